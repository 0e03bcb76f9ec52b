"""``testbed compare RUN_DIR``: an emulated run beside its simulated twin, stage by stage.

The twin is the run's own plan (``RUN_DIR/plan.json``, in emulated time whatever the run's time
dilation) simulated with the run's seed and load duration (``run.json``) and the clusters' speeds
the run recorded (:func:`testbed.plan.speeds.read_speeds`, :func:`~testbed.plan.speeds.apply_speeds`).
Its run folder is written beside the report (``OUT/simulated``, a simulated run like any other:
``testbed report RUN_DIR OUT/simulated`` draws both). The queries are paired by id and compared
by the rules of :mod:`testbed.results.twin`.

Written into ``OUT`` (default ``RUN_DIR/compare``): ``compare.json`` (every figure, the rules,
the verdict), ``compare.md`` and ``compare.html`` (the same page, :mod:`testbed.results.page`),
``figures/twin_cdf_<group>.png`` (per stage, the emulated and the simulated CDF of the
like-for-like pairs: all of them, then each cluster) and ``figures/twin_success.png`` (success
per window in both engines).

:func:`twin_line` is the verdict's line at the end of ``testbed run``'s summary: it runs the
comparison when it is cheap (:func:`twin_cost`), and otherwise says how to get it.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from pydantic import ValidationError

from testbed.agent.live import aset_sources
from testbed.core.errors import InputError
from testbed.core.util import write_json_atomic
from testbed.plan.resolved import Plan
from testbed.plan.speeds import Speeds, apply_speeds, read_speeds
from testbed.results.html_report import _json, _make_out_dir, load_run
from testbed.results.page import Block, write_html, write_markdown
from testbed.results.plots import _plt, _save
from testbed.results.record_files import read_records
from testbed.results.runs import run_simulation
from testbed.results.twin import (
    COLUMNS,
    MIN_PAIRS,
    PART_ABS_MS,
    PART_P,
    PART_REL,
    STAGES,
    UNPAIRED_REASONS,
    Pairing,
    choices,
    group_stats,
    like_for_like,
    pair_queries,
    success_difference,
    verdict,
    where_they_part,
    window_s,
)

#: The most cluster figures a report draws (one per cluster, after the one of all pairs).
MAX_CLUSTER_FIGURES = 8
#: Where a run's comparison goes by default, inside the run folder.
COMPARE_DIR = "compare"


class CompareError(InputError):
    """A folder that cannot be compared with its twin (names the folder or file; exit code 2)."""


@dataclass
class EmulatedRun:
    """What the twin needs of an emulated run: its folder, plan (emulated time), seed, load
    duration (emulated s), time dilation k, records, load start (epoch ns; None when the run did not
    record it), status (``run.json``'s) and the speeds it recorded (None: none)."""

    run_dir: Path
    plan: Plan
    seed: int
    duration_s: float
    time_dilation: float
    records: pd.DataFrame
    origin_ns: int | None
    status: str
    speeds: Speeds | None


def read_emulated_run(run_dir: Path) -> EmulatedRun:
    """Read an emulated run folder for :func:`compare_run`; nothing in it is written.

    Raises:
        CompareError: not a folder, no ``run.json``, a simulated run, no or a broken ``plan.json``
            (each named); testbed.results.html_report.ReportError: no records, a JSON file cut short;
            testbed.results.record_files.RecordsError: records that are not whole (names the file).
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise CompareError(f"{run_dir}: not a run directory (no such folder)")
    run = _json(run_dir / "run.json")
    if not run:
        raise CompareError(f"{run_dir / 'run.json'}: missing or empty: {run_dir} is not a run directory")
    if run.get("mode") == "simulation":
        raise CompareError(f"{run_dir}: a simulated run; compare takes an emulated run (testbed run) and simulates "
                           f"its twin")
    plan = _read_plan(run_dir / "plan.json")
    data = load_run(run_dir)
    exp = plan.experiment
    duration = run.get("duration_s") or data.summary.get("duration_s") or exp.duration_s
    start = _json(run_dir / "load_start.json").get("start_ns")
    return EmulatedRun(run_dir, plan, int(run.get("seed", exp.seed)), float(duration), plan.time_dilation,
                       data.records, None if start is None else int(start), str(run.get("status", "unknown")),
                       read_speeds(run_dir))


def _read_plan(path: Path) -> Plan:
    """The run's plan from ``plan.json`` (:meth:`Plan.from_dict`).

    Raises:
        CompareError: the file is missing, not JSON, or not a plan (names the file and the first field)."""
    if not path.exists():
        raise CompareError(f"{path}: missing: compare simulates the run's own plan, which the run writes there at "
                           f"bring-up (a run that failed before its network came up has none)")
    doc = _json(path)
    try:
        return Plan.from_dict(doc)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(x) for x in err["loc"])
        raise CompareError(f"{path}: not a plan of this testbed version ({exc.error_count()} problem(s); first: "
                           f"{where}: {err['msg']})") from None


def simulate_twin(run: EmulatedRun, out: Path) -> tuple[pd.DataFrame, Path, float]:
    """Simulate ``run``'s plan (at its speeds) with its seed and duration into ``out/simulated``;
    returns (the simulated records, that folder, the wall time it took, s).

    Raises:
        testbed.sim.SimError, testbed.core.errors.RunFailure: as :func:`testbed.results.runs.run_simulation`.
    """
    plan = apply_speeds(run.plan, run.speeds)
    t = time.perf_counter()
    sim_dir, _s = run_simulation(plan, duration_s=run.duration_s, seed=run.seed, run_dir=out / "simulated",
                                 quiet=True)
    wall = time.perf_counter() - t
    return read_records(sim_dir / "records.parquet"), sim_dir, wall


def compare_run(run_dir: Path, out_dir: Path | None = None, run_status: str | None = None) -> dict:
    """Compare an emulated run with its simulated twin and write the report (module docstring).
    ``run_status``: how the run ended, when the caller knows it before ``run.json`` says it
    (``testbed run``'s summary; default: ``run.json``'s ``status``).

    Returns ``compare.json``'s content, with ``html``, ``markdown`` and ``json`` (the paths written).

    Raises:
        CompareError, ReportError, RecordsError: bad input, before anything is written (named).
        testbed.sim.SimError: the plan cannot be simulated (named).
        ReportError: ``out_dir`` cannot be created or written.
    """
    t = time.perf_counter()
    run = read_emulated_run(run_dir)
    if run_status is not None:
        run.status = run_status
    out = Path(out_dir) if out_dir is not None else run.run_dir / COMPARE_DIR
    created = _make_out_dir(out)
    try:
        sim, sim_dir, sim_wall = simulate_twin(run, out)
        pairing = pair_queries(run.records, sim, run.origin_ns)
        result = _result(run, pairing, sim_dir, sim_wall)
        figures = _figures(pairing, result, out / "figures")
        result["wall_s"]["total"] = round(time.perf_counter() - t, 2)
        paths = {"json": out / "compare.json", "markdown": out / "compare.md", "html": out / "compare.html"}
        write_json_atomic(paths["json"], result, indent=1)
        blocks = _page(result, figures)
        write_markdown(paths["markdown"], blocks)
        write_html(paths["html"], f"Twin report: {run.run_dir.name}", blocks)
    except BaseException:
        if created is not None:
            shutil.rmtree(created, ignore_errors=True)
        raise
    return result | {k: str(v) for k, v in paths.items()}


def _result(run: EmulatedRun, pairing: Pairing, sim_dir: Path, sim_wall: float) -> dict:
    """``compare.json``'s content (without the total wall time)."""
    groups = group_stats(pairing.pairs)
    result = {
        "run_dir": str(run.run_dir), "simulated_run_dir": str(sim_dir), "run_status": run.status,
        "seed": run.seed, "duration_s": run.duration_s, "time_dilation": run.time_dilation,
        "speeds": None if run.speeds is None else run.speeds.model_dump(mode="json"),
        "pairing": {"emulated": pairing.emulated, "simulated": pairing.simulated, "paired": len(pairing.pairs),
                    "share": round(pairing.share, 4),
                    "unpaired": {k: {"queries": v, "why": UNPAIRED_REASONS[k]} for k, v in pairing.unpaired.items()},
                    "lag_ms": pairing.lag_ms()},
        "choices": choices(pairing.pairs),
        "success": success_difference(pairing.pairs, run.duration_s),
        "groups": groups,
        "parts": where_they_part(groups),
        "per_cluster": _per_cluster(pairing.pairs),
        "rules": RULES,
        "wall_s": {"simulate": round(sim_wall, 2)},
    }
    result["verdict"] = verdict(result)
    return result


#: The rules, as compare.json and the report state them (testbed.results.twin's docstring).
RULES = {
    "pairing": "one query id in both engines' records, same source and application, created within 100 ms of "
               "emulated time of each other",
    "like_for_like": "over the pairs both engines answered (HTTP 200) at the same cluster with the "
                     "same model",
    "parts": f"a stage parts in a group when its emulated and simulated medians differ by more than "
             f"{PART_ABS_MS:g} ms and by more than {100 * PART_REL:g} % of the simulated median, over at least "
             f"{MIN_PAIRS} pairs, and the paired Wilcoxon signed-rank test gives p < {PART_P:g}; the group parts at "
             f"the first such stage in a query's order ({', '.join(s.removesuffix('_ms') for s in STAGES)}); the "
             f"verdict names the earliest stage that parts on any cluster (else path), on the cluster where its "
             f"medians differ most",
    "success": "mean over windows of equal emulated time (by the simulated creation instant) of the paired "
               "queries' success ratio emulated - simulated, with a 95 % Student-t interval over the windows; "
               "neighbouring windows are not independent under a long queue, so the interval is optimistic then",
}


def _per_cluster(pairs: pd.DataFrame) -> dict[str, dict]:
    """Each engine on its own, per cluster it sent paired queries to: queries, success ratio, e2e
    p50 of the answered ones (ms)."""
    out: dict[str, dict] = {}
    clusters = sorted(set(pairs["cluster_emu"].astype(str)) | set(pairs["cluster_sim"].astype(str)))
    for c in clusters:
        row = {}
        for side in ("emu", "sim"):
            g = pairs[pairs[f"cluster_{side}"].astype(str) == c]
            ok = pd.to_numeric(g[f"http_status_{side}"], errors="coerce") == 200
            e2e = g.loc[ok, f"e2e_ms_{side}"].dropna()
            row |= {f"queries {side}": int(len(g)),
                    f"success {side}": round(float((g[f"outcome_{side}"] == "success").mean()), 3) if len(g) else None,
                    f"e2e p50 {side}": round(float(e2e.median()), 3) if len(e2e) else None}
        out[c] = row
    return out


# ----------------------------------------------------------------------------- figures

def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", name).strip("_") or "group"


def fig_stage_cdfs(group: pd.DataFrame, title: str, path: Path) -> bool:
    """Per stage (:data:`testbed.results.twin.COLUMNS`), the CDF of the emulated and of the
    simulated times (ms) of ``group``'s like-for-like pairs, in one panel each (2 x 3, 1,265 px
    wide); x up to the larger 99th percentile. False when there is no pair."""
    if not len(group):
        return False
    plt = _plt()
    fig, axes = plt.subplots(2, 3, figsize=(11.5, 6.2))
    for ax, col in zip(axes.flat, COLUMNS, strict=True):
        top = 0.0
        for side, label, color in (("emu", "emulated", "#4c72b0"), ("sim", "simulated", "#dd8452")):
            v = np.sort(group[f"{col}_{side}"].dropna().to_numpy(float))
            if len(v):
                ax.step(v, np.arange(1, len(v) + 1) / len(v), where="post", color=color,
                        label=f"{label}: p50 {np.median(v):.3g} ms")
                top = max(top, float(np.quantile(v, 0.99)))
        ax.set_xlim(left=min(0.0, ax.get_xlim()[0]), right=top * 1.05 if top > 0 else 1.0)
        zero = not (group[f"{col}_emu"].fillna(0).any() or group[f"{col}_sim"].fillna(0).any())
        ax.set(title=col.removesuffix("_ms") + (" (0 in every pair, both engines)" if zero else ""), xlabel="ms",
               ylim=(0, 1.02))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    axes[0][0].set_ylabel("fraction of pairs")
    axes[1][0].set_ylabel("fraction of pairs")
    fig.suptitle(f"{title}: {len(group)} queries answered by the same cluster and model in both engines")
    _save(fig, path)
    return True


def fig_success_windows(pairs: pd.DataFrame, duration_s: float, path: Path) -> bool:
    """The paired queries' success ratio per window (:func:`testbed.results.twin.window_s`) in
    each engine, against the window's start (s of emulated time). False when there is no pair."""
    if not len(pairs):
        return False
    w = window_s(duration_s)
    win = np.floor(pairs["t_s"].to_numpy(float) / w) * w
    plt = _plt()
    fig, ax = plt.subplots(figsize=(11.5, 3.6))
    for side, label, color in (("emu", "emulated", "#4c72b0"), ("sim", "simulated", "#dd8452")):
        per = (pairs[f"outcome_{side}"] == "success").groupby(win).mean()
        ax.plot(per.index, per.to_numpy(), marker="o", color=color, label=label)
    ax.set(xlabel=f"window start (s of emulated time; windows of {w:g} s)", ylabel="success ratio",
           ylim=(-0.02, 1.02), title="Success per window, paired queries")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    _save(fig, path)
    return True


def _figures(pairing: Pairing, result: dict, figdir: Path) -> dict[str, tuple[str, Path]]:
    """Every figure of the report: name -> (title, PNG)."""
    lfl = like_for_like(pairing.pairs)
    out: dict[str, tuple[str, Path]] = {}
    groups = [("all", "All clusters", lfl)]
    clusters = [g for g in result["groups"] if g != "all" and " -> " not in g][:MAX_CLUSTER_FIGURES]
    groups += [(c, f"Cluster {c}", lfl[lfl["cluster_emu"].astype(str) == c]) for c in clusters]
    for name, title, g in groups:
        p = figdir / f"twin_cdf_{_slug(name)}.png"
        if fig_stage_cdfs(g, title, p):
            out[f"cdf_{name}"] = (f"Stage CDFs, emulated and simulated: {title}", p)
    p = figdir / "twin_success.png"
    if fig_success_windows(pairing.pairs, result["duration_s"], p):
        out["success"] = ("Success per window, emulated and simulated", p)
    return out


# ----------------------------------------------------------------------------- the page

def _cell(x: float | None) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:g}"


