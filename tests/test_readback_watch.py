"""Reading a link change back from the controller's event log: pure logic, no emulation.

The event runner (:class:`testbed.emu.event_runner.EventRunner`) fires a ``link_up`` through a fake
dynamics and reads it back through the real :class:`testbed.emu.linkctl.Readback`, on a fake clock
and a fake controller whose event log grows as the clock advances. The timings are those of a
594-switch run (AS7018, time dilation 6.5): ports up at +38 ms, LLDP saw the link both ways at
+5.0 s and +5.1 s, the changed switches acknowledged their flows at +6.1 s (wall clock), long after
the kind's 3 s window.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from testbed.emu import event_runner, linkctl
from testbed.emu.event_runner import EventRunner
from testbed.emu.linkctl import Applied, Readback, routes_over_link
from testbed.model.timeline import Change

T_FIRE = 1796545416.286429  # the run's link_up (applied_unix_s)
K = 6.5
A, B = 464, 226  # the link's dpids, as the event names it (s464-s226)
#: The controller's events after the link_up, as the run logged them (seq, wall s after the firing).
RUN_EVENTS = [
    {"seq": 12, "dt": 0.037899, "kind": "port_status", "dpid": 226},
    {"seq": 13, "dt": 0.038000, "kind": "port_status", "dpid": 464},
    {"seq": 14, "dt": 4.996376, "kind": "link_add", "src": 226, "dst": 464},
    {"seq": 15, "dt": 5.091000, "kind": "link_add", "src": 464, "dst": 226},
    {"seq": 16, "dt": 5.224139, "kind": "reroute", "reason": "link 464->226 up", "flows": 468, "switches": [1, 2, 3]},
    {"seq": 17, "dt": 6.126906, "kind": "reroute_done", "reroute": 16, "install_ms": 902.757},
]
PROBES_BACK_S = 0.025273  # the link's first probe answered after the firing (wall s)


class _Clock:
    """A fake wall clock (unix s): the runner's waits advance it."""

    def __init__(self, now: float):
        self.now = now

    def time(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


class _Stop:
    """The runner's stop event on the fake clock: waiting advances it; never set unless ``at`` is passed."""

    def __init__(self, clock: _Clock, at: float = float("inf")):
        self.clock, self.at = clock, at

    def is_set(self) -> bool:
        return self.clock.now >= self.at

    def wait(self, s: float | None = None) -> bool:
        self.clock.now = min(self.clock.now + (s or 0.0), max(self.clock.now, self.at))
        return self.is_set()


class _Dyn:
    """The parts of :class:`testbed.emu.dynamics.Dynamics` the runner and :class:`Readback` use for a
    ``link_up``: the controller's events appear as the fake clock passes them."""

    def __init__(self, clock: _Clock, events: list[dict], k: float = K):
        self.clock, self.events = clock, events
        self.plan = SimpleNamespace(time_dilation=k)
        self.rest_url = "http://controller"
        self.by_link = {0: (SimpleNamespace(name="P0a"), SimpleNamespace(name="P0b"))}
        self.dpid = {"s464": A, "s226": B}

    def link_index(self, ch: Change) -> int:
        return 0

    def window_s(self, ch: Change) -> float:
        return ch.entry.window_s

    def apply(self, ch: Change, affected: list) -> Applied:
        t = self.clock.now
        return Applied(ch, t, t, affected=[("charlotte", "fechicago"), ("charlotte", "fedallas")])

    def measure(self, ap: Applied, until: float):
        return ap.change.entry.measure(ap.change, Readback(self, ap, until), None, None)

    def samples(self, daemon: str, target: str, since_ns: int, until_ns: int) -> list[list[int]]:
        """Probes every 10 ms, answered from :data:`PROBES_BACK_S` after the firing on (1 ms back)."""
        first_back = int((T_FIRE + PROBES_BACK_S) * 1e9)
        rows, t = [], first_back - 20_000_000
        while t < min(until_ns, int(self.clock.now * 1e9)):
            back = t >= first_back
            if t >= since_ns:
                rows.append([len(rows), t, t + 500_000 if back else 0, t + 500_000 if back else 0,
                             t + 1_000_000 if back else 0, len(rows)])
            t += 10_000_000
        return rows

    def get_events(self, url: str) -> list[dict]:
        """The controller's log so far (``/testbed/events``: ``t`` unix s)."""
        evs = [{**{k: v for k, v in e.items() if k != "dt"}, "t": T_FIRE + e["dt"]} for e in self.events]
        return [e for e in evs if e["t"] <= self.clock.now]


def _fire_link_up(monkeypatch, tmp_path, events=RUN_EVENTS, next_fire=float("inf"), stop_at=float("inf"),
                  k=K) -> dict:
    """Fire one ``link_up`` of s464-s226 at :data:`T_FIRE` through the runner; its events.csv row."""
    clock = _Clock(T_FIRE)
    dyn = _Dyn(clock, events, k)
    monkeypatch.setattr(event_runner, "time", clock)
    monkeypatch.setattr(linkctl, "time", clock)
    monkeypatch.setattr(linkctl, "get_events", dyn.get_events)
    ch = Change(t_s=30.0 * k, kind="link_up", event=4, link=("s464", "s226"))
    live = SimpleNamespace(run_dir=tmp_path, plan=dyn.plan, dynamics=dyn)
    runner = EventRunner(live, None, [ch], t0_s=T_FIRE - 30.0 * k)
    runner.stop_event = _Stop(clock, stop_at)
    rows: list[dict] = []
    runner._apply_group([ch], [[]], next_fire, rows.append)
    assert len(rows) == 1
    return rows[0]


def test_link_up_read_back_waits_for_the_controller_past_its_window(monkeypatch, tmp_path):
    """LLDP rediscovered the link 5.0 s (wall) after the link_up and the flows were acknowledged at
    6.1 s, past the kind's 3 s window: the read-back keeps watching and reports the routes' return,
    in emulated ms (6126.906 / 6.5), as the row's value and in its note."""
    row = _fire_link_up(monkeypatch, tmp_path)
    assert row["ok"] == 1
    assert row["value_measured"] == "942.601"
    assert row["effect_ms"] == "3.888"  # 25.273 wall ms / 6.5
    assert "None" not in row["note"]
    assert "routes over the link again after 942.6 ms" in row["note"]
    assert "link probes answered again after 3.9 ms" in row["note"]
    assert "468 flow(s)" in row["note"]
    assert "emulated ms (k = 6.5)" in row["note"]


def test_link_up_read_back_says_plainly_when_the_routes_did_not_return(monkeypatch, tmp_path):
    """The next change fires 4 s (wall) after the link_up: the watch ends there, before LLDP saw
    the link; the row says so (how long it watched, what was missing), with no value and ok 0."""
    row = _fire_link_up(monkeypatch, tmp_path, next_fire=T_FIRE + 4.0)
    assert row["ok"] == 0
    assert row["value_measured"] == ""
    assert "None" not in row["note"]
    assert "routes not over the link again in the 615.4 ms watched" in row["note"]  # 4000 / 6.5
    assert "LLDP has not seen the link either way" in row["note"]


def test_link_up_read_back_stops_watching_when_the_run_ends(monkeypatch, tmp_path):
    """The runner is stopped (the load ended) 5.5 s after the link_up: the flows were not
    acknowledged yet, and the row says that rather than taking the link's discovery for it."""
    row = _fire_link_up(monkeypatch, tmp_path, stop_at=T_FIRE + 5.5)
    assert row["ok"] == 0 and row["value_measured"] == ""
    assert "468 flow(s) rerouted, not all acknowledged yet" in row["note"]


@pytest.mark.parametrize("events, at, how", [
    (RUN_EVENTS, 17, "acknowledged"),
    # no flow changed when the trees took the link back: in force at the second link_add
    ([e for e in RUN_EVENTS if e["kind"] not in ("reroute", "reroute_done")], 15, "no flow changed"),
    # LLDP saw one direction twice (a flap): not both ways yet
    ([RUN_EVENTS[2], {**RUN_EVENTS[2], "seq": 15}], None, "LLDP has seen 226->464 only"),
    # an unrelated reroute after the link's discovery is not the one the link_add caused
    ([*RUN_EVENTS[:4], {**RUN_EVENTS[4], "reason": "link 330-488 delay 11 -> 65 ms"}, RUN_EVENTS[5]], 15,
     "no flow changed"),
])
def test_routes_over_link_matches_both_directions_and_its_own_reroute(events, at, how):
    evs = [{**e, "t": T_FIRE + e["dt"]} for e in events]
    got, why = routes_over_link(evs, A, B)
    assert (got["seq"] if got else None) == at
    assert how in why
    assert routes_over_link(evs, B, A) == (got, why)  # the event may name the link either way
