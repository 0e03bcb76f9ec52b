"""ASET over the real discrete-event simulator (testbed.sim): Gymnasium checks, determinism per
seed, the arrival counter and an end-to-end train -> export -> evaluate smoke run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from testbed.aset.envs import AsetSimEnv
from testbed.model.policies import CATALOGUE
from testbed.plan.build import plan_experiment
from testbed.plan.policies import aset_actions
from testbed.spec.aset import ObservationSpec

REPO = Path(__file__).resolve().parent.parent
TRIANGLE = REPO / "experiments" / "triangle.yaml"
SPEC = ObservationSpec()


@pytest.fixture(scope="module")
def plan():
    return plan_experiment(TRIANGLE)


def test_check_env_passes_on_real_simulator(plan):
    from gymnasium.utils.env_checker import check_env

    env = AsetSimEnv(plan, SPEC, 3.0)
    check_env(env, skip_render_check=True)
    assert env.observation_space.shape == (len(plan.sources), env.obs_size)


def _episode(env, seed, actions):
    obs, _ = env.reset(seed=seed)
    seen, trans = [obs], []
    for a in actions:
        obs, _, _, done, info = env.step(a)
        seen.append(obs)
        trans += [(t[0], t[2], round(t[3], 9)) for t in info["transitions"]]
        if done:
            return np.stack(seen), trans, info
    raise AssertionError("episode did not end")


def test_real_env_deterministic_per_seed_and_counts_every_query(plan):
    env = AsetSimEnv(plan, SPEC, 4.0)
    acts = np.random.default_rng(3).integers(0, len(CATALOGUE), (40, len(plan.sources)))
    a, ta, ia = _episode(env, 11, acts)
    b, tb, ib = _episode(env, 11, acts)
    c, _, ic = _episode(env, 12, acts)
    np.testing.assert_array_equal(a, b)
    assert ta == tb and ia["success_ratio"] == ib["success_ratio"] and ia["queries"] == ib["queries"]
    assert not np.array_equal(a, c)
    # every query created in the episode settled into exactly one window's reward
    n = ia["queries"]
    assert n > 0 and len(ta) <= 40 * len(plan.sources)
    # the arrival features saw every created query: rate features sum back to the query count
    k = SPEC.history_windows
    scale = SPEC.window_ms / 1e3 * SPEC.rate_scale_qps
    newest = a[1:, :, k - 1]  # newest rate of the single application, per window and source
    assert int(round(float(newest.sum()) * scale)) == n


def test_ci95_and_verdicts_exact():
    from testbed.aset.evaluate import summarise
    from testbed.core.util import ci95

    m, h = ci95([1.0, 2.0, 3.0])
    assert m == 2.0 and h == pytest.approx(4.302652729911275 / np.sqrt(3), rel=1e-9)
    table = {"closest": [0.90, 0.92, 0.94], "cloud": [0.80, 0.80, 0.80], "mix": [0.91, 0.93, 0.95],
             "oracle": [0.97, 0.98, 0.99], "aset": [0.95, 0.96, 0.99]}
    runs = [{"scenario": "s", "kind": "tuning", "policy": p, "seed": k, "success_ratio": v}
            for p, vals in table.items() for k, v in enumerate(vals, 1)]
    (row,) = summarise(runs, ["closest", "cloud"])
    assert row["best_static"] == "closest" and row["kind"] == "tuning"
    assert row["diff"][0] == pytest.approx(0.0466666667)
    assert row["headroom"][0] == pytest.approx(0.06) and row["captured"] == pytest.approx(0.0466666667 / 0.06)
    assert row["within_1pt"] and row["above_beyond_ci"]  # paired diffs 0.05, 0.04, 0.05 (and 0.04, 0.03, 0.04)
    runs[-1]["success_ratio"] = 0.90  # paired diffs 0.05, 0.04, -0.04: CI crosses 0
    (row,) = summarise(runs, ["closest", "cloud"])
    assert row["within_1pt"] and not row["above_beyond_ci"]
    # fresh seeds keep the best static policy chosen on the tuning seeds, even if another wins there
    runs += [{"scenario": "s", "kind": "fresh", "policy": p, "seed": 100 + k, "success_ratio": v}
             for p, vals in {"closest": [0.5, 0.5], "cloud": [0.6, 0.7]}.items() for k, v in enumerate(vals)]
    tuning, fresh = summarise(runs, ["closest", "cloud"])
    assert fresh["best_static"] == "closest" and fresh["winner"] == "cloud"


def test_train_then_evaluate_end_to_end_on_triangle(tmp_path):
    """aset-tiny (150 steps) on the real simulator, then evaluate: 2 seeds x (7 static + ASET)."""
    from testbed.aset.evaluate import evaluate
    from testbed.aset.train import train
    from testbed.spec.aset import load_aset_config

    cfg, base = load_aset_config(REPO / "experiments" / "aset-tiny.yaml")
    cfg = cfg.model_copy(update={"training": cfg.training.model_copy(update={"out_dir": str(tmp_path)})})
    res = train(cfg, base, steps=150, progress=False)
    assert res.policy_path.with_suffix(".npz").is_file() and len(res.episodes) == 15
    assert {e["scenario"] for e in res.episodes} == {"triangle"}
    assert (res.out_dir / "checkpoints" / "ckpt-150.index").is_file()
    ev = cfg.evaluation.model_copy(update={"checkpoint": str(res.policy_path), "out_dir": str(tmp_path / "ev"),
                                           "duration_s": 3.0})
    out = evaluate(cfg.model_copy(update={"evaluation": ev}), base, seeds=2, workers=1, progress=False)
    acts = aset_actions(cfg)  # the config's actions: the 7 the shipped checkpoints have, not the whole catalogue
    assert acts == tuple(CATALOGUE)[:7] and len(CATALOGUE) > 7
    assert len(out.runs) == 2 * (len(acts) + 3)  # every static, the mix, the oracle, ASET
    assert {r["policy"] for r in out.runs} == {*acts, "mix", "oracle", "aset"}
    (row,) = out.table
    assert row["scenario"] == "triangle" and row["aset"][2] == 2
    for f in ("runs.csv", "results.csv", "results.md", "results.png", "oracle.json", "agreement.md"):
        assert (out.out_dir / f).is_file()
    # same seed -> same arrivals for every schedule (common random numbers)
    assert len({r["n"] for r in out.runs if r["seed"] == 1}) == 1
    # the oracle is never below the best static policy nor the mix, seed by seed
    for k in (1, 2):
        by = {r["policy"]: r["success_ratio"] for r in out.runs if r["seed"] == k}
        assert by["oracle"] >= by["mix"] - 1e-12 and by["oracle"] >= by[row["best_static"]] - 1e-12


def test_specialise_starts_from_the_general_network_and_evaluates_per_scenario(tmp_path):
    """aset-tiny: the general run (1 seed, 100 steps), then --specialise (50 steps on the triangle
    from its last checkpoint), then evaluate --specialised: ASET's rows use the specialised file."""
    import json

    from testbed.agent.npolicy import NumpyPolicy
    from testbed.aset.evaluate import evaluate
    from testbed.aset.train import last_checkpoint, specialise, specialised_path, train_seeds
    from testbed.spec.aset import load_aset_config

    cfg, base = load_aset_config(REPO / "experiments" / "aset-tiny.yaml")
    export = tmp_path / "aset"
    tr = cfg.training.model_copy(update={"out_dir": str(tmp_path), "seeds": [1], "export_to": str(export)})
    cfg = cfg.model_copy(update={"training": tr})
    with pytest.raises(FileNotFoundError, match="no training checkpoint"):
        specialise(cfg, base)
    train_seeds(cfg, base, steps=100)
    assert last_checkpoint(tmp_path / "aset-tiny" / "seed-1").name == "ckpt-100"
    (res,) = specialise(cfg, base, steps=50)
    spec = specialised_path(export, "triangle")
    assert spec.name == "aset-triangle" and spec.with_suffix(".npz").is_file()
    assert len(res.episodes) == 5 and res.out_dir == tmp_path / "aset-tiny" / "specialised" / "triangle"
    # it started from the general network (epsilon from training.specialise, not from 1.0) and moved on
    assert res.episodes[0]["epsilon"] <= cfg.training.specialise.epsilon_start
    general, special = NumpyPolicy(export), NumpyPolicy(spec)
    assert json.loads(spec.with_suffix(".json").read_text())["meta"]["steps"] == 50
    assert any(not np.array_equal(a[0], b[0]) for a, b in zip(general.layers, special.layers, strict=True))
    ev = cfg.evaluation.model_copy(update={"checkpoint": str(export), "out_dir": str(tmp_path / "ev"),
                                           "duration_s": 3.0})
    ecfg = cfg.model_copy(update={"evaluation": ev})
    out = evaluate(ecfg, base, seeds=2, workers=1, progress=False, specialised=True, agreement_check=False)
    assert out.out_dir.name == "aset-tiny-specialised" and out.table[0]["aset"][2] == 2
    spec.with_suffix(".npz").unlink()
    with pytest.raises(FileNotFoundError, match="testbed train --specialise"):
        evaluate(ecfg, base, seeds=2, workers=1, progress=False, specialised=True)


