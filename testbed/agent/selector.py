"""The selector protocol of every agent: an object with ``select(obs) -> policy`` and, optionally,
``reset()`` (called once before the first window), asked once per decision window for one source.
The general agent, the paper's DQN and the rollout agent (checkpoint kinds,
:mod:`testbed.agent.checkpoint`), an SB3 model and a selector of one's own are all selectors; ONE
function resolves any of them (:func:`testbed.agent.live.resolve_agent`) and the same
:class:`SelectorDriver` drives it in the simulator, the evaluation and the emulation's source
processes (:class:`testbed.agent.live.SourceSelector`).

A selector of one's own is named under ``aset: {selector: ...}`` (:class:`testbed.spec.experiment.SelectorSpec`):

- ``{use: package.module:function, params: {...}}``: a callable ``f(obs, **params) -> policy``;
- ``{use: package.module:Class, params: {...}}``: ``Class(**params)`` (one instance per source)
  with ``select(obs) -> policy`` and, optionally, ``reset()`` (called once before the first window);
- ``{sb3: path/to/model.zip, algorithm: DQN}``: a Stable-Baselines3 model trained on
  ``testbed/AsetSim-v0`` (the optional extra ``peer``); it acts by
  ``model.predict(obs.vector, deterministic=True)``.

A policy is returned as an index into the action space (``policies``, an ``int`` or a numpy
integer) or as one of its names. Every window (``aset.window``, default the report interval; a
whole number of report intervals) the selector gets an :class:`Observation`: the raw window state of
:mod:`testbed.agent.observation` and the feature vector ASET's plan-based agent observes, built by
:class:`~testbed.agent.observation.SourceObserver` from the lists of
:class:`testbed.plan.boundaries.SelectorContext` (every application, cluster and source of the
experiment, sorted by name: a row of ``testbed/AsetSim-v0``'s observation, without a plan block),
with the default :class:`~testbed.spec.aset.ObservationSpec` scales.

Resolution (:func:`resolve_selector`) and the fit check (:func:`check_selector`: the object's
shape, the SB3 model's spaces against the policy list and the observation size, one call on the
first observation) run before anything is built (``testbed plan``, ``simulate``, ``run``); each
failure is a :class:`SelectorError` (exit code 2) naming the selector. A selector that raises, or
returns something that is not a policy, during a run is a :class:`SelectorFailed` (exit code 4)
with its traceback: the run stops, it is never swallowed.
"""

from __future__ import annotations

import inspect
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from testbed.agent.observation import SourceContext, SourceObserver, observation_layout
from testbed.core.errors import EXIT_COMPONENT_DIED, InputError, RunFailure
from testbed.core.hashing import file_sha256
from testbed.core.plugins import NOT_INSTALLED, PluginError, PluginFault, call_plugin, load, parse_ref, time_limit_s
from testbed.core.util import REPO_ROOT
from testbed.plan.boundaries import SelectorContext
from testbed.spec.aset import ObservationSpec
from testbed.spec.experiment import SelectorSpec


class SelectorError(InputError):
    """A selector that cannot be used: not importable, the wrong shape, spaces that do not match
    the policy list or the observation, or a first call that fails (exit code 2); names it."""


class SelectorFailed(RunFailure):
    """A selector raised, or returned no policy, during a run (exit code 4); the message names it,
    the source and the window, and ends with the traceback."""

    def __init__(self, message: str, what: str = "", tb: str = ""):
        super().__init__(message, EXIT_COMPONENT_DIED)
        self.what, self.tb = what, tb


