"""Scenario events: what an experiment file may ask to change mid-run, and the timeline of changes.

An event (:class:`EventSpec`, the ``events:`` list of an experiment) changes one link or one
cluster from time ``at`` (s since the load starts). Kinds and their value:

=================  ==========================  =====================================================
kind               value                       effect
=================  ==========================  =====================================================
``link_delay``     ``delay`` (one-way, >= 0)   the link's propagation delay, both directions
``link_bandwidth`` ``bandwidth`` (> 0)         the link's capacity (the shaper's rate), both ways
``link_loss``      ``loss_pct`` (0..100)       independent frame loss per direction
``link_down``      -                           the link carries nothing; routes avoid it
``link_up``        -                           the link is back; routes may use it again
``link_congestion````background`` (>= 0)       background traffic of that rate through the link
                   ``traffic``: udp|tcp        (0 ends it); ``direction``: both, ab or ba
``cluster_down``   ``mode``: kill|stop         kill: the server dies (connections refused, what
                                               it held is lost); stop: it freezes (SIGSTOP:
                                               nothing is answered until it resumes)
``cluster_up``     -                           kill: the server restarts; stop: it resumes
=================  ==========================  =====================================================

Time-varying forms for the value kinds: a step (the value, at ``at``), a ramp
(``ramp: {to: VALUE, over: DURATION, every: DURATION}``: linear from the value in force at ``at``
-- or ``from`` -- to ``to``, one step every ``every``), or a trace (``trace: FILE.csv`` with
columns ``t_s`` and the value in the kind's unit, ``delay_ms`` / ``bandwidth_mbps`` / ``loss_pct`` /
``background_mbps``, ``t_s`` relative to ``at``). :func:`expand` turns events into one sorted
timeline of :class:`Change` (each a step), which both engines apply with the same meaning: the
emulation for real (:mod:`testbed.emu.events`), the simulator in virtual time.

Routing (both engines): least one-way delay over the links that are up; the controller learns a
delay change from the event itself (the run tells it), a failure from OpenFlow port status.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from testbed.spec.schema import Num, StrictModel, unit_pair
from testbed.spec.units import MAX_DELAY_MS, RATE_UNITS_MBPS, _parse, parse_delay_ms, parse_duration_s, parse_rate_mbps

EventKind = Literal["link_delay", "link_bandwidth", "link_loss", "link_down", "link_up", "link_congestion",
                    "cluster_down", "cluster_up"]
#: The value field of each kind that carries one, and its unit (the trace CSV's column).
VALUE_FIELD: dict[str, str] = {"link_delay": "delay_ms", "link_bandwidth": "bandwidth_mbps", "link_loss": "loss_pct",
                               "link_congestion": "background_mbps"}
LINK_KINDS = frozenset({"link_delay", "link_bandwidth", "link_loss", "link_down", "link_up", "link_congestion"})
CLUSTER_KINDS = frozenset({"cluster_down", "cluster_up"})
#: The most steps one ramp or trace may expand to (each step is applied and measured for real).
MAX_STEPS_PER_EVENT = 1000


def parse_background_mbps(value: object, item: str = "") -> float:
    """A background rate such as ``"80Mbit/s"``, where ``"0Mbit/s"`` (the end of a congestion) is
    valid too (:func:`testbed.spec.units.parse_rate_mbps` refuses 0); negative values fail validation."""
    return _parse(value, RATE_UNITS_MBPS, "background rate", item)


class RampSpec(StrictModel):
    """A linear ramp: from ``from`` (default: the value in force when it starts) to ``to`` over
    ``over_s`` seconds, one step every ``every_s`` seconds (the last step reaches ``to``)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, populate_by_name=True)

    start: Num | None = Field(None, alias="from")
    to: Num
    over_s: Num = Field(gt=0)
    every_s: Num = Field(1.0, gt=0)

    @model_validator(mode="before")
    @classmethod
    def _units(cls, data: Any) -> Any:
        data = unit_pair(data, "over", parse_duration_s, "s")
        return unit_pair(data, "every", parse_duration_s, "s")


