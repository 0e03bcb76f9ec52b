"""Inference server: zoo models (TensorFlow or LiteRT) behind TensorFlow Serving's REST API (aiohttp).

    python -m testbed.serve.server CONFIG.json      # a testbed.plan.boundaries.ServerConfig

Start-up: TensorFlow's intra-op pool gets ``workers x threads`` threads (inter-op 1); each
worker's LiteRT interpreter ``threads`` threads (``ServerConfig.threads``, from
:func:`testbed.model.cpu.threads_per_call`). It loads the listed variants with their runtime
(each file checked against the SHA-256 the zoo recorded), answers each one's labelled start-up
sample (:func:`testbed.serve.loaders.check_answers`; it exits 7 without serving, naming the file, on a
hash mismatch or an accuracy far below the model's: :data:`testbed.core.errors.EXIT_INTEGRITY`),
warms each up (``warmup_calls`` calls at batch 1, and as many at ``max_batch`` when batching),
times each model's bare call when ``speed`` asks (:mod:`testbed.serve.speed`: the cluster's scale,
and its pad replaces ``cpu_pad``), with ``speed: host`` its request handling
(:func:`with_handling`), binds the socket, starts ``workers`` inference threads, then
writes ``ready_file`` (JSON {"pid", "port", "host", "models", "runtimes", "mean_service_ms",
"warmup_ms", "speed" (a :class:`testbed.plan.speeds.ClusterSpeed`, or null), ...}; ``port`` 0 picks a
free port, reported there). Queue, discipline, admission and batching: the model's
(:mod:`testbed.model.queue`, through :mod:`testbed.serve.scheduler`); admission's mean service
time per model is the plan's (``ServerConfig.mean_service_ms``).

Endpoints (TensorFlow Serving REST API, https://www.tensorflow.org/tfx/serving/api_rest):

* ``POST /v1/models/{name}[/versions/1]:predict``. Row form ``{"instances": [in, ...]}`` (an
  instance may also be ``{"x": in}``), columnar form ``{"inputs": [in, ...]}`` or
  ``{"inputs": {"x": [in, ...]}}``; optional ``"signature_name": "serving_default"``. ``in`` is a
  nested list of numbers of the model family's input shape (digits [32][32][1], parity [16][16][1],
  cancer [30]) or a binary ``{"b64": "<base64>"}`` holding either the input as raw little-endian
  float32, row-major (exactly prod(shape) x 4 bytes), or, for image families, an 8-bit greyscale
  PNG of the input's height x width (pixels / 255). At most 256 inputs per request. Answer
  ``{"predictions": [[p_0..p_k], ...]}`` (row) or ``{"outputs": [[...], ...]}`` (columnar),
  softmax probabilities. One request is one query; request header ``X-Testbed-Deadline-Ns``
  (absolute deadline, epoch ns) feeds EDF and admission. Refused at arrival: HTTP 503
  ``{"error": message, "reason": "queue_full" | "admission"}``. Bad JSON, wrong shape, bad base64,
  non-numbers, a bad deadline header: 400 naming the problem; unknown model or version: 404; too
  large a body: 413; an inference failure: 500; all ``{"error": message}``. No input crashes it.
  Response headers (epoch ns, the clock all emulated hosts share):
  ``X-Testbed-T1`` the request's last byte arrived at the host (the kernel's receive timestamp,
  before the event loop read it: :mod:`testbed.serve.rxstamp`), ``X-Testbed-T1h`` the request read
  and decoded (it enters the queue), ``X-Testbed-T2`` inference start, ``X-Testbed-T3`` inference
  end, ``X-Testbed-T3h`` the answer encoded, just before it is written, ``X-Testbed-Queue-Len``
  queries waiting when it arrived, ``X-Testbed-Batch`` inputs in the model call that served it,
  ``X-Testbed-Model``, ``X-Testbed-Runtime``. A 503 carries T1, T1h and the queue length.
  T1h - T1 and T3h - T3 are the event loop's handling (waits for the CPU quota included).
* ``GET /v1/models/{name}[/versions/1]``: model status (version "1", state AVAILABLE); 404 if unknown.
* ``GET /v1/models/{name}[/versions/1]/metadata``: signature_def (input ``x`` DT_FLOAT [-1, *shape],
  output ``probabilities`` DT_FLOAT [-1, classes]) in TF Serving's JSON shape.
* ``GET /v1/models``: the served variants with family, runtime, accuracy, params.
* ``GET /v1/stats``: ``queue_len``, ``busy``, ``workers``, ``served``, ``dropped``
  (``dropped_queue_full`` + ``dropped_admission``), ``errors`` (failed inferences and refused
  requests), ``batches``, ``mean_batch``, ``busy_s`` (sum of model-call time), ``answer_cpu_s``
  (CPU time of the event loop encoding the answers, for :mod:`testbed.serve.handling`),
  ``process_cpu_s`` (the process's CPU time since it started), ``expected_handling_s`` (what the
  model charged the quota for the handling of the queries so far, at this host's speed:
  :func:`testbed.plan.speeds.work_totals`), ``unstamped_reads``
  (reads that came without a kernel timestamp: their T1 is the read's time), ``uptime_s``,
  ``utilization`` = busy_s / (uptime_s x workers), ``per_model`` (per model: ``served``, ``busy_s``, and
  the calls' speed: ``timed`` calls, their ``cpu_s`` and wall time before the pad ``unpadded_s``, and
  the ``late`` ones, which ran beyond 10 % of their target (waits for the CPU, or a call of one input
  that took more CPU than the speed check measured at start-up):
  :func:`testbed.serve.scheduler.pad_work`).

The same stats JSON goes to ``stats_file`` every ``stats_interval_s`` s (atomic) and once more
on SIGTERM / SIGINT, after which the server finishes in-flight queries (up to 5 s), stops and
exits with code 0. Exit code 2: a bad config, a missing zoo / variant / runtime, or the port in use;
the reason is the last line of stderr.
"""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import socket
import sys
import threading
import time
import weakref
import zlib
from pathlib import Path
from typing import Any

