"""Run results: merge the per-source records, summarise them, print and save the summary.

Files in a run directory (all written by :mod:`testbed.emu.run`):
``records.csv`` / ``records.parquet`` (one row per query, columns of
:data:`testbed.model.records.RECORD_FIELDS`), ``link_stats.csv`` (controller port stats per poll),
``rtt_check.csv``, ``clusters/<name>.stats.json`` (server counters; ``<name>.stats.<n>.json``
for the earlier lives of a restarted server), ``linkemu/<node>.json`` (each user-space link
emulator's counters), ``run.json`` (what happened: ``health``), ``summary.json``, ``summary.md``;
with packet capture also ``capture/queries.csv`` (``pkt_*`` columns, :mod:`testbed.results.capture`),
joined into the records here. Every column is documented in docs/records-schema.md.

Every count of queries in the summary (totals, per cause, per cluster, per application) comes
from the records, so the tables agree with ``records.csv`` exactly. The servers' own counters
are shown apart and labelled as such: they count what each server saw in its life, including
answers that came after the source had given up, and none of the queries of a life whose last
stats file a kill cut short.

Latency figures (:func:`latency_figures`, the one rule of the summary and of ``testbed report``,
stated by :data:`LATENCY_RULE`): the e2e percentiles and the mean breakdown are taken over every
answered query (:func:`answered`), nothing left out.

New connections (:data:`COLD_RULE`): before the load, every source's path to every (cluster,
model) is warmed (:meth:`testbed.emu.servers.ClusterServers.warm_paths`; those requests
are not records) and each source opens one keep-alive connection to every cluster
(:mod:`testbed.emu.source`). ``cold = 1`` is set by the source on a query whose request opened a
new TCP connection (aiohttp's connection tracing): no open connection to its cluster was idle,
because its other queries to that cluster (or its stats poll) held each one, as in a burst, or
the idle one had been closed. Such a query paid one more round trip for the handshake; it is
the system's behaviour under bursts, counted in every figure, and the summary says how many
there were (``cold_queries``; measured: docs/trustworthy-runs.md, "New connections").
"""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.table import Table
from rich.text import Text

from testbed.core.errors import InputError, RunFailure
from testbed.core.util import markdown_table, natural_key, repeated, replace_atomic
from testbed.model.records import CAUSES, COLUMNS, FAILURE, RECORD_FIELDS, SUCCESS

#: What ``cold = 1`` marks (printed with the summary; docs/trustworthy-runs.md, "New connections").
COLD_RULE = ("every source -> cluster/model path was warmed and each source opened one connection to every cluster "
             "before the load (warm-up requests are not records); cold = 1 marks a query that opened a new TCP "
             "connection because none to its cluster was idle (its other queries or its stats poll held them, "
             "as in a burst, or the idle one had been closed): it paid one more round trip for the handshake "
             "and counts in every figure, latency percentiles and mean breakdown included")
#: Which queries the latency percentiles and the mean breakdown are taken over (:func:`latency_figures`;
#: printed beside them in the summary and in ``testbed report``).
LATENCY_RULE = "over every answered query (HTTP 200 with an e2e time), cold ones (new connections) included"


def read_csv_exact(path: Path | bytes) -> pd.DataFrame:
    """``pd.read_csv`` keeping ``*_ns`` columns as nullable 64-bit integers (``path``: a file, or
    its bytes).

    ns since the epoch (~1.8e18) do not fit a float64 exactly (53-bit mantissa: ~256 ns steps), which
    is what a column with empty cells would otherwise become.
    """
    src = (lambda: io.BytesIO(path)) if isinstance(path, bytes) else (lambda: path)
    cols = pd.read_csv(src(), nrows=0).columns
    return pd.read_csv(src(), dtype={c: "Int64" for c in cols if c.endswith("_ns")})


class RecordsError(InputError):
    """A records file that does not hold records of :data:`testbed.model.records.RECORD_FIELDS`
    (the message names the file and the problem: truncated, a missing column, a bad value)."""


#: Record columns whose values are numbers: those with a unit in the record schema, and
#: ``http_status`` (an HTTP status, or the -1 / 0 codes of :func:`testbed.model.records.classify`).
NUMERIC_RECORD_FIELDS: tuple[str, ...] = tuple(c.name for c in COLUMNS if c.unit != "-" or c.name == "http_status")


def _csv_shape_problem(path: Path | bytes) -> str | None:
    """Why ``path`` (a file, or its bytes) is not a whole CSV table (a header, then rows of as many
    fields), or None.

    A file cut short (a crash, a full disk, a partial copy) ends inside a row: its last line does
    not end with a newline, or has fewer fields than the header (pandas would fill them with empty
    cells silently)."""
    data = path if isinstance(path, bytes) else Path(path).read_bytes()
    reader = csv.reader(io.StringIO(data.decode("utf-8", errors="replace"), newline=""))
    header = next(reader, None)
    if not header:
        return "no header line"
    dup = repeated(header)
    if dup:
        return f"column {dup[0]!r} appears twice in the header"
    for row in reader:
        if len(row) != len(header):
            return (f"line {reader.line_num} has {len(row)} fields, the header {len(header)} "
                    f"(the file is truncated or not a records file)")
    if not data.endswith(b"\n"):
        return "the last line does not end with a newline (the file is truncated)"
    return None


