"""The event runner looks up the paths a link change moves ahead of it, off the firing thread:
pure logic, a fake dynamics whose look-up takes longer than the probes' preparation
(:data:`testbed.emu.dynamics.PREPARE_S`), as the controller's did on a 594-switch network."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from testbed.emu.dynamics import PREPARE_S
from testbed.emu.event_runner import LOOKUP_LEAD_S, EventRunner
from testbed.emu.linkctl import Applied
from testbed.model.timeline import Change, Measured

LOOKUP_S = 4 * PREPARE_S  # a look-up that would make the change late if it ran in the preparation


class _Dyn:
    """Records when each change was looked up, prepared and applied, and how many changes the model
    held at its look-up; ``fail`` makes the look-up raise."""

    def __init__(self, fail: bool = False):
        self.model_changes = 0
        self.log: list[tuple[str, int, float, int]] = []  # (what, event, unix s, changes in the model)
        self.fail = fail
        self.lock = threading.Lock()

    def _note(self, what: str, ch: Change) -> None:
        with self.lock:
            self.log.append((what, ch.event, time.time(), self.model_changes))

    def affected(self, ch: Change) -> list[tuple[str, str]]:
        self._note("lookup", ch)
        if self.fail:
            raise RuntimeError("controller unreachable")
        time.sleep(LOOKUP_S)
        self._note("found", ch)
        return [("src", f"cluster{ch.event}")]

    def prepare(self, ch: Change, affected: list[tuple[str, str]]) -> None:
        assert affected == [("src", f"cluster{ch.event}")]
        self._note("prepare", ch)

    def apply(self, ch: Change, affected: list[tuple[str, str]]) -> Applied:
        self._note("fire", ch)
        self.model_changes += 1
        t = time.time()
        return Applied(ch, t, t, affected=affected)

    def window_s(self, ch: Change) -> float:
        return 0.05

    def measure(self, ap: Applied, until: float) -> Measured:
        return Measured(1.0, "ms", 1.0, 1.0, True, "")

    def first(self, what: str, event: int) -> tuple[float, int]:
        return next((t, n) for w, e, t, n in self.log if w == what and e == event)


def _run(tmp_path, dyn: _Dyn, at_s: list[float]) -> EventRunner:
    changes = [Change(t_s=t, kind="link_delay", event=i, link=("s1", "s2"), value=5.0) for i, t in enumerate(at_s)]
    live = SimpleNamespace(run_dir=tmp_path, plan=SimpleNamespace(time_dilation=1.0), dynamics=dyn)
    runner = EventRunner(live, None, changes, t0_s=time.time())
    runner.start()
    runner.join(timeout=at_s[-1] + 10)
    runner.stop()
    return runner


def test_a_slow_lookup_is_done_before_its_change_and_after_the_change_before(tmp_path):
    """Changes at 0.5 s and LOOKUP_LEAD_S + 1 s: the first is looked up at once, the second once the
    first has been applied (the model holds it) and LOOKUP_LEAD_S before its time; each look-up has
    ended before its change's probes are raised."""
    dyn = _Dyn()
    runner = _run(tmp_path, dyn, [0.5, LOOKUP_LEAD_S + 1.0])
    assert runner.error is None, runner.error
    assert [r["event"] for r in runner.rows] == [0, 1] and all(r["ok"] == 1 for r in runner.rows)
    for event in (0, 1):
        assert dyn.first("found", event)[0] <= dyn.first("prepare", event)[0] <= dyn.first("fire", event)[0]
    assert dyn.first("lookup", 0)[1] == 0 and dyn.first("lookup", 1)[1] == 1  # the model as the change finds it
    fire0, lookup1 = dyn.first("fire", 0)[0], dyn.first("lookup", 1)[0]
    assert lookup1 >= fire0 and lookup1 >= runner.t0_s + 1.0 - 1e-3  # not before LOOKUP_LEAD_S ahead


def test_a_failed_lookup_stops_the_runner_naming_the_change(tmp_path):
    dyn = _Dyn(fail=True)
    runner = _run(tmp_path, dyn, [0.3])
    assert runner.error is not None and "events.0 (link_delay s1-s2)" in str(runner.error)
    assert "controller unreachable" in str(runner.error)
    assert not [r for r in dyn.log if r[0] in ("prepare", "fire")]
