"""Request handling: the CPU a server spends on each query beside the model call, per variant.

    python -m testbed.serve.handling [--variants all|a,b] [-n 200] [--zoo models/zoo] [--profiles models/profiles]

Why: a cluster's CFS quota pays for everything its server process does, and the server's event
loop parses every request (HTTP, the JSON body, base64, JPEG decoding and resizing to the model's
input) on one thread before the query reaches the queue. For the image families that costs about
as much CPU as the model call itself (benchmarks/server_cpu_bench.py), so a CPU model that charges
only the model calls (the profiles' ``cpu_time`` rows) underestimates throttling
(:mod:`testbed.model.cpu`, :meth:`~testbed.model.cpu.CfsQuota.handle`).

Method, per variant: one real inference server (``python -m testbed.serve.server``, 1 worker,
1 thread, LiteRT where the variant has it, else TensorFlow, or the runtime given; no CPU quota, on
127.0.0.1), queries
one at a time with the family's real request bodies (:func:`testbed.plan.zoo.request_bodies`)
after 20 warm-up ones: first ``n`` back to back (warm), then ``max(30, n / 4)`` each 100 ms after
the previous answer (cold, as the profiler's isolated rows). Per pass, CPU time (user + system,
from ``/proc/<pid>/task/<tid>/stat``) divided by the queries: ``handling_ms`` = the server's main
thread, which runs the event loop and nothing else per query (reading the request and writing the
answer); ``answer_ms`` = the part of it encoding the answer (the server's own count,
``answer_cpu_s`` of ``GET /v1/stats``, by the thread's CPU clock around the encoding: the answer's
writing, t3 -> t3h, which the simulator charges after the call on the same quota; the few
microseconds of aiohttp's hand-off to the socket after T3h stay in ``handling_ms - answer_ms``,
charged before the queue); ``call_cpu_ms`` = every other thread (the worker's model call and its
hand-off). CPU time, not wall time, so that the machine's
other load does not stretch the figures (the wall times of the model call, T3 - T2, are kept
too). Just before the server starts, ``bare_call_cpu_ms``: the same model's bare call in this
process, as the profiler makes it (1 thread, back to back, ``n`` calls; for TensorFlow the
process's CPU time, as its executor runs a graph's ops on its own pool threads). ``call_cpu_ms`` over it
is the model call as the server makes it, after the event loop decoded a real request and
handed it to a worker thread (:func:`testbed.plan.handling_profiles.call_factors`).

Writes ``<profiles>/handling.json`` (schema 1)::

    {"schema": 1, "method", "measured_at", "machine": {"cpu", "cores"},
     "variants": {"<variant>": {"family", "runtime", "queries", "isolated_queries", "bare_call_cpu_ms", "handling_ms",
                                "answer_ms", "call_cpu_ms", "handling_isolated_ms", "call_cpu_isolated_ms",
                                "call_wall_ms", "call_wall_isolated_ms", "request_bytes_mean",
                                "loadavg_1min"}},
     "other_runtimes": {"<variant>": {"<runtime>": {the same fields}}}}

``variants`` holds each variant's row in its default runtime (LiteRT where it has it);
``--runtime tensorflow`` measures a variant that has LiteRT too into ``other_runtimes`` (the
call factors differ by runtime: TensorFlow's graph executor pays more per call, and after
idleness, than LiteRT's interpreter). :func:`testbed.plan.handling_profiles.measured_row` reads the row
of a runtime (the plan's :class:`~testbed.model.service.ServiceFigures`).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from testbed.core.errors import RunFailure
from testbed.core.util import REPO_ROOT, poll_until, stop_processes, write_json_atomic
from testbed.plan import zoo
from testbed.plan.boundaries import ServerConfig
from testbed.plan.handling_profiles import FILE, MIN_ISOLATED, MIN_N, RESOLUTION_S, SCHEMA, queries_to_resolve, resolved
from testbed.plan.profiles import cpu_time
from testbed.plan.speeds import LEAST_PACED_MS
from testbed.serve.launch import server_command
from testbed.serve.loaders import load_model

WARMUP = 20
#: Idle time before each query of the isolated pass (s): the CFS period, as the profiler's isolated rows.
ISOLATED_GAP_S = 0.1
CLK_TCK = os.sysconf("SC_CLK_TCK")


def proc_cpu_s(path: Path) -> float:
    """User + system CPU (s) from a ``/proc/<pid>[/task/<tid>]/stat`` file (proc(5): utime, stime).

    Raises:
        OSError: the process is gone.
    """
    fields = path.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def start_server(zoo_dir: Path, variant: str, runtime: str, tmp: Path) -> tuple[subprocess.Popen, int]:
    """One inference server for ``variant`` on 127.0.0.1 (1 worker, 1 thread, no CPU quota);
    returns (process, port) once it is ready.

    Raises:
        RuntimeError: the server exited or was not ready within 180 s (with its log's tail).
    """
    ready = tmp / f"{variant}.ready.json"
    cfg = ServerConfig(cluster="handling", host="127.0.0.1", port=0, zoo_dir=str(zoo_dir), models=[variant],
                       runtimes={variant: runtime}, workers=1, threads=1, queue_limit=256, warmup_calls=30,
                       cpu_cores=1.0, ready_file=str(ready))
    cfg_path = tmp / f"{variant}.server.json"
    cfg_path.write_text(cfg.model_dump_json())
    log_path = tmp / f"{variant}.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(server_command(cfg_path), stdout=log, stderr=subprocess.STDOUT)

    try:
        poll_until(ready.is_file, 180.0, f"the inference server for {variant!r}", 0.05, proc=proc)
    except RunFailure as exc:
        proc.kill()
        proc.wait()
        raise RuntimeError(f"{exc}; its log: {log_path.read_text()[-2000:]}") from None
    return proc, int(json.loads(ready.read_text())["port"])

def _pass(proc: subprocess.Popen, query: Callable[[int], float], n: int, gap_s: float) -> dict[str, float]:
    """``n`` queries (``gap_s`` idle before each): CPU ms per query of the main thread and of the
    other threads, and the mean wall time of the model call (ms)."""
    main, whole = Path(f"/proc/{proc.pid}/task/{proc.pid}/stat"), Path(f"/proc/{proc.pid}/stat")
    m0, p0 = proc_cpu_s(main), proc_cpu_s(whole)
    walls = []
    for i in range(n):
        if gap_s:
            time.sleep(gap_s)
        walls.append(query(i))
    m1, p1 = proc_cpu_s(main), proc_cpu_s(whole)
    # the two clocks are read at slightly different instants: a difference below one tick is 0
    return {"main_ms": (m1 - m0) / n * 1e3, "other_ms": max(0.0, (p1 - p0) - (m1 - m0)) / n * 1e3,
            "wall_ms": float(np.mean(walls))}


def time_bare_calls(model: Any, x: np.ndarray, n: int, all_threads: bool = False, gap_s: float = 0.0) -> np.ndarray:
    """CPU ms of each of ``n`` bare calls of a loaded ``model`` (one input each, cycling through
    the payloads ``x``, back to back: the profiler's call; warm the model up first; with ``gap_s``
    > 0 each call after that many s of sleep: a call after idleness). The calling
    thread's CPU time, or with ``all_threads`` the process's (TensorFlow runs a graph's ops on its
    own pool threads; a runtime on several threads). CPU time, not wall time: other processes'
    load does not stretch it. The one timer of the bare call: the host-speed check, the handling
    measurement (their mean) and each inference server's speed check (:mod:`testbed.serve.speed`,
    its median) use it."""
    clock = time.process_time if all_threads else time.thread_time
    out = np.empty(n)
    for i in range(n):
        if gap_s > 0:
            time.sleep(gap_s)
        t0 = clock()
        model.predict(x[i % len(x)][None])
        out[i] = clock() - t0
    return out * 1e3


def bare_calls_for(profile_ms: float, budget_s: float, least: int) -> int:
    """How many bare calls to time: about ``budget_s`` of CPU at the profile's ``profile_ms`` per
    call, and at least ``least``."""
    return max(least, int(budget_s * 1e3 / max(profile_ms, 1e-6)))


def bare_call_cpu_ms(zoo_dir: Path, variant: str, runtime: str, manifest: dict[str, Any], n: int,
                     all_threads: bool = False) -> float:
    """CPU ms per call of ``variant``'s bare model call in this process (1 thread, back to back,
    the family's decoded payloads, after 20 warm-up calls; :func:`time_bare_calls`): the
    profiler's call, measured minutes before the server's so that both see the same machine (on a
    shared host, CPU time per call itself varies by 10-30 % over an hour). The calling thread's
    CPU time, or with ``all_threads`` the process's: TensorFlow's executor runs a graph's ops on
    its own pool threads, which the server's figure (every thread but the event loop's) counts too."""
    model = load_model(zoo_dir, variant, runtime, manifest, threads=1)
    x = zoo.load_payloads(zoo_dir, manifest["variants"][variant]["family"])[0]
    model.warm_up(x, calls=WARMUP, batch=1)
    return float(time_bare_calls(model, x, n, all_threads).mean())


def default_runtime(manifest: dict[str, Any], variant: str) -> str:
    """The runtime a variant's row in ``variants`` is measured with: LiteRT where it has it."""
    return "litert" if "litert" in zoo.runtimes_of(manifest, variant) else "tensorflow"


