"""The move rule of ``testbed specialize``'s plan search (``Settings.ascent``), compared on the
validation set: the rule is chosen here, never on the test set it is scored on.

    nice -n 5 .venv/bin/python benchmarks/ascent_rule.py experiments/generated/validation/gen-validation-*.yaml \\
        --eval-seeds 20 --result

Per experiment: step 1 of :func:`testbed.aset.specialize.specialize` (every built-in policy alone,
then the per-source coordinate ascent) on specialization seed 1's tuning seeds, once per rule of
:data:`testbed.aset.specialize.ASCENT_RULES` (the candidates' runs shared; no budget), then each
rule's plan and the best static policy on the evaluation seeds 1..N (common random numbers; apart
from the tuning seeds, which start at 1,000,000). Gains are paired per seed, in points of success
ratio, with 95 % CIs (:func:`testbed.core.util.paired_test`); "beyond the CI in k of n" is
Holm-corrected over the experiments (:func:`testbed.core.util.holm`). Writes
``benchmarks/results/aset-ascent-rule.json`` with ``--result`` (docs/results.md).
"""

from __future__ import annotations

import argparse
import math
import shlex
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.resultfile import write_result  # noqa: E402
from testbed.aset.specialize import (  # noqa: E402
    ASCENT_RULES,
    Report,
    Settings,
    _Runner,
    search_plan,
    static_job,
    tuning_seeds,
)
from testbed.core.util import holm, paired_test  # noqa: E402
from testbed.plan.build import plan_experiment  # noqa: E402

RESULT = "aset-ascent-rule"


def compare(path: Path, eval_seeds: list[int], workers: int) -> dict:
    """One experiment's plans under every rule and their per-seed success ratios (%) on ``eval_seeds``."""
    plan = plan_experiment(path)
    exp_json, base_dir = plan.experiment.model_dump_json(), str(plan.base_dir)
    srcs = sorted(h.name for h in plan.sources)
    runner = _Runner(workers, None, guard=False)
    seen: dict = {}
    plans, moves, best = {}, {}, ""
    for rule in ASCENT_RULES:
        s = replace(Settings(), ascent=rule)
        rep = Report(str(path), 0.0, 1, tuning_seeds(1, s.tuning_seeds), tuning_seeds(1, s.check_seeds, 500))
        search_plan(runner, exp_json, base_dir, srcs, rep, s, math.inf, None, seen)
        plans[rule], moves[rule], best = rep.mix, rep.mix_moves, rep.best_static
    runs = {"best static": [best] * len(srcs), **plans}
    distinct = list(dict.fromkeys(tuple(a) for a in runs.values()))
    counts = runner.map(static_job, [(exp_json, base_dir, k, list(a)) for a in distinct for k in eval_seeds],
                        "evaluation seeds")
    n = len(eval_seeds)
    by = {a: np.array([100 * c[0] / c[1] if c[1] else math.nan for c in counts[i * n:(i + 1) * n]])
          for i, a in enumerate(distinct)}
    return {"experiment": path.stem, "sources": len(srcs), "best_static": best, "plans": plans, "moves": moves,
            "ratios": {name: by[tuple(a)] for name, a in runs.items()}}


def _pm(t: dict) -> str:
    return f"{t['mean']:+.2f} ± {t['ci']:.2f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("experiments", nargs="+", type=Path)
    ap.add_argument("--eval-seeds", type=int, default=20, help="evaluation seeds 1..N (default 20)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--result", action="store_true", help=f"write benchmarks/results/{RESULT}.json")
    args = ap.parse_args(argv)
    seeds = list(range(1, args.eval_seeds + 1))
    old, new = ASCENT_RULES
    rows, tests = [], []
    for path in args.experiments:
        got = compare(path, seeds, args.workers)
        r = got["ratios"]
        t_new_old = paired_test(r[new], r[old])
        tests.append(t_new_old)
        row = [got["experiment"], got["sources"], f"{got['best_static']} {np.nanmean(r['best static']):.2f}",
               f"{len(got['moves'][old])}: {_pm(paired_test(r[old], r['best static']))}",
               f"{len(got['moves'][new])}: {_pm(paired_test(r[new], r['best static']))}",
               "same plan" if got["plans"][new] == got["plans"][old] else _pm(t_new_old)]
        rows.append(row)
        print(" | ".join(str(v) for v in row), flush=True)
    changed = [t for t, row in zip(tests, rows, strict=True) if row[-1] != "same plan"]
    rejected = holm([t["p"] for t in changed])
    above = sum(1 for t, rej in zip(changed, rejected, strict=True) if rej and t["mean"] > 0)
    below = sum(1 for t, rej in zip(changed, rejected, strict=True) if rej and t["mean"] < 0)
    mean_all = float(np.mean([t["mean"] if row[-1] != "same plan" else 0.0 for t, row in zip(tests, rows,
                                                                                               strict=True)]))
    summary = (f"{new} against {old} over {len(rows)} validation experiments: the plans differ in {len(changed)}; "
               f"mean gain {mean_all:+.2f} points; beyond the CI (Holm) above in {above}, below in {below}")
    print(summary)
    if args.result:
        cmd = "nice -n 5 .venv/bin/python benchmarks/ascent_rule.py " + " ".join(
            shlex.quote(str(p)) for p in args.experiments) + f" --eval-seeds {args.eval_seeds} --result"
        cols = ["experiment", "sources", "best static (tuning seeds' choice), % on evaluation seeds",
                f"{old}: moves, gain over best static (points, 95 % CI)",
                f"{new}: moves, gain over best static", f"{new} - {old}"]
        write_result(RESULT, "The plan search's move rule, on the validation set", cmd,
                     [{"caption": f"evaluation seeds 1-{args.eval_seeds}, paired; plans searched on specialization "
                                  f"seed 1's {Settings().tuning_seeds} tuning seeds", "columns": cols, "rows": rows}],
                     summary=summary,
                     notes=[f"{old}: the candidate with the highest mean gain is tested (one-sided paired t >= "
                            f"{Settings().accept_t}) and no move when it fails; {new}: the highest mean among the "
                            "candidates that pass the same test."])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
