"""Strict parsing of quantities with units.

The rule (``docs/system-model.md``: every quantity of a configuration carries its unit, in the
value or in the key):

* A value must be a string of a number immediately followed by a unit, with no space:
  ``"5ms"``, ``"0.5ms"``, ``"250us"``, ``"1s"``; ``"100Mbit/s"``, ``"1Gbit/s"``, ``"10Mbps"``.
* A bare number (``10``) is rejected for a key without a unit: write ``"10ms"``, or use a key
  that carries the unit (``delay_ms: 10``), which the schema accepts as a plain number.
* ``"10 ms"`` (a space), ``"5msms"`` (a repeated unit), ``"5"`` (no unit), ``"-1ms"`` (negative:
  said so) and unknown units (``"5min"``) are rejected with :class:`UnitError` naming the value,
  the item and the accepted forms. Nothing is guessed.

On the command line (``--duration`` of every command, :func:`parse_duration_arg_s`) a bare number
is seconds (``30``), as the flag's help says; a number with a unit is read as in experiment files
(``30s``, ``500ms``).
"""

from __future__ import annotations

import math
import re

from testbed.core.errors import InputError

_NUMBER = r"(?P<num>\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)"

#: Time units -> factor to milliseconds.
TIME_UNITS_MS: dict[str, float] = {"us": 1e-3, "ms": 1.0, "s": 1e3}
#: Rate units -> factor to Mbit/s. "bps" style aliases are accepted (bits, not bytes).
RATE_UNITS_MBPS: dict[str, float] = {
    "bit/s": 1e-6, "kbit/s": 1e-3, "Mbit/s": 1.0, "Gbit/s": 1e3,
    "bps": 1e-6, "kbps": 1e-3, "Mbps": 1.0, "Gbps": 1e3,
}


class UnitError(InputError):
    """A quantity is missing its unit, has an unknown unit, or is malformed."""


def _parse(value: object, units: dict[str, float], what: str, item: str) -> float:
    accepted = ", ".join(f'"1{u}"' for u in units)
    where = f" for {item}" if item and item != what else ""
    if isinstance(value, bool) or value is None:
        raise UnitError(f"{what}{where}: got {value!r}; write a number with a unit, e.g. {accepted}")
    if isinstance(value, int | float):
        raise UnitError(
            f"{what}{where}: bare number {value!r} has no unit; write it with a unit "
            f"(one of {accepted}) or use the key with the unit suffix"
        )
    if not isinstance(value, str):
        raise UnitError(f"{what}{where}: expected a string like {accepted}, got {type(value).__name__}")
    m = re.fullmatch(_NUMBER + r"(?P<unit>[A-Za-z/]+)", value)
    if m is None and re.fullmatch(r"-" + _NUMBER + r"(?P<unit>[A-Za-z/]+)", value.strip()):
        raise UnitError(f"{what}{where}: {value!r} is negative; a {what} must be positive")
    if m is None:
        hint = " (no spaces between number and unit)" if " " in value.strip() else ""
        raise UnitError(f"{what}{where}: cannot parse {value!r}{hint}; accepted forms: {accepted}")
    unit = m.group("unit")
    if unit not in units:
        raise UnitError(f"{what}{where}: unknown unit {unit!r} in {value!r}; accepted units: {accepted}")
    number = float(m.group("num"))
    if not math.isfinite(number):
        raise UnitError(f"{what}{where}: {value!r} is not finite")
    return number * units[unit]


#: The largest one-way link delay we accept anywhere (topology links, the cloud link, link_delay
#: events), ms: 600 s, as the largest deadline (``testbed.spec.experiment.MAX_DEADLINE_S``). Beyond it a
#: path's RTT is meaningless to both engines (1e308 ms summed to an infinite RTT).
MAX_DELAY_MS = 600_000.0


def parse_delay_ms(value: object, item: str = "") -> float:
    """Parse a delay such as ``"5ms"``, ``"250us"`` or ``"0.02s"`` into milliseconds.

    Args:
        value: the configured value (must be a string with a unit).
        item: what the value belongs to, used in the error message (e.g. ``"link Seattle-Denver"``).

    Returns:
        The delay in ms (>= 0).

    Raises:
        UnitError: bare number, space before the unit, repeated/unknown unit, or malformed.
    """
    return _parse(value, TIME_UNITS_MS, "delay", item)


#: The largest link rate we accept anywhere (topology links, host and cloud links, bandwidth and
#: congestion events), Mbit/s: 1 Tbit/s, above the fastest Ethernet IEEE 802.3 defines (800 Gbit/s)
#: and far above what a veth pair of the emulation carries (a few Gbit/s).
MAX_RATE_MBPS = 1_000_000.0


def parse_rate_mbps(value: object, item: str = "") -> float:
    """Parse a bandwidth such as ``"100Mbit/s"`` or ``"1Gbps"`` into Mbit/s (10^6 bit/s).

    Raises:
        UnitError: as :func:`parse_delay_ms`; also for zero bandwidth, or one over
            :data:`MAX_RATE_MBPS`.
    """
    mbps = _parse(value, RATE_UNITS_MBPS, "bandwidth", item)
    if mbps <= 0:
        raise UnitError(f"bandwidth for {item}: must be > 0, got {value!r}")
    if mbps > MAX_RATE_MBPS:
        raise UnitError(f"bandwidth for {item}: {value!r} is over the bound of {MAX_RATE_MBPS:g} Mbit/s (1 Tbit/s, "
                        f"testbed.spec.units.MAX_RATE_MBPS: above the fastest Ethernet, 800 Gbit/s)")
    return mbps


def parse_duration_s(value: object, item: str = "") -> float:
    """Parse a duration such as ``"30s"`` or ``"500ms"`` into seconds."""
    return _parse(value, TIME_UNITS_MS, "duration", item) / 1e3


def parse_duration_arg_s(text: str, item: str = "--duration") -> float:
    """A duration given on the command line, in seconds: a bare number is seconds (``30``,
    ``0.5``), or a number with its unit as in experiment files (``30s``, ``500ms``, ``250us``).

    Raises:
        UnitError: malformed, negative, an unknown unit, or not finite (names ``item``).
    """
    t = str(text).strip()
    if re.fullmatch(_NUMBER, t):
        value = float(t)
        if not math.isfinite(value):
            raise UnitError(f"duration for {item}: {text!r} is not finite")
        return value
    if re.fullmatch("-" + _NUMBER, t):
        raise UnitError(f"duration for {item}: {text!r} is negative; a duration must be positive")
    return parse_duration_s(t, item)
