"""Experiment reports: ``testbed report RUN_DIR [RUN_DIR ...] [--out DIR]``.

Reads run directories (emulated or simulated: same record schema, docs/records-schema.md) and writes
into ``--out``: ``report.html`` (self-contained: every figure embedded as a base64 PNG),
``report.md`` (same content, linking the PNGs) and ``figures/*.png``. Figures (docs/reports.md):

* ``latency_cdf.png``: CDF of end-to-end latency (ms) of answered queries, per run and policy;
* ``breakdown.png``: mean network / queueing / inference time (ms) of answered queries;
* ``success_over_time.png``: success ratio per time bin (s since the run's first query);
* ``policy_over_time.png``: the policy in force for each query (``policy`` column) over time;
* ``link_util_<k>.png``: per run with ``link_stats.csv``: link utilization over time as a heatmap
  (max of both directions, controller port stats) beside the topology drawn on its coordinates
  (lon/lat from ``plan.json``), links coloured by mean utilization;
* ``hop_delays.png``: with packet capture: per-hop one-way delay against the configured link delay;
* a comparison table across runs (status, queries, success ratio, q/s, e2e percentiles, breakdown).

Each run's status comes from its ``run.json`` (:func:`run_status`): ok, failed (what failed),
interrupted, killed, or unfinished. A run that did not end ok is flagged (``NOT OK`` before its
status in the table, ``[status]`` after its label in the figures, a warning above the table):
its records stop early, or those after the failure are not of the planned experiment.

Latency figures are the summary's (:func:`testbed.results.summary.latency_figures`, the same answered
queries, :data:`testbed.results.summary.LATENCY_RULE`, stated under the table): a run's row equals its
``summary.md`` line; the table also counts the queries that opened a new connection (``cold``).
"""

from __future__ import annotations

import json
import os
import shutil
from datetime import datetime
from pathlib import Path

import pandas as pd

from testbed.core.errors import EXIT_INTERRUPTED, InputError
from testbed.results.figures import COLD_RULE, LATENCY_RULE, latency_figures, load_duration_s
from testbed.results.page import Block, write_html, write_markdown
from testbed.results.plots import (
    RunData,
    RunStatus,
    _groups,
    _t_s,
    fig_breakdown,
    fig_hop_delays,
    fig_latency_cdf,
    fig_link_utilization,
    fig_policy_over_time,
    fig_success_over_time,
)
from testbed.results.record_files import check_records, merge_records, read_records
from testbed.results.render import _headline, capture_warnings


class ReportError(InputError):
    """A run directory that cannot be reported on (named in the message)."""


def _first_sentence(text: str) -> str:
    return str(text).split(". ")[0].rstrip(".")


def run_status(run: dict) -> RunStatus:
    """A run's status from its ``run.json`` (written by :mod:`testbed.emu.lifecycle`; ``killed`` set by
    :func:`testbed.emu.cleanup.mark_killed_runs`). A component that failed is named
    (``health.failure``, or the exit code and first sentence of ``message``); a simulated run's
    ``run.json`` without a status is ok (the simulator writes its run directory only once it
    finished); an emulated one without a status is ``unknown``."""
    status, code = run.get("status"), run.get("exit_code")
    failure = run.get("failure") or {}
    message = _first_sentence(run.get("message") or "")
    if status == "ok" or (status is None and run.get("mode") == "simulation"):
        return RunStatus("ok", "")
    if status == "killed":
        ended = run.get("ended") or {}
        return RunStatus("killed", f"before it finished, found by {ended.get('found_by', '?')} at "
                                   f"{ended.get('found_at', '?')}: its records stop where it was killed")
    if status == "running":
        return RunStatus("unfinished", "run.json says running: under way, or killed and not yet found by a "
                                       "later run or testbed cleanup")
    if code == EXIT_INTERRUPTED:
        return RunStatus("interrupted", "Ctrl-C or SIGTERM: its records stop there")
    if status == "failed" and failure:
        return RunStatus(f"failed: {failure.get('kind', '')} {failure.get('component', '')}".rstrip(),
                         _first_sentence(failure.get("message") or message))
    if status == "failed":
        return RunStatus(f"failed (exit {code})", message)
    return RunStatus("unknown", f"run.json has no status ({status!r})")


