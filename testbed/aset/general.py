"""The general ASET agent in the simulator: episodes driven by the general features
(:mod:`testbed.agent.features`), its training data and its fit.

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
from varied bases, so the scores rank the policies given what the source observes. Acting is the
argmax of Q. What it gives up: one step of policy iteration (the target values one window of a
followed by the base), as the rollout agent of :mod:`testbed.aset.rollout`.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from testbed.agent.features import INPUT_SIZE, PolicyFeaturizer, scorer_input
from testbed.agent.general import GeneralPolicy, forward, plan_feature_context
from testbed.aset.envs import WindowView
from testbed.aset.episode import Episode
from testbed.aset.headroom import continuation_ok
from testbed.plan.build import Plan
from testbed.spec.aset import ObservationSpec


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
        self.featurizers = [PolicyFeaturizer(plan_feature_context(plan, s, self.policies), spec) for s in srcs]
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


def run_general(plan: Plan, seed: int, policy: GeneralPolicy, duration_s: float | None = None) -> dict:
    """ASET (a general checkpoint) on one seed: ``{"ok", "n", "choices": {policy: windows}}``."""
    run = GeneralRun(plan, seed, policy.policies, policy.obs_spec, duration_s)
    choices: dict[str, int] = {}
    while not run.done:
        names = [policy.policies[policy.act(loc, pp)] for loc, pp in run.observe()]
        for n in names:
            choices[n] = choices.get(n, 0) + 1
        run.step(names)
    run.ep.finish()
    return {"ok": int(run.ep.ok.sum()), "n": int(run.ep.n.sum()), "choices": choices}


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

def init_weights(hidden: list[int], seed: int) -> list[np.ndarray]:
    """Glorot-uniform weights and zero biases of the scorer ``INPUT_SIZE -> hidden... -> 1``."""
    rng = np.random.default_rng(seed)
    sizes = [INPUT_SIZE, *hidden, 1]
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
    """Fit the scorer on ``train`` (``x``, ``y``, ``ref`` of :func:`episode_data`, joined), keep the
    epoch of the lowest loss on ``valid``; returns ``weights`` and the ``curve`` (epoch, train loss,
    valid loss, valid decision gain in points)."""
    ws = init_weights(hidden, seed)
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


#: The code an episode's figures depend on (folders and files under ``testbed/``): the model, the
#: simulator, the plan, the specs, the episodes, the references' rollouts, the generator and the
#: general features. Not the trainer's or the evaluation's orchestration, nor the command line.
SIM_CODE = ("core", "model", "sim", "plan", "spec", "aset/episode.py", "aset/headroom.py", "aset/generator.py",
            "aset/general.py", "aset/envs.py", "aset/scenarios.py", "aset/jobs.py", "agent")


@functools.cache
def sim_fingerprint() -> str:
    """sha256 of :data:`SIM_CODE`'s Python files (paths and bytes): the key of the cached episodes of
    :mod:`testbed.aset.general_train` and :mod:`testbed.aset.general_eval`, so a change of the
    orchestration, the docs or the command line does not re-simulate them."""
    import hashlib

    pkg = Path(__file__).resolve().parents[1]
    files = []
    for part in SIM_CODE:
        p = pkg / part
        files += sorted(p.rglob("*.py")) if p.is_dir() else [p]
    h = hashlib.sha256()
    for f in files:
        if "__pycache__" not in f.parts:
            h.update(str(f.relative_to(pkg)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


__all__ = ["SIM_CODE", "GeneralRun", "decision_gain", "episode_data", "fit", "init_weights", "run_general",
           "sim_fingerprint"]
