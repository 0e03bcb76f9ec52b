"""The general ASET agent as it acts: one scoring network shared by every policy, Q(s, p) = f(local
features, features of what p would do now) (:mod:`testbed.agent.features`), in numpy; the checkpoint
kind ``general`` (:mod:`testbed.agent.checkpoint`).

Its checkpoint's JSON carries, besides the container's keys, ``layers`` (the Dense layers in the
``.npz``: ``w0, w1, ...`` = W0, b0, W1, b1, ...; the last has one output), ``bounds``, and the
decision rule: ``default_policy`` (one of ``policies``, or None) and ``margin`` (points). Its
``features`` hold the observation spec (window, history, scales, clip) and the feature names
(:data:`~testbed.agent.features.LOCAL_FEATURES`, :data:`~testbed.agent.features.POLICY_FEATURES`): a
checkpoint whose names differ from this code's is refused (the features changed: retrain), never
read with shifted columns. Nothing in it names a source, a cluster or an application, so it drives
any experiment within the bounds.
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
from testbed.agent.features import (
    INPUT_SIZE,
    LOCAL_FEATURES,
    MAX_APPLICATIONS,
    MAX_CLUSTERS,
    MAX_POLICIES,
    POLICY_FEATURES,
    PROBE_QUERIES,
    FeatureContext,
    PolicyFeaturizer,
    scorer_input,
)
from testbed.spec.aset import ObservationSpec

#: The checkpoint kind and the format version this code writes and reads.
KIND, VERSION = "general", 1


def forward(layers: Sequence[tuple[np.ndarray, np.ndarray]], x: np.ndarray) -> np.ndarray:
    """ReLU MLP forward pass; ``x`` (..., INPUT_SIZE) -> (...,) scores (the last layer's one output)."""
    for i, (w, b) in enumerate(layers):
        x = x @ w + b
        if i < len(layers) - 1:
            x = np.maximum(x, 0.0)
    return x[..., 0]


def export_general(weights: Sequence[np.ndarray], path: str | Path, *, policies: Sequence[str],
                   obs_spec: ObservationSpec, provenance: Mapping | None = None, default_policy: str | None = None,
                   margin: float = 0.0) -> Path:
    """Write the checkpoint ``PATH.{npz,json}`` (module docstring); returns ``PATH``. The decision
    rule (:meth:`GeneralPolicy.act`): ``default_policy`` (one of ``policies``, or None) and
    ``margin`` (points).

    Raises:
        ValueError: the weights do not take :data:`~testbed.agent.features.INPUT_SIZE` inputs or give
            more than one output, ``obs_spec`` has plans (the general observation has none), or the
            default policy is not one of ``policies``.
    """
    ws = [np.asarray(w, np.float32) for w in weights]
    if ws[0].shape[0] != INPUT_SIZE or ws[-1].shape[-1] != 1:
        raise ValueError(f"export {path}: network {ws[0].shape[0]} -> {ws[-1].shape[-1]}, the general scorer is "
                         f"{INPUT_SIZE} -> 1")
    if obs_spec.plans is not None:
        raise ValueError(f"export {path}: observation.plans is set; the general observation has no plan")
    if default_policy is not None and default_policy not in policies:
        raise ValueError(f"export {path}: default policy {default_policy!r} is not one of {list(policies)}")
    features = {"observation": obs_spec.model_dump(), "local_features": list(LOCAL_FEATURES),
                "policy_features": list(POLICY_FEATURES)}
    return write_checkpoint(path, kind=KIND, version=VERSION, policies=policies, features=features,
                            arrays={f"w{i}": w for i, w in enumerate(ws)}, provenance=provenance,
                            layers=len(ws) // 2, default_policy=default_policy, margin=float(margin),
                            bounds={"clusters": MAX_CLUSTERS, "applications": MAX_APPLICATIONS,
                                    "policies": MAX_POLICIES, "probe_queries": PROBE_QUERIES})


class GeneralPolicy:
    """A general checkpoint loaded for acting: :meth:`scores` and :meth:`act`.

    Args:
        checkpoint: a :class:`~testbed.agent.checkpoint.Checkpoint` of kind ``general``, or its path.

    Raises:
        CheckpointError: not of kind ``general``, feature names other than this code's (retrain),
            or weights that do not fit them; each names the file.
    """

    def __init__(self, checkpoint: Checkpoint | str | Path):
        ckpt = checkpoint if isinstance(checkpoint, Checkpoint) else read_checkpoint(checkpoint)
        where = f"ASET checkpoint {ckpt.path}"
        if ckpt.kind != KIND:
            raise CheckpointError(f"{where}: kind {ckpt.kind!r}, not a general checkpoint")
        for key, names in (("local_features", LOCAL_FEATURES), ("policy_features", POLICY_FEATURES)):
            if tuple(ckpt.features.get(key) or ()) != names:
                raise CheckpointError(f"{where}: its {key} differ from this testbed's (the features changed): "
                                      f"retrain with testbed train experiments/aset-general.yaml")
        self.layers = ckpt.layers()
        if self.layers[0][0].shape[0] != INPUT_SIZE or self.layers[-1][0].shape[1] != 1:
            raise CheckpointError(f"{where}: network {self.layers[0][0].shape[0]} -> {self.layers[-1][0].shape[1]}, "
                                  f"the features give {INPUT_SIZE} -> 1")
        self.path, self.meta = ckpt.path, dict(ckpt.meta)
        self.policies: tuple[str, ...] = ckpt.policies
        try:
            self.obs_spec = ObservationSpec.model_validate(ckpt.features["observation"])
            self._set_rule(ckpt.meta.get("default_policy"), float(ckpt.meta.get("margin") or 0.0))
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"{where}: {type(exc).__name__}: {str(exc).splitlines()[0]}") from None

    @classmethod
    def from_weights(cls, weights: Sequence[np.ndarray], policies: Sequence[str], obs_spec: ObservationSpec,
                     default_policy: str | None = None, margin: float = 0.0) -> GeneralPolicy:
        """A policy from in-memory weights (training, tests)."""
        self = cls.__new__(cls)
        ws = [np.asarray(w, np.float32) for w in weights]
        self.layers = list(zip(ws[0::2], ws[1::2], strict=True))
        self.path, self.meta = Path("<weights>"), {}
        self.policies, self.obs_spec = tuple(policies), obs_spec
        self._set_rule(default_policy, margin)
        return self

    def _set_rule(self, default_policy: str | None, margin: float) -> None:
        if default_policy is not None and default_policy not in self.policies:
            raise ValueError(f"{self.path}: default policy {default_policy!r} is not one of {list(self.policies)}")
        self.default_policy, self.margin = default_policy, float(margin)
        self._bonus = np.array([self.margin if p == default_policy else 0.0 for p in self.policies], np.float32)

    def scores(self, local: np.ndarray, per_policy: np.ndarray) -> np.ndarray:
        """Q(s, p) for every policy: (P,) for one state, (B, P) for a batch."""
        return forward(self.layers, scorer_input(local, per_policy))

    def act(self, local: np.ndarray, per_policy: np.ndarray) -> int:
        """The index (into :attr:`policies`) of the highest of score + ``margin`` at the default
        policy (the first on a tie): the checkpoint leaves its default policy (the one of the highest
        mean value in its training data, :mod:`testbed.aset.general`) only where it estimates
        another better by more than the margin (points; chosen on held-out training episodes)."""
        return int(np.argmax(self.scores(local, per_policy) + self._bonus))


class GeneralSelector:
    """The general agent as a selector (:mod:`testbed.agent.selector`'s protocol) of one source:
    its features from the raw window state (``obs.state``), its checkpoint's decision rule."""

    def __init__(self, policy: GeneralPolicy, ctx: FeatureContext):
        self.policy = policy
        self.featurizer = PolicyFeaturizer(ctx, policy.obs_spec)

    def select(self, obs) -> int:
        return self.policy.act(*self.featurizer.observe(obs.state))

    def reset(self) -> None:
        self.featurizer.reset()


def make_selector(ckpt: Checkpoint, setup: SourceSetup) -> GeneralSelector:
    """The ``general`` kind's factory (:func:`testbed.agent.checkpoint.register_kind`).

    Raises:
        CheckpointError: the checkpoint cannot be read as a general one. ValueError: the source is
            beyond a bound (:class:`~testbed.agent.features.FeatureContext`), naming it.
    """
    policy = GeneralPolicy(ckpt)
    return GeneralSelector(policy, FeatureContext(setup.source, setup.options, setup.applications, policy.policies))


register_kind(KIND, make_selector, versions=(VERSION,))


__all__ = ["KIND", "VERSION", "GeneralPolicy", "GeneralSelector", "export_general", "forward", "make_selector"]
