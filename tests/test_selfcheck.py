"""The RTT self-check's pure parts: ping parsing, the tolerance rule, the second attempt, and the datapath
compensation's arithmetic (a fake emulator control: no network)."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from testbed.emu.selfcheck import (
    RttResult,
    check_rtts,
    check_rtts_twice,
    excess_per_switch_ms,
    parse_ping,
    reply_wait_s,
)

REPO = Path(__file__).resolve().parent.parent

PING = """PING 10.0.0.5 (10.0.0.5) 56(84) bytes of data.
64 bytes from 10.0.0.5: icmp_seq=1 ttl=64 time=11.6 ms
64 bytes from 10.0.0.5: icmp_seq=2 ttl=64 time=10.9 ms
64 bytes from 10.0.0.5: icmp_seq=4 ttl=64 time=12.0 ms

--- 10.0.0.5 ping statistics ---
4 packets transmitted, 3 received, 25% packet loss, time 603ms
"""


def test_parse_ping():
    assert parse_ping(PING) == [11.6, 10.9, 12.0]
    assert parse_ping("connect: Network is unreachable") == []


def test_result_median_error_and_ok():
    r = RttResult("s", "c", [1, 2], 10.0, [11.6, 10.9, 12.0], tolerance_ms=1.5)
    assert r.median_ms == 11.6 and r.error_ms == pytest.approx(1.6) and not r.ok
    assert RttResult("s", "c", [1], 10.0, [], 5.0).ok is False  # no reply is never a pass


class _Proc:
    def __init__(self, out):
        self.out = out

    def wait(self):
        return 0

    def communicate(self):
        return self.out, None


def test_tolerance_is_abs_plus_pct_plus_per_switch():
    src = SimpleNamespace(name="s", mac="m1", ip="10.0.0.1")
    clu = SimpleNamespace(name="c", mac="m2", ip="10.0.0.2")
    plan = SimpleNamespace(sources=[src], clusters=[clu])
    node = SimpleNamespace(popen=lambda *a, **k: _Proc(PING))
    emu = SimpleNamespace(node=lambda name: node)
    [r] = check_rtts(emu, plan, lambda a, b: ([1, 2, 3], 5.0), count=4, tol_ms=1.0, tol_pct=5.0, per_switch_ms=0.5)
    assert r.expected_ms == 10.0
    assert r.tolerance_ms == pytest.approx(1.0 + 0.5 + 3 * 0.5)  # 3 switches on the path
    assert r.ok  # error 1.6 ms <= 3.0 ms


def test_a_failed_path_is_measured_once_more_and_both_medians_are_kept():
    src = SimpleNamespace(name="s", mac="m1", ip="10.0.0.1")
    near = SimpleNamespace(name="near", mac="m2", ip="10.0.0.2")
    far = SimpleNamespace(name="far", mac="m3", ip="10.0.0.3")
    plan = SimpleNamespace(sources=[src], clusters=[near, far])
    slow = PING.replace("time=1", "time=2")  # 21.6 / 20.9 / 22.0 ms: out of tolerance
    answers = {"10.0.0.2": [PING, PING], "10.0.0.3": [slow, slow, slow, PING]}  # (warm-up, ping) per attempt
    pinged: list[str] = []

    def popen(cmd, **_k):
        pinged.append(cmd[-1])
        return _Proc(answers[cmd[-1]].pop(0))

    emu = SimpleNamespace(node=lambda name: SimpleNamespace(popen=popen))
    near_r, far_r = check_rtts_twice(emu, plan, lambda a, b: ([1, 2], 5.0), count=4, tol_ms=1.0, tol_pct=5.0,
                                     per_switch_ms=0.5, pause_s=0.0)
    assert (near_r.attempt, near_r.first_median_ms, near_r.ok) == (1, None, True)
    assert (far_r.attempt, far_r.first_median_ms, far_r.median_ms, far_r.ok) == (2, 21.6, 11.6, True)
    assert pinged.count("10.0.0.2") == 2 and pinged.count("10.0.0.3") == 4  # warm-up and ping, twice for far


def test_a_path_that_fails_twice_stays_failed():
    src = SimpleNamespace(name="s", mac="m1", ip="10.0.0.1")
    clu = SimpleNamespace(name="c", mac="m2", ip="10.0.0.2")
    plan = SimpleNamespace(sources=[src], clusters=[clu])
    slow = PING.replace("time=1", "time=2")
    emu = SimpleNamespace(node=lambda name: SimpleNamespace(popen=lambda *a, **k: _Proc(slow)))
    [r] = check_rtts_twice(emu, plan, lambda a, b: ([1, 2], 5.0), count=4, tol_ms=1.0, tol_pct=5.0, pause_s=0.0)
    assert (r.attempt, r.first_median_ms, r.median_ms, r.ok) == (2, 21.6, 21.6, False)


def test_excess_per_switch_is_the_median_of_each_paths_minimum_over_its_switches():
    rs = [RttResult("s", "a", [1, 2], 10.0, [12.0, 11.0, 30.0], 5.0),  # min 11: +1.0 over 2 switches
          RttResult("s", "b", [1, 2, 3, 4], 20.0, [23.0, 22.4], 5.0),  # +2.4 over 4
          RttResult("s", "c", [1], 0.0, [0.3, 0.9], 5.0),  # +0.3 over 1
          RttResult("s", "d", [1, 2], 5.0, [], 5.0)]  # no answer: left out
    assert excess_per_switch_ms(rs) == pytest.approx(0.5)  # median of 0.5, 0.6, 0.3
    assert excess_per_switch_ms([rs[-1]]) is None


def test_compensation_lowers_what_the_emulator_holds_never_what_was_asked(tmp_path):
    import yaml

    from testbed.emu.mininet_network import Emulation, EmulationError
    from testbed.plan.build import build_plan
    from testbed.spec.experiment import Experiment

    triangle = REPO / "experiments" / "triangle.yaml"
    plan = build_plan(Experiment.model_validate(yaml.safe_load(triangle.read_text())), base_dir=triangle.parent)
    sent: list[tuple[str, dict]] = []

    class Control:
        def set(self, link, **params):
            sent.append((link, params))
            return {"t_applied": 1.0}

    emu = Emulation(plan, "userspace", "user", tmp_path)
    emu._controls = {"E0": (Control(), None, None)}
    emu._group_of = {lk.index: "E0" for lk in plan.links}
    emu.applied = {lk.index: {"delay_ms": lk.delay_ms, "up": True} for lk in plan.links}
    asked = {lk.emu_name: lk.delay_ms for lk in plan.links}
    assert sorted(asked.values()) == [2.0, 3.0, 10.0]
    floored = emu.compensate_delays(2.5)
    assert {name: p["delay_ms"] for name, p in sent} == {n: max(0.0, d - 2.5) for n, d in asked.items()}
    assert [lk.delay_ms for lk in plan.links if lk.index in floored] == [2.0]  # shorter than the offset
    assert {i: a["delay_ms"] for i, a in emu.applied.items()} == {lk.index: lk.delay_ms for lk in plan.links}
    ten = next(lk for lk in plan.links if lk.delay_ms == 10.0)
    sent.clear()
    emu.set_link(ten.index, delay_ms=20.0)  # a link_delay event later in the run: offset kept
    assert sent == [(ten.emu_name, {"delay_ms": 17.5})] and emu.applied[ten.index]["delay_ms"] == 20.0
    with pytest.raises(EmulationError, match="user-space link emulator"):
        Emulation(plan, "netem", "user", tmp_path).compensate_delays(1.0)



def _refused_run(d: Path, rows: list[tuple[float, float, int]], code: int = 3,
                 message: str = "RTT self-check failed on 1 path(s), twice each") -> Path:
    """A run directory with ``run.json`` and ``rtt_check.csv`` rows (expected ms, median ms, ok)."""
    d.mkdir(parents=True)
    (d / "run.json").write_text(json.dumps({"exit_code": code, "message": message}))
    lines = ["source,cluster,dpids,expected_rtt_ms,median_rtt_ms,error_ms,tolerance_ms,samples_ms,ok,attempt,"
             "first_median_ms"]
    lines += [f"a,c{i},1 2,{e},{m},{m - e},1.0,,{ok},2,{m}" for i, (e, m, ok) in enumerate(rows)]
    (d / "rtt_check.csv").write_text("\n".join(lines) + "\n")
    return d


def test_emulation_tests_skip_only_a_refusal_measured_slower_than_planned(tmp_path):
    """The emulation tests' shared check (tests/emu_checks.py): a run the RTT self-check refused
    with every failing path slower than planned skips with its figures; a path faster than planned,
    another exit code or another refusal fails."""
    from emu_checks import expect_run_ok, host_too_slow

    slow = _refused_run(tmp_path / "slow", [(6.0, 9.58, 0), (4.0, 4.2, 1)])
    assert "9.58 ms vs 6.00 ms expected" in host_too_slow(slow)
    with pytest.raises(pytest.skip.Exception):
        expect_run_ok(3, run_dir=slow)
    fast = _refused_run(tmp_path / "fast", [(6.0, 2.0, 0)])
    silent = _refused_run(tmp_path / "silent", [(6.0, float("nan"), 0), (4.0, 9.0, 0)])  # no reply: broken
    other = _refused_run(tmp_path / "other", [(6.0, 9.0, 0)], code=4, message="inference server died")
    for d in (fast, silent, other):
        assert host_too_slow(d) == ""
        with pytest.raises(AssertionError):
            expect_run_ok(3, run_dir=d)
    expect_run_ok(0, run_dir=other)


def test_ping_waits_for_a_reply_longer_than_the_path_s_wall_clock_rtt():
    """A path of 106 ms emulated at k = 30 has a 3.2 s RTT on the wall clock: ping's default 2 s wait
    would read it as no reply (nan) and fail the self-check."""
    assert [reply_wait_s(ms) for ms in (10.0, 499.0, 3188.4)] == ["2", "2", "8"]
    src = SimpleNamespace(name="s", mac="m1", ip="10.0.0.1")
    plan = SimpleNamespace(sources=[src], clusters=[SimpleNamespace(name="c", mac="m2", ip="10.0.0.2")])
    cmds: list[list[str]] = []

    def popen(cmd, **_k):
        cmds.append(cmd)
        return _Proc(PING)

    emu = SimpleNamespace(node=lambda name: SimpleNamespace(popen=popen))
    check_rtts(emu, plan, lambda a, b: ([1, 2], 1594.2), count=3, tol_ms=1.0, tol_pct=0.0)
    assert [c[c.index("-W") + 1] for c in cmds] == ["8", "8"]  # the warm-up's and the measurement's


def test_a_path_that_answers_no_ping_is_named_broken_not_slow(tmp_path, monkeypatch):
    from rich.console import Console

    from testbed.emu import bringup
    from testbed.emu.mininet_network import EmulationError

    results = [RttResult("s", "near", [1, 2], 10.0, [10.1, 10.2], 2.0),
               RttResult("s", "far", [1, 3], 106.0, [], 10.0, attempt=2, first_median_ms=float("nan"))]
    monkeypatch.setattr(bringup, "check_rtts_twice", lambda *a, **k: results)
    monkeypatch.setattr(bringup, "wall_clock", lambda plan: None)
    em = SimpleNamespace(ping_count=5, rtt_tolerance_ms=2.0, rtt_tolerance_pct=5.0, rtt_tolerance_per_switch_ms=0.0)
    live = SimpleNamespace(emu=None, plan=SimpleNamespace(experiment=SimpleNamespace(emulation=em)),
                           path_of=None, run_dir=tmp_path)
    with pytest.raises(EmulationError, match=r"1 answered no ping at all, e.g. s -> far .*broken .*not slow"):
        bringup.rtt_self_check(live, Console(quiet=True))
