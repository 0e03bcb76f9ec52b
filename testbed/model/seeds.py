"""The random streams of a run, each named once: one ``numpy.random.Generator`` per stream, seeded
from the run's seed and the stream's place in the plan.

Both engines draw the same quantity from the same stream: a source's arrivals and its ``random``
policy's picks are the same numbers in the emulation (:mod:`testbed.emu.source`) and the simulator
(:mod:`testbed.sim`). A generator is ``numpy.random.default_rng([*key, STREAM, *index])``, where
``key`` is ``[seed]`` for a run (:func:`run_key`) or ``[seed, RESEEDED, *salt]`` for a future
redrawn by :meth:`testbed.sim.engine.Simulator.reseed` (:func:`reseed_key`), and ``index`` the
stream's indices:

=====================  ======  ====================================================  ============
stream                 number  index                                                 drawn by
=====================  ======  ====================================================  ============
:func:`arrivals`       1       (workload entry, source index); reseeded: (stream k)  both engines
:func:`service`        2       (cluster index, model index)                          simulator
:func:`dispatcher`     3       (source index)                                        both engines
:func:`batch_service`  4       (cluster index, model index, batch size)              simulator
:func:`loss`           5       (source index)                                        simulator
:func:`payloads`       -       ``[seed, source index]``: which request body to send  emulation
=====================  ======  ====================================================  ============

Indices: a source's index is its place in the plan's sources (:attr:`testbed.plan.resolved.Plan.sources`),
a cluster's in the plan's clusters, a model's in the sorted model names of the plan, a workload
entry's in the experiment's ``workload`` list, a reseeded stream k's in the simulator's arrival
streams (workload entries in order, each entry's sources in the plan's weight order). Keys are
lists of non-negative integers (numpy's ``SeedSequence`` entropy).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

ARRIVALS, SERVICE, DISPATCHER, BATCH_SERVICE, LOSS = 1, 2, 3, 4, 5
#: The key element that marks a reseeded future: ``[seed, RESEEDED, *salt]``.
RESEEDED = 9

Key = Sequence[int]


def run_key(seed: int) -> list[int]:
    """The key of a run's streams: ``[seed]``."""
    return [int(seed)]


def reseed_key(seed: int, salt: Sequence[int]) -> list[int]:
    """The key of a future redrawn with ``salt`` (common random numbers across clones):
    ``[seed, RESEEDED, *salt]``."""
    return [int(seed), RESEEDED, *(int(x) for x in salt)]


def _rng(key: Key, stream: int, *index: int) -> np.random.Generator:
    return np.random.default_rng([*key, stream, *index])


def arrivals(key: Key, workload_index: int, source_index: int) -> np.random.Generator:
    """The arrival times of one (workload entry, source) stream, at a run's start."""
    return _rng(key, ARRIVALS, workload_index, source_index)


def reseeded_arrivals(key: Key, stream_index: int) -> np.random.Generator:
    """The arrival times of the simulator's stream ``stream_index`` in a reseeded future
    (``key`` from :func:`reseed_key`)."""
    return _rng(key, ARRIVALS, stream_index)


def service(key: Key, cluster_index: int, model_index: int) -> np.random.Generator:
    """The unthrottled service times of one (cluster, model) at batch 1 (the simulator's draws)."""
    return _rng(key, SERVICE, cluster_index, model_index)


def batch_service_prefix(key: Key, cluster_index: int) -> list[int]:
    """The key prefix of one cluster's batched service streams; :func:`batch_service` completes it."""
    return [*key, BATCH_SERVICE, cluster_index]


def batch_service(prefix: Key, model_index: int, batch: int) -> np.random.Generator:
    """The service times of one cluster's calls of ``model_index`` on ``batch`` inputs (``prefix``
    from :func:`batch_service_prefix`)."""
    return np.random.default_rng([*prefix, model_index, batch])


def dispatcher(key: Key, source_index: int) -> np.random.Generator:
    """A source's dispatcher: the ``random`` policy's picks (and any stateful policy's draws)."""
    return _rng(key, DISPATCHER, source_index)


def loss(key: Key, source_index: int) -> np.random.Generator:
    """Whether a message of a source's queries is lost on a lossy path (the simulator's draws)."""
    return _rng(key, LOSS, source_index)


def payloads(seed: int, source_index: int) -> np.random.Generator:
    """Which of its application's request bodies an emulated source sends with each query."""
    return np.random.default_rng([int(seed), source_index])


__all__ = ["ARRIVALS", "BATCH_SERVICE", "DISPATCHER", "LOSS", "RESEEDED", "SERVICE", "Key", "arrivals", "batch_service",
           "batch_service_prefix", "dispatcher", "loss", "payloads", "reseed_key", "reseeded_arrivals", "run_key",
           "service"]
