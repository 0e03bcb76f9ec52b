"""A registry of named items: name -> entry, in registration order, with one error for an unknown name.

The testbed's extension points (policies, event kinds) are each one :class:`Registry`: an item is
added once, where it is defined, and every list, set and name check is derived from the registry
instead of being written out by hand. A registry is a read-only :class:`~collections.abc.Mapping`
(name -> entry, iterated in registration order); it is changed only through :meth:`Registry.add`,
:meth:`Registry.remove` and :meth:`Registry.temporarily` (for tests).

Views that stay current when an item is added or removed:

- :meth:`Registry.names_view`: the names in registration order, a :class:`NamesView` (a sequence that
  compares equal to the tuple of the same names);
- :meth:`Registry.subset`: the names whose entry satisfies a predicate, a :class:`SubsetView` (a set).

A registry built with a :class:`testbed.core.plugins.PluginHook` also resolves names it does not
hold: an entry-point name of the hook's group, ``package.module:callable``, or either with
parameters (:mod:`testbed.core.plugins`). :meth:`Registry.resolve` is the one place this happens:
a registered name is a dictionary look-up (the fast path); a plug-in is loaded, checked by the
hook's ``make`` and kept (:meth:`Registry.plugins`), once per process. Plug-ins are not part of the
registration order: :meth:`Registry.names`, the views, ``in`` and iteration are the registered
entries only.

Example::

    KINDS: Registry[Kind] = Registry("event kind")
    KINDS.add("link_down", Kind(...))
    KINDS.resolve("link_dwn", where="events[0].kind")
    # UnknownNameError: events[0].kind: unknown event kind 'link_dwn'; known: link_down (did you mean 'link_down'?)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence, Set
from contextlib import contextmanager
from typing import Generic, TypeVar, overload

from testbed.core.errors import InputError
from testbed.core.plugins import PluginError, PluginFault, PluginHook, entry_point_names, load, parse_ref
from testbed.core.util import did_you_mean

T = TypeVar("T")
#: What a look-up gives for a name that is not there (an entry may be any value, None included).
_MISSING = object()


class UnknownNameError(InputError):
    """A name that is not in a registry. ``name`` is the name asked for, ``known`` the registered names
    (in order), ``where`` the item that named it ("" when not given). The message reads
    ``[where: ]unknown <kind> 'name'; known: a, b[ (did you mean 'x'?)]``."""

    def __init__(self, message: str, name: str, known: tuple[str, ...], where: str = ""):
        super().__init__(message)
        self.name = name
        self.known = known
        self.where = where


class Registry(Mapping[str, T], Generic[T]):
    """Named entries of one kind (``kind``: the noun errors use, e.g. ``"policy"``), in registration
    order.

    Args:
        kind: what an entry is, for the messages ("policy", "event kind").
        plugins: how to resolve a name that is not registered (module docstring); None: it is an
            :class:`UnknownNameError`.
    """

    def __init__(self, kind: str, plugins: PluginHook[T] | None = None):
        self.kind = kind
        self._items: dict[str, T] = {}
        self._hook = plugins
        self._plugins: dict[str, T] = {}

    # -- Mapping ---------------------------------------------------------------------------
    def __getitem__(self, name: str) -> T:
        return self._items[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self._items)})"

    # -- changes ---------------------------------------------------------------------------
    def add(self, name: str, entry: T) -> T:
        """Register ``entry`` under ``name`` (appended to the order); returns ``entry``.

        Raises:
            ValueError: ``name`` is empty or already registered.
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"a {self.kind} needs a non-empty name, got {name!r}")
        if name in self._items:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._items[name] = entry
        return entry

    def remove(self, name: str) -> T:
        """Unregister ``name``; returns its entry.

        Raises:
            UnknownNameError: ``name`` is not registered.
        """
        self.resolve(name)
        return self._items.pop(name)

    @contextmanager
    def temporarily(self, name: str, entry: T) -> Iterator[T]:
        """``with registry.temporarily(name, entry):`` the entry is registered inside the block
        and removed after it (also on an error). For tests.

        Raises:
            ValueError: ``name`` is already registered.
        """
        self.add(name, entry)
        try:
            yield entry
        finally:
            self._items.pop(name, None)

    # -- look-ups --------------------------------------------------------------------------
    @property
    def names(self) -> tuple[str, ...]:
        """The registered names now, in registration order (a snapshot)."""
        return tuple(self._items)

    def unknown(self, name: object, where: str = "", extra: Sequence[str] = ()) -> UnknownNameError:
        """The error for ``name`` not being registered: names ``where`` (the item, e.g.
        ``sources.atl.policy``), the known names (plus ``extra`` ones the caller also accepts, and
        with a plug-in hook the installed entry points of its group) and a close match when there
        is one; else, with a plug-in hook, the forms a plug-in takes."""
        known = (*self._items, *extra, *(entry_point_names(self._hook.group) if self._hook is not None else ()))
        text = f"unknown {self.kind} {name!r}; known: {', '.join(known) or '(none)'}"
        hint = did_you_mean(name, known, n=1, cutoff=0.6)
        if hint:
            text += hint
        elif self._hook is not None:  # no likely typo: say what else a name may be
            text += (f"; or a plug-in: a name of entry-point group {self._hook.group!r} or "
                     f"package.module:callable")
        return UnknownNameError(f"{where}: {text}" if where else text, str(name), tuple(known), where)

    def resolve(self, name: object, where: str = "") -> T:
        """The entry registered as ``name``, or the plug-in ``name`` refers to (module docstring).

        Raises:
            UnknownNameError: ``name`` is not registered, nor (with a plug-in hook) an entry point of
                its group or a ``module:callable`` (the message as :meth:`unknown`, the entry points
                listed with the registered names).
            testbed.core.plugins.PluginError: the plug-in cannot be loaded or its hook refuses it: the
                message leads with ``where`` and names the plug-in and what to fix.
            testbed.core.plugins.PluginFault: the plug-in exited or hung as it was imported or
                checked (exit code 4), led by ``where``.
        """
        try:
            hit = self._items.get(name, _MISSING)  # type: ignore[arg-type]
            if hit is _MISSING:
                hit = self._plugins.get(name, _MISSING)  # type: ignore[arg-type]
        except TypeError:  # an unhashable name
            raise self.unknown(name, where) from None
        if hit is not _MISSING:
            return hit
        if self._hook is None or not isinstance(name, str):
            raise self.unknown(name, where)
        hit = self._plugins[name] = self._load(name, where)
        return hit

    def _load(self, name: str, where: str) -> T:
        """Load, check and wrap the plug-in ``name`` (:meth:`resolve`)."""
        lead = f"{where}: " if where else ""
        try:
            ref = parse_ref(name)
        except PluginError as exc:
            raise PluginError(f"{lead}{self.kind} {exc}") from None
        if ref.target in self._items:
            raise PluginError(f"{lead}built-in {self.kind} {ref.target!r} takes no parameters (given {name!r}); "
                              f"write {ref.target!r}")
        group = self._hook.group
        if not ref.is_import_path and ref.target not in entry_point_names(group):
            raise self.unknown(name, where)
        try:
            loaded = load(ref, group)
        except PluginError as exc:
            raise PluginError(f"{lead}{self.kind} {exc}") from None
        except PluginFault as exc:  # it exited or hung as it was imported: exit code 4, led by the item
            raise PluginFault(f"{lead}{self.kind} {exc}", exc.what, exc.tb) from exc.__cause__
        try:
            return self._hook.make(name, loaded)
        except PluginFault as exc:
            raise PluginFault(f"{lead}{exc}", exc.what, exc.tb) from exc.__cause__
        except (TypeError, ValueError) as exc:
            raise PluginError(f"{lead}{self.kind} {name!r} ({loaded.origin.import_path}, {loaded.origin.file}): "
                              f"{exc}") from None

    def set_plugins(self, hook: PluginHook[T]) -> None:
        """Resolve names this registry does not hold through ``hook`` from now on (module
        docstring): a layer above the registry's own installs how a plug-in is checked and wrapped
        (the policy registry of the pure model gets its hook from :mod:`testbed.plan.policy_plugins`).
        The plug-ins resolved before are dropped."""
        self._hook = hook
        self._plugins.clear()

    def plugins(self) -> dict[str, T]:
        """The plug-ins resolved in this process so far: reference -> entry, in resolution order."""
        return dict(self._plugins)

    def names_view(self) -> NamesView:
        """The names in registration order, kept current (see :class:`NamesView`)."""
        return NamesView(self)

    def subset(self, keep: Callable[[T], bool]) -> SubsetView:
        """The names whose entry satisfies ``keep``, kept current (see :class:`SubsetView`)."""
        return SubsetView(self, keep)


