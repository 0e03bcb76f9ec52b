"""Plug-in modules written for a test module (imported by the tests; pytest puts ``tests/`` on ``sys.path``)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path


def modules_on_path(tmp_path_factory, name: str, files: dict[str, str]) -> Iterator[Path]:
    """A fresh temporary folder ``name`` holding ``files`` (file name -> text), on ``sys.path`` until
    the generator is closed: the body of a module-scoped fixture (``yield from``)."""
    folder = tmp_path_factory.mktemp(name)
    for file, text in files.items():
        (folder / file).write_text(text)
    sys.path.insert(0, str(folder))
    importlib.invalidate_caches()
    yield folder
    sys.path.remove(str(folder))
