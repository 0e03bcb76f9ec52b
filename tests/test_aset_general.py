"""The general ASET agent: one checkpoint for any experiment, the scenario generator, the
fresh-state reference and evaluate's name checks (docs/aset.md, "The general agent")."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from testbed.agent.features import INPUT_SIZE, LOCAL_FEATURES, POLICY_FEATURES, FeatureContext
from testbed.agent.gate import GatedPolicy
from testbed.agent.general import GeneralPolicy, export_general
from testbed.agent.live import SourceSelector, check_agents, source_configs, source_setup
from testbed.aset.episode import Episode
from testbed.aset.general import GeneralRun, init_weights
from testbed.aset.generator import (
    HELD_OUT_PATTERNS,
    HELD_OUT_TOPOLOGIES,
    draw_scenario,
    plan_document,
    write_scenarios,
)
from testbed.model.policies import CATALOGUE
from testbed.plan.boundaries import SourceConfig
from testbed.plan.build import build_plan, plan_experiment
from testbed.sim.run import drive
from testbed.spec.aset import ObservationSpec
from testbed.spec.experiment import AsetSpec, Experiment

REPO = Path(__file__).resolve().parent.parent
SPEC = ObservationSpec()
POLICIES = tuple(CATALOGUE)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A general checkpoint (seeded random weights: what is tested here is the plumbing)."""
    path = tmp_path_factory.mktemp("ckpt") / "general"
    export_general(init_weights([32, 32], 7), path, policies=POLICIES, obs_spec=SPEC)
    return path


def _drive(plan, seed: int, checkpoint: Path, duration_s: float) -> tuple[Episode, dict[str, list[str]]]:
    """Every source on the checkpoint through the one loop of simulate and evaluate."""
    srcs = sorted(h.name for h in plan.sources)
    ep = Episode(plan, seed, dict.fromkeys(srcs, "closest"), None, duration_s)
    schedule = drive(ep.sim, plan, srcs, AsetSpec(checkpoint=str(checkpoint)), duration_s, on_resolved=ep.count)
    ep.finish()
    return ep, schedule


def _with_sources(n: int) -> dict:
    """The first train scenario of the generator with ``n`` sources."""
    for seed in range(1, 200):
        doc = draw_scenario("train", seed)
        if len(doc["sources"]) == n:
            doc.pop("x_generated")
            return doc
    raise AssertionError(f"no generated scenario with {n} sources")


def test_generator_is_deterministic_and_its_scenarios_plan(tmp_path):
    for split in ("train", "held_out"):
        for seed in range(1, 11):
            a, b = draw_scenario(split, seed), draw_scenario(split, seed)
            assert a == b
            info = a["x_generated"]
            held = info["topology"] in HELD_OUT_TOPOLOGIES or info["pattern"] in HELD_OUT_PATTERNS
            assert held == (split == "held_out"), (split, seed, info)
            assert 2 <= len(a["sources"]) <= 8
        paths = write_scenarios(tmp_path / split, split, list(range(1, 11)))
        for p in paths:  # what testbed plan does with the file
            plan = plan_experiment(p)
            assert 8 <= len([s for s in plan.switches if s.label != "cloud"]) <= 60
    assert draw_scenario("train", 1) != draw_scenario("train", 2)


def test_one_checkpoint_drives_2_4_and_7_sources_on_other_topologies(checkpoint):
    policy = GeneralPolicy(checkpoint)
    assert policy.policies == POLICIES and policy.meta["features"]["policy_features"] == list(POLICY_FEATURES)
    topologies = set()
    for n in (2, 4, 7):
        doc = _with_sources(n)
        topologies.add(doc["topology"]["source"])
        plan = plan_document(doc)
        ep, schedule = _drive(plan, 1, checkpoint, 5.0)
        assert ep.queries > 0 and sum(len(x) for x in schedule.values()) == 10 * n
        # the trainer's episodes and every engine's selector build the same features
        run = GeneralRun(plan, 2, POLICIES, SPEC, duration_s=5)
        srcs = sorted(h.name for h in plan.sources)
        states: list[list[dict]] = []
        for _ in range(4):
            run.observe()
            states.append([run.view.state(i, "least_loaded") for i in range(n)])
            run.step(["least_loaded"] * n)
        cfgs = source_configs(plan, srcs, AsetSpec(checkpoint=str(checkpoint)))
        for i, cfg in enumerate(cfgs):
            live = SourceSelector(cfg).driver.obj.featurizer
            sim = GeneralRun(plan, 2, POLICIES, SPEC, duration_s=5).featurizers[i]
            for window in states:
                (la, pa), (lb, pb) = live.observe(window[i]), sim.observe(window[i])
                assert pa.shape == (len(POLICIES), len(POLICY_FEATURES)) and la.shape == (len(LOCAL_FEATURES),)
                assert np.array_equal(la, lb) and np.array_equal(pa, pb)
    assert len(topologies) == 3


