"""The built-in scenario event kinds, one registered class each (:func:`testbed.model.timeline.register`).

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

Each class holds everything about its kind: the YAML form (``name``, ``value_field``, ``unit``,
:meth:`rule`), how both engines apply it (:meth:`apply`, on a
:class:`~testbed.model.timeline.LinkControl` or :class:`~testbed.model.timeline.ClusterControl`), and
how the emulation measures it (``window_s``, ``boost_hz``, ``paths``, :meth:`tolerance`,
:meth:`measure` through a :class:`~testbed.model.timeline.Probe`). Adding a kind is one more class
here (``docs/extending.md``). Imported by :mod:`testbed.model` (its package), so the kinds are
registered whenever the model is.
"""

from __future__ import annotations

import math
from typing import ClassVar

from testbed.model.timeline import (
    Change,
    ClusterControl,
    ClusterKind,
    LinkControl,
    LinkKind,
    Measured,
    Probe,
    Tolerance,
    register,
)
from testbed.spec.units import MAX_DELAY_MS


def _rate_tolerance(value: float | None) -> float:
    """10 % of a rate, 1 Mbit/s at least."""
    return max(1.0, 0.1 * (value or 0.0))


@register
class LinkDelay(LinkKind):
    name = "link_delay"
    value_field, unit = "delay_ms", "ms"
    effect = "the link's propagation delay, both directions"
    window_s, boost_hz = 0.6, 500.0
    examples = (10.0, 30.0, 0.0)
    paths: ClassVar[frozenset[str]] = frozenset({"now", "after"})

    def rule(self, value: float) -> str | None:
        if value < 0:
            return f"delay {value:g} ms is negative"
        if value > MAX_DELAY_MS:
            return f"delay {value:g} ms is above {MAX_DELAY_MS:g} ms (600 s)"
        return None

    def apply(self, ch: Change, target: LinkControl) -> None:
        target.set_delay(float(ch.value))

    def window(self, ch: Change, link: LinkControl) -> float:
        # a lowered delay waits for the frames in flight
        return self.window_s + 2 * max(link.delay_ms, ch.value or 0.0) / 1e3

    def tolerance(self, ch: Change, tol: Tolerance, n: int = 0) -> float:
        """Half the RTT self-check's absolute term, its relative term of the value, and its
        per-switch term for the two switches of the probe path (the probe path's baseline overhead
        is subtracted, so this is generous)."""
        return tol.abs_ms / 2 + tol.pct / 100 * (ch.value or 0.0) + tol.per_switch_ms

    def measure(self, ch: Change, probe: Probe, link: LinkControl, tol: Tolerance) -> Measured:
        return probe.delay(link.delay_ms, self.tolerance(ch, tol))


@register
class LinkBandwidth(LinkKind):
    name = "link_bandwidth"
    value_field, unit = "bandwidth_mbps", "Mbit/s"
    effect = "the link's capacity (the shaper's rate), both directions"
    window_s, boost_hz = 0.4, 100.0
    examples = (20.0, 50.0)

    def rule(self, value: float) -> str | None:
        return f"bandwidth {value:g} Mbit/s must be > 0 (use link_down to cut a link)" if value <= 0 else None

    def apply(self, ch: Change, target: LinkControl) -> None:
        target.set_rate(float(ch.value))

    def tolerance(self, ch: Change, tol: Tolerance, n: int = 0) -> float:
        """10 % of the value, 1 Mbit/s at least."""
        return _rate_tolerance(ch.value)

    def after_apply(self, ch: Change, probe: Probe, tol: Tolerance) -> None:
        probe.train(float(ch.value), self.tolerance(ch, tol))

    def measure(self, ch: Change, probe: Probe, link: LinkControl, tol: Tolerance) -> Measured:
        return probe.rate(link.capacity_mbps, self.tolerance(ch, tol))


