"""Plug-ins that leave the testbed's control: one that exits (``sys.exit``, ``SystemExit``, another
BaseException of its own), one that hangs, one that declares nothing.

Wherever a plug-in's code is called (its import, its plan-time check, its decisions in the simulator,
a sweep's or an evaluation's worker, an emulated source's process; an ASET selector's calls), an exit
is the plug-in's fault: exit code 4, the plug-in named, its traceback shown; never a silent end of
the testbed's process. Its import and its plan-time check have a time limit
(``TESTBED_PLUGIN_TIMEOUT_S``, ``testbed --plugin-timeout``). A plain ``module:callable`` without
``@policy_plugin`` is used with the safe properties (never cached), said once. A real Ctrl-C while
a plug-in runs is still an interruption (exit 130), not the plug-in's fault. The emulation's
cases (a plug-in that exits or calls ``os._exit`` inside a real source) are in
``test_plugin_faults_emulation.py``.
"""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from plugin_files import modules_on_path

from testbed.cli.main import main
from testbed.core.errors import EXIT_COMPONENT_DIED
from testbed.core.plugins import TIMEOUT_ENV, PluginFault
from testbed.model.policies import REGISTRY, UNDECLARED
from testbed.plan.build import build_plan
from testbed.spec.experiment import Experiment

REPO = Path(__file__).resolve().parent.parent
TRIANGLE = REPO / "experiments" / "triangle.yaml"

#: The plug-in modules of these tests (file name -> source).
MODULES = {
    "tbx_exits_at_import.py": "import sys\nsys.exit(3)\n",
    "tbx_sleeps_at_import.py": "import time\ntime.sleep(60)\n\ndef p(options, deadline_ms, min_accuracy, ctx=None):\n"
                               "    return None\n",
    "tbx_exiting.py": '''
import os
import signal
import sys
import time

from testbed.model.policies import Decision, policy_plugin

CALLS = {}


class Escape(BaseException):
    """A BaseException of the plug-in's own (not an Exception)."""


def _first(options):
    return Decision(options[0].cluster, options[0].model, False)


def _count(key, after):
    CALLS[key] = CALLS.get(key, 0) + 1
    return CALLS[key] > after


@policy_plugin()
def exits_now(options, deadline_ms, min_accuracy, ctx=None):
    sys.exit(0)


@policy_plugin()
def exits_later(options, deadline_ms, min_accuracy, ctx=None, *, after=5):
    """SystemExit(0) from its call number ``after`` + 1 on (counted per process and ``after``)."""
    if _count(("exit", after), after):
        raise SystemExit(0)
    return _first(options)


@policy_plugin()
def escapes_later(options, deadline_ms, min_accuracy, ctx=None, *, after=5):
    if _count(("escape", after), after):
        raise Escape("deliberately not an Exception")
    return _first(options)


@policy_plugin()
def interrupts_itself(options, deadline_ms, min_accuracy, ctx=None, *, after=5):
    if _count(("kbd", after), after):
        raise KeyboardInterrupt
    return _first(options)


@policy_plugin()
def gets_a_ctrl_c(options, deadline_ms, min_accuracy, ctx=None, *, after=5):
    """A real SIGINT (as a Ctrl-C sends) arrives while it decides."""
    if _count(("sigint", after), after):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)
    return _first(options)


@policy_plugin()
def hangs_when_checked(options, deadline_ms, min_accuracy, ctx=None):
    time.sleep(60)
    return _first(options)


def plain(options, deadline_ms, min_accuracy, ctx=None, *, k=0):
    """A plain decision function: no decorator, draws from the context."""
    if ctx is not None:
        ctx.rng.random()
    return _first(options)


class SelectsThenExits:
    """An ASET selector that exits at its window ``at``."""

    def __init__(self, at=3):
        self.at, self.n = at, 0

    def select(self, obs):
        self.n += 1
        if self.n > self.at:
            sys.exit(2)
        return 0
''',
}


@pytest.fixture(scope="module")
def mods(tmp_path_factory) -> Path:
    """A folder holding :data:`MODULES`, on ``sys.path`` for the module's tests."""
    yield from modules_on_path(tmp_path_factory, "plugin_faults", MODULES)


def _experiment_file(tmp_path: Path, **changes) -> Path:
    data = yaml.safe_load(TRIANGLE.read_text())
    data.update(changes)
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _plan(**changes):
    data = yaml.safe_load(TRIANGLE.read_text())
    data.update(changes)
    return build_plan(Experiment.model_validate(data), base_dir=TRIANGLE.parent)


# ------------------------------------------------------------------- exits at import, at plan time

