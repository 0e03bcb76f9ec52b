"""Every agent as it acts, behind one seam: the selector protocol (:mod:`testbed.agent.selector`:
``select(obs)``, ``reset()``), one checkpoint container with a registry of kinds
(:mod:`testbed.agent.checkpoint`; the built-in kinds :mod:`testbed.agent.general` and
:mod:`testbed.agent.npolicy`), and one resolution and per-source selector for the simulator, the
evaluation and the emulation (:mod:`testbed.agent.live`). The observations:
:mod:`testbed.agent.observation` (plan-based) and :mod:`testbed.agent.features` (the general agent's).
Training and evaluation are in :mod:`testbed.aset`.
"""