@register
class LinkLoss(LinkKind):
    name = "link_loss"
    value_field, unit = "loss_pct", "%"
    effect = "independent frame loss per direction"
    window_s, boost_hz = 1.2, 1000.0
    examples = (5.0,)

    def rule(self, value: float) -> str | None:
        return f"loss {value:g} % is outside 0..100" if not 0 <= value <= 100 else None

    def apply(self, ch: Change, target: LinkControl) -> None:
        target.set_loss(float(ch.value))

    def tolerance(self, ch: Change, tol: Tolerance, n: int = 0) -> float:
        """Three binomial standard deviations over ``n`` probes, plus 0.5 point."""
        p = (ch.value or 0.0) / 100
        return 300 * math.sqrt(max(p * (1 - p), 1e-4) / max(n, 1)) + 0.5

    def measure(self, ch: Change, probe: Probe, link: LinkControl, tol: Tolerance) -> Measured:
        return probe.loss(float(ch.value), lambda n: self.tolerance(ch, tol, n))


@register
class LinkDown(LinkKind):
    name = "link_down"
    effect = "the link carries nothing; routes avoid it"
    sets_up = False
    window_s, boost_hz = 2.0, 200.0
    #: 10 s from the firing in all, while paths that used the link have not answered again: the
    #: controller reroutes on the port status (no LLDP wait), but the changed switches may take
    #: seconds to acknowledge their flows on a busy machine (1.3 s for 468 flows on 594 switches).
    watch_s = 8.0
    paths: ClassVar[frozenset[str]] = frozenset({"now"})

    def apply(self, ch: Change, target: LinkControl) -> None:
        target.set_up(False)

    def measure(self, ch: Change, probe: Probe, link: LinkControl, tol: Tolerance) -> Measured:
        return probe.reroute()


@register
class LinkUp(LinkKind):
    name = "link_up"
    effect = "the link is back; routes may use it again"
    sets_up = True
    window_s, boost_hz = 3.0, 200.0
    #: 15 s from the firing in all, until the controller routes over the link again: the run's
    #: grace for the LLDP rediscovery (``testbed.emu.health.LINK_UP_GRACE_S``, 10 s: 5.0 s on 594
    #: switches beside other jobs) and 5 s for the changed switches to acknowledge their flows.
    watch_s = 12.0
    paths: ClassVar[frozenset[str]] = frozenset({"after"})

    def apply(self, ch: Change, target: LinkControl) -> None:
        target.set_up(True)

    def measure(self, ch: Change, probe: Probe, link: LinkControl, tol: Tolerance) -> Measured:
        return probe.rediscovery()


@register
class LinkCongestion(LinkKind):
    name = "link_congestion"
    value_field, unit = "background_mbps", "Mbit/s"
    effect = "background traffic of that rate through the link (0 ends it); traffic udp|tcp, direction both|ab|ba"
    window_s, boost_hz = 1.2, 200.0
    examples = (10.0, 50.0)

    def rule(self, value: float) -> str | None:
        return f"background {value:g} Mbit/s is negative" if value < 0 else None

    def apply(self, ch: Change, target: LinkControl) -> None:
        target.set_background(float(ch.value), ch.direction, ch.traffic)

    def tolerance(self, ch: Change, tol: Tolerance, n: int = 0) -> float:
        """10 % of the value, 1 Mbit/s at least."""
        return _rate_tolerance(ch.value)

    def measure(self, ch: Change, probe: Probe, link: LinkControl, tol: Tolerance) -> Measured:
        return probe.carried(float(ch.value), self.tolerance(ch, tol))


@register
class ClusterDown(ClusterKind):
    name = "cluster_down"
    effect = "kill: the server dies (what it held is lost); stop: it freezes (SIGSTOP)"
    sets_up = False

    def apply(self, ch: Change, target: ClusterControl) -> None:
        target.set_up(False, ch.mode)


@register
class ClusterUp(ClusterKind):
    name = "cluster_up"
    effect = "kill: the server restarts; stop: it resumes"
    sets_up = True
    measured_unit = "s"

    def apply(self, ch: Change, target: ClusterControl) -> None:
        target.set_up(True, ch.mode)


__all__ = ["ClusterDown", "ClusterUp", "LinkBandwidth", "LinkCongestion", "LinkDelay", "LinkDown", "LinkLoss",
           "LinkUp"]
