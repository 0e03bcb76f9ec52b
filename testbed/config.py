"""Experiment files: the YAML schema, validated with pydantic before anything is built.

Every quantity carries its unit in the value (``deadline: 80ms``) or in the key
(``deadline_ms: 80``); see :mod:`testbed.units` for the exact rule. Unknown keys are errors.
Names that become Mininet node names (clusters, sources) are restricted to ``[a-z][a-z0-9]*``
so that nothing a stranger writes reaches a shell command unchecked.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, model_validator

from testbed.capture.spec import CaptureSpec
from testbed.inference.spec import ServerSpec
from testbed.schema import NAME_RE, Num
from testbed.schema import StrictModel as _Model
from testbed.schema import unit_pair as _unit_pair
from testbed.units import parse_delay_ms, parse_duration_s, parse_rate_mbps


class ConfigError(ValueError):
    """The experiment file is invalid; the message names the offending item."""


class TopologySpec(_Model):
    """Where the topology comes from and how link parameters are derived.

    ``source``: ``topohub:GROUP/NAME`` (e.g. ``topohub:topozoo/Abilene``), a path to a Topology Zoo
    ``.graphml`` file, or a path to one of our ``.yaml`` topology files (relative paths are
    resolved against the experiment file's folder, then the repository's ``topologies/``).
    Delay from geography: great-circle km x ``ms_per_km`` x ``route_factor``, never below
    ``delay_floor_ms`` (system-model.md).
    """

    source: str
    route_factor: Num = Field(1.0, ge=1.0)
    ms_per_km: Num = Field(0.005, gt=0)
    delay_floor_ms: Num = Field(0.1, ge=0)
    bandwidth_mbps: Num = Field(100.0, gt=0)
    host_bandwidth_mbps: Num = Field(1000.0, gt=0)
    keep_largest_component: bool = False

    @model_validator(mode="before")
    @classmethod
    def _units(cls, data: Any) -> Any:
        data = _unit_pair(data, "delay_floor", parse_delay_ms, "ms")
        data = _unit_pair(data, "bandwidth", parse_rate_mbps, "mbps")
        return _unit_pair(data, "host_bandwidth", parse_rate_mbps, "mbps")


class CloudSpec(_Model):
    """The cloud: an extra site hanging off ``attach_to`` over a long link (our choice: 20 ms)."""

    attach_to: str
    delay_ms: Num = Field(20.0, ge=0)
    bandwidth_mbps: Num = Field(1000.0, gt=0)

    @model_validator(mode="before")
    @classmethod
    def _units(cls, data: Any) -> Any:
        data = _unit_pair(data, "delay", parse_delay_ms, "ms")
        return _unit_pair(data, "bandwidth", parse_rate_mbps, "mbps")


class ClusterSpec(_Model):
    """An edge cluster (or the cloud): a CPU-limited host running one inference server.

    ``site`` is a topology node (its label or id), or ``cloud``.
    """

    name: str = Field(pattern=NAME_RE)
    site: str
    tier: Literal["far_edge", "near_edge", "cloud"]
    cpu_cores: Num = Field(gt=0)
    workers: int = Field(1, ge=1)
    memory_mib: int = Field(1024, ge=64)
    queue_limit: int = Field(64, ge=1)
    models: list[str] = Field(min_length=1)
    server: ServerSpec = ServerSpec()


class ApplicationSpec(_Model):
    """An application: its deadline D_a, minimum accuracy A_a and model family."""

    name: str = Field(pattern=NAME_RE)
    deadline_ms: Num = Field(gt=0)
    min_accuracy: Num = Field(ge=0, le=1)
    family: str = "digits"

    @model_validator(mode="before")
    @classmethod
    def _units(cls, data: Any) -> Any:
        return _unit_pair(data, "deadline", parse_delay_ms, "ms")


class SourceSpec(_Model):
    """A query source (workload generator + dispatcher) attached at an access site."""

    name: str = Field(pattern=NAME_RE)
    site: str


class WorkloadSpec(_Model):
    """Poisson arrivals of one application at some sources, ``rate_qps`` queries/s at each."""

    application: str
    sources: list[str] | Literal["all"] = "all"
    process: Literal["poisson"] = "poisson"
    rate_qps: Num = Field(gt=0)


class EmulationSpec(_Model):
    """How the network is emulated.

    ``link_emulator``: ``netem`` (kernel qdisc), ``userspace`` (our AF_PACKET forwarder) or
    ``auto`` (netem if the kernel has it). ``datapath``: OVS ``kernel``, ``user`` or ``auto``.
    RTT self-check: each (source, cluster) path passes when ``|median measured - expected| <=
    rtt_tolerance_ms + rtt_tolerance_pct/100 x expected + rtt_tolerance_per_switch_ms x switches``,
    switches being those on the controller's path. The per-switch term covers forwarding cost
    (both directions): measured here, OVS's userspace datapath adds ~0.2 ms per switch traversal
    and the user-space link emulator ~0.2 ms per link traversal, ~1 ms of RTT per hop in all.
    """

    link_emulator: Literal["auto", "netem", "userspace"] = "auto"
    datapath: Literal["auto", "kernel", "user"] = "auto"
    rtt_check: bool = True
    rtt_tolerance_ms: Num = Field(1.0, ge=0)
    rtt_tolerance_pct: Num = Field(5.0, ge=0)
    rtt_tolerance_per_switch_ms: Num = Field(1.0, ge=0)
    ping_count: int = Field(5, ge=1, le=100)
    of_port: int = Field(6653, ge=1, le=65535)
    rest_port: int = Field(8080, ge=1, le=65535)
    server_port: int = Field(8501, ge=1, le=65535)
    stats_interval_s: Num = Field(1.0, gt=0)

    @model_validator(mode="before")
    @classmethod
    def _units(cls, data: Any) -> Any:
        data = _unit_pair(data, "rtt_tolerance", parse_delay_ms, "ms")
        return _unit_pair(data, "stats_interval", parse_duration_s, "s")


class Experiment(_Model):
    """One experiment file (see ``experiments/default.yaml``)."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    seed: int = 1
    duration_s: Num = Field(gt=0)
    policy: Literal["closest"] = "closest"
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

    @model_validator(mode="before")
    @classmethod
    def _units(cls, data: Any) -> Any:
        return _unit_pair(data, "duration", parse_duration_s, "s")

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
                raise ValueError(f"workload[{i}]: unknown application {w.application!r}; known: {sorted(apps)}")
            if w.sources != "all":
                for s in w.sources:
                    if s not in srcs:
                        raise ValueError(f"workload[{i}]: unknown source {s!r}; known: {sorted(srcs)}")
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


def format_validation_error(exc: ValidationError, path: str, what: str = "experiment") -> str:
    """One line per pydantic error: its location (e.g. ``links.2.delay``) and message."""
    lines = [f"{path}: invalid {what}"]
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        lines.append(f"  {loc}: {msg}")
    return "\n".join(lines)


def load_experiment(path: str | Path) -> Experiment:
    """Read and validate an experiment YAML file.

    Raises:
        ConfigError: the file is missing, is not YAML, or fails validation; the message lists each
            offending item by its location (e.g. ``applications.0.deadline``).
    """
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read experiment file {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a UTF-8 text file") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    try:
        return Experiment.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, str(path))) from None
