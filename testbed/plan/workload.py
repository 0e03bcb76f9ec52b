"""The workload of a plan: each entry's sources and their spatial weights (demand matrices read
here), and the load's bounds (:mod:`testbed.spec.experiment`) checked before anything runs."""

from __future__ import annotations

from pathlib import Path

from testbed.core.util import repo_path
from testbed.model.arrivals import ArrivalError
from testbed.plan.network_layout import Network
from testbed.plan.resolved import PlanError
from testbed.plan.traces import read_trace, source_weights
from testbed.spec import experiment as cfg
from testbed.spec.experiment import Experiment, WorkloadSpec


def resolve_weights(net: Network, base_dir: Path) -> list[dict[str, float]]:
    """Per workload entry, the spatial weight of every source it selects
    (:func:`testbed.plan.traces.source_weights`; demand matrices read relative to ``base_dir``).

    Raises:
        PlanError: a weight cannot be resolved (names the workload entry).
    """
    site_of = {s.name: s.node_id for s in net.switches}
    site_names = {h.name: (h.site, site_of[h.switch]) for h in net.hosts if h.role == "source"}
    out = []
    for i, w in enumerate(net.exp.workload):
        sel = [s.name for s in net.exp.sources if w.sources == "all" or s.name in w.sources]
        try:
            out.append(source_weights(w, [(n, site_names[n]) for n in sel], Path(base_dir)))
        except ArrivalError as exc:
            raise PlanError(f"workload.{i}: {exc}") from None
    return out


def _peak_rate_qps(w: WorkloadSpec) -> float:
    """The highest rate (q/s, before spatial weights) a workload entry asks of one source."""
    if w.process == "mmpp":
        return max(w.rates_qps)
    if w.process == "step":
        return max(s.rate_qps for s in w.steps)
    if w.process == "diurnal":
        return w.rate_qps * (1 + w.amplitude)
    return w.rate_qps or 0.0


def check_load_bounds(exp: Experiment, weights: list[dict[str, float]], duration_s: float,
                      base_dir: Path = Path(".")) -> int:
    """Check a load of ``duration_s`` s against the bounds of :mod:`testbed.spec.experiment` (also when a
    command overrides the duration): each source's peak rate after its spatial weight, the
    expected queries of the run, the report intervals, MMPP state changes. Trace files are read
    (and so validated) here. Returns the expected number of queries.

    Raises:
        PlanError: a bound is exceeded or a trace cannot be read (names the workload entry); the
            workload creates no query at all in ``duration_s`` (every entry's rates are 0, or its
            trace has no arrival before the end: the run would measure nothing, exit 5, after the
            emulation was built; names every entry), or fewer than 1 query expected in all.
    """
    if not 0 < duration_s <= cfg.MAX_DURATION_S:
        raise PlanError(f"duration {duration_s:g} s: must be in (0, {cfg.MAX_DURATION_S:g}] s")
    problem = cfg.windows_problem(duration_s, exp.report_interval_s, [a.deadline_ms for a in exp.applications])
    if problem:
        raise PlanError(problem)
    expected = 0.0
    silent: list[str] = []  # the entries that create no query
    for i, (w, ws) in enumerate(zip(exp.workload, weights, strict=True)):
        item = f"workload.{i} ({w.application})"
        if w.process == "trace":
            try:
                t = read_trace(repo_path(w.trace, Path(base_dir)))
            except ArrivalError as exc:
                raise PlanError(f"{item}: {exc}") from None
            expected += float((t < duration_s).sum()) * len(ws)
            if not (t < duration_s).any():
                silent.append(f"{item}: its trace has no arrival before {duration_s:g} s")
            continue
        peak = _peak_rate_qps(w)
        if peak * sum(ws.values()) <= 0:
            silent.append(f"{item}: its {w.process} rates are 0 q/s" if peak <= 0 else
                          f"{item}: its sources' spatial weights are all 0")
        for src, weight in ws.items():
            if peak * weight > cfg.MAX_RATE_QPS:
                raise PlanError(f"{item}: source {src!r} would get {peak:g} q/s x spatial weight {weight:.3g} = "
                                f"{peak * weight:g} q/s, over the bound of {cfg.MAX_RATE_QPS:g} q/s per source")
        expected += peak * duration_s * len(ws)
        if w.process == "mmpp" and duration_s / min(w.dwell_s) > cfg.MAX_STATE_CHANGES:
            raise PlanError(f"{item}: mmpp dwell {min(w.dwell_s):g} s over {duration_s:g} s is about "
                            f"{duration_s / min(w.dwell_s):.3g} state changes per source, over the bound of "
                            f"{cfg.MAX_STATE_CHANGES:.0e}")
    if len(silent) == len(exp.workload):
        raise PlanError(f"the workload creates no query in {duration_s:g} s ({'; '.join(silent)}): the run would "
                        f"measure nothing; give some entry a rate above 0")
    if expected < 1:
        raise PlanError(f"the workload expects {expected:.3g} queries in {duration_s:g} s (peak rates x sources x "
                        f"duration, fewer than 1): the run would most likely measure nothing; lengthen the "
                        f"duration or raise a rate")
    if expected > cfg.MAX_EXPECTED_QUERIES:
        raise PlanError(f"the workload asks for about {expected:.3g} queries in {duration_s:g} s (peak rates x sources "
                        f"x duration), over the bound of {cfg.MAX_EXPECTED_QUERIES:,} per run (the simulator holds "
                        f"every query in memory, ~2.5 KB each); lower the rates or the duration")
    return int(expected)


__all__ = ["check_load_bounds", "resolve_weights"]
