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

A refused value's message says what to write instead, when the value reads as a quantity under
looser rules (:func:`read_loosely`: a space before the unit, ``min``/``h``/``sec``/``msec``/``ns``,
a rate unit in another case, bytes per second): ``'10min' ... write '600s'``,
``'100MB/s' is bytes per second ... write '800Mbit/s'``. The looser reading only ever feeds a
message; the value is still refused.
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


#: The end of a bare number's message when the caller knows no key form (:func:`bare_number_hint` replaces it).
KEY_FORM_TAIL = " or use the key with the unit suffix"
#: Time units the strict rule refuses but a message can translate (factor to ms): what people write.
_LOOSE_TIME_MS: dict[str, float] = {
    "ns": 1e-6, "nsec": 1e-6, "usec": 1e-3, "usecs": 1e-3, "µs": 1e-3, "μs": 1e-3, "microsecond": 1e-3,
    "microseconds": 1e-3, "msec": 1.0, "msecs": 1.0, "millisecond": 1.0, "milliseconds": 1.0, "sec": 1e3,
    "secs": 1e3, "second": 1e3, "seconds": 1e3, "m": 60e3, "min": 60e3, "mins": 60e3, "minute": 60e3,
    "minutes": 60e3, "h": 3600e3, "hr": 3600e3, "hrs": 3600e3, "hour": 3600e3, "hours": 3600e3,
}
#: Rate prefixes (any case) -> Mbit/s per bit/s of the unit.
_RATE_PREFIX_MBPS = {"": 1e-6, "k": 1e-3, "m": 1.0, "g": 1e3, "t": 1e6}
_BYTE_UNITS = frozenset({"B/s", "Bps", "Byte/s", "Bytes/s", "byte/s", "bytes/s"})
_BIT_UNITS = frozenset({"b/s", "bit", "bits", "bit/s", "bits/s", "bps"})


def _loose_rate_mbps(unit: str) -> tuple[float, bool] | None:
    """(Mbit/s per 1 of ``unit``, whether it counts bytes) under the looser rules, or None.
    ``B`` (capital) is bytes, ``b`` bits, as IEC 80000-13 writes them; ``mbps`` is megabits."""
    prefix = unit[0] if len(unit) > 1 and unit[0].lower() in _RATE_PREFIX_MBPS else ""
    rest = unit[len(prefix):]
    factor = _RATE_PREFIX_MBPS[prefix.lower()]
    if rest in _BYTE_UNITS:
        return factor * 8, True
    if rest.lower() in _BIT_UNITS:
        return factor, False
    return None


def read_loosely(value: object, kind: str) -> float | None:
    """``value`` read under looser rules than the strict one (module docstring), in the unit of
    ``kind`` (``"time"``: ms; ``"rate"``: Mbit/s), or None when even these do not read it. For
    messages only: a value the strict rule refuses stays refused."""
    if isinstance(value, bool) or not isinstance(value, str):
        return None
    m = re.fullmatch(r"\s*" + _NUMBER + r"\s*(?P<unit>[^\s\d][^\s]*)\s*", value)
    if m is None:
        return None
    number, unit = float(m["num"]), m["unit"]
    if kind == "time":
        factor = TIME_UNITS_MS.get(unit) or _LOOSE_TIME_MS.get(unit) or _LOOSE_TIME_MS.get(unit.lower())
        return number * factor if factor else None
    if unit in RATE_UNITS_MBPS:
        return number * RATE_UNITS_MBPS[unit]
    loose = _loose_rate_mbps(unit)
    return None if loose is None else number * loose[0]


def _show(value: float, small: str, unit: str, big: str) -> str:
    """``value`` (in ``unit``) in the strict form with the unit that reads best: ``big`` (x 1000)
    from 1000, ``unit`` from 1 (and for 0), else ``small`` (/ 1000)."""
    if value >= 1e3:
        return f"{value / 1e3:g}{big}"
    if value >= 1 or value == 0:
        return f"{value:g}{unit}"
    return f"{value * 1e3:g}{small}"


def show_time(ms: float) -> str:
    """A time in ms written in the strict form with the unit that reads best: ``600s``, ``60ms``, ``250us``."""
    return _show(ms, "us", "ms", "s")


def show_rate(mbps: float) -> str:
    """A rate in Mbit/s written in the strict form: ``800Mbit/s``, ``1Gbit/s``, ``64kbit/s``."""
    return _show(mbps, "kbit/s", "Mbit/s", "Gbit/s")


#: The unit suffixes of keys (``deadline_ms``): what the number means, and how a value with a unit
#: is read for :func:`unit_key_hint` (a kind of :func:`read_loosely`, a factor from its unit).
KEY_UNITS: dict[str, tuple[str, str | None, float]] = {
    "_ms": ("milliseconds", "time", 1.0), "_s": ("seconds", "time", 1e-3), "_mbps": ("Mbit/s", "rate", 1.0),
    "_qps": ("queries per second", None, 1.0), "_pct": ("percent", None, 1.0), "_mib": ("MiB", None, 1.0),
}


