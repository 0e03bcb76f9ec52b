"""The selector of one source in a run: ONE construction for ``testbed simulate``, ``testbed
evaluate`` and the emulation's source processes, so the same seed gives the same decisions in all
three.

Every agent is a selector behind :mod:`testbed.agent.selector`'s protocol (``select(obs)``,
``reset()``) and is resolved by ONE function, :func:`resolve_agent`, from the experiment's ``aset:``
section and the source's :class:`~testbed.agent.checkpoint.SourceSetup`:

- ``aset.selector``: a selector of one's own (a callable, a class, a Stable-Baselines3 model;
  :func:`testbed.agent.selector.resolve_selector`);
- ``aset.checkpoint`` (default ``models/aset/general``): a checkpoint
  (:mod:`testbed.agent.checkpoint`), whose ``kind`` names the factory that builds the selector
  (``general``, ``qnetwork``, or any kind registered there).

:class:`SourceSelector` (built from the source's config, :class:`testbed.plan.boundaries.SourceConfig`,
by the emulation's source process and, for each source, by the simulator's driver loop
:func:`testbed.sim.run.drive`) feeds the agent the raw window state every window through
:class:`~testbed.agent.selector.SelectorDriver` (which times each decision and refuses what is not
a policy). With ``cfg.records`` set (the emulation), the resolved queries' cluster and e2e are read
back from the source's records (:class:`RecordsTail`), and the decision timing and the per-policy
window counts go to ``<records without .csv>.aset.json`` when the process exits.

:func:`check_agents` is the one pre-check of ``testbed plan``, ``simulate``, ``run`` and ``evaluate``:
every ``aset`` source's agent resolved and checked on its first observation; it returns what
``run.json``'s ``selector`` records (for a checkpoint: its path, kind, version and the SHA-256 of
both files).
"""

from __future__ import annotations

import atexit
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from testbed.agent.checkpoint import (
    CheckpointError,
    SourceSetup,
    agent_kind,
    checkpoint_files,
    checkpoint_path,
    read_checkpoint,
)
from testbed.agent.features import AppView
from testbed.agent.selector import (
    ResolvedSelector,
    SelectorDriver,
    SelectorError,
    check_selector,
    file_sha256,
    initial_policy,
    resolve_selector,
    selector_window,
)
from testbed.core.errors import InputError
from testbed.plan.boundaries import SourceConfig
from testbed.plan.dilation import dilate
from testbed.spec.aset import plan_key
from testbed.spec.experiment import ASET_POLICY, AsetSpec


def source_setup(cfg: SourceConfig) -> SourceSetup:
    """The :class:`~testbed.agent.checkpoint.SourceSetup` of a source's config, in emulated time:
    under time dilation k the config's RTTs, service times, deadlines and window are on the wall
    clock (x k) and are brought back through the config's clock (:attr:`SourceConfig.clock`), as the
    window's measured figures are (the source's records), so that the setup is the undilated plan's."""
    c = cfg.clock
    apps = tuple(AppView(a.name, c.emulated(float(a.deadline_ms)), float(a.min_accuracy), a.family or "")
                 for a in cfg.applications)
    options = tuple(o.option if not c.dilated else replace(o.option, rtt_ms=c.emulated(o.option.rtt_ms),
                                                           service_ms=c.emulated(o.option.service_ms))
                    for o in cfg.options)
    window = cfg.aset.window_s if cfg.aset is not None else None
    return SourceSetup(cfg.source, options, apps, cfg.selector_context, plan_key(cfg, cfg.experiment or ""),
                       window)


@dataclass
class Agent:
    """One source's resolved agent: ``resolved`` (``make()`` gives a fresh selector;
    ``provenance`` what ``run.json`` records), ``context`` (the experiment's names with the action
    space), ``window_s`` (the decision window, emulated s)."""

    resolved: ResolvedSelector
    context: Any
    window_s: float

    @property
    def policies(self) -> tuple[str, ...]:
        return tuple(self.context.policies)


def _checkpoint_window(ckpt_window: float | None, configured: float | None, report_interval_s: float,
                       path: Path) -> float:
    """The decision window of a checkpoint's selector (s): its own; a configured one must equal it."""
    if ckpt_window is None:
        return float(configured or report_interval_s)
    if configured is not None and abs(float(configured) - ckpt_window) > 1e-9:
        raise CheckpointError(f"aset.window {float(configured) * 1e3:g} ms differs from the checkpoint's window "
                              f"{ckpt_window * 1e3:g} ms ({path}); set aset.window to {ckpt_window * 1e3:g}ms")
    return ckpt_window


