"""The move rule and the restarts of ``testbed specialize``'s plan search (``Settings.ascent``,
``accept_t``, ``start_statics``, ``orders``), compared on the validation set: the rule is chosen
here, never on the test set it is scored on.

    nice -n 5 .venv/bin/python benchmarks/ascent_rule.py experiments/generated/validation/gen-validation-*.yaml \\
        --rules best_mean:0 best_mean:0:1:3 best_mean:0:2:2 --eval-seeds 20 --result

Per experiment: step 1 of :func:`testbed.aset.specialize.specialize` (every built-in policy alone,
then the per-source coordinate ascent) on specialization seed 1's tuning seeds, once per rule
(``ascent:accept_t[:start_statics[:orders]]``, :data:`testbed.aset.specialize.ASCENT_RULES`,
:func:`testbed.aset.specialize.plan_starts`; the candidates' runs shared; no budget), then each
rule's plan and the best static policy on N evaluation seeds from ``--eval-from`` (common random
numbers; apart from the tuning seeds, which start at 1,000,000). Each rule is compared with the
first. Gains are paired per seed, in points of success ratio, with 95 % CIs
(:func:`testbed.core.util.paired_test`); "beyond the CI in k of n" is Holm-corrected over the
experiments (:func:`testbed.core.util.holm`). Writes ``benchmarks/results/aset-ascent-rule.json``
(or ``--name``'s) with ``--result`` (docs/results.md).
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
    TaskRunner,
    search_plan,
    static_job,
    tuning_seeds,
)
from testbed.core.util import holm, paired_test  # noqa: E402
from testbed.plan.build import plan_experiment  # noqa: E402

RESULT = "aset-ascent-rule"


#: A rule: (ascent, accept_t, start_statics, orders) (:class:`testbed.aset.specialize.Settings`).
Rule = tuple[str, float, int, int]


def parse_rule(text: str) -> Rule:
    """``ascent:accept_t[:start_statics[:orders]]`` (e.g. ``best_mean:0:1:3``; the last two default
    to 1) -> (ascent, accept_t, start_statics, orders).

    Raises:
        argparse.ArgumentTypeError: not of that form, or an unknown ascent.
    """
    name, *rest = text.split(":")
    try:
        if not 1 <= len(rest) <= 3:
            raise ValueError
        value = float(rest[0])
        statics, orders = (int(x) for x in [*rest[1:], "1", "1"][:2])
        if statics < 1 or orders < 1:
            raise ValueError
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give ascent:accept_t[:start_statics[:orders]], e.g. "
                                         f"best_mean:1.64 or best_mean:0:1:3 (counts >= 1)") from None
    if name not in ASCENT_RULES:
        raise argparse.ArgumentTypeError(f"{text!r}: ascent one of {', '.join(ASCENT_RULES)}")
    return name, value, statics, orders


def _label(rule: Rule) -> str:
    starts = "" if rule[2:] == (1, 1) else f", starts {rule[2]} x {rule[3]}"
    return f"{rule[0]}, t >= {rule[1]:g}{starts}"


def _spelled(rule: Rule) -> str:
    return f"{rule[0]}:{rule[1]:g}" + ("" if rule[2:] == (1, 1) else f":{rule[2]}:{rule[3]}")


def compare(path: Path, rules: list[Rule], eval_seeds: list[int], workers: int) -> dict:
    """One experiment's plans under every rule and their per-seed success ratios (%) on ``eval_seeds``."""
    plan = plan_experiment(path)
    exp_json, base_dir = plan.experiment.model_dump_json(), str(plan.base_dir)
    srcs = sorted(h.name for h in plan.sources)
    runner = TaskRunner(workers, None, guard=False)
    seen: dict = {}
    plans, moves, best = {}, {}, ""
    for rule in rules:
        s = replace(Settings(), ascent=rule[0], accept_t=rule[1], start_statics=rule[2], orders=rule[3])
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


