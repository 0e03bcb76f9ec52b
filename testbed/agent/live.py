"""ASET in the emulation: the per-window policy selector each source's dispatcher calls.

``testbed.emu.source`` (a source host, experiment ``policy: aset``) builds
``LivePolicySelector(cfg)`` once and calls ``choose(state)`` every window with the raw window
state of :mod:`testbed.agent.observation`. With a general checkpoint (the default,
``models/aset/general``; :func:`testbed.agent.general.is_general`) the selector builds the general
features from the source's options and applications (:func:`~testbed.agent.general.config_feature_context`,
:class:`~testbed.agent.features.PolicyFeaturizer`, the SAME code as the simulator's
:class:`testbed.aset.general.GeneralRun`) and acts by :meth:`~testbed.agent.general.GeneralPolicy.act`;
with a plan-based one it rebuilds that observation with the SAME code as the simulator env
(:class:`~testbed.agent.observation.SourceObserver`) and runs the exported Q-network
(:class:`~testbed.agent.npolicy.NumpyPolicy`). Both in numpy (no TensorFlow import: the source
process stays light). Every decision is timed (``time.perf_counter_ns``) and
:meth:`LivePolicySelector.timing` summarises it; with ``cfg.records`` set, the summary and the
per-policy window counts go to ``<records without .csv>.aset.json`` when the process exits.

Source config keys used (``cfg`` is the source's JSON config written by ``testbed.emu.run``):
``source``, ``applications`` [{name, ...}], ``options`` [{cluster, rtt_ms, ...}], and
``aset`` (the experiment's ``aset:`` section, :class:`testbed.spec.experiment.AsetSpec`):
``checkpoint``: path of the exported policy without suffix (default ``models/aset/general``); ``window_s``:
must equal the checkpoint's window (the arrival-rate features are per window);
``options.control_socket`` (optional): a Unix socket of a running
:class:`~testbed.aset.envs.AsetLiveEnv`; when set, the state goes to that env and its answer is
used (the checkpoint's choice after one window without answer). A relative checkpoint path is
resolved against ``cfg.repo_dir`` when given, else the repository checkout
(:data:`testbed.core.util.REPO_ROOT`). For a plan-based checkpoint, the source-identity one-hot is
placed by ``cfg.source``'s index in the checkpoint's ``sources`` (the experiment's sources sorted by
name at training), not by ``cfg.source_index`` (the plan's order); a general checkpoint reads no name.
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import time
import zipfile
import zlib
from collections.abc import Mapping
from pathlib import Path

import numpy as np
from pydantic import ValidationError

from testbed.agent.features import PolicyFeaturizer
from testbed.agent.general import GeneralPolicy, config_feature_context, is_general
from testbed.agent.npolicy import NumpyPolicy, ObservationSizeError, application_names_problem
from testbed.agent.observation import SourceContext, SourceObserver, context_size
from testbed.agent.selector import (
    ResolvedSelector,
    SelectorDriver,
    check_plan_selector,
    resolve_selector,
    selector_window,
)
from testbed.core.errors import InputError
from testbed.core.util import REPO_ROOT
from testbed.plan.boundaries import SourceConfig
from testbed.plan.dilation import dilate
from testbed.spec.aset import plan_key

REPO = REPO_ROOT


def checkpoint_path(checkpoint: str, repo_dir: str | Path | None = None) -> Path:
    """An ``aset.checkpoint`` as a path: relative ones against ``repo_dir`` (default the repository)."""
    ckpt = Path(checkpoint)
    return ckpt if ckpt.is_absolute() else Path(repo_dir or REPO) / ckpt


class CheckpointFileError(InputError):
    """An ASET checkpoint's files exist but cannot be read (a truncated ``.npz``, a JSON that is not
    the export's); the message names the file."""


