"""The arrivals' input files, read at plan time and by each engine's sources: traces (a CSV column
``t_s``), demand matrices (CSV ``source_site,target_site,demand`` or SNDlib's through topohub) and
the spatial weights they give. The arrival processes themselves are pure model code
(:mod:`testbed.model.arrivals`)."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from testbed.core.util import InputFileError, read_input_text, repo_path
from testbed.model.arrivals import ArrivalError, ArrivalProcess, make_process
from testbed.spec.experiment import WorkloadSpec


def _csv_rows(path: Path, what: str) -> list[dict[str, str]]:
    """The rows of a CSV input file with a header (``csv.DictReader``).

    Raises:
        ArrivalError: ``<what> <path>: ...``: the file cannot be read as text
            (:func:`testbed.core.util.read_input_text`), or a line is not CSV (e.g. a field longer than
            the csv module's limit), with its line number.
    """
    try:
        text = read_input_text(path)
    except InputFileError as exc:
        raise ArrivalError(f"{what} {exc}") from None
    reader = csv.DictReader(io.StringIO(text, newline=""))
    try:
        return list(reader)
    except csv.Error as exc:
        # line_num counts the lines read before the one that failed
        raise ArrivalError(f"{what} {path}: line {reader.line_num + 1}: not CSV ({exc})") from None


def read_trace(path: str | Path) -> np.ndarray:
    """Timestamps (s) from a CSV file with a header and a column ``t_s``.

    Raises:
        ArrivalError: missing file, no ``t_s`` column, a value that is not a finite number >= 0.
    """
    path = Path(path)
    rows = _csv_rows(path, "trace")
    if not rows or "t_s" not in rows[0]:
        raise ArrivalError(f"trace {path}: needs a header with a column 't_s' (seconds since the load starts)")
    return np.asarray([_cell(f"trace {path}", k, "t_s", r["t_s"]) for k, r in enumerate(rows, start=2)])


def _cell(what: str, line: int, column: str, text: str | None) -> float:
    """``text`` (a CSV cell) as a finite number >= 0.

    Raises:
        ArrivalError: naming ``what``, the line and the column, when it is not one.
    """
    try:
        v = float(text)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ArrivalError(f"{what}: line {line}: {column} {text!r} is not a number") from None
    if not math.isfinite(v) or v < 0:
        raise ArrivalError(f"{what}: line {line}: {column} must be a finite number >= 0, got {v}")
    return v


def read_demand_matrix(path: str | Path) -> dict[str, float]:
    """Total demand originating at each site, from a CSV ``source_site,target_site,demand``, or
    from topohub (``topohub:sndlib/abilene``: SNDlib's demand matrix; sites by node id and name).

    Raises:
        ArrivalError: missing file or columns, a demand that is not a number >= 0, or a topohub
            topology without demands.
    """
    if str(path).startswith("topohub:"):
        import topohub

        key = str(path).removeprefix("topohub:")
        try:
            data = topohub.get(key)
        except Exception as exc:  # noqa: BLE001 - topohub raises various errors for unknown keys
            raise ArrivalError(f"demand matrix {path}: topohub has no {key!r} ({exc})") from None
        dem = data.get("graph", {}).get("demands") or {}
        if not dem:
            raise ArrivalError(f"demand matrix {path}: topohub {key!r} has no demands (SNDlib topologies have)")
        names = {n["id"]: n.get("name", str(n["id"])) for n in data["nodes"]}
        out: dict[str, float] = {}
        for src, row in dem.items():
            total = float(sum(row.values()))
            out[str(src)] = total
            out[str(names.get(src, src))] = total
        return out
    path = Path(path)
    rows = _csv_rows(path, "demand matrix")
    if not rows or not {"source_site", "demand"} <= set(rows[0]):
        raise ArrivalError(f"demand matrix {path}: needs columns source_site,target_site,demand")
    out: dict[str, float] = {}
    for k, r in enumerate(rows, start=2):
        d = _cell(f"demand matrix {path}", k, "demand", r["demand"])
        out[r["source_site"]] = out.get(r["source_site"], 0.0) + d
    return out


def source_weights(spec: WorkloadSpec, sources: Sequence[tuple[str, Sequence[str]]],
                   base_dir: Path = Path(".")) -> dict[str, float]:
    """Weight per selected source (mean 1 over them), from ``weights`` or ``demand_matrix``.

    ``sources``: (source name, the names its site goes by: label, node id) for each selected source.

    Raises:
        ArrivalError: the demand matrix names none of a source's site names, or every weight is 0.
    """
    names = [s for s, _ in sources]
    if spec.weights is not None:
        raw = {s: float(spec.weights.get(s, 0.0)) for s in names}
    elif spec.demand_matrix is not None:
        dm_path = spec.demand_matrix if spec.demand_matrix.startswith("topohub:") else \
            repo_path(spec.demand_matrix, base_dir)
        dm = read_demand_matrix(dm_path)
        raw = {}
        for s, sites in sources:
            hit = [dm[x] for x in sites if x in dm]
            if not hit:
                raise ArrivalError(f"demand matrix {spec.demand_matrix}: no row for the site of source {s!r} "
                                   f"(looked for {', '.join(map(repr, sites))})")
            raw[s] = hit[0]
    else:
        return dict.fromkeys(names, 1.0)
    total = sum(raw.values())
    if total <= 0:
        raise ArrivalError(f"workload {spec.application!r}: every source weight is 0")
    return {s: w * len(names) / total for s, w in raw.items()}


def arrival_process(spec: WorkloadSpec, rng: np.random.Generator, weight: float, base_dir: Path) -> ArrivalProcess:
    """:func:`testbed.model.arrivals.make_process` with a trace read from its file (relative to
    ``base_dir``, the experiment's folder): the one way both engines' sources build their arrivals.

    Raises:
        ArrivalError: the trace cannot be read.
    """
    trace = read_trace(repo_path(spec.trace, base_dir)) if spec.process == "trace" else None
    return make_process(spec, rng, weight, trace)


def application_rates(workload: Sequence[WorkloadSpec], weights: Sequence[dict[str, float]],
                      base_dir: Path) -> dict[str, float]:
    """Each application's mean query rate (q/s) over its workload entries at every source they
    select, with each source's spatial weight (``weights[i]``: source -> weight of entry i; a step
    process counts its highest rate, :attr:`~testbed.model.arrivals.ArrivalProcess.mean_rate_qps`).
    Applications without an entry are absent.

    Raises:
        testbed.model.arrivals.ArrivalError: an entry's process cannot be built (the plan has checked it).
    """
    rng = np.random.default_rng(0)
    rates: dict[str, float] = {}
    for w, by_source in zip(workload, weights, strict=True):
        for weight in by_source.values():
            rates[w.application] = rates.get(w.application, 0.0) + arrival_process(w, rng, weight,
                                                                                     base_dir).mean_rate_qps
    return rates


__all__ = ["application_rates", "arrival_process", "read_demand_matrix", "read_trace", "source_weights"]