import numpy as np
from aiohttp import web

from testbed.core.cgroups import ThrottleCounters
from testbed.core.errors import EXIT_INTEGRITY, TestbedError
from testbed.core.util import hold_loop, write_json_atomic
from testbed.plan import zoo
from testbed.plan.boundaries import ServerConfig, read_config
from testbed.plan.speeds import ClusterSpeed
from testbed.serve import rxstamp
from testbed.serve.loaders import check_answers, configure_tf_threads, load_model
from testbed.serve.payload import (
    RequestError,
    encode_json,
    metadata_response,
    parse_predict_body,
    predict_response,
)
from testbed.serve.scheduler import CallPace, Job, Scheduler, ThrottleState
from testbed.serve.speed import measure as measure_speed

#: Largest request body [bytes] (one 32x32 image as JSON is ~5-10 kB).
MAX_BODY_BYTES = 32 * 1024 * 1024
#: Seconds the server waits for in-flight queries on shutdown.
SHUTDOWN_GRACE_S = 5.0


def _paces(cfg: ServerConfig, speed: ClusterSpeed | None) -> dict[str, CallPace]:
    """Per paced model (:meth:`testbed.plan.speeds.SpeedTarget.paced`), how its call of one input is
    paced and judged (:class:`CallPace`): the time it should take, warm (its bare call at start-up x
    k / s: :attr:`ClusterSpeed.slowdown`) and cold (x the profile's cold factor), each call's x a
    draw of the simulator's samples over the profile's median (``SpeedTarget.draws``); empty
    without a speed check."""
    if speed is None or cfg.speed is None:
        return {}
    return {m: CallPace(ms.bare_ms * speed.slowdown, ms.bare_ms * speed.slowdown * ms.cold_factor, speed.slowdown,
                        tuple(cfg.speed.draws.get(m, ())))
            for m, ms in speed.models.items() if cfg.speed.paced(m)}


