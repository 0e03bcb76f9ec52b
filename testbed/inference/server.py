"""Inference server: real TensorFlow SavedModels behind TensorFlow Serving's REST API (aiohttp).

    python -m testbed.inference.server --host 0.0.0.0 --port 8501 --zoo models/zoo \\
        --models digits_small,digits_large --workers 1 --threads 1 --queue-limit 64 \\
        --stats-file PATH --ready-file PATH

Start-up: sets TensorFlow's intra-op threads to ``--threads`` and inter-op threads to 1, loads
the listed variants (``testbed.inference.zoo.ZooModel``), warms each up (``--warmup`` >= 20
single-image calls on the zoo's payloads), binds the socket, starts ``--workers`` inference
threads, then writes ``--ready-file`` (JSON {"pid", "port", "host", "models", "warmup_ms",
"warmup_ms_per_model", ...}; ``--port 0`` picks a free port, reported there).

Endpoints:

* ``POST /v1/models/{name}:predict`` (also ``/v1/models/{name}/versions/1:predict``).
  Body ``{"instances": [img, ...]}`` (row form; an instance may also be ``{"x": img}``) or
  ``{"inputs": [img, ...]}`` / ``{"inputs": {"x": [img, ...]}}`` (columnar form); ``img`` is a
  nested list [32][32][1] of numbers (float32 pixels in [0, 1]); at most 256 images per request.
  Answer ``{"predictions": [[p0..p9], ...]}`` (row form) or ``{"outputs": [[p0..p9], ...]}``
  (columnar), probabilities summing to 1. One request is one query: it waits in a FIFO queue of at
  most ``--queue-limit`` queries (not counting those being served) for one of ``--workers``
  threads; if the queue is full: HTTP 503 ``{"error": "queue full (limit N)"}``. Bad JSON, wrong
  shape, non-numbers: 400; unknown model: 404; too large a body: 413; an inference failure: 500;
  all with ``{"error": message}``. No input crashes the server.
  Response headers (nanoseconds since the epoch, ``time.time_ns()``, the clock all emulated hosts
  share): ``X-Testbed-T1`` body fully received, ``X-Testbed-T2`` inference start, ``X-Testbed-T3``
  inference end; ``X-Testbed-Queue-Len`` queries waiting (not in service) when it arrived. A 503
  carries T1 and the queue length too. T2 - T1 (queueing) includes decoding the JSON body in the
  event loop, ~0.5 ms per 32x32 image on a 2 GHz-class core (as TF Serving's REST front end does).
* ``GET /v1/models/{name}``: TF Serving model status (version "1", state AVAILABLE); 404 if unknown.
* ``GET /v1/models``: the served variants with their manifest accuracy.
* ``GET /v1/stats``: ``{"queue_len", "busy_workers", "workers", "queue_limit", "served", "dropped",
  "errors", "busy_s", "uptime_s", "utilization", "per_model"}``: counters since ready; ``busy_s`` is
  the total inference time [s] (sum of T3 - T2), ``utilization`` = busy_s / (uptime_s * workers).

The same stats JSON goes to ``--stats-file`` every ``--stats-interval`` s (atomic: temp file +
rename) and once more on SIGTERM / SIGINT, after which the server finishes in-flight queries
(up to 5 s), stops and exits with code 0. Exit code 2: bad arguments or a missing zoo / variant.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import queue
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from aiohttp import web

from testbed.inference import zoo

#: Most images accepted in one request (a bigger batch is a 400).
MAX_INSTANCES = 256
#: Largest request body [bytes] (one 32x32 image as JSON is ~5-10 kB).
MAX_BODY_BYTES = 32 * 1024 * 1024
#: Seconds the server waits for in-flight queries on shutdown.
SHUTDOWN_GRACE_S = 5.0


class RequestError(Exception):
    """A request the server refuses; ``status`` is the HTTP status, ``str(exc)`` the reason."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def parse_predict_body(body: bytes, input_shape: tuple[int, ...] = zoo.INPUT_SHAPE) -> tuple[np.ndarray, bool]:
    """Decode a TF Serving predict body into images float32 [N, *input_shape] and whether it was columnar.

    Raises:
        RequestError(400): not JSON, not an object, neither or both of ``instances`` / ``inputs``,
            not numbers, ragged, wrong shape, non-finite values, empty or more than MAX_INSTANCES.
    """
    try:
        doc = json.loads(body)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise RequestError(400, f"malformed JSON body: {exc}") from None
    if not isinstance(doc, dict):
        raise RequestError(400, "body must be a JSON object with 'instances' (row form) or 'inputs' (columnar)")
    if ("instances" in doc) == ("inputs" in doc):
        raise RequestError(400, "body must have exactly one of 'instances' (row form) or 'inputs' (columnar)")
    columnar = "inputs" in doc
    key = "inputs" if columnar else "instances"
    data = doc[key]
    if columnar and isinstance(data, dict):
        if list(data) != [zoo.INPUT_NAME]:
            raise RequestError(400, f"'inputs' names {sorted(data)}; the only input is {zoo.INPUT_NAME!r}")
        data = data[zoo.INPUT_NAME]
    if not columnar and isinstance(data, list) and data and all(isinstance(r, dict) for r in data):
        if any(list(r) != [zoo.INPUT_NAME] for r in data):
            raise RequestError(400, f"each named instance must be {{{zoo.INPUT_NAME!r}: image}}")
        data = [r[zoo.INPUT_NAME] for r in data]
    if not isinstance(data, list) or not data:
        raise RequestError(400, f"{key!r} must be a non-empty list of images {list(input_shape)}")
    if len(data) > MAX_INSTANCES:
        raise RequestError(400, f"{key!r} has {len(data)} images; at most {MAX_INSTANCES} per request")
    try:
        x = np.asarray(data, dtype=np.float32)
    except (ValueError, TypeError, OverflowError) as exc:
        raise RequestError(400, f"{key!r} is not a rectangular array of numbers: {exc}") from None
    expected = [len(data), *input_shape]
    if list(x.shape) != expected:
        raise RequestError(400, f"wrong shape: {key!r} is {list(x.shape)}, expected {expected} "
                                f"(each image {list(input_shape)}, float32 in [0, 1])")
    if not np.isfinite(x).all():
        raise RequestError(400, f"{key!r} holds NaN or infinite values")
    return x, columnar


