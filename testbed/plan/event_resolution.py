"""The events of a plan: each event's link named by the plan's switches, its trace read, and the
timeline expanded into changes (:func:`testbed.model.timeline.expand`)."""

from __future__ import annotations

import math
from pathlib import Path

from testbed.core.util import repo_path
from testbed.model.timeline import Change, expand, kind_of
from testbed.plan.network_layout import Network
from testbed.plan.resolved import PlanError, Switch


def read_value_trace(path: Path, column: str, item: str) -> list[tuple[float, float]]:
    """Rows (t_s, value) of an event's trace CSV (columns ``t_s`` and ``column``), t_s >= 0 and
    increasing, values finite and >= 0.

    Raises:
        PlanError: the file cannot be read, lacks a column, or a row breaks a rule (names ``item``).
    """
    import pandas as pd  # heavy (~0.4 s): only a plan with an event trace pays it, not every process of a run

    try:
        df = pd.read_csv(path)
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise PlanError(f"{item}: cannot read trace {str(path)!r}: {exc}") from None
    missing = [c for c in ("t_s", column) if c not in df.columns]
    if missing:
        raise PlanError(f"{item}: trace {str(path)!r} lacks column(s) {missing} (has {list(df.columns)})")
    t = pd.to_numeric(df["t_s"], errors="coerce")
    v = pd.to_numeric(df[column], errors="coerce")
    bad = df.index[t.isna() | v.isna() | (t < 0) | (v < 0) | ~t.apply(math.isfinite) | ~v.apply(math.isfinite)]
    if len(bad):
        raise PlanError(f"{item}: trace {str(path)!r} row {int(bad[0]) + 2}: t_s and {column} must be numbers >= 0")
    if not t.is_monotonic_increasing:
        raise PlanError(f"{item}: trace {str(path)!r}: t_s must increase")
    return list(zip(t.astype(float).tolist(), v.astype(float).tolist(), strict=True))


def _links_at(net: Network, end: Switch | None, ref: str) -> str:
    """``'Chicago' links to 'Indianapolis', 'Kansas City'``: the ends of the links at a site, by label."""
    if end is None:
        return f"{ref!r} has no links"
    label = {s.name: s.label for s in net.switches}
    others = [label[lk.b] if lk.a == end.name else label[lk.a] for lk in net.links if end.name in (lk.a, lk.b)]
    return f"{ref!r} links to {', '.join(map(repr, others)) or 'nothing'}"


def _event_link(net: Network, ends: tuple[str, str], item: str) -> tuple[str, str]:
    """The plan's (a, b) switch names of an event's link between sites ``ends``.

    Raises:
        PlanError: an end is unknown, or the topology has no link between the two.
    """
    by_pair = {frozenset((lk.a, lk.b)): (lk.a, lk.b) for lk in net.links}
    a = net.cloud_switch if ends[0] == "cloud" else net.node_of(ends[0], f"{item}.link")
    b = net.cloud_switch if ends[1] == "cloud" else net.node_of(ends[1], f"{item}.link")
    pair = by_pair.get(frozenset((a.name, b.name))) if a and b else None
    if pair is None:
        raise PlanError(f"{item}: no link between {ends[0]!r} and {ends[1]!r} in the topology; "
                        f"{_links_at(net, a, ends[0])}; {_links_at(net, b, ends[1])}")
    return a.name, b.name


def resolve_events(net: Network, base_dir: Path) -> list[Change]:
    """Each event's link as the plan's (a, b), its trace read (relative to ``base_dir``), the
    timeline expanded.

    Raises:
        PlanError: an unknown cluster or link, a bad trace, or a timeline the model refuses.
    """
    exp = net.exp
    clusters = {c.name for c in exp.clusters}
    links: dict[int, tuple[str, str]] = {}
    traces: dict[int, list[tuple[float, float]]] = {}
    for i, ev in enumerate(exp.events):
        item = f"events.{i} ({ev.kind})"
        if ev.cluster is not None and ev.cluster not in clusters:
            raise PlanError(f"{item}: unknown cluster {ev.cluster!r}; known: {', '.join(sorted(clusters))}")
        if ev.link is not None:
            links[i] = _event_link(net, ev.link, item)
        if ev.trace is not None:
            column = kind_of(ev.kind, f"events.{i}.kind").value_field
            traces[i] = read_value_trace(repo_path(ev.trace, Path(base_dir)), column, item)
    initial = {(lk.a, lk.b): {"delay_ms": lk.delay_ms, "bandwidth_mbps": lk.bandwidth_mbps,
                              "loss_pct": lk.loss_pct, "background_mbps": 0.0} for lk in net.links}
    initial |= {(b, a): v for (a, b), v in initial.items()}
    try:
        return expand(exp.events, links, initial, traces)
    except ValueError as exc:
        raise PlanError(str(exc)) from None


def events_after_end(changes: list[Change], duration_s: float) -> str | None:
    """A note on the event steps at or after the end of a ``duration_s`` load (they never happen),
    or None when there are none."""
    late = [c for c in changes if c.t_s >= duration_s]
    if not late:
        return None
    return (f"{len(late)} event step(s) at or after the end of the load ({duration_s:g} s) do not happen "
            f"(first: events.{late[0].event} {late[0].kind} at {late[0].t_s:g} s)")


__all__ = ["events_after_end", "read_value_trace", "resolve_events"]
