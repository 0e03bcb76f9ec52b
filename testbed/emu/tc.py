"""``tc`` commands of the emulated network's shaping (HTB with a pfifo or netem leaf), run and read back.

Units: rates in Mbit/s, delays in ms, loss in percent, queues in frames, quantum and burst in
bytes. :func:`htb_commands` shapes a device, :func:`tc_change_commands` changes it at run time,
:func:`run_tc` runs commands in a namespace (one ``tc -batch`` where it can), and
:func:`read_htb_rates_mbps` reads the kernel's rates back (what was applied, ``network.json``).
"""

from __future__ import annotations

import re
import subprocess

from testbed.emu.netplan import EmulationError

#: Frames of the FIFO behind every shaper (HTB leaf, netem limit, the emulator's shaper):
#: a veth's txqueuelen, :data:`testbed.model.network.DEFAULT_QUEUE_PACKETS`.
QUEUE_PACKETS = 1000
#: HTB's class quantum, bytes: explicit, so that no rate triggers "quantum of class is big".
HTB_QUANTUM = 60000


# --------------------------------------------------------------------------- tc commands

def _htb_class(rate_mbps: float) -> list[str]:
    """HTB class parameters: the rate, an explicit quantum, and a burst of at least 15 kB (Mininet's)
    or 1 ms at the rate, so that high rates are reachable between two qdisc wake-ups."""
    burst = max(15000, int(rate_mbps * 1e6 / 8 * 0.001))
    return ["rate", f"{rate_mbps:.6f}mbit", "burst", str(burst), "cburst", str(burst), "quantum", str(HTB_QUANTUM)]


def htb_commands(dev: str, rate_mbps: float, leaf: list[str] | None = None) -> list[list[str]]:
    """``tc`` argv lists that shape ``dev``'s egress at ``rate_mbps`` (HTB, one class), with ``leaf``
    (default ``pfifo limit QUEUE_PACKETS``) as the class's qdisc, on a device without a root qdisc
    of its own (a new veth)."""
    leaf = leaf or ["pfifo", "limit", str(QUEUE_PACKETS)]
    return [["tc", "qdisc", "add", "dev", dev, "root", "handle", "5:", "htb", "default", "1"],
            ["tc", "class", "add", "dev", dev, "parent", "5:", "classid", "5:1", "htb", *_htb_class(rate_mbps)],
            ["tc", "qdisc", "add", "dev", dev, "parent", "5:1", "handle", "10:", *leaf]]


def netem_leaf(delay_ms: float, loss_pct: float) -> list[str]:
    """netem's arguments for a one-way delay (ms) and loss (%)."""
    return ["netem", "delay", f"{delay_ms:.6f}ms", "loss", f"{loss_pct:.6f}%", "limit", str(QUEUE_PACKETS)]


def tc_change_commands(dev: str, state: dict, change: dict) -> list[list[str]]:
    """``tc`` argv lists applying ``change`` (any of ``rate_mbps``, ``delay_ms``, ``loss_pct``) to a
    netem-mode port whose current parameters are ``state`` (same keys)."""
    new = {**state, **change}
    cmds = []
    if "rate_mbps" in change:
        cmds.append(["tc", "class", "change", "dev", dev, "parent", "5:", "classid", "5:1", "htb",
                     *_htb_class(new["rate_mbps"])])
    if "delay_ms" in change or "loss_pct" in change:
        cmds.append(["tc", "qdisc", "change", "dev", dev, "parent", "5:1", "handle", "10:",
                     *netem_leaf(new["delay_ms"], new["loss_pct"])])
    return cmds


def run_tc(cmds: list[list[str]], node=None) -> None:
    """Run ``tc`` (or ``ip``) commands, in order, in the root namespace (``node`` None) or in a
    Mininet node (one shell round trip for all of them).

    Raises:
        EmulationError: a command failed (the first failing one and its stderr are quoted).
    """
    if not cmds:
        return
    if node is None and all(c[0] == "tc" for c in cmds):  # one process: tc -batch, stops at the first failure
        res = subprocess.run(["tc", "-batch", "-"], input="".join(" ".join(c[1:]) + "\n" for c in cmds),
                             capture_output=True, text=True)
        if res.returncode:
            m = re.search(r"Command failed -:(\d+)", res.stderr)
            cmd = " ".join(cmds[int(m.group(1)) - 1]) if m else f"tc -batch of {len(cmds)} commands"
            raise EmulationError(f"'{cmd}' failed: {res.stderr.strip()}")
        return
    if node is None:
        for cmd in cmds:
            res = subprocess.run(cmd, capture_output=True, text=True)
            if res.returncode:
                raise EmulationError(f"'{' '.join(cmd)}' failed: {res.stderr.strip()}")
        return
    script = " && ".join(f"{' '.join(cmd)} 2>&1" for cmd in cmds)
    out = node.cmd(f"{script}; echo rc=$?")
    if not out.rstrip().endswith("rc=0"):
        raise EmulationError(f"'{script}' failed in {node.name}: {out.strip()}")


_TC_RATE = re.compile(r"class htb 5:1 .*?\brate (\d+(?:\.\d+)?)([KMGT]?)bit")
_SI = {"": 1e-6, "K": 1e-3, "M": 1.0, "G": 1e3, "T": 1e6}


def read_htb_rates_mbps(devs: list[str], node=None) -> dict[str, float | None]:
    """:func:`read_htb_rate_mbps` for several devices of one namespace, in one shell."""
    script = "; ".join(f"echo @@{d}; tc class show dev {d}" for d in devs)
    out = subprocess.run(script, shell=True, capture_output=True, text=True).stdout if node is None \
        else node.cmd(script)
    parts = dict(zip(devs, re.split(r"^@@\S+\s*$", out or "", flags=re.M)[1:], strict=False))
    rates = {}
    for d in devs:
        m = _TC_RATE.search(parts.get(d, ""))
        rates[d] = float(m.group(1)) * _SI[m.group(2)] if m else None
    return rates


def read_htb_rate_mbps(dev: str, node=None) -> float | None:
    """The rate of HTB class 5:1 on ``dev`` as the kernel reports it (``tc class show``), Mbit/s;
    None if there is none."""
    cmd = ["tc", "class", "show", "dev", dev]
    out = subprocess.run(cmd, capture_output=True, text=True).stdout if node is None else node.cmd(" ".join(cmd))
    m = _TC_RATE.search(out or "")
    return float(m.group(1)) * _SI[m.group(2)] if m else None
