"""Scheduling policies: a pure decision from (query, the state the dispatcher last heard).

The catalogue of static policies of ``docs/system-model.md`` ("The policies"). A policy is one
decision function registered with :func:`register_policy` in this file; everything else is derived
from :data:`REGISTRY`: :data:`CATALOGUE` (the names in registration order: ASET's action space, so
a new policy is appended after the others, never inserted: a trained checkpoint's action i is the
i-th name), :data:`DETERMINISTIC`, :data:`LOAD_AWARE`, and every policy-name check (the plan's,
the simulator's, a source's, the command line's). Both the emulation's dispatcher
(:mod:`testbed.emu.source`) and the simulator (:mod:`testbed.sim`) call :func:`decide`, through
:class:`testbed.model.dispatch.Dispatcher`. ``docs/extending.md`` ("Adding a policy") shows the steps.

Every policy has the signature ``policy(options, deadline_ms, min_accuracy, ctx=None) -> Decision``:

- ``options``: one :class:`Option` per (cluster, model) pair, carrying what the dispatcher knows:
  the expected RTT, the expected service time t_m, the accuracy, and the load it last heard
  (stale by the report interval): ``queue_wait_ms`` (expected queueing delay) and ``load``
  (queries at the cluster per worker), ``up`` (the cluster answered its last report), and the
  parts of that estimate: ``reported`` (queries in the report), ``sent`` (the dispatcher's own
  sends since), ``workers``, ``heard_at_s`` (when the report was heard) and ``service_rate_qps``.
- ``ctx``: the dispatcher's own state: a seeded ``numpy.random.Generator`` (``random``, ``p2c``),
  round-robin counters (``round_robin``) and the clock of the decision (``now_s``, which
  ``age_aware`` reads), one :class:`Context` per dispatcher. Deterministic given options, ctx and seed.

A feasible pair is (cluster, model) with accuracy >= A_a and RTT(source, cluster) + t_m <= D_a
on a cluster last heard up. With no feasible pair a policy falls back to ``min_latency`` over the
pairs meeting A_a (our choice, ``docs/system-model.md``) and says so (``fallback=True``); with no pair
meeting A_a it takes the most accurate one (the query will fail with cause ``accuracy``).
Clusters last heard down are avoided while any cluster is up.

Ties are broken by (cluster name, model name), so every pick is reproducible.

A policy of one's own needs no edit here (``docs/extending.md``, "A policy of your own (plug-in)"):
wherever a policy is named, :data:`REGISTRY` also resolves an entry-point name of the group
:data:`PLUGIN_GROUP`, a ``package.module:callable``, or either with parameters, once
:mod:`testbed.plan.policy_plugins` (imported by every planning process) has installed how: it
loads the plug-in (:mod:`testbed.core.plugins`), checks it (its signature, its properties, calls on
a synthetic option list) and wraps it. The callable is a decision function of the signature above
whose parameters are keyword arguments after ``ctx``; it declares its properties with
:func:`policy_plugin` (without it: the safe defaults, never cached). A plug-in is not in
:data:`CATALOGUE` (ASET's default action space): it is used where it is named. A plug-in that
raises or exits while deciding is a :class:`PolicyFailure` (exit code 4) naming it, with its
traceback.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from testbed.core.errors import EXIT_COMPONENT_DIED, RunFailure
from testbed.core.registry import NamesView, Registry, SubsetView


@dataclass(frozen=True)
class Option:
    """A (cluster, model) pair as the dispatcher sees it.

    ``rtt_ms``: expected RTT source->cluster (ms). ``service_ms``: expected inference time t_m at
    the cluster's CPU share (ms). ``accuracy``: alpha_m in [0, 1]. ``queue_wait_ms``: expected
    queueing delay from the last load report (ms; 0 when unknown). ``load``: queries at the
    cluster per worker, waiting or in service, as last reported plus the dispatcher's own sends
    since (:mod:`testbed.model.dispatch`; 0 when unknown). ``tier``: ``far_edge``, ``near_edge`` or
    ``cloud``. ``up``: False when the cluster did not answer its last report.

    The parts of the load estimate, per cluster (the same on each of its options):
    ``reported``: queries waiting or in service in the last report. ``sent``: the queries the
    dispatcher sent there since that report (``load = (reported + sent) / workers``).
    ``workers``: the cluster's W. ``heard_at_s``: when the report was heard, on the caller's clock
    (s; None: never), compared with :attr:`Context.now_s`. ``service_rate_qps``: queries/s the
    cluster completes with every worker busy, ``W x 1000 / mean service time`` (the mean over its
    models, :class:`testbed.model.dispatch.Dispatcher`; 0 when unknown).
    """

    cluster: str
    model: str
    rtt_ms: float
    service_ms: float
    accuracy: float
    queue_wait_ms: float = 0.0
    load: float = 0.0
    tier: str = ""
    up: bool = True
    reported: int = 0
    sent: int = 0
    workers: int = 1
    heard_at_s: float | None = None
    service_rate_qps: float = 0.0


@dataclass(frozen=True)
class Decision:
    """The chosen pair; ``fallback`` is True when the policy found no feasible pair."""

    cluster: str
    model: str
    fallback: bool


@dataclass
class Context:
    """A dispatcher's own state for ``random`` and ``p2c`` (``rng``), ``round_robin`` (``rr``: next
    index per key, the key being the application's (deadline, accuracy)) and ``age_aware``
    (``now_s``: the time of the decision on the clock of :attr:`Option.heard_at_s`, s; None:
    unknown, every report taken as fresh). The dispatcher sets ``now_s`` at each decision."""

    rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(0))
    rr: dict = field(default_factory=dict)
    now_s: float | None = None


#: A decision function: ``(options, deadline_ms, min_accuracy, ctx) -> Decision``.
PolicyFn = Callable[[list[Option], float, float, "Context | None"], Decision]
#: What :func:`decide_many` gives for a stateful policy: ``(feasible options, deadline_ms,
#: min_accuracy, n, ctx) -> n decisions`` in one call (the feasible list is never empty).
ManyFn = Callable[[list[Option], float, float, int, Context], list[Decision]]


@dataclass(frozen=True)
class Policy:
    """One registered policy (see :func:`register_policy`); calling it applies ``fn``.

    ``deterministic``: the decision depends only on (options, deadline, accuracy), so it is constant
    between two load reports and a dispatcher caches it per application. ``load_aware``: the
    decision reads the load estimate (``queue_wait_ms`` / ``load``), which the dispatcher's own sends
    change, so its cache is dropped at every send. ``stateful``: the decision reads or changes the
    dispatcher's :class:`Context` (its seeded ``rng``, its ``rr`` counters): never cached, and
    :func:`decide` refuses a missing ``ctx``. ``all_options``: the policy is given every option of
    the query's family (``cloud`` ignores the deadline), not only the feasible ones. ``many``: a
    batched form for :func:`decide_many` (``ManyFn``; None: ``n`` calls of ``fn``). ``origin``: where
    a plug-in came from (a :class:`testbed.core.plugins.Origin`, set by
    :mod:`testbed.plan.policy_plugins`; the model reads no module or file); None for a built-in policy.
    A plug-in's ``fn`` is its wrapper: every decision through it is checked and any failure is a
    :class:`PolicyFailure`. ``decision_ms``: what one decision costs, as the simulator charges it
    (``dispatch_ms``): :data:`BUILTIN_DECISION_MS` for a built-in policy, for a plug-in the median
    wall time of its plan-time check calls (:func:`testbed.plan.policy_plugins.check_plugin`).
    """

    name: str
    fn: PolicyFn
    deterministic: bool = False
    load_aware: bool = False
    stateful: bool = False
    all_options: bool = False
    many: ManyFn | None = None
    origin: Any = None
    decision_ms: float = 0.0

    def __call__(self, options: list[Option], deadline_ms: float, min_accuracy: float,
                 ctx: Context | None = None) -> Decision:
        return self.fn(options, deadline_ms, min_accuracy, ctx)

    def __deepcopy__(self, memo: dict) -> Policy:
        return self  # a registry entry: immutable, shared by every copy of a dispatcher


#: The entry-point group of policy plug-ins (``[project.entry-points."testbed.policies"]`` of a
#: plug-in package's ``pyproject.toml``).
PLUGIN_GROUP = "testbed.policies"
#: name -> :class:`Policy`, in registration order: the order of the ``@register_policy`` functions
#: in this file. The order is ASET's action index (a trained checkpoint stores action numbers):
#: a new policy goes after the others.
#: Plug-ins (module docstring) are resolved by the same registry and kept apart from the order.
#: How a plug-in is loaded, checked and wrapped is installed by :mod:`testbed.plan.policy_plugins`
#: (``REGISTRY.set_plugins``), which every planning process imports: the model reads no module.
REGISTRY: Registry[Policy] = Registry("policy")
#: The policy names in registration order: index = ASET's action (a live view of :data:`REGISTRY`).
CATALOGUE: NamesView = REGISTRY.names_view()
#: Policies whose decision depends only on (options, deadline, accuracy): constant between two
#: load reports, so a dispatcher (or the simulator) may cache them per application.
DETERMINISTIC: SubsetView = REGISTRY.subset(lambda p: p.deterministic)
#: Policies whose decision depends on the load estimate (so on the dispatcher's own sends).
LOAD_AWARE: SubsetView = REGISTRY.subset(lambda p: p.load_aware)
#: name -> :class:`Policy` (callable as its decision function), for every name of :data:`CATALOGUE`.
POLICIES: Mapping[str, Policy] = REGISTRY


def register_policy(name: str, *, deterministic: bool = False, load_aware: bool = False, stateful: bool = False,
                    all_options: bool = False, many: ManyFn | None = None) -> Callable[[PolicyFn], PolicyFn]:
    """Decorator: register the decision function below it as policy ``name`` (flags as
    :class:`Policy`), appended to :data:`CATALOGUE`; returns the function unchanged.

    Example::

        @register_policy("fastest_model", deterministic=True)
        def fastest_model(options, deadline_ms, min_accuracy, ctx=None) -> Decision: ...

    Raises:
        ValueError: ``name`` is empty or already registered; ``deterministic`` with ``stateful``
            (a decision that reads the context cannot be cached).
    """
    if deterministic and stateful:
        raise ValueError(f"policy {name!r}: a stateful policy is not deterministic (its decisions are not cached)")

    def add(fn: PolicyFn) -> PolicyFn:
        REGISTRY.add(name, Policy(name, fn, deterministic, load_aware, stateful, all_options, many))
        return fn

    return add


def unregister_policy(name: str) -> Policy:
    """Remove policy ``name`` from :data:`REGISTRY` (for tests; ``REGISTRY.temporarily`` does both).

    Raises:
        testbed.core.registry.UnknownNameError: ``name`` is not registered.
    """
    return REGISTRY.remove(name)


def policy(name: str, where: str = "") -> Policy:
    """The registered policy ``name``.

    Raises:
        testbed.core.registry.UnknownNameError: not registered; the message names ``where`` (the item
            that named it), the known policies and a close match.
    """
    return REGISTRY.resolve(name, where)


# --------------------------------------------------------------------------- plug-ins

#: The attribute :func:`policy_plugin` sets on a decision function: its :class:`PolicyTraits`.
TRAITS_ATTR = "testbed_policy"
F = TypeVar("F", bound=Callable[..., Decision])


@dataclass(frozen=True)
class PolicyTraits:
    """What a plug-in declares about its decisions (the flags of :class:`Policy`, same meaning)."""

    deterministic: bool = False
    load_aware: bool = False
    stateful: bool = False
    all_options: bool = False


#: The properties of a plug-in that declares none (a plain ``module:callable``, no
#: :func:`policy_plugin`): the safe ones, whatever it does. Not deterministic (never cached: it is
#: called at every query), load-aware, stateful (it may use the dispatcher's :class:`Context`).
UNDECLARED = PolicyTraits(deterministic=False, load_aware=True, stateful=True)


def policy_plugin(*, deterministic: bool = False, load_aware: bool = False, stateful: bool = False,
                  all_options: bool = False) -> Callable[[F], F]:
    """Decorator: declare a decision function a policy plug-in with these properties (as
    :class:`Policy`); returns the function unchanged, with :class:`PolicyTraits` as its
    ``testbed_policy`` attribute. Its signature is ``fn(options, deadline_ms, min_accuracy, ctx=None,
    *, <its parameters>) -> Decision``; the parameters come from the reference
    (``mypkg.sched:slack(margin_ms=5)`` or ``{use: ..., params: {...}}``). A stateful plug-in keeps
    its state in the dispatcher's :class:`Context`: ``ctx.rng`` (seeded per source) and ``ctx.rr``
    (a dict; use keys of your own, e.g. tuples that start with your policy's name). A plain
    function without this decorator is taken with :data:`UNDECLARED` (never cached); declaring
    ``deterministic=True`` lets the dispatcher cache its decisions between two load reports.

    Example::

        @policy_plugin(deterministic=True, load_aware=True)
        def slack(options, deadline_ms, min_accuracy, ctx=None, *, margin_ms=0.0) -> Decision: ...

    Raises:
        ValueError: ``deterministic`` with ``stateful``.
    """
    if deterministic and stateful:
        raise ValueError("a stateful policy is not deterministic (its decisions are not cached)")
    traits = PolicyTraits(deterministic, load_aware, stateful, all_options)

    def mark(fn: F) -> F:
        setattr(fn, TRAITS_ATTR, traits)
        return fn

    return mark


#: The decision cost the simulator charges a built-in policy, ms: none. A built-in decision is a few
#: comparisons over at most a few dozen options, 5-60 us of Python per query here
#: (benchmarks/dilation.py's runs: the emulation's dispatch_ms p95 of the built-in policies), below
#: the resolution of every other stage; a constant 0 keeps the simulator's runs independent of the
#: machine that planned them.
BUILTIN_DECISION_MS = 0.0


class PolicyFailure(RunFailure):
    """A policy plug-in raised, exited, or returned something that is not a :class:`Decision` among
    its options, while deciding during a run. Exit code 4 (a component failed during the run); the
    message names the policy and its import path and holds the plug-in's traceback. Raised by the
    plug-in's wrapper (:mod:`testbed.plan.policy_plugins`), through which every decision of a
    plug-in goes."""

    exit_code = EXIT_COMPONENT_DIED


def plugin_origins(names: list[str] | tuple[str, ...] | set[str]) -> dict[str, dict[str, Any]]:
    """For each name of ``names`` that is a plug-in: where it came from (:class:`Origin` as a dict:
    ``import_path``, ``distribution``, ``version``, ``file``, ``sha256``, ...), for ``run.json``.
    Built-in names and ``aset`` are left out.

    Raises:
        testbed.core.registry.UnknownNameError, testbed.core.plugins.PluginError: as ``REGISTRY.resolve``.
    """
    out: dict[str, dict[str, Any]] = {}
    for n in names:
        if n in REGISTRY or n == "aset":
            continue
        origin = REGISTRY.resolve(n).origin
        if origin is not None:
            out[n] = origin.as_dict()
    return out


def _usable(options: list[Option]) -> list[Option]:
    up = [o for o in options if o.up]
    return up or list(options)


def feasible(options: list[Option], deadline_ms: float, min_accuracy: float) -> list[Option]:
    """Pairs with accuracy >= ``min_accuracy`` and rtt + service <= ``deadline_ms`` (clusters up)."""
    return [o for o in options if o.up and o.accuracy >= min_accuracy and o.rtt_ms + o.service_ms <= deadline_ms]


def _expected_ms(o: Option) -> float:
    return o.rtt_ms + o.queue_wait_ms + o.service_ms


def _min_latency_pick(options: list[Option]) -> Option:
    return min(options, key=lambda o: (_expected_ms(o), o.cluster, o.model))


def _fallback(options: list[Option], min_accuracy: float) -> Decision:
    if not options:
        raise ValueError("no (cluster, model) options to choose from")
    pool = _usable(options)
    accurate = [o for o in pool if o.accuracy >= min_accuracy]
    if accurate:
        pick = _min_latency_pick(accurate)
    else:
        pick = max(pool, key=lambda o: (o.accuracy, -o.rtt_ms, o.cluster, o.model))
    return Decision(pick.cluster, pick.model, True)


def _fastest_at(ok: list[Option], cluster: str) -> Option:
    return min((o for o in ok if o.cluster == cluster), key=lambda o: (o.service_ms, o.model))


@register_policy("closest", deterministic=True)
def closest(options: list[Option], deadline_ms: float, min_accuracy: float, ctx: Context | None = None) -> Decision:
    """``closest``: the feasible cluster with the smallest RTT; there, the fastest feasible model.

    Raises:
        ValueError: ``options`` is empty.
    """
    ok = feasible(options, deadline_ms, min_accuracy)
    if not ok:
        return _fallback(options, min_accuracy)
    cluster = min(ok, key=lambda o: (o.rtt_ms, o.cluster)).cluster
    pick = _fastest_at(ok, cluster)
    return Decision(pick.cluster, pick.model, False)


@register_policy("cloud", deterministic=True, all_options=True)
def cloud(options: list[Option], deadline_ms: float, min_accuracy: float, ctx: Context | None = None) -> Decision:
    """``cloud``: the cloud cluster (tier ``cloud``), its fastest model meeting A_a, whatever the
    deadline. No cloud cluster up or no cloud model accurate enough: the fallback.

    Raises:
        ValueError: ``options`` is empty.
    """
    ok = [o for o in options if o.tier == "cloud" and o.up and o.accuracy >= min_accuracy]
    if not ok:
        return _fallback(options, min_accuracy)
    pick = min(ok, key=lambda o: (o.service_ms, o.rtt_ms, o.cluster, o.model))
    return Decision(pick.cluster, pick.model, False)


@register_policy("least_loaded", deterministic=True, load_aware=True)
def least_loaded(options: list[Option], deadline_ms: float, min_accuracy: float,
                 ctx: Context | None = None) -> Decision:
    """``least_loaded``: the feasible cluster with the lowest load, queries per worker (last heard
    plus the dispatcher's own sends; ties: smaller RTT), there the fastest feasible model.

    Raises:
        ValueError: ``options`` is empty.
    """
    ok = feasible(options, deadline_ms, min_accuracy)
    if not ok:
        return _fallback(options, min_accuracy)
    cluster = min(ok, key=lambda o: (o.load, o.rtt_ms, o.cluster)).cluster
    pick = _fastest_at(ok, cluster)
    return Decision(pick.cluster, pick.model, False)


@register_policy("min_latency", deterministic=True, load_aware=True)
def min_latency(options: list[Option], deadline_ms: float, min_accuracy: float,
                ctx: Context | None = None) -> Decision:
    """``min_latency``: the feasible pair minimising RTT + expected queue wait + t_m.

    Raises:
        ValueError: ``options`` is empty.
    """
    ok = feasible(options, deadline_ms, min_accuracy)
    if not ok:
        return _fallback(options, min_accuracy)
    pick = _min_latency_pick(ok)
    return Decision(pick.cluster, pick.model, False)


@register_policy("max_accuracy", deterministic=True, load_aware=True)
def max_accuracy(options: list[Option], deadline_ms: float, min_accuracy: float,
                 ctx: Context | None = None) -> Decision:
    """``max_accuracy``: the most accurate feasible pair whose expected completion (RTT + expected
    queue wait + t_m) meets D_a (ties: the earlier expected completion); else ``min_latency``.

    Raises:
        ValueError: ``options`` is empty.
    """
    ok = [o for o in feasible(options, deadline_ms, min_accuracy) if _expected_ms(o) <= deadline_ms]
    if not ok:
        return min_latency(options, deadline_ms, min_accuracy)
    pick = min(ok, key=lambda o: (-o.accuracy, _expected_ms(o), o.cluster, o.model))
    return Decision(pick.cluster, pick.model, False)


def _random_many(ok: list[Option], deadline_ms: float, min_accuracy: float, n: int, ctx: Context) -> list[Decision]:
    picks = [Decision(o.cluster, o.model, False) for o in ok]
    return [picks[i] for i in ctx.rng.integers(len(ok), size=n).tolist()]


def _round_robin_many(ok: list[Option], deadline_ms: float, min_accuracy: float, n: int,
                      ctx: Context) -> list[Decision]:
    clusters = sorted({o.cluster for o in ok})
    best = [Decision(c, _fastest_at(ok, c).model, False) for c in clusters]
    key = (deadline_ms, min_accuracy)
    i = ctx.rr.get(key, 0)
    ctx.rr[key] = i + n
    return [best[(i + k) % len(best)] for k in range(n)]


@register_policy("random", stateful=True, many=_random_many)
def random(options: list[Option], deadline_ms: float, min_accuracy: float, ctx: Context | None = None) -> Decision:
    """``random``: uniform over the feasible pairs, drawn from ``ctx.rng`` (seeded per dispatcher).

    Raises:
        ValueError: ``options`` is empty; ``ctx`` is None.
    """
    if ctx is None:
        raise ValueError("policy 'random' needs a Context with a seeded rng")
    ok = feasible(options, deadline_ms, min_accuracy)
    if not ok:
        return _fallback(options, min_accuracy)
    pick = ok[int(ctx.rng.integers(len(ok)))]
    return Decision(pick.cluster, pick.model, False)


@register_policy("round_robin", stateful=True, many=_round_robin_many)
def round_robin(options: list[Option], deadline_ms: float, min_accuracy: float,
                ctx: Context | None = None) -> Decision:
    """``round_robin``: cycles over the feasible clusters (sorted by name; one counter per
    application class in ``ctx.rr``), there the fastest feasible model.

    Raises:
        ValueError: ``options`` is empty; ``ctx`` is None.
    """
    if ctx is None:
        raise ValueError("policy 'round_robin' needs a Context")
    ok = feasible(options, deadline_ms, min_accuracy)
    if not ok:
        return _fallback(options, min_accuracy)
    clusters = sorted({o.cluster for o in ok})
    key = (deadline_ms, min_accuracy)
    i = ctx.rr.get(key, 0)
    ctx.rr[key] = i + 1
    pick = _fastest_at(ok, clusters[i % len(clusters)])
    return Decision(pick.cluster, pick.model, False)


def _lightest(ok: list[Option], load: Callable[[Option], float]) -> Decision:
    """The feasible cluster with the lowest ``load`` (ties: smaller RTT, then name), there the
    fastest feasible model."""
    cluster = min(ok, key=lambda o: (load(o), o.rtt_ms, o.cluster)).cluster
    pick = _fastest_at(ok, cluster)
    return Decision(pick.cluster, pick.model, False)


@register_policy("p2c", load_aware=True, stateful=True)
def p2c(options: list[Option], deadline_ms: float, min_accuracy: float, ctx: Context | None = None) -> Decision:
    """``p2c`` (power of two choices): two distinct feasible clusters drawn uniformly from
    ``ctx.rng`` (the clusters sorted by name; one draw from ``n``, one from the ``n - 1`` others),
    the one with the lower load (queries per worker: last report plus the dispatcher's own sends
    since, ``Option.load``; ties: smaller RTT, then name); there the fastest feasible model. With
    one feasible cluster, that one (no draw). Mitzenmacher, "How useful is old information?",
    IEEE TPDS 11(1), 2000: two random choices keep most of the benefit of load information and
    herd far less than the least loaded of all when the information is stale.

    Raises:
        ValueError: ``options`` is empty; ``ctx`` is None.
    """
    if ctx is None:
        raise ValueError("policy 'p2c' needs a Context with a seeded rng")
    ok = feasible(options, deadline_ms, min_accuracy)
    if not ok:
        return _fallback(options, min_accuracy)
    clusters = sorted({o.cluster for o in ok})
    if len(clusters) > 1:
        a = int(ctx.rng.integers(len(clusters)))
        b = int(ctx.rng.integers(len(clusters) - 1))
        drawn = {clusters[a], clusters[b + (b >= a)]}
        ok = [o for o in ok if o.cluster in drawn]
    return _lightest(ok, lambda o: o.load)


def age_discounted_load(o: Option, now_s: float | None) -> float:
    """The expected queries per worker at ``o``'s cluster now, its report discounted by its age:
    ``(max(0, reported - age x service_rate_qps) + sent) / workers``, ``age = max(0, now_s -
    heard_at_s)`` in s (0 when either is None). The reported queries drain at the cluster's full
    service rate while the report ages; arrivals from other dispatchers since are not estimated,
    the dispatcher's own sends are added. After Dahlin, "Interpreting stale load information",
    IEEE TPDS 11(10), 2000 (a report is read in the light of its age)."""
    age_s = max(0.0, now_s - o.heard_at_s) if now_s is not None and o.heard_at_s is not None else 0.0
    return (max(0.0, o.reported - age_s * o.service_rate_qps) + o.sent) / max(1, o.workers)


@register_policy("age_aware", load_aware=True)
def age_aware(options: list[Option], deadline_ms: float, min_accuracy: float,
              ctx: Context | None = None) -> Decision:
    """``age_aware``: ``least_loaded`` on the age-discounted load (:func:`age_discounted_load`,
    at ``ctx.now_s``): the feasible cluster with the lowest expected queries per worker now
    (ties: smaller RTT, then name), there the fastest feasible model. Without ``ctx`` or
    ``ctx.now_s``, every report is taken as fresh (``least_loaded``'s choice).

    Raises:
        ValueError: ``options`` is empty.
    """
    ok = feasible(options, deadline_ms, min_accuracy)
    if not ok:
        return _fallback(options, min_accuracy)
    now_s = ctx.now_s if ctx is not None else None
    return _lightest(ok, lambda o: age_discounted_load(o, now_s))


def decide_many(policy: str, options: list[Option], deadline_ms: float, min_accuracy: float, n: int,
                ctx: Context | None = None) -> list[Decision]:
    """``n`` successive decisions of ``policy`` for the same application on the same state, as ``n``
    calls of :func:`decide` would give them (same distribution; a policy's batched form, ``many``
    of :class:`Policy`, may draw differently: ``random`` draws its ``n`` indices in one call, so its
    stream differs from n single draws). For the simulator's hot path.

    Raises:
        ValueError: as :func:`decide`.
    """
    p = REGISTRY.resolve(policy)
    if p.deterministic or n <= 0:
        return [decide(policy, options, deadline_ms, min_accuracy, ctx)] * max(n, 0)
    if ctx is None:
        raise ValueError(f"policy {policy!r} needs a Context")
    if p.many is None:
        return [p(options, deadline_ms, min_accuracy, ctx) for _ in range(n)]
    ok = feasible(options, deadline_ms, min_accuracy)
    if not ok:
        return [_fallback(options, min_accuracy)] * n
    return p.many(ok, deadline_ms, min_accuracy, n, ctx)


def decide(policy: str, options: list[Option], deadline_ms: float, min_accuracy: float,
           ctx: Context | None = None) -> Decision:
    """Apply the policy called ``policy`` (a name of :data:`CATALOGUE`, or a plug-in reference).

    Raises:
        ValueError: unknown policy name (:class:`testbed.core.registry.UnknownNameError`, the message
            lists the catalogue), empty ``options``, or no ``ctx`` for a stateful policy.
        testbed.core.plugins.PluginError: a plug-in that cannot be resolved.
        PolicyFailure: a plug-in raised or answered something that is not one of ``options``.
    """
    p = REGISTRY.resolve(policy)
    if ctx is None and p.stateful:
        raise ValueError(f"policy {policy!r} needs a Context")
    return p.fn(options, deadline_ms, min_accuracy, ctx)


__all__ = ["BUILTIN_DECISION_MS", "CATALOGUE", "DETERMINISTIC", "LOAD_AWARE", "PLUGIN_GROUP", "POLICIES", "REGISTRY",
           "Context", "Decision",
           "ManyFn", "Option", "Policy", "PolicyFailure", "PolicyFn", "PolicyTraits", "UNDECLARED", "age_aware",
           "age_discounted_load", "closest", "cloud", "decide", "decide_many", "feasible",
           "least_loaded", "max_accuracy", "min_latency", "p2c", "plugin_origins", "policy",
           "policy_plugin", "random", "register_policy", "round_robin", "unregister_policy"]
