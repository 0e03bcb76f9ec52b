"""Scheduling policies: a pure decision from (query, the state the dispatcher last heard).

The catalogue of static policies of ``docs/system-model.md`` ("The policies"), in the fixed order of
:data:`CATALOGUE` (ASET's action space). Both the emulation's dispatcher
(:mod:`testbed.emu.source`) and the simulator (:mod:`testbed.sim`) call :func:`decide`.

Every policy has the signature ``policy(options, deadline_ms, min_accuracy, ctx=None) -> Decision``:

- ``options``: one :class:`Option` per (cluster, model) pair, carrying what the dispatcher knows:
  the expected RTT, the expected service time t_m, the accuracy, and the load it last heard
  (stale by the report interval): ``queue_wait_ms`` (expected queueing delay) and ``load``
  (queue length per worker), ``up`` (the cluster answered its last report).
- ``ctx``: the dispatcher's own state for the two stateful policies: a seeded
  ``numpy.random.Generator`` (``random``) and round-robin counters (``round_robin``), one
  :class:`Context` per dispatcher. Deterministic given options, ctx and seed.

A feasible pair is (cluster, model) with accuracy >= A_a and RTT(source, cluster) + t_m <= D_a
on a cluster last heard up. With no feasible pair a policy falls back to ``min_latency`` over the
pairs meeting A_a (our choice, ``docs/system-model.md``) and says so (``fallback=True``); with no pair
meeting A_a it takes the most accurate one (the query will fail with cause ``accuracy``).
Clusters last heard down are avoided while any cluster is up.

Ties are broken by (cluster name, model name), so every pick is reproducible.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

#: The policy catalogue in a fixed order: index = ASET's action.
CATALOGUE: tuple[str, ...] = ("closest", "cloud", "least_loaded", "min_latency", "max_accuracy", "random",
                              "round_robin")
#: Policies whose decision depends only on (options, deadline, accuracy): constant between two
#: load reports, so a dispatcher (or the simulator) may cache them per application.
DETERMINISTIC: frozenset[str] = frozenset({"closest", "cloud", "least_loaded", "min_latency", "max_accuracy"})


@dataclass(frozen=True)
class Option:
    """A (cluster, model) pair as the dispatcher sees it.

    ``rtt_ms``: expected RTT source->cluster (ms). ``service_ms``: expected inference time t_m at
    the cluster's CPU share (ms). ``accuracy``: alpha_m in [0, 1]. ``queue_wait_ms``: expected
    queueing delay from the last load report (ms; 0 when unknown). ``load``: queue length per
    worker from the last report (0 when unknown). ``tier``: ``far_edge``, ``near_edge`` or
    ``cloud``. ``up``: False when the cluster did not answer its last report.
    """

    cluster: str
    model: str
    rtt_ms: float
    service_ms: float
    accuracy: float
    queue_wait_ms: float = 0.0
    load: float = 0.0
    tier: str = ""
    up: bool = True


@dataclass(frozen=True)
class Decision:
    """The chosen pair; ``fallback`` is True when the policy found no feasible pair."""

    cluster: str
    model: str
    fallback: bool


@dataclass
class Context:
    """A dispatcher's own state for ``random`` (``rng``) and ``round_robin`` (``rr``: next index
    per key, the key being the application's (deadline, accuracy))."""

    rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(0))
    rr: dict = field(default_factory=dict)


def _usable(options: list[Option]) -> list[Option]:
    up = [o for o in options if o.up]
    return up or list(options)


def feasible(options: list[Option], deadline_ms: float, min_accuracy: float) -> list[Option]:
    """Pairs with accuracy >= ``min_accuracy`` and rtt + service <= ``deadline_ms`` (clusters up)."""
    return [o for o in options if o.up and o.accuracy >= min_accuracy and o.rtt_ms + o.service_ms <= deadline_ms]


def _expected_ms(o: Option) -> float:
    return o.rtt_ms + o.queue_wait_ms + o.service_ms


def _min_latency_pick(options: list[Option]) -> Option:
    return min(options, key=lambda o: (_expected_ms(o), o.cluster, o.model))


