"""Run results: merge the per-source records, summarise them, print and save the summary.

The steps live in three modules: :mod:`testbed.results.record_files` (reading, merging, checking the
records), :mod:`testbed.results.figures` (what the summary computes) and
:mod:`testbed.results.render` (``summary.md``, the console's tables, the headline); this module
is :func:`summarize` and :func:`print_summary`, and keeps the names other code imports.

Files in a run directory (written by :mod:`testbed.emu.lifecycle` and :mod:`testbed.results.runs`):
``records.csv`` / ``records.parquet`` (one row per query, columns of
:data:`testbed.model.records.RECORD_FIELDS`), ``link_stats.csv`` (controller port stats per poll),
``rtt_check.csv``, ``clusters/<name>.stats.json`` (server counters; ``<name>.stats.<n>.json``
for the earlier lives of a restarted server), ``linkemu/<node>.json`` (each user-space link
emulator's counters), ``run.json`` (what happened: ``health``), ``summary.json``, ``summary.md``;
with packet capture also ``capture/queries.csv`` (``pkt_*`` columns, :mod:`testbed.results.pcap_analysis`),
joined into the records here. Every column is documented in docs/records-schema.md.

Every count of queries in the summary (totals, per cause, per cluster, per application) comes
from the records, so the tables agree with ``records.csv`` exactly. The servers' own counters
are shown apart and labelled as such: they count what each server saw in its life, including
answers that came after the source had given up, and none of the queries of a life whose last
stats file a kill cut short.

Latency figures (:func:`latency_figures`, the one rule of the summary and of ``testbed report``,
stated by :data:`LATENCY_RULE`): the e2e percentiles and the mean breakdown are taken over every
answered query (:func:`answered`), nothing left out.

New connections (:data:`COLD_RULE`): before the load, every source's path to every (cluster,
model) is warmed (:meth:`testbed.emu.servers.ClusterServers.warm_paths`; those requests
are not records) and each source opens one keep-alive connection to every cluster
(:mod:`testbed.emu.source`). ``cold = 1`` is set by the source on a query whose request opened a
new TCP connection (aiohttp's connection tracing): no open connection to its cluster was idle,
because its other queries to that cluster (or its stats poll) held each one, as in a burst, or
the idle one had been closed. Such a query paid one more round trip for the handshake; it is
the system's behaviour under bursts, counted in every figure, and the summary says how many
there were (``cold_queries``; measured: docs/trustworthy-runs.md, "New connections").
"""

from __future__ import annotations

import json
from pathlib import Path

from testbed.core.util import replace_atomic
from testbed.results.figures import (
    COLD_RULE,
    LATENCY_RULE,
    _link_emulators,
    _links,
    _plan_doc,
    _service_check,
    answered,
    aset_sources,
    capture_figures,
    cluster_figures,
    cold_calls,
    cold_queries,
    latency_figures,
    load_duration_s,
    node_names,
    plan_dilation,
    query_figures,
    run_facts,
    switch_of,
)
from testbed.results.record_files import (
    NUMERIC_RECORD_FIELDS,
    RecordsError,
    check_records,
    merge_records,
    read_csv_exact,
    read_records,
    records_arrow_schema,
    records_check,
    whole_source_rows,
)
from testbed.results.render import _headline, _tables, capture_warnings, print_summary

__all__ = ["COLD_RULE", "LATENCY_RULE", "NUMERIC_RECORD_FIELDS", "RecordsError", "_headline", "_links", "_plan_doc",
           "_tables", "answered", "aset_sources", "capture_warnings", "check_records", "cold_calls", "cold_queries",
           "latency_figures", "load_duration_s", "merge_records", "node_names", "print_summary", "read_csv_exact",
           "read_records", "records_arrow_schema", "summarize", "switch_of", "whole_source_rows"]


def summarize(run_dir: Path, duration_s: float) -> dict:
    """Compute the run summary and write ``summary.json``.

    ``duration_s``: the configured load duration (s). Returns a dict with: ``queries``,
    ``duration_s`` (configured), ``load_s`` (measured, :func:`load_duration_s`), ``success_ratio``,
    ``throughput_qps`` (answered queries per s of measured load), ``failures`` (count per cause,
    causes with none left out), ``drop_reasons`` (of ``dropped``), ``e2e_ms`` p50/p95/p99 and
    ``breakdown_ms`` (mean network / queueing / inference, ms) of every answered query
    (:func:`latency_figures`, ``latency_rule``), ``cold_queries`` (queries that opened a new
    connection) and ``cold_rule`` (what that means), ``per_application`` and ``per_cluster`` (queries, success,
    answered, every cause: from the records; ``utilization`` and ``server``: the servers' own
    counters, apart), ``link_emulators`` (lateness and drops), ``links`` (mean and max utilization
    per direction, drops, from the controller's port stats), ``records_check`` (rows per source
    file, merged, gaps), ``health`` (from ``run.json``), ``host_speed`` (``host_speed.json``: a
    bare model call now against its profile; ``{}`` if not measured). ``capture`` (with packet
    capture: queries matched, retransmissions, per-hop one-way delay). ``time_dilation``: the run's
    k (plan.json; 1 when undilated): the records and every figure from them are in emulated time,
    the link emulators' lateness and the links' rates on the wall clock.

    Raises:
        RecordsError: a source's records are not whole (names the file and the problem).
        testbed.core.errors.RunFailure: the merged records cannot be written.
        OSError: ``summary.json`` cannot be written.
    """
    df = merge_records(run_dir)
    plan = _plan_doc(run_dir)
    s = query_figures(df, duration_s)
    s["per_cluster"] = cluster_figures(run_dir, df)
    s["service_check"] = _service_check(df, s["per_cluster"], plan)
    s["link_emulators"] = _link_emulators(run_dir)
    s["links"] = _links(run_dir, plan)
    s["records_check"] = records_check(run_dir, df)
    s.update(run_facts(run_dir, df, plan))
    # k: the records are in emulated time; the link emulators' lateness and the links' rates are on the wall clock
    s["time_dilation"] = plan_dilation(plan)
    cap = capture_figures(run_dir)
    if cap is not None:
        s["capture"] = cap
    replace_atomic(run_dir / "summary.json", lambda p: p.write_text(json.dumps(s, indent=2)))
    return s
