"""Policy plug-ins: a policy of one's own, named in an experiment, resolved at plan time, run by both engines.

The three forms (a built-in name, an entry point of group ``testbed.policies``, ``module:callable``
with parameters) resolve through the one policy registry and give the same decisions in the
simulator's dispatcher and in an emulated source's (built from its JSON config, as ``testbed run``
starts it) on the same heard trace; a plug-in that cannot be used is a plan error naming it; one
that raises during a simulation stops it with exit code 4, naming it. The entry-point form uses
``examples/policy_plugin`` installed with pip into a temporary folder (no network). The last two
tests run the emulation (root, Mininet): a ``module:callable`` plug-in on real packets, and one that
raises mid-run.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from plugin_files import modules_on_path

from testbed.cli.main import main
from testbed.core.plugins import NOT_INSTALLED, normalize_ref
from testbed.core.registry import UnknownNameError
from testbed.model.dispatch import Heard
from testbed.model.policies import CATALOGUE, REGISTRY, PolicyFailure
from testbed.plan.build import build_plan
from testbed.plan.resolved import PlanError
from testbed.spec.experiment import Experiment

REPO = Path(__file__).resolve().parent.parent
TRIANGLE = REPO / "experiments" / "triangle.yaml"
EXAMPLE = REPO / "examples" / "policy_plugin"

#: The test's plug-in module: one good policy with a parameter, and one of each mistake.
SCHED = '''
from testbed.model.policies import Decision, feasible, policy_plugin


@policy_plugin(stateful=True)
def two_choices(options, deadline_ms, min_accuracy, ctx=None, *, d=2):
    """d options drawn from the source's ctx.rng; the least loaded of them (ties: RTT, names)."""
    idx = ctx.rng.choice(len(options), size=min(d, len(options)), replace=False)
    pick = min((options[i] for i in idx), key=lambda o: (o.load, o.rtt_ms, o.cluster, o.model))
    return Decision(pick.cluster, pick.model, not feasible([pick], deadline_ms, min_accuracy))


@policy_plugin()
def short_signature(options, deadline_ms):
    return Decision(options[0].cluster, options[0].model, False)


def undeclared(options, deadline_ms, min_accuracy, ctx=None):
    return Decision(options[0].cluster, options[0].model, False)


@policy_plugin(deterministic=True)
def divides_by_zero(options, deadline_ms, min_accuracy, ctx=None):
    return 1 / 0


@policy_plugin(deterministic=True)
def answers_a_tuple(options, deadline_ms, min_accuracy, ctx=None):
    return (options[0].cluster, options[0].model)


@policy_plugin(deterministic=True)
def draws_undeclared(options, deadline_ms, min_accuracy, ctx=None):
    o = options[int(ctx.rng.integers(len(options)))]
    return Decision(o.cluster, o.model, False)


@policy_plugin(deterministic=True)
def reads_load_undeclared(options, deadline_ms, min_accuracy, ctx=None):
    o = min(options, key=lambda o: (o.load, o.cluster, o.model))
    return Decision(o.cluster, o.model, False)


CALLS = {}


@policy_plugin()
def fails_later(options, deadline_ms, min_accuracy, ctx=None, *, after=5):
    """The first option, until its call number ``after`` + 1 (counted per process and ``after``)."""
    CALLS[after] = CALLS.get(after, 0) + 1
    if CALLS[after] > after:
        raise RuntimeError(f"tb_sched.fails_later: call {CALLS[after]} is past {after}, deliberately broken")
    return Decision(options[0].cluster, options[0].model, False)
