"""The general ASET agent's learner (``testbed train`` of an ASET config with ``general:``), one
file top to bottom: episodes driven by the general features (:mod:`testbed.agent.features`), their
training data, the fit of the scorer, the decision rule and the export.

**Episodes** (:class:`GeneralRun`): an :class:`~testbed.aset.episode.Episode` of any plan (any
number of sources, clusters, applications within the bounds), one
:class:`~testbed.agent.features.PolicyFeaturizer` per source built by
:func:`~testbed.agent.general.plan_feature_context` from the same options and applications the
emulation gives that source, fed the window state of :class:`~testbed.aset.envs.WindowView`
(the plan-based env's, so both observations read the simulator the same way).

**Data** (:func:`episode_data`; one episode per task): a base static policy is drawn per
episode (uniform over the policies), every source follows it and leaves it with probability
``behaviour_epsilon`` per window for a policy drawn uniformly (so the current-policy feature
varies). At every ``probe_every``-th window one source i drawn at random is probed: for each
policy a, a clone runs the window with i on a and the others on what they do in this window,
then ``horizon`` - 1 windows of the base, and is settled
(:func:`testbed.aset.headroom.continuation_ok`, the oracle's measure). The target of a is the
team's success-ratio gain over the window as the episode runs it, in points:
``100 x (ok_a - ok_ref) / queries created by every source in [w, w + horizon)``; 0 for the
reference (i's own action in the episode).

**Fit** (:func:`fit`): the shared scorer (:mod:`testbed.agent.general`, ReLU MLP) learns
``Q(s, a) - Q(s, ref) = target_a`` (Huber loss, Adam, numpy): the values of one-window deviations
from varied bases, so the scores rank the policies given what the source observes. What it gives
up: one step of policy iteration (the target values one window of a followed by the base), as the
rollout agent of :mod:`testbed.aset.rollout`.

**Rule and export** (:func:`decision_rule`, :func:`train_general`): the default policy is the one
of the highest mean target in the training data; the margin (points) the agent's argmax must beat
it by is chosen on held-out episodes from :data:`MARGINS`. Acting: the ``general`` checkpoint kind
(:mod:`testbed.agent.general`), through the one seam of every agent (:mod:`testbed.agent.live`).

Outputs in ``<general.out_dir>/<config name>/``: ``seed-<k>/curve.csv`` (epoch, train loss,
validation loss, validation decision gain in points), ``seed-<k>/general.{npz,json}``,
``curves.png`` (every seed), ``data.json`` (episodes, samples, simulation wall time); the export
seed's checkpoint at ``general.export_to`` or, with ``general.ensemble`` B >= 2, the gated ensemble
of B bootstrap fits over every seed's episodes (:func:`export_ensemble`; kind ``gated``,
:mod:`testbed.agent.gate`). Each episode's data is cached in ``<out>/cache`` as npz,
keyed by everything it depends on (the simulation's code, :func:`testbed.aset.jobs.code_fingerprint`;
the generator seed, the simulator seed, the data settings).
"""

from __future__ import annotations

import csv
import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from testbed.agent.features import INPUT_SIZE, FeatureContext, PolicyFeaturizer, scorer_input
from testbed.agent.gate import GatedPolicy, gain_bounds, gate_choice
from testbed.agent.general import export_general, forward
from testbed.agent.live import source_configs, source_setup
from testbed.aset.envs import WindowView
from testbed.aset.episode import Episode
from testbed.aset.generator import draw_scenario, plan_document
from testbed.aset.headroom import continuation_ok
from testbed.aset.jobs import code_fingerprint
from testbed.core.distributed import imap_unordered
from testbed.core.errors import InputError
from testbed.core.util import write_json_atomic
from testbed.plan.build import Plan
from testbed.plan.policy_resolution import aset_actions
from testbed.spec.aset import AsetConfig, ObservationSpec


@dataclass(frozen=True)
class _ViewContext:
    """What :class:`WindowView` reads of a source: its name and the clusters of its path utilization."""

    source: str
    clusters: tuple[str, ...]