def measure_one(zoo_dir: Path, variant: str, n: int, tmp: Path, runtime: str | None = None) -> dict[str, Any]:
    """The handling figures of ``variant`` (module doc) in ``runtime`` (None:
    :func:`default_runtime`), from ``n`` back-to-back queries and ``max(30, n / 4)`` isolated ones.

    Raises:
        RuntimeError: the server did not start or answered a query with an error status.
    """
    manifest = zoo.load_manifest(zoo_dir)
    family = manifest["variants"][variant]["family"]
    runtime = runtime or default_runtime(manifest, variant)
    bodies, _ = zoo.request_bodies(zoo_dir, family)
    bare_ms = bare_call_cpu_ms(zoo_dir, variant, runtime, manifest, n, all_threads=runtime == "tensorflow")
    proc, port = start_server(zoo_dir, variant, runtime, tmp)
    n_iso = max(MIN_ISOLATED, n // 4)
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)

        def query(i: int) -> float:
            conn.request("POST", f"/v1/models/{variant}:predict", bodies[i % len(bodies)],
                         {"Content-Type": "application/json"})
            resp = conn.getresponse()
            resp.read()
            if resp.status != 200:
                raise RuntimeError(f"{variant}: HTTP {resp.status} from the server")
            return (int(resp.getheader("X-Testbed-T3")) - int(resp.getheader("X-Testbed-T2"))) / 1e6

        def answer_cpu_s() -> float:
            conn.request("GET", "/v1/stats")
            return float(json.loads(conn.getresponse().read()).get("answer_cpu_s", 0.0))

        for i in range(WARMUP):
            query(i)
        time.sleep(0.3)
        a0 = answer_cpu_s()
        warm = _pass(proc, query, n, 0.0)
        answer_ms = (answer_cpu_s() - a0) / n * 1e3
        cold = _pass(proc, query, n_iso, ISOLATED_GAP_S)
        conn.close()
    finally:
        stop_processes([proc])
    return {"family": family, "runtime": runtime, "queries": n, "isolated_queries": n_iso,
            "bare_call_cpu_ms": round(bare_ms, 3),
            "handling_ms": round(warm["main_ms"], 3), "answer_ms": round(min(answer_ms, warm["main_ms"]), 4),
            "call_cpu_ms": round(warm["other_ms"], 3),
            "handling_isolated_ms": round(cold["main_ms"], 3), "call_cpu_isolated_ms": round(cold["other_ms"], 3),
            "call_wall_ms": round(warm["wall_ms"], 3), "call_wall_isolated_ms": round(cold["wall_ms"], 3),
            "request_bytes_mean": int(np.mean([len(b) for b in bodies]))}


