"""The summary as text: its headline lines, its tables, on the console and in ``summary.md``.

:func:`print_summary` prints what :func:`testbed.results.summary.summarize` computed (a dict,
``summary.json``'s), as plain text (never console markup) and saves the same lines with real
Markdown tables. Tables are ``(title, columns, rows)`` (:data:`SummaryTable`), one list for both.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError
from rich.console import Console
from rich.table import Table
from rich.text import Text

from testbed.core.cgroups import PERIOD_US, dilated_period_us
from testbed.core.errors import EXIT_ALL_FAILED
from testbed.core.util import markdown_table, replace_atomic
from testbed.emu.machine import OTHER_NOTABLE_CORES, SATURATED_SHARE, STEAL_NOTABLE_CORES, MachineCpu
from testbed.model.records import CAUSES, SHARES
from testbed.plan.speeds import Speeds
from testbed.results.figures import COLD_RULE, DECISION_SHARE_NOTABLE, LATENCY_RULE, LINKEMU_COUNTERS
from testbed.results.verdict import dilation_warning

SummaryTable = tuple[str, list[str], list[list[object]]]
#: The failure-cause columns of the per-cluster and per-application tables: counts of failed
#: queries by cause (``fail accuracy``, not ``accuracy``: the column is no accuracy figure).
CAUSE_COLUMNS = [f"fail {c}" for c in CAUSES]


def _tables(s: dict) -> list[SummaryTable]:
    """The summary's tables: (title, columns, rows), the same on the console and in summary.md."""
    return [t for step in (_record_tables, _stage_tables, _server_table, _link_emulator_table, _links_table,
                           _capture_table, _health_table) for t in step(s)]


def _cell(v: float | None, fmt: str = "") -> str:
    """A number for a table cell or the headline: formatted (``fmt``; as it is by default), or
    ``n/a`` when not measured (no answered query: not ``None``)."""
    return "n/a" if v is None else format(v, fmt)


def _record_tables(s: dict) -> list[SummaryTable]:
    """Per cluster and per application, from the records: queries, success, answered, failures
    by cause (:data:`CAUSE_COLUMNS`), e2e p95 (ms)."""
    out = []
    for key, what in (("per_cluster", "cluster"), ("per_application", "application")):
        rows = [[name, v["queries"], v["success"], _cell(v["success_ratio"], ".3f"), v["answered"],
                 *[v["failures"].get(c, 0) for c in CAUSES], _cell(v.get("e2e_p95_ms"))]
                for name, v in s.get(key, {}).items()]
        if rows:
            out.append((f"Per {what} (from the records; fail <cause>: failed queries by cause)",
                        [what, "queries", "success", "success ratio", "answered", *CAUSE_COLUMNS, "e2e p95 ms"], rows))
    return out


def _stage_tables(s: dict) -> list[SummaryTable]:
    """Where the time goes per path (medians of the five shares of e2e and the network excess, ms)
    and the decision cost per policy (dispatch_ms p50 / p95, ms)."""
    out = []
    rows = [[path, v["answered"], *(_cell(v[f"{k}_ms"]["p50"]) for k in SHARES),
             _cell(v["network_excess_ms"]["p50"]), _cell(v["expected_rtt_ms"]["p50"])]
            for path, v in (s.get("per_path") or {}).items()]
    if rows:
        out.append(("Where the time goes, per path (medians, ms, of the answered queries; excess = network - "
                    "expected RTT of the path in force at td)",
                    ["source>cluster", "answered", *SHARES, "network excess", "expected RTT"], rows))
    rows = [[p, v["queries"], _cell(v["p50_ms"]), _cell(v["p95_ms"]), _cell(v["max_ms"]), _cell(v["min_deadline_ms"]),
             "-" if v["share_of_deadline"] is None else f"{100 * v['share_of_deadline']:.1f} %"]
            for p, v in (s.get("decision_cost") or {}).items()]
    if rows:
        out.append(("Decision cost per policy (dispatch_ms = td - t0, every query)",
                    ["policy", "queries", "p50 ms", "p95 ms", "max ms", "smallest deadline ms", "p95 / deadline"],
                    rows))
    return out


