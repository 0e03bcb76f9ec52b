"""Scenario events in the model: the kinds' behaviour, and the timeline of changes.

An event (:class:`~testbed.spec.events.EventSpec`, the YAML form) changes one link or one cluster
from time ``at``. Each kind is ONE entry of the registry :data:`EVENT_KINDS`: an :class:`EventKind`
subclass registered with :func:`register` (the built-in ones are in :mod:`testbed.model.event_kinds`,
which lists them with their values and effects). An entry holds

* its YAML form (:class:`~testbed.spec.events.EventForm`): name, target, value field and unit, the
  values it accepts;
* how it is applied, :meth:`EventKind.apply`, to a :class:`LinkControl` or a :class:`ClusterControl`:
  both engines implement these, the simulator's model state
  (:class:`testbed.model.network.NetworkState`, :mod:`testbed.sim`) and the emulation
  (:mod:`testbed.emu.dynamics`, :mod:`testbed.emu.event_runner`), so the kind never names an engine;
* how the emulation measures it: the measurement window, probe rate and tolerance, and
  :meth:`EventKind.measure`, which reads the change back through a :class:`Probe`.

:func:`expand` turns events into one sorted timeline of :class:`Change` (each a step), which both
engines apply with the same meaning. Routing (both engines): least one-way delay over the links
that are up; the controller learns a delay change from the event itself (the run tells it), a
failure from OpenFlow port status.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal, NamedTuple, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, field_validator

from testbed.spec.events import EVENT_KINDS, EventForm, EventSpec, RampSpec, event_form, parse_background_mbps

#: The most steps one ramp or trace may expand to (each step is applied and measured for real).
MAX_STEPS_PER_EVENT = 1000

Direction = Literal["both", "ab", "ba"]


class LinkControl(Protocol):
    """One link as an event changes it, oriented as the change names it (``ab``: from the change's
    ``link[0]`` to ``link[1]``). Delays ms, rates Mbit/s, loss %. Implemented by the model's link
    state (simulator) and by the emulation's link (emulator, ``tc``, the controller told)."""

    @property
    def delay_ms(self) -> float:
        """The one-way delay in force (ms)."""
        ...

    @property
    def capacity_mbps(self) -> float:
        """The capacity in force (Mbit/s)."""
        ...

    def set_delay(self, delay_ms: float) -> None:
        """The propagation delay, both directions (ms)."""

    def set_rate(self, rate_mbps: float) -> None:
        """The capacity (the shaper's rate), both directions (Mbit/s, > 0)."""

    def set_loss(self, loss_pct: float) -> None:
        """Independent frame loss per direction (%)."""

    def set_up(self, up: bool) -> None:
        """Carry traffic (True) or nothing (False; routes avoid the link)."""

    def set_background(self, rate_mbps: float, direction: Direction, traffic: Literal["udp", "tcp"]) -> None:
        """Background traffic of ``rate_mbps`` through the link in ``direction`` (0 ends it)."""


class ClusterControl(Protocol):
    """One cluster's server as an event changes it. Implemented by the simulator's cluster and the
    emulation's servers."""

    def set_up(self, up: bool, mode: Literal["kill", "stop"]) -> None:
        """Down (``kill``: the server dies, what it held is lost; ``stop``: it freezes) or back up
        (``kill``: it restarts; ``stop``: it resumes)."""


@dataclass
class Measured:
    """What a change's measurement found: ``value`` in ``unit`` (None: nothing measurable),
    ``effect_ms`` (from firing to the first measurement showing it), the ``tolerance`` it is
    judged with, ``ok``, a ``note``; ``pending``: what it waits for has not shown yet, so the
    emulation reads it again while its kind's ``watch_s`` lasts (the last reading is recorded)."""

    value: float | None
    unit: str
    effect_ms: float | None
    tolerance: float | None
    ok: bool | None
    note: str
    pending: bool = False


