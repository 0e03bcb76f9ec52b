"""The house's layers hold: the import-linter contract (.importlinter) is kept, and no cycle or import
against the layers hides in an import inside a function (benchmarks/layers.py counts those)."""

import subprocess
import sys
from pathlib import Path

from bench_modules import load_benchmark

REPO = Path(__file__).resolve().parent.parent


def _layers():
    return load_benchmark("layers", "layers_bench")


def test_the_import_contract_is_kept():
    r = subprocess.run([str(Path(sys.executable).parent / "lint-imports"), "--no-cache"], cwd=REPO,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "0 broken" in r.stdout


def test_no_cycle_and_no_import_against_the_layers_even_inside_functions():
    m = _layers().measure(None)
    assert m["modules"] > 50 and m["top-level modules"] == 0
    assert m["against the layers"] == []
    assert m["cycles"] == []
    # the one import kept inside functions: the DQN, which imports TensorFlow
    assert {a.split(" -> ")[1] for a in m["in functions"]} <= {"testbed.aset.dqn"}, m["in functions"]


def test_the_count_sees_an_import_against_the_layers(tmp_path, monkeypatch):
    """The counter is not blind: a spec module importing the simulator is one import against the
    layers, and an import each way between two modules is a cycle."""
    layers = _layers()
    files = {"testbed/spec/x.py": "def f():\n    from testbed.sim import y\n",
             "testbed/sim/y.py": "import testbed.spec.x\n"}
    monkeypatch.setattr(layers, "sources", lambda rev: files)
    m = layers.measure(None)
    assert m["against the layers"] == ["testbed.spec.x -> testbed.sim.y"]
    assert m["cycles"] == [["testbed.sim.y", "testbed.spec.x"]]
    assert m["in functions"] == ["testbed.spec.x -> testbed.sim.y"]