def _stage_table(groups: dict[str, list[dict]], names: list[str]) -> pd.DataFrame:
    rows = []
    for g in names:
        for r in groups[g]:
            d = None if r["emu_p50"] is None else round(r["emu_p50"] - r["sim_p50"], 3)
            rows.append({"group": g, "stage": r["stage"].removesuffix("_ms"), "n": r["n"],
                         "emu p50": _cell(r["emu_p50"]), "sim p50": _cell(r["sim_p50"]), "Δ p50": _cell(d),
                         "emu p95": _cell(r["emu_p95"]), "sim p95": _cell(r["sim_p95"]),
                         "Wilcoxon p": _cell(r["p"]), "parts": "PARTS" if r["parts"] else ""})
    return pd.DataFrame(rows)


def _parts_table(groups: dict[str, list[dict]]) -> pd.DataFrame:
    rows = []
    for g, stats in groups.items():
        first = next((r for r in stats if r["parts"]), None)
        e2e = stats[-1]
        rows.append({"group": g, "pairs": stats[0]["n"],
                     "parts at": "-" if first is None else first["stage"].removesuffix("_ms"),
                     "its p50 emu / sim": "-" if first is None else f"{first['emu_p50']:g} / {first['sim_p50']:g}",
                     "e2e p50 emu / sim": f"{_cell(e2e['emu_p50'])} / {_cell(e2e['sim_p50'])}"})
    return pd.DataFrame(rows)


