"""The emulated-time clock: the one object that carries the time dilation k.

Under time dilation k (``emulation.time_dilation``, :mod:`testbed.plan.dilation`) the emulated
system runs k times slower than the wall clock: one emulated second lasts k wall seconds, a rate of
the emulated system (Mbit/s, queries/s) is k times lower on the wall clock. Every conversion
between the two clocks goes through an :class:`EmulatedClock`; no module multiplies or divides by
k itself. At k = 1 every conversion is the identity (and returns its argument unchanged).

Conversions (pure: no clock is read here):

===============================================  ======================  =============================
what                                             emulated -> wall        wall -> emulated
===============================================  ======================  =============================
an instant (ns since the epoch)                  :meth:`wall_ns`         :meth:`emulated_ns`
a duration (any unit: s, ms, us, ns)             :meth:`wall`            :meth:`emulated`
a rate (Mbit/s, queries/s)                       :meth:`wall_rate`       :meth:`emulated_rate`
a value of a unit (``ms``, ``s``, ``Mbit/s``,    :meth:`wall_value`      :meth:`emulated_value`
``%``, ``""``; :data:`UNIT_SCALE`)
===============================================  ======================  =============================

Instants are mapped around ``origin_ns``, the wall instant at which both clocks read the same (the
load's start, ``load_start.json``): ``emulated = origin + (wall - origin) / k``. The source of the
method: Gupta et al., "To Infinity and Beyond: Time-Warped Network Emulation", NSDI 2006.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

#: How a value of each unit dilates: ``time`` (a duration: x k on the wall clock), ``rate`` (/ k)
#: or ``none`` (sizes, shares, loss, counts). A unit with no rule is a KeyError: a new event kind
#: must say how its value dilates.
UNIT_SCALE: dict[str, str] = {"ms": "time", "s": "time", "Mbit/s": "rate", "%": "none", "": "none"}


@dataclass(frozen=True)
class EmulatedClock:
    """The emulated system's clock against the wall clock.

    Args:
        k: the time dilation (>= 1): wall seconds per emulated second.
        origin_ns: the wall instant (ns since the epoch) at which both clocks read the same; only
            the instant conversions use it (0 for a clock that converts durations only).

    Raises:
        ValueError: ``k`` < 1 or not finite.
    """

    k: float = 1.0
    origin_ns: int = 0

    def __post_init__(self) -> None:
        k = float(self.k)
        if not 1.0 <= k < float("inf"):
            raise ValueError(f"time dilation k = {self.k!r}: must be a finite number >= 1")
        object.__setattr__(self, "k", k)

    @property
    def dilated(self) -> bool:
        """Whether k != 1 (the two clocks differ)."""
        return self.k != 1.0

    def at(self, origin_ns: int) -> EmulatedClock:
        """The same dilation with another shared instant (e.g. the load's start once known)."""
        return EmulatedClock(self.k, int(origin_ns))

    # -- instants (ns since the epoch) --
    def emulated_ns(self, wall_ns: int | None) -> int | None:
        """A wall instant as an emulated instant, rounded to the ns; None stays None."""
        if wall_ns is None or self.k == 1.0:
            return wall_ns
        return self.origin_ns + round((wall_ns - self.origin_ns) / self.k)

    def wall_ns(self, emulated_ns: int | None) -> int | None:
        """An emulated instant as a wall instant, rounded to the ns; None stays None."""
        if emulated_ns is None or self.k == 1.0:
            return emulated_ns
        return self.origin_ns + round((emulated_ns - self.origin_ns) * self.k)

    def instants(self, times_ns: Mapping[str, int | None]) -> dict[str, int | None]:
        """Named wall instants (ns) as emulated instants (:meth:`emulated_ns`), None kept."""
        return {name: self.emulated_ns(t) for name, t in times_ns.items()}

    # -- durations and rates --
    def emulated(self, wall: float) -> float:
        """A duration measured on the wall clock, in emulated time (same unit): ``wall / k``."""
        return wall if self.k == 1.0 else wall / self.k

    def wall(self, emulated: float) -> float:
        """A duration of the emulated system, on the wall clock (same unit): ``emulated x k``."""
        return emulated if self.k == 1.0 else emulated * self.k

    def emulated_rate(self, wall_rate: float) -> float:
        """A rate measured on the wall clock (per s), as the emulated system's: ``x k``."""
        return wall_rate if self.k == 1.0 else wall_rate * self.k

    def wall_rate(self, emulated_rate: float) -> float:
        """A rate of the emulated system (per s), on the wall clock: ``/ k``."""
        return emulated_rate if self.k == 1.0 else emulated_rate / self.k

    # -- values of a unit --
    def scale(self, unit: str) -> float:
        """The factor a value in ``unit`` is multiplied by on the wall clock (k, 1 / k or 1).

        Raises:
            KeyError: a unit with no rule in :data:`UNIT_SCALE`.
        """
        rule = UNIT_SCALE[unit]
        return self.wall(1.0) if rule == "time" else self.wall_rate(1.0) if rule == "rate" else 1.0

    def wall_value(self, value: float | None, unit: str) -> float | None:
        """An emulated ``value`` in ``unit`` on the wall clock (:meth:`scale`); None stays None."""
        return None if value is None else value * self.scale(unit)

    def emulated_value(self, value: float | None, unit: str) -> float | None:
        """A ``value`` in ``unit`` measured on the wall clock, in emulated terms; None stays None."""
        return None if value is None else value / self.scale(unit)


#: The undilated clock (k = 1): every conversion is the identity.
UNDILATED = EmulatedClock()

__all__ = ["UNDILATED", "UNIT_SCALE", "EmulatedClock"]