def _renamed(doc: dict, m: dict[str, str]) -> dict:
    d = yaml.safe_load(yaml.safe_dump(doc))
    for c in d["clusters"]:
        c["name"] = m.get(c["name"], c["name"])
    for key in ("sources", "applications"):
        for x in d[key]:
            x["name"] = m[x["name"]]
    for w in d["workload"]:
        w["application"] = m[w["application"]]
        if w["sources"] != "all":
            w["sources"] = [m[s] for s in w["sources"]]
    for e in d.get("events") or []:
        if "cluster" in e:
            e["cluster"] = m.get(e["cluster"], e["cluster"])
    return d


def _trajectory(doc: dict, names: dict[str, str], policy: GeneralPolicy) -> list:
    """Features and actions of every source (by original name) for 10 windows, each source's
    policy drawn per original name (so both namings run the same schedule)."""
    plan = build_plan(Experiment.model_validate(doc), base_dir=REPO / "experiments")
    run = GeneralRun(plan, 3, POLICIES, SPEC, duration_s=5)
    inv = {v: k for k, v in names.items()}
    srcs = sorted(h.name for h in plan.sources)
    rng = np.random.default_rng(0)
    out = []
    while not run.done:
        feats = dict(zip((inv.get(s, s) for s in srcs), run.observe(), strict=True))
        acts = {s: policy.act(*f) for s, f in feats.items()}
        out.append({s: (feats[s], acts[s]) for s in sorted(feats)})
        draw = dict(zip(sorted(feats), rng.integers(0, len(POLICIES), len(feats)), strict=True))
        run.step([POLICIES[int(draw[inv.get(s, s)])] for s in srcs])
    return out


def test_same_features_and_action_whatever_the_names(checkpoint):
    """Renamed sources, clusters and applications (in the same sorted order: ``round_robin`` cycles
    over clusters by name and the policies break ties by name, so only an order-changing renaming
    changes what a policy does, and then its features say so) give the same features and the same
    action, window by window."""
    policy = GeneralPolicy(checkpoint)
    doc = yaml.safe_load((REPO / "experiments/scenario-failure.yaml").read_text())
    names = {"atl": "k1", "lax": "k2", "nyc": "k3", "sea": "k4", "fedc": "dd", "fesv": "ee", "nechi": "ff",
             "classify": "ab", "faces": "ac", "hands": "ad"}
    a = _trajectory(doc, {}, policy)
    b = _trajectory(_renamed(doc, names), names, policy)
    assert len(a) == len(b) == 10
    for wa, wb in zip(a, b, strict=True):
        for s in wa:
            (la, pa), act_a = wa[s]
            (lb, pb), act_b = wb[s]
            assert np.array_equal(la, lb) and np.array_equal(pa, pb) and act_a == act_b
    # and the scorer sees features only: the same features give the same action in another experiment
    loc, pp = a[4]["atl"][0]
    assert policy.act(loc, pp) == GeneralPolicy(checkpoint).act(loc.copy(), pp.copy())


