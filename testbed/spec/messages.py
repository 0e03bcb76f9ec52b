"""What a validation error says: the one place that turns pydantic's errors of an input file
(experiment, topology, ASET config) into messages that point at the fix.

:func:`explain` takes one pydantic error and the model class of the whole file, and returns the
message line :func:`testbed.spec.experiment.format_validation_error` prints after the location:

==============================  ===============================================================
pydantic error                  what the message adds
==============================  ===============================================================
``extra_forbidden``             ``unknown key`` + the nearest keys of that mapping (``did you
(an unknown key)                mean 'seed'?``, unit forms included: ``deadline`` and
                                ``deadline_ms``), or where the key belongs when it is a key of
                                another section (``'clusters' is a key of the top level, not of
                                'topology'``), else the keys the mapping takes
``missing``                     both forms of a key with a unit (``deadline: 100ms`` or
                                ``deadline_ms: 100``)
a string for a number           what the key's unit is and the number to write: ``duration_s is
(``... carries its unit``,      in seconds: write 'duration_s: 600' or 'duration: 600s'``
``float_parsing``)
``literal_error`` (a choice)    the value given and the nearest choice
``string_pattern_mismatch``     for names (``[a-z][a-z0-9]*``): the rule and the name rewritten
                                by it
a number out of its bound       the value given
a key with another unit         the quantity's key and the number converted: ``deadline_s: 0.06``
(``deadline_s``)                -> ``write 'deadline_ms: 60' or 'deadline: 0.06s'``
``list_type`` (a value)         the list to write: ``models: [digits_small]``
``model_type`` (a value where   the mapping to write: ``topology: {source: topohub:...}``
a section belongs)
a union's branches              one line: ``Input should be a valid list or 'all'; got 'sea'``
(``sources.list[str]``, ...)    (:func:`merged`)
==============================  ===============================================================

The model tree is walked by the error's location (``clusters.0.queue_limt``: the experiment's
``clusters`` field, a list of :class:`~testbed.spec.experiment.ClusterSpec`), so the keys named
are the ones the schema takes, never a list written by hand. Which keys have a unit form
(``deadline`` for ``deadline_ms``) is read from each model's ``unit_keys`` (:func:`unit_forms`).
"""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Iterator
from typing import Annotated, Any

from pydantic import BaseModel

from testbed.core.util import did_you_mean
from testbed.spec.schema import StrictModel
from testbed.spec.units import key_unit, unit_key_hint

#: pydantic error types of a number outside a Field bound (``ge``, ``gt``, ``le``, ``lt``).
BOUND_ERRORS = frozenset({"greater_than", "greater_than_equal", "less_than", "less_than_equal"})
#: The most keys listed when none is close to an unknown one.
_MAX_LISTED = 40


def _models_in(annotation: Any) -> Iterator[type[BaseModel]]:
    """The pydantic models an annotation holds at any depth of Optional, Union, list, dict, Annotated."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
        return
    origin = typing.get_origin(annotation)
    if origin is None:
        return
    args = typing.get_args(annotation)
    if origin is Annotated:
        args = args[:1]
    elif origin is dict:
        args = args[1:]
    elif origin not in (list, tuple, set, frozenset, typing.Union, types.UnionType):
        return
    for a in args:
        yield from _models_in(a)


def model_at(root: type[BaseModel], loc: tuple[int | str, ...]) -> type[BaseModel] | None:
    """The model whose keys apply at location ``loc`` of a ``root`` document (list indexes and
    dict keys are stepped over), or None when the location leaves the model tree."""
    cls: type[BaseModel] | None = root
    for part in loc:
        if cls is None:
            return None
        if isinstance(part, int):
            continue
        field = cls.model_fields.get(part) or next(
            (f for f in cls.model_fields.values() if f.alias == part), None)
        if field is None:  # a dict key (e.g. a node name under coordinates): stay in the value's model
            continue
        cls = next(_models_in(field.annotation), None)
    return cls


def unit_forms(cls: type[BaseModel]) -> dict[str, str]:
    """The unit form of each key with a unit that ``cls`` reads (``{"deadline": "deadline_ms"}``), from
    its :attr:`~testbed.spec.schema.StrictModel.unit_keys`."""
    return {key: f"{key}_{suffix}" for key, _parse, suffix in getattr(cls, "unit_keys", ())}


def keys_of(cls: type[BaseModel]) -> list[str]:
    """The keys a mapping of ``cls`` takes: its fields (by alias where one is set) and their unit forms."""
    keys = [f.alias or name for name, f in cls.model_fields.items()]
    return keys + list(unit_forms(cls))


def _tree(root: type[BaseModel]) -> Iterator[tuple[str, type[BaseModel]]]:
    """(path, model) of every model of ``root``'s tree (``""`` for the root; ``clusters``,
    ``clusters.server``, ...), each model once."""
    seen: set[type[BaseModel]] = set()
    pending: list[tuple[str, type[BaseModel]]] = [("", root)]
    while pending:
        path, cls = pending.pop(0)
        if cls in seen:
            continue
        seen.add(cls)
        yield path, cls
        for name, field in cls.model_fields.items():
            for sub in _models_in(field.annotation):
                pending.append((f"{path}.{name}" if path else name, sub))


def homes_of(root: type[BaseModel], key: str) -> list[str]:
    """Where ``key`` is a key in ``root``'s tree: ``["topology", "cloud"]``, ``"the top level"`` for the root."""
    return [path or "the top level" for path, cls in _tree(root) if key in keys_of(cls)]