def run(zoo_dir: Path, profiles_dir: Path, variants: list[str] | None = None, n: int = 200,
        log: Any = print, runtime: str | None = None) -> dict[str, Any]:
    """Measure ``variants`` (default: all of the zoo's) and merge them into ``<profiles>/handling.json``,
    in ``runtime`` (None: each variant's :func:`default_runtime`; a row in another runtime than the
    default goes to ``other_runtimes``).

    Raises:
        ValueError: an empty or unknown variant list, a runtime the zoo does not know or a variant
            does not have, ``n`` < 100 (the CPU clock ticks at 10 ms:
            fewer queries leave the per-query figure coarse), a ``profiles_dir`` that is not a
            folder, or a ``handling.json`` there that is not one (all before measuring).
        RuntimeError: a server failed (the variants measured before it are kept).
    """
    manifest = zoo.load_manifest(zoo_dir)
    known = manifest["variants"]
    if variants is not None and not variants:
        raise ValueError("--variants: the list is empty (give variant names, or all)")
    variants = list(variants or known)
    bad = [v for v in variants if v not in known]
    if bad:
        raise ValueError(f"--variants: unknown variant(s) {', '.join(map(repr, bad))} (known: {', '.join(known)})")
    if runtime is not None:
        if runtime not in zoo.RUNTIMES:
            raise ValueError(f"--runtime: {runtime!r} is not a runtime (one of {', '.join(zoo.RUNTIMES)})")
        lacking = [v for v in variants if runtime not in zoo.runtimes_of(manifest, v)]
        if lacking:
            raise ValueError(f"--runtime {runtime}: variant(s) {', '.join(lacking)} have no {runtime} model")
    if n < MIN_N:
        raise ValueError(f"-n: {n} queries is too few (>= 100; the CPU clock has 10 ms ticks)")
    if not Path(profiles_dir).is_dir():
        raise ValueError(f"--profiles: {profiles_dir} is not a folder")
    path = Path(profiles_dir) / FILE
    doc = {"schema": SCHEMA, "variants": {}}
    if path.is_file():
        try:
            doc = json.loads(path.read_text())
        except ValueError as exc:
            raise ValueError(f"{path}: not JSON ({exc}); fix or remove it before measuring into it") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("variants"), dict):
            raise ValueError(f"{path}: no 'variants' object; fix or remove it before measuring into it")
        others = doc.get("other_runtimes", {})
        if not isinstance(others, dict) or not all(isinstance(r, dict) for r in others.values()):
            raise ValueError(f"{path}: 'other_runtimes' is not an object of objects; fix or remove it before "
                             f"measuring into it")
    with tempfile.TemporaryDirectory(prefix="handling-") as tmp:
        for v in variants:
            row = measure_one(Path(zoo_dir), v, n, Path(tmp), runtime)
            row["loadavg_1min"] = round(os.getloadavg()[0], 2)
            if not _place_row(doc, manifest, v, row, log):
                continue
            doc.update(schema=SCHEMA, method=__doc__.split("Method, per variant: ")[1].split("\n\nWrites")[0],
                       measured_at=datetime.now(UTC).isoformat(timespec="seconds"),
                       machine={"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()})
            write_json_atomic(path, doc)  # a long run keeps what it measured
            log(f"[handling] {v} ({row['runtime']}): CPU per query: event loop {row['handling_ms']:.2f} ms, model call "
                f"{row['call_cpu_ms']:.2f} ms warm / {row['call_cpu_isolated_ms']:.2f} ms cold "
                f"(load average {row['loadavg_1min']})")
    return doc


def _place_row(doc: dict[str, Any], manifest: dict[str, Any], variant: str, row: dict[str, Any],
               log: Any) -> bool:
    """Put a measured row in ``doc`` (``variants`` for the variant's default runtime, else
    ``other_runtimes``), unless its passes were below the CPU clock's resolution and the row it
    would replace was not: then keep that one and say so. Returns whether it was placed."""
    here = f"[handling] {variant} ({row['runtime']})"
    if row["runtime"] == default_runtime(manifest, variant):
        rows, key = doc["variants"], variant
    else:
        rows, key = doc.setdefault("other_runtimes", {}).setdefault(variant, {}), row["runtime"]
    if not resolved(row):
        need = queries_to_resolve(row)
        more = f"use -n {need} or more" if need else "no -n resolves a call of 0 ms"
        old = rows.get(key)
        if isinstance(old, dict) and resolved(old):
            log(f"{here}: NOT written: at -n {row['queries']} a pass used less CPU than the clock resolves "
                f"({RESOLUTION_S:g} s), and the row there (-n {old.get('queries')}) does; to replace it, {more}")
            return False
        log(f"{here}: WARNING: at -n {row['queries']} a pass used less CPU than the clock resolves "
            f"({RESOLUTION_S:g} s): its call factors read as 1.0; {more}")
    rows[key] = row
    return True


#: The host-speed check (:func:`host_speed`): a bare call this many times slower than the profile
#: means the machine is slower now than when it was profiled: on a shared host the same bare call
#: drifts by more than that over a day, while repeats minutes apart differ by 10-30 %
#: (docs/models-and-servers.md, "The host-speed check").
HOST_SLOW_FACTOR = 1.25
#: CPU time the host-speed check spends on calls (s).
HOST_CHECK_S = 0.5


def host_speed(zoo_dir: str | os.PathLike[str], profiles_dir: str | os.PathLike[str],
               models: dict[str, str]) -> dict[str, Any]:
    """How fast this machine runs a model now against its profile: the bare call (1 thread, back to
    back, :func:`bare_call_cpu_ms`) of the cheapest of ``models`` (name -> runtime) whose profiled
    unthrottled call takes at least 1 ms, for about :data:`HOST_CHECK_S` of CPU.

    Returns ``{"model", "runtime", "calls", "now_ms", "profile_ms", "ratio", "slow"}`` (``slow``:
    ratio >= :data:`HOST_SLOW_FACTOR`), or ``{}`` when no model qualifies (the small zoo's models
    are too short to time this way).

    Raises:
        zoo.ZooError: a model's profile or file is missing.
    """
    manifest = zoo.load_manifest(zoo_dir)
    cands = []
    for name, runtime in sorted(models.items()):
        ms = float(cpu_time(profiles_dir, name, runtime, 1, 1).samples_ms.mean())
        if ms >= LEAST_PACED_MS:
            cands.append((ms, name, runtime))
    if not cands:
        return {}
    prof_ms, name, runtime = min(cands)
    n = bare_calls_for(prof_ms, HOST_CHECK_S, 30)
    # TensorFlow runs a graph's ops on its own pool threads: the process's CPU, as measure_one does
    # (the calling thread's alone read 0.40 ms for digits_large against 2.59 ms profiled: "0.15x")
    now = bare_call_cpu_ms(Path(zoo_dir), name, runtime, manifest, n, all_threads=runtime == "tensorflow")
    ratio = now / prof_ms
    return {"model": name, "runtime": runtime, "calls": n, "now_ms": round(now, 3), "profile_ms": round(prof_ms, 3),
            "ratio": round(ratio, 2), "slow": ratio >= HOST_SLOW_FACTOR}


def main(argv: list[str] | None = None) -> int:
    """Command line (module doc); exit 2 on a bad option."""
    repo = REPO_ROOT
    ap = argparse.ArgumentParser(prog="python -m testbed.serve.handling", description=__doc__.split("\n\n")[0])
    ap.add_argument("--zoo", default=str(repo / "models" / "zoo"))
    ap.add_argument("--profiles", default=str(repo / "models" / "profiles"))
    ap.add_argument("--variants", default="all", help="comma-separated variants, or all (default)")
    ap.add_argument("-n", type=int, default=200, help="timed back-to-back queries per variant (>= 100)")
    ap.add_argument("--runtime", default=None,
                    help="measure in this runtime (default: LiteRT where the variant has it, else TensorFlow)")
    args = ap.parse_args(argv)
    variants = None if args.variants == "all" else [v.strip() for v in args.variants.split(",") if v.strip()]
    try:
        run(Path(args.zoo), Path(args.profiles), variants, args.n, runtime=args.runtime)
    except (ValueError, zoo.ZooError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
