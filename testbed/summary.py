"""Run results: merge the per-source records, summarise them, print and save the summary.

Files in a run directory (all written by :mod:`testbed.run`):
``records.csv`` / ``records.parquet`` (one row per query, columns of
:data:`testbed.workload.RECORD_FIELDS`), ``link_stats.csv`` (controller port stats per poll),
``rtt_check.csv``, ``clusters/<name>.stats.json`` (server counters), ``summary.json``, ``summary.md``.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.table import Table


def merge_records(run_dir: Path) -> pd.DataFrame:
    """Concatenate ``sources/*.records.csv`` into ``records.csv`` and ``records.parquet`` (by t0)."""
    parts = [pd.read_csv(p) for p in sorted((run_dir / "sources").glob("*.records.csv")) if p.stat().st_size]
    df = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    if not df.empty:
        df = df.sort_values("t0_ns", kind="stable").reset_index(drop=True)
    df.to_csv(run_dir / "records.csv", index=False)
    if not df.empty:
        df.to_parquet(run_dir / "records.parquet", index=False)
    return df


def _pct(series: pd.Series, q: float) -> float | None:
    s = series.dropna()
    return None if s.empty else round(float(s.quantile(q)), 3)


def summarize(run_dir: Path, duration_s: float) -> dict:
    """Compute the run summary and write ``summary.json``.

    Returns a dict with: ``queries``, ``success_ratio``, ``throughput_qps`` (answered queries per s of
    load), ``failures`` (count per cause), ``e2e_ms`` p50/p95/p99 (answered queries), ``breakdown_ms``
    (mean network / queueing / inference of answered queries), ``per_application``, ``per_cluster``
    (queries, success ratio, utilization from the server's busy time), ``links`` (mean and max
    utilization per direction, drops, from the controller's port stats).
    """
    df = merge_records(run_dir)
    s: dict = {"queries": int(len(df)), "duration_s": duration_s}
    if df.empty:
        s.update(success_ratio=None, failures={}, e2e_ms={}, breakdown_ms={})
    else:
        ok = df["outcome"] == "success"
        answered = df[df["http_status"].astype(str) == "200"]
        s["success_ratio"] = round(float(ok.mean()), 4)
        s["throughput_qps"] = round(len(answered) / duration_s, 3)
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
    (run_dir / "summary.json").write_text(json.dumps(s, indent=2))
    return s


def print_summary(s: dict, console: Console, run_dir: Path | None = None) -> None:
    """Print the summary as tables (and save them as ``summary.md`` when ``run_dir`` is given)."""
    rec = Console(record=True, width=110, file=io.StringIO())
    for c in (console, rec):
        sr = s.get("success_ratio")
        c.print(f"[bold]Summary[/bold]: {s['queries']} queries in {s['duration_s']:g} s, success ratio "
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
    if run_dir is not None:
        (run_dir / "summary.md").write_text(rec.export_text())