def _summary(base: Rule, rule: Rule, tests: list[dict | None]) -> str:
    """One rule against the first over the experiments (None: the same plan)."""
    changed = [t for t in tests if t is not None]
    rejected = holm([t["p"] for t in changed])
    above = sum(1 for t, rej in zip(changed, rejected, strict=True) if rej and t["mean"] > 0)
    below = sum(1 for t, rej in zip(changed, rejected, strict=True) if rej and t["mean"] < 0)
    mean_all = float(np.mean([0.0 if t is None else t["mean"] for t in tests]))
    return (f"{_label(rule)} against {_label(base)} over {len(tests)} experiments: the plans differ "
            f"in {len(changed)}; mean gain {mean_all:+.2f} points; beyond the CI (Holm) above in {above}, "
            f"below in {below}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("experiments", nargs="+", type=Path)
    ap.add_argument("--rules", nargs="+", type=parse_rule,
                    default=[("best_mean", 1.64, 1, 1), ("best_passing", 1.64, 1, 1)],
                    help="ascent:accept_t[:start_statics[:orders]] each, the first the baseline "
                         "(default best_mean:1.64 best_passing:1.64)")
    ap.add_argument("--eval-seeds", type=int, default=20, help="how many evaluation seeds (default 20)")
    ap.add_argument("--eval-from", type=int, default=1, help="the first evaluation seed (default 1; the test set's "
                                                               "evaluation, benchmarks/aset_test_set.py, uses 101)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--result", action="store_true", help="write benchmarks/results/NAME.json")
    ap.add_argument("--name", default=RESULT, help=f"the result's NAME (default {RESULT})")
    args = ap.parse_args(argv)
    seeds = list(range(args.eval_from, args.eval_from + args.eval_seeds))
    base, others = args.rules[0], args.rules[1:]
    rows, tests = [], {r: [] for r in others}
    for path in args.experiments:
        got = compare(path, args.rules, seeds, args.workers)
        r = got["ratios"]
        row = [got["experiment"], got["sources"], f"{got['best_static']} {np.nanmean(r['best static']):.2f}"]
        row += [f"{len(got['moves'][x])}: {_pm(paired_test(r[x], r['best static']))}" for x in args.rules]
        for x in others:
            same = got["plans"][x] == got["plans"][base]
            tests[x].append(None if same else paired_test(r[x], r[base]))
            row.append("same plan" if same else _pm(tests[x][-1]))
        rows.append(row)
        print(" | ".join(str(v) for v in row), flush=True)
    summary = "; ".join(_summary(base, x, tests[x]) for x in others)
    print(summary)
    if args.result:
        cmd = ("nice -n 5 .venv/bin/python benchmarks/ascent_rule.py " + " ".join(shlex.quote(str(p)) for p in
               args.experiments) + " --rules " + " ".join(_spelled(r) for r in args.rules)
               + f" --eval-seeds {args.eval_seeds}" + (f" --eval-from {args.eval_from}" if args.eval_from != 1 else "")
               + " --result" + (f" --name {args.name}" if args.name != RESULT else ""))
        cols = (["experiment", "sources", "best static (tuning seeds' choice), % on evaluation seeds"]
                + [f"{_label(x)}: moves, gain over best static (points, 95 % CI)" for x in args.rules]
                + [f"{_label(x)} - {_label(base)}" for x in others])
        title = ("The plan search's move rule, on the validation set" if args.name == RESULT
                 else "The plan search's rules, on the validation set: " + "; ".join(_label(x) for x in args.rules))
        write_result(args.name, title, cmd,
                     [{"caption": f"evaluation seeds {seeds[0]}-{seeds[-1]}, paired; plans searched on specialization "
                                  f"seed 1's {Settings().tuning_seeds} tuning seeds", "columns": cols, "rows": rows}],
                     summary=summary,
                     notes=["best_mean: the candidate with the highest mean gain is tested (one-sided paired t >= "
                            "accept_t) and no move when it fails; best_passing: the highest mean among the "
                            "candidates that pass the same test; accept_t 0: any positive mean gain; starts S x O: "
                            "the ascent from each of the S best static policies in O source orders, the end "
                            "point of the highest tuning mean kept. Moves: over every start of a rule, the ones not "
                            "kept included."])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