def _decision_warnings(s: dict) -> list[str]:
    """A WARNING per policy whose decision cost is a noticeable share of its deadlines
    (:data:`testbed.results.figures.DECISION_SHARE_NOTABLE`)."""
    return [f"WARNING: policy {p}'s decisions cost {v['p50_ms']} ms (p50), {v['p95_ms']} ms (p95) each: "
            f"{100 * v['share_of_deadline']:.1f} % of the smallest deadline it decided for ({v['min_deadline_ms']} ms; "
            f"warned from {100 * DECISION_SHARE_NOTABLE:g} %). That time is in dispatch_ms and in e2e: the query "
            f"leaves the source only once it is decided."
            for p, v in (s.get("decision_cost") or {}).items() if v.get("notable")]


#: A (cluster, model) with more than this share of its model calls late (their median call ran
#: slower than the speed the run asked: :func:`testbed.serve.scheduler.pad_work`) gets a WARNING.
LATE_CALLS_NOTABLE = 0.5
#: ... when at least this many of its calls were timed (fewer say little either way),
LATE_CALLS_LEAST = 10
#: ... and its cluster's cgroup ran out of its quota in less than this share of the load's CFS
#: periods: a call that waited for its own cluster's quota is late too, and that wait is the
#: emulated system's own (the simulator charges it), so a cluster throttled in most periods is
#: not called slow for it.
LATE_CALLS_MAX_THROTTLED = 0.5


def _late_cell(calls: dict) -> str:
    timed = sum(v["timed"] for v in calls.values())
    return "-" if not timed else f"{sum(v['late'] for v in calls.values())}/{timed}"


def _followed_quotas(s: dict) -> str:
    """The summary's line on the quotas that followed their work during the load
    (``clusters/<name>.cpu.json`` ``quota_factor`` and ``quota_overrun``:
    :meth:`testbed.emu.servers.ClusterServers.follow_quotas`); empty when none did."""
    cpu = {c: (v.get("cpu") or {}) for c, v in (s.get("per_cluster") or {}).items()}
    got = {c: v for c, v in cpu.items() if v.get("quota_factor")}
    if not got:
        return ""

    def one(c: str, v: dict) -> str:
        f, u = v["quota_factor"], v.get("quota_overrun")
        over = f", overrun /{u['mean']:.2f}" if u and u.get("mean", 1.0) > 1.0 else ""
        return f"{c} x{f['mean']:.2f} mean (x{f['min']:.2f}-{f['max']:.2f}){over}"

    each = ", ".join(one(c, v) for c, v in sorted(got.items()))
    return ("Quotas followed the clusters' work (cores x s x r / u: r = the server's CPU over what the model "
            "charges for its calls and handling, u = how far CFS let it run past its quota): " + each + ".")


def _late_warnings(s: dict) -> list[str]:
    """A WARNING per (cluster, model) most of whose model calls were late, at a cluster that was
    not throttled in most periods (:data:`LATE_CALLS_MAX_THROTTLED`)."""
    out = []
    held = ("ran slower than the speeds the run recorded (speed: host): its inference_ms are longer than the "
            "twin's, which simulates at them" if (s.get("speeds") or {}).get("mode") == "host" else
            "was not at its profile's speed: its inference_ms are longer than the simulator's")
    for name, v in (s.get("per_cluster") or {}).items():
        cpu = v.get("cpu") or {}
        if cpu.get("periods") and cpu.get("throttled_periods", 0) >= LATE_CALLS_MAX_THROTTLED * cpu["periods"]:
            continue
        for model, c in ((v.get("server") or {}).get("calls") or {}).items():
            if c["timed"] >= LATE_CALLS_LEAST and c["late"] > LATE_CALLS_NOTABLE * c["timed"]:
                out.append(f"WARNING: cluster {name}'s calls of {model} ran slower than the speed the run asked: "
                           f"{c['late']} of {c['timed']} were late (beyond 10 % of their target: they waited for "
                           f"the CPU, or took more CPU than the server's speed check measured at start-up from "
                           f"back-to-back calls, as on a busy host or where a call after an idle gap costs this host "
                           f"more than it cost the profile's machine), so this cluster {held}. Waits shrink on a "
                           f"quieter machine or at a larger time dilation; a call's extra CPU does not (per_model "
                           f"cpu_s / timed in clusters/{name}.stats.json against its bare_ms in run.json speeds tells "
                           f"which)")
    return out


