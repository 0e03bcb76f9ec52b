"""Experiment files: the YAML schema, validated with pydantic before anything is built.

Every quantity carries its unit in the value (``deadline: 80ms``) or in the key
(``deadline_ms: 80``); see :mod:`testbed.spec.units` for the exact rule. Unknown keys are errors.
Names that become Mininet node names (clusters, sources) are restricted to ``[a-z][a-z0-9]*``
so that nothing a stranger writes reaches a shell command unchecked.

Bounds the engines can execute (each a module constant below; docs/trustworthy-runs.md says why):

=============================  ==================================================================
what                           bound
=============================  ==================================================================
``seed``                       0 .. 2^32 - 1 (numpy's SeedSequence takes no negative entropy)
``duration``                   (0, 1e6 s]; and at most ``MAX_WINDOWS`` report intervals, the drain
                               after the load included (:func:`report_windows`)
``deadline``                   [1 ms, 600 s] (``MIN_DEADLINE_MS``: request handling alone takes about
                               1 ms; ``MAX_DEADLINE_S``: it sets how long a run drains)
link delays                    [0, 600 s] one-way (``testbed.spec.units.MAX_DELAY_MS``): topology links,
                               ``cloud.delay``, ``link_delay`` events
``report_interval``            >= 10 ms (every source polls every cluster once per interval)
``emulation.stats_interval``   >= 100 ms (port stats of every switch; the servers' stats files)
``aset.window``                >= 10 ms
rates (``rate_qps``, ...)      <= 10,000 q/s per stream and source (after spatial weights)
``clusters.workers``           1 .. 64 per cluster (each worker holds its own interpreter of every
                               model the cluster serves)
expected queries of a run      <= 1,000,000 (the simulator holds every query in memory,
                               ~2.5 KB each at peak; checked by the plan, which knows the weights)
``mmpp`` ``dwell``             >= 1 ms, at most 10^7 expected state changes per source
ports                          ``of_port``, ``rest_port`` and ``server_port`` all different
``name``                       at most 100 bytes (it names the run directory and the cgroups)
``emulation.time_dilation``    1 .. 100 (``MAX_TIME_DILATION``), or ``auto`` (chosen from a measured
                               warm-up when the emulation runs: :mod:`testbed.emu.autodilate`)
=============================  ==================================================================

Booleans are never numbers (``workers: true`` is an error) and duplicate keys are errors
(:mod:`testbed.spec.schema`).

A model listed twice in a cluster's ``models`` is an error naming it.

Empty lists: a list that would make the run measure or do nothing is an error naming it
(``clusters``, ``sources``, ``applications``, ``workload``, a cluster's ``models``, a workload
entry's ``sources``: ``[]`` selects no source; ``capture.interfaces``). ``events: []`` is
meaningful and the default: the run has no scenario events (the network and the clusters stay
as planned).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, BeforeValidator, Field, ValidationError, field_validator, model_validator

from testbed.core.errors import InputError
from testbed.core.plugins import normalize_ref
from testbed.core.util import InputFileError, did_you_mean, repeated
from testbed.spec.capture import CaptureSpec
from testbed.spec.events import EventSpec
from testbed.spec.messages import explain, merged, model_named
from testbed.spec.schema import NAME_RE, Num, YamlValueError, describe_yaml_error, load_yaml_file, number_only
from testbed.spec.schema import StrictModel as _Model
from testbed.spec.serving import ServerSpec
from testbed.spec.units import MAX_DELAY_MS, MAX_RATE_MBPS, parse_delay_ms, parse_duration_s, parse_rate_mbps

#: The policy a source starts with that is not a static one: ASET picks a static policy per window.
ASET_POLICY = "aset"
#: The checkpoint ``policy: aset`` uses when the experiment names none (no ``aset:`` section, or one
#: without ``checkpoint``): the general agent (docs/aset.md), which fits any experiment within its bounds.
DEFAULT_ASET_CHECKPOINT = "models/aset/general"

def _policy_ref(value: Any) -> Any:
    """A policy as written, in its one string form (:func:`testbed.core.plugins.normalize_ref`): the
    mapping ``{use: mypkg.sched:p2c, params: {d: 2}}`` becomes ``mypkg.sched:p2c(d=2)``."""
    return normalize_ref(value)


#: A policy: a static policy of the policy registry (testbed.model.policies; the experiment knows no
#: list of them: the plan resolves it, testbed.plan.policy_resolution.check_policy), :data:`ASET_POLICY`, or
#: a plug-in: an entry-point name of group ``testbed.policies``, ``package.module:callable``, either
#: with parameters (``mypkg.sched:p2c(d=2)``), or the mapping ``{use: ..., params: {...}}``, held as
#: that string form (docs/extending.md, "A policy of your own (plug-in)").
PolicyName = Annotated[str, BeforeValidator(_policy_ref)]


MAX_SEED = 2**32 - 1
MAX_DURATION_S = 1e6
MIN_REPORT_INTERVAL_S = 0.01
MAX_WINDOWS = 200_000
MIN_STATS_INTERVAL_S = 0.1
MIN_ASET_WINDOW_S = 0.01
MAX_RATE_QPS = 10_000.0
MAX_WORKERS = 64
#: The most CPU cores a cluster has. Why: a cluster is one host running one inference server
#: (:class:`ClusterSpec`), and the largest single servers have 512 hardware threads (two 128-core
#: AMD EPYC 9754 with SMT, 2023); a larger number is a unit slip (``cpu_cores: 1e6``), and the
#: service-time profiles it would need (one measured at that share) cannot exist.
MAX_CPU_CORES = 512.0
#: The largest memory limit of a cluster, MiB: 1 TiB, beyond the RAM of any machine the testbed runs
#: on (a limit past the machine's RAM limits nothing).
MAX_MEMORY_MIB = 1_048_576
MAX_EXPECTED_QUERIES = 1_000_000
MIN_DWELL_S = 0.001
MAX_STATE_CHANGES = 10**7
MAX_NAME_BYTES = 100
#: Largest ``emulation.time_dilation`` k. Why: the per-thread cap of a dilated cluster is the
#: kernel's smallest CFS quota, 1 ms, per k ms (:mod:`testbed.core.cgroups`), so k ms is that
#: cap's period: at k = 100 a call runs at 1/k speed to within 100 ms of wall clock (1 ms
#: emulated); the cluster's own period is k x 100 ms up to the kernel's 1 s, then 1 s (Linux
#: Documentation/scheduler/sched-bwc.rst). Past 100 a 40 s run would take over an hour.
MAX_TIME_DILATION = 100.0
#: ``emulation.time_dilation: auto`` (and ``testbed run --time-dilation auto``): k chosen when the
#: emulation runs, from a measured warm-up (:mod:`testbed.emu.autodilate`).
AUTO_DILATION = "auto"


def _dilation_value(v: Any) -> Any:
    """``emulation.time_dilation`` as written: ``auto`` (any case) or a number (:func:`number_only`'s
    rule, with a message that names both forms)."""
    if isinstance(v, str) and v.strip().lower() == AUTO_DILATION:
        return AUTO_DILATION
    if isinstance(v, str):
        raise ValueError(f"{v!r}: give a number (k, 1 .. {MAX_TIME_DILATION:g}) or 'auto'")
    return number_only(v)


#: k, or ``auto`` (:data:`AUTO_DILATION`).
TimeDilation = Annotated[float | Literal["auto"], BeforeValidator(_dilation_value)]
#: How long (ms) a source waits past a query's deadline before it calls the query unanswered (our
#: choice: long enough to see how late late answers are, short enough to end a run promptly). The
#: outcome rule (:func:`testbed.model.records.classify`) and the run's drain (:func:`drain_s`) use it.
GRACE_MS = 2000.0
#: Longest application deadline (s). Why: after the load a run waits for its last answers up to the
#: longest deadline plus the grace (:data:`testbed.model.records.GRACE_MS`): the emulation's sources
#: keep those queries open, and the simulator steps through that drain once per report interval
#: (``deadline: 1e12s`` passed the plan and the simulator never ended; 1e5 s took 16 s of wall time
#: for 51 queries, 1e7 s over a minute). 600 s is far beyond any interactive inference deadline
#: (the experiments' are 33-370 ms) and keeps a run's end within ten minutes of its load.
MAX_DEADLINE_S = 600.0
#: Shortest application deadline (ms). Why: an inference server's request handling alone takes
#: about a millisecond per query (models/profiles/handling.json: 1.15 ms for digits_small, the
#: smallest model of the zoo), so a shorter deadline fails every query; and a number under 1 in a
#: key that counts milliseconds (``deadline_ms: 0.1``) is most often seconds written by mistake.
MIN_DEADLINE_MS = 1.0


class ConfigError(InputError):
    """The experiment file is invalid; the message names the offending item."""


def drain_s(deadlines_ms: list[float]) -> float:
    """How long (s) a run goes on after its load for the last answers: the longest deadline plus
    the grace (:data:`testbed.model.records.GRACE_MS`); the simulator's end is the load's plus this."""
    return (max(deadlines_ms, default=0.0) + GRACE_MS) / 1e3


def report_windows(duration_s: float, report_interval_s: float, deadlines_ms: list[float]) -> float:
    """Report intervals the simulator steps through for a load of ``duration_s`` (s): the load and
    the drain after it (:func:`drain_s`)."""
    return (duration_s + drain_s(deadlines_ms)) / report_interval_s


def windows_problem(duration_s: float, report_interval_s: float, deadlines_ms: list[float]) -> str | None:
    """Why a load of ``duration_s`` s is over :data:`MAX_WINDOWS` report intervals, or None."""
    windows = report_windows(duration_s, report_interval_s, deadlines_ms)
    if windows <= MAX_WINDOWS:
        return None
    return (f"duration {duration_s:g} s + the drain after it ({drain_s(deadlines_ms):g} s: the longest deadline "
            f"+ {GRACE_MS / 1e3:g} s grace) / report_interval {report_interval_s:g} s = {windows:.0f} report "
            f"intervals, over the bound of {MAX_WINDOWS} (the simulator steps once per interval); lengthen "
            f"report_interval or shorten the duration")


def _rate_within_bound(v: float | None) -> float | None:
    """A rate (q/s) within :data:`MAX_RATE_QPS` (the message states the value and the bound; the
    error's location names the item)."""
    if v is not None and v > MAX_RATE_QPS:
        raise ValueError(f"{v:g} q/s is over the bound of {MAX_RATE_QPS:,.0f} q/s per stream and source "
                         f"(testbed.spec.experiment.MAX_RATE_QPS; docs/trustworthy-runs.md)")
    return v


class TopologySpec(_Model):
    """Where the topology comes from and how link parameters are derived.

    ``source``: ``topohub:GROUP/NAME`` (e.g. ``topohub:topozoo/Abilene``), a path to a Topology Zoo
    ``.graphml`` file, or a path to one of our ``.yaml`` topology files (relative paths are
    resolved against the experiment file's folder, then the repository's ``topologies/``).
    Delay from geography: great-circle km x ``ms_per_km`` x ``route_factor``, never below
    ``delay_floor_ms`` (``docs/system-model.md``, "The system").

    ``coordinates``: ``{node: [lat, lon]}`` (degrees) for nodes the source gives no coordinates
    (Topology Zoo GraphML often lacks them); a node is named by its id or label; given
    coordinates replace the source's. ``dataset_link_speeds``: read the link capacities a
    GraphML file gives (``LinkSpeedRaw``, ``LinkSpeed``, ``LinkLabel``; rules in
    :mod:`testbed.spec.topology`); false: every link gets ``bandwidth``.

    ``mtu``: the IP MTU (bytes) of every interface of the emulated network, hosts' included; TCP
    carries ``mtu - 52`` bytes per frame (:func:`testbed.model.network.mss_of`). 1500 (Ethernet,
    RFC 894) by default; up to 9000 ("jumbo" frames, as many ISP cores and data centres run). The
    user-space datapath's cost is per frame, so a larger MTU raises the query rate it carries
    (docs/scale-out.md, "Load ceiling").
    """

    source: str
    route_factor: Num = Field(1.0, ge=1.0)
    ms_per_km: Num = Field(0.005, gt=0)
    delay_floor_ms: Num = Field(0.1, ge=0)
    bandwidth_mbps: Num = Field(100.0, gt=0, le=MAX_RATE_MBPS)
    host_bandwidth_mbps: Num = Field(1000.0, gt=0, le=MAX_RATE_MBPS)
    mtu: int = Field(1500, ge=576, le=9000)
    keep_largest_component: bool = False
    coordinates: dict[str, list[Num]] = {}
    dataset_link_speeds: bool = True

    @field_validator("coordinates")
    @classmethod
    def _lat_lon(cls, v: dict[str, list[float]]) -> dict[str, list[float]]:
        for node, ll in v.items():
            if len(ll) != 2 or not (-90 <= ll[0] <= 90 and -180 <= ll[1] <= 180):
                raise ValueError(f"coordinates of {node!r}: give [lat, lon] in degrees, lat in [-90, 90] and "
                                 f"lon in [-180, 180], got {ll}")
        return v

    unit_keys = (("delay_floor", parse_delay_ms, "ms"),
                 ("bandwidth", parse_rate_mbps, "mbps"),
                 ("host_bandwidth", parse_rate_mbps, "mbps"))


class CloudSpec(_Model):
    """The cloud: an extra site hanging off ``attach_to`` over a long link (our choice: 20 ms)."""

    attach_to: str
    delay_ms: Num = Field(20.0, ge=0, le=MAX_DELAY_MS)
    bandwidth_mbps: Num = Field(1000.0, gt=0, le=MAX_RATE_MBPS)

    unit_keys = (("delay", parse_delay_ms, "ms"), ("bandwidth", parse_rate_mbps, "mbps"))


class ClusterSpec(_Model):
    """An edge cluster (or the cloud): a CPU-limited host running one inference server.

    ``site`` is a topology node (its label or id), or ``cloud``.
    """

    name: str = Field(pattern=NAME_RE)
    site: str
    tier: Literal["far_edge", "near_edge", "cloud"]
    #: >= 0.01: the emulation's smallest CFS quota is 1 ms per 100 ms period (cgroups.py), and the
    #: simulator must run the same share.
    cpu_cores: Num = Field(ge=0.01)
    #: <= MAX_WORKERS: every worker holds its own interpreter of each model the cluster serves,
    #: built before the server is ready; beyond the cluster's cores more workers only split its
    #: CPU quota (docs/trustworthy-runs.md has the measurement).
    workers: int = Field(1, ge=1)
    #: 64 MiB to MAX_MEMORY_MIB: the cgroup memory limit of the cluster's host.
    memory_mib: int = Field(1024, ge=64, le=MAX_MEMORY_MIB)
    queue_limit: int = Field(64, ge=1)
    models: list[str] = Field(min_length=1)
    server: ServerSpec = ServerSpec()

    @field_validator("models")
    @classmethod
    def _models_once(cls, v: list[str]) -> list[str]:
        twice = repeated(v)
        if twice:
            raise ValueError(f"{', '.join(map(repr, twice))} listed twice: a cluster serves each model once "
                             f"(one interpreter per worker), so list it once")
        return v

    @field_validator("cpu_cores")
    @classmethod
    def _cores_bound(cls, v: float) -> float:
        if v > MAX_CPU_CORES:
            raise ValueError(f"{v:g} cores is over the bound of {MAX_CPU_CORES:g} per cluster "
                             f"(testbed.spec.experiment.MAX_CPU_CORES): a cluster is one host running one inference "
                             f"server, and the largest servers have 512 hardware threads; give the host's CPU share "
                             f"in cores, e.g. cpu_cores: 2")
        return v

    @field_validator("workers")
    @classmethod
    def _workers_bound(cls, v: int) -> int:
        if v > MAX_WORKERS:
            raise ValueError(f"{v} workers is over the bound of {MAX_WORKERS} per cluster "
                             f"(testbed.spec.experiment.MAX_WORKERS: "
                             f"each worker holds its own interpreter of every model the cluster serves, e.g. 77 MiB "
                             f"per worker for default.yaml's far-edge clusters; docs/trustworthy-runs.md)")
        return v


class ApplicationSpec(_Model):
    """An application: its deadline D_a, minimum accuracy A_a and model family."""

    name: str = Field(pattern=NAME_RE)
    deadline_ms: Num = Field(gt=0)
    min_accuracy: Num = Field(ge=0, le=1)
    family: str = "digits"

    unit_keys = (("deadline", parse_delay_ms, "ms"),)

    @field_validator("deadline_ms")
    @classmethod
    def _deadline_bound(cls, v: float) -> float:
        if v < MIN_DEADLINE_MS:
            raise ValueError(f"{v:g} ms is under the bound of {MIN_DEADLINE_MS:g} ms "
                             f"(testbed.spec.experiment.MIN_DEADLINE_MS: a server's request handling alone takes "
                             f"about 1 ms); deadline_ms counts milliseconds: if you meant {v:g} s, write "
                             f"'deadline_ms: {v * 1e3:g}' or 'deadline: {v * 1e3:g}ms'")
        if v > MAX_DEADLINE_S * 1e3:
            raise ValueError(f"{v / 1e3:g} s is over the bound of {MAX_DEADLINE_S:g} s "
                             f"(testbed.spec.experiment.MAX_DEADLINE_S): after the load a run waits up to the longest "
                             f"deadline + {GRACE_MS / 1e3:g} s for the last answers, and the simulator steps "
                             f"through that wait")
        return v


class SourceSpec(_Model):
    """A query source (workload generator + dispatcher) attached at an access site; ``policy``
    overrides the experiment's policy for this source."""

    name: str = Field(pattern=NAME_RE)
    site: str
    policy: PolicyName | None = None


class StepSpec(_Model):
    """One step of a ``step`` arrival process: from ``at_s`` on, ``rate_qps`` queries/s."""

    at_s: Num = Field(ge=0)
    rate_qps: Num = Field(ge=0)

    _rate_bound = field_validator("rate_qps")(_rate_within_bound)

    unit_keys = (("at", parse_duration_s, "s"),)


class WorkloadSpec(_Model):
    """Arrivals of one application at some sources (see :mod:`testbed.model.arrivals` for the formulas).

    ``process`` and its keys (rates are per source, before spatial weights):

    - ``poisson``: ``rate_qps``.
    - ``mmpp``: Markov-modulated Poisson (bursts): ``rates_qps`` (one per state, >= 2 states) and
      ``dwell_s`` (mean exponential time in each state, s); the chain leaves a state for one of
      the others uniformly; it starts in state 0.
    - ``diurnal``: ``rate_qps`` x (1 + ``amplitude`` x sin(2 pi (t + ``phase_s``) / ``period_s``)).
    - ``step``: ``steps``: ``[{at: 0s, rate_qps: 2}, {at: 20s, rate_qps: 8}]`` (piecewise constant;
      0 before the first step).
    - ``trace``: ``trace``: a CSV file with a column ``t_s`` (seconds since the load starts), replayed
      at every selected source (relative paths: against the experiment file's folder); ``rate_qps``
      is ignored.

    Spatial weights (optional, one of): ``weights`` ``{source: w}`` or ``demand_matrix``: a CSV
    ``source_site,target_site,demand``, or ``topohub:sndlib/NAME`` (SNDlib's demand matrix, for an
    experiment on that SNDlib topology); a source's weight is the demand originating at its site.
    Weights are normalised to mean 1 over the selected sources, so the total rate stays
    ``rate_qps`` x number of sources.
    """

    application: str
    sources: list[str] | Literal["all"] = "all"
    process: Literal["poisson", "mmpp", "diurnal", "step", "trace"] = "poisson"
    rate_qps: Num | None = Field(None, ge=0)
    rates_qps: list[Num] | None = None
    dwell_s: list[Num] | None = None
    amplitude: Num = Field(0.5, ge=0, le=1)
    period_s: Num = Field(60.0, gt=0)
    phase_s: Num = 0.0
    steps: list[StepSpec] | None = None
    trace: str | None = None
    weights: dict[str, Num] | None = None
    demand_matrix: str | None = None

    _rate_bound = field_validator("rate_qps")(_rate_within_bound)

    @field_validator("sources")
    @classmethod
    def _some_source(cls, v: list[str] | str) -> list[str] | str:
        if v == []:
            raise ValueError("[] selects no source, so this entry would send no query; name the sources or "
                             "write 'all'")
        return v

    unit_keys = (("period", parse_duration_s, "s"), ("phase", parse_duration_s, "s"))

    @model_validator(mode="after")
    def _process_keys(self) -> WorkloadSpec:
        p = self.process
        if p in ("poisson", "diurnal") and self.rate_qps is None:
            raise ValueError(f"process {p!r} needs rate_qps")
        if p == "mmpp":
            if not self.rates_qps or not self.dwell_s or len(self.rates_qps) != len(self.dwell_s) \
                    or len(self.rates_qps) < 2:
                raise ValueError("process 'mmpp' needs rates_qps and dwell_s, lists of the same length >= 2")
            for i, r in enumerate(self.rates_qps):
                if r < 0:
                    raise ValueError(f"mmpp: rates_qps.{i}: {r:g} q/s is negative")
                try:
                    _rate_within_bound(r)
                except ValueError as exc:
                    raise ValueError(f"mmpp: rates_qps.{i}: {exc}") from None
            for i, d in enumerate(self.dwell_s):
                if d < MIN_DWELL_S:
                    raise ValueError(f"mmpp: dwell_s.{i}: {d:g} s is under the bound of {MIN_DWELL_S:g} s")
        if p == "step":
            if not self.steps:
                raise ValueError("process 'step' needs steps: [{at: 0s, rate_qps: N}, ...]")
            ats = [s.at_s for s in self.steps]
            if ats != sorted(ats):
                raise ValueError("step: steps must be in increasing 'at' order")
        if p == "trace" and not self.trace:
            raise ValueError("process 'trace' needs trace: PATH.csv (column t_s)")
        if self.weights is not None and self.demand_matrix is not None:
            raise ValueError("give either weights or demand_matrix, not both")
        if self.weights is not None and any(w < 0 for w in self.weights.values()):
            raise ValueError("weights must be >= 0")
        return self


#: ``selector.use``: ``package.module:attribute`` (dotted names, one colon).
_DOTTED = r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*"
SELECTOR_USE_RE = rf"^{_DOTTED}:{_DOTTED}$"


class SelectorSpec(_Model):
    """A selector of one's own in place of the ASET checkpoint (``aset: {selector: ...}``;
    :mod:`testbed.agent.selector`, docs/extending.md, "A selector of your own"). Exactly one of:

    ``use``: ``package.module:attribute``, a callable ``obs -> policy`` or a class with
    ``select(obs)`` (and optionally ``reset()``), built as ``Class(**params)`` once per source;
    ``params`` (a mapping) only with ``use``.
    ``sb3``: the path of a Stable-Baselines3 model (``.zip``, relative to the repository) trained on
    ``testbed/AsetSim-v0``; ``algorithm``: its Stable-Baselines3 class (default ``DQN``).

    ``policies``: the action space, policy names in action-index order (default: every built-in
    policy, :data:`testbed.model.policies.CATALOGUE`, the default action set of AsetSim-v0)."""

    use: str | None = Field(None, pattern=SELECTOR_USE_RE)
    params: dict[str, Any] = {}
    sb3: str | None = None
    algorithm: str = Field("DQN", pattern=r"^[A-Za-z][A-Za-z0-9]*$")
    policies: list[str] | None = Field(None, min_length=2)

    @model_validator(mode="after")
    def _one_form(self) -> SelectorSpec:
        if (self.use is None) == (self.sb3 is None):
            raise ValueError("give exactly one of use (package.module:callable_or_class) and sb3 (path/to/model.zip)")
        if self.params and self.use is None:
            raise ValueError("params: only with use (a Stable-Baselines3 model takes none)")
        if self.algorithm != "DQN" and self.sb3 is None:  # a JSON round trip sets the default: not counted
            raise ValueError("algorithm: only with sb3 (the Stable-Baselines3 class of the model)")
        if self.policies is not None and len(set(self.policies)) != len(self.policies):
            raise ValueError("policies: a policy is listed twice")
        return self

    @property
    def name(self) -> str:
        """How messages name this selector: ``use`` or ``sb3``."""
        return self.use or f"sb3:{self.sb3}"


class AsetSpec(_Model):
    """Settings of the ``aset`` policy (testbed.aset): ``checkpoint`` (path of the trained agent),
    ``window`` (decision window; default: the checkpoint's own, which a set window must equal: the
    agent's arrival-rate features are per window), ``options`` (free-form, read by testbed.aset),
    ``plan``: which scenario's plan a checkpoint with plans (``observation.plans``, docs/aset.md)
    applies, by scenario name (default: this experiment's ``name``), e.g. for a renamed copy of a
    scenario of the suite. ``selector`` (:class:`SelectorSpec`): a selector of one's own instead of
    the checkpoint (then no ``checkpoint``; ``window`` default: the report interval)."""

    checkpoint: str | None = None
    window_s: Num | None = Field(None, ge=MIN_ASET_WINDOW_S)
    options: dict[str, Any] = {}
    plan: str | None = None
    selector: SelectorSpec | None = None

    unit_keys = (("window", parse_duration_s, "s"),)

    @model_validator(mode="after")
    def _checkpoint_or_selector(self) -> AsetSpec:
        if self.selector is not None and self.checkpoint:
            raise ValueError(f"selector ({self.selector.name}) and checkpoint ({self.checkpoint}): the selector "
                             f"replaces the checkpoint; give one of them")
        return self


class SimulationSpec(_Model):
    """Simulator-only settings (``testbed simulate``).

    ``request_bytes`` / ``response_bytes``: bytes on the wire per query (request: the JSON image,
    default: the mean size of the zoo's request bodies; response: the JSON probabilities, default
    400). ``overhead_ms``: fixed per-query cost outside the network and the model (HTTP/JSON
    handling in the emulation; 0 by default). ``per_hop_ms``: forwarding cost per link of the path
    and round trip (software switches and link emulators; 0 by default). Both are calibration knobs
    for comparing with an emulation host (see docs/policies-and-simulator.md), not part of the
    system model. ``warmup``: queries created before this time are simulated but not recorded.
    """

    request_bytes: int | None = Field(None, ge=1)
    response_bytes: int = Field(400, ge=1)
    overhead_ms: Num = Field(0.0, ge=0)
    per_hop_ms: Num = Field(0.0, ge=0)
    warmup_s: Num = Field(0.0, ge=0)

    unit_keys = (("overhead", parse_delay_ms, "ms"),
                 ("per_hop", parse_delay_ms, "ms"),
                 ("warmup", parse_duration_s, "s"))


class EmulationSpec(_Model):
    """How the network is emulated.

    ``link_emulator``: ``netem`` (kernel qdisc), ``userspace`` (our AF_PACKET forwarder) or
    ``auto`` (netem if the kernel has it). ``datapath``: OVS ``kernel``, ``user`` or ``auto``.
    RTT self-check: each (source, cluster) path passes when ``|median measured - expected| <=
    rtt_tolerance_ms + rtt_tolerance_pct/100 x expected + rtt_tolerance_per_switch_ms x switches``,
    switches being those on the controller's path. The per-switch term covers forwarding cost
    (both directions): measured here, OVS's userspace datapath adds ~0.2 ms per switch traversal
    and the user-space link emulator ~0.2 ms per link traversal, ~1 ms of RTT per hop in all.
    ``compensate_datapath`` (user-space link emulator only; nothing to lower with netem): before the
    self-check, every path is pinged, the datapath's own RTT per switch is taken as the median over
    paths of (min RTT - expected) / switches, and half of it is taken off every link's emulated
    one-way delay (:func:`testbed.emu.bringup.calibrate_datapath`; ``datapath_calibration.json``).
    ``time_dilation`` k (1 .. :data:`MAX_TIME_DILATION`, default 1), or ``auto``: the emulated
    system runs k times slower than the wall clock (its delays x k, bandwidths and rates / k, CPU
    at 1/k speed); measured times are divided by k, so records and summaries are in emulated time
    (:mod:`testbed.plan.dilation`, docs/dilation.md). ``auto``: k is chosen when the emulation
    runs, from a measured warm-up (:mod:`testbed.emu.autodilate`); the simulator ignores k.
    ``testbed run --time-dilation`` overrides it.
    ``speed``: ``profile`` (default) runs every cluster at its models' profiled speed whatever the
    host's speed of the day: each server times its models' bare calls at start-up, and the
    cluster's CPU quota, and its threads' caps or its calls' padding, are scaled by the measured
    factor (:mod:`testbed.plan.speeds`); ``host`` leaves the clusters at the host's speed and
    only records the factors (``testbed simulate --speeds RUN_DIR`` then simulates at them).
    """

    link_emulator: Literal["auto", "netem", "userspace"] = "auto"
    datapath: Literal["auto", "kernel", "user"] = "auto"
    rtt_check: bool = True
    #: Bounds (our choice): a tolerance past them accepts any RTT the network could give (the
    #: self-check would pass a path twice or a second off), so it is a check turned off in
    #: disguise; ``rtt_check: false`` says that plainly.
    rtt_tolerance_ms: Num = Field(1.0, ge=0, le=1000)
    rtt_tolerance_pct: Num = Field(5.0, ge=0, le=100)
    rtt_tolerance_per_switch_ms: Num = Field(1.0, ge=0, le=100)
    ping_count: int = Field(5, ge=1, le=100)
    compensate_datapath: bool = True
    of_port: int = Field(6653, ge=1, le=65535)
    rest_port: int = Field(8080, ge=1, le=65535)
    server_port: int = Field(8501, ge=1, le=65535)
    stats_interval_s: Num = Field(1.0, ge=MIN_STATS_INTERVAL_S)
    time_dilation: TimeDilation = 1.0
    speed: Literal["profile", "host"] = "profile"

    unit_keys = (("rtt_tolerance", parse_delay_ms, "ms"), ("stats_interval", parse_duration_s, "s"))

    @field_validator("time_dilation")
    @classmethod
    def _dilation_bounds(cls, v: float | str) -> float | str:
        if v != AUTO_DILATION and not 1.0 <= v <= MAX_TIME_DILATION:
            raise ValueError(f"time dilation {v:g} is outside 1 .. {MAX_TIME_DILATION:g} (or give 'auto')")
        return v

    @model_validator(mode="after")
    def _distinct_ports(self) -> EmulationSpec:
        ports = {"of_port": self.of_port, "rest_port": self.rest_port, "server_port": self.server_port}
        seen: dict[int, str] = {}
        for key, port in ports.items():
            if port in seen:
                raise ValueError(f"{seen[port]} and {key} are both {port}: the OpenFlow, REST and inference "
                                 f"server ports must all differ (one process would answer the other's protocol)")
            seen[port] = key
        return self


class Experiment(_Model):
    """One experiment file (see ``experiments/default.yaml``). ``events: []`` (the default): no
    scenario events; every other list must name at least one item (module docstring)."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=MAX_NAME_BYTES)
    seed: int = Field(1, ge=0, le=MAX_SEED)
    duration_s: Num = Field(gt=0, le=MAX_DURATION_S)
    policy: PolicyName = "closest"
    report_interval_s: Num = Field(0.5, ge=MIN_REPORT_INTERVAL_S)
    aset: AsetSpec | None = None
    events: list[EventSpec] = []
    simulation: SimulationSpec = SimulationSpec()
    topology: TopologySpec
    cloud: CloudSpec | None = None
    clusters: list[ClusterSpec] = Field(min_length=1)
    sources: list[SourceSpec] = Field(min_length=1)
    applications: list[ApplicationSpec] = Field(min_length=1)
    workload: list[WorkloadSpec] = Field(min_length=1)
    emulation: EmulationSpec = EmulationSpec()
    capture: CaptureSpec | None = None
    zoo_dir: str = "models/zoo"
    profiles_dir: str = "models/profiles"
    runs_dir: str = "runs"

    unit_keys = (("duration", parse_duration_s, "s"), ("report_interval", parse_duration_s, "s"))

    @model_validator(mode="before")
    @classmethod
    def _default_checkpoint(cls, data: Any) -> Any:
        """``policy: aset`` without a checkpoint gets :data:`DEFAULT_ASET_CHECKPOINT`."""
        if not isinstance(data, dict):
            return data
        srcs = data.get("sources") if isinstance(data.get("sources"), list) else []
        uses = data.get("policy") == ASET_POLICY or any(isinstance(s, dict) and s.get("policy") == ASET_POLICY
                                                       for s in srcs)
        aset = data.get("aset")
        if uses and aset is None:
            return {**data, "aset": {"checkpoint": DEFAULT_ASET_CHECKPOINT}}
        if uses and isinstance(aset, dict) and not aset.get("checkpoint") and aset.get("selector") is None:
            return {**data, "aset": {**aset, "checkpoint": DEFAULT_ASET_CHECKPOINT}}
        return data

    @model_validator(mode="after")
    def _windows(self) -> Experiment:
        problem = windows_problem(self.duration_s, self.report_interval_s, [a.deadline_ms for a in self.applications])
        if problem:
            raise ValueError(problem)
        return self

    @model_validator(mode="after")
    def _references(self) -> Experiment:
        names: dict[str, str] = {}
        for kind, items in (("cluster", self.clusters), ("source", self.sources),
                            ("application", self.applications)):
            for it in items:
                key = it.name if kind != "application" else f"app:{it.name}"
                if key in names:
                    raise ValueError(f"{kind} name {it.name!r} is used twice")
                names[key] = kind
        apps = {a.name for a in self.applications}
        srcs = {s.name for s in self.sources}
        for i, w in enumerate(self.workload):
            if w.application not in apps:
                raise ValueError(f"workload[{i}]: unknown application {w.application!r}; known: {sorted(apps)}"
                                 f"{did_you_mean(w.application, apps)}")
            if w.sources != "all":
                for s in w.sources:
                    if s not in srcs:
                        raise ValueError(f"workload[{i}]: unknown source {s!r}; known: {sorted(srcs)}"
                                         f"{did_you_mean(s, srcs)}")
            if w.weights is not None:
                for s in w.weights:
                    if s not in srcs:
                        raise ValueError(f"workload[{i}].weights: unknown source {s!r}; known: {sorted(srcs)}"
                                         f"{did_you_mean(s, srcs)}")
        uses_aset = self.policy == ASET_POLICY or any(s.policy == ASET_POLICY for s in self.sources)
        if uses_aset and (self.aset is None or not (self.aset.checkpoint or self.aset.selector)):
            raise ValueError("policy 'aset' needs an 'aset:' section with a checkpoint (aset: {checkpoint: PATH}) "
                             "or a selector (aset: {selector: {use: package.module:callable}})")
        clusters = {c.name for c in self.clusters}
        for i, ev in enumerate(self.events):
            if ev.cluster is not None and ev.cluster not in clusters:
                raise ValueError(f"events[{i}]: unknown cluster {ev.cluster!r}; known: {sorted(clusters)}"
                                 f"{did_you_mean(ev.cluster, clusters)}")
        if self.cloud is None:
            for s in self.sources:
                if s.site == "cloud":
                    raise ValueError(f"source {s.name!r} sits in the cloud but the experiment has no 'cloud:' section")
        for c in self.clusters:
            if (c.site == "cloud") != (c.tier == "cloud"):
                raise ValueError(f"cluster {c.name!r}: tier 'cloud' goes with site 'cloud' and only there")
            if c.site == "cloud" and self.cloud is None:
                raise ValueError(f"cluster {c.name!r} sits in the cloud but the experiment has no 'cloud:' section")
        return self


#: The unit of a quantity's number form, by its key's suffix (:func:`testbed.spec.schema.unit_pair`).
_SUFFIX_UNITS = {"s": "s", "ms": "ms", "mbps": "Mbit/s"}


def _as_written(loc: tuple, data: Any) -> str:
    """``loc`` with each key as the document wrote it: a quantity read from ``duration: 0s`` is
    validated as ``duration_s`` (:func:`testbed.spec.schema.unit_pair`), and named ``duration in s``
    (the bounds in the message are in that unit)."""
    parts, node = [], data
    for p in loc:
        shown = str(p)
        if isinstance(node, dict) and p not in node and isinstance(p, str) and "_" in p:
            written, suffix = p.rsplit("_", 1)
            if written in node and suffix in _SUFFIX_UNITS:
                p, shown = written, f"{written} in {_SUFFIX_UNITS[suffix]}"
        parts.append(shown)
        node = node.get(p) if isinstance(node, dict) else (
            node[p] if isinstance(node, list) and isinstance(p, int) and 0 <= p < len(node) else None)
    return ".".join(parts)


def format_validation_error(exc: ValidationError, path: str, what: str = "experiment",
                            model: type[BaseModel] | None = None, data: Any = None) -> str:
    """One line per pydantic error: its location (e.g. ``links.2.delay``, each key as ``data``, the
    document, wrote it when given) and a message that points at the fix
    (:func:`testbed.spec.messages.explain`: the nearest key, the unit, the nearest choice); an
    error of the whole file (a rule across its items, which names them itself) has no location.
    ``model``: the model of the whole document (default: the strict model named by the error's
    title)."""
    root = model or model_named(exc.title)
    lines = [f"{path}: invalid {what}"]
    for err in merged(exc.errors()):
        loc = _as_written(tuple(err["loc"]), data)
        msg = explain(err, root)
        lines.append(f"  {loc}: {msg}" if loc else f"  {msg}")
    return "\n".join(lines)


M = TypeVar("M", bound=BaseModel)


def load_yaml_model(path: str | Path, model: type[M], what: str, error: type[InputError] | None = None) -> M:
    """The one reader of a YAML input file into its schema ``model`` (experiments, ASET configs,
    topologies): :func:`testbed.spec.schema.load_yaml_file`, then ``model.model_validate``.

    ``what`` names the kind of file in the messages (``experiment``, ``ASET config``, ``topology``).

    Raises:
        InputError: ``error`` (default :class:`ConfigError`): the file is missing or unreadable,
            is not YAML (line, column and the likely fix), gives a key twice, is not a mapping at
            the top level, or fails validation (:func:`format_validation_error`: each offending
            item by its location, e.g. ``applications.0.deadline``).
    """
    error = error or ConfigError
    path = Path(path)
    try:
        data = load_yaml_file(path)
    except InputFileError as exc:
        raise error(f"{what} file {exc}") from None
    except YamlValueError as exc:  # a key twice, an integer too long to read
        raise error(f"{path}: {exc}") from None
    except yaml.YAMLError as exc:
        raise error(f"{path}: {describe_yaml_error(exc)}") from None
    if not isinstance(data, dict):
        raise error(f"{path}: expected a mapping at the top level")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise error(format_validation_error(exc, str(path), what=what, model=model, data=data)) from None


def load_experiment(path: str | Path) -> Experiment:
    """Read and validate an experiment YAML file (:func:`load_yaml_model`).

    Raises:
        ConfigError: the file is missing, is not YAML, or fails validation; the message lists each
            offending item by its location (e.g. ``applications.0.deadline``).
    """
    return load_yaml_model(path, Experiment, "experiment")
