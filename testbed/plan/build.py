"""The resolved plan of an experiment: switches, links, hosts and expected paths.

``build_plan`` applies every validation rule *before* anything is built (it needs no root and
touches no network state). The rules, each either an error naming the item or a note the plan
prints:

=====================  =============================================  ===============================
what                   our YAML topology                              topohub / GraphML (not editable)
=====================  =============================================  ===============================
duplicate node id      error                                          error
unknown link endpoint  error (with close matches)                     error
self-loop              error                                          dropped, noted
parallel links         error                                          merged (min delay, summed
                                                                      bandwidth), noted
node w/o coordinates   error naming every node a derived delay        same, with the GraphML advice;
                       needs (give lat/lon or the links' delay)       ``topology.coordinates`` fixes
                                                                      both
link capacity          ``bandwidth`` of the link, else the default    GraphML: LinkSpeedRaw, LinkSpeed,
                                                                      LinkLabel (testbed.spec.topology),
                                                                      noted
disconnected graph     error listing the components, unless           same
                       ``keep_largest_component: true`` (then the
                       smaller components are dropped, noted)
DPIDs                  explicit or 1..N; must be unique and in        generated 1..N
                       [1, 2^64-1]
names                  ``[a-z][a-z0-9]*``; interface names            generated s1..sN
                       (``NAME-ethN``) at most 15 bytes (IFNAMSIZ-1)
unknown site           error (with close matches); a site dropped     same
                       by ``keep_largest_component`` says so
model / family         error unless the catalog (the zoo) has it, and same
                       unless some cluster serves the family
min_accuracy           error unless a served model of the             same
                       application's family reaches it
load bounds            per source rate (after spatial weights) and    same
                       expected queries of the run within
                       testbed.spec.experiment's bounds; traces read here;
                       error when the workload creates no query
bandwidth              error when one request of an application       same
                       takes longer than its deadline to cross a
                       host link or a link of a path it may take
                       (request bytes, the model's transfer time)
run directory paths    every file of a run fits PATH_MAX              same
service-time profile   error unless the catalog has one for the       same
                       model at the cluster's runtime
policy names           error unless the experiment's and each         same
                       source's ``policy`` is a registered policy
                       or ``aset`` (testbed.plan.policy_resolution)
=====================  =============================================  ===============================

Link delay: the configured one if given, else great-circle km x ms_per_km x route_factor, never
below delay_floor_ms (``docs/system-model.md``, "The system"). RTT of a path = 2 x the sum of its one-way delays.

The plan also fixes, once, every model's accuracy and each cluster's service times
(:class:`testbed.model.service.ServiceFigures`, from one profiles folder): the emulation's servers
and dispatchers and the simulator all take them from here. A plan
(:class:`testbed.plan.resolved.Plan`) is a pydantic model; it is what ``plan.json`` holds
(``Plan.model_dump_json``) and what every process of a run reads back.

:func:`build_plan` is the list of steps; each lives with its concern: :mod:`testbed.plan.network_layout`
(switches, links, hosts, paths), :mod:`testbed.plan.event_resolution`, :mod:`testbed.plan.workload`
(weights, load bounds), :mod:`testbed.plan.cluster_figures` (models, service times, request bytes),
:mod:`testbed.plan.checks` (names, transfers, run directory, notes) and
:mod:`testbed.plan.capture_points`.
"""

from __future__ import annotations

from pathlib import Path

from testbed.core.errors import InputError, naming_file
from testbed.core.util import repo_path
from testbed.plan import network_layout
from testbed.plan.capture_points import validate_capture
from testbed.plan.catalog import Catalog, ZooCatalog
from testbed.plan.checks import (
    CPU_HEADROOM_CORES,
    check_names,
    check_transfers,
    cpu_note,
    feasibility_warnings,
    overload_note,
    run_dir_limit_problem,
    runs_dir_problem,
    senders_and_servers,
)
from testbed.plan.cluster_figures import request_sizes, resolve_models
from testbed.plan.event_resolution import events_after_end, resolve_events
from testbed.plan.policy_resolution import check_experiment_policies, decision_costs
from testbed.plan.resolved import Host, Link, PathInfo, Plan, PlanError, QueueSettings, Switch
from testbed.plan.workload import check_load_bounds, resolve_weights
from testbed.spec.experiment import Experiment, load_experiment
from testbed.spec.topology import RawTopology, TopologyError, load_topology


