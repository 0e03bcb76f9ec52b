"""The twin's arithmetic: an emulated run's queries paired with the simulator's, stage by stage.

Pure functions of two record frames (:data:`testbed.model.records.RECORD_FIELDS`), no I/O; the
command that reads a run, simulates it and writes the report is :mod:`testbed.results.twin_comparison`.

Rules (stated once here; docs/reports.md, "The twin report"):

- **Pairing** (:func:`pair_queries`): both engines draw the same arrivals from the run's seed and
  number each source's queries ``<source>-1, -2, ...`` in creation order, so a query id names the
  same arrival in both. A pair is one id in both record sets with the same source and
  application, created within :data:`ARRIVAL_TOLERANCE_MS` of each other (emulated time since
  the load started). Every other query is counted under its reason (:data:`UNPAIRED_REASONS`).
- **Like for like** (:func:`like_for_like`): stage figures are taken over the pairs that both
  engines answered (HTTP 200 with an e2e time) at the same cluster with the same model; the share
  of pairs whose decisions differ is given beside them (``same_choice``).
- **Where the engines part** (:func:`parts`, :func:`parts_at`): a stage parts in a group (a
  cluster, a path source -> cluster) when its emulated median differs from its simulated median
  by more than :data:`PART_ABS_MS` *and* by more than :data:`PART_REL` of the simulated median,
  the group has at least :data:`MIN_PAIRS` like-for-like pairs, and the paired Wilcoxon
  signed-rank test (``scipy.stats.wilcoxon``) rejects a zero median difference at
  :data:`PART_P`. The group parts at the first such stage in a query's order (:data:`STAGES`):
  a difference early in a query's life changes what comes after it. The thresholds are the
  validation target of the project's issue on engine agreement (per-stage medians within 1 ms or
  10 %).
- **Success difference** (:func:`success_difference`): the paired queries are cut into windows of
  the same emulated time (by their simulated creation instant; :func:`window_s`). In each window
  the success ratio of its paired queries in the emulation minus that in the simulation; the
  estimate is the mean of those differences over the windows, with a 95 % Student-t interval
  over them (:func:`testbed.core.util.ci95`). Windows next to each other are not independent
  under a long queue, so the interval is optimistic then.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from testbed.core.errors import InputError
from testbed.core.util import ci95

#: The stages of a query's life, in its order (the record's durations, ms; they add up to e2e).
STAGES: tuple[str, ...] = ("dispatch_ms", "network_ms", "handling_ms", "queueing_ms", "inference_ms")
#: What the stage tables show: the stages, then the end-to-end time.
COLUMNS: tuple[str, ...] = (*STAGES, "e2e_ms")
#: A stage parts only if its medians differ by more than this (ms) ...
PART_ABS_MS = 1.0
#: ... and by more than this share of the simulated median ...
PART_REL = 0.10
#: ... and the paired Wilcoxon signed-rank test rejects a zero difference at this level ...
PART_P = 0.01
#: ... over at least this many like-for-like pairs.
MIN_PAIRS = 10
#: Two queries of one id are one arrival only if created within this much emulated time (ms).
ARRIVAL_TOLERANCE_MS = 100.0
#: Why a query is not paired (:func:`pair_queries`), in the order they are checked.
UNPAIRED_REASONS: dict[str, str] = {
    "only_emulated": "only in the emulation (the simulator created no query of that id)",
    "only_simulated": "only in the simulation (no emulated record of that id: not written, or the emulated "
                      "source stopped early)",
    "stream_differs": "the same id for another source or application (the engines drew different arrivals)",
    "created_apart": f"created more than {ARRIVAL_TOLERANCE_MS:g} ms apart (the emulated source fell behind its "
                     f"schedule, or the arrivals differ)",
}
#: Record columns carried into a pair (``<col>_emu``, ``<col>_sim``).
PAIR_COLUMNS: tuple[str, ...] = ("cluster", "model", "policy", "http_status", "outcome", "failure_cause",
                                 "expected_rtt_ms", *COLUMNS)
#: Windows of the success difference: about this long (s of emulated time) ...
WINDOW_TARGET_S = 5.0
#: ... and at least this many over the run.
MIN_WINDOWS = 8


class TwinError(InputError):
    """Records that cannot be paired (a query id twice in one engine's records; named; exit code 2)."""


@dataclass
class Pairing:
    """The pairs of two runs' queries (:func:`pair_queries`).

    ``pairs``: one row per pair: ``query_id``, ``source``, ``application``, ``t_s`` (its simulated
    creation instant, s since the load started), ``lag_ms`` (emulated creation - simulated, ms),
    and ``<col>_emu`` / ``<col>_sim`` for every column of :data:`PAIR_COLUMNS`. ``emulated`` /
    ``simulated``: queries in each engine's records; ``unpaired``: per reason of
    :data:`UNPAIRED_REASONS` (reasons with none left out), the emulated queries left unpaired for
    it (``only_simulated``: simulated queries), so paired + the emulated reasons = ``emulated``."""

    pairs: pd.DataFrame
    emulated: int
    simulated: int
    unpaired: dict[str, int] = field(default_factory=dict)

    @property
    def share(self) -> float:
        """Paired queries over the emulated ones (0 .. 1; 0 for no emulated query)."""
        return len(self.pairs) / self.emulated if self.emulated else 0.0

    def lag_ms(self) -> dict[str, float | None]:
        """Emulated creation instant minus simulated, over the pairs (ms): p50, p95, max of |lag|."""
        lag = self.pairs["lag_ms"].astype(float) if len(self.pairs) else pd.Series(dtype=float)
        if lag.empty:
            return {"p50": None, "p95": None, "max_abs": None}
        return {"p50": round(float(lag.median()), 3), "p95": round(float(lag.quantile(0.95)), 3),
                "max_abs": round(float(lag.abs().max()), 3)}


def _unique_ids(df: pd.DataFrame, engine: str) -> pd.DataFrame:
    twice = df["query_id"][df["query_id"].duplicated()]
    if len(twice):
        raise TwinError(f"{engine} records: query id {twice.iloc[0]!r} appears more than once "
                        f"({len(twice)} repeated ids): the records were merged twice or edited")
    return df.set_index("query_id", drop=False)


def pair_queries(emulated: pd.DataFrame, simulated: pd.DataFrame, origin_ns: int | None = None,
                 tolerance_ms: float = ARRIVAL_TOLERANCE_MS) -> Pairing:
    """Pair two record sets of the same plan and seed by query id (module docstring).

    Args:
        emulated: the emulated run's records (``t0_ns`` epoch ns, already in emulated time).
        simulated: the simulated twin's records (``t0_ns`` since the load started).
        origin_ns: when the emulated load started (epoch ns, ``load_start.json``); None: the
            first emulated query is taken to be created when the first simulated one was.
        tolerance_ms: the most two creation instants of one arrival may differ (emulated ms).

    Raises:
        TwinError: a query id appears twice in one engine's records.
    """
    e, s = _unique_ids(emulated, "emulated"), _unique_ids(simulated, "simulated")
    if origin_ns is None:
        origin_ns = int(e["t0_ns"].min()) - int(s["t0_ns"].min()) if len(e) and len(s) else 0
    both = e.index.intersection(s.index, sort=False)
    unpaired = {"only_emulated": int(len(e) - len(both)), "only_simulated": int(len(s) - len(both))}
    e, s = e.loc[both], s.loc[both]
    same_stream = (e["source"].to_numpy() == s["source"].to_numpy()) & (
        e["application"].to_numpy() == s["application"].to_numpy())
    lag_ms = ((e["t0_ns"].astype("int64").to_numpy() - origin_ns) - s["t0_ns"].astype("int64").to_numpy()) / 1e6
    close = np.abs(lag_ms) <= tolerance_ms
    unpaired["stream_differs"] = int((~same_stream).sum())
    unpaired["created_apart"] = int((same_stream & ~close).sum())
    keep = same_stream & close
    pairs = pd.DataFrame({"query_id": e["query_id"].to_numpy()[keep], "source": e["source"].to_numpy()[keep],
                          "application": e["application"].to_numpy()[keep],
                          "t_s": s["t0_ns"].astype("int64").to_numpy()[keep] / 1e9, "lag_ms": lag_ms[keep]})
    for col in PAIR_COLUMNS:
        pairs[f"{col}_emu"] = e[col].to_numpy()[keep]
        pairs[f"{col}_sim"] = s[col].to_numpy()[keep]
    for col in COLUMNS:
        for side in ("emu", "sim"):
            pairs[f"{col}_{side}"] = pd.to_numeric(pairs[f"{col}_{side}"], errors="coerce").astype(float)
    return Pairing(pairs.sort_values("t_s", kind="stable").reset_index(drop=True), len(emulated), len(simulated),
                   {k: v for k, v in unpaired.items() if v})


def _answered(pairs: pd.DataFrame, side: str) -> pd.Series:
    status = pd.to_numeric(pairs[f"http_status_{side}"], errors="coerce")
    return (status == 200) & pairs[f"e2e_ms_{side}"].notna()


def like_for_like(pairs: pd.DataFrame) -> pd.DataFrame:
    """The pairs both engines answered at the same cluster with the same model (module docstring)."""
    same = (pairs["cluster_emu"] == pairs["cluster_sim"]) & (pairs["model_emu"] == pairs["model_sim"])
    return pairs[same & _answered(pairs, "emu") & _answered(pairs, "sim")]


def _wilcoxon_p(d: np.ndarray) -> float | None:
    """Two-sided p of the paired Wilcoxon signed-rank test of differences ``d`` (1.0 when every
    difference is 0; None for fewer than :data:`MIN_PAIRS`)."""
    if len(d) < MIN_PAIRS:
        return None
    if not np.any(d != 0):
        return 1.0
    from scipy import stats

    return float(stats.wilcoxon(d, zero_method="zsplit").pvalue)


def parts(emu_p50: float, sim_p50: float, n: int, p: float | None) -> bool:
    """Whether a stage's medians part (module docstring: > :data:`PART_ABS_MS` and > :data:`PART_REL`
    of the simulated median apart, at least :data:`MIN_PAIRS` pairs, Wilcoxon p < :data:`PART_P`)."""
    diff = abs(emu_p50 - sim_p50)
    return (n >= MIN_PAIRS and p is not None and p < PART_P and diff > PART_ABS_MS
            and diff > PART_REL * abs(sim_p50))


def _r(x: float) -> float:
    return round(float(x), 3)


def stage_stats(group: pd.DataFrame) -> list[dict]:
    """Per column of :data:`COLUMNS` over ``group``'s like-for-like pairs: ``stage``, ``n``,
    ``emu_p50``, ``sim_p50``, ``emu_p95``, ``sim_p95`` (ms), ``p`` (paired Wilcoxon; None below
    :data:`MIN_PAIRS`), ``parts`` (:func:`parts`; never for ``e2e_ms``, the sum of the stages).
    No pair: the percentiles are None and nothing parts."""
    out = []
    for col in COLUMNS:
        a, b = group[f"{col}_emu"].to_numpy(float), group[f"{col}_sim"].to_numpy(float)
        ok = ~(np.isnan(a) | np.isnan(b))
        a, b = a[ok], b[ok]
        row: dict = {"stage": col, "n": int(len(a))}
        if len(a):
            row |= {"emu_p50": _r(np.median(a)), "sim_p50": _r(np.median(b)), "emu_p95": _r(np.quantile(a, 0.95)),
                    "sim_p95": _r(np.quantile(b, 0.95))}
            p = _wilcoxon_p(a - b)
            row["p"] = None if p is None else float(f"{p:.3g}")
            row["parts"] = col in STAGES and parts(row["emu_p50"], row["sim_p50"], len(a), p)
        else:
            row |= {"emu_p50": None, "sim_p50": None, "emu_p95": None, "sim_p95": None, "p": None, "parts": False}
        out.append(row)
    return out


def parts_at(stats: list[dict]) -> dict | None:
    """The first stage (a row of :func:`stage_stats`) in a query's order that parts, or None."""
    return next((r for r in stats if r["stage"] in STAGES and r["parts"]), None)


def group_stats(pairs: pd.DataFrame) -> dict[str, list[dict]]:
    """:func:`stage_stats` of the like-for-like pairs per group: ``all``, then each cluster
    (``<cluster>``), then each path (``<source> -> <cluster>``), clusters and paths sorted."""
    lfl = like_for_like(pairs)
    out = {"all": stage_stats(lfl)}
    for c, g in sorted(lfl.groupby("cluster_emu", sort=True), key=lambda kv: str(kv[0])):
        out[str(c)] = stage_stats(g)
    for (src, c), g in sorted(lfl.groupby(["source", "cluster_emu"], sort=True), key=lambda kv: tuple(map(str,
                                                                                                            kv[0]))):
        out[f"{src} -> {c}"] = stage_stats(g)
    return out


def choices(pairs: pd.DataFrame) -> dict[str, float | int | None]:
    """How often the engines decided alike: ``pairs``, ``same_cluster`` and ``same_choice``
    (cluster and model) as shares of the pairs (None for no pair), and ``both_answered``."""
    n = len(pairs)
    if not n:
        return {"pairs": 0, "same_cluster": None, "same_choice": None, "both_answered": 0}
    same_c = pairs["cluster_emu"] == pairs["cluster_sim"]
    same = same_c & (pairs["model_emu"] == pairs["model_sim"])
    return {"pairs": n, "same_cluster": _r(same_c.mean()), "same_choice": _r(same.mean()),
            "both_answered": int((_answered(pairs, "emu") & _answered(pairs, "sim")).sum())}


def window_s(duration_s: float) -> float:
    """The success windows' length (s of emulated time): the run cut into ``max(MIN_WINDOWS,
    round(duration / WINDOW_TARGET_S))`` equal windows (40 s: 8 of 5 s; 10 s: 8 of 1.25 s;
    600 s: 120 of 5 s)."""
    return duration_s / max(MIN_WINDOWS, round(duration_s / WINDOW_TARGET_S))


def success_difference(pairs: pd.DataFrame, duration_s: float) -> dict:
    """The success difference emulated - simulated over paired windows (module docstring).

    Returns ``emu``, ``sim`` (success ratios of the paired queries, 0 .. 1; None without pairs),
    ``diff_pts`` and ``ci_pts`` (mean of the windows' differences and its 95 % half-width, in
    percentage points; ``ci_pts`` None for fewer than 2 windows), ``window_s``, ``windows``
    (with paired queries), ``method``."""
    w = window_s(duration_s)
    out: dict = {"window_s": round(w, 6), "windows": 0, "emu": None, "sim": None, "diff_pts": None, "ci_pts": None,
                 "method": f"mean over windows of {w:g} s of emulated time (by the simulated creation instant) of "
                           f"the paired queries' success ratio emulated - simulated; 95 % Student-t interval over the "
                           f"windows (testbed.core.util.ci95)"}
    if not len(pairs):
        return out
    ok_e = (pairs["outcome_emu"] == "success").astype(float)
    ok_s = (pairs["outcome_sim"] == "success").astype(float)
    win = np.floor(pairs["t_s"].to_numpy(float) / w).astype(int)
    per = pd.DataFrame({"w": win, "d": ok_e - ok_s}).groupby("w")["d"].mean()
    mean, half = ci95(list(per.to_numpy()))
    out.update(windows=int(len(per)), emu=_r(ok_e.mean()), sim=_r(ok_s.mean()), diff_pts=round(100 * mean, 2),
               ci_pts=None if math.isnan(half) else round(100 * half, 2))
    return out


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}" if abs(x) < 100 else f"{x:.0f}"