def load_checkpoint(ckpt: Path) -> NumpyPolicy | GeneralPolicy:
    """The exported policy at ``ckpt``: a :class:`GeneralPolicy` for a general checkpoint
    (:func:`testbed.agent.general.is_general`), else the plan-based :class:`NumpyPolicy`; a corrupt
    file refused by name.

    Raises:
        FileNotFoundError: a file of the pair is missing.
        CheckpointFileError: a file cannot be read (e.g. ``zipfile.BadZipFile`` of a truncated
            ``.npz``, a JSON without a key of the export), naming the checkpoint.
        ValueError: the files do not match (:class:`NumpyPolicy`; ObservationSizeError).
    """
    try:
        return GeneralPolicy(ckpt) if is_general(ckpt) else NumpyPolicy(ckpt)
    except (zipfile.BadZipFile, zlib.error, EOFError, KeyError, TypeError, json.JSONDecodeError,
            UnicodeDecodeError, ValidationError) as exc:
        what = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise CheckpointFileError(f"ASET checkpoint {ckpt}: cannot read it ({type(exc).__name__}: {what}); "
                                  f"export it again (testbed train)") from None


def _check_window(policy: NumpyPolicy, window_s: float | None, ckpt: Path) -> None:
    """Refuse an ``aset.window`` that is not the checkpoint's (the arrival-rate features are per window).

    Raises:
        ValueError: naming both windows.
    """
    window_ms = policy.obs_spec.window_ms
    if window_s is not None and abs(float(window_s) * 1e3 - window_ms) > 1e-6:
        raise ValueError(f"aset.window {float(window_s) * 1e3:g} ms differs from the checkpoint's "
                         f"window {window_ms:g} ms ({ckpt}); set aset.window to {window_ms:g}ms")


def _checkpoint_sources(policy: NumpyPolicy, source: str, ckpt: Path) -> tuple[str, ...]:
    """The source-id order of the checkpoint (its ``sources``), which must include ``source``.

    Raises:
        ObservationSizeError: an older format without sources. ValueError: ``source`` is not one.
    """
    sources = policy.sources
    if not sources:  # an older format: its observation has no source identity
        n = policy.obs_size
        raise ObservationSizeError(f"ASET checkpoint {ckpt}: format {policy.format} takes observations of "
                                   f"{n} features without the source identity; this testbed's observation adds "
                                   f"one feature per source of the experiment ({n} + n_sources, from the "
                                   f"checkpoint's 'sources', which it lacks): retrain with testbed train")
    if source not in sources:
        raise ValueError(f"source {source!r} is not one of the checkpoint's sources {list(sources)} ({ckpt}): "
                         f"its source identity is unknown")
    return sources


def source_context(policy: NumpyPolicy, cfg, ckpt: Path) -> SourceContext:
    """The observation context of the source of ``cfg`` (a :class:`testbed.plan.boundaries.SourceConfig`)
    under ``policy``, after EVERY check that the checkpoint fits it: the ONE check of the live
    selector and of the run's pre-check (:func:`check_experiment_checkpoint`).

    Raises:
        ValueError: ``aset.window`` is not the checkpoint's window; the source's clusters are not
            the checkpoint's, or an application is unknown to it; the source is not one of its
            sources; it has plans and none (or one of another size) for this experiment; each
            named. ObservationSizeError: an older format, or another observation size.
    """
    meta = policy.meta
    _check_window(policy, cfg.aset.window_s if cfg.aset is not None else None, ckpt)
    rtt: dict[str, float] = {}
    for o in cfg.options:
        c = o.option.cluster
        rtt[c] = min(rtt.get(c, float("inf")), float(o.option.rtt_ms))
    if set(rtt) != set(meta["clusters"]):
        raise ValueError(f"source {cfg.source!r}: clusters {sorted(rtt)} differ from the checkpoint's "
                         f"{meta['clusters']} ({ckpt})")
    problem = application_names_problem(f"source {cfg.source!r}", [a.name for a in cfg.applications],
                                        meta["applications"])
    if problem:
        raise ValueError(problem)
    sources = _checkpoint_sources(policy, cfg.source, ckpt)
    deadline = {a.name: float(a.deadline_ms) for a in cfg.applications}
    deadline.update({a: d for a, d in zip(meta["applications"], meta.get("deadlines_ms") or [], strict=False)
                     if a not in deadline})
    planned = policy.obs_spec.planned(plan_key(cfg, cfg.experiment or ""), sources)
    ctx = SourceContext(cfg.source, tuple(meta["applications"]), tuple(meta["clusters"]),
                        tuple(rtt[c] for c in meta["clusters"]), tuple(meta["policies"]),
                        tuple(deadline.get(a, 0.0) for a in meta["applications"]), sources=sources,
                        plan=planned[sources.index(cfg.source)] if planned else None)
    policy.check_size(context_size(ctx, policy.obs_spec), f"the live selector of source {cfg.source!r}")
    return ctx


