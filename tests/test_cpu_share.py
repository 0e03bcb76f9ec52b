"""The CPU quota shared by the jobs that run at once (testbed/model/cpu.py, CfsQuota.start / finish /
ends) and the simulator's cluster on it (testbed/sim/clusters.py): exact values.

0.25 core: 25 ms of CPU per 100 ms period, every running job drawing on it at once."""

from __future__ import annotations

import numpy as np
import pytest

from testbed.model import queue as mq
from testbed.model.cpu import CfsQuota
from testbed.model.service import service_figures
from testbed.sim.clusters import BatchSamplers, Cluster, ServiceSampler
from testbed.sim.columns import Queries


def test_jobs_that_overlap_share_the_period_quota():
    # a 20 ms call from 0 and 10 ms of the event loop from 10 ms: at 10 ms 15 ms of quota is left,
    # which both spend together (2 CPU-s per s) by 17.5 ms; each has 2.5 ms to run in the next period
    q = CfsQuota(0.25, handling=True)
    q.start(1, 0.0, 0.020)
    assert q.ends() == {1: pytest.approx(0.020)}  # alone it fits
    q.start(2, 0.010, 0.010, call=False)
    assert q.ends() == {1: pytest.approx(0.1025), 2: pytest.approx(0.1025)}  # the later job moved the call's end
    q.finish(1, 0.1025)
    q.finish(2, 0.1025)
    assert q.run(0.110, 0.005) == pytest.approx(0.115)  # 20 ms of the second period's quota left


@pytest.mark.parametrize("call_ms, job_at_ms, job_ms, job_end_ms, call_end_ms", [
    # a 40 ms call from 0 runs 25 ms, is throttled, and needs 15 ms more from 100 ms; a 2 ms read
    # that comes at 50 ms (throttled) runs at 100 ms beside the call, not after its 15 ms: the
    # period's quota covers both, the call is not delayed
    (40, 50, 2, 102, 115),
    # the call alone would end at 20 ms; a loop job of 12 ms from 5 ms makes both draw on the 20 ms
    # left, spent at 15 ms: the call has 5 ms to go, the loop 2 ms, both from the next period
    (20, 5, 12, 102, 105),
], ids=["a_read_during_a_throttled_call_runs_beside_it", "a_job_started_later_throttles_the_call"])
def test_a_loop_job_beside_a_call(call_ms, job_at_ms, job_ms, job_end_ms, call_end_ms):
    q = CfsQuota(0.25, handling=True)
    q.start(1, 0.0, call_ms / 1e3)
    q.start(2, job_at_ms / 1e3, job_ms / 1e3, call=False)
    ends = q.ends()
    assert ends[2] == pytest.approx(job_end_ms / 1e3)
    assert ends[1] == pytest.approx(call_end_ms / 1e3)


def test_pause_freezes_the_jobs_and_their_quota():
    q = CfsQuota(0.25, handling=True)
    q.start(1, 0.0, 0.010)
    q.pause(0.004, 0.250)  # stopped at 4 ms until 250 ms: 6 ms to run from there, a fresh period's quota
    assert q.ends()[1] == pytest.approx(0.256)


def test_the_cold_rule_counts_running_calls():
    q = CfsQuota(0.5, cold_factor=1.5, workers=2)
    q.start(1, 0.0, 0.010)  # idle before: cold, 15 ms
    assert q.ends()[1] == pytest.approx(0.015)
    q.start(2, 0.005, 0.010)  # a call runs: warm, 10 ms (both fit in the 50 ms of quota)
    assert q.ends() == {1: pytest.approx(0.015), 2: pytest.approx(0.015)}
    q.finish(1, 0.015)
    q.finish(2, 0.015)
    assert q.run(0.015 + 0.021, 0.010) == pytest.approx(0.036 + 0.015)  # idle 21 ms >= 20: cold again
    q.start(3, 0.1, 0.001)
    with pytest.raises(ValueError, match="already running"):
        q.start(3, 0.1, 0.001)


def test_a_sequence_of_calls_is_booked_as_before():
    # one job at a time: the shared flow is the single-thread rule (a call throttled across periods)
    q = CfsQuota(0.25)
    assert q.run(0.0, 0.060) == pytest.approx(0.2 + 0.010)  # 25 + 25 + 10 ms in three periods
    assert q.run(0.210, 0.010) == pytest.approx(0.220)
    assert q.isolated_s(0.060) == pytest.approx(0.210)


