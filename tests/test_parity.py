"""Parity: the simulator and the inference server run the same model and decide the same.

One scripted trace (server arrival times, deadlines, models, service time of the k-th model
call) goes through both adapters of :class:`testbed.model.queue.ServerQueue`:

* the simulator (:class:`testbed.sim.Simulator`, virtual clock), on a plan whose only source sits
  at its only cluster's switch, the arrivals given as trace workloads;
* the inference server's :class:`testbed.serve.scheduler.Scheduler` with its real worker
  threads, driven on a scripted clock by a harness that releases each model call at its scripted
  end (the fake model blocks until then), one event at a time.

Asserted per query: admitted or refused (and why), the start order, start and end times, the
batch it was served in, and the outcome and cause of its record. Cases: FIFO and EDF, with and
without batching, with and without admission (the EDF + admission case is the one whose drift
the issue found). A second test holds the dispatcher step to the same parity: the state the
simulator's report gives and the state a source hears from the server's ``/v1/stats`` lead to the
same decisions.
"""

from __future__ import annotations

import math
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from testbed.model.records import make_record
from testbed.plan.build import build_plan
from testbed.plan.catalog import FixedCatalog
from testbed.serve.scheduler import Job, Scheduler
from testbed.sim import ServiceSampler, Simulator
from testbed.spec.experiment import Experiment

REPO = Path(__file__).resolve().parent.parent
#: Two models: "fast" (accuracy 0.9, 4 ms planned) and "good" (0.96, 7 ms planned).
CATALOG = FixedCatalog({"fast": ("digits", 0.9, [4.0]), "good": ("digits", 0.96, [7.0])})
#: Arrivals (s since the load starts) per application: a burst that queues, then a gap, then another.
TRACE = {"tight": [0.100, 0.101, 0.102, 0.1035, 0.105, 0.1062, 0.300, 0.3001, 0.3002, 0.3004, 0.3006],
         "loose": [0.1005, 0.1015, 0.1025, 0.104, 0.3003, 0.3005, 0.3007, 0.3008]}


def _service_script(n: int = 64) -> list[float]:
    """The scripted unthrottled time (ms) of the k-th model call, whatever its model or batch."""
    return [3.0 + (7 * k) % 5 for k in range(n)]


def _plan(tmp_path: Path, server: dict) -> object:
    for app, ts in TRACE.items():
        pd.DataFrame({"t_s": ts}).to_csv(tmp_path / f"{app}.csv", index=False)
    exp = Experiment.model_validate({
        "name": "parity", "duration": "1s", "seed": 3, "policy": "closest", "report_interval": "50ms",
        "topology": {"source": str(REPO / "topologies/triangle.yaml")},
        "clusters": [{"name": "c", "site": "B", "tier": "far_edge", "cpu_cores": 2, "workers": 2,
                      "queue_limit": 5, "models": ["fast", "good"], "server": server}],
        "sources": [{"name": "src", "site": "B"}],
        "applications": [{"name": "tight", "deadline": "25ms", "min_accuracy": 0.8},
                         {"name": "loose", "deadline": "60ms", "min_accuracy": 0.95}],
        "workload": [{"application": app, "process": "trace", "trace": str(tmp_path / f"{app}.csv")}
                     for app in TRACE]})
    return build_plan(exp, base_dir=tmp_path, catalog=CATALOG)


def _simulate(plan) -> pd.DataFrame:
    script = iter(_service_script())
    sampler = ServiceSampler(5.0, 7.0, lambda rng, n: [next(script) for _ in range(n)], np.random.default_rng(0),
                             block=1)
    sim = Simulator(plan, seed=3, service=lambda cluster, model: sampler)
    sim.run_until(2.0)
    qt = sim.query_table().sort_values("t1_s", kind="stable").reset_index(drop=True)
    qt["deadline_s"] = qt.t0_s + np.where(qt.application == "tight", 0.025, 0.060)
    qt["back_s"] = [sim.back_s[0][0]] * len(qt)
    return qt


