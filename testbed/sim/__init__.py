"""A fast discrete-event simulator of the testbed (same plan, policies, records as the emulation).

``from testbed.sim import Simulator`` (see :class:`testbed.sim.engine.Simulator` for the API);
``testbed simulate EXPERIMENT.yaml`` runs one experiment (:func:`simulate_experiment`).
"""

from testbed.sim.engine import Resolved, ServiceSampler, SimError, Simulator
from testbed.sim.run import simulate_experiment

__all__ = ["Resolved", "ServiceSampler", "SimError", "Simulator", "simulate_experiment"]
