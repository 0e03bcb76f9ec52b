"""Sweeps: policies x scenarios x seeds, in local processes or on Ray; resumable; streamed to Parquet.

Each cell (scenario, policy, seed) is one run: :func:`testbed.results.runs.run_simulation` (default), or
with ``emulate=True`` one emulation, :func:`testbed.results.runs.run_emulation` (root; one per machine:
the Ray task needs the custom resource ``mininet: 1``, and takes ``/tmp/testbed-emulation.lock``
on its node). Cells run through :func:`testbed.core.distributed.imap_unordered` (``backend="process"``
or ``"ray"``, with ``ray_address`` for a cluster). The plan is sent to the workers, so a cluster's
nodes need the repository (the package and its model zoo) but not the experiment files.

Every finished cell is written at once to ``OUT/cells/<scenario>-<fingerprint>/<policy>-s<seed>.parquet``
(one row, atomically); a sweep started again with the same ``OUT`` skips the cells found there
that read back whole (a cell file that does not, cut short, is run again, and said so).
The fingerprint is a hash of what decides a cell's result besides policy and seed (the plan as
JSON, the duration, simulation or emulation, the link emulator).

``OUT`` is the sweep's own: before any cell runs, the sweep writes ``OUT/sweep.json`` (its inputs:
policies, seeds, duration, mode, each experiment by name and fingerprint). A sweep writes only
into a new or empty folder, or into one a sweep made (``sweep.json``; with other inputs, e.g. more
seeds, it says so and rewrites the tables for this call's); any other folder (another tool's, e.g.
an evaluation's ``runs.csv``, which would be replaced) is refused before anything runs, naming it. A sweep that fails
before it measured anything (Ray unreachable) removes what it created.

At the end, the results table has one row per run (``runs.csv``/``runs.parquet``) and one per
(scenario, policy) (``table.csv``, ``table.md``): success ratio mean and 95% confidence interval
over the seeds (:func:`testbed.core.util.ci95`), e2e latency percentiles (mean over seeds of each run's
p50/p95/p99, answered queries), failures per cause (mean count per run; every cause of
:data:`testbed.model.records.CAUSES`, so the causes add up to the failures). Plots:
``success_ratio.png`` (bars with the CI per scenario and policy) and ``e2e_p95.png``.
Results do not depend on the backend: the same seeds give the same table.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import math
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from testbed.core.distributed import imap_unordered
from testbed.core.errors import EXIT_BRINGUP, EXIT_INPUT, InputError, RunFailure
from testbed.core.plugins import ref_slug
from testbed.core.util import ci95, markdown_table, replace_atomic, write_json_atomic
from testbed.model.records import CAUSES
from testbed.plan.build import build_plan, events_after_end, plan_experiment, runs_dir_problem
from testbed.results.runs import run_emulation, run_simulation

#: The per-(scenario, policy) columns of ``table.md``, in order.
TABLE_COLUMNS = ["scenario", "policy", "seeds", "success_mean", "success_ci95", "e2e_p50_ms", "e2e_p95_ms",
                 "e2e_p99_ms"] + [f"fail_{c}" for c in CAUSES]
EMULATION_LOCK = Path("/tmp/testbed-emulation.lock")
#: The Ray resource an emulation cell needs: one unit per machine that can hold an emulation.
EMULATION_RESOURCE = "mininet"
#: The sweep's record in its output folder: what it was made with (:func:`sweep_inputs`).
SWEEP_RECORD = "sweep.json"
#: The columns every cell's row has (:func:`_row`); a cell file without them is not a finished cell.
CELL_COLUMNS = ["scenario", "policy", "seed", "queries", "success_ratio", "e2e_p50_ms", "e2e_p95_ms",
                "e2e_p99_ms"] + [f"fail_{c}" for c in CAUSES]


def _row(name: str, policy: str, seed: int, s: dict) -> dict:
    """A run's row of the results table, from its summary."""
    e2e = s.get("e2e_ms") or {}
    row = {"scenario": name, "policy": policy, "seed": seed, "queries": s["queries"],
           "success_ratio": s.get("success_ratio"), "e2e_p50_ms": e2e.get("p50"), "e2e_p95_ms": e2e.get("p95"),
           "e2e_p99_ms": e2e.get("p99"), "wall_s": (s.get("timings_s") or {}).get("wall_s")}
    for c in CAUSES:
        row[f"fail_{c}"] = (s.get("failures") or {}).get(c, 0)
    return row