def build_plan(exp: Experiment, raw: RawTopology | None = None, base_dir: Path = Path("."),
               catalog: Catalog | None = None) -> Plan:
    """Resolve and validate an experiment into a :class:`Plan`. Builds nothing; needs no root.

    Args:
        exp: the validated experiment file.
        raw: the loaded topology; loaded from ``exp.topology.source`` when None.
        base_dir: the experiment file's folder: a relative topology, trace or demand-matrix path is
            resolved against it.
        catalog: where models come from; default the zoo and profiles folders of the experiment
            (``zoo_dir``, ``profiles_dir``, relative to the repository).

    Raises:
        PlanError: any rule of this module's table is violated; the message names the item.
        TopologyError: the topology cannot be loaded.
        testbed.plan.catalog.CatalogError: the model zoo cannot be read.
    """
    base_dir = Path(base_dir)
    check_experiment_policies(exp)
    raw = raw if raw is not None else load_topology(exp.topology.source, base_dir)
    zoo_dir, profiles_dir = repo_path(exp.zoo_dir), repo_path(exp.profiles_dir)
    net = network_layout.Network(exp, raw, notes=list(raw.notes))
    network_layout.add_nodes(net)
    network_layout.keep_connected(net, network_layout.read_links(net))
    network_layout.add_cloud(net)
    network_layout.add_hosts(net)
    check_names(net.switches, net.links, net.hosts)
    paths = network_layout.expected_paths(net)
    changes = resolve_events(net, base_dir)
    weights = resolve_weights(net, base_dir)
    check_load_bounds(exp, weights, exp.duration_s, base_dir)
    catalog = catalog if catalog is not None else ZooCatalog(zoo_dir, profiles_dir)
    models, services = resolve_models(exp, catalog, net.notes)
    request_bytes = request_sizes(exp, catalog)
    check_transfers(net, paths, models, request_bytes)
    plan = Plan(experiment=exp, topology_name=raw.name, switches=net.switches, links=net.links, hosts=net.hosts,
                paths=paths, notes=net.notes, models=models, services=services, changes=changes,
                weights=weights, request_bytes=request_bytes, base_dir=str(base_dir.resolve()),
                zoo_dir=str(zoo_dir), profiles_dir=str(profiles_dir), decision_ms=decision_costs(exp))
    problem = run_dir_limit_problem(repo_path(exp.runs_dir), plan)
    if problem:
        raise PlanError(f"runs_dir: {problem}")
    validate_capture(plan)  # a capture point that is not in the network: refused before anything is built
    plan.notes += [n for n in (cpu_note(exp), overload_note(plan), events_after_end(changes, exp.duration_s)) if n]
    plan.notes += feasibility_warnings(plan)
    return plan


def plan_experiment(path: str | Path, catalog: Catalog | None = None) -> Plan:
    """Load an experiment file and plan it (see :func:`build_plan`).

    Raises:
        ConfigError, PlanError, TopologyError, CatalogError: with a message naming the file and the
            offending item.
    """
    path = Path(path)
    exp = load_experiment(path)
    try:
        return build_plan(exp, base_dir=path.parent, catalog=catalog)
    except InputError as exc:
        raise naming_file(exc, path) from None


__all__ = ["CPU_HEADROOM_CORES", "Host", "Link", "PathInfo", "Plan", "PlanError", "QueueSettings", "Switch",
           "TopologyError", "build_plan", "check_load_bounds", "events_after_end", "feasibility_warnings",
           "plan_experiment", "run_dir_limit_problem", "runs_dir_problem", "senders_and_servers"]
