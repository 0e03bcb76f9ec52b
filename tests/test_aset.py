"""ASET: observation, environments, agent, checkpoints and the live selector (no emulation).

The environment tests here drive :class:`AsetSimEnv` with a small fake simulator implementing the
simulator contract of issue 4 (pure logic: arrivals and outcomes are scripted); the tests against
the real simulator are in ``tests/test_aset_sim.py``.
"""

from __future__ import annotations

import heapq
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from testbed.agent.observation import (
    SourceContext,
    SourceObserver,
    context_size,
    observation_layout,
    observation_size,
)
from testbed.aset.envs import AsetSimEnv
from testbed.model.policies import CATALOGUE
from testbed.plan.build import build_plan, plan_experiment
from testbed.plan.policy_resolution import check_aset_policies
from testbed.spec.aset import AgentSpec, AsetConfig, ObservationSpec, TrainingSpec, load_aset_config
from testbed.spec.experiment import ConfigError

REPO = Path(__file__).resolve().parent.parent
TRIANGLE = REPO / "experiments" / "triangle.yaml"


@dataclass
class Resolved:
    source: str
    application: str
    policy: str
    t0_s: float
    resolved_s: float
    success: bool
    failure_cause: str


class FakeSim:
    """Scripted simulator (same methods as testbed.sim.Simulator): Poisson arrivals of ``rate``
    q/s per (source, application); a query succeeds iff its source's policy is ``good``; it
    resolves ``e2e_s`` after creation."""

    good = "least_loaded"
    rate = 40.0
    e2e_s = 0.03

    def __init__(self, plan, seed, policies=None):
        self.rng = np.random.default_rng(seed)
        self.now_s = 0.0
        self.sources = [s.name for s in plan.sources]
        self.apps = [a.name for a in plan.experiment.applications]
        self.clusters = [c.name for c in plan.clusters]
        self.policy = {s: self.policy_names[0] for s in self.sources} | dict(policies or {})
        self.next = {(s, a): float(self.rng.exponential(1 / self.rate)) for s in self.sources for a in self.apps}
        self.inflight: list = []
        self.resolved: list = []
        self.created: list = []

    policy_names = list(CATALOGUE)

    def set_policy(self, source, policy):
        self.policy[source] = policy

    def run_until(self, t_s):
        for key in sorted(self.next):
            while self.next[key] <= t_s:
                t0 = self.next[key]
                s, a = key
                ok = self.policy[s] == self.good
                heapq.heappush(self.inflight, (t0 + self.e2e_s, t0, s, a, self.policy[s], ok))
                self.created.append((s, a))
                self.next[key] = t0 + float(self.rng.exponential(1 / self.rate))
        while self.inflight and self.inflight[0][0] <= t_s:
            tr, t0, s, a, p, ok = heapq.heappop(self.inflight)
            self.resolved.append(Resolved(s, a, p, t0, tr, ok, "" if ok else "deadline_miss"))
        self.now_s = t_s

    def drain_resolved(self):
        out, self.resolved = self.resolved, []
        return out

    def drain_created(self):
        out, self.created = self.created, []
        return out

    def cluster_state(self, source=None):
        return {c: {"queue_len": i, "busy": 1, "workers": 2, "utilization": 0.25 * (i + 1), "up": True}
                for i, c in enumerate(self.clusters)}

    def link_utilization(self):
        return {("s1", "s2"): 0.5}

    def path_links(self, source, cluster):
        return [("s2", "s1")]


@pytest.fixture(scope="module")
def plan():
    return plan_experiment(TRIANGLE)


SPEC = ObservationSpec(window_ms=100, history_windows=2, rate_scale_qps=10, queue_scale=2, rtt_scale_ms=50, clip=5)