class Probe(Protocol):
    """The emulation's readback of one applied link change over its measurement window (each method
    reads what the probes across the link, or along the paths it carried, saw)."""

    def delay(self, expect_ms: float, tolerance_ms: float) -> Measured:
        """One-way delay of the link's probes, judged against ``expect_ms``."""
        ...

    def train(self, rate_mbps: float, tolerance_mbps: float) -> None:
        """Send a packet train at the new rate now, right after the change (read by :meth:`rate`)."""

    def rate(self, expect_mbps: float, tolerance_mbps: float) -> Measured:
        """The packet train's rate."""
        ...

    def loss(self, expect_pct: float, tolerance: Callable[[int], float]) -> Measured:
        """Probe loss a>b; ``tolerance(n)`` for ``n`` probes sent."""
        ...

    def reroute(self) -> Measured:
        """Time until every source -> cluster path the link carried answers again (ms)."""
        ...

    def rediscovery(self) -> Measured:
        """Time until the routes use the link again (ms)."""
        ...

    def carried(self, expect_mbps: float, tolerance_mbps: float) -> Measured:
        """Background rate carried at the far end of the link."""
        ...


class Tolerance(NamedTuple):
    """The run's RTT self-check tolerance (``experiment.emulation``), which delay readbacks reuse:
    an absolute term (ms), a relative one (% of the value) and one per switch on the path (ms)."""

    abs_ms: float
    pct: float
    per_switch_ms: float


class EventKind(EventForm):
    """One event kind: its YAML form (:class:`~testbed.spec.events.EventForm`: ``name``, ``target``,
    ``value_field``, ``unit``, :meth:`rule`), how it is applied and how it is measured. Subclass
    :class:`LinkKind` or :class:`ClusterKind` and decorate with :func:`register`.

    Class attributes beside the form's:

    * ``sets_up``: True for a kind that brings its link or cluster back up, False for one that
      takes it down, None otherwise (the timeline checks that downs and ups alternate);
    * ``measured_unit``: the unit of the emulation's measured value (default: ``unit``, else ms);
    * ``window_s``: how long the emulation measures after applying it (s, cut short by the next
      change); ``boost_hz``: the link probes' rate meanwhile (per second);
    * ``watch_s``: how much longer (wall s) the emulation keeps reading a change back while its
      reading is ``pending`` (:class:`Measured`), e.g. the controller has not rerouted yet: the
      controller and its LLDP run on the wall clock, undilated; cut short by the next change and
      by the run's end (default 0: read once, at the end of the window);
    * ``paths``: which source -> cluster paths its measurement probes: ``"now"`` (paths that cross
      the link before the change), ``"after"`` (paths that will cross it after), both, or none;
    * ``examples``: values ``benchmarks/dynamics_bench.py kinds`` fires in turn (then the link's
      planned value, to leave it as planned), in the kind's unit.
    """

    sets_up: ClassVar[bool | None] = None
    measured_unit: ClassVar[str] = ""
    window_s: ClassVar[float] = 0.0
    watch_s: ClassVar[float] = 0.0
    boost_hz: ClassVar[float] = 20.0
    paths: ClassVar[frozenset[str]] = frozenset()
    examples: ClassVar[tuple[float, ...]] = ()

    def apply(self, ch: Change, target: LinkControl | ClusterControl) -> None:
        """Apply one step ``ch`` of this kind to ``target`` (a :class:`LinkControl` for a link kind,
        oriented as ``ch.link``; a :class:`ClusterControl` for a cluster kind)."""
        raise NotImplementedError(f"event kind {self.name!r} has no apply")

    def window(self, ch: Change, link: LinkControl) -> float:
        """The emulation's measurement window for ``ch`` (s), given the link before it (default :attr:`window_s`)."""
        return self.window_s

    def tolerance(self, ch: Change, tol: Tolerance, n: int = 0) -> float | None:
        """The tolerance a measurement of ``ch`` is judged with, in :attr:`measured_unit` (None: none;
        ``n``: probes counted, for the kinds whose tolerance depends on it)."""
        return None

    def after_apply(self, ch: Change, probe: Probe, tol: Tolerance) -> None:
        """Called by the emulation right after applying ``ch``, before its window (default: nothing)."""

    def measure(self, ch: Change, probe: Probe, link: LinkControl, tol: Tolerance) -> Measured:
        """Read ``ch`` back at the end of its window through ``probe``; ``link`` is the model's link
        after the change (what the emulation should now show)."""
        raise NotImplementedError(f"event kind {self.name!r} is not measured")

    @property
    def shown_unit(self) -> str:
        """The unit of the measured value (``measured_unit``, else ``unit``, else ms)."""
        return self.measured_unit or self.unit or "ms"