def run_one(plan, policy: str, seed: int, duration_s: float | None, runs_dir: str | None) -> dict:
    """One simulated run (in a worker); returns its row of the results table. ``runs_dir`` None:
    the run directory is temporary.

    Raises:
        RunFailure: the temporary folder cannot be made, or the run cannot be written (exit 3,
            naming the folder)."""
    name = plan.experiment.name
    tmp = None
    if runs_dir is None:
        try:
            tmp = tempfile.mkdtemp(prefix="sweep-")
        except OSError as exc:
            raise RunFailure(f"sweep cell {name} / {policy} / seed {seed}: cannot make its temporary run folder in "
                             f"{tempfile.gettempdir()} ({exc.strerror or exc})", EXIT_BRINGUP) from None
        run_dir = Path(tmp) / "run"
    else:
        run_dir = Path(runs_dir) / f"{name}-{ref_slug(policy)}-s{seed}"
    try:
        _, s = run_simulation(plan, duration_s=duration_s, seed=seed, policy=policy, run_dir=run_dir, quiet=True)
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    return _row(name, policy, seed, s)


def with_policy_and_seed(plan, policy: str, seed: int):
    """``plan`` planned again with every source on ``policy`` and the experiment's seed ``seed``
    (what the emulation reads; the simulator takes both as arguments instead)."""
    exp = plan.experiment
    exp = exp.model_copy(update={"seed": seed, "policy": policy,
                                 "sources": [s.model_copy(update={"policy": None}) for s in exp.sources]})
    return build_plan(exp, base_dir=Path(plan.base_dir))