'''


@pytest.fixture(scope="module")
def sched(tmp_path_factory) -> Path:
    """The folder holding ``tb_sched.py`` (:data:`SCHED`), on ``sys.path`` for the module's tests."""
    yield from modules_on_path(tmp_path_factory, "plugin", {"tb_sched.py": SCHED})


def _experiment(**changes) -> Experiment:
    data = yaml.safe_load(TRIANGLE.read_text())
    data.update(changes)
    return Experiment.model_validate(data)


def _plan(policy, **changes):
    return build_plan(_experiment(policy=policy, **changes), base_dir=TRIANGLE.parent)


#: The three forms, as an experiment may write them, and their string form.
FORMS = {"built-in": ("least_loaded", "least_loaded"),
         "entry point": ({"use": "slack", "params": {"margin_ms": 5}}, "slack(margin_ms=5)"),
         "module:callable": ({"use": "tb_sched:two_choices", "params": {"d": 2}}, "tb_sched:two_choices(d=2)")}


@pytest.mark.parametrize("form", list(FORMS))
def test_each_form_resolves_with_its_origin(form, sched, example_installed):
    written, ref = FORMS[form]
    plan = _plan(written)
    assert plan.experiment.policy == ref  # one string form, whatever the file wrote
    p = REGISTRY.resolve(ref)
    if form == "built-in":
        assert p.origin is None and ref in CATALOGUE
        return
    assert ref not in CATALOGUE and ref in REGISTRY.plugins()  # ASET's default action space is unchanged
    assert p.origin.ref == ref
    assert p.origin.sha256 == hashlib.sha256(Path(p.origin.file).read_bytes()).hexdigest()
    if form == "entry point":
        assert (p.origin.entry_point, p.origin.import_path) == ("slack", "slack_policy.policy:slack")
        assert (p.origin.distribution, p.origin.version) == ("testbed-slack-policy", "0.1.0")
        assert Path(p.origin.file).is_relative_to(example_installed)
        assert (p.deterministic, p.load_aware, p.stateful) == (True, True, False)
    else:
        assert (p.origin.distribution, p.origin.version) == (NOT_INSTALLED, NOT_INSTALLED)
        assert p.origin.file == str((sched / "tb_sched.py").resolve()) and p.stateful


def _heard_trace(clusters: list[str], steps: int) -> list[list[tuple[str, Heard]]]:
    """Reports of every cluster, one list per step: random queues and busy workers, now and then one down."""
    rng = np.random.default_rng(11)
    trace = []
    for t in range(steps):
        step = []
        for c in clusters:
            busy = int(rng.integers(0, 2))
            step.append((c, Heard(int(rng.integers(0, 6)) * busy, busy, 1, float(rng.random()),
                                  bool(rng.random() > 0.1), t * 0.5)))
        trace.append(step)
    return trace


@pytest.mark.parametrize("form", list(FORMS))
def test_both_engines_decide_the_same_on_the_same_trace(form, sched, example_installed, tmp_path):
    """The simulator's dispatcher of each source and the emulated source built from its JSON config
    (as testbed run starts it, the plug-in resolved again there) decide alike on one heard trace."""
    from testbed.core.util import write_json_atomic
    from testbed.emu.source import Source
    from testbed.plan.boundaries import SourceConfig, read_config
    from testbed.sim import Simulator

    written, ref = FORMS[form]
    plan = _plan(written)
    sim = Simulator(plan)
    (tmp_path / "sources").mkdir()
    for host in plan.sources:
        cfg = SourceConfig.from_plan(plan, host.name, start_ns=0, duration_s=8, run_dir=tmp_path)
        cfg = read_config(write_json_atomic(tmp_path / f"{host.name}.json", cfg), SourceConfig)
        assert cfg.policy == ref
        if form == "module:callable":
            assert cfg.plugin_paths == [str(sched.resolve())]
        src = Source(cfg)
        try:
            a, b = sim.dispatchers[sim.src_index[host.name]], src.dispatcher
            assert a.policy == b.policy == ref
            seen_a, seen_b = [], []
            for step in _heard_trace(a.clusters, 40):
                a.hear_all(step)
                b.hear_all(step)
                for app in plan.experiment.applications:
                    seen_a += [a.dispatch(app.deadline_ms, app.min_accuracy, app.family) for _ in range(3)]
                    seen_b += [b.dispatch(app.deadline_ms, app.min_accuracy, app.family) for _ in range(3)]
            assert seen_a == seen_b
            if form != "built-in" or host.name == "srca":  # the trace moves the choice between clusters
                assert len({d.cluster for d in seen_a}) == 2, host.name
        finally:
            src.out.close()


def test_simulate_records_the_plugin_and_its_origin(sched, tmp_path, capsys):
    ref = "tb_sched:two_choices(d=2)"
    code = main(["simulate", str(TRIANGLE), "--policy", ref, "--duration", "4s", "--runs-dir", str(tmp_path)])
    assert code == 0, capsys.readouterr().out
    run_dir = next(tmp_path.iterdir())
    run = json.loads((run_dir / "run.json").read_text())
    assert set(run["policies"].values()) == {ref}
    origin = run["policy_plugins"][ref]
    assert origin["import_path"] == "tb_sched:two_choices" and origin["version"] == NOT_INSTALLED
    assert origin["sha256"] == hashlib.sha256((sched / "tb_sched.py").read_bytes()).hexdigest()
    df = pd.concat(pd.read_csv(f) for f in (run_dir / "sources").glob("*.records.csv"))
    assert len(df) > 10 and set(df["policy"]) == {ref}


def test_an_experiment_file_with_the_mapping_form_runs_the_entry_point(example_installed, tmp_path, capsys):
    data = yaml.safe_load(TRIANGLE.read_text())
    data["topology"]["source"] = str(TRIANGLE.parent / data["topology"]["source"])
    data["sources"][0]["policy"] = {"use": "slack", "params": {"margin_ms": 20}}
    exp = tmp_path / "exp.yaml"
    exp.write_text(yaml.safe_dump(data))
    assert main(["simulate", str(exp), "--duration", "4s", "--runs-dir", str(tmp_path / "runs")]) == 0, \
        capsys.readouterr().out
    run = json.loads((next((tmp_path / "runs").iterdir()) / "run.json").read_text())
    ref = "slack(margin_ms=20)"
    assert run["policies"] == {"srca": ref, "srcc": "closest"}
    assert run["policy_plugins"][ref]["distribution"] == "testbed-slack-policy"
    assert list(run["policy_plugins"]) == [ref]


@pytest.mark.parametrize(("policy", "says"), [
    ("tb_sched:short_signature", ["signature short_signature(options, deadline_ms)", "does not match"]),
    ("tb_sched:two_choices(k=3)", ["signature two_choices", "unexpected keyword argument 'k'"]),
    ("tb_sched:divides_by_zero", ["raised ZeroDivisionError", "tb_sched.py:"]),
    ("tb_sched:answers_a_tuple", ["returned tuple", "not a testbed.model.policies.Decision"]),
    ("tb_sched:draws_undeclared", ["changed the dispatcher's Context", "stateful=True"]),
    ("tb_sched:reads_load_undeclared", ["changes with the load", "load_aware=True"]),
    ("tb_sched:nothing_here", ["has no attribute 'nothing_here'"]),
    ("tb_sched_missing.sub:policy", ["module 'tb_sched_missing' is not found", "PYTHONPATH"]),
    ("no_such_policy", ["unknown policy 'no_such_policy'", "entry-point group 'testbed.policies'"]),
    ("closest(x=1)", ["built-in policy 'closest' takes no parameters"]),
])
def test_a_plugin_that_cannot_be_used_is_a_plan_error_naming_it(policy, says, sched):
    with pytest.raises(PlanError) as exc:
        _plan("closest", sources=[{"name": "srca", "site": "A", "policy": policy}, {"name": "srcc", "site": "C"}])
    text = str(exc.value)
    assert text.startswith("sources.srca.policy: ") and policy.split("(")[0] in text, text
    for s in says:
        assert s in text, text


def test_a_malformed_reference_is_refused_by_the_schema():
    with pytest.raises(Exception, match="has the keys use"):
        _experiment(policy={"use": "tb_sched:two_choices", "parameters": {"d": 2}})
    with pytest.raises(Exception, match="not a reference"):
        _experiment(policy="tb sched:two choices")
    with pytest.raises(Exception, match=r"'\$\(id\)': not a reference"):  # its name, before its parameters
        _experiment(policy="$(id)")
    assert normalize_ref({"use": "tb_sched:two_choices(d=2)", "params": {"a": "x"}}) == \
        "tb_sched:two_choices(a='x', d=2)"


def test_a_plugin_that_raises_during_a_simulation_stops_it_naming_it(sched, tmp_path, capsys):
    ref = "tb_sched:fails_later(after=9)"
    code = main(["simulate", str(TRIANGLE), "--policy", ref, "--duration", "4s", "--runs-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 4, out
    assert f"policy '{ref}' (tb_sched:fails_later" in out and "RuntimeError" in out
    assert "deliberately broken" in out and "tb_sched.py" in out  # its traceback
    assert not list(tmp_path.iterdir())  # no run directory that looks finished


def test_a_source_process_whose_plugin_raises_exits_4_with_its_traceback(sched, tmp_path):
    """``python -m testbed.emu.source`` (the process testbed run starts in each source host), run
    here outside a network (its queries find no server): it imports the plug-in from its config's
    ``plugin_paths`` alone (not on its PYTHONPATH), and when the plug-in raises it writes the
    traceback to its log and exits 4, the code the run's health watch turns into the run's exit 4."""
    import time

    from testbed.core.util import write_json_atomic
    from testbed.plan.boundaries import SourceConfig

    ref = "tb_sched:fails_later(after=6)"
    plan = _plan(ref, sources=[{"name": "srca", "site": "A"}])
    (tmp_path / "sources").mkdir()
    cfg = SourceConfig.from_plan(plan, "srca", start_ns=time.time_ns() + int(1e9), duration_s=20, run_dir=tmp_path)
    path = write_json_atomic(tmp_path / "srca.json", cfg)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-m", "testbed.emu.source", str(path)], env=env, capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 4, proc.stderr
    assert "the policy failed while dispatching" in proc.stderr and "Traceback" in proc.stderr
    assert "deliberately broken" in proc.stderr and "tb_sched.py" in proc.stderr
    tally = json.loads((tmp_path / "sources" / "srca.tally.json").read_text())
    assert 0 < tally["created"] == tally["written"]  # the queries dispatched before it raised are on record


def test_a_plugin_raising_in_the_engine_is_a_policy_failure(sched):
    from testbed.sim import Simulator

    sim = Simulator(_plan("tb_sched:fails_later(after=7)"))
    with pytest.raises(PolicyFailure) as exc:
        sim.run_until(8.0)
    assert exc.value.exit_code == 4 and isinstance(exc.value.__cause__, RuntimeError)


def test_sweep_runs_a_plugin_in_its_worker_processes(sched, tmp_path, capsys):
    ref = "tb_sched:two_choices(d=2)"
    code = main(["sweep", str(TRIANGLE), "--policies", f"closest, {ref}", "--seeds", "1", "--jobs", "2",
                 "--duration", "3s", "--out", str(tmp_path)])
    assert code == 0, capsys.readouterr().out
    runs = pd.read_csv(tmp_path / "runs.csv")
    assert sorted(runs["policy"]) == sorted(["closest", ref]) and (runs["queries"] > 0).all()


def test_sweep_refuses_a_plugin_that_cannot_be_used_before_running(sched, tmp_path, capsys):
    code = main(["sweep", str(TRIANGLE), "--policies", "closest,tb_sched:short_signature", "--seeds", "1",
                 "--out", str(tmp_path / "out")])
    assert code == 2 and "--policies: policy 'tb_sched:short_signature'" in capsys.readouterr().out
    assert not (tmp_path / "out").exists()


def test_a_plugin_is_an_aset_action(sched):
    from testbed.aset.envs import AsetSimEnv
    from testbed.plan.policy_resolution import aset_actions
    from testbed.spec.aset import AsetConfig

    ref = "tb_sched:two_choices(d=2)"
    cfg = AsetConfig.model_validate({"name": "plug", "actions": ["closest", {"use": "tb_sched:two_choices",
                                                                            "params": {"d": 2}}]})
    actions = aset_actions(cfg)
    assert actions == ("closest", ref)
    env = AsetSimEnv(_plan("closest"), cfg.observation, 2.0, policies=actions)
    env.reset(seed=1)
    truncated = False
    while not truncated:
        _, _, _, truncated, _ = env.step(np.ones(len(env.contexts), dtype=np.int64))
    pols = set(env.sim.query_table()["policy"])
    assert ref in pols
    with pytest.raises(Exception, match="actions: policy 'tb_sched:divides_by_zero'"):
        aset_actions(AsetConfig.model_validate({"name": "plug", "actions": ["closest", "tb_sched:divides_by_zero"]}))


def test_train_and_evaluate_take_a_plugin_action(example_installed, tmp_path, capsys):
    """testbed train and testbed evaluate on an ASET config whose actions hold the entry-point
    plug-in in the mapping form: the agent is trained on it and it is evaluated as a static policy."""
    cfg = yaml.safe_load((REPO / "experiments" / "aset-tiny.yaml").read_text())
    cfg.update(name="plug", actions=["closest", "least_loaded", {"use": "slack", "params": {"margin_ms": 20}}])
    cfg["training"].update(scenarios=[str(TRIANGLE)], steps=100, out_dir=str(tmp_path / "train"))
    cfg["evaluation"].update(scenarios=[str(TRIANGLE)], out_dir=str(tmp_path / "eval"),
                             checkpoint=str(tmp_path / "train" / "plug" / "seed-1" / "policy"))
    path = tmp_path / "aset-plug.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["train", str(path)]) == 0, capsys.readouterr().out
    assert main(["evaluate", str(path)]) == 0, capsys.readouterr().out
    runs = pd.read_csv(tmp_path / "eval" / "plug" / "runs.csv")
    static = runs[(runs["row"] == "slack(margin_ms=20)") & (runs["seeds"] == "evaluation")]
    assert len(static) == 2 and static["success_ratio"].notna().all()  # one run per seed, with queries


def test_unknown_names_still_list_the_builtins_and_a_close_match():
    with pytest.raises(UnknownNameError, match=r"did you mean 'closest'"):
        REGISTRY.resolve("closet", "policy")


# --------------------------------------------------------------------------- the emulation (root, Mininet)

def _emulated(tmp_path: Path, policy: str, duration_s: float) -> tuple[int, Path]:
    from testbed.results.runs import run_emulation

    code = run_emulation(_plan(policy), runs_dir=tmp_path, duration_s=duration_s)
    return code, next(tmp_path.iterdir())


@pytest.mark.emulation
@pytest.mark.skipif(os.geteuid() != 0, reason="emulation needs root")
def test_emulation_runs_a_module_plugin_on_real_packets(sched, tmp_path):
    ref = "tb_sched:two_choices(d=2)"
    code, run_dir = _emulated(tmp_path / "runs", ref, 6)
    assert code == 0
    df = pd.read_csv(run_dir / "records.csv")
    assert len(df) >= 20 and set(df["policy"]) == {ref}
    assert (df["outcome"] == "success").mean() > 0.5
    assert set(df.loc[df["source"] == "srca", "cluster"]) == {"edgeb", "edgec"}  # two choices, not closest's one
    run = json.loads((run_dir / "run.json").read_text())
    assert run["policy_plugins"][ref]["sha256"] == hashlib.sha256((sched / "tb_sched.py").read_bytes()).hexdigest()


@pytest.mark.emulation
@pytest.mark.skipif(os.geteuid() != 0, reason="emulation needs root")
def test_emulation_stops_with_exit_4_when_a_plugin_raises(sched, tmp_path):
    ref = "tb_sched:fails_later(after=8)"
    code, run_dir = _emulated(tmp_path / "runs", ref, 20)
    assert code == 4
    logs = [(run_dir / "logs" / f"source-{s}.log").read_text() for s in ("srca", "srcc")]
    broke = [log for log in logs if "the policy failed while dispatching" in log]
    assert broke, logs
    assert "Traceback" in broke[0] and "deliberately broken" in broke[0] and "tb_sched.py" in broke[0]
    run = json.loads((run_dir / "run.json").read_text())
    assert run["exit_code"] == 4 and run["status"] == "failed"
    assert any(i["component"].startswith("source-") for i in run["health"]["incidents"])