def whole_source_rows(path: Path) -> tuple[bytes, str]:
    """A source's records file (``sources/<name>.records.csv``) without a last line cut short, and
    what was left out ("" when nothing). A source writes and flushes one row at a time, so a kill
    or a full disk in the middle of a write cuts at most its last line: the rows before it are
    whole, and an interrupted run keeps them.

    Raises:
        RecordsError: naming the file: it cannot be read, or a line before the last is not whole.
    """
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise RecordsError(f"{path}: cannot read the records: {exc.strerror}") from None
    problem = _csv_shape_problem(data)
    if problem is None or problem == "no header line":
        return data, ""
    body = data.rstrip(b"\n")
    trimmed = body[:body.rfind(b"\n") + 1] if b"\n" in body else b""
    if not trimmed or _csv_shape_problem(trimmed) is not None:
        raise RecordsError(f"{path}: {problem}")
    return trimmed, f"its last line is cut short and left out ({problem})"


def check_records(df: pd.DataFrame, what: str) -> None:
    """Refuse a frame that is not records (:data:`testbed.model.records.RECORD_FIELDS`): a
    missing column, a non-numeric value in a numeric column (:data:`NUMERIC_RECORD_FIELDS`), an
    ``outcome`` other than success/failure, or a ``failure_cause`` outside the causes. Columns
    beyond the schema are allowed (``pkt_*`` of the packet analysis, docs/records-schema.md).

    Raises:
        RecordsError: naming ``what`` (the file), the column, and the first bad row (1 = the first
            row after the header) with its value.
    """
    missing = [c for c in RECORD_FIELDS if c not in df.columns]
    if missing:
        raise RecordsError(f"{what}: not a records file: {len(missing)} column(s) of the record schema missing "
                           f"({', '.join(missing[:6])}{', ...' if len(missing) > 6 else ''}); "
                           f"see docs/records-schema.md")
    for col in NUMERIC_RECORD_FIELDS:
        if pd.api.types.is_numeric_dtype(df[col]):  # parsed as numbers already: nothing to find
            continue
        given = df[col].notna() & (df[col].astype("string").str.strip() != "")
        bad = given & pd.to_numeric(df[col], errors="coerce").isna()
        if bad.any():
            i = int(bad.to_numpy().argmax())
            raise RecordsError(f"{what}: column {col!r}, row {i + 1}: {df[col].iloc[i]!r} is not a number")
    checks = (("outcome", {SUCCESS, FAILURE}), ("failure_cause", {"", *CAUSES}))
    for col, allowed in checks:
        values = df[col].astype("string").fillna("")
        bad = ~values.isin(allowed)
        if bad.any():
            i = int(bad.to_numpy().argmax())
            raise RecordsError(f"{what}: column {col!r}, row {i + 1}: {values.iloc[i]!r} is not one of "
                               f"{', '.join(repr(a) for a in sorted(allowed))}")


def read_records(path: Path) -> pd.DataFrame:
    """A records file (``records.csv`` or ``records.parquet``), checked whole before it is used:
    the CSV's shape (:func:`_csv_shape_problem`) and the columns and values (:func:`check_records`).

    Raises:
        RecordsError: the file cannot be read or is not whole records (names the file and the problem).
    """
    path = Path(path)
    try:
        if path.suffix == ".parquet":
            df = pd.read_parquet(path)
        else:
            problem = _csv_shape_problem(path)
            if problem:
                raise RecordsError(f"{path}: {problem}")
            try:
                df = read_csv_exact(path)
            except ValueError:  # a *_ns cell that is no integer: name its column and row
                check_records(pd.read_csv(path, dtype=str), str(path))
                raise
    except (OSError, ValueError) as exc:  # parser, decoding and pyarrow errors are ValueErrors
        if isinstance(exc, RecordsError):
            raise
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise RecordsError(f"{path}: cannot read the records: {first}") from None
    check_records(df, str(path))
    return df


def merge_records(run_dir: Path, *, write: bool = True) -> pd.DataFrame:
    """Concatenate ``sources/*.records.csv`` into ``records.csv`` and ``records.parquet`` (by t0).
    ``write=False``: only return the merged frame, nothing is written in ``run_dir`` (a reader's
    merge, ``testbed report``: the run's own merge is its teardown's).

    When the packet analysis ran (``capture/queries.csv``), its ``pkt_*`` columns are joined by
    ``query_id`` (left join: queries not seen on the wire keep empty ``pkt_*`` cells). The sources'
    files are never modified; each output is written to a temporary file and renamed, so a full
    disk leaves the earlier file (or none), never a truncated one.

    Raises:
        RunFailure: the merged files cannot be written (names the error; the sources' files stay).
    """
    parts, files = [], {}
    for path in sorted((run_dir / "sources").glob("*.records.csv")):
        data, note = whole_source_rows(path)  # a last line cut by a kill or a full disk is left out
        files[path.name.removesuffix(".records.csv")] = (max(0, data.count(b"\n") - 1), note)
        if data.strip():
            try:
                part = read_csv_exact(data)
            except ValueError:  # a *_ns cell that is no integer: name the file, its column and row
                check_records(pd.read_csv(io.BytesIO(data), dtype=str), str(path))
                raise
            check_records(part, str(path))
            parts.append(part)
    parts = [p for p in parts if not p.empty]
    df = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    if not df.empty:
        df = df.sort_values("t0_ns", kind="stable").reset_index(drop=True)
        pkt = run_dir / "capture" / "queries.csv"
        if pkt.exists() and pkt.stat().st_size > 1:
            q = read_csv_exact(pkt)
            if not q.empty and "query_id" in q:
                df = df.merge(q.drop_duplicates("query_id"), on="query_id", how="left", validate="one_to_one")
    df.attrs["source_files"] = files  # per source: (whole rows, the cut-line note); the records check reads it
    if not write:
        return df
    try:
        replace_atomic(run_dir / "records.csv", lambda p: df.to_csv(p, index=False))
        if not df.empty:
            typed = _text_as_str(df)
            replace_atomic(run_dir / "records.parquet", lambda p: typed.to_parquet(p, index=False,
                                                                                  schema=records_arrow_schema(typed)))
    except OSError as exc:
        raise RunFailure(f"cannot write the merged records in {run_dir}: {exc.strerror or exc}; the records are "
                         f"intact in {run_dir / 'sources'}") from exc
    return df


