"""Building blocks of every YAML schema of the testbed (experiments, topologies, server and
capture settings): strict pydantic models, strict YAML reading and the unit rule of
:mod:`testbed.spec.units`.

A quantity carries its unit in the value (``deadline: 80ms``) or in the key (``deadline_ms: 80``),
never neither: :func:`unit_pair` turns the first form into the second.

Nothing is guessed (docs/extending.md, "Experiment files"):

* :func:`load_yaml` refuses a mapping that gives the same key twice (YAML itself would keep the
  last one silently); the error names the key and both lines. It reads ``1e12`` as the number it
  is (YAML 1.2; PyYAML's YAML 1.1 reads an exponent without a dot as text, which then failed as
  "carries its unit already"). An integer too long for Python to read (over
  ``sys.get_int_max_str_digits()``, 4300 digits) is a :class:`YamlValueError` naming its line
  (it was a PyYAML traceback).
* :func:`load_yaml` reads nothing it cannot read safely: text over :data:`MAX_YAML_BYTES`, a
  document of more than :data:`MAX_YAML_NODES` nodes once its aliases are expanded, nesting deeper
  than :data:`MAX_YAML_DEPTH` and an alias inside its own anchor (a loop) are each a
  :class:`YamlLimitError`, found before the document is built (a loop used to end in a
  ``RecursionError`` of the validation, a 50 MB file took minutes). YAML 1.1's boolean words
  ``yes``, ``no``, ``on``, ``off`` (any case) are a :class:`YamlValueError` naming the word and its
  line: YAML 1.2 reads them as strings, so a node ``NO`` became ``false`` and then node 0; write
  ``true`` / ``false`` for a boolean, or quote the word for a name. :func:`load_yaml_file` is the
  one reader of a YAML input file (experiments, topologies, ASET configs).
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
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, ClassVar

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, model_validator

from testbed.core.errors import InputError
from testbed.core.util import read_input_text
from testbed.spec.units import KEY_FORM_TAIL, UnitError, bare_number_hint, unit_key_hint

NAME_RE = r"^[a-z][a-z0-9]*$"


class YamlValueError(InputError):
    """YAML text that parses but holds something the testbed does not read (names the line)."""


class DuplicateKeyError(YamlValueError):
    """A YAML mapping gives the same key twice; the message names the key and both lines."""


class NumberTooLongError(YamlValueError):
    """An integer with more digits than Python reads (``sys.get_int_max_str_digits()``)."""


class YamlLimitError(YamlValueError):
    """A YAML text or document past a stated bound (size, nodes, depth) or an alias loop."""


#: The largest YAML input read, bytes (UTF-8): an experiment, topology or ASET config is a few kB
#: (a 200-node topology in our format is about 40 kB); the pure-Python parser reads about
#: 0.15-0.3 MB/s on the 2-core test machine, so the bound keeps a read under about 10 s.
MAX_YAML_BYTES = 2 * 1024 * 1024
#: The most nodes (scalars, sequences, mappings) a document may hold with its aliases expanded:
#: what validation walks. A 2 MiB file of short items holds about 500 000.
MAX_YAML_NODES = 500_000
#: The deepest nesting read (our schemas nest 5 levels); past it PyYAML's recursive composer and
#: the validation would end in a ``RecursionError``.
MAX_YAML_DEPTH = 64
#: YAML 1.1's boolean words that YAML 1.2 reads as strings (``true`` / ``false`` are booleans in both).
YAML11_BOOL_WORDS = frozenset({"yes", "no", "on", "off"})


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses duplicate keys in a mapping (merge keys ``<<`` excepted:
    overriding a merged key is what they are for) and YAML 1.1's boolean words; it keeps the names
    of the anchors of the document it composed (``anchor_names``: node id -> name) for the errors
    of :func:`_check_graph`."""

    def compose_document(self):
        self.get_event()  # DocumentStartEvent
        node = self.compose_node(None, None)
        self.get_event()  # DocumentEndEvent
        self.anchor_names = {id(n): name for name, n in self.anchors.items()}
        self.anchors = {}
        return node

    depth = 0

    def compose_node(self, parent, index):
        if self.depth >= MAX_YAML_DEPTH:
            mark = self.peek_event().start_mark
            raise YamlLimitError(f"line {mark.line + 1}: nested more than {MAX_YAML_DEPTH} levels deep, past what "
                                 f"the testbed reads")
        self.depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

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


