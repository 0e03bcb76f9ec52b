"""Plug-ins: objects named by a reference string, loaded from an entry point or a ``module:callable``.

A registry (:class:`testbed.core.registry.Registry`) built with a :class:`PluginHook` resolves a
name it does not hold through this module. The reference forms, as written in a YAML file or on
the command line (:func:`parse_ref`, :func:`format_ref`):

==============================  ===================================================================
``slack``                       a name registered under the hook's entry-point group
                                (``importlib.metadata.entry_points(group=...)``)
``mypkg.sched:p2c``             ``package.module:callable`` (attribute path after the colon)
``mypkg.sched:p2c(d=2)``        either form with parameters: keyword arguments, Python literals
``{use: mypkg.sched:p2c,        the mapping form of a YAML file; :func:`format_ref` turns it into
params: {d: 2}}``               the string form above (parameters sorted by name), so one plug-in
                                with one set of parameters has one name everywhere
==============================  ===================================================================

:func:`load` imports the object and says where it came from (:class:`Origin`): the resolved import
path, the distribution that installed it and its version (``importlib.metadata``; ``"not
installed"`` for a module found on ``sys.path`` only), the module file and its SHA-256, and the
``sys.path`` entry it was imported from (so another process, e.g. an emulated source, can import it
too). Every failure is a :class:`PluginError` (an :class:`testbed.core.errors.InputError`, exit
code 2) that names the reference and says what to fix.

A plug-in's code runs inside the testbed's processes; every call of it (its import here, its
checks and decisions, a selector's calls) goes through :func:`call_plugin`: an exit or another
BaseException that is not an Exception raised by the plug-in is a :class:`PluginFault` (exit code 4)
naming it, with its traceback, never the end of the process. Its import and its plan-time calls
have a time limit (:func:`time_limit_s`: :data:`TIMEOUT_ENV`, default :data:`DEFAULT_TIMEOUT_S`).
What cannot be caught in-process: ``os._exit`` (and a crash of native code) ends the process at
once; the run's tally check then says which source vanished (``docs/extending.md``).
"""

from __future__ import annotations

import ast
import dis
import hashlib
import importlib
import importlib.metadata as md
import math
import os
import re
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Generic, TypeVar

from testbed.core.errors import EXIT_COMPONENT_DIED, InputError, RunFailure
from testbed.core.hashing import file_sha256

T = TypeVar("T")

#: A dotted Python name (``pkg.mod``, ``Class.method``).
_DOTTED = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
#: What a distribution is recorded as when the module was found on ``sys.path`` but no installed
#: distribution provides it.
NOT_INSTALLED = "not installed"


class PluginError(InputError):
    """A plug-in reference that cannot be used: bad syntax, nothing by that name, a module that does
    not import, an object of the wrong shape. The message names the reference and what to fix."""


class PluginFault(RunFailure):
    """A plug-in that left the testbed's control where it was called: it exited (``sys.exit``,
    ``SystemExit``), raised another BaseException that is not an Exception (``KeyboardInterrupt``
    raised by its own code, ``GeneratorExit``, a class of its own), or ran past its time limit
    (:func:`time_limit_s`; the import and the plan-time calls only). Exit code 4, the plug-in's fault;
    ``what`` names the plug-in and the call, ``tb`` is its traceback (also at the end of the message).
    An :class:`Exception`, so that every handler of a plug-in's errors sees it."""

    exit_code = EXIT_COMPONENT_DIED

    def __init__(self, message: str, what: str = "", tb: str = ""):
        super().__init__(message)
        self.what, self.tb = what, tb


@dataclass(frozen=True)
class PluginRef:
    """A parsed reference: ``target`` (an entry-point name or ``module:attr``) and its ``params``
    (keyword arguments, Python literals)."""

    target: str
    params: Mapping[str, Any] = field(default_factory=dict)

    @property
    def is_import_path(self) -> bool:
        """``module:attr`` (else an entry-point name)."""
        return ":" in self.target

    def __str__(self) -> str:
        return format_ref(self.target, self.params)