def refuse_unfit_checkpoint(plan) -> dict | None:
    """:func:`check_experiment_checkpoint` on a run's plan, as an input error, and the experiment's
    ``aset.selector`` resolved and checked (:func:`testbed.agent.selector.check_plan_selector`):
    the one pre-check of ``testbed plan`` and of ``testbed run`` before bring-up.

    Returns:
        ``run.json``'s record of the selector (None without one).

    Raises:
        testbed.core.errors.InputError: (exit code 2) naming the checkpoint or the selector, the
            source and what is wrong; a missing, unreadable or corrupt file included.
    """

    exp = plan.experiment
    dilated = (plan.clock == "emulated" and plan.time_dilation != 1.0
               and any((s.policy or exp.policy) == "aset" for s in exp.sources))
    try:  # on the plan the sources get: under time dilation, the wall-clock one
        check_experiment_checkpoint(dilate(plan) if dilated else plan)
    except InputError:
        raise
    except (OSError, ValueError) as exc:
        raise InputError(str(exc)) from None
    return check_plan_selector(plan)


def check_experiment_checkpoint(run, repo_dir: str | Path | None = None) -> None:
    """Refuse, before a run is built, an ASET checkpoint its sources could not load.

    ``run``: the run's :class:`testbed.plan.build.Plan`: every check of the live selector
    (:func:`source_context`) on the config each ``aset`` source will get; or an ``Experiment``
    alone: the checks that need no network (the file, ``aset.window``, a plan for this experiment
    when the checkpoint has ``observation.plans``). Does nothing when no source applies ``aset``.

    Raises:
        ValueError: naming the checkpoint, the source(s) and what is wrong
            (FileNotFoundError for a missing file; :class:`CheckpointFileError` for a corrupt one).
    """
    plan = run if hasattr(run, "experiment") else None
    experiment = run.experiment if plan is not None else run
    uses = [s.name for s in experiment.sources if (s.policy or experiment.policy) == "aset"]
    if not uses or experiment.aset is None or not experiment.aset.checkpoint:
        return
    ckpt = checkpoint_path(experiment.aset.checkpoint, repo_dir)
    policy = load_checkpoint(ckpt)
    if isinstance(policy, GeneralPolicy):
        _check_general(policy, plan, experiment, uses, ckpt)
        return
    if plan is None:
        try:
            _check_window(policy, experiment.aset.window_s, ckpt)
            if policy.obs_spec.plans is not None:
                policy.obs_spec.planned(plan_key(experiment), policy.sources)
        except ValueError as exc:
            raise ValueError(f"ASET checkpoint {ckpt} (sources {', '.join(uses)}): {exc}") from None
        return

    for name in uses:
        cfg = SourceConfig.from_plan(plan, name, 0, experiment.duration_s, Path(plan.base_dir))
        if cfg is None:  # no workload entry selects it: no source process, no selector
            continue
        try:
            source_context(policy, cfg, ckpt)
        except ValueError as exc:
            raise ValueError(f"ASET checkpoint {ckpt} (source {name}): {exc}") from None


def _check_general(policy: GeneralPolicy, plan, experiment, uses: list[str], ckpt: Path) -> None:
    """The checks of a general checkpoint: the window, and (with a plan) every ``aset`` source's
    features within the bounds (:func:`testbed.agent.general.config_feature_context`).

    Raises:
        ValueError: naming the checkpoint, the source and what is wrong.
    """
    try:
        _check_window(policy, experiment.aset.window_s, ckpt)
    except ValueError as exc:
        raise ValueError(f"ASET checkpoint {ckpt} (sources {', '.join(uses)}): {exc}") from None
    if plan is None:
        return
    for name in uses:
        cfg = SourceConfig.from_plan(plan, name, 0, experiment.duration_s, Path(plan.base_dir))
        if cfg is None:
            continue
        try:
            config_feature_context(cfg, policy.policies)
        except ValueError as exc:
            raise ValueError(f"ASET checkpoint {ckpt} (source {name}): {exc}") from None