def _other_unit(here: type[BaseModel], key: str, value: Any) -> str:
    """For ``deadline_s: 0.06`` where the model counts ``deadline_ms``: ``this quantity's key is
    'deadline_ms' (milliseconds): write 'deadline_ms: 60' or 'deadline: 0.06s'``; "" otherwise."""
    ku = key_unit(key)
    if ku is None:
        return ""
    stem = key[: -len(ku[0])]
    field = unit_forms(here).get(stem)
    if field is None:
        return ""
    want = key_unit(field)
    ratio = {("_s", "_ms"): 1e3, ("_ms", "_s"): 1e-3}.get((ku[0], want[0]) if want else ("", ""))
    text = f"unknown key: this quantity's key is {field!r} ({want[1] if want else ''})"
    if ratio is None or isinstance(value, bool) or not isinstance(value, int | float):
        return text
    unit = "s" if ku[0] == "_s" else "ms"
    return f"{text}: write '{field}: {value * ratio:g}' or '{stem}: {value:g}{unit}'"


def _unknown_key(root: type[BaseModel] | None, loc: tuple[int | str, ...], value: Any = None) -> str:
    key = str(loc[-1])
    here = model_at(root, loc[:-1]) if root is not None else None
    if here is None:
        return "unknown key"
    other_unit = _other_unit(here, key, value)
    if other_unit:
        return other_unit
    keys = keys_of(here)
    close = did_you_mean(key, keys)
    if close:
        return f"unknown key{close}"
    homes = homes_of(root, key) if root is not None else []
    where = ".".join(str(p) for p in loc[:-1] if not isinstance(p, int)) or "the top level"
    if homes:
        names = [h if h == "the top level" else repr(h) for h in homes]
        listed = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
        return (f"unknown key: {key!r} is a key of {listed}, not of "
                f"{where if where == 'the top level' else repr(where)}; move it there")
    listed = ", ".join(keys[:_MAX_LISTED]) + (" ..." if len(keys) > _MAX_LISTED else "")
    return f"unknown key; the keys here: {listed}"


def _missing(root: type[BaseModel] | None, loc: tuple[int | str, ...], msg: str) -> str:
    here = model_at(root, loc[:-1]) if root is not None and loc else None
    key = str(loc[-1]) if loc else ""
    if here is None:
        return msg
    stem = next((s for s, name in unit_forms(here).items() if name == key), None)
    if stem is None:
        return msg
    suffix = key[len(stem):]
    unit = {"_ms": "ms", "_s": "s", "_mbps": "Mbit/s"}[suffix]
    return f"{msg}: write '{stem}: <number>{unit}' or '{key}: <number>' (a number of {unit})"


def _choice(err: dict[str, Any]) -> str:
    msg = err["msg"]
    expected = re.findall(r"'([^']*)'", str((err.get("ctx") or {}).get("expected", "")))
    got = err.get("input")
    return f"{msg}; got {got!r}{did_you_mean(got, expected)}"


def _name_rule(err: dict[str, Any]) -> str:
    got = err.get("input")
    pattern = str((err.get("ctx") or {}).get("pattern", ""))
    if pattern != r"^[a-z][a-z0-9]*$" or not isinstance(got, str):
        return f"{err['msg']} (got {got!r})"
    fixed = re.sub(r"[^a-z0-9]", "", got.lower()).lstrip("0123456789")
    example = f", e.g. {fixed!r}" if fixed else ""
    return (f"{got!r} is not a name: a name is lower-case letters and digits, starting with a letter "
            f"({pattern}: it names a host and its network interfaces){example}")