class EventSpec(StrictModel):
    """One scenario event (module table). Values carry their unit (``delay: 30ms``,
    ``bandwidth: 20Mbit/s``, ``background: 80Mbit/s``) or use the unit key (``delay_ms: 30``);
    a ramp's ``to``/``from`` are in the kind's unit key (ms, Mbit/s, %)."""

    at_s: Num = Field(ge=0)
    kind: EventKind
    link: list[str] | None = Field(None, min_length=2, max_length=2)
    cluster: str | None = None
    delay_ms: Num | None = Field(None, ge=0, le=MAX_DELAY_MS)
    bandwidth_mbps: Num | None = Field(None, gt=0)
    loss_pct: Num | None = Field(None, ge=0, le=100)
    background_mbps: Num | None = Field(None, ge=0)
    traffic: Literal["udp", "tcp"] = "udp"
    direction: Literal["both", "ab", "ba"] = "both"
    mode: Literal["kill", "stop"] = "kill"
    ramp: RampSpec | None = None
    trace: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _units(cls, data: Any) -> Any:
        data = unit_pair(data, "at", parse_duration_s, "s")
        data = unit_pair(data, "delay", parse_delay_ms, "ms")
        data = unit_pair(data, "bandwidth", parse_rate_mbps, "mbps")
        return unit_pair(data, "background", parse_background_mbps, "mbps")

    @model_validator(mode="after")
    def _fields(self) -> EventSpec:
        k = self.kind
        if k in LINK_KINDS and self.link is None:
            raise ValueError(f"event {k!r} needs 'link' ([A, B])")
        if k in CLUSTER_KINDS and self.cluster is None:
            raise ValueError(f"event {k!r} needs 'cluster'")
        if k in LINK_KINDS and self.cluster is not None or k in CLUSTER_KINDS and self.link is not None:
            raise ValueError(f"event {k!r} takes {'link' if k in LINK_KINDS else 'cluster'} only")
        field = VALUE_FIELD.get(k)
        given = [f for f in VALUE_FIELD.values() if getattr(self, f) is not None]
        if field is None:
            if given or self.ramp or self.trace:
                raise ValueError(f"event {k!r} takes no value ({', '.join(given) or 'ramp/trace'} given)")
            return self
        if any(f != field for f in given):
            raise ValueError(f"event {k!r} takes {field.removesuffix('_ms').removesuffix('_mbps')!r}, "
                             f"not {[f for f in given if f != field]}")
        forms = sum((getattr(self, field) is not None and self.ramp is None, self.ramp is not None,
                     self.trace is not None))
        if forms != 1:
            raise ValueError(f"event {k!r} needs exactly one of a value "
                             f"({field.removesuffix('_ms').removesuffix('_mbps')!r}), 'ramp' or 'trace'")
        return self


class Change(BaseModel):
    """One step of the timeline: at ``t_s`` (s since the load starts), ``kind`` applies to
    ``link`` (the plan's switch names, as in ``Plan.links``) or ``cluster`` with ``value`` (the
    kind's unit: ms, Mbit/s, %; None for kinds without a value). ``event``: index into
    ``experiment.events``; ``step``: the step's number within its event (0 for a plain step)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    t_s: float
    kind: EventKind
    event: int
    step: int = 0
    link: tuple[str, str] | None = None
    cluster: str | None = None
    value: float | None = None
    traffic: Literal["udp", "tcp"] = "udp"
    direction: Literal["both", "ab", "ba"] = "both"
    mode: Literal["kill", "stop"] = "kill"


def check_value(kind: str, value: float, item: str) -> None:
    """A step's value is one the kind can take (the rule of both engines): delay >= 0 ms,
    bandwidth > 0 Mbit/s (a link that carries nothing is ``link_down``), loss within 0..100 %,
    background >= 0 Mbit/s; all finite.

    Raises:
        ValueError: naming ``item`` (e.g. ``events.2 step 4``), the value and the rule.
    """
    v = float(value)
    if not math.isfinite(v):
        raise ValueError(f"{item} ({kind}): value {value!r} is not finite")
    if kind == "link_delay" and v < 0:
        raise ValueError(f"{item} (link_delay): delay {v:g} ms is negative")
    if kind == "link_delay" and v > MAX_DELAY_MS:
        raise ValueError(f"{item} (link_delay): delay {v:g} ms is above {MAX_DELAY_MS:g} ms (600 s)")
    if kind == "link_bandwidth" and v <= 0:
        raise ValueError(f"{item} (link_bandwidth): bandwidth {v:g} Mbit/s must be > 0 (use link_down to cut a link)")
    if kind == "link_loss" and not 0 <= v <= 100:
        raise ValueError(f"{item} (link_loss): loss {v:g} % is outside 0..100")
    if kind == "link_congestion" and v < 0:
        raise ValueError(f"{item} (link_congestion): background {v:g} Mbit/s is negative")


def check_up_down(changes: Sequence[Change]) -> None:
    """Along the timeline, a link (or cluster) goes down only while up and comes up only while down.

    Raises:
        ValueError: naming the event, the link or cluster, the time and the earlier event.
    """
    down: dict[object, Change] = {}
    for c in changes:
        if c.kind not in ("link_down", "link_up", "cluster_down", "cluster_up"):
            continue
        key = frozenset(c.link) if c.link else c.cluster
        what = f"link {'-'.join(c.link)}" if c.link else f"cluster {c.cluster}"
        if c.kind.endswith("_down"):
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
    """
    current = {k: dict(v) for k, v in initial.items()}
    out: list[tuple[float, int, int, Change]] = []
    timed = sorted(range(len(events)), key=lambda i: (events[i].at_s, i))
    for i in timed:
        ev = events[i]
        field = VALUE_FIELD.get(ev.kind)
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
                check_value(ev.kind, v, f"events.{i}" + (f" step {k}" if len(steps) > 1 else ""))
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


__all__ = ["CLUSTER_KINDS", "LINK_KINDS", "MAX_STEPS_PER_EVENT", "VALUE_FIELD", "Change", "EventKind", "EventSpec",
           "RampSpec", "check_up_down", "check_value", "expand", "parse_background_mbps"]