def test_a_module_that_exits_at_import_is_named_with_exit_4(mods, tmp_path, capsys):
    exp = _experiment_file(tmp_path, policy="tbx_exits_at_import:p")
    assert main(["plan", str(exp)]) == EXIT_COMPONENT_DIED
    out = capsys.readouterr().out
    assert "policy 'tbx_exits_at_import:p': importing module 'tbx_exits_at_import': the plug-in exited" in out
    assert "SystemExit(3)" in out and "tbx_exits_at_import.py\", line 2" in out and "sys.exit(3)" in out


def test_a_decision_that_exits_at_plan_time_fails_plan_json_with_exit_4(mods, tmp_path, capsys):
    exp = _experiment_file(tmp_path, policy="tbx_exiting:exits_now")
    assert main(["plan", str(exp), "--json"]) == EXIT_COMPONENT_DIED
    out = capsys.readouterr().out
    assert not out.lstrip().startswith("{")  # no plan printed
    assert "policy 'tbx_exiting:exits_now' (tbx_exiting:exits_now" in out and "checked on synthetic options" in out
    assert "exited (SystemExit(0))" in out and "sys.exit(0)" in out  # its traceback


# ------------------------------------------------------------------- exits later, in each engine

@pytest.mark.parametrize("ref, says", [
    ("tbx_exiting:exits_later(after=11)", "the plug-in exited (SystemExit(0))"),
    ("tbx_exiting:escapes_later(after=12)", "the plug-in raised Escape: deliberately not an Exception"),
    ("tbx_exiting:interrupts_itself(after=13)", "the plug-in raised KeyboardInterrupt"),
])
def test_simulate_stops_with_exit_4_naming_a_plugin_that_exits_while_deciding(mods, ref, says, tmp_path, capsys):
    code = main(["simulate", str(TRIANGLE), "--policy", ref, "--duration", "4s", "--runs-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == EXIT_COMPONENT_DIED, out
    assert f"policy '{ref}' (tbx_exiting:" in out and "deciding" in out and says in out
    assert "tbx_exiting.py" in out and "Traceback" in out
    assert not list(tmp_path.iterdir())  # no run directory that looks finished


def test_a_real_ctrl_c_while_a_plugin_decides_is_an_interruption_not_its_fault(mods, tmp_path):
    """In a process of its own whose SIGINT has the default action, as a command started from a
    terminal has: an ignored SIGINT is inherited across exec (and Python then keeps ignoring it), and
    a test process can be left ignoring it (an in-process `testbed run` ignores it once its run is
    over, testbed.emu.lifecycle); on a busy machine this Ctrl-C was twice not raised."""
    proc = subprocess.run([sys.executable, "-m", "testbed.cli.main", "simulate", str(TRIANGLE), "--policy",
                           "tbx_exiting:gets_a_ctrl_c(after=14)", "--duration", "4s", "--runs-dir", str(tmp_path)],
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(mods), str(REPO)])),
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 130, proc.stdout + proc.stderr
    assert "interrupted" in proc.stdout, proc.stdout


def test_sweep_workers_report_a_plugin_that_exits(mods, tmp_path, capsys):
    code = main(["sweep", str(TRIANGLE), "--policies", "closest, tbx_exiting:exits_later(after=15)", "--seeds", "1",
                 "--jobs", "2", "--duration", "3s", "--out", str(tmp_path / "sweep")])
    out = capsys.readouterr().out
    assert code == EXIT_COMPONENT_DIED, out
    assert "policy 'tbx_exiting:exits_later(after=15)'" in out and "SystemExit" in out


def test_evaluate_reports_a_plugin_action_that_exits(mods, tmp_path, capsys):
    cfg = yaml.safe_load((REPO / "experiments" / "aset-tiny.yaml").read_text())
    cfg["actions"] = ["closest", "tbx_exiting:exits_later(after=40)"]
    cfg["training"]["scenarios"] = [str(TRIANGLE)]
    cfg["evaluation"].update(scenarios=[str(TRIANGLE)], out_dir=str(tmp_path / "eval"))
    path = tmp_path / "aset-exit.yaml"
    path.write_text(yaml.safe_dump(cfg))
    code = main(["evaluate", str(path), "--headroom"])
    out = capsys.readouterr().out
    assert code == EXIT_COMPONENT_DIED, out
    assert "policy 'tbx_exiting:exits_later(after=40)'" in out and "SystemExit" in out


