"""ASET: a deep Q-learning agent that picks the scheduling policy of each dispatcher per window.

``docs/system-model.md``, section "ASET": one agent decision per dispatcher (source) and window ``dt``;
the action indexes the static policy catalogue; the reward is the success ratio of the queries the
dispatcher created in the window, assigned once all of them are resolved. Modules:

- :mod:`testbed.spec.aset`: the ``experiments/aset-*.yaml`` schema (every constant).
- :mod:`testbed.agent.observation`: the ONE feature construction, used by the simulator env, the
  live env and the live selector.
- :mod:`testbed.aset.envs`: Gymnasium environments ``AsetSimEnv`` and ``AsetLiveEnv``.
- :mod:`testbed.aset.agent`: double DQN (TensorFlow/Keras).
- :mod:`testbed.agent.npolicy`: exported weights (.npz + .json) and their numpy forward pass.
- :mod:`testbed.agent.live`: ``LivePolicySelector`` called by the emulation's dispatcher.
- :mod:`testbed.aset.train`, :mod:`testbed.aset.evaluate`: ``testbed train`` / ``testbed evaluate``.
- :mod:`testbed.aset.bench`: decision time per window (``python -m testbed.aset.bench``).

Importing this package does not import TensorFlow (:mod:`testbed.aset.agent` does); it registers
the Gymnasium environment ``testbed/AsetSim-v0`` (:func:`testbed.aset.envs.make_sim_env`)::

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