def _json(path: Path) -> dict:
    """A run's JSON file as a dict ({} when absent or empty).

    Raises:
        ReportError: it is not valid JSON (cut short?) or not an object, naming the file."""
    if not (path.exists() and path.stat().st_size):
        return {}
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ReportError(f"{path}: not valid JSON ({exc}): the file was cut short or replaced") from None
    if not isinstance(data, dict):
        raise ReportError(f"{path}: expected a JSON object, found {type(data).__name__}")
    return data


#: ``run.json`` statuses of a run whose teardown did not merge its records: a ``records.csv`` or
#: ``records.parquet`` in it is not the run's own (an older ``testbed report`` wrote one), so the
#: report merges the sources instead.
UNMERGED_STATUSES = ("running", "killed")


def merged_by_its_run(run_dir: Path) -> bool:
    """Whether ``run_dir``'s ``records.csv``/``records.parquet`` is its own run's merge: present, and
    ``run.json`` does not say the run stopped before its teardown (:data:`UNMERGED_STATUSES`).

    Raises:
        ReportError: ``run.json`` is not valid JSON (named)."""
    run_dir = Path(run_dir)
    present = (run_dir / "records.parquet").exists() or (run_dir / "records.csv").exists()
    return present and _json(run_dir / "run.json").get("status") not in UNMERGED_STATUSES