class LinkKind(EventKind):
    """A kind that changes one link (``link: [A, B]``)."""

    target: ClassVar[Literal["link", "cluster"]] = "link"


class ClusterKind(EventKind):
    """A kind that changes one cluster (``cluster: NAME``)."""

    target: ClassVar[Literal["link", "cluster"]] = "cluster"


K = TypeVar("K", bound=type[EventKind])


def register(cls: K) -> K:
    """Class decorator: register one instance of ``cls`` in :data:`EVENT_KINDS` under ``cls.name``.

    Raises:
        ValueError: the name is already registered.
    """
    EVENT_KINDS.add(cls.name, cls())
    return cls


def kind_of(name: str, where: str = "") -> EventKind:
    """The registered kind named ``name``.

    Raises:
        testbed.core.registry.UnknownNameError: (a ValueError) naming ``where``, the kind and the known ones.
    """
    kind = event_form(name, where)
    if not isinstance(kind, EventKind):
        raise TypeError(f"event kind {name!r} is registered as a {type(kind).__name__}, not an EventKind")
    return kind


#: The kinds that change a link, and those that change a cluster (kept current with the registry).
LINK_KINDS = EVENT_KINDS.subset(lambda k: k.target == "link")
CLUSTER_KINDS = EVENT_KINDS.subset(lambda k: k.target == "cluster")


class _ValueFields(Mapping[str, str]):
    """Kind name -> its value field (the trace CSV's column), for the kinds that take a value; read
    from the registry when used."""

    def _now(self) -> dict[str, str]:
        return {n: k.value_field for n, k in EVENT_KINDS.items() if k.value_field is not None}

    def __getitem__(self, name: str) -> str:
        return self._now()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._now())

    def __len__(self) -> int:
        return len(self._now())


#: The value field of each kind that carries one, and its unit (the trace CSV's column).
VALUE_FIELD: Mapping[str, str] = _ValueFields()


