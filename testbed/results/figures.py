"""The figures of a run's summary, computed from its merged records and the files beside them.

Every count of queries (totals, per cause, per cluster, per application) comes from the records
(:mod:`testbed.results.record_files`); the servers' own counters (:func:`_server_counters`), the link
emulators' (:func:`_link_emulators`) and the controller's port stats (:func:`_links`) are kept
apart. Latency figures follow one rule (:func:`latency_figures`, :data:`LATENCY_RULE`), the
summary's and ``testbed report``'s. Times in ms unless a name says otherwise.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd

from testbed.core.clock import EmulatedClock
from testbed.core.util import natural_key
from testbed.emu.health import read_health
from testbed.emu.machine import machine_cpu_of_run
from testbed.model.cpu import COLD_AFTER_S
from testbed.model.records import CAUSES, SHARES
from testbed.plan.speeds import read_speeds

#: What ``cold = 1`` marks (printed with the summary; docs/trustworthy-runs.md, "New connections").
COLD_RULE = ("every source -> cluster/model path was warmed and each source opened one connection to every cluster "
             "before the load (warm-up requests are not records); cold = 1 marks a query that opened a new TCP "
             "connection because none to its cluster was idle (its other queries or its stats poll held them, "
             "as in a burst, or the idle one had been closed): it paid one more round trip for the handshake "
             "and counts in every figure, latency percentiles and mean breakdown included")
#: Which queries the latency percentiles and the mean breakdown are taken over (:func:`latency_figures`;
#: printed beside them in the summary and in ``testbed report``).
LATENCY_RULE = "over every answered query (HTTP 200 with an e2e time), cold ones (new connections) included"


def _pct(series: pd.Series, q: float) -> float | None:
    s = series.dropna()
    return None if s.empty else round(float(s.quantile(q)), 3)


def load_duration_s(t0_ns: pd.Series, duration_s: float) -> float:
    """Seconds of load the records cover: the measured span of t0, never above ``duration_s``.

    A run stopped early (Ctrl-C) covers less than its configured duration. For n arrivals of a
    Poisson process in [0, T], the span max - min of the arrival times has expectation
    T (n - 1) / (n + 1) (order statistics of n uniform points), so T is estimated as
    span x (n + 1) / (n - 1), capped at the configured ``duration_s`` (s). Fewer than 2 queries:
    ``duration_s``.
    """
    t = pd.to_numeric(t0_ns, errors="coerce").dropna()
    if len(t) < 2:
        return float(duration_s)
    span_s = (float(t.max()) - float(t.min())) / 1e9
    return min(float(duration_s), span_s * (len(t) + 1) / (len(t) - 1))


# ----------------------------------------------------------------------------- parts of the summary

def _causes(g: pd.DataFrame) -> dict[str, int]:
    """Failures of ``g`` per cause, every cause present (0 when none)."""
    counts = g.loc[g["outcome"] != "success", "failure_cause"].astype("string").fillna("").value_counts()
    out = {c: int(counts.get(c, 0)) for c in CAUSES}
    for c, n in counts.items():  # a cause outside CAUSES would be a bug upstream: shown, not hidden
        if c not in out:
            out[str(c) or "unknown"] = int(n)
    return out


#: What each failure cause means, for the headline of a run in which every query failed.
CAUSE_MEANING: dict[str, str] = {
    "unreachable": "no route from the source to its cluster: a link cut by an event (events.csv), or none at all",
    "deadline_miss": "no answer within the deadline",
    "server_down": "nothing listened at the cluster (connection refused or reset)",
    "dropped": "refused by the server's queue bound or admission",
    "error": "an HTTP error or a client-side error",
    "accuracy": "every model chosen is less accurate than the application asks",
}


def all_failed_reason(queries: int, failures: dict[str, int]) -> str:
    """Why a run in which every one of its ``queries`` failed did so: its causes, most frequent
    first, each with its count and meaning (:data:`CAUSE_MEANING`)."""
    parts = [f"{c} {n} ({CAUSE_MEANING.get(c, 'unknown cause')})"
             for c, n in sorted(failures.items(), key=lambda kv: (-kv[1], kv[0])) if n]
    return f"every one of the {queries} queries failed: " + "; ".join(parts)


def answered(df: pd.DataFrame) -> pd.DataFrame:
    """The answered queries of records ``df``: HTTP 200 with an e2e time (ms). The rows of every
    latency figure (:func:`latency_figures`) and of the answered counts, in the summary and in
    ``testbed report`` alike."""
    if df.empty or "http_status" not in df or "e2e_ms" not in df:
        return df.iloc[0:0]
    # numeric compare: a column with empty cells (unanswered queries) reads back as 200.0
    status = pd.to_numeric(df["http_status"], errors="coerce")
    return df[(status == 200) & pd.to_numeric(df["e2e_ms"], errors="coerce").notna()]


def cold_queries(df: pd.DataFrame) -> int:
    """Queries of ``df`` that opened a new TCP connection (``cold = 1``, :data:`COLD_RULE`)."""
    if df.empty or "cold" not in df:
        return 0
    return int((pd.to_numeric(df["cold"], errors="coerce").fillna(0) == 1).sum())


def network_excess(df: pd.DataFrame) -> pd.Series:
    """``network_ms - expected_rtt_ms`` per query of ``df`` (ms; NaN where either is missing): the
    network time beyond the RTT of the path in force when the query was sent, that is the transfer
    of request and answer on the links (their rates and queues), a cold query's TCP handshake, and
    in an emulation the forwarding cost of its own processes."""
    return _numeric(df, "network_ms") - _numeric(df, "expected_rtt_ms")


def latency_figures(df: pd.DataFrame) -> dict:
    """The latency figures of records ``df`` (:data:`LATENCY_RULE`): ``e2e_ms`` p50/p95/p99 and
    ``breakdown_ms`` (mean of each of the five shares of e2e, :data:`testbed.model.records.SHARES`:
    dispatch / network / handling / queueing / inference), all in ms rounded to 3 decimals (None
    without an answered query), over :func:`answered`; ``network_excess_ms`` p50/p95
    (:func:`network_excess`); ``answered`` (queries) and ``cold_queries`` (queries that opened a new
    connection, every outcome)."""
    ans = answered(df)
    breakdown = {}
    for k in SHARES:
        col = _numeric(ans, f"{k}_ms").dropna()
        breakdown[k] = None if col.empty else round(float(col.mean()), 3)
    excess = network_excess(ans).dropna()
    return {"e2e_ms": {f"p{q}": _pct(_numeric(ans, "e2e_ms"), q / 100) for q in (50, 95, 99)},
            "breakdown_ms": breakdown, "network_excess_ms": {f"p{q}": _pct(excess, q / 100) for q in (50, 95)},
            "answered": int(len(ans)), "cold_queries": cold_queries(df)}


def path_stages(df: pd.DataFrame) -> dict[str, dict]:
    """Per path (``<source>><cluster>``) of the answered queries of ``df``: ``answered`` and the
    median and p95 (ms) of each share of e2e (:data:`testbed.model.records.SHARES`), of
    ``network_excess`` (:func:`network_excess`) and of ``expected_rtt``: where the time of each path
    goes (the twin report compares these between the engines)."""
    ans = answered(df)
    if ans.empty or "source" not in ans or "cluster" not in ans:
        return {}
    out: dict[str, dict] = {}
    for (src, cl), g in ans.groupby(["source", "cluster"], sort=True):
        cols = {f"{k}_ms": _numeric(g, f"{k}_ms") for k in SHARES}
        cols["network_excess_ms"] = network_excess(g)
        cols["expected_rtt_ms"] = _numeric(g, "expected_rtt_ms")
        out[f"{src}>{cl}"] = {"answered": int(len(g)),
                              **{name: {"p50": _pct(v.dropna(), 0.5), "p95": _pct(v.dropna(), 0.95)}
                                 for name, v in cols.items()}}
    return out


#: A decision cost is noticeable (a WARNING in the summary's first lines) when a policy's
#: ``dispatch_ms`` p95 is at least this share of the smallest deadline of the applications it
#: decided for. Why 5 %: the built-in policies cost 0.01-0.1 ms a decision here, under 1 % of the
#: smallest deadline of any shipped experiment (10 ms), so they never trip it; at 5 % the decision
#: alone moves e2e by more than the validation's per-stage tolerance (1 ms or 10 % of a stage), and a
#: deadline met with a margin of 5 % or less becomes a miss.
DECISION_SHARE_NOTABLE = 0.05


def decision_costs(df: pd.DataFrame) -> dict[str, dict]:
    """Per policy of records ``df`` (every query, answered or not: its decision was made): the
    decision cost ``dispatch_ms`` p50 / p95 / max (ms), ``queries``, the smallest deadline of its
    queries (``min_deadline_ms``), the p95's share of it (``share_of_deadline``) and ``notable``
    (that share >= :data:`DECISION_SHARE_NOTABLE`)."""
    if df.empty or "dispatch_ms" not in df or "policy" not in df:
        return {}
    out: dict[str, dict] = {}
    for policy, g in df.groupby("policy", sort=True):
        d = _numeric(g, "dispatch_ms").dropna()
        if d.empty:
            continue
        dl = _numeric(g, "deadline_ms").dropna()
        p95 = _pct(d, 0.95)
        share = None if dl.empty or not float(dl.min()) > 0 else round(p95 / float(dl.min()), 4)
        out[str(policy)] = {"queries": int(len(d)), "p50_ms": _pct(d, 0.5), "p95_ms": p95,
                            "max_ms": round(float(d.max()), 3),
                            "min_deadline_ms": None if dl.empty else round(float(dl.min()), 3),
                            "share_of_deadline": share,
                            "notable": share is not None and share >= DECISION_SHARE_NOTABLE}
    return out


def _numeric(df: pd.DataFrame, col: str) -> pd.Series:
    """Column ``col`` of ``df`` as numbers (empty cells and text: NaN; an absent column: empty)."""
    return pd.to_numeric(df[col], errors="coerce") if col in df else pd.Series(dtype=float)


def _per_group(df: pd.DataFrame, by: str) -> dict[str, dict]:
    out = {}
    for key, g in df.groupby(by):
        ok = int((g["outcome"] == "success").sum())
        out[str(key)] = {"queries": int(len(g)), "success": ok, "success_ratio": round(ok / len(g), 4),
                         "answered": int(len(answered(g))), "failures": _causes(g),
                         "e2e_p95_ms": _pct(answered(g)["e2e_ms"], 0.95)}
    return out


def _server_counters(run_dir: Path) -> dict[str, dict]:
    """Per cluster, the servers' own counters summed over the lives of the server.

    ``lives`` counts the lives started (``<cluster>.lives.json``, written by the run) and
    ``lives_not_ready`` those that never became ready (killed or ended while loading: no counters);
    without that file, every stats file is one life. ``calls``: per model, its model calls
    ``timed`` and the ``late`` ones, which ran slower than the speed the run asked
    (:func:`testbed.serve.scheduler.pad_work`)."""
    out: dict[str, dict] = {}
    for f in sorted((run_dir / "clusters").glob("*.stats*.json")):
        name = f.name.split(".stats")[0]
        try:
            st = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        c = out.setdefault(name, {"lives": 0, "lives_not_ready": 0, "served": 0, "dropped": 0,
                                  "dropped_queue_full": 0, "dropped_admission": 0, "errors": 0, "utilization": None,
                                  "calls": {}})
        c["lives"] += 1
        for k in ("served", "dropped", "dropped_queue_full", "dropped_admission", "errors"):
            c[k] += int(st.get(k) or 0)
        for model, pm in (st.get("per_model") or {}).items():
            calls = c["calls"].setdefault(model, {"timed": 0, "late": 0})
            for k in calls:
                calls[k] += int(pm.get(k) or 0)
        if f.name == f"{name}.stats.json":
            c["utilization"] = st.get("utilization")
    for name, c in out.items():
        try:
            lives = json.loads((run_dir / "clusters" / f"{name}.lives.json").read_text())
            c["lives"], c["lives_not_ready"] = int(lives["lives"]), int(lives["lives"]) - int(lives["ready"])
        except (OSError, ValueError, KeyError, TypeError):
            pass
    return out


#: The service check (:func:`_service_check`): a model's median measured call time above this many
#: times its profile's (the plan's unthrottled samples at the cluster's runtime and threads), at a
#: cluster whose server was busy less than :data:`SLOW_SERVICE_MAX_UTILIZATION` of the time, means
#: the machine did not give the cluster its CPU share (the quota is a ceiling, not a guarantee).
#: Measured on a quiet machine, an isolated call at a quarter core takes 1.0-1.3x the unthrottled
#: median (docs/models-and-servers.md, ``iso`` columns), so 1.75x is beyond the share's own effect.
SLOW_SERVICE_FACTOR = 1.75
SLOW_SERVICE_MAX_UTILIZATION = 0.5
#: ... and the median call must also exceed what is expected by at least this much (ms). Why: the
#: measured call time (t3 - t2 at the server) carries a fixed overhead per call that the profile's
#: bare call has not (the hand-off to the worker and the time stamps): an unloaded server measures
#: digits_small's 0.007 ms LiteRT call at 0.034 ms (``benchmarks/server_bench.py --variants
#: digits_small --runtimes litert``), and on a loaded machine at 0.073 ms, 9.86x, which the ratio
#: alone would report as starvation on every triangle-litert run. TensorFlow's is larger: its cold
#: call of digits_small in a 0.5-core cgroup took 1.27-1.41 ms (triangle runs at load 0.3-0.5,
#: docs/trustworthy-runs.md) against 0.64 ms expected with its cold factor (profile 0.31 ms x 2.07,
#: ``models/profiles/handling.json``), 0.7 ms over, which a floor of 0.5 ms would report as starvation
#: on every triangle run. 1.0 ms is above that; every model of the real-DNN experiments has a profile of
#: 2 ms or more, where 1.75x is an excess of 1.5 ms or more, so the floor hides no starvation of theirs.
SLOW_SERVICE_MIN_EXCESS_MS = 1.0
#: Fewest answered, unbatched queries of a (cluster, model) for the service check to judge it.
SERVICE_CHECK_MIN_QUERIES = 10


def cold_calls(df: pd.DataFrame) -> pd.Series:
    """Which answered model calls were cold by the CPU model's rule (:mod:`testbed.model.cpu`): a
    call that started (t2) at least :data:`~testbed.model.cpu.COLD_AFTER_S` after the previous
    call at the same cluster ended (t3); a cluster's first call is cold. ``df``: records with
    ``cluster``, ``t2_ns``, ``t3_ns``. Returns a boolean Series on ``df``'s index (False where t2
    or t3 is missing)."""
    t = df[["cluster", "t2_ns", "t3_ns"]].dropna().sort_values(["cluster", "t2_ns"])
    prev_end = t.groupby("cluster")["t3_ns"].transform(lambda s: s.cummax().shift())
    cold = (t["t2_ns"] - prev_end >= COLD_AFTER_S * 1e9) | prev_end.isna()
    return cold.reindex(df.index, fill_value=False)


def plan_dilation(plan: dict | None) -> float:
    """k of a run from its ``plan.json`` (``emulation.time_dilation``): 1 when absent, and for a
    simulated run of an experiment that says ``auto`` (the simulator's clock is virtual)."""
    k = (((plan or {}).get("experiment") or {}).get("emulation") or {}).get("time_dilation", 1.0)
    return 1.0 if k in (None, "auto") else float(k)


def _plan_doc(run_dir: Path) -> dict | None:
    """The run's plan.json as an object, or None when it is missing or unreadable (a run made
    before plans were saved, or a file cut short)."""
    try:
        doc = json.loads((run_dir / "plan.json").read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _service_check(df: pd.DataFrame, per_cluster: dict, plan: dict | None) -> dict:
    """Measured inference time per (cluster, model) against the plan's profile.

    The expected call is the plan's profile median (the in-server call), times the model's cold
    factor for the calls that were cold by the CPU model's rule (:func:`cold_calls`): at a few
    queries per second every call is cold, and TensorFlow's cold call is about twice its warm one
    (``models/profiles/handling.json``).

    Returns ``{"per_model": {"<cluster>/<model>": {"queries", "cold_queries", "measured_p50_ms",
    "profile_p50_ms", "expected_p50_ms" (with the cold calls' factor), "ratio" (measured /
    expected), "excess_ms" (measured - expected, ms)}}, "starved": [keys judged slow: ratio >=
    SLOW_SERVICE_FACTOR and excess >= SLOW_SERVICE_MIN_EXCESS_MS at a server busy <
    SLOW_SERVICE_MAX_UTILIZATION]}``, and the 1-minute load average of the machine and its CPU
    count when the summary was made (``loadavg_1min``, ``cpus``). Empty ``per_model`` when the
    run has no plan.json (a simulated run compares with itself).
    """
    out: dict = {"per_model": {}, "starved": [], "loadavg_1min": round(os.getloadavg()[0], 2),
                 "cpus": os.cpu_count()}
    if df.empty or "inference_ms" not in df or plan is None:
        return out
    services = plan.get("services") or {}
    lat = answered(df)
    cold = cold_calls(lat) if {"t2_ns", "t3_ns"} <= set(lat.columns) else pd.Series(False, index=lat.index)
    lat = lat[lat["inference_ms"].notna() & (lat["batch"].fillna(1) <= 1)] if "batch" in lat else lat
    for (cluster, model), g in lat.groupby(["cluster", "model"]):
        fig = (services.get(str(cluster)) or {}).get(str(model))
        if not fig or len(g) < SERVICE_CHECK_MIN_QUERIES:
            continue
        prof = float(np.median(fig["samples_ms"]))
        g_cold = cold.reindex(g.index, fill_value=False)
        expected = float(np.median(np.where(g_cold, prof * float(fig.get("cold_factor", 1.0)), prof)))
        meas = float(g["inference_ms"].median())
        key = f"{cluster}/{model}"
        out["per_model"][key] = {"queries": int(len(g)), "cold_queries": int(g_cold.sum()),
                                 "measured_p50_ms": round(meas, 3), "profile_p50_ms": round(prof, 3),
                                 "expected_p50_ms": round(expected, 3), "ratio": round(meas / expected, 2),
                                 "excess_ms": round(meas - expected, 3)}
        util = (per_cluster.get(str(cluster)) or {}).get("utilization")
        slow = meas >= SLOW_SERVICE_FACTOR * expected and meas - expected >= SLOW_SERVICE_MIN_EXCESS_MS
        if slow and util is not None and util < SLOW_SERVICE_MAX_UTILIZATION:
            out["starved"].append(key)
    return out


#: Link emulator counters (``linkemu/<node>.json``, both directions summed): summary key -> stats prefix.
LINKEMU_COUNTERS = {"lost": "lost", "overflow": "overflow", "shaper_drops": "shaper_drops",
                    "dropped_down": "dropped_down", "kernel_drops": "kernel_drops", "send_errors": "send_errors"}


def _link_emulators(run_dir: Path) -> dict:
    """Lateness (ms behind the due time) and drops of every user-space link emulator: the loss
    model (``lost``), its FIFO (``overflow``), the bandwidth shaper's queue (``shaper_drops``: the
    emulated link's own queue, as congestion drops it), frames that met the link down
    (``dropped_down``), the kernel receive buffer (``kernel_drops``: the emulator fell behind) and
    send errors."""
    rows = {}
    for f in sorted((run_dir / "linkemu").glob("*.json"), key=lambda p: natural_key(p.stem)):  # l1, l2, .., l10
        try:
            st = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        row = {"delay_ms": st.get("delay_ms"),
               "frames": int(st.get("frames_ab", 0) or 0) + int(st.get("frames_ba", 0) or 0),
               "max_late_ms": round(float(st.get("max_lateness_us", 0.0) or 0.0) / 1e3, 3),
               "mean_late_ms": round(float(st.get("mean_lateness_us", 0.0) or 0.0) / 1e3, 3)}
        for key, prefix in LINKEMU_COUNTERS.items():
            row[key] = int(st.get(f"{prefix}_ab", 0) or 0) + int(st.get(f"{prefix}_ba", 0) or 0)
        rows[f.stem] = row
    if not rows:
        return {}
    total = {k: sum(r[k] for r in rows.values()) for k in ("frames", *LINKEMU_COUNTERS)}
    total["max_late_ms"] = max(r["max_late_ms"] for r in rows.values())
    return {"per_emulator": rows, "total": total}


def switch_of(plan: dict) -> dict[str, str]:
    """link_stats.csv ``a``/``b`` value -> switch name: the emulation writes DPIDs, the simulator names.
    ``plan``: plan.json's object."""
    out = {str(s["dpid"]): s["name"] for s in plan.get("switches", [])}
    out.update({s["name"]: s["name"] for s in plan.get("switches", [])})
    return out


def node_names(plan: dict) -> dict[str, str]:
    """link_stats.csv ``a``/``b`` value (DPID or switch name) -> switch label (the topology's place
    name); hosts keep their name. ``plan``: plan.json's object."""
    label = {s["name"]: s.get("label") or s["name"] for s in plan.get("switches", [])}
    return {k: label[v] for k, v in switch_of(plan).items()}


def _links(run_dir: Path, plan: dict | None) -> dict:
    """Per link of link_stats.csv, named by its ends' place names (:func:`node_names`; DPIDs or
    switch names when the run has no readable plan.json), as the report names them: utilization
    mean and max per direction, drops over the run."""
    links_csv = run_dir / "link_stats.csv"
    links = {}
    if links_csv.exists() and links_csv.stat().st_size:
        try:
            names = node_names(plan or {})
        except (TypeError, KeyError, AttributeError):  # a plan.json of another shape: name them as written
            names = {}
        ls = pd.read_csv(links_csv)
        for (a, b, kind), g in ls.groupby(["a", "b", "kind"]):
            a, b = names.get(str(a), str(a)), names.get(str(b), str(b))
            links[f"{a}-{b}"] = {"kind": kind, "capacity_mbps": float(g["capacity_mbps"].iloc[0]),
                                 "util_ab_mean": round(float(g["util_ab"].mean()), 5),
                                 "util_ab_max": round(float(g["util_ab"].max()), 5),
                                 "util_ba_mean": round(float(g["util_ba"].mean()), 5),
                                 "util_ba_max": round(float(g["util_ba"].max()), 5),
                                 "drops": int(g["drops_total"].max() - g["drops_total"].min())}
    return links


def aset_sources(plan: dict) -> set[str]:
    """The sources of a run's ``plan.json`` whose dispatcher ASET drives (policy ``aset``, their own
    or the experiment's): their records' ``policy`` column holds the policy ASET chose per window."""
    exp = (plan or {}).get("experiment") or {}
    return {str(s.get("name")) for s in exp.get("sources") or []
            if (s.get("policy") or exp.get("policy")) == "aset"}


def _aset_choices(plan: dict | None, df: pd.DataFrame) -> dict[str, float]:
    """Share (0-1) of the ASET-driven sources' queries sent under each policy ASET chose ({} when no
    source applies aset; ``plan``: plan.json's object): what the agent did, which the run's figures
    are the outcome of."""
    driven = aset_sources(plan or {})
    if not driven or df.empty or "source" not in df or "policy" not in df:
        return {}
    pols = df.loc[df["source"].astype(str).isin(driven), "policy"].astype(str)
    return {k: round(float(v), 4) for k, v in pols.value_counts(normalize=True).items()} if len(pols) else {}


def _machine_cpu(run_dir: Path, df: pd.DataFrame, plan: dict | None = None) -> tuple[dict, str]:
    """The machine's CPU over the load the records show (the first to the last query's t0: not
    the sources' start-up before, nor the teardown after; under time dilation k, the records'
    emulated instants taken back to the wall clock), from an emulation's samples
    (:func:`testbed.emu.machine.machine_cpu_of_run`): ``({}, "")`` for a simulation, ``({},
    why)`` when the samples are unreadable or too few."""
    t0 = pd.to_numeric(df["t0_ns"], errors="coerce").dropna() if "t0_ns" in df else pd.Series(dtype=float)
    if t0.empty:
        return {}, ""
    lo, hi = float(t0.min()) / 1e9, float(t0.max()) / 1e9
    clock = EmulatedClock(plan_dilation(plan))
    if clock.dilated:  # the records are in emulated time, the samples on the wall clock
        try:
            clock = clock.at(int(json.loads((run_dir / "load_start.json").read_text())["start_ns"]))
        except (OSError, ValueError, KeyError, TypeError):
            return {}, "the load's start (load_start.json) is unreadable: no wall-clock window for the CPU samples"
        lo, hi = clock.wall_ns(int(t0.min())) / 1e9, clock.wall_ns(int(t0.max())) / 1e9
    got, note = machine_cpu_of_run(run_dir, lo, hi)
    return (got.model_dump() if got else {}), note


# ----------------------------------------------------------------------------- the summary's steps

def query_figures(df: pd.DataFrame, duration_s: float) -> dict:
    """The figures of the queries themselves, from records ``df`` (``duration_s``: the configured
    load, s): ``queries``, ``duration_s``, ``load_s`` (:func:`load_duration_s`), ``cold_rule``,
    ``latency_rule``, ``success_ratio`` (0-1, None without records), ``throughput_qps`` (answered
    per s of load), ``failures`` (per cause, causes with none left out), ``drop_reasons``,
    ``cold_queries``, ``e2e_ms``, ``breakdown_ms``, ``network_excess_ms`` (:func:`latency_figures`),
    ``per_path`` (:func:`path_stages`), ``decision_cost`` (:func:`decision_costs`) and
    ``per_application`` (:func:`_per_group`); ``all_failed`` (:func:`all_failed_reason`) when
    no query succeeded."""
    s: dict = {"queries": int(len(df)), "duration_s": duration_s,
               "load_s": round(load_duration_s(df["t0_ns"], duration_s), 3) if "t0_ns" in df else duration_s,
               "cold_rule": COLD_RULE, "latency_rule": LATENCY_RULE}
    if df.empty:
        s.update(success_ratio=None, failures={}, e2e_ms={}, breakdown_ms={}, per_application={}, cold_queries=0)
        return s
    ok = df["outcome"] == "success"
    lat = latency_figures(df)
    s["success_ratio"] = round(float(ok.mean()), 4)
    s["throughput_qps"] = round(lat["answered"] / s["load_s"], 3) if s["load_s"] > 0 else None
    s["failures"] = {k: v for k, v in _causes(df).items() if v}
    dropped = df[df["failure_cause"] == "dropped"]
    s["drop_reasons"] = {str(k) or "unknown": int(v)
                         for k, v in dropped["drop_reason"].astype("string").fillna("").value_counts().items()}
    s.update(cold_queries=lat["cold_queries"], e2e_ms=lat["e2e_ms"], breakdown_ms=lat["breakdown_ms"],
             network_excess_ms=lat["network_excess_ms"], per_path=path_stages(df), decision_cost=decision_costs(df))
    s["per_application"] = _per_group(df, "application")
    if not ok.any():
        s["all_failed"] = all_failed_reason(s["queries"], s["failures"])
    return s


def cluster_figures(run_dir: Path, df: pd.DataFrame) -> dict[str, dict]:
    """Per cluster: the records' figures (:func:`_per_group`), with the server's own counters apart
    (``utilization``, ``server``: :func:`_server_counters`) and its cgroup's CPU during the load
    (``cpu``: ``clusters/<name>.cpu.json``) when the run has them."""
    per_cluster = _per_group(df, "cluster") if not df.empty else {}
    for name, counters in _server_counters(run_dir).items():
        row = per_cluster.setdefault(name, {"queries": 0, "success": 0, "success_ratio": None, "answered": 0,
                                            "failures": dict.fromkeys(CAUSES, 0), "e2e_p95_ms": None})
        row["utilization"] = counters["utilization"]
        row["server"] = counters
    for f in sorted((run_dir / "clusters").glob("*.cpu.json")):
        name = f.name.removesuffix(".cpu.json")
        if name in per_cluster:
            try:
                per_cluster[name]["cpu"] = json.loads(f.read_text())
            except (OSError, ValueError):
                continue
    return per_cluster


def run_facts(run_dir: Path, df: pd.DataFrame, plan: dict | None) -> dict:
    """What the run's own files say beside the records: ``host_speed`` (``host_speed.json``, ``{}``
    when not measured), ``speeds`` (``run.json`` ``speeds``, :func:`testbed.plan.speeds.read_speeds`;
    absent when the run has none), ``machine_cpu`` and ``machine_cpu_note`` (:func:`_machine_cpu`), and when
    present ``health`` (``run.json``), ``aset_choices`` (:func:`_aset_choices`) and ``provenance``
    (the command and code the run came from, :func:`testbed.core.util.provenance`)."""
    out: dict = {}
    try:
        out["host_speed"] = json.loads((run_dir / "host_speed.json").read_text())
    except (OSError, ValueError):
        out["host_speed"] = {}
    try:
        speeds = read_speeds(run_dir)
    except ValueError:
        speeds = None
    if speeds is not None:
        out["speeds"] = speeds.model_dump(mode="json")
    out["machine_cpu"], out["machine_cpu_note"] = _machine_cpu(run_dir, df, plan)
    health = read_health(run_dir)
    if health:
        out["health"] = health
    choices = _aset_choices(plan, df)
    if choices:
        out["aset_choices"] = choices
    try:
        prov = json.loads((run_dir / "run.json").read_text()).get("provenance")
    except (OSError, ValueError, AttributeError):
        prov = None
    if isinstance(prov, dict) and prov.get("command"):
        out["provenance"] = prov
    return out


def capture_figures(run_dir: Path) -> dict | None:
    """The packet analysis's figures (``capture/analysis.json``, :mod:`testbed.results.pcap_analysis`):
    queries matched, retransmissions, per-hop one-way delay (ms) and the files it could not read;
    None without packet capture."""
    cap = run_dir / "capture" / "analysis.json"
    if not cap.exists():
        return None
    a = json.loads(cap.read_text())
    return {"queries_matched": a.get("queries_matched"), "retransmissions": a.get("retransmissions"),
            "hops": {f"{h['from']}>{h['to']}": {k: h.get(k) for k in
                                                ("packets", "median_ms", "p95_ms", "configured_ms", "emulated_ms")}
                     for h in a.get("hop_delays", [])},
            "errors": list(a.get("errors") or [])}
