"""Client side of the testbed's Ryu controller (``controllers/testbed_controller.py``).

The orchestrator writes the controller config (:func:`write_config`), starts a real
``ryu-manager`` (:func:`start_controller`, via :mod:`testbed.sdn.launcher`), waits until every
switch and link is there and the flows are installed (:func:`wait_ready`), reads link statistics
and installed paths over the REST API (:func:`get_links`, :func:`get_path`, :func:`get_paths`,
:func:`get_status`) and stops it (:func:`stop_controller`).

Units: delays in ms, bandwidths and rates in Mbit/s, times in seconds, ports are TCP ports.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from testbed.core.errors import RunFailure
from testbed.core.lifeline import tied_popen
from testbed.core.util import REPO_ROOT, stopped, write_json_atomic
from testbed.plan.boundaries import ControllerConfig

#: The Ryu app: the copy an installed package ships (setup.py copies ``controllers/testbed_controller.py``,
#: its source, into ``testbed/sdn/ryu_app/``), else the checkout's.
_SHIPPED_APP = Path(__file__).resolve().parent / "ryu_app" / "testbed_controller.py"
CONTROLLER_APP = _SHIPPED_APP if _SHIPPED_APP.is_file() else REPO_ROOT / "controllers" / "testbed_controller.py"
CONFIG_ENV = "TESTBED_CONTROLLER_CONFIG"
PINS_ENV = "TESTBED_CONTROLLER_PINS"

#: ryu-manager's start on the 2-core machine spends ~0.4 s of CPU in two imports that it never
#: uses: eventlet's green DNS resolver (dnspython; every address here is numeric) and, through
#: eventlet's ``import distutils.version``, setuptools' distutils shim (pkg_resources). Both
#: switches are eventlet's and setuptools' own.
FAST_START_ENV = {"EVENTLET_NO_GREENDNS": "yes", "SETUPTOOLS_USE_DISTUTILS": "stdlib"}
#: The controller's nice value when started by root: that of the system's ovs-vswitchd (and the
#: shards'), so that on a busy machine neither LLDP, the REST answers nor ARP for unplanned hosts
#: starve behind the real-time link emulators and the load (a nice-0 controller stalled for seconds
#: at load 16-77 and lost links with no event).
CONTROLLER_NICE = -10

#: rest_port -> (process, log path) of controllers started by this process (for wait_ready messages).
_STARTED: dict[int, tuple[subprocess.Popen, Path, int]] = {}


class ControllerError(RunFailure):
    """The controller could not be started, or its REST API answered with an error."""


class ControllerNotReady(ControllerError):
    """The controller did not see every switch and link (or did not install flows) in time."""


# --------------------------------------------------------------------------- config


def write_config(path: str | Path, switches: Iterable[Mapping[str, Any]] | None = None,
                 links: Iterable[Mapping[str, Any]] = (), hosts: Iterable[Mapping[str, Any]] = (),
                 stats_interval_s: float = 1.0, config: ControllerConfig | None = None) -> Path:
    """Write the controller's config (a :class:`testbed.plan.boundaries.ControllerConfig`, read by the
    Ryu app from ``$TESTBED_CONTROLLER_CONFIG``): ``config`` as given, or built from the parts.

    Args:
        path: file to write (parent directories are created).
        switches: ``{"name": str, "dpid": int}`` each.
        links: undirected switch links ``{"a": dpid, "b": dpid, "delay_ms": float (one-way, ms),
            "bandwidth_mbps": float (Mbit/s)}``; switch ports are discovered by LLDP.
        hosts: ``{"name", "mac", "ip", "dpid", "port" (switch port number), "delay_ms" (ms),
            "bandwidth_mbps" (Mbit/s)}`` each.
        stats_interval_s: port statistics polling period, seconds (> 0).

    Returns:
        The path written.

    Raises:
        ValueError: duplicate or unknown DPIDs, self-loops or duplicate links, bad MACs, duplicate
            MACs or IPs, negative delays, non-positive bandwidths or interval (the message names the
            offending item).
    """
    if config is None:
        try:
            config = ControllerConfig(switches=[dict(s) for s in switches or ()], links=[dict(lk) for lk in links],
                                      hosts=[{**h, "mac": str(h["mac"]).lower()} for h in hosts],
                                      stats_interval_s=stats_interval_s)
        except ValidationError as exc:
            raise ValueError("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg'].removeprefix('Value error, ')}"
                                       for e in exc.errors())) from None
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, config)
    return path


# --------------------------------------------------------------------------- process


def _python() -> str:
    """A Python interpreter that can import ``ryu`` and ``testbed`` (this one, else the repo venv)."""
    if importlib.util.find_spec("ryu") is not None:
        return sys.executable
    venv = REPO_ROOT / ".venv" / "bin" / "python"
    if venv.exists():
        return str(venv)
    raise ControllerError("Ryu is not installed for this Python and there is no .venv; run ./install.sh")


def _port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def controller_command(of_port: int, rest_port: int, app: str | Path = CONTROLLER_APP,
                       of_host: str = "127.0.0.1") -> list[str]:
    """The ``ryu-manager`` command line used by :func:`start_controller` (OpenFlow on ``of_host``,
    REST on 127.0.0.1)."""
    return [_python(), "-m", "testbed.sdn.launcher", "--observe-links",
            "--ofp-listen-host", of_host, "--ofp-tcp-listen-port", str(of_port),
            "--wsapi-host", "127.0.0.1", "--wsapi-port", str(rest_port), str(app)]


def start_controller(config_path: str | Path, of_port: int, rest_port: int, log_path: str | Path,
                     pins_path: str | Path | None = None, of_host: str = "127.0.0.1",
                     check_s: float = 0.3) -> subprocess.Popen:
    """Start ``ryu-manager`` with the testbed app, in its own process group.

    Args:
        config_path: JSON written by :func:`write_config`.
        of_port: OpenFlow TCP port the switches connect to (127.0.0.1).
        rest_port: REST TCP port (127.0.0.1).
        log_path: file receiving the controller's stdout and stderr (parents created).
        pins_path: JSON list of pinned probe pairs (``{"a_mac", "b_mac", "a", "b"}``: their traffic
            crosses exactly the link between DPIDs a and b), or None.
        of_host: the address the switches connect to (127.0.0.1, or the OVS shards' control address).
        check_s: seconds to wait for an immediate exit (0: the caller watches the process itself).

    Returns:
        The running process (``start_new_session=True``: its pid is its process group id), at
        nice :data:`CONTROLLER_NICE` when started by root.

    Raises:
        FileNotFoundError: ``config_path`` does not exist.
        ControllerError: a port is already in use, Ryu is missing, or ryu-manager exits at once.
    """
    config_path = Path(config_path).resolve()
    if not config_path.is_file():
        raise FileNotFoundError(f"controller config {config_path} does not exist (write it with write_config)")
    for what, port, host in (("OpenFlow", of_port, of_host), ("REST", rest_port, "127.0.0.1")):
        if _port_in_use(port, host):
            raise ControllerError(f"{what} port {port} on 127.0.0.1 is already in use (another ryu-manager? "
                                  f"see `ss -ltnp 'sport = :{port}'`); choose another port")
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, **{CONFIG_ENV: str(config_path)})
    if pins_path is not None:
        env[PINS_ENV] = str(Path(pins_path).resolve())
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    env.update(FAST_START_ENV)
    with open(log_path, "ab") as log:
        proc = tied_popen(subprocess.Popen, controller_command(of_port, rest_port, of_host=of_host), stdout=log,
                          stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=str(REPO_ROOT),
                          start_new_session=True)
    _STARTED[rest_port] = (proc, log_path, of_port)
    if os.geteuid() == 0:  # only root may lower a nice value; the emulation runs as root
        os.setpriority(os.PRIO_PROCESS, proc.pid, CONTROLLER_NICE)
    time.sleep(check_s)
    if proc.poll() is not None:
        raise ControllerError(f"ryu-manager exited at once with code {proc.returncode}:\n{_tail(log_path)}")
    return proc


def stop_controller(proc: subprocess.Popen, timeout_s: float = 5.0) -> None:
    """Stop a controller started by :func:`start_controller` (SIGTERM to its process group, then
    SIGKILL after ``timeout_s`` seconds). Safe to call twice or on an exited process."""
    for port, entry in list(_STARTED.items()):
        if entry[0] is proc:
            del _STARTED[port]
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
            os.killpg(proc.pid, signal.SIGCONT)  # a stopped controller would hold the SIGTERM until the SIGKILL
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pass
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # leftovers of the group, if any
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=timeout_s)


def _tail(path: Path, lines: int = 15) -> str:
    try:
        text = Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return f"(no log at {path})"
    return "\n".join(text[-lines:]) or f"({path} is empty)"


# --------------------------------------------------------------------------- REST

#: How long a REST request waits for ryu-manager's answer, s. Its one thread also answers every
#: switch's LLDP and port statistics: on backbone/americas (1,138 switches, 2 cores, load 86) a
#: path request went unanswered for 5 s while every switch stayed connected. A dead controller is
#: the health watch's to report (its process), not a timeout's.
REST_TIMEOUT_S = 30.0


def _get(rest_url: str, path: str, params: Mapping[str, str] | None = None, timeout_s: float = REST_TIMEOUT_S,
         body: Mapping[str, Any] | None = None) -> Any:
    """GET ``path`` (or POST ``body`` as JSON) and decode the JSON answer."""
    url = rest_url.rstrip("/") + path
    if params:
        url += "?" + urllib.parse.urlencode(params)
    req = url if body is None else urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                                          headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:  # noqa: S310 - our own 127.0.0.1 API
            return json.loads(r.read())
    except urllib.error.HTTPError as exc:
        body = exc.read().decode(errors="replace")
        try:
            msg = json.loads(body).get("error", body)
        except (ValueError, AttributeError):
            msg = body.strip()[:300]
        raise ControllerError(f"GET {url}: HTTP {exc.code}: {msg}") from exc
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise ControllerError(f"GET {url} failed: {getattr(exc, 'reason', exc)}") from exc


def get_status(rest_url: str, timeout_s: float = REST_TIMEOUT_S) -> dict:
    """``GET /testbed/status``: ``ready``, ``switches_expected``, ``switches_connected``,
    ``missing_switches``, ``links_expected``, ``links_discovered``, ``missing_links``,
    ``flows_installed``, ``switch_names`` ({"dpid": name}), ``unexpected_links``.

    Raises:
        ControllerError: unreachable or an HTTP error.
    """
    return _get(rest_url, "/testbed/status", timeout_s=timeout_s)


def get_links(rest_url: str, timeout_s: float = REST_TIMEOUT_S) -> list[dict]:
    """``GET /testbed/links``: one dict per switch link and host link.

    Keys: ``a``, ``a_port``, ``b``, ``b_port`` (switch links: DPIDs and OpenFlow ports; host links:
    ``a`` is the host name, ``a_port`` None, ``b`` its switch DPID), ``kind`` ("switch"|"host"),
    ``capacity_mbps`` (Mbit/s), ``delay_ms`` (ms), ``t`` (unix s of the newest sample, None before
    two samples), ``rate_mbps_ab``/``rate_mbps_ba`` (Mbit/s in the last stats interval),
    ``util_ab``/``util_ba`` (rate / capacity), ``drops_ab``/``drops_ba`` (packets dropped or in
    error in the last interval), ``drops_total`` (since the controller started), ``a_name``,
    ``b_name``.

    Raises:
        ControllerError: unreachable or an HTTP error.
    """
    return _get(rest_url, "/testbed/links", timeout_s=timeout_s)


def get_path(rest_url: str, src_mac: str, dst_mac: str, timeout_s: float = REST_TIMEOUT_S) -> dict:
    """``GET /testbed/path``: the installed path ``{"src", "dst", "dpids": [...], "delay_ms"}``,
    ``delay_ms`` being the one-way sum of link delays (ms) including both host links.

    Raises:
        ControllerError: unknown MAC (HTTP 404), bad MAC (400), not ready (503), unreachable.
    """
    return _get(rest_url, "/testbed/path", {"src": src_mac, "dst": dst_mac}, timeout_s=timeout_s)


def get_events(rest_url: str, since: int = 0, timeout_s: float = REST_TIMEOUT_S) -> list[dict]:
    """``GET /testbed/events``: the controller's events with ``seq`` > ``since``, each ``{"seq",
    "t" (unix s), "kind", ...}``: ``port_status`` (dpid, switch, port, name, reason, link_down),
    ``link_add`` / ``link_delete`` (src, src_port, dst, dst_port), ``link_change`` (a, b, delay_ms,
    bandwidth_mbps, before), ``reroute`` (reason, switches, flows), ``reroute_done`` (reroute,
    reason, install_ms: ms until every changed switch acknowledged its flows).

    Raises:
        ControllerError: unreachable or an HTTP error.
    """
    return _get(rest_url, "/testbed/events", {"since": str(since)}, timeout_s=timeout_s)


def post_link(rest_url: str, a: int, b: int, delay_ms: float | None = None, bandwidth_mbps: float | None = None,
              timeout_s: float = REST_TIMEOUT_S) -> dict:
    """``POST /testbed/link``: the link between DPIDs ``a`` and ``b`` now has this one-way delay (ms;
    the trees are recomputed) and/or bandwidth (Mbit/s; for utilization). Returns ``{"t", "reroute"}``.

    Raises:
        ControllerError: unknown link (HTTP 404), bad values (400), unreachable.
    """
    body: dict[str, Any] = {"a": a, "b": b}
    if delay_ms is not None:
        body["delay_ms"] = delay_ms
    if bandwidth_mbps is not None:
        body["bandwidth_mbps"] = bandwidth_mbps
    return _get(rest_url, "/testbed/link", timeout_s=timeout_s, body=body)


def get_paths(rest_url: str, timeout_s: float = REST_TIMEOUT_S) -> list[dict]:
    """``GET /testbed/paths``: :func:`get_path` for every ordered pair of distinct hosts.

    Raises:
        ControllerError: not ready (HTTP 503) or unreachable.
    """
    return _get(rest_url, "/testbed/paths", timeout_s=timeout_s)


def _not_ready_message(rest_url: str, status: dict | None, last_error: str | None, timeout_s: float,
                       log_path: Path | None, of_port: int | None) -> str:
    if status is None:
        msg = (f"controller REST API at {rest_url} never answered within {timeout_s:g} s ({last_error}); "
               f"is ryu-manager running?")
        return msg + (f" Its log ({log_path}):\n{_tail(log_path)}" if log_path else "")
    names = {int(k): v for k, v in status.get("switch_names", {}).items()}

    def nm(d: int) -> str:
        return f"{names.get(d, f'dpid{d}')} (dpid {d})"

    problems = []
    for d in status.get("missing_switches", []):
        problems.append(f"switch {nm(d)} never connected: check `ovs-vsctl show` (bridge {names.get(d, '?')} "
                        f"with controller tcp:127.0.0.1:{of_port or '<of_port>'}) and that ovs-vswitchd runs")
    for a, b in status.get("missing_links", []):
        problems.append(f"link {nm(a)} <-> {nm(b)} not discovered by LLDP in both directions: check that the "
                        f"ports are up (`ovs-ofctl -O OpenFlow13 show {names.get(a, a)}`), veth offloads are "
                        f"off, and whatever sits on the link (link emulator) forwards frames")
    if not problems and not status.get("flows_installed"):
        problems.append("topology complete but the switches did not acknowledge the flows (barrier); "
                        "see the controller log")
    msg = f"controller not ready after {timeout_s:g} s: " + "; ".join(problems)
    if log_path:
        msg += f"\nController log ({log_path}), last lines:\n{_tail(log_path, 8)}"
    return msg


def wait_ready(rest_url: str, timeout_s: float = 60.0, poll_s: float = 0.25,
               proc: subprocess.Popen | None = None, nudge: Callable[[], None] | None = None,
               on_connected: Callable[[], None] | None = None) -> dict:
    """Poll ``/testbed/status`` until ``ready`` (all switches, all links both ways, flows acknowledged).

    Args:
        rest_url: e.g. ``http://127.0.0.1:8080``.
        timeout_s: give up after this many seconds.
        poll_s: polling period, seconds.
        proc: the controller process; defaults to the one :func:`start_controller` started for this
            REST port, so an early exit is reported at once with its log.
        nudge: called at each poll while a switch is missing (e.g.
            :meth:`testbed.emu.mininet_network.Emulation.nudge_switches`).
        on_connected: called once: at the first poll that finds every switch connected and the
            controller not yet ready (links still being discovered, flows not yet installed), else
            before returning ready. What it raises propagates.

    Returns:
        The final status dict.

    Raises:
        ControllerNotReady: timeout, or the controller process exited or is stopped (process
            state 'T', named as such); the message names each
            missing switch (name and DPID) and link and says what to check, or quotes the log when
            the REST API never answered or the process died.
    """
    port = urllib.parse.urlparse(rest_url).port
    log_path = of_port = None
    if port in _STARTED:
        started_proc, log_path, of_port = _STARTED[port]
        proc = proc or started_proc
    deadline = time.monotonic() + timeout_s
    status: dict | None = None
    last_error: str | None = None
    while True:
        if proc is not None and proc.poll() is not None:
            tail = _tail(log_path) if log_path else "(log unknown)"
            raise ControllerNotReady(f"ryu-manager exited with code {proc.returncode} before becoming ready:\n{tail}")
        if proc is not None and stopped(proc.pid):
            raise ControllerNotReady(f"ryu-manager is not ready and cannot become so: {stopped(proc.pid)}")
        try:
            status = get_status(rest_url, timeout_s=min(5.0, max(0.5, timeout_s)))
            if status.get("ready"):
                if on_connected is not None:
                    on_connected()
                return status
        except ControllerError as exc:
            last_error = str(exc)
        if on_connected is not None and status is not None and "missing_switches" in status \
                and not status["missing_switches"]:
            on_connected()
            on_connected = None
        if nudge is not None and (status is None or status.get("missing_switches")):
            nudge()
        if time.monotonic() >= deadline:
            raise ControllerNotReady(_not_ready_message(rest_url, status, last_error, timeout_s, log_path, of_port))
        time.sleep(poll_s)
