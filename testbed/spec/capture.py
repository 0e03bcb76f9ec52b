"""Packet-capture settings (the ``capture:`` key of an experiment file)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from testbed.spec.schema import Num, StrictModel
from testbed.spec.units import parse_duration_s

CAPTURE_NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$"


class CaptureSpec(StrictModel):
    """Which interfaces to capture on, and how much.

    ``interfaces``: ``edge`` (every host <-> switch link, both source and cluster sides), ``all``
    (also every switch <-> switch link), or a list of node names (every interface of that host or
    switch) or ``NODE:PORT`` / interface names as shown by ``testbed plan``.
    ``snaplen_bytes``: bytes kept per packet. ``max_mib``: size bound per capture file (MiB);
    capture on that interface stops when it is reached.
    """

    interfaces: Literal["edge", "all"] | list[str] = "edge"
    snaplen_bytes: int = Field(256, ge=64, le=65535)
    max_mib: Num = Field(50.0, gt=0, le=10000)
    start_delay_s: Num = Field(0.0, ge=0)

    unit_keys = (("start_delay", parse_duration_s, "s"),)
