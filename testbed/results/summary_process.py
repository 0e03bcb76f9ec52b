"""The summary of an emulated run, in a process of its own (:func:`testbed.results.verdict.summarise_in_child`):
``python -m testbed.results.summary_process RUN_DIR DURATION_S TIMINGS_JSON [--capture]``.

It writes ``summary.json`` (:func:`summarise`) and exits 0, or exits 1 with the error on stderr;
a crash kills only this process, never the run's verdict.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from testbed.core.util import write_json_atomic
from testbed.plan.transfer import dilation_figures
from testbed.results.figures import _plan_doc, answered
from testbed.results.pcap_analysis import analyze_run
from testbed.results.record_files import read_records
from testbed.results.summary import summarize
from testbed.results.verdict import dilation_check


def summarise(run_dir: Path, duration_s: float, timings: dict[str, float], capture: bool) -> dict:
    """``summary.json`` of whatever was measured (also of nothing): the packet analysis first when
    the run captured packets, :func:`testbed.results.summary.summarize`, the run's ``timings_s``
    (wall clock), ``clocks`` (the clock of each kind of figure) and ``dilation_check``
    (:func:`testbed.results.verdict.dilation_check`). Returns it.

    Raises:
        OSError, TestbedError: the records cannot be merged or the summary written.
    """
    measured = any((run_dir / "sources").glob("*.records.csv"))
    if measured and capture and (run_dir / "pcap").is_dir():
        analyze_run(run_dir)
    s = summarize(run_dir, duration_s)
    s["timings_s"] = {k: round(v, 2) for k, v in timings.items()}
    s["clocks"] = {"records and every figure from them": "emulated", "duration_s, load_s": "emulated",
                   "timings_s": "wall", "machine_cpu": "wall (cores over the load's wall-clock window)",
                   "link_emulators (lateness)": "wall", "links (rates)": "wall",
                   "health (incidents' t_run_s, t_load_s)": "wall; t_load_emulated_s: emulated"}
    if measured and s.get("queries"):
        merged = run_dir / "records.parquet"
        rows = answered(read_records(merged if merged.exists() else run_dir / "records.csv")).to_dict("records")
        host, planned, _ = dilation_figures(_plan_doc(run_dir) or {}, rows)
        s["dilation_check"] = dilation_check(float(s.get("time_dilation", 1.0)), host, planned,
                                             s.get("machine_cpu") or {}, ovs_daemons(run_dir))
    write_json_atomic(run_dir / "summary.json", s, indent=2)
    return s


def ovs_daemons(run_dir: Path) -> int:
    """The ``ovs-vswitchd`` processes the run forwarded with: its OVS shards (``network.json``
    ``ovs``), else 1 (the system's)."""
    try:
        ovs = json.loads((run_dir / "network.json").read_text()).get("ovs")
    except (OSError, ValueError, AttributeError):
        return 1
    return len(ovs) if isinstance(ovs, list) and ovs else 1


def main(argv: list[str]) -> int:
    run_dir, duration_s, timings = Path(argv[0]), float(argv[1]), json.loads(argv[2])
    try:
        summarise(run_dir, duration_s, timings, "--capture" in argv[3:])
    except Exception as exc:  # noqa: BLE001 - the parent reports it as the summary's failure
        print(f"summary failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