class _Gate:
    """A fake model: ``predict`` records the call and blocks until the harness releases it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: list[dict] = []  # {"tags", "t2", "release": Event}
        self.active = 0

    def predict(self, x: np.ndarray) -> np.ndarray:
        call = {"tags": [int(v) for v in x[:, 0]], "release": threading.Event(), "returned": threading.Event()}
        with self.lock:
            self.calls.append(call)
            self.active += 1
        call["release"].wait(30)
        with self.lock:
            self.active -= 1
        call["returned"].set()
        return np.zeros((len(x), 2), np.float32)


class _Clock:
    def __init__(self) -> None:
        self.ns = 0

    def __call__(self) -> int:
        return self.ns


def _serve(plan, qt: pd.DataFrame) -> dict[int, dict]:
    """Replay the simulator's server arrivals through the real Scheduler on a scripted clock."""
    spec = plan.experiment.clusters[0]
    srv = spec.server
    gate, clock = _Gate(), _Clock()
    sched = Scheduler({"fast": gate, "good": gate}, workers=spec.workers, queue_limit=spec.queue_limit,
                      discipline=srv.discipline, admission=srv.admission, max_batch=srv.max_batch,
                      max_queue_delay_ms=srv.max_queue_delay_ms,
                      service_ms={m: f.busy_mean_ms for m, f in plan.services["c"].items()}, clock_ns=clock)
    sched.start()
    script = _service_script()
    out: dict[int, dict] = {}
    ends: list[tuple[int, int]] = []  # (end ns, call index)

    def quiet() -> None:
        """Wait until every worker is in a model call or idle with nothing to take now."""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with sched.cond, gate.lock:  # nobody between states, and nothing a free worker should take now
                if gate.active + sched.idle == spec.workers and not sched._ready \
                        and sched.queue.due(clock.ns / 1e9) > clock.ns / 1e9:
                    break
            time.sleep(0.001)
        else:
            pytest.fail("the scheduler did not settle")
        with gate.lock:
            for k, call in enumerate(gate.calls):
                if "t2" not in call:
                    call["t2"] = clock.ns
                    ends.append((clock.ns + int(script[k] * 1e6), k))
                    for tag in call["tags"]:
                        out[tag].update(t2=clock.ns, batch=len(call["tags"]), call=k)

    arrivals = [(int(round(r.t1_s * 1e9)), i) for i, r in qt.iterrows()]
    ai = 0
    try:
        while True:
            quiet()
            with sched.cond:
                waiting = len(sched.queue)
            if ai == len(arrivals) and not ends and not waiting:
                break
            t_arr = arrivals[ai][0] if ai < len(arrivals) else None
            with sched.cond:
                due = sched.queue.due(clock.ns / 1e9)
            t_due = None if due == float("inf") else int(round(due * 1e9))
            t_end = min(ends)[0] if ends else None
            nxt = min(t for t in (t_arr, t_due, t_end) if t is not None)
            clock.ns = max(clock.ns, nxt)
            if t_end is not None and t_end <= nxt:  # a call ends (first at equal times, as in the simulator)
                ends.sort()
                _, k = ends.pop(0)
                for tag in gate.calls[k]["tags"]:
                    out[tag]["t3"] = clock.ns
                gate.calls[k]["release"].set()
                assert gate.calls[k]["returned"].wait(10)
            elif t_due is not None and t_due <= nxt:  # the batching timer
                with sched.cond:
                    sched.cond.notify_all()
            else:
                i = arrivals[ai][1]
                ai += 1
                r = qt.loc[i]
                job = Job(model=r.model, x=np.full((1, 1), i, np.float32), deadline_ns=int(round(r.deadline_s * 1e9)))
                refused = sched.submit(job)
                out[i] = {"refused": None if refused is None else refused[0]}
    finally:
        for call in gate.calls:
            call["release"].set()
        sched.stop(5)
    return out


