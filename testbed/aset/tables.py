"""What ``testbed evaluate`` (:mod:`testbed.aset.evaluate`) makes of its runs: the statistics per
scenario (means with 95 % CIs, paired differences per seed, the verdicts), the Markdown tables and
the files of its results folder (``runs.csv``, ``results.csv`` / ``.md``, ``oracle.json``,
``agreement.md``, ``results.png``)."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from testbed.core.util import ci95, markdown_table

ASET = "aset"
MIX = "mix"
ORACLE = "oracle"
CAUSAL = "causal"
#: Rows of runs.csv that are not static policies.
NOT_STATIC = (ASET, MIX, ORACLE, CAUSAL)


def _by_seed(runs: list[dict], scenario: str, kind: str, policy: str) -> dict[int, float]:
    return {r["seed"]: r["success_ratio"] for r in runs
            if r["scenario"] == scenario and r["kind"] == kind and r["policy"] == policy}


def _paired(a: dict[int, float], b: dict[int, float]) -> tuple[float, float]:
    keys = sorted(set(a) & set(b))
    return ci95([a[k] - b[k] for k in keys])


def _stats(ratios: list[float]) -> tuple[float, float, int]:
    """Mean, 95 % CI half-width and number of the seeds with a success ratio (a seed on which no
    query was created has none, NaN: left out of all three)."""
    return (*ci95(ratios), sum(not math.isnan(r) for r in ratios))


def summarise(runs: list[dict], actions: Sequence[str] | None = None) -> list[dict]:
    """One row per (scenario, kind): every policy's (mean, CI half-width, n); the best static
    policy (chosen on the tuning seeds, kept on fresh seeds); headroom and ASET's paired
    differences with their CIs; the verdicts (module docstring). With causal planner
    rows: ``causal_gain`` = planner - mix (paired, with CI), ``causal_share`` = mean(planner - mix) /
    mean(oracle - mix) on the seeds both ran (NaN unless the oracle gains over the mix), and
    ``aset_vs_causal`` = ASET - planner (paired)."""
    table = []
    statics_of = actions
    for sc in dict.fromkeys(r["scenario"] for r in runs):
        best_tuning = None
        for kind in ("tuning", "fresh"):
            rs = [r for r in runs if r["scenario"] == sc and r["kind"] == kind]
            if not rs:
                continue
            pols = list(dict.fromkeys(r["policy"] for r in rs))
            statics = [p for p in pols if p not in NOT_STATIC and (statics_of is None or p in statics_of)]
            stats = {p: _stats(list(_by_seed(runs, sc, kind, p).values())) for p in pols}
            if best_tuning is None:
                best_tuning = max(statics, key=lambda p: (stats[p][0], p))
            best = best_tuning
            row: dict = {"scenario": sc, "kind": kind, "best_static": best,
                         "winner": max(statics, key=lambda p: (stats[p][0], p)), **{p: stats[p] for p in pols}}
            bs = _by_seed(runs, sc, kind, best)
            if ORACLE in stats:
                row["headroom"] = _paired(_by_seed(runs, sc, kind, ORACLE), bs)
            if MIX in stats:
                row["mix_gain"] = _paired(_by_seed(runs, sc, kind, MIX), bs)
                row["assignment"] = next(r.get("assignment", "") for r in rs if r["policy"] == MIX)
            if ASET in stats:
                asr = _by_seed(runs, sc, kind, ASET)
                row["diff"] = _paired(asr, bs)
                row["diff_mix"] = _paired(asr, _by_seed(runs, sc, kind, MIX)) if MIX in stats else (math.nan, math.nan)
                dm, dh = row["diff"]
                mm, mh = row["diff_mix"]
                row["within_1pt"] = dm >= -0.01
                row["above_beyond_ci"] = (not math.isnan(dh)) and dm - dh > 0 and (math.isnan(mm) or mm - mh > 0)
                hm = row.get("headroom", (math.nan, math.nan))[0]
                orc = _by_seed(runs, sc, kind, ORACLE)
                d_or = [asr[k] - bs[k] for k in orc if k in asr and k in bs]  # on the headroom's seeds
                row["captured"] = float(np.mean(d_or)) / hm if d_or and hm and hm > 0 else math.nan
            if CAUSAL in stats:
                row.update(_causal_figures(runs, sc, kind))
            table.append(row)
    return table


def _causal_figures(runs: list[dict], sc: str, kind: str) -> dict:
    """The causal planner's paired figures of one scenario and seed set (:func:`summarise`)."""
    cp, mix = _by_seed(runs, sc, kind, CAUSAL), _by_seed(runs, sc, kind, MIX)
    orc, asr = _by_seed(runs, sc, kind, ORACLE), _by_seed(runs, sc, kind, ASET)
    both = [k for k in cp if k in mix and k in orc]
    gain_or = float(np.mean([orc[k] - mix[k] for k in both])) if both else math.nan
    share = float(np.mean([cp[k] - mix[k] for k in both])) / gain_or if both and gain_or > 0 else math.nan
    out = {"causal_gain": _paired(cp, mix), "causal_share": share}
    if asr:
        out["aset_vs_causal"] = _paired(asr, cp)
    return out