def _text_as_str(df: pd.DataFrame) -> pd.DataFrame:
    """A copy whose text record columns hold str or None (a name CSV-read as a number, or a column
    with no value read as NaN, would not convert to the schema's string)."""
    from testbed.model.records import TEXT_FIELDS

    out = df.copy()
    for c in TEXT_FIELDS & set(out.columns):
        out[c] = out[c].astype(object).where(out[c].notna(), None).map(lambda v: v if v is None else str(v))
    return out


def records_arrow_schema(df: pd.DataFrame):
    """The Parquet schema of a records frame: every record column with its one type (text: string;
    :data:`testbed.model.records.INTEGER_FIELDS`: int64; the rest: double; nulls allowed), whatever
    values the run happened to have, so that emulated and simulated files concatenate (pandas
    guessed each run's: a column with no value became double, ``label`` int64 here and double
    there; a reviewer's find, Dec 4); other columns (``pkt_*``) as pyarrow infers them.

    Returns:
        pyarrow.Schema, in ``df``'s column order.
    """
    import pyarrow as pa

    from testbed.model.records import INTEGER_FIELDS, RECORD_FIELDS, TEXT_FIELDS

    inferred = pa.Schema.from_pandas(df, preserve_index=False)
    fields = []
    for f in inferred:
        if f.name in TEXT_FIELDS:
            f = pa.field(f.name, pa.string())
        elif f.name in INTEGER_FIELDS:
            f = pa.field(f.name, pa.int64())
        elif f.name in RECORD_FIELDS:
            f = pa.field(f.name, pa.float64())
        fields.append(f)
    return pa.schema(fields)


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


