"""Bad input, seventh round (the newcomer review of Dec 3): what ``testbed plan`` refuses with exit
code 2 and a message naming the item, before anything is built. Fast: no emulation."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from testbed.cli.main import main

REPO = Path(__file__).resolve().parent.parent
TRIANGLE = REPO / "experiments" / "triangle.yaml"


def _triangle(tmp_path: Path, name: str = "e.yaml", **replace: str) -> Path:
    """experiments/triangle.yaml in ``tmp_path`` (its topology by absolute path), ``old=new`` texts
    replaced (each must be there)."""
    text = TRIANGLE.read_text().replace("../topologies/triangle.yaml", str(REPO / "topologies" / "triangle.yaml"))
    for old, new in replace.items():
        assert old in text, old
        text = text.replace(old, new)
    path = tmp_path / name
    path.write_text(text)
    return path


def _plan(capsys, path: Path) -> tuple[int, str]:
    """``testbed plan PATH``: exit code and output (one line per message: the console may wrap)."""
    code = main(["plan", str(path)])
    out = capsys.readouterr()
    return code, " ".join((out.out + out.err).split())


# ------------------------------------------------------------------------------------------ D9

def test_a_workload_that_creates_no_query_is_refused(tmp_path, capsys):
    code, out = _plan(capsys, _triangle(tmp_path, **{"rate_qps: 4": "rate_qps: 0"}))
    assert code == 2
    assert ("the workload creates no query in 8 s (workload.0 (digits): its poisson rates are 0 q/s): the run would "
            "measure nothing; give some entry a rate above 0") in out
    # an entry at 0 beside one that sends is a choice, not an error
    ok = _triangle(tmp_path, "ok.yaml", **{"rate_qps: 4}": "rate_qps: 4}\n  - {application: digits, rate_qps: 0}"})
    assert _plan(capsys, ok)[0] == 0


def test_a_load_too_short_for_one_query_is_refused_before_anything_is_built(tmp_path, capsys):
    """The newcomer review: ``--duration=0.0001ms`` built the emulation for 20 s, then exit 5."""
    path = _triangle(tmp_path)
    code = main(["run", str(path), "--duration=0.0001ms", "--runs-dir", str(tmp_path / "runs")])
    got = capsys.readouterr()
    out = " ".join((got.out + got.err).split())
    assert code == 2 and "fewer than 1" in out and not (tmp_path / "runs").exists()
    # 2 sources x 4 q/s x 0.2 s = 1.6 queries: a short run, but not an empty one
    assert main(["plan", str(_triangle(tmp_path, "short.yaml", **{"duration: 8s": "duration: 200ms"}))]) == 0


@pytest.mark.parametrize(("seeds", "base", "code"), [(2, 2**32 - 2, 0), (1, 2**32 - 1, 0), (2, 2**32 - 1, 2)])
def test_sweep_seed_base_reaches_the_last_seed(tmp_path, capsys, seeds, base, code):
    """The newcomer review: --seeds 2 --seed-base 4294967294 (seeds ..94, ..95) was refused."""
    out = tmp_path / "sw"
    args = ["sweep", str(_triangle(tmp_path)), "--seeds", str(seeds), "--seed-base", str(base), "--policies",
            "closest", "--duration", "1s", "--out", str(out), "--jobs", "1"]
    assert main(args) == code
    got = capsys.readouterr()
    said = " ".join((got.out + got.err).split())
    if code:
        assert f"seeds {base} .. {base + seeds - 1} are not all in 0 .. 4294967295" in said


def test_a_sweep_of_more_cells_than_it_runs_is_refused_before_it_plans_them(tmp_path, capsys):
    """A reviewer's find (Dec 4): --seeds 100000000 planned every cell in memory and the OOM killer
    took the process (24 GiB) after a minute, with nothing said."""
    out = tmp_path / "sw"
    t = time.monotonic()
    code = main(["sweep", str(_triangle(tmp_path)), "--seeds", "100000000", "--policies", "closest,round_robin",
                 "--duration", "1s", "--out", str(out)])
    said = " ".join(capsys.readouterr().out.split())
    assert code == 2 and time.monotonic() - t < 30 and not out.exists()
    assert ("--seeds 100000000: 1 experiment(s) x 2 policies x 100000000 seeds = 200000000 cells, more than the "
            "100000 a sweep runs; lower --seeds") in said


def test_a_min_accuracy_no_served_model_reaches_is_refused(tmp_path, capsys):
    from testbed.plan.zoo import load_manifest

    best = load_manifest(REPO / "models" / "zoo")["variants"]["digits_large"]["accuracy"]  # as this zoo measured it
    code, out = _plan(capsys, _triangle(tmp_path, **{"min_accuracy: 0.5": "min_accuracy: 0.9999"}))
    assert code == 2
    assert ("application 'digits': min_accuracy 0.9999 is above every model of its family 'digits' the clusters "
            f"serve (the best: digits_large {best:.4f}), so every query would fail 'accuracy'") in out
    assert _plan(capsys, _triangle(tmp_path, "ok.yaml", **{"min_accuracy: 0.5": f"min_accuracy: {best}"}))[0] == 0


def test_a_model_listed_twice_in_a_cluster_is_refused(tmp_path, capsys):
    twice = {"models: [digits_small]}": "models: [digits_small, digits_small]}"}
    code, out = _plan(capsys, _triangle(tmp_path, **twice))
    assert code == 2
    assert "clusters.0.models: 'digits_small' listed twice: a cluster serves each model once" in out


def test_a_host_link_one_request_cannot_cross_within_its_deadline_is_refused(tmp_path, capsys):
    """19,335 request bytes are 14 frames at MTU 1500: (19,335 + 14 x 66) x 8 bits at 1 kbit/s =
    162.1 s (testbed.model.network.transfer_ms), against a deadline of 100 ms. The run built
    everything and failed the warm-up after 34 s with an empty TimeoutError."""
    code, out = _plan(capsys, _triangle(tmp_path, **{"host_bandwidth: 1Gbit/s": "host_bandwidth: 1kbit/s"}))
    assert code == 2
    assert ("topology.host_bandwidth (the host link of source 'srca'): 0.001 Mbit/s: one request of application "
            "'digits' (19,335 bytes) takes 162.1 s to cross it, over its deadline of 100 ms, so no such query could "
            "succeed; raise the bandwidth") in out
    # 2 Mbit/s: 81.0 ms, within the deadline
    two = {"host_bandwidth: 1Gbit/s": "host_bandwidth: 2Mbit/s"}
    assert _plan(capsys, _triangle(tmp_path, "ok.yaml", **two))[0] == 0


def test_a_backbone_link_on_a_path_too_slow_for_one_request_is_refused(tmp_path, capsys):
    topo = (REPO / "topologies" / "triangle.yaml").read_text().replace(
        "{a: A, b: B, delay: 2ms, bandwidth: 100Mbit/s}", "{a: A, b: B, delay: 2ms, bandwidth: 1Mbit/s}")
    (tmp_path / "tri.yaml").write_text(topo)
    exp = _triangle(tmp_path, **{str(REPO / "topologies" / "triangle.yaml"): str(tmp_path / "tri.yaml")})
    code, out = _plan(capsys, exp)
    assert code == 2
    assert ("link 'A' - 'B' (l1, on the path srca -> edgeb): 1 Mbit/s: one request of application 'digits' "
            "(19,335 bytes) takes 162.1 ms to cross it, over its deadline of 100 ms") in out


@pytest.mark.parametrize("mutant", ["rate_zero", "minacc_unserv", "models_dup", "tl_bw1k", "hostbw_bps"])
def test_the_reviews_mutants_are_refused(mutant, tmp_path, capsys):
    """The review's own files (/tmp/rev/mut), rebuilt here from the triangle: each one passed `plan`."""
    changes = {"rate_zero": {"rate_qps: 4": "rate_qps: 0"},
               "minacc_unserv": {"min_accuracy: 0.5": "min_accuracy: 0.9999"},
               "models_dup": {"models: [digits_small]}": "models: [digits_small, digits_small]}"},
               "tl_bw1k": {"host_bandwidth: 1Gbit/s": "host_bandwidth: 1kbit/s"},
               "hostbw_bps": {"host_bandwidth: 1Gbit/s": "host_bandwidth: 1bit/s"}}[mutant]
    assert _plan(capsys, _triangle(tmp_path, **changes))[0] == 2


