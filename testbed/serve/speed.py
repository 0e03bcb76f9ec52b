"""An inference server's speed check at start-up: how fast this host runs each model it serves
against the model's profile, and the cluster's scale from it (:mod:`testbed.plan.speeds` has the
rule and what the run does with it).

After its warm-up, and before it binds its socket, the server times each model's bare call with
the models as it serves them (the cluster's runtime and threads per call) with the one timer of
the bare call, :func:`testbed.serve.handling.time_bare_calls`: one input per call, back to back,
about :data:`SPEED_CHECK_S` of CPU and at least :data:`LEAST_CALLS` calls per model; the figure
is the median CPU time per call (a call the machine's other load preempted reads slow: the median
leaves it out), against the profile's median (p50). It runs in the cluster's cgroup, whose CPU
quota the run lifts until the server is ready (:class:`testbed.emu.servers.ClusterServers`): a
call throttled by a quota runs cold after each wait and reads slow (hand_full, face_dual and
mobilenet_v2_100 took 6-14 % more CPU per call under 0.25 core than free on this machine). The
calling thread's CPU time for a LiteRT call on one thread, else the process's (TensorFlow runs a
graph's ops on its own pool threads); a call on t > 1 threads is taken as its CPU time / t (as the
CPU model charges a call, :mod:`testbed.model.cpu`: t CPU-s per s of wall time; a call whose
threads are not all busy reads faster than it is).

It then times :data:`COLD_CALLS` bare calls of each model whose cold call is padded
(:meth:`testbed.plan.speeds.SpeedTarget.times_cold`), each after :data:`ISOLATED_GAP_S` of
sleep (the handling measurement's isolated pass, whose ratio to the warm call is the profile's
cold factor: :func:`testbed.plan.handling_profiles.call_factors`): the median is the model's
``bare_cold_ms``. A call after idleness costs a host more CPU than a back-to-back one (caches and
the idle core cooled down), and by another ratio than it cost the profile's machine (this project's
build VMs: 1.74-1.81x against the profile's 1.56x for digits_large, docs/models-and-servers.md); a
cold call of one input is padded to the profile's cold call x k / s
(:func:`testbed.serve.scheduler.pad_work`), and the ratio says how much room the host leaves it.

A restarted server (a ``cluster_down`` kill, then ``cluster_up``) is given the bare calls of its
first life (``SpeedTarget.measured_ms``, ``measured_cold_ms``) and does not time them again: every
life of a cluster runs at one scale.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from testbed.plan import zoo
from testbed.plan.speeds import ClusterSpeed, SpeedTarget, cluster_speed
from testbed.serve.handling import ISOLATED_GAP_S, bare_calls_for, time_bare_calls

#: CPU time (s) the speed check spends per model (our choice: the bare call's median over about
#: that much CPU repeats within a few % on a quiet host).
SPEED_CHECK_S = 0.25
#: Fewest timed calls per model (resnet50, the zoo's slowest, ~90 ms: about 1 s of CPU).
LEAST_CALLS = 10
#: Bare calls after an idle gap timed per model (our choice: about 1 s of bring-up per model; the
#: median of 10 repeats within a few % on a quiet host).
COLD_CALLS = 10


def measure(target: SpeedTarget, cores: float, zoo_dir: str, models: dict[str, Any]) -> ClusterSpeed:
    """Time the bare call of each of ``models`` (name -> loaded model, warm) unless ``target``
    carries a first life's figures, and apply the rule (:func:`testbed.plan.speeds.cluster_speed`)
    for a cluster of ``cores``.

    Raises:
        testbed.plan.zoo.ZooError: a family's payloads are missing.
        ValueError: a model has no profile figure in ``target``, or a figure is not > 0.
    """
    if target.measured_ms is not None:
        return cluster_speed(target, cores, dict(target.measured_ms), bare_cold_ms=target.measured_cold_ms)
    manifest = zoo.load_manifest(zoo_dir)
    bare: dict[str, float] = {}
    cold: dict[str, float] = {}
    calls: dict[str, int] = {}
    for name, model in models.items():
        x = zoo.load_payloads(zoo_dir, manifest["variants"][name]["family"])[0]
        n = bare_calls_for(target.profile_ms[name], SPEED_CHECK_S, LEAST_CALLS)
        all_threads = getattr(model, "runtime", "") == "tensorflow" or target.threads > 1
        bare[name] = float(np.median(time_bare_calls(model, x, n, all_threads))) / target.threads
        if target.times_cold(name):
            cold[name] = float(np.median(time_bare_calls(model, x, COLD_CALLS, all_threads, ISOLATED_GAP_S)))
        calls[name] = n
    return cluster_speed(target, cores, bare, calls, cold)


__all__ = ["COLD_CALLS", "LEAST_CALLS", "SPEED_CHECK_S", "measure"]
