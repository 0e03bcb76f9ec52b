"""The user-space link emulator, run for real between three network namespaces.

Topology (built once per module, removed in the fixture's ``finally``)::

    le-a: a0 10.99.0.1/24 --veth-- l0 [linkemu in le-l] l1 --veth-- b0 10.99.0.2/24 :le-b

Offloads are off on every veth and IPv6 is off in every namespace, so the only frames on the
link are the ones the tests send (ARP and ICMP). Needs root, ``ip``, ``ping`` and ``ethtool``.
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from testbed.emu.linkemu import LinkConfig, LinkEmuError, disable_offloads, netem_available

pytestmark = pytest.mark.emulation

REPO = Path(__file__).resolve().parent.parent
NS_A, NS_L, NS_B = "le-a", "le-l", "le-b"
IP_A, IP_B = "10.99.0.1", "10.99.0.2"
LOCK_PATH = Path("/tmp/le-linkemu-test.lock")


def _sh(cmd: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(cmd, capture_output=True, text=True)
    if check and res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {res.stderr.strip()}")
    return res


def _in(ns: str, *cmd: str) -> list[str]:
    return ["ip", "netns", "exec", ns, *cmd]


def _del_namespaces() -> None:
    for ns in (NS_A, NS_L, NS_B):
        if Path(f"/run/netns/{ns}").exists():
            _sh(["ip", "netns", "del", ns], check=False)


@pytest.fixture(scope="module")
def net() -> Iterator[None]:
    """The three namespaces and two veth pairs; always removed afterwards."""
    if os.geteuid() != 0:
        pytest.skip("needs root (network namespaces, raw sockets)")
    for tool in ("ip", "ping", "ethtool"):
        if shutil.which(tool) is None:
            pytest.skip(f"needs {tool}")
    with open(LOCK_PATH, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one instance of this test at a time
        _del_namespaces()  # left by a killed earlier run of this test (we hold its lock)
        try:
            for ns in (NS_A, NS_L, NS_B):
                _sh(["ip", "netns", "add", ns])
                _sh(_in(ns, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1",
                        "net.ipv6.conf.default.disable_ipv6=1"))
            _sh(["ip", "link", "add", "a0", "netns", NS_A, "type", "veth", "peer", "name", "l0", "netns", NS_L])
            _sh(["ip", "link", "add", "l1", "netns", NS_L, "type", "veth", "peer", "name", "b0", "netns", NS_B])
            for ns, dev in ((NS_A, "a0"), (NS_L, "l0"), (NS_L, "l1"), (NS_B, "b0")):
                disable_offloads(dev, netns=ns)
                _sh(["ip", "-n", ns, "link", "set", dev, "up"])
            _sh(["ip", "-n", NS_A, "addr", "add", f"{IP_A}/24", "dev", "a0"])
            _sh(["ip", "-n", NS_B, "addr", "add", f"{IP_B}/24", "dev", "b0"])
            yield
        finally:
            _del_namespaces()


def _mac(ns: str, dev: str) -> str:
    return json.loads(_sh(["ip", "-j", "-n", ns, "link", "show", dev]).stdout)[0]["address"]


def _static_arp(on: bool) -> None:
    """Permanent neighbour entries (no ARP on the link) or flushed ones (ARP again)."""
    for ns, dev, ip, peer_ns, peer_dev in ((NS_A, "a0", IP_B, NS_B, "b0"), (NS_B, "b0", IP_A, NS_A, "a0")):
        if on:
            _sh(["ip", "-n", ns, "neigh", "replace", ip, "lladdr", _mac(peer_ns, peer_dev), "dev", dev,
                 "nud", "permanent"])
        else:  # "flush" leaves permanent entries alone
            _sh(["ip", "-n", ns, "neigh", "del", ip, "dev", dev], check=False)


class Emu:
    """Handle of a running emulator; ``stats`` is filled after the context exits."""

    def __init__(self, proc: subprocess.Popen[str], stats_file: Path) -> None:
        self.proc = proc
        self.stats_file = stats_file
        self.stats: dict = {}
        self.returncode: int | None = None
        self.output = ""


@contextmanager
def emulator(tmp_path: Path, delay_ms: float, *extra: str) -> Iterator[Emu]:
    """Run ``python -m testbed.emu.linkemu`` in le-l; SIGTERM it on exit and read its stats."""
    stats_file = tmp_path / "sub" / "stats.json"  # parent does not exist yet: the emulator creates it
    cmd = _in(NS_L, sys.executable, "-m", "testbed.emu.linkemu", "--if-a", "l0", "--if-b", "l1",
              "--delay-ms", str(delay_ms), "--stats-file", str(stats_file), *extra)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    emu = Emu(proc, stats_file)
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 15)
        line = proc.stdout.readline() if ready else ""
        assert "linkemu ready" in line, f"emulator did not start: {line!r}"
        yield emu
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            emu.output = proc.communicate(timeout=10)[0]
        except subprocess.TimeoutExpired:
            proc.kill()
            emu.output = proc.communicate()[0]
        emu.returncode = proc.returncode
        if stats_file.exists():
            emu.stats = json.loads(stats_file.read_text())


def ping(count: int, interval: float, quiet_loss: bool = False) -> tuple[int, int, list[float], list[int]]:
    """Ping b0 from a0. Returns (transmitted, received, RTTs in ms, icmp_seq in arrival order)."""
    out = _sh(_in(NS_A, "ping", "-n", "-c", str(count), "-i", str(interval), "-W", "1", IP_B), check=False).stdout
    rtts, seqs = [], []
    for line in out.splitlines():
        fields = dict(tok.split("=", 1) for tok in line.split() if "=" in tok)
        if "time" in fields and "icmp_seq" in fields:
            rtts.append(float(fields["time"]))
            seqs.append(int(fields["icmp_seq"]))
    summary = next(line for line in out.splitlines() if "packets transmitted" in line).split()
    sent, received = int(summary[0]), int(summary[3])
    if not quiet_loss:
        assert received == sent, f"unexpected loss:\n{out}"
    return sent, received, rtts, seqs


def test_delay_10ms_rtt_and_stats(net: None, tmp_path: Path) -> None:
    """2 x 10 ms: no RTT below 20 ms and the fastest within [20, 22] ms; stats count every frame.

    The fastest of 20 pings, not the median: on a busy machine the emulator and ping wake late
    (the emulator counts its own lateness in ``max_lateness_us``), which only ever adds time."""
    _static_arp(False)
    with emulator(tmp_path, 10.0) as emu:
        sent_w, recv_w, _, _ = ping(2, 0.05)  # warm-up (includes ARP through the emulator)
        sent, received, rtts, seqs = ping(20, 0.05)
    assert emu.returncode == 0, emu.output
    assert len(rtts) == 20 and seqs == sorted(seqs)
    assert 20.0 <= min(rtts) <= 22.0, rtts
    st = emu.stats
    assert set(st) >= {"frames_ab", "frames_ba", "bytes_ab", "bytes_ba", "lost_ab", "lost_ba",
                       "max_lateness_us", "mean_lateness_us"}
    # every echo request went a->b and every reply b->a; the rest are ARP (request/reply, probes)
    assert 0 <= st["frames_ab"] - (sent_w + sent) <= 4, st
    assert 0 <= st["frames_ba"] - (recv_w + received) <= 4, st
    assert st["bytes_ab"] >= 98 * (sent_w + sent)  # an echo request frame is 98 bytes
    assert st["lost_ab"] == st["lost_ba"] == 0
    assert 0 <= st["mean_lateness_us"] <= st["max_lateness_us"]


def test_delay_half_ms(net: None, tmp_path: Path) -> None:
    """2 x 0.5 ms: no RTT below 1.0 ms and the fastest within [1.0, 2.5] ms (sub-millisecond
    sleeps are precise)."""
    with emulator(tmp_path, 0.5) as emu:
        ping(2, 0.05)
        _, _, rtts, _ = ping(20, 0.05)
    assert emu.returncode == 0, emu.output
    assert 1.0 <= min(rtts) <= 2.5, rtts


def test_jitter_keeps_order(net: None, tmp_path: Path) -> None:
    """With jitter larger than the ping interval, replies still arrive in sequence order, and the
    delay varies both ways around 2 x 5 ms (never below 2 x (5 - 4) ms; some below 10 ms). No upper
    bound: a busy machine only ever adds time."""
    with emulator(tmp_path, 5.0, "--jitter-ms", "4", "--seed", "3") as emu:
        ping(2, 0.05)
        _, _, rtts, seqs = ping(60, 0.002)
    assert emu.returncode == 0, emu.output
    assert seqs == sorted(seqs)
    assert 2.0 <= min(rtts) < 10.0, rtts
    assert len(set(rtts)) > 5  # the delay does vary


def _loss_run(tmp_path: Path) -> tuple[int, dict]:
    with emulator(tmp_path, 1.0, "--loss-pct", "50", "--seed", "1234") as emu:
        sent, received, _, _ = ping(200, 0.005, quiet_loss=True)
    assert emu.returncode == 0, emu.output
    assert sent == 200
    return received, emu.stats


def test_loss_is_random_but_reproducible(net: None, tmp_path: Path) -> None:
    """50 % loss per direction, fixed seed: fractions near 0.5 and the same drops on a rerun.

    Without ARP (permanent neighbours) and IPv6 the frame sequence on the link is fixed, so the
    seeded per-direction generators drop exactly the same frames each time.
    """
    _static_arp(True)
    try:
        received, st = _loss_run(tmp_path / "1")
        received2, st2 = _loss_run(tmp_path / "2")
    finally:
        _static_arp(False)
    assert st["frames_ab"] + st["lost_ab"] == 200, st  # every request, delivered or dropped
    assert st["frames_ba"] + st["lost_ba"] == st["frames_ab"], st  # one reply per delivered request
    assert received == st["frames_ba"]
    assert 0.3 <= st["lost_ab"] / 200 <= 0.7, st
    assert 0.3 <= st["lost_ba"] / st["frames_ab"] <= 0.7, st
    assert 0.6 <= 1 - received / 200 <= 0.9  # round trip: 1 - 0.5 * 0.5 = 0.75 expected
    keys = ("frames_ab", "frames_ba", "lost_ab", "lost_ba", "bytes_ab", "bytes_ba")
    assert {k: st[k] for k in keys} == {k: st2[k] for k in keys}
    assert received == received2


_VLAN_RX = """
import select, socket, struct, sys, time
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3))
s.bind(("b0", 3))
s.setsockopt(263, 8, 1)  # SOL_PACKET, PACKET_AUXDATA
print("ready", flush=True)
end = time.monotonic() + 5
while time.monotonic() < end:
    if not select.select([s], [], [], 0.2)[0]:
        continue
    data, anc, _, _ = s.recvmsg(2048, 256)
    for _, ctype, cdata in anc:
        status, _, _, _, _, tci, tpid = struct.unpack("=IIIHHHH", cdata)
        if ctype == 8 and data[12:14] == b"\\x88\\xb5":
            print(status & 0x10, tci, hex(tpid), data[14:24].decode(), flush=True)
            sys.exit(0)