class LivePolicySelector:
    """Chooses the policy of one dispatcher for the next window from its live window state.

    Raises:
        KeyError: ``cfg`` lacks ``aset.checkpoint``.
        FileNotFoundError: the checkpoint files are missing; :class:`CheckpointFileError`: corrupt.
        ValueError: the checkpoint does not fit this source (:func:`source_context`: the window,
            the emulation's clusters, applications, this source, the plan; the message names
            them); :class:`~testbed.agent.npolicy.ObservationSizeError` when the checkpoint's
            network takes another observation size than the one built here (e.g. a checkpoint of
            an older format, without the source identity).
    """

    def __init__(self, cfg):
        aset = cfg.aset
        if aset is None or not aset.checkpoint:
            raise KeyError("source config: 'aset.checkpoint' is required with policy 'aset'")
        ckpt = checkpoint_path(aset.checkpoint, cfg.repo_dir)
        self.policy = load_checkpoint(ckpt)
        self.source = cfg.source
        if isinstance(self.policy, GeneralPolicy):  # features of what each policy would do: no names
            _check_window(self.policy, aset.window_s, ckpt)
            self.policies = self.policy.policies
            self.featurizer = PolicyFeaturizer(config_feature_context(cfg, self.policies), self.policy.obs_spec)
            self.observer = None
        else:
            self.ctx = source_context(self.policy, cfg, ckpt)
            self.policies = self.ctx.policies
            self.observer = SourceObserver(self.ctx, self.policy.obs_spec)
        self.decision_ns: list[int] = []
        sock = (aset.options or {}).get("control_socket")
        self.control = ControlClient(sock, cfg.source) if sock else None
        self.window_s = self.policy.obs_spec.window_ms / 1e3
        self.choices: dict[str, int] = {}
        self.report_path = Path(cfg.records).with_suffix(".aset.json") if cfg.records else None
        self.tail = RecordsTail(cfg.records, cfg.start_ns) if cfg.records else None
        self.start_ns = int(cfg.start_ns)

    def restart_at(self, start_ns: int) -> None:
        """The load's start time once the run's start barrier released the source (epoch ns):
        window times and resolved queries' t0 count from it."""
        self.start_ns = int(start_ns)
        if self.tail is not None:
            self.tail.start_ns = int(start_ns)
        if self.report_path is not None:
            atexit.register(self.write_report)

    def choose(self, state: Mapping) -> str:
        """The policy name for the next window (a name of the checkpoint's catalogue)."""
        t = time.perf_counter_ns()
        state = self.complete(state)
        if self.observer is None:
            name = self.policies[self.policy.act(*self.featurizer.observe(state))]
        else:
            name = self.policies[int(self.policy.act(self.observer.observe(state))[0])]
        self.decision_ns.append(time.perf_counter_ns() - t)
        if self.control is not None:
            remote = self.control.ask(state, self.window_s)
            if remote in self.policies:
                name = remote
        self.choices[name] = self.choices.get(name, 0) + 1
        return name

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
        """Decision time per window (observation + forward pass), in ms: n, mean, p50, p99, max."""
        if not self.decision_ns:
            return {"n": 0}
        ms = np.asarray(self.decision_ns, dtype=np.float64) / 1e6
        return {"n": int(ms.size), "mean_ms": float(ms.mean()), "p50_ms": float(np.percentile(ms, 50)),
                "p99_ms": float(np.percentile(ms, 99)), "max_ms": float(ms.max())}