def latency_figures(df: pd.DataFrame) -> dict:
    """The latency figures of records ``df`` (:data:`LATENCY_RULE`): ``e2e_ms`` p50/p95/p99 and
    ``breakdown_ms`` (mean network / queueing / inference), all in ms rounded to 3 decimals (None
    without an answered query), over :func:`answered`; ``network_excess_ms`` p50/p95: network
    time minus the planned RTT of the query's path (``network_ms - expected_rtt_ms``: the transfer
    of request and answer, the links' queues, and in an emulation the forwarding cost of its own
    processes); ``answered`` (queries) and ``cold_queries`` (queries that opened a new connection,
    every outcome)."""
    ans = answered(df)
    breakdown = {}
    for k in ("network", "queueing", "inference"):
        col = _numeric(ans, f"{k}_ms").dropna()
        breakdown[k] = None if col.empty else round(float(col.mean()), 3)
    excess = (_numeric(ans, "network_ms") - _numeric(ans, "expected_rtt_ms")).dropna()
    return {"e2e_ms": {f"p{q}": _pct(_numeric(ans, "e2e_ms"), q / 100) for q in (50, 95, 99)},
            "breakdown_ms": breakdown, "network_excess_ms": {f"p{q}": _pct(excess, q / 100) for q in (50, 95)},
            "answered": int(len(ans)), "cold_queries": cold_queries(df)}


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
    without that file, every stats file is one life."""
    out: dict[str, dict] = {}
    for f in sorted((run_dir / "clusters").glob("*.stats*.json")):
        name = f.name.split(".stats")[0]
        try:
            st = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        c = out.setdefault(name, {"lives": 0, "lives_not_ready": 0, "served": 0, "dropped": 0,
                                  "dropped_queue_full": 0, "dropped_admission": 0, "errors": 0, "utilization": None})
        c["lives"] += 1
        for k in ("served", "dropped", "dropped_queue_full", "dropped_admission", "errors"):
            c[k] += int(st.get(k) or 0)
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
#: alone reported as starvation on every triangle-litert run. TensorFlow's is larger: its cold
#: call of digits_small in a 0.5-core cgroup took 1.27-1.41 ms (triangle runs at load 0.3-0.5, Dec
#: 3 2026) against 0.64 ms expected with its cold factor (profile 0.31 ms x 2.07,
#: ``models/profiles/handling.json``), 0.7 ms over, which a floor of 0.5 ms reported as starvation on
#: every triangle run. 1.0 ms is above that; every model of the real-DNN experiments has a profile of
#: 2 ms or more, where 1.75x is an excess of 1.5 ms or more, so the floor hides no starvation of theirs.
SLOW_SERVICE_MIN_EXCESS_MS = 1.0
#: Fewest answered, unbatched queries of a (cluster, model) for the service check to judge it.
SERVICE_CHECK_MIN_QUERIES = 10


def _lives_cell(server: dict) -> str:
    """``2``, or ``2 (1 never ready)``."""
    n = server.get("lives_not_ready", 0)
    return f"{server['lives']}" + (f" ({n} never ready)" if n else "")


def cold_calls(df: pd.DataFrame) -> pd.Series:
    """Which answered model calls were cold by the CPU model's rule (:mod:`testbed.model.cpu`): a
    call that started (t2) at least :data:`~testbed.model.cpu.COLD_AFTER_S` after the previous
    call at the same cluster ended (t3); a cluster's first call is cold. ``df``: records with
    ``cluster``, ``t2_ns``, ``t3_ns``. Returns a boolean Series on ``df``'s index (False where t2
    or t3 is missing)."""
    from testbed.model.cpu import COLD_AFTER_S

    t = df[["cluster", "t2_ns", "t3_ns"]].dropna().sort_values(["cluster", "t2_ns"])
    prev_end = t.groupby("cluster")["t3_ns"].transform(lambda s: s.cummax().shift())
    cold = (t["t2_ns"] - prev_end >= COLD_AFTER_S * 1e9) | prev_end.isna()
    return cold.reindex(df.index, fill_value=False)


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
    import numpy as np

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


def _records_check(run_dir: Path, df: pd.DataFrame) -> dict:
    """Rows per source file, rows merged, and per source the query ids missing from the records.
    ``df``: :func:`merge_records`'s frame, whose ``attrs["source_files"]`` has each file's whole rows
    and cut-line note (a file it lacks is read here).

    A source's ids are ``<source>-<n>``, n = 1 .. created. Its tally
    (:class:`testbed.plan.boundaries.SourceTally`, written when it exits) says how many it created,
    so records lost at the end of a file count too; without a tally (a source killed before it
    exited) only gaps inside 1 .. the largest id seen can be counted, and the source is listed in
    ``sources_without_tally``. A source whose tally is there but whose records file is not (deleted
    during the run) is in ``records_file_missing``, and all its created queries are missing.
    """
    from testbed.core.errors import InputError
    from testbed.plan.boundaries import SourceTally, read_config, tally_path

    per_file, created, no_tally, cut, gone = {}, {}, [], {}, []
    files = {p.name.removesuffix(".records.csv"): p for p in (run_dir / "sources").glob("*.records.csv")}
    for t in (run_dir / "sources").glob("*.tally.json"):  # a source whose records file is gone: all lost
        files.setdefault(t.name.removesuffix(".tally.json"), t.with_name(t.name.replace(".tally.json", ".records.csv")))
    read = dict(df.attrs.get("source_files", {}))  # merge_records read each file once already
    for name, p in sorted(files.items()):
        if p.exists():
            if name not in read:
                data, note = whole_source_rows(p)
                read[name] = (max(0, data.count(b"\n") - 1), note)
            per_file[name], note = read[name]
            if note:
                cut[name] = note
        else:
            per_file[name] = 0
            gone.append(name)
        try:
            created[name] = read_config(tally_path(p), SourceTally).created
        except InputError:
            no_tally.append(name)
    seen: dict[str, set[int]] = {name: set() for name in per_file}
    if not df.empty and "query_id" in df:
        for src, g in df.groupby("source"):
            n = pd.to_numeric(g["query_id"].astype(str).str.rsplit("-", n=1).str[-1], errors="coerce").dropna()
            seen[str(src)] = set(n.astype(int))
    gaps = {}
    for src, ids in seen.items():
        missing = created[src] - len(ids) if src in created else (max(ids) - len(ids) if ids else 0)
        if missing:
            gaps[src] = missing
    return {"rows_per_source_file": per_file, "rows_merged": int(len(df)), "missing_query_ids": gaps,
            "queries_created": created, "sources_without_tally": no_tally, "cut_last_line": cut,
            "records_file_missing": gone}


def summarize(run_dir: Path, duration_s: float) -> dict:
    """Compute the run summary and write ``summary.json``.

    ``duration_s``: the configured load duration (s). Returns a dict with: ``queries``,
    ``duration_s`` (configured), ``load_s`` (measured, :func:`load_duration_s`), ``success_ratio``,
    ``throughput_qps`` (answered queries per s of measured load), ``failures`` (count per cause,
    causes with none left out), ``drop_reasons`` (of ``dropped``), ``e2e_ms`` p50/p95/p99 and
    ``breakdown_ms`` (mean network / queueing / inference, ms) of every answered query
    (:func:`latency_figures`, ``latency_rule``), ``cold_queries`` (queries that opened a new
    connection) and ``cold_rule`` (what that means), ``per_application`` and ``per_cluster`` (queries, success,
    answered, every cause: from the records; ``utilization`` and ``server``: the servers' own
    counters, apart), ``link_emulators`` (lateness and drops), ``links`` (mean and max utilization
    per direction, drops, from the controller's port stats), ``records_check`` (rows per source
    file, merged, gaps), ``health`` (from ``run.json``), ``host_speed`` (``host_speed.json``: a
    bare model call now against its profile; ``{}`` if not measured). ``capture`` (with packet
    capture: queries matched, retransmissions, per-hop one-way delay).
    """
    from testbed.emu.health import read_health

    df = merge_records(run_dir)
    s: dict = {"queries": int(len(df)), "duration_s": duration_s,
               "load_s": round(load_duration_s(df["t0_ns"], duration_s), 3) if "t0_ns" in df else duration_s,
               "cold_rule": COLD_RULE, "latency_rule": LATENCY_RULE}
    if df.empty:
        s.update(success_ratio=None, failures={}, e2e_ms={}, breakdown_ms={}, per_application={}, cold_queries=0)
    else:
        ok = df["outcome"] == "success"
        lat = latency_figures(df)
        s["success_ratio"] = round(float(ok.mean()), 4)
        s["throughput_qps"] = round(lat["answered"] / s["load_s"], 3) if s["load_s"] > 0 else None
        s["failures"] = {k: v for k, v in _causes(df).items() if v}
        dropped = df[df["failure_cause"] == "dropped"]
        s["drop_reasons"] = {str(k) or "unknown": int(v)
                             for k, v in dropped["drop_reason"].astype("string").fillna("").value_counts().items()}
        s.update(cold_queries=lat["cold_queries"], e2e_ms=lat["e2e_ms"], breakdown_ms=lat["breakdown_ms"],
                 network_excess_ms=lat["network_excess_ms"])
        s["per_application"] = _per_group(df, "application")
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
    s["per_cluster"] = per_cluster
    plan = _plan_doc(run_dir)
    s["service_check"] = _service_check(df, per_cluster, plan)
    s["link_emulators"] = _link_emulators(run_dir)
    s["links"] = _links(run_dir, plan)
    s["records_check"] = _records_check(run_dir, df)
    try:
        s["host_speed"] = json.loads((run_dir / "host_speed.json").read_text())
    except (OSError, ValueError):
        s["host_speed"] = {}
    s["machine_cpu"], s["machine_cpu_note"] = _machine_cpu(run_dir, df)
    health = read_health(run_dir)
    if health:
        s["health"] = health
    choices = _aset_choices(plan, df)
    if choices:
        s["aset_choices"] = choices
    try:  # the command and the code the run came from (testbed.core.util.provenance)
        prov = json.loads((run_dir / "run.json").read_text()).get("provenance")
    except (OSError, ValueError, AttributeError):
        prov = None
    if isinstance(prov, dict) and prov.get("command"):
        s["provenance"] = prov
    cap = run_dir / "capture" / "analysis.json"
    if cap.exists():
        a = json.loads(cap.read_text())
        s["capture"] = {"queries_matched": a.get("queries_matched"), "retransmissions": a.get("retransmissions"),
                        "hops": {f"{h['from']}>{h['to']}": {k: h.get(k) for k in
                                                            ("packets", "median_ms", "p95_ms", "configured_ms",
                                                             "emulated_ms")}
                                 for h in a.get("hop_delays", [])},
                        "errors": list(a.get("errors") or [])}
    replace_atomic(run_dir / "summary.json", lambda p: p.write_text(json.dumps(s, indent=2)))
    return s


# ----------------------------------------------------------------------------- printing

SummaryTable = tuple[str, list[str], list[list[object]]]
#: The failure-cause columns of the per-cluster and per-application tables: counts of failed
#: queries by cause (``fail accuracy``, not ``accuracy``: the column is no accuracy figure).
CAUSE_COLUMNS = [f"fail {c}" for c in CAUSES]


def _tables(s: dict) -> list[SummaryTable]:
    """The summary's tables: (title, columns, rows), the same on the console and in summary.md."""
    return [t for step in (_record_tables, _server_table, _link_emulator_table, _links_table, _capture_table,
                           _health_table) for t in step(s)]


