"""A cluster server's queue: bounded, FIFO or EDF, admission control, dynamic batching, W workers.

Pure logic with no clock of its own: every call takes ``now`` (seconds on the caller's clock: the
wall clock in the inference server, the virtual clock in the simulator). The server
(:mod:`testbed.serve.scheduler`) and the simulator (:mod:`testbed.sim`) are adapters over
:class:`ServerQueue`; neither states a queue rule of its own. Rules (``ServerSpec`` in
:mod:`testbed.spec.serving` is the user-facing description):

* **Order.** Waiting queries are kept by a key: FIFO serves in arrival order; EDF serves the
  earliest absolute deadline first (no deadline = +infinity; ties: arrival order). That key is
  the only difference between the two.
* **Bound.** At most ``queue_limit`` queries wait; one more is refused: :data:`QUEUE_FULL`.
  Queries in service do not count. A query is *waiting* from its arrival until a worker starts
  its batch.
* **Admission** (``admission=True``, queries with a deadline only): at arrival, ``ahead`` = the
  waiting queries that would be served before it (FIFO: all; EDF: those whose deadline is <= its
  own) + the busy workers; the query is refused (:data:`ADMISSION`) if
  ``now + (ahead / workers + 1) x mean_service_s[model]`` is later than its deadline. An admitted
  query is never dropped later, even when EDF lets later arrivals overtake it.
* **Start.** A free worker starts a batch at once when nothing is batched (``max_batch`` 1).
  With batching, the batch is the first waiting query in key order plus the waiting queries for
  the same model in key order while the batch holds at most ``max_batch`` inputs; a free worker
  starts it as soon as it is full, or at the latest ``max_queue_delay_s`` after the arrival of
  the oldest waiting query for that model (:meth:`ServerQueue.due`). The queries of a batch share
  one model call: the same start and end.

Events, as the adapters use them: :meth:`arrive` (a query arrives; it may start at once),
:meth:`complete` (a worker finished; it may start the next query at once), :meth:`due` /
:meth:`take` (the batching timer), :meth:`clear` (the server died: what waited is lost).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping
from heapq import heappop, heappush
from typing import Any

#: Refusal reasons (the HTTP 503 body's ``reason``, the records' ``drop_reason``).
QUEUE_FULL = "queue_full"
ADMISSION = "admission"
#: Return codes of :meth:`ServerQueue.arrive`.
STARTED, WAITING, REFUSED_FULL, REFUSED_ADMISSION = 0, 1, 2, 3
REASONS = {REFUSED_FULL: QUEUE_FULL, REFUSED_ADMISSION: ADMISSION}
INF = math.inf


class ServerQueue:
    """The queue of one server (module docstring for the rules).

    Args:
        workers: W >= 1 workers (model calls in parallel).
        queue_limit: most waiting queries (>= 1).
        discipline: ``fifo`` or ``edf``.
        admission: refuse queries expected to finish after their deadline.
        max_batch: most inputs per model call (1: no batching).
        max_queue_delay_s: longest a batch waits to fill after its oldest query arrived (s, >= 0).
        mean_service_s: model -> mean service time of one query (s) at the server's CPU share,
            needed for every model when ``admission`` is on.

    Raises:
        ValueError: a setting out of range (the message names it).

    Entries are ``(key, seq, item, model, size, arrival_s)``; ``item`` is the adapter's handle of
    the query (a job, an index), returned untouched in batches.
    """

    __slots__ = ("workers", "limit", "edf", "admission", "max_batch", "max_delay", "mean_s", "busy", "heap", "_seq")

    def __init__(self, workers: int = 1, queue_limit: int = 64, discipline: str = "fifo", admission: bool = False,
                 max_batch: int = 1, max_queue_delay_s: float = 0.0, mean_service_s: Mapping[str, float] | None = None):
        if workers < 1 or queue_limit < 1 or max_batch < 1 or not max_queue_delay_s >= 0:
            raise ValueError(f"workers, queue_limit, max_batch must be >= 1 and max_queue_delay >= 0 "
                             f"(got {workers}, {queue_limit}, {max_batch}, {max_queue_delay_s})")
        if discipline not in ("fifo", "edf"):
            raise ValueError(f"discipline must be 'fifo' or 'edf', got {discipline!r}")
        self.mean_s = dict(mean_service_s or {})
        if admission and not self.mean_s:
            raise ValueError("admission needs a mean service time per model")
        self.workers, self.limit, self.edf = workers, queue_limit, discipline == "edf"
        self.admission, self.max_batch, self.max_delay = admission, max_batch, float(max_queue_delay_s)
        self.busy = 0  # workers in a model call
        #: The waiting entries (a heap by key, seq); adapters may read it, never change it. The
        #: list object is never replaced, so a reference to it stays valid.
        self.heap: list[tuple[float, int, Any, str, int, float]] = []
        self._seq = 0

    def __len__(self) -> int:
        """Queries waiting."""
        return len(self.heap)

    def key(self, deadline_s: float | None) -> float:
        """The ordering key of a query: 0 under FIFO (the sequence number orders), its deadline under EDF."""
        if not self.edf:
            return 0.0
        return INF if deadline_s is None else deadline_s

    def ahead(self, deadline_s: float | None) -> int:
        """Queries that would be served before one arriving now with ``deadline_s``, busy workers included."""
        if not self.edf:
            return len(self.heap) + self.busy
        k = self.key(deadline_s)
        return sum(1 for e in self.heap if e[0] <= k) + self.busy

    def expected_completion(self, model: str, now: float, deadline_s: float | None) -> float:
        """Admission's estimate (s): ``now + (ahead / workers + 1) x mean service of model``."""
        return now + (self.ahead(deadline_s) / self.workers + 1.0) * self.mean_s[model]

    def arrive(self, item: Any, model: str, now: float, deadline_s: float | None = None, size: int = 1) -> int:
        """A query arrives. Returns :data:`STARTED` (a worker was free, nothing waits, no
        batching: it is in service now, ``busy`` counts it), :data:`WAITING`, :data:`REFUSED_FULL`
        or :data:`REFUSED_ADMISSION`.

        Raises:
            KeyError: admission is on and ``model`` has no mean service time.
        """
        heap = self.heap
        if len(heap) >= self.limit:
            return REFUSED_FULL
        if self.admission and deadline_s is not None:
            if self.expected_completion(model, now, deadline_s) > deadline_s:
                return REFUSED_ADMISSION
        if not heap and self.busy < self.workers and self.max_batch == 1:
            self.busy += 1
            return STARTED
        self._seq += 1
        key = (INF if deadline_s is None else deadline_s) if self.edf else 0.0  # = self.key(deadline_s)
        heappush(heap, (key, self._seq, item, model, size, now))
        return WAITING

    def complete(self, now: float) -> list[Any] | None:
        """A worker finished its model call. Without batching it takes the next waiting query at
        once (returned as a one-item batch, still counted busy); otherwise returns None (call
        :meth:`due` / :meth:`take`)."""
        if self.max_batch == 1 and self.heap:
            return [heappop(self.heap)[2]]  # the worker stays busy with the next query
        self.busy -= 1
        return None

    def _batch_entries(self) -> tuple[list[tuple], int]:
        """The entries the next batch would hold (in key order) and its inputs."""
        heap = self.heap
        head = heap[0]
        if self.max_batch == 1:
            return [head], head[4]
        model, room = head[3], self.max_batch
        out, n = [], 0
        for e in sorted(heap) if len(heap) > 1 else heap:
            if e[3] == model and e[4] <= room - n:
                out.append(e)
                n += e[4]
                if n >= room:
                    break
        return out, n

    def due(self, now: float) -> float:
        """When a free worker would start the next batch if nothing else happened: ``now`` or a
        later batching deadline; :data:`INF` when nothing waits or every worker is busy."""
        heap = self.heap
        if not heap or self.busy >= self.workers:
            return INF
        if self.max_batch == 1:
            return now
        entries, n = self._batch_entries()
        if n >= self.max_batch:
            return now
        model = heap[0][3]
        oldest = min(e[5] for e in heap if e[3] == model)
        return max(now, oldest + self.max_delay)

    def take(self, now: float, force: bool = False) -> tuple[str, list[Any]] | None:
        """Start the next batch on a free worker if it is due at ``now`` (or, with ``force``,
        whenever anything waits and a worker is free: a server shutting down serves what is
        queued). Returns ``(model, items in key order)`` and counts the worker busy, or None."""
        if not self.heap or self.busy >= self.workers:
            return None
        if not force and self.due(now) > now:
            return None
        entries, _ = self._batch_entries()
        if len(entries) == 1 and entries[0] is self.heap[0]:
            heapq.heappop(self.heap)
        else:
            taken = {id(e) for e in entries}
            self.heap[:] = [e for e in self.heap if id(e) not in taken]
            heapq.heapify(self.heap)
        self.busy += 1
        return entries[0][3], [e[2] for e in entries]

    def clear(self) -> list[Any]:
        """The server died: return the waiting items (lost) and forget them; no worker is busy."""
        items = [e[2] for e in sorted(self.heap)]
        self.heap.clear()
        self.busy = 0
        return items

    def waiting_items(self) -> list[Any]:
        """The waiting items in key order (for inspection; the queue is unchanged)."""
        return [e[2] for e in sorted(self.heap)]


__all__ = ["ADMISSION", "INF", "QUEUE_FULL", "REASONS", "REFUSED_ADMISSION", "REFUSED_FULL", "STARTED", "WAITING",
           "ServerQueue"]