CASES = [
    pytest.param({"discipline": "fifo"}, id="fifo"),
    pytest.param({"discipline": "edf"}, id="edf"),
    pytest.param({"discipline": "fifo", "admission": True}, id="fifo-admission"),
    pytest.param({"discipline": "edf", "admission": True}, id="edf-admission"),
    pytest.param({"discipline": "fifo", "max_batch": 3, "max_queue_delay": "1.7ms"}, id="fifo-batching"),
    pytest.param({"discipline": "edf", "max_batch": 3, "max_queue_delay": "1.7ms", "admission": True},
                 id="edf-batching-admission"),
]


@pytest.mark.parametrize("server", CASES)
def test_simulator_and_server_decide_the_same(server, tmp_path):
    plan = _plan(tmp_path, server)
    qt = _simulate(plan)
    assert len(qt) == sum(len(v) for v in TRACE.values())
    srv = _serve(plan, qt)
    refused_somewhere = False
    for i, r in qt.iterrows():
        s = srv[i]
        if r.status == 503:
            refused_somewhere = True
        assert (s["refused"] is not None) == (r.status == 503), (i, s, r.to_dict())
        if s["refused"] is None:  # same start and end, to the ns (floats vs integers: 2 ns of rounding)
            assert abs(s["t2"] - r.t2_s * 1e9) <= 2, (i, "start", s, r.to_dict())
            assert abs(s["t3"] - r.t3_s * 1e9) <= 2, (i, "end", s, r.to_dict())
            assert s["batch"] == r.batch, (i, "batch", s, r.to_dict())
    # start order: the same sequence of model calls and who was in each
    started = qt.dropna(subset=["t2_s"])
    sim_calls = [sorted(g.index) for _, g in started.groupby(["t2_s", "t3_s"], sort=True)]
    srv_calls = {}
    for i, s in srv.items():
        if s["refused"] is None:
            srv_calls.setdefault(s["call"], []).append(i)
    assert [sorted(v) for _, v in sorted(srv_calls.items())] == sim_calls
    # outcome and cause of each record, built by the same rule from each engine's times
    for i, r in qt.iterrows():
        s = srv[i]
        d_ms = (r.deadline_s - r.t0_s) * 1e3
        base = dict(query_id=str(i), source="src", application=r.application, cluster="c", model=r.model,
                    policy="closest", fallback=False, deadline_ms=d_ms, min_accuracy=0.5, model_accuracy=0.9,
                    expected_rtt_ms=0.0, t0_ns=int(round(r.t0_s * 1e9)), td_ns=int(round(r.td_s * 1e9)))
        if s["refused"] is None:  # the harness has no event loop: the server reads and writes at once
            t4 = s["t3"] + int(round(r.back_s * 1e9))
            rec_srv = make_record(**base, status=200, t1_ns=int(round(r.t1_s * 1e9)), t1h_ns=int(round(r.t1_s * 1e9)),
                                  t2_ns=s["t2"], t3_ns=s["t3"], t3h_ns=s["t3"], t4_ns=t4)
        else:
            rec_srv = make_record(**base, status=503, t4_ns=int(round((r.t1_s + r.back_s) * 1e9)),
                                  drop_reason=s["refused"])
        st = int(r.status)
        def ns(v: float) -> int | None:
            return None if pd.isna(v) else int(round(v * 1e9))

        rec_sim = make_record(**base, status=st, t1_ns=ns(r.t1_s), t1h_ns=ns(r.t1h_s), t2_ns=ns(r.t2_s),
                              t3_ns=ns(r.t3_s), t3h_ns=ns(r.t3h_s), t4_ns=ns(r.t4_s), drop_reason=s["refused"] or "")
        assert (rec_srv["outcome"], rec_srv["failure_cause"]) == (rec_sim["outcome"], rec_sim["failure_cause"]), i
        for col in ("e2e_ms", "dispatch_ms", "network_ms", "handling_ms", "queueing_ms", "inference_ms"):
            a, b = rec_srv.get(col), rec_sim.get(col)  # the same time columns, to the us (ns rounding)
            assert (a is None) == (b is None) and (a is None or abs(a - b) <= 0.002), (i, col, a, b)
    if server.get("admission") or server.get("discipline") == "fifo" and "max_batch" not in server:
        assert refused_somewhere, "the trace should refuse something in this case"