def where_they_part(groups: dict[str, list[dict]]) -> dict | None:
    """Where the engines part: the earliest stage (:data:`STAGES` order) that parts in any
    cluster, named with the cluster where its medians differ most; if no cluster parts, the same
    over the paths; None when no group parts. Returns ``stage``, ``group``, ``emu_p50``,
    ``sim_p50``, ``n``, and ``also``: every (group, stage) where a group first parts."""
    clusters = {g: s for g, s in groups.items() if g != "all" and " -> " not in g}
    paths = {g: s for g, s in groups.items() if " -> " in g}
    first = {g: parts_at(s) for g, s in groups.items() if g != "all"}
    also = [{"group": g, "stage": r["stage"]} for g, r in first.items() if r is not None]
    for scope in (clusters, paths):
        hits = [(STAGES.index(r["stage"]), -abs(r["emu_p50"] - r["sim_p50"]), g, r)
                for g, r in ((g, first[g]) for g in scope) if r is not None]
        if hits:
            _i, _d, g, r = min(hits, key=lambda h: (h[0], h[1]))
            return {"stage": r["stage"], "group": g, "emu_p50": r["emu_p50"], "sim_p50": r["sim_p50"], "n": r["n"],
                    "also": also}
    return None


def verdict(result: dict) -> str:
    """The twin's one line from :mod:`testbed.results.twin_comparison`'s result (``compare.json``): the
    success ratios and their difference with its interval, and where the engines part."""
    sd, pr = result["success"], result["pairing"]
    if sd["emu"] is None:
        return f"twin: no query paired ({pr['emulated']} emulated, {pr['simulated']} simulated)"
    ci = "" if sd["ci_pts"] is None else f" ± {sd['ci_pts']:.1f}"
    head = (f"twin: success {sd['emu']:.3f} emulated vs {sd['sim']:.3f} simulated ({sd['diff_pts']:+.1f}{ci} pts, "
            f"{pr['paired']} of {pr['emulated']} queries paired)")
    w = result.get("parts")
    if w is None:
        n = result["groups"]["all"][0]["n"]
        if n < MIN_PAIRS:
            return f"{head}; too few queries answered alike in both engines to compare stages ({n})"
        return f"{head}; no stage parts (medians within {PART_ABS_MS:g} ms or {100 * PART_REL:g} %)"
    stage = w["stage"].removesuffix("_ms")
    return f"{head}; engines part at {stage} on {w['group']} (p50 {_ms(w['emu_p50'])} vs {_ms(w['sim_p50'])} ms)"


__all__ = ["ARRIVAL_TOLERANCE_MS", "COLUMNS", "MIN_PAIRS", "PART_ABS_MS", "PART_P", "PART_REL", "STAGES",
           "UNPAIRED_REASONS", "Pairing", "TwinError", "choices", "group_stats", "like_for_like", "pair_queries",
           "parts", "parts_at", "stage_stats", "success_difference", "verdict", "where_they_part", "window_s"]
