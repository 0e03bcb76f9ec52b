"""The ASET emulation benchmark (``benchmarks/aset_emulation.py``): its gap table compares the engines
over the same seeds and says which were left out, and simulated records are reused only when made
from the same inputs. Fast: no emulation.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from triangle_inputs import scenario

REPO = Path(__file__).resolve().parent.parent
TRIANGLE = REPO / "experiments" / "triangle.yaml"


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import aset_emulation

    yield aset_emulation
    sys.modules.pop("aset_emulation", None)


def test_the_gap_table_compares_the_engines_over_the_same_seeds_and_says_which_were_left_out(bench, tmp_path):
    raw = [{"scenario": "sc", "policy": p, "seed": k, "run": None,
            "success_ratio": None if (p, k) == ("aset", 2) else 0.5 + 0.1 * k, "simulated": 0.9 if k == 2 else 0.6,
            "machine_busy": 0.6 + 0.1 * k if p == "min_latency" else None}
           for p in ("aset", "min_latency") for k in (1, 2, 3)]
    rows = {line.split("|")[2].strip(): [c.strip() for c in line.split("|")[3:-1]]
            for line in bench.tables(raw, "min_latency", tmp_path).splitlines()[2:]}
    assert rows["aset"] == ["1, 3 (left out, a figure missing: 2)", "70.00 ± 127.06", "60.00 ± 0.00", "+10.00", "-"]
    assert rows["min_latency"][4] == "70-90"  # the machine's CPUs busy over the emulated loads, by seed
    assert rows["min_latency"][0] == "1, 2, 3"
    assert rows["aset - min_latency"][:3] == ["1, 3 (left out, a figure missing: 2)", "+0.00 ± 0.00", "+0.00 ± 0.00"]


def test_simulated_records_are_reused_only_when_made_from_the_same_inputs(bench, tmp_path, monkeypatch):
    import testbed.results.runs as runs

    calls = []

    def fake(plan, seed=None, policy=None, run_dir=None, quiet=False, **kw):
        calls.append(plan.experiment.workload[0].rate_qps)
        run_dir.mkdir(parents=True)
        (run_dir / "summary.json").write_text("{}")
        return run_dir, {}

    monkeypatch.setattr(runs, "run_simulation", fake)
    scen = scenario(tmp_path / "exp", "sc")
    stale = tmp_path / "sim" / "sc-minlatency-s1-sim"  # a record of the old naming: another scenario's
    stale.mkdir(parents=True)
    for f in ("summary.json", "records.parquet"):
        (stale / f).write_text("{}")
    first = bench.simulate_records(scen, 1, "min_latency", tmp_path / "sim")
    assert first != stale and calls == [4]
    assert bench.simulate_records(scen, 1, "min_latency", tmp_path / "sim") == first and calls == [4]
    scen.write_text(scen.read_text().replace("rate_qps: 4", "rate_qps: 5"))  # same file name, other scenario
    second = bench.simulate_records(scen, 1, "min_latency", tmp_path / "sim")
    assert second != first and calls == [4, 5]