def test_observation_layout_exact_values():
    ctx = SourceContext("srca", ("appa", "appb"), ("c1", "c2"), (10.0, 200.0), ("closest", "cloud", "random"),
                        (50.0, 100.0), sources=("srca", "srcb"))
    obs = SourceObserver(ctx, SPEC)
    assert obs.size == observation_size(2, 2, 3, 2, 2) == 2 * 2 + 8 * 2 + 2 + 3 + 2
    state = {"arrivals": {"appa": 3, "appb": 0, "other": 9},
             "clusters": {"c1": {"queue_len": 8, "busy": 2, "workers": 2, "utilization": 0.5, "up": True}},
             "path_util": {"c1": 0.25, "c2": 0.75},
             "resolved": [("appa", True), ("appa", False, 0.5), ("appa", True, 0.6, "c1", 25.0),
                          ("appa", True, 0.7, "c1", 35.0), ("appb", False, 0.7, "c2", None)],
             "in_flight": {"c1": 6}, "report_age_s": {"c1": 0.05, "c2": 0.2},
             "policy": "cloud"}
    v = obs.observe(state)
    expect = [0.0, 3.0,            # appa rate history (3 queries / 0.1 s / 10 q/s), oldest first
              0.0, 0.0,            # appb
              0.5, 0.0,            # utilization (c2 missing -> down -> 0)
              2.0, 0.0,            # queue per worker / queue_scale = 8 / 2 / 2
              0.2, 4.0,            # rtt / 50 ms
              1.0, 0.0,            # up
              0.25, 0.75,          # path util
              0.6, 5.0,            # e2e / deadline: c1 (25 + 35) / 2 / 50; c2 no answer (100 + 2000) / 100, clipped
              0.5, 2.0,            # report age / window (0.1 s)
              1.5, 0.0,            # in flight / workers / queue_scale = 6 / 2 / 2 (c2: no entry)
              0.75, 0.0,           # success ratio per app (appa 3/4, appb 0/1)
              0.0, 1.0, 0.0,       # policy one-hot
              1.0, 0.0]            # source identity one-hot: srca is source 0 of (srca, srcb)
    assert v.dtype == np.float32
    np.testing.assert_allclose(v, expect, rtol=1e-6)
    v2 = obs.observe({"arrivals": {"appa": 100}, "policy": "closest"})
    assert v2[0] == pytest.approx(3.0) and v2[1] == 5.0  # history shifted; 100 q clipped to clip=5
    assert v2[14] == pytest.approx(0.6)  # measured latency kept when nothing resolved there
    assert v2[20] == pytest.approx(0.75) and v2[16] == 0.0  # success kept; no report age given -> 0
    layout = observation_layout(2, 2, 3, 2, 2)
    assert (layout["policy"], layout["source_id"]) == (slice(22, 25), slice(25, 27))
    with pytest.raises(ValueError, match="not once in the experiment's sources"):
        SourceContext("srcz", ("appa",), ("c1",), (1.0,), ("closest",), sources=("srca", "srcb"))


def _same_state_two_sources(ctx_a: SourceContext, ctx_b: SourceContext, spec: ObservationSpec, states: list) -> tuple:
    oa, ob = SourceObserver(ctx_a, spec), SourceObserver(ctx_b, spec)
    return np.stack([oa.observe(st) for st in states]), np.stack([ob.observe(st) for st in states])


def test_observations_of_two_sources_differ_only_in_the_source_id(plan):
    """Same window states, same RTTs: every feature equal but the identity one-hot, which is each
    source's own index (the env's rows are the sources in sorted order)."""
    from testbed.aset.envs import plan_contexts

    ca, cc = plan_contexts(plan, CATALOGUE)
    assert (ca.source, cc.source) == ("srca", "srcc") and ca.sources == cc.sources == ("srca", "srcc")
    cc_same_rtt = SourceContext(cc.source, cc.applications, cc.clusters, ca.rtt_ms, cc.policies, cc.deadline_ms,
                                sources=cc.sources)
    sim = FakeSim(plan, 0)
    states = [{"arrivals": {"digits": k}, "clusters": sim.cluster_state(), "path_util": {ca.clusters[0]: 0.1 * k},
               "resolved": [("digits", k % 2 == 0, 0.1 * k, ca.clusters[0], 20.0 + k)],
               "in_flight": {ca.clusters[-1]: k}, "policy": CATALOGUE[k % len(CATALOGUE)]} for k in range(6)]
    va, vc = _same_state_two_sources(ca, cc_same_rtt, SPEC, states)
    ids = observation_layout(1, len(ca.clusters), len(CATALOGUE), SPEC.history_windows, 2)["source_id"]
    assert va.shape == vc.shape == (6, context_size(ca, SPEC)) and ids.stop == va.shape[1]
    rest = np.ones(va.shape[1], bool)
    rest[ids] = False
    np.testing.assert_array_equal(va[:, rest], vc[:, rest])
    np.testing.assert_array_equal(va[:, ids], np.tile([1.0, 0.0], (6, 1)))
    np.testing.assert_array_equal(vc[:, ids], np.tile([0.0, 1.0], (6, 1)))
    # in the env every row carries its own source's identity
    env = AsetSimEnv(plan, SPEC, 1.0, simulator_factory=FakeSim)
    obs, _ = env.reset(seed=1)
    np.testing.assert_array_equal(obs[:, ids], np.eye(2, dtype=np.float32))


def test_config_errors_name_the_item(tmp_path):
    bad = tmp_path / "x.yaml"
    bad.write_text("name: t\nagent: {gamma: 1.5}\nobservation: {window: 10}\n")
    with pytest.raises(ConfigError) as exc:
        load_aset_config(bad)
    msg = str(exc.value)
    assert "agent.gamma" in msg and "observation" in msg and "window" in msg
    bad.write_text("name: t\nagent: {hiden: [3]}\n")
    with pytest.raises(ConfigError, match="agent.hiden: unknown key"):
        load_aset_config(bad)
    for actions, said in (("[]", "0 policies"), ("[closest]", "1 policy")):
        bad.write_text(f"name: t\nactions: {actions}\n")
        with pytest.raises(ConfigError, match=f"actions: {said}: ASET needs at least 2"):
            load_aset_config(bad)