def _server_table(s: dict) -> list[SummaryTable]:
    """The servers' own counters (utilization 0-1, 3 decimals)."""
    rows = [[name, _lives_cell(v["server"]), v["server"]["served"], v["server"]["dropped_queue_full"],
             v["server"]["dropped_admission"], v["server"]["errors"], _cell(v["server"]["utilization"], ".3f"),
             "-" if "cpu" not in v else f"{v['cpu']['throttled_periods']}/{v['cpu']['periods']}",
             _late_cell(v["server"].get("calls") or {})]
            for name, v in s.get("per_cluster", {}).items() if "server" in v]
    if not rows:
        return []
    return [("Server counters (each server's own view, summed over its lives: includes warm-up requests "
             "and answers the source had given up on; a killed life's last stats interval is missing; "
             "throttled = CFS periods of the load in which the cluster's cgroup ran out of its quota; "
             "late calls = model calls that ran beyond 10 % of the time the run's speed asked)",
             ["cluster", "lives", "served", "dropped queue_full", "dropped admission", "errors",
              "utilization", "throttled / periods", "late calls / timed"], rows)]


def _link_emulator_table(s: dict) -> list[SummaryTable]:
    """Per link emulator (lK, in link order): delay held, frames, lateness (ms), drops."""
    le = s.get("link_emulators") or {}
    rows = [[name, "-" if v["delay_ms"] is None else f"{v['delay_ms']:.3f}",
             v["frames"], f"{v['max_late_ms']:.3f}", f"{v['mean_late_ms']:.3f}",
             *[v[k] for k in LINKEMU_COUNTERS]]
            for name, v in le.get("per_emulator", {}).items()]
    if not rows:
        return []
    return [("Link emulators (lateness = sent after the due time; drops: loss model, FIFO overflow, "
             "bandwidth shaper queue, link down, kernel receive buffer, send errors)",
             ["emulator", "delay ms held (after datapath compensation)", "frames", "max late ms",
              "mean late ms", "lost", "overflow",
              "shaper drops", "dropped down", "kernel drops", "send errors"], rows)]


def _links_table(s: dict) -> list[SummaryTable]:
    """The 8 busiest links: the controller's port stats in an emulation, the simulator's link load
    in a simulation (``s["mode"]``)."""
    top = sorted(s.get("links", {}).items(), key=lambda kv: -max(kv[1]["util_ab_max"], kv[1]["util_ba_max"]))
    rows = [[name, f"{v['capacity_mbps']:g}", f"{v['util_ab_mean']:.4f}/{v['util_ab_max']:.4f}",
             f"{v['util_ba_mean']:.4f}/{v['util_ba_max']:.4f}", v["drops"]] for name, v in top[:8]]
    if not rows:
        return []
    source = ("the simulator's link load" if s.get("mode") == "simulation" else
              "controller port stats: the bytes each link delivered at its far end, after its shaper")
    return [(f"Busiest links ({source})",
             ["link", "capacity Mbit/s", "util a>b mean/max", "util b>a mean/max", "drops"], rows)]


def capture_warnings(errors: list[str]) -> list[str]:
    """One warning per capture file the packet analysis left out or read in part (``analysis.json``
    ``errors``, :func:`testbed.results.pcap_analysis.analyze_run`): without it, the hops on either side
    of an unread capture point are merged into one, with no word of it."""
    return [f"WARNING: packet capture: {e}; the per-hop delays skip that capture point (the hops on either "
            f"side of it show as one)" for e in errors]