# ------------------------------------------------------------------------------------------ D7

def test_a_deadline_beyond_the_bound_is_refused_naming_why(tmp_path, capsys):
    """``deadline: 1e12s`` passed the plan, and the simulator, stepping through the drain after the
    load (the longest deadline + 2 s grace) once per report interval, never ended."""
    code, out = _plan(capsys, _triangle(tmp_path, **{"deadline: 100ms": "deadline: 1e12s"}))
    assert code == 2
    assert ("applications.0.deadline_ms: 1e+12 s is over the bound of 600 s "
            "(testbed.spec.experiment.MAX_DEADLINE_S): after the load a run waits up to the longest deadline + 2 s "
            "for the last answers") in out


def test_the_longest_deadline_drains_in_bounded_time(tmp_path):
    """At the bound (600 s) the simulator ends at the load + 600 s + 2 s grace, in seconds of wall time."""
    import json
    import time

    from testbed.plan.build import plan_experiment
    from testbed.results.runs import run_simulation

    plan = plan_experiment(_triangle(tmp_path, **{"deadline: 100ms": "deadline: 600s"}))
    t = time.perf_counter()
    run_dir, s = run_simulation(plan, run_dir=tmp_path / "run", quiet=True)
    assert time.perf_counter() - t < 30 and s["queries"] > 0
    assert json.loads((run_dir / "run.json").read_text())["duration_s"] == pytest.approx(8 + 600 + 2)


