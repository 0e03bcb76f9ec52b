"""``testbed train`` of the general agent (an ASET config with a ``general:`` section): data episodes
over the generator's training distribution, in parallel (:mod:`testbed.core.distributed`, process
pool or Ray), one fit per training seed with its learning curve, the export seed's network written
to ``general.export_to`` (:func:`testbed.agent.general.export_general`).

Outputs in ``<general.out_dir>/<config name>/``: ``seed-<k>/curve.csv`` (epoch, train loss,
validation loss, validation decision gain in points: the measured gain of the scorer's pick over
the episode's own action, per probed decision, on held-out episodes), ``seed-<k>/general.{npz,json}``,
``curves.png`` (every seed), ``data.json`` (episodes, samples, simulation wall time). Each
episode's data is cached in ``<out>/cache`` as npz, keyed by everything it depends on (the code,
the generator seed, the simulator seed, the data settings).
"""

from __future__ import annotations

import csv
import hashlib
import json
import time
from pathlib import Path

import numpy as np

from testbed.agent.general import export_general, forward
from testbed.aset.general import episode_data, fit, sim_fingerprint
from testbed.aset.generator import draw_scenario, plan_document
from testbed.core.distributed import imap_unordered
from testbed.core.errors import InputError
from testbed.core.util import write_json_atomic
from testbed.plan.policies import aset_actions
from testbed.spec.aset import AsetConfig

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
    blob = json.dumps({"code": sim_fingerprint(), "obs": cfg.observation.model_dump(), "policies": policies,
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
        export_general(res["weights"], out / "general", policies=policies, obs_spec=cfg.observation, meta=meta, **rule)
        lines.append(f"seed {seed}: {len(eps)} episodes, {meta['train_samples']} + {meta['valid_samples']} samples, "
                     f"best epoch {best[0]}: validation loss {best[2]:.4f}; default {default}, margin {margin:g}: "
                     f"validation gain {gains[str(margin)]:+.3f} points per probed decision (default alone "
                     f"{gains['default']:+.3f}, margin 0 {gains['0.0']:+.3f}); fit {fit_s:.0f} s -> {out / 'general'}")
        if seed == export_seed:
            dst = base / g.export_to
            export_general(res["weights"], dst, policies=policies, obs_spec=cfg.observation, meta=meta, **rule)
            lines.append(f"exported seed {seed} -> {dst}.{{npz,json}}")
    write_json_atomic(root / "data.json", {"episodes": len(tasks), "wall_s": round(wall, 1),
                                           "simulation_cpu_s": round(sim_s, 1),
                                           "samples": int(sum(len(r["x"]) for r in results))})
    _plot(root / "curves.png", curves)
    lines.append(f"data: {len(tasks)} episodes, {wall:.0f} s wall ({sim_s:.0f} s of simulation in the workers, "
                 f"cached episodes excluded) -> {root}")
    return lines


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


__all__ = ["data_job", "episode_tasks", "train_general"]
