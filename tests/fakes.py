"""Fakes for the pure-logic tests (imported by them; pytest puts ``tests/`` on ``sys.path``)."""

from __future__ import annotations

import time

import numpy as np


class SpinModel:
    """A model whose call burns ``ms`` of the calling thread's CPU time (a busy loop, no sleep),
    then answers zeros of shape (batch, 2). ``runtime``: the runtime it stands for."""

    runtime = "litert"

    def __init__(self, ms: float):
        self.ms = ms

    def predict(self, x):
        t = time.thread_time()
        while time.thread_time() - t < self.ms / 1e3:
            pass
        return np.zeros((len(x), 2), dtype=np.float32)