class GeneralRun:
    """An episode of ``plan`` on seed ``seed`` driven window by window with the general features.

    Args:
        plan: any plan within the bounds of :mod:`testbed.agent.features`.
        seed: the simulator seed (common random numbers).
        policies: the policy list (score order).
        spec: the observation settings (window, history, scales).
        duration_s: episode length (s; default the experiment's).
        initial: every source's policy before its first decision.

    Raises:
        ValueError: a source without application, or beyond a bound (naming it); a window that is
            not a whole number of report intervals.
    """

    def __init__(self, plan: Plan, seed: int, policies: tuple[str, ...], spec: ObservationSpec,
                 duration_s: float | None = None, initial: str = "closest"):
        srcs = sorted(h.name for h in plan.sources)
        self.plan, self.policies, self.spec = plan, tuple(policies), spec
        self.ep = Episode(plan, seed, dict.fromkeys(srcs, initial), spec.window_ms / 1e3, duration_s)
        setups = {c.source: source_setup(c) for c in source_configs(plan, srcs)}
        missing = [s for s in srcs if s not in setups]
        if missing:
            raise ValueError(f"{plan.experiment.name}: source(s) {', '.join(missing)} create no query (no workload "
                             f"entry selects them): nothing to decide for")
        self.featurizers = [PolicyFeaturizer(FeatureContext(s, setups[s].options, setups[s].applications,
                                                            self.policies), spec) for s in srcs]
        clusters = tuple(sorted(c.name for c in plan.clusters))
        self.view = WindowView(self.ep, [_ViewContext(s, clusters) for s in srcs])
        self.current = [initial] * len(srcs)

    @property
    def done(self) -> bool:
        return self.ep.w >= self.ep.n_windows

    def observe(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """Each source's ``(local, per_policy)`` for the next window (sorted source order)."""
        return [f.observe(self.view.state(i, self.current[i])) for i, f in enumerate(self.featurizers)]

    def step(self, names: list[str]) -> None:
        """Run the next window with one policy per source (sorted order)."""
        self.current = list(names)
        self.ep.set_policies(self.current)
        self.view.absorb(self.ep.step())


def episode_data(plan: Plan, seed: int, policies: tuple[str, ...], spec: ObservationSpec, *, horizon: int = 2,
                 probe_every: int = 2, behaviour_epsilon: float = 0.15, duration_s: float | None = None) -> dict:
    """The training data of one episode (module docstring).

    Returns:
        ``x`` float32 (samples, policies, INPUT_SIZE): the scorer's inputs; ``y`` float32 (samples,
        policies): targets in points; ``ref`` int64 (samples,): the reference action;
        ``base`` the episode's base policy; ``wall_s``.
    """
    t0 = time.perf_counter()
    rng = np.random.default_rng([seed, 31])
    run = GeneralRun(plan, seed, policies, spec, duration_s)
    n_s, n_p = len(run.featurizers), len(policies)
    base = policies[int(rng.integers(n_p))]
    run.current = [base] * n_s
    run.ep.set_policies(run.current)
    xs, oks, refs, windows = [], [], [], []
    while not run.done:
        feats = run.observe()
        acts = [policies[int(rng.integers(n_p))] if rng.random() < behaviour_epsilon else base for _ in range(n_s)]
        w = run.ep.w
        if w % probe_every == 0:
            i = int(rng.integers(n_s))
            ok = np.empty(n_p, np.int64)
            ref_ok = continuation_ok(run.ep, w, horizon, [base] * n_s, acts)
            for a, name in enumerate(policies):
                ok[a] = ref_ok if name == acts[i] else continuation_ok(
                    run.ep, w, horizon, [base] * n_s, acts[:i] + [name] + acts[i + 1:])
            xs.append(scorer_input(*feats[i]))
            oks.append(ok - ref_ok)
            refs.append(policies.index(acts[i]))
            windows.append(w)
        run.step(acts)
    ep = run.ep
    ep.finish()
    queries = np.array([ep.n[w:min(ep.n_windows, w + horizon)].sum() for w in windows], np.float64)
    keep = queries > 0
    y = 100.0 * np.asarray(oks, np.float64).reshape(-1, n_p) / np.maximum(queries, 1)[:, None]
    return {"x": np.asarray(xs, np.float32).reshape(-1, n_p, INPUT_SIZE)[keep], "y": y.astype(np.float32)[keep],
            "ref": np.asarray(refs, np.int64)[keep], "base": base, "wall_s": time.perf_counter() - t0}


# -- the fit ------------------------------------------------------------------------------------------

def init_weights(hidden: list[int], seed: int, inputs: int = INPUT_SIZE) -> list[np.ndarray]:
    """Glorot-uniform weights and zero biases of the scorer ``inputs -> hidden... -> 1``."""
    rng = np.random.default_rng(seed)
    sizes = [inputs, *hidden, 1]
    ws: list[np.ndarray] = []
    for a, b in zip(sizes, sizes[1:], strict=False):
        lim = np.sqrt(6.0 / (a + b))
        ws += [rng.uniform(-lim, lim, (a, b)).astype(np.float32), np.zeros(b, np.float32)]
    return ws


def _loss_grad(ws: list[np.ndarray], x: np.ndarray, y: np.ndarray, ref: np.ndarray,
               delta: float) -> tuple[float, list[np.ndarray]]:
    """Huber loss of ``Q(s, a) - Q(s, ref) - y`` over the non-reference actions, and its gradient."""
    b, p, d = x.shape
    acts = [x.reshape(b * p, d)]
    for i in range(0, len(ws) - 2, 2):
        acts.append(np.maximum(acts[-1] @ ws[i] + ws[i + 1], 0.0))
    q = (acts[-1] @ ws[-2] + ws[-1]).reshape(b, p)
    rows = np.arange(b)
    err = q - q[rows, ref][:, None] - y
    mask = np.ones_like(err)
    mask[rows, ref] = 0.0
    n = mask.sum()
    absd = np.abs(err)
    loss = float((np.where(absd <= delta, 0.5 * err ** 2, delta * (absd - 0.5 * delta)) * mask).sum() / n)
    g = np.clip(err, -delta, delta) * mask / n
    g[rows, ref] -= g.sum(axis=1)
    grad = g.reshape(b * p, 1).astype(np.float32)
    grads: list[np.ndarray] = [None] * len(ws)  # type: ignore[list-item]
    for li in range(len(ws) - 2, -1, -2):
        a = acts[li // 2]
        grads[li], grads[li + 1] = a.T @ grad, grad.sum(axis=0)
        if li:
            grad = (grad @ ws[li].T) * (a > 0)
    return loss, grads


def evaluate_loss(ws: list[np.ndarray], x: np.ndarray, y: np.ndarray, ref: np.ndarray, delta: float) -> float:
    return _loss_grad(ws, x, y, ref, delta)[0] if len(x) else float("nan")


def decision_gain(ws: list[np.ndarray], x: np.ndarray, y: np.ndarray) -> float:
    """Mean target (points) of the action the scorer picks: the measured gain of acting on it over
    the reference, per decision (0: as good as the episode's own action)."""
    if not len(x):
        return float("nan")
    layers = list(zip(ws[0::2], ws[1::2], strict=True))
    pick = np.argmax(forward(layers, x), axis=1)
    return float(y[np.arange(len(y)), pick].mean())


def fit(train: dict, valid: dict, *, hidden: list[int], seed: int, epochs: int = 60, batch: int = 128,
        lr: float = 1e-3, delta: float = 1.0) -> dict:
    """Fit the scorer on ``train`` (``x``, ``y``, ``ref`` of :func:`episode_data`, joined; ``x`` of
    any input width: a gated member's, :func:`testbed.agent.gate.input_width`), keep the epoch of the
    lowest loss on ``valid``; returns ``weights`` and the ``curve`` (epoch, train loss, valid loss,
    valid decision gain in points)."""
    ws = init_weights(hidden, seed, int(train["x"].shape[-1]))
    m = [np.zeros_like(w) for w in ws]
    v = [np.zeros_like(w) for w in ws]
    rng = np.random.default_rng(seed)
    best, best_ws, curve, t = np.inf, [w.copy() for w in ws], [], 0
    n = len(train["x"])
    for epoch in range(epochs):
        order = rng.permutation(n)
        losses = []
        for k in range(0, n, batch):
            idx = order[k:k + batch]
            loss, grads = _loss_grad(ws, train["x"][idx], train["y"][idx], train["ref"][idx], delta)
            losses.append(loss)
            t += 1
            for j, g in enumerate(grads):
                m[j] = 0.9 * m[j] + 0.1 * g
                v[j] = 0.999 * v[j] + 0.001 * g * g
                ws[j] -= lr * (m[j] / (1 - 0.9 ** t)) / (np.sqrt(v[j] / (1 - 0.999 ** t)) + 1e-8)
        vl = evaluate_loss(ws, valid["x"], valid["y"], valid["ref"], delta)
        curve.append((epoch, float(np.mean(losses)), vl, decision_gain(ws, valid["x"], valid["y"])))
        if vl < best or not np.isfinite(best):
            best, best_ws = vl, [w.copy() for w in ws]
    return {"weights": best_ws, "curve": curve, "best_valid": best}


# -- the training run -----------------------------------------------------------------------------

#: What the data of one episode depends on besides the code and its seeds.
DATA_KEYS = ("episode_s", "horizon_windows", "probe_every", "behaviour_epsilon")


def episode_tasks(cfg: AsetConfig, seed: int) -> list[tuple[int, int]]:
    """(generator seed, simulator seed) of each data episode of training seed ``seed``."""
    g = cfg.general
    rng = np.random.default_rng([seed, 3102])
    lo, hi = g.scenario_seeds
    return [(int(rng.integers(lo, hi + 1)), int(rng.integers(1, 2**31 - 1))) for _ in range(g.episodes)]


def _key(cfg: AsetConfig, policies: tuple[str, ...], gen_seed: int, sim_seed: int) -> str:
    g = cfg.general
    blob = json.dumps({"code": code_fingerprint(), "obs": cfg.observation.model_dump(), "policies": policies,
                       "data": {k: getattr(g, k) for k in DATA_KEYS}, "gen": gen_seed, "sim": sim_seed},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def data_job(cfg_json: str, gen_seed: int, sim_seed: int, cache: str) -> dict:
    """One data episode (:func:`testbed.aset.general.episode_data`) of generated training scenario
    ``gen_seed``, read from or written to the cache; ``x``, ``y``, ``ref`` arrays and figures."""
    cfg = AsetConfig.model_validate_json(cfg_json)
    policies = aset_actions(cfg)
    f = Path(cache) / f"{_key(cfg, policies, gen_seed, sim_seed)}.npz"
    if f.is_file():
        try:
            with np.load(f, allow_pickle=False) as d:
                return {k: d[k] for k in d.files} | {"cached": True}
        except (OSError, ValueError):
            pass
    doc = draw_scenario("train", gen_seed)
    info = doc.pop("x_generated")
    g = cfg.general
    out = episode_data(plan_document(doc), sim_seed, policies, cfg.observation, horizon=g.horizon_windows,
                       probe_every=g.probe_every, behaviour_epsilon=g.behaviour_epsilon, duration_s=g.episode_s)
    out.pop("base")
    out["pattern"] = np.array(info["pattern"])
    f.parent.mkdir(parents=True, exist_ok=True)
    tmp = f.with_suffix(".tmp.npz")
    np.savez_compressed(tmp, **out)
    tmp.replace(f)
    return out | {"cached": False}


def _join(parts: list[dict]) -> dict:
    if not parts:
        return {"x": np.zeros((0, 1, 1), np.float32), "y": np.zeros((0, 1), np.float32), "ref": np.zeros(0, np.int64)}
    return {k: np.concatenate([p[k] for p in parts]) for k in ("x", "y", "ref")}


def train_general(cfg: AsetConfig, base: Path, *, jobs: int | None = None, backend: str = "process",
                  ray_address: str | None = None, console=None) -> list[str]:
    """Train (module docstring); returns the lines to print (what was written, with figures).

    Raises:
        testbed.core.errors.InputError: the config has no ``general:`` section.
    """

    g = cfg.general
    if g is None:
        raise InputError(f"ASET config {cfg.name}: no 'general:' section")
    policies = aset_actions(cfg)
    root = (base / g.out_dir / cfg.name).resolve()
    cache = root / "cache"
    tasks = [(cfg.model_dump_json(), gs, ss, str(cache)) for seed in g.seeds for gs, ss in episode_tasks(cfg, seed)]
    owner = [seed for seed in g.seeds for _ in range(g.episodes)]
    t0 = time.perf_counter()
    results: list[dict | None] = [None] * len(tasks)
    for i, r in imap_unordered(data_job, tasks, backend=backend, jobs=jobs or g.workers, ray_address=ray_address):
        results[i] = r
        if console is not None and (i % 20 == 0):
            console.print(f"data: {sum(x is not None for x in results)}/{len(tasks)} episodes")
    wall = time.perf_counter() - t0
    sim_s = float(sum(float(r["wall_s"]) for r in results if not r["cached"]))
    lines, curves = [], {}
    export_seed = g.export_seed if g.export_seed is not None else g.seeds[0]
    for seed in g.seeds:
        eps = [r for r, o in zip(results, owner, strict=True) if o == seed and len(r["x"])]
        rng = np.random.default_rng([seed, 3103])
        n_valid = max(1, int(round(g.validation_fraction * len(eps))))
        valid_idx = set(rng.choice(len(eps), size=n_valid, replace=False).tolist())
        train = _join([e for i, e in enumerate(eps) if i not in valid_idx])
        valid = _join([e for i, e in enumerate(eps) if i in valid_idx])
        t1 = time.perf_counter()
        res = fit(train, valid, hidden=list(g.hidden), seed=seed, epochs=g.epochs, batch=g.batch_size,
                  lr=g.learning_rate, delta=g.huber_delta)
        fit_s = time.perf_counter() - t1
        out = root / f"seed-{seed}"
        out.mkdir(parents=True, exist_ok=True)
        with open(out / "curve.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["epoch", "train_loss", "valid_loss", "valid_gain_points"])
            w.writerows([[e, f"{a:.6f}", f"{b:.6f}", f"{c:.4f}"] for e, a, b, c in res["curve"]])
        curves[seed] = res["curve"]
        best = min(res["curve"], key=lambda r: r[2])
        default, margin, gains = decision_rule(res["weights"], train, valid, policies)
        meta = {"seed": seed, "episodes": len(eps), "train_samples": int(len(train["x"])),
                "valid_samples": int(len(valid["x"])), "best_epoch": best[0], "valid_loss": best[2],
                "valid_gain_points": best[3], "fit_s": round(fit_s, 1), "config": cfg.name,
                "valid_gain_by_margin": gains}
        rule = {"default_policy": default, "margin": margin}
        export_general(res["weights"], out / "general", policies=policies, obs_spec=cfg.observation, provenance=meta,
                       **rule)
        lines.append(f"seed {seed}: {len(eps)} episodes, {meta['train_samples']} + {meta['valid_samples']} samples, "
                     f"best epoch {best[0]}: validation loss {best[2]:.4f}; default {default}, margin {margin:g}: "
                     f"validation gain {gains[str(margin)]:+.3f} points per probed decision (default alone "
                     f"{gains['default']:+.3f}, margin 0 {gains['0.0']:+.3f}); fit {fit_s:.0f} s -> {out / 'general'}")
        if seed == export_seed and not g.ensemble:
            dst = base / g.export_to
            export_general(res["weights"], dst, policies=policies, obs_spec=cfg.observation, provenance=meta, **rule)
            lines.append(f"exported seed {seed} -> {dst}.{{npz,json}}")
    if g.ensemble:
        lines += export_ensemble(cfg, [r for r in results if len(r["x"])], policies, base, root)
    write_json_atomic(root / "data.json", {"episodes": len(tasks), "wall_s": round(wall, 1),
                                           "simulation_cpu_s": round(sim_s, 1),
                                           "samples": int(sum(len(r["x"]) for r in results))})
    _plot(root / "curves.png", curves)
    lines.append(f"data: {len(tasks)} episodes, {wall:.0f} s wall ({sim_s:.0f} s of simulation in the workers, "
                 f"cached episodes excluded) -> {root}")
    return lines


def export_ensemble(cfg: AsetConfig, episodes: list[dict], policies: tuple[str, ...], base: Path,
                    root: Path) -> list[str]:
    """The gated general checkpoint (:mod:`testbed.agent.gate`): every seed's episodes pooled, a
    share ``validation_fraction`` of them held out (seeded), ``general.ensemble`` scorers each
    fitted on a bootstrap resample of the rest (whole episodes; its out-of-bag episodes choose its
    epoch), the reference = :func:`decision_rule`'s default (highest mean target in the training
    data) and a provisional margin (the best of :data:`MARGINS` for the gated picks on the held-out
    episodes; :mod:`testbed.aset.gate_margin` chooses the one shipped, on the validation scenarios).
    Written to ``general.export_to`` and ``<root>/ensemble/general``; returns the lines to print."""
    g = cfg.general
    rng = np.random.default_rng([3105, len(episodes)])
    n_valid = max(1, int(round(g.validation_fraction * len(episodes))))
    valid_idx = set(rng.choice(len(episodes), size=n_valid, replace=False).tolist())
    train_eps = [e for i, e in enumerate(episodes) if i not in valid_idx]
    valid = _join([e for i, e in enumerate(episodes) if i in valid_idx])
    members, epochs, t0 = [], [], time.perf_counter()
    for b in range(g.ensemble):
        pick = np.random.default_rng([3106, b]).integers(0, len(train_eps), len(train_eps))
        oob = sorted(set(range(len(train_eps))) - set(pick.tolist()))
        res = fit(_join([train_eps[i] for i in pick]), _join([train_eps[i] for i in oob]) if oob else valid,
                  hidden=list(g.hidden), seed=1000 + b, epochs=g.epochs, batch=g.batch_size, lr=g.learning_rate,
                  delta=g.huber_delta)
        members.append(res["weights"])
        epochs.append(int(min(res["curve"], key=lambda r: r[2])[0]))
    train = _join(train_eps)
    default = policies[int(np.argmax(train["y"].mean(axis=0)))]
    gated = GatedPolicy.from_members(members, policies, cfg.observation, default)
    gains = gated_gains(gated, valid)
    margin = max(MARGINS, key=lambda m: (gains[str(m)], m))
    meta = {"members": len(members), "best_epochs": epochs, "train_episodes": len(train_eps),
            "valid_episodes": len(valid_idx), "train_samples": int(len(train["x"])),
            "valid_samples": int(len(valid["x"])), "valid_gain_by_margin": gains, "config": cfg.name,
            "fit_s": round(time.perf_counter() - t0, 1), "margin_choice": {"on": "held-out training episodes"}}
    lines = []
    for dst in (root / "ensemble" / "general", base / g.export_to):
        gated.with_margin(margin).export(dst, meta)
        lines.append(f"gated ensemble of {len(members)} -> {dst}.{{npz,json}}: reference {default}, provisional "
                     f"margin {margin:g} (held-out episodes: {gains[str(margin)]:+.3f} points per probed decision, "
                     f"reference alone {gains['default']:+.3f}); fits {meta['fit_s']:.0f} s")
    return lines


def gated_gains(gated: GatedPolicy, data: dict) -> dict[str, float]:
    """Mean target (points per probed decision) of the gated picks on ``data`` (``x`` of the scorer,
    ``y``), per margin of :data:`MARGINS`, and of the reference alone (``default``)."""
    if not len(data["x"]):
        return {"default": float("nan")} | {str(m): float("nan") for m in MARGINS}
    ref = gated.policies.index(gated.reference)
    rows = np.arange(len(data["x"]))
    lowers = [gain_bounds(gated.member_scores(x), ref, gated.z)[1] for x in data["x"]]
    out = {"default": float(data["y"][:, ref].mean())}
    for m in MARGINS:
        picks = np.array([gate_choice(lo, ref, m) for lo in lowers])
        out[str(m)] = float(data["y"][rows, picks].mean())
    return out


#: The margins (points) the decision rule is chosen from, on the validation episodes.
MARGINS = (0.0, 0.25, 0.5, 1.0, 2.0, 3.0)


def decision_rule(weights: list[np.ndarray], train: dict, valid: dict,
                  policies: tuple[str, ...]) -> tuple[str, float, dict[str, float]]:
    """The acting rule of :meth:`testbed.agent.general.GeneralPolicy.act`: the default policy = the
    one of the highest mean target in ``train`` (the policy that, deviated to for one window, gains
    the most on average over the training distribution), and the margin of :data:`MARGINS` with the
    highest mean target of the picks on ``valid`` (ties: the larger margin). Returns (default,
    margin, validation gain per margin and of the default alone, points per probed decision)."""
    default = policies[int(np.argmax(train["y"].mean(axis=0)))]
    d = policies.index(default)
    layers = list(zip(weights[0::2], weights[1::2], strict=True))
    q = forward(layers, valid["x"]) if len(valid["x"]) else np.zeros((0, len(policies)))
    rows = np.arange(len(q))
    gains = {"default": float(valid["y"][:, d].mean()) if len(q) else float("nan")}
    best_m, best_g = MARGINS[-1], -np.inf
    for m in MARGINS:
        qq = q.copy()
        qq[:, d] += m
        g = float(valid["y"][rows, qq.argmax(axis=1)].mean()) if len(q) else float("nan")
        gains[str(m)] = g
        if g >= best_g:
            best_m, best_g = m, g
    return default, best_m, gains


def _plot(path: Path, curves: dict[int, list]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for seed, c in curves.items():
        e = [r[0] for r in c]
        axes[0].plot(e, [r[1] for r in c], ls="--", label=f"seed {seed} train")
        axes[0].plot(e, [r[2] for r in c], label=f"seed {seed} validation")
        axes[1].plot(e, [r[3] for r in c], label=f"seed {seed}")
    axes[0].set(xlabel="epoch", ylabel="Huber loss (points)", title="general ASET: loss")
    axes[1].set(xlabel="epoch", ylabel="points per probed decision", title="validation decision gain")
    for ax in axes:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


__all__ = ["MARGINS", "GeneralRun", "data_job", "decision_gain", "decision_rule", "episode_data", "episode_tasks",
           "export_ensemble", "fit", "gated_gains", "init_weights", "train_general"]