def _pct(cell, signed: bool = False) -> str:
    m, h = cell[0], cell[1]
    if math.isnan(m):
        return "-"
    s = f"{100 * m:+.2f}" if signed else f"{100 * m:.2f}"
    return s + (f" ± {100 * h:.2f}" if not math.isnan(h) else "")


def _share(x: float) -> str:
    return "-" if math.isnan(x) else f"{100 * x:.0f} %"


def results_markdown(table: list[dict], actions: Sequence[str]) -> str:
    """The results as Markdown tables: success ratio in % (mean ± 95 % CI half-width) of every static
    policy, the mix, the oracle and ASET; best static, headroom, ASET's paired gaps, the verdicts."""
    rows = []
    for t in table:
        r = {"scenario": t["scenario"], "seeds": t["kind"]}
        for p in (*actions, MIX, ORACLE, CAUSAL, ASET):
            if p in t:
                r[p] = _pct(t[p])
        r["best static"] = t["best_static"] + ("" if t["winner"] == t["best_static"] else f" (here {t['winner']})")
        r["headroom (pts)"] = _pct(t["headroom"], True) if "headroom" in t else "-"
        if "diff" in t:
            r["ASET - best (pts)"] = _pct(t["diff"], True)
            r["ASET - mix (pts)"] = _pct(t["diff_mix"], True)
            r["captured"] = _share(t["captured"])
            r["within 1 pt"] = "yes" if t["within_1pt"] else "NO"
            r["above best & mix beyond CI"] = "yes" if t["above_beyond_ci"] else "no"
        if "causal_gain" in t:
            r["causal - mix (pts)"] = _pct(t["causal_gain"], True)
            r["causal share of oracle - mix"] = _share(t["causal_share"])
        rows.append(r)
    mixes = [{"scenario": t["scenario"], "per-source mix (sources sorted)": t.get("assignment", ""),
              "mix - best (pts)": _pct(t["mix_gain"], True) if "mix_gain" in t else "-"}
             for t in table if t["kind"] == "tuning"]
    return markdown_table(rows) + "\n" + markdown_table(mixes)


def summary_markdown(table: list[dict]) -> str:
    """The compact table of the verdicts (one row per scenario and seed set): the best static policy
    (chosen on the tuning seeds) and the static winner on these seeds, success ratios in % (mean ±
    95 % CI) of the best static, the mix, the oracle and ASET, the headroom and ASET's paired gaps
    in points, the captured share and the verdicts (module docstring)."""
    rows = []
    for t in table:
        b = t["best_static"]
        r = {"scenario": t["scenario"], "seeds": f"{t['kind']} ({t[b][2]})", "best static": b,
             "winner here": t["winner"], "best static %": _pct(t[b]), "mix %": _pct(t[MIX]) if MIX in t else "-",
             "oracle %": f"{_pct(t[ORACLE])} ({t[ORACLE][2]})" if ORACLE in t else "-",
             "headroom (pts)": _pct(t["headroom"], True) if "headroom" in t else "-"}
        if ASET in t:
            r.update({"ASET %": _pct(t[ASET]), "ASET - best": _pct(t["diff"], True),
                      "ASET - mix": _pct(t["diff_mix"], True),
                      "captured": _share(t["captured"]),
                      "within 1 pt": "yes" if t["within_1pt"] else "NO",
                      "above best & mix (CI)": "yes" if t["above_beyond_ci"] else "no"})
        if CAUSAL in t:
            r["causal %"] = f"{_pct(t[CAUSAL])} ({t[CAUSAL][2]})"
            if "aset_vs_causal" in t:
                r["ASET - causal"] = _pct(t["aset_vs_causal"], True)
        rows.append(r)
    return markdown_table(rows)


