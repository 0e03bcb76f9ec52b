#!/usr/bin/env python3
"""Markdown table of the zoo's variants: source of weights, quality and its source, size, service times.

    .venv/bin/python benchmarks/zoo_table.py [--families hands,faces,imagenet] [--shares 0.25,0.5,1]

Reads ``models/zoo/manifest.json`` and ``models/profiles/<variant>.json`` (measured by
``testbed profile``); prints nothing it did not read. Per variant and runtime it has: p50 / p95 of
the per-call time [ms] at batch 1 for each share, ``iso`` = isolated calls (quota refilled, low
load), ``b2b`` = back to back (high load); at 1 core only back to back (never throttled).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from testbed.plan import profiles, zoo  # noqa: E402

ZOO = REPO / "models" / "zoo"
PROFILES = REPO / "models" / "profiles"


def cell(rows: list[dict], runtime: str, share: float, load: str) -> str:
    """``p50 / p95`` [ms] of the batch-1 measurement, or ``-``."""
    for r in rows:
        if (r.get("runtime"), float(r["cpu_cores"]), int(r["batch"]), r.get("load", "back_to_back")) == \
                (runtime, share, 1, load):
            return f"{r['p50_ms']:.3g} / {r['p95_ms']:.3g}"
    return "-"


def main(argv: list[str] | None = None) -> int:
    """Print the table."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--families", default="hands,faces,imagenet")
    ap.add_argument("--shares", default="0.25,0.5,1")
    args = ap.parse_args(argv)
    manifest = zoo.load_manifest(ZOO)
    shares = [float(s) for s in args.shares.split(",")]
    head = ["application", "variant", "weights", "quality", "quality source", "params", ".tflite MB", "runtime"]
    for s in shares:
        head += [f"{s:g} core iso", f"{s:g} core b2b"] if s < 1 else [f"{s:g} core"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for fam in args.families.split(","):
        for name in zoo.families(manifest)[fam]:
            v = manifest["variants"][name]
            try:
                rows = profiles.measurements(zoo.load_profile(PROFILES, name))
            except zoo.ZooError:
                rows = []
            size = v.get("size_bytes") or 0
            weights = "random (Keras arch.)" if v.get("random_weights") else (
                "MediaPipe 0.10.21 wheel" if v.get("graph") else v.get("weights", ""))
            source = v["accuracy_source"]
            source = (f"measured here ({v['n_test']} frames with known faces)" if source.startswith("measured")
                      else source.split("; the weights here")[0].split("; its palm")[0])
            for rt in zoo.runtimes_of(manifest, name):
                cells = []
                for s in shares:
                    cells += [cell(rows, rt, s, "isolated"), cell(rows, rt, s, "back_to_back")] if s < 1 \
                        else [cell(rows, rt, s, "back_to_back")]
                mb = f"{size / 1e6:.2f}" + (f" (SavedModel {v['savedmodel_bytes'] / 1e6:.1f})"
                                             if rt == "tensorflow" and v.get("savedmodel_bytes") else "")
                print("| " + " | ".join([fam, name, weights, f"{v['accuracy']:.3f}", source, f"{v['params']:,}",
                                         mb, rt, *cells]) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