def _page(result: dict, figures: dict[str, tuple[str, Path]]) -> list[Block]:
    """The report's blocks (:mod:`testbed.results.page`)."""
    pr, sd, ch, groups = result["pairing"], result["success"], result["choices"], result["groups"]
    blocks = [Block("h1", f"Twin report: {Path(result['run_dir']).name}"), Block("p", result["verdict"]),
              Block("list", items=(
                  f"emulated run: {result['run_dir']} (status {result['run_status']})",
                  f"simulated twin: {result['simulated_run_dir']} (the run's plan, seed {result['seed']}, "
                  f"{result['duration_s']:g} s of load; time dilation of the run {result['time_dilation']:g}: every "
                  f"figure is in emulated time)",
                  "clusters' speeds: " + ("the profiles' (the run recorded none)" if result["speeds"] is None
                                          else json.dumps(result["speeds"])),
                  f"simulated in {result['wall_s']['simulate']:g} s; the whole comparison took "
                  f"{result['wall_s']['total']:g} s"))]
    if result["run_status"] != "ok":
        blocks.append(Block("warning", f"The run did not end ok (run.json status {result['run_status']}): its records "
                                       f"stop early or are not those of the planned experiment after its failure."))
    unpaired = [f"{v['queries']} {v['why']}" for v in pr["unpaired"].values()]
    lag = pr["lag_ms"]
    blocks += [Block("h2", "Pairing"),
               Block("p", f"{pr['paired']} of {pr['emulated']} emulated queries paired ({100 * pr['share']:.1f} %) "
                          f"with the simulator's {pr['simulated']}. Emulated minus simulated creation instant: p50 "
                          f"{_cell(lag['p50'])} ms, p95 {_cell(lag['p95'])} ms, largest {_cell(lag['max_abs'])} ms. "
                          f"Rule: {RULES['pairing']}."),
               Block("list", items=tuple(unpaired) or ("every query paired",)),
               Block("p", f"Decisions: the same cluster for {_pct(ch['same_cluster'])} of the pairs, the same cluster "
                          f"and model for {_pct(ch['same_choice'])}; {ch['both_answered']} pairs answered in both."),
               Block("h2", "Success"),
               Block("p", f"Paired queries: {_ratio(sd['emu'])} emulated, {_ratio(sd['sim'])} simulated; difference "
                          f"{_cell(sd['diff_pts'])} ± {_cell(sd['ci_pts'])} points over {sd['windows']} windows of "
                          f"{sd['window_s']:g} s. Method: {RULES['success']}."),
               Block("table", table=pd.DataFrame([{"cluster": c, **v} for c, v in result["per_cluster"].items()])),
               Block("p", "Each engine on its own per cluster (the paired queries it sent there): queries, success "
                          "ratio, e2e p50 of the answered ones (ms)."),
               Block("h2", "Where the engines part"),
               Block("p", f"Rule: {RULES['parts']}. Stage figures are taken {RULES['like_for_like']}."),
               Block("table", table=_parts_table(groups))]
    clusters = [g for g in groups if g != "all" and " -> " not in g]
    paths = [g for g in groups if " -> " in g]
    blocks += [Block("h2", "Stages per cluster (ms)"), Block("table", table=_stage_table(groups, ["all", *clusters]))]
    if paths:
        blocks += [Block("h2", "Stages per path (ms)"), Block("table", table=_stage_table(groups, paths))]
    for title, p in figures.values():
        blocks += [Block("h2", title), Block("figure", p.stem, path=p)]
    blocks.append(Block("p", "Rules and figures: docs/reports.md, 'The twin report'; every figure: compare.json."))
    return blocks


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f} %"


