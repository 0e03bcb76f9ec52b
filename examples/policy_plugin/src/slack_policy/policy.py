"""``slack``: the feasible (cluster, model) pair with the most slack left before the deadline.

Slack of a pair = D_a - (RTT + expected queue wait + t_m), with the dispatcher's stale load estimate
(``Option.queue_wait_ms``). Where ``min_latency`` only asks for the earliest answer, ``slack`` first
keeps the pairs whose slack is at least ``margin_ms`` (a safety margin against the staleness of
the load report) and among them prefers accuracy when ``prefer_accuracy`` is set; with no pair
keeping the margin it takes the pair of largest slack. With no feasible pair at all it falls back
as every built-in policy does (``min_latency`` over the pairs meeting A_a, ``fallback=True``).

Parameters (from the experiment: ``policy: {use: slack, params: {margin_ms: 10}}``):

- ``margin_ms`` (float, ms, default 0): the slack a pair must keep to count as safe;
- ``prefer_accuracy`` (bool, default False): among the safe pairs take the most accurate one
  (ties: the larger slack) instead of the largest slack.

Deterministic (the same options give the same pick) and load-aware (it reads ``queue_wait_ms``).
"""

from __future__ import annotations

from testbed.model.policies import Decision, Option, feasible, policy_plugin


def _slack(o: Option, deadline_ms: float) -> float:
    return deadline_ms - (o.rtt_ms + o.queue_wait_ms + o.service_ms)


@policy_plugin(deterministic=True, load_aware=True)
def slack(options: list[Option], deadline_ms: float, min_accuracy: float, ctx=None, *,
          margin_ms: float = 0.0, prefer_accuracy: bool = False) -> Decision:
    """The pick described in the module docstring. ``options``: the pairs the dispatcher offers
    (the feasible ones when there are any); ``deadline_ms`` D_a (ms); ``min_accuracy`` A_a (0..1).

    Raises:
        ValueError: ``options`` is empty.
    """
    if not options:
        raise ValueError("no (cluster, model) options to choose from")
    ok = feasible(options, deadline_ms, min_accuracy)
    if not ok:
        pool = [o for o in options if o.up] or list(options)
        accurate = [o for o in pool if o.accuracy >= min_accuracy]
        if accurate:
            pick = min(accurate, key=lambda o: (o.rtt_ms + o.queue_wait_ms + o.service_ms, o.cluster, o.model))
        else:
            pick = max(pool, key=lambda o: (o.accuracy, -o.rtt_ms, o.cluster, o.model))
        return Decision(pick.cluster, pick.model, True)
    safe = [o for o in ok if _slack(o, deadline_ms) >= margin_ms]
    if safe and prefer_accuracy:
        pick = min(safe, key=lambda o: (-o.accuracy, -_slack(o, deadline_ms), o.cluster, o.model))
    else:
        pick = min(safe or ok, key=lambda o: (-_slack(o, deadline_ms), o.cluster, o.model))
    return Decision(pick.cluster, pick.model, False)
