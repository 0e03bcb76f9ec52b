"""The per-query record: its schema with units, the grace period, the outcome rule and the builder.

One row per query, the same columns in the emulation (:mod:`testbed.emu.source`) and the simulator
(:mod:`testbed.sim`), both built by :func:`make_record` (docs/records-schema.md is the reference
for users). Times ``*_ns`` are integers, ns on the clock every emulated host shares (epoch ns in
the emulation, virtual ns since the load started in the simulator); ``*_ms`` are milliseconds.

Outcome (``docs/system-model.md``, "The record and the outcome rule"): a query SUCCEEDS iff it
was answered (HTTP 200), e2e = t4 - t0 <= D_a, and alpha_m >= A_a. Failures by cause, in this
order of precedence (:func:`classify`):

==================  =============================================================================
``unreachable``     no answer in time (none, a client-side error, or an answer after the deadline)
                    while the network had no route between the source and the cluster at some
                    instant of the query's life, from its creation to its deadline plus
                    :data:`GRACE_MS`: a link cut by an event, or none at all (``cut``,
                    :func:`testbed.model.network.path_cut` over the plan's timeline)
``deadline_miss``   no answer within the deadline plus :data:`GRACE_MS` (the source gave up)
``server_down``     the connection was refused or reset: nothing listens (the server is down)
``dropped``         HTTP 503: refused by the server's queue bound or admission (``drop_reason``)
``error``           any other HTTP status or client-side error
``accuracy``        answered, but alpha_m < A_a
``deadline_miss``   answered after the deadline
==================  =============================================================================
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from testbed.spec.experiment import GRACE_MS  # the grace is part of what an experiment's deadline means

#: ``status`` values of :func:`classify` beyond HTTP codes.
NO_ANSWER: int | None = None  # nothing came back within the deadline + grace
CONNECTION_REFUSED = -1  # connection refused or reset by the peer: the server is down
CLIENT_ERROR = 0  # any other failure on the client side (e.g. a malformed answer)

SUCCESS = "success"
FAILURE = "failure"
#: Failure causes (``""`` on success); the precedence is the table's above.
CAUSES: tuple[str, ...] = ("deadline_miss", "server_down", "dropped", "error", "accuracy", "unreachable")
#: The five shares of e2e (``<share>_ms`` columns), in the query's order: e2e = their sum.
SHARES: tuple[str, ...] = ("dispatch", "network", "handling", "queueing", "inference")
#: The causes that are the network's (the summary's headline names them when every query failed).
NETWORK_CAUSES: frozenset[str] = frozenset({"unreachable"})


@dataclass(frozen=True)
class Column:
    """One record column: its name, unit (``-`` for none) and meaning."""

    name: str
    unit: str
    doc: str


#: The record schema, in column order.
COLUMNS: tuple[Column, ...] = (
    Column("query_id", "-", "<source>-<n>, n = 1, 2, ... per source (HTTP header X-Testbed-Query-Id)"),
    Column("source", "-", "source host name"),
    Column("application", "-", "application name"),
    Column("cluster", "-", "cluster chosen by the policy"),
    Column("model", "-", "model variant chosen by the policy"),
    Column("policy", "-", "policy in force for this query"),
    Column("fallback", "0/1", "1 when no option met the constraints and the policy fell back"),
    Column("deadline_ms", "ms", "the application's deadline D_a"),
    Column("min_accuracy", "0-1", "the application's minimum accuracy A_a"),
    Column("model_accuracy", "0-1", "accuracy alpha_m of the chosen model"),
    Column("expected_rtt_ms", "ms", "RTT of the path in force when the query was sent (at td), with the link "
                                    "delays in force then (2 x sum of one-way delays); empty: no route then"),
    Column("t0_ns", "ns", "query created at the source (just before the policy decides)"),
    Column("td_ns", "ns", "the dispatcher's decision made: the request starts on its way"),
    Column("t1_ns", "ns", "request fully arrived at the cluster's host (before the server reads it)"),
    Column("t1h_ns", "ns", "request read and decoded by the server: the query enters the queue"),
    Column("t2_ns", "ns", "inference starts"),
    Column("t3_ns", "ns", "inference ends"),
    Column("t3h_ns", "ns", "answer encoded and handed to the network by the server"),
    Column("t4_ns", "ns", "response fully read at the source"),
    Column("e2e_ms", "ms", "t4 - t0 = dispatch + network + handling + queueing + inference"),
    Column("dispatch_ms", "ms", "td - t0: the dispatcher's decision (a policy or plug-in's own cost)"),
    Column("network_ms", "ms", "(t1 - td) + (t4 - t3h): transfer of request and answer only"),
    Column("handling_ms", "ms", "(t1h - t1) + (t3h - t3): the server reading the request and writing the answer, "
                                "on the cluster's CPU quota"),
    Column("queueing_ms", "ms", "t2 - t1h"),
    Column("inference_ms", "ms", "t3 - t2"),
    Column("batch", "inputs", "inputs in the model call that served the query"),
    Column("request_bytes", "bytes", "request body size"),
    Column("response_bytes", "bytes", "response body size"),
    Column("http_status", "-", "HTTP status; -1 connection refused/reset; 0 other client error; empty: no answer"),
    Column("queue_len_at_arrival", "queries", "queries waiting at the server when the request arrived"),
    Column("drop_reason", "-", "queue_full or admission, for HTTP 503"),
    Column("cold", "0/1", "1 when the query's request opened a new TCP connection to its cluster (none was idle)"),
    Column("label", "-", "true class / reference of the input sample"),
    Column("predicted", "-", "class predicted by the model (answered classification queries)"),
    Column("outcome", "-", "success or failure"),
    Column("failure_cause", "-", "one of CAUSES; empty on success"),
    Column("error", "-", "exception name on the client side, if any"),
)
#: Column names in order (the CSV header of every records file).
RECORD_FIELDS: list[str] = [c.name for c in COLUMNS]
#: Columns whose values are text (the rest are numbers; see :data:`INTEGER_FIELDS`).
TEXT_FIELDS: frozenset[str] = frozenset({"query_id", "source", "application", "cluster", "model", "policy",
                                         "drop_reason", "outcome", "failure_cause", "error"})
#: Numeric columns whose values are integers (counts, codes, ns, 0/1 flags, class indices).
INTEGER_FIELDS: frozenset[str] = frozenset({"fallback", "t0_ns", "td_ns", "t1_ns", "t1h_ns", "t2_ns", "t3_ns", "t3h_ns",
                                            "t4_ns", "batch",
                                            "request_bytes", "response_bytes", "http_status",
                                            "queue_len_at_arrival", "cold", "label", "predicted"})


def answered_in_time(status: int | None, e2e_ms: float | None, deadline_ms: float) -> int | None:
    """The status as the source sees it: an answer later than deadline + :data:`GRACE_MS` was
    given up on, so it counts as :data:`NO_ANSWER` (the emulation's client timeout does exactly
    that; the simulator applies it to its computed times)."""
    if status is not None and e2e_ms is not None and e2e_ms > deadline_ms + GRACE_MS:
        return NO_ANSWER
    return status


def classify(status: int | None, e2e_ms: float | None, deadline_ms: float, accuracy: float,
             min_accuracy: float, cut: bool = False) -> tuple[str, str]:
    """Outcome and failure cause of one query (the module table).

    Args:
        status: HTTP status, :data:`CONNECTION_REFUSED`, :data:`CLIENT_ERROR`, or
            :data:`NO_ANSWER` (None).
        e2e_ms: t4 - t0 in ms (None without an answer).
        deadline_ms, accuracy, min_accuracy: D_a, alpha_m, A_a.
        cut: the network had no route between the query's source and cluster at some instant of
            its life (:func:`testbed.model.network.path_cut`).

    Returns:
        ``("success", "")`` or ``("failure", cause)`` with cause in :data:`CAUSES`.
    """
    status = answered_in_time(status, e2e_ms, deadline_ms)
    if cut and (status in (NO_ANSWER, CLIENT_ERROR) or (status == 200 and (e2e_ms is None or e2e_ms > deadline_ms))):
        return FAILURE, "unreachable"
    if status is None or (status == 200 and e2e_ms is None):
        return FAILURE, "deadline_miss"
    if status == CONNECTION_REFUSED:
        return FAILURE, "server_down"
    if status == 503:
        return FAILURE, "dropped"
    if status != 200:
        return FAILURE, "error"
    if accuracy < min_accuracy:
        return FAILURE, "accuracy"
    if e2e_ms > deadline_ms:
        return FAILURE, "deadline_miss"
    return SUCCESS, ""


def _ms(a_ns: int | None, b_ns: int | None) -> float | None:
    return None if a_ns is None or b_ns is None else round((b_ns - a_ns) / 1e6, 3)


def make_record(*, query_id: str, source: str, application: str, cluster: str, model: str, policy: str,
                fallback: bool, deadline_ms: float, min_accuracy: float, model_accuracy: float,
                expected_rtt_ms: float | None, t0_ns: int, status: int | None, td_ns: int | None = None,
                t1_ns: int | None = None, t1h_ns: int | None = None, t2_ns: int | None = None,
                t3_ns: int | None = None, t3h_ns: int | None = None, t4_ns: int | None = None,
                batch: int | None = None, request_bytes: int | None = None, response_bytes: int | None = None,
                queue_len_at_arrival: int | None = None, drop_reason: str = "", cold: bool = False,
                label: object = "", predicted: object = "", error: str = "", cut: bool = False) -> dict[str, object]:
    """One record row (keys :data:`RECORD_FIELDS`), with the derived durations, outcome and cause
    (``cut``: as :func:`classify`).

    Durations are derived from the times given: ``e2e_ms`` from t0/t4, ``dispatch_ms`` from t0/td
    (whenever td is known), ``network_ms`` etc. only when t1..t3 are known (an answered query).
    An engine that does not give ``td_ns`` / ``t1h_ns`` / ``t3h_ns`` gets them equal to t0 / t1 /
    t3 (a zero dispatch or handling share), so the five shares always add up to e2e.
    ``expected_rtt_ms`` None or infinite (no route when the query was sent) is left empty.
    ``status`` as :func:`classify`; a late answer (after deadline + grace) is recorded without its
    times, as an unanswered query.
    """
    e2e = _ms(t0_ns, t4_ns)
    status = answered_in_time(status, e2e, deadline_ms)
    outcome, cause = classify(status, e2e, deadline_ms, model_accuracy, min_accuracy, cut)
    row: dict[str, object] = {
        "query_id": query_id, "source": source, "application": application, "cluster": cluster, "model": model,
        "policy": policy, "fallback": int(bool(fallback)), "deadline_ms": deadline_ms, "min_accuracy": min_accuracy,
        "model_accuracy": model_accuracy, "t0_ns": t0_ns,
        "expected_rtt_ms": None if expected_rtt_ms is None or not math.isfinite(expected_rtt_ms)
        else round(expected_rtt_ms, 3),
        "td_ns": t0_ns if td_ns is None else td_ns, "dispatch_ms": _ms(t0_ns, t0_ns if td_ns is None else td_ns),
        "request_bytes": request_bytes, "label": label, "outcome": outcome, "failure_cause": cause,
        "error": error, "cold": int(bool(cold)), "drop_reason": drop_reason if status == 503 else ""}
    if status is not None:
        row.update(http_status=status, t4_ns=t4_ns, e2e_ms=e2e, response_bytes=response_bytes)
        if status == 503:
            row["queue_len_at_arrival"] = queue_len_at_arrival
    if status == 200 and None not in (t1_ns, t2_ns, t3_ns, t4_ns):
        td = row["td_ns"]
        t1h = t1h_ns if t1h_ns is not None else t1_ns
        t3h = t3h_ns if t3h_ns is not None else t3_ns
        network = round(((t1_ns - td) + (t4_ns - t3h)) / 1e6, 3)
        handling = round(((t1h - t1_ns) + (t3h - t3_ns)) / 1e6, 3)
        row.update(t1_ns=t1_ns, t1h_ns=t1h, t2_ns=t2_ns, t3_ns=t3_ns, t3h_ns=t3h, network_ms=network,
                   handling_ms=handling, queueing_ms=_ms(t1h, t2_ns), inference_ms=_ms(t2_ns, t3_ns), batch=batch,
                   queue_len_at_arrival=queue_len_at_arrival, predicted=predicted)
    return row


__all__ = ["CAUSES", "CLIENT_ERROR", "COLUMNS", "CONNECTION_REFUSED", "FAILURE", "GRACE_MS", "NETWORK_CAUSES",
           "NO_ANSWER", "RECORD_FIELDS", "SHARES", "SUCCESS", "Column", "answered_in_time", "classify", "make_record"]
