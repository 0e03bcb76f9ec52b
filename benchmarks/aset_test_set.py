"""ASET on the frozen test set: every static policy, the per-source mix, the fresh-state reference,
zero-shot ASET (the shipped general checkpoint), specialized ASET (``testbed specialize``'s checkpoint
per scenario), the oracle and the causal planner, per scenario, with paired 95 % CIs, the claims over
the scenarios (Holm-corrected) and issue 37's targets, each met or missed with its numbers.

    nice -n 8 .venv/bin/python benchmarks/aset_test_set.py experiments/generated/test/gen-test-{1..12}.yaml \\
        --name aset-test-set --out runs/aset-test-set/subset12
    nice -n 8 .venv/bin/python benchmarks/aset_test_set.py experiments/generated/test/gen-test-{7,11,22}.yaml \\
        --specialized runs/aset-test-set/ckpt --oracle 5 --causal 4 --name aset-test-set-specialized \\
        --out runs/aset-test-set/heldout3

It is ``testbed evaluate`` (:func:`testbed.aset.evaluate.evaluate`, the one evaluation: tuning seeds
1-5 choose the best static policy, the mix and the fresh-state reference; evaluation seeds 101-120
score every row, paired; the oracle and the causal planner on the first ``--oracle`` of them) with
the agents ``zero-shot`` (``--general``) and, with ``--specialized DIR``, ``specialized``
(``DIR/<scenario stem>``, tuned by ``testbed specialize`` on its own seeds >= 1000000). It writes
``benchmarks/results/<name>.json`` (rendered into docs/results.md by ``benchmarks/results.py``) and
evaluate's own outputs in ``--out`` (results.md, results.json, runs.csv, choices.json, cache/).
"""

from __future__ import annotations

import argparse
import math
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.resultfile import write_result  # noqa: E402
from testbed.aset.evaluate import BEST, CAUSAL, FRESH, MIX, ORACLE, Protocol, evaluate  # noqa: E402
from testbed.model.policies import CATALOGUE  # noqa: E402

#: The targets' tolerance (points) and the mix gain (points) above which specialized ASET must win.
TOL, MIX_GAIN = 0.5, 3.0
ZERO, SPEC = "zero-shot", "specialized"


def _pm(g: dict | None) -> str:
    if g is None or g["mean"] != g["mean"]:
        return "-"
    return f"{g['mean']:+.2f} ± {g['ci']:.2f}" if g["ci"] == g["ci"] else f"{g['mean']:+.2f}"


def _pct(x: dict) -> str:
    return "-" if x["mean"] != x["mean"] else f"{x['mean']:.2f}"


def tables(rows: list[dict], claims: dict, agents: list[str]) -> list[dict]:
    """The page's tables: per scenario every static policy and each row's gain; the claims."""
    refs = [r for r in (MIX, FRESH, ORACLE, CAUSAL) if any(r in row["gains"] for row in rows)]
    gain_cols = [*refs, *agents]
    t1 = {"caption": "Per scenario: every static policy's success % (mean over evaluation seeds 101-120), the best "
                     "static policy (chosen on tuning seeds 1-5), and each row's gain over it in points (mean ± "
                     "95 % CI, paired per seed; the oracle and the causal planner on the first reference seeds)",
          "columns": ["scenario", "sources", *CATALOGUE, "best static", *[f"{c} - best" for c in gain_cols]],
          "rows": [[r["scenario"], r["sources"], *[_pct(r["rows"][p]) if p in r["rows"] else "-" for p in CATALOGUE],
                    f"{r['best_static']} {_pct(r['rows'][BEST])}", *[_pm(r["gains"].get(c)) for c in gain_cols]]
                   for r in rows]}
    t2 = {"caption": "Over the scenarios: above (below) the best static policy beyond the CI, paired t tests at "
                     "5 % Holm-corrected over the scenarios",
          "columns": ["row", "scenarios", "mean gain (pts)", "worst (pts)", "above", "below"],
          "rows": [[k, c["scenarios"], f"{c['mean_gain']:+.2f}", f"{c['worst_gain']:+.2f}",
                    f"{c['above']} of {c['scenarios']}", f"{c['below']} of {c['scenarios']}"]
                   for k, c in claims.items()]}
    return [t1, t2]


def shares_note(rows: list[dict], agents: list[str]) -> str:
    """One line: each agent's most chosen policy and its share of the decisions, per scenario."""
    parts = []
    for a in agents:
        per = []
        for r in rows:
            sh = (r["agents"].get(a) or {}).get("shares") or {}
            if sh:
                top = max(sh, key=lambda p: sh[p])
                per.append(f"{r['scenario']} {top} {100 * sh[top]:.0f} %")
        parts.append(f"{a}: " + ", ".join(per))
    return "Choice shares (the most chosen policy): " + "; ".join(parts) + "."


