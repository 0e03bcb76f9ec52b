"""Packet capture inside the emulated namespaces (filled in by the packet-capture issue)."""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any

from testbed.capture.spec import CaptureSpec


def start_capture(live: Any, spec: CaptureSpec, stack: ExitStack) -> None:
    """Start capturing on the interfaces ``spec`` names; register the stop on ``stack``.

    ``live``: the running :class:`testbed.run.Live`. Pcaps go to ``live.run_dir / "pcap"``.
    """
    raise NotImplementedError("packet capture is not implemented yet")