class Change(BaseModel):
    """One step of the timeline: at ``t_s`` (s since the load starts), ``kind`` (a registered kind)
    applies to ``link`` (the plan's switch names, as in ``Plan.links``) or ``cluster`` with ``value``
    (the kind's unit: ms, Mbit/s, %; None for kinds without a value). ``event``: index into
    ``experiment.events``; ``step``: the step's number within its event (0 for a plain step)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    t_s: float
    kind: str
    event: int
    step: int = 0
    link: tuple[str, str] | None = None
    cluster: str | None = None
    value: float | None = None
    traffic: Literal["udp", "tcp"] = "udp"
    direction: Direction = "both"
    mode: Literal["kill", "stop"] = "kill"

    @field_validator("kind")
    @classmethod
    def _known(cls, v: str) -> str:
        kind_of(v)
        return v

    @property
    def entry(self) -> EventKind:
        """The registered kind of this change."""
        return kind_of(self.kind)


def check_value(kind: str, value: float, item: str) -> None:
    """A step's value is one the kind can take (the rule of both engines: finite, and
    :meth:`~testbed.spec.events.EventForm.rule` of the kind: e.g. delay >= 0 ms, bandwidth > 0
    Mbit/s, loss within 0..100 %, background >= 0 Mbit/s).

    Raises:
        ValueError: naming ``item`` (e.g. ``events.2 step 4``), the value and the rule.
    """
    kind_of(kind).check(value, item)


def check_up_down(changes: Sequence[Change]) -> None:
    """Along the timeline, a link (or cluster) goes down only while up and comes up only while down
    (the kinds with :attr:`EventKind.sets_up` False / True).

    Raises:
        ValueError: naming the event, the link or cluster, the time and the earlier event.
    """
    down: dict[object, Change] = {}
    for c in changes:
        sets_up = c.entry.sets_up
        if sets_up is None:
            continue
        key = frozenset(c.link) if c.link else c.cluster
        what = f"link {'-'.join(c.link)}" if c.link else f"cluster {c.cluster}"
        if not sets_up:
            if key in down:
                raise ValueError(f"events.{c.event} ({c.kind}) at {c.t_s:g} s: {what} is already down "
                                 f"(events.{down[key].event} at {down[key].t_s:g} s)")
            down[key] = c
        elif key not in down:
            raise ValueError(f"events.{c.event} ({c.kind}) at {c.t_s:g} s: {what} is not down then")
        else:
            del down[key]


def _ramp_steps(r: RampSpec, start_value: float, at_s: float) -> list[tuple[float, float]]:
    n = max(1, round(r.over_s / r.every_s))
    v0 = start_value if r.start is None else float(r.start)
    return [(at_s + r.over_s * i / n, v0 + (float(r.to) - v0) * i / n) for i in range(0 if r.start is not None else 1,
                                                                                         n + 1)]


def expand(events: Sequence[EventSpec], links: Mapping[int, tuple[str, str]],
           initial: Mapping[tuple[str, str], Mapping[str, float]], traces: Mapping[int, Sequence[tuple[float, float]]],
           horizon_s: float | None = None) -> list[Change]:
    """The timeline of every event as steps, sorted by time (ties: the order of the file).

    Args:
        events: the experiment's events.
        links: event index -> the plan's (a, b) switch names of its link (link events only).
        initial: (a, b) -> {value field: value} in force before any event (the plan's link
            delay_ms, bandwidth_mbps, loss_pct; background_mbps 0), for ramps without ``from``.
        traces: event index -> [(t_s relative to ``at``, value)] read from its CSV.
        horizon_s: steps after this time (s) are dropped (None: keep all).

    Raises:
        ValueError: a ramp or trace of more than :data:`MAX_STEPS_PER_EVENT` steps, a trace with
            no rows, a step value the kind cannot take (:func:`check_value`), or a link or cluster
            set down while down or up while up (:func:`check_up_down`); the message names the event.
        testbed.core.registry.UnknownNameError: an event of a kind that is not registered.
    """
    current = {k: dict(v) for k, v in initial.items()}
    out: list[tuple[float, int, int, Change]] = []
    timed = sorted(range(len(events)), key=lambda i: (events[i].at_s, i))
    for i in timed:
        ev = events[i]
        kind = kind_of(ev.kind, f"events.{i}.kind")
        field = kind.value_field
        link = links.get(i)
        if field is None:
            steps: list[tuple[float, float | None]] = [(ev.at_s, None)]
        elif ev.trace is not None:
            rows = traces.get(i) or []
            if not rows:
                raise ValueError(f"events.{i}: trace {ev.trace!r} has no rows")
            steps = [(ev.at_s + t, v) for t, v in rows]
        elif ev.ramp is not None:
            base = current.get(link, {}).get(field, 0.0) if link else 0.0
            steps = _ramp_steps(ev.ramp, base, ev.at_s)
        else:
            steps = [(ev.at_s, float(getattr(ev, field)))]
        if len(steps) > MAX_STEPS_PER_EVENT:
            raise ValueError(f"events.{i}: {len(steps)} steps; at most {MAX_STEPS_PER_EVENT} per event")
        for k, (t, v) in enumerate(steps):
            if v is not None:
                kind.check(v, f"events.{i}" + (f" step {k}" if len(steps) > 1 else ""))
            if horizon_s is not None and t > horizon_s:
                continue
            out.append((t, i, k, Change(t_s=t, kind=ev.kind, event=i, step=k, link=link, cluster=ev.cluster,
                                        value=v, traffic=ev.traffic, direction=ev.direction, mode=ev.mode)))
            if link is not None and field is not None and v is not None:
                current.setdefault(link, {})[field] = v
    out.sort(key=lambda x: (x[0], x[1], x[2]))
    timeline = [c for _, _, _, c in out]
    check_up_down(timeline)
    return timeline


__all__ = ["CLUSTER_KINDS", "EVENT_KINDS", "LINK_KINDS", "MAX_STEPS_PER_EVENT", "Change", "ClusterControl",
           "ClusterKind", "EventKind", "EventSpec", "LinkControl", "LinkKind", "Measured", "Probe", "RampSpec",
           "Tolerance", "VALUE_FIELD", "check_up_down", "check_value", "expand", "kind_of", "parse_background_mbps",
           "register"]
