"""Capture points of an experiment's ``capture:`` key, resolved against the plan (no root, builds
nothing). The capture itself (one ``tcpdump`` per point) is :mod:`testbed.emu.pcap`'s.

Capture points (see :func:`capture_points`):

* a host ``h``: its interface ``h-eth0`` in the host's namespace;
* a link ``lK`` (``K`` = link index, as in ``testbed plan``): with the user-space link emulator,
  ``lK-eth0`` (side ``a``) and ``lK-eth1`` (side ``b``) in the emulator's namespace, so the hop
  ``lK-eth0 > lK-eth1`` is exactly the emulated link; with netem, the two switch ports of the link;
* a switch ``sN``: every port ``sN-ethP`` (root namespace);
* an interface name (``srca-eth0``, ``l2-eth1``, ``s1-eth3``): that interface.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from testbed.core.util import did_you_mean
from testbed.plan.resolved import Plan, PlanError
from testbed.spec.capture import CaptureSpec

_IFNAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,14}$")


@dataclass(frozen=True)
class CapturePoint:
    """One interface we capture on.

    ``name``: the interface name (also the pcap file stem); ``node``: the Mininet node whose
    namespace holds it (None = root namespace); ``kind``: ``host``, ``link`` or ``switch``;
    ``host``: the host name (kind host); ``link``: the link index and ``side`` (``a``/``b``, the end
    of the link the interface faces) for link points and switch ports on switch links.
    """

    name: str
    node: str | None
    kind: str
    host: str | None = None
    link: int | None = None
    side: str | None = None
    switch: str | None = None


def _switch_ports(plan: Plan) -> list[CapturePoint]:
    """Every switch port in the order Mininet creates them (links first, then hosts)."""
    count = {s.name: 0 for s in plan.switches}
    out = []
    for lk in plan.links:
        for sw, side in ((lk.a, "a"), (lk.b, "b")):
            count[sw] += 1
            out.append(CapturePoint(f"{sw}-eth{count[sw]}", None, "switch", link=lk.index, side=side, switch=sw))
    for h in plan.hosts:
        count[h.switch] += 1
        out.append(CapturePoint(f"{h.switch}-eth{count[h.switch]}", None, "switch", host=h.name, switch=h.switch))
    return out


def _link_points(plan: Plan, link_emulator: str) -> dict[str, list[CapturePoint]]:
    """Link emulator name -> its two capture points (a side first)."""
    ports = _switch_ports(plan)
    out = {}
    for lk in plan.links:
        if link_emulator == "userspace":
            out[lk.emu_name] = [CapturePoint(f"{lk.emu_name}-eth0", lk.emu_name, "link", link=lk.index, side="a"),
                                CapturePoint(f"{lk.emu_name}-eth1", lk.emu_name, "link", link=lk.index, side="b")]
        else:
            out[lk.emu_name] = [p for p in ports if p.link == lk.index]
    return out


def capture_points(plan: Plan, spec: CaptureSpec, link_emulator: str = "userspace") -> list[CapturePoint]:
    """Resolve ``spec.interfaces`` against the plan into capture points (no duplicates, plan order).

    ``link_emulator``: ``userspace`` or ``netem`` (decides where a link is captured, see the module
    docstring). Raises :class:`testbed.plan.resolved.PlanError` naming the first unknown item
    (``capture.interfaces.2: 'x' is not a host, switch, link (lK) or interface of the plan``).
    """
    hosts = {h.name: CapturePoint(f"{h.name}-eth0", h.name, "host", host=h.name) for h in plan.hosts}
    links = _link_points(plan, link_emulator)
    ports = _switch_ports(plan)
    if spec.interfaces == "edge":
        return list(hosts.values())
    if spec.interfaces == "all":
        return list(hosts.values()) + [p for lk in plan.links for p in links[lk.emu_name]]
    by_if: dict[str, CapturePoint] = {p.name: p for p in ports}
    if link_emulator == "userspace":
        by_if.update({p.name: p for pts in links.values() for p in pts})
    else:  # lK-eth0/1 do not exist with netem: they stand for the link's switch ports
        by_if.update({f"{k}-eth{i}": p for k, pts in links.items() for i, p in enumerate(pts)})
    by_if.update({p.name: p for p in hosts.values()})
    out: dict[str, CapturePoint] = {}
    for i, item in enumerate(spec.interfaces):
        if item in hosts:
            found = [hosts[item]]
        elif item in links:
            found = links[item]
        elif any(s.name == item for s in plan.switches):
            found = [p for p in ports if p.switch == item]
        elif item in by_if:
            found = [by_if[item]]
        else:
            hint = did_you_mean(item, [*hosts, *links, *by_if])
            raise PlanError(f"capture.interfaces.{i}: {item!r} is not a host, switch, link emulator (lK) or "
                            f"interface of the plan{hint} (see `testbed plan`)")
        for p in found:
            out.setdefault(p.name, p)
    if not out:
        raise PlanError("capture.interfaces: the list is empty; use edge, all or name interfaces")
    return list(out.values())


def validate_capture(plan: Plan) -> None:
    """Check the experiment's ``capture:`` names against the plan (no-op without ``capture:``).

    Raises :class:`testbed.plan.resolved.PlanError` naming the offending item; builds nothing.
    """
    spec = plan.experiment.capture
    if spec is not None:
        for p in capture_points(plan, spec, "userspace"):
            if not _IFNAME_RE.match(p.name):
                raise PlanError(f"capture: interface name {p.name!r} is not a valid Linux interface name")


__all__ = ["CapturePoint", "capture_points", "validate_capture"]
