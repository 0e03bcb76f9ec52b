#!/usr/bin/env python3
"""Inference-server benchmark: overhead over the bare model call, max sustained q/s per core, RSS.

    .venv/bin/python benchmarks/server_bench.py [--variants digits_small,digits_large,...] [--families hands,faces]
        [--runtimes tensorflow,litert] [--group family|all] [--duration 3] [--latency-queries 300]
        [--concurrency 4] [--no-cgroup] [--client raw|http.client] [--pin CPU] [--json out.json] [--decode]

For each runtime (tensorflow, litert) and, with ``--group family`` (default), each application
family, one server subprocess (``python -m testbed.serve.server CONFIG.json``, a
``testbed.plan.boundaries.ServerConfig``: 1 worker, 1 thread, 30 warm-up calls) serves the selected
variants that have that runtime on 127.0.0.1, held to ONE core by a CFS quota
(``testbed.core.cgroups``, period 100 ms; ``--no-cgroup``: unlimited).
Queries are the family's request bodies (``zoo.request_bodies``: JPEG frames in b64 for the image
families); their mean size [bytes] is printed per family.

1. Overhead at low load: one query at a time over a kept-alive HTTP connection (``RawHTTP``, a
   thin socket client, so that the figure is the server's and not a client library's;
   ``--client http.client`` for the standard library's, as before Dec 2 2026),
   a single held-out input per query. Per query: client round trip (send -> answer parsed) and
   the server's model call (T3 - T2 response headers). Overhead = round trip - model call: HTTP
   on both sides, JSON encode/decode, queue hand-off. Reported as p50 / p95 [ms], with the model
   call's p50 and the bare model call's p50 from ``models/profiles`` for comparison, and the
   server-side part before the model call (T2 - T1: JSON decoding + queue hand-off). The HTTP
   baseline is the p50 round trip of ``GET /v1/models/NAME`` on the same connection (client,
   TCP, aiohttp, no body, no model); "predict path adds" = overhead p50 - that baseline: what the
   predict path itself (decode, queue hand-off, encode) costs over any HTTP request. The round
   trip ends when the answer's bytes are read; the client's JSON parse is timed apart. The
   overhead's stages (sent -> T1, T1 -> T2, T3 -> answer) are on the host's one clock.
   ``--pin CPU`` holds the server's threads to one CPU and the clients to the others (the
   thread hand-offs then stay on one core). ``--decode``: only the JPEG decode path, PIL
   against the server's (simplejpeg), caches warm and cold, with a check that both give the
   same pixels.
2. Max sustained q/s per core: a closed loop of ``--concurrency`` clients (aiohttp), each sending
   its next query when the previous answer arrives, for ``--duration`` s; q/s = answers (HTTP
   200) / duration. The server's one core is the bottleneck; the clients run outside its quota
   (on the other core).
3. Memory: VmRSS [MiB] of each server process after warm-up and after the load.

Timings on a shared 2-core machine are noisy (other processes steal CPU): quote them with the
date and the load average printed at the start.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from testbed.plan import profiles, zoo  # noqa: E402

ZOO = REPO / "models" / "zoo"
PROFILES = REPO / "models" / "profiles"


def rss_mib(pid: int) -> float:
    """Resident set size [MiB] of ``pid`` (VmRSS from /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def start_server(runtime: str, variants: list[str], tmp: Path, use_cgroup: bool,
                 pin: int | None = None) -> tuple[subprocess.Popen, int, list]:
    """Start one server (1 worker, 1 thread) for ``variants`` with ``runtime``; return (proc, port, cgroup dirs).

    ``pin``: the CPU the server's threads are held to (``sched_setaffinity``), None: any."""
    from testbed.plan.boundaries import ServerConfig

    ready = tmp / f"{runtime}-{variants[0]}.ready.json"
    cfg = ServerConfig(cluster="bench", host="127.0.0.1", port=0, zoo_dir=str(ZOO), models=variants,
                       runtimes={v: runtime for v in variants}, workers=1, threads=1, queue_limit=256,
                       warmup_calls=30, cpu_cores=1.0, ready_file=str(ready))
    cfg_path = tmp / f"{runtime}-{variants[0]}.server.json"
    cfg_path.write_text(cfg.model_dump_json())
    cmd = [sys.executable, "-m", "testbed.serve.server", str(cfg_path)]
    log = open(tmp / f"{runtime}-{variants[0]}.log", "w")  # noqa: SIM115 - lives as long as the server
    affinity = None if pin is None else (lambda: os.sched_setaffinity(0, {pin}))
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, preexec_fn=affinity)  # noqa: PLW1509
    dirs: list = []
    if use_cgroup:
        from testbed.core import cgroups

        dirs = cgroups.create_limited_group(f"aset-bench-{os.getpid()}-{runtime}-{variants[0]}", 1.0, 4096)
        cgroups.add_process(dirs, proc.pid)
    deadline = time.monotonic() + 180
    while not ready.is_file():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise SystemExit(f"server ({runtime}) did not start: {log.name}: {Path(log.name).read_text()[-2000:]}")
        time.sleep(0.1)
    return proc, json.loads(ready.read_text())["port"], dirs