def _fallback(options: list[Option], min_accuracy: float) -> Decision:
    if not options:
        raise ValueError("no (cluster, model) options to choose from")
    pool = _usable(options)
    accurate = [o for o in pool if o.accuracy >= min_accuracy]
    if accurate:
        pick = _min_latency_pick(accurate)
    else:
        pick = max(pool, key=lambda o: (o.accuracy, -o.rtt_ms, o.cluster, o.model))
    return Decision(pick.cluster, pick.model, True)


def _fastest_at(ok: list[Option], cluster: str) -> Option:
    return min((o for o in ok if o.cluster == cluster), key=lambda o: (o.service_ms, o.model))


def closest(options: list[Option], deadline_ms: float, min_accuracy: float, ctx: Context | None = None) -> Decision:
    """``closest``: the feasible cluster with the smallest RTT; there, the fastest feasible model.

    Raises:
        ValueError: ``options`` is empty.
    """
    ok = feasible(options, deadline_ms, min_accuracy)
    if not ok:
        return _fallback(options, min_accuracy)
    cluster = min(ok, key=lambda o: (o.rtt_ms, o.cluster)).cluster
    pick = _fastest_at(ok, cluster)
    return Decision(pick.cluster, pick.model, False)


def cloud(options: list[Option], deadline_ms: float, min_accuracy: float, ctx: Context | None = None) -> Decision:
    """``cloud``: the cloud cluster (tier ``cloud``), its fastest model meeting A_a, whatever the
    deadline. No cloud cluster up or no cloud model accurate enough: the fallback.

    Raises:
        ValueError: ``options`` is empty.
    """
    ok = [o for o in options if o.tier == "cloud" and o.up and o.accuracy >= min_accuracy]
    if not ok:
        return _fallback(options, min_accuracy)
    pick = min(ok, key=lambda o: (o.service_ms, o.rtt_ms, o.cluster, o.model))
    return Decision(pick.cluster, pick.model, False)


def least_loaded(options: list[Option], deadline_ms: float, min_accuracy: float,
                 ctx: Context | None = None) -> Decision:
    """``least_loaded``: the feasible cluster with the lowest queue length per worker (last heard;
    ties: smaller RTT), there the fastest feasible model.

    Raises:
        ValueError: ``options`` is empty.
    """
    ok = feasible(options, deadline_ms, min_accuracy)
    if not ok:
        return _fallback(options, min_accuracy)
    cluster = min(ok, key=lambda o: (o.load, o.rtt_ms, o.cluster)).cluster
    pick = _fastest_at(ok, cluster)
    return Decision(pick.cluster, pick.model, False)


def min_latency(options: list[Option], deadline_ms: float, min_accuracy: float,
                ctx: Context | None = None) -> Decision:
    """``min_latency``: the feasible pair minimising RTT + expected queue wait + t_m.

    Raises:
        ValueError: ``options`` is empty.
    """
    ok = feasible(options, deadline_ms, min_accuracy)
    if not ok:
        return _fallback(options, min_accuracy)
    pick = _min_latency_pick(ok)
    return Decision(pick.cluster, pick.model, False)


def max_accuracy(options: list[Option], deadline_ms: float, min_accuracy: float,
                 ctx: Context | None = None) -> Decision:
    """``max_accuracy``: the most accurate feasible pair whose expected completion (RTT + expected
    queue wait + t_m) meets D_a (ties: the earlier expected completion); else ``min_latency``.

    Raises:
        ValueError: ``options`` is empty.
    """
    ok = [o for o in feasible(options, deadline_ms, min_accuracy) if _expected_ms(o) <= deadline_ms]
    if not ok:
        return min_latency(options, deadline_ms, min_accuracy)
    pick = min(ok, key=lambda o: (-o.accuracy, _expected_ms(o), o.cluster, o.model))
    return Decision(pick.cluster, pick.model, False)


