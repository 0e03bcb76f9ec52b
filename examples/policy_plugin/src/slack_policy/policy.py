"""``slack``: the most accurate (cluster, model) pair that keeps a margin of slack before the deadline.

Slack of a pair = D_a - (RTT + expected queue wait + t_m), on the dispatcher's last-heard load
(``Option.queue_wait_ms``, stale by up to one report interval). Among the feasible pairs,
``slack`` keeps those whose slack is at least ``margin_ms`` and takes the most accurate of them
(ties: the larger slack, then names); when no pair keeps the margin it takes the pair of largest
slack, i.e. the earliest expected answer. The margin is a guard against the staleness of the load
report: ``margin_ms = 0`` decides as the built-in ``max_accuracy`` (the most accurate pair expected
in time), a margin larger than every deadline as ``min_latency``; in between, a more accurate
model is taken only where it is expected to finish ``margin_ms`` early. With no feasible pair it
falls back as every built-in policy does (``min_latency`` over the pairs meeting A_a,
``fallback=True``).

Parameter (``policy: {use: slack, params: {margin_ms: 20}}``): ``margin_ms`` (ms, >= 0, default
10).

Deterministic (the same options give the same pick) and load-aware (it reads ``queue_wait_ms``).
"""

from __future__ import annotations

from testbed.model.policies import Decision, Option, feasible, policy_plugin


def _expected_ms(o: Option) -> float:
    return o.rtt_ms + o.queue_wait_ms + o.service_ms


@policy_plugin(deterministic=True, load_aware=True)
def slack(options: list[Option], deadline_ms: float, min_accuracy: float, ctx=None, *,
          margin_ms: float = 10.0) -> Decision:
    """The pick described in the module docstring. ``options``: the pairs the dispatcher offers
    (the feasible ones when there are any); ``deadline_ms`` D_a (ms); ``min_accuracy`` A_a (0..1).

    Raises:
        ValueError: ``options`` is empty, or ``margin_ms`` < 0.
    """
    if not options:
        raise ValueError("no (cluster, model) options to choose from")
    if margin_ms < 0:
        raise ValueError(f"margin_ms {margin_ms}: a margin is >= 0 ms")
    ok = feasible(options, deadline_ms, min_accuracy)
    if not ok:
        pool = [o for o in options if o.up] or list(options)
        accurate = [o for o in pool if o.accuracy >= min_accuracy]
        if accurate:
            pick = min(accurate, key=lambda o: (_expected_ms(o), o.cluster, o.model))
        else:
            pick = max(pool, key=lambda o: (o.accuracy, -o.rtt_ms, o.cluster, o.model))
        return Decision(pick.cluster, pick.model, True)
    safe = [o for o in ok if deadline_ms - _expected_ms(o) >= margin_ms]
    if safe:
        pick = min(safe, key=lambda o: (-o.accuracy, _expected_ms(o), o.cluster, o.model))
    else:
        pick = min(ok, key=lambda o: (_expected_ms(o), o.cluster, o.model))
    return Decision(pick.cluster, pick.model, False)