def resolve_agent(aset: AsetSpec, setup: SourceSetup, report_interval_s: float,
                  repo_dir: str | Path | None = None) -> Agent:
    """THE resolution of every agent (module docstring) for the source ``setup``.

    Args:
        aset: the experiment's ``aset:`` section (``selector`` or ``checkpoint``).
        setup: the source. report_interval_s: the experiment's, emulated s (a selector's default window).
        repo_dir: relative checkpoint and model paths are resolved against it (default the repository).

    Raises:
        SelectorError: a selector of one's own that cannot be resolved, or a window that is not
            whole report intervals. CheckpointError: a checkpoint that is missing, corrupt, of
            an unknown kind, or that does not fit this source (its factory's message), naming the
            file and the source.
    """
    if aset.selector is not None:
        window = selector_window(aset, report_interval_s)
        return Agent(resolve_selector(aset.selector, repo_dir), setup.context, window)
    path = checkpoint_path(aset.checkpoint, repo_dir)
    ckpt = read_checkpoint(path)
    window = _checkpoint_window(ckpt.window_s, setup.window_s, report_interval_s, path)
    context = setup.context.model_copy(update={"policies": list(ckpt.policies)})
    mine = replace(setup, context=context, window_s=window)
    make = agent_kind(ckpt.kind).make
    try:
        make(ckpt, mine)  # every check of the factory, now: a misfit is a plan error
    except InputError:  # CheckpointError, ObservationSizeError: they name the file
        raise
    except (KeyError, ValueError) as exc:  # the factory's own "does not fit" (ObservationSizeError too)
        raise CheckpointError(f"ASET checkpoint {path} (source {setup.source}): {exc}") from None
    npz, meta = checkpoint_files(path)
    provenance = {"kind": ckpt.kind, "version": ckpt.version, "checkpoint": str(aset.checkpoint),
                  "file": str(meta), "sha256": {"json": file_sha256(meta), "npz": file_sha256(npz)},
                  "trained": dict(ckpt.provenance)}
    resolved = ResolvedSelector(None, lambda: make(ckpt, mine), provenance, label=f"checkpoint {aset.checkpoint}")
    return Agent(resolved, context, window)


class SourceSelector:
    """Chooses one source's policy for the next window from its raw window state (module docstring).

    Args:
        cfg: the source's config (``aset`` and ``selector_context`` set: a source on policy ``aset``).
        agent: the resolved agent (default: :func:`resolve_agent` of ``cfg``).

    Raises:
        SelectorError, CheckpointError: as :func:`resolve_agent`; KeyError: ``cfg`` has no ``aset``.
    """

    def __init__(self, cfg: SourceConfig, agent: Agent | None = None):
        if cfg.aset is None or not (cfg.aset.checkpoint or cfg.aset.selector) or cfg.selector_context is None:
            raise KeyError("source config: 'aset' with 'aset.checkpoint' or 'aset.selector', and 'selector_context', "
                           "are required with policy 'aset'")
        self.agent = agent or resolve_agent(cfg.aset, source_setup(cfg), cfg.clock.emulated(cfg.report_interval_s),
                                            cfg.repo_dir)
        self.window_s = self.agent.window_s
        self.driver = SelectorDriver(self.agent.resolved, self.agent.context, self.window_s)
        self.source, self.policies = cfg.source, self.driver.policies
        self.decision_ns, self.choices = self.driver.decision_ns, self.driver.choices
        self.cfg_aset = cfg.aset
        self.report_path = Path(cfg.records).with_suffix(".aset.json") if cfg.records else None
        self.tail = RecordsTail(cfg.records, cfg.start_ns) if cfg.records else None
        self.start_ns = int(cfg.start_ns)

    @property
    def selector(self):
        """The acting object (``select(obs)``, ``reset()``): a checkpoint kind's selector, or one's own."""
        return self.driver.obj

    @property
    def initial(self) -> str:
        """The policy the source applies before the selector's first decision: the selector's own
        ``initial_policy`` where it names one (a gated checkpoint's reference,
        :mod:`testbed.agent.checkpoint`), else ``aset.options.initial_policy`` (default ``closest``).
        ONE rule for the simulator's loop, the evaluation's jobs and the emulation's sources."""
        own = getattr(self.driver.obj, "initial_policy", None)
        return str(own) if own else initial_policy(self.cfg_aset)

    def restart_at(self, start_ns: int) -> None:
        """The load's start time once the run's start barrier released the source (epoch ns):
        window times and resolved queries' t0 count from it."""
        self.start_ns = int(start_ns)
        if self.tail is not None:
            self.tail.start_ns = int(start_ns)
        if self.report_path is not None:
            atexit.register(self.write_report)

    def choose(self, state: Mapping) -> str:
        """The policy name for the next window (one of :attr:`policies`).

        Raises:
            testbed.agent.selector.SelectorFailed: the selector raised or returned no policy.
        """
        return self.driver.choose(self.complete(state))

    def complete(self, state: Mapping) -> Mapping:
        """The window state with per-query cluster and e2e in ``resolved``: when the dispatcher's
        state gives only (application, success, t0_s), the same queries are read from the end of
        this source's records file (written as each query resolves), which has both."""
        out = dict(state)
        if "now_s" not in out:
            out["now_s"] = (time.time_ns() - self.start_ns) / 1e9
        res = state.get("resolved") or ()
        if self.tail is not None and not all(len(r) >= 5 for r in res):
            out["resolved"] = self.tail.read()
        return out

    def write_report(self) -> None:
        """Write ``<records>.aset.json`` (at process exit): source, decision timing (ms) and how many
        windows each policy was chosen."""
        if self.report_path is None:
            return
        try:
            self.report_path.write_text(json.dumps({"source": self.source, "timing": self.timing(),
                                                    "choices": self.choices}, indent=1))
        except OSError:
            pass

    def timing(self) -> dict[str, float]:
        """Decision time per window (observation + the agent's decision), in ms: n, mean, p50, p99, max."""
        if not self.decision_ns:
            return {"n": 0}
        ms = np.asarray(self.decision_ns, dtype=np.float64) / 1e6
        return {"n": int(ms.size), "mean_ms": float(ms.mean()), "p50_ms": float(np.percentile(ms, 50)),
                "p99_ms": float(np.percentile(ms, 99)), "max_ms": float(ms.max())}


