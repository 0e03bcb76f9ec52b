"""Plug-ins that leave the testbed's control inside a real emulated source (root, Mininet): one that
raises ``SystemExit(0)`` mid-run stops the run with exit code 4, its name on the console; one that
calls ``os._exit(0)`` (which nothing in-process can catch) ends its source at once, and the run's
check of the sources' tallies against their records says that the source vanished, naming it.
About 40 s each here; under the shared emulation lock.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from plugin_files import modules_on_path

from testbed.plan.build import build_plan
from testbed.spec.experiment import Experiment

REPO = Path(__file__).resolve().parent.parent
TRIANGLE = REPO / "experiments" / "triangle.yaml"

pytestmark = [pytest.mark.emulation, pytest.mark.skipif(os.geteuid() != 0, reason="emulation needs root")]

PLUGIN = '''
import os

from testbed.model.policies import Decision, policy_plugin

CALLS = {}


def _first(options):
    return Decision(options[0].cluster, options[0].model, False)


@policy_plugin()
def exits_later(options, deadline_ms, min_accuracy, ctx=None, *, after=5):
    CALLS["exit"] = CALLS.get("exit", 0) + 1
    if CALLS["exit"] > after:
        raise SystemExit(0)
    return _first(options)


@policy_plugin()
def os_exits_later(options, deadline_ms, min_accuracy, ctx=None, *, after=5):
    CALLS["os"] = CALLS.get("os", 0) + 1
    if CALLS["os"] > after:
        os._exit(0)
    return _first(options)
'''


@pytest.fixture(scope="module")
def plugin(tmp_path_factory) -> Path:
    yield from modules_on_path(tmp_path_factory, "plugin_emu", {"tbx_emu_exits.py": PLUGIN})


def _run(tmp_path: Path, policy: str, capsys) -> tuple[int, str, Path]:
    from testbed.results.runs import run_emulation

    data = yaml.safe_load(TRIANGLE.read_text())
    data["policy"] = policy
    plan = build_plan(Experiment.model_validate(data), base_dir=TRIANGLE.parent)
    code = run_emulation(plan, runs_dir=tmp_path / "runs", duration_s=10)
    return code, capsys.readouterr().out, next((tmp_path / "runs").iterdir())


def test_a_plugin_that_exits_mid_run_stops_the_run_with_exit_4_naming_it(plugin, tmp_path, capsys):
    ref = "tbx_emu_exits:exits_later(after=8)"
    code, out, run_dir = _run(tmp_path, ref, capsys)
    assert code == 4, out
    assert "HEALTH: query source source-src" in out and "died: exit code 4" in out
    assert f"policy '{ref}' (tbx_emu_exits:exits_later" in out and "exited (SystemExit(0))" in out  # named
    logs = "".join((run_dir / "logs" / f"source-{s}.log").read_text() for s in ("srca", "srcc"))
    assert "raise SystemExit(0)" in logs and "tbx_emu_exits.py" in logs  # its traceback
    run = json.loads((run_dir / "run.json").read_text())
    assert run["exit_code"] == 4 and run["status"] == "failed"


def test_a_plugin_that_calls_os_exit_leaves_a_source_that_vanished_named(plugin, tmp_path, capsys):
    ref = "tbx_emu_exits:os_exits_later(after=8)"
    code, out, run_dir = _run(tmp_path, ref, capsys)
    assert code == 4, out
    assert "RECORDS: source srca vanished: it left no tally" in out
    assert "RECORDS: source srcc vanished: it left no tally" in out
    s = json.loads((run_dir / "summary.json").read_text())
    assert sorted(s["records_check"]["sources_without_tally"]) == ["srca", "srcc"]
    assert s["queries"] > 0  # what the sources recorded before they vanished is kept
    run = json.loads((run_dir / "run.json").read_text())
    assert run["exit_code"] == 4 and "vanished" in run["message"]
