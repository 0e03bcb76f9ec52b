"""``testbed train``'s input checks (review of the ASET trainer): a new run starts from an emptied
seed folder, a run that cannot train is refused up front and one that trained nothing exports
nothing (exit 5), every output path, ``observation.window`` and the scenarios' load over the
effective episode are checked before any folder is made, and ``training.seeds: []`` is refused.
Simulator only; the runs that train are aset-tiny sized (seconds)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from testbed.cli.main import main

REPO = Path(__file__).resolve().parent.parent
TRIANGLE = REPO / "experiments" / "triangle.yaml"


def _scenario(folder: Path, name: str, rate: float) -> Path:
    """The triangle experiment renamed ``name`` with ``rate`` q/s per source, in ``folder``."""
    text = TRIANGLE.read_text().replace("../topologies/triangle.yaml", str(REPO / "topologies" / "triangle.yaml"))
    text = text.replace("name: triangle", f"name: {name}", 1).replace("rate_qps: 4", f"rate_qps: {rate}")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.yaml"
    path.write_text(text)
    return path


def _config(tmp_path: Path, rollout: bool = False, observation: dict | None = None, **training) -> Path:
    """aset-tiny with its scenario by absolute path, ``out_dir`` in ``tmp_path`` and ``training``
    keys replaced (``rollout``: ``training.method: rollout`` with a small data set)."""
    d = yaml.safe_load((REPO / "experiments" / "aset-tiny.yaml").read_text())
    d["training"].update({"scenarios": [str(TRIANGLE)], "out_dir": str(tmp_path / "runs")})
    d["observation"].update(observation or {})
    if rollout:
        d["agent"] = {"hidden": [8]}
        d["observation"].setdefault("plans", {"triangle": ["closest", "closest"]})
        d["training"] = {"method": "rollout", "scenarios": d["training"]["scenarios"], "episode": "2s",
                         "out_dir": d["training"]["out_dir"], "rollout": {"episodes_per_scenario": 2, "epochs": 1}}
    d["training"].update(training)
    d.pop("evaluation")
    path = tmp_path / "experiments" / "tiny.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(d))
    return path


def _error(capsys) -> str:
    out = " ".join(capsys.readouterr().out.split())
    assert "Traceback" not in out
    return out


# ------------------------------------------------------------------ 1: a new run, an emptied folder
def test_a_new_run_of_a_seed_starts_from_an_emptied_folder(tmp_path):
    cfg = _config(tmp_path, steps=100)
    seed = tmp_path / "runs" / "aset-tiny" / "seed-1"
    (seed / "checkpoints").mkdir(parents=True)
    (seed / "tb").mkdir()
    for old in ("checkpoints/ckpt-300.index", "checkpoints/ckpt-300.data-00000-of-00001", "tb/events.out.old",
                "policy.npz", "notes.txt"):
        (seed / old).write_text("an earlier run's")
    assert main(["train", str(cfg)]) == 0
    assert sorted(p.name for p in (seed / "checkpoints").glob("*.index")) == ["ckpt-100.index"]
    assert not (seed / "checkpoints" / "ckpt-300.index").exists() and not (seed / "tb" / "events.out.old").exists()
    assert (seed / "policy.npz").read_bytes() != b"an earlier run's"
    assert (seed / "notes.txt").read_text() == "an earlier run's"  # not training's: kept


# ------------------------------------------------------------------ 2: a run that cannot train
def test_steps_too_few_to_reach_train_start_are_refused_before_anything_is_written(tmp_path, capsys):
    export = tmp_path / "models" / "aset"
    export.parent.mkdir()
    for f in ("aset.npz", "aset.json"):
        (export.parent / f).write_text("the committed model")
    cfg = _config(tmp_path, export_to=str(export))
    assert main(["train", str(cfg), "--steps", "5"]) == 2
    out = _error(capsys)
    assert out.startswith(f"error: {cfg}: --steps 5 x 2 dispatchers") and "agent.train_start 64" in out
    assert not (tmp_path / "runs").exists()
    assert main(["train", str(_config(tmp_path, steps=20, export_to=str(export)))]) == 2
    assert "training.steps 20 x 2 dispatchers" in _error(capsys)
    assert (export.parent / "aset.npz").read_text() == "the committed model"


def test_a_run_whose_network_took_no_gradient_step_exports_nothing_and_exits_5(tmp_path, capsys):
    """32 steps x 2 sources could fill train_start 64, but the transitions settle windows late:
    no gradient step; the committed model at export_to is left as it was."""
    export = tmp_path / "models" / "aset"
    export.parent.mkdir()
    for f in ("aset.npz", "aset.json"):
        (export.parent / f).write_text("the committed model")
    assert main(["train", str(_config(tmp_path, export_to=str(export))), "--steps", "32"]) == 5
    out = _error(capsys)
    assert "error: seed 1: 32 steps" in out and "no gradient step" in out and "nothing exported" in out
    assert not (tmp_path / "runs" / "aset-tiny" / "seed-1" / "policy.npz").exists()
    assert (export.parent / "aset.npz").read_text() == "the committed model"


# ------------------------------------------------------------------ 3: output paths
@pytest.mark.parametrize("case", ["export under a file", "out_dir a file", "export_to a folder", "export_to dir/"])
def test_unwritable_output_paths_are_refused_before_training(tmp_path, capsys, case):
    afile = tmp_path / "afile"
    afile.write_text("a file")
    (tmp_path / "adir").mkdir()
    keys, item = {
        "export under a file": ({"export_to": str(afile / "x")},
                                f"training.export_to {afile / 'x'}: {afile} exists and is not a directory"),
        "out_dir a file": ({"out_dir": str(afile)}, f"training.out_dir {afile}: cannot create {afile / 'aset-tiny'}"),
        "export_to a folder": ({"export_to": str(tmp_path / "adir")}, f"{tmp_path / 'adir'} is a folder"),
        "export_to dir/": ({"export_to": "runs/exportdir/"}, "training.export_to runs/exportdir/: 'runs/exportdir/' "
                                                             "names a folder"),
    }[case]
    cfg = _config(tmp_path, **keys)
    assert main(["train", str(cfg)]) == 2
    out = _error(capsys)
    assert out.startswith(f"error: {cfg}: ") and item in out
    assert not (tmp_path / "runs").exists()


def test_a_rollout_cache_dir_that_is_a_file_is_refused_before_any_episode(tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("a file")
    cfg = _config(tmp_path, rollout=True)
    d = yaml.safe_load(cfg.read_text())
    d["training"]["rollout"]["cache_dir"] = str(afile)
    cfg.write_text(yaml.safe_dump(d))
    assert main(["train", str(cfg)]) == 2
    assert f"training.rollout.cache_dir {afile}: {afile} exists and is not a directory" in _error(capsys)
    assert not (tmp_path / "runs").exists()


# ------------------------------------------------------------------ 4: the window
def test_a_window_not_a_multiple_of_the_report_interval_is_refused_before_any_folder(tmp_path, capsys):
    cfg = _config(tmp_path, observation={"window": "300ms"})
    assert main(["train", str(cfg)]) == 2
    out = _error(capsys)
    assert out.startswith(f"error: {cfg}: observation.window: triangle: the decision window 300 ms must be a whole "
                          f"multiple") and str(TRIANGLE) in out
    assert not (tmp_path / "runs").exists()


# ------------------------------------------------------------------ 5: the load over the effective episode
@pytest.mark.parametrize("rollout", [False, True])
def test_a_scenario_expecting_under_one_query_per_episode_is_refused_naming_its_file(tmp_path, capsys, rollout):
    low = _scenario(tmp_path / "scen", "trilow", 0.07)  # 0.07 x 2 sources x 8 s = 1.1 queries: plans
    cfg = _config(tmp_path, rollout=rollout, observation={"plans": {"trilow": ["closest", "closest"]}} if rollout
                  else None, scenarios=[str(low)], episode="1s")
    assert main(["train", str(cfg)]) == 2
    out = _error(capsys)
    assert f"{low}: at load scale 0.6 (training.randomise.load_scale) over a training episode" in out
    assert "expects 0.084 queries in 1 s" in out and "in 8 s" not in out
    assert not (tmp_path / "runs").exists()


def test_the_lowest_load_scale_is_checked_over_the_scenarios_own_duration_too(tmp_path, capsys):
    """Each episode's scaled plan is built at the scenario's own 8 s: at 0.6 x 0.07 q/s it expects
    0.67 queries, refused there (it used to fail mid-training, when such a factor was drawn)."""
    low = _scenario(tmp_path / "scen", "trilow", 0.07)
    assert main(["train", str(_config(tmp_path, scenarios=[str(low)], episode="30s"))]) == 2
    out = _error(capsys)
    assert f"{low}: at load scale 0.6" in out and "its own duration" in out and "in 8 s" in out
    assert not (tmp_path / "runs").exists()


# ------------------------------------------------------------------ 6: no seed
def test_an_empty_seed_list_is_refused(tmp_path, capsys):
    from testbed.aset.dqn import train_seeds
    from testbed.spec.aset import load_aset_config
    from testbed.spec.experiment import ConfigError

    assert main(["train", str(_config(tmp_path, seeds=[]))]) == 2
    assert "training.seeds" in _error(capsys)
    cfg, base = load_aset_config(_config(tmp_path))  # model_copy skips validation: the trainer checks too
    cfg = cfg.model_copy(update={"training": cfg.training.model_copy(update={"seeds": []})})
    with pytest.raises(ConfigError, match=r"^training\.seeds: an empty list trains nothing"):
        train_seeds(cfg, base)
    assert not (tmp_path / "runs").exists()
