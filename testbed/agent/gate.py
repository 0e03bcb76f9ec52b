"""Deviate only with confidence: a bootstrap ensemble of scorers and the gate that decides from it;
the checkpoint kind ``gated`` (:mod:`testbed.agent.checkpoint`).

A gated checkpoint holds B scorers (:func:`testbed.agent.general.forward`, each fitted on a bootstrap
resample of the same data: the general learner with ``general.ensemble``, :mod:`testbed.aset.general`;
``testbed specialize``, :mod:`testbed.aset.specialize`) and a **reference** policy per source: the
general agent's default policy for every source (zero-shot), or a specialized checkpoint's plan
(the per-source static mix found for one experiment). Each member b scores every policy p; the
estimated gain of p over the reference r is ``g_b(p) = Q_b(s, p) - Q_b(s, r)`` (points of success
ratio). The gate leaves the reference for p only when the ensemble's lower bound beats the margin::

    lower(p) = mean_b g_b(p) - z * sd_b g_b(p)   >   margin

(the spread of bootstrap fits estimates the standard error of the fitted gain, Efron and Tibshirani,
"An Introduction to the Bootstrap", 1993, ch. 6; ``z`` = 1.645: a one-sided 95 % bound under a
normal approximation), and then goes to the policy of the highest lower bound. Where the members
disagree (a state unlike the data, or a gain within the labels' noise) the spread is large and the
reference stays. ``margin`` (points) is chosen on the validation scenarios
(``experiments/generated/validation``, :mod:`testbed.aset.gate_margin`), never on those scored.

Inputs of a member: the general scorer's ``[local, row_p, row_p - mean_q row_q]``
(:func:`testbed.agent.features.scorer_input`) and, in a specialized checkpoint (``sources`` set),
a one-hot of the source among the experiment's sources (sorted by name) and a column that is 1 at
the reference policy's row: the experiment's plan differs per source.

The checkpoint (the container's keys, :mod:`testbed.agent.checkpoint`): ``features`` as the
``general`` kind's (observation spec and feature names: other names are refused, retrain);
arrays ``m<b>_w<i>`` (member b's W0, b0, W1, b1, ...); JSON keys ``members``, ``layers``,
``reference`` (one policy name, or source -> policy), ``sources`` (empty: zero-shot, any source),
``margin`` (points) and ``z``. Its selector starts each source on its reference
(``initial_policy``, read by :class:`testbed.agent.live.SourceSelector`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
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
    POLICY_FEATURES,
    FeatureContext,
    scorer_input,
)
from testbed.agent.general import GeneralSelector, forward
from testbed.spec.aset import ObservationSpec

#: The checkpoint kind and the format version this code writes and reads.
KIND, VERSION = "gated", 1
#: The lower bound's z (one-sided 95 %, normal approximation of the bootstrap spread).
Z_95 = 1.645


def input_width(n_sources: int) -> int:
    """A member's input width: the scorer's, plus (specialized: ``n_sources`` > 0) the source
    one-hot and the reference column."""
    return INPUT_SIZE + (n_sources + 1 if n_sources else 0)


def member_inputs(local: np.ndarray, per_policy: np.ndarray, source_index: int | None, n_sources: int,
                  ref: int) -> np.ndarray:
    """The members' inputs for one (source, window): (P, :func:`input_width`) float32."""
    x = scorer_input(local, per_policy)
    if not n_sources:
        return x
    extra = np.zeros((x.shape[0], n_sources + 1), np.float32)
    extra[:, source_index] = 1.0
    extra[ref, n_sources] = 1.0
    return np.concatenate([x, extra], axis=1)


def gain_bounds(q: np.ndarray, ref: int, z: float) -> tuple[np.ndarray, np.ndarray]:
    """(mean, lower bound) of the gain over ``ref`` per policy from member scores ``q`` (B, P):
    ``g = q - q[:, ref]``; lower = mean - z * sd (sd with B - 1 degrees of freedom); both 0 at ``ref``."""
    g = q - q[:, ref:ref + 1]
    mean = g.mean(axis=0)
    sd = g.std(axis=0, ddof=1) if g.shape[0] > 1 else np.zeros_like(mean)
    return mean, mean - z * sd


def gate_choice(lower: np.ndarray, ref: int, margin: float) -> int:
    """The gate: the policy of the highest lower bound if that bound is above ``margin`` (points),
    else ``ref``."""
    lo = np.array(lower, dtype=np.float64)
    lo[ref] = -np.inf
    best = int(np.argmax(lo))
    return best if lo[best] > margin else ref


