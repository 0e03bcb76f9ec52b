"""One seam for every agent (testbed/agent/checkpoint.py, testbed/agent/live.py): every agent kind
loads through resolve_agent, simulate and evaluate give the same decisions per seed, corrupt or
unknown checkpoints are refused naming the file, and evaluate refuses overlapping seeds."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from testbed.agent.checkpoint import (
    CheckpointError,
    read_checkpoint,
    register_kind,
    write_checkpoint,
)
from testbed.agent.gate import GatedPolicy
from testbed.agent.live import SourceSelector, check_agents, source_configs
from testbed.aset.jobs import agent_job
from testbed.cli.main import main as cli_main
from testbed.core.errors import EXIT_INPUT
from testbed.plan.build import build_plan, plan_experiment
from testbed.sim.run import simulate
from testbed.spec.experiment import AsetSpec, Experiment

REPO = Path(__file__).resolve().parent.parent
TRIANGLE = REPO / "experiments" / "triangle.yaml"
SUITE = REPO / "experiments" / "scenario-hotspot.yaml"  # the experiment the plan-based checkpoints know
STATE = {"arrivals": {}, "clusters": {}, "path_util": {}, "resolved": [], "policy": "closest"}


class Constant:
    """A checkpoint kind of a test's own: always its JSON's ``choice``."""

    def __init__(self, choice: str):
        self.choice = choice

    def select(self, obs) -> str:
        return self.choice

    def reset(self) -> None:
        pass


def _constant(ckpt, setup) -> Constant:
    if ckpt.meta["choice"] not in ckpt.policies:
        raise ValueError(f"choice {ckpt.meta['choice']!r} is not one of its policies")
    return Constant(ckpt.meta["choice"])


register_kind("test-constant", _constant, versions=(1,))


def _selector(experiment: Path, aset: dict) -> SourceSelector:
    plan = plan_experiment(experiment)
    cfg = source_configs(plan, [plan.sources[0].name], AsetSpec.model_validate(aset))[0]
    return SourceSelector(cfg)


@pytest.mark.parametrize("experiment, aset, kind", [
    (TRIANGLE, {"checkpoint": "models/aset/general"}, "gated"),              # the shipped general ensemble
    (TRIANGLE, {"checkpoint": "models/aset/general-single"}, "general"),     # one general scorer
    (SUITE, {"checkpoint": "models/aset/aset"}, "qnetwork"),            # the paper's double DQN
    (SUITE, {"checkpoint": "models/aset/aset-rollout"}, "qnetwork"),    # the rollout regression
    (TRIANGLE, {"selector": {"use": "examples.selector.rules:SuccessGuard", "params": {"hold": 2}}}, "class"),
])
def test_every_agent_kind_loads_through_the_one_seam(experiment, aset, kind):
    sel = _selector(experiment, aset)
    assert sel.agent.resolved.provenance["kind"] == kind
    first = sel.choose(STATE)
    assert first in sel.policies and sel.choose(STATE) in sel.policies
    assert sel.timing()["n"] == 2


def test_a_registered_kind_is_one_entry_and_loads_through_the_seam(tmp_path):
    path = write_checkpoint(tmp_path / "const", kind="test-constant", version=1, policies=["closest", "cloud"],
                            features={}, arrays={"unused": np.zeros(1)}, provenance={"by": "a test"},
                            choice="cloud")
    sel = _selector(TRIANGLE, {"checkpoint": str(path)})
    assert sel.policies == ("closest", "cloud") and sel.choose(STATE) == "cloud"
    assert sel.agent.resolved.provenance["trained"] == {"by": "a test"}
    doc = yaml.safe_load(TRIANGLE.read_text())
    doc.update(policy="aset", aset={"checkpoint": str(path)}, duration="5s")
    record = check_agents(build_plan(Experiment.model_validate(doc), base_dir=TRIANGLE.parent))
    assert record["kind"] == "test-constant" and record["policies"] == ["closest", "cloud"]
    assert set(record["sha256"]) == {"json", "npz"}
    bad = write_checkpoint(tmp_path / "bad", kind="test-constant", version=1, policies=["closest", "cloud"],
                           features={}, arrays={}, choice="random")
    with pytest.raises(CheckpointError, match=r"bad .source .*choice 'random' is not one of its policies"):
        _selector(TRIANGLE, {"checkpoint": str(bad)})


def test_corrupt_and_unknown_checkpoints_are_refused_naming_the_file(tmp_path):
    for suffix in (".npz", ".json"):
        shutil.copy(REPO / f"models/aset/general-single{suffix}", tmp_path / f"g{suffix}")  # a legacy file
    meta = json.loads((tmp_path / "g.json").read_text())
    for name, change in (("kind", {"kind": "nonesuch", "version": 1}), ("version", {"kind": "general", "version": 9}),
                         ("format", {"format": "aset-policy-v1"})):
        shutil.copy(tmp_path / "g.npz", tmp_path / f"{name}.npz")
        doc = {k: v for k, v in meta.items() if k != "format"} | change
        (tmp_path / f"{name}.json").write_text(json.dumps(doc))
    with pytest.raises(CheckpointError, match=r"kind\.json: kind 'nonesuch' is not a known agent kind"):
        read_checkpoint(tmp_path / "kind")
    with pytest.raises(CheckpointError, match=r"version\.json: general version 9, this testbed reads 1"):
        read_checkpoint(tmp_path / "version")
    with pytest.raises(CheckpointError, match=r"format\.json: format 'aset-policy-v1'; not a checkpoint"):
        read_checkpoint(tmp_path / "format")
    (tmp_path / "cut.json").write_text((tmp_path / "g.json").read_text())
    (tmp_path / "cut.npz").write_bytes((tmp_path / "g.npz").read_bytes()[:100])
    with pytest.raises(CheckpointError, match=r"cut\.npz is not a readable numpy archive"):
        read_checkpoint(tmp_path / "cut")
    (tmp_path / "half.npz").write_bytes((tmp_path / "g.npz").read_bytes())
    (tmp_path / "half.json").write_text((tmp_path / "g.json").read_text()[:50])
    with pytest.raises(CheckpointError, match=r"half\.json is unreadable or not JSON"):
        read_checkpoint(tmp_path / "half")
    with pytest.raises(CheckpointError, match=r"missing\.npz is missing"):
        read_checkpoint(tmp_path / "missing")
    with pytest.raises(CheckpointError, match="window 1000 ms differs from the checkpoint's window 500 ms"):
        _selector(TRIANGLE, {"checkpoint": "models/aset/general", "window": "1s"})


@pytest.mark.parametrize("checkpoint, experiment", [
    ("gated margin 0", REPO / "experiments/generated/held-out/gen-heldout-2.yaml"),
    ("models/aset/aset", SUITE),
])
def test_simulate_and_evaluate_give_the_same_aset_decisions_per_seed(tmp_path, checkpoint, experiment):
    """``testbed simulate`` and ``testbed evaluate``'s ASET runs (agent_job) drive the sources
    through the same loop: the same seed gives the same schedule, window by window (the shipped
    gated checkpoint at margin 0, so that it leaves its reference)."""
    if checkpoint == "gated margin 0":
        checkpoint = str(GatedPolicy(REPO / "models/aset/general").with_margin(0.0).export(tmp_path / "g0"))
    doc = copy.deepcopy(yaml.safe_load(experiment.read_text()))
    doc.update(policy="aset", aset={"checkpoint": checkpoint})
    for s in doc["sources"]:
        s.pop("policy", None)
    path = tmp_path / experiment.name
    path.write_text(yaml.safe_dump(doc))
    schedules = []
    for seed in (1, 2):
        out = simulate(plan_experiment(path), duration_s=8.0, seed=seed)
        job = agent_job(str(path), seed, AsetSpec(checkpoint=checkpoint).model_dump_json(), 8.0)
        assert out.schedule == job["schedule"]
        assert sum(len(x) for x in job["schedule"].values()) == 16 * len(doc["sources"])
        schedules.append(job["schedule"])
    assert schedules[0] != schedules[1]  # the seed matters: the comparison is not of constants


def test_evaluate_refuses_overlapping_tuning_and_evaluation_seeds(tmp_path, capsys):
    out = tmp_path / "out"
    rc = cli_main(["evaluate", str(TRIANGLE), "--tuning-seeds", "1-5", "--seeds", "4-30", "--out", str(out)])
    err = capsys.readouterr().out  # the CLI prints its errors on stdout
    assert rc == EXIT_INPUT and "evaluation seeds 4, 5 are also tuning seeds" in err
    assert not out.exists()
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump({"name": "x", "evaluation": {"scenarios": [str(TRIANGLE)], "tuning_seeds": [1, 2],
                                                               "seeds": [2, 3], "out_dir": str(tmp_path / "o")}}))
    assert cli_main(["evaluate", str(cfg)]) == EXIT_INPUT
    assert "evaluation seeds 2 are also tuning seeds" in capsys.readouterr().out
