"""One evaluation episode in the simulator, window by window: the one measure behind every ASET figure.

Every number of ``testbed evaluate`` (static policies, the per-source static mix, the clairvoyant
oracle, ASET) and every reward of ``testbed train`` is counted by :class:`Episode`, so they are
comparable by construction:

* the episode lasts ``duration_s``; queries are created in ``[0, duration_s)`` only
  (``Simulator.arrivals_end``), by the plan's arrival processes seeded from ``seed`` (common random
  numbers: the same seed gives every schedule the same arrivals, :mod:`testbed.model.arrivals`);
* a decision window is ``window_s`` long and must be a whole number of report intervals (so a
  window starts right after a report: what a dispatcher knows at a window's start is the same
  whatever the schedule; ``docs/system-model.md``, "ASET");
* each query is counted in the window and source it was created in, once it is resolved
  (answered, refused, or past its deadline: ``Simulator.drain_resolved``); after the last window
  the simulator runs on until every query is resolved (:meth:`Episode.finish`);
* success ratio = successful / created queries (``docs/system-model.md``: the primary metric).

Sources are in sorted name order (as in :func:`testbed.aset.envs.plan_contexts`); a schedule is one
policy name per source and window.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from testbed.plan.build import Plan
from testbed.sim import Simulator


def window_of(plan: Plan, window_s: float | None) -> float:
    """The decision window (s): ``window_s`` or, when None, the plan's report interval.

    Raises:
        ValueError: the window is not a positive whole multiple of the report interval.
    """
    r = float(plan.experiment.report_interval_s)
    w = r if window_s is None else float(window_s)
    k = w / r
    if w <= 0 or abs(k - round(k)) > 1e-9 or round(k) < 1:
        raise ValueError(f"{plan.experiment.name}: the decision window {w * 1e3:g} ms must be a whole multiple "
                         f"(>= 1) of the report interval {r * 1e3:g} ms")
    return w


def settle_s(plan: Plan) -> float:
    """How long after the last creation every query is resolved: the largest deadline plus one
    report interval (s)."""
    return max(a.deadline_ms for a in plan.experiment.applications) / 1e3 + float(plan.experiment.report_interval_s)


def episode_windows(window_s: float, episode_s: float) -> int:
    """The decision windows an :class:`Episode` of ``episode_s`` s runs: ``episode_s`` rounded to
    whole windows of ``window_s`` s, at least one (the rule ``testbed train`` checks loads over)."""
    return max(1, int(round(episode_s / window_s)))


class Episode:
    """The simulator of one (plan, seed), advanced window by window, counting per (window, source).

    Args:
        plan: the scenario.
        seed: the simulator seed (arrivals, service draws, random policy).
        policies: the policy of every source at the start (name per source; default: the plan's).
        window_s: decision window (s; default the report interval; :func:`window_of`).
        duration_s: episode length (s; default the experiment's duration).
        simulator_factory: ``(plan, seed, policies) -> simulator`` (tests inject a fake).
        view: what the dispatchers know (:class:`testbed.sim.Simulator`'s ``view``: ``"reports"``,
            the system model; ``"fresh"``, the fresh-state reference).

    Attributes:
        ok, n: int arrays (windows, sources): successes and queries created in each window by each source.
        sources: source names (sorted); ``w``: the next window to run.
    """

    def __init__(self, plan: Plan, seed: int, policies: Mapping[str, str] | None = None, window_s: float | None = None,
                 duration_s: float | None = None, simulator_factory: Callable | None = None, view: str = "reports"):
        self.plan = plan
        self.seed = int(seed)
        self.window_s = window_of(plan, window_s) if simulator_factory is None else float(window_s or 0.5)
        self.duration_s = float(duration_s or plan.experiment.duration_s)
        self.n_windows = episode_windows(self.window_s, self.duration_s)
        self.duration_s = self.n_windows * self.window_s
        self.sources = sorted(h.name for h in plan.sources)
        self._index = {s: i for i, s in enumerate(self.sources)}
        if simulator_factory is None:
            self.sim = Simulator(plan, seed=self.seed, policies=dict(policies or {}), track_resolved=True, view=view)
        else:
            self.sim = simulator_factory(plan, self.seed, dict(policies or {}))
        self.sim.arrivals_end = self.duration_s
        self.ok = np.zeros((self.n_windows, len(self.sources)), np.int64)
        self.n = np.zeros((self.n_windows, len(self.sources)), np.int64)
        self.w = 0
        self.finished = False

    # -- schedule ---------------------------------------------------------------------------------
    def set_policies(self, names: Sequence[str]) -> None:
        """The policy of each source (sorted order) for the queries created from now on."""
        for s, p in zip(self.sources, names, strict=True):
            self.sim.set_policy(s, p)

    @property
    def policies(self) -> list[str]:
        """The policy in force per source (sorted order)."""
        return [self.sim.source_view(s).policy for s in self.sources]

    # -- time ---------------------------------------------------------------------------------------
    def step(self) -> list:
        """Simulate the next window; returns the queries resolved during it (``Simulator.Resolved``)."""
        if self.w >= self.n_windows:
            raise RuntimeError("the episode has no window left; call finish()")
        self.w += 1
        self.sim.run_until(self.w * self.window_s)
        return self.collect()

    def run_to(self, window: int) -> None:
        """Simulate up to the start of ``window`` (<= n_windows) without changing policies."""
        window = min(window, self.n_windows)
        if window > self.w:
            self.w = window
            self.sim.run_until(window * self.window_s)
            self.collect()

    def finish(self) -> list:
        """Run every remaining window with the policies in force, then until every query is resolved."""
        self.run_to(self.n_windows)
        if not self.finished:
            self.sim.run_until(self.duration_s + settle_s(self.plan))
            self.finished = True
        return self.collect()

    def settled_counts(self) -> tuple[np.ndarray, np.ndarray]:
        """(ok, n) with every query created so far resolved, found on a copy run on until the
        largest deadline has passed (this episode is left where it is)."""
        c = self.clone()
        c.settle_to(self.w)
        return c.ok, c.n

    def settle_to(self, window: int) -> None:
        """Run the simulator on, with the policies in force, until every query created before
        ``window`` is resolved (its start plus :func:`settle_s`), and count them."""
        self.sim.run_until(window * self.window_s + settle_s(self.plan))
        self.collect()

    def collect(self) -> list:
        """Count the queries the simulator resolved since the last call (each in the window and
        source it was created in); returns them (``Simulator.Resolved``)."""
        return self.count(self.sim.drain_resolved())

    def count(self, out: list) -> list:
        """Count queries resolved (``Simulator.Resolved``), each in the window and source it was
        created in; returns them. For a loop that drains the simulator itself
        (:func:`testbed.sim.run.drive`'s ``on_resolved``)."""
        dt, nw = self.window_s, self.n_windows
        for q in out:
            i = self._index.get(q.source)
            w = int(q.t0_s // dt)
            if i is None or w >= nw:
                continue
            self.n[w, i] += 1
            self.ok[w, i] += int(bool(q.success))
        return out

    # -- results ------------------------------------------------------------------------------------
    @property
    def success_ratio(self) -> float:
        """Successful / created queries so far (the episode's figure once :meth:`finish` ran)."""
        n = int(self.n.sum())
        return float(self.ok.sum()) / n if n else math.nan

    @property
    def queries(self) -> int:
        return int(self.n.sum())

    def clone(self) -> Episode:
        """An independent copy that continues exactly as this one would (same random streams):
        the simulator's :meth:`~testbed.sim.Simulator.clone` and copies of the counts; the plan
        and the names are shared."""
        c = copy.copy(self)
        c.sim = self.sim.clone()
        c.ok, c.n = self.ok.copy(), self.n.copy()
        return c


def run_static(plan: Plan, seed: int, policies: Sequence[str], window_s: float | None = None,
               duration_s: float | None = None, view: str = "reports") -> Episode:
    """A whole episode with a constant policy per source (sorted order), the dispatchers' ``view``
    of :class:`testbed.sim.Simulator`; returns it finished."""
    srcs = sorted(h.name for h in plan.sources)
    ep = Episode(plan, seed, dict(zip(srcs, policies, strict=True)), window_s, duration_s, view=view)
    ep.finish()
    return ep


__all__ = ["Episode", "run_static", "settle_s", "window_of"]
