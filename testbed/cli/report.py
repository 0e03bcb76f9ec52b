"""``testbed report RUN_DIR [RUN_DIR ...] [--out DIR]``: HTML + Markdown report of one or more runs."""

from __future__ import annotations

import argparse
from pathlib import Path

from testbed.cli.common import console
from testbed.core.errors import InputError
from testbed.core.util import repeated
from testbed.results.html_report import build_report, merged_by_its_run
from testbed.results.pcap_analysis import analyze_run
from testbed.results.summary import capture_warnings, merge_records


def register(subparsers) -> None:
    """Add the ``report`` subcommand (see :mod:`testbed.results.html_report`)."""
    p = subparsers.add_parser(
        "report", help="write a report (HTML with embedded PNGs + Markdown) of one or more run directories",
        description="Latency CDFs per policy, network/queueing/inference breakdown, success ratio and policy "
                    "over time, link utilization heatmap + topology, per-hop delays (packet capture), and a "
                    "comparison table across runs. Works for emulated and simulated runs.")
    p.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR")
    p.add_argument("--out", type=Path, default=None,
                   help="output folder (default: RUN_DIR/report for one run, <parent>/report-<time> for several)")
    p.add_argument("--analyze", action="store_true",
                   help="(re)run the packet analysis of runs that have a pcap/ folder before reporting: it "
                        "writes RUN_DIR/capture/, and refreshes the merged records a finished run has; "
                        "without it the report only reads the runs")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:

    twice = repeated([str(d.resolve()) for d in args.run_dirs])
    if twice:  # it would be reported as two runs with the same figures
        raise InputError(f"run folder(s) given more than once: {', '.join(twice)}")
    for d in args.run_dirs:
        if args.analyze and (d / "pcap" / "capture.json").exists():

            res = analyze_run(d)
            if merged_by_its_run(d):  # its pkt_* columns anew; a run without its own merge is merged in memory
                merge_records(d)
            console.print(f"{d}: packet analysis matched {res['queries_matched']} queries", markup=False,
                          highlight=False)
            for line in capture_warnings(res.get("errors") or []):
                console.print(f"{d}: {line}", markup=False, highlight=False)
    out = build_report(args.run_dirs, args.out)  # a ReportError (InputError) is printed once by testbed.cli.main
    if out["warning"]:
        console.print(out["warning"])
    console.print(f"report: {out['html']} ({len(out['figures'])} figures; Markdown: {out['markdown']})")
    for k, v in out["skipped"].items():
        console.print(f"  not drawn: {k}: {v}")
    return 0
