"""``testbed evaluate`` refuses bad input before any run, naming it (a reviewer's findings):
two scenarios of one name or one file listed twice, results folders that cannot be written, a
duration that expects no query or is not whole decision windows, a checkpoint cut short,
``--headroom --specialised``; and a seed on which no query was created never divides by zero.

Every check here runs before the first job: :func:`testbed.aset.evaluate._parallel` is replaced by
a function that fails the test if a job is started.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from testbed.aset import evaluate as ev_mod
from testbed.aset.config import load_aset_config
from testbed.cli import main
from testbed.errors import EXIT_INPUT

REPO = Path(__file__).resolve().parent.parent
TRIANGLE = REPO / "experiments" / "triangle.yaml"


def _scenario(tmp_path: Path, file: str = "triangle.yaml", **changes) -> Path:
    """A copy of the triangle (topology by absolute path) with ``changes`` to its top-level keys
    and ``rate_qps`` / ``deadline`` of its workload and application."""
    d = yaml.safe_load(TRIANGLE.read_text())
    d["topology"]["source"] = str(REPO / "topologies" / "triangle.yaml")
    if "rate_qps" in changes:
        d["workload"][0]["rate_qps"] = changes.pop("rate_qps")
    if "deadline" in changes:
        d["applications"][0]["deadline"] = changes.pop("deadline")
    d.update(changes)
    path = tmp_path / file
    path.write_text(yaml.safe_dump(d))
    return path


def _config(tmp_path: Path, scenarios: list[str], **evaluation):
    """aset-tiny with these evaluation scenarios, results under ``tmp_path / "ev"``."""
    cfg, base = load_aset_config(REPO / "experiments" / "aset-tiny.yaml")
    upd = {"scenarios": scenarios, "out_dir": str(tmp_path / "ev"), "duration_s": 3.0, **evaluation}
    return cfg.model_copy(update={"evaluation": cfg.evaluation.model_copy(update=upd)}), base


def _config_file(tmp_path: Path, scenarios: list[str], **evaluation) -> Path:
    """The same as a YAML file (absolute paths), for the command line."""
    d = yaml.safe_load((REPO / "experiments" / "aset-tiny.yaml").read_text())
    d["evaluation"].update({"scenarios": scenarios, "out_dir": str(tmp_path / "ev"), "duration": "3s", **evaluation})
    path = tmp_path / "cfg" / "aset.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(yaml.safe_dump(d))
    return path


@pytest.fixture
def no_jobs(monkeypatch):
    """Fail the test if evaluate starts a job (the checks must come first)."""
    def refuse(*_a, **_k):
        raise AssertionError("a job was started before the input was checked")
    monkeypatch.setattr(ev_mod, "_parallel", refuse)


def _headroom(cfg, base, **kw):
    return ev_mod.evaluate(cfg, base, headroom_only=True, workers=1, progress=False, **kw)


# ----------------------------------------------------------------------------- 4. a checkpoint cut short
def _export(path: Path) -> Path:
    from testbed.aset.config import ObservationSpec
    from testbed.aset.npolicy import export_policy
    from testbed.aset.observation import observation_size

    size = observation_size(1, 2, 2, 4, 2)
    rng = np.random.default_rng(0)
    ws = [rng.normal(size=(size, 8)), np.zeros(8), rng.normal(size=(8, 2)), np.zeros(2)]
    return export_policy(ws, path, obs_spec=ObservationSpec(), applications=["digits"], clusters=["edgeb", "edgec"],
                         policies=["closest", "cloud"], sources=["srca", "srcc"])


def test_a_cut_npz_or_json_is_a_value_error_naming_the_file(tmp_path):
    from testbed.aset.npolicy import NumpyPolicy

    npz = _export(tmp_path / "policy")
    NumpyPolicy(tmp_path / "policy")  # whole: it opens
    npz.write_bytes(npz.read_bytes()[:300])
    with pytest.raises(ValueError, match=rf"{npz} is not a readable numpy archive"):
        NumpyPolicy(tmp_path / "policy")
    _export(tmp_path / "policy")
    meta = tmp_path / "policy.json"
    meta.write_text(meta.read_text()[:29])
    with pytest.raises(ValueError, match=rf"{meta} is unreadable or not JSON"):
        NumpyPolicy(tmp_path / "policy")
    meta.write_text('{"format": "aset-policy-v3"}')
    with pytest.raises(ValueError, match=rf"{meta}: no layers, policies, observation"):
        NumpyPolicy(tmp_path / "policy")


def test_evaluate_and_the_bench_name_a_cut_checkpoint_without_a_traceback(tmp_path, capsys, no_jobs):
    from testbed.aset import bench

    npz = _export(tmp_path / "policy")
    npz.write_bytes(npz.read_bytes()[:300])
    path = _config_file(tmp_path, [str(_scenario(tmp_path))], checkpoint=str(tmp_path / "policy"))
    assert main(["evaluate", str(path)]) == EXIT_INPUT
    out = capsys.readouterr().out
    assert f"error: ASET checkpoint file {npz} is not a readable numpy archive" in out and "Traceback" not in out
    live = _scenario(tmp_path, "live.yaml", aset={"checkpoint": str(tmp_path / "policy"), "window": "500ms"})
    assert bench.main([str(tmp_path / "policy"), str(live), "10"]) == EXIT_INPUT
    assert str(npz) in capsys.readouterr().err


# ----------------------------------------------------------------------------- 3. no query met
def test_best_mix_leaves_out_a_seed_without_query_and_says_when_every_seed_has_none(monkeypatch):
    from testbed.aset import headroom
    from testbed.plan import plan_experiment

    plan = plan_experiment(TRIANGLE)
    counts = {1: (3, 4), 2: (0, 0)}
    monkeypatch.setattr(headroom, "static_ratio", lambda _p, seed, *_a: counts[seed])
    mix, value, _ = headroom.best_mix(plan, [1, 2], ["closest", "cloud"], "closest")
    assert value == 0.75 and mix == ["closest", "closest"]
    counts[1] = (0, 0)
    with pytest.raises(ValueError, match=r"triangle, seeds \[1, 2\]: no query .* undefined"):
        headroom.best_mix(plan, [1, 2], ["closest", "cloud"], "closest")

