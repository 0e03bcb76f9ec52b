"""A run's records: reading them whole, merging the sources' files, the records check, Parquet.

A source appends one row per query to ``sources/<name>.records.csv`` (columns of
:data:`testbed.model.records.RECORD_FIELDS`, docs/records-schema.md). :func:`merge_records` joins
them by t0 into ``records.csv`` and ``records.parquet`` (one Parquet schema for every run,
:func:`records_arrow_schema`), with the packet analysis's ``pkt_*`` columns when it ran;
:func:`read_records` reads a merged file back, checked whole (:func:`check_records`);
:func:`records_check` counts rows per file and the query ids missing from them.

Raises (throughout): :class:`RecordsError` (an :class:`testbed.core.errors.InputError`, exit code
2) naming the file and the problem.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pandas as pd

from testbed.core.errors import InputError, RunFailure
from testbed.core.util import repeated, replace_atomic
from testbed.model.records import (
    CAUSES,
    COLUMNS,
    FAILURE,
    INTEGER_FIELDS,
    RECORD_FIELDS,
    SUCCESS,
    TEXT_FIELDS,
)
from testbed.plan.boundaries import SourceTally, read_config, tally_path


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
    out = df.copy()
    for c in TEXT_FIELDS & set(out.columns):
        out[c] = out[c].astype(object).where(out[c].notna(), None).map(lambda v: v if v is None else str(v))
    return out


def records_arrow_schema(df: pd.DataFrame):
    """The Parquet schema of a records frame: every record column with its one type (text: string;
    :data:`testbed.model.records.INTEGER_FIELDS`: int64; the rest: double; nulls allowed), whatever
    values the run happened to have, so that emulated and simulated files concatenate (left to
    pandas, each run's types are guessed: a column with no value becomes double, ``label`` int64 in
    one run and double in another); other columns (``pkt_*``) as pyarrow infers them.

    Returns:
        pyarrow.Schema, in ``df``'s column order.
    """
    import pyarrow as pa  # deferred: pyarrow is heavy, and only a writer of Parquet needs it

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



def records_check(run_dir: Path, df: pd.DataFrame) -> dict:
    """Rows per source file, rows merged, and per source the query ids missing from the records.
    ``df``: :func:`merge_records`'s frame, whose ``attrs["source_files"]`` has each file's whole rows
    and cut-line note (a file it lacks is read here).

    A source's ids are ``<source>-<n>``, n = 1 .. created. Its tally
    (:class:`testbed.plan.boundaries.SourceTally`, written when it exits) says how many it created,
    so records lost at the end of a file count too; without a tally (a source killed before it
    exited) only gaps inside 1 .. the largest id seen can be counted, and the source is listed in
    ``sources_without_tally``. A source whose tally is there but whose records file is not (deleted
    during the run) is in ``records_file_missing``, and all its created queries are missing;
    ``rows_lost``: per source, the rows its tally says it wrote that its file no longer holds;
    ``records_restored``: the sources that wrote their file back after it was deleted
    (:class:`testbed.plan.boundaries.SourceTally`). :func:`storage_faults` reads the verdict.
    """
    per_file, created, no_tally, cut, gone, written, restored = {}, {}, [], {}, [], {}, []
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
            tally = read_config(tally_path(p), SourceTally)
        except InputError:
            no_tally.append(name)
            continue
        created[name], written[name] = tally.created, tally.written
        if tally.restored:
            restored.append(name)
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
    lost = {name: n - per_file.get(name, 0) for name, n in written.items() if n > per_file.get(name, 0)}
    return {"rows_per_source_file": per_file, "rows_merged": int(len(df)), "missing_query_ids": gaps,
            "queries_created": created, "queries_written": written, "sources_without_tally": no_tally,
            "cut_last_line": cut, "records_file_missing": gone, "rows_lost": lost, "records_restored": restored}


def storage_faults(rc: dict) -> list[str]:
    """What :func:`records_check`'s result ``rc`` says went wrong with what the sources wrote, one
    sentence each ([] when nothing): a records file missing while its source's tally says it wrote
    rows, rows written that a file no longer holds, a file written back after it was deleted
    during the run, and a source that left no tally (it vanished: ``os._exit`` in a plug-in, a
    SIGKILL, a crash of native code; it never said how many queries it made). Any of them fails
    a run that had not failed already (exit code 4, :func:`testbed.results.runs.finish_emulation`)."""
    out = []
    for name in rc.get("records_file_missing") or []:
        out.append(f"storage: sources/{name}.records.csv is missing while source {name}'s tally says it wrote "
                   f"{(rc.get('queries_written') or {}).get(name, '?')} records; none of them is in this run")
    for name, n in (rc.get("rows_lost") or {}).items():
        if name not in (rc.get("records_file_missing") or []):
            out.append(f"storage: sources/{name}.records.csv holds {rc['rows_per_source_file'].get(name, 0)} rows "
                       f"while source {name}'s tally says it wrote {rc['queries_written'][name]}: {n} lost")
    for name in rc.get("records_restored") or []:
        out.append(f"storage: sources/{name}.records.csv was deleted during the run; source {name} wrote it back "
                   f"from its open file ({(rc.get('queries_written') or {}).get(name, '?')} rows), but the run was "
                   f"disturbed")
    for name in rc.get("sources_without_tally") or []:
        out.append(f"source {name} vanished: it left no tally (it exited without closing its records: os._exit in a "
                   f"plug-in, a kill, a crash), so the queries it made after its last record are not counted")
    return out