def _construct_bool(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> bool:
    """``true`` / ``false`` (any case), or :class:`YamlValueError` for YAML 1.1's other words
    (:data:`YAML11_BOOL_WORDS`), naming the word and its line."""
    if str(node.value).lower() in YAML11_BOOL_WORDS:
        raise YamlValueError(f"line {node.start_mark.line + 1}: {node.value!r} is a boolean in YAML 1.1 and a "
                             f"string in YAML 1.2, so the testbed refuses it unquoted: write true or false for a "
                             f"boolean, or quote it (\"{node.value}\") for a name or an id")
    return yaml.constructor.SafeConstructor.construct_yaml_bool(loader, node)


_UniqueKeyLoader.add_constructor("tag:yaml.org,2002:bool", _construct_bool)


def _check_graph(root: yaml.Node, anchors: dict[int, str]) -> None:
    """Refuse a composed document whose aliases loop or which expands past :data:`MAX_YAML_NODES`
    nodes. Each distinct node is visited once (its expanded size memoised), so the check is linear
    in the text, however many times its aliases repeat it.

    Raises:
        YamlLimitError: an alias inside its own anchor (names the anchor and line), or too many nodes.
    """
    size: dict[int, int] = {}
    on_path: set[int] = set()

    def count(node: yaml.Node) -> int:
        key = id(node)
        if key in size:
            return size[key]
        if key in on_path:
            name = anchors.get(key, "?")
            raise YamlLimitError(f"line {node.start_mark.line + 1}: the anchor &{name} contains an alias to itself "
                                 f"(*{name}), a loop: a document cannot hold itself")
        on_path.add(key)
        n = 1
        if isinstance(node, yaml.SequenceNode):
            n += sum(count(child) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            n += sum(count(k) + count(v) for k, v in node.value)
        on_path.discard(key)
        if n > MAX_YAML_NODES:
            raise YamlLimitError(f"line {node.start_mark.line + 1}: the document holds more than {MAX_YAML_NODES} "
                                 f"nodes once its aliases are expanded, past what the testbed reads")
        size[key] = n
        return n

    count(root)


def load_yaml(text: str) -> Any:
    """Parse YAML like ``yaml.safe_load``, refusing what it cannot read safely (module docstring).

    Raises:
        YamlLimitError: over :data:`MAX_YAML_BYTES`, :data:`MAX_YAML_NODES` nodes (aliases
            expanded) or :data:`MAX_YAML_DEPTH` levels, or an alias loop; found before the
            document is built.
        DuplicateKeyError: a mapping repeats a key (names it and both lines).
        NumberTooLongError: an integer too long to read (names its line).
        YamlValueError: a YAML 1.1 boolean word (``yes``, ``no``, ``on``, ``off``) unquoted.
        yaml.YAMLError: the text is not YAML.
    """
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_YAML_BYTES:
        raise YamlLimitError(f"{size} bytes of YAML, more than the {MAX_YAML_BYTES} bytes the testbed reads "
                             f"(an experiment, topology or ASET config is a few kB)")
    loader = _UniqueKeyLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_graph(node, loader.anchor_names)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def load_yaml_file(path: str | Path) -> Any:
    """The YAML document of a user's input file: :func:`testbed.core.util.read_input_text` with
    :data:`MAX_YAML_BYTES` as its bound (refused before the file is read), then :func:`load_yaml`.

    Raises:
        InputFileError: missing, unreadable, not a regular file, over :data:`MAX_YAML_BYTES`, not
            UTF-8 (names the file).
        YamlValueError: as :func:`load_yaml` (without the file's name: the caller adds it).
        yaml.YAMLError: the text is not YAML.
    """
    return load_yaml(read_input_text(path, max_bytes=MAX_YAML_BYTES))


#: What the most common YAML syntax errors of a hand edit mean, by PyYAML's problem text.
_YAML_ADVICE = (
    ("found character '\\t'", "YAML indents with spaces, never tabs: replace the tab with spaces"),
    ("expected ',' or ']', but got ':'", "an unclosed [...] (its ']' missing before the next key), or a ':' "
                                          "inside one of its items: close it, or quote the item"),
    ("but got ':'", "a ':' inside a value of a {...}: quote the value (site: \"Seattle: WA\")"),
    ("mapping values are not allowed here", "a ':' followed by a space inside a value, or a key indented "
                                             "under a value: quote the value (site: \"A: B\") or fix the indentation"),
    ("expected <block end>, but found '-'", "a list item ('- ') where a key was expected: indent a list's items "
                                             "under the key that holds them (clusters:), all by the same amount"),
    ("expected <block end>, but found '<block sequence start>'",
     "a list item ('- ') at another indentation than the items before it: indent every item of a list alike"),
    ("expected <block end>, but found '<block mapping start>'",
     "a key indented deeper than its neighbours: indent the keys of one mapping alike"),
    ("could not find expected ':'", "a line that is neither 'key: value' nor a list item: add the ':' or "
                                     "join it to the line above"),
    ("expected ',' or '}'", "an unclosed {...} or a ',' missing between its entries"),
    ("expected ',' or ']'", "an unclosed [...] or a ',' missing between its items"),
)


def describe_yaml_error(exc: yaml.YAMLError) -> str:
    """A YAML syntax error in one line: where (line and column of the problem), what PyYAML saw,
    and for the common hand-edit mistakes (tabs, a ':' in a value, a list or key at the wrong
    indentation, unclosed brackets) what to change."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None)
    if mark is None or problem is None:
        return f"not valid YAML: {exc}"
    context = getattr(exc, "context", None)
    text = f"{context}, {problem}" if context else str(problem)
    advice = next((a for key, a in _YAML_ADVICE if key in text), "")
    return (f"not valid YAML at line {mark.line + 1}, column {mark.column + 1}: {text}"
            + (f"; {advice}" if advice else ""))


#: A quantity's two forms: ``(key, parse, suffix)`` reads ``key: "<num><unit>"`` with ``parse`` into
#: ``key_<suffix>`` (:func:`unit_pair`).
UnitKey = tuple[str, Callable[..., float], str]


def unit_pair(data: Any, key: str, parse, suffix: str) -> Any:
    """Accept ``key: "<num><unit>"`` or ``key_<suffix>: <num>``; store under ``key_<suffix>``."""
    if not isinstance(data, dict):
        return data
    if key in data and f"{key}_{suffix}" in data:
        raise ValueError(f"give either '{key}' or '{key}_{suffix}', not both")
    if key in data:
        data = dict(data)
        value = data.pop(key)
        try:
            data[f"{key}_{suffix}"] = parse(value, item=key)
        except UnitError as exc:
            hint = bare_number_hint(key, suffix, value)
            raise ValueError(str(exc).removesuffix(KEY_FORM_TAIL) + hint if hint else str(exc)) from None
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
        if bool not in admits and str in admits:
            return (f"{key}: got the boolean {str(value).lower()} where a name, an id or a number is expected; "
                    f"quote it if it is a name")
        if bool not in admits and admits & {int, float}:
            return f"{key}: got the boolean {str(value).lower()} where a number is expected"
        return None
    if admits <= {bool, type(None)} and bool in admits and value is not None:
        return f"{key}: expected true or false, got {value!r}"
    if isinstance(value, str) and int in admits and not admits & {str, float}:
        hint = unit_key_hint(key, value)
        return f"{key}: expected an integer, got the string {value!r}" + (f"; {hint}" if hint else "")
    return None


class StrictModel(BaseModel):
    """Unknown keys are errors, values are frozen, numbers finite; booleans, numbers and integers
    are never converted into one another (module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    #: The quantities this model reads in either form, in the order they are read (:data:`UnitKey`).
    unit_keys: ClassVar[tuple[UnitKey, ...]] = ()

    @model_validator(mode="before")
    @classmethod
    def _no_silent_conversions(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        for key, parse, suffix in cls.unit_keys:
            data = unit_pair(data, key, parse, suffix)
        for name, field in cls.model_fields.items():
            for key in (name, field.alias):
                if key is not None and key in data:
                    msg = _kind_error(key, data[key], _leaf_types(field.annotation))
                    if msg:
                        raise ValueError(msg)
        return data


__all__ = ["MAX_YAML_BYTES", "MAX_YAML_DEPTH", "MAX_YAML_NODES", "NAME_RE", "DuplicateKeyError", "Num",
           "NumberTooLongError", "StrictModel", "UnitKey", "YamlLimitError", "YamlValueError", "describe_yaml_error",
           "load_yaml", "load_yaml_file", "number_only", "unit_pair"]