def agreement_markdown(agree: dict[str, list[int]]) -> str:
    """Pairwise agreement of the actions' decisions (100 % = duplicates)."""
    rows = [{"actions": k.replace("|", " / "), "same decision": f"{100 * s / t:.1f} %" if t else "-",
             "states": t, "duplicate": "YES" if t and s == t else ""} for k, (s, t) in agree.items()]
    return markdown_table(rows)


def write_results(out: Path, runs: list[dict], table: list[dict], actions: Sequence[str], mixes: dict,
                  schedules: dict, agree: dict, causal_schedules: dict | None = None,
                  causal_settings: dict | None = None) -> None:
    """Write the results folder ``out``: ``runs.csv``, ``results.csv``, ``results.md``, ``oracle.json``,
    ``agreement.md`` (with ``agree``) and ``results.png`` (the tuning rows)."""
    with open(out / "runs.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["scenario", "kind", "policy", "seed", "ok", "n", "success_ratio", "extra"])
        for r in runs:
            extra = {k: v for k, v in r.items() if k not in ("scenario", "kind", "policy", "seed", "ok", "n",
                                                             "success_ratio")}
            w.writerow([r["scenario"], r["kind"], r["policy"], r["seed"], r["ok"], r["n"],
                        f"{r['success_ratio']:.6f}", json.dumps(extra) if extra else ""])
    with open(out / "results.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["scenario", "kind", "policy", "mean", "ci95", "n", "best_static"])
        for row in table:
            for p, v in row.items():
                if isinstance(v, tuple) and len(v) == 3:
                    w.writerow([row["scenario"], row["kind"], p, f"{v[0]:.6f}", f"{v[1]:.6f}", v[2],
                                row["best_static"]])
    text = summary_markdown(table) + "\n" + results_markdown(table, actions)
    if causal_settings:
        c = causal_settings
        text += (f"\ncausal planner: {c['samples']} sampled futures per decision, leaves the mix on a paired t >= "
                 f"{c['min_t']:g}, {c['horizon_windows'] or 'all'} windows of look-ahead\n")
    (out / "results.md").write_text(text)
    (out / "oracle.json").write_text(json.dumps({"mixes": mixes, "schedules": schedules,
                                                 **({"causal": causal_schedules, "causal_settings": causal_settings}
                                                    if causal_schedules else {})}))
    if agree:
        (out / "agreement.md").write_text(agreement_markdown(agree))
    _plot(out / "results.png", [t for t in table if t["kind"] == "tuning"], actions)


def _plot(path: Path, table: list[dict], actions: Sequence[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not table:
        return
    pols = [p for p in (*actions, MIX, ORACLE, CAUSAL, ASET) if p in table[0]]
    fig, ax = plt.subplots(figsize=(max(8, 1.8 * len(table)), 4.5))
    width = 0.8 / len(pols)
    x = np.arange(len(table))
    for j, p in enumerate(pols):
        m = [100 * row[p][0] if p in row else np.nan for row in table]
        h = [100 * (0 if p not in row or math.isnan(row[p][1]) else row[p][1]) for row in table]
        ax.bar(x + (j - (len(pols) - 1) / 2) * width, m, width, yerr=h, capsize=2, label=p,
               color={ASET: "black", ORACLE: "0.6", CAUSAL: "0.45", MIX: "0.8"}.get(p))
    ax.set_xticks(x, [row["scenario"] for row in table], rotation=15)
    lo = min(100 * row[p][0] for row in table for p in pols if p in row and p != "cloud")
    ax.set_ylim(max(0, lo - 10), 100.5)
    ax.set_ylabel("success ratio (%), mean ± 95% CI")
    ax.set_title("static policies, per-source mix, oracle" + (", causal planner" if CAUSAL in pols else "")
                 + " and ASET (simulator)")
    ax.legend(ncol=5, fontsize=7)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
