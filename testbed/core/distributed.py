"""Run independent tasks in parallel: local processes, or Ray (one machine or a cluster).

One primitive, :func:`imap_unordered`, used by ``testbed sweep`` and meant for ``testbed evaluate``
and the rollout workers of ``testbed train``::

    from testbed.core.distributed import imap_unordered
    for i, result in imap_unordered(fn, [(a, b), (c, d)], backend="ray"):
        ...  # result = fn(*tasks[i]), in the order the tasks finish

Backends:

* ``process`` (default): ``concurrent.futures.ProcessPoolExecutor`` with ``jobs`` workers
  (default: the CPU count). The workers end with the command however it ends: an interrupt or a
  failed task stops them (``_stop_workers``), and the kernel sends each SIGTERM when the command
  dies, SIGKILL included (the parent-death signal of :mod:`testbed.core.lifeline`).
* ``ray``: every task is a Ray task (``num_cpus`` per task, default 1, plus ``resources``, e.g.
  ``{"mininet": 1}`` so that a node runs one emulation at a time). Without ``ray_address``, Ray
  is embedded: ``ray.init()`` starts a private local instance with ``jobs`` CPUs (default: the CPU
  count), bound to 127.0.0.1 only (see :func:`ray_session`). With ``ray_address`` (``HOST:PORT``
  of a running head, or ``auto``) the tasks go to that cluster.

Large arguments shared by many tasks (a plan) are sent once: with Ray every argument that is not
a plain number or string goes to the object store once per distinct object (``ray.put``) and the
tasks receive it by reference.

Determinism is the tasks' own: the backends only decide where and when a task runs, so the same
tasks give the same results on either (``tests/test_ray.py`` checks it on a two-node cluster).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import Any, Literal

from testbed.core.errors import InputError
from testbed.core.lifeline import tie_to_parent

Backend = Literal["process", "ray"]
BACKENDS: tuple[str, ...] = ("process", "ray")
#: Ray reads these when it is imported: no usage statistics sent anywhere, and a Ray started here
#: without a cluster address stays on 127.0.0.1 (Ray otherwise binds its services to the address
#: of the interface with the default route, so that other machines can join).
_RAY_LOCAL_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


#: Seconds a cancelled running task gets to end by itself (an emulation's teardown) before Ray stops.
CANCEL_GRACE_S = 120.0


class DistributedError(InputError):
    """A backend that cannot be used as asked (Ray missing, bad address, resource absent)."""


def _import_ray(local: bool):
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if local:
        for k, v in _RAY_LOCAL_ENV.items():
            os.environ.setdefault(k, v)
    try:
        import ray
    except ImportError:
        raise DistributedError("the ray backend needs Ray: pip install 'ray==2.60.0'") from None
    return ray


@contextlib.contextmanager
def ray_session(address: str | None = None, num_cpus: int | None = None,
                resources: dict[str, float] | None = None) -> Iterator[Any]:
    """Ray, connected for the duration of the ``with`` block; yields the ``ray`` module.

    ``address`` None: an embedded local instance (``ray.init`` with ``num_cpus``, default
    ``os.cpu_count()``, and ``resources`` declared for this machine, no dashboard, services on
    127.0.0.1), shut down at the end. ``address``: connect to that cluster (``num_cpus`` and
    ``resources`` are the cluster's own, set by ``ray start``), disconnect at the end. A Ray
    already initialised by the caller is used as it is and left running.

    Raises:
        DistributedError: Ray is not installed, or the cluster cannot be reached.
    """
    ray = _import_ray(local=address is None or _is_loopback(address))
    if ray.is_initialized():
        yield ray
        return
    if address not in (None, "auto"):
        _check_reachable(address)
    try:
        if address is None:
            ray.init(num_cpus=num_cpus or os.cpu_count() or 1, resources=resources or None, include_dashboard=False,
                     log_to_driver=False, configure_logging=False)
        else:
            ray.init(address=address, log_to_driver=False, configure_logging=False)
    except (ConnectionError, ValueError, RuntimeError) as exc:
        raise DistributedError(f"cannot start or reach Ray at {address or 'a local instance'}: {exc}") from None
    try:
        yield ray
    finally:
        ray.shutdown()


def _split(address: str) -> tuple[str, int]:
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit():
        raise DistributedError(f"--ray-address {address!r}: expected HOST:PORT of the head (e.g. 10.0.0.5:6379) "
                               f"or 'auto'")
    return host.strip("[]"), int(port)


def _is_loopback(address: str) -> bool:
    """A cluster on this machine's loopback (then Ray must not swap 127.0.0.1 for the NIC's address)."""
    if address == "auto":
        return False
    host = _split(address)[0]
    return host == "localhost" or host.startswith("127.") or host == "::1"


def _check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail fast (instead of Ray's minutes of retries) when nothing listens at the head's address."""
    import socket

    host, port = _split(address)
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as exc:
        raise DistributedError(f"no Ray head at {address}: {exc} (start one with ray start --head, "
                               f"docs/scale-out.md)") from None


def _plain(v: Any) -> bool:
    return v is None or isinstance(v, (bool, int, float, str, bytes))


def _check_resources(ray, resources: dict[str, float] | None) -> None:
    have = ray.cluster_resources()
    missing = {k: v for k, v in (resources or {}).items() if have.get(k, 0) < v}
    if missing:
        raise DistributedError(f"no Ray node offers {missing} (cluster has {sorted(have)}); start the nodes "
                               f"with e.g. ray start ... --resources='{{\"mininet\": 1}}' (docs/scale-out.md)")