def test_specialise_from_the_command_line_without_jobs(tmp_path):
    """``testbed train CONFIG --specialise`` with ``--jobs`` left out (it used to crash on
    ``max(1, None)``): one worker, exit 0, the specialised file exported."""
    import yaml

    from testbed.aset.train import specialised_path
    from testbed.cli.main import main

    d = yaml.safe_load((REPO / "experiments" / "aset-tiny.yaml").read_text())
    d["training"].update({"scenarios": [str(TRIANGLE)], "seeds": [1], "steps": 100, "out_dir": str(tmp_path / "runs"),
                          "export_to": str(tmp_path / "aset")})
    d["evaluation"].update({"scenarios": [str(TRIANGLE)], "checkpoint": str(tmp_path / "aset"),
                            "out_dir": str(tmp_path / "ev")})
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(d))
    assert main(["train", str(path)]) == 0
    assert main(["train", str(path), "--specialise", "--steps", "50"]) == 0
    assert specialised_path(tmp_path / "aset", "triangle").with_suffix(".npz").is_file()


def test_a_mix_baseline_gives_zero_reward_to_the_agent_that_plays_the_mix():
    """reward.baseline_mix: the baseline run applies the scenario's per-source assignment; an agent
    applying that same assignment every window gets exactly 0 in every transition, and the same
    episode figure as the baseline run; another assignment does not (capacity: the triangle
    succeeds under every policy)."""
    from testbed.spec.aset import RewardSpec

    plan = plan_experiment(REPO / "experiments" / "scenario-capacity.yaml")
    srcs = sorted(h.name for h in plan.sources)
    mix = ["min_latency", "closest", "max_accuracy", "least_loaded"][:len(srcs)]
    env = AsetSimEnv(plan, SPEC, 4.0, reward=RewardSpec(baseline_mix={plan.experiment.name: mix}, team_weight=0.5))
    same = np.array([[CATALOGUE.index(p) for p in mix]] * 40)
    _, trans, info = _episode(env, 5, same)
    assert trans and all(r == 0.0 for _, _, r in trans)
    assert info["baseline_success_ratio"] == info["success_ratio"]
    other = np.array([[CATALOGUE.index("closest")] * len(srcs)] * 40)
    _, trans2, info2 = _episode(env, 5, other)
    assert any(r != 0.0 for _, _, r in trans2)
    assert info2["baseline_success_ratio"] == info["baseline_success_ratio"]


