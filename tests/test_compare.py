"""``testbed compare RUN_DIR``: the twin report (testbed.results.twin's rules, testbed.results.twin_comparison).

The pairing, the "parts at" rule and the windowed interval are tested on synthetic records (pure
logic). A simulated run relabelled as emulated is its own twin: compare must pair every query and
find no stage that parts (real simulator, no root). Bad input exits 2 naming the item. The
emulation test (marked ``emulation``, root) compares a real 10 s triangle run.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from emu_checks import expect_run_ok
from scipy import stats

from testbed.cli.main import main
from testbed.core.errors import EXIT_INPUT
from testbed.model.records import RECORD_FIELDS
from testbed.plan.build import plan_experiment
from testbed.results.runs import run_emulation, run_simulation
from testbed.results.twin import (
    ARRIVAL_TOLERANCE_MS,
    MIN_PAIRS,
    STAGES,
    TwinError,
    group_stats,
    pair_queries,
    parts,
    parts_at,
    stage_stats,
    success_difference,
    verdict,
    where_they_part,
    window_s,
)
from testbed.results.twin_comparison import twin_cost, twin_line

REPO = Path(__file__).resolve().parent.parent
TRIANGLE = REPO / "experiments" / "triangle.yaml"


# ----------------------------------------------------------------------------- synthetic records

def _records(n: int, *, source: str = "srca", t0_ms: float = 0.0, step_ms: float = 100.0, network: float = 5.0,
             queueing: float = 2.0, inference: float = 3.0, cluster: str = "edgeb", success=None) -> pd.DataFrame:
    """``n`` answered records of one source, created every ``step_ms`` from ``t0_ms`` (ns since 0)."""
    rows = []
    for i in range(n):
        ok = True if success is None else bool(success(i))
        e2e = network + queueing + inference
        rows.append({**dict.fromkeys(RECORD_FIELDS), "query_id": f"{source}-{i + 1}", "source": source,
                     "application": "digits", "cluster": cluster, "model": "digits_small", "policy": "closest",
                     "http_status": 200, "t0_ns": int((t0_ms + i * step_ms) * 1e6), "e2e_ms": e2e,
                     "dispatch_ms": 0.0, "network_ms": network, "handling_ms": 0.0, "queueing_ms": queueing,
                     "inference_ms": inference, "expected_rtt_ms": 4.0, "outcome": "success" if ok else "failure",
                     "failure_cause": "" if ok else "deadline_miss"})
    return pd.DataFrame(rows)


def test_pairing_pairs_one_arrival_by_id_and_counts_every_other_query_under_its_reason():
    sim = _records(10)
    emu = _records(12, t0_ms=1000.0 + 2.0)  # epoch-like origin 1 s, created 2 ms late; 2 ids the simulator lacks
    emu.loc[3, "application"] = "other"  # same id, another stream
    emu.loc[5, "t0_ns"] += int((ARRIVAL_TOLERANCE_MS + 50) * 1e6)  # the source fell behind
    sim = sim.drop(index=[7])  # an id only the emulation has... and one only the simulator has:
    sim = pd.concat([sim, _records(1, source="srcc")])
    p = pair_queries(emu, sim, origin_ns=int(1000 * 1e6))
    assert p.emulated == 12 and p.simulated == 10
    assert p.unpaired == {"only_emulated": 3, "only_simulated": 1, "stream_differs": 1, "created_apart": 1}
    assert len(p.pairs) + 3 + 1 + 1 == p.emulated  # paired + the emulated reasons = every emulated query
    assert set(p.pairs["query_id"]) == {f"srca-{i}" for i in (1, 2, 3, 5, 7, 9, 10)}
    assert p.pairs["lag_ms"].to_numpy() == pytest.approx([2.0] * 7)
    assert p.lag_ms() == {"p50": 2.0, "p95": 2.0, "max_abs": 2.0}
    assert p.pairs["t_s"].is_monotonic_increasing


def test_pairing_without_a_load_start_aligns_the_first_queries():
    p = pair_queries(_records(5, t0_ms=7e6 + 100.0), _records(5, t0_ms=100.0), origin_ns=None)
    assert len(p.pairs) == 5 and p.share == 1.0 and p.pairs["lag_ms"].abs().max() == pytest.approx(0.0)


def test_a_query_id_twice_in_one_engines_records_is_refused_naming_it():
    emu = pd.concat([_records(3), _records(1)])
    with pytest.raises(TwinError, match=r"emulated records: query id 'srca-1' appears more than once"):
        pair_queries(emu, _records(3))


def test_a_stage_parts_only_beyond_1_ms_and_10_percent_over_enough_pairs_with_a_small_p():
    assert parts(12.0, 10.5, 50, 1e-6)  # 1.5 ms and 14 %
    assert not parts(101.0, 99.5, 50, 1e-6)  # 1.5 ms but 1.5 %
    assert not parts(0.9, 0.1, 50, 1e-6)  # 800 % but 0.8 ms
    assert not parts(12.0, 10.5, MIN_PAIRS - 1, 1e-6)  # too few pairs
    assert not parts(12.0, 10.5, 50, 0.02)  # the paired test does not reject
    assert parts(2.0, 0.0, 50, 1e-6)  # a stage the simulator has none of


def test_the_group_parts_at_the_first_stage_in_a_querys_order():
    rng = np.random.default_rng(1)
    emu = _records(60, network=30.0, queueing=400.0)
    sim = _records(60, network=10.0, queueing=100.0)
    for df in (emu, sim):  # some spread, so the paired test has differences to rank
        for col in ("network_ms", "queueing_ms", "inference_ms"):
            df[col] = df[col] + rng.uniform(0, 0.5, len(df))
    pairs = pair_queries(emu, sim, origin_ns=0).pairs
    rows = stage_stats(pairs)
    by = {r["stage"]: r for r in rows}
    assert by["network_ms"]["parts"] and by["queueing_ms"]["parts"] and not by["inference_ms"]["parts"]
    assert not by["e2e_ms"]["parts"]  # the sum of the stages is shown, never named
    assert not by["dispatch_ms"]["parts"] and by["dispatch_ms"]["p"] == 1.0  # 0 in every pair
    assert by["network_ms"]["emu_p50"] == pytest.approx(float(np.median(emu["network_ms"])), abs=1e-3)
    assert by["network_ms"]["sim_p95"] == pytest.approx(float(np.quantile(sim["network_ms"], 0.95)), abs=1e-3)
    assert parts_at(rows)["stage"] == "network_ms"
    assert parts_at(stage_stats(pairs.iloc[: MIN_PAIRS - 1])) is None  # too few pairs to judge


def test_the_verdict_names_the_earliest_stage_on_the_cluster_where_it_differs_most():
    def run(cluster, source, network, queueing, n=30):
        e = _records(n, source=source, cluster=cluster, network=network[0], queueing=queueing[0])
        s = _records(n, source=source, cluster=cluster, network=network[1], queueing=queueing[1])
        for df in (e, s):
            df["network_ms"] += np.linspace(0, 0.3, n)
            df["queueing_ms"] += np.linspace(0, 0.3, n)[::-1]
        return e, s

    parts_ = [run("edgeb", "srca", (31.0, 10.0), (5.0, 5.0)), run("edgec", "srcb", (5.0, 2.0), (300.0, 10.0)),
              run("cloud", "srcc", (5.0, 5.0), (900.0, 10.0))]
    emu = pd.concat([p[0] for p in parts_], ignore_index=True)
    sim = pd.concat([p[1] for p in parts_], ignore_index=True)
    groups = group_stats(pair_queries(emu, sim, origin_ns=0).pairs)
    assert list(groups) == ["all", "cloud", "edgeb", "edgec", "srca -> edgeb", "srcb -> edgec", "srcc -> cloud"]
    w = where_they_part(groups)
    # network parts on edgeb (21 ms) and edgec (3 ms): the earliest stage wins over cloud's larger queueing gap
    assert (w["stage"], w["group"]) == ("network_ms", "edgeb")
    assert {"group": "cloud", "stage": "queueing_ms"} in w["also"]
    result = {"success": {"emu": 0.943, "sim": 0.893, "diff_pts": 5.0, "ci_pts": 1.2},
              "pairing": {"emulated": 90, "simulated": 90, "paired": 90}, "parts": w, "groups": groups}
    assert verdict(result) == ("twin: success 0.943 emulated vs 0.893 simulated (+5.0 ± 1.2 pts, 90 of 90 queries "
                               "paired); engines part at network on edgeb (p50 31.1 vs 10.2 ms)")
    result["parts"] = None
    assert verdict(result).endswith("; no stage parts (medians within 1 ms or 10 %)")


def test_success_difference_is_the_mean_over_windows_with_a_student_t_interval():
    assert (window_s(40), window_s(10), window_s(600)) == (5.0, 1.25, 5.0)
    # 8 windows of 5 s, 10 queries each; the emulation always succeeds, the simulator fails k of 10 in window k
    sim_fail = {w: w % 4 for w in range(8)}
    emu = _records(80, step_ms=500.0)
    sim = _records(80, step_ms=500.0, success=lambda i: (i % 10) >= sim_fail[i // 10])
    sd = success_difference(pair_queries(emu, sim, origin_ns=0).pairs, 40.0)
    diffs = np.array([sim_fail[w] / 10 for w in range(8)])
    half = stats.t.ppf(0.975, 7) * diffs.std(ddof=1) / math.sqrt(8)
    assert sd["windows"] == 8 and sd["window_s"] == 5.0
    assert sd["diff_pts"] == pytest.approx(100 * diffs.mean(), abs=0.01)
    assert sd["ci_pts"] == pytest.approx(100 * half, abs=0.01)
    assert sd["emu"] == 1.0 and sd["sim"] == pytest.approx(1 - diffs.mean(), abs=1e-3)
    one = success_difference(pair_queries(emu.iloc[:5], sim.iloc[:5], origin_ns=0).pairs, 40.0)
    assert one["windows"] == 1 and one["ci_pts"] is None  # one window: no interval


# ----------------------------------------------------------------------------- a real folder, no root

@pytest.fixture(scope="module")
def own_twin(tmp_path_factory) -> Path:
    """A simulated triangle run (10 s) relabelled as emulated: a real run folder whose twin is itself."""
    root = tmp_path_factory.mktemp("twin")
    run_dir, _s = run_simulation(plan_experiment(TRIANGLE), run_dir=root / "run", duration_s=10.0, quiet=True)
    run = json.loads((run_dir / "run.json").read_text())
    (run_dir / "run.json").write_text(json.dumps(run | {"mode": "emulation", "duration_s": 10.0}))
    return run_dir


def test_a_run_compared_with_itself_pairs_every_query_and_parts_nowhere(own_twin, tmp_path, capsys):
    out = tmp_path / "cmp"
    assert main(["compare", str(own_twin), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    result = json.loads((out / "compare.json").read_text())
    pr = result["pairing"]
    assert pr["paired"] == pr["emulated"] == pr["simulated"] > 50 and pr["unpaired"] == {}
    assert result["parts"] is None and result["success"]["diff_pts"] == 0.0
    assert set(result["groups"]) == {"all", "edgeb", "edgec", "srca -> edgeb", "srcc -> edgec"}
    assert all(r["emu_p50"] == r["sim_p50"] for g in result["groups"].values() for r in g)
    assert "no stage parts" in result["verdict"] and result["verdict"] in printed
    html = (out / "compare.html").read_text()
    assert html.count("data:image/png;base64,") == 4  # all, edgeb, edgec, success
    assert (out / "compare.md").read_text().count("](figures/twin_") == 4
    assert (out / "simulated" / "run.json").exists()


def test_twin_cost_is_the_expected_simulation_time():
    plan = plan_experiment(TRIANGLE)
    assert twin_cost(plan, 20_000) == (pytest.approx(12.0), "")


# ----------------------------------------------------------------------------- bad input

def _compare_error(path: Path, capsys) -> str:
    assert main(["compare", str(path)]) == EXIT_INPUT
    return capsys.readouterr().out


def test_not_a_run_directory_exits_2_naming_it(tmp_path, capsys):
    assert "no-such: not a run directory" in _compare_error(tmp_path / "no-such", capsys)
    assert "run.json: missing or empty" in _compare_error(tmp_path, capsys)


def test_a_simulated_run_is_refused(own_twin, tmp_path, capsys):
    sim = tmp_path / "sim"
    shutil.copytree(own_twin, sim)
    run = json.loads((sim / "run.json").read_text())
    (sim / "run.json").write_text(json.dumps(run | {"mode": "simulation"}))
    assert "a simulated run; compare takes an emulated run" in _compare_error(sim, capsys)


def test_a_run_without_plan_json_exits_2_naming_it(own_twin, tmp_path, capsys):
    d = tmp_path / "run"
    shutil.copytree(own_twin, d)
    (d / "plan.json").unlink()
    assert f"{d / 'plan.json'}: missing: compare simulates the run's own plan" in _compare_error(d, capsys)
    (d / "plan.json").write_text(json.dumps({"experiment": {}}))
    assert "plan.json: not a plan of this testbed version" in _compare_error(d, capsys)
    assert not (d / "compare").exists()  # refused before anything was written


def test_corrupted_records_exit_2_naming_the_file(own_twin, tmp_path, capsys):
    d = tmp_path / "run"
    shutil.copytree(own_twin, d)
    (d / "records.parquet").unlink()
    lines = (d / "records.csv").read_text().splitlines()
    cells = lines[3].split(",")
    cells[RECORD_FIELDS.index("network_ms")] = "fast"
    (d / "records.csv").write_text("\n".join([*lines[:3], ",".join(cells), *lines[4:]]) + "\n")
    said = _compare_error(d, capsys)
    assert f"{d / 'records.csv'}: column 'network_ms', row 3: 'fast' is not a number" in said
    assert not (d / "compare").exists()


# ----------------------------------------------------------------------------- a real emulation

@pytest.mark.emulation
@pytest.mark.skipif(os.geteuid() != 0, reason="emulation needs root")
def test_compare_on_a_short_emulation_pairs_its_queries_and_names_where_they_part(tmp_path, capsys):
    expect_run_ok(run_emulation(plan_experiment(TRIANGLE), runs_dir=tmp_path, duration_s=10, twin=twin_line),
                  tmp_path)
    run_dir = next(p for p in tmp_path.iterdir() if (p / "run.json").exists())
    summary = json.loads((run_dir / "summary.json").read_text())
    # the run's summary ends with the twin's verdict (10 s of the triangle is cheap to simulate)
    assert summary["twin"]["verdict"].startswith("twin: success ")
    assert summary["twin"]["verdict"] in (run_dir / "summary.md").read_text().splitlines()[-1]
    result = json.loads((run_dir / "compare" / "compare.json").read_text())
    assert result["run_status"] == "ok"  # the outcome the run knew, before run.json recorded it
    pr = result["pairing"]
    assert pr["emulated"] == summary["queries"] >= 50 and pr["share"] >= 0.95, pr
    w = result["parts"]
    if w is not None:  # the stage named parts by the rule on that cluster, and is the verdict's
        row = next(r for r in result["groups"][w["group"]] if r["stage"] == w["stage"])
        assert w["stage"] in STAGES and row["parts"] and abs(row["emu_p50"] - row["sim_p50"]) > 1.0
        assert f"engines part at {w['stage'].removesuffix('_ms')} on {w['group']}" in result["verdict"]
    else:
        # no cluster or path parts (the verdict's rule, where_they_part); the pooled "all" may, with
        # more pairs behind its test, and names no place
        assert not any(r["parts"] for name, g in result["groups"].items() if name != "all" for r in g)
    clusters = {g for g in result["groups"] if g != "all" and " -> " not in g}
    assert clusters == {"edgeb", "edgec"} and all(result["groups"][c][0]["n"] > 0 for c in clusters)
    assert result["success"]["emu"] is not None and result["success"]["windows"] == 8
    # testbed compare again, into another folder: the same verdict (the simulation is deterministic)
    assert main(["compare", str(run_dir), "--out", str(tmp_path / "again")]) == 0
    again = json.loads((tmp_path / "again" / "compare.json").read_text())
    assert again["verdict"] == result["verdict"] and again["verdict"] in capsys.readouterr().out


def test_the_run_summarys_twin_line_says_why_it_did_not_compare_and_how_to(own_twin, tmp_path):
    plan = plan_experiment(TRIANGLE)
    line, facts = twin_line(own_twin, plan, 100, ok=False)
    assert line == (f"twin: not compared, the run did not end ok; `testbed compare {own_twin}` compares what it "
                    f"measured") and facts["how"] == f"testbed compare {own_twin}"
    line, facts = twin_line(own_twin, plan, 10**6, ok=True)  # 100 s of simulation expected: not cheap
    assert line == f"twin: not compared (expected to take 110 s, over 20 s); get it with `testbed compare {own_twin}`"
    broken = tmp_path / "run"
    shutil.copytree(own_twin, broken)
    (broken / "plan.json").unlink()
    line, facts = twin_line(broken, plan, 100, ok=True)  # a comparison that fails says so; the run stands
    assert line.startswith("twin: the comparison failed (CompareError: ") and "plan.json: missing" in line
    assert facts["why"].startswith("failed: CompareError")
