"""The simulator's query columns and what a run gives out of them.

Queries live in columns (one list per field, indexed by query number), not in objects:
:class:`Queries`. :class:`RunColumns` is the simulator's part that reads them: the resolved
queries (:meth:`RunColumns.drain_resolved`), the records and the run directory in the
emulation's layout.
"""

from __future__ import annotations

import copy
import csv
import heapq
from dataclasses import dataclass
from pathlib import Path

from testbed.core.util import provenance, write_json_atomic
from testbed.model.network import path_cut, rtt_at
from testbed.model.policies import plugin_origins
from testbed.model.records import GRACE_MS, RECORD_FIELDS, classify, make_record
from testbed.plan.boundaries import SourceTally, tally_path


@dataclass(frozen=True)
class Resolved:
    """A query resolved (answered, refused, or past its deadline), as :meth:`Simulator.drain_resolved`
    returns it. Times in s of simulated time; ``e2e_ms`` None when no answer came."""

    source: str
    application: str
    policy: str
    cluster: str
    model: str
    t0_s: float
    resolved_s: float
    success: bool
    failure_cause: str
    e2e_ms: float | None


class Queries:
    """Every query of a run, one list per field (index = query number).

    ``td`` is when the dispatcher's decision was made (the request leaves; t0 + the decision's
    cost, :attr:`~testbed.sim.engine.Simulator.decision_s`), ``t1h`` when the server's event loop
    has read the request (the query enters the queue), ``t3h`` when it has written the answer (None
    until then). An answered query has ``t2``/``t3`` (start / end of its model call) and nothing in
    ``status``/``t4``, which :meth:`status_of` and :meth:`t4_of` derive (HTTP 200, t3h + the
    response's way back); a query refused or lost has ``status`` (503 or connection refused) and
    ``t4`` (when the refusal reached the source); ``batch`` is set for batches of more than one.
    """

    __slots__ = ("src", "app", "cl", "model", "pol", "fb", "t0", "td", "t1", "t1h", "dl", "back", "t2", "t3", "t3h",
                 "t4", "status",
                 "qlen", "batch", "reason", "released", "recorded")

    def __init__(self) -> None:
        for f in self.__slots__:
            setattr(self, f, [])
        self.fb = bytearray()  # 0/1 per query
        self.released = bytearray()  # 1 once drain_resolved reported it
        self.reason: dict[int, str] = {}  # drop reason of refused queries only

    def __len__(self) -> int:
        return len(self.t0)

    def __deepcopy__(self, memo: dict) -> Queries:
        """A copy of every column: each holds numbers, None or names only, so a shallow copy per
        column is exact (and far cheaper than visiting every past query)."""
        new = Queries.__new__(Queries)
        for f in self.__slots__:
            setattr(new, f, copy.copy(getattr(self, f)))
        memo[id(self)] = new
        return new

    def status_of(self, qi: int) -> int | None:
        """HTTP status as the source sees it (None: no answer yet, its answer not written included)."""
        if self.t2[qi] is None:
            return self.status[qi]
        return 200 if self.t3h[qi] is not None else None

    def t4_of(self, qi: int) -> float | None:
        """When the answer or the refusal reached the source (s; None: not yet)."""
        if self.t2[qi] is None:
            return self.t4[qi]
        t3h = self.t3h[qi]
        return None if t3h is None else t3h + self.back[qi]