def _capture_table(s: dict) -> list[SummaryTable]:
    """Per-hop one-way delay (ms) from the packet capture."""
    cap = s.get("capture")
    if not cap:
        return []
    rows = [[hop, v["packets"], f"{v['median_ms']:.3f}", f"{v['p95_ms']:.3f}",
             "-" if v["configured_ms"] is None else f"{v['configured_ms']:g}",
             "-" if v.get("emulated_ms") is None else f"{v['emulated_ms']:g}"] for hop, v in cap["hops"].items()]
    return [(f"Per-hop one-way delay, packet capture ({cap['queries_matched']} queries matched, "
             f"{cap['retransmissions']} retransmissions)",
             ["hop", "packets", "median ms", "p95 ms", "configured ms",
              "emulated ms (configured - datapath compensation)"], rows)]


def _health_table(s: dict) -> list[SummaryTable]:
    """The incidents of ``run.json``."""
    incidents = (s.get("health") or {}).get("incidents") or []
    if not incidents:
        return []
    if float(s.get("time_dilation", 1.0)) != 1.0:
        return [("Health: components that died or failed during the run (run.json)",
                 ["component", "kind", "what", "s into the load (wall clock)", "s into the load (emulated)",
                  "exit code", "pid, serving"],
                 [[i["component"], i["kind"], i["how"], i.get("t_load_s"), i.get("t_load_emulated_s"),
                   i.get("exit_code"), _serving(i)] for i in incidents])]
    return [("Health: components that died or failed during the run (run.json)",
             ["component", "kind", "what", "s into the load", "exit code", "pid, serving"],
             [[i["component"], i["kind"], i["how"], i.get("t_load_s"), i.get("exit_code"), _serving(i)]
              for i in incidents])]


def _serving(incident: dict) -> str:
    """``pid 123: l1 (A-B), l2 (B-C)`` for an incident of a process that served several links, else ""."""
    serves = incident.get("serves") or []
    if not serves:
        return ""
    return (f"pid {incident['pid']}: " if incident.get("pid") is not None else "") + ", ".join(serves)


#: A cluster whose cgroup ran out of quota in more than this share of the load's CFS periods was
#: held back by its own quota, not by the machine (:func:`_service_warning`).
THROTTLED_SHARE_NOTABLE = 0.05


def _service_warning(s: dict, sc: dict) -> str:
    """The summary's line about models that ran slower than their profile at servers that were not
    busy: held back by their own CFS quota (the cgroup was throttled: the CPU per query was more
    than the plan's figures give, e.g. on a host slower than when profiled), or by the machine
    (not throttled: other processes had the CPU)."""
    worst = max(sc["starved"], key=lambda k: sc["per_model"][k]["ratio"])
    w = sc["per_model"][worst]
    clusters = sorted({k.split("/")[0] for k in sc["starved"]})
    cpu = {c: (s.get("per_cluster", {}).get(c) or {}).get("cpu") or {} for c in clusters}
    throttled = {c: v.get("throttled_share", 0.0) for c, v in cpu.items() if v}
    head = (f"WARNING: inference ran slower than its profile at servers that were not busy "
            f"({', '.join(sc['starved'])}; e.g. {worst}: median {w['measured_p50_ms']} ms against "
            f"{w.get('expected_p50_ms', w['profile_p50_ms'])} ms expected, {w['ratio']}x). ")
    if throttled and max(throttled.values()) > THROTTLED_SHARE_NOTABLE:
        shares = ", ".join(f"{c} {100 * v:.0f} %" for c, v in sorted(throttled.items()))
        return head + (f"Their cgroups ran out of CPU quota in {shares} of the CFS periods: the CPU per query "
                       f"(model call and request handling, testbed/model/cpu.py) exceeded what the plan's figures "
                       f"give; if the host-speed line says the machine is slower than when profiled, that is why, "
                       f"and the simulator is optimistic here.")
    return head + (f"The machine did not give the clusters their CPU share (load average {sc['loadavg_1min']} on "
                   f"{sc['cpus']} CPUs at the end). Latencies and success are not those of the planned clusters; "
                   f"rerun on a quieter machine.")


#: Where the host-speed warning suggests re-measuring profiles (a copy: models/profiles/ is tracked,
#: and every simulation reads it).
PROFILES_COPY = "runs/profiles-here"