def _cell(v: float | None, fmt: str = "") -> str:
    """A number for a table cell or the headline: formatted (``fmt``; as it is by default), or
    ``n/a`` when not measured (no answered query: not ``None``)."""
    return "n/a" if v is None else format(v, fmt)


def _record_tables(s: dict) -> list[SummaryTable]:
    """Per cluster and per application, from the records: queries, success, answered, failures
    by cause (:data:`CAUSE_COLUMNS`), e2e p95 (ms)."""
    out = []
    for key, what in (("per_cluster", "cluster"), ("per_application", "application")):
        rows = [[name, v["queries"], v["success"], _cell(v["success_ratio"], ".3f"), v["answered"],
                 *[v["failures"].get(c, 0) for c in CAUSES], _cell(v.get("e2e_p95_ms"))]
                for name, v in s.get(key, {}).items()]
        if rows:
            out.append((f"Per {what} (from the records; fail <cause>: failed queries by cause)",
                        [what, "queries", "success", "success ratio", "answered", *CAUSE_COLUMNS, "e2e p95 ms"], rows))
    return out


def _server_table(s: dict) -> list[SummaryTable]:
    """The servers' own counters (utilization 0-1, 3 decimals)."""
    rows = [[name, _lives_cell(v["server"]), v["server"]["served"], v["server"]["dropped_queue_full"],
             v["server"]["dropped_admission"], v["server"]["errors"], _cell(v["server"]["utilization"], ".3f"),
             "-" if "cpu" not in v else f"{v['cpu']['throttled_periods']}/{v['cpu']['periods']}"]
            for name, v in s.get("per_cluster", {}).items() if "server" in v]
    if not rows:
        return []
    return [("Server counters (each server's own view, summed over its lives: includes warm-up requests "
             "and answers the source had given up on; a killed life's last stats interval is missing; "
             "throttled = CFS periods of the load in which the cluster's cgroup ran out of its quota)",
             ["cluster", "lives", "served", "dropped queue_full", "dropped admission", "errors",
              "utilization", "throttled / periods"], rows)]