def explain(err: dict[str, Any], root: type[BaseModel] | None = None) -> str:
    """The message of one pydantic error (one of ``ValidationError.errors()``) of a document of
    model ``root`` (module docstring), without its location."""
    loc = tuple(err["loc"])
    msg = err["msg"].removeprefix("Value error, ")
    kind = err["type"]
    if kind == "extra_forbidden":
        return _unknown_key(root, loc, err.get("input"))
    if kind == "missing":
        return _missing(root, loc, msg)
    if kind in BOUND_ERRORS:  # pydantic states the bound; the value makes it an answer
        return f"{msg} (got {err['input']!r})"
    if kind == "literal_error":
        return _choice(err)
    if kind == "string_pattern_mismatch":
        return _name_rule(err)
    if loc and isinstance(err.get("input"), str) and ("carries its unit already" in msg
                                                      or kind in ("float_parsing", "int_parsing")):
        here = model_at(root, loc[:-1]) if root is not None else None
        hint = unit_key_hint(str(loc[-1]), err.get("input"), stem_form=here is not None
                             and str(loc[-1]) in unit_forms(here).values()) or _plain_number(str(loc[-1]), err["input"])
        return f"{msg}; {hint}" if hint else msg
    if kind == "list_type" and isinstance(err.get("input"), str | int | float) and loc:
        return f"{msg}; got {err['input']!r}: write a list, e.g. '{loc[-1]}: [{err['input']}]'"
    if kind == "model_type" and loc and not isinstance(err.get("input"), dict):
        return _mapping_expected(root, loc, msg, err.get("input"))
    return msg


def _plain_number(key: str, value: str) -> str:
    """``write 'cpu_cores: 0.25'`` for ``'0.25cores'``: the number a value starts with, or ""."""
    m = re.match(r"\s*(\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)", value)
    return f"write '{key}: {float(m[1]):g}' (a plain number)" if m else ""


def _mapping_expected(root: type[BaseModel] | None, loc: tuple[int | str, ...], msg: str, got: Any) -> str:
    """A section written as a value (``topology: topohub:...``): the mapping it should be."""
    here = model_at(root, loc) if root is not None else None
    if here is None:
        return msg
    required = [f.alias or n for n, f in here.model_fields.items() if f.is_required()]
    key = str(loc[-1]) if not isinstance(loc[-1], int) else "the item"
    if len(required) == 1 and isinstance(got, str | int | float):
        return (f"{msg}; got {got!r}: {key} is a mapping of its keys; write "
                f"'{key}: {{{required[0]}: {got}}}'")
    return f"{msg}; got {got!r}: {key} is a mapping of its keys ({', '.join(required) or 'all optional'} required)"


#: Location parts pydantic adds for the branch of a union (``list[str]``, ``literal['all']``, ``float``).
_BRANCH = re.compile(r".*\[.*\]|str|int|float|bool|none|dict|list|[A-Z]\w*")


def merged(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Pydantic's errors with the branches of a union merged: ``sources.list[str]: Input should be
    a valid list`` and ``sources.literal['all']: Input should be 'all'`` become one error at
    ``sources``: ``Input should be a valid list or 'all'``."""
    out: list[dict[str, Any]] = []
    seen: dict[tuple, dict[str, Any]] = {}
    for err in errors:
        loc = tuple(err["loc"])
        clean = tuple(p for p in loc if isinstance(p, int) or not _BRANCH.fullmatch(str(p)))
        if clean == loc:
            out.append(err)
            continue
        if clean in seen:
            first = seen[clean]
            first["msg"] = f"{first['msg']} or {err['msg'].removeprefix('Input should be ')}"
            continue
        err = {**err, "loc": clean, "msg": err["msg"], "type": "union"}
        seen[clean] = err
        out.append(err)
    for err in seen.values():
        err["msg"] += f"; got {err['input']!r}"
        if "a valid list" in err["msg"] and isinstance(err["input"], str) and err["loc"]:
            err["msg"] += f": for a list write '{err['loc'][-1]}: [{err['input']}]'"
    return out


def model_named(title: str) -> type[BaseModel] | None:
    """The strict model (a :class:`testbed.spec.schema.StrictModel` subclass) whose name is
    ``title`` (a ValidationError's ``title``), when exactly one has it."""
    found: list[type[BaseModel]] = []
    pending = list(StrictModel.__subclasses__())
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        if cls.__name__ == title and cls not in found:
            found.append(cls)
    return found[0] if len(found) == 1 else None


__all__ = ["BOUND_ERRORS", "explain", "merged", "homes_of", "keys_of", "model_at", "model_named", "unit_forms"]