sys.exit(1)
"""

_VLAN_TX = """
import socket, struct
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind(("a0", 0))
tag = struct.pack("!HHH", 0x8100, (3 << 13) | 10, 0x88b5)  # PCP 3, VID 10, local experimental type
s.send(b"\\xff" * 6 + bytes.fromhex("020000000001") + tag + b"hello-vlan".ljust(46, b"\\0"))
"""


def test_vlan_tag_survives(net: None, tmp_path: Path) -> None:
    """An 802.1Q-tagged frame leaves with its tag (the kernel hands it over untagged + auxdata)."""
    with emulator(tmp_path, 1.0) as emu:
        rx = subprocess.Popen(_in(NS_B, sys.executable, "-c", _VLAN_RX), stdout=subprocess.PIPE, text=True)
        try:
            assert rx.stdout is not None and rx.stdout.readline().strip() == "ready"
            _sh(_in(NS_A, sys.executable, "-c", _VLAN_TX))
            out = rx.communicate(timeout=10)[0].split()
        finally:
            if rx.poll() is None:
                rx.kill()
                rx.wait()
    assert emu.returncode == 0, emu.output
    assert out == ["16", str((3 << 13) | 10), "0x8100", "hello-vlan"]
    assert emu.stats["bytes_ab"] == 64  # 14 + 4 (tag) + 46


def test_cli_rejects_missing_interface(net: None) -> None:
    """A wrong interface name is a clear error with exit code 2, not a traceback."""
    res = _sh(_in(NS_L, sys.executable, "-m", "testbed.emu.linkemu", "--if-a", "nope0", "--if-b", "l1",
                  "--delay-ms", "1"), check=False)
    assert res.returncode == 2
    assert "no interface named 'nope0'" in res.stderr


def test_config_validation() -> None:
    with pytest.raises(LinkEmuError):
        LinkConfig("x", "y", delay_ms=-1).validate()
    with pytest.raises(LinkEmuError):
        LinkConfig("x", "y", delay_ms=1, loss_pct=101).validate()
    with pytest.raises(LinkEmuError):
        LinkConfig("x", "x", delay_ms=1).validate()


def test_netem_probe_cleans_up() -> None:
    """The probe answers a bool and leaves no ``tbprobe`` namespace behind."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    netem_available.cache_clear()
    assert isinstance(netem_available(), bool)
    left = [p.name for p in Path("/run/netns").glob(f"tbprobe-{os.getpid()}-*")] if Path("/run/netns").exists() else []
    assert left == []


