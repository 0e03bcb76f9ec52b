"""The plan-based ASET agent as it acts: a Q-network over the plan-based observation
(:mod:`testbed.agent.observation`), in numpy; the checkpoint kind ``qnetwork``
(:mod:`testbed.agent.checkpoint`), written by the paper's double DQN (:mod:`testbed.aset.dqn`) and
by the rollout regression (:mod:`testbed.aset.rollout`); ``provenance.method`` says which.

No TensorFlow here: the emulation's source processes and ``testbed evaluate`` load the policy
without the 3-4 s / ~500 MB TensorFlow import. The checkpoint's JSON carries, besides the
container's keys, everything needed to rebuild the same observation: ``applications`` and
``clusters`` (feature order), ``sources`` (source-id order), ``deadlines_ms`` (per application),
``obs_size``, ``layers`` and ``plan_margin`` (the decision rule, :func:`plan_scores`); its
``features`` hold the observation spec. The observation size is part of the checkpoint (the first
layer's input width); every user checks it against the observation it builds
(:meth:`NumpyPolicy.check_size`, :meth:`NumpyPolicy.check_contexts`) and fails with
:class:`ObservationSizeError` naming both sizes, never with a numpy shape error. Version 2 (no
source identity) opens, so that the size check can say what changed, but cannot drive this
observation: retrain.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from testbed.agent.checkpoint import (
    Checkpoint,
    CheckpointError,
    SourceSetup,
    read_checkpoint,
    register_kind,
    write_checkpoint,
)
from testbed.agent.observation import SourceContext, SourceObserver, context_size, observation_size
from testbed.core.errors import InputError, counted
from testbed.spec.aset import ObservationSpec

#: The checkpoint kind and the format version this code writes; :data:`OLDER_VERSIONS` it opens.
KIND, VERSION = "qnetwork", 3
#: Older versions :class:`NumpyPolicy` opens (for the size error), with what their observation lacks.
OLDER_VERSIONS = {2: "no source identity"}
#: What :class:`NumpyPolicy` reads from a checkpoint's JSON besides the container's keys.
META_KEYS = ("layers",)


def application_names_problem(where: str, applications, trained) -> str | None:
    """What keeps a plan-based checkpoint trained on the applications ``trained`` (feature order)
    from observing ``applications``, or None: ONE message for the live selector (a source's
    applications must all be known to it) and for ``testbed evaluate`` (an experiment's must be
    exactly them: its observation places each application's features by position)."""
    unknown = sorted(set(applications) - set(trained))
    if unknown:
        return f"{where}: applications {unknown} unknown to the checkpoint (trained on {list(trained)})"
    return None


class ObservationSizeError(InputError):
    """A checkpoint's network input width differs from the observation built for it."""


def plan_scores(q, obs, margin: float, n_actions: int):
    """The scores the greedy decision maximises: ``q + margin * plan``, ``plan`` being the
    observation's last ``n_actions`` features (the planned-policy one-hot of
    :mod:`testbed.agent.observation`); ``q`` itself when ``margin`` is 0 (no plan block needed).

    ONE rule for the agent's acting and its double-DQN target (TensorFlow tensors) and for the
    exported policy (numpy arrays): shapes (batch, n_actions) and (batch, obs_size).
    """
    if not margin:
        return q
    return q + margin * obs[:, -n_actions:]


def export_policy(weights: list[np.ndarray], path: str | Path, *, obs_spec: ObservationSpec,
                  applications: list[str], clusters: list[str], policies: list[str], sources: list[str],
                  provenance: Mapping | None = None, deadlines_ms: list[float] | None = None,
                  plan_margin: float = 0.0) -> Path:
    """Write the checkpoint ``PATH.{npz,json}`` (module docstring); returns ``PATH``.

    Raises:
        ObservationSizeError: the weights' input width is not the observation size of these names.
    """
    size = observation_size(len(applications), len(clusters), len(policies), obs_spec.history_windows, len(sources),
                            obs_spec.plans is not None)
    if np.shape(weights[0])[0] != size:
        raise ObservationSizeError(f"export {path}: network input {np.shape(weights[0])[0]} != observation size "
                                   f"{size} of {counted(len(sources), 'source')}, "
                                   f"{counted(len(applications), 'application')}, {counted(len(clusters), 'cluster')}, "
                                   f"{counted(len(policies), 'policy', 'policies')}")
    return write_checkpoint(path, kind=KIND, version=VERSION, policies=policies,
                            features={"observation": obs_spec.model_dump()},
                            arrays={f"w{i}": np.asarray(w, np.float32) for i, w in enumerate(weights)},
                            provenance=provenance, applications=list(applications), clusters=list(clusters),
                            sources=list(sources), deadlines_ms=list(deadlines_ms or []), obs_size=size,
                            layers=len(weights) // 2, plan_margin=float(plan_margin))


class NumpyPolicy:
    """Greedy policy from exported weights: ReLU MLP forward pass in numpy (float32).

    ``obs_size``: the network's input width; ``sources``: the source-id order (empty for an
    older format, whose observation has no source identity: :meth:`check_size` then refuses it).

    Raises:
        FileNotFoundError: ``PATH.npz`` or ``PATH.json`` is missing, or is not a regular file.
        ValueError: a file that cannot be read (a cut ``.npz`` or ``.json``, a JSON without
            :data:`META_KEYS`), naming it; unknown format, or the files do not match (layer count or shapes);
            :class:`ObservationSizeError` when the JSON's observation size is not the network's.
    """

    def __init__(self, checkpoint: Checkpoint | str | Path):
        ckpt = checkpoint if isinstance(checkpoint, Checkpoint) else read_checkpoint(checkpoint)
        self.path, self.meta = ckpt.path, dict(ckpt.meta)
        where = f"ASET checkpoint {ckpt.path}"
        if ckpt.kind != KIND:
            raise CheckpointError(f"{where}: kind {ckpt.kind!r}, not a Q-network over the plan-based observation")
        self.version = ckpt.version
        self.format = f"{KIND} v{ckpt.version}"
        self.layers = ckpt.layers()
        if self.layers[-1][0].shape[1] != len(ckpt.policies):
            raise CheckpointError(f"{where}.npz: output width {self.layers[-1][0].shape[1]} != "
                                  f"{counted(len(ckpt.policies), 'policy', 'policies')} in its JSON")
        try:
            self.obs_spec = ObservationSpec.model_validate(ckpt.features["observation"])
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"{where}: no valid observation spec ({type(exc).__name__})") from None
        self.policies = ckpt.policies
        self.obs_size = self.layers[0][0].shape[0]
        self.sources = tuple(self.meta.get("sources") or ())
        self.plan_margin = float(self.meta.get("plan_margin") or 0.0)
        if self.plan_margin and self.obs_spec.plans is None:
            raise CheckpointError(f"{where}: plan_margin {self.plan_margin:g} without observation plans")
        if self.version == VERSION:
            m = self.meta
            try:
                size = observation_size(len(m["applications"]), len(m["clusters"]), len(ckpt.policies),
                                        self.obs_spec.history_windows, len(self.sources),
                                        self.obs_spec.plans is not None)
            except (KeyError, TypeError) as exc:
                raise CheckpointError(f"{where}: no {exc} in its JSON (an incomplete export: export it "
                                      f"again)") from None
            if size != self.obs_size or m.get("obs_size", size) != size:
                raise ObservationSizeError(f"{where}.npz: network input {self.obs_size} features, but its JSON "
                                           f"describes an observation of {size} (obs_size {m.get('obs_size')})")

    @classmethod
    def from_weights(cls, weights: list[np.ndarray], obs_spec: ObservationSpec,
                     plan_margin: float = 0.0) -> NumpyPolicy:
        """A policy from in-memory weights (W0, b0, W1, b1, ...), e.g. for rollout workers;
        ``plan_margin`` as the agent's (:func:`plan_scores`)."""
        self = cls.__new__(cls)
        ws = [np.asarray(w, np.float32) for w in weights]
        self.layers = list(zip(ws[0::2], ws[1::2], strict=True))
        self.meta = {"layers": len(self.layers)}
        self.path, self.format, self.version, self.sources = Path("<weights>"), f"{KIND} v{VERSION}", VERSION, ()
        self.obs_spec = obs_spec
        self.obs_size = self.layers[0][0].shape[0]
        self.plan_margin = float(plan_margin)
        return self

    def check_size(self, size: int, what: str) -> None:
        """Refuse an observation of ``size`` features (built by ``what``) that is not the network's.

        Raises:
            ObservationSizeError: naming both sizes (and, for an older format, what it lacks).
        """
        if size != self.obs_size:
            old = f", {self.format}: {OLDER_VERSIONS[self.version]}" if self.version in OLDER_VERSIONS else ""
            raise ObservationSizeError(f"ASET checkpoint {self.path}: its network takes observations of "
                                       f"{self.obs_size} features{old}; {what} builds {size}: retrain with "
                                       f"testbed train (docs/aset.md)")

    def check_contexts(self, contexts: Sequence[SourceContext], what: str) -> None:
        """Refuse contexts (one per source, e.g. an env's) that this policy cannot drive: other
        applications (named as the live selector names them, :func:`application_names_problem`),
        clusters or sources (the source-id order) than the checkpoint's, or another observation size.

        Raises:
            ValueError: the names differ (the message names both lists); ObservationSizeError.
        """
        ctx = contexts[0]
        if "applications" in self.meta:
            trained = list(self.meta["applications"])
            problem = application_names_problem(what, ctx.applications, trained)
            if problem is None and list(ctx.applications) != trained:
                problem = (f"{what}: applications {list(ctx.applications)} are not the checkpoint's {trained} (its "
                           f"observation places them by position)")
            if problem:
                raise ValueError(f"{problem} ({self.path})")
        if "clusters" in self.meta and list(ctx.clusters) != list(self.meta["clusters"]):
            raise ValueError(f"{what}: clusters {list(ctx.clusters)} differ from the checkpoint's "
                             f"{self.meta['clusters']} ({self.path})")
        if self.sources and list(ctx.sources) != list(self.sources):
            raise ValueError(f"{what}: sources {list(ctx.sources)} differ from the checkpoint's {list(self.sources)} "
                             f"({self.path}; the source identity is a one-hot in this order)")
        self.check_size(context_size(ctx, self.obs_spec), what)

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        """Q-values, shape (batch, n_actions), for observations (batch, obs_size) or (obs_size,)."""
        x = np.atleast_2d(np.asarray(obs, np.float32))
        for i, (w, b) in enumerate(self.layers):
            x = x @ w + b
            if i < len(self.layers) - 1:
                np.maximum(x, 0.0, out=x)
        return x

    def act(self, obs: np.ndarray) -> np.ndarray:
        """Greedy actions, shape (batch,): the argmax of :func:`plan_scores` (the plain Q-values
        for a checkpoint without a plan margin)."""
        x = np.atleast_2d(np.asarray(obs, np.float32))
        q = self.q_values(x)
        return np.argmax(plan_scores(q, x, self.plan_margin, q.shape[1]), axis=1)


def _check_window(policy: NumpyPolicy, window_s: float | None) -> None:
    window_ms = policy.obs_spec.window_ms
    if window_s is not None and abs(float(window_s) * 1e3 - window_ms) > 1e-6:
        raise ValueError(f"aset.window {float(window_s) * 1e3:g} ms differs from the checkpoint's "
                         f"window {window_ms:g} ms ({policy.path}); set aset.window to {window_ms:g}ms")


def source_context(policy: NumpyPolicy, setup: SourceSetup) -> SourceContext:
    """The observation context of the source ``setup`` under ``policy``, after EVERY check that the
    checkpoint fits it.

    Raises:
        ValueError: the source's clusters are not the checkpoint's, an application is unknown to
            it, the source is not one of its sources, or it has plans and none (or one of another
            size) for this scenario; each named. ObservationSizeError: an older version, or
            another observation size.
    """
    meta, src = policy.meta, setup.source
    _check_window(policy, setup.window_s)
    rtt: dict[str, float] = {}
    for o in setup.options:
        rtt[o.cluster] = min(rtt.get(o.cluster, float("inf")), float(o.rtt_ms))
    if set(rtt) != set(meta["clusters"]):
        raise ValueError(f"source {src!r}: clusters {sorted(rtt)} differ from the checkpoint's "
                         f"{meta['clusters']} ({policy.path})")
    problem = application_names_problem(f"source {src!r}", [a.name for a in setup.applications],
                                        meta["applications"])
    if problem:
        raise ValueError(problem)
    sources = policy.sources
    if not sources:
        raise ObservationSizeError(f"ASET checkpoint {policy.path}: {policy.format} takes observations of "
                                   f"{policy.obs_size} features without the source identity; this testbed's "
                                   f"observation adds one feature per source of the experiment: retrain")
    if src not in sources:
        raise ValueError(f"source {src!r} is not one of the checkpoint's sources {list(sources)} ({policy.path}): "
                         f"its source identity is unknown")
    deadline = {a.name: float(a.deadline_ms) for a in setup.applications}
    deadline.update({a: d for a, d in zip(meta["applications"], meta.get("deadlines_ms") or [], strict=False)
                     if a not in deadline})
    planned = policy.obs_spec.planned(setup.scenario, sources)
    ctx = SourceContext(src, tuple(meta["applications"]), tuple(meta["clusters"]),
                        tuple(rtt[c] for c in meta["clusters"]), tuple(policy.policies),
                        tuple(deadline.get(a, 0.0) for a in meta["applications"]), sources=sources,
                        plan=planned[sources.index(src)] if planned else None)
    policy.check_size(context_size(ctx, policy.obs_spec), f"the selector of source {src!r}")
    return ctx


class QNetworkSelector:
    """A ``qnetwork`` checkpoint as a selector (:mod:`testbed.agent.selector`'s protocol) of one
    source: the plan-based observation in the checkpoint's order, from the raw window state
    (``obs.state``), and the greedy decision of :func:`plan_scores`."""

    def __init__(self, policy: NumpyPolicy, ctx: SourceContext):
        self.policy, self.ctx = policy, ctx
        self.observer = SourceObserver(ctx, policy.obs_spec)

    def select(self, obs) -> int:
        return int(self.policy.act(self.observer.observe(obs.state))[0])

    def reset(self) -> None:
        self.observer.reset()


def make_selector(ckpt: Checkpoint, setup: SourceSetup) -> QNetworkSelector:
    """The ``qnetwork`` kind's factory (:func:`testbed.agent.checkpoint.register_kind`).

    Raises:
        CheckpointError: the checkpoint cannot be read. ValueError, ObservationSizeError: it does
            not fit the source (:func:`source_context`).
    """
    policy = NumpyPolicy(ckpt)
    return QNetworkSelector(policy, source_context(policy, setup))


register_kind(KIND, make_selector, versions=(VERSION, *OLDER_VERSIONS))

__all__ = ["KIND", "VERSION", "NumpyPolicy", "ObservationSizeError", "QNetworkSelector", "application_names_problem",
           "export_policy", "make_selector", "plan_scores", "source_context"]