@dataclass(frozen=True)
class Observation:
    """What a selector gets each window.

    ``vector``: float32 array (size,), every value in [0, clip]: the plan-based ASET observation
    (:mod:`testbed.agent.observation`: arrival rates, per-cluster utilization, queue, RTT, up, path
    utilization, measured latency, report age, in-flight, per-application success ratio,
    current-policy one-hot, source-identity one-hot); ``np.asarray(obs)`` is it too.
    ``state``: the raw window state it was built from (a mapping). ``context``: the names in feature
    order (``applications``, ``clusters``, ``sources``, ``policies``: the action space). ``layout``:
    block name -> slice of ``vector`` (:func:`~testbed.agent.observation.observation_layout`).
    ``window``: the index of the window just ended (0 = the first).
    """

    vector: np.ndarray
    state: Mapping[str, Any]
    context: SourceContext
    layout: Mapping[str, slice]
    window: int

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        return self.vector if dtype is None else self.vector.astype(dtype)

    def block(self, name: str) -> np.ndarray:
        """The features of block ``name`` (``rates``, ``utilization``, ``queue``, ``rtt``, ``up``,
        ``path_util``, ``latency``, ``report_age``, ``in_flight``, ``success``, ``policy``,
        ``source_id``). Raises KeyError for another name."""
        return self.vector[self.layout[name]]

    @property
    def policies(self) -> tuple[str, ...]:
        """The action space: policy names in action-index order."""
        return self.context.policies

    @property
    def source(self) -> str:
        return self.context.source

    @property
    def policy(self) -> str:
        """The policy in force during the window just ended."""
        return str(self.state.get("policy"))

    def success(self) -> dict[str, float]:
        """Per application: its success ratio among this source's queries resolved in the window
        (the previous window's when none resolved; 1.0 at the start)."""
        return dict(zip(self.context.applications, self.block("success").tolist(), strict=True))


@dataclass
class ResolvedSelector:
    """A resolved selector: ``make()`` gives a fresh acting object (``select(obs)``, ``reset()``),
    ``provenance`` what ``run.json`` records (kind, import path or file, version, SHA-256).
    ``spec``: the ``aset.selector`` it came from (None for a checkpoint's, named by ``label``)."""

    spec: SelectorSpec | None
    make: Callable[[], Any]
    provenance: dict[str, Any]
    spaces: Callable[[Any], tuple[int | None, tuple[int, ...] | None]] = field(default=lambda obj: (None, None))
    label: str | None = None

    @property
    def name(self) -> str:
        return self.label or self.spec.name


class _CallableSelector:
    def __init__(self, fn: Callable, params: Mapping[str, Any]):
        self.fn, self.params = fn, dict(params)

    def select(self, obs: Observation) -> Any:
        return self.fn(obs, **self.params)

    def reset(self) -> None:
        pass


class _SB3Selector:
    def __init__(self, model):
        self.model = model

    def select(self, obs: Observation) -> Any:
        action, _ = self.model.predict(obs.vector, deterministic=True)
        return np.asarray(action).reshape(-1)[0]

    def reset(self) -> None:
        pass


#: The entry-point group a selector's ``use`` may name (``[project.entry-points."testbed.selectors"]``).
SELECTOR_GROUP = "testbed.selectors"


class _Shielded:
    """A selector object of one's own as the driver calls it: ``select(obs)`` and ``reset()`` through
    :func:`testbed.core.plugins.call_plugin` (an exit of the plug-in is a
    :class:`~testbed.core.plugins.PluginFault`, an Exception the driver reports with the plug-in's
    traceback); every other attribute is the object's."""

    def __init__(self, inner: Any, name: str):
        self._inner, self._name = inner, name

    def select(self, obs: Any) -> Any:
        return call_plugin(f"aset.selector {self._name}, select", self._inner.select, obs)

    def reset(self) -> None:
        reset = getattr(self._inner, "reset", None)
        if callable(reset):
            call_plugin(f"aset.selector {self._name}, reset", reset)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _import(spec: SelectorSpec) -> tuple[Any, dict[str, Any]]:
    """The object ``spec.use`` names and its provenance, loaded by the one plug-in loader
    (:func:`testbed.core.plugins.load`): its module imported from ``sys.path``, the repository root
    appended to it (so that a module of the checkout, such as ``examples.selector.rules``, needs no
    install), under the plug-ins' time limit.

    Raises:
        SelectorError: the module cannot be imported (any exception while importing it), or has
            no such attribute; naming the selector.
        PluginFault: the module exits or hangs as it is imported (exit code 4).
    """
    try:
        loaded = load(parse_ref(spec.use), SELECTOR_GROUP, extra_path=str(REPO_ROOT))
    except PluginError as exc:
        raise SelectorError(f"aset.selector {spec.use}: {exc}") from None
    o = loaded.origin
    prov = {"use": spec.use, "params": dict(spec.params), "module_file": o.file, "sha256": o.sha256,
            "distribution": None if o.distribution == NOT_INSTALLED else o.distribution,
            "version": None if o.version == NOT_INSTALLED else o.version}
    return loaded.obj, prov