@dataclass
class Job:
    """One query in the FIFO queue; the worker fills t2/t3 [ns] and ``result`` or ``error``."""

    model: str
    x: np.ndarray
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    t2: int = 0
    t3: int = 0
    result: np.ndarray | None = None
    error: str | None = None


@dataclass
class Stats:
    """Counters since ready; guarded by ``lock`` (workers and the event loop both update them)."""

    workers: int
    queue_limit: int
    lock: threading.Lock = field(default_factory=threading.Lock)
    served: int = 0
    dropped: int = 0
    errors: int = 0
    busy_workers: int = 0
    busy_s: float = 0.0
    started: float = field(default_factory=time.monotonic)
    per_model: dict[str, dict[str, float]] = field(default_factory=dict)

    def snapshot(self, queue_len: int) -> dict[str, Any]:
        """The stats JSON (see the module doc); ``queue_len`` = queries waiting now."""
        with self.lock:
            uptime = max(time.monotonic() - self.started, 1e-9)
            return {"queue_len": queue_len, "busy_workers": self.busy_workers, "workers": self.workers,
                    "queue_limit": self.queue_limit, "served": self.served, "dropped": self.dropped,
                    "errors": self.errors, "busy_s": round(self.busy_s, 6), "uptime_s": round(uptime, 3),
                    "utilization": round(self.busy_s / (uptime * self.workers), 6),
                    "per_model": {k: dict(v) for k, v in self.per_model.items()},
                    "pid": os.getpid(), "time_ns": time.time_ns()}