def _link_emulator_table(s: dict) -> list[SummaryTable]:
    """Per link emulator (lK, in link order): delay held, frames, lateness (ms), drops."""
    le = s.get("link_emulators") or {}
    rows = [[name, "-" if v["delay_ms"] is None else f"{v['delay_ms']:.3f}",
             v["frames"], f"{v['max_late_ms']:.3f}", f"{v['mean_late_ms']:.3f}",
             *[v[k] for k in LINKEMU_COUNTERS]]
            for name, v in le.get("per_emulator", {}).items()]
    if not rows:
        return []
    return [("Link emulators (lateness = sent after the due time; drops: loss model, FIFO overflow, "
             "bandwidth shaper queue, link down, kernel receive buffer, send errors)",
             ["emulator", "delay ms held (after datapath compensation)", "frames", "max late ms",
              "mean late ms", "lost", "overflow",
              "shaper drops", "dropped down", "kernel drops", "send errors"], rows)]


def _links_table(s: dict) -> list[SummaryTable]:
    """The 8 busiest links: the controller's port stats in an emulation, the simulator's link load
    in a simulation (``s["mode"]``)."""
    top = sorted(s.get("links", {}).items(), key=lambda kv: -max(kv[1]["util_ab_max"], kv[1]["util_ba_max"]))
    rows = [[name, f"{v['capacity_mbps']:g}", f"{v['util_ab_mean']:.4f}/{v['util_ab_max']:.4f}",
             f"{v['util_ba_mean']:.4f}/{v['util_ba_max']:.4f}", v["drops"]] for name, v in top[:8]]
    if not rows:
        return []
    source = "the simulator's link load" if s.get("mode") == "simulation" else "controller port stats"
    return [(f"Busiest links ({source})",
             ["link", "capacity Mbit/s", "util a>b mean/max", "util b>a mean/max", "drops"], rows)]


def capture_warnings(errors: list[str]) -> list[str]:
    """One warning per capture file the packet analysis left out or read in part (``analysis.json``
    ``errors``, :func:`testbed.results.capture.analyze_run`): without it, the hops on either side
    of an unread capture point are merged into one, with no word of it."""
    return [f"WARNING: packet capture: {e}; the per-hop delays skip that capture point (the hops on either "
            f"side of it show as one)" for e in errors]


def _capture_table(s: dict) -> list[SummaryTable]:
    """Per-hop one-way delay (ms) from the packet capture."""
    cap = s.get("capture")
    if not cap:
        return []
    rows = [[hop, v["packets"], f"{v['median_ms']:.3f}", f"{v['p95_ms']:.3f}",
             "-" if v["configured_ms"] is None else f"{v['configured_ms']:g}",
             "-" if v.get("emulated_ms") is None else f"{v['emulated_ms']:g}"] for hop, v in cap["hops"].items()]
    return [(f"Per-hop one-way delay, packet capture ({cap['queries_matched']} queries matched, "
             f"{cap['retransmissions']} retransmissions)",
             ["hop", "packets", "median ms", "p95 ms", "configured ms",
              "emulated ms (configured - datapath compensation)"], rows)]


def _health_table(s: dict) -> list[SummaryTable]:
    """The incidents of ``run.json``."""
    incidents = (s.get("health") or {}).get("incidents") or []
    if not incidents:
        return []
    return [("Health: components that died or failed during the run (run.json)",
             ["component", "kind", "what", "s into the load", "exit code", "pid, serving"],
             [[i["component"], i["kind"], i["how"], i.get("t_load_s"), i.get("exit_code"), _serving(i)]
              for i in incidents])]


def _serving(incident: dict) -> str:
    """``pid 123: l1 (A-B), l2 (B-C)`` for an incident of a process that served several links, else ""."""
    serves = incident.get("serves") or []
    if not serves:
        return ""
    return (f"pid {incident['pid']}: " if incident.get("pid") is not None else "") + ", ".join(serves)


#: A cluster whose cgroup ran out of quota in more than this share of the load's CFS periods was
#: held back by its own quota, not by the machine (:func:`_service_warning`).
THROTTLED_SHARE_NOTABLE = 0.05


def _service_warning(s: dict, sc: dict) -> str:
    """The summary's line about models that ran slower than their profile at servers that were not
    busy: held back by their own CFS quota (the cgroup was throttled: the CPU per query was more
    than the plan's figures give, e.g. on a host slower than when profiled), or by the machine
    (not throttled: other processes had the CPU)."""
    worst = max(sc["starved"], key=lambda k: sc["per_model"][k]["ratio"])
    w = sc["per_model"][worst]
    clusters = sorted({k.split("/")[0] for k in sc["starved"]})
    cpu = {c: (s.get("per_cluster", {}).get(c) or {}).get("cpu") or {} for c in clusters}
    throttled = {c: v.get("throttled_share", 0.0) for c, v in cpu.items() if v}
    head = (f"WARNING: inference ran slower than its profile at servers that were not busy "
            f"({', '.join(sc['starved'])}; e.g. {worst}: median {w['measured_p50_ms']} ms against "
            f"{w.get('expected_p50_ms', w['profile_p50_ms'])} ms expected, {w['ratio']}x). ")
    if throttled and max(throttled.values()) > THROTTLED_SHARE_NOTABLE:
        shares = ", ".join(f"{c} {100 * v:.0f} %" for c, v in sorted(throttled.items()))
        return head + (f"Their cgroups ran out of CPU quota in {shares} of the CFS periods: the CPU per query "
                       f"(model call and request handling, testbed/model/cpu.py) exceeded what the plan's figures "
                       f"give; if the host-speed line says the machine is slower than when profiled, that is why, "
                       f"and the simulator is optimistic here.")
    return head + (f"The machine did not give the clusters their CPU share (load average {sc['loadavg_1min']} on "
                   f"{sc['cpus']} CPUs at the end). Latencies and success are not those of the planned clusters; "
                   f"rerun on a quieter machine.")


