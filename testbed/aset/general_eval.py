"""``testbed evaluate EXPERIMENT.yaml [...]``: ASET against its references on any experiment files,
over seeds 1..N in the simulator (common random numbers: seed k gives every schedule the same
arrivals).

Per scenario:

- **every static policy** (all sources on it); **best static** = the highest mean over the seeds;
- **fresh-state reference**: the static policies again with the dispatchers hearing the clusters'
  true state every 10 ms (:class:`testbed.sim.Simulator` ``view="fresh"``: the same dispatch rule,
  only what it hears differs); the reference is the best of them (highest mean). Only the
  load-aware policies (registry flag ``load_aware``) are run again: the others' decisions read no
  load, so their stale figure stands for their fresh one (it misses only a cluster failure heard
  up to one report interval sooner: the reference is then a lower bound);
- **per-source static mix** (``mix_seeds`` > 0): coordinate ascent from the best static policy
  (:func:`testbed.aset.headroom.best_mix`) on the first ``mix_seeds`` seeds: offline, with
  hindsight, a reference and not a competitor;
- **ASET**: the checkpoint (a general one, :mod:`testbed.agent.general`; or a plan-based one, which
  must fit the experiment's names: an application-name mismatch is refused with the live
  selector's message, :func:`testbed.agent.npolicy.application_names_problem`);
- **causal planner** (``causal_samples`` K > 0, on the first ``oracle_seeds`` seeds) and
  **clairvoyant oracle** (``oracle_seeds`` > 0), both rollouts over the best static policy
  (:mod:`testbed.aset.headroom`; horizon 2 windows).

Figures: success % mean ± 95 % CI (t), paired differences ASET - X per seed (mean ± CI), and the
capture share of each ceiling's headroom: ``(ASET - best static) / (ceiling - best static)``
(None when the ceiling is not above the best static policy).
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from testbed.agent.general import GeneralPolicy, is_general, plan_feature_context
from testbed.agent.npolicy import policy_files
from testbed.aset.episode import run_static
from testbed.aset.evaluate import inputs_fingerprint
from testbed.aset.general import run_general, sim_fingerprint
from testbed.aset.headroom import best_mix, causal_planner, rollout_oracle, static_ratio
from testbed.aset.jobs import aset_job, check_checkpoint, plan_of
from testbed.core.distributed import imap_unordered
from testbed.core.errors import InputError
from testbed.core.util import ci95, markdown_table, write_json_atomic
from testbed.model.policies import CATALOGUE, REGISTRY

#: Fewest seeds of an evaluation on experiment files (the 95 % CIs and paired differences).
MIN_SEEDS = 10


def static_job(path: str, seed: int, policy: str, view: str, duration_s: float | None) -> tuple[int, int]:
    """(ok, n) of every source on ``policy`` with the dispatchers' ``view``."""
    plan = plan_of(path)
    ep = run_static(plan, seed, [policy] * len(plan.sources), None, duration_s, view=view)
    return int(ep.ok.sum()), int(ep.n.sum())


def aset_general_job(path: str, seed: int, checkpoint: str, duration_s: float | None) -> tuple[int, int]:
    r = run_general(plan_of(path), seed, GeneralPolicy(checkpoint), duration_s)
    return r["ok"], r["n"]


def aset_plan_job(path: str, seed: int, checkpoint: str, duration_s: float | None) -> tuple[int, int]:
    r = aset_job(path, seed, checkpoint, duration_s)
    return r["ok"], r["n"]


def mix_job(path: str, seeds: list[int], start: str, duration_s: float | None) -> list[str]:
    return best_mix(plan_of(path), seeds, list(CATALOGUE), start, None, duration_s)[0]


def assignment_job(path: str, seed: int, assignment: list[str], duration_s: float | None) -> tuple[int, int]:
    return static_ratio(plan_of(path), seed, assignment, None, duration_s)


def oracle_job(path: str, seed: int, base: list[str], duration_s: float | None) -> tuple[int, int]:
    r = rollout_oracle(plan_of(path), seed, base, list(CATALOGUE), None, duration_s, 2)
    return r.ok, r.n


def causal_job(path: str, seed: int, base: list[str], samples: int, duration_s: float | None) -> tuple[int, int]:
    r = causal_planner(plan_of(path), seed, base, list(CATALOGUE), samples, None, duration_s, 2, 1.64)
    return r.ok, r.n


def check_checkpoint_fits(ckpt: Path, paths: Sequence[str]) -> bool:
    """Refuse, before any run, a checkpoint that cannot drive every experiment; True for a general one.

    Raises:
        InputError: a missing or unreadable checkpoint; a general one beyond its bounds on a source;
            a plan-based one whose applications (the live selector's message), clusters or
            sources are not the experiment's.
    """
    try:
        if is_general(ckpt):
            pol = GeneralPolicy(ckpt)
            for p in paths:
                plan = plan_of(p)
                for h in plan.sources:
                    plan_feature_context(plan, h.name, pol.policies)
            return True
        check_checkpoint(ckpt, list(paths))
        return False
    except (OSError, ValueError) as exc:
        raise InputError(f"ASET checkpoint {ckpt}: {exc}") from None