def test_aset_config_files_validate():
    import yaml

    files = [f for f in sorted((REPO / "experiments").glob("aset-*.yaml"))
             if "topology" not in yaml.safe_load(f.read_text())]
    assert len(files) >= 2, "no experiments/aset-*.yaml ASET configs"
    for f in files:
        cfg, base = load_aset_config(f)
        assert base == REPO and cfg.agent.hidden == [64, 64]
        scenarios = [*(cfg.training.scenarios if cfg.training else []),
                     *(cfg.evaluation.scenarios if cfg.evaluation else [])]
        for sc in scenarios:  # issue 13: the decision window is at least the report interval
            assert cfg.observation.window_ms >= plan_experiment(REPO / sc).experiment.report_interval_s * 1e3


def test_check_env_passes_on_sim_env_with_fake(plan):
    from gymnasium.utils.env_checker import check_env

    env = AsetSimEnv(plan, SPEC, 1.0, simulator_factory=FakeSim)
    check_env(env, skip_render_check=True)
    assert env.observation_space.shape == (2, env.obs_size)
    assert env.action_space.nvec.tolist() == [len(CATALOGUE)] * 2


def _rollout(env, seed, n):
    obs, _ = env.reset(seed=seed)
    acts = np.random.default_rng(99)
    out = [obs]
    trans = []
    for _ in range(n):
        obs, r, term, trunc, info = env.step(acts.integers(0, len(CATALOGUE), 2))
        out.append(obs)
        trans += [(t[0], t[2], t[3]) for t in info["transitions"]]
        if trunc:
            break
    return np.stack(out), trans, info


def test_env_is_deterministic_per_seed_and_settles_rewards(plan):
    env = AsetSimEnv(plan, SPEC, 2.0, simulator_factory=FakeSim)
    a, ta, info = _rollout(env, 5, 100)
    b, tb, _ = _rollout(env, 5, 100)
    c, tc, _ = _rollout(env, 6, 100)
    np.testing.assert_array_equal(a, b)
    assert ta == tb and ta != tc
    assert info["window"] == 20 and len(a) == 21
    # every (window, source) with queries settled, reward = 1 iff the good policy was chosen
    assert 35 <= len(ta) <= 40
    good = CATALOGUE.index(FakeSim.good)
    assert all(r == (1.0 if act == good else 0.0) for _, act, r in ta)
    assert info["success_ratio"] == pytest.approx(np.mean([r for _, _, r in ta]), abs=0.2)


def test_team_weighted_reward_exact_values():
    from testbed.aset.envs import _Settler

    # window 0: source 0 gained 1 of 2 queries over the baseline, source 1 lost 1 of 4; window 1:
    # source 0 created nothing (no transition), source 1 gained 2 of 2
    ok = np.array([[2, 1], [0, 2]])
    n = np.array([[2, 4], [0, 2]])
    base = np.array([[1, 2], [0, 0]])
    obs = np.zeros(3, np.float32)

    def rewards(weight):
        st = _Settler(weight)
        for w in (0, 1):
            for i in (0, 1):
                st.decisions[(w, i)] = (obs, 0)
                st.next_obs[(w, i)] = obs
        return [(i, r) for i, _, _, r, _ in st.settle(2, ok, n, base)]

    assert rewards(0.0) == [(0, 0.5), (1, -0.25), (1, 1.0)]
    assert rewards(1.0) == [(0, 0.0), (1, 0.0), (1, 1.0)]  # team of window 0: (1 - 1) / 6
    assert rewards(0.5) == [(0, 0.25), (1, -0.125), (1, 1.0)]
    with pytest.raises(ValueError):
        AsetConfig(name="x", reward={"team_weight": 1.5})


def _tiny_cfg(tmp_path, steps):
    return AsetConfig(
        name="toy", seed=3, observation=SPEC,
        agent=AgentSpec(learning_rate=3e-3, gamma=0.5, batch_size=32, replay_size=5000, train_start=64,
                        target_update_steps=50, epsilon_start=1.0, epsilon_end=0.02, epsilon_decay_steps=400),
        training=TrainingSpec(scenarios=["unused.yaml"], steps=steps, episode_s=5.0, checkpoint_every=10_000,
                              out_dir=str(tmp_path)))


