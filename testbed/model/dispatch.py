"""The dispatcher step: what a source knows, the options it sees, and its decision.

A source's dispatcher knows, per (cluster, model) pair, what the plan fixes (:class:`OptionSpec`:
RTT, expected service time, accuracy, tier) and, per cluster, the load it last *heard*
(:class:`Heard`, stale by the report interval: the emulation polls each server's ``/v1/stats``,
the simulator takes a snapshot; a failed poll marks the cluster down). From these it builds the
:class:`testbed.model.policies.Option` list and applies the policy in force (:func:`testbed.model.policies.decide`).
A query is only ever sent to a model of its application's family (the models of another family
answer another question): the options a policy sees are those of that family.
Both engines go through :class:`Dispatcher`; neither builds options of its own.

A dispatcher also knows its own in-flight queries (``docs/system-model.md``, "The dispatcher and
what it knows"): the queries it sent to each cluster since it last heard from that cluster, which
the report cannot contain yet (our definition: the same in both engines, reset by each report).
Its estimate of a cluster is the report plus them: ``n = queue_len + busy + sent``, of which
``min(n, workers)`` busy and the rest waiting. Without it, every dispatcher of a load-aware
policy sends everything to the cluster that looked idlest at the last report (herding).

Expected queueing delay (our choice, ``docs/system-model.md``, "The dispatcher and what it
knows"): a query arriving at a cluster estimated with ``queue`` waiting and ``busy`` of
``workers`` busy waits ``(queue + 1) / workers x mean service`` when every worker is busy, else
0 (:func:`expected_wait_ms`). Queries per worker, ``n / workers``, is the load.

Decisions of the deterministic policies (``deterministic`` of :class:`testbed.model.policies.Policy`,
:data:`testbed.model.policies.DETERMINISTIC`) depend only on the options; the dispatcher caches them
per application until something is heard, or, for the load-aware ones (``load_aware``,
:data:`LOAD_AWARE`), until it sends a query. What the dispatcher does with a policy follows from
its registry entry's flags alone: no policy is named here.

The clock: a decision may be given the time it is taken (``now_s``, on the clock of
:attr:`Heard.at_s`: the simulator's virtual time, the emulated source's ``time.time()``), which
the dispatcher hands to the policy as ``Context.now_s`` (``age_aware`` reads the age of each report
from it). Each option also carries the parts of the load estimate (``reported``, ``sent``,
``workers``, ``heard_at_s``) and the cluster's service rate, ``W x 1000 / t`` (W as last heard), t the mean of
``mean_service_ms`` over the cluster's options as this source sees them (every model deployed
there; our choice: a report does not say which models its queue holds).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from testbed.model import policies as pol

#: Policies whose decision depends on the load estimate (so on the dispatcher's own sends): from the
#: policy registry (:data:`testbed.model.policies.LOAD_AWARE`).
LOAD_AWARE = pol.LOAD_AWARE


@dataclass(frozen=True)
class OptionSpec:
    """What the plan fixes about one (cluster, model) pair, as one source sees it.

    ``rtt_ms``: the plan's RTT source -> cluster (ms). ``service_ms``: expected service time t_m
    at the cluster's share (ms; the feasibility test RTT + t_m <= D_a uses it). ``mean_service_ms``:
    mean service time per call when the cluster is busy (ms; the expected wait uses it).
    ``accuracy``: alpha_m. ``tier``: far_edge / near_edge / cloud. ``workers``: the cluster's W.
    ``family``: the model's family (the kind of query it answers; "" matches every application).
    """

    cluster: str
    model: str
    rtt_ms: float
    service_ms: float
    mean_service_ms: float
    accuracy: float
    tier: str
    workers: int
    family: str = ""


@dataclass(frozen=True)
class Heard:
    """A cluster's load as a dispatcher last heard it. ``utilization`` 0..1 over the last report
    interval; ``up`` False when the last report failed; ``at_s`` when it was heard (the caller's
    clock, None: never)."""

    queue_len: int = 0
    busy: int = 0
    workers: int = 1
    utilization: float = 0.0
    up: bool = True
    at_s: float | None = None

    def as_dict(self) -> dict[str, float | int | bool]:
        """The window-state view ASET's observation reads (``queue_len``, ``busy``, ``workers``,
        ``utilization``, ``up``)."""
        return {"queue_len": self.queue_len, "busy": self.busy, "workers": self.workers,
                "utilization": self.utilization, "up": self.up}

    @classmethod
    def of(cls, report: Mapping[str, Any] | None, workers: int, at_s: float | None = None) -> Heard:
        """The one reading of a cluster's load report, whoever made it: a server's ``GET /v1/stats``
        answer (the emulation's sources), a simulated cluster's report, ASET's window state. Each
        carries ``queue_len``, ``busy`` (workers busy), ``workers``, ``utilization`` (0..1 over the
        last report interval; clamped) and ``up`` (default True); a missing count reads 0 and a
        missing ``workers`` the plan's ``workers``. ``report`` None: nothing was heard (down)."""
        if report is None:
            return cls(workers=workers, up=False, at_s=at_s)
        return cls(int(report.get("queue_len") or 0), int(report.get("busy") or 0),
                   int(report.get("workers") or workers),
                   max(0.0, min(1.0, float(report.get("utilization") or 0.0))), bool(report.get("up", True)), at_s)


def expected_wait_ms(queue_len: int, busy: int, workers: int, mean_service_ms: float) -> float:
    """Expected queueing delay (ms) at a cluster last heard with ``queue_len`` waiting and
    ``busy`` of ``workers`` busy (module docstring); infinite for ``workers`` <= 0."""
    if workers <= 0:
        return float("inf")
    if busy < workers:
        return 0.0
    return (queue_len + 1) / workers * mean_service_ms


class Dispatcher:
    """The dispatcher of one source.

    Args:
        specs: one :class:`OptionSpec` per (cluster, model) pair the source may use.
        policy: the policy in force (a name of :data:`testbed.model.policies.CATALOGUE`, or a plug-in
            reference that :data:`testbed.model.policies.REGISTRY` resolves); ``policy`` may be
            reassigned at any time (ASET does, per window).
        rng: the source's generator for ``random`` (seeded by the caller).

    Raises:
        ValueError: no options, or an unknown policy
            (:class:`testbed.core.registry.UnknownNameError`), or a plug-in that cannot be used
            (:class:`testbed.core.plugins.PluginError`).
    """

    def __init__(self, specs: Sequence[OptionSpec], policy: str, rng: np.random.Generator):
        if not specs:
            raise ValueError("a dispatcher needs at least one (cluster, model) option")
        self.specs = list(specs)
        self.clusters = list(dict.fromkeys(s.cluster for s in self.specs))
        self._pos: dict[str, list[int]] = {c: [] for c in self.clusters}  # cluster -> its options
        for i, s in enumerate(self.specs):
            self._pos[s.cluster].append(i)
        self.heard: dict[str, Heard] = {}
        for s in self.specs:
            self.heard.setdefault(s.cluster, Heard(workers=s.workers))
        self.ctx = pol.Context(rng=rng)
        # cluster -> mean busy service time of its models (ms), for its service rate W x 1000 / it
        self._mean_ms = {c: sum(self.specs[i].mean_service_ms for i in idx) / len(idx) for c, idx in self._pos.items()}
        self.sent: dict[str, int] = dict.fromkeys(self.clusters, 0)  # own queries since the last report
        self._options: list[pol.Option] | None = None
        self._stale: set[str] = set()  # clusters sent to since their options were built
        self._family: dict[str, list[int]] = {}  # family -> its options (fixed)
        #: feasible options per application: they depend on the plan and on which clusters are up
        #: (not on the load), so they are kept until a report changes that
        self._candidates: dict[tuple[str, float, float], list[int]] = {}
        self._cache: dict[tuple[str, float, float], pol.Decision] = {}
        #: decisions the policy actually made (a cached one is not made again): what costs a decision
        self.decisions_made = 0
        self._policy = ""
        self._entry: pol.Policy | None = None
        self.policy = policy

    @property
    def policy(self) -> str:
        return self._policy

    @policy.setter
    def policy(self, name: str) -> None:
        entry = pol.REGISTRY.resolve(name)
        if name != self._policy:
            self._policy, self._entry = name, entry
            self._cache = {}

    # -- what is heard and sent ------------------------------------------------------------
    def hear(self, cluster: str, heard: Heard) -> None:
        """A report from ``cluster`` (or its failure: ``Heard(up=False, ...)``); it covers what this
        dispatcher sent there before, so its in-flight count restarts at 0."""
        self.hear_all([(cluster, heard)])

    def hear_all(self, reports: Iterable[tuple[str, Heard]]) -> None:
        """Several reports at once."""
        up_changed = False
        for cluster, heard in reports:
            old = self.heard.get(cluster)
            if old is None or old.up != heard.up:
                up_changed = True
            self.heard[cluster] = heard
            self.sent[cluster] = 0
        self._options = None
        self._stale.clear()
        if up_changed:
            self._candidates = {}
        self._cache = {}

    def lost(self, cluster: str, at_s: float | None = None) -> None:
        """The report from ``cluster`` failed: it is taken as down, its last load kept."""
        h = self.heard[cluster]
        self.hear(cluster, Heard(h.queue_len, h.busy, h.workers, h.utilization, False, at_s))

    def note_sent(self, cluster: str, n: int = 1) -> None:
        """This dispatcher sent ``n`` queries to ``cluster``: its own in-flight count grows, and so
        does the load it sees there (feasibility does not change: it ignores the load)."""
        self.sent[cluster] += n
        if self._options is not None:
            self._stale.add(cluster)  # its options are rebuilt when next read (options)
        if self._entry.load_aware:
            self._cache = {}

    # -- options ---------------------------------------------------------------------------
    def _build(self, cluster: str, out: list[pol.Option]) -> None:
        """The options of ``cluster`` on what is heard and sent now, into ``out`` at their indices."""
        h = self.heard[cluster]
        w = max(1, h.workers)
        reported, sent = h.queue_len + h.busy, self.sent[cluster]
        n = reported + sent
        busy, load = min(n, w), n / w
        mean_ms = self._mean_ms[cluster]
        rate = w * 1e3 / mean_ms if mean_ms > 0 else 0.0
        for i in self._pos[cluster]:
            s = self.specs[i]
            out[i] = pol.Option(s.cluster, s.model, s.rtt_ms, s.service_ms, s.accuracy,
                                expected_wait_ms(n - busy, busy, w, s.mean_service_ms), load, s.tier, h.up,
                                reported, sent, w, h.at_s, rate)

    @property
    def options(self) -> list[pol.Option]:
        """The :class:`testbed.model.policies.Option` list as this dispatcher sees it now."""
        if self._options is None:
            opts: list[pol.Option] = [None] * len(self.specs)  # type: ignore[list-item]  # each set below
            for cluster in self.clusters:
                self._build(cluster, opts)
            self._options = opts
            self._stale.clear()
        elif self._stale:
            for cluster in self._stale:
                self._build(cluster, self._options)
            self._stale.clear()
        return self._options

    def _family_idx(self, family: str) -> list[int]:
        idx = self._family.get(family)
        if idx is None:
            idx = [i for i, s in enumerate(self.specs) if not family or s.family in ("", family)]
            if not idx:
                raise ValueError(f"no (cluster, model) option serves family {family!r}")
            self._family[family] = idx
        return idx

    def options_for(self, family: str = "") -> list[pol.Option]:
        """The options a query of ``family`` may use: the models of that family ("": all).

        Raises:
            ValueError: no option serves ``family`` (the plan refuses such an experiment).
        """
        opts = self.options
        return [opts[i] for i in self._family_idx(family)]

    def _for_policy(self, family: str, deadline_ms: float, min_accuracy: float) -> list[pol.Option]:
        """What the policy is given: the family's feasible options when there are any (a policy
        looks only at those, or at all of them to fall back), else all; every option of the family
        for a policy registered with ``all_options`` (``cloud``)."""
        opts = self.options
        if self._entry.all_options:
            return [opts[i] for i in self._family_idx(family)]
        key = (family, deadline_ms, min_accuracy)
        cand = self._candidates.get(key)
        if cand is None:
            fam = self._family_idx(family)
            ok = {id(o) for o in pol.feasible([opts[i] for i in fam], deadline_ms, min_accuracy)}
            cand = self._candidates[key] = [i for i in fam if id(opts[i]) in ok] or fam
        return [opts[i] for i in cand]

    # -- decisions -------------------------------------------------------------------------
    def decide(self, deadline_ms: float, min_accuracy: float, family: str = "",
               now_s: float | None = None) -> pol.Decision:
        """The decision of the policy in force for a query of an application (D_a, A_a, its
        family), taken at ``now_s`` (s, on the clock of :attr:`Heard.at_s`; None: unknown, set as
        ``ctx.now_s``), without sending it (see :meth:`dispatch`)."""
        self.ctx.now_s = now_s
        if self._entry.deterministic:
            key = (family, deadline_ms, min_accuracy)
            d = self._cache.get(key)
            if d is None:
                opts = self._for_policy(family, deadline_ms, min_accuracy)
                d = self._cache[key] = pol.decide(self._policy, opts, deadline_ms, min_accuracy, self.ctx)
                self.decisions_made += 1
            return d
        self.decisions_made += 1
        return pol.decide(self._policy, self._for_policy(family, deadline_ms, min_accuracy), deadline_ms,
                          min_accuracy, self.ctx)

    def dispatch(self, deadline_ms: float, min_accuracy: float, family: str = "",
                 now_s: float | None = None) -> pol.Decision:
        """Decide for one query at ``now_s`` (as :meth:`decide`) and count it as sent (the
        dispatcher step of one query)."""
        d = self.decide(deadline_ms, min_accuracy, family, now_s)
        self.note_sent(d.cluster)
        return d

    def dispatch_many(self, deadline_ms: float, min_accuracy: float, n: int, family: str = "",
                      times: Sequence[float] | None = None) -> list[pol.Decision]:
        """``n`` successive queries of one application with no report in between: the same
        decisions as ``n`` calls of :meth:`dispatch` (``random`` draws its ``n`` indices at once,
        :func:`testbed.model.policies.decide_many`). ``times``: the ``n`` queries' times (as
        ``now_s`` of :meth:`dispatch`; a load-aware policy decides each at its own, any other at the
        first; None: unknown).

        Raises:
            ValueError: ``times`` is not of length ``n``.
        """
        if times is not None and len(times) != n:
            raise ValueError(f"dispatch_many: {len(times)} times for {n} queries")
        if self._entry.load_aware:
            if times is None:
                return [self.dispatch(deadline_ms, min_accuracy, family) for _ in range(n)]
            return [self.dispatch(deadline_ms, min_accuracy, family, t) for t in times]
        self.ctx.now_s = times[0] if times else None
        if self._entry.deterministic:
            d = self.decide(deadline_ms, min_accuracy, family, self.ctx.now_s)
            self.note_sent(d.cluster, n)
            return [d] * n
        out = pol.decide_many(self._policy, self._for_policy(family, deadline_ms, min_accuracy), deadline_ms,
                              min_accuracy, n, self.ctx)
        self.decisions_made += n
        counts: dict[str, int] = {}
        for d in out:
            counts[d.cluster] = counts.get(d.cluster, 0) + 1
        for c, k in counts.items():
            self.note_sent(c, k)
        return out

    def heard_state(self) -> dict[str, dict[str, float | int | bool]]:
        """Per cluster, what was last heard (the ``clusters`` part of ASET's window state)."""
        return {c: h.as_dict() for c, h in self.heard.items()}


__all__ = ["LOAD_AWARE", "Dispatcher", "Heard", "OptionSpec", "expected_wait_ms"]