def run_one_emulated(plan, policy: str, seed: int, duration_s: float | None, runs_dir: str,
                     link_emulator: str | None = None) -> dict:
    """One emulated run (root) of ``plan`` with ``policy`` and ``seed``, under this machine's
    emulation lock; the run directory is kept under ``runs_dir/<scenario>-<policy>-s<seed>/``.

    Raises:
        RunFailure: the run exited non-zero (its run directory is named).
    """
    name = plan.experiment.name
    cell_dir = Path(runs_dir) / f"{name}-{ref_slug(policy)}-s{seed}"
    cell_dir.mkdir(parents=True, exist_ok=True)
    cell_plan = with_policy_and_seed(plan, policy, seed)
    with open(EMULATION_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one emulation per machine, queued behind any other
        before = set(cell_dir.iterdir())
        code = run_emulation(cell_plan, console=Console(quiet=True), runs_dir=cell_dir, duration_s=duration_s,
                              link_emulator=link_emulator)
    (run_dir,) = set(cell_dir.iterdir()) - before
    if code != 0:
        raise RunFailure(f"sweep cell {name} / {policy} / seed {seed}: testbed run exited {code}; see {run_dir}",
                         code)
    row = _row(name, policy, seed, json.loads((run_dir / "summary.json").read_text()))
    row["run_dir"] = str(run_dir)
    return row


def aggregate(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per (scenario, policy): n, success ratio mean and CI, latency percentiles, failures."""
    rows = []
    for (sc, pol), g in runs.groupby(["scenario", "policy"], sort=False):
        m, h = ci95(g["success_ratio"].tolist())
        row = {"scenario": sc, "policy": pol, "seeds": len(g), "queries_mean": round(g["queries"].mean(), 1),
               "success_mean": round(m, 4), "success_ci95": None if math.isnan(h) else round(h, 4)}
        for q in ("p50", "p95", "p99"):
            row[f"e2e_{q}_ms"] = round(float(g[f"e2e_{q}_ms"].mean()), 3)
        for c in CAUSES:
            row[f"fail_{c}"] = round(float(g[f"fail_{c}"].mean()), 1)
        rows.append(row)
    return pd.DataFrame(rows)


def plot(table: pd.DataFrame, out: Path) -> list[Path]:
    """Grouped bars per scenario and policy: success ratio (with the 95% CI) and e2e p95."""
    import matplotlib  # deferred: heavy, and only a plot needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    scen = list(dict.fromkeys(table["scenario"]))
    pols = list(dict.fromkeys(table["policy"]))
    for col, err, label, fname in (("success_mean", "success_ci95", "success ratio (mean, 95% CI)",
                                    "success_ratio.png"),
                                   ("e2e_p95_ms", None, "e2e p95 (ms, mean over seeds)", "e2e_p95.png")):
        fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(scen)), 4))
        w = 0.8 / max(1, len(pols))
        x = np.arange(len(scen))
        for i, p in enumerate(pols):
            sub = table[table["policy"] == p].set_index("scenario").reindex(scen)
            yerr = sub[err].astype(float).fillna(0).values if err else None
            ax.bar(x + i * w - 0.4 + w / 2, sub[col].astype(float).values, w, yerr=yerr, capsize=2, label=p)
        ax.set_xticks(x, scen, rotation=20, ha="right")
        ax.set_ylabel(label)
        ax.legend(fontsize=7, ncol=min(4, len(pols)))
        fig.tight_layout()
        try:
            replace_atomic(out / fname, lambda p, fig=fig: fig.savefig(p, dpi=120, format="png"))
        finally:
            plt.close(fig)
        paths.append(out / fname)
    return paths


def fingerprint(plan, duration_s: float | None, emulate: bool, link_emulator: str | None) -> str:
    """12 hex digits of SHA-256 over what decides a cell's result besides policy and seed, and the
    row's failure causes (:data:`CAUSES`: a cell written with other causes lacks a column, so it
    runs again rather than leave that cause empty)."""
    h = hashlib.sha256(plan.model_dump_json().encode())
    h.update(repr((duration_s, emulate, link_emulator if emulate else None, CAUSES)).encode())
    return h.hexdigest()[:12]


def cell_path(out: Path, name: str, fp: str, policy: str, seed: int) -> Path:
    """Where a finished cell's row is kept (one-row Parquet file)."""
    return out / "cells" / f"{name}-{fp}" / f"{ref_slug(policy)}-s{seed}.parquet"


@contextlib.contextmanager
def _writing_results(out: Path):
    """Turn an OSError of a write of the sweep's own files in ``out`` (a cell's row, the tables,
    the plots) into :class:`RunFailure` (exit 3) naming the file; a cell's own failures (its run,
    a worker) pass unchanged, so the message never blames ``out`` for them."""
    try:
        yield
    except OSError as exc:
        raise RunFailure(f"cannot write the sweep's results in {out} ({exc.filename or out}: {exc.strerror or exc})",
                         EXIT_BRINGUP) from None


def _write_cell(path: Path, row: dict) -> None:
    """One finished cell, atomically (:func:`testbed.core.util.replace_atomic`: whole or absent)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    replace_atomic(path, lambda tmp: pd.DataFrame([row]).to_parquet(tmp, index=False))


def read_cell(path: Path, name: str | None = None, policy: str | None = None,
              seed: int | None = None) -> pd.DataFrame:
    """A finished cell's row, read back whole: one row with every :data:`CELL_COLUMNS`, and (when
    given) the cell's scenario ``name``, ``policy`` and ``seed``.

    Raises:
        ValueError: the file cannot be read (cut short, not Parquet: pyarrow's message) or is not
            that cell's row (which part differs)."""
    import pyarrow as pa  # deferred: heavy, and only a cell file's reader needs it

    try:
        df = pd.read_parquet(path)
    except (OSError, ValueError, pa.ArrowException) as exc:  # cut short: pyarrow's ArrowInvalid
        raise ValueError(f"cannot be read back ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})"
                         ) from None
    missing = [c for c in CELL_COLUMNS if c not in df.columns]
    if len(df) != 1 or missing:
        raise ValueError(f"is not one row of the results table ({len(df)} rows"
                         + (f"; no column {', '.join(missing[:4])}" if missing else "") + ")")
    got = (df["scenario"].iloc[0], df["policy"].iloc[0], int(df["seed"].iloc[0]))
    want = (name, policy, seed)
    if any(w is not None and g != w for g, w in zip(got, want, strict=True)):
        raise ValueError(f"holds the row of {got[0]} / {got[1]} / seed {got[2]}, not of this cell")
    return df


def _pending_cells(cells: list, console) -> list:
    """The cells not finished: no file, or a file that does not read back as the cell's row
    (:func:`read_cell`: a write cut short); each of those is named, as it runs again."""
    pending = []
    for c in cells:
        plan, policy, seed, path = c
        if path.exists():
            try:
                read_cell(path, plan.experiment.name, policy, seed)
                continue
            except ValueError as exc:
                console.print(f"sweep: cell file {path} {exc}: running that cell again", markup=False,
                              highlight=False)
        pending.append(c)
    return pending


def sweep_inputs(cells: list, policies: Sequence[str], seeds: Sequence[int], duration_s: float | None,
                 emulate: bool, link_emulator: str | None) -> dict:
    """What decides a sweep's cells and tables (kept in ``OUT/sweep.json``): the policies, the
    seeds, the duration, the mode, and each experiment as ``<name>-<fingerprint>`` (the folder of
    its cells: the fingerprint changes with its plan)."""
    return {"policies": list(policies), "seeds": [int(x) for x in seeds], "duration_s": duration_s,
            "emulate": bool(emulate), "link_emulator": link_emulator if emulate else None,
            "experiments": list(dict.fromkeys(c[3].parent.name for c in cells))}


def _differences(made: dict, inputs: dict) -> list[str]:
    """The inputs of ``inputs`` that ``made`` (a ``sweep.json``'s) has otherwise, as ``key: there, here``
    (the order of policies and experiments does not count: it only orders the tables)."""
    def norm(k, v):
        return sorted(v) if k in ("policies", "experiments") and isinstance(v, list) else v

    return [f"{k}{' (name-fingerprint of the plan, duration and mode)' if k == 'experiments' else ''}: "
            f"{made.get(k)!r} there, {inputs[k]!r} here" for k in inputs
            if norm(k, made.get(k)) != norm(k, inputs[k])]


#: What a sweep writes in its folder (besides ``sweep.json``): a folder holding only these, with at
#: least one cell, is a sweep's made before sweeps recorded their inputs.
SWEEP_OUTPUTS = frozenset({"cells", "runs", "runs.csv", "runs.parquet", "table.csv", "table.md"})


def _old_sweep(out: Path) -> bool:
    """``out`` holds only a sweep's outputs (:data:`SWEEP_OUTPUTS`) and at least one cell file."""
    names = {p.name for p in out.iterdir()}
    return names <= SWEEP_OUTPUTS and (out / "cells").is_dir() and any((out / "cells").rglob("*.parquet"))


def check_out(out: Path, inputs: dict) -> list[str]:
    """Refuse an ``--out`` the sweep must not write in, before anything runs: a path under a file,
    or a folder that is not empty and that no sweep made (no ``sweep.json``: another tool's results,
    e.g. an evaluation's ``runs.csv``, would be replaced). A sweep's own folder made with other
    inputs (more seeds or policies, another duration: the usual way to extend a sweep) is taken,
    and its differences are returned (``key: there, here``) for the caller to say: its cells are
    kept, keyed by their inputs, and its tables are rewritten for these inputs.

    Raises:
        InputError: naming the folder and why (nothing was run or written)."""
    blocker = next((p for p in (out, *out.parents) if p.exists()), None)
    if blocker is not None and not blocker.is_dir():
        raise InputError(f"--out {out}: {blocker} is a file, not a folder; nothing was run")
    if not out.is_dir() or not any(out.iterdir()):
        return []
    record = out / SWEEP_RECORD
    if not record.is_file() and _old_sweep(out):
        return [f"{SWEEP_RECORD}: none there (a sweep made before sweeps recorded their inputs)"]
    if not record.is_file():
        names = sorted(p.name for p in out.iterdir())
        shown = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
        raise InputError(f"--out {out}: the folder holds {shown} but no {SWEEP_RECORD}: testbed sweep did not make "
                         f"it, and would replace its files; give a new or empty folder; nothing was run")
    try:
        made = json.loads(record.read_text())["inputs"]
        diff = _differences(made, inputs)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise InputError(f"--out {out}: {record} cannot be read as a sweep's record ({type(exc).__name__}: {exc}); "
                         f"nothing was run") from None
    return diff


def _plan_cells(experiments: Sequence[str], policies: Sequence[str], seeds: Sequence[int], out: Path,
                duration_s: float | None, emulate: bool, link_emulator: str | None):
    """Plan every experiment (bad input fails here, before anything runs); the cells as
    (plan, policy, seed, path of its result)."""
    cells = []
    for e in experiments:
        plan = plan_experiment(e)
        fp = fingerprint(plan, duration_s, emulate, link_emulator)
        cells += [(plan, p, s, cell_path(out, plan.experiment.name, fp, p, s)) for p in policies for s in seeds]
    return cells


def _run_cells(pending: list, duration_s: float | None, runs_dir: str | None, emulate: bool, link_emulator: str | None,
               jobs: int | None, backend: str, ray_address: str | None, prog, task) -> None:
    """Run the cells not done yet; write each as it finishes."""
    if emulate:
        tasks = [(plan, p, s, duration_s, runs_dir, link_emulator) for plan, p, s, _ in pending]
        it = imap_unordered(run_one_emulated, tasks, backend=backend, ray_address=ray_address,
                            jobs=1 if backend == "process" else jobs, resources={EMULATION_RESOURCE: 1})
    else:
        tasks = [(plan, p, s, duration_s, runs_dir) for plan, p, s, _ in pending]
        it = imap_unordered(run_one, tasks, backend=backend, jobs=jobs, ray_address=ray_address)
    for i, row in it:
        with _writing_results(pending[i][3].parents[2]):  # out/cells/<scenario>/<cell>
            _write_cell(pending[i][3], row)
        prog.update(task, advance=1, info=f"{row['scenario']} {row['policy']} seed {row['seed']}: "
                                          f"{row['success_ratio']}")


def sweep(experiments: Sequence[str], policies: Sequence[str], seeds: Sequence[int], out: Path,
          jobs: int | None = None, duration_s: float | None = None, keep_runs: bool = False,
          console=None, *, backend: str = "process", ray_address: str | None = None, emulate: bool = False,
          link_emulator: str | None = None) -> pd.DataFrame:
    """Run every (experiment, policy, seed) not finished yet in ``out`` with a progress bar; write
    the tables and plots to ``out``; return the per-(scenario, policy) table.

    Args:
        jobs: parallel workers (process backend) or CPUs of the embedded Ray (default: CPU count).
        backend: ``process`` or ``ray`` (:mod:`testbed.core.distributed`); ``ray_address`` implies ``ray``.
        emulate: every cell is an emulation (root), one per machine at a time.
        keep_runs: keep every simulated run directory under ``out/runs`` (emulated runs are always kept).

    Raises:
        testbed.spec.experiment.ConfigError, testbed.plan.build.PlanError: an experiment is invalid (checked
            before any run starts).
        testbed.core.errors.InputError: ``out`` is under a file, or is a folder that is not empty and
            not this sweep's (:func:`check_out`), checked before any run starts.
        testbed.core.distributed.DistributedError: Ray missing or unreachable, or no node for emulations
            (what this call created in ``out`` is removed: nothing was measured).
        testbed.core.errors.RunFailure: an emulated cell failed (the cells finished before it are kept);
            ``out`` cannot be written, checked before any cell runs, or a write failed later (a
            full disk: exit code 3, naming the file; every file is written whole or not at all).
    """
    console = console or Console()
    backend = "ray" if ray_address else backend
    if emulate and ray_address is None and os.geteuid() != 0:
        raise RunFailure("sweep --emulate: the emulation needs root on this machine (sudo)", EXIT_INPUT)
    cells = _plan_cells(experiments, policies, seeds, out, duration_s, emulate, link_emulator)
    if duration_s is not None:  # what testbed simulate says of a --duration before the scenario's events
        for plan in {id(c[0]): c[0] for c in cells}.values():  # each experiment's plan once
            late = events_after_end(plan.changes, duration_s)
            if late:
                console.print(f"note: {plan.experiment.name}: {late}", markup=False, highlight=False)
    inputs = sweep_inputs(cells, policies, seeds, duration_s, emulate, link_emulator)
    diff = check_out(out, inputs)
    if diff:
        console.print(f"sweep: {out} was made by a sweep of other inputs ({'; '.join(diff)}): its cells are kept "
                      f"(each keyed by its inputs), and its tables and {SWEEP_RECORD} are rewritten for these",
                      markup=False, highlight=False)
    problem = runs_dir_problem(out)
    if problem:
        raise RunFailure(f"--out {out}: {problem}; nothing was run", EXIT_BRINGUP)
    record = {"made_by": "testbed sweep", "inputs": inputs, "experiment_files": [str(e) for e in experiments]}
    return _sweep_cells(cells, record, out, jobs, duration_s, keep_runs, console, backend, ray_address,
                        emulate, link_emulator)


def _sweep_cells(cells: list, record: dict, out: Path, jobs: int | None, duration_s: float | None,
                 keep_runs: bool, console, backend: str, ray_address: str | None, emulate: bool,
                 link_emulator: str | None) -> pd.DataFrame:
    """Write ``record`` (``sweep.json``) unless there, run the cells not finished in ``out`` with a
    progress bar, then write the results (:func:`sweep`). On any failure before a cell finished,
    what this call created is removed."""
    created = next((p for p in reversed([out, *out.parents]) if not p.exists()), None)
    wrote_record = False
    try:
        with _writing_results(out):
            out.mkdir(parents=True, exist_ok=True)
            if not (out / SWEEP_RECORD).exists():  # a new folder is marked as the sweep's before any cell
                write_json_atomic(out / SWEEP_RECORD, record)
                wrote_record = True
        runs_dir = str(out / "runs") if keep_runs or emulate else None
        pending = _pending_cells(cells, console)
        if len(pending) < len(cells):
            console.print(f"sweep: {len(cells) - len(pending)} of {len(cells)} cells already done in "
                          f"{out / 'cells'}; running the other {len(pending)}", markup=False, highlight=False)
        with Progress(TextColumn("[bold]sweep[/bold]"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      TextColumn("{task.fields[info]}"), console=console) as prog:
            task = prog.add_task("sweep", total=len(cells), completed=len(cells) - len(pending), info="")
            if pending:
                _run_cells(pending, duration_s, runs_dir, emulate, link_emulator, jobs, backend, ray_address,
                           prog, task)
    except BaseException:
        _undo_if_nothing_measured(out, created, wrote_record)
        raise
    with _writing_results(out):
        df = write_results([c[3] for c in cells], record["inputs"]["policies"], out)
        write_json_atomic(out / SWEEP_RECORD, record)  # the inputs of the tables now there (extended or not)
        return df


def _undo_if_nothing_measured(out: Path, created: Path | None, wrote_record: bool) -> None:
    """After a failed sweep: when the only file this call left is its ``sweep.json`` (no cell, no
    kept run), remove what it created (``created``, the topmost folder it made, or the record and
    the empty folders in an ``out`` that was empty); anything measured is kept."""
    top = created or out
    if not top.is_dir():
        return
    ours = {out / SWEEP_RECORD} if wrote_record else set()
    if any(p not in ours for p in top.rglob("*") if not p.is_dir()):
        return
    if created is not None:
        shutil.rmtree(created, ignore_errors=True)
    elif wrote_record:  # ``out`` was empty: it is again
        for p in list(out.iterdir()):
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)


def write_results(cell_files: Sequence[Path], policies: Sequence[str], out: Path) -> pd.DataFrame:
    """``runs.csv``/``.parquet``, ``table.csv``/``.md`` and the plots from the finished cells, each
    written whole or not at all (:func:`testbed.core.util.replace_atomic`).

    Raises:
        RunFailure: a cell file does not read back (:func:`read_cell`; named: run the sweep again
            to run that cell again); nothing is written then.
        OSError: a file cannot be written (the others are as they were, or whole)."""
    pol_rank = {p: i for i, p in enumerate(policies)}
    rows = []
    for f in cell_files:
        try:
            rows.append(read_cell(f))
        except ValueError as exc:
            raise RunFailure(f"cell file {f} {exc}; no table was written", EXIT_BRINGUP) from None
    runs = pd.concat(rows, ignore_index=True)
    runs = runs.sort_values(["scenario", "policy", "seed"], key=lambda c: c.map(pol_rank) if c.name == "policy"
                            else c).reset_index(drop=True)
    replace_atomic(out / "runs.csv", lambda p: runs.to_csv(p, index=False))
    replace_atomic(out / "runs.parquet", lambda p: runs.to_parquet(p, index=False))
    table = aggregate(runs)
    replace_atomic(out / "table.csv", lambda p: table.to_csv(p, index=False))
    replace_atomic(out / "table.md", lambda p: p.write_text(markdown_table(table, TABLE_COLUMNS)))
    plot(table, out)
    return table
