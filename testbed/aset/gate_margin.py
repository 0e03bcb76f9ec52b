"""The gate's margin, chosen on the validation scenarios (never on those scored).

``python -m testbed.aset.gate_margin CHECKPOINT [CHECKPOINT ...] --scenarios FILE.yaml ... --seeds 1-6
[--write]``: every gated checkpoint (:mod:`testbed.agent.gate`) is run on its scenario(s) at each
candidate margin of :data:`MARGINS` beside its reference (the general checkpoint's default policy
on every source, a specialized checkpoint's plan), on the same seeds (common random numbers). Given
one general checkpoint and several scenarios, each scenario is run with it; given one specialized
checkpoint per scenario (in the same order), each with its own.

Rule (:func:`choose_margin`): a margin is admissible when on every scenario the mean paired
difference agent - reference is at least ``-tolerance`` points (default 0.25: half the 0.5-point
tolerance of the issue's targets); the margin shipped is the admissible one of the highest mean
difference over the scenarios (ties: the larger margin); with none admissible, :data:`OFF` (the
reference alone). ``--write`` stores it in a general checkpoint's JSON (``margin``, with the
table in ``meta.margin_choice``); for specialized checkpoints it prints the value that
:data:`testbed.aset.specialize.DEFAULT_MARGIN` should hold, and ``--apply MARGIN CHECKPOINT ...``
gives checkpoints specialized before that choice the margin (with their check's verdict at it).
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from testbed.agent.gate import GatedPolicy, set_margin
from testbed.aset.episode import run_static
from testbed.aset.jobs import agent_job, plan_of
from testbed.aset.specialize import CHECK_MARGINS, OFF_MARGIN, apply_margin, margin_after_check
from testbed.core.distributed import imap_unordered
from testbed.core.util import ci95
from testbed.spec.experiment import AsetSpec

#: Candidate margins (points): those a specialized checkpoint's final check measures.
MARGINS = CHECK_MARGINS
#: The margin that never leaves the reference.
OFF = OFF_MARGIN


def margins_job(scenario: str, checkpoint: str, seed: int, margins: Sequence[float], scratch: str) -> list[float]:
    """Success ratio of the gated checkpoint on one seed at each of ``margins`` (ascending), each
    a copy written under ``scratch`` and driven through the one agent loop
    (:func:`testbed.aset.jobs.agent_job`): for a specialized one, what it ships at that margin (its
    final check's verdict, :func:`testbed.aset.specialize.margin_after_check`: the plan where the
    check switched the corrections off). Once a margin's run leaves the reference nowhere, every
    larger margin's run is the reference's (the gate deviates where the lower bound beats the
    margin: on the same states, never at a larger one), which is not simulated again."""
    g = GatedPolicy(checkpoint)
    srcs = sorted(h.name for h in plan_of(scenario).sources)
    ref = {s: g.reference_of(s) for s in srcs}
    out: list[float] = []
    quiet: float | None = None  # the run of a margin at which the gate never deviated
    for m in sorted(margins):
        eff = margin_after_check(g.provenance, m) if g.specialized else m
        if eff >= OFF:
            out.append(reference_job(scenario, checkpoint, seed))
            continue
        if quiet is not None:
            out.append(quiet)
            continue
        path = g.with_margin(eff).export(Path(scratch) / f"{Path(checkpoint).name}-s{seed}-m{eff:g}")
        r = agent_job(scenario, seed, AsetSpec(checkpoint=str(path)).model_dump_json(), None)
        out.append(r["ok"] / r["n"] if r["n"] else math.nan)
        if all(p == ref[s] for s, ps in r["schedule"].items() for p in ps):
            quiet = out[-1]
    return [float(x) for x in out]


def reference_job(scenario: str, checkpoint: str, seed: int) -> float:
    """Success ratio of the checkpoint's reference (default or plan) on one seed."""
    plan = plan_of(scenario)
    g = GatedPolicy(checkpoint)
    ep = run_static(plan, seed, [g.reference_of(s) for s in sorted(h.name for h in plan.sources)])
    return ep.success_ratio


def choose_margin(diffs: dict[float, list[list[float]]], tolerance: float = 0.25) -> tuple[float, dict]:
    """The rule of the module docstring. ``diffs``: margin -> per scenario the per-seed differences
    agent - reference (points). Returns (margin, table: margin -> mean, worst scenario mean, admissible)."""
    table = {}
    for m, per in diffs.items():
        means = [float(np.nanmean(d)) for d in per]
        table[m] = {"mean": float(np.mean(means)), "worst": float(min(means)), "admissible": min(means) >= -tolerance,
                    "per_scenario": [round(x, 3) for x in means]}
    ok = [m for m, t in table.items() if t["admissible"]]
    if not ok:
        return OFF, table
    return max(ok, key=lambda m: (round(table[m]["mean"], 9), m)), table