def _throttles(cfg: ServerConfig) -> ThrottleCounters | None:
    """How the scheduler reads the cluster's quota running out (:class:`Scheduler` ``throttles``):
    the counters of ``cfg.cpu_stat_file``; None without one.

    Raises:
        ValueError: the file is set but its counters cannot be read (names it).
    """
    if not cfg.cpu_stat_file:
        return None
    try:
        read = ThrottleCounters(Path(cfg.cpu_stat_file))
    except OSError as exc:
        raise ValueError(f"cannot open {cfg.cpu_stat_file!r} (cpu_stat_file): {exc}") from exc
    if read() is None:
        raise ValueError(f"cannot read the throttling counters of {cfg.cpu_stat_file!r} (cpu_stat_file)")
    return read


def _handling_expected(cfg: ServerConfig, speed: ClusterSpeed | None) -> dict[str, tuple[float, float]]:
    """Per model, the CPU (s) the model charges the cluster's quota for a query's handling at this
    host's speed: s x the profile's reading of the request and writing of the answer
    (``SpeedTarget.handling_ms`` - ``answer_ms``, ``answer_ms``); empty without a speed check."""
    if speed is None or cfg.speed is None:
        return {}
    out = {}
    for m, total_ms in cfg.speed.handling_ms.items():
        answer_ms = min(total_ms, cfg.speed.answer_ms.get(m, 0.0))
        out[m] = (speed.scale * (total_ms - answer_ms) / 1e3, speed.scale * answer_ms / 1e3)
    return out


