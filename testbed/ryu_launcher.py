"""Run ``ryu-manager`` with a compatibility shim for the installed eventlet.

Ryu 4.34's ``ryu.app.wsgi`` does ``from eventlet.wsgi import ALREADY_HANDLED`` at import
time; the eventlet installed here (0.33.3) no longer defines that name, so the stock
``ryu-manager`` script dies with ``ImportError`` before parsing its arguments. Ryu only
uses the value as an opaque sentinel returned from WebSocket handlers, so any unique
object works.

Usage (accepts exactly ``ryu-manager``'s arguments)::

    python -m testbed.ryu_launcher --observe-links --wsapi-host 127.0.0.1 ... APP.py
"""

from __future__ import annotations

import sys


def _patch_eventlet() -> None:
    """Define ``eventlet.wsgi.ALREADY_HANDLED`` if this eventlet lacks it (idempotent)."""
    import eventlet.wsgi

    if not hasattr(eventlet.wsgi, "ALREADY_HANDLED"):
        eventlet.wsgi.ALREADY_HANDLED = object()


def main(argv: list[str] | None = None) -> None:
    """Patch eventlet, then run ``ryu.cmd.manager.main()``.

    Args:
        argv: ryu-manager arguments (without the program name); ``None`` means
            ``sys.argv[1:]``.

    Raises:
        SystemExit: as ``ryu-manager`` does (bad arguments, ``--version``, ...).
    """
    _patch_eventlet()
    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    from ryu.cmd.manager import main as ryu_main

    ryu_main()


if __name__ == "__main__":
    main()