def test_the_report_interval_bound_counts_the_drain(tmp_path, capsys):
    """(99,999 s of load + 602 s of drain) / 0.5 s = 201,202 intervals: over 200,000, though the
    load alone (199,998) is not."""
    code, out = _plan(capsys, _triangle(tmp_path, **{"deadline: 100ms": "deadline: 600s",
                                                     "duration: 8s": "duration: 99999s\nreport_interval: 500ms",
                                                     "rate_qps: 4": "rate_qps: 0.001"}))
    assert code == 2
    assert ("duration 99999 s + the drain after it (602 s: the longest deadline + 2 s grace) / report_interval 0.5 s "
            "= 201202 report intervals, over the bound of 200000") in out


# ----------------------------------------------------------------------------------------- D12

def test_an_integer_too_long_to_read_is_an_input_error_naming_its_line(tmp_path, capsys):
    """5001 digits: PyYAML's int() raised ValueError past Python's 4300-digit limit, a traceback
    and exit 1."""
    code, out = _plan(capsys, _triangle(tmp_path, **{"rate_qps: 4": "rate_qps: 1" + "0" * 5000}))
    assert code == 2 and "Traceback" not in out
    assert ("e.yaml: line 24: an integer of 5001 digits, over the 4300 digits Python reads, and far over every bound "
            "of the testbed; write a smaller number") in out


def test_an_integer_too_long_in_a_yaml_topology_names_the_file_and_line(tmp_path):
    from testbed.spec.topology import TopologyError, load_yaml_topology

    f = tmp_path / "t.yaml"
    f.write_text("name: t\nnodes:\n  - {id: A, dpid: " + "9" * 4400 + "}\nlinks: []\n")
    with pytest.raises(TopologyError, match=r"t\.yaml: line 3: an integer of 4400 digits, over the 4300 digits"):
        load_yaml_topology(f)


# ----------------------------------------------------------------------------------------- D11

_COMMANDS = {"run": ["run", "e.yaml"], "simulate": ["simulate", "e.yaml"],
             "sweep": ["sweep", "e.yaml", "--out", "o"], "evaluate": ["evaluate", "aset.yaml"]}


