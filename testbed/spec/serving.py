"""Per-cluster inference-server settings (the ``server:`` key of a cluster in an experiment file).

Read by the emulation (passed to :mod:`testbed.serve.server`) and by the simulator, which
models the same queue discipline, admission rule and batching.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from testbed.spec.schema import Num, StrictModel
from testbed.spec.units import parse_delay_ms

Runtime = Literal["tensorflow", "litert"]


class ServerSpec(StrictModel):
    """How a cluster's server runs its models and orders its queue.

    Exact rules: :mod:`testbed.serve.scheduler` (the server implements them, the simulator models them).

    - ``runtime``: ``tensorflow`` (SavedModel signature, a compiled ``tf.function``) or ``litert``
      (``ai-edge-litert`` interpreter on the zoo's ``.tflite``); ``model_runtimes`` overrides it per
      model variant (keys that the cluster does not serve are ignored).
    - ``discipline``: ``fifo`` or ``edf`` (earliest absolute deadline t0 + D_a first; the source
      sends it in the ``X-Testbed-Deadline-Ns`` request header; no deadline = +infinity; ties FIFO).
    - ``admission``: when true, a query with a deadline is rejected at arrival (HTTP 503, reason
      ``admission``; the source records cause ``dropped``) if its expected completion
      ``now + (ahead / workers + 1) x mean service time`` is later than its deadline, where
      ``ahead`` = waiting queries served before it (FIFO: all waiting; EDF: those with a deadline
      <= its own) + busy workers, and the mean service time is the model's profile at the
      cluster's CPU share, batch 1, its runtime. Off by default: a plain bounded queue
      (``queue_limit`` waiting queries; beyond, 503 reason ``queue_full``).
    - ``max_batch`` / ``max_queue_delay_ms``: dynamic batching; a free worker takes the first
      waiting query, then the waiting queries for the same model in discipline order up to
      ``max_batch`` inputs, and if the batch is not full waits for more until
      ``max_queue_delay_ms`` after that first query joined the queue; one model call serves the
      batch. ``max_batch: 1`` (default) disables batching.
    - ``warmup_calls``: inference calls per model at batch 1 (and as many at ``max_batch`` when
      batching) before the server reports ready.
    """

    runtime: Runtime = "tensorflow"
    model_runtimes: dict[str, Runtime] = {}
    discipline: Literal["fifo", "edf"] = "fifo"
    admission: bool = False
    max_batch: int = Field(1, ge=1, le=256)
    max_queue_delay_ms: Num = Field(0.0, ge=0)
    warmup_calls: int = Field(20, ge=0, le=10000)

    unit_keys = (("max_queue_delay", parse_delay_ms, "ms"),)

    def runtime_of(self, model: str) -> Runtime:
        """The runtime that serves ``model``."""
        return self.model_runtimes.get(model, self.runtime)
