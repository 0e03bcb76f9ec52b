"""The request-handling figures of the zoo's models: reading ``<profiles>/handling.json`` (schema 1),
measured by :mod:`testbed.serve.handling` (its docstring has the method and the file's format).

Per variant: ``handling_ms``, the CPU a server spends on each query beside the model call (its
event loop reading the request and writing the answer), ``answer_ms`` of it the answer's side
(encoding it: the server's writing of the answer, t3 -> t3h, which both engines put in ``handling_ms``
after the model call; a row without it, measured before it was, is refused with the command that
measures it),
and the call factors (:func:`call_factors`): the in-server call over
the profiler's bare call, and a cold call over a warm one. The plan's catalog reads them
(:class:`testbed.plan.catalog.ZooCatalog`) into each cluster's
:class:`~testbed.model.service.ServiceFigures`.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from testbed.plan import zoo

FILE = "handling.json"
SCHEMA = 1
#: Fewest queries of the isolated pass.
MIN_ISOLATED = 30
#: Fewest back-to-back queries per variant (``-n``).
MIN_N = 100
#: Least CPU time (s) a pass must total for a factor to be taken from it (20 ticks of 10 ms: 5 %).
RESOLUTION_S = 0.2


#: Bounds of the figures in ``handling.json`` (ms of CPU per query; queries per pass): a value
#: outside is a corrupt file, not a measurement (resnet50's call, the zoo's longest, is ~100 ms).
MAX_FIGURE_MS = 10_000.0
MIN_QUERIES, MAX_QUERIES = MIN_ISOLATED, 1_000_000
_MS_FIELDS = ("handling_ms", "call_cpu_ms", "call_cpu_isolated_ms", "bare_call_cpu_ms")


def _field(row: dict, key: str, kind: type, lo: float, hi: float) -> float | int:
    """``row[key]`` as a finite number of ``kind`` (JSON booleans and strings refused) in [lo, hi]."""
    v = row.get(key)
    ok_type = isinstance(v, int) if kind is int else isinstance(v, (int, float))
    if v is None or isinstance(v, bool) or not ok_type or not math.isfinite(v) or not lo <= v <= hi:
        want = "an integer" if kind is int else "a number"
        raise ValueError(f"{key} = {v!r} (expected {want} in [{lo:g}, {hi:g}])")
    return kind(v)


def measured_row(profiles_dir: str | os.PathLike[str], variant: str, runtime: str | None = None) -> dict[str, Any]:
    """The row of ``variant`` in ``handling.json`` with every figure checked: the four CPU times
    finite numbers in [0, :data:`MAX_FIGURE_MS`] ms, ``answer_ms`` in [0, ``handling_ms``], the query counts integers in
    [:data:`MIN_QUERIES`, :data:`MAX_QUERIES`], the runtime one of the zoo's. With ``runtime``: its
    row in ``other_runtimes`` when there is one, else the row in ``variants`` (whose ``runtime``
    then says which it is).

    Raises:
        zoo.ZooFileMissing: no ``handling.json``, or no row for ``variant`` (with the command to measure it).
        zoo.ZooError: the file is malformed, or a figure is out of range or missing (naming the field and value).
    """
    path = Path(profiles_dir) / FILE
    hint = (f"measure it: python -m testbed.serve.handling --variants {variant}"
            + (f" --runtime {runtime}" if runtime is not None else ""))
    if not path.is_file():
        raise zoo.ZooFileMissing(f"{path} does not exist; {hint}")
    try:
        doc = json.loads(path.read_text())
        rows = doc["variants"] if isinstance(doc, dict) else None
        if not isinstance(rows, dict):
            raise ValueError("no 'variants' object")
        row = rows.get(variant)
        others = doc.get("other_runtimes", {})
        if not isinstance(others, dict) or not isinstance(others.get(variant, {}), dict):
            raise ValueError("'other_runtimes' is not an object of objects")
        other = others.get(variant, {}).get(runtime) if runtime is not None else None
        if other is not None and not (isinstance(row, dict) and row.get("runtime") == runtime):
            row = other
        else:
            other = None
    except (ValueError, KeyError, TypeError, OSError) as exc:
        raise zoo.ZooError(f"{path}: malformed ({exc}); {hint}") from None
    if row is None:
        raise zoo.ZooFileMissing(f"{path} has no row for variant {variant!r}; {hint}")
    try:
        if not isinstance(row, dict):
            raise ValueError(f"the row is a {type(row).__name__}, not an object")
        got: dict[str, Any] = {k: _field(row, k, float, 0.0, MAX_FIGURE_MS) for k in _MS_FIELDS}
        for k in ("queries", "isolated_queries"):
            got[k] = _field(row, k, int, MIN_QUERIES, MAX_QUERIES)
        if row.get("runtime") not in zoo.RUNTIMES:
            raise ValueError(f"runtime = {row.get('runtime')!r} (expected one of {', '.join(zoo.RUNTIMES)})")
        if other is not None and row["runtime"] != runtime:
            raise ValueError(f"other_runtimes: the {runtime} row says runtime = {row['runtime']!r}")
        got["runtime"] = row["runtime"]
        if "answer_ms" not in row:
            raise ValueError("no answer_ms (the answer's side of the handling: the row was measured before it "
                             "was; without it the simulator would write no answer time, t3h - t3, while the "
                             "emulation's server does)")
        got["answer_ms"] = _field(row, "answer_ms", float, 0.0, got["handling_ms"])
    except ValueError as exc:
        raise zoo.ZooError(f"{path}: variant {variant!r}: {exc}; {hint}") from None
    return got


def handling_ms(profiles_dir: str | os.PathLike[str], variant: str) -> float:
    """CPU ms per request of the server's request handling for ``variant`` (``handling.json``).

    Raises:
        zoo.ZooFileMissing: no ``handling.json``, or no row for ``variant`` (with the command to measure it).
        zoo.ZooError: the file is malformed.
    """
    return measured_row(profiles_dir, variant)["handling_ms"]


def call_factors(profiles_dir: str | os.PathLike[str], variant: str) -> tuple[float, float]:
    """(in-server factor, cold factor) of ``variant``'s model call, from ``handling.json``:

    * in-server = the CPU of the server's warm model call (``call_cpu_ms``) / that of the bare
      call measured just before it (``bare_call_cpu_ms``: the profiler's call, back to back, 1
      thread), at least 1: the same call, made after the event loop decoded a real request and
      handed it to a worker thread;
    * cold = the CPU of its call after 100 ms of idleness / that of its warm call (at least 1).

    A factor whose pass used less than :data:`RESOLUTION_S` of CPU in all is 1.0: the CPU clock's
    10 ms ticks cannot resolve it (the small zoo's sub-millisecond models).

    Raises:
        zoo.ZooFileMissing / zoo.ZooError: as :func:`handling_ms`.
    """
    return factors_of(measured_row(profiles_dir, variant))


def _warm_resolved(row: dict[str, Any]) -> bool:
    """The back-to-back pass (and the bare call) used at least :data:`RESOLUTION_S` of CPU."""
    return min(row["call_cpu_ms"], row["bare_call_cpu_ms"]) * row["queries"] / 1e3 >= RESOLUTION_S


def _cold_resolved(row: dict[str, Any]) -> bool:
    """The isolated pass used at least :data:`RESOLUTION_S` of CPU."""
    return row["call_cpu_isolated_ms"] * row["isolated_queries"] / 1e3 >= RESOLUTION_S


def resolved(row: dict[str, Any]) -> bool:
    """Whether both passes of ``row`` used at least :data:`RESOLUTION_S` of CPU, so that
    :func:`factors_of` reads its factors (below, it gives 1.0). False for a row it cannot read."""
    try:
        return _warm_resolved(row) and _cold_resolved(row)
    except (KeyError, TypeError):
        return False


def queries_to_resolve(row: dict[str, Any]) -> int | None:
    """The least ``-n`` (rounded up to 100s) at which both passes of a row with these per-query
    figures would be :func:`resolved` (the isolated pass has ``n / 4`` queries); None when a figure
    is 0 ms (no ``-n`` resolves it)."""
    warm, cold = min(row["call_cpu_ms"], row["bare_call_cpu_ms"]), row["call_cpu_isolated_ms"]
    if warm <= 0 or cold <= 0:
        return None
    return max(MIN_N, math.ceil(max(RESOLUTION_S * 1e3 / warm, 4 * RESOLUTION_S * 1e3 / cold) / 100) * 100)


def factors_of(row: dict[str, Any]) -> tuple[float, float]:
    """:func:`call_factors` of a row :func:`measured_row` returned (no second read of the file)."""
    warm, cold, bare = row["call_cpu_ms"], row["call_cpu_isolated_ms"], row["bare_call_cpu_ms"]
    if not _warm_resolved(row):  # includes a bare call of 0 ms
        return 1.0, 1.0
    server = max(1.0, warm / bare)
    if not _cold_resolved(row):
        return server, 1.0
    return server, max(1.0, cold / warm)


__all__ = ["FILE", "MAX_FIGURE_MS", "MAX_QUERIES", "MIN_ISOLATED", "MIN_N", "MIN_QUERIES", "RESOLUTION_S", "SCHEMA",
           "call_factors", "factors_of", "handling_ms", "measured_row", "queries_to_resolve", "resolved"]
