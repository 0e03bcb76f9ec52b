"""Building blocks of every YAML schema of the testbed (experiments, topologies, server and
capture settings): strict pydantic models, strict YAML reading and the unit rule of
:mod:`testbed.spec.units`.

A quantity carries its unit in the value (``deadline: 80ms``) or in the key (``deadline_ms: 80``),
never neither: :func:`unit_pair` turns the first form into the second.

Nothing is guessed (README, "Experiment files"):

* :func:`load_yaml` refuses a mapping that gives the same key twice (YAML itself would keep the
  last one silently); the error names the key and both lines. It reads ``1e12`` as the number it
  is (YAML 1.2; PyYAML's YAML 1.1 reads an exponent without a dot as text, which then failed as
  "carries its unit already"). An integer too long for Python to read (over
  ``sys.get_int_max_str_digits()``, 4300 digits) is a :class:`YamlValueError` naming its line
  (it was a PyYAML traceback).
* :class:`StrictModel` refuses a boolean where a number is expected (``workers: true`` is not 1)
  and anything but ``true``/``false`` where a boolean is expected (``rtt_check: 1`` or ``"yes"``
  is not true), and a string where an integer is expected (``workers: "2"``). Pydantic's lax mode
  would convert all of these silently.
"""

from __future__ import annotations

import re
import sys
import types
import typing
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, model_validator

from testbed.core.errors import InputError
from testbed.spec.units import UnitError

NAME_RE = r"^[a-z][a-z0-9]*$"


class YamlValueError(InputError):
    """YAML text that parses but holds something the testbed does not read (names the line)."""


class DuplicateKeyError(YamlValueError):
    """A YAML mapping gives the same key twice; the message names the key and both lines."""


class NumberTooLongError(YamlValueError):
    """An integer with more digits than Python reads (``sys.get_int_max_str_digits()``)."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses duplicate keys in a mapping (merge keys ``<<`` excepted:
    overriding a merged key is what they are for)."""

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, int] = {}
        for key_node, _value in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.get(key)
            except TypeError:  # unhashable key: the base constructor reports it
                continue
            line = key_node.start_mark.line + 1
            if first is not None:
                raise DuplicateKeyError(f"key {key!r} appears twice in the same mapping, at line {first} and at "
                                        f"line {line}; YAML would keep only the last one silently: remove one")
            seen[key] = line
        return super().construct_mapping(node, deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
                                 lambda loader, node: loader.construct_mapping(node))


def _construct_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    """PyYAML's integer, or :class:`NumberTooLongError` for one Python refuses to read (its
    ``int()`` raises ValueError past ``sys.get_int_max_str_digits()`` digits)."""
    try:
        return yaml.constructor.SafeConstructor.construct_yaml_int(loader, node)
    except ValueError:
        digits = sum(ch.isdigit() for ch in str(node.value))
        raise NumberTooLongError(f"line {node.start_mark.line + 1}: an integer of {digits} digits, over the "
                                 f"{sys.get_int_max_str_digits()} digits Python reads, and far over every bound of "
                                 f"the testbed; write a smaller number") from None


_UniqueKeyLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)
#: YAML 1.2's exponent floats without a dot (``1e12``, ``-2E-3``): YAML 1.1 (PyYAML) resolves them
#: to strings. PyYAML's own float forms (``1.0e+12``, ``.5``) keep their resolver.
_UniqueKeyLoader.add_implicit_resolver("tag:yaml.org,2002:float",
                                       re.compile(r"^[-+]?[0-9]+(?:\.[0-9]*)?[eE][-+]?[0-9]+$"),
                                       list("-+0123456789"))


def load_yaml(text: str) -> Any:
    """Parse YAML like ``yaml.safe_load``, refusing duplicate keys.

    Raises:
        DuplicateKeyError: a mapping repeats a key (names it and both lines).
        NumberTooLongError: an integer too long to read (names its line).
        yaml.YAMLError: the text is not YAML.
    """
    return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass


def unit_pair(data: Any, key: str, parse, suffix: str) -> Any:
    """Accept ``key: "<num><unit>"`` or ``key_<suffix>: <num>``; store under ``key_<suffix>``."""
    if not isinstance(data, dict):
        return data
    if key in data and f"{key}_{suffix}" in data:
        raise ValueError(f"give either '{key}' or '{key}_{suffix}', not both")
    if key in data:
        data = dict(data)
        try:
            data[f"{key}_{suffix}"] = parse(data.pop(key), item=key)
        except UnitError as exc:
            raise ValueError(str(exc)) from None
    return data


def number_only(v: Any) -> Any:
    """A number as it is: refuses a boolean, and a string (the unit is in the key; a number given
    as a quoted string is named as such)."""
    if isinstance(v, bool):
        raise ValueError(f"{v!r} is a boolean; give a number")
    if isinstance(v, str):
        try:
            float(v)
        except ValueError:
            raise ValueError(f"{v!r}: this key carries its unit already; give a plain number") from None
        raise ValueError(f"{v!r} is a string, not a number; write it without quotes")
    return v


Num = Annotated[float, BeforeValidator(number_only)]


def _leaf_types(annotation: Any) -> set[Any]:
    """The plain types an annotation admits at its top level (``int | None`` -> {int, NoneType};
    ``Annotated[float, ...]`` -> {float}); containers and models count as themselves."""
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return _leaf_types(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        out: set[Any] = set()
        for a in typing.get_args(annotation):
            out |= _leaf_types(a)
        return out
    if origin is typing.Literal:
        return {type(a) for a in typing.get_args(annotation)}
    return {origin or annotation}


def _kind_error(key: str, value: Any, admits: set[Any]) -> str | None:
    """Why ``value`` does not fit a field admitting ``admits`` without a silent conversion."""
    if Any in admits or object in admits:
        return None
    if isinstance(value, bool):
        if bool not in admits and admits & {int, float}:
            return f"{key}: got the boolean {str(value).lower()} where a number is expected"
        return None
    if admits <= {bool, type(None)} and bool in admits and value is not None:
        return f"{key}: expected true or false, got {value!r}"
    if isinstance(value, str) and int in admits and not admits & {str, float}:
        return f"{key}: expected an integer, got the string {value!r}"
    return None


class StrictModel(BaseModel):
    """Unknown keys are errors, values are frozen, numbers finite; booleans, numbers and integers
    are never converted into one another (module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _no_silent_conversions(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        for name, field in cls.model_fields.items():
            for key in (name, field.alias):
                if key is not None and key in data:
                    msg = _kind_error(key, data[key], _leaf_types(field.annotation))
                    if msg:
                        raise ValueError(msg)
        return data


__all__ = ["NAME_RE", "DuplicateKeyError", "Num", "NumberTooLongError", "StrictModel", "YamlValueError", "load_yaml",
           "number_only", "unit_pair"]
