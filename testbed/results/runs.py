"""Running one experiment end to end: an engine, then the merge, the summary and the exit code.

The engines measure (:func:`testbed.emu.lifecycle.emulate`, :func:`testbed.sim.run.simulate`) and say
what they measured; this module, above them, turns that into a run folder with its summary and
the command's exit code (:mod:`testbed.core.errors`):

- :func:`run_emulation` (``testbed run``, the emulated sweep): ``time_dilation: auto`` chosen
  first (:mod:`testbed.emu.autodilate`); then the run's verdict (what the sources wrote, counted)
  recorded in ``run.json`` before the summary, and the records merged and summarised, in a child
  process, whatever happened before (``summary.json``, ``summary.md``; with packet capture, the
  packet analysis first: :mod:`testbed.results.verdict`); a run that measured nothing never exits
  0 (5), nor one in which every query failed (6); a summary that fails or crashes turns a
  successful run into a failed one (4), ``run.json`` keeping the verdict and saying so, the
  records staying in ``sources/``; ``--strict``: a run whose time dilation was too small exits 3;
- :func:`run_simulation` (``testbed simulate``, the sweep): the simulated run folder written whole
  or not at all (a full or unwritable disk leaves nothing that looks like a finished run: exit 3).
"""

from __future__ import annotations

import io
import json
import os
import shutil
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from rich.console import Console

from testbed.agent.checkpoint import checkpoint_files, checkpoint_path
from testbed.agent.live import aset_sources
from testbed.core.errors import (
    EXIT_ALL_FAILED,
    EXIT_BRINGUP,
    EXIT_COMPONENT_DIED,
    EXIT_INTERRUPTED,
    EXIT_NOTHING_MEASURED,
    EXIT_OK,
    RunFailure,
)
from testbed.core.hashing import file_sha256
from testbed.core.plugins import ref_slug
from testbed.core.util import replace_atomic, repo_path, write_json_atomic
from testbed.emu.autodilate import resolve
from testbed.emu.lifecycle import EmulationOutcome, emulate
from testbed.plan.build import Plan
from testbed.results.figures import all_failed_reason
from testbed.results.record_files import storage_faults
from testbed.results.summary import print_summary, summarize
from testbed.results.verdict import measured_verdict, summarise_in_child
from testbed.sim.engine import Simulator
from testbed.sim.run import simulate

__all__ = ["TwinLine", "checkpoint_line", "finish_emulation", "run_emulation", "run_simulation"]

#: The twin's line of a run's summary: (run folder, plan, queries measured, whether the run ended
#: ok) -> (the line, what ``summary.json`` keeps of it); :func:`testbed.results.twin_comparison.twin_line`.
TwinLine = Callable[[Path, Plan, int, bool], tuple[str, dict]]


# ----------------------------------------------------------------------------- emulation

def run_emulation(plan: Plan, console: Console | None = None, runs_dir: Path | None = None,
                  duration_s: float | None = None, link_emulator: str | None = None,
                  process_ends: bool = False, strict: bool = False,
                  summarise: Summariser | None = None, twin: TwinLine | None = None) -> int:
    """Emulate a planned experiment end to end (:func:`testbed.emu.lifecycle.emulate`), then record its
    verdict and summarise what was measured (:func:`finish_emulation`); returns the exit code
    (:mod:`testbed.core.errors`). A plan whose time dilation is ``auto`` gets its k first, from
    measured warm-ups (:func:`testbed.emu.autodilate.resolve`; they go to ``runs_dir/auto-dilation``).
    Results go to ``runs_dir/<timestamp>-<name>/``; records measured before a failure or an
    interruption are kept and summarised (the plan carries the experiment's folder, where its traces
    are read). ``process_ends``: the caller exits with the returned code right after (the CLI):
    SIGINT and SIGTERM stay ignored once the outcome is recorded, so the process's exit status is
    the recorded one. ``strict``: a run whose measurements say its time dilation was too small exits
    3 (:mod:`testbed.results.verdict`). ``summarise``: what summarises (default:
    :func:`summarise_run`, in a child process). ``twin``: the summary ends with the simulated twin's
    line (:func:`summarize_twin`; ``testbed run`` gives :func:`testbed.results.twin_comparison.twin_line`).

    Raises:
        InputError: ``auto`` found no k within the bound; RunFailure: a warm-up failed.
    """
    console = console or Console(markup=False, highlight=False, soft_wrap=True)
    said = checkpoint_line(plan)
    if said:
        console.print(said, markup=False, highlight=False)
    plan, auto = resolve(plan, console, runs_dir)
    with emulate(plan, console, runs_dir, duration_s, link_emulator, process_ends, auto=auto) as outcome:
        if outcome.run_dir is not None:
            outcome.status, outcome.message = finish_emulation(outcome, console, strict, summarise, plan, twin)
    return outcome.status