def test_general_checkpoint_refuses_other_features(checkpoint, tmp_path):
    import json
    import shutil

    for suffix in (".npz", ".json"):
        shutil.copy(f"{checkpoint}{suffix}", tmp_path / f"old{suffix}")
    meta = json.loads((tmp_path / "old.json").read_text())
    meta["features"]["policy_features"] = meta["features"]["policy_features"][:-1]
    (tmp_path / "old.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="policy_features differ from this testbed's"):
        GeneralPolicy(tmp_path / "old")
    assert INPUT_SIZE == len(LOCAL_FEATURES) + 2 * len(POLICY_FEATURES)


def test_feature_context_bounds():
    plan = plan_experiment(REPO / "experiments/scenario-failure.yaml")
    setup = source_setup(source_configs(plan, ["atl"])[0])
    ctx = FeatureContext("atl", setup.options, setup.applications, POLICIES)
    with pytest.raises(ValueError, match="policies, need 2"):
        FeatureContext("atl", setup.options, setup.applications, ("closest",))
    assert len(ctx.clusters) == 4 and len(ctx.applications) == 3


def test_fresh_state_is_not_below_stale_state_on_the_same_arrivals():
    """``least_loaded`` on a held-out scenario where stale reports herd the dispatchers: with the
    clusters' true state (simulator ``view="fresh"``) the same arrivals (the same queries per seed)
    succeed more often, by a paired mean well above its spread (docs/aset.md gives the figures,
    and the policies and scenarios where fresh information does not help)."""
    from testbed.aset.episode import run_static

    plan = plan_experiment(REPO / "experiments/generated/held-out/gen-heldout-6.yaml")
    n = len(plan.sources)
    diffs = []
    for seed in range(1, 9):
        stale = run_static(plan, seed, ["least_loaded"] * n, duration_s=20)
        fresh = run_static(plan, seed, ["least_loaded"] * n, duration_s=20, view="fresh")
        assert fresh.queries == stale.queries > 0
        diffs.append(fresh.success_ratio - stale.success_ratio)
    d = np.asarray(diffs)
    assert d.mean() - 2.4 * d.std(ddof=1) / np.sqrt(len(d)) > 0, diffs  # one-sided 2.4 sigma (t_7 at 2.5 %)


def test_simulator_view_is_checked():
    from testbed.sim import Simulator
    from testbed.sim.engine import SimError

    plan = plan_experiment(REPO / "experiments/scenario-failure.yaml")
    with pytest.raises(SimError, match="view 'stale'"):
        Simulator(plan, seed=1, view="stale")


def _renamed_app_experiment(tmp_path: Path) -> Path:
    doc = yaml.safe_load((REPO / "experiments/scenario-failure.yaml").read_text())
    doc = _renamed(doc, {**{s["name"]: s["name"] for s in doc["sources"]}, "hands": "handz", "faces": "faces",
                         "classify": "classify"})
    doc["policy"] = "aset"
    doc["aset"] = {"checkpoint": str(REPO / "models/aset/aset")}
    path = tmp_path / "renamed.yaml"
    path.write_text(yaml.safe_dump(doc))
    (tmp_path / "topologies").mkdir(exist_ok=True)
    return path


def test_evaluate_refuses_an_application_name_mismatch_like_the_live_selector(tmp_path):
    from testbed.aset.evaluate import Protocol, evaluate
    from testbed.core.errors import InputError

    path = _renamed_app_experiment(tmp_path)
    want = r"applications \['handz'\] unknown to the checkpoint \(trained on \['classify', 'faces', 'hands'\]\)"
    with pytest.raises(InputError, match=want):
        evaluate([str(path)], Protocol([1], [2], list(POLICIES)), tmp_path / "out",
                 agents={"ASET": str(REPO / "models/aset/aset")}, progress=False)
    assert not (tmp_path / "out").exists()
    plan = plan_experiment(path)
    cfg = source_configs(plan, ["atl"], AsetSpec(checkpoint="models/aset/aset"))[0]
    with pytest.raises(ValueError, match=want):
        SourceSelector(cfg)


def test_policy_aset_without_a_checkpoint_drives_a_held_out_scenario_live():
    """The shipped general checkpoint is what ``policy: aset`` runs with no ``aset:`` section; the
    run's pre-check accepts it on a held-out scenario and the live selector picks a policy."""
    doc = yaml.safe_load((REPO / "experiments/generated/held-out/gen-heldout-7.yaml").read_text())
    doc["policy"] = "aset"
    exp = Experiment.model_validate(doc)
    assert exp.aset.checkpoint == "models/aset/general"
    plan = build_plan(exp)
    record = check_agents(plan)
    assert record["kind"] == "gated" and record["checkpoint"] == "models/aset/general"
    shipped = GatedPolicy(REPO / "models/aset/general")  # a gated ensemble over every built-in policy
    assert not shipped.specialized and shipped.policies == POLICIES and shipped.reference == "min_latency"
    src = sorted(h.name for h in plan.sources)[0]
    sel = SourceSelector(SourceConfig.from_plan(plan, src, 0, 5.0, Path("/tmp")))
    assert sel.initial == "min_latency"  # it starts on its reference, in every engine
    state = {"arrivals": {a.name: 3 for a in exp.applications}, "policy": "closest", "resolved": [],
             "clusters": {c.name: {"queue_len": 1, "busy": 1, "workers": 1, "utilization": 0.5, "up": True}
                          for c in exp.clusters}}
    assert all(sel.choose(state) in POLICIES for _ in range(3))


def test_decision_rule_default_and_margin():
    """The default policy is the one of the highest mean target in the training data; the margin is
    the one whose picks gain most on the validation data (ties: the larger)."""
    from testbed.aset.general import MARGINS, decision_rule

    rng = np.random.default_rng(0)
    ws = init_weights([8], 3)
    x = rng.random((50, len(POLICIES), INPUT_SIZE)).astype(np.float32)
    y = np.zeros((50, len(POLICIES)), np.float32)
    y[:, POLICIES.index("min_latency")] = 1.0  # min_latency is worth 1 point more than anything else
    train = {"x": x, "y": y, "ref": np.zeros(50, np.int64)}
    default, margin, gains = decision_rule(ws, train, train, POLICIES)
    assert default == "min_latency" and gains["default"] == 1.0
    assert gains[str(margin)] == 1.0 and margin == max(m for m in MARGINS if gains[str(m)] == 1.0)
    loc = np.zeros(len(LOCAL_FEATURES), np.float32)
    rows = rng.random((len(POLICIES), len(POLICY_FEATURES))).astype(np.float32)
    plain = GeneralPolicy.from_weights(ws, POLICIES, SPEC)
    sure = GeneralPolicy.from_weights(ws, POLICIES, SPEC, "min_latency", 1e6)
    assert plain.act(loc, rows) == int(np.argmax(plain.scores(loc, rows)))
    assert sure.act(loc, rows) == POLICIES.index("min_latency")