def _key(fn, task: tuple) -> str:
    """The cache key of one job: the function, the simulation's code
    (:func:`testbed.aset.general.sim_fingerprint`), the arguments, an experiment file's content and
    inputs (:func:`testbed.aset.evaluate.inputs_fingerprint`) and, for an ASET job, the checkpoint's files."""
    import hashlib

    h = hashlib.sha256(f"{fn.__name__}\0{sim_fingerprint()}".encode())
    for a in task:
        h.update(json.dumps(a, sort_keys=True, default=str).encode())
        if isinstance(a, str) and a.endswith((".yaml", ".yml")) and Path(a).is_file():
            h.update(Path(a).read_bytes())
            h.update(inputs_fingerprint(str(Path(a).resolve())).encode())
    if fn in (aset_general_job, aset_plan_job):
        for f in policy_files(task[2]):
            h.update(f.read_bytes() if f.is_file() else b"")
    return h.hexdigest()[:24]


def _ratio(c: tuple[int, int]) -> float:
    return c[0] / c[1] if c[1] else math.nan


def _share(x: float, ceiling: float) -> float | None:
    return x / ceiling if ceiling > 1e-9 else None


def evaluate_experiments(paths: Sequence[str], *, checkpoint: Path, seeds: int = MIN_SEEDS,
                         duration_s: float | None = None, mix_seeds: int = 0, oracle_seeds: int = 0,
                         causal_samples: int = 0, workers: int = 2, backend: str = "process",
                         ray_address: str | None = None, out: Path | None = None,
                         progress: Callable[[str], None] | None = None) -> list[dict]:
    """Evaluate (module docstring); returns one row per scenario (also written to ``out``:
    ``runs.csv``, ``results.json``, ``results.md``).

    Raises:
        InputError: fewer than :data:`MIN_SEEDS` seeds; the checkpoint does not fit (before any run).
    """
    if seeds < MIN_SEEDS:
        raise InputError(f"--seeds {seeds}: at least {MIN_SEEDS} (mean ± 95 % CI and paired differences)")
    general = check_checkpoint_fits(checkpoint, paths)
    ks = list(range(1, seeds + 1))
    pols = list(CATALOGUE)

    cache = (out or Path("runs/aset-eval/files")) / "cache"

    def run(fn, tasks: list[tuple]) -> list:
        """``fn`` over ``tasks`` in parallel, each result kept in ``cache`` under :func:`_key`."""
        keys = [_key(fn, t) for t in tasks]
        res: list = [None] * len(tasks)
        todo = []
        for i, k in enumerate(keys):
            f = cache / f"{k}.json"
            try:
                res[i] = json.loads(f.read_text())
            except (OSError, ValueError):
                todo.append(i)
        for j, r in imap_unordered(fn, [tasks[i] for i in todo], backend=backend, jobs=workers,
                                   ray_address=ray_address):
            res[todo[j]] = r
            cache.mkdir(parents=True, exist_ok=True)
            write_json_atomic(cache / f"{keys[todo[j]]}.json", r)
        return res

    say = progress or (lambda _m: None)
    fresh_pols = [x for x in pols if REGISTRY[x].load_aware]
    stat_tasks = [(p, k, pol, view, duration_s) for p in paths
                  for view, names in (("reports", pols), ("fresh", fresh_pols)) for pol in names for k in ks]
    say(f"{len(stat_tasks)} static runs (stale and fresh views)")
    counts = dict(zip(((t[0], t[3], t[2], t[1]) for t in stat_tasks), run(static_job, stat_tasks), strict=True))
    aset_fn = aset_general_job if general else aset_plan_job
    say(f"{len(paths) * len(ks)} ASET runs")
    a_tasks = [(p, k, str(checkpoint), duration_s) for p in paths for k in ks]
    aset_counts = dict(zip(((t[0], t[1]) for t in a_tasks), run(aset_fn, a_tasks), strict=True))
    rows = []
    for p in paths:
        n_src = len(plan_of(p).sources)
        stale = {pol: [_ratio(counts[(p, "reports", pol, k)]) for k in ks] for pol in pols}
        fresh = {pol: [_ratio(counts[(p, "fresh" if pol in fresh_pols else "reports", pol, k)]) for k in ks]
                 for pol in pols}
        best = max(pols, key=lambda x: np.nanmean(stale[x]))
        best_f = max(pols, key=lambda x: np.nanmean(fresh[x]))
        row = {"scenario": p, "sources": n_src, "statics": {x: ci95(stale[x]) for x in pols},
               "best": best, "best_ratio": ci95(stale[best]), "fresh_best": best_f,
               "fresh_ratio": ci95(fresh[best_f]), "per_seed": {"best": stale[best], "fresh": fresh[best_f]}}
        row["per_seed"]["aset"] = [_ratio(aset_counts[(p, k)]) for k in ks]
        rows.append(row)
    if mix_seeds:
        say(f"mix: coordinate ascent on seeds 1..{mix_seeds}")
        mixes = run(mix_job, [(r["scenario"], ks[:mix_seeds], r["best"], duration_s) for r in rows])
        m_tasks = [(r["scenario"], k, m, duration_s) for r, m in zip(rows, mixes, strict=True) for k in ks]
        mc = run(assignment_job, m_tasks)
        for j, (r, m) in enumerate(zip(rows, mixes, strict=True)):
            r["mix"] = m
            r["per_seed"]["mix"] = [_ratio(c) for c in mc[j * len(ks):(j + 1) * len(ks)]]
    for kind, n_k, fn, extra in (("oracle", oracle_seeds, oracle_job, ()),
                                 ("causal", oracle_seeds if causal_samples else 0, causal_job, (causal_samples,))):
        if not n_k:
            continue
        say(f"{kind}: {n_k} seeds per scenario")
        tasks = [(r["scenario"], k, [r["best"]] * r["sources"], *extra, duration_s) for r in rows for k in ks[:n_k]]
        res = run(fn, tasks)
        for j, r in enumerate(rows):
            r["per_seed"][kind] = [_ratio(c) for c in res[j * n_k:(j + 1) * n_k]] + [math.nan] * (len(ks) - n_k)
    for r in rows:
        _differences(r)
    if out is not None:
        _write(out, rows, ks)
    return rows