def _lives_cell(server: dict) -> str:
    """``2``, or ``2 (1 never ready)``."""
    n = server.get("lives_not_ready", 0)
    return f"{server['lives']}" + (f" ({n} never ready)" if n else "")


def _machine_lines(m: dict, note: str = "") -> list[str]:
    """The machine's CPU during an emulation's load (``summary.json`` ``machine_cpu``,
    :mod:`testbed.emu.machine`), and a warning when it was saturated on the whole or for a
    stretch; ``note``: why it is not known."""
    if note:
        return [f"Machine CPU during the load: not known: {note}."]
    if not m:
        return []
    try:
        mc = MachineCpu.model_validate(m)
    except ValidationError as exc:
        return [f"Machine CPU during the load: not known: summary.json's machine_cpu is malformed "
                f"({exc.error_count()} errors)."]
    roles = ", ".join(f"{r} {v:.2f}" for r, v in sorted(mc.by_role.items(), key=lambda kv: -kv[1]))
    lines = [f"Machine CPU during the load ({mc.window_s:g} s, first to last query): {mc.busy_cores:.2f} of "
             f"{mc.cpus} CPUs busy, {mc.steal_cores:.2f} stolen by the hypervisor ({100 * mc.busy_share:.0f} % in "
             f"all; at least {100 * SATURATED_SHARE:.0f} % for {mc.saturated_s:g} s of it, peak "
             f"{100 * mc.peak_share:.0f} % over one sample); cores by process: {roles}; the testbed's own processes "
             f"(link emulators, Open vSwitch, sources, controller, link probes, this run) {mc.testbed_cores:.2f}."]
    if mc.busy_share < SATURATED_SHARE and mc.saturated_s >= 0.1 * mc.window_s:
        lines.append(f"WARNING: the machine's CPUs were at least {100 * SATURATED_SHARE:.0f} % busy or stolen for "
                     f"{mc.saturated_s:g} s of the {mc.window_s:g} s load: queries of those seconds waited for a CPU "
                     f"in the testbed's own processes, which the simulator does not model.")
    hot = [f"{label} for {secs:g} s" for label, secs in mc.hot_threads.items() if secs >= 0.1 * mc.window_s]
    if hot:
        lines.append(f"WARNING: a single thread of the testbed's own processes was at least "
                     f"{100 * SATURATED_SHARE:.0f} % of one CPU busy for a tenth or more of the {mc.window_s:g} s "
                     f"load: {'; '.join(hot)}. What it forwards or sends waited behind it even where the machine "
                     f"had idle CPUs, which shows up as network time that the simulator does not have.")
    if mc.busy_share >= SATURATED_SHARE:
        other = mc.by_role.get("other", 0.0)
        beside = [f"the {other:.2f} cores of other processes on the machine"] if other >= OTHER_NOTABLE_CORES else []
        if mc.steal_cores >= STEAL_NOTABLE_CORES:
            beside.append(f"the {mc.steal_cores:.2f} cores the hypervisor gave to other machines")
        lines.append(f"WARNING: the machine's CPUs were {100 * mc.busy_share:.0f} % busy or stolen during the load: "
                     f"queries waited for a CPU in the link emulators, Open vSwitch, the sources and the servers' "
                     f"event loops, which shows up as network and queueing time that the simulator does not have "
                     f"(it models the clusters' CPU shares, not the testbed's own processes, "
                     f"{mc.testbed_cores:.2f} cores here" + "".join(f", nor {b}" for b in beside)
                     + "). Compare with a simulation only at a lower load or on a larger, quieter machine.")
    return lines