class InferenceServer:
    """The aiohttp handlers around a :class:`Scheduler` of loaded variants."""

    def __init__(self, models: dict[str, Any], workers: int = 1, queue_limit: int = 64, discipline: str = "fifo",
                 admission: bool = False, max_batch: int = 1, max_queue_delay_ms: float = 0.0,
                 service_ms: dict[str, float] | None = None, cpu_pad: float = 0.0,
                 paces: dict[str, CallPace] | None = None, seed: int = 0,
                 handling_expected: dict[str, tuple[float, float]] | None = None,
                 throttles: ThrottleState | None = None):
        """``models``: name -> loaded variant (``predict``, ``input_shape``, ``classes``, ``info``, ``runtime``).
        ``cpu_pad``: each request's handling (and each model call, :class:`Scheduler`) is followed
        by a sleep of ``cpu_pad`` x its CPU time (a time-dilated cluster below one core).
        ``paces``: per model, how its call of one input is paced and judged (:class:`Scheduler`),
        its draws seeded by ``seed``; ``throttles``: how a paced call is known to have been stalled by the
        cluster's quota (:class:`Scheduler`). ``handling_expected``: per model, the CPU (s) the model
        charges for reading a request and writing its answer (counted in ``expected_handling_s``).

        Raises:
            ValueError: a bad scheduler setting.
        """
        self.models = models
        self.scheduler = Scheduler(models, workers=workers, queue_limit=queue_limit, discipline=discipline,
                                   admission=admission, max_batch=max_batch, max_queue_delay_ms=max_queue_delay_ms,
                                   service_ms=service_ms, cpu_pad=cpu_pad, paces=paces, seed=seed,
                                   throttles=throttles)
        self.cpu_pad = cpu_pad
        self.refused = 0  # 4xx / 5xx answers other than 503 (bad requests, unknown models, failures)
        self.answer_cpu_s = 0.0  # the event loop's CPU encoding answers
        self.handling_expected = handling_expected or {}
        self.expected_handling_s = 0.0  # what the model charged for the handling so far
        #: per connection's transport, its socket that keeps the kernel's receive timestamps
        self.stamps: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def start_workers(self) -> None:
        """Start the inference threads (uptime counts from here)."""
        self.scheduler.start()

    def stop_workers(self, timeout_s: float = SHUTDOWN_GRACE_S) -> None:
        """Serve what is queued, then stop the workers."""
        self.scheduler.stop(timeout_s)

    def snapshot(self) -> dict[str, Any]:
        """The stats dict (see the module doc)."""
        snap = self.scheduler.snapshot()
        snap["errors"] += self.refused
        snap.update(pid=os.getpid(), time_ns=time.time_ns(), answer_cpu_s=round(self.answer_cpu_s, 6),
                    process_cpu_s=round(time.process_time(), 6),
                    expected_handling_s=round(self.expected_handling_s, 6),
                    unstamped_reads=sum(s.unstamped for s in list(self.stamps.values())))
        return snap

    def _error(self, status: int, message: str, headers: dict[str, str] | None = None, count: bool = True,
               **extra: Any) -> web.Response:
        if count:
            self.refused += 1
        return web.json_response({"error": message, **extra}, status=status, headers=headers)

    def _model(self, request: web.Request) -> tuple[str, Any] | web.Response:
        name = request.match_info["name"]
        version = request.match_info.get("version")
        if name not in self.models:
            return self._error(404, f"model {name!r} not found (serving: {', '.join(sorted(self.models))})")
        if version is not None and version != "1":
            return self._error(404, f"model {name!r} has no version {version!r} (only '1')")
        return name, self.models[name]

    async def predict(self, request: web.Request) -> web.Response:
        """``POST /v1/models/{name}:predict`` (see the module doc)."""
        found = self._model(request)
        if isinstance(found, web.Response):
            return found
        name, model = found
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return self._error(413, f"request body larger than {MAX_BODY_BYTES} bytes")
        t1 = self._arrived_ns(request)
        deadline = request.headers.get("X-Testbed-Deadline-Ns")
        try:
            if deadline is not None:
                try:
                    deadline = int(deadline)
                except ValueError:
                    raise RequestError(400, f"X-Testbed-Deadline-Ns {deadline[:40]!r} is not an integer "
                                            "(absolute deadline, ns since the epoch)") from None
            cpu0 = time.thread_time()
            x, columnar = parse_predict_body(body, model.input_shape)
        except RequestError as exc:
            return self._error(exc.status, str(exc))
        if self.cpu_pad:  # the handling at 1 / k speed (a time-dilated cluster below one core)
            hold_loop(self.cpu_pad * (time.thread_time() - cpu0))
        self.expected_handling_s += self.handling_expected.get(name, (0.0, 0.0))[0]
        t1h = time.time_ns()
        headers = {"X-Testbed-T1": str(t1), "X-Testbed-T1h": str(t1h),
                   "X-Testbed-Queue-Len": str(self.scheduler.queue_len()),
                   "X-Testbed-Model": name, "X-Testbed-Runtime": model.runtime}
        loop = asyncio.get_running_loop()
        future = loop.create_future()

        def done(j: Job) -> None:
            try:
                loop.call_soon_threadsafe(_resolve, future)
            except RuntimeError:
                pass  # the event loop is closed: shutting down, nobody waits for this answer

        job = Job(model=name, x=x, deadline_ns=deadline, done=done, t1=t1)
        refused = self.scheduler.submit(job)
        if refused is not None:
            return self._error(503, refused[1], headers, count=False, reason=refused[0])
        await future
        headers.update({"X-Testbed-T2": str(job.t2), "X-Testbed-T3": str(job.t3), "X-Testbed-Batch": str(job.batch)})
        if job.error is not None or job.result is None:
            return self._error(500, f"inference failed in model {name!r}: {job.error}", headers, count=False)
        cpu0 = time.thread_time()
        answer = encode_json(predict_response(job.result, columnar))
        cpu = time.thread_time() - cpu0
        self.answer_cpu_s += cpu
        if self.cpu_pad:  # the encoding at 1 / k speed, as the request's decoding
            hold_loop(self.cpu_pad * cpu)
        self.expected_handling_s += self.handling_expected.get(name, (0.0, 0.0))[1]
        headers["X-Testbed-T3h"] = str(time.time_ns())  # encoded; aiohttp writes it as the handler returns
        return web.Response(body=answer, headers=headers, content_type="application/json")

    def _arrived_ns(self, request: web.Request) -> int:
        """When the request's last byte reached the host (:mod:`testbed.serve.rxstamp`): the kernel's
        timestamp of the connection's latest read, or now when it has none (a stamped socket that
        read no stamp: counted in ``unstamped_reads``)."""
        sock = self.stamps.get(request.transport) if request.transport is not None else None
        stamp = sock.last_rx_ns if sock is not None else None
        return stamp if stamp is not None else time.time_ns()

    async def model_status(self, request: web.Request) -> web.Response:
        """``GET /v1/models/{name}``: TF Serving's model status shape."""
        found = self._model(request)
        if isinstance(found, web.Response):
            return found
        return web.json_response({"model_version_status": [
            {"version": "1", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}]})

    async def model_metadata(self, request: web.Request) -> web.Response:
        """``GET /v1/models/{name}/metadata``: TF Serving's metadata shape (signature_def)."""
        found = self._model(request)
        if isinstance(found, web.Response):
            return found
        return web.json_response(metadata_response(*found))

    async def list_models(self, request: web.Request) -> web.Response:
        """``GET /v1/models``: served variants with family, runtime, accuracy and parameter count."""
        return web.json_response({"models": {n: {"family": m.info.get("family"), "runtime": m.runtime,
                                                 "accuracy": m.info.get("accuracy"), "params": m.info.get("params")}
                                             for n, m in self.models.items()}})

    async def stats_handler(self, request: web.Request) -> web.Response:
        """``GET /v1/stats``."""
        return web.json_response(self.snapshot())

    def make_app(self) -> web.Application:
        """The aiohttp application with the routes above and JSON error pages."""
        app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[self._json_errors])
        name, ver = r"{name:[^/:]+}", r"{version:[^/:]+}"
        app.router.add_post(f"/v1/models/{name}:predict", self.predict)
        app.router.add_post(f"/v1/models/{name}/versions/{ver}:predict", self.predict)
        app.router.add_get("/v1/models", self.list_models)
        app.router.add_get(f"/v1/models/{name}", self.model_status)
        app.router.add_get(f"/v1/models/{name}/versions/{ver}", self.model_status)
        app.router.add_get(f"/v1/models/{name}/metadata", self.model_metadata)
        app.router.add_get(f"/v1/models/{name}/versions/{ver}/metadata", self.model_metadata)
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




