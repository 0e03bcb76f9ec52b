"""Policy plug-ins: how the policy registry of the model loads, checks and wraps a policy of one's own.

The model's :data:`testbed.model.policies.REGISTRY` holds the built-in policies and reads no module
of its own; importing this module installs its plug-in hook (``REGISTRY.set_plugins``), so that a
name it does not hold (an entry-point name of group :data:`~testbed.model.policies.PLUGIN_GROUP`,
``package.module:callable``, either with parameters) is resolved here: loaded by the one plug-in
loader (:func:`testbed.core.plugins.load`), checked (:func:`plugin_policy`, :func:`check_plugin`)
and wrapped, once per process. :mod:`testbed.plan` imports this module, so every process that
plans or runs an experiment (the CLI, the simulator, an emulated source, a sweep's worker) has it.

What a plug-in gets, and the limits it is held to:

- a decision function marked with :func:`testbed.model.policies.policy_plugin` has the properties
  it declares; a plain function without it gets :data:`testbed.model.policies.UNDECLARED` (never
  cached, re-decided at every query), and a note says once, on stderr, that the decorator enables
  caching;
- its import and its plan-time check run under a time limit
  (:func:`testbed.core.plugins.time_limit_s`);
- every call of it goes through :func:`testbed.core.plugins.call_plugin`: at plan time an exit or
  a hang is a :class:`testbed.core.plugins.PluginFault` (exit code 4) and an exception a plan error
  (exit code 2), both naming it; during a run an exception, an exit, or an answer that is not one
  of its options is a :class:`testbed.model.policies.PolicyFailure` (exit code 4) naming it, with
  its traceback.
"""

from __future__ import annotations

import functools
import inspect
import sys
import time
import traceback
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from testbed.core.plugins import Loaded, PluginFault, PluginHook, call_plugin, plugin_traceback, time_limit_s
from testbed.model.policies import (
    PLUGIN_GROUP,
    REGISTRY,
    TRAITS_ATTR,
    UNDECLARED,
    Context,
    Decision,
    Option,
    Policy,
    PolicyFailure,
    PolicyTraits,
    feasible,
)


def _wrong_answer(d: object, options: list[Option]) -> str:
    """What is wrong with ``d`` as a decision among ``options`` ("" when nothing)."""
    if not isinstance(d, Decision):
        return (f"returned {type(d).__name__} {d!r}, not a testbed.model.policies.Decision(cluster, model, "
                f"fallback)")
    if not any(o.cluster == d.cluster and o.model == d.model for o in options):
        return f"returned ({d.cluster}, {d.model}), which is not one of the options it was given"
    return ""


class GuardedDecision:
    """A plug-in's decision function as the dispatcher calls it: ``fn(options, deadline_ms,
    min_accuracy, ctx) -> Decision`` through :func:`testbed.core.plugins.call_plugin`.

    Args:
        name: the policy's reference. origin: ``"import.path:attr, /its/file.py"``. fn: the plug-in's
            function with its parameters bound.

    Raises (when called):
        PolicyFailure: the plug-in raised (any Exception), exited or raised another BaseException of
            its own, or returned something that is not a :class:`Decision` among the options; the
            message names it and ends with its traceback.
    """

    def __init__(self, name: str, origin: str, fn: Callable[..., Any]):
        self.name, self.origin, self.fn = name, origin, fn

    def __call__(self, options: list[Option], deadline_ms: float, min_accuracy: float,
                 ctx: Context | None = None) -> Decision:
        who = f"policy {self.name!r} ({self.origin})"
        try:
            d = call_plugin(f"{who}, deciding", self.fn, options, deadline_ms, min_accuracy, ctx)
        except PluginFault as exc:
            raise PolicyFailure(str(exc)) from exc.__cause__
        except Exception as exc:
            tb = plugin_traceback(exc)
            raise PolicyFailure(f"{who} raised {type(exc).__name__}: {exc}\n{tb}") from exc
        problem = _wrong_answer(d, options)
        if problem:
            raise PolicyFailure(f"{who} {problem}")
        return d