def write_json_atomic(path: str | os.PathLike[str], data: dict[str, Any]) -> None:
    """Write ``data`` to ``path`` atomically (temp file in the same directory, then ``os.replace``)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


class InferenceServer:
    """The queue, the worker threads and the aiohttp handlers around a set of loaded variants."""

    def __init__(self, models: dict[str, zoo.ZooModel], workers: int = 1, queue_limit: int = 64):
        """``models``: name -> loaded variant; ``workers`` inference threads; ``queue_limit`` >= 1 waiting."""
        self.models = models
        self.workers = workers
        self.queue_limit = queue_limit
        self.queue: queue.Queue[Job | None] = queue.Queue(maxsize=queue_limit)
        self.stats = Stats(workers=workers, queue_limit=queue_limit)
        self.stats.per_model = {m: {"served": 0, "busy_s": 0.0} for m in models}
        self._threads: list[threading.Thread] = []

    # -- worker side -------------------------------------------------------------------------
    def start_workers(self) -> None:
        """Start the inference threads and reset the counters' clock (uptime counts from here)."""
        self.stats.started = time.monotonic()
        for i in range(self.workers):
            t = threading.Thread(target=self._worker, name=f"inference-{i}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop_workers(self, timeout_s: float = SHUTDOWN_GRACE_S) -> None:
        """Let the workers finish what is queued, then stop them (waits at most ``timeout_s``)."""
        deadline = time.monotonic() + timeout_s
        for _ in self._threads:
            try:
                self.queue.put(None, timeout=max(0.01, deadline - time.monotonic()))
            except queue.Full:
                break
        for t in self._threads:
            t.join(timeout=max(0.01, deadline - time.monotonic()))

    def _worker(self) -> None:
        while True:
            job = self.queue.get()
            if job is None:
                return
            with self.stats.lock:
                self.stats.busy_workers += 1
            job.t2 = time.time_ns()
            try:
                job.result = self.models[job.model].predict(job.x)
            except Exception as exc:  # noqa: BLE001 - reported to the client as a 500
                job.error = f"{type(exc).__name__}: {exc}"
            job.t3 = time.time_ns()
            busy = (job.t3 - job.t2) / 1e9
            with self.stats.lock:
                self.stats.busy_workers -= 1
                self.stats.busy_s += busy
                self.stats.per_model[job.model]["busy_s"] += busy
            try:
                job.loop.call_soon_threadsafe(_resolve, job)
            except RuntimeError:
                pass  # the event loop is closed: shutting down, nobody waits for this answer

    # -- HTTP side ---------------------------------------------------------------------------
    def _error(self, status: int, message: str, headers: dict[str, str] | None = None,
               count: bool = True) -> web.Response:
        if count:
            with self.stats.lock:
                self.stats.errors += 1
        return web.json_response({"error": message}, status=status, headers=headers)

    def _unknown(self, name: str) -> web.Response:
        return self._error(404, f"model {name!r} not found (serving: {', '.join(sorted(self.models))})")

    async def predict(self, request: web.Request) -> web.Response:
        """``POST /v1/models/{name}:predict`` (see the module doc)."""
        name = request.match_info["name"]
        version = request.match_info.get("version")
        if name not in self.models:
            return self._unknown(name)
        if version is not None and version != "1":
            return self._error(404, f"model {name!r} has no version {version!r} (only '1')")
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return self._error(413, f"request body larger than {MAX_BODY_BYTES} bytes")
        t1 = time.time_ns()
        try:
            x, columnar = parse_predict_body(body)
        except RequestError as exc:
            return self._error(exc.status, str(exc))
        qlen = self.queue.qsize()
        headers = {"X-Testbed-T1": str(t1), "X-Testbed-Queue-Len": str(qlen), "X-Testbed-Model": name}
        loop = asyncio.get_running_loop()
        job = Job(model=name, x=x, loop=loop, future=loop.create_future())
        try:
            self.queue.put_nowait(job)
        except queue.Full:
            with self.stats.lock:
                self.stats.dropped += 1
            return self._error(503, f"queue full (limit {self.queue_limit})", headers, count=False)
        await job.future
        headers.update({"X-Testbed-T2": str(job.t2), "X-Testbed-T3": str(job.t3)})
        if job.error is not None or job.result is None:
            return self._error(500, f"inference failed in model {name!r}: {job.error}", headers)
        with self.stats.lock:
            self.stats.served += 1
            self.stats.per_model[name]["served"] += 1
        key = "outputs" if columnar else "predictions"
        return web.json_response({key: job.result.tolist()}, headers=headers)

    async def model_status(self, request: web.Request) -> web.Response:
        """``GET /v1/models/{name}``: TF Serving's model status shape."""
        name = request.match_info["name"]
        if name not in self.models:
            return self._unknown(name)
        return web.json_response({"model_version_status": [
            {"version": "1", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}]})

    async def list_models(self, request: web.Request) -> web.Response:
        """``GET /v1/models``: served variants with their manifest accuracy and parameter count."""
        return web.json_response({"models": {n: {"accuracy": m.info.get("accuracy"), "params": m.info.get("params")}
                                             for n, m in self.models.items()}})

    async def stats_handler(self, request: web.Request) -> web.Response:
        """``GET /v1/stats``."""
        return web.json_response(self.stats.snapshot(self.queue.qsize()))

    def snapshot(self) -> dict[str, Any]:
        """The current stats dict."""
        return self.stats.snapshot(self.queue.qsize())

    def make_app(self) -> web.Application:
        """The aiohttp application with the routes above and JSON error pages."""
        app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[self._json_errors])
        app.router.add_post(r"/v1/models/{name:[^/:]+}:predict", self.predict)
        app.router.add_post(r"/v1/models/{name:[^/:]+}/versions/{version:[^/:]+}:predict", self.predict)
        app.router.add_get("/v1/models", self.list_models)
        app.router.add_get(r"/v1/models/{name:[^/:]+}", self.model_status)
        app.router.add_get("/v1/stats", self.stats_handler)
        return app

    @web.middleware
    async def _json_errors(self, request: web.Request, handler: Any) -> web.StreamResponse:
        try:
            return await handler(request)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            return self._error(exc.status, f"{exc.reason}: {request.method} {request.path}")
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - never crash on a request
            return self._error(500, f"internal error: {type(exc).__name__}: {exc}")


