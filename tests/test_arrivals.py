"""Arrival processes: rates, windowing, traces, spatial weights, bad input."""

import numpy as np
import pytest

from testbed.model.arrivals import (
    MMPP,
    ArrivalError,
    Diurnal,
    Poisson,
    Step,
    Trace,
    make_process,
)
from testbed.plan.traces import read_trace, source_weights
from testbed.spec.experiment import WorkloadSpec


def collect(proc, end, window=0.5):
    parts, a = [], 0.0
    while a < end:
        parts.append(proc.times(a, min(end, a + window)))
        a += window
    return np.concatenate(parts)


def test_poisson_rate_and_exponential_gaps():
    t = collect(Poisson(np.random.default_rng(1), 50.0), 400.0)
    assert len(t) == pytest.approx(20000, rel=0.03)
    gaps = np.diff(t)
    assert (gaps >= 0).all() and gaps.mean() == pytest.approx(0.02, rel=0.03)
    assert np.std(gaps) / gaps.mean() == pytest.approx(1.0, abs=0.05)  # exponential: CV = 1


def test_step_diurnal_mmpp_rates():
    t = collect(Step(np.random.default_rng(2), [(0, 10.0), (100, 40.0)]), 200.0)
    assert (t < 100).sum() == pytest.approx(1000, rel=0.1) and (t >= 100).sum() == pytest.approx(4000, rel=0.06)
    d = Diurnal(np.random.default_rng(3), 20.0, 0.8, 100.0)
    t = collect(d, 1000.0)
    assert len(t) == pytest.approx(20000, rel=0.03)
    peak = ((t % 100) < 50).sum() / ((t % 100) >= 50).sum()  # sin > 0 in the first half period
    assert peak > 3
    m = MMPP(np.random.default_rng(4), [2.0, 50.0], [4.0, 1.0])
    t = collect(m, 2000.0)
    assert len(t) / 2000 == pytest.approx(m.mean_rate_qps, rel=0.1) and m.mean_rate_qps == pytest.approx(11.6)


def test_trace_replay_is_exact(tmp_path):
    f = tmp_path / "trace.csv"
    f.write_text("t_s\n0.1\n0.35\n0.5\n2.25\n")
    tr = Trace(np.random.default_rng(0), read_trace(f))
    assert collect(tr, 3.0).tolist() == [0.1, 0.35, 0.5, 2.25]
    f.write_text("time\n1\n")
    with pytest.raises(ArrivalError, match="column 't_s'"):
        read_trace(f)
    f.write_text("t_s\n1\nabc\n")
    with pytest.raises(ArrivalError, match="line 3: t_s 'abc' is not a number"):
        read_trace(f)
    with pytest.raises(ArrivalError, match="No such file"):
        read_trace(tmp_path / "none.csv")


def test_spatial_weights(tmp_path):
    w = WorkloadSpec(application="a", rate_qps=10, weights={"x": 3, "y": 1})
    assert source_weights(w, [("x", ["X"]), ("y", ["Y"])]) == {"x": 1.5, "y": 0.5}
    dm = tmp_path / "dm.csv"
    dm.write_text("source_site,target_site,demand\nSeattle,Denver,6\nSeattle,Chicago,2\nAtlanta,Denver,4\n")
    w = WorkloadSpec(application="a", rate_qps=10, demand_matrix=str(dm))
    assert source_weights(w, [("sea", ["Seattle", "3"]), ("atl", ["Atlanta", "9"])]) == {"sea": 4 / 3, "atl": 2 / 3}
    with pytest.raises(ArrivalError, match="no row for the site of source 'nyc'"):
        source_weights(w, [("nyc", ["New York", "0"])])
    p = make_process(WorkloadSpec(application="a", rate_qps=10), np.random.default_rng(0), weight=2.0)
    assert isinstance(p, Poisson) and p.rate == 20.0


def test_same_seed_same_arrivals_whatever_the_windows():
    a = collect(Poisson(np.random.default_rng(7), 30.0), 10.0, window=0.5)
    b = collect(Poisson(np.random.default_rng(7), 30.0), 10.0, window=0.5)
    assert a.tolist() == b.tolist()


def test_sndlib_demand_matrix_from_topohub():
    w = WorkloadSpec(application="a", rate_qps=10, demand_matrix="topohub:sndlib/abilene")
    got = source_weights(w, [("atl", ["ATLAM5", "0"]), ("x", ["other", "2"])])
    # origin totals of SNDlib abilene: node 0 (ATLAM5) and node 2; normalised to mean 1
    import topohub

    dem = topohub.get("sndlib/abilene")["graph"]["demands"]
    a, b = sum(dem[0].values()), sum(dem[2].values())
    assert got == pytest.approx({"atl": 2 * a / (a + b), "x": 2 * b / (a + b)})
