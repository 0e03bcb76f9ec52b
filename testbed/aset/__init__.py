"""ASET's training and evaluation (the agents as they act are in :mod:`testbed.agent`).

``docs/system-model.md``, section "ASET": one agent decision per dispatcher (source) and window; the
action indexes the static policy catalogue. Every agent acts through one seam
(:mod:`testbed.agent.live`: :func:`~testbed.agent.live.resolve_agent`, a checkpoint kind of
:mod:`testbed.agent.checkpoint` or a selector of one's own). Modules:

- :mod:`testbed.aset.evaluate`, :mod:`testbed.aset.jobs`: ``testbed evaluate`` (the protocol, the
  worker jobs, the result cache); :mod:`testbed.aset.headroom`: the mix, the oracle, the causal
  planner; :mod:`testbed.aset.episode`: the one measure of every figure.
- Learners, one file each: :mod:`testbed.aset.general` (the general agent),
  :mod:`testbed.aset.dqn` (the paper's double DQN; imports TensorFlow), :mod:`testbed.aset.rollout`
  (the Q-network regressed on rollout targets).
- :mod:`testbed.aset.envs`: the Gymnasium environment ``testbed/AsetSim-v0``;
  :mod:`testbed.aset.scenarios`: the training scenarios and what the trainers share;
  :mod:`testbed.aset.generator`: generated scenarios; :mod:`testbed.aset.bench`: decision time.

Importing this package does not import TensorFlow; it registers the Gymnasium environment
``testbed/AsetSim-v0`` (:func:`testbed.aset.envs.make_sim_env`)::

    import gymnasium, testbed.aset
    env = gymnasium.make("testbed/AsetSim-v0", experiment="experiments/scenario-bursty.yaml")
"""

ENV_ID = "testbed/AsetSim-v0"


def register_envs() -> None:
    """Register ``testbed/AsetSim-v0`` with Gymnasium (idempotent)."""
    import gymnasium

    if ENV_ID not in gymnasium.registry:
        gymnasium.register(id=ENV_ID, entry_point="testbed.aset.envs:make_sim_env")


register_envs()