# ----------------------------------------------------------------------------- the run's summary line

#: The simulator's speed assumed by :func:`twin_cost` (simulated queries per wall s): well below the
#: 88,288 q/s measured on a busy machine (docs/policies-and-simulator.md, benchmarks/sim_bench.py).
SIM_QPS_FLOOR = 10_000.0
#: What a comparison costs beside the simulation (s): reading, pairing, figures, the page (measured
#: 2.5-8.8 s on the triangle's 10 s, the machine idle and busy).
COMPARE_FIXED_S = 10.0
#: ``testbed run`` compares itself with its twin when that is expected to take at most this long (s).
TWIN_BUDGET_S = 20.0


def twin_cost(plan: Plan, queries: int) -> tuple[float | None, str]:
    """The expected wall time (s) of :func:`compare_run` on a run of ``queries`` queries of ``plan``:
    ``queries / SIM_QPS_FLOOR + COMPARE_FIXED_S``; None (with why) when it cannot be told cheaply:
    sources driven by an ASET checkpoint or a selector plug-in (the twin runs the agent window by
    window)."""
    driven = aset_sources(plan)
    if driven:
        return None, f"sources {', '.join(driven)} are driven by an ASET agent or selector, which the twin runs too"
    return queries / SIM_QPS_FLOOR + COMPARE_FIXED_S, ""