def load_run(run_dir: Path) -> RunData:
    """Load one run directory; nothing in it is written (the report only reads its runs).

    Records (:func:`_load_records`): ``records.parquet``, else ``records.csv``, else the per-source
    CSVs merged in memory (:func:`testbed.results.summary.merge_records` with ``write=False``), each checked
    against the record schema (:func:`testbed.results.summary.read_records`) and against the number of
    queries ``summary.json`` counted (a file cut at a line boundary has whole rows, but fewer).

    Raises:
        ReportError: ``run_dir`` is not a directory or has no records at all.
        testbed.results.summary.RecordsError: the records are not whole (names the file and the problem).
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ReportError(f"{run_dir}: not a directory")
    run = _json(run_dir / "run.json")
    df, what = _load_records(run_dir, run)
    summary = _json(run_dir / "summary.json")
    counted = summary.get("queries")
    if isinstance(counted, int) and counted != len(df):
        raise ReportError(f"{what}: {len(df)} records, but summary.json counted {counted} queries of this run: the "
                          f"records file was cut short or replaced (the sources' files are in {run_dir / 'sources'})")
    mode = run.get("mode") or summary.get("mode") or "emulation"
    ls = run_dir / "link_stats.csv"
    hd = run_dir / "capture" / "hop_delays.csv"
    return RunData(run_dir, run_dir.name, mode, df, summary, _json(run_dir / "plan.json"),
                   _link_stats(ls),
                   pd.read_csv(hd) if hd.exists() and hd.stat().st_size > 1 else pd.DataFrame(),
                   run_status(run))


def _load_records(run_dir: Path, run: dict) -> tuple[pd.DataFrame, Path]:
    """A run's records and the file(s) they came from (:func:`load_run`). A run whose ``run.json``
    says it did not reach its teardown (:data:`UNMERGED_STATUSES`) is read from its sources when it
    has them. Nothing is written in ``run_dir``.

    Raises:
        ReportError: no records at all; testbed.results.summary.RecordsError: records not whole (named)."""
    sources = run_dir / "sources" / "*.records.csv"
    has_sources = any((run_dir / "sources").glob("*.records.csv"))
    if has_sources and run.get("status") in UNMERGED_STATUSES:
        merged = None
    elif (run_dir / "records.parquet").exists():
        merged = run_dir / "records.parquet"
    elif (run_dir / "records.csv").exists() and (run_dir / "records.csv").stat().st_size > 1:
        merged = run_dir / "records.csv"
    elif has_sources:
        merged = None
    else:
        raise ReportError(f"{run_dir}: no records (records.parquet, records.csv or sources/*.records.csv)")
    if merged is not None:
        return read_records(merged), merged
    try:
        df = merge_records(run_dir, write=False)
    except (OSError, ValueError) as exc:  # a source file cut inside a row, not CSV
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ReportError(f"{sources}: cannot merge the sources' records: {first}") from None
    if not df.empty:
        check_records(df, str(sources))
    return df, sources


LINK_STATS_COLUMNS = ("t", "a", "b", "kind", "util_ab", "util_ba")


def _link_stats(path: Path) -> pd.DataFrame:
    """``link_stats.csv``'s complete rows (empty when the file is absent or empty). A row cut short
    (the last line of an interrupted run) is left out.

    Raises:
        ReportError: the header lacks a column the report reads, or the file is not CSV, naming the file.
    """
    if not (path.exists() and path.stat().st_size):
        return pd.DataFrame()
    try:
        df = pd.read_csv(path)
    except (pd.errors.ParserError, UnicodeDecodeError, ValueError) as exc:
        raise ReportError(f"{path}: not a link statistics CSV ({exc})") from None
    missing = [c for c in LINK_STATS_COLUMNS if c not in df.columns]
    if missing:
        raise ReportError(f"{path}: no column {', '.join(missing)} (the file was cut short or replaced)")
    for c in ("t", "util_ab", "util_ba"):
        df[c] = pd.to_numeric(df[c], errors="coerce")
    return df.dropna(subset=list(LINK_STATS_COLUMNS)).reset_index(drop=True)


# ------------------------------------------------------------------------------------------- tables

def comparison_table(runs: list[RunData]) -> pd.DataFrame:
    """One row per run and policy: queries, load (s), success ratio, answered q/s, e2e p50/p95/p99 (ms)
    and mean network/queueing/inference (ms) as the summary takes them
    (:func:`testbed.results.summary.latency_figures`), the median network time above the planned RTT
    (ms), how busy (or stolen) the machine's CPUs were over an emulated run's load (%; None for a
    simulation), ``cold`` (queries that opened a new connection), failures per cause."""
    rows = []
    for label, r, g in _groups(runs):
        lat = latency_figures(g)
        dur = float(r.summary.get("duration_s") or 0) or (float(_t_s(r.records).max()) or 1.0)
        load = load_duration_s(g["t0_ns"], dur)
        fails = g.loc[g["outcome"] != "success", "failure_cause"].fillna("?").value_counts()
        rows.append({"run / policy": label, "status": r.status.short if r.status.ok else f"NOT OK: {r.status.short}",
                     "mode": r.mode, "queries": len(g), "load_s": round(load, 2),
                     "success_ratio": round(float((g["outcome"] == "success").mean()), 4) if len(g) else None,
                     "answered_qps": round(lat["answered"] / load, 2) if load > 0 else None,
                     **{f"e2e_{q}_ms": v for q, v in lat["e2e_ms"].items()},
                     **{f"{k}_mean_ms": v for k, v in lat["breakdown_ms"].items()},
                     "network_excess_p50_ms": lat["network_excess_ms"]["p50"],
                     "cpus_busy_pct": _busy_pct(r.summary.get("machine_cpu") or {}),
                     "cold": lat["cold_queries"],
                     "failures": ", ".join(f"{k} {v}" for k, v in fails.items()) or "none"})
    return pd.DataFrame(rows)


#: The note under the comparison table: which queries its latency figures are over, and what ``cold`` counts.
TABLE_NOTE = (f"Latency percentiles, the mean breakdown, the latency CDF and the breakdown figure are {LATENCY_RULE} "
              f"(the summary's rule, testbed.results.summary.latency_figures). cold: {COLD_RULE}.")


# ------------------------------------------------------------------------------------------- report

FIGURES = [("latency_cdf", "Latency CDF per policy", fig_latency_cdf),
           ("breakdown", "Network / queueing / inference breakdown", fig_breakdown),
           ("success_over_time", "Success ratio over time", fig_success_over_time),
           ("policy_over_time", "Policy in force over time", fig_policy_over_time),
           ("hop_delays", "Per-hop one-way delay (packet capture)", fig_hop_delays)]


def default_out_dir(run_dirs: list[Path]) -> Path:
    """``RUN_DIR/report`` for one run; ``<parent of the first>/report-<timestamp>`` for several."""
    if len(run_dirs) == 1:
        return Path(run_dirs[0]) / "report"
    return Path(run_dirs[0]).resolve().parent / f"report-{datetime.now():%Y%m%d-%H%M%S}"


def build_report(run_dirs: list[Path], out_dir: Path | None = None) -> dict:
    """Write ``report.html``, ``report.md`` and ``figures/*.png`` for the given runs into ``out_dir``.

    Returns ``{"html": Path, "markdown": Path, "figures": {name: Path}, "skipped": {name: reason},
    "warning": the runs that did not end ok, or ""}``.
    Every run is read and checked before anything is written; ``out_dir`` is created (with its
    parents) when missing.

    Raises:
        ReportError: no runs, a missing directory or one without records (named); ``out_dir`` is a
            file or cannot be created or written; a write fails midway (what this report had
            written is removed, and the folders it created).
        testbed.results.summary.RecordsError: a run's records are not whole (names the file and the problem).
    """
    if not run_dirs:
        raise ReportError("no run directory given")
    runs = [load_run(Path(d)) for d in run_dirs]
    labels = [r.label for r in runs]
    for i, r in enumerate(runs):  # same directory name twice (runs from different parents): disambiguate
        if labels.count(r.label) > 1:
            r.label = f"{r.path.parent.name}/{r.label}#{i}"
    out = Path(out_dir) if out_dir else default_out_dir([r.path for r in runs])
    created = _make_out_dir(out)
    try:
        return _write_report(runs, out)
    except OSError as exc:  # e.g. the disk filled up: no half-written report is left
        _remove_report(out, created)
        name = exc.filename or out
        raise ReportError(f"cannot write the report in {out} ({name}: {exc.strerror or exc}); nothing was "
                          f"left there") from None


def _make_out_dir(out: Path) -> Path | None:
    """Create ``out/figures`` and check that files can be written there; returns the topmost
    folder created here (None when ``out/figures`` existed).

    Raises:
        ReportError: ``out`` is a file, or cannot be created or written (named, with the reason).
    """
    figdir = out / "figures"
    for p in (out, figdir):
        if p.exists() and not p.is_dir():
            raise ReportError(f"report folder {out}: {'it' if p == out else p} is a file; give a folder (it is "
                              f"created if missing)")
    top = next((p for p in reversed([figdir, *figdir.parents]) if not p.exists()), None)
    probe = figdir / f".probe.{os.getpid()}"
    try:
        figdir.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        _remove_report(out, top)
        raise ReportError(f"report folder {out}: cannot create or write it ({exc.filename or out}: "
                          f"{exc.strerror or exc})") from None
    return top


def _remove_report(out: Path, created: Path | None) -> None:
    """Remove what a failed report wrote: its own files, and the folders created for it."""
    try:
        for name in ("report.html", "report.md"):
            (out / name).unlink(missing_ok=True)
        for p in (out / "figures").glob("*.png") if (out / "figures").is_dir() else ():
            if p.stem in {n for n, _t, _f in FIGURES} or p.stem.startswith("link_util_"):
                p.unlink(missing_ok=True)
    except OSError:
        pass
    if created is not None:
        shutil.rmtree(created, ignore_errors=True)


def _write_report(runs: list[RunData], out: Path) -> dict:
    """The figures, the comparison table, ``report.html`` and ``report.md`` (see :func:`build_report`)."""
    figdir = out / "figures"
    figures: dict[str, Path] = {}
    titles: dict[str, str] = {}
    skipped: dict[str, str] = {}
    for name, title, fn in FIGURES:
        p = figdir / f"{name}.png"
        if fn(runs, p):
            figures[name], titles[name] = p, title
        else:
            p.unlink(missing_ok=True)
            skipped[name] = "no data (no answered queries" + (" / no packet capture)" if name == "hop_delays" else ")")
    for k, r in enumerate(runs, start=1):
        name = f"link_util_{k}"
        p = figdir / f"{name}.png"
        if fig_link_utilization(r, p):
            figures[name], titles[name] = p, f"Link utilization over time and on the topology: {r.label}"
        else:
            what = "no complete row in link_stats.csv" if (r.path / "link_stats.csv").exists() else "no link_stats.csv"
            skipped[name] = f"{r.label}: {what}" + (" (simulated run)" if r.mode == "simulation" else "")
    table = comparison_table(runs)
    hops = [(r.label, r.hop_delays) for r in runs if not r.hop_delays.empty]
    _write_html(out / "report.html", runs, table, figures, titles, skipped, hops)
    _write_md(out / "report.md", runs, table, figures, titles, skipped, hops)
    return {"html": out / "report.html", "markdown": out / "report.md", "figures": figures, "skipped": skipped,
            "warning": _not_ok_warning(runs)}


#: The summary's warnings that say a run's figures are not those of the planned clusters (a
#: saturated machine, a slow host, starved clusters), carried into the report's list of runs.
COMPARABILITY_WARNINGS = ("WARNING: the machine", "WARNING: this machine", "WARNING: inference ran slower",
                          "WARNING: a single thread")


def _busy_pct(machine_cpu: dict) -> float | None:
    """Busy + stolen share of the CPUs over an emulated run's load, % (summary ``machine_cpu``)."""
    try:
        return round(100 * min(1.0, (machine_cpu["busy_cores"] + machine_cpu["steal_cores"]) / machine_cpu["cpus"]), 1)
    except (KeyError, TypeError, ZeroDivisionError):
        return None


def _capture_errors(run_dir: Path) -> list[str]:
    """The warnings of the run's packet analysis as it stands (``capture/analysis.json`` ``errors``,
    also after ``testbed report --analyze`` ran it again): capture files left out or read in part."""
    try:
        a = json.loads((Path(run_dir) / "capture" / "analysis.json").read_text())
    except (OSError, ValueError):
        return []
    errors = a.get("errors") if isinstance(a, dict) else None
    return capture_warnings([str(e) for e in errors]) if isinstance(errors, list) else []


def _runs_list(runs: list[RunData]) -> list[str]:
    """One entry per run, with its summary's warnings of :data:`COMPARABILITY_WARNINGS`: the
    report compares runs, and those say when not to."""
    out = []
    for r in runs:
        s = r.summary
        try:
            warnings = [x for x in _headline(s) if x.startswith(COMPARABILITY_WARNINGS)] if "queries" in s else []
        except (KeyError, TypeError, ValueError):  # an older or partial summary: its warnings are not known
            warnings = []
        warnings += _capture_errors(r.path)
        out.append(f"{r.label} ({r.mode}; {len(r.records)} queries; {r.path})"
                   + (f"; configured load {s['duration_s']:g} s" if s.get("duration_s") else "")
                   + ("" if r.status.ok else f"; NOT OK: {r.status.short} ({r.status.detail})")
                   + "".join(f" {w}" for w in warnings))
    return out


def _not_ok_warning(runs: list[RunData]) -> str:
    """The warning above the comparison table naming the runs that did not end ok ("" when all did)."""
    bad = [r for r in runs if not r.status.ok]
    if not bad:
        return ""
    return (f"WARNING: {len(bad)} of {len(runs)} runs did not end ok ("
            + "; ".join(f"{r.label}: {r.status.short}" for r in bad)
            + "): their records stop early, or those after the failure are not of the planned experiment; "
              "compare them with care.")


def _page(runs, table: pd.DataFrame, figures, titles, skipped, hops) -> list[Block]:
    """The report as blocks (:mod:`testbed.results.page`), the same in ``report.html`` and ``report.md``."""
    blocks = [Block("h1", "ASET testbed report"),
              Block("p", f"Generated {datetime.now():%Y-%m-%d %H:%M:%S} from {len(runs)} run(s):"),
              Block("list", items=tuple(_runs_list(runs))), Block("h2", "Comparison across runs")]
    warning = _not_ok_warning(runs)
    if warning:
        blocks.append(Block("warning", warning))
    blocks += [Block("table", table=table), Block("p", TABLE_NOTE)]
    for name, p in figures.items():
        blocks += [Block("h2", titles[name]), Block("figure", name, path=p)]
    for label, h in hops:
        blocks += [Block("h3", f"Per-hop one-way delay: {label}"), Block("table", table=h)]
    if skipped:
        blocks += [Block("h2", "Not drawn"), Block("list", items=tuple(f"{k}: {v}" for k, v in skipped.items()))]
    blocks.append(Block("p", "Columns and units: docs/records-schema.md; figures: docs/reports.md."))
    return blocks


def _write_html(path: Path, runs, table: pd.DataFrame, figures, titles, skipped, hops) -> None:
    write_html(path, "ASET testbed report", _page(runs, table, figures, titles, skipped, hops))


def _write_md(path: Path, runs, table: pd.DataFrame, figures, titles, skipped, hops) -> None:
    write_markdown(path, _page(runs, table, figures, titles, skipped, hops))