def _check_binds(fn: Callable, args: tuple, kwargs: Mapping[str, Any], what: str, spec: SelectorSpec) -> None:
    """Refuse ``fn`` when it cannot be called with ``args`` and ``kwargs`` (its signature)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # a builtin without a signature: the first call tells
    try:
        sig.bind(*args, **kwargs)
    except TypeError as exc:
        raise SelectorError(f"aset.selector {spec.use}: {what} {sig} cannot be called so ({exc}); a selector is "
                            f"called with one observation") from None


def _resolve_use(spec: SelectorSpec) -> ResolvedSelector:
    obj, prov = _import(spec)
    if inspect.isclass(obj):
        if not callable(getattr(obj, "select", None)):
            raise SelectorError(f"aset.selector {spec.use}: the class has no select(obs) method")
        _check_binds(obj, (), spec.params, "its constructor", spec)
        _check_binds(obj.select, (None, None), {}, "its select", spec)
        if hasattr(obj, "reset") and not callable(obj.reset):
            raise SelectorError(f"aset.selector {spec.use}: its reset is not a method")

        def make() -> Any:
            try:
                made = call_plugin(f"aset.selector {spec.use}, {obj.__name__}(**params)", obj, **spec.params,
                                   limit_s=time_limit_s())
            except PluginFault:
                raise
            except Exception as exc:  # noqa: BLE001 - the plug-in's own constructor: named
                raise SelectorError(f"aset.selector {spec.use}: {obj.__name__}(**params) raised "
                                    f"{type(exc).__name__}: {exc}") from exc
            return _Shielded(made, spec.use)

        return ResolvedSelector(spec, make, {"kind": "class", **prov})
    if not callable(obj):
        raise SelectorError(f"aset.selector {spec.use}: a {type(obj).__name__}, not a callable or a class with "
                            f"select(obs)")
    _check_binds(obj, (None,), spec.params, "its signature", spec)
    return ResolvedSelector(spec, lambda: _Shielded(_CallableSelector(obj, spec.params), spec.use),
                            {"kind": "callable", **prov})


def _resolve_sb3(spec: SelectorSpec, repo_dir: str | Path | None) -> ResolvedSelector:
    try:
        import stable_baselines3 as sb3
    except ImportError as exc:
        raise SelectorError(f"aset.selector {spec.name}: Stable-Baselines3 is not installed ({exc}); it is the "
                            f"optional extra 'peer': pip install -e '.[peer]'") from None
    path = Path(spec.sb3)
    path = path if path.is_absolute() else Path(repo_dir or REPO_ROOT) / path
    if not path.is_file():
        raise SelectorError(f"aset.selector {spec.name}: no such file {path}")
    algo = getattr(sb3, spec.algorithm, None)
    if not inspect.isclass(algo) or not hasattr(algo, "load"):
        raise SelectorError(f"aset.selector {spec.name}: stable_baselines3 has no algorithm {spec.algorithm!r}")
    try:
        model = algo.load(str(path), device="cpu")
    except Exception as exc:  # noqa: BLE001 - a file SB3 cannot read: named
        raise SelectorError(f"aset.selector {spec.name}: {spec.algorithm}.load({path}) failed "
                            f"({type(exc).__name__}: {exc})") from None
    import torch

    def spaces(obj: _SB3Selector) -> tuple[int | None, tuple[int, ...] | None]:
        n = getattr(obj.model.action_space, "n", None)
        return (None if n is None else int(n)), tuple(obj.model.observation_space.shape or ())

    prov = {"kind": "sb3", "file": str(path), "sha256": file_sha256(path), "algorithm": spec.algorithm,
            "distribution": "stable-baselines3", "version": sb3.__version__, "torch": torch.__version__}
    return ResolvedSelector(spec, lambda: _SB3Selector(model), prov, spaces)


def resolve_selector(spec: SelectorSpec, repo_dir: str | Path | None = None) -> ResolvedSelector:
    """Import (``use``) or load (``sb3``, relative to ``repo_dir``, default the repository) the
    selector ``spec`` names.

    Raises:
        SelectorError: not importable or loadable, or not a callable / a class with ``select``,
            or a signature that cannot take one observation (with ``params``); naming it.
    """
    return _resolve_use(spec) if spec.use is not None else _resolve_sb3(spec, repo_dir)


def source_context(ctx: SelectorContext) -> SourceContext:
    """The observation context (:class:`~testbed.agent.observation.SourceContext`) of a
    :class:`~testbed.plan.boundaries.SelectorContext`."""
    return SourceContext(ctx.source, tuple(ctx.applications), tuple(ctx.clusters), tuple(ctx.rtt_ms),
                         tuple(ctx.policies), tuple(ctx.deadlines_ms), sources=tuple(ctx.sources))


def observation_spec(window_s: float) -> ObservationSpec:
    """The selector's observation settings: the defaults (those of ``testbed/AsetSim-v0`` without
    overrides) with a window of ``window_s`` s."""
    return ObservationSpec(window_ms=float(window_s) * 1e3)


class SelectorDriver:
    """One source's selector in a run: :meth:`choose` maps its window state to a policy name.

    Args:
        resolved: the resolved selector (a fresh acting object is made, and reset).
        ctx: this source's observation context. window_s: the decision window (s).

    Raises:
        SelectorError: the class's constructor raised.
    """

    def __init__(self, resolved: ResolvedSelector, ctx: SelectorContext, window_s: float):
        self.resolved = resolved
        self.ctx = source_context(ctx)
        self.spec = observation_spec(window_s)
        self.observer = SourceObserver(self.ctx, self.spec)
        self.layout = observation_layout(len(self.ctx.applications), len(self.ctx.clusters), len(self.ctx.policies),
                                         self.spec.history_windows, len(self.ctx.sources))
        self.obj = resolved.make()
        reset = getattr(self.obj, "reset", None)
        if callable(reset):
            reset()
        self.window = 0
        self.choices: dict[str, int] = {}
        self.decision_ns: list[int] = []

    @property
    def policies(self) -> tuple[str, ...]:
        return self.ctx.policies

    def observe(self, state: Mapping[str, Any]) -> Observation:
        """The :class:`Observation` of one window state (pushes it into the history)."""
        return Observation(self.observer.observe(state), state, self.ctx, self.layout, self.window)

    def policy_of(self, out: Any) -> str | None:
        """The policy name ``out`` (an index or a name) stands for, or None."""
        if isinstance(out, str):
            return out if out in self.ctx.policies else None
        if isinstance(out, bool):
            return None
        if isinstance(out, np.ndarray) and out.size == 1:
            out = out.reshape(-1)[0]
        if isinstance(out, int | np.integer) and 0 <= int(out) < len(self.ctx.policies):
            return self.ctx.policies[int(out)]
        return None

    def _failed(self, what: str, tb: str = "") -> SelectorFailed:
        return SelectorFailed(f"aset.selector {self.resolved.name} (source {self.ctx.source}, window "
                              f"{self.window}): {what}; the run stops" + (f"\n{tb}" if tb else ""), what, tb)

    def choose(self, state: Mapping[str, Any]) -> str:
        """The policy for the next window.

        Raises:
            SelectorFailed: the selector raised (its traceback in the message) or returned
                neither an index of the action space nor one of its names.
        """
        t = time.perf_counter_ns()
        obs = self.observe(state)
        try:
            out = self.obj.select(obs)
        except Exception as exc:  # noqa: BLE001 - the plug-in's own failure: reported, the run stops
            raise self._failed(f"raised {type(exc).__name__}: {exc}", traceback.format_exc()) from exc
        name = self.policy_of(out)
        if name is None:
            raise self._failed(f"returned {out!r}, neither an index in [0, {len(self.ctx.policies)}) nor one of "
                               f"{', '.join(self.ctx.policies)}")
        self.decision_ns.append(time.perf_counter_ns() - t)
        self.window += 1
        self.choices[name] = self.choices.get(name, 0) + 1
        return name


def first_state(ctx: SelectorContext, policy: str) -> dict[str, Any]:
    """The window state of a source before any query: no arrival, every cluster up and idle."""
    return {"arrivals": {}, "clusters": {c: {"queue_len": 0, "busy": 0, "workers": 1, "utilization": 0.0, "up": True}
                                         for c in ctx.clusters},
            "path_util": {}, "resolved": [], "in_flight": {}, "report_age_s": {}, "policy": policy}


def check_selector(resolved: ResolvedSelector, ctx: SelectorContext, window_s: float, initial: str) -> None:
    """Refuse a selector that does not fit the source ``ctx``: a model whose action space is not
    ``Discrete(len(policies))`` or whose observation is not the one built here, or one whose call
    on the first observation (:func:`first_state`) raises or returns no policy. The probe runs on
    an object of its own (a class's is made for it).

    Raises:
        SelectorError: naming the selector, the source and what is wrong.
    """
    where = f"aset.selector {resolved.name} (source {ctx.source})"
    if initial not in ctx.policies:
        raise SelectorError(f"{where}: initial policy {initial!r} (aset.options.initial_policy) is not one of its "
                            f"policies {', '.join(ctx.policies)}")
    driver = SelectorDriver(resolved, ctx, window_s)
    n, shape = resolved.spaces(driver.obj)
    size = int(driver.observer.size)
    if n is None and resolved.spec is not None and resolved.spec.sb3 is not None:
        raise SelectorError(f"{where}: its action space is not Discrete (a policy index per window)")
    if n is not None and n != len(ctx.policies):
        raise SelectorError(f"{where}: its action space has {n} actions, the policy list {len(ctx.policies)} "
                            f"({', '.join(ctx.policies)}); set aset.selector.policies to the list it was trained on")
    if shape is not None and shape != (size,):
        raise SelectorError(f"{where}: it takes observations of shape {shape}, this experiment's are ({size},) "
                            f"({len(ctx.applications)} applications, {len(ctx.clusters)} clusters, "
                            f"{len(ctx.sources)} sources, {len(ctx.policies)} policies): train it on this "
                            f"experiment's testbed/AsetSim-v0")
    try:
        driver.choose(first_state(ctx, initial))
    except SelectorFailed as exc:
        raise SelectorError(f"{where}: its first call, on the observation of a window without queries, "
                            f"{exc.what}" + (f"\n{exc.tb}" if exc.tb else "")) from None


def selector_window(aset, report_interval_s: float) -> float:
    """The decision window of a selector (s): ``aset.window_s``, default the report interval.

    Raises:
        SelectorError: a window that is not a whole number (>= 1) of report intervals.
    """
    w = float(aset.window_s or report_interval_s)
    k = w / float(report_interval_s)
    if abs(k - round(k)) > 1e-9 or round(k) < 1:
        raise SelectorError(f"aset.window {w * 1e3:g} ms: a selector's window must be a whole number (>= 1) of "
                            f"report intervals ({float(report_interval_s) * 1e3:g} ms)")
    return w


def initial_policy(aset) -> str:
    """The policy a selected source applies before the selector's first decision:
    ``aset.options.initial_policy``, default ``closest`` (as the checkpoint-driven sources)."""
    return str((aset.options or {}).get("initial_policy", "closest"))


__all__ = ["Observation", "ResolvedSelector", "SelectorDriver", "SelectorError", "SelectorFailed",
           "check_selector", "first_state", "initial_policy", "observation_spec", "resolve_selector",
           "selector_window", "source_context"]