def test_a_selector_that_exits_stops_the_simulation_with_exit_4(mods, tmp_path, capsys):
    data = copy.deepcopy(yaml.safe_load(TRIANGLE.read_text()))
    data.update(policy="aset", aset={"selector": {"use": "tbx_exiting:SelectsThenExits", "params": {"at": 3}}},
                duration="6s")
    exp = tmp_path / "sel.yaml"
    exp.write_text(yaml.safe_dump(data))
    code = main(["simulate", str(exp), "--runs-dir", str(tmp_path / "runs")])
    out = capsys.readouterr().out
    assert code == EXIT_COMPONENT_DIED, out
    assert "aset.selector tbx_exiting:SelectsThenExits" in out and "exited (SystemExit(2))" in out
    assert "sys.exit(2)" in out


def test_a_source_process_whose_plugin_exits_stops_with_exit_4_and_its_tally(mods, tmp_path):
    """``python -m testbed.emu.source`` (the process ``testbed run`` starts in each source host), run
    here outside a network: a SystemExit(0) of its plug-in is reported as the plug-in's failure
    (exit 4, traceback on stderr), not a normal end (exit 0), and the source's tally is written."""
    from testbed.core.util import write_json_atomic
    from testbed.plan.boundaries import SourceConfig

    ref = "tbx_exiting:exits_later(after=6)"
    plan = _plan(policy=ref, sources=[{"name": "srca", "site": "A"}])
    (tmp_path / "sources").mkdir()
    cfg = SourceConfig.from_plan(plan, "srca", start_ns=time.time_ns() + int(1e9), duration_s=20, run_dir=tmp_path)
    path = write_json_atomic(tmp_path / "srca.json", cfg)
    proc = subprocess.run([sys.executable, "-m", "testbed.emu.source", str(path)],
                          env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    assert proc.returncode == EXIT_COMPONENT_DIED, proc.stderr
    assert "the policy failed while dispatching" in proc.stderr and "SystemExit" in proc.stderr
    assert f"[source] stopped: policy '{ref}'" in proc.stderr
    tally = json.loads((tmp_path / "sources" / "srca.tally.json").read_text())
    assert 0 < tally["created"] == tally["written"]


# ------------------------------------------------------------------- hangs

def test_a_module_that_hangs_at_import_is_stopped_at_the_time_limit(mods, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv(TIMEOUT_ENV, "1")
    exp = _experiment_file(tmp_path, policy="tbx_sleeps_at_import:p")
    t = time.monotonic()
    assert main(["plan", str(exp)]) == EXIT_COMPONENT_DIED
    assert time.monotonic() - t < 30  # not the 60 s of its sleep
    out = capsys.readouterr().out
    assert "importing module 'tbx_sleeps_at_import': did not finish within 1 s" in out
    assert TIMEOUT_ENV in out and "tbx_sleeps_at_import.py\", line 2" in out and "time.sleep(60)" in out


def test_the_time_limit_is_a_command_line_option_too(mods, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(TIMEOUT_ENV, raising=False)
    exp = _experiment_file(tmp_path, policy="tbx_exiting:hangs_when_checked")
    assert main(["--plugin-timeout", "1", "plan", str(exp)]) == EXIT_COMPONENT_DIED
    out = capsys.readouterr().out
    assert "policy 'tbx_exiting:hangs_when_checked'" in out and "checked on synthetic options" in out
    assert "did not finish within 1 s" in out and "time.sleep(60)" in out
    assert os.environ[TIMEOUT_ENV] == "1"  # what the run's processes inherit
    with pytest.raises(SystemExit):
        main(["--plugin-timeout", "soon", "plan", str(exp)])
    assert "a number of seconds >= 0" in capsys.readouterr().err


# ------------------------------------------------------------------- a plain function

def test_a_plain_function_is_used_with_the_safe_properties_and_a_note_said_once(mods, capsys):
    p = REGISTRY.resolve("tbx_exiting:plain")
    assert (p.deterministic, p.load_aware, p.stateful) == (UNDECLARED.deterministic, UNDECLARED.load_aware,
                                                            UNDECLARED.stateful) == (False, True, True)
    REGISTRY.resolve("tbx_exiting:plain(k=1)")  # the same function with parameters: no second note
    err = capsys.readouterr().err
    assert err.count("declares no properties") == 1
    assert "never cached" in err and "@testbed.model.policies.policy_plugin(deterministic=True" in err


def test_a_plain_function_runs_in_the_simulator(mods, tmp_path, capsys):
    code = main(["simulate", str(TRIANGLE), "--policy", "tbx_exiting:plain(k=2)", "--duration", "3s",
                 "--runs-dir", str(tmp_path)])
    assert code == 0, capsys.readouterr().out


def test_a_plugin_fault_is_an_exception_with_exit_code_4():
    """Every handler of a plug-in's errors (``except Exception``) sees it; the CLI returns 4."""
    assert issubclass(PluginFault, Exception) and PluginFault("x").exit_code == EXIT_COMPONENT_DIED