def checkpoint_line(plan: Plan, policy: str | None = None) -> str | None:
    """The console's line naming the ASET checkpoint a run loads, for the sources it drives (those on
    policy ``aset`` without a selector of one's own; none with a ``policy`` override): its
    ``aset.checkpoint``, the weights file it resolves to and the first 16 hex digits of that file's
    SHA-256 (``run.json`` records the checkpoint too). None when no checkpoint drives a source."""
    aset = plan.experiment.aset
    sources = [] if policy is not None else aset_sources(plan)
    if not sources or aset is None or not aset.checkpoint or aset.selector is not None:
        return None
    weights = checkpoint_files(checkpoint_path(aset.checkpoint))[0]
    digest = f"SHA-256 {file_sha256(weights)[:16]}..." if weights.is_file() else "its weights file is missing"
    return (f"ASET: source(s) {', '.join(sources)} choose their policy each window with the checkpoint "
            f"{aset.checkpoint} ({weights}, {digest})")


#: What summarises a run: (outcome, console) -> summary dict (:func:`summarise_run`).
Summariser = Callable[[EmulationOutcome, Console], dict]


def verdict_of(status: int, message: str, verdict: dict) -> tuple[int, str]:
    """The run's exit code and message from the engine's and what the sources wrote
    (:func:`testbed.results.verdict.measured_verdict`): a run that measured nothing never exits 0
    (:data:`~testbed.core.errors.EXIT_NOTHING_MEASURED`), nor one in which every query failed
    (:data:`~testbed.core.errors.EXIT_ALL_FAILED`)."""
    if status != EXIT_OK:
        return status, message
    if not verdict["queries"]:
        return EXIT_NOTHING_MEASURED, "the run measured no query"
    if not verdict["success"]:
        return EXIT_ALL_FAILED, all_failed_reason(verdict["queries"], verdict["failures"])
    return status, message


def _record(outcome: EmulationOutcome, **fields) -> None:
    if outcome.record is not None:
        outcome.record.update(**fields)


