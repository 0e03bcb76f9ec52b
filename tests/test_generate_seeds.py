"""``testbed generate --seeds``: the count is bounded (:data:`testbed.cli.generate.MAX_SEEDS`) and
checked before anything is drawn; what is asked is said up front, with a progress bar."""

from __future__ import annotations

import time

import pytest

from testbed.cli.generate import MAX_SEEDS
from testbed.cli.main import main


@pytest.mark.parametrize("seeds, said", [
    ("1-100000000", f"100,000,000 seeds; at most {MAX_SEEDS:,} per command"),
    (f"0-{MAX_SEEDS}", f"{MAX_SEEDS + 1:,} seeds; at most"),
    ("9-3", "a range goes from the smaller seed to the larger"),
    ("x", "expected e.g. 1-20 or 1,4,9"),
])
def test_too_many_or_malformed_seeds_are_refused_at_once(seeds, said, tmp_path, capsys):
    t = time.monotonic()
    with pytest.raises(SystemExit) as exc:
        main(["generate", "--seeds", seeds, "--out", str(tmp_path / "gen")])
    assert exc.value.code == 2 and time.monotonic() - t < 10  # no list of 10^8 seeds built first
    assert said in capsys.readouterr().err
    assert not (tmp_path / "gen").exists()


def test_what_is_generated_is_said_up_front(tmp_path, capsys):
    assert main(["generate", "--seeds", "2,5", "--out", str(tmp_path / "gen")]) == 0
    out = capsys.readouterr().out
    assert out.index("generating 2 scenario(s) of split held_out") < out.index("wrote ")
    assert sorted(p.name for p in (tmp_path / "gen").iterdir()) == ["gen-heldout-2.yaml", "gen-heldout-5.yaml"]