def test_reported_state_gives_the_same_decisions(tmp_path):
    """The simulator's report of a cluster and the server's /v1/stats of the same queue state give
    a dispatcher the same view, hence the same decision, for every policy."""
    from testbed.emu.source import heard_from_stats
    from testbed.model.dispatch import Dispatcher, OptionSpec
    from testbed.model.policies import CATALOGUE, DETERMINISTIC

    plan = _plan(tmp_path, {"discipline": "fifo"})
    gate = _Gate()
    sched = Scheduler({"fast": gate, "good": gate}, workers=2, queue_limit=5)
    sched.start()
    try:
        for i in range(4):  # two in service, two waiting
            assert sched.submit(Job(model="fast", x=np.full((1, 1), i, np.float32))) is None
        deadline = time.monotonic() + 5
        while gate.active < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        stats = sched.snapshot()
    finally:
        for call in gate.calls:
            call["release"].set()
        sched.stop(5)
    sim = Simulator(plan, seed=1, service=lambda c, m: ServiceSampler.deterministic(50.0, np.random.default_rng(0)))
    cl = sim.clusters[0]
    for _ in range(4):
        sim.q.t0.append(0.0)
        sim.q.td.append(0.0)
    for col in (sim.q.src, sim.q.app, sim.q.cl, sim.q.pol):
        col.extend([0] * 4)
    sim.q.model.extend([sim.model_index["fast"]] * 4)
    sim.q.dl.extend([1.0] * 4)
    sim.q.t1.extend([0.0] * 4)
    sim.q.back.extend([0.0] * 4)
    for col in (sim.q.t1h, sim.q.t2, sim.q.t3, sim.q.t3h, sim.q.t4, sim.q.status, sim.q.qlen, sim.q.batch):
        col.extend([None] * 4)
    for i in range(4):
        cl.add([i])
    cl.advance(0.001)
    heard_sim = cl.snapshot(0.001, 0.05)
    heard_srv = heard_from_stats(stats, 2, heard_sim.utilization, 0.001)
    assert (heard_sim.queue_len, heard_sim.busy, heard_sim.workers, heard_sim.up) == \
        (heard_srv.queue_len, heard_srv.busy, heard_srv.workers, heard_srv.up) == (2, 2, 2, True)
    specs = [OptionSpec("c", m, 1.0, f.expected_ms, f.busy_mean_ms, plan.models[m].accuracy, "far_edge", 2)
             for m, f in plan.services["c"].items()] + [
        OptionSpec("far", "fast", 20.0, 4.0, 4.0, 0.9, "cloud", 2)]
    for policy in CATALOGUE:
        a = Dispatcher(specs, policy, np.random.default_rng(7))
        b = Dispatcher(specs, policy, np.random.default_rng(7))
        a.hear_all([("c", heard_sim)])
        b.hear("c", heard_srv)
        da = [a.decide(25.0, 0.8, now_s=0.001 + 0.02 * k) for k in range(5)]  # reports aging (age_aware)
        db = [b.decide(25.0, 0.8, now_s=0.001 + 0.02 * k) for k in range(5)]
        assert da == db, policy
        if policy in DETERMINISTIC:
            assert len(set(da)) == 1


# --------------------------------------------------------------------------- one plan, one model, both engines

@pytest.fixture(scope="module", params=["triangle", "default"])
def shipped(request):
    from testbed.plan.build import plan_experiment

    return plan_experiment(REPO / "experiments" / f"{request.param}.yaml")