#: The units a value of a counted key may be written with, by mistake, and their factor to the key's unit.
_COUNT_UNITS: dict[str, dict[str, float]] = {
    "_qps": {"": 1.0, "/s": 1.0, "qps": 1.0, "q/s": 1.0, "queries/s": 1.0},
    "_pct": {"": 1.0, "%": 1.0, "pct": 1.0, "percent": 1.0},
    "_mib": {"": 1.0, "MiB": 1.0, "M": 1.0, "GiB": 1024.0, "G": 1024.0},
}


def key_unit(key: str) -> tuple[str, str, str | None, float] | None:
    """(suffix, what the number means, kind, factor) of a key that carries its unit, or None."""
    for suffix, (meaning, kind, factor) in KEY_UNITS.items():
        if key.endswith(suffix) and len(key) > len(suffix):
            return suffix, meaning, kind, factor
    return None


def unit_key_hint(key: str, value: object, stem_form: bool = False) -> str:
    """What to write instead of ``key: value`` when ``key`` carries its unit (``deadline_ms``) and
    ``value`` is a string with one (``"60ms"``, ``"10min"``, ``"3/s"``): ``deadline_ms is in
    milliseconds: write 'deadline_ms: 60'`` (with ``stem_form``, also the unit form: ``or 'deadline:
    60ms'``); "" when the key carries no unit or the value does not read as a quantity."""
    ku = key_unit(key)
    if ku is None or not isinstance(value, str):
        return ""
    suffix, meaning, kind, factor = ku
    if kind is None:
        m = re.fullmatch(r"\s*" + _NUMBER + r"\s*(?P<unit>.*?)\s*", value)
        scale = _COUNT_UNITS[suffix].get(m["unit"]) if m else None
        number = float(m["num"]) * scale if m and scale else None
    else:
        got = read_loosely(value, kind)
        number = None if got is None else got * factor
    if number is None:
        return ""
    stem = key[: -len(suffix)]
    shown = (show_time(number / factor) if kind == "time" else show_rate(number)) if kind else ""
    other = f" or '{stem}: {shown}'" if stem_form and shown else ""
    return f"{key} is in {meaning}: write '{key}: {number:g}'{other}"


def bare_number_hint(key: str, suffix: str, value: object) -> str:
    """``; write 'delay: 20ms' or 'delay_ms: 20'`` for a bare number given to a key without its
    unit (the key of the unit form and ``suffix`` the key form's: ``ms``, ``s``, ``mbps``)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return ""
    unit = {"ms": "ms", "s": "s", "mbps": "Mbit/s"}.get(suffix, suffix)
    meaning = {"ms": "milliseconds", "s": "seconds", "mbps": "Mbit/s"}.get(suffix, suffix)
    other = {"ms": "s", "s": "ms"}.get(suffix)
    also = f"; '{key}: {value:g}{other}' if you meant {'seconds' if other == 's' else 'milliseconds'}" if other else ""
    return f": for {meaning} write '{key}: {value:g}{unit}' or '{key}_{suffix}: {value:g}'{also}"


def _instead(value: str, units: dict[str, float]) -> str:
    """``; write 'X'`` (the strict form of ``value``) when :func:`read_loosely` reads it, else ""."""
    kind = "time" if units is TIME_UNITS_MS else "rate"
    got = read_loosely(value, kind)
    if got is None:
        return ""
    fixed = show_time(got) if kind == "time" else show_rate(got)
    unit = re.sub(r"^[\s\d.eE+-]+", "", value.strip())
    loose = _loose_rate_mbps(unit) if kind == "rate" else None
    why = " is bytes per second (capital B); in bits per second it is" if loose and loose[1] else " is"
    return f"; {value.strip()!r}{why} {fixed}: write '{fixed}'"


def _parse(value: object, units: dict[str, float], what: str, item: str) -> float:
    accepted = ", ".join(f'"1{u}"' for u in units)
    where = f" for {item}" if item and item != what else ""
    if isinstance(value, bool) or value is None:
        raise UnitError(f"{what}{where}: got {value!r}; write a number with a unit, e.g. {accepted}")
    if isinstance(value, int | float):
        raise UnitError(f"{what}{where}: bare number {value!r} has no unit; write it with a unit "
                        f"(one of {accepted}){KEY_FORM_TAIL}")
    if not isinstance(value, str):
        raise UnitError(f"{what}{where}: expected a string like {accepted}, got {type(value).__name__}")
    m = re.fullmatch(_NUMBER + r"(?P<unit>[A-Za-z/]+)", value)
    if m is None and re.fullmatch(r"-" + _NUMBER + r"(?P<unit>[A-Za-z/]+)", value.strip()):
        raise UnitError(f"{what}{where}: {value!r} is negative; a {what} must be positive")
    if m is None:
        hint = " (no spaces between number and unit)" if " " in value.strip() else ""
        raise UnitError(f"{what}{where}: cannot parse {value!r}{hint}; accepted forms: {accepted}"
                        f"{_instead(value, units)}")
    unit = m.group("unit")
    if unit not in units:
        raise UnitError(f"{what}{where}: unknown unit {unit!r} in {value!r}; accepted units: {accepted}"
                        f"{_instead(value, units)}")
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
