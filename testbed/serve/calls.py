"""What a loaded model is to the server and the profiler: the :class:`Model` call, its
:class:`NamedOutputs` (multi-output models) and the warm-up loop. The loaders
(:mod:`testbed.serve.loaders`, :mod:`testbed.serve.graphs`) both build on these.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

import numpy as np


class NamedOutputs(dict):
    """Named output arrays of one model call (TF Serving's multi-output shape), each [N, ...].

    Indexing with a slice slices every array (``out[i:j]``: the outputs of inputs i..j-1), which
    is how the server's scheduler splits a batched call among its queries; a string key gives one
    array as usual.
    """

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, slice):
            return NamedOutputs({k: v[key] for k, v in self.items()})
        return super().__getitem__(key)


class Model(Protocol):
    """What the server and the profiler need from a loaded variant (TensorFlow, LiteRT or a test fake)."""

    name: str
    runtime: str
    input_shape: tuple[int, ...]
    classes: int
    info: dict[str, Any]

    def predict(self, x: np.ndarray) -> np.ndarray | NamedOutputs:
        """Probabilities float32 [N, classes] (or :class:`NamedOutputs`) for inputs float32 [N, *input_shape]."""
        ...


def warm_up(model: Model, x: np.ndarray, calls: int, batch: int) -> float:
    """Run ``calls`` predictions of ``batch`` inputs from ``x`` (cycling through it); return their
    total wall time [ms]."""
    t = time.perf_counter()
    for i in range(calls):
        idx = (np.arange(batch) + i * batch) % len(x)
        model.predict(x[idx])
    return (time.perf_counter() - t) * 1e3


__all__ = ["Model", "NamedOutputs", "warm_up"]
