"""The figures of a report (:mod:`testbed.results.html_report`): what one run directory gives a report
(:class:`RunData`, :class:`RunStatus`), its records grouped per run and policy (:func:`_groups`),
and one function per figure, each drawing into a PNG and returning False when it has nothing to
draw. Latency figures take the summary's queries (:func:`testbed.results.figures.answered`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from testbed.model.records import SHARES
from testbed.results.figures import answered, aset_sources, node_names, switch_of

MAX_POLICY_PANELS = 8
MAX_HOP_ROWS = 40


@dataclass
class RunData:
    """What the report needs from one run directory (missing files give empty frames / dicts)."""

    path: Path
    label: str
    mode: str
    records: pd.DataFrame
    summary: dict = field(default_factory=dict)
    plan: dict = field(default_factory=dict)
    link_stats: pd.DataFrame = field(default_factory=pd.DataFrame)
    hop_delays: pd.DataFrame = field(default_factory=pd.DataFrame)
    status: RunStatus = field(default_factory=lambda: RunStatus("ok", ""))


@dataclass(frozen=True)
class RunStatus:
    """How a run ended, from its ``run.json`` (:func:`run_status`): ``short`` for the table (``ok``,
    ``failed: <what>``, ``interrupted``, ``killed``, ``unfinished``, ``unknown``) and ``detail``
    for the list of runs (the run's own message, or who found it killed)."""

    short: str
    detail: str

    @property
    def ok(self) -> bool:
        return self.short == "ok"

    @property
    def word(self) -> str:
        """The first word of ``short`` (``failed``, ``killed``, ...), the flag of the figures' labels."""
        return self.short.split(":")[0].split(" (")[0]


def _t_s(df: pd.DataFrame) -> pd.Series:
    t = df["t0_ns"].astype("Int64")
    return ((t - t.min()).astype("float64")) / 1e9


def _policy_keys(r: RunData) -> pd.Series:
    """Per record, the policy its run applied: ``aset`` for a source ASET drives (one group over the
    whole run: the static policy it chose window by window is not a run of that policy, and a rate
    over its scattered windows is no rate), else the record's policy."""
    pols = r.records["policy"].fillna("?").astype(str) if "policy" in r.records else pd.Series("?", r.records.index)
    driven = aset_sources(r.plan)
    if driven and "source" in r.records:
        pols = pols.where(~r.records["source"].astype(str).isin(driven), "aset")
    return pols


def _groups(runs: list[RunData]) -> list[tuple[str, RunData, pd.DataFrame]]:
    """(label, run, records) per run and policy (``aset`` for the sources ASET drives:
    :func:`_policy_keys`); the label names the run only when there are several, and ends with
    ``[failed]`` (the status's first word) when the run did not end ok."""
    out = []
    for r in runs:
        pols = _policy_keys(r)
        flag = "" if r.status.ok else f" [{r.status.word}]"
        for pol, g in r.records.groupby(pols, sort=True):
            out.append(((pol if len(runs) == 1 else f"{r.label} / {pol}") + flag, r, g))
    return out


# ------------------------------------------------------------------------------------------- figures

def _plt():
    import matplotlib  # deferred: heavy, and only a report's figures need it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> None:
    """Lay out, write (PNG, 110 dpi) and close one figure."""
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _plt().close(fig)


def _save_lines(fig, ax, path: Path, drawn: int, legend_loc: str) -> bool:
    """Finish a figure of ``drawn`` lines (a light grid, the legend where there is a line) and
    :func:`_save` it; True when there was something to draw."""
    ax.grid(alpha=0.3)
    if drawn:
        ax.legend(fontsize=8, loc=legend_loc)
    _save(fig, path)
    return drawn > 0


def fig_latency_cdf(runs: list[RunData], path: Path) -> bool:
    """CDF of e2e latency (ms) of answered queries per run and policy; False when nothing to draw."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    drawn = 0
    for label, _r, g in _groups(runs):
        e = np.sort(pd.to_numeric(answered(g)["e2e_ms"], errors="coerce").dropna().to_numpy())
        if len(e):
            ax.step(e, np.arange(1, len(e) + 1) / len(e), where="post", label=f"{label} (n={len(e)})")
            drawn += 1
    deadlines = sorted({float(x) for r in runs for x in pd.to_numeric(r.records.get("deadline_ms", pd.Series()),
                                                                      errors="coerce").dropna().unique()})
    for d in deadlines[:4]:
        ax.axvline(d, color="grey", ls=":", lw=1)
    ax.set(xlabel="end-to-end latency (ms)", ylabel="fraction of answered queries", ylim=(0, 1.02),
           title="Latency CDF per policy" + (" (dotted: deadlines)" if deadlines else ""))
    return _save_lines(fig, ax, path, drawn, "lower right")


def fig_breakdown(runs: list[RunData], path: Path) -> bool:
    """Stacked bars: mean dispatch / network / handling / queueing / inference (ms, the five shares of
    e2e, :data:`testbed.model.records.SHARES`) of answered queries per run and policy."""
    plt = _plt()
    rows = []
    for label, _r, g in _groups(runs):
        a = answered(g)
        if len(a):
            rows.append((label, *(float(pd.to_numeric(a[f"{k}_ms"], errors="coerce").mean()) if f"{k}_ms" in a
                                  else float("nan") for k in SHARES)))
    fig, ax = plt.subplots(figsize=(7, 1.2 + 0.45 * max(len(rows), 3)))
    left = np.zeros(len(rows))
    for i, (name, color) in enumerate(zip(SHARES, ("#8172b3", "#4c72b0", "#937860", "#dd8452", "#55a868"),
                                          strict=True)):
        vals = np.nan_to_num(np.array([r[i + 1] for r in rows], dtype=float))
        ax.barh([r[0] for r in rows], vals, left=left, color=color, label=name)
        left += vals
    ax.set(xlabel="mean time per answered query (ms)")
    fig.suptitle("Where the time goes (the legend names the shares)", fontsize=11)  # over the figure: long
    # run labels push the axes right, and a title centred on them would be cut at the figure's edge
    ax.legend(fontsize=8, loc="lower right")
    ax.invert_yaxis()
    _save(fig, path)
    return bool(rows)


def _bin_s(runs: list[RunData]) -> float:
    span = max((float(_t_s(r.records).max()) for r in runs if not r.records.empty), default=1.0)
    return max(1.0, round(span / 30.0))


def fig_success_over_time(runs: list[RunData], path: Path) -> bool:
    """Success ratio per time bin (bin = max(1 s, span / 30)) per run and policy."""
    plt = _plt()
    width = _bin_s(runs)
    fig, ax = plt.subplots(figsize=(7, 3.8))
    drawn = 0
    for label, r, g in _groups(runs):
        if g.empty:
            continue
        t = _t_s(r.records).loc[g.index]
        ok = (g["outcome"] == "success").astype(float)
        b = (t // width) * width
        s = ok.groupby(b).mean()
        ax.plot(s.index + width / 2, s.to_numpy(), marker="o", ms=3, label=label)
        drawn += 1
    ax.set(xlabel=f"time since the first query (s), {width:g} s bins", ylabel="success ratio", ylim=(-0.02, 1.05),
           title="Success ratio over time")
    return _save_lines(fig, ax, path, drawn, "lower left")


def fig_policy_over_time(runs: list[RunData], path: Path) -> bool:
    """The policy in force per query (``policy`` column) over time, one panel per run (at most 8);
    every source's queries in one panel (an ASET run: the policy each source's agent chose)."""
    plt = _plt()
    shown = [r for r in runs if not r.records.empty][:MAX_POLICY_PANELS]
    if not shown:
        return False
    fig, axes = plt.subplots(len(shown), 1, figsize=(7, 1.4 + 1.3 * len(shown)), squeeze=False, sharex=True)
    for ax, r in zip(axes[:, 0], shown, strict=True):
        pol = r.records["policy"].fillna("?").astype(str) if "policy" in r.records else pd.Series("?", r.records.index)
        cats = sorted(pol.unique())
        y = pol.map({c: i for i, c in enumerate(cats)})
        t = _t_s(r.records)
        ok = r.records.get("outcome", pd.Series("success", r.records.index)) == "success"
        # successes just below their policy's line and failures just above, each counted: drawn on
        # one line, the failures hid the successes (a run at 41 % success looked all red)
        ax.scatter(t[ok], y[ok] - 0.15, s=6, color="#55a868", label=f"success ({int(ok.sum())})")
        ax.scatter(t[~ok], y[~ok] + 0.15, s=10, color="#c44e52", marker="x", label=f"failure ({int((~ok).sum())})")
        ax.set_yticks(range(len(cats)), cats, fontsize=8)
        ax.set_ylim(-0.6, len(cats) - 0.4)
        ax.set_title(r.label, fontsize=9)
        ax.grid(alpha=0.3, axis="x")
    axes[0, 0].legend(fontsize=7, loc="upper right")
    axes[-1, 0].set_xlabel("time since the first query (s)")
    fig.suptitle("Policy in force per query over time", fontsize=10)
    _save(fig, path)
    return True


def link_utilization(r: RunData) -> pd.DataFrame:
    """Per poll and link: t_s (s since the first poll), link (label), util (max of both directions, 0..1)."""
    ls = r.link_stats
    if ls.empty:
        return pd.DataFrame(columns=["t_s", "link", "util", "a", "b", "kind"])
    names = node_names(r.plan)
    a = ls["a"].astype(str).map(lambda x: names.get(x, x))
    b = ls["b"].astype(str).map(lambda x: names.get(x, x))
    return pd.DataFrame({"t_s": ls["t"] - ls["t"].min(), "link": a + "-" + b,
                         "util": np.maximum(ls["util_ab"].to_numpy(float), ls["util_ba"].to_numpy(float)),
                         "a": ls["a"].astype(str), "b": ls["b"].astype(str), "kind": ls["kind"]})


def fig_link_utilization(r: RunData, path: Path) -> bool:
    """Heatmap (links x time) of utilization beside the topology on its lon/lat, for one run."""
    plt = _plt()
    u = link_utilization(r)
    if u.empty:
        return False
    m = u.pivot_table(index="link", columns="t_s", values="util", aggfunc="max").fillna(0.0)
    m = m.loc[m.max(axis=1).sort_values(ascending=False).index]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 0.8 + max(3.5, 0.28 * len(m))),
                                  gridspec_kw={"width_ratios": [1.6, 1]})
    vmax = max(float(m.to_numpy().max()), 1e-6)
    im = ax.imshow(m.to_numpy(), aspect="auto", cmap="viridis", vmin=0, vmax=vmax, interpolation="nearest",
                   extent=(float(m.columns.min()), float(m.columns.max()) or 1.0, len(m) - 0.5, -0.5))
    ax.set_yticks(range(len(m)), list(m.index), fontsize=7)
    ax.set(xlabel="time since the first poll (s)", title="Link utilization (max of both directions)")
    fig.colorbar(im, ax=ax, label="utilization (0-1)")
    # topology on its coordinates
    sw = r.plan.get("switches", [])
    pos = {}
    have = [s for s in sw if s.get("lat") is not None and s.get("lon") is not None]
    for s in have:
        pos[s["name"]] = (float(s["lon"]), float(s["lat"]))
    if have:
        lon0 = min(p[0] for p in pos.values())
        lat1 = max(p[1] for p in pos.values())
        spread = max(1.0, max(p[0] for p in pos.values()) - lon0)
    else:
        lon0, lat1, spread = 0.0, 0.0, 1.0
    for i, s in enumerate(x for x in sw if x["name"] not in pos):  # no coordinates (e.g. the cloud)
        pos[s["name"]] = (lon0 + 0.15 * spread * i, lat1 + 0.15 * spread)
    to_sw = switch_of(r.plan)
    us = u[u["kind"] == "switch"]
    mean_util = us.groupby([us["a"].map(lambda x: to_sw.get(x, x)), us["b"].map(lambda x: to_sw.get(x, x))])[
        "util"].mean()
    cmap = plt.get_cmap("viridis")
    for lk in r.plan.get("links", []):
        if lk["a"] in pos and lk["b"] in pos:
            val = mean_util.get((lk["a"], lk["b"]), mean_util.get((lk["b"], lk["a"]), 0.0))
            (x1, y1), (x2, y2) = pos[lk["a"]], pos[lk["b"]]
            ax2.plot([x1, x2], [y1, y2], color=cmap(min(val / vmax, 1.0)), lw=1.5 + 4 * min(val / vmax, 1.0),
                     zorder=1)
            ax2.text((x1 + x2) / 2, (y1 + y2) / 2, f"{lk['delay_ms']:.3g} ms", fontsize=6, color="grey")
    hosts: dict[str, list[str]] = {}
    for h in r.plan.get("hosts", []):
        hosts.setdefault(h["switch"], []).append(h["name"])
    for s in sw:
        x, y = pos[s["name"]]
        ax2.scatter([x], [y], s=40, color="#333333", zorder=2)
        label = s.get("label") or s["name"]
        if s["name"] in hosts:
            label += "\n" + ",".join(hosts[s["name"]])
        ax2.annotate(label, (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax2.set(xlabel="longitude", ylabel="latitude", title="Topology, links coloured by mean utilization")
    ax2.grid(alpha=0.2)
    fig.suptitle(r.label, fontsize=9)
    _save(fig, path)
    return True


def _link_dir(plan: dict, a: str, b: str) -> str:
    """`` (A>B)`` with switch labels when the hop ``a > b`` is link emulator lK's eth0 > eth1 or back."""
    label = {s["name"]: s.get("label") or s["name"] for s in plan.get("switches", [])}
    for lk in plan.get("links", []):
        e = lk.get("emu_name") or f"l{lk['index']}"
        ends = (label.get(lk["a"], lk["a"]), label.get(lk["b"], lk["b"]))
        if (a, b) == (f"{e}-eth0", f"{e}-eth1"):
            return f" ({ends[0]}>{ends[1]})"
        if (a, b) == (f"{e}-eth1", f"{e}-eth0"):
            return f" ({ends[1]}>{ends[0]})"
    return ""