def _resolve(future: asyncio.Future) -> None:
    if not future.done():  # the client may have gone away (handler cancelled)
        future.set_result(None)


async def _listen(server: InferenceServer, host: str, port: int) -> tuple[web.AppRunner, asyncio.Server, int]:
    """``server``'s application on our own listening socket, stamped (:mod:`testbed.serve.rxstamp`),
    with aiohttp's handler per connection: (runner, listener, the port bound).

    Raises:
        OSError: the address cannot be bound.
    """
    runner = web.AppRunner(server.make_app(), access_log=None, handle_signals=False,
                           shutdown_timeout=SHUTDOWN_GRACE_S)
    await runner.setup()
    sock = socket.create_server((host, port), backlog=1024, family=socket.AF_INET)
    rxstamp.enable(sock)
    listener = await asyncio.get_running_loop().create_server(
        lambda: rxstamp.StampingProtocol(runner.server(), server.stamps), sock=sock)
    return runner, listener, sock.getsockname()[1]


#: The handling check (:func:`time_handling`): about this much of the event loop's CPU at the
#: profile's speed (s), and at most this much of the model calls' (s), in at least
#: :data:`HANDLING_LEAST_QUERIES` timed queries after :data:`HANDLING_WARMUP` untimed ones. Our
#: choice: the handling profile's 200 back-to-back queries of 0.2-1.6 ms repeat within a few % on
#: a quiet host (models/profiles/handling.json, :mod:`testbed.serve.handling`).
HANDLING_CHECK_S = 0.25
HANDLING_CALLS_S = 1.0
HANDLING_LEAST_QUERIES = 30
HANDLING_WARMUP = 20
#: The timed queries are split into this many batches, and the check's figure is the median of
#: their means: a burst of other load that slows one batch's queries is left out (our choice).
HANDLING_BATCHES = 5


