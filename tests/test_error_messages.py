"""Error messages as a user reads them: a plan error names the experiment file, the train command names
the config its scenarios came from, counts agree in number, an error of the whole file has no
location prefix, a negative duration is said to be negative (in a file and on the command line), and
a directory given as the topology file is said to be one.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from triangle_inputs import scenario

from testbed.spec.experiment import ConfigError

REPO = Path(__file__).resolve().parent.parent
TRIANGLE = REPO / "experiments" / "triangle.yaml"


def test_a_plan_error_names_the_experiment_file(tmp_path):
    from testbed.aset.scenarios import scenario_sampler
    from testbed.plan.build import PlanError, plan_experiment
    from testbed.spec.aset import RandomiseSpec

    bad = scenario(tmp_path, "bad", **{"min_accuracy: 0.5}": "min_accuracy: 0.5, family: nosuch}"})
    with pytest.raises(PlanError, match=rf"^{bad}: application 'digits': family 'nosuch'"):
        plan_experiment(bad)
    with pytest.raises(PlanError, match=rf"^{bad}: application 'digits'"):
        scenario_sampler([TRIANGLE, bad], RandomiseSpec())


def test_the_train_command_names_the_config_its_scenarios_came_from(tmp_path, capsys):
    from testbed.cli.main import main

    a = scenario(tmp_path / "exp", "a")
    b = scenario(tmp_path / "exp", "b", name="tri3", extra_source=True)
    cfg = tmp_path / "experiments" / "aset.yaml"
    cfg.parent.mkdir()
    cfg.write_text(f"name: t\ntraining: {{scenarios: [{a}, {b}], out_dir: {tmp_path / 'out'}}}\n")
    assert main(["train", str(cfg)]) == 2
    out = " ".join(capsys.readouterr().out.split())
    assert out.startswith(f"error: {cfg}: training.scenarios: every scenario must have") and "Traceback" not in out
    assert not (tmp_path / "out").exists()


def test_counts_in_messages_agree_in_number():
    from testbed.core.errors import counted
    from testbed.spec.aset import RewardSpec

    assert (counted(1, "policy", "policies"), counted(2, "source"), counted(0, "step")) == \
        ("1 policy", "2 sources", "0 steps")
    with pytest.raises(ValueError, match=r"baseline_mix.x: 1 policy for 2 sources$"):
        RewardSpec(baseline_mix={"x": ["cloud"]}).baseline_for("x", 2)


def test_an_error_of_the_whole_file_has_no_location_prefix(tmp_path):
    from testbed.spec.experiment import load_experiment

    f = scenario(tmp_path, "twice", **{"  - {name: srcc, site: C}\n": "  - {name: srcc, site: C}\n"
                                                                       "  - {name: srcc, site: B}\n"})
    with pytest.raises(ConfigError) as err:
        load_experiment(f)
    assert str(err.value) == f"{f}: invalid experiment\n  source name 'srcc' is used twice"


def test_a_negative_duration_is_said_to_be_negative(tmp_path):
    from testbed.spec.experiment import load_experiment

    f = scenario(tmp_path, "neg", **{"duration: 8s": "duration: -1s"})
    with pytest.raises(ConfigError, match=r"\n  duration: '-1s' is negative; a duration must be positive$"):
        load_experiment(f)


def test_a_negative_duration_on_the_command_line_reaches_its_check(capsys):
    from testbed.cli.main import main

    with pytest.raises(SystemExit) as exc:
        main(["simulate", str(TRIANGLE), "--duration", "-1s"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "expected one argument" not in err
    assert "argument --duration: duration for --duration: '-1s' is negative; a duration must be positive" in err


def test_a_directory_given_as_the_topology_file_is_said_to_be_one(tmp_path):
    from testbed.plan.build import plan_experiment
    from testbed.spec.topology import TopologyError

    (tmp_path / "topo.yaml").mkdir()
    f = scenario(tmp_path, "tdir", **{str(REPO / "topologies" / "triangle.yaml"): "topo.yaml"})
    with pytest.raises(TopologyError, match=rf"^{f}: topology file 'topo.yaml': {tmp_path / 'topo.yaml'} is a "
                                            r"directory, not a topology file$"):
        plan_experiment(f)