def test_a_mix_baseline_that_does_not_fit_is_refused_naming_it(plan):
    from testbed.aset.train import check_reward_baselines
    from testbed.plan.policies import check_aset_policies
    from testbed.spec.aset import AsetConfig, RewardSpec
    from testbed.spec.experiment import ConfigError

    name, n = plan.experiment.name, len(plan.sources)
    with pytest.raises(ValueError, match=r"reward.baseline_mix.x: unknown policy 'fastest'"):
        check_aset_policies(AsetConfig.model_validate({"name": "t", "reward": {"baseline_mix": {"x": ["fastest"]}}}))
    with pytest.raises(ConfigError, match=r"reward.baseline_mix.nosuch: no training scenario"):
        check_reward_baselines(RewardSpec(baseline_mix={"nosuch": ["cloud"] * n}), [plan])
    with pytest.raises(ConfigError, match=rf"reward.baseline_mix.{name}: {n + 1} policies for {n} sources"):
        check_reward_baselines(RewardSpec(baseline_mix={name: ["cloud"] * (n + 1)}), [plan])
    other = plan.model_copy(update={"experiment": plan.experiment.model_copy(update={"name": "other"})})
    with pytest.raises(ConfigError, match=r"no mix for training scenario 'other', and no reward.baseline"):
        check_reward_baselines(RewardSpec(baseline_mix={name: ["cloud"] * n}), [plan, other])
    check_reward_baselines(RewardSpec(baseline="min_latency", baseline_mix={name: ["cloud"] * n}), [plan, other])
    fallback = RewardSpec(baseline="closest", baseline_mix={name: ["cloud"] * n})
    assert fallback.baseline_for("other", n) == ["closest"] * n
    assert RewardSpec().baseline_for(name, n) is None