#: Where the host-speed warning suggests re-measuring profiles (a copy: models/profiles/ is tracked,
#: and every simulation reads it).
PROFILES_COPY = "runs/profiles-here"


def _machine_cpu(run_dir: Path, df: pd.DataFrame) -> tuple[dict, str]:
    """The machine's CPU over the load the records show (the first to the last query's t0: not
    the sources' start-up before, nor the teardown after), from an emulation's samples
    (:func:`testbed.emu.machine.machine_cpu_of_run`): ``({}, "")`` for a simulation, ``({},
    why)`` when the samples are unreadable or too few."""
    from testbed.emu.machine import machine_cpu_of_run

    t0 = pd.to_numeric(df["t0_ns"], errors="coerce").dropna() if "t0_ns" in df else pd.Series(dtype=float)
    if t0.empty:
        return {}, ""
    got, note = machine_cpu_of_run(run_dir, float(t0.min()) / 1e9, float(t0.max()) / 1e9)
    return (got.model_dump() if got else {}), note


def _machine_lines(m: dict, note: str = "") -> list[str]:
    """The machine's CPU during an emulation's load (``summary.json`` ``machine_cpu``,
    :mod:`testbed.emu.machine`), and a warning when it was saturated on the whole or for a
    stretch; ``note``: why it is not known."""
    from pydantic import ValidationError

    from testbed.emu.machine import OTHER_NOTABLE_CORES, SATURATED_SHARE, STEAL_NOTABLE_CORES, MachineCpu

    if note:
        return [f"Machine CPU during the load: not known: {note}."]
    if not m:
        return []
    try:
        mc = MachineCpu.model_validate(m)
    except ValidationError as exc:
        return [f"Machine CPU during the load: not known: summary.json's machine_cpu is malformed "
                f"({exc.error_count()} errors)."]
    roles = ", ".join(f"{r} {v:.2f}" for r, v in sorted(mc.by_role.items(), key=lambda kv: -kv[1]))
    lines = [f"Machine CPU during the load ({mc.window_s:g} s, first to last query): {mc.busy_cores:.2f} of "
             f"{mc.cpus} CPUs busy, {mc.steal_cores:.2f} stolen by the hypervisor ({100 * mc.busy_share:.0f} % in "
             f"all; at least {100 * SATURATED_SHARE:.0f} % for {mc.saturated_s:g} s of it, peak "
             f"{100 * mc.peak_share:.0f} % over one sample); cores by process: {roles}; the testbed's own processes "
             f"(link emulators, Open vSwitch, sources, controller, link probes, this run) {mc.testbed_cores:.2f}."]
    if mc.busy_share < SATURATED_SHARE and mc.saturated_s >= 0.1 * mc.window_s:
        lines.append(f"WARNING: the machine's CPUs were at least {100 * SATURATED_SHARE:.0f} % busy or stolen for "
                     f"{mc.saturated_s:g} s of the {mc.window_s:g} s load: queries of those seconds waited for a CPU "
                     f"in the testbed's own processes, which the simulator does not model.")
    hot = [f"{label} for {secs:g} s" for label, secs in mc.hot_threads.items() if secs >= 0.1 * mc.window_s]
    if hot:
        lines.append(f"WARNING: a single thread of the testbed's own processes was at least "
                     f"{100 * SATURATED_SHARE:.0f} % of one CPU busy for a tenth or more of the {mc.window_s:g} s "
                     f"load: {'; '.join(hot)}. What it forwards or sends waited behind it even where the machine "
                     f"had idle CPUs, which shows up as network time that the simulator does not have.")
    if mc.busy_share >= SATURATED_SHARE:
        other = mc.by_role.get("other", 0.0)
        beside = [f"the {other:.2f} cores of other processes on the machine"] if other >= OTHER_NOTABLE_CORES else []
        if mc.steal_cores >= STEAL_NOTABLE_CORES:
            beside.append(f"the {mc.steal_cores:.2f} cores the hypervisor gave to other machines")
        lines.append(f"WARNING: the machine's CPUs were {100 * mc.busy_share:.0f} % busy or stolen during the load: "
                     f"queries waited for a CPU in the link emulators, Open vSwitch, the sources and the servers' "
                     f"event loops, which shows up as network and queueing time that the simulator does not have "
                     f"(it models the clusters' CPU shares, not the testbed's own processes, "
                     f"{mc.testbed_cores:.2f} cores here" + "".join(f", nor {b}" for b in beside)
                     + "). Compare with a simulation only at a lower load or on a larger, quieter machine.")
    return lines


