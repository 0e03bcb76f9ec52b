"""Run ``ryu-manager`` with a compatibility shim for the installed eventlet.

Ryu 4.34's ``ryu.app.wsgi`` does ``from eventlet.wsgi import ALREADY_HANDLED`` at import
time; the eventlet installed here (0.33.3) no longer defines that name, so the stock
``ryu-manager`` script dies with ``ImportError`` before parsing its arguments. Ryu only
uses the value as an opaque sentinel returned from WebSocket handlers, so any unique
object works.

The controller app validates its config with :class:`testbed.plan.boundaries.ControllerConfig`, and
``testbed.plan.boundaries`` imports ``testbed.model.dispatch``, which imports numpy (0.26 s of CPU here,
a quarter of the controller's start, which the network bring-up waits for). The controller never
calls numpy, so :func:`_lazy_imports` makes ``import numpy`` in this process lazy: the module
runs at its first attribute access, if ever.

Usage (accepts exactly ``ryu-manager``'s arguments)::

    python -m testbed.sdn.launcher --observe-links --wsapi-host 127.0.0.1 ... APP.py
"""

from __future__ import annotations

import importlib.util
import sys

#: Modules this process imports through the controller's config validation but never uses.
LAZY_MODULES = ("numpy",)


def _lazy_imports(names: tuple[str, ...] = LAZY_MODULES) -> None:
    """Make ``import NAME`` cheap for each of ``names`` (module doc): ``sys.modules`` gets a
    stand-in module (PEP 562 ``__getattr__``) that imports the real one at its first attribute
    access and takes on its contents, while ``sys.modules`` then holds the real one. (A
    :class:`importlib.util.LazyLoader` module does not help: on Python 3.11 the ``import``
    statement reads its ``__spec__``, which loads it.) A name already imported or not installed
    is left alone."""
    import types

    for name in names:
        if name in sys.modules:
            continue
        spec = importlib.util.find_spec(name)
        if spec is None:
            continue
        stub = types.ModuleType(name, f"stand-in for {name}, imported at first use (testbed.sdn.launcher)")
        stub.__spec__ = spec

        def load(attr: str, name: str = name, stub: types.ModuleType = stub):
            if sys.modules.get(name) is stub:
                del sys.modules[name]
            real = importlib.import_module(name)
            stub.__dict__.pop("__getattr__", None)
            stub.__dict__.update(real.__dict__)  # the stand-in now reads as the real module
            return getattr(real, attr)

        stub.__getattr__ = load
        sys.modules[name] = stub


def _patch_eventlet() -> None:
    """Define ``eventlet.wsgi.ALREADY_HANDLED`` if this eventlet lacks it (idempotent)."""
    import eventlet.wsgi

    if not hasattr(eventlet.wsgi, "ALREADY_HANDLED"):
        eventlet.wsgi.ALREADY_HANDLED = object()


def main(argv: list[str] | None = None) -> None:
    """Lazy numpy, patch eventlet, then run ``ryu.cmd.manager.main()``.

    Args:
        argv: ryu-manager arguments (without the program name); ``None`` means
            ``sys.argv[1:]``.

    Raises:
        SystemExit: as ``ryu-manager`` does (bad arguments, ``--version``, ...).
    """
    _lazy_imports()
    _patch_eventlet()
    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    from ryu.cmd.manager import main as ryu_main

    ryu_main()


if __name__ == "__main__":
    main()
