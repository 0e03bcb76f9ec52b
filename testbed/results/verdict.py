"""An emulated run's verdict before its summary, the summary in a process of its own, and the
"too small a k" check.

**The verdict first.** When the load ends, :func:`measured_verdict` counts what the sources wrote
(``sources/*.records.csv``, read as plain CSV rows: no pandas, nothing that can crash), and the run
writes it to ``run.json`` (``verdict``, ``status``, ``exit_code``, ``message``) before it summarises
(:func:`testbed.results.runs.finish_emulation`). The summary (merge, figures, packet analysis) then
runs in a child process (:func:`summarise_in_child`): whatever happens to it, an exception or a
crash of the numerical libraries (SIGSEGV), the run keeps its verdict, ``run.json`` says
``summary: {"status": "failed", ...}`` and ``testbed report RUN_DIR`` can still summarise the
records.

**Too small a k** (:func:`dilation_check`; docs/dilation.md, "Too small a k"). A run's own
measurements say its time dilation k was too small, whatever k it was (1 included), when any of:

1. the network: the host's share of the network time (per answered query on an open connection
   ``network_ms - expected_rtt_ms`` minus the planned transfer,
   :func:`testbed.plan.transfer.host_share_ms`) has a p50 above :data:`UNDERSIZED_HOST_MS` and
   above :data:`UNDERSIZED_HOST_SHARE` of the planned network time's p50: twice what ``auto``
   aims at (:func:`testbed.emu.autodilate.excess_target_ms`);
2. the CPU: the emulation's own processes and its servers used at least
   :data:`UNDERSIZED_CPU_SHARE` of the cores available to it over the load (the machine's cores
   less other jobs' that are not niced and the hypervisor's steal, at least the CFS fair share:
   :func:`testbed.emu.machine.emulation_cores`): they were short of CPU;
3. Open vSwitch: it used at least :data:`UNDERSIZED_OVS_CORES` of a core per ``ovs-vswitchd`` (its
   user-space datapath forwards in one thread: it was saturated). With OVS shards the mean per
   daemon is judged (their sum is spread over many threads and cores);
4. the CPU at the load's peaks: in at least :data:`UNDERSIZED_SHORT_SHARE` of the load window the
   emulation's own processes and servers used at least
   :data:`~testbed.emu.machine.SATURATED_SHARE` of the cores available to them in that sampling
   step (``machine_cpu.short_s``): a mean over the window below criterion 2's hides bursts and
   events that the machine could not carry.

The summary says so in its first lines; ``testbed run --strict`` exits 3 on it.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from testbed.core.errors import EXIT_COMPONENT_DIED, RunFailure
from testbed.core.util import REPO_ROOT
from testbed.emu.machine import SATURATED_SHARE, emulation_cores

#: The "too small a k" thresholds (module docstring).
UNDERSIZED_HOST_MS = 2.0
UNDERSIZED_HOST_SHARE = 0.20
UNDERSIZED_CPU_SHARE = 0.90
UNDERSIZED_OVS_CORES = 0.90
UNDERSIZED_SHORT_SHARE = 0.10
#: The summary's child process (``python -m`` this module).
SUMMARY_MODULE = "testbed.results.summary_process"


class SummaryFailed(RunFailure):
    """The summary's child process failed (its exit code or signal, and its last lines); a component
    of the run died (exit code :data:`~testbed.core.errors.EXIT_COMPONENT_DIED`)."""

    exit_code = EXIT_COMPONENT_DIED


# ----------------------------------------------------------------------------- the verdict

def measured_verdict(run_dir: Path) -> dict:
    """What the sources wrote, counted from ``sources/*.records.csv`` as plain CSV rows: ``queries``,
    ``answered`` (HTTP 200), ``success``, ``success_ratio`` (None without a query), ``failures``
    (count per ``failure_cause``), ``per_source`` (rows per file), ``counted_from``. A file that
    cannot be read is named in ``unreadable``."""
    queries = answered = success = 0
    failures: dict[str, int] = {}
    per_source: dict[str, int] = {}
    unreadable: dict[str, str] = {}
    for f in sorted((Path(run_dir) / "sources").glob("*.records.csv")):
        n = 0
        try:
            with open(f, newline="", errors="replace") as fh:
                for row in csv.DictReader(fh):
                    n += 1
                    answered += (row.get("http_status") or "").strip() in ("200", "200.0")
                    if row.get("outcome") == "success":
                        success += 1
                    elif row.get("failure_cause"):
                        failures[row["failure_cause"]] = failures.get(row["failure_cause"], 0) + 1
        except (OSError, csv.Error) as exc:
            unreadable[f.name] = str(exc)
        per_source[f.name.removesuffix(".records.csv")] = n
        queries += n
    out = {"queries": queries, "answered": answered, "success": success,
           "success_ratio": round(success / queries, 4) if queries else None,
           "failures": dict(sorted(failures.items())), "per_source": per_source,
           "counted_from": "sources/*.records.csv, as CSV rows, before the summary"}
    if unreadable:
        out["unreadable"] = unreadable
    return out


# ----------------------------------------------------------------------------- the summary's process

def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def summarise_in_child(run_dir: Path, duration_s: float, timings: dict[str, float], capture: bool,
                       module: str = SUMMARY_MODULE) -> dict:
    """Run ``python -m module RUN_DIR DURATION_S TIMINGS_JSON [--capture]`` (the summary:
    :mod:`testbed.results.summary_process`) and return the ``summary.json`` it wrote. Its output goes
    to ``logs/summary.log``.

    Raises:
        SummaryFailed: it exited non-zero or died of a signal (named, with its last lines).
    """
    run_dir = Path(run_dir)
    cmd = [sys.executable, "-m", module, str(run_dir), repr(float(duration_s)), json.dumps(timings)]
    if capture:
        cmd.append("--capture")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    env.setdefault("PYTHONFAULTHANDLER", "1")  # a crash leaves its Python stack in the log
    log = run_dir / "logs" / "summary.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as out:
        code = subprocess.run(cmd, cwd=str(REPO_ROOT), env=env, stdout=out, stderr=subprocess.STDOUT).returncode
    if code != 0:
        how = f"died of {_signal_name(code)}" if code < 0 else f"exited with code {code}"
        try:
            tail = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()][-6:]
        except OSError:
            tail = []
        raise SummaryFailed(f"the summary process {how} (its log: {log})" + (": " + " | ".join(tail) if tail else ""))
    return json.loads((run_dir / "summary.json").read_text())


# ----------------------------------------------------------------------------- too small a k

def dilation_check(k: float, host_p50_ms: float | None, planned_p50_ms: float | None, machine_cpu: dict,
                   ovs_daemons: int = 1) -> dict:
    """The module docstring's rule on a run's figures: ``too_small`` (bool), ``reasons`` (one
    sentence per criterion met), ``figures`` and ``rule``. ``machine_cpu``: ``summary.json``'s
    (:class:`testbed.emu.machine.MachineCpu` as a dict; {} when unknown: the CPU criteria are then
    not judged, and ``unjudged`` says so). ``ovs_daemons``: the ``ovs-vswitchd`` processes that
    forwarded (1, or the OVS shards: ``network.json`` ``ovs``)."""
    reasons, unjudged = [], []
    host_bound = max(UNDERSIZED_HOST_MS, UNDERSIZED_HOST_SHARE * (planned_p50_ms or 0.0))
    if host_p50_ms is None:
        unjudged.append("network (no answered query)")
    elif host_p50_ms > host_bound:
        reasons.append(f"the host added {host_p50_ms:.2f} ms to the median query's network time (p50 of network - "
                       f"planned RTT - planned transfer), above {host_bound:.2f} ms (the larger of "
                       f"{UNDERSIZED_HOST_MS:g} ms and {UNDERSIZED_HOST_SHARE:.0%} of the planned network time, "
                       f"p50 {planned_p50_ms or 0:.2f} ms)")
    figures = {"host_share_p50_ms": None if host_p50_ms is None else round(host_p50_ms, 3),
               "planned_network_p50_ms": None if planned_p50_ms is None else round(planned_p50_ms, 3),
               "host_share_bound_ms": round(host_bound, 3)}
    roles = machine_cpu.get("by_role") or {}
    if roles:
        cpus = int(machine_cpu.get("cpus") or os.cpu_count() or 1)
        steal = float(machine_cpu.get("steal_cores") or 0.0)
        competing = float(roles.get("other", 0.0)) + steal
        own, available = emulation_cores(roles, steal, cpus)
        ovs = float(roles.get("ovs-vswitchd", 0.0))
        figures.update(own_cores=round(own, 3), available_cores=round(available, 3), ovs_cores=round(ovs, 3))
        if own >= UNDERSIZED_CPU_SHARE * available:
            reasons.append(f"the emulation's own processes and servers used {own:.2f} cores of the {available:.2f} "
                           f"available to it ({cpus} cores less {competing:.2f} of other jobs not niced and of the "
                           f"hypervisor): at least {UNDERSIZED_CPU_SHARE:.0%}, they were short of CPU")
        daemons = max(1, int(ovs_daemons))
        if ovs / daemons >= UNDERSIZED_OVS_CORES:
            per = f" ({ovs / daemons:.2f} per ovs-vswitchd of {daemons})" if daemons > 1 else ""
            reasons.append(f"Open vSwitch used {ovs:.2f} cores{per}, at least {UNDERSIZED_OVS_CORES:g} of its one "
                           f"forwarding thread: it was saturated")
        short, window = float(machine_cpu.get("short_s") or 0.0), float(machine_cpu.get("window_s") or 0.0)
        figures["short_s"] = round(short, 1)
        if window > 0 and short >= UNDERSIZED_SHORT_SHARE * window:
            reasons.append(f"for {short:.0f} s of the load's {window:.0f} s the emulation's own processes and servers "
                           f"used at least {SATURATED_SHARE:.0%} of the cores available to them (at least "
                           f"{UNDERSIZED_SHORT_SHARE:.0%} of the load): they were short of CPU at its peaks")
    else:
        unjudged.append("CPU (the machine's CPU during the load is not known)")
    out = {"time_dilation": k, "too_small": bool(reasons), "reasons": reasons, "figures": figures,
           "rule": "docs/dilation.md, 'Too small a k' (testbed.results.verdict)"}
    if unjudged:
        out["unjudged"] = unjudged
    return out


def dilation_warning(check: dict) -> str | None:
    """The summary's first line about ``check`` (:func:`dilation_check`), or None when k was enough."""
    if not check or not check.get("too_small"):
        return None
    k = check.get("time_dilation", 1.0)
    return (f"TIME DILATION TOO SMALL: at k = {k:g} this run's own measurements say the machine did not keep up: "
            + "; ".join(check["reasons"]) + ". Its figures describe this machine as much as the emulated system: "
            "run it again with a larger --time-dilation, or --time-dilation auto (docs/dilation.md); "
            "testbed run --strict exits 3 on this.")


__all__ = ["SUMMARY_MODULE", "SummaryFailed", "dilation_check", "dilation_warning",
           "measured_verdict", "summarise_in_child"]