def random(options: list[Option], deadline_ms: float, min_accuracy: float, ctx: Context | None = None) -> Decision:
    """``random``: uniform over the feasible pairs, drawn from ``ctx.rng`` (seeded per dispatcher).

    Raises:
        ValueError: ``options`` is empty; ``ctx`` is None.
    """
    if ctx is None:
        raise ValueError("policy 'random' needs a Context with a seeded rng")
    ok = feasible(options, deadline_ms, min_accuracy)
    if not ok:
        return _fallback(options, min_accuracy)
    pick = ok[int(ctx.rng.integers(len(ok)))]
    return Decision(pick.cluster, pick.model, False)


def round_robin(options: list[Option], deadline_ms: float, min_accuracy: float,
                ctx: Context | None = None) -> Decision:
    """``round_robin``: cycles over the feasible clusters (sorted by name; one counter per
    application class in ``ctx.rr``), there the fastest feasible model.

    Raises:
        ValueError: ``options`` is empty; ``ctx`` is None.
    """
    if ctx is None:
        raise ValueError("policy 'round_robin' needs a Context")
    ok = feasible(options, deadline_ms, min_accuracy)
    if not ok:
        return _fallback(options, min_accuracy)
    clusters = sorted({o.cluster for o in ok})
    key = (deadline_ms, min_accuracy)
    i = ctx.rr.get(key, 0)
    ctx.rr[key] = i + 1
    pick = _fastest_at(ok, clusters[i % len(clusters)])
    return Decision(pick.cluster, pick.model, False)


PolicyFn = Callable[[list[Option], float, float, "Context | None"], Decision]

#: name -> decision function, for every name of :data:`CATALOGUE`.
POLICIES: dict[str, PolicyFn] = {
    "closest": closest, "cloud": cloud, "least_loaded": least_loaded, "min_latency": min_latency,
    "max_accuracy": max_accuracy, "random": random, "round_robin": round_robin,
}
assert tuple(POLICIES) == CATALOGUE


def decide_many(policy: str, options: list[Option], deadline_ms: float, min_accuracy: float, n: int,
                ctx: Context | None = None) -> list[Decision]:
    """``n`` successive decisions of ``policy`` for the same application on the same state, as ``n``
    calls of :func:`decide` would give them (same distribution; ``random`` draws its ``n`` indices
    in one call, so its stream differs from n single draws). For the simulator's hot path.

    Raises:
        ValueError: as :func:`decide`.
    """
    if policy in DETERMINISTIC or n <= 0:
        return [decide(policy, options, deadline_ms, min_accuracy, ctx)] * max(n, 0)
    if ctx is None:
        raise ValueError(f"policy {policy!r} needs a Context")
    ok = feasible(options, deadline_ms, min_accuracy)
    if not ok:
        return [_fallback(options, min_accuracy)] * n
    if policy == "random":
        picks = [Decision(o.cluster, o.model, False) for o in ok]
        return [picks[i] for i in ctx.rng.integers(len(ok), size=n).tolist()]
    if policy == "round_robin":
        clusters = sorted({o.cluster for o in ok})
        best = [Decision(c, _fastest_at(ok, c).model, False) for c in clusters]
        key = (deadline_ms, min_accuracy)
        i = ctx.rr.get(key, 0)
        ctx.rr[key] = i + n
        return [best[(i + k) % len(best)] for k in range(n)]
    return [decide(policy, options, deadline_ms, min_accuracy, ctx) for _ in range(n)]


def decide(policy: str, options: list[Option], deadline_ms: float, min_accuracy: float,
           ctx: Context | None = None) -> Decision:
    """Apply the policy called ``policy`` (a name of :data:`CATALOGUE`).

    Raises:
        ValueError: unknown policy name (the message lists the catalogue), or empty ``options``.
    """
    fn = POLICIES.get(policy)
    if fn is None:
        raise ValueError(f"unknown policy {policy!r}; known: {', '.join(CATALOGUE)}")
    return fn(options, deadline_ms, min_accuracy, ctx)


__all__ = ["CATALOGUE", "DETERMINISTIC", "POLICIES", "Context", "Decision", "Option", "closest", "cloud",
           "decide", "decide_many", "feasible", "least_loaded", "max_accuracy", "min_latency",
           "random", "round_robin"]
