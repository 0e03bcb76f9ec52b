"""ASET over the real discrete-event simulator (testbed.sim): Gymnasium checks, determinism per
seed, the arrival counter and an end-to-end train -> export -> evaluate smoke run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from testbed.aset.envs import AsetSimEnv
from testbed.model.policies import CATALOGUE
from testbed.plan.build import plan_experiment
from testbed.plan.policy_resolution import aset_actions
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


def test_ci95_and_the_paired_test_exact():
    from scipy import stats

    from testbed.core.util import ci95, paired_test

    m, h = ci95([1.0, 2.0, 3.0])
    assert m == 2.0 and h == pytest.approx(4.302652729911275 / np.sqrt(3), rel=1e-9)
    a, b = [95.0, 96.0, 99.0], [90.0, 92.0, 94.0]
    g = paired_test(a, b)
    assert g["mean"] == pytest.approx(14 / 3) and g["n"] == 3
    assert g["ci"] == pytest.approx(ci95([5.0, 4.0, 5.0])[1]) and g["p"] == pytest.approx(stats.ttest_rel(a, b).pvalue)
    assert paired_test([1.0, float("nan"), 3.0], [0.0, 1.0, 2.0])["n"] == 2  # a seed without queries: no pair
    assert paired_test([1.0, 2.0], [1.0, 2.0])["p"] == 1.0


def test_train_then_evaluate_end_to_end_on_triangle(tmp_path):
    """aset-tiny (150 steps) on the real simulator, then evaluate: every static, the mix, the
    oracle and ASET on the evaluation seeds, chosen on the tuning seeds."""
    from testbed.aset.dqn import train
    from testbed.aset.evaluate import ORACLE, Protocol, evaluate
    from testbed.spec.aset import load_aset_config

    cfg, base = load_aset_config(REPO / "experiments" / "aset-tiny.yaml")
    cfg = cfg.model_copy(update={"training": cfg.training.model_copy(update={"out_dir": str(tmp_path)})})
    res = train(cfg, base, steps=150, progress=False)
    assert res.policy_path.with_suffix(".npz").is_file() and len(res.episodes) == 15
    assert {e["scenario"] for e in res.episodes} == {"triangle"}
    assert (res.out_dir / "checkpoints" / "ckpt-150.index").is_file()
    acts = aset_actions(cfg)  # the config's actions: every built-in policy
    assert acts == tuple(CATALOGUE) and len(CATALOGUE) == 9
    p = Protocol(tuning=[1, 2], seeds=[3, 4, 5, 6, 7], actions=list(acts), reference_seeds=5, duration_s=3.0,
                 fresh=False)
    out = evaluate([str(TRIANGLE)], p, tmp_path / "ev", agents={"ASET": str(res.policy_path)}, workers=1,
                   progress=False)
    (row,) = out.rows
    assert row["scenario"] == "triangle" and row["rows"]["ASET"]["seeds"] == 5
    assert set(row["rows"]) == {*acts, "best static", "mix", ORACLE, "ASET"}
    assert abs(sum(row["agents"]["ASET"]["shares"].values()) - 1) < 1e-9
    for f in ("runs.csv", "results.json", "results.md", "choices.json"):
        assert (out.out / f).is_file()
    # the oracle is never below the best static policy nor the mix, seed by seed
    by = {}
    for r in out.runs:
        if r["seeds"] == "evaluation":
            by.setdefault(r["seed"], {})[r["row"]] = r["success_ratio"]
    for k in p.seeds:
        assert by[k][ORACLE] >= by[k]["mix"] - 1e-12 and by[k][ORACLE] >= by[k]["best static"] - 1e-12


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
    from testbed.aset.scenarios import check_reward_baselines
    from testbed.plan.policy_resolution import check_aset_policies
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

    from testbed.aset import jobs as ev

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
    """The decision rule (plan_margin), the plans and the observation spec live in the checkpoint's
    JSON: a changed JSON with the same weights is another agent, so another key. A checkpoint
    named with a dot (aset-v1.2) is the pair aset-v1.2.npz / .json, not aset-v1.npz."""
    import json

    import numpy as np

    from testbed.agent.checkpoint import checkpoint_files
    from testbed.aset import jobs as ev
    from testbed.spec.experiment import AsetSpec

    assert checkpoint_files(tmp_path / "aset-v1.2") == (tmp_path / "aset-v1.2.npz", tmp_path / "aset-v1.2.json")
    assert checkpoint_files(tmp_path / "aset-v1.2.json") == checkpoint_files(tmp_path / "aset-v1.2.npz")
    npz, meta = checkpoint_files(tmp_path / "aset-v1.2")
    np.savez(npz, w0=np.zeros((2, 2)), w1=np.zeros(2))
    meta.write_text(json.dumps({"plan_margin": 0.02}))
    agent = AsetSpec(checkpoint=str(tmp_path / "aset-v1.2")).model_dump_json()

    def key() -> str:
        return ev.task_key(ev.agent_job, (str(TRIANGLE), 1, agent, None))

    k0 = key()
    assert key() == k0
    meta.write_text(json.dumps({"plan_margin": 0.05}))
    k1 = key()
    assert k1 != k0
    np.savez(npz, w0=np.ones((2, 2)), w1=np.zeros(2))
    assert key() not in (k0, k1)