def test_the_evaluation_cache_key_follows_the_profiles_and_the_code(tmp_path, monkeypatch):
    """A cached result must not outlive what produced it: re-measured profiles (e.g.
    handling.json), a changed zoo manifest or changed package code give a new key; a file the
    simulation does not read does not."""
    import shutil

    from testbed.aset import evaluate as ev

    prof, zoo = tmp_path / "profiles", tmp_path / "zoo"
    prof.mkdir()
    zoo.mkdir()
    (prof / "handling.json").write_text('{"a": 1}')
    (zoo / "manifest.json").write_text("{}")
    (zoo / "README").write_text("not read")
    scen = tmp_path / "exp.yaml"

    def key() -> str:
        ev.code_fingerprint.cache_clear()
        ev.inputs_fingerprint.cache_clear()
        return ev.task_key(ev.static_job, (str(scen), 1, ["min_latency"], None))

    shutil.copy(TRIANGLE, scen)
    text = scen.read_text() + f"\nzoo_dir: {zoo}\nprofiles_dir: {prof}\n"
    scen.write_text(text)
    k0 = key()
    assert key() == k0
    (zoo / "README").write_text("still not read")
    assert key() == k0
    (prof / "handling.json").write_text('{"a": 2}')
    k1 = key()
    assert k1 != k0
    (zoo / "manifest.json").write_text('{"v": 1}')
    k2 = key()
    assert k2 not in (k0, k1)
    (tmp_path / "topo.yaml").write_bytes((REPO / "topologies" / "triangle.yaml").read_bytes())
    scen.write_text(text.replace("source: ../topologies/triangle.yaml", f"source: {tmp_path / 'topo.yaml'}"))
    k3 = key()
    (tmp_path / "topo.yaml").write_text((tmp_path / "topo.yaml").read_text() + "\n# a changed link\n")
    assert key() != k3
    monkeypatch.setattr(ev, "code_fingerprint", lambda: "another tree")
    assert ev.task_key(ev.static_job, (str(scen), 1, ["min_latency"], None)) not in (k2, k3)


def test_the_evaluation_cache_key_covers_the_checkpoints_json_and_dotted_names(tmp_path):
    """The decision rule (plan_margin), the plans and the observation spec live in the policy's
    JSON: a changed JSON with the same weights is another policy, so another key. A checkpoint
    named with a dot (aset-v1.2) is the pair aset-v1.2.npz / .json, not aset-v1.npz."""
    import json

    import numpy as np

    from testbed.agent.npolicy import policy_files
    from testbed.aset import evaluate as ev

    assert policy_files(tmp_path / "aset-v1.2") == (tmp_path / "aset-v1.2.npz", tmp_path / "aset-v1.2.json")
    assert policy_files(tmp_path / "aset-v1.2.json") == policy_files(tmp_path / "aset-v1.2.npz")
    npz, meta = policy_files(tmp_path / "aset-v1.2")
    np.savez(npz, w0=np.zeros((2, 2)), w1=np.zeros(2))
    meta.write_text(json.dumps({"plan_margin": 0.02}))

    def key() -> str:
        return ev.task_key(ev.aset_job, (str(TRIANGLE), 1, str(tmp_path / "aset-v1.2"), None))

    k0 = key()
    assert key() == k0
    meta.write_text(json.dumps({"plan_margin": 0.05}))
    k1 = key()
    assert k1 != k0
    np.savez(npz, w0=np.ones((2, 2)), w1=np.zeros(2))
    assert key() not in (k0, k1)