def stop_server(proc: subprocess.Popen, dirs: list) -> None:
    """SIGTERM, wait, then remove the benchmark's cgroups."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    from testbed.core import cgroups

    cgroups.remove_groups(dirs)


class RawHTTP:
    """A thin HTTP/1.1 client on one kept-alive TCP socket (``TCP_NODELAY``): the request's bytes
    are built once, the answer is read up to its ``Content-Length`` (aiohttp's ``web.Response``
    always sends one) and its headers are split by hand. It times the server, not a client
    library: ``http.client`` parses every answer's headers with the ``email`` package, which cost
    0.35-0.4 ms per query here (``--client http.client`` keeps it, for comparison).

    Raises:
        ConnectionError: the server closed the connection; ValueError: an answer without
        Content-Length.
    """

    def __init__(self, port: int, timeout_s: float = 30.0):
        import socket

        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout_s)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    @staticmethod
    def request_bytes(method: str, path: str, body: bytes = b"") -> bytes:
        """The whole request, head and body, ready to send in one ``sendall``."""
        head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        if method == "POST":
            head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        return (head + "\r\n").encode() + body

    def exchange(self, request: bytes) -> tuple[int, dict[str, str], bytes]:
        """Send ``request``; (status, headers with lower-case names, body) of the answer."""
        self.sock.sendall(request)
        buf = b""
        while (end := buf.find(b"\r\n\r\n")) < 0:
            buf += self._recv()
        lines = buf[:end].decode("latin-1").split("\r\n")
        headers = dict((k.strip().lower(), v.strip()) for k, _, v in (ln.partition(":") for ln in lines[1:]))
        if "content-length" not in headers:
            raise ValueError(f"answer without Content-Length: {lines[0]!r}")
        need = end + 4 + int(headers["content-length"])
        while len(buf) < need:
            buf += self._recv()
        return int(lines[0].split()[1]), headers, buf[end + 4:need]

    def _recv(self) -> bytes:
        chunk = self.sock.recv(1 << 18)
        if not chunk:
            raise ConnectionError("the server closed the connection")
        return chunk

    def close(self) -> None:
        """Close the socket."""
        self.sock.close()


class LibHTTP:
    """The same interface through ``http.client`` (the client library's cost included)."""

    def __init__(self, port: int, timeout_s: float = 30.0):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)

    @staticmethod
    def request_bytes(method: str, path: str, body: bytes = b"") -> tuple[str, str, bytes]:
        """(method, path, body): ``http.client`` builds the bytes itself."""
        return method, path, body

    def exchange(self, request: tuple[str, str, bytes]) -> tuple[int, dict[str, str], bytes]:
        """Send ``request``; (status, headers with lower-case names, body) of the answer."""
        method, path, body = request
        self.conn.request(method, path, body or None, {"Content-Type": "application/json"} if body else {})
        resp = self.conn.getresponse()
        raw = resp.read()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, raw

    def close(self) -> None:
        """Close the connection."""
        self.conn.close()