def _ray_imap(fn: Callable, tasks: Sequence[tuple], jobs: int | None, ray_address: str | None,
              resources: dict[str, float] | None, num_cpus: float) -> Iterator[tuple[int, Any]]:
    local_res = {k: max(1.0, v) for k, v in (resources or {}).items()} if ray_address is None else None
    with ray_session(ray_address, jobs, local_res) as ray:
        _check_resources(ray, resources)
        remote = ray.remote(num_cpus=num_cpus, resources=resources or None, max_retries=0)(fn)
        refs: dict[int, Any] = {}  # id(object) -> its ObjectRef: each shared object is sent once

        def ref(v: Any) -> Any:
            if _plain(v):
                return v
            if id(v) not in refs:
                refs[id(v)] = ray.put(v)
            return refs[id(v)]

        pending = {remote.remote(*[ref(a) for a in args]): i for i, args in enumerate(tasks)}
        try:
            while pending:
                done, _ = ray.wait(list(pending), num_returns=1)
                for r in done:
                    yield pending.pop(r), ray.get(r)  # a task's exception is raised here, as its own type
        finally:
            _cancel(ray, list(pending))


def _cancel(ray, refs: list, grace_s: float = CANCEL_GRACE_S) -> None:
    """Stop tasks that will not be collected: queued ones are dropped, running ones get a
    KeyboardInterrupt (an emulation then tears down as on Ctrl-C); wait up to ``grace_s`` s for them
    before Ray shuts down, which would kill their processes outright."""
    if not refs:
        return
    for r in refs:
        ray.cancel(r, force=False)
    ray.wait(refs, num_returns=len(refs), timeout=grace_s)


def _worker_signals(parent_pid: int) -> None:
    """A pool worker ends at once on SIGTERM (the default action), whatever handler it inherited
    from the command: a simulator cell has nothing to tear down, and an emulation cell's run
    installs its own handler for the time of the run (it tears down as on Ctrl-C). The worker gets
    that SIGTERM when the command dies, however it dies (SIGKILL included): the lifeline's death
    signal (:func:`testbed.core.lifeline.tie_to_parent`; a worker whose command died before the
    signal was set exits at once)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    tie_to_parent(parent_pid)()


def _stop_workers(procs: list, grace_s: float = CANCEL_GRACE_S) -> None:
    """Stop a pool's worker processes (``multiprocessing.Process``) when its results will not be
    collected (an interrupted command, a failed task): SIGTERM every 2 s while they live (an
    emulation cell tears down; a worker that took one more queued cell stops it too), SIGKILL those
    left after ``grace_s``. Waiting for the running cells instead would take minutes, and a SIGTERM to
    the command alone would leave the workers running as orphans."""
    deadline = time.monotonic() + grace_s
    while any(p.is_alive() for p in procs) and time.monotonic() < deadline:
        for p in procs:
            if p.is_alive():
                p.terminate()
        t_next = min(deadline, time.monotonic() + 2.0)
        for p in procs:
            p.join(max(0.0, t_next - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(1.0)


def _process_imap(fn: Callable, tasks: Sequence[tuple], jobs: int | None) -> Iterator[tuple[int, Any]]:
    if jobs == 1:  # one worker: in this process, in task order (no pool to start, tracebacks stay local)
        for i, args in enumerate(tasks):
            yield i, fn(*args)
        return
    # the workers are forked by this thread, which lives while it consumes this generator: their
    # death signal (set by _worker_signals) fires when the command dies
    pool = ProcessPoolExecutor(max_workers=jobs or os.cpu_count() or 1, initializer=_worker_signals,
                               initargs=(os.getpid(),))
    pending: dict[Future, int] = {}
    try:
        pending = {pool.submit(fn, *args): i for i, args in enumerate(tasks)}
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for f in done:
                yield pending.pop(f), f.result()
    finally:
        if pending:  # interrupted, or a task failed: the rest will not be collected
            procs = list((getattr(pool, "_processes", None) or {}).values())  # no public handle on them
            pool.shutdown(wait=False, cancel_futures=True)
            _stop_workers(procs)
        pool.shutdown(wait=True, cancel_futures=True)


def imap_unordered(fn: Callable, tasks: Sequence[tuple], *, backend: Backend = "process", jobs: int | None = None,
                   ray_address: str | None = None, resources: dict[str, float] | None = None,
                   num_cpus: float = 1) -> Iterator[tuple[int, Any]]:
    """Yield ``(i, fn(*tasks[i]))`` for every task, in the order the tasks finish.

    Args:
        fn: a module-level function (it is pickled to the workers).
        tasks: the argument tuples.
        backend: ``process`` or ``ray`` (module docstring).
        jobs: parallel workers (process) / CPUs of the embedded Ray instance; default: the CPU count.
            Ignored with ``ray_address`` (the cluster's CPUs decide).
        ray_address: a Ray cluster (``HOST:PORT`` or ``auto``); None: embedded local Ray.
        resources: Ray custom resources each task needs (``{"mininet": 1}``); with embedded Ray, this
            machine declares them (one unit each, or the amount asked), so tasks queue on it.
        num_cpus: CPUs each Ray task reserves.

    Raises:
        DistributedError: unknown backend, Ray missing or unreachable, no node with ``resources``.
        Exception: the first exception a task raised (the remaining tasks are cancelled or
            abandoned when the generator is closed).
    """
    if backend not in BACKENDS:
        raise DistributedError(f"backend {backend!r}: expected one of {', '.join(BACKENDS)}")
    if backend == "ray":
        return _ray_imap(fn, tasks, jobs, ray_address, resources, num_cpus)
    if ray_address is not None:
        raise DistributedError("--ray-address needs the ray backend")
    return _process_imap(fn, tasks, jobs)


__all__ = ["BACKENDS", "Backend", "DistributedError", "imap_unordered", "ray_session"]