class NamesView(Sequence[str]):
    """A registry's names in registration order, read when used (an item added or removed later
    shows). Compares equal to a tuple, list or view of the same names; pickles as a tuple."""

    def __init__(self, registry: Registry):
        self._registry = registry

    @overload
    def __getitem__(self, i: int) -> str: ...

    @overload
    def __getitem__(self, i: slice) -> tuple[str, ...]: ...

    def __getitem__(self, i: int | slice) -> str | tuple[str, ...]:
        return self._registry.names[i]

    def __len__(self) -> int:
        return len(self._registry)

    def __iter__(self) -> Iterator[str]:
        return iter(self._registry.names)

    def __contains__(self, name: object) -> bool:
        return name in self._registry

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (tuple, list, NamesView)):
            return self._registry.names == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._registry.names)

    def __repr__(self) -> str:
        return repr(self._registry.names)

    def __reduce__(self) -> tuple:
        return tuple, (self._registry.names,)


class SubsetView(Set[str]):
    """The names of a registry whose entry satisfies a predicate, read when used. Compares equal to
    a set or frozenset of the same names; pickles as a frozenset."""

    def __init__(self, registry: Registry, keep: Callable):
        self._registry = registry
        self._keep = keep

    @classmethod
    def _from_iterable(cls, it) -> frozenset[str]:
        """The result of a set operation (``&``, ``|``, ``-``, ``^``) with a view: a frozenset."""
        return frozenset(it)

    def _now(self) -> tuple[str, ...]:
        return tuple(n for n, e in self._registry.items() if self._keep(e))

    def __contains__(self, name: object) -> bool:
        try:
            return name in self._registry and bool(self._keep(self._registry[name]))  # type: ignore[index]
        except TypeError:  # an unhashable name
            return False

    def __iter__(self) -> Iterator[str]:
        return iter(self._now())

    def __len__(self) -> int:
        return len(self._now())

    def __hash__(self) -> int:
        return self._hash()

    def __repr__(self) -> str:
        return f"{{{', '.join(map(repr, self._now()))}}}"

    def __reduce__(self) -> tuple:
        return frozenset, (self._now(),)


__all__ = ["NamesView", "Registry", "SubsetView", "UnknownNameError"]
