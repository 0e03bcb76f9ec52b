"""``testbed sweep``'s seeds: ``--seed-base`` reaches the last seed, and a sweep of more cells than it
runs is refused before it plans them.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from triangle_inputs import triangle

from testbed.cli.main import main

REPO = Path(__file__).resolve().parent.parent
TRIANGLE = REPO / "experiments" / "triangle.yaml"
_COMMANDS = {"run": ["run", "e.yaml"], "simulate": ["simulate", "e.yaml"],
             "sweep": ["sweep", "e.yaml", "--out", "o"], "evaluate": ["evaluate", "aset.yaml"]}


@pytest.mark.parametrize(("seeds", "base", "code"), [(2, 2**32 - 2, 0), (1, 2**32 - 1, 0), (2, 2**32 - 1, 2)])
def test_sweep_seed_base_reaches_the_last_seed(tmp_path, capsys, seeds, base, code):
    """``--seeds 2 --seed-base 4294967294`` (seeds ..94, ..95) reaches the last seed, 2**32 - 1."""
    out = tmp_path / "sw"
    args = ["sweep", str(triangle(tmp_path)), "--seeds", str(seeds), "--seed-base", str(base), "--policies",
            "closest", "--duration", "1s", "--out", str(out), "--jobs", "1"]
    assert main(args) == code
    got = capsys.readouterr()
    said = " ".join((got.out + got.err).split())
    if code:
        assert f"seeds {base} .. {base + seeds - 1} are not all in 0 .. 4294967295" in said


def test_a_sweep_of_more_cells_than_it_runs_is_refused_before_it_plans_them(tmp_path, capsys):
    """``--seeds 100000000`` is refused at once, before any cell is planned (planning them all in
    memory would take tens of GiB)."""
    out = tmp_path / "sw"
    t = time.monotonic()
    code = main(["sweep", str(triangle(tmp_path)), "--seeds", "100000000", "--policies", "closest,round_robin",
                 "--duration", "1s", "--out", str(out)])
    said = " ".join(capsys.readouterr().out.split())
    assert code == 2 and time.monotonic() - t < 30 and not out.exists()
    assert ("--seeds 100000000: 1 experiment(s) x 2 policies x 100000000 seeds = 200000000 cells, more than the "
            "100000 a sweep runs; lower --seeds") in said