def aset_sources(plan) -> list[str]:
    """The sources of ``plan`` on policy ``aset`` (sorted by name)."""
    exp = plan.experiment
    return sorted(s.name for s in exp.sources if (s.policy or exp.policy) == ASET_POLICY)


def source_configs(plan, sources: list[str], aset: AsetSpec | None = None) -> list[SourceConfig]:
    """The configs the emulation gives ``sources`` (those no workload entry selects left out),
    with ``aset`` in place of the experiment's section when given. ``plan``: a wall-clock plan
    (:func:`testbed.plan.dilation.dilate`) under time dilation, else the plan."""
    cfgs = SourceConfig.all_from_plan(plan, 0, plan.experiment.duration_s, Path(plan.base_dir), sources)
    return [cfg.model_copy(update={"records": "", **({"aset": aset} if aset is not None else {})})
            for cfg in cfgs.values()]


def check_agents(plan, sources: list[str] | None = None) -> dict[str, Any] | None:
    """Resolve and check the agent of every ``aset`` source of ``plan`` (or of ``sources``), on the
    configs the sources get (under time dilation, the wall-clock plan's): the one pre-check of
    ``testbed plan``, ``simulate``, ``run`` and ``evaluate``. None when no source applies ``aset``.

    Returns:
        ``run.json``'s ``selector``: the provenance (a checkpoint's path, kind, version, SHA-256s;
        a selector's import path or file, version, SHA-256), ``policies``, ``window_s``, ``sources``.

    Raises:
        InputError (SelectorError, CheckpointError): naming the agent, the source and what is wrong.
    """
    exp = plan.experiment
    uses = aset_sources(plan) if sources is None else sorted(sources)
    if not uses or exp.aset is None:
        return None
    dilated = plan.clock == "emulated" and plan.time_dilation != 1.0
    cfgs = source_configs(dilate(plan) if dilated else plan, uses)
    if not cfgs:
        return None
    record: dict[str, Any] | None = None
    for cfg in cfgs:
        try:
            sel = SourceSelector(cfg)
        except (OSError, KeyError) as exc:
            raise InputError(f"source {cfg.source} on aset: {exc}") from None
        if record is None:
            record = {**sel.agent.resolved.provenance, "policies": list(sel.policies), "window_s": sel.window_s,
                      "sources": [c.source for c in cfgs], "initial": {}}
        record["initial"][cfg.source] = sel.initial
        check_selector(sel.agent.resolved, sel.agent.context, sel.window_s, sel.initial)
    return record


class RecordsTail:
    """The rows a source appended to its records CSV since the last :meth:`read`, as resolved
    tuples ``(application, success, t0_s, cluster, e2e_ms)`` (t0 in s since ``start_ns``)."""

    def __init__(self, path: str, start_ns: int):
        self.path, self.start_ns = path, int(start_ns)
        self.offset = 0
        self.header: list[str] | None = None
        self._partial = ""

    def read(self) -> list[tuple]:
        import csv

        try:
            with open(self.path, newline="") as f:
                f.seek(self.offset)
                chunk = f.read()
                self.offset = f.tell()
        except OSError:
            return []
        text = self._partial + chunk
        lines = text.split("\n")
        self._partial = lines.pop()  # an unfinished last line waits for the next read
        out = []
        for row in csv.reader(lines):
            if not row:
                continue
            if self.header is None:
                self.header = row
                continue
            rec = dict(zip(self.header, row, strict=False))
            try:
                e2e = float(rec["e2e_ms"]) if rec.get("e2e_ms") else None
                t0 = (int(rec["t0_ns"]) - self.start_ns) / 1e9
            except (KeyError, ValueError):
                continue
            out.append((rec.get("application", ""), rec.get("outcome") == "success", t0, rec.get("cluster", ""), e2e))
        return out


__all__ = ["Agent", "RecordsTail", "SelectorError", "SourceSelector", "aset_sources", "check_agents",
           "resolve_agent", "source_configs", "source_setup"]