def test_a_source_gets_the_same_options_and_random_streams_in_both_engines(shipped, tmp_path):
    """The emulated source (its SourceConfig, as the run writes it, and the Source it builds) and the
    simulator's dispatcher of the same source: the same option list and the same generators (the
    streams of testbed.model.seeds, keyed alike)."""
    from testbed.emu.source import Source
    from testbed.model import seeds
    from testbed.model.arrivals import make_process
    from testbed.plan.boundaries import SourceConfig

    plan = shipped
    sim = Simulator(plan)
    for si, host in enumerate(plan.sources):
        cfg = SourceConfig.from_plan(plan, host.name, start_ns=0, duration_s=plan.experiment.duration_s,
                                     run_dir=tmp_path)
        if cfg is None:
            continue
        (tmp_path / "sources").mkdir(exist_ok=True)
        d = sim.dispatchers[sim.src_index[host.name]]
        assert cfg.source_index == si and cfg.seed == sim.seed
        assert [o.option for o in cfg.options] == d.specs == plan.options(host.name)
        for ci, c in enumerate(sim.clusters):  # expected_rtt_ms: the same timeline of the path in force
            assert cfg.rtt_steps[c.name] == [(t, None if math.isinf(r) else r) for t, r in sim.rtt_steps[si][ci]]
        assert sim.decision_s[sim.policy_names.index(d.policy)] == plan.decision_ms.get(d.policy, 0.0) / 1e3
        src = Source(cfg)
        try:
            assert src.dispatcher.specs == d.specs and src.dispatcher.policy == d.policy
            assert src.dispatcher.ctx.rng.bit_generator.state == d.ctx.rng.bit_generator.state
        finally:
            src.out.close()
        fresh = Simulator(plan)  # its arrival streams not yet drawn: one per (workload entry, source), in order
        keys = [(wi, s) for wi in range(len(plan.experiment.workload)) for s in plan.weights[wi]]
        procs = dict(zip(keys, (proc for _, _, proc in fresh.streams), strict=True))
        for st in cfg.streams:  # the emulated source's arrival process, built as its _arrivals does
            mine = make_process(st.spec, seeds.arrivals(seeds.run_key(cfg.seed), st.index, cfg.source_index),
                                st.weight, Path(cfg.base_dir))
            np.testing.assert_array_equal(mine.times(0.0, 3.0), procs[(st.index, host.name)].times(0.0, 3.0))


def test_the_plan_the_model_and_the_controller_route_alike(shipped):
    """Every (source, cluster) path: the plan's expected path, the model's route (the simulator's),
    and the path the controller's trees give (built from the ControllerConfig the run hands the Ryu
    app, as the app does: testbed.model.routing on DPIDs)."""
    from testbed.model import routing
    from testbed.plan.boundaries import ControllerConfig

    plan = shipped
    cfg = ControllerConfig.from_plan(plan, {h.name: k for k, h in enumerate(plan.hosts, start=1)})
    graph = routing.build_graph([(lk.a, lk.b, lk.delay_ms) for lk in cfg.links], nodes=[s.dpid for s in cfg.switches])
    trees = routing.all_trees(graph, sorted({h.dpid for h in cfg.hosts}))
    name = {s.dpid: s.name for s in cfg.switches}
    switch_dpid = {s.name: s.dpid for s in cfg.switches}
    dpid = {h.name: h.dpid for h in cfg.hosts}
    model = plan.network_state().routes({(p.switches[0], p.switches[-1]) for p in plan.paths})
    sim = Simulator(plan)
    for p in plan.paths:
        installed = [name[d] for d in routing.tree_path(trees[dpid[p.cluster]], dpid[p.source], dpid[p.cluster])]
        assert p.switches == model[(p.switches[0], p.switches[-1])] == installed, (p.source, p.cluster)
        assert sim.paths[sim.src_index[p.source]][sim.cl_index[p.cluster]] == p.switches
        assert p.one_way_ms == pytest.approx(routing.path_delay_ms(graph, [switch_dpid[x] for x in p.switches]))