class RunColumns:
    """The :class:`~testbed.sim.engine.Simulator`'s reading of its query columns (``self.q``):
    resolved and created queries, records, server counters and the run directory."""

    def _cut(self, qi: int) -> bool:
        """Whether query ``qi``'s life (creation to deadline + grace) meets a span in which the
        network has no route from its source to its cluster (:func:`testbed.model.network.path_cut`)."""
        q = self.q
        spans = self.no_route[q.src[qi]][q.cl[qi]]
        return bool(spans) and path_cut(spans, q.t0[qi], q.t0[qi] + (self.apps[q.app[qi]].deadline_ms + GRACE_MS) / 1e3)

    def _outcome(self, qi: int) -> tuple[str, str, float | None]:
        q = self.q
        a = self.apps[q.app[qi]]
        t4 = q.t4_of(qi)
        e2e = None if t4 is None else (t4 - q.t0[qi]) * 1e3
        outcome, cause = classify(q.status_of(qi), e2e, a.deadline_ms, self.accuracy[q.model[qi]], a.min_accuracy)
        if cause in ("deadline_miss", "error") and self._cut(qi):  # the only causes a cut path can turn
            outcome, cause = classify(q.status_of(qi), e2e, a.deadline_ms, self.accuracy[q.model[qi]],
                                      a.min_accuracy, True)
        return outcome, cause, e2e

    def drain_resolved(self) -> list[Resolved]:
        """Queries resolved since the last call (answered or refused by their deadline, or past
        their deadline), in order of resolution time."""
        out: list[Resolved] = []
        h = self.res_heap
        if h is None:
            return out
        q, now = self.q, self.now_s
        while h and h[0][0] <= now:
            t, qi = heapq.heappop(h)
            if q.released[qi]:
                continue
            t4 = q.t4_of(qi)
            if t < q.dl[qi] and (t4 is None or t4 != t):
                continue  # an answer that moved (the server froze): its deadline entry settles it
            q.released[qi] = 1
            outcome, cause, e2e = self._outcome(qi)
            if e2e is not None and t4 > t:
                e2e = None  # not answered by the time it was settled
            out.append(Resolved(self.sources[q.src[qi]], self.apps[q.app[qi]].name, self.policy_names[q.pol[qi]],
                                self.clusters[q.cl[qi]].name, self.model_names[q.model[qi]], q.t0[qi], t,
                                outcome == "success", cause, e2e))
        return out

    def drain_created(self) -> list[tuple[str, str]]:
        """(source, application) of every query created since the last call (one tuple per query,
        grouped by source and application; for arrival-rate features)."""
        out = []
        for (si, ai), n in self._created.items():
            out += [(self.sources[si], self.apps[ai].name)] * n
        self._created = {}
        return out

    def records(self) -> list[dict]:
        """One row per recorded query (``record=True``), keys :data:`testbed.model.records.RECORD_FIELDS`;
        times in ns since the virtual epoch 0 = the load starts. A query answered later than
        deadline + grace counts as unanswered, as in the emulation."""
        q = self.q
        rows = []
        seq = [0] * len(self.sources)  # ids <source>-1, -2, ... in creation order, as the emulated sources give
        for qi in sorted(self.queries_recorded, key=lambda i: (q.t0[i], i)):
            seq[q.src[qi]] += 1
            a = self.apps[q.app[qi]]
            ci = q.cl[qi]

            def ns(v: float | None) -> int | None:
                return None if v is None else int(round(v * 1e9))

            st = q.status_of(qi)
            td = q.td[qi]
            rows.append(make_record(
                query_id=f"{self.sources[q.src[qi]]}-{seq[q.src[qi]]}", source=self.sources[q.src[qi]],
                application=a.name,
                cluster=self.clusters[ci].name, model=self.model_names[q.model[qi]],
                policy=self.policy_names[q.pol[qi]], fallback=q.fb[qi], deadline_ms=a.deadline_ms,
                min_accuracy=a.min_accuracy, model_accuracy=self.accuracy[q.model[qi]],
                expected_rtt_ms=rtt_at(self.rtt_steps[q.src[qi]][ci], td), t0_ns=ns(q.t0[qi]), td_ns=ns(td),
                status=st, t1_ns=ns(q.t1[qi]) if st == 200 else None, t1h_ns=ns(q.t1h[qi]) if st == 200 else None,
                t2_ns=ns(q.t2[qi]), t3_ns=ns(q.t3[qi]), t3h_ns=ns(q.t3h[qi]), t4_ns=ns(q.t4_of(qi)),
                batch=q.batch[qi] or 1, request_bytes=self.req_bytes_app[q.app[qi]],
                response_bytes=self.resp_bytes if st == 200 else 0, queue_len_at_arrival=q.qlen[qi],
                drop_reason=q.reason.get(qi, ""), cut=self._cut(qi)))
        return rows

    def query_table(self):
        """Every query so far as a ``pandas.DataFrame``, one row per query (recorded or not): source,
        application, cluster, model, policy, t0_s, td_s, t1_s, t1h_s, t2_s, t3_s, t3h_s, t4_s (s of simulated
        time; NaN when not reached),
        status (200, 503, -1 refused; NaN: no answer yet), batch (inputs in its model call),
        queue_len_at_arrival. For analysis and tests; :meth:`records` is the run's record schema."""
        import pandas as pd

        q = self.q
        n = len(q)
        return pd.DataFrame({
            "source": [self.sources[i] for i in q.src], "application": [self.apps[i].name for i in q.app],
            "cluster": [self.clusters[i].name for i in q.cl], "model": [self.model_names[i] for i in q.model],
            "policy": [self.policy_names[i] for i in q.pol], "t0_s": q.t0,
            "td_s": q.td, "t1_s": q.t1,
            "t1h_s": pd.array(q.t1h, dtype="Float64"),
            "t2_s": pd.array(q.t2, dtype="Float64"), "t3_s": pd.array(q.t3, dtype="Float64"),
            "t3h_s": pd.array(q.t3h, dtype="Float64"),
            "t4_s": pd.array([q.t4_of(i) for i in range(n)], dtype="Float64"),
            "status": pd.array([q.status_of(i) for i in range(n)], dtype="Int64"),
            "batch": [(b or 1) if t2 is not None else None for b, t2 in zip(q.batch, q.t2, strict=True)],
            "queue_len_at_arrival": pd.array(q.qlen, dtype="Int64")})

    def cluster_stats(self) -> dict[str, dict]:
        """Server counters per cluster, as the emulation's ``clusters/<name>.stats.json``."""
        t = self.now_s
        out = {}
        for c in self.clusters:
            up = max(t, 1e-9)
            out[c.name] = {"queue_len": len(c.queue), "busy": c.queue.busy, "workers": c.workers,
                           "queue_limit": c.queue.limit, "served": c.served, "dropped": c.dropped, "lost": c.lost,
                           "busy_s": round(c.cum_busy(t), 6), "uptime_s": round(t, 6),
                           "utilization": round(c.cum_busy(t) / (up * c.workers), 6)}
        return out

    def write_run(self, run_dir: Path, extra: dict | None = None) -> None:
        """Write the run directory in the emulation's layout: ``sources/<source>.records.csv``
        (:data:`RECORD_FIELDS`) and its tally (:class:`testbed.plan.boundaries.SourceTally`),
        ``clusters/<name>.stats.json``, ``link_stats.csv``, ``plan.json``
        and ``run.json`` (``{"mode": "simulation", ...}``; ``policy_plugins``: for each policy plug-in
        the run used, where it came from, :func:`testbed.model.policies.plugin_origins`)."""
        run_dir = Path(run_dir)
        for sub in ("sources", "clusters"):
            (run_dir / sub).mkdir(parents=True, exist_ok=True)
        by_src: dict[str, list[dict]] = {s: [] for s in self.sources}
        for r in self.records():
            by_src[r["source"]].append(r)
        for s, rs in by_src.items():  # every query the simulator created is a row: created = rows
            path = run_dir / "sources" / f"{s}.records.csv"
            with open(path, "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=RECORD_FIELDS)
                w.writeheader()
                w.writerows(rs)
            write_json_atomic(tally_path(path), SourceTally(source=s, created=len(rs), written=len(rs),
                                                            unwritten=0, failed=0))
        for name, st in self.cluster_stats().items():
            write_json_atomic(run_dir / "clusters" / f"{name}.stats.json", st)
        if self.link_rows:
            with open(run_dir / "link_stats.csv", "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=list(self.link_rows[0]))
                w.writeheader()
                w.writerows(self.link_rows)
        self.plan.write_json(run_dir / "plan.json")
        info = {"mode": "simulation", "seed": self.seed, "duration_s": self.now_s,
                "report_interval_s": self.R, "policies": dict(zip(self.sources, self.src_policy, strict=True)),
                "request_bytes": dict(zip([a.name for a in self.apps], self.req_bytes_app, strict=True)),
                "response_bytes": self.resp_bytes,
                "warmup_s": self.warmup_s, "epoch": "t_ns = 0 when the load starts (virtual)",
                "provenance": provenance(), "policy_plugins": plugin_origins(self.policy_names)}
        write_json_atomic(run_dir / "run.json", info | (extra or {}))


__all__ = ["Queries", "Resolved", "RunColumns"]