def test_netdev_configure_matches_ethtool_in_a_namespace() -> None:
    """testbed.emu.netdev (the bring-up's in-process set-up) leaves a veth end in another
    namespace exactly as ``ethtool -K ... rx off tx off sg off tso off gso off gro off`` leaves
    one in the root namespace, up, with IPv6 off there and the root namespace's defaults untouched."""
    from testbed.emu import netdev

    if os.geteuid() != 0 or shutil.which("ethtool") is None:
        pytest.skip("needs root and ethtool")
    ns = "le-nd"
    _sh(["ip", "netns", "del", ns], check=False)
    _sh(["ip", "netns", "add", ns])
    holder = subprocess.Popen(_in(ns, "sleep", "60"))
    try:
        _sh(["ip", "link", "add", "lend0", "type", "veth", "peer", "name", "lend1", "netns", ns])
        _sh(["ip", "link", "add", "lend2", "type", "veth", "peer", "name", "lend3"])
        _sh(["ethtool", "-K", "lend2", "rx", "off", "tx", "off", "sg", "off", "tso", "off", "gso", "off", "gro", "off"])
        root_default = Path("/proc/sys/net/ipv6/conf/default/disable_ipv6").read_text()
        netdev.configure(holder.pid, ["lend1"], namespace_ipv6_off=True)

        def features(cmd: list[str]) -> list[str]:
            return [ln.split(":")[1].split()[0] for ln in _sh(cmd).stdout.splitlines()[1:] if ":" in ln]

        assert features(_in(ns, "ethtool", "-k", "lend1")) == features(["ethtool", "-k", "lend2"])
        assert netdev.read_features(holder.pid, "lend1") == netdev.read_features(None, "lend2")
        flags = _sh(_in(ns, "ip", "-o", "link", "show", "lend1")).stdout.split("<", 1)[1].split(">", 1)[0]
        assert "UP" in flags.split(",")
        for conf in ("lend1", "all", "default"):
            assert _sh(_in(ns, "cat", f"/proc/sys/net/ipv6/conf/{conf}/disable_ipv6")).stdout.strip() == "1"
        assert Path("/proc/sys/net/ipv6/conf/default/disable_ipv6").read_text() == root_default
        with pytest.raises(netdev.NetdevError, match="nosuch"):
            netdev.configure(holder.pid, ["nosuch"])
    finally:
        holder.kill()
        holder.wait()
        _sh(["ip", "link", "del", "lend2"], check=False)
        _sh(["ip", "netns", "del", ns], check=False)