@pytest.fixture(scope="module")
def toy_training(plan, tmp_path_factory):
    from testbed.aset.dqn import train

    tmp = tmp_path_factory.mktemp("toy")
    cfg = _tiny_cfg(tmp, 600)
    return train(cfg, REPO, progress=False, simulator_factory=FakeSim, plans=plan), cfg


def test_agent_learns_toy_scenario_within_600_steps(toy_training, plan):
    """Toy: only ``least_loaded`` ever succeeds. Budget: 600 env steps (1200 decisions)."""
    from testbed.agent.npolicy import NumpyPolicy

    result, cfg = toy_training
    pol = NumpyPolicy(result.policy_path)
    env = AsetSimEnv(plan, SPEC, 5.0, simulator_factory=FakeSim)
    obs, _ = env.reset(seed=123)
    picks = []
    done = False
    while not done:
        a = pol.act(obs)
        picks += a.tolist()
        obs, _, _, done, info = env.step(a)
    share = np.mean(np.asarray(picks) == CATALOGUE.index("least_loaded"))
    assert len(picks) == 100 and share > 0.95
    assert info["success_ratio"] > 0.95
    assert (result.out_dir / "curve.png").is_file() and (result.out_dir / "episodes.csv").is_file()
    assert any((result.out_dir / "tb").iterdir())
    assert len(result.episodes) == 600 // 50


