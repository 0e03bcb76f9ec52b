"""One error root: every exception class the testbed defines derives from TestbedError, so the
``testbed`` command prints it as one line and returns its exit code (``testbed/core/errors.py``),
unless it is on the short allow-list below with the reason it never reaches the command."""

from __future__ import annotations

import functools
import importlib
import inspect
import pkgutil

import pytest

import testbed
from testbed.core.errors import EXIT_BRINGUP, EXIT_INPUT, EXIT_INTEGRITY, InputError, RunFailure, TestbedError

#: Exceptions that never reach the ``testbed`` command, with the reason.
ALLOWED_OUTSIDE = {
    "testbed.serve.payload.RequestError": "an HTTP refusal of the inference server, answered in serve/server.py",
    "testbed.serve.server._StopWhileLoading": "control flow inside the server's main() (a signal while loading)",
    "testbed.core.plugins._Expired": "control flow inside a plug-in's call (its time limit; a BaseException so the "
                                     "plug-in's own except Exception does not swallow it), turned into PluginFault",
    "testbed.aset.specialize._OverBudget": "control flow inside specialize (the budget's guard stops a step), caught "
                                           "there and said in the report's truncated steps",
}


@functools.cache
def _defined_exceptions() -> dict[str, type[BaseException]]:
    """Every exception class defined in a module of ``testbed`` (its ``__module__`` is that module),
    by its qualified name; every module is imported (``__main__`` modules are not: they run)."""
    found: dict[str, type[BaseException]] = {}
    for info in pkgutil.walk_packages(testbed.__path__, "testbed."):
        if info.name.rsplit(".", 1)[-1] == "__main__":
            continue
        mod = importlib.import_module(info.name)
        for name, obj in vars(mod).items():
            if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == mod.__name__:
                found[f"{mod.__name__}.{name}"] = obj
    return found


def test_every_exception_derives_from_testbed_error():
    found = _defined_exceptions()
    assert len(found) > 20  # the walk saw the package, not an empty path
    outside = sorted(q for q, cls in found.items() if not issubclass(cls, TestbedError) and q not in ALLOWED_OUTSIDE)
    assert not outside, f"exceptions outside TestbedError and not on the allow-list: {outside}"
    stale = sorted(set(ALLOWED_OUTSIDE) - set(found))
    assert not stale, f"allow-list entries that no longer exist: {stale}"
    for q, cls in found.items():
        if issubclass(cls, TestbedError):
            assert cls.exit_code in (EXIT_INPUT, EXIT_BRINGUP, 4, 5, 6, EXIT_INTEGRITY), (q, cls.exit_code)


@pytest.mark.parametrize(("name", "code", "stdlib"), [
    ("UnitError", EXIT_INPUT, ValueError),             # pydantic validators need ValueError
    ("DuplicateKeyError", EXIT_INPUT, ValueError),
    ("InputFileError", EXIT_INPUT, ValueError),
    ("ZooError", EXIT_INPUT, RuntimeError),
    ("ZooFileMissing", EXIT_INPUT, FileNotFoundError),
    ("GraphError", EXIT_INPUT, RuntimeError),
    ("ProfileError", EXIT_BRINGUP, RuntimeError),
    ("NoRouteError", EXIT_BRINGUP, LookupError),
    ("NetdevError", EXIT_BRINGUP, OSError),
    ("PcapError", EXIT_INPUT, ValueError),
    ("ObservationSizeError", EXIT_INPUT, ValueError),
])
def test_exit_code_and_the_stdlib_base_callers_catch(name, code, stdlib):
    """The class of that name, wherever it is defined (once), keeps the stdlib base callers catch."""
    (cls,) = [c for q, c in _defined_exceptions().items() if q.rsplit(".", 1)[1] == name]
    exc = cls("a message")
    assert isinstance(exc, TestbedError) and isinstance(exc, stdlib)
    assert exc.exit_code == code and str(exc) == "a message"
    assert isinstance(exc, InputError if code == EXIT_INPUT else RunFailure) or isinstance(exc, OSError)


def test_netdev_error_keeps_the_errno_form():
    from testbed.emu.netdev import NetdevError

    exc = NetdevError(19, "interface x: no such device")
    assert exc.errno == 19 and "no such device" in str(exc) and exc.exit_code == EXIT_BRINGUP


def test_a_unit_error_in_a_pydantic_validator_is_a_validation_error():
    from pydantic import BaseModel, ValidationError, field_validator

    from testbed.spec.units import parse_delay_ms

    class Link(BaseModel):
        delay: float

        @field_validator("delay", mode="before")
        @classmethod
        def _unit(cls, v):
            return parse_delay_ms(v, item="delay")

    assert Link(delay="5ms").delay == 5.0
    with pytest.raises(ValidationError, match="bare number"):
        Link(delay=5)