@pytest.mark.parametrize("command", sorted(_COMMANDS))
@pytest.mark.parametrize(("given", "seconds"), [("10", 10.0), ("10s", 10.0), ("0.5", 0.5), ("500ms", 0.5),
                                                ("1e2", 100.0), ("2500us", 0.0025)])
def test_duration_takes_the_same_forms_in_every_command(command, given, seconds):
    """One parser (testbed.cli.common.duration_arg): ``run`` took only bare seconds ('10s' was
    refused), simulate, sweep and evaluate only a unit ('10' was refused)."""
    from testbed.cli.main import _parser

    args = _parser().parse_args([*_COMMANDS[command], "--duration", given])
    assert args.duration == pytest.approx(seconds)


@pytest.mark.parametrize("command", sorted(_COMMANDS))
@pytest.mark.parametrize(("given", "said"), [
    ("10min", "duration for --duration: unknown unit 'min' in '10min'"),
    ("0", "'0': the duration must be in (0, 1e+06] s"),
    ("2e6s", "'2e6s': the duration must be in (0, 1e+06] s"),
    ("-1s", "duration for --duration: '-1s' is negative; a duration must be positive"),
    ("-3", "duration for --duration: '-3' is negative; a duration must be positive"),
    ("1e999", "duration for --duration: '1e999' is not finite"),
    ("ten", "duration for --duration: cannot parse 'ten'"),
])
def test_a_bad_duration_is_refused_alike_in_every_command(command, given, said, capsys):
    from testbed.cli.main import _attach_negative_values, _parser, _value_options

    ap = _parser()
    with pytest.raises(SystemExit) as exc:
        ap.parse_args(_attach_negative_values([*_COMMANDS[command], "--duration", given], _value_options(ap)))
    err = " ".join(capsys.readouterr().err.split())
    if command == "evaluate":  # one simulated episode per figure: at most 1 h (MAX_EPISODE_S)
        said = said.replace("(0, 1e+06] s", "(0, 3600] s")
    assert exc.value.code == 2 and f"argument --duration: {said}" in err


# ----------------------------------------------------------------------------------------- nits

def test_evaluate_given_an_experiment_file_refuses_the_config_options(capsys):
    """An experiment file is evaluated as such (docs/aset.md, "The general agent"): an option of an
    ASET config's evaluation, or fewer than 10 seeds, is refused by name before any run."""
    code = main(["evaluate", str(REPO / "experiments" / "default.yaml"), "--headroom"])
    out = " ".join(capsys.readouterr().out.split())
    assert code == 2 and "unknown key" not in out
    assert "--headroom: options of an ASET config's evaluation, not of experiment files" in out
    code = main(["evaluate", str(REPO / "experiments" / "default.yaml"), "--seeds", "5"])
    out = " ".join(capsys.readouterr().out.split())
    assert code == 2 and "--seeds 5: at least 10" in out


def test_the_host_speed_warning_says_the_profilers_overwrite_the_tracked_profiles():
    """It told the reader to run testbed profile and the handling measurement, both of which write
    into the tracked models/profiles/ by default (every later simulation then differs from the
    published figures) without saying so."""
    from testbed.results.summary import _headline

    s = {"queries": 1, "duration_s": 1.0, "host_speed": {"model": "hand_lite", "ratio": 1.6, "now_ms": 8.0,
                                                         "profile_ms": 5.0, "slow": True}}
    (line,) = [x for x in _headline(s) if x.startswith("WARNING: this machine ran")]
    assert ("into a copy of your own: both commands overwrite --profiles, by default the tracked models/profiles/ "
            "that every later simulation reads (cp -r models/profiles runs/profiles-here; testbed profile --shares "
            "1,2 --profiles runs/profiles-here; python -m testbed.serve.handling --profiles runs/profiles-here; "
            "then profiles_dir: runs/profiles-here in the experiment)") in line