def finish_emulation(outcome: EmulationOutcome, console: Console, strict: bool = False,
                     summarise: Summariser | None = None, plan: Plan | None = None,
                     twin: TwinLine | None = None) -> tuple[int, str]:
    """Record the run's verdict, then summarise it: (exit code, message).

    1. The verdict: what the sources wrote, counted (:func:`testbed.results.verdict.measured_verdict`),
       the exit code from it (:func:`verdict_of`), into ``run.json`` (``verdict``, ``status``,
       ``exit_code``, ``message``; ``summary: {"status": "running"}``) before anything else.
    2. The summary (``summarise``, default :func:`summarise_run`: in a child process). When it
       fails, whatever the cause (an exception, a crash of the child), the run fails
       (:data:`~testbed.core.errors.EXIT_COMPONENT_DIED` unless it had failed already), ``run.json``
       says ``summary: {"status": "failed", "error": ...}``, and the records stay in ``sources/``
       (``testbed report RUN_DIR`` summarises them).
    3. The records against the sources' tallies (a records file deleted or cut, a source that
       vanished without its tally: :func:`testbed.results.record_files.storage_faults`), each said on a
       ``RECORDS:`` line; a run that ended ok with such a fault exits
       :data:`~testbed.core.errors.EXIT_COMPONENT_DIED`.
    4. With ``twin`` (and the run's ``plan``), the summary's last line: the twin's verdict
       (:func:`summarize_twin`).
    5. ``strict``: a run whose measurements say its time dilation was too small
       (``summary.json`` ``dilation_check``) exits :data:`~testbed.core.errors.EXIT_BRINGUP` (3).
    """
    verdict = measured_verdict(outcome.run_dir)
    status, message = verdict_of(outcome.status, outcome.message, verdict)
    if status != outcome.status:
        console.print(f"error: {message} (exit code {status})", markup=False, highlight=False)
    _record(outcome, verdict=verdict, status="ok" if status == EXIT_OK else "failed", exit_code=status,
            message=message, summary={"status": "running"})
    try:
        s = (summarise or summarise_run)(outcome, console)
    except (Exception, KeyboardInterrupt) as exc:  # noqa: BLE001 - whatever stops the summary, the verdict stays
        why = "interrupted" if isinstance(exc, KeyboardInterrupt) else f"{type(exc).__name__}: {exc}"
        console.print(f"error: the summary could not be made ({why}); the verdict is in run.json, the records are "
                      f"in {outcome.run_dir / 'sources'} (testbed report {outcome.run_dir} summarises them)",
                      markup=False, highlight=False)
        if status == EXIT_OK:
            status = EXIT_INTERRUPTED if isinstance(exc, KeyboardInterrupt) else EXIT_COMPONENT_DIED
        _record(outcome, summary={"status": "failed", "error": why}, status="failed", exit_code=status,
                message=f"summary failed: {why}")
        return status, f"summary failed: {why}"
    check = s.get("dilation_check") or {}
    _record(outcome, summary={"status": "ok"}, dilation_check=check)
    faults = storage_faults(s.get("records_check") or {})
    for fault in faults:  # what the sources wrote against what is on disk: said whatever the run's status
        console.print(f"RECORDS: {fault}", markup=False, highlight=False)
    if status == EXIT_OK and faults:
        message = f"{faults[0]} (and {len(faults) - 1} more)" if len(faults) > 1 else faults[0]
        console.print(f"error: {message}; the run's records are not whole (exit code {EXIT_COMPONENT_DIED})",
                      markup=False, highlight=False)
        _record(outcome, status="failed", exit_code=EXIT_COMPONENT_DIED, message=message)
        return EXIT_COMPONENT_DIED, message
    if twin is not None and plan is not None and s.get("queries"):
        try:
            summarize_twin(twin, outcome.run_dir, plan, s, status == EXIT_OK, console)
        except OSError as exc:
            console.print(f"twin: not written ({exc})", markup=False, highlight=False)
    if strict and status == EXIT_OK and check.get("too_small"):
        message = "time dilation too small (--strict): " + "; ".join(check["reasons"])
        console.print(f"error: {message} (exit code {EXIT_BRINGUP})", markup=False, highlight=False)
        return EXIT_BRINGUP, message
    return status, message


def summarise_run(outcome: EmulationOutcome, console: Console) -> dict:
    """``summary.json`` (in a child process: :func:`testbed.results.verdict.summarise_in_child`) and
    ``summary.md`` of whatever was measured (also of nothing: a run that failed before its load
    says so there too); printed when there are records.

    Raises:
        SummaryFailed: the child failed or crashed; OSError: ``summary.md`` cannot be written.
    """
    run_dir = outcome.run_dir
    measured = any((run_dir / "sources").glob("*.records.csv"))
    s = summarise_in_child(run_dir, outcome.duration_s, outcome.timings, outcome.capture)
    print_summary(s, console if measured else Console(file=io.StringIO()), run_dir)
    return s


def summarize_twin(twin: TwinLine, run_dir: Path, plan: Plan, s: dict, ok: bool, console: Console) -> None:
    """The summary's last line: the simulated twin's verdict, or how to get it (``twin``, e.g.
    :func:`testbed.results.twin_comparison.twin_line`: compared when the run ended ok and that is cheap);
    kept as ``twin`` in ``summary.json`` and as the last line of ``summary.md``.

    Raises:
        OSError: ``summary.json`` or ``summary.md`` cannot be written.
    """
    line, facts = twin(run_dir, plan, int(s["queries"]), ok)
    console.print(line, markup=False, highlight=False)
    s["twin"] = facts
    write_json_atomic(run_dir / "summary.json", s, indent=2)
    md = run_dir / "summary.md"
    if md.exists():
        text = md.read_text().rstrip("\n") + f"\n\n{line}\n"
        replace_atomic(md, lambda p: p.write_text(text))


# ----------------------------------------------------------------------------- simulation