def _literal(v: Any, where: str) -> Any:
    """``v`` when it is a Python literal :func:`ast.literal_eval` reads back from its ``repr``."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (list, tuple)):
        return [_literal(x, where) for x in v]
    if isinstance(v, Mapping):
        return {str(k): _literal(x, where) for k, x in v.items()}
    raise PluginError(f"{where}: a parameter is a number, a string, a boolean, null, a list or a mapping; "
                      f"got {type(v).__name__} {v!r}")


def format_ref(target: str, params: Mapping[str, Any] | None = None) -> str:
    """The string form of a reference: ``target`` or ``target(k=v, ...)``, parameters sorted by name,
    values as Python literals (``mypkg.sched:p2c(d=2)``).

    Raises:
        PluginError: ``target`` is not an entry-point name or ``module:attr``; a parameter name is not
            an identifier or its value not a literal.
    """
    target = str(target).strip()
    _check_target(target, target)
    if not params:
        return target
    parts = []
    for k in sorted(params):
        if not isinstance(k, str) or not k.isidentifier():
            raise PluginError(f"{target}: parameter name {k!r} is not a Python identifier")
        parts.append(f"{k}={_literal(params[k], f'{target}: params.{k}')!r}")
    return f"{target}({', '.join(parts)})"


def _check_target(target: str, ref: str) -> None:
    mod, colon, attr = target.partition(":")
    if not _DOTTED.match(mod) or (colon and not _DOTTED.match(attr)):
        raise PluginError(f"{ref!r}: not a reference; write a name, package.module:callable, or either with "
                          f"parameters: mypkg.sched:p2c(d=2), or {{use: mypkg.sched:p2c, params: {{d: 2}}}}")


def parse_ref(text: str) -> PluginRef:
    """Parse ``target`` or ``target(k=v, ...)`` (:func:`format_ref`'s form; values Python literals).

    Raises:
        PluginError: anything else, naming ``text``.
    """
    text = str(text).strip()
    target, params = text, {}
    if text.endswith(")") and "(" in text:
        target = text[:text.index("(")].strip()
        _check_target(target, text)  # the name first: '$(id)' is not a reference at all
        try:
            call = ast.parse(f"_{text[text.index('('):]}", mode="eval").body
            if not isinstance(call, ast.Call) or call.args:
                raise ValueError("parameters are given by name: (name=value, ...)")
            for kw in call.keywords:
                if kw.arg is None:
                    raise ValueError("no **mapping: give each parameter by name")
                params[kw.arg] = ast.literal_eval(kw.value)
        except (SyntaxError, ValueError) as exc:
            raise PluginError(f"{text!r}: its parameters do not read as name=value, ... with Python literal "
                              f"values ({exc})") from None
    _check_target(target, text)
    return PluginRef(target, params)


def normalize_ref(value: Any) -> Any:
    """A reference as a YAML file may give it, in its string form: a mapping ``{use, params}`` becomes
    :func:`format_ref`'s string; a string is returned as written (stripped) once it parses; anything
    else is returned unchanged (the schema's type check then refuses it).

    Raises:
        PluginError: a mapping with other keys, no ``use``, or ``params`` not a mapping; a string that
            does not parse (:func:`parse_ref`).
    """
    if isinstance(value, Mapping):
        extra = set(value) - {"use", "params"}
        if extra or "use" not in value:
            raise PluginError(f"a policy given as a mapping has the keys use (required) and params; got "
                              f"{', '.join(map(str, value)) or 'none'}")
        params = value.get("params") or {}
        if not isinstance(params, Mapping):
            raise PluginError(f"{value['use']}: params is a mapping of name: value, got {params!r}")
        inner = parse_ref(str(value["use"]))
        return format_ref(inner.target, {**inner.params, **params})
    if isinstance(value, str) and value.strip() and not value.strip().isidentifier():
        return str(parse_ref(value))
    return value.strip() if isinstance(value, str) else value


@dataclass(frozen=True)
class Origin:
    """Where a plug-in came from. ``ref``: the reference as resolved; ``import_path``: the object's
    ``module:attr``; ``entry_point``: the entry-point name (None: given as ``module:attr``);
    ``distribution`` and ``version``: the installed distribution that provides it, or
    :data:`NOT_INSTALLED` for both; ``file``: the module file; ``sha256``: its SHA-256 (hex);
    ``sys_path``: the ``sys.path`` entry its top-level package was imported from."""

    ref: str
    import_path: str
    entry_point: str | None
    distribution: str
    version: str
    file: str
    sha256: str
    sys_path: str

    def as_dict(self) -> dict[str, Any]:
        """The JSON form recorded in ``run.json``."""
        return asdict(self)


@dataclass(frozen=True)
class Loaded:
    """A loaded plug-in: the object ``obj``, its ``params`` and its :class:`Origin`."""

    obj: Any
    params: Mapping[str, Any]
    origin: Origin


@dataclass(frozen=True)
class PluginHook(Generic[T]):
    """How a registry resolves a name it does not hold: ``group`` (the entry-point group) and
    ``make(name, loaded) -> entry`` (checks the loaded object and wraps it; raises ``ValueError`` or
    ``TypeError`` saying what is wrong and what to fix)."""

    group: str
    make: Callable[[str, Loaded], T]


def entry_point_names(group: str) -> tuple[str, ...]:
    """The names registered under entry-point ``group`` by the installed distributions, sorted."""
    return tuple(sorted({ep.name for ep in md.entry_points(group=group)}))


@cache
def _packages_distributions() -> Mapping[str, list[str]]:
    return md.packages_distributions()


def _import(module: str, attr: str, ref: str, extra_path: str | None = None) -> tuple[Any, Any]:
    """(module object, the attribute) of ``module:attr``, the import under :func:`time_limit_s`
    (:func:`call_plugin`); ``extra_path`` (a folder) is appended to ``sys.path`` first when it is not
    on it."""
    if extra_path and extra_path not in sys.path:
        sys.path.append(extra_path)
    try:
        mod = call_plugin(f"{ref!r}: importing module {module!r}", importlib.import_module, module,
                          limit_s=time_limit_s())
    except PluginFault:
        raise
    except ModuleNotFoundError as exc:
        raise PluginError(f"{ref!r}: module {exc.name!r} is not found (sys.path: install the package that provides "
                          f"it, or add its folder to PYTHONPATH)") from None
    except Exception as exc:  # noqa: BLE001 - whatever a module raises as it is imported is the plug-in's error
        raise PluginError(f"{ref!r}: importing module {module!r} failed: {type(exc).__name__}: {exc}") from exc
    obj: Any = mod
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise PluginError(f"{ref!r}: module {module!r} ({getattr(mod, '__file__', '?')}) has no attribute "
                              f"{attr!r}")
        obj = getattr(obj, part)
    return mod, obj


#: The environment variable that sets the time limit (s) of a plug-in's import and of its plan-time
#: calls (:func:`time_limit_s`); ``0`` or ``inf``: no limit. The ``testbed`` command's
#: ``--plugin-timeout S`` sets it (and so every process a run starts inherits it).
TIMEOUT_ENV = "TESTBED_PLUGIN_TIMEOUT_S"
#: The default time limit (s): a module's import and its checks take well under a second; 30 s
#: leaves room for a plug-in that imports a large library (TensorFlow imports in 3.5-4.4 s here).
DEFAULT_TIMEOUT_S = 30.0


def time_limit_s() -> float:
    """The time limit (s) of a plug-in's import and of its plan-time calls: :data:`TIMEOUT_ENV`,
    default :data:`DEFAULT_TIMEOUT_S`; ``math.inf`` for no limit (``0``, ``inf``).

    Raises:
        PluginError: the variable is set to something that is not a number >= 0.
    """
    text = os.environ.get(TIMEOUT_ENV, "").strip()
    if not text:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise PluginError(f"{TIMEOUT_ENV}={text!r}: the time limit of a plug-in's import and plan-time calls is a "
                          f"number of seconds >= 0 (0: no limit)")
    return math.inf if value == 0 else value


class _Expired(BaseException):
    """Raised inside a plug-in's code when its time limit ends (a BaseException, so that the
    plug-in's own ``except Exception`` does not swallow it)."""


@contextmanager
def _alarm(limit_s: float) -> Iterator[bool]:
    """Raise :class:`_Expired` in the main thread after ``limit_s`` s (``SIGALRM``, a real-time
    timer); yields whether the limit is armed: not in another thread (signals go to the main thread
    only), not for ``inf``, not when a timer of someone else's is running. The previous handler is
    restored after."""
    armed = (math.isfinite(limit_s) and limit_s > 0 and threading.current_thread() is threading.main_thread()
             and hasattr(signal, "setitimer") and signal.getitimer(signal.ITIMER_REAL)[0] == 0)
    if not armed:
        yield False
        return

    def expire(signum: int, frame: object) -> None:
        raise _Expired

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, limit_s)
    try:
        yield True
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


#: The opcodes of a ``raise`` statement: an exception whose innermost frame stopped at one was
#: raised by that code, not delivered by a signal between two instructions.
_RAISES = frozenset(dis.opmap[n] for n in ("RAISE_VARARGS", "RERAISE") if n in dis.opmap)


def _from_a_signal(exc: BaseException) -> bool:
    """Whether ``exc`` was delivered to the plug-in's code from outside: raised by a signal handler
    installed in this process (a Python handler's frame is in its traceback), or a
    ``KeyboardInterrupt`` that no ``raise`` statement raised (Python's own SIGINT handler, Ctrl-C)."""
    handlers = set()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        code = getattr(signal.getsignal(sig), "__code__", None)
        if code is not None:
            handlers.add(code)
    tb, last = exc.__traceback__, None
    while tb is not None:
        if tb.tb_frame.f_code in handlers:
            return True
        last, tb = tb, tb.tb_next
    if isinstance(exc, KeyboardInterrupt) and last is not None:
        code = last.tb_frame.f_code.co_code
        return not (0 <= last.tb_lasti < len(code) and code[last.tb_lasti] in _RAISES)
    return False


#: Where the testbed's own frames and the import machinery's are: a plug-in's traceback starts at its
#: first frame outside them.
_OWN = (str(Path(__file__).resolve().parents[1]), str(Path(importlib.__file__).parent), "<frozen importlib")


def plugin_traceback(exc: BaseException, stopped: bool = False) -> str:
    """The traceback of ``exc`` from the plug-in's first frame: the frames of the testbed (and of
    the import machinery) that called it are left out (all kept when every frame is ours). With
    ``stopped`` (``exc`` is the testbed's own interruption of the plug-in), the frames where the
    plug-in was, without the testbed's frames that stopped it nor the exception's line."""
    te = traceback.TracebackException.from_exception(exc)
    frames = list(te.stack)
    while frames and frames[0].filename.startswith(_OWN):
        frames.pop(0)
    if stopped:
        while len(frames) > 1 and frames[-1].filename.startswith(_OWN):
            frames.pop()
        return "Where it was (most recent call last):\n" + "".join(traceback.format_list(frames))
    if frames:
        te.stack = traceback.StackSummary.from_list(frames)
    return "".join(te.format())


def call_plugin(what: str, fn: Callable[..., T], *args: Any, limit_s: float = math.inf, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)``, a plug-in's code, kept within the testbed's control: what ``fn``
    raises as an :class:`Exception` passes unchanged (the caller says what it means); an exit
    (``SystemExit``) or another BaseException that is not an Exception raised by ``fn``'s own code
    becomes a :class:`PluginFault` naming ``what`` (e.g. ``"policy 'mypkg.sched:p2c' (..., file)
    deciding"``) with the traceback; a Ctrl-C or a signal's handler is not the plug-in's fault and
    passes unchanged. With a finite ``limit_s`` (main thread only), ``fn`` is stopped after
    ``limit_s`` s with a :class:`PluginFault` saying so (:data:`TIMEOUT_ENV` to change the limit).

    Raises:
        PluginFault: as above.
        Exception: whatever ``fn`` raises.
    """
    try:
        with _alarm(limit_s):
            return fn(*args, **kwargs)
    except Exception:
        raise
    except _Expired as exc:
        tb = plugin_traceback(exc, stopped=True)
        raise PluginFault(f"{what}: did not finish within {limit_s:g} s, the time limit of a plug-in's import and "
                          f"plan-time calls (set {TIMEOUT_ENV}=<seconds>, or testbed --plugin-timeout <seconds>; "
                          f"0: no limit).\n{tb}", what, tb) from None
    except BaseException as exc:
        if _from_a_signal(exc):
            raise
        tb = plugin_traceback(exc)
        kind = f"exited ({type(exc).__name__}({exc.args[0] if exc.args else ''!r}))" if isinstance(exc, SystemExit) \
            else f"raised {type(exc).__name__}: {exc}"
        raise PluginFault(f"{what}: the plug-in {kind}, which would have ended the testbed's process; "
                          f"a plug-in raises an Exception, never exits (the plug-in's fault, exit code 4):\n{tb}",
                          what, tb) from exc


def _origin(ref: str, module: str, attr: str, mod: Any, dist: md.Distribution | None, ep: str | None) -> Origin:
    file = getattr(mod, "__file__", None)
    if not file:
        raise PluginError(f"{ref!r}: module {module!r} has no file (a namespace package or a built-in): a plug-in "
                          f"lives in a .py file")
    if dist is None:
        names = _packages_distributions().get(module.split(".")[0]) or []
        dist = md.distribution(names[0]) if names else None
    depth = mod.__name__.count(".") + (Path(file).name == "__init__.py")
    return Origin(ref=ref, import_path=f"{module}:{attr}", entry_point=ep,
                  distribution=dist.metadata["Name"] if dist else NOT_INSTALLED,
                  version=dist.version if dist else NOT_INSTALLED, file=str(Path(file).resolve()),
                  sha256=file_sha256(file), sys_path=str(Path(file).resolve().parents[depth]))


def load(ref: PluginRef, group: str, extra_path: str | None = None) -> Loaded:
    """Import the object ``ref`` names: its entry point in ``group``, or its ``module:attr`` (with
    ``extra_path``, a folder, appended to ``sys.path`` when it is not on it: e.g. the repository's
    root, so that ``examples.selector.rules`` needs no install). The one loader of every kind of
    plug-in (policies, ASET selectors).

    Raises:
        PluginError: no such entry point (the message lists the installed ones), the module is not
            found or raises an exception as it is imported, the attribute is missing, or the module
            has no file.
        PluginFault: the module exits (``sys.exit``) or raises another BaseException that is not an
            Exception as it is imported, or its import takes longer than :func:`time_limit_s`
            (exit code 4; the message names the reference and holds the traceback).
    """
    text = str(ref)
    if ref.is_import_path:
        module, _, attr = ref.target.partition(":")
        mod, obj = _import(module, attr, text, extra_path)
        return Loaded(obj, dict(ref.params), _origin(text, module, attr, mod, None, None))
    eps = [ep for ep in md.entry_points(group=group) if ep.name == ref.target]
    if not eps:
        known = ", ".join(entry_point_names(group)) or "(none installed)"
        raise PluginError(f"{text!r}: no entry point {ref.target!r} in group {group!r} (installed: {known}); "
                          f"install the package that provides it, or write package.module:callable")
    ep = eps[0]
    module, _, attr = ep.value.partition(":")
    mod, obj = _import(module.strip(), attr.strip(), text)
    return Loaded(obj, dict(ref.params), _origin(text, module.strip(), attr.strip(), mod, ep.dist, ep.name))


def ref_slug(ref: str) -> str:
    """``ref`` as a file-name part: itself when it has only ``[A-Za-z0-9_.-]`` (every built-in
    policy); else its other characters as ``_`` and 8 hex digits of its SHA-256 (two references
    never share a slug), e.g. ``slack_policy.policy_slack_margin_ms_5_-1a2b3c4d``."""
    if re.fullmatch(r"[A-Za-z0-9_.-]+", ref):
        return ref
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", ref).strip("_")[:80] + "-" + hashlib.sha256(ref.encode()).hexdigest()[:8]


def split_refs(text: str) -> list[str]:
    """Comma-separated references (``closest, mypkg.sched:p2c(d=2, k=3)``), split at the commas outside
    parentheses and brackets, each stripped; empty ones left out."""
    out, depth, cur = [], 0, []
    for ch in text:
        depth += ch in "([{"
        depth -= ch in ")]}"
        if ch == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur).strip())
    return [x for x in out if x]


def add_sys_paths(paths: list[str] | tuple[str, ...]) -> None:
    """Put ``paths`` (the :attr:`Origin.sys_path` of plug-ins resolved in another process) at the end
    of ``sys.path`` when they are not on it, so that this process imports the same modules."""
    for p in paths:
        if p and p not in sys.path:
            sys.path.append(p)


__all__ = ["DEFAULT_TIMEOUT_S", "NOT_INSTALLED", "TIMEOUT_ENV", "Loaded", "Origin", "PluginError", "PluginFault",
           "PluginHook", "PluginRef", "add_sys_paths", "call_plugin", "entry_point_names", "format_ref", "load",
           "normalize_ref", "plugin_traceback", "parse_ref", "ref_slug", "split_refs", "time_limit_s"]