def fig_hop_delays(runs: list[RunData], path: Path) -> bool:
    """Per-hop median one-way delay (p5-p95 whiskers) against the configured link delay (captured runs).

    More than MAX_HOP_ROWS hops: only the hops that are one emulated link are drawn.
    """
    plt = _plt()
    rows = [(f"{h['from']}>{h['to']}{_link_dir(r.plan, h['from'], h['to'])}"
             + ("" if len(runs) == 1 else f" [{r.label[-12:]}]"), h)
            for r in runs if not r.hop_delays.empty for _, h in r.hop_delays.iterrows()]
    if not rows:
        return False
    title = "Per-hop one-way delay (packet capture)"
    if len(rows) > MAX_HOP_ROWS:  # large topologies: the emulated links only (every hop is in the table)
        rows = [x for x in rows if not pd.isna(x[1]["configured_ms"])][:MAX_HOP_ROWS] or rows[:MAX_HOP_ROWS]
        title = f"One-way delay of the {len(rows)} emulated-link hops (capture)"
    fig, ax = plt.subplots(figsize=(7, 1.2 + 0.22 * len(rows)))
    y = np.arange(len(rows))
    med = np.array([h["median_ms"] for _, h in rows], dtype=float)
    lo = med - np.array([h["p5_ms"] for _, h in rows], dtype=float)
    hi = np.array([h["p95_ms"] for _, h in rows], dtype=float) - med
    ax.barh(y, med, xerr=[lo, hi], color="#4c72b0", alpha=0.8, label="measured median (p5-p95)")
    conf = np.array([np.nan if pd.isna(h["configured_ms"]) else h["configured_ms"] for _, h in rows], dtype=float)
    ax.scatter(conf, y, marker="|", s=200, color="#c44e52", label="configured link delay", zorder=3)
    ax.set_yticks(y, [n for n, _ in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set(xlabel="one-way delay (ms)", title=title)
    ax.legend(fontsize=7, loc="lower right")
    _save(fig, path)
    return True