def twin_line(run_dir: Path, plan: Plan, queries: int, ok: bool) -> tuple[str, dict]:
    """The twin's line at the end of ``testbed run``'s summary, and what ``summary.json`` keeps of it
    (``verdict``, ``report`` or ``how``). The twin is compared (:func:`compare_run`, into
    ``RUN_DIR/compare``) when the run ended ok and :func:`twin_cost` is at most
    :data:`TWIN_BUDGET_S`; otherwise the line says why not and how to get it. A comparison that
    fails, or is interrupted (Ctrl-C), says so: the run's own results and exit code stand."""
    how = f"testbed compare {run_dir}"
    if not ok:
        return (f"twin: not compared, the run did not end ok; `{how}` compares what it measured",
                {"how": how, "why": "the run did not end ok"})
    cost, why = twin_cost(plan, queries)
    if cost is None or cost > TWIN_BUDGET_S:
        why = why or f"expected to take {cost:.0f} s, over {TWIN_BUDGET_S:g} s"
        return f"twin: not compared ({why}); get it with `{how}`", {"how": how, "why": why}
    try:
        result = compare_run(run_dir, run_status="ok")  # run.json records the outcome after the summary
    except KeyboardInterrupt:  # the run itself is over and recorded as it ended: only its twin is skipped
        return f"twin: interrupted; get it with `{how}`", {"how": how, "why": "interrupted"}
    except Exception as exc:  # noqa: BLE001 - the run's own results stand; the comparison's failure is said
        first = str(exc).splitlines()[0] if str(exc) else ""
        return (f"twin: the comparison failed ({type(exc).__name__}: {first}); the run's results stand; retry with "
                f"`{how}`", {"how": how, "why": f"failed: {type(exc).__name__}: {first}"})
    return f"{result['verdict']} (report: {result['html']})", {"verdict": result["verdict"], "report": result["html"]}


__all__ = ["COMPARE_DIR", "CompareError", "EmulatedRun", "compare_run", "fig_stage_cdfs", "fig_success_windows",
           "read_emulated_run", "simulate_twin", "twin_cost", "twin_line"]
