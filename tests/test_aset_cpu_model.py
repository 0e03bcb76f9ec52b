"""The cold-call rule of the CPU-share model (testbed/model/cpu.py; issue 13 item 3): exact values."""

from __future__ import annotations

import pytest

from testbed.model.cpu import COLD_AFTER_S, CfsQuota


def test_default_quota_has_no_cold_calls():
    q = CfsQuota(0.25)
    assert q.run(0.0, 0.010) == pytest.approx(0.010)
    assert q.run(0.5, 0.010) == pytest.approx(0.510)  # long idle: still 10 ms (rule off)


def test_cold_factor_applies_after_idleness_only():
    q = CfsQuota(0.5, cold_factor=1.5)
    e1 = q.run(0.0, 0.010)  # the first call is cold: 15 ms
    assert e1 == pytest.approx(0.015)
    e2 = q.run(e1, 0.010)  # back to back: warm
    assert e2 == pytest.approx(0.025)
    e3 = q.run(e2 + COLD_AFTER_S / 2, 0.010)  # idle below the threshold: warm
    assert e3 == pytest.approx(e2 + COLD_AFTER_S / 2 + 0.010)
    start = e3 + COLD_AFTER_S * 1.01
    assert q.run(start, 0.010) == pytest.approx(start + 0.015)  # idle >= threshold: cold


def test_cold_call_is_throttled_like_any_other():
    # 0.25 core: 25 ms of quota per 100 ms period; a cold call of 20 ms x 1.5 = 30 ms CPU runs 25 ms,
    # waits for the next period (t = 100 ms), then the remaining 5 ms
    q = CfsQuota(0.25, cold_factor=1.5)
    assert q.run(0.0, 0.020) == pytest.approx(0.105)


def test_per_call_factor_and_validation():
    q = CfsQuota(1.0, workers=2)  # 2 workers x 1 thread > 1 core: throttling is possible
    assert q.run(0.0, 0.004, cold_factor=2.0) == pytest.approx(0.008)
    assert q.run(0.008, 0.004, cold_factor=2.0) == pytest.approx(0.012)  # right after: warm
    with pytest.raises(ValueError, match="cold_factor"):
        CfsQuota(0.5, cold_factor=0.9)