def _check_signature(fn: Callable, params: Mapping[str, Any]) -> None:
    """``fn`` accepts ``(options, deadline_ms, min_accuracy, ctx, **params)``."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        raise TypeError(f"{fn!r} is not a function whose signature can be read") from None
    try:
        sig.bind([], 0.0, 0.0, None, **params)
    except TypeError as exc:
        given = ", ".join(params) or "none"
        raise TypeError(f"signature {fn.__name__}{sig} does not match what the dispatcher calls, "
                        f"fn(options, deadline_ms, min_accuracy, ctx=None, *, <parameters>) -> Decision, with "
                        f"the parameters given ({given}): {exc}") from None


#: The synthetic option list of the check (:func:`check_plugin`): three tiers, two models; at a 50 ms
#: deadline and accuracy 0.85, two options are feasible.
_SYNTHETIC = (Option("edge-a", "large", 2.0, 20.0, 0.92, 0.0, 0.2, "far_edge"),
              Option("edge-a", "small", 2.0, 5.0, 0.80, 0.0, 0.2, "far_edge"),
              Option("edge-b", "large", 8.0, 20.0, 0.92, 6.0, 1.0, "near_edge"),
              Option("edge-b", "small", 8.0, 5.0, 0.80, 6.0, 1.0, "near_edge"),
              Option("cloud", "large", 40.0, 12.0, 0.92, 0.0, 0.1, "cloud"),
              Option("cloud", "small", 40.0, 3.0, 0.80, 0.0, 0.1, "cloud"))
_DEADLINE_MS, _MIN_ACCURACY = 50.0, 0.85


def _given(p: Policy, options: list[Option], deadline_ms: float) -> list[Option]:
    """What the dispatcher hands ``p`` (:meth:`testbed.model.dispatch.Dispatcher._for_policy`)."""
    if p.all_options:
        return list(options)
    return feasible(options, deadline_ms, _MIN_ACCURACY) or list(options)


def _call(p: Policy, options: list[Option], deadline_ms: float, ctx: Context, what: str,
          took_ms: list[float]) -> Decision:
    t0 = time.perf_counter_ns()
    try:
        d = p.fn(options, deadline_ms, _MIN_ACCURACY, ctx)
    except Exception as exc:
        last = traceback.extract_tb(exc.__traceback__)[-1]
        raise ValueError(f"raised {type(exc).__name__}: {exc} (at {last.filename}:{last.lineno}) when called on "
                         f"{what}; it must decide on any non-empty option list") from None
    took_ms.append((time.perf_counter_ns() - t0) / 1e6)
    problem = _wrong_answer(d, options)
    if problem:
        raise ValueError(f"{problem} (called on {what})")
    return d


def _ctx_state(ctx: Context) -> tuple:
    return repr(ctx.rng.bit_generator.state), repr(ctx.rr)


def check_plugin(p: Policy) -> float:
    """Call plug-in ``p`` (its own function, unwrapped) as a dispatcher would, on a synthetic option
    list (three tiers, two models, some load), and hold it to what it declares; return the median
    wall time of these calls (ms, ``time.perf_counter_ns``): its decision cost
    (:attr:`testbed.model.policies.Policy.decision_ms`).


    - on the feasible options and on options none of which is feasible, it returns a
      :class:`Decision` among the options given;
    - not ``stateful``: it leaves the :class:`Context` as it was (draws nothing from ``ctx.rng``,
      writes nothing in ``ctx.rr``);
    - ``deterministic``: the same options give the same decision with another ``ctx``;
    - ``deterministic`` and not ``load_aware``: the decision does not change when the loads do (the
      dispatcher would keep a decision that depends on them past its own sends).

    Raises:
        ValueError: the first of these that fails, saying what to change.
        BaseException: what the plug-in raises that is not an Exception (the caller,
            :func:`plugin_policy`, runs this through :func:`testbed.core.plugins.call_plugin`).
    """
    ctx = Context(rng=np.random.default_rng(0))
    before = _ctx_state(ctx)
    took: list[float] = []
    opts = _given(p, list(_SYNTHETIC), _DEADLINE_MS)
    first = _call(p, opts, _DEADLINE_MS, ctx, f"{len(opts)} synthetic options at a {_DEADLINE_MS:g} ms deadline",
                  took)
    _call(p, _given(p, list(_SYNTHETIC), 1.0), 1.0, ctx, "synthetic options none of which meets a 1 ms deadline",
          took)
    if not p.stateful and _ctx_state(ctx) != before:
        raise ValueError("it changed the dispatcher's Context (drew from ctx.rng or wrote ctx.rr) but does not "
                         "declare it: use @policy_plugin(stateful=True)")
    if not p.deterministic:
        return float(np.median(took))
    again = _call(p, opts, _DEADLINE_MS, Context(rng=np.random.default_rng(1)), "the same options again", took)
    if again != first:
        raise ValueError(f"it declares deterministic=True but decided {first} then {again} on the same options; "
                         f"declare deterministic=False (or stateful=True if it uses ctx)")
    if p.load_aware:
        return float(np.median(took))
    loaded = [Option(o.cluster, o.model, o.rtt_ms, o.service_ms, o.accuracy, o.queue_wait_ms + 1000.0 * (i % 2 == 0),
                     o.load + 10.0 * (i % 2 == 0), o.tier, o.up) for i, o in enumerate(opts)]
    moved = _call(p, loaded, _DEADLINE_MS, Context(rng=np.random.default_rng(0)), "the same options under load",
                  took)
    if moved != first:
        raise ValueError("its decision changes with the load (queue_wait_ms, load) but it does not declare it: "
                         "use @policy_plugin(deterministic=True, load_aware=True)")
    return float(np.median(took))


#: The import paths of the plain functions this process has taken with the safe defaults (the
#: note about the decorator is said once for each).
_NOTED: set[str] = set()


def _note_undeclared(name: str, import_path: str) -> None:
    """Say once per function, on stderr, that a plain function is never cached and how to change it."""
    if import_path in _NOTED:
        return
    _NOTED.add(import_path)
    print(f"note: policy {name!r} ({import_path}) declares no properties: it is taken as not deterministic, "
          f"load-aware and stateful, so it is called at every query and never cached; to let the dispatcher cache "
          f"its decisions, decorate it with @testbed.model.policies.policy_plugin(deterministic=True, ...) "
          f"(docs/extending.md)", file=sys.stderr, flush=True)


def plugin_policy(name: str, loaded: Loaded) -> Policy:
    """The :class:`Policy` of a loaded plug-in (the hook of :data:`REGISTRY`): ``loaded.obj`` must be a
    decision function accepting its parameters; its properties are those :func:`policy_plugin`
    declared, else :data:`~testbed.model.policies.UNDECLARED` (said once on stderr); its decisions
    are checked (:func:`check_plugin`, under :func:`testbed.core.plugins.time_limit_s`) and its
    function is wrapped (:class:`GuardedDecision`).

    Raises:
        TypeError: not callable, properties that are not :class:`PolicyTraits`, or a signature that
            does not fit.
        ValueError: :func:`check_plugin` fails.
        PluginFault: the plug-in exited or hung while it was checked (exit code 4).
    """
    fn = loaded.obj
    origin = loaded.origin
    if not callable(fn):
        raise TypeError(f"{type(fn).__name__} {fn!r} is not callable: a policy plug-in is a decision function")
    traits = getattr(fn, TRAITS_ATTR, None)
    if traits is None:
        traits = UNDECLARED
        _note_undeclared(name, origin.import_path)
    if not isinstance(traits, PolicyTraits):
        raise TypeError(f"its {TRAITS_ATTR} attribute is {traits!r}, not the PolicyTraits that "
                        f"@testbed.model.policies.policy_plugin(...) sets")
    _check_signature(fn, loaded.params)
    bound = functools.partial(fn, **loaded.params) if loaded.params else fn
    raw = Policy(name, bound, traits.deterministic, traits.load_aware, traits.stateful, traits.all_options,
                 origin=origin)
    where = f"{origin.import_path}, {origin.file}"
    cost_ms = call_plugin(f"policy {name!r} ({where}), checked on synthetic options", check_plugin, raw,
                          limit_s=time_limit_s())
    return Policy(name, GuardedDecision(name, where, bound), traits.deterministic, traits.load_aware, traits.stateful,
                  traits.all_options, origin=origin, decision_ms=round(cost_ms, 4))


REGISTRY.set_plugins(PluginHook(PLUGIN_GROUP, plugin_policy))

__all__ = ["GuardedDecision", "check_plugin", "plugin_policy"]
