"""Policies, resolved by the policy registry when an experiment or an ASET config is used.

The experiment and ASET files (:mod:`testbed.spec`) hold a policy as a name string and know no
list of policies: the list is the registry of :mod:`testbed.model.policies` (one
``@register_policy`` entry per policy), which the spec layer cannot import. The names are resolved
here, once, with an error that names the item (``sources.atl.policy``, ``actions``,
``reward.baseline_mix.triangle``), the known policies and a close match. A plug-in
(:mod:`testbed.core.plugins`: an entry-point name, ``package.module:callable``, with parameters or
not) is loaded and checked here, at plan time (:func:`testbed.plan.policy_plugins.plugin_policy`: its
signature, its declared properties, calls on a synthetic option list); a failure is a plan error
that names the item, the plug-in and what to fix:

- :func:`check_policy`: one name (the experiment's ``aset`` is accepted where a source's policy may be it);
- :func:`check_experiment_policies`: the experiment's ``policy`` and every source's (called by
  :func:`testbed.plan.build.build_plan`);
- :func:`check_aset_policies`: every policy name of an ASET config (``actions``, the reward's
  baselines, the observation's plans); :func:`load_aset` loads a config for use and checks them;
- :func:`aset_actions`: the action set of an ASET config (its ``actions``, or the whole catalogue).

Every error is an :class:`testbed.core.errors.InputError` (exit code 2).
"""

from __future__ import annotations

from pathlib import Path

from testbed.core.errors import InputError, naming_file
from testbed.core.registry import UnknownNameError
from testbed.model.policies import CATALOGUE, REGISTRY
from testbed.plan.resolved import PlanError
from testbed.spec.aset import AsetConfig, load_aset_config
from testbed.spec.experiment import ASET_POLICY, ConfigError, Experiment


def check_policy(name: str, item: str, *, aset: bool = False) -> str:
    """``name`` when it is a registered policy or a plug-in that resolves and passes its checks (or
    :data:`~testbed.spec.experiment.ASET_POLICY` with ``aset``).

    Args:
        name: the policy as written (its string form, :data:`testbed.spec.experiment.PolicyName`).
        item: where it was written, for the message (e.g. ``sources.atl.policy``).
        aset: ``aset`` is accepted too (a source's policy may be ASET's).

    Raises:
        PlanError: not a policy: ``<item>: unknown policy 'x'; known: closest, ... (did you mean 'y'?)``;
            or a plug-in that cannot be used: ``<item>: policy 'mypkg.sched:p2c' (...): <what to fix>``.
    """
    if name in REGISTRY or (aset and name == ASET_POLICY):
        return name
    try:
        REGISTRY.resolve(name, item)
    except UnknownNameError:
        raise PlanError(str(REGISTRY.unknown(name, item, extra=(ASET_POLICY,) if aset else ()))) from None
    except InputError as exc:
        raise PlanError(str(exc)) from None
    return name


def check_experiment_policies(exp: Experiment) -> None:
    """The experiment's ``policy`` and each source's ``policy`` (``sources.<name>.policy``) name a
    registered policy or ``aset``.

    Raises:
        PlanError: as :func:`check_policy`, naming the first unknown one.
    """
    check_policy(exp.policy, "policy", aset=True)
    for s in exp.sources:
        if s.policy is not None:
            check_policy(s.policy, f"sources.{s.name}.policy", aset=True)


def decision_costs(exp: Experiment) -> dict[str, float]:
    """The decision cost (ms) the simulator charges per decision of each policy the experiment's
    sources use (the plan's ``decision_ms``): :attr:`testbed.model.policies.Policy.decision_ms`, 0 for
    a built-in policy, the median of a plug-in's plan-time check calls for a plug-in. ``aset`` is
    left out (the policies it switches to are looked up when it does).

    Raises:
        PlanError: as :func:`check_policy`.
    """
    names = {exp.policy} | {s.policy for s in exp.sources if s.policy is not None}
    return {n: REGISTRY.resolve(n).decision_ms for n in sorted(names) if n != ASET_POLICY}


def _aset_names(cfg: AsetConfig) -> list[tuple[str, list[str]]]:
    """(item, the policy names it lists) for every place of an ASET config that names policies."""
    named = [("actions", list(cfg.actions or [])),
             ("reward.baseline", [cfg.reward.baseline] if cfg.reward.baseline else [])]
    named += [(f"reward.baseline_mix.{k}", list(v)) for k, v in (cfg.reward.baseline_mix or {}).items()]
    named += [(f"observation.plans.{k}", list(v)) for k, v in (cfg.observation.plans or {}).items()]
    return named


def check_aset_policies(cfg: AsetConfig) -> AsetConfig:
    """Every policy an ASET config names (``actions``, ``reward.baseline``,
    ``reward.baseline_mix.<scenario>``, ``observation.plans.<scenario>``) is registered or a plug-in
    that resolves (:func:`check_policy`); returns ``cfg``.

    Raises:
        ConfigError: ``<item>: unknown policy 'x'; known: ...`` for the first unknown name, or the
            plug-in's error naming the item.
    """
    for item, names in _aset_names(cfg):
        for name in names:
            try:
                REGISTRY.resolve(name, item)
            except InputError as exc:
                raise ConfigError(str(exc)) from None
    return cfg


def aset_actions(cfg: AsetConfig) -> tuple[str, ...]:
    """ASET's action set, in action-index order: the config's ``actions``, or every registered
    policy (:data:`testbed.model.policies.CATALOGUE`, registration order).

    Raises:
        ConfigError: an action is not a registered policy.
    """
    check_aset_policies(cfg)
    return tuple(cfg.actions or CATALOGUE)


def load_aset(path: str | Path) -> tuple[AsetConfig, Path]:
    """:func:`testbed.spec.aset.load_aset_config` (the config and its base folder) with its policy
    names checked (:func:`check_aset_policies`): an ASET config loaded for use.

    Raises:
        ConfigError: as ``load_aset_config``, or an unknown policy (the message led by ``path``).
    """
    cfg, base = load_aset_config(path)
    try:
        check_aset_policies(cfg)
    except ConfigError as exc:
        raise naming_file(exc, path) from None
    return cfg, base


__all__ = ["aset_actions", "check_aset_policies", "check_experiment_policies", "check_policy", "decision_costs",
           "load_aset"]