def handling_queries(handling_ms: float, call_ms: float) -> int:
    """How many queries the handling check times, for a query of ``handling_ms`` of handling and
    ``call_ms`` of model call at the profile's speed (module constants above)."""
    by_handling = int(HANDLING_CHECK_S * 1e3 / max(handling_ms, 1e-6))
    by_calls = int(HANDLING_CALLS_S * 1e3 / max(handling_ms + call_ms, 1e-6))
    return max(HANDLING_LEAST_QUERIES, min(by_handling, by_calls))


def time_handling(host: str, zoo_dir: str, name: str, model: Any, n: int) -> float:
    """The event loop's CPU per query (ms) of ``n`` real queries of ``name`` (a loaded ``model``):
    a server of that model alone (1 worker, our listening socket, as :func:`serve` makes it) on
    ``host`` at a free port, and a client thread sending the family's real request bodies
    (:func:`testbed.plan.zoo.request_bodies`) back to back on one kept-alive connection after
    :data:`HANDLING_WARMUP` untimed ones; the event loop thread's CPU clock over each of
    :data:`HANDLING_BATCHES` batches of the timed queries, the median of their means.
    The handling profile's method (:mod:`testbed.serve.handling`: its server's main thread per
    query), made inside the server's own process, in its network namespace and before its CPU
    quota is set. The server is gone when this returns.

    Raises:
        RuntimeError: a query was not answered with HTTP 200 (names the status).
        OSError: ``host`` cannot be bound or reached.
    """
    family = zoo.load_manifest(zoo_dir)["variants"][name]["family"]
    bodies = zoo.request_bodies(zoo_dir, family)[0]

    async def check() -> float:
        server = InferenceServer({name: model}, workers=1, queue_limit=8)
        runner, listener, port = await _listen(server, host, 0)
        server.start_workers()
        clock = time.pthread_getcpuclockid(threading.get_ident())  # this thread runs the event loop

        def client() -> float:
            # raw bytes on a socket: the client's own Python, which holds the interpreter's lock
            # that the event loop then waits for, kept to a minimum
            requests = [(f"POST /v1/models/{name}:predict HTTP/1.1\r\nHost: {host}\r\n"
                         f"Content-Type: application/json\r\nContent-Length: {len(b)}\r\n\r\n").encode() + b
                        for b in bodies]
            with socket.create_connection((host, port), timeout=300) as conn:
                for i in range(HANDLING_WARMUP):
                    conn.sendall(requests[i % len(requests)])
                    _read_answer(conn, name)
                means = []
                for batch in np.array_split(np.arange(n), HANDLING_BATCHES):
                    cpu0 = time.clock_gettime(clock)
                    for i in batch:
                        conn.sendall(requests[i % len(requests)])
                        _read_answer(conn, name)
                    means.append((time.clock_gettime(clock) - cpu0) / len(batch) * 1e3)
                return float(np.median(means))

        try:
            return await asyncio.to_thread(client)
        finally:
            listener.close()
            await runner.cleanup()
            await asyncio.to_thread(server.stop_workers)

    return asyncio.run(check())


