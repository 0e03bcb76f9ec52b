"""``time_dilation: auto``: k chosen from a short warm-up of the experiment's own load, measured.

The rule (our choice, stated; docs/dilation.md, "auto"). A warm-up at a candidate k is the
experiment emulated as it will run (its network, clusters, sources and workload), for a short
load (:func:`warmup_seconds`: about :data:`WARMUP_QUERIES` queries, between
:data:`WARMUP_MIN_WALL_S` and :data:`WARMUP_MAX_WALL_S` of wall clock), without packet capture,
RTT self-check and path warming (each source still opens one connection to every cluster before
the load; warming every path takes k x its time, minutes at large k), and with its scenario events
moved after the load's end (:func:`warmup_plan`): none happens, but the probes that would measure
them run, and their CPU is measured with the rest.
It measures, on this machine now:

- the CPU per query of each of the testbed's own roles (Open vSwitch, link emulators, sources,
  controller, the run process) and of the inference servers (CPU s per query, wall clock:
  :mod:`testbed.emu.machine`), over the load's window; a query's path length is in these figures
  (a longer path costs more Open vSwitch and link emulator CPU), and is printed as CPU per
  switch link;
- the host's share of the network time: per answered query on an open connection, ``network_ms -
  expected_rtt_ms`` minus the planned transfer the simulator models
  (:func:`testbed.plan.transfer.host_share_ms`), p50, in emulated ms.

Before the warm-ups the machine's other jobs are sampled for :data:`MACHINE_SAMPLE_S` s
(:func:`measure_machine`): CPU of processes niced above this one counts as available (they yield:
:data:`testbed.emu.machine.NICED_OTHER`), CPU of the others and the hypervisor's steal does not.

From one warm-up at k_c the smallest k that carries the load is the largest of (:func:`needed_k`):

- CPU: the emulation's cores at k = 1 (the testbed's CPU per query x the plan's peak emulated
  rate, plus the servers', capped at the clusters' cores), over :data:`MAX_BUSY_FRACTION` of the
  available cores (``cpus - competing``, at least ``cpus / (1 + competing)``: the share CFS gives
  a waking process beside always-busy ones). Below half busy the mean wait for a CPU stays below
  the work's own time (M/M/1: wait / service = rho / (1 - rho) <= 1 at rho = 0.5);
- Open vSwitch: its cores at k = 1 over :data:`MAX_BUSY_FRACTION` of one core (its user-space
  datapath forwards in one thread). Once warm-ups at two rates or more are measured, the testbed's
  CPU that does not fall with the rate (the idle network's timers and polls, :func:`cpu_floor`) is
  taken from these budgets and only the rest is counted per query;
- the network: the host's share scales as 1 / k (the emulator's wall-clock cost per packet, divided
  by k in emulated time; docs/dilation.md measured 3.6-4.6 x less at k = 4 than at k = 1), so
  k_c x share / target, with the target :func:`excess_target_ms`: the validation's bound on a
  stage's median, 1 ms or 10 % of the planned network time's median, whichever is larger. Once
  warm-ups at two k or more are measured, the share is fitted as ``floor + b / k``
  (:func:`network_floor`): only ``b / k`` falls with k, so k is ``b / target``; a floor that does
  not fall with k is printed (dilation cannot remove it) and does not drive k.

k is then rounded up on :func:`k_grid` and checked by a warm-up at that k, up to
:data:`MAX_WARMUPS` warm-ups (:func:`choose`): a warm-up whose figures ask for more k leads to one
at the larger k; one that carries its k with room to spare (it asks for at most k / 1.5), or that
carries a k above :data:`FULL_PERIOD_K` while asking for one at most that, leads to one at the
smaller k (above it runs have come out well above their twins: docs/dilation.md). The smallest k a
warm-up carried is chosen; when none did, the last figures'
k, said to be unverified. Above :data:`~testbed.spec.experiment.MAX_TIME_DILATION` ``auto``
refuses, with the figures.

The first candidate (:func:`first_candidate`) is a guess from the plan alone (its rate and path
lengths, :func:`testbed.emu.capacity.guess_cores`, the pre-flight's estimate); only the warm-ups'
measurements decide.

Warm-ups are kept (``auto-dilation/warmups.json`` beside their run folders) and reused for the same
plan (its network, clusters, sources and workload: :func:`plan_key`) for
:data:`REUSE_MAX_AGE_S`, while other jobs' CPU is within :data:`REUSE_LOAD_TOLERANCE` cores of what
it was then: the usual run-change-run loop pays for its warm-ups once. The run's own check
(:mod:`testbed.results.verdict`, "too small a k") judges every run, warm-ups reused or not.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from rich.console import Console

from testbed.core.cgroups import MAX_PERIOD_US, PERIOD_US
from testbed.core.errors import EXIT_OK, InputError, RunFailure
from testbed.core.util import repo_path, write_json_atomic
from testbed.emu.capacity import (
    MAX_BUSY_FRACTION,
    emulated_rate_qps,
    guess_cores,
    k_grid,
)
from testbed.emu.lifecycle import emulate
from testbed.emu.machine import (
    NICED_OTHER,
    SERVER_ROLE,
    TESTBED_ROLES,
    available_cores,
    machine_cpu_of_run,
    other_jobs,
)
from testbed.emu.source import CANNOT_REACH
from testbed.plan.build import Plan
from testbed.plan.dilation import with_time_dilation
from testbed.plan.speeds import ClusterSpeed
from testbed.plan.transfer import TransferTable, dilation_figures
from testbed.spec.experiment import MAX_TIME_DILATION

#: The host's share of the network time p50 auto aims under (ms), or this share of the planned
#: network time's median, whichever is larger (:func:`excess_target_ms`): the validation's bound
#: on a stage's median (docs/dilation.md).
EXCESS_TARGET_MS = 1.0
EXCESS_TARGET_SHARE = 0.10
#: A warm-up's load: about this many queries, within these bounds of wall clock (s), and at least
#: :data:`WARMUP_MIN_QUERIES` whatever the wall clock.
WARMUP_QUERIES = 200
WARMUP_MIN_QUERIES = 50
WARMUP_MIN_WALL_S = 5.0
WARMUP_MAX_WALL_S = 15.0
#: At most this many warm-ups per choice: enough for a first guess too small (it asks for much
#: more), the larger k (it carries, asking for less), and two steps down towards the smallest k
#: that carries; above k = 10 the kernel enforces a sub-core quota loosely (docs/dilation.md).
MAX_WARMUPS = 4
#: A warm-up that carried its k asks for a smaller one only below k / this ...
LOWER_MARGIN = 1.5
#: ... or when its k is above this one and the smaller is not: the largest k at which a cluster's
#: CFS period is the model's 100 ms of emulated time (the kernel's longest period, 1 s, over
#: 100 ms); above it runs have succeeded well above their twins (docs/dilation.md, "What is not done").
FULL_PERIOD_K = MAX_PERIOD_US / PERIOD_US
#: How long (s) other jobs' CPU is sampled before the warm-ups.
MACHINE_SAMPLE_S = 1.0
#: Fewer answered queries on open connections than this and a warm-up's network figure is not
#: judged (its CPU is).
MIN_ANSWERED = 20
#: The testbed's CPU that does not fall with the rate (:func:`cpu_floor`) is taken from the CPU
#: budget up to this share of it; beyond, the rest counts per query as before (our choice: a fit
#: over a few warm-ups on a busy machine is not trusted to leave less than a quarter).
MAX_FIXED_SHARE = 0.75
#: Warm-ups of the same plan are reused this long (s) ...
REUSE_MAX_AGE_S = 3600.0
#: ... while other jobs' competing CPU differs by at most this many cores from then.
REUSE_LOAD_TOLERANCE = 0.25
#: A warm-up's scenario events are moved this long (emulated s) past its load's end: past its drain too,
#: so that none happens while its last answers are awaited (:func:`warmup_plan`).
EVENTS_AFTER_S = 86_400.0
#: The warm-ups kept for reuse, in the warm-ups' folder.
WARMUPS_FILE = "warmups.json"


@dataclass
class Machine:
    """Other jobs on this machine now: ``cpus``, ``competing`` (cores of processes not niced
    above this one, plus the hypervisor's steal), ``niced`` (cores of niced ones: available)."""

    cpus: int
    competing: float
    niced: float

    @property
    def available(self) -> float:
        """Cores the emulation can count on (:func:`testbed.emu.machine.available_cores`)."""
        return available_cores(self.cpus, self.competing)


@dataclass
class Warmup:
    """What one warm-up at ``k`` measured: ``queries`` (all) and ``answered``; ``window_s`` (wall
    s of the load: first to last query); ``role_cores`` (mean cores per role over it, wall
    clock); ``host_ms`` (p50 of the host's share of the network time, emulated ms; None with
    fewer than :data:`MIN_ANSWERED` answered); ``planned_network_ms`` (p50 of RTT + planned
    transfer, emulated ms); ``hops`` (mean switch links per answered query's path);
    ``success`` (ratio); ``run_dir``; ``wall_s`` (the warm-up, bring-up included)."""

    k: float
    queries: int
    answered: int
    window_s: float
    role_cores: dict[str, float]
    host_ms: float | None
    planned_network_ms: float | None
    hops: float
    success: float | None
    run_dir: str = ""
    wall_s: float = 0.0
    timings_s: dict[str, float] = field(default_factory=dict)

    def cpu_ms_per_query(self) -> dict[str, float]:
        """CPU (ms, wall clock) per query of each role (cores x window / queries)."""
        if self.queries <= 0:
            return {}
        return {r: c * self.window_s / self.queries * 1e3 for r, c in self.role_cores.items()}

    def wall_qps(self) -> float:
        """The load's queries per second of wall clock."""
        return self.queries / self.window_s if self.window_s > 0 else 0.0

    def testbed_cores(self) -> tuple[float, float]:
        """Mean cores over the load of the testbed's own roles, and of Open vSwitch among them."""
        return (sum(c for r, c in self.role_cores.items() if r in TESTBED_ROLES),
                self.role_cores.get("ovs-vswitchd", 0.0))


@dataclass
class Need:
    """The k each criterion asks for from one warm-up (:func:`needed_k`), and ``k`` (their largest,
    at least 1), with the figures behind them (``fixed_cores``: :func:`cpu_floor`'s)."""

    k: float
    k_cpu: float
    k_ovs: float
    k_network: float
    needed_cores: float
    ovs_cores: float
    target_ms: float
    floor_ms: float = 0.0
    fixed_cores: tuple[float, float] = (0.0, 0.0)

    def binding(self) -> str:
        """Which criterion sets ``k``."""
        return max((("CPU", self.k_cpu), ("Open vSwitch", self.k_ovs), ("network", self.k_network)),
                   key=lambda kv: kv[1])[0]


@dataclass
class AutoDilation:
    """What ``auto`` chose: ``k``; ``verified`` (a warm-up at ``k`` carried it); ``rate_qps``
    (the plan's peak emulated q/s); ``machine``; ``warmups`` (each with its :class:`Need`);
    ``why`` (the lines printed); ``wall_s`` (the whole choice)."""

    k: float
    verified: bool
    rate_qps: float
    machine: Machine
    warmups: list[tuple[Warmup, Need]] = field(default_factory=list)
    why: list[str] = field(default_factory=list)
    wall_s: float = 0.0

    def to_dict(self) -> dict:
        """For ``run.json`` (``time_dilation_auto``)."""
        return {"k": self.k, "verified": self.verified, "rate_qps": round(self.rate_qps, 3),
                "machine": asdict(self.machine), "wall_s": round(self.wall_s, 1), "why": self.why,
                "warmups": [{**asdict(w), "need": asdict(n)} for w, n in self.warmups]}


# ----------------------------------------------------------------------------- pure rules

def excess_target_ms(planned_network_ms: float | None) -> float:
    """The host's share of the network time p50 (ms) auto aims under: :data:`EXCESS_TARGET_MS`, or
    :data:`EXCESS_TARGET_SHARE` of the planned network time's median, whichever is larger."""
    return max(EXCESS_TARGET_MS, EXCESS_TARGET_SHARE * (planned_network_ms or 0.0))


def _intercept(pts: list[tuple[float, float]]) -> float:
    """``a`` of ``y = a + b u`` fitted by least squares to ``pts`` (u, y), with ``a, b >= 0`` (all of
    y is ``a`` when the slope is not positive); 0 with fewer than two distinct u."""
    if len({round(u, 9) for u, _ in pts}) < 2:
        return 0.0
    u = np.array([p[0] for p in pts])
    y = np.array([p[1] for p in pts])
    b = float(np.polyfit(u, y, 1)[0])
    if b <= 0:
        return max(0.0, float(y.mean()))
    return max(0.0, float(np.mean(y - b * u)))


def network_floor(points: list[tuple[float, float]]) -> float:
    """The part of the host's share of the network time that does not fall with k (ms): ``a`` of
    ``share = a + b / k`` fitted by least squares to the warm-ups' (k, share) (``a, b >= 0``); 0
    with fewer than two distinct k."""
    return _intercept([(1.0 / k, x) for k, x in points if x is not None])


def cpu_floor(warmups: list[Warmup]) -> tuple[float, float]:
    """The testbed's CPU that does not fall with the load's rate (cores: its own roles, and Open
    vSwitch among them): ``a`` of ``cores = a + b x q/s`` fitted to the warm-ups' (wall-clock q/s,
    cores) as :func:`network_floor` fits the share; (0, 0) with fewer than two distinct rates. The
    idle network's timers and polls cost this whatever k; counted per query, they made a warm-up
    at a larger k (fewer queries per second) ask for a larger k still."""
    pts = [(w.wall_qps(), w.testbed_cores()) for w in warmups if w.queries > 0]
    return (_intercept([(q, c[0]) for q, c in pts]), _intercept([(q, c[1]) for q, c in pts]))


def needed_k(w: Warmup, rate_qps: float, cluster_cores: float, machine: Machine, floor_ms: float = 0.0,
             fixed_cores: tuple[float, float] = (0.0, 0.0)) -> Need:
    """The k each criterion of the module docstring asks for, from warm-up ``w`` at the plan's peak
    emulated rate ``rate_qps`` (q/s), the clusters' ``cluster_cores`` and the ``machine``;
    ``floor_ms``: the part of the host's share that does not fall with k (:func:`network_floor`);
    ``fixed_cores``: the testbed's and Open vSwitch's CPU that does not fall with the rate
    (:func:`cpu_floor`), taken from their budgets (at most :data:`MAX_FIXED_SHARE` of each)
    rather than counted per query."""
    per = w.cpu_ms_per_query()
    qps = w.wall_qps()
    (testbed_cores, ovs_cores), (fixed, ovs_fixed) = w.testbed_cores(), fixed_cores
    testbed = max(0.0, testbed_cores - fixed) / qps * 1e3 if qps > 0 else 0.0  # ms per query
    servers = min(cluster_cores, rate_qps * per.get(SERVER_ROLE, 0.0) / 1e3)
    needed = rate_qps * testbed / 1e3 + servers  # cores at k = 1
    ovs = rate_qps * (max(0.0, ovs_cores - ovs_fixed) / qps if qps > 0 else 0.0)
    budget = MAX_BUSY_FRACTION * machine.available
    k_cpu = needed / max(budget - fixed, (1.0 - MAX_FIXED_SHARE) * budget)
    k_ovs = ovs / max(MAX_BUSY_FRACTION - ovs_fixed, (1.0 - MAX_FIXED_SHARE) * MAX_BUSY_FRACTION)
    target = excess_target_ms(w.planned_network_ms)
    k_net = w.k * max(0.0, w.host_ms - floor_ms) / target if w.host_ms is not None else 0.0
    return Need(max(1.0, k_cpu, k_ovs, k_net), k_cpu, k_ovs, k_net, needed, ovs, target, floor_ms,
                (fixed, ovs_fixed))


def next_candidate(tried: list[tuple[float, float]]) -> float | None:
    """The next k to warm up at, from the (k, needed k) of the warm-ups so far (:func:`choose`'s
    rule), or None: the choice is made."""
    k, need = tried[-1]
    carried = [kk for kk, n in tried if n <= kk]
    failed = [kk for kk, n in tried if n > kk]
    if need <= k:
        lower = k_grid(need)
        room = lower <= k / LOWER_MARGIN or lower <= FULL_PERIOD_K < k
        if room and lower > max(failed, default=0.0) and lower not in carried:
            return lower
        return None
    up = k_grid(need)  # > k: k is on the grid
    if up > MAX_TIME_DILATION or up in failed:
        return None
    smaller_carried = [kk for kk in carried if kk <= up]  # up itself carried: nothing to check
    return None if smaller_carried else up


def decision(tried: list[tuple[float, float]]) -> tuple[float, bool]:
    """(k, verified) from the warm-ups' (k, needed k): the smallest k a warm-up carried, else the
    last warm-up's needed k on the grid (not verified)."""
    carried = [k for k, n in tried if n <= k]
    if carried:
        return min(carried), True
    return k_grid(tried[-1][1]), False


# ----------------------------------------------------------------------------- measurements

def measure_machine(sample_s: float = MACHINE_SAMPLE_S, proc: Path = Path("/proc")) -> Machine:
    """Other jobs' CPU now, over ``sample_s`` s (:class:`Machine`, :func:`testbed.emu.machine.other_jobs`)."""
    compete, niced = other_jobs(sample_s, proc)
    return Machine(os.cpu_count() or 1, compete, niced)


def first_candidate(plan: Plan, machine: Machine) -> float:
    """The first k to warm up at: a guess from the plan's rate and path lengths
    (:func:`testbed.emu.capacity.guess_cores`, the pre-flight's estimate)."""
    return min(MAX_TIME_DILATION, k_grid(guess_cores(plan) / (MAX_BUSY_FRACTION * machine.available)))


def warmup_seconds(rate_qps: float, k: float) -> float:
    """A warm-up's load, emulated s: :data:`WARMUP_QUERIES` at ``rate_qps``, within
    [:data:`WARMUP_MIN_WALL_S`, :data:`WARMUP_MAX_WALL_S`] s of wall clock at k, and at least
    :data:`WARMUP_MIN_QUERIES` queries."""
    if rate_qps <= 0:
        return WARMUP_MAX_WALL_S / k
    within = min(max(WARMUP_QUERIES / rate_qps, WARMUP_MIN_WALL_S / k), WARMUP_MAX_WALL_S / k)
    return max(within, WARMUP_MIN_QUERIES / rate_qps)


def warmup_plan(plan: Plan, k: float, seconds: float) -> Plan:
    """``plan`` at k for a warm-up of ``seconds`` (emulated s) of load: no packet capture, no RTT
    self-check, and its scenario events moved after the load's end, so that none happens while the
    probes that would measure them run as in the run (:mod:`testbed.emu.dynamics`: their packets
    cost Open vSwitch and the link emulators CPU that the run pays too, and that does not fall with
    the load's rate)."""
    exp = plan.experiment
    emulation = exp.emulation.model_copy(update={"rtt_check": False})
    exp = exp.model_copy(update={"capture": None, "emulation": emulation})
    after = [c.model_copy(update={"t_s": c.t_s + seconds + EVENTS_AFTER_S}) for c in plan.changes]
    return with_time_dilation(plan.model_copy(update={"experiment": exp, "changes": after}), k)


def read_warmup(run_dir: Path, k: float, wall_s: float = 0.0) -> Warmup:
    """A warm-up's figures (:class:`Warmup`) from its run directory: the sources' records, the
    machine's CPU samples over the load's window, ``plan.json``.

    Raises:
        RunFailure: it measured no query.
    """
    files = sorted((run_dir / "sources").glob("*.records.csv"))
    frames = [pd.read_csv(f) for f in files if f.stat().st_size]
    df = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    if df.empty or "t0_ns" not in df:
        raise RunFailure(f"time dilation auto: the warm-up at k = {k:g} measured no query ({run_dir})")
    plan_doc = json.loads((run_dir / "plan.json").read_text())
    t0 = pd.to_numeric(df["t0_ns"], errors="coerce").dropna() / 1e9
    start = int(json.loads((run_dir / "load_start.json").read_text())["start_ns"]) / 1e9
    lo, hi = start + (t0.min() - start) * k, start + (t0.max() - start) * k  # records: emulated time
    cpu, _ = machine_cpu_of_run(run_dir, lo, hi)
    ans = df[pd.to_numeric(df["http_status"], errors="coerce") == 200]
    rows = ans.to_dict("records")
    host_ms, planned_ms, judged = dilation_figures(plan_doc, rows)
    table = TransferTable(plan_doc)
    hops = [table.hops(str(r["source"]), str(r["cluster"])) or 0 for r in rows]
    ok = (df["outcome"] == "success").sum() if "outcome" in df else 0
    return Warmup(k=k, queries=len(df), answered=len(ans), window_s=cpu.window_s if cpu else 0.0,
                  role_cores=dict(cpu.by_role) if cpu else {},
                  host_ms=host_ms if judged >= MIN_ANSWERED else None,
                  planned_network_ms=planned_ms,
                  hops=float(np.mean(hops)) if hops else 0.0, success=float(ok) / len(df),
                  run_dir=str(run_dir), wall_s=round(wall_s, 1))


def unreached_clusters(run_dir: Path) -> list[str]:
    """The lines of the sources' logs (``logs/source-<name>.log``) saying a source could not connect to a
    cluster before the load (:data:`testbed.emu.source.CANNOT_REACH`), each prefixed with its source."""
    out = []
    for log in sorted((run_dir / "logs").glob("source-*.log")):
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith(CANNOT_REACH):
                out.append(f"{log.stem.removeprefix('source-')}: {line.removeprefix('[source] ')}")
    return out


class SpeedFloor(RunFailure):
    """A warm-up at ``k`` was refused by the clusters' speed check (:func:`testbed.plan.speeds.check_fits`):
    the host runs the models so much slower than their profiles that a cluster's quota at the
    profile's speed cannot be used below time dilation ``least_k``."""

    def __init__(self, message: str, k: float, least_k: float, cluster: str):
        super().__init__(message, 3)
        self.k, self.least_k, self.cluster = k, least_k, cluster


def speed_floor(run_dir: Path, cpus: int) -> tuple[float, str] | None:
    """The least k that the speed checks of a run's ready clusters allow on ``cpus`` CPUs
    (:meth:`testbed.plan.speeds.ClusterSpeed.least_dilation`, from ``clusters/<name>.ready.json``)
    and the cluster that sets it; None when no cluster reported a speed."""
    floors = []
    for f in sorted((run_dir / "clusters").glob("*.ready.json")):
        try:
            speed = json.loads(f.read_text()).get("speed")
        except (OSError, ValueError):
            continue
        if speed:
            floors.append((ClusterSpeed.model_validate(speed).least_dilation(cpus), f.name.removesuffix(".ready.json")))
    return max(floors) if floors else None


def run_warmup(plan: Plan, k: float, runs_dir: Path) -> Warmup:
    """One warm-up at k (:func:`warmup_plan`, :func:`warmup_seconds`) under ``runs_dir``, quiet.

    Raises:
        RunFailure: the warm-up failed (its message and run directory), a source could not connect to a
            cluster before its load (:func:`unreached_clusters`), or it measured nothing.
    """
    seconds = warmup_seconds(emulated_rate_qps(plan), k)
    wplan = warmup_plan(plan, k, seconds)
    log = io.StringIO()
    t = time.monotonic()
    with emulate(wplan, Console(file=log, width=200), runs_dir, seconds, warm_paths=False) as outcome:
        pass
    if outcome.status != EXIT_OK or outcome.run_dir is None:
        where = f" ({outcome.run_dir})" if outcome.run_dir else ""
        floor = speed_floor(outcome.run_dir, os.cpu_count() or 1) if outcome.run_dir else None
        if floor is not None and floor[0] > k:
            raise SpeedFloor(f"time dilation auto: the warm-up at k = {k:g}{where} was refused by the speed check of "
                             f"cluster {floor[1]}, which needs k >= {floor[0]:g}: {outcome.message}", k, *floor)
        raise RunFailure(f"time dilation auto: the warm-up at k = {k:g} failed{where}: {outcome.message}",
                         outcome.status or 3)
    unreached = unreached_clusters(outcome.run_dir)
    if unreached:
        raise RunFailure(f"time dilation auto: in the warm-up at k = {k:g} ({outcome.run_dir}) sources could not "
                         f"connect to clusters before the load, so it measured a broken network, not the load: "
                         + "; ".join(unreached), 3)
    got = read_warmup(outcome.run_dir, k, time.monotonic() - t)
    got.timings_s = {name: round(v, 1) for name, v in outcome.timings.items()}
    return got


def plan_key(plan: Plan) -> str:
    """What makes two plans' warm-ups the same (SHA-256, hex): the plan at k = 1 without its
    duration, capture and run folder, and of its events only what the probes need (each step's kind
    and link or cluster: :func:`warmup_plan`)."""
    exp = plan.experiment.model_copy(update={"duration_s": 1.0, "events": [], "capture": None, "runs_dir": "."})
    probed = sorted({(c.kind, c.link or (), c.cluster or "") for c in plan.changes})
    doc = plan.model_copy(update={"experiment": exp, "changes": []}).model_dump_json(
        exclude={"experiment": {"emulation": {"time_dilation"}}}) + json.dumps(probed)
    return hashlib.sha256(doc.encode()).hexdigest()


def _kept(folder: Path) -> dict:
    try:
        got = json.loads((folder / WARMUPS_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return got if isinstance(got, dict) else {}


def kept_warmups(folder: Path, key: str, machine: Machine, now: float | None = None) -> tuple[list[Warmup], str]:
    """The warm-ups kept for plan ``key`` that may be reused now (module docstring), and a line
    saying when they were measured; ([], "") when there are none."""
    entry = _kept(folder).get(key) or {}
    now = time.time() if now is None else now
    age = now - float(entry.get("t", 0.0))
    then = float((entry.get("machine") or {}).get("competing", math.inf))
    if not entry or age > REUSE_MAX_AGE_S or abs(then - machine.competing) > REUSE_LOAD_TOLERANCE:
        return [], ""
    try:
        warmups = [Warmup(**w) for w in entry.get("warmups") or []]
    except TypeError:
        return [], ""
    return warmups, (f"reusing the warm-ups of this plan from {age / 60:.0f} min ago (other jobs then "
                     f"{then:.2f} cores, now {machine.competing:.2f}; kept {REUSE_MAX_AGE_S / 60:g} min while "
                     f"within {REUSE_LOAD_TOLERANCE:g} cores)")


def keep_warmups(folder: Path, key: str, machine: Machine, warmups: list[Warmup]) -> None:
    """Keep ``warmups`` for plan ``key`` (:data:`WARMUPS_FILE`; entries past their age dropped).
    A write that fails is not an error (the next choice measures again)."""
    kept = {k: v for k, v in _kept(folder).items() if time.time() - float(v.get("t", 0)) <= REUSE_MAX_AGE_S}
    kept[key] = {"t": time.time(), "machine": asdict(machine), "warmups": [asdict(w) for w in warmups]}
    try:
        folder.mkdir(parents=True, exist_ok=True)
        write_json_atomic(folder / WARMUPS_FILE, kept, indent=1)
    except OSError:
        pass


# ----------------------------------------------------------------------------- the choice

def _warmup_line(w: Warmup, n: Need, rate: float) -> str:
    per = w.cpu_ms_per_query()
    testbed = sum(ms for r, ms in per.items() if r in TESTBED_ROLES)
    net = per.get("ovs-vswitchd", 0.0) + per.get("link emulators", 0.0)
    host = "-" if w.host_ms is None else f"{w.host_ms:.2f} ms"
    verdict = "carried" if n.k <= w.k else f"too small (needs {n.k:.1f}, set by {n.binding()})"
    return (f"warm-up at k = {w.k:g} ({w.queries} queries, {w.wall_s:.0f} s of wall clock): the testbed's CPU "
            f"{testbed:.1f} ms per query (Open vSwitch and link emulators {net:.1f} ms over paths of {w.hops:.1f} "
            f"switch links on average), servers "
            f"{per.get(SERVER_ROLE, 0.0):.1f} ms; host's share of the network time p50 {host} (target "
            f"{n.target_ms:.2f} ms); at {rate:.0f} q/s: {n.needed_cores:.2f} cores at k = 1, Open vSwitch "
            f"{n.ovs_cores:.2f}: {verdict}")


def _judge(out: AutoDilation, tried: list[tuple[float, float]], w: Warmup, rate: float, cores: float, say) -> None:
    """Add warm-up ``w`` and judge every warm-up so far again with the floor they now give."""
    ws = [x for x, _ in out.warmups] + [w]
    floor = network_floor([(x.k, x.host_ms) for x in ws])
    fixed = cpu_floor(ws)
    needs = [needed_k(x, rate, cores, out.machine, floor, fixed) for x in ws]
    out.warmups[:] = list(zip(ws, needs, strict=True))
    tried[:] = [(x.k, n.k) for x, n in out.warmups]
    out.why.append(_warmup_line(w, needs[-1], rate))
    over = f"fitted over the warm-ups at k = {', '.join(f'{x.k:g}' for x in ws)}"
    if floor > 0:
        out.why[-1] += (f"; of the host's share {floor:.2f} ms does not fall with k ({over}): dilation cannot "
                        "remove it, it does not drive k")
    if fixed[0] > 0:
        out.why[-1] += (f"; of the testbed's CPU {fixed[0]:.2f} cores (Open vSwitch {fixed[1]:.2f}) do not fall with "
                        f"the rate ({over}): taken from the budget, not counted per query")
    say("  " + out.why[-1])


def choose(plan: Plan, console: Console | None = None, runs_dir: Path | None = None,
           warm=run_warmup, machine: Machine | None = None) -> AutoDilation:
    """Choose k for ``plan`` from measured warm-ups (module docstring); prints the choice and why
    on ``console``. Warm-up runs go to ``runs_dir/auto-dilation`` (default: the experiment's
    ``runs_dir``). ``warm`` (plan, k, folder) -> :class:`Warmup` and ``machine``: what measures
    (replaced in unit tests of the rule).

    Raises:
        InputError: the figures ask for k above :data:`~testbed.spec.experiment.MAX_TIME_DILATION`.
        RunFailure: a warm-up failed (its message and run directory).
    """
    t_all = time.monotonic()
    say = (lambda line: console.print(line, markup=False, highlight=False)) if console is not None else (
        lambda line: None)
    machine = machine or measure_machine()
    rate = emulated_rate_qps(plan)
    cores = sum(c.cpu_cores for c in plan.experiment.clusters)
    folder = Path(runs_dir or repo_path(plan.experiment.runs_dir)) / "auto-dilation"
    key = plan_key(plan)
    reused, when = kept_warmups(folder, key, machine) if warm is run_warmup else ([], "")
    k = first_candidate(plan, machine)
    say(f"time dilation auto: {rate:.1f} emulated q/s at peak; other jobs use {machine.competing:.2f} of "
        f"{machine.cpus} cores (and niced ones {machine.niced:.2f}, which yield): {machine.available:.2f} available; "
        f"warm-ups of ~{WARMUP_QUERIES} queries ({WARMUP_MIN_WALL_S:g}-{WARMUP_MAX_WALL_S:g} s of load each, at least "
        f"{WARMUP_MIN_QUERIES} queries) from "
        f"k = {k:g}, in {folder}")
    out = AutoDilation(k, False, rate, machine)
    tried: list[tuple[float, float]] = []
    if reused:
        say("  " + when)
        out.why.append(when)
    for w in reused:
        _judge(out, tried, w, rate, cores, say)
    if reused:
        k = next_candidate(tried)
    measured, attempts, floor = [], 0, 1.0
    while k is not None and attempts < MAX_WARMUPS:
        attempts += 1
        try:
            w = warm(plan, k, folder)
        except SpeedFloor as e:  # the host is too slow for the clusters' quotas at this k: a failed try
            floor = max(floor, e.least_k)
            tried.append((k, e.least_k))
            line = (f"warm-up at k = {k:g}: cluster {e.cluster}'s quota at its profile's speed needs k >= "
                    f"{e.least_k:g} on this host (testbed.plan.speeds.check_fits)")
            out.why.append(line)
            say("  " + line)
        else:
            measured.append(w)
            _judge(out, tried, w, rate, cores, say)
        k = next_candidate(tried)
        if k is not None and k < floor:  # below the speed checks' floor: refused again
            k = None
    if measured and warm is run_warmup:
        keep_warmups(folder, key, machine, [w for w, _ in out.warmups])
    out.k, out.verified = decision([t for t in tried if t[0] >= floor] or tried)
    out.wall_s = time.monotonic() - t_all
    if out.k > MAX_TIME_DILATION:
        raise InputError(f"time dilation auto: this load needs k = {tried[-1][1]:.1f}, above the largest, "
                         f"{MAX_TIME_DILATION:g}: " + "; ".join(out.why) + "; lower the load, or run on a larger or "
                         "idler machine")
    how = ("a warm-up at it carried the load" if out.verified else
           f"UNVERIFIED: no warm-up carried its k within {MAX_WARMUPS} warm-ups; this is the last one's figure")
    out.why.append(f"k = {out.k:g}: {how} (choice took {out.wall_s:.0f} s)")
    say(f"time dilation auto: k = {out.k:g}: {how} ({out.wall_s:.0f} s)")
    return out


def resolve(plan: Plan, console: Console | None = None, runs_dir: Path | None = None) -> tuple[Plan, dict | None]:
    """``plan`` with its time dilation chosen when it is ``auto`` (:func:`choose`), and the choice
    for ``run.json`` (None when k was given)."""
    if not plan.dilation_auto:
        return plan, None
    got = choose(plan, console, runs_dir)
    return with_time_dilation(plan, got.k), got.to_dict()


__all__ = ["EXCESS_TARGET_MS", "MAX_BUSY_FRACTION", "NICED_OTHER", "AutoDilation", "Machine", "Need", "SpeedFloor",
           "Warmup", "choose", "decision", "emulated_rate_qps", "excess_target_ms", "first_candidate", "k_grid",
           "measure_machine", "needed_k", "next_candidate", "read_warmup", "resolve", "speed_floor",
           "warmup_seconds"]