def _differences(r: dict) -> None:
    """Paired differences (points) and capture shares of one scenario's row."""
    ps = {k: np.asarray(v, float) * 100 for k, v in r["per_seed"].items()}
    a = ps["aset"]
    r["aset"] = ci95(list(a))
    d = {}
    for ref in ("best", "fresh", "mix", "causal", "oracle"):
        if ref in ps:
            ok = ~np.isnan(ps[ref]) & ~np.isnan(a)
            d[ref] = ci95(list(a[ok] - ps[ref][ok]))
            if ref != "best":
                d[f"{ref}-best"] = ci95(list(ps[ref][ok] - ps["best"][ok]))
    r["diff"] = d
    gain = d["best"][0]
    r["capture"] = {ref: _share(gain, d[f"{ref}-best"][0]) for ref in ("fresh", "causal", "oracle")
                    if f"{ref}-best" in d}


def _pm(c) -> str:
    m, h = c
    return "n/a" if m != m else f"{m:+.2f} ± {h:.2f}"


def results_markdown(rows: list[dict]) -> str:
    """The table of the module docstring's figures (success %, paired differences in points)."""
    head = ["scenario", "src", "best static", "fresh-state best", "mix", "ASET", "ASET - best", "ASET - fresh",
            "ASET - mix", "fresh - best", "causal - best", "oracle - best", "capture (fresh / causal / oracle)"]
    body = []
    for r in rows:
        d = r["diff"]
        cap = " / ".join("n/a" if r["capture"].get(k) is None else f"{100 * r['capture'][k]:.0f} %"
                         for k in ("fresh", "causal", "oracle"))
        mix = f"{100 * np.nanmean(r['per_seed']['mix']):.2f}" if "mix" in r["per_seed"] else "-"
        body.append([Path(r["scenario"]).stem, r["sources"], f"{r['best']} {100 * r['best_ratio'][0]:.2f}",
                     f"{r['fresh_best']} {100 * r['fresh_ratio'][0]:.2f}", mix, f"{r['aset'][0]:.2f}",
                     _pm(d["best"]), _pm(d["fresh"]), _pm(d["mix"]) if "mix" in d else "-",
                     _pm(d["fresh-best"]), _pm(d["causal-best"]) if "causal-best" in d else "-",
                     _pm(d["oracle-best"]) if "oracle-best" in d else "-", cap])
    mean_gain = np.mean([r["diff"]["best"][0] for r in rows])
    table = markdown_table([dict(zip(head, b, strict=True)) for b in body], head)
    return f"{table}\n\nMean ASET - best static over the {len(rows)} scenarios: {mean_gain:+.2f} points"


def _write(out: Path, rows: list[dict], ks: list[int]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "runs.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["scenario", "kind", "seed", "success_ratio"])
        for r in rows:
            for kind, v in r["per_seed"].items():
                w.writerows([[r["scenario"], kind, k, f"{x:.6f}"] for k, x in zip(ks, v, strict=True)])
    (out / "results.json").write_text(json.dumps(rows, indent=1, default=float))
    (out / "results.md").write_text(results_markdown(rows) + "\n")


__all__ = ["MIN_SEEDS", "check_checkpoint_fits", "evaluate_experiments", "results_markdown"]
