"""The general ASET checkpoint: one scoring network shared by every policy, Q(s, p) = f(local
features, features of what p would do now) (:mod:`testbed.agent.features`), in numpy.

Files: ``NAME.npz`` (the Dense weights ``w0, w1, ...``: W0, b0, W1, b1, ...; the last layer has one
output) and ``NAME.json`` with :data:`FORMAT`, the policy list the network was trained with (score
order), the feature names (:data:`~testbed.agent.features.LOCAL_FEATURES`,
:data:`~testbed.agent.features.POLICY_FEATURES`), the observation spec (window, history, scales,
clip) and the bounds. A checkpoint whose feature names differ from this code's is refused (the
features changed: retrain), never read with shifted columns. Nothing in it names a source, a
cluster or an application, so it drives any experiment within the bounds.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from testbed.agent.features import (
    INPUT_SIZE,
    LOCAL_FEATURES,
    MAX_APPLICATIONS,
    MAX_CLUSTERS,
    MAX_POLICIES,
    POLICY_FEATURES,
    PROBE_QUERIES,
    AppView,
    FeatureContext,
    scorer_input,
)
from testbed.agent.npolicy import policy_files
from testbed.core.clock import EmulatedClock
from testbed.spec.aset import ObservationSpec

#: Format of the general checkpoint's JSON.
FORMAT = "aset-general-v1"


def is_general(path: str | Path) -> bool:
    """True when the checkpoint at ``path`` (without suffix) has a JSON of :data:`FORMAT` (False
    for a missing or unreadable one: the plan-based loader then says what is wrong)."""
    try:
        return json.loads(policy_files(path)[1].read_text()).get("format") == FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def forward(layers: Sequence[tuple[np.ndarray, np.ndarray]], x: np.ndarray) -> np.ndarray:
    """ReLU MLP forward pass; ``x`` (..., INPUT_SIZE) -> (...,) scores (the last layer's one output)."""
    for i, (w, b) in enumerate(layers):
        x = x @ w + b
        if i < len(layers) - 1:
            x = np.maximum(x, 0.0)
    return x[..., 0]


def export_general(weights: Sequence[np.ndarray], path: str | Path, *, policies: Sequence[str],
                   obs_spec: ObservationSpec, meta: dict | None = None, default_policy: str | None = None,
                   margin: float = 0.0) -> Path:
    """Write ``PATH.npz`` and ``PATH.json`` (module docstring); returns the .npz path. The decision
    rule (:meth:`GeneralPolicy.act`) is stored with it: ``default_policy`` (one of ``policies``, or
    None) and ``margin`` (points).

    Raises:
        ValueError: the weights do not take :data:`~testbed.agent.features.INPUT_SIZE` inputs or give
            more than one output, or ``obs_spec`` has plans (the general observation has none).
    """
    ws = [np.asarray(w, np.float32) for w in weights]
    if ws[0].shape[0] != INPUT_SIZE or ws[-1].shape[-1] != 1:
        raise ValueError(f"export {path}: network {ws[0].shape[0]} -> {ws[-1].shape[-1]}, the general scorer is "
                         f"{INPUT_SIZE} -> 1")
    if obs_spec.plans is not None:
        raise ValueError(f"export {path}: observation.plans is set; the general observation has no plan")
    if default_policy is not None and default_policy not in policies:
        raise ValueError(f"export {path}: default policy {default_policy!r} is not one of {list(policies)}")
    npz, meta_file = policy_files(path)
    npz.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(npz, **{f"w{i}": w for i, w in enumerate(ws)})
    meta_file.write_text(json.dumps({
        "format": FORMAT, "policies": list(policies), "local_features": list(LOCAL_FEATURES),
        "policy_features": list(POLICY_FEATURES), "observation": obs_spec.model_dump(), "layers": len(ws) // 2,
        "bounds": {"clusters": MAX_CLUSTERS, "applications": MAX_APPLICATIONS, "policies": MAX_POLICIES,
                   "probe_queries": PROBE_QUERIES}, "default_policy": default_policy, "margin": float(margin),
        "meta": meta or {}}, indent=1))
    return npz


class GeneralPolicy:
    """A general checkpoint loaded for acting: :meth:`scores` and :meth:`act`.

    Raises:
        FileNotFoundError: a file of the pair is missing.
        ValueError: not :data:`FORMAT`, feature names other than this code's (retrain), or weights
            that do not fit them; each names the file.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        npz, meta_file = policy_files(path)
        for f in (npz, meta_file):
            if not f.is_file():
                raise FileNotFoundError(f"ASET checkpoint file {f} is missing")
        try:
            meta = json.loads(meta_file.read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"ASET checkpoint file {meta_file} is unreadable or not JSON: {exc}") from None
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise ValueError(f"{meta_file}: not a general ASET checkpoint (format {FORMAT!r})")
        for key, names in (("local_features", LOCAL_FEATURES), ("policy_features", POLICY_FEATURES)):
            if tuple(meta.get(key) or ()) != names:
                raise ValueError(f"{meta_file}: its {key} differ from this testbed's (the features changed): retrain "
                                 f"with testbed train experiments/aset-general.yaml")
        with np.load(npz, allow_pickle=False) as data:
            ws = [data[f"w{i}"].astype(np.float32) for i in range(2 * int(meta["layers"]))]
        self.layers = list(zip(ws[0::2], ws[1::2], strict=True))
        if self.layers[0][0].shape[0] != INPUT_SIZE:
            raise ValueError(f"{npz}: input width {self.layers[0][0].shape[0]}, the features give {INPUT_SIZE}")
        self.meta = meta
        self.policies: tuple[str, ...] = tuple(meta["policies"])
        self.obs_spec = ObservationSpec.model_validate(meta["observation"])
        self._set_rule(meta.get("default_policy"), float(meta.get("margin") or 0.0))

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
        mean value in its training data, :mod:`testbed.aset.general_train`) only where it estimates
        another better by more than the margin (points; chosen on held-out training episodes)."""
        return int(np.argmax(self.scores(local, per_policy) + self._bonus))




def config_feature_context(cfg, policies: Sequence[str]) -> FeatureContext:
    """The :class:`FeatureContext` of the emulation's source config ``cfg``
    (:class:`testbed.plan.boundaries.SourceConfig`: its options are the plan's, its applications
    those of its workload entries), in emulated time: under time dilation k the config's RTTs,
    service times and deadlines are on the wall clock (x k), and are divided by k here, as the
    window's measured figures are (the source's records), through the config's clock, so that the features are those of
    :func:`plan_feature_context` on the undilated plan.

    Raises:
        ValueError: beyond a bound (:class:`FeatureContext`), naming the source.
    """
    c = EmulatedClock(float(getattr(cfg, "time_dilation", 1.0) or 1.0))
    apps = tuple(AppView(a.name, c.emulated(float(a.deadline_ms)), float(a.min_accuracy), a.family or "")
                 for a in cfg.applications)
    options = tuple(o.option if not c.dilated else replace(o.option, rtt_ms=c.emulated(o.option.rtt_ms),
                                                           service_ms=c.emulated(o.option.service_ms))
                    for o in cfg.options)
    return FeatureContext(cfg.source, options, apps, tuple(policies))


def plan_feature_context(plan, source: str, policies: Sequence[str]) -> FeatureContext:
    """The :class:`FeatureContext` of ``source`` in a :class:`testbed.plan.build.Plan`: the same
    options and applications as :func:`config_feature_context` of the config the emulation gives
    that source (:meth:`testbed.plan.boundaries.SourceConfig.from_plan`).

    Raises:
        ValueError: no workload entry selects ``source``, or beyond a bound, naming the source.
    """
    exp = plan.experiment
    names = {w.application for wi, w in enumerate(exp.workload) if source in plan.weights[wi]}
    apps = tuple(AppView(a.name, float(a.deadline_ms), float(a.min_accuracy), a.family or "")
                 for a in exp.applications if a.name in names)
    return FeatureContext(source, tuple(plan.options(source)), apps, tuple(policies))


__all__ = ["FORMAT", "GeneralPolicy", "config_feature_context", "export_general", "forward", "is_general",
           "plan_feature_context"]