def period_warning(k: float) -> str | None:
    """The summary's WARNING when dilation ``k`` stretches the clusters' CFS period past the kernel's
    longest (:func:`testbed.core.cgroups.dilated_period_us`: k > 10), or None: their quota is then
    enforced per ``1 s / k`` of emulated time, not per the model's 100 ms
    (:data:`testbed.core.cgroups.PERIOD_US`; docs/system-model.md, "The CPU quota and service time").
    Runs above k = 10 have come out well above their twins (docs/dilation.md, "What is not done")."""
    emulated_ms = dilated_period_us(k) / k / 1000
    if emulated_ms >= PERIOD_US / 1000 * 0.999:
        return None
    return (f"WARNING: at k = {k:g} the clusters' CPU quota runs over the kernel's longest CFS period, "
            f"{dilated_period_us(k) / 1e6:g} s, which is {emulated_ms:.1f} ms of emulated time, not the "
            f"{PERIOD_US / 1000:g} ms the simulator models, and runs above k = 10 have succeeded well above their "
            f"twins (7-15 points in the validation matrix; docs/dilation.md, 'What is not done')")


def _headline(s: dict) -> list[str]:
    sr = s.get("success_ratio")
    load = s.get("load_s", s["duration_s"])
    span = f"{load:g} s" if load == s["duration_s"] else f"{load:g} s of load (configured {s['duration_s']:g} s)"
    fails = ", ".join(f"{k} {v}" for k, v in (s.get("failures") or {}).items()) or "none"
    drops = s.get("drop_reasons") or {}
    if drops:
        fails += " (dropped: " + ", ".join(f"{k} {v}" for k, v in drops.items()) + ")"
    k = s.get("time_dilation", 1.0)
    clock = " (emulated clock)" if k != 1.0 else ""
    lines = [f"Summary: {s['queries']} queries in {span}{clock}, success ratio {'-' if sr is None else f'{sr:.3f}'}, "
             f"answered {s.get('throughput_qps', 0)} q/s{clock}; failures {fails}"]
    if k != 1.0:
        lines.append(f"Time dilation k = {k:g}: the run took {k:g} x its emulated time on the wall clock; every figure "
                     f"from the records is in emulated time (the link emulators' lateness, the links' rates, the "
                     f"machine's CPU, the health incidents' times and timings_s are on the wall clock).")
        period = period_warning(k)
        if period:
            lines.append(period + ".")
    if s.get("speeds"):
        speeds = Speeds.model_validate(s["speeds"])
        lines.append("Speeds: " + speeds.line() + ".")
        lines.extend(w + "." for w in speeds.warnings())
        followed = _followed_quotas(s)
        if followed:
            lines.append(followed)
    lines.extend(w + "." for w in _late_warnings(s))
    lines[1:1] = _decision_warnings(s)
    small = dilation_warning(s.get("dilation_check") or {})
    if small:
        lines.insert(0, small)
    if s.get("all_failed"):
        lines.insert(0, f"ALL QUERIES FAILED (exit code {EXIT_ALL_FAILED}): {s['all_failed']}")
    e, b = s.get("e2e_ms", {}), s.get("breakdown_ms", {})
    if e:
        lines.append(f"e2e ms: p50 {_cell(e.get('p50'))}  p95 {_cell(e.get('p95'))}  p99 {_cell(e.get('p99'))};  "
                     "mean breakdown ms: " + "  ".join(f"{k} {_cell(b.get(k))}" for k in SHARES)
                     + f" ({s.get('latency_rule', LATENCY_RULE)})")
    ex = s.get("network_excess_ms") or {}
    if ex.get("p50") is not None:
        lines.append(f"Network time above the RTT of the path in force: p50 {ex['p50']:+.3f} ms, p95 {ex['p95']:+.3f} "
                     f"ms (network_ms - expected_rtt_ms, network_ms = (t1 - td) + (t4 - t3h): the transfer of "
                     f"request and answer on the links, their queues, a cold query's TCP handshake, and in an "
                     f"emulation the forwarding cost of its own processes; the decision is dispatch_ms, the "
                     f"server's reading and writing handling_ms).")
    lines.extend(_machine_lines(s.get("machine_cpu") or {}, s.get("machine_cpu_note") or ""))
    lines.append(f"New connections (cold = 1): {s.get('cold_queries', 0)} queries here; "
                 f"{s.get('cold_rule', COLD_RULE)}.")
    le = (s.get("link_emulators") or {}).get("total")
    if le:
        lines.append(f"Link emulators: at most {le['max_late_ms']:.3f} ms late; {le['frames']} frames delivered; "
                     f"dropped: {le['lost']} by the loss model, {le['overflow']} FIFO overflow, {le['shaper_drops']} "
                     f"by the bandwidth shaper, {le['dropped_down']} on a link down, {le['kernel_drops']} by the "
                     f"kernel (the emulator fell behind), {le['send_errors']} send errors.")
    hs = s.get("host_speed") or {}
    if hs.get("slow") and (s.get("speeds") or {}).get("mode") != "profile":  # speed: profile made up for it
        lines.append(f"WARNING: this machine ran {hs['model']}'s bare model call {hs['ratio']}x slower than its "
                     f"profile ({hs['now_ms']} against {hs['profile_ms']} ms): every simulated figure of this "
                     f"plan is optimistic for this machine now (the warning starts at 1.25x); re-measure the "
                     f"profiles and the request handling on this machine state before comparing with a "
                     f"simulation, into a copy of your own: both commands overwrite --profiles, by default the "
                     f"tracked models/profiles/ that every later simulation reads (cp -r models/profiles "
                     f"{PROFILES_COPY}; testbed profile --shares 1,2 --profiles {PROFILES_COPY}; python -m "
                     f"testbed.serve.handling --profiles {PROFILES_COPY}; then profiles_dir: {PROFILES_COPY} "
                     f"in the experiment).")
    sc = s.get("service_check") or {}
    if sc.get("starved"):
        lines.append(_service_warning(s, sc))
    rc = s.get("records_check") or {}
    lines.extend(capture_warnings((s.get("capture") or {}).get("errors") or []))
    for name in rc.get("records_file_missing") or []:
        lines.append(f"WARNING: sources/{name}.records.csv is missing while the source's tally says it wrote "
                     f"{rc.get('queries_created', {}).get(name, '?')} records: none of its queries is in this summary.")
    for name, note in (rc.get("cut_last_line") or {}).items():
        lines.append(f"WARNING: sources/{name}.records.csv: {note}; its whole rows are kept.")
    if rc.get("missing_query_ids"):
        lines.append(f"WARNING: query ids missing from the records (lost records): {rc['missing_query_ids']}")
    if rc.get("sources_without_tally"):
        lines.append("WARNING: no tally from source(s) " + ", ".join(rc["sources_without_tally"])
                     + " (killed before they exited?): records lost at the end of their files cannot be counted")
    if s.get("aset_choices"):
        lines.append("ASET chose, window by window (share of its sources' queries): " + ", ".join(
            f"{k} {100 * v:.1f} %" for k, v in s["aset_choices"].items())
            + " (per source and window: the records' policy column; counts: sources/<name>.records.aset.json).")
    prov = s.get("provenance") or {}
    if prov.get("command"):
        code = (f"git {prov['git_commit'][:12]}" + (" with local changes" if prov.get("git_dirty") else "")
                if prov.get("git_commit") else "code version not known (no git)")
        lines.append(f"Reproduce: {prov['command']} ({code}).")
    h = s.get("health") or {}
    if h.get("failure"):
        lines.append(f"RUN FAILED: {h['failure']['kind']} {h['failure']['component']}; see the Health table and "
                     f"run.json. Records after that point are not of the planned experiment.")
    return lines


def print_summary(s: dict, console: Console, run_dir: Path | None = None) -> None:
    """Print the summary (plain text; headline and tables) and, when ``run_dir`` is given, save it
    as ``summary.md``: the same lines and real Markdown tables."""
    md: list[str] = []
    for line in _headline(s):
        console.print(Text(line))
        md.append(line + "\n")
    for title, cols, rows in _tables(s):
        t = Table(title=Text(title))
        for c in cols:
            t.add_column(Text(c), overflow="fold")
        for r in rows:
            t.add_row(*(Text("" if v is None else str(v)) for v in r))
        console.print(t)
        md.append(f"\n### {title}\n\n" + markdown_table([dict(zip(cols, r, strict=True)) for r in rows], cols))
    if run_dir is not None:
        replace_atomic(Path(run_dir) / "summary.md", lambda p: p.write_text("\n".join(md)))