def measure(pairs: Sequence[tuple[str, str]], seeds: Sequence[int], margins: Sequence[float] = MARGINS,
            workers: int = 2) -> dict[float, list[list[float]]]:
    """Per margin, per (scenario, checkpoint) pair, the per-seed differences agent - reference (points)."""
    with tempfile.TemporaryDirectory(prefix="gate-margin-") as scratch:
        return _measure(pairs, seeds, sorted(margins), workers, scratch)


def _measure(pairs: Sequence[tuple[str, str]], seeds: Sequence[int], margins: list[float], workers: int,
             scratch: str) -> dict[float, list[list[float]]]:
    tasks = [(sc, ck, k) for sc, ck in pairs for k in seeds]
    ref = [0.0] * len(tasks)
    for i, r in imap_unordered(reference_job, tasks, jobs=workers):
        ref[i] = r
    ag: list = [None] * len(tasks)
    for i, r in imap_unordered(margins_job, [(*t, margins, scratch) for t in tasks], jobs=workers):
        ag[i] = r
    n, out = len(seeds), {}
    for mi, m in enumerate(margins):
        out[m] = []
        for pi in range(len(pairs)):
            a = np.array([ag[pi * n + j][mi] for j in range(n)])
            r = np.array(ref[pi * n:(pi + 1) * n])
            out[m].append(list(100 * (a - r)))
    return out


def _seeds(text: str) -> list[int]:
    lo, _, hi = text.partition("-")
    return list(range(int(lo), int(hi or lo) + 1))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoints", nargs="+")
    ap.add_argument("--scenarios", nargs="+", default=[])
    ap.add_argument("--seeds", type=_seeds, default=_seeds("1-6"))
    ap.add_argument("--tolerance", type=float, default=0.25)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None, help="write the table (JSON) here")
    ap.add_argument("--write", action="store_true", help="store the margin in a general checkpoint")
    ap.add_argument("--apply", type=float, default=None, metavar="MARGIN",
                    help="instead: give each specialized CHECKPOINT this margin with its check's verdict at it")
    args = ap.parse_args(argv)
    if args.apply is not None:
        for ck in args.checkpoints:
            m = apply_margin(ck, args.apply, {"on": "the validation set", "chosen": args.apply})
            print(f"{ck}: margin {m:g}" + (" (its check switched the corrections off)" if m >= OFF else ""))
        return 0
    if not args.scenarios:
        ap.error("--scenarios: the validation scenarios")
    if len(args.checkpoints) == 1:
        pairs = [(sc, args.checkpoints[0]) for sc in args.scenarios]
    elif len(args.checkpoints) == len(args.scenarios):
        pairs = list(zip(args.scenarios, args.checkpoints, strict=True))
    else:
        ap.error("give one checkpoint, or one per scenario")
    diffs = measure(pairs, args.seeds, workers=args.workers)
    margin, table = choose_margin(diffs, args.tolerance)
    for m, t in table.items():
        cis = [ci95(d) for d in diffs[m]]
        print(f"margin {m:g}: mean agent - reference {t['mean']:+.3f} points, worst scenario {t['worst']:+.3f}"
              f"{'' if t['admissible'] else ' (not admissible)'}; per scenario "
              + ", ".join(f"{c[0]:+.2f}±{c[1]:.2f}" for c in cis))
    print(f"chosen margin: {margin:g} points")
    prov = {"on": [Path(s).name for s in args.scenarios], "seeds": args.seeds, "tolerance": args.tolerance,
            "table": {str(m): t for m, t in table.items()}, "chosen": margin}
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(prov | {"diffs": {str(m): d for m, d in diffs.items()}}, indent=1))
    if args.write:
        if len(args.checkpoints) != 1 or GatedPolicy(args.checkpoints[0]).specialized:
            ap.error("--write: one general gated checkpoint (specialized margins go to specialize.DEFAULT_MARGIN)")
        set_margin(args.checkpoints[0], margin, prov)
        print(f"wrote margin {margin:g} into {args.checkpoints[0]}.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["MARGINS", "OFF", "choose_margin", "margins_job", "measure"]