def test_cleanup_removes_a_killed_runs_control_folder(tmp_path):
    """A killed run leaves /run/aset-testbed/ctl-<id>/ (its link emulators' control sockets): the
    next run's bring-up removed it, testbed cleanup did not."""
    import os
    import subprocess
    import sys

    (tmp_path / "ctl-0123456789").mkdir()
    (tmp_path / "ctl-0123456789" / "E0.sock").write_text("")
    (tmp_path / "keep").mkdir()
    res = subprocess.run([sys.executable, "-m", "testbed.cli", "cleanup"], cwd=REPO, capture_output=True, text=True,
                         env=dict(os.environ, TESTBED_STATE_DIR=str(tmp_path)))
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"removed control folder {tmp_path / 'ctl-0123456789'}" in res.stdout
    assert "removed 1 leftover item(s)" in res.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep", "lock"]


@pytest.mark.parametrize("text, said", [("name: a\nname: b\n", "key 'name' appears twice"),
                                        ("name: a\nseed: 1" + "0" * 5000 + "\n", "digits")])
def test_an_aset_config_is_read_like_an_experiment(tmp_path, capsys, text, said):
    """ASET configs go through the experiments' YAML reader: a repeated key or an integer too long
    to read is exit 2 naming the line, not a silent overwrite or a traceback."""
    cfg = tmp_path / "aset.yaml"
    cfg.write_text(text)
    assert main(["train", str(cfg)]) == 2
    said_out = capsys.readouterr()
    assert said in said_out.out + said_out.err and "Traceback" not in said_out.out + said_out.err


# --------------------------------------------------------------- link delays are bounded (600 s)
def test_link_delays_above_600_s_are_refused_naming_them(tmp_path, capsys):
    """A cloud, topology or event delay of 1e308 ms summed to an infinite RTT, and ``testbed plan
    --json`` wrote ``Infinity`` (not JSON); each is now refused, naming it."""
    cloud = _triangle(tmp_path, "c.yaml",
                      **{"policy: closest": "policy: closest\ncloud: {attach_to: C, delay: 1e308ms}"})
    code, out = _plan(capsys, cloud)
    assert code == 2 and "cloud.delay_ms: Input should be less than or equal to 600000" in out
    topo = (REPO / "topologies" / "triangle.yaml").read_text().replace("delay: 10ms", "delay: 1e12ms")
    (tmp_path / "t.yaml").write_text(topo)
    code, out = _plan(capsys, _triangle(tmp_path, "e.yaml", **{str(REPO / "topologies" / "triangle.yaml"):
                                                               str(tmp_path / "t.yaml")}))
    assert code == 2 and "links.2.delay_ms: Input should be less than or equal to 600000" in out
    event = _triangle(tmp_path, "v.yaml", **{"policy: closest": "policy: closest\nevents:\n"
                                            "  - {at: 1s, kind: link_delay, link: [A, B], delay: 1e15ms}"})
    code, out = _plan(capsys, event)
    assert code == 2 and "events.0.delay_ms: Input should be less than or equal to 600000" in out


def test_an_empty_node_id_is_refused_naming_the_node(tmp_path, capsys):
    topo = tmp_path / "t.yaml"
    topo.write_text((REPO / "topologies" / "triangle.yaml").read_text().replace("{id: C,", "{id: '',")
                    .replace("{a: B, b: C,", "{a: B, b: '',").replace("{a: A, b: C,", "{a: A, b: '',"))
    path = _triangle(tmp_path, **{str(REPO / "topologies" / "triangle.yaml"): str(topo)})
    code, out = _plan(capsys, path)
    assert code == 2 and "node 3 of topology 'triangle' has an empty id" in out


def test_a_topology_that_is_not_a_regular_file_is_named_as_such(tmp_path, capsys):
    path = _triangle(tmp_path, **{str(REPO / "topologies" / "triangle.yaml"): "/dev/null"})
    code, out = _plan(capsys, path)
    assert code == 2 and "/dev/null is not a regular file" in out and "not found" not in out


def test_report_refuses_a_run_folder_given_twice(tmp_path, capsys):
    d = tmp_path / "run"
    d.mkdir()
    assert main(["report", str(d), str(tmp_path / "." / "run")]) == 2
    assert f"run folder(s) given more than once: {d}" in " ".join(capsys.readouterr().out.split())
