"""Scenario events' YAML form: what an experiment file may ask to change mid-run (``events:``).

An event (:class:`EventSpec`) changes one link or one cluster from time ``at`` (s since the load
starts). Its ``kind`` names an entry of :data:`EVENT_KINDS`, the registry of event kinds: each kind
says what it targets (``link: [A, B]`` or ``cluster: NAME``), which value field it takes (if any)
and the values it accepts (:meth:`EventForm.check`). The built-in kinds and their meaning are
registered by :mod:`testbed.model.event_kinds` (the model layer, which also holds how each kind is
applied and measured); this module reads the registry and never imports the model.

Values carry their unit (``delay: 30ms``, ``bandwidth: 20Mbit/s``, ``background: 80Mbit/s``) or
use the unit key (``delay_ms: 30``); the value fields are :data:`VALUE_FIELDS`. Time-varying forms
for the kinds with a value: a step (the value, at ``at``), a ramp (``ramp: {to: VALUE, over:
DURATION, every: DURATION}``: linear from the value in force at ``at`` -- or ``from`` -- to ``to``,
one step every ``every``), or a trace (``trace: FILE.csv`` with columns ``t_s`` and the value in the
kind's unit key, ``t_s`` relative to ``at``).
"""

from __future__ import annotations

import math
from typing import ClassVar, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from testbed.core.registry import Registry
from testbed.spec.schema import Num, StrictModel
from testbed.spec.units import MAX_DELAY_MS, RATE_UNITS_MBPS, _parse, parse_delay_ms, parse_duration_s, parse_rate_mbps

#: The value fields an event may carry (each in its unit: ms, Mbit/s, %, Mbit/s); a kind takes one or none.
VALUE_FIELDS = ("delay_ms", "bandwidth_mbps", "loss_pct", "background_mbps")


class EventForm:
    """The YAML form of one event kind (the spec part of a kind; :class:`testbed.model.timeline.EventKind`
    adds how it is applied and measured).

    Class attributes: ``name`` (the ``kind:`` string), ``target`` (``"link"`` or ``"cluster"``),
    ``value_field`` (one of :data:`VALUE_FIELDS`, or None for a kind without a value), ``unit`` (the
    value's unit as shown: ``ms``, ``Mbit/s``, ``%``; "" without a value), ``effect`` (one line for
    the docs and error messages).
    """

    name: ClassVar[str]
    target: ClassVar[Literal["link", "cluster"]]
    value_field: ClassVar[str | None] = None
    unit: ClassVar[str] = ""
    effect: ClassVar[str] = ""

    def rule(self, value: float) -> str | None:
        """Why ``value`` (finite, in :attr:`unit`) is one this kind cannot take, or None when it can.
        Override per kind (the default accepts every finite value)."""
        return None

    def check(self, value: float, item: str) -> None:
        """``value`` is finite and passes :meth:`rule` (the rule of both engines, for every step).

        Raises:
            ValueError: naming ``item`` (e.g. ``events.2 step 4``), the kind, the value and the rule.
        """
        v = float(value)
        if not math.isfinite(v):
            raise ValueError(f"{item} ({self.name}): value {value!r} is not finite")
        why = self.rule(v)
        if why is not None:
            raise ValueError(f"{item} ({self.name}): {why}")

    @property
    def value_key(self) -> str:
        """The value field without its unit suffix (``delay``), as the YAML's unit form writes it."""
        return (self.value_field or "").removesuffix("_ms").removesuffix("_mbps")


#: Every event kind by name, in registration order (filled by :mod:`testbed.model.event_kinds`).
EVENT_KINDS: Registry[EventForm] = Registry("event kind")


def event_form(kind: str, where: str = "") -> EventForm:
    """The registered kind named ``kind``.

    Raises:
        testbed.core.registry.UnknownNameError: (a ValueError) naming ``where``, the kind and the known ones.
        RuntimeError: no kind is registered at all (:mod:`testbed.model` was not imported).
    """
    if not EVENT_KINDS:
        raise RuntimeError("no event kinds are registered: the built-in ones register when testbed.model is "
                           "imported (testbed.model.event_kinds)")
    return EVENT_KINDS.resolve(kind, where)


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

    unit_keys = (("over", parse_duration_s, "s"), ("every", parse_duration_s, "s"))


class EventSpec(StrictModel):
    """One scenario event (module doc). Values carry their unit (``delay: 30ms``,
    ``bandwidth: 20Mbit/s``, ``background: 80Mbit/s``) or use the unit key (``delay_ms: 30``);
    a ramp's ``to``/``from`` are in the kind's unit key (ms, Mbit/s, %).

    Raises (on validation, as pydantic's ValidationError): an unknown kind (naming the known ones),
    a link kind without ``link`` or a cluster kind without ``cluster`` (or with the other), a value
    field the kind does not take, or not exactly one of value / ``ramp`` / ``trace`` for a kind
    with a value.
    """

    at_s: Num = Field(ge=0)
    kind: str
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

    unit_keys = (("at", parse_duration_s, "s"),
                 ("delay", parse_delay_ms, "ms"),
                 ("bandwidth", parse_rate_mbps, "mbps"),
                 ("background", parse_background_mbps, "mbps"))

    @field_validator("kind")
    @classmethod
    def _known(cls, v: str) -> str:
        event_form(v)
        return v

    @model_validator(mode="after")
    def _fields(self) -> EventSpec:
        form = event_form(self.kind)
        k, on_link = self.kind, form.target == "link"
        if on_link and self.link is None:
            raise ValueError(f"event {k!r} needs 'link' ([A, B])")
        if not on_link and self.cluster is None:
            raise ValueError(f"event {k!r} needs 'cluster'")
        if on_link and self.cluster is not None or not on_link and self.link is not None:
            raise ValueError(f"event {k!r} takes {form.target} only")
        field = form.value_field
        given = [f for f in VALUE_FIELDS if getattr(self, f) is not None]
        if field is None:
            if given or self.ramp or self.trace:
                raise ValueError(f"event {k!r} takes no value ({', '.join(given) or 'ramp/trace'} given)")
            return self
        if any(f != field for f in given):
            raise ValueError(f"event {k!r} takes {form.value_key!r}, not {[f for f in given if f != field]}")
        forms = sum((getattr(self, field) is not None and self.ramp is None, self.ramp is not None,
                     self.trace is not None))
        if forms != 1:
            raise ValueError(f"event {k!r} needs exactly one of a value ({form.value_key!r}), 'ramp' or 'trace'")
        return self


__all__ = ["EVENT_KINDS", "VALUE_FIELDS", "EventForm", "EventSpec", "RampSpec", "event_form", "parse_background_mbps"]