def verdicts(rows: list[dict], claims: dict) -> list[list[str]]:
    """Issue 37's targets, each ``[target, verdict, numbers]``; a target whose agent was not run says so."""
    out = []
    zero = [(r["scenario"], r["rows"][ZERO]["mean"] - r["rows"]["min_latency"]["mean"]) for r in rows
            if ZERO in r["rows"]]
    if zero:
        worst = min(zero, key=lambda x: x[1])
        out.append(["zero-shot never more than 0.5 below min_latency", "met" if worst[1] >= -TOL else "missed",
                    f"worst {worst[1]:+.2f} ({worst[0]}), mean {sum(x for _, x in zero) / len(zero):+.2f}"])
    spec = [r for r in rows if SPEC in r["gains"]]
    if not spec:
        return out + [["specialized targets", "not measured", "no specialized checkpoint given"]]
    g = [(r["scenario"], r["gains"][SPEC]["mean"]) for r in spec]
    worst = min(g, key=lambda x: x[1])
    out.append(["specialized never more than 0.5 below the best static", "met" if worst[1] >= -TOL else "missed",
                f"worst {worst[1]:+.2f} ({worst[0]})"])
    vm = [(r["scenario"], r["agents"][SPEC]["vs_mix"]["mean"]) for r in spec if "vs_mix" in r["agents"][SPEC]]
    if vm:
        w = min(vm, key=lambda x: x[1])
        out.append(["specialized never more than 0.5 below the mix", "met" if w[1] >= -TOL else "missed",
                    f"worst {w[1]:+.2f} ({w[0]})"])
    big = [r for r in spec if MIX in r["gains"] and r["gains"][MIX]["mean"] >= MIX_GAIN]
    beyond = [r for r in big if r["gains"][SPEC]["mean"] - r["gains"][SPEC]["ci"] > 0]
    out.append([f"specialized above the best static beyond the CI where the mix gains >= {MIX_GAIN:g}",
                ("met" if len(beyond) == len(big) else "missed") if big else "not tested",
                f"{len(beyond)} of {len(big)} such scenarios" + ("" if big else " (none here: vacuous)")])
    mean = sum(x for _, x in g) / len(g)
    head = [r["headroom"]["points"] for r in spec if r.get("headroom")]
    out.append(["specialized averages >= +2 over the best static", "met" if mean >= 2 else "missed",
                f"mean {mean:+.2f} over {len(g)} scenarios; headroom (mix or causal planner) mean "
                f"{(sum(head) / len(head)) if head else math.nan:+.2f}"])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("scenarios", nargs="+", type=Path)
    ap.add_argument("--general", default="models/aset/general", help="the zero-shot checkpoint")
    ap.add_argument("--specialized", type=Path, default=None, help="folder of testbed specialize's checkpoints")
    ap.add_argument("--oracle", type=int, default=0, help="reference seeds of the oracle (and causal planner)")
    ap.add_argument("--causal", type=int, default=0, help="sampled futures of the causal planner (0: off)")
    ap.add_argument("--no-mix", action="store_true", help="skip the per-source mix")
    ap.add_argument("--no-fresh", action="store_true", help="skip the fresh-state reference")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--name", default="aset-test-set", help="the results file's name (docs/results.md section)")
    ap.add_argument("--out", type=Path, default=Path("runs/aset-test-set/eval"))
    args = ap.parse_args(argv)
    agents = {ZERO: args.general}
    if args.specialized is not None:
        agents[SPEC] = str(args.specialized / "{stem}")
    protocol = Protocol(tuning=list(range(1, 6)), seeds=list(range(101, 121)), actions=list(CATALOGUE),
                        mix=not args.no_mix, fresh=not args.no_fresh, reference_seeds=args.oracle,
                        causal_samples=args.causal)
    res = evaluate([str(s) for s in args.scenarios], protocol, args.out, agents=agents, workers=args.workers)
    rows = res.rows
    checks = verdicts(rows, res.claims)
    command = "nice -n 8 .venv/bin/python benchmarks/aset_test_set.py " + " ".join(shlex.quote(a) for a in
                                                                                  (argv or sys.argv[1:]))
    missed = [c[0] for c in checks if c[1] == "missed"]
    summary = (f"{len(rows)} test scenarios, 20 evaluation seeds paired. Targets: "
               + ("all measured ones met." if not missed else "missed: " + "; ".join(missed) + "."))
    tabs = tables(rows, res.claims, list(agents))
    tabs.append({"caption": "Issue 37's targets", "columns": ["target", "verdict", "numbers"], "rows": checks})
    path = write_result(args.name, f"ASET on the frozen test set ({', '.join(r['scenario'] for r in rows)})"
                        if len(rows) <= 4 else f"ASET on the frozen test set ({len(rows)} scenarios)", command, tabs,
                        summary=summary,
                        notes=[shares_note(rows, list(agents)),
                               "Zero-shot is models/aset/general (the gated ensemble, margin 4 points chosen on the "
                               "validation set); specialized checkpoints were tuned on their own seeds (>= 1000000)."])
    print(res.markdown)
    for c in checks:
        print(f"{c[0]}: {c[1]} ({c[2]})")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
