"""examples/ end to end in the simulator: ``examples/together/experiment.yaml`` on topohub
sndlib/polska with all three plug-ins of docs/extending.md at once: the model of one's own
(examples/own_model, trained offline and added with ``testbed zoo add``), the policy plug-in
(examples/policy_plugin, installed with pip: its entry point) and the selector of one's own
(examples/selector/rules.py). The emulation of the policy plug-in on real packets:
tests/test_policy_plugins.py."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import yaml
from test_zoo_add import _add, own_model, small_zoo  # noqa: F401 - own_model: a fixture

from testbed.plan.build import plan_experiment
from testbed.results.runs import run_simulation

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "together" / "experiment.yaml"


def test_the_three_plug_ins_together_in_the_simulator(tmp_path, own_model, example_installed):  # noqa: F811 - fixtures
    model, accuracy = own_model
    zoo_dir, profiles = small_zoo(tmp_path, ("digits_small", "digits_medium"))
    assert _add(model, zoo_dir, "digits_lenet", accuracy) == 0
    exp = yaml.safe_load(EXAMPLE.read_text())
    exp.update(zoo_dir=str(zoo_dir), profiles_dir=str(profiles))
    (tmp_path / "together.yaml").write_text(yaml.safe_dump(exp))
    run_dir, summary = run_simulation(plan_experiment(tmp_path / "together.yaml"), runs_dir=tmp_path / "runs",
                                      duration_s=10, quiet=True)
    run = json.loads((run_dir / "run.json").read_text())
    df = pd.concat([pd.read_csv(f) for f in sorted((run_dir / "sources").glob("*.records.csv"))])
    assert summary["queries"] == len(df) > 100 and summary["success_ratio"] > 0.5

    # the model: served, and the only models that reach the application's 0.95 are lenet and medium
    assert "digits_lenet" in set(df["model"])
    assert set(df.loc[df["fallback"] == 0, "model"]) <= {"digits_lenet", "digits_medium"}
    # the plug-in: the sources on it dispatched by it, its provenance in run.json
    on_slack = df[df["source"].isin(["szczecin", "rzeszow"])]
    assert len(on_slack) > 0 and set(on_slack["policy"]) == {"slack(margin_ms=10)"}
    plugins = json.dumps(run["policy_plugins"])
    assert "slack_policy" in plugins and "testbed-slack-policy" in plugins
    # the selector: it drove the other two, window by window
    sel = run["selector"]
    assert sel["use"] == "examples.selector.rules:SuccessGuard" and sel["sources"] == ["katowice", "kolobrzeg"]
    assert all(sum(c.values()) == 20 for c in sel["choices"].values())  # 10 s of 500 ms windows
    on_selector = df[df["source"].isin(["katowice", "kolobrzeg"])]
    assert set(on_selector["policy"]) <= {"closest", "least_loaded"}