CLIENTS = {"raw": RawHTTP, "http.client": LibHTTP}


def latency(port: int, variant: str, bodies: list[bytes], n: int, client: str = "raw") -> dict[str, float]:
    """Sequential queries; p50/p95 of round trip, model call (T3 - T2) and overhead [ms], and the
    overhead's stages on the host's one clock (``time.time_ns``, which the server stamps too):
    request sent -> T1 (client send, server's HTTP read), T1 -> T2 (body decode, queue hand-off),
    T3 -> answer received (hand-back, encode, HTTP write, client read). The round trip ends when
    the answer's bytes are read; the client's JSON parse of it is timed apart (``client_parse``),
    as it is the client's work, not the server's. ``client``: a key of :data:`CLIENTS` (``raw``:
    :class:`RawHTTP`, the default; ``http.client``: the standard library's client)."""
    conn = CLIENTS[client](port)
    rtt, model, pre, send, post, parse = [], [], [], [], [], []
    requests = [conn.request_bytes("POST", f"/v1/models/{variant}:predict", b) for b in bodies]
    for i in range(n + 20):
        t0, w0 = time.perf_counter_ns(), time.time_ns()
        status, headers, raw = conn.exchange(requests[i % len(requests)])
        t4, w4 = time.perf_counter_ns(), time.time_ns()
        json.loads(raw)
        t5 = time.perf_counter_ns()
        if status != 200:
            raise SystemExit(f"{variant}: HTTP {status}: {raw[:200]!r}")
        if i >= 20:  # the first 20: connection and cache warm-up
            t1, t2, t3 = (int(headers[f"x-testbed-t{k}"]) for k in (1, 2, 3))
            rtt.append((t4 - t0) / 1e6)
            model.append((t3 - t2) / 1e6)
            pre.append((t2 - t1) / 1e6)
            send.append((t1 - w0) / 1e6)
            post.append((w4 - t3) / 1e6)
            parse.append((t5 - t4) / 1e6)
    base = []
    status_request = conn.request_bytes("GET", f"/v1/models/{variant}")
    for i in range(n // 2 + 10):  # the same client and HTTP stack, no body, no model: GET model status
        t0 = time.perf_counter_ns()
        conn.exchange(status_request)
        if i >= 10:
            base.append((time.perf_counter_ns() - t0) / 1e6)
    conn.close()
    over = np.asarray(rtt) - np.asarray(model)
    return {"rtt_p50_ms": float(np.median(rtt)), "model_p50_ms": float(np.median(model)),
            "overhead_p50_ms": float(np.median(over)), "overhead_p95_ms": float(np.percentile(over, 95)),
            "overhead_p99_ms": float(np.percentile(over, 99)),
            "send_to_t1_p50_ms": float(np.median(send)), "decode_queue_p50_ms": float(np.median(pre)),
            "t3_to_answer_p50_ms": float(np.median(post)), "client_parse_p50_ms": float(np.median(parse)),
            "http_baseline_p50_ms": float(np.median(base)),
            "server_added_p50_ms": float(np.median(over) - np.median(base))}


def decode_bench(families: list[str], frames: int = 64, reps: int = 256) -> dict[str, Any]:
    """Per family: median time [us] to turn one JPEG frame into the model's float32 input, through
    PIL (decode, copy out, / 255) and through the server's path
    (:func:`testbed.serve.payload.decode_frame`: simplejpeg), with caches warm and with them
    cold (a 32 MB sweep before each frame, as a model call leaves them); and whether the two give
    the same pixels on every frame."""
    import io

    from PIL import Image

    from testbed.serve import payload

    def pil(raw: bytes, shape: tuple[int, ...]) -> np.ndarray:
        with Image.open(io.BytesIO(raw)) as img:
            rgb = img.convert("RGB")
            if rgb.size != (shape[1], shape[0]):
                rgb = rgb.resize((shape[1], shape[0]), Image.BILINEAR)
            return np.asarray(rgb, dtype=np.float32) / np.float32(255.0)

    zoo.ensure_zoo(ZOO)
    sweep = np.ones(8_000_000, np.float32)
    out: dict[str, Any] = {}
    for fam in families:
        jpegs = zoo.load_jpegs(ZOO, fam)[:frames]
        shape = tuple(zoo.load_payloads(ZOO, fam)[0].shape[1:])
        row: dict[str, Any] = {"frames": len(jpegs), "shape": list(shape)}
        def server(raw: bytes, shape: tuple[int, ...]) -> np.ndarray:
            return payload.decode_frame(raw, shape, "x")

        for name, fn in (("pil", pil), ("server", server)):
            for cold in (False, True):
                ts = []
                for i in range(reps):
                    if cold:
                        sweep[::16] += 1.0
                    t0 = time.perf_counter_ns()
                    fn(jpegs[i % len(jpegs)], shape)
                    ts.append(time.perf_counter_ns() - t0)
                row[f"{name}_{'cold' if cold else 'warm'}_us"] = round(float(np.median(ts[20:])) / 1e3, 1)
        row["same_pixels"] = all(np.array_equal(pil(j, shape), server(j, shape)) for j in jpegs)
        out[fam] = row
        print(f"decode {fam:<9} {shape}: PIL {row['pil_warm_us']:.0f} us warm / {row['pil_cold_us']:.0f} us cold; "
              f"server (simplejpeg) {row['server_warm_us']:.0f} / {row['server_cold_us']:.0f} us; "
              f"same pixels on {row['frames']} frames: {row['same_pixels']}", flush=True)
    return out


async def closed_loop(port: int, variant: str, bodies: list[bytes], concurrency: int, duration_s: float) -> float:
    """Answers per second with ``concurrency`` clients in a closed loop for ``duration_s``."""
    import aiohttp

    url = f"http://127.0.0.1:{port}/v1/models/{variant}:predict"
    ok = 0
    end = time.monotonic() + duration_s
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        async def client(k: int) -> None:
            nonlocal ok
            i = k
            while time.monotonic() < end:
                async with session.post(url, data=bodies[i % len(bodies)],
                                        headers={"Content-Type": "application/json"}) as resp:
                    await resp.read()
                    ok += resp.status == 200
                i += concurrency

        t = time.monotonic()
        await asyncio.gather(*(client(k) for k in range(concurrency)))
        return ok / (time.monotonic() - t)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print a table (and optionally JSON)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variants", default="all")
    ap.add_argument("--families", default="", help="only variants of these comma-separated families")
    ap.add_argument("--group", default="family", choices=("family", "all"),
                    help="one server per family (RSS per application) or one for all variants")
    ap.add_argument("--runtimes", default="tensorflow,litert")
    ap.add_argument("--duration", type=float, default=3.0, help="seconds of closed-loop load per variant")
    ap.add_argument("--latency-queries", type=int, default=300)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--no-cgroup", action="store_true")
    ap.add_argument("--client", default="raw", choices=sorted(CLIENTS),
                    help="the low-load client: a thin socket client (raw) or the standard library's http.client")
    ap.add_argument("--pin", type=int, default=None, metavar="CPU",
                    help="hold the server's threads to this CPU and the clients to the others")
    ap.add_argument("--json", default=None)
    ap.add_argument("--decode", action="store_true",
                    help="only time the JPEG decode path (PIL against the server's) per image family")
    args = ap.parse_args(argv)
    if args.decode:
        fams = [f for f in args.families.split(",") if f] or ["hands", "faces", "imagenet"]
        res = decode_bench(fams)
        if args.json:
            Path(args.json).write_text(json.dumps(res, indent=1))
        return 0
    if args.pin is not None:
        others = set(range(os.cpu_count() or 1)) - {args.pin}
        if args.pin not in os.sched_getaffinity(0) or not others:
            raise SystemExit(f"--pin {args.pin}: not one of this machine's CPUs {sorted(os.sched_getaffinity(0))}, "
                             "or no other CPU is left for the clients")
        os.sched_setaffinity(0, others)
    manifest = zoo.ensure_zoo(ZOO)
    variants = list(manifest["variants"]) if args.variants == "all" else args.variants.split(",")
    fams = [f for f in args.families.split(",") if f]
    variants = [v for v in variants if not fams or manifest["variants"][v]["family"] in fams]
    bodies = {v: zoo.request_bodies(ZOO, manifest["variants"][v]["family"], 64)[0] for v in variants}
    print(f"# {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}, load average {os.getloadavg()[0]:.2f}, "
          f"{os.cpu_count()} cores, server quota {'none' if args.no_cgroup else '1 core'}, client {args.client}, "
          f"server CPU {'any' if args.pin is None else args.pin}")
    for fam in dict.fromkeys(manifest["variants"][v]["family"] for v in variants):
        sizes = [len(b) for b in zoo.request_bodies(ZOO, fam, 64)[0]]
        print(f"# request body of {fam}: mean {np.mean(sizes):.0f} bytes (min {min(sizes)}, max {max(sizes)})")
    results: dict[str, Any] = {}
    groups = ({f: [v for v in variants if manifest["variants"][v]["family"] == f]
               for f in dict.fromkeys(manifest["variants"][v]["family"] for v in variants)}
              if args.group == "family" else {"all": variants})
    with tempfile.TemporaryDirectory() as d:
        for rt, group, names in ((rt, g, [v for v in vs if rt in zoo.runtimes_of(manifest, v)])
                                 for rt in args.runtimes.split(",") for g, vs in groups.items()):
            if not names:
                continue
            proc, port, dirs = start_server(rt, names, Path(d), not args.no_cgroup, args.pin)
            try:
                res: dict[str, Any] = {"rss_mib_ready": round(rss_mib(proc.pid), 1), "variants": {}}
                for v in names:
                    lat = latency(port, v, bodies[v], args.latency_queries, args.client)
                    qps = asyncio.run(closed_loop(port, v, bodies[v], args.concurrency, args.duration))
                    try:
                        bare = profiles.service_time(PROFILES, v, 1.0, 1, rt).p50_ms
                    except zoo.ZooError:
                        bare = float("nan")
                    res["variants"][v] = {**{k: round(x, 3) for k, x in lat.items()}, "bare_p50_ms": bare,
                                          "max_qps_per_core": round(qps, 1)}
                    r = res["variants"][v]
                    print(f"{rt:<10} {v:<14} overhead p50 {r['overhead_p50_ms']:.3f} ms p95 {r['overhead_p95_ms']:.3f}"
                          f" (HTTP GET baseline {r['http_baseline_p50_ms']:.3f}, predict path adds "
                          f"{r['server_added_p50_ms']:.3f}; stages: sent->T1 {r['send_to_t1_p50_ms']:.3f}, "
                          f"T1->T2 {r['decode_queue_p50_ms']:.3f}, T3->answer {r['t3_to_answer_p50_ms']:.3f}; "
                          f"client parse apart {r['client_parse_p50_ms']:.3f})"
                          f" | model call p50 {r['model_p50_ms']:.3f} (profile {bare:.3f}) | round trip p50 "
                          f"{r['rtt_p50_ms']:.3f} ms | max {r['max_qps_per_core']:.0f} q/s per core", flush=True)
                res["rss_mib_after"] = round(rss_mib(proc.pid), 1)
                print(f"{rt:<10} {group} server RSS {res['rss_mib_ready']:.0f} MiB after warm-up, "
                      f"{res['rss_mib_after']:.0f} MiB after the load ({', '.join(names)})", flush=True)
            finally:
                stop_server(proc, dirs)
            results[f"{rt}/{group}"] = res
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