def test_the_export_gives_the_agent_s_actions(toy_training, plan, tmp_path):
    from testbed.agent.npolicy import NumpyPolicy

    result, cfg = toy_training
    agent = result.agent
    obs = np.random.default_rng(0).uniform(0, 2, (256, agent.obs_size)).astype(np.float32)
    pol = NumpyPolicy(result.policy_path)
    np.testing.assert_allclose(pol.q_values(obs), agent.q_values(obs), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(pol.act(obs), agent.act(obs, explore=False))
    # the observation size and the source-id order are part of the exported checkpoint
    assert pol.obs_size == agent.obs_size == pol.meta["obs_size"] and pol.sources == ("srca", "srcc")
    # and on the env's own observations (one row per source, each with its identity one-hot)
    env = AsetSimEnv(plan, SPEC, 2.0, simulator_factory=FakeSim)
    o, _ = env.reset(seed=4)
    rows = [o]
    for _ in range(19):
        o, *_ = env.step(pol.act(o))
        rows.append(o)
    rows = np.concatenate(rows)
    np.testing.assert_array_equal(pol.act(rows), agent.act(rows, explore=False))


def _write_v2_copy(src: Path, dst: Path) -> int:
    """A copy of an exported policy as the previous format wrote it: no ``sources``, no
    ``obs_size``, a network without the source-id inputs. Returns its input width."""

    meta = json.loads(src.with_suffix(".json").read_text())
    n_src = len(meta.pop("sources"))
    del meta["obs_size"]
    meta["version"] = 2
    with np.load(src.with_suffix(".npz")) as d:
        ws = {k: d[k] for k in d.files}
    ws["w0"] = ws["w0"][:-n_src]
    np.savez(dst.with_suffix(".npz"), **ws)
    dst.with_suffix(".json").write_text(json.dumps(meta))
    return int(ws["w0"].shape[0])


def test_checkpoint_of_another_observation_size_fails_naming_both_sizes(toy_training, plan, tmp_path):
    """A checkpoint of another observation size is refused with an error that names both sizes, by
    every user: the sim env's, the one seam's selector (simulate, evaluate, the emulation) and the
    export."""

    from testbed.agent.live import SourceSelector
    from testbed.agent.npolicy import NumpyPolicy, ObservationSizeError, export_policy
    from testbed.aset.envs import plan_contexts

    result, cfg = toy_training
    size = result.agent.obs_size
    n = len(CATALOGUE)  # the toy config names no actions: the whole catalogue
    assert size == context_size(plan_contexts(plan, CATALOGUE)[0], SPEC) == 1 * 2 + 8 * 2 + 1 + n + 2
    old = tmp_path / "v2"
    assert _write_v2_copy(result.policy_path, old) == size - 2
    pol = NumpyPolicy(old)  # opens, so that the size check can say what changed
    with pytest.raises(ObservationSizeError, match=rf"takes observations of {size - 2} features, qnetwork v2: no "
                       rf"source identity; the simulator env of triangle builds {size}"):
        pol.check_contexts(AsetSimEnv(plan, SPEC, 1.0, simulator_factory=FakeSim).contexts,
                           "the simulator env of triangle")
    with pytest.raises(ObservationSizeError, match=rf"{size - 2} features without the source identity; this "
                       rf"testbed's observation adds one feature per source"):
        SourceSelector(_live_cfg(plan, {"checkpoint": str(old)}))
    # a current-format JSON whose sizes do not match its weights
    bad = tmp_path / "bad"
    _write_v2_copy(result.policy_path, bad)
    meta = json.loads(result.policy_path.with_suffix(".json").read_text())
    bad.with_suffix(".json").write_text(json.dumps(meta))
    with pytest.raises(ObservationSizeError, match=rf"network input {size - 2} features.*observation of {size}"):
        NumpyPolicy(bad)
    with pytest.raises(ObservationSizeError, match=rf"network input {size} != observation size {size + 1}"):
        export_policy(result.agent.weights(), tmp_path / "x", obs_spec=SPEC, applications=["digits"],
                      clusters=list(meta["clusters"]), policies=list(CATALOGUE), sources=["srca", "srcb", "srcc"])
    # a source the checkpoint was not trained with has no identity
    with pytest.raises(ValueError, match=r"'srcz' is not one of the checkpoint's sources \['srca', 'srcc'\]"):
        cfg_z = _live_cfg(plan, {"checkpoint": str(result.policy_path)}).model_copy(update={"source": "srcz"})
        SourceSelector(cfg_z)


def _live_cfg(plan, aset, options=None, records=None):
    """A source's config as testbed.emu.lifecycle writes it (testbed.plan.boundaries.SourceConfig)."""
    from testbed.plan.boundaries import SelectorContext, SourceConfig

    opts = options or [(h.name, plan.rtt_ms("srca", h.name)) for h in plan.clusters]
    return SourceConfig.model_validate({
        "source": "srca", "source_index": 0, "seed": 1, "policy": "aset", "start_ns": 0, "duration_s": 1,
        "report_interval_s": 0.5, "server_port": 8501,
        "applications": [{"name": "digits", "family": "digits", "deadline_ms": 100, "min_accuracy": 0.5}],
        "streams": [], "base_dir": ".", "zoo_dir": ".", "repo_dir": ".", "records": records or "",
        "options": [{"ip": "10.0.0.1", "option": {"cluster": c, "model": "m", "rtt_ms": rtt, "service_ms": 1.0,
                                                  "mean_service_ms": 1.0, "accuracy": 0.9, "tier": "far_edge",
                                                  "workers": 1}} for c, rtt in opts],
        "aset": aset, "selector_context": SelectorContext.from_plan(plan, "srca").model_dump()})


def test_live_selector_uses_checkpoint_and_times_decisions(toy_training, plan, tmp_path):
    from testbed.agent.live import SourceSelector as LivePolicySelector

    result, _ = toy_training
    aset = {"checkpoint": str(result.policy_path)}
    sel = LivePolicySelector(_live_cfg(plan, aset))
    state = {"arrivals": {"digits": 4}, "clusters": FakeSim(plan, 0).cluster_state(), "path_util": {},
             "resolved": [("digits", False)], "policy": "closest"}
    picks = {sel.choose(state) for _ in range(50)}
    assert picks == {"least_loaded"}
    t = sel.timing()
    assert t["n"] == 50 and t["p99_ms"] > 0
    sel2 = LivePolicySelector(_live_cfg(plan, aset, records=str(tmp_path / "srca.records.csv")))
    sel2.choose(state)
    sel2.write_report()

    rep = json.loads((tmp_path / "srca.records.aset.json").read_text())
    assert rep["source"] == "srca" and rep["timing"]["n"] == 1 and rep["choices"] == {"least_loaded": 1}
    with pytest.raises(ValueError, match="nowhere"):
        LivePolicySelector(_live_cfg(plan, aset, options=[("nowhere", 1.0)]))
    with pytest.raises(KeyError, match="'aset.checkpoint' or 'aset.selector'"):
        LivePolicySelector(_live_cfg(plan, {}))
    with pytest.raises(ValueError, match="differs from the checkpoint's window 100 ms"):
        LivePolicySelector(_live_cfg(plan, {"checkpoint": str(result.policy_path), "window_s": 0.2}))
    ok = LivePolicySelector(_live_cfg(plan, {"checkpoint": str(result.policy_path), "window_s": 0.1, "options": {}}))
    assert ok.choose(state) == "least_loaded"


def test_scale_rates_scales_every_rate():
    from testbed.aset.scenarios import scale_rates

    data = [{"application": "a", "rate_qps": 4.0, "process": {"kind": "mmpp", "rates_qps": [1.0, 10.0]}},
            {"application": "b", "rate_qps": 2}]
    out = scale_rates(data, 1.5)
    assert out[0]["rate_qps"] == 6.0 and out[0]["process"]["rates_qps"] == [1.5, 15.0] and out[1]["rate_qps"] == 3.0
    assert data[0]["rate_qps"] == 4.0  # input untouched


LIVE = REPO / "experiments" / "aset-live.yaml"
COMMITTED = REPO / "models" / "aset" / "aset"


def _skip_unless_committed_checkpoint_is_current() -> None:
    """The committed policy predates the source identity until it is retrained (docs/aset.md):
    then it must be refused with the size error, and what needs it is skipped."""
    from testbed.agent.live import SourceSelector as LivePolicySelector
    from testbed.agent.npolicy import VERSION, NumpyPolicy, ObservationSizeError
    from testbed.plan.boundaries import SourceConfig

    pol = NumpyPolicy(COMMITTED)
    if pol.version == VERSION:
        return
    plan = plan_experiment(LIVE)
    cfg = SourceConfig.from_plan(plan, plan.sources[0].name, 0, 1.0, Path("/tmp"))
    with pytest.raises(ObservationSizeError, match=f"{pol.obs_size} features without the source identity"):
        LivePolicySelector(cfg)
    pytest.skip(f"models/aset/aset is of format {pol.format} (no source identity): retrain it "
                f"(testbed train experiments/aset-train.yaml, docs/aset.md)")


def test_live_experiment_source_configs_drive_a_policy_of_its_plan(tmp_path):
    """Every source config of experiments/aset-live.yaml, as testbed.emu.lifecycle writes it, drives the live
    selector of a policy exported for that plan (random weights: the fit of names, source ids and
    sizes is what is tested, whatever models/aset/aset is)."""
    from testbed.agent.live import SourceSelector as LivePolicySelector
    from testbed.agent.npolicy import export_policy
    from testbed.aset.envs import plan_contexts
    from testbed.plan.boundaries import SourceConfig

    plan = plan_experiment(LIVE)
    ctxs = plan_contexts(plan, CATALOGUE)
    spec = ObservationSpec()  # 500 ms, the experiment's aset.window
    size = context_size(ctxs[0], spec)
    rng = np.random.default_rng(0)
    ws = [rng.normal(size=(size, 16)), np.zeros(16), rng.normal(size=(16, len(CATALOGUE))), np.zeros(len(CATALOGUE))]
    ck = tmp_path / "policy"
    c0 = ctxs[0]
    export_policy(ws, ck, obs_spec=spec, applications=list(c0.applications), clusters=list(c0.clusters),
                  policies=list(CATALOGUE), sources=list(c0.sources), deadlines_ms=list(c0.deadline_ms))
    ids = observation_layout(len(c0.applications), len(c0.clusters), len(CATALOGUE), spec.history_windows,
                             len(c0.sources))["source_id"]
    state = {"arrivals": {}, "clusters": {}, "path_util": {}, "resolved": [], "policy": "closest"}
    for s in plan.sources:
        cfg = SourceConfig.from_plan(plan, s.name, 0, 1.0, tmp_path)
        cfg = cfg.model_copy(update={"records": "", "aset": cfg.aset.model_copy(update={"checkpoint": str(ck)})})
        sel = LivePolicySelector(cfg)
        q = sel.selector
        assert q.observer.size == size and q.ctx.source_id == c0.sources.index(s.name)
        assert q.observer.observe(state)[ids].tolist() == [float(x == s.name) for x in c0.sources]
        assert sel.choose(state) in CATALOGUE


def test_committed_checkpoint_drives_the_live_experiment():
    """models/aset/aset fits experiments/aset-live.yaml: the source config as testbed.emu.lifecycle writes it
    (applications, per (cluster, model) options, the experiment's aset section) is accepted."""
    from testbed.agent.live import SourceSelector as LivePolicySelector
    from testbed.plan.boundaries import SourceConfig

    _skip_unless_committed_checkpoint_is_current()
    plan = plan_experiment(LIVE)
    exp = plan.experiment
    assert exp.policy == "aset" and exp.aset.checkpoint == "models/aset/aset"
    for s in plan.sources:
        cfg = SourceConfig.from_plan(plan, s.name, 0, 1.0, Path("/tmp"))
        sel = LivePolicySelector(cfg)
        assert sel.choose({"arrivals": {}, "clusters": {}, "path_util": {}, "resolved": [], "policy": "closest"}) \
            in CATALOGUE


# -- the planned policy and the plan margin (sixth round, docs/aset.md) --------------------------

def _planned_spec(plans: dict[str, list[str]]) -> ObservationSpec:
    return SPEC.model_copy(update={"plans": plans})


def test_the_plan_block_is_a_one_hot_of_the_planned_policy_at_the_end(plan):
    from testbed.aset.envs import plan_contexts

    spec = _planned_spec({"triangle": ["closest", "least_loaded"]})
    ca, cc = plan_contexts(plan, CATALOGUE, spec)
    assert (ca.plan, cc.plan) == ("closest", "least_loaded")
    layout = observation_layout(1, len(ca.clusters), len(CATALOGUE), SPEC.history_windows, 2, planned=True)
    plain = observation_size(1, len(ca.clusters), len(CATALOGUE), SPEC.history_windows, 2)
    assert layout["plan"] == slice(plain, plain + len(CATALOGUE)) == slice(context_size(ca, spec) - len(CATALOGUE),
                                                                         context_size(ca, spec))
    va = SourceObserver(ca, spec).observe({"policy": "cloud"})
    vc = SourceObserver(cc, spec).observe({"policy": "cloud"})
    np.testing.assert_array_equal(va[layout["plan"]], np.eye(len(CATALOGUE))[CATALOGUE.index("closest")])
    np.testing.assert_array_equal(vc[layout["plan"]], np.eye(len(CATALOGUE))[CATALOGUE.index("least_loaded")])
    np.testing.assert_array_equal(va[:plain], SourceObserver(plan_contexts(plan, CATALOGUE)[0], SPEC).observe(
        {"policy": "cloud"}))  # everything before the block is the plain observation
    with pytest.raises(ValueError, match="no planned policy"):
        SourceObserver(plan_contexts(plan, CATALOGUE)[0], spec)


def test_plans_that_do_not_fit_are_refused_naming_the_scenario(plan):
    from testbed.aset.envs import plan_contexts

    with pytest.raises(ValueError, match="no plan for scenario 'triangle'.*planned: other"):
        plan_contexts(plan, CATALOGUE, _planned_spec({"other": ["closest", "closest"]}))
    with pytest.raises(ValueError, match=r"plans.triangle: 1 policy for 2 sources \(srca, srcc\)"):
        plan_contexts(plan, CATALOGUE, _planned_spec({"triangle": ["closest"]}))
    with pytest.raises(ValueError, match="planned policy 'cloud' is not an action"):
        plan_contexts(plan, ("closest", "random"), _planned_spec({"triangle": ["cloud", "closest"]}))
    with pytest.raises(ValueError, match="observation.plans.triangle: unknown policy 'fastest'"):
        check_aset_policies(AsetConfig(name="x", observation=_planned_spec({"triangle": ["fastest", "closest"]})))
    with pytest.raises(ValueError, match="plan_margin 0.1.*observation.plans is not set"):
        AsetConfig(name="x", agent=AgentSpec(plan_margin=0.1))
    with pytest.raises(ValueError, match="names no scenario"):
        ObservationSpec(plans={})


def test_plan_scores_is_one_rule_for_numpy_and_tensorflow():
    import tensorflow as tf

    from testbed.agent.npolicy import plan_scores

    q = np.array([[0.5, 0.7, 0.1], [0.2, 0.1, 0.0]], np.float32)
    obs = np.array([[9.0, 1.0, 0.0, 0.0], [9.0, 0.0, 0.0, 1.0]], np.float32)  # plan one-hot = last 3
    np.testing.assert_array_equal(np.argmax(plan_scores(q, obs, 0.0, 3), 1), [1, 0])
    np.testing.assert_array_equal(np.argmax(plan_scores(q, obs, 0.1, 3), 1), [1, 0])  # 0.7 > 0.5 + 0.1
    np.testing.assert_array_equal(np.argmax(plan_scores(q, obs, 0.3, 3), 1), [0, 2])  # the plan wins
    np.testing.assert_allclose(plan_scores(tf.constant(q), tf.constant(obs), 0.3, 3).numpy(),
                               plan_scores(q, obs, 0.3, 3))


def test_the_plan_margin_keeps_the_plan_unless_learning_says_otherwise(plan, tmp_path):
    """Toy (only least_loaded succeeds): with the plan on closest and a margin below the learnt
    advantage the agent still learns least_loaded; the same network under a margin above every
    Q-value difference keeps the plan everywhere; export and agent decide alike."""

    from testbed.agent.npolicy import NumpyPolicy
    from testbed.aset.dqn import train

    cfg = _tiny_cfg(tmp_path, 600)
    cfg = cfg.model_copy(update={"observation": _planned_spec({"triangle": ["closest", "closest"]}),
                                 "agent": cfg.agent.model_copy(update={"plan_margin": 0.3})})
    result = train(cfg, REPO, progress=False, simulator_factory=FakeSim, plans=plan)
    pol = NumpyPolicy(result.policy_path)
    assert pol.plan_margin == 0.3 and pol.obs_spec.plans == {"triangle": ["closest", "closest"]}
    env = AsetSimEnv(plan, pol.obs_spec, 5.0, simulator_factory=FakeSim)
    obs, _ = env.reset(seed=123)
    rows, done = [], False
    while not done:
        rows.append(obs)
        obs, _, _, done, _ = env.step(pol.act(obs))
    rows = np.concatenate(rows)
    np.testing.assert_array_equal(pol.act(rows), result.agent.act(rows, explore=False))
    assert np.mean(pol.act(rows) == CATALOGUE.index("least_loaded")) > 0.95
    q = pol.q_values(rows)
    assert np.max(q) - np.min(q) < 10.0
    meta = json.loads(result.policy_path.with_suffix(".json").read_text())
    meta["plan_margin"] = 10.0
    result.policy_path.with_suffix(".json").write_text(json.dumps(meta))
    np.testing.assert_array_equal(NumpyPolicy(result.policy_path).act(rows), CATALOGUE.index("closest"))


def test_a_run_refuses_a_checkpoint_without_a_plan_for_its_experiment(plan, tmp_path):
    from testbed.agent.live import check_agents
    from testbed.agent.npolicy import export_policy
    from testbed.aset.envs import plan_contexts

    spec = _planned_spec({"other": ["closest", "closest"]})
    c0 = plan_contexts(plan, CATALOGUE)[0]
    size = observation_size(1, len(c0.clusters), len(CATALOGUE), spec.history_windows, 2, planned=True)
    rng = np.random.default_rng(0)
    ws = [rng.normal(size=(size, 4)).astype(np.float32), np.zeros(4, np.float32),
          rng.normal(size=(4, len(CATALOGUE))).astype(np.float32), np.zeros(len(CATALOGUE), np.float32)]
    export_policy(ws, tmp_path / "ck", obs_spec=spec, applications=list(c0.applications), clusters=list(c0.clusters),
                  policies=list(CATALOGUE), sources=list(c0.sources), plan_margin=0.1)
    exp = plan.experiment.model_copy(update={"policy": "aset", "aset": plan.experiment.aset.model_copy(
        update={"checkpoint": str(tmp_path / "ck")}) if plan.experiment.aset else None})
    if exp.aset is None:
        from testbed.spec.experiment import AsetSpec

        exp = exp.model_copy(update={"aset": AsetSpec(checkpoint=str(tmp_path / "ck"))})
    with pytest.raises(ValueError, match=r"ck \(source srca\): observation.plans: no plan for scenario 'triangle'"):
        check_agents(build_plan(exp, base_dir=TRIANGLE.parent))
    assert check_agents(build_plan(exp.model_copy(update={"policy": "closest"}), base_dir=TRIANGLE.parent)) is None


def test_the_committed_plan_checkpoint_drives_every_source_of_the_suite_live(tmp_path):
    """models/aset/aset-plan: each source's live selector on a suite scenario finds its planned
    policy by the experiment's name (the plans of experiments/aset-plan.yaml) and decides."""
    from testbed.agent.live import SourceSelector as LivePolicySelector
    from testbed.plan.boundaries import SourceConfig
    from testbed.spec.experiment import AsetSpec

    cfg_plan = load_aset_config(REPO / "experiments" / "aset-plan.yaml")[0]
    plan = plan_experiment(REPO / "experiments" / "scenario-failure.yaml")
    want = cfg_plan.observation.plans["scenario-failure"]
    sources = sorted(h.name for h in plan.sources)
    for i, s in enumerate(sources):
        cfg = SourceConfig.from_plan(plan, s, 0, 1.0, tmp_path)
        assert cfg.experiment == "scenario-failure"
        cfg = cfg.model_copy(update={"aset": AsetSpec(checkpoint="models/aset/aset-plan", window="500ms"),
                                     "records": ""})
        sel = LivePolicySelector(cfg)
        assert sel.selector.ctx.plan == want[i] and sel.selector.policy.plan_margin == cfg_plan.agent.plan_margin > 0
        assert sel.choose({"policy": want[i]}) in CATALOGUE
    cfg = SourceConfig.from_plan(plan, sources[0], 0, 1.0, tmp_path).model_copy(update={
        "aset": AsetSpec(checkpoint="models/aset/aset-plan", window="500ms"), "records": "",
        "experiment": "scenario-unplanned"})
    with pytest.raises(ValueError, match="no plan for scenario 'scenario-unplanned'"):
        LivePolicySelector(cfg)
    renamed = cfg.model_copy(update={"aset": cfg.aset.model_copy(update={"plan": "scenario-failure"})})
    assert LivePolicySelector(renamed).selector.ctx.plan == want[0]  # a renamed copy names its plan (aset.plan)


def test_training_refuses_a_scenario_without_a_plan_before_it_starts(tmp_path):
    from testbed.aset.scenarios import training_scenarios

    cfg, base = load_aset_config(REPO / "experiments" / "aset-plan.yaml")
    plans = dict(cfg.observation.plans)
    del plans["scenario-hotspot"]
    cfg = cfg.model_copy(update={"observation": cfg.observation.model_copy(update={"plans": plans}),
                                 "reward": cfg.reward.model_copy(update={"baseline_mix": plans})})
    with pytest.raises(ConfigError, match=r"no plan for scenario 'scenario-hotspot'.*scenario-hotspot.yaml\)"):
        training_scenarios(cfg, base)