def run_simulation(plan: Plan, runs_dir: Path | None = None,
                   duration_s: float | None = None, seed: int | None = None, policy: str | None = None,
                   run_dir: Path | None = None, console: Console | None = None,
                   quiet: bool = False) -> tuple[Path, dict]:
    """Simulate ``plan`` for ``duration_s`` (default: the experiment's; :func:`testbed.sim.run.simulate`)
    and write its run directory with its summary. ``policy`` overrides the policy of every source.
    Returns (run directory, summary dict). ``run_dir`` default: ``runs_dir`` (default the
    experiment's) ``/<timestamp>-<name>[-<policy>]-sim-s<seed>``.

    The run directory is written whole or not at all (:func:`_write_whole`): a full or unwritable
    disk leaves nothing that looks like a finished run.

    Raises:
        testbed.sim.SimError, testbed.model.arrivals.ArrivalError: bad input, naming the item (a source
            a checkpoint that does not fit a source on ``aset``: :func:`testbed.agent.live.check_agents`).
        testbed.core.errors.RunFailure: the run directory cannot be written (exit code 3; names it and
            the reason; nothing is left there).
    """
    exp = plan.experiment
    out = simulate(plan, duration_s=duration_s, seed=seed, policy=policy)
    if run_dir is None:
        base = Path(runs_dir) if runs_dir else repo_path(exp.runs_dir)
        tag = f"-{ref_slug(policy)}" if policy else ""
        run_dir = base / f"{datetime.now():%Y%m%d-%H%M%S}-{exp.name}{tag}-sim-s{out.sim.seed}"
    n = len(out.sim.queries_recorded)
    s = _write_whole(out.sim, Path(run_dir), out.duration_s, out.wall_s, out.selector)
    if not quiet:
        console = console or Console()
        said = checkpoint_line(plan, policy)
        if said:
            console.print(said, markup=False, highlight=False)
        print_summary(s, console)
        console.print(f"simulated {out.duration_s:g} s, {n} queries in {out.wall_s:.2f} s wall; run directory: "
                      f"{run_dir}")
    return run_dir, s


def _write_whole(sim: Simulator, run_dir: Path, duration_s: float, wall_s: float, selector: dict | None = None
                 ) -> dict:
    """Write the simulated run (records, ``run.json``, ``summary.json``, ``summary.md``) into a
    hidden sibling of ``run_dir`` and rename it to ``run_dir`` once everything is written; an
    earlier simulated run of the same name is replaced. Returns the summary.

    Raises:
        testbed.core.errors.RunFailure: a write failed (a full disk, no permission), or ``run_dir``
            exists and is not a simulated run directory (exit code 3; the partial copy is removed).
    """
    _check_replaceable(run_dir)
    tmp = run_dir.with_name(f".{run_dir.name}.partial-{os.getpid()}")
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        extra = {"simulated_s": duration_s, "wall_s": round(wall_s, 3), "queries": len(sim.queries_recorded),
                 "status": "ok"}
        if selector is not None:  # aset.selector: what drove the sources (import path or file, version, SHA-256)
            extra["selector"] = selector
        sim.write_run(tmp, extra)
        s = summarize(tmp, duration_s)
        s["mode"] = "simulation"
        s["time_dilation"] = 1.0  # the simulator's clock is virtual: emulation.time_dilation does not apply
        s["cold_rule"] = "simulated: the simulator models no TCP connection, so no query opens one (cold = 0 for all)"
        s["timings_s"] = {"wall_s": round(wall_s, 3)}
        write_json_atomic(tmp / "summary.json", s, indent=2)
        print_summary(s, Console(quiet=True), tmp)  # summary.md
        if run_dir.exists():
            shutil.rmtree(run_dir)
        os.rename(tmp, run_dir)
    except (OSError, RunFailure) as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        cause = exc if isinstance(exc, OSError) else exc.__cause__  # the merge's RunFailure wraps its OSError
        why = getattr(cause, "strerror", None) or str(cause or exc)
        raise RunFailure(f"cannot write the simulated run {run_dir}: {why}; nothing was left there (free space or "
                         f"choose another --runs-dir)", EXIT_BRINGUP) from None
    return s


def _check_replaceable(run_dir: Path) -> None:
    """A new simulated run may take ``run_dir``'s place: it does not exist, is an empty folder, or
    is an earlier simulated run of the same name (its ``run.json`` says so; replaced as the
    simulator always did).

    Raises:
        testbed.core.errors.RunFailure: ``run_dir`` exists and is not a simulated run directory (exit 3).
    """
    if not run_dir.exists() or (run_dir.is_dir() and not any(run_dir.iterdir())):
        return
    try:
        simulated = json.loads((run_dir / "run.json").read_text()).get("mode") == "simulation"
    except (OSError, ValueError, AttributeError):
        simulated = False
    if not simulated:
        raise RunFailure(f"{run_dir} exists and is not a simulated run directory; it is left as it is: choose "
                         f"another --runs-dir", EXIT_BRINGUP)
