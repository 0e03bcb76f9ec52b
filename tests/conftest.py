"""Fixtures shared by several test modules (pytest finds them here for every module of tests/)."""

from __future__ import annotations

import importlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "policy_plugin"


@pytest.fixture(scope="session")
def example_installed(tmp_path_factory) -> Path:
    """``examples/policy_plugin`` installed with pip into a temporary folder on ``sys.path``: its
    entry point ``slack`` of group ``testbed.policies`` is then visible to importlib.metadata. One
    install for the session: a resolved plug-in is kept for the process (tests/test_examples.py
    uses it too)."""
    target = tmp_path_factory.mktemp("site")
    copy = tmp_path_factory.mktemp("example") / "policy_plugin"  # the build's files land beside the copy
    shutil.copytree(EXAMPLE, copy, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps", "--no-index",
                    "--quiet", "--target", str(target), str(copy)], check=True, cwd=copy)
    sys.path.insert(0, str(target))
    importlib.invalidate_caches()
    yield target
    sys.path.remove(str(target))




def pytest_runtest_setup(item: pytest.Item) -> None:
    """Emulation tests need the machine to themselves (they time real processes): on a
    pytest-xdist worker (``-n``) they would run beside other tests, so each one fails at once,
    before its emulation, and says how to run them (``tests/run``)."""
    if hasattr(item.config, "workerinput") and item.get_closest_marker("emulation"):
        pytest.fail("an emulation test cannot run under pytest-xdist (-n): it times real processes and needs the "
                    "machine to itself. Run tests/run (the unit tests on every CPU, then the emulation tests one "
                    "at a time), or add -m 'not emulation'", pytrace=False)