def _headline(s: dict) -> list[str]:
    sr = s.get("success_ratio")
    load = s.get("load_s", s["duration_s"])
    span = f"{load:g} s" if load == s["duration_s"] else f"{load:g} s of load (configured {s['duration_s']:g} s)"
    fails = ", ".join(f"{k} {v}" for k, v in (s.get("failures") or {}).items()) or "none"
    drops = s.get("drop_reasons") or {}
    if drops:
        fails += " (dropped: " + ", ".join(f"{k} {v}" for k, v in drops.items()) + ")"
    lines = [f"Summary: {s['queries']} queries in {span}, success ratio {'-' if sr is None else f'{sr:.3f}'}, "
             f"answered {s.get('throughput_qps', 0)} q/s; failures {fails}"]
    e, b = s.get("e2e_ms", {}), s.get("breakdown_ms", {})
    if e:
        lines.append(f"e2e ms: p50 {_cell(e.get('p50'))}  p95 {_cell(e.get('p95'))}  p99 {_cell(e.get('p99'))};  "
                     f"mean breakdown ms: network {_cell(b.get('network'))}  queueing {_cell(b.get('queueing'))}  "
                     f"inference {_cell(b.get('inference'))} "
                     f"({s.get('latency_rule', LATENCY_RULE)})")
    ex = s.get("network_excess_ms") or {}
    if ex.get("p50") is not None:
        lines.append(f"Network time above the planned RTT: p50 {ex['p50']:+.3f} ms, p95 {ex['p95']:+.3f} ms "
                     f"(network_ms - expected_rtt_ms, network_ms = t1 - t0 + t4 - t3: the transfer of request and "
                     f"answer, the links' queues, the source's dispatch decision, the server's reading of the "
                     f"request and writing of the answer, a cold query's TCP handshake, and in an emulation the "
                     f"forwarding cost of its own processes).")
    lines.extend(_machine_lines(s.get("machine_cpu") or {}, s.get("machine_cpu_note") or ""))
    lines.append(f"New connections (cold = 1): {s.get('cold_queries', 0)} queries here; "
                 f"{s.get('cold_rule', COLD_RULE)}.")
    le = (s.get("link_emulators") or {}).get("total")
    if le:
        lines.append(f"Link emulators: at most {le['max_late_ms']:.3f} ms late; {le['frames']} frames delivered; "
                     f"dropped: {le['lost']} by the loss model, {le['overflow']} FIFO overflow, {le['shaper_drops']} "
                     f"by the bandwidth shaper, {le['dropped_down']} on a link down, {le['kernel_drops']} by the "
                     f"kernel (the emulator fell behind), {le['send_errors']} send errors.")
    hs = s.get("host_speed") or {}
    if hs.get("slow"):
        lines.append(f"WARNING: this machine ran {hs['model']}'s bare model call {hs['ratio']}x slower than its "
                     f"profile ({hs['now_ms']} against {hs['profile_ms']} ms): every simulated figure of this "
                     f"plan is optimistic for this machine now (the warning starts at 1.25x); re-measure the "
                     f"profiles and the request handling on this machine state before comparing with a "
                     f"simulation, into a copy of your own: both commands overwrite --profiles, by default the "
                     f"tracked models/profiles/ that every later simulation reads (cp -r models/profiles "
                     f"{PROFILES_COPY}; testbed profile --shares 1,2 --profiles {PROFILES_COPY}; python -m "
                     f"testbed.serve.handling --profiles {PROFILES_COPY}; then profiles_dir: {PROFILES_COPY} "
                     f"in the experiment).")
    sc = s.get("service_check") or {}
    if sc.get("starved"):
        lines.append(_service_warning(s, sc))
    rc = s.get("records_check") or {}
    lines.extend(capture_warnings((s.get("capture") or {}).get("errors") or []))
    for name in rc.get("records_file_missing") or []:
        lines.append(f"WARNING: sources/{name}.records.csv is missing while the source's tally says it wrote "
                     f"{rc.get('queries_created', {}).get(name, '?')} records: none of its queries is in this summary.")
    for name, note in (rc.get("cut_last_line") or {}).items():
        lines.append(f"WARNING: sources/{name}.records.csv: {note}; its whole rows are kept.")
    if rc.get("missing_query_ids"):
        lines.append(f"WARNING: query ids missing from the records (lost records): {rc['missing_query_ids']}")
    if rc.get("sources_without_tally"):
        lines.append("WARNING: no tally from source(s) " + ", ".join(rc["sources_without_tally"])
                     + " (killed before they exited?): records lost at the end of their files cannot be counted")
    if s.get("aset_choices"):
        lines.append("ASET chose, window by window (share of its sources' queries): " + ", ".join(
            f"{k} {100 * v:.1f} %" for k, v in s["aset_choices"].items())
            + " (per source and window: the records' policy column; counts: sources/<name>.records.aset.json).")
    prov = s.get("provenance") or {}
    if prov.get("command"):
        code = (f"git {prov['git_commit'][:12]}" + (" with local changes" if prov.get("git_dirty") else "")
                if prov.get("git_commit") else "code version not known (no git)")
        lines.append(f"Reproduce: {prov['command']} ({code}).")
    h = s.get("health") or {}
    if h.get("failure"):
        lines.append(f"RUN FAILED: {h['failure']['kind']} {h['failure']['component']}; see the Health table and "
                     f"run.json. Records after that point are not of the planned experiment.")
    return lines


def print_summary(s: dict, console: Console, run_dir: Path | None = None) -> None:
    """Print the summary (plain text; headline and tables) and, when ``run_dir`` is given, save it
    as ``summary.md``: the same lines and real Markdown tables."""
    md: list[str] = []
    for line in _headline(s):
        console.print(Text(line))
        md.append(line + "\n")
    for title, cols, rows in _tables(s):
        t = Table(title=Text(title))
        for c in cols:
            t.add_column(Text(c), overflow="fold")
        for r in rows:
            t.add_row(*(Text("" if v is None else str(v)) for v in r))
        console.print(t)
        md.append(f"\n### {title}\n\n" + markdown_table([dict(zip(cols, r, strict=True)) for r in rows], cols))
    if run_dir is not None:
        replace_atomic(Path(run_dir) / "summary.md", lambda p: p.write_text("\n".join(md)))
