"""Loading a benchmark script (``benchmarks/<name>.py``) as a module in a test: the benchmarks are
scripts, not a package, so they are loaded by path."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parent.parent


def load_benchmark(name: str, module_name: str | None = None) -> ModuleType:
    """``benchmarks/<name>.py`` loaded as module ``module_name`` (default ``bench_<name>``).

    Raises:
        FileNotFoundError: no such benchmark.
    """
    spec = importlib.util.spec_from_file_location(module_name or f"bench_{name}", REPO / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
