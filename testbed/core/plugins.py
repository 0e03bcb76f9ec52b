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
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.metadata as md
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Generic, TypeVar

from testbed.core.errors import InputError

T = TypeVar("T")

#: A dotted Python name (``pkg.mod``, ``Class.method``).
_DOTTED = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
#: What a distribution is recorded as when the module was found on ``sys.path`` but no installed
#: distribution provides it.
NOT_INSTALLED = "not installed"


class PluginError(InputError):
    """A plug-in reference that cannot be used: bad syntax, nothing by that name, a module that does
    not import, an object of the wrong shape. The message names the reference and what to fix."""


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


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _import(module: str, attr: str, ref: str) -> tuple[Any, Any]:
    """(module object, the attribute) of ``module:attr``."""
    try:
        mod = importlib.import_module(module)
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
                  sha256=_sha256(file), sys_path=str(Path(file).resolve().parents[depth]))


def load(ref: PluginRef, group: str) -> Loaded:
    """Import the object ``ref`` names: its entry point in ``group``, or its ``module:attr``.

    Raises:
        PluginError: no such entry point (the message lists the installed ones), the module is not
            found or raises as it is imported, the attribute is missing, or the module has no file.
    """
    text = str(ref)
    if ref.is_import_path:
        module, _, attr = ref.target.partition(":")
        mod, obj = _import(module, attr, text)
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


__all__ = ["NOT_INSTALLED", "Loaded", "Origin", "PluginError", "PluginHook", "PluginRef", "add_sys_paths",
           "entry_point_names", "format_ref", "load", "normalize_ref", "parse_ref", "ref_slug", "split_refs"]