def _read_answer(conn: socket.socket, name: str) -> None:
    """Read one HTTP/1.1 answer (headers, then Content-Length bytes) from ``conn``.

    Raises:
        RuntimeError: the status is not 200, or the connection closed (names the model).
        OSError: the socket failed or timed out.
    """
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            raise RuntimeError(f"the handling check's connection closed before {name}'s answer")
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    status = head.split(b" ", 2)[1]
    if status != b"200":
        raise RuntimeError(f"the handling check's query of {name} was answered HTTP {status.decode(errors='replace')}")
    length = int(next(line.split(b":", 1)[1] for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:")))
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            raise RuntimeError(f"the handling check's connection closed in {name}'s answer")
        body += chunk


def with_handling(cfg: ServerConfig, speed: ClusterSpeed, models: dict[str, Any]) -> ClusterSpeed:
    """``speed`` with its :attr:`~testbed.plan.speeds.ClusterSpeed.handling_factor`: a restarted
    server's first life's, else its handling check's (:meth:`~testbed.plan.speeds.SpeedTarget.handling_probe`,
    :func:`time_handling`: the event loop's CPU per query over the profile's ``handling_ms``), or
    ``speed`` as it is when its target asks for none.

    Raises:
        RuntimeError, OSError: as :func:`time_handling`.
    """
    target = cfg.speed
    if target is None:
        return speed
    if target.measured_handling_factor is not None:
        return speed.model_copy(update={"handling_factor": target.measured_handling_factor})
    probe = target.handling_probe()
    if probe is None:
        return speed
    n = handling_queries(target.handling_ms[probe], target.profile_ms[probe])
    ms = time_handling(cfg.host, cfg.zoo_dir, probe, models[probe], n)
    return speed.model_copy(update={"handling_factor": ms / target.handling_ms[probe]})


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
    runner, listener, bound = await _listen(server, host, port)
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
    listener.close()  # stops accepting
    await runner.cleanup()  # waits for in-flight queries (<= SHUTDOWN_GRACE_S)
    await asyncio.to_thread(server.stop_workers)
    if stats_file:
        write_json_atomic(stats_file, server.snapshot())


def load_models(cfg: ServerConfig) -> dict[str, Any]:
    """The served variants, loaded with their runtimes and thread counts.

    Raises:
        zoo.ZooError: a variant or runtime file is missing (checked before TensorFlow is imported).
    """
    manifest = zoo.load_manifest(cfg.zoo_dir)
    for n in cfg.models:  # fail fast, before paying for TensorFlow's import
        (zoo.tflite_path if cfg.runtimes[n] == "litert" else zoo.variant_dir)(cfg.zoo_dir, n, manifest)
    if "tensorflow" in cfg.runtimes.values():
        configure_tf_threads(intra_op=cfg.workers * cfg.threads, inter_op=1)
    return {n: load_model(cfg.zoo_dir, n, cfg.runtimes[n], manifest, threads=cfg.threads, pool=cfg.workers)
            for n in cfg.models}


def warm_up(cfg: ServerConfig, models: dict[str, Any]) -> dict[str, float]:
    """``warmup_calls`` calls per model (and as many at ``max_batch``); ms per model."""
    out = {}
    for n, m in models.items():
        try:
            x = zoo.load_payloads(cfg.zoo_dir, m.info["family"])[0]
        except zoo.ZooError:
            x = np.random.default_rng(0).random((8, *m.input_shape), dtype=np.float32)
        ms = m.warm_up(x, cfg.warmup_calls, 1)
        if cfg.max_batch > 1:
            ms += m.warm_up(x, cfg.warmup_calls, cfg.max_batch)
        out[n] = round(ms, 3)
    return out


# Not a TestbedError: internal control flow of main() below (a signal during loading); never leaves this module.
class _StopWhileLoading(BaseException):
    """SIGTERM/SIGINT while the models load or warm up (a BaseException: library code that catches
    ``Exception`` during an import must not swallow it)."""


def main(argv: list[str] | None = None) -> int:
    """Run the server; returns the exit code (0 after SIGTERM/SIGINT, 2 on a bad config or zoo, 7 when
    a model fails its integrity check: nothing is served then)."""
    import argparse


    ap = argparse.ArgumentParser(
        prog="python -m testbed.serve.server",
        description="The inference server of one cluster (TensorFlow Serving's REST API). Every setting is in "
                    "CONFIG.json, a testbed.plan.boundaries.ServerConfig; the emulation writes it from the cluster's "
                    "spec (clusters/<name>.server.json, testbed.serve.launch.write_server_config).")
    ap.add_argument("config", metavar="CONFIG.json", help="the server's ServerConfig (JSON)")
    try:
        argv = [ap.parse_args(sys.argv[1:] if argv is None else argv).config]
    except SystemExit as exc:  # --help (0) or a usage error (2)
        return int(exc.code or 0)
    early_stop: list[int] = []

    def stop_loading(signum: int, _frame) -> None:
        early_stop.append(signum)
        raise _StopWhileLoading

    for sig in (signal.SIGTERM, signal.SIGINT):  # while loading: stop at once, not after the warm-up
        signal.signal(sig, stop_loading)
    try:
        cfg = read_config(argv[0], ServerConfig)
        throttles = _throttles(cfg)
        models = load_models(cfg)
        answers = {n: check_answers(cfg.zoo_dir, n, m, zoo.load_manifest(cfg.zoo_dir)) for n, m in models.items()}
        warmup = warm_up(cfg, models)
        speed = measure_speed(cfg.speed, cfg.cpu_cores, cfg.zoo_dir, models) if cfg.speed else None
        for sig in (signal.SIGTERM, signal.SIGINT):  # until the event loop takes over
            signal.signal(sig, lambda signum, _frame: early_stop.append(signum))
    except _StopWhileLoading:
        print("[inference-server] stopped while loading its models (no stats: it never served)", file=sys.stderr)
        return 0
    except (TestbedError, zoo.ZooError, ValueError) as exc:
        print(f"[inference-server] {exc}", file=sys.stderr)
        return EXIT_INTEGRITY if isinstance(exc, zoo.ZooIntegrityError) else 2
    # TensorFlow leaves a huge, long-lived object graph; each full (gen-2) collection walks it:
    # measured here ~600 ms wall at a 0.25-core CFS quota, stalling every query behind it.
    # Collect once, then freeze the survivors into the permanent generation (Python docs,
    # gc.freeze: "Freeze all the objects tracked by gc ... ignore them for all future collections").
    gc.collect()
    gc.freeze()
    if speed is not None and not early_stop:
        try:
            speed = with_handling(cfg, speed, models)
        except (RuntimeError, OSError) as exc:
            print(f"[inference-server] the handling check failed: {exc}", file=sys.stderr)
            return 2
    server = InferenceServer(models, workers=cfg.workers, queue_limit=cfg.queue_limit, discipline=cfg.discipline,
                             admission=cfg.admission, max_batch=cfg.max_batch,
                             max_queue_delay_ms=cfg.max_queue_delay_ms, service_ms=cfg.mean_service_ms,
                             cpu_pad=speed.cpu_pad if speed else cfg.cpu_pad,
                             paces=_paces(cfg, speed), seed=zlib.crc32(cfg.cluster.encode()),
                             handling_expected=_handling_expected(cfg, speed), throttles=throttles)
    if early_stop:
        if cfg.stats_file:
            write_json_atomic(cfg.stats_file, server.snapshot())
        return 0
    ready_info = {"models": cfg.models, "runtimes": cfg.runtimes, "mean_service_ms": cfg.mean_service_ms,
                  "warmup_ms": round(sum(warmup.values()), 3), "warmup_ms_per_model": warmup,
                  "answer_check": answers, "speed": speed.model_dump(mode="json") if speed else None,
                  "config": cfg.model_dump(mode="json")}
    try:
        asyncio.run(serve(server, cfg.host, cfg.port, cfg.stats_file, cfg.ready_file, ready_info,
                          cfg.stats_interval_s, early_stop))
    except OSError as exc:
        print(f"[inference-server] cannot serve on {cfg.host}:{cfg.port}: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