def _cluster(handling_ms: float, service_ms: float, t1s: list[float]) -> Queries:
    """One 0.25-core cluster (1 worker, FIFO, the event loop reading each request) fed arrivals
    ``t1s`` (s) with deterministic calls; returns the filled columns."""
    fig = service_figures("m", "litert", 0.25, 1, 1, [service_ms], {1: service_ms}, handling_ms=handling_ms)
    q = Queries()
    n = len(t1s)
    for col in ("t1h", "t2", "t3", "t3h", "t4", "status", "qlen", "batch"):
        setattr(q, col, [None] * n)
    q.cl, q.model, q.t1 = [0] * n, [0] * n, list(t1s)
    q.back, q.dl = [0.0] * n, [float("inf")] * n
    samplers = {0: ServiceSampler.deterministic(service_ms, np.random.default_rng(0))}
    cl = Cluster(q, None, 0, "c", "far_edge", mq.ServerQueue(1, 16), {0: fig}, samplers,
                 BatchSamplers([0], {0: fig}, hooked=samplers))
    cl.add(list(range(n)))
    cl.advance(float("inf"))
    return q


def test_the_simulator_reads_a_request_beside_a_throttled_call():
    # query 0: read 0-2 ms, call 40 ms from 2 ms: 23 ms of quota left, throttled at 25 ms, 17 ms
    # more from 100 ms (ends 117 ms). Query 1 comes at 50 ms: its read runs at 100 ms beside the
    # call (ends 102 ms), not after the call's 17 ms; its call starts when the worker is free
    q = _cluster(2.0, 40.0, [0.0, 0.050])
    assert q.t1h[0] == pytest.approx(0.002)
    assert q.t3[0] == pytest.approx(0.117)
    assert q.t1h[1] == pytest.approx(0.102)
    # at 117 ms 25 - 4 - 15 = 6 ms of quota left: 6 ms, then 25 ms in the next period, 9 ms in the one after
    assert q.t2[1] == pytest.approx(0.117)
    assert q.t3[1] == pytest.approx(0.309)
    assert q.t3h == q.t3  # no CPU to write the answer (answer_ms 0): it leaves as the call ends


def test_the_simulator_reads_a_request_beside_a_running_call_on_the_quota_left():
    # query 1 comes at 10 ms while query 0's call runs (15 ms of the period's quota left): its 2 ms
    # read runs beside the call (both drawing on the quota) and ends at 12 ms, rather than waiting
    # for what the call had not yet spent; the call, which shared 2 ms of quota, ends 2 ms later
    q = _cluster(2.0, 40.0, [0.0, 0.010])
    assert q.t1h[1] == pytest.approx(0.012)
    assert q.t3[0] == pytest.approx(0.119)  # 8 + 2 + 11 ms in the first period, 19 ms from 100 ms
    assert q.t2[1] == pytest.approx(0.119)
    assert q.t3[1] == pytest.approx(0.309)  # 6 ms left at 119 ms, then 25 ms, then 9 ms


@pytest.mark.parametrize("seed", range(6))
def test_the_first_ends_are_those_of_all_ends_to_the_bit(seed):
    # a quota read through next_ends (its flow stops at the first end, a finish there takes the state
    # it reached) and one read through ends (every flow run in full) given the same random jobs:
    # the same first ends, exactly, and the same state after every step
    rng = np.random.default_rng(seed)
    cores, threads = [(0.25, 1), (0.5, 1), (0.5, 2), (1.0, 1)][seed % 4]
    lazy, full = (CfsQuota(cores, threads, workers=3, handling=True) for _ in range(2))
    t, key, checked = 0.0, 0, 0
    for _ in range(400):
        e = full.ends()
        first = min(e.values(), default=None)
        assert lazy.next_ends() == {k: v for k, v in e.items() if v == first}
        checked += len(e) > 1
        u = rng.random()
        if first is not None and u < 0.45:  # the job that ends first ends
            k = min(k for k, v in e.items() if v == first)
            t = first
            for q in (lazy, full):
                q.finish(k, t)
        elif u < 0.5:  # the server is frozen a while
            t2 = t + float(rng.uniform(0.0, 0.15))
            for q in (lazy, full):
                q.pause(t, t2)
            t = t2
        else:  # a job starts before the first end
            t = t + float(rng.uniform(0.0, 0.03)) if first is None else float(rng.uniform(t, first))
            wall, call = float(rng.exponential(0.02)), bool(rng.random() < 0.6)
            for q in (lazy, full):
                q.start(key, t, wall, call)
            key += 1
        assert (lazy._t, lazy._k, lazy._left, lazy._rem) == (full._t, full._k, full._left, full._rem)
    assert checked > 50  # jobs did overlap


def test_the_runner_shortcut_is_taken_only_where_run_would_give_start_plus_wall():
    free = CfsQuota(4.0, threads=1, workers=2)
    assert free.runner(False)(1.0, 0.25) == 1.25 == free.run(1.0, 0.25)
    assert free.runner(True) == free.run  # per-model cold factors: the cold rule needs run's bookkeeping
    for q in (CfsQuota(0.5, threads=1, workers=2), CfsQuota(4.0, workers=2, cold_factor=2.0),
              CfsQuota(2.0, workers=2, handling=True)):
        assert q.runner(False) == q.run, (q.cores, q.cold_factor, q.unlimited)