def _resolve(job: Job) -> None:
    if not job.future.done():  # the client may have gone away (handler cancelled)
        job.future.set_result(None)


async def serve(server: InferenceServer, host: str, port: int, stats_file: str | None, ready_file: str | None,
                ready_info: dict[str, Any], stats_interval_s: float = 1.0,
                stop_requested: list[int] | None = None) -> None:
    """Bind, start the workers, write the ready file, serve until SIGTERM/SIGINT, then shut down.

    ``stop_requested``: signals received before the event loop took over (non-empty: stop at once).
    """
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if stop_requested:
        stop.set()
    runner = web.AppRunner(server.make_app(), access_log=None, handle_signals=False,
                           shutdown_timeout=SHUTDOWN_GRACE_S)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=1024, shutdown_timeout=SHUTDOWN_GRACE_S)
    await site.start()
    bound = runner.addresses[0][1] if runner.addresses else port
    server.start_workers()
    if ready_file:
        write_json_atomic(ready_file, {"pid": os.getpid(), "port": bound, "host": host, **ready_info})
    print(f"[inference-server] pid {os.getpid()} serving {', '.join(server.models)} on {host}:{bound}",
          flush=True)

    async def write_stats() -> None:
        while True:
            if stats_file:
                try:
                    write_json_atomic(stats_file, server.snapshot())
                except OSError as exc:
                    print(f"[inference-server] cannot write stats file {stats_file}: {exc}", file=sys.stderr)
            await asyncio.sleep(stats_interval_s)

    writer = asyncio.create_task(write_stats())
    await stop.wait()
    writer.cancel()
    await runner.cleanup()  # stops accepting, waits for in-flight queries (<= SHUTDOWN_GRACE_S)
    await asyncio.to_thread(server.stop_workers)
    if stats_file:
        write_json_atomic(stats_file, server.snapshot())