class SelectorLive(LivePolicySelector):
    """A selector of one's own (``aset.selector``, :mod:`testbed.agent.selector`) in a source
    process, with the interface of :class:`LivePolicySelector` (``choose``, ``window_s``,
    ``restart_at``, the ``.aset.json`` report): the same :class:`~testbed.agent.selector.SelectorDriver`
    as the simulator's, fed the same window state (``resolved`` completed from the records tail).

    Raises:
        testbed.agent.selector.SelectorError: the selector cannot be resolved, or the config has
            no ``selector_context``.
    """

    def __init__(self, cfg, resolved: ResolvedSelector | None = None):
        aset = cfg.aset
        if aset is None or aset.selector is None or cfg.selector_context is None:
            raise KeyError("source config: 'aset.selector' and 'selector_context' are required for a selector")
        self.resolved = resolved or resolve_selector(aset.selector, cfg.repo_dir)
        self.window_s = selector_window(aset, cfg.clock.emulated(cfg.report_interval_s))
        self.driver = SelectorDriver(self.resolved, cfg.selector_context, self.window_s)
        self.source, self.policies = cfg.source, self.driver.policies
        self.control = None
        self.decision_ns = self.driver.decision_ns
        self.choices = self.driver.choices
        self.report_path = Path(cfg.records).with_suffix(".aset.json") if cfg.records else None
        self.tail = RecordsTail(cfg.records, cfg.start_ns) if cfg.records else None
        self.start_ns = int(cfg.start_ns)

    def choose(self, state: Mapping) -> str:
        """The policy name for the next window (raises
        :class:`~testbed.agent.selector.SelectorFailed` when the selector raises)."""
        return self.driver.choose(self.complete(state))


def live_selector(cfg) -> LivePolicySelector:
    """The per-window selector of a source on policy ``aset``: :class:`SelectorLive` with
    ``aset.selector``, else the checkpoint's :class:`LivePolicySelector`."""
    if cfg.aset is not None and cfg.aset.selector is not None:
        return SelectorLive(cfg)
    return LivePolicySelector(cfg)


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


def _jsonable(state: Mapping) -> dict:
    return {"arrivals": dict(state.get("arrivals") or {}), "clusters": dict(state.get("clusters") or {}),
            "path_util": dict(state.get("path_util") or {}),
            "resolved": [list(r) for r in state.get("resolved") or ()], "policy": state.get("policy"),
            "now_s": state.get("now_s"),
            "in_flight": dict(state.get("in_flight") or {}), "report_age_s": dict(state.get("report_age_s") or {})}


class ControlClient:
    """The dispatcher's end of the live-env control channel (Unix datagram socket)."""

    def __init__(self, server_path: str, source: str):
        self.server_path = server_path
        self.source = source
        self.path = f"{server_path}.{source}.{os.getpid()}"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        if os.path.exists(self.path):
            os.unlink(self.path)
        self.sock.bind(self.path)

    def ask(self, state: Mapping, timeout_s: float) -> str | None:
        """Send the state, wait up to ``timeout_s`` for the policy name (None on timeout/error)."""
        try:
            self.sock.sendto(json.dumps({"source": self.source, "state": _jsonable(state)}).encode(),
                             self.server_path)
            self.sock.settimeout(timeout_s)
            data, _ = self.sock.recvfrom(65536)
            return json.loads(data)["policy"]
        except (OSError, ValueError, KeyError):
            return None


class ControlServer:
    """The env's end: collects one state per source per window and replies with the policies."""

    def __init__(self, path: str):
        self.path = path
        if os.path.exists(path):
            os.unlink(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(path)
        self.peers: dict[str, str] = {}

    def receive_all(self, sources: list[str], timeout_s: float) -> dict[str, dict]:
        """Block until every source sent its state (TimeoutError after ``timeout_s``)."""
        got: dict[str, dict] = {}
        deadline = time.monotonic() + timeout_s
        while len(got) < len(sources):
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"live env: no window state from {sorted(set(sources) - set(got))}")
            self.sock.settimeout(left)
            data, peer = self.sock.recvfrom(1 << 20)
            msg = json.loads(data)
            if msg.get("source") in sources:
                got[msg["source"]] = msg["state"]
                self.peers[msg["source"]] = peer
        return got

    def reply_all(self, policies: Mapping[str, str]) -> None:
        for src, name in policies.items():
            if src in self.peers:
                try:
                    self.sock.sendto(json.dumps({"policy": name}).encode(), self.peers[src])
                except OSError:
                    pass

    def close(self) -> None:
        self.sock.close()
        if os.path.exists(self.path):
            os.unlink(self.path)
