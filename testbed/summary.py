"""Run results: merge the per-source records, summarise them, print and save the summary.

Files in a run directory (all written by :mod:`testbed.run`):
``records.csv`` / ``records.parquet`` (one row per query, columns of
:data:`testbed.model.records.RECORD_FIELDS`), ``link_stats.csv`` (controller port stats per poll),
``rtt_check.csv``, ``clusters/<name>.stats.json`` (server counters), ``summary.json``, ``summary.md``;
with packet capture also ``capture/queries.csv`` (``pkt_*`` columns, :mod:`testbed.capture.analysis`),
joined into the records here. Every column is documented in docs/records-schema.md.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.table import Table


def read_csv_exact(path: Path) -> pd.DataFrame:
    """``pd.read_csv`` keeping ``*_ns`` columns as nullable 64-bit integers.

    ns since the epoch (~1.8e18) do not fit a float64 exactly (53-bit mantissa: ~256 ns steps), which
    is what a column with empty cells would otherwise become.
    """
    cols = pd.read_csv(path, nrows=0).columns
    return pd.read_csv(path, dtype={c: "Int64" for c in cols if c.endswith("_ns")})


def merge_records(run_dir: Path) -> pd.DataFrame:
    """Concatenate ``sources/*.records.csv`` into ``records.csv`` and ``records.parquet`` (by t0).

    When the packet analysis ran (``capture/queries.csv``), its ``pkt_*`` columns are joined by
    ``query_id`` (left join: queries not seen on the wire keep empty ``pkt_*`` cells).
    """
    parts = [read_csv_exact(p) for p in sorted((run_dir / "sources").glob("*.records.csv")) if p.stat().st_size]
    parts = [p for p in parts if not p.empty]
    df = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    if not df.empty:
        df = df.sort_values("t0_ns", kind="stable").reset_index(drop=True)
        pkt = run_dir / "capture" / "queries.csv"
        if pkt.exists() and pkt.stat().st_size > 1:
            q = read_csv_exact(pkt)
            if not q.empty and "query_id" in q:
                df = df.merge(q.drop_duplicates("query_id"), on="query_id", how="left", validate="one_to_one")
    df.to_csv(run_dir / "records.csv", index=False)
    if not df.empty:
        df.to_parquet(run_dir / "records.parquet", index=False)
    return df


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


def summarize(run_dir: Path, duration_s: float) -> dict:
    """Compute the run summary and write ``summary.json``.

    ``duration_s``: the configured load duration (s). Returns a dict with: ``queries``,
    ``duration_s`` (configured), ``load_s`` (measured, :func:`load_duration_s`), ``success_ratio``,
    ``throughput_qps`` (answered queries per s of measured load), ``failures`` (count per cause),
    ``e2e_ms`` p50/p95/p99 (answered queries), ``breakdown_ms``
    (mean network / queueing / inference of answered queries), ``per_application``, ``per_cluster``
    (queries, success ratio, utilization from the server's busy time), ``links`` (mean and max
    utilization per direction, drops, from the controller's port stats).
    ``capture`` (with packet capture: queries matched, retransmissions, per-hop one-way delay).
    """
    df = merge_records(run_dir)
    s: dict = {"queries": int(len(df)), "duration_s": duration_s,
               "load_s": round(load_duration_s(df["t0_ns"], duration_s), 3) if "t0_ns" in df else duration_s}
    if df.empty:
        s.update(success_ratio=None, failures={}, e2e_ms={}, breakdown_ms={})
    else:
        ok = df["outcome"] == "success"
        # numeric compare: a column with empty cells (unanswered queries) reads back as 200.0
        answered = df[pd.to_numeric(df["http_status"], errors="coerce") == 200]
        s["success_ratio"] = round(float(ok.mean()), 4)
        s["throughput_qps"] = round(len(answered) / s["load_s"], 3) if s["load_s"] > 0 else None
        s["failures"] = {k: int(v) for k, v in df.loc[~ok, "failure_cause"].value_counts().items()}
        s["e2e_ms"] = {f"p{q}": _pct(answered["e2e_ms"], q / 100) for q in (50, 95, 99)}
        s["breakdown_ms"] = {k: (None if answered[f"{k}_ms"].dropna().empty
                                 else round(float(answered[f"{k}_ms"].mean()), 3))
                             for k in ("network", "queueing", "inference")}
        s["per_application"] = {
            app: {"queries": int(len(g)), "success_ratio": round(float((g["outcome"] == "success").mean()), 4),
                  "e2e_p95_ms": _pct(g["e2e_ms"], 0.95)}
            for app, g in df.groupby("application")
        }
    clusters = {}
    for f in sorted((run_dir / "clusters").glob("*.stats.json")):
        name = f.name.removesuffix(".stats.json")
        st = json.loads(f.read_text())
        g = df[df["cluster"] == name] if not df.empty else df
        clusters[name] = {"queries": int(len(g)),
                          "success_ratio": None if g.empty else round(float((g["outcome"] == "success").mean()), 4),
                          "utilization": st.get("utilization"), "served": st.get("served"),
                          "dropped": st.get("dropped")}
    s["per_cluster"] = clusters
    links_csv = run_dir / "link_stats.csv"
    links = {}
    if links_csv.exists() and links_csv.stat().st_size:
        ls = pd.read_csv(links_csv)
        for (a, b, kind), g in ls.groupby(["a", "b", "kind"]):
            links[f"{a}-{b}"] = {"kind": kind, "capacity_mbps": float(g["capacity_mbps"].iloc[0]),
                                 "util_ab_mean": round(float(g["util_ab"].mean()), 5),
                                 "util_ab_max": round(float(g["util_ab"].max()), 5),
                                 "util_ba_mean": round(float(g["util_ba"].mean()), 5),
                                 "util_ba_max": round(float(g["util_ba"].max()), 5),
                                 "drops": int(g["drops_total"].max() - g["drops_total"].min())}
    s["links"] = links
    cap = run_dir / "capture" / "analysis.json"
    if cap.exists():
        a = json.loads(cap.read_text())
        s["capture"] = {"queries_matched": a.get("queries_matched"), "retransmissions": a.get("retransmissions"),
                        "hops": {f"{h['from']}>{h['to']}": {k: h.get(k) for k in
                                                            ("packets", "median_ms", "p95_ms", "configured_ms")}
                                 for h in a.get("hop_delays", [])}}
    (run_dir / "summary.json").write_text(json.dumps(s, indent=2))
    return s


def print_summary(s: dict, console: Console, run_dir: Path | None = None) -> None:
    """Print the summary as tables (and save them as ``summary.md`` when ``run_dir`` is given)."""
    rec = Console(record=True, width=110, file=io.StringIO())
    for c in (console, rec):
        sr = s.get("success_ratio")
        load = s.get("load_s", s["duration_s"])
        span = f"{load:g} s" if load == s["duration_s"] else f"{load:g} s of load (configured {s['duration_s']:g} s)"
        c.print(f"[bold]Summary[/bold]: {s['queries']} queries in {span}, success ratio "
                f"{'-' if sr is None else f'{sr:.3f}'}, answered {s.get('throughput_qps', 0)} q/s; "
                f"failures {s.get('failures') or 'none'}")
        e, b = s.get("e2e_ms", {}), s.get("breakdown_ms", {})
        if e:
            c.print(f"e2e ms: p50 {e.get('p50')}  p95 {e.get('p95')}  p99 {e.get('p99')};  mean breakdown ms: "
                    f"network {b.get('network')}  queueing {b.get('queueing')}  inference {b.get('inference')}")
        t = Table(title="Per cluster")
        for col in ("cluster", "queries", "success ratio", "utilization", "served", "dropped"):
            t.add_column(col)
        for name, v in s.get("per_cluster", {}).items():
            t.add_row(name, str(v["queries"]), str(v["success_ratio"]), str(v["utilization"]),
                      str(v["served"]), str(v["dropped"]))
        c.print(t)
        t = Table(title="Busiest links (controller port stats)")
        for col in ("link", "capacity Mbit/s", "util a>b mean/max", "util b>a mean/max", "drops"):
            t.add_column(col)
        top = sorted(s.get("links", {}).items(), key=lambda kv: -max(kv[1]["util_ab_max"], kv[1]["util_ba_max"]))
        for name, v in top[:8]:
            t.add_row(name, f"{v['capacity_mbps']:g}", f"{v['util_ab_mean']:.4f}/{v['util_ab_max']:.4f}",
                      f"{v['util_ba_mean']:.4f}/{v['util_ba_max']:.4f}", str(v["drops"]))
        c.print(t)
        cap = s.get("capture")
        if cap:
            t = Table(title=f"Per-hop one-way delay, packet capture ({cap['queries_matched']} queries matched, "
                            f"{cap['retransmissions']} retransmissions)")
            for col in ("hop", "packets", "median ms", "p95 ms", "configured ms"):
                t.add_column(col)
            for hop, v in cap["hops"].items():
                t.add_row(hop, str(v["packets"]), f"{v['median_ms']:.3f}", f"{v['p95_ms']:.3f}",
                          "-" if v["configured_ms"] is None else f"{v['configured_ms']:g}")
            c.print(t)
    if run_dir is not None:
        (run_dir / "summary.md").write_text(rec.export_text())
