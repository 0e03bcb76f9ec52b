"""A fast discrete-event simulator of the testbed (same plan, policies, records as the emulation).

``from testbed.sim import Simulator`` (see :class:`testbed.sim.engine.Simulator` for the API);
``testbed simulate EXPERIMENT.yaml`` runs one experiment (:func:`simulate`; its run folder and summary:
:func:`testbed.results.runs.run_simulation`).
"""

from testbed.sim.engine import Resolved, ServiceSampler, SimError, Simulator
from testbed.sim.run import SimOutcome, simulate

__all__ = ["Resolved", "ServiceSampler", "SimError", "SimOutcome", "Simulator", "simulate"]
