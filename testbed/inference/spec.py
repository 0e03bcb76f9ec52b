"""Per-cluster inference-server settings (the ``server:`` key of a cluster in an experiment file).

Read by the emulation (passed to :mod:`testbed.inference.server`) and by the simulator, which
models the same queue discipline, admission rule and batching.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from testbed.schema import Num, StrictModel, unit_pair
from testbed.units import parse_delay_ms

Runtime = Literal["tensorflow", "litert"]


class ServerSpec(StrictModel):
    """How a cluster's server runs its models and orders its queue.

    - ``runtime``: ``tensorflow`` (SavedModel through a compiled ``tf.function``) or ``litert``
      (``ai-edge-litert`` interpreter); ``model_runtimes`` overrides it per model variant.
    - ``discipline``: ``fifo`` or ``edf`` (earliest absolute deadline t0 + D_a first; the source
      sends it in the ``X-Testbed-Deadline-Ns`` request header).
    - ``admission``: when true, a query is rejected at arrival (HTTP 503, cause ``dropped``) if its
      expected completion, (queries ahead of it / workers + 1) x mean service time, is later than
      its deadline. Off by default: a plain bounded queue.
    - ``max_batch`` / ``max_queue_delay_ms``: dynamic batching; a worker takes up to ``max_batch``
      queued queries for one model, waiting at most ``max_queue_delay_ms`` for the batch to fill.
      ``max_batch: 1`` (default) disables batching.
    - ``warmup_calls``: inference calls per model (and batch size) before the server reports ready.
    """

    runtime: Runtime = "tensorflow"
    model_runtimes: dict[str, Runtime] = {}
    discipline: Literal["fifo", "edf"] = "fifo"
    admission: bool = False
    max_batch: int = Field(1, ge=1, le=256)
    max_queue_delay_ms: Num = Field(0.0, ge=0)
    warmup_calls: int = Field(20, ge=0, le=10000)

    @model_validator(mode="before")
    @classmethod
    def _units(cls, data: Any) -> Any:
        return unit_pair(data, "max_queue_delay", parse_delay_ms, "ms")

    def runtime_of(self, model: str) -> Runtime:
        """The runtime that serves ``model``."""
        return self.model_runtimes.get(model, self.runtime)