def build_parser() -> argparse.ArgumentParser:
    """The command line (see the module doc)."""
    ap = argparse.ArgumentParser(prog="python -m testbed.inference.server",
                                 description="TF Serving-compatible REST inference server for the model zoo")
    ap.add_argument("--host", default="0.0.0.0")
    ap.add_argument("--port", type=int, default=8501, help="TCP port (0: pick a free one; see --ready-file)")
    ap.add_argument("--zoo", default="models/zoo", help="zoo directory with manifest.json")
    ap.add_argument("--models", default="", help="comma-separated variants to serve (default: all in the zoo)")
    ap.add_argument("--workers", type=int, default=1, help="inference threads")
    ap.add_argument("--threads", type=int, default=1, help="TensorFlow intra-op threads (inter-op is 1)")
    ap.add_argument("--queue-limit", type=int, default=64, help="most queries waiting; beyond: HTTP 503")
    ap.add_argument("--warmup", type=int, default=30, help="warm-up calls per model before ready (>= 20)")
    ap.add_argument("--stats-file", default=None, help="stats JSON rewritten every --stats-interval s")
    ap.add_argument("--stats-interval", type=float, default=1.0, help="seconds between stats-file writes")
    ap.add_argument("--ready-file", default=None, help="JSON written once the models are warm and the port open")
    return ap


def main(argv: list[str] | None = None) -> int:
    """Run the server; returns the exit code (0 after SIGTERM/SIGINT, 2 on bad arguments / zoo)."""
    args = build_parser().parse_args(argv)
    for opt in ("workers", "threads", "queue_limit"):
        if getattr(args, opt) < 1:
            print(f"--{opt.replace('_', '-')} must be >= 1", file=sys.stderr)
            return 2
    if args.warmup < 20 or args.stats_interval <= 0:
        print("--warmup must be >= 20 and --stats-interval > 0", file=sys.stderr)
        return 2
    early_stop: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT):  # until the event loop takes over
        signal.signal(sig, lambda signum, _frame: early_stop.append(signum))
    try:
        manifest = zoo.load_manifest(args.zoo)
        names = list(dict.fromkeys(n.strip() for n in args.models.split(",") if n.strip()))
        names = names or list(manifest["variants"])
        for n in names:  # fail fast, before paying for TensorFlow's import
            zoo.variant_dir(args.zoo, n, manifest)
        zoo.configure_tf_threads(intra_op=args.threads, inter_op=1)
        models = {n: zoo.ZooModel(args.zoo, n, manifest) for n in names}
        try:
            warm_x, _ = zoo.load_payloads(args.zoo)
        except zoo.ZooError:
            warm_x = np.random.default_rng(0).random((8, *zoo.INPUT_SHAPE), dtype=np.float32)
    except zoo.ZooError as exc:
        print(f"[inference-server] {exc}", file=sys.stderr)
        return 2
    warmup = {n: round(m.warm_up(warm_x, args.warmup), 3) for n, m in models.items()}
    # TensorFlow leaves a huge, long-lived object graph; each full (gen-2) collection walks it:
    # measured here ~600 ms wall at a 0.25-core CFS quota, stalling every query behind it.
    # Collect once, then freeze the survivors into the permanent generation (Python docs,
    # gc.freeze: "Freeze all the objects tracked by gc ... ignore them for all future collections").
    gc.collect()
    gc.freeze()
    server = InferenceServer(models, workers=args.workers, queue_limit=args.queue_limit)
    if early_stop:
        if args.stats_file:
            write_json_atomic(args.stats_file, server.snapshot())
        return 0
    ready_info = {"models": names, "warmup_ms": round(sum(warmup.values()), 3), "warmup_ms_per_model": warmup,
                  "warmup_calls": args.warmup, "workers": args.workers, "threads": args.threads,
                  "queue_limit": args.queue_limit}
    try:
        asyncio.run(serve(server, args.host, args.port, args.stats_file, args.ready_file, ready_info,
                          args.stats_interval, early_stop))
    except OSError as exc:
        print(f"[inference-server] cannot serve on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
