"""Scheduling policies: a pure decision from (query, the state the dispatcher last heard).

Implements ``closest`` from ``shared/design/system-model.md``; the rest of the catalogue follows
the same signature. A feasible pair is (cluster, model) with accuracy >= A_a and
RTT(source, cluster) + t_m <= D_a. With no feasible pair the dispatcher falls back to
``min_latency`` over the pairs meeting A_a (our choice, system-model.md), and says so
(``fallback=True``); with no pair meeting A_a it takes the most accurate one (the query will fail
with cause ``accuracy``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Option:
    """A (cluster, model) pair as the dispatcher sees it.

    ``rtt_ms``: expected RTT source->cluster (ms). ``service_ms``: expected inference time t_m at
    the cluster's CPU share (ms). ``accuracy``: alpha_m in [0, 1]. ``queue_wait_ms``: expected
    queueing delay from the last load report (0 when unknown).
    """

    cluster: str
    model: str
    rtt_ms: float
    service_ms: float
    accuracy: float
    queue_wait_ms: float = 0.0


@dataclass(frozen=True)
class Decision:
    """The chosen pair; ``fallback`` is True when no pair was feasible."""

    cluster: str
    model: str
    fallback: bool


def feasible(options: list[Option], deadline_ms: float, min_accuracy: float) -> list[Option]:
    """Pairs with accuracy >= ``min_accuracy`` and rtt + service <= ``deadline_ms``."""
    return [o for o in options if o.accuracy >= min_accuracy and o.rtt_ms + o.service_ms <= deadline_ms]


def _min_latency(options: list[Option]) -> Option:
    return min(options, key=lambda o: (o.rtt_ms + o.queue_wait_ms + o.service_ms, o.cluster, o.model))


def closest(options: list[Option], deadline_ms: float, min_accuracy: float) -> Decision:
    """``closest``: the feasible cluster with the smallest RTT; there, the fastest feasible model.

    Raises:
        ValueError: ``options`` is empty.
    """
    if not options:
        raise ValueError("no (cluster, model) options to choose from")
    ok = feasible(options, deadline_ms, min_accuracy)
    if ok:
        best_rtt = min(o.rtt_ms for o in ok)
        cluster = min(o.cluster for o in ok if o.rtt_ms == best_rtt)
        pick = min((o for o in ok if o.cluster == cluster), key=lambda o: (o.service_ms, o.model))
        return Decision(pick.cluster, pick.model, False)
    accurate = [o for o in options if o.accuracy >= min_accuracy]
    if accurate:
        pick = _min_latency(accurate)
    else:
        pick = max(options, key=lambda o: (o.accuracy, -o.rtt_ms))
    return Decision(pick.cluster, pick.model, True)


POLICIES = {"closest": closest}