@dataclass
class SourceActor:
    """A gated policy bound to one source: ``act(local, per_policy) -> policy index``, ``ref`` (its
    reference's index), ``initial`` (the reference's name: the policy before the first decision)."""

    gated: GatedPolicy
    source: str
    index: int | None
    ref: int

    @property
    def initial(self) -> str:
        return self.gated.policies[self.ref]

    @property
    def obs_spec(self) -> ObservationSpec:
        return self.gated.obs_spec

    def bounds(self, local: np.ndarray, per_policy: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(mean gain, lower bound) per policy over the reference, points."""
        g = self.gated
        x = member_inputs(local, per_policy, self.index, len(g.sources), self.ref)
        return gain_bounds(g.member_scores(x), self.ref, g.z)

    def act(self, local: np.ndarray, per_policy: np.ndarray) -> int:
        return gate_choice(self.bounds(local, per_policy)[1], self.ref, self.gated.margin)


class GatedPolicy:
    """A gated checkpoint loaded for acting (module docstring); :meth:`for_source` binds it to a
    source. ``provenance``: how it was made (a specialized one's tuning seeds, plan search, rounds,
    check, costs).

    Args:
        checkpoint: a :class:`~testbed.agent.checkpoint.Checkpoint` of kind ``gated``, or its path.

    Raises:
        CheckpointError: not of kind ``gated``, feature names other than this code's (retrain),
            fewer than 2 members, weights of another input width, or a reference that is not a
            policy; each names the file.
    """

    def __init__(self, checkpoint: Checkpoint | str | Path):
        ckpt = checkpoint if isinstance(checkpoint, Checkpoint) else read_checkpoint(checkpoint)
        where = f"ASET checkpoint {ckpt.path}"
        if ckpt.kind != KIND:
            raise CheckpointError(f"{where}: kind {ckpt.kind!r}, not a gated checkpoint")
        for key, names in (("local_features", LOCAL_FEATURES), ("policy_features", POLICY_FEATURES)):
            if tuple(ckpt.features.get(key) or ()) != names:
                raise CheckpointError(f"{where}: its {key} differ from this testbed's (the features changed): "
                                      f"train or specialize it again")
        m = ckpt.meta
        try:
            n_members, n_layers = int(m["members"]), int(m["layers"])
            members = [[np.asarray(ckpt.arrays[f"m{b}_w{i}"], np.float32) for i in range(2 * n_layers)]
                       for b in range(n_members)]
            self.path = ckpt.path
            self._setup(members, ckpt.policies, ObservationSpec.model_validate(ckpt.features["observation"]),
                        m["reference"], m.get("sources") or (), float(m["margin"]), float(m.get("z", Z_95)),
                        dict(ckpt.provenance))
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"{where}: {type(exc).__name__}: {str(exc).splitlines()[0]}") from None

    @classmethod
    def from_members(cls, members: Sequence[Sequence[np.ndarray]], policies: Sequence[str], obs_spec: ObservationSpec,
                     reference: str | Mapping[str, str], *, sources: Sequence[str] = (), margin: float = 0.0,
                     z: float = Z_95, provenance: Mapping | None = None) -> GatedPolicy:
        """A gated policy from in-memory member weights (flat W0, b0, W1, b1, ... lists)."""
        self = cls.__new__(cls)
        self.path = Path("<members>")
        self._setup([[np.asarray(w, np.float32) for w in m] for m in members], policies, obs_spec, reference,
                    sources, margin, z, dict(provenance or {}))
        return self

    def _setup(self, members: list[list[np.ndarray]], policies: Sequence[str], obs_spec: ObservationSpec,
               reference: str | Mapping[str, str], sources: Sequence[str], margin: float, z: float,
               provenance: dict) -> None:
        where = str(self.path)
        if len(members) < 2:
            raise ValueError(f"{where}: {len(members)} member(s); the gate's lower bound needs at least 2")
        self.policies: tuple[str, ...] = tuple(policies)
        self.sources: tuple[str, ...] = tuple(sources)
        width = input_width(len(self.sources))
        for m in members:
            if m[0].shape[0] != width or m[-2].shape[-1] != 1:
                raise ValueError(f"{where}: a member takes {m[0].shape[0]} inputs, the features give {width}")
        named = [reference] if isinstance(reference, str) else list(dict(reference).values())
        bad = sorted({r for r in named if r not in self.policies})
        if bad:
            raise ValueError(f"{where}: reference {bad} is not among the policies {list(self.policies)}")
        if not isinstance(reference, str) and set(reference) != set(self.sources):
            raise ValueError(f"{where}: the plan names sources {sorted(reference)}, the checkpoint's are "
                             f"{list(self.sources)}")
        if obs_spec.plans is not None:
            raise ValueError(f"{where}: observation.plans is set; the gated observation has no plan block")
        self.weights = [list(m) for m in members]
        self.members = [list(zip(m[0::2], m[1::2], strict=True)) for m in members]
        self.obs_spec = obs_spec
        self.reference = reference if isinstance(reference, str) else dict(reference)
        self.margin, self.z, self.provenance = float(margin), float(z), provenance

    @property
    def specialized(self) -> bool:
        """True for a checkpoint specialized for one experiment's sources (its plan per source)."""
        return bool(self.sources)

    def member_scores(self, x: np.ndarray) -> np.ndarray:
        """Every member's scores of ``x`` (P, width): (B, P)."""
        return np.stack([forward(m, x) for m in self.members])

    def reference_of(self, source: str) -> str:
        """The reference policy of ``source`` (the default, or the plan's).

        Raises:
            ValueError: a specialized checkpoint and a source that is not one of its sources.
        """
        if isinstance(self.reference, str):
            return self.reference
        if source not in self.reference:
            raise ValueError(f"source {source!r} is not one of the sources {list(self.sources)} this checkpoint was "
                             f"specialized for ({self.path}); specialize it for this experiment "
                             f"(testbed specialize EXPERIMENT.yaml)")
        return self.reference[source]

    def for_source(self, source: str) -> SourceActor:
        """The acting object of ``source`` (raises ValueError as :meth:`reference_of`)."""
        ref = self.policies.index(self.reference_of(source))
        return SourceActor(self, source, self.sources.index(source) if self.sources else None, ref)

    def with_margin(self, margin: float) -> GatedPolicy:
        """A copy that gates at ``margin`` (points); members shared."""
        c = object.__new__(GatedPolicy)
        c.__dict__.update(self.__dict__)
        c.margin = float(margin)
        return c

    def export(self, path: str | Path, provenance: Mapping | None = None) -> Path:
        """Write this policy as a ``gated`` checkpoint at ``path`` (without suffix; the container's
        :func:`~testbed.agent.checkpoint.write_checkpoint`); ``provenance`` replaces its own."""
        features = {"observation": self.obs_spec.model_dump(), "local_features": list(LOCAL_FEATURES),
                    "policy_features": list(POLICY_FEATURES)}
        arrays = {f"m{b}_w{i}": w for b, m in enumerate(self.weights) for i, w in enumerate(m)}
        return write_checkpoint(path, kind=KIND, version=VERSION, policies=self.policies, features=features,
                                arrays=arrays, provenance=self.provenance if provenance is None else provenance,
                                members=len(self.weights), layers=len(self.weights[0]) // 2,
                                reference=self.reference, sources=list(self.sources), margin=self.margin, z=self.z)


def export_gated(members: Sequence[Sequence[np.ndarray]], path: str | Path, *, policies: Sequence[str],
                 obs_spec: ObservationSpec, reference: str | Mapping[str, str], sources: Sequence[str] = (),
                 margin: float, z: float = Z_95, provenance: Mapping | None = None) -> Path:
    """Write the ``gated`` checkpoint ``PATH.{npz,json}`` (module docstring) after the checks of
    :meth:`GatedPolicy.from_members`; returns ``PATH``.

    Raises:
        ValueError: fewer than 2 members, input widths, a reference not a policy, a plan whose
            sources are not ``sources``, or an observation spec with plans.
    """
    g = GatedPolicy.from_members(members, policies, obs_spec, reference, sources=sources, margin=margin, z=z,
                                 provenance=provenance)
    return g.export(path)


def set_margin(path: str | Path, margin: float, choice: Mapping) -> None:
    """Rewrite the gated checkpoint at ``path`` with the gate's ``margin`` (points), keeping how it
    was chosen in ``provenance.margin_choice``.

    Raises:
        CheckpointError: not a gated checkpoint.
    """
    g = GatedPolicy(path).with_margin(margin)
    g.export(path, {**g.provenance, "margin_choice": dict(choice)})


class GatedSelector(GeneralSelector):
    """A gated checkpoint as a selector (:mod:`testbed.agent.selector`'s protocol) of one source:
    the general agent's selector (its features from the raw window state) acting through the gate;
    ``initial_policy``: the source's reference (the policy before the first decision)."""

    def __init__(self, actor: SourceActor, ctx: FeatureContext):
        super().__init__(actor, ctx)
        self.initial_policy = actor.initial


def make_selector(ckpt: Checkpoint, setup: SourceSetup) -> GatedSelector:
    """The ``gated`` kind's factory (:func:`testbed.agent.checkpoint.register_kind`).

    Raises:
        CheckpointError: the checkpoint cannot be read as a gated one. ValueError: a specialized
            checkpoint and a source it was not specialized for, or a source beyond a bound
            (:class:`~testbed.agent.features.FeatureContext`), naming it.
    """
    gated = GatedPolicy(ckpt)
    actor = gated.for_source(setup.source)
    return GatedSelector(actor, FeatureContext(setup.source, setup.options, setup.applications, gated.policies))


register_kind(KIND, make_selector, versions=(VERSION,))


__all__ = ["KIND", "VERSION", "Z_95", "GatedPolicy", "GatedSelector", "SourceActor", "export_gated", "gain_bounds",
           "gate_choice", "input_width", "make_selector", "member_inputs", "set_margin"]
