"""``testbed new-experiment --topology SOURCE [--clusters SPEC] [--sources SPEC] [--out FILE]``:
write a commented experiment file for a topology of one's own, planned before it is written.

``--topology``: ``topohub:GROUP/NAME`` (e.g. ``topohub:sndlib/polska``), a ``.graphml`` file or a
``.yaml`` topology file (``topologies/triangle.yaml`` shows the format).

``--clusters``: ``auto:N`` (default ``auto:3``), or comma-separated ``NODE[:TIER][:CORES]``
items: ``Chicago:near_edge:1,Denver:0.25``. TIER is ``far_edge`` (default) or ``near_edge``;
CORES the CPU share in cores (default 0.25 far edge, 0.5 near edge, as ``experiments/default.yaml``).
``auto:N`` takes the N most central nodes (networkx closeness centrality by hops; ties: the
higher degree, then the label): the most central one is near edge, the others far edge.
``--cloud NODE|auto`` adds a cloud cluster (0.5 core) behind a 20 ms link at that node (``auto``:
the most central one); none by default.

``--sources``: ``auto:N`` (default ``auto:4``): the N least central nodes (where users attach, at
the edge of the network), nodes without a cluster first; or comma-separated ``NODE`` items.

Deadlines at zero load: the file must let every application's queries succeed. Where the placement
above leaves a source without a (cluster, model) that answers within the deadline at zero load
(the plan's own check, :func:`testbed.plan.checks.zero_load_feasibility`: the path's RTT, the
messages' transfer on every link, the model's expected time at the cluster's share), ``auto:N``
clusters are placed again, greedily, to bring every source within reach and then further within
it, and ``auto:N`` sources out of every cluster's reach move to the least central nodes within one
(:func:`reach_deadlines`; the file's header says so). When no query of an application could meet
its deadline even so, nothing is written and the error names, per application, the fastest pair
and the nearest deadline that would work. Sources left out of reach (named nodes, too few
clusters) are a note, and the file is written.

A NODE is a node's id or its label, as in an experiment file. A name the topology does not have
is refused with the nearest names (``difflib``) and the topology's node names.

The applications are zoo families (``--family digits,imagenet``), each served by every variant
of the family at every cluster; ``min_accuracy`` is the lowest accuracy of those variants, so
every served model qualifies (``--min-accuracy`` sets it). The file is checked as ``testbed
plan`` checks it before it is written; a file that exists is never replaced without ``--force``.
Without ``--out`` the file is printed.

Node ids and labels come from the topology's data: they are written only as quoted YAML strings
(a label that is not printable, or names two nodes, is replaced by the node's id), and the host
names made from them are checked against the experiment's name rule.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

import networkx as nx
from pydantic import ValidationError

from testbed.cli.common import console
from testbed.core.errors import InputError
from testbed.core.util import did_you_mean, replace_atomic, repo_path
from testbed.plan import zoo
from testbed.plan.build import build_plan
from testbed.plan.checks import AppFeasibility, feasibility_warnings, zero_load_feasibility
from testbed.plan.placement import Demand, cover_sources, covers, zero_load_from
from testbed.plan.resolved import Plan
from testbed.spec.experiment import (
    MAX_CPU_CORES,
    MAX_DEADLINE_S,
    MAX_NAME_BYTES,
    MIN_DEADLINE_MS,
    ConfigError,
    Experiment,
    format_validation_error,
)
from testbed.spec.schema import NAME_RE, load_yaml
from testbed.spec.topology import RawTopology, load_topology, resolve_topology_path
from testbed.spec.units import UnitError, parse_delay_ms, parse_duration_s, parse_rate_mbps

#: CPU share (cores) per tier when the command line gives none (experiments/default.yaml's).
TIER_CORES = {"far_edge": 0.25, "near_edge": 0.5, "cloud": 0.5}
#: Waiting queries per cluster before its server answers 503 (experiments/default.yaml's).
TIER_QUEUE = {"far_edge": 16, "near_edge": 32, "cloud": 64}
#: Longest host name: its interfaces are NAME-ethN, at most 15 bytes (Linux IFNAMSIZ - 1).
MAX_HOST_NAME = 10
#: The most node names an error lists.
MAX_LISTED = 60


class NewExperimentError(InputError):
    """A command-line value of ``new-experiment`` is invalid (names it), or the file would not plan."""


@dataclass(frozen=True)
class Node:
    """A topology node: its id, its label, and the reference the file writes (the label when it
    is printable and names this node only, else the id)."""

    id: str
    label: str
    ref: str


@dataclass(frozen=True)
class Placement:
    """A cluster or source at a node: the host name, the node, and for a cluster its tier and cores."""

    name: str
    node: Node
    tier: str = ""
    cores: float = 0.0


# --------------------------------------------------------------------------- the topology

def _nodes(raw: RawTopology) -> list[Node]:
    labels = [n.label for n in raw.nodes]
    out = []
    for n in raw.nodes:
        unique = labels.count(n.label) == 1 and n.label.isprintable() and n.label.strip() == n.label and n.label
        if not (unique or n.id.isprintable()):
            raise NewExperimentError(f"topology {raw.name!r}: node id {n.id!r} is not printable text; it cannot "
                                     f"name a site")
        out.append(Node(n.id, n.label, n.label if unique else n.id))
    return out


def _graph(raw: RawTopology, nodes: list[Node]) -> tuple[nx.Graph, bool]:
    """The topology's graph over node ids, reduced to its largest connected component, and
    whether it had to be (the file then sets ``keep_largest_component``)."""
    g = nx.Graph()
    g.add_nodes_from(n.id for n in nodes)
    g.add_edges_from((lk.a, lk.b) for lk in raw.links if lk.a != lk.b and lk.a in g and lk.b in g)
    if g.number_of_nodes() == 0:
        raise NewExperimentError(f"topology {raw.name!r} has no nodes")
    comps = sorted(nx.connected_components(g), key=lambda c: (-len(c), min(c)))
    return g.subgraph(comps[0]).copy(), len(comps) > 1


def _by_centrality(g: nx.Graph, nodes: dict[str, Node]) -> list[Node]:
    """Nodes, most central first: closeness centrality by hops, then degree, then label."""
    closeness = nx.closeness_centrality(g)
    return sorted((nodes[i] for i in g), key=lambda n: (-closeness[n.id], -g.degree[n.id], n.label, n.id))


def _find(ref: str, nodes: list[Node], in_graph: set[str], option: str) -> Node:
    """The node ``ref`` names (id, else label), or an error with the nearest names and the list."""
    found = [n for n in nodes if n.id == ref] or [n for n in nodes if n.label == ref]
    if len(found) > 1:
        ids = ", ".join(n.id for n in found)
        raise NewExperimentError(f"{option}: {ref!r} is the label of {len(found)} nodes ({ids}); name one by its id")
    if not found:
        names = [n.label for n in nodes]
        listed = ", ".join(map(repr, names[:MAX_LISTED])) + (f" ... and {len(names) - MAX_LISTED} more"
                                                             if len(names) > MAX_LISTED else "")
        raise NewExperimentError(f"{option}: the topology has no node {ref!r}"
                                 f"{did_you_mean(ref, names + [n.id for n in nodes])}; its nodes: {listed}")
    if found[0].id not in in_graph:
        raise NewExperimentError(f"{option}: node {ref!r} is not in the topology's largest connected component, "
                                 f"which the experiment keeps; pick a node in it")
    return found[0]


# --------------------------------------------------------------------------- names and placements

def host_name(text: str, used: set[str], prefix: str = "", fallback: str = "h") -> str:
    """A host name made from ``prefix`` + ``text`` (``fallback`` when that keeps no letter):
    lower-case letters and digits, at most :data:`MAX_HOST_NAME` characters, starting with a letter,
    not a switch or link emulator name (``s<digits>``, ``l<digits>``), not in ``used`` (a digit is
    appended); added to ``used``."""
    def clean(t: str) -> str:
        return re.sub(r"[^a-z0-9]", "", t.lower()).lstrip("0123456789")

    base = clean(prefix + text) or clean(fallback) or "h"
    if re.fullmatch(r"[sl]\d+", base):
        base = "h" + base
    base = base[:MAX_HOST_NAME]
    name, k = base, 1
    while name in used or re.fullmatch(r"[sl]\d+", name):
        k += 1
        name = f"{base[:MAX_HOST_NAME - len(str(k))]}{k}"
    if not re.fullmatch(NAME_RE, name):  # by construction; a broken rule must not write a file
        raise NewExperimentError(f"host name {name!r} made from {text!r} breaks the name rule {NAME_RE}")
    used.add(name)
    return name


def _items(spec: str, option: str) -> tuple[int | None, list[str]]:
    """``auto:N`` -> (N, []); ``a,b:c`` -> (None, ["a", "b:c"])."""
    m = re.fullmatch(r"\s*auto\s*:\s*(.*?)\s*", spec)
    if m:
        if not re.fullmatch(r"[+-]?\d+", m[1]) or int(m[1]) < 1:
            raise NewExperimentError(f"{option} {spec!r}: auto:N needs a whole number N >= 1")
        return int(m[1]), []
    items = [s.strip() for s in spec.split(",")]
    if not all(items):
        raise NewExperimentError(f"{option} {spec!r}: an empty item; write e.g. auto:3 or NODE,NODE")
    return None, items


def _cluster_item(item: str) -> tuple[str, str, float | None]:
    """``NODE[:TIER][:CORES]`` -> (NODE, TIER, CORES or None), read from the right (a label may hold ':')."""
    ref, tier, cores = item, "far_edge", None
    for _ in range(2):
        head, sep, last = ref.rpartition(":")
        if not sep:
            break
        if last in ("far_edge", "near_edge"):
            tier, ref = last, head
        elif re.fullmatch(r"\d+(?:\.\d+)?", last) and cores is None:
            cores, ref = float(last), head
        elif last in ("cloud", "faredge", "nearedge", "fe", "ne"):
            raise NewExperimentError(f"--clusters {item!r}: tier {last!r}: write far_edge or near_edge (the cloud is "
                                     f"--cloud NODE)")
        else:
            break
    if cores is not None and cores < 0.01:
        raise NewExperimentError(f"--clusters {item!r}: {cores:g} cores is under 0.01 (the smallest CPU share)")
    if cores is not None and cores > MAX_CPU_CORES:
        raise NewExperimentError(f"--clusters {item!r}: {cores:g} cores is over {MAX_CPU_CORES:g}, the most a cluster "
                                 f"(one host) has (testbed.spec.experiment.MAX_CPU_CORES)")
    return ref, tier, cores


def _refuse_unread_part(item: str, ref: str, nodes: list[Node]) -> None:
    """When ``ref`` (what :func:`_cluster_item` left of ``item`` as the node) is not a node but a
    node followed by ``:`` parts that are neither a tier nor a CPU share (``B:far_edge:-1``), the
    error names the part that is wrong, not the whole as a node.

    Raises:
        NewExperimentError: naming the node and the part after it.
    """
    names = {n.id for n in nodes} | {n.label for n in nodes}
    head, rest = ref, []
    while ":" in head:
        head, _, last = head.rpartition(":")
        rest.insert(0, last)
        if head in names:
            bad = next((x for x in rest if x not in ("far_edge", "near_edge")), rest[-1])
            try:
                number = float(bad)
            except ValueError:
                number = None
            what = (f"{bad!r} is not a CPU share: cores are a number from 0.01 to {MAX_CPU_CORES:g}"
                    if number is not None else
                    f"{bad!r} is neither a tier (far_edge or near_edge) nor a CPU share in cores (a number from "
                    f"0.01 to {MAX_CPU_CORES:g})")
            raise NewExperimentError(f"--clusters {item!r}: node {head!r} is in the topology; {what}; write "
                                     f"NODE[:TIER][:CORES], e.g. {head}:far_edge:2")


def place_clusters(spec: str, nodes: list[Node], g: nx.Graph, used: set[str]) -> list[Placement]:
    """The clusters ``--clusters`` asks for (module docstring)."""
    n, items = _items(spec, "--clusters")
    central = _by_centrality(g, {x.id: x for x in nodes})
    if n is not None:
        if n > len(central):
            raise NewExperimentError(f"--clusters auto:{n}: the topology has {len(central)} nodes (in its largest "
                                     f"connected component)")
        picked = [(x, "near_edge" if i == 0 else "far_edge", None) for i, x in enumerate(central[:n])]
    else:
        picked = []
        for item in items:
            ref, tier, cores = _cluster_item(item)
            try:
                node = _find(ref, nodes, set(g), f"--clusters {item!r}")
            except NewExperimentError:
                _refuse_unread_part(item, ref, nodes)
                raise
            picked.append((node, tier, cores))
        twice = sorted({x.label for x, t, _ in picked if sum(y == x and u == t for y, u, _ in picked) > 1})
        if twice:
            raise NewExperimentError(f"--clusters: node(s) {', '.join(map(repr, twice))} named twice with one tier; "
                                     f"give a cluster more cores instead (NODE:TIER:CORES), or another tier")
    prefix = {"far_edge": "fe", "near_edge": "ne"}
    return [Placement(host_name(x.label, used, prefix[tier]), x, tier, cores or TIER_CORES[tier])
            for x, tier, cores in picked]


def place_sources(spec: str, nodes: list[Node], g: nx.Graph, clusters: list[Placement],
                  used: set[str]) -> list[Placement]:
    """The sources ``--sources`` asks for (module docstring)."""
    n, items = _items(spec, "--sources")
    if n is not None:
        taken = {c.node.id for c in clusters}
        periphery = _by_centrality(g, {x.id: x for x in nodes})[::-1]
        order = [x for x in periphery if x.id not in taken] + [x for x in periphery if x.id in taken]
        if n > len(order):
            raise NewExperimentError(f"--sources auto:{n}: the topology has {len(order)} nodes (in its largest "
                                     f"connected component); sources sit at distinct nodes")
        chosen = order[:n]
    else:
        chosen = [_find(item, nodes, set(g), f"--sources {item!r}") for item in items]
        twice = sorted({x.label for x in chosen if chosen.count(x) > 1})
        if twice:
            raise NewExperimentError(f"--sources: node(s) {', '.join(map(repr, twice))} named twice; one source per "
                                     f"node (a source sends for every application)")
    return [Placement(host_name(x.label, used, fallback=f"src{x.id}"), x) for x in chosen]


# --------------------------------------------------------------------------- applications

@dataclass(frozen=True)
class App:
    """An application of a zoo family: its name, the family, the variants that serve it and the
    runtime of each, and its minimum accuracy."""

    name: str
    family: str
    models: dict[str, str]
    min_accuracy: float


def applications(families: list[str], min_accuracy: float | None, zoo_dir: Path, used: set[str]) -> list[App]:
    """One application per family, served by every variant of the family (LiteRT where the
    variant has a ``.tflite``, else TensorFlow).

    Raises:
        NewExperimentError: a family not in the zoo (the nearest names and the zoo's families).
    """
    try:
        manifest = zoo.load_manifest(zoo_dir)
    except zoo.ZooError as exc:
        raise NewExperimentError(f"model zoo: {exc}") from None
    by_family = zoo.families(manifest)
    out = []
    for fam in families:
        if fam not in by_family:
            raise NewExperimentError(f"--family {fam!r} is not a family of the model zoo {zoo_dir}"
                                     f"{did_you_mean(fam, by_family)} (has: {', '.join(sorted(by_family))})")
        models = {m: "litert" if "litert" in zoo.runtimes_of(manifest, m) else "tensorflow" for m in by_family[fam]}
        lowest = min(float(manifest["variants"][m]["accuracy"]) for m in models)
        floor = min_accuracy if min_accuracy is not None else int(lowest * 100) / 100
        out.append(App(host_name(fam, used), fam, models, floor))
    return out


# --------------------------------------------------------------------------- the file

def q(text: str) -> str:
    """``text`` as a YAML double-quoted scalar (JSON's escapes are YAML's): safe whatever it holds."""
    return json.dumps(text, ensure_ascii=False)


#: The column the comments of the header's lines start at.
_COMMENT_COLUMN = 32


def _commented(lines: list[tuple[str, str]]) -> str:
    """``key: value   # comment`` lines, the comments aligned."""
    out = []
    for text, comment in lines:
        out.append(f"{text.ljust(_COMMENT_COLUMN - 2)}  # {comment}" if comment else text)
    return "\n".join(out) + "\n"


def _header(opts: Options, raw: RawTopology, source: str, dropped: bool, out_label: str) -> str:
    out = shlex.quote(out_label)
    intro = (f"# Written by: {opts.command}\n"
             f"# Topology {q(raw.name)}: {len(raw.nodes)} nodes, {len(raw.links)} links"
             f"{'; nodes outside its largest connected part are dropped' if dropped else ''}.\n"
             f"# Check it: testbed plan {out}; simulate it: testbed simulate {out};\n"
             f"# emulate it: sudo .venv/bin/testbed run {out}\n"
             f"# Every quantity carries its unit, in the value (deadline: 100ms) or in the key (deadline_ms: 100):\n"
             f"# times in us, ms or s; rates in bit/s, kbit/s, Mbit/s or Gbit/s (no space before the unit).\n")
    return intro + _commented([
        (f"name: {scalar(opts.name)}", "names the run directory (letters, digits, _ . -)"),
        (f"seed: {opts.seed}", "seeds every random draw: the same seed, the same run"),
        (f"duration: {opts.duration}", "load duration; the run then drains for the longest deadline + 2s"),
        (f"policy: {scalar(opts.policy)}", "how a source picks a cluster per query (testbed plan names the known)"),
        ("report_interval: 500ms", "each cluster reports its queue to the sources this often (>= 10ms)"),
        ("", ""),
        ("topology:", ""),
        (f"  source: {q(source)}", "topohub:GROUP/NAME, a .graphml or a .yaml (relative to this file)"),
        (f"  bandwidth: {opts.bandwidth}", "capacity of each link whose source states none"),
        ("  host_bandwidth: 1Gbit/s", "capacity of each host's link to its switch (0 ms)"),
        ("  # A link's one-way delay, when its source states none: great-circle km x ms_per_km x route_factor,", ""),
        ("  # at least delay_floor (docs/system-model.md).", ""),
        ("  ms_per_km: 0.005", "ms per km: light in fibre, ~200,000 km/s"),
        ("  route_factor: 1.0", "fibre path over great-circle distance (>= 1)"),
        ("  delay_floor: 0.1ms", "the shortest one-way link delay"),
        (f"  keep_largest_component: {str(dropped).lower()}", "true: nodes outside the largest connected part dropped"),
    ])


def scalar(text: str) -> str:
    """``text`` plain when it is a simple word YAML reads as that string, else double-quoted."""
    plain = re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.:-]*", text) and text.lower() not in (
        "true", "false", "null", "yes", "no", "on", "off", "y", "n")
    return text if plain else q(text)


_CLUSTERS = """
# Clusters: one host each, running one inference server. site: a node of the topology (its label
# or id). tier: far_edge, near_edge or cloud. cpu_cores: the host's CPU share in cores (a cgroup
# quota; >= 0.01). memory_mib: its memory limit (MiB). workers: server processes (each holds every
# model). queue_limit: waiting queries before the server answers 503. server.runtime: litert
# (.tflite) or tensorflow (SavedModel). models: zoo variants it serves (models/zoo/manifest.json).
# Host names: lower-case letters and digits, at most 10 characters (interfaces are NAME-ethN).
clusters:
"""

_APPS = """
# Applications: deadline (end to end, per query; >= 1ms) and min_accuracy (0..1: a model below it
# fails the query) of each family of the zoo. The accuracy of each variant: models/zoo/manifest.json.
applications:
"""

_WORKLOAD = """
# Load: rate_qps queries per second at each source, per application (process: poisson; also mmpp,
# diurnal, step, trace: see testbed/spec/experiment.py WorkloadSpec).
workload:
"""


def _cluster_lines(clusters: list[Placement], apps: list[App]) -> list[str]:
    models = {m: rt for a in apps for m, rt in a.models.items()}
    other = {m: rt for m, rt in models.items() if rt != "litert"}
    server = "{runtime: litert" + (f", model_runtimes: {{{', '.join(f'{m}: {rt}' for m, rt in other.items())}}}"
                                  if other else "") + "}"
    return [f"  - {{name: {c.name}, site: {q(c.node.ref if c.tier != 'cloud' else 'cloud')}, tier: {c.tier},\n"
            f"     cpu_cores: {c.cores:g}, memory_mib: 1024, workers: 1, queue_limit: {TIER_QUEUE[c.tier]},\n"
            f"     server: {server},\n     models: [{', '.join(models)}]}}" for c in clusters]


def render(opts: Options, raw: RawTopology, source: str, clusters: list[Placement], cloud: Node | None,
           sources: list[Placement], apps: list[App], dropped: bool, out_label: str, placement: str = "") -> str:
    """The experiment file's text (comments included); ``placement``: a line on how the clusters
    and sources were placed, when not by centrality alone."""
    text = _header(opts, raw, source, dropped, out_label)
    if placement:
        text = text.replace("\n# Check it:", f"\n# Placement: {placement}.\n# Check it:", 1)
    if cloud is not None:
        text += (f"\ncloud:                         # a site behind one long link, for the tier cloud\n"
                 f"  attach_to: {q(cloud.ref)}\n  delay: 20ms                  # one way\n"
                 f"  bandwidth: 1Gbit/s\n")
    text += _CLUSTERS + "\n".join(_cluster_lines(clusters, apps)) + "\n"
    text += "\n# Sources: where queries start (a workload generator and a dispatcher), at a node of the topology.\n"
    text += "sources:\n" + "".join(f"  - {{name: {s.name}, site: {q(s.node.ref)}}}\n" for s in sources)
    text += _APPS + "".join(f"  - {{name: {a.name}, family: {a.family}, deadline: {opts.deadline}, "
                            f"min_accuracy: {a.min_accuracy:g}}}\n" for a in apps)
    text += _WORKLOAD + "".join(f"  - {{application: {a.name}, sources: all, rate_qps: {opts.rate:g}}}\n"
                                for a in apps)
    return text


# --------------------------------------------------------------------------- the command

@dataclass(frozen=True)
class Options:
    """What the command line asks for, checked."""

    command: str
    name: str
    seed: int
    duration: str
    policy: str
    bandwidth: str
    deadline: str
    rate: float


def _check_value(parse, text: str, option: str) -> str:
    try:
        parse(text, option)
    except UnitError as exc:
        raise NewExperimentError(str(exc)) from None
    return text


def _command_line(args: argparse.Namespace) -> str:
    """The command that writes this file again (every option spelled out; one line)."""
    words = ["testbed", "new-experiment", "--topology", args.topology, "--clusters", args.clusters,
             "--sources", args.sources, "--family", ",".join(args.family), "--deadline", args.deadline,
             "--rate", f"{args.rate:g}", "--duration", args.duration, "--policy", args.policy,
             "--bandwidth", args.bandwidth, "--seed", str(args.seed)]
    for flag, value in (("--cloud", args.cloud), ("--name", args.name), ("--min-accuracy", args.min_accuracy)):
        if value is not None:
            words += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
    if args.out is not None:
        words += ["--out", str(args.out)]
    return " ".join(shlex.quote(w) for w in words).replace("\n", " ").replace("\r", " ")


def _options(args: argparse.Namespace, raw: RawTopology) -> Options:
    stem = args.topology.removeprefix("topohub:") if args.topology.startswith("topohub:") else Path(args.topology).stem
    name = args.name or re.sub(r"[^A-Za-z0-9_.-]", "", stem.replace("/", "-")).lstrip("_.-")[:60] or "scenario"
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name) or len(name.encode()) > MAX_NAME_BYTES:
        raise NewExperimentError(f"--name {name!r}: letters, digits, '_', '.', '-' (starting with a letter or "
                                 f"digit), at most {MAX_NAME_BYTES} bytes")
    if not args.family:
        raise NewExperimentError("--family: name at least one family of the model zoo, e.g. digits")
    if not (0 < args.rate <= 10_000):
        raise NewExperimentError(f"--rate {args.rate:g}: queries per second per source, in (0, 10000]")
    return Options(_command_line(args), name, args.seed,
                   _check_value(parse_duration_s, args.duration, "--duration"), args.policy,
                   _check_value(parse_rate_mbps, args.bandwidth, "--bandwidth"),
                   _check_deadline(args.deadline), args.rate)


def _check_deadline(text: str) -> str:
    """``--deadline`` read and held to the experiment's bounds (:class:`testbed.spec.experiment.ApplicationSpec`).

    Raises:
        NewExperimentError: not a time, or out of bounds (names ``--deadline`` and the bound).
    """
    try:
        ms = parse_delay_ms(text, "--deadline")
    except UnitError as exc:
        raise NewExperimentError(str(exc)) from None
    if not MIN_DEADLINE_MS <= ms <= MAX_DEADLINE_S * 1e3:
        raise NewExperimentError(f"--deadline {text}: a deadline is from {MIN_DEADLINE_MS:g} ms to "
                                 f"{MAX_DEADLINE_S:g} s (testbed.spec.experiment.MIN_DEADLINE_MS, MAX_DEADLINE_S)")
    return text


def _topology_source(text: str, out: Path | None) -> tuple[str, RawTopology, Path]:
    """(what the file writes as topology.source, the loaded topology, the folder the file plans from)."""
    base = (out.parent if out else Path.cwd()).resolve()
    if text.startswith("topohub:"):
        return text, load_topology(text, base), base
    path = resolve_topology_path(text, Path.cwd()).resolve()
    return os.path.relpath(path, base), load_topology(str(path), base), base


def write_experiment(args: argparse.Namespace) -> tuple[str, Path | None]:
    """Compose, check (as ``testbed plan``) and write the experiment; returns (its text, where written).

    Placement: where a placement of ``auto:N`` leaves a source without a (cluster, model) that
    answers within the deadline at zero load (:func:`testbed.plan.checks.zero_load_feasibility`),
    the clusters (``--clusters auto:N``) are placed again to bring every source within reach, and
    sources (``--sources auto:N``) out of every cluster's reach are replaced by the next least
    central nodes within it (:func:`reach_deadlines`).

    Raises:
        NewExperimentError: a bad option, an unknown node or family, an existing ``--out`` without
            ``--force``, a file that would not plan, or an application none of whose queries could
            meet its deadline even at zero load (names the nearest deadline that would work; nothing
            is written).
        TopologyError: the topology cannot be loaded.
    """
    out: Path | None = args.out
    if out is not None and (out.is_dir() or not out.parent.is_dir()):
        raise NewExperimentError(f"--out {out}: {'a folder' if out.is_dir() else f'no folder {out.parent}'}; "
                                 f"name a file in an existing folder")
    if out is not None and out.exists() and not args.force:
        raise NewExperimentError(f"--out {out}: the file exists; pass --force to replace it, or choose another name")
    source, raw, base = _topology_source(args.topology, out)
    opts = _options(args, raw)
    nodes = _nodes(raw)
    g, dropped = _graph(raw, nodes)
    used: set[str] = set()
    clusters = place_clusters(args.clusters, nodes, g, used)
    cloud = None
    if args.cloud:
        cloud = (_by_centrality(g, {x.id: x for x in nodes})[0] if args.cloud == "auto"
                 else _find(args.cloud, nodes, set(g), "--cloud"))
        clusters.append(Placement(host_name("cloud", used), cloud, "cloud", TIER_CORES["cloud"]))
    sources = place_sources(args.sources, nodes, g, clusters, used)
    apps = applications(args.family, args.min_accuracy, repo_path("models/zoo"), used)
    label = str(out) if out else "FILE.yaml"
    text = render(opts, raw, source, clusters, cloud, sources, apps, dropped, label)
    plan = _check_plans(text, raw, base)
    verdicts = zero_load_feasibility(plan)
    auto_clusters, auto_sources = _items(args.clusters, "--clusters")[0], _items(args.sources, "--sources")[0]
    if any(not f.ok or f.late_sources for f in verdicts) and (auto_clusters or auto_sources):
        picked, chosen, why = reach_deadlines(plan, g, nodes, clusters, sources, auto_clusters, auto_sources)
        clusters, sources, apps = _named(picked, cloud, chosen, args)
        text = render(opts, raw, source, clusters, cloud, sources, apps, dropped, label, placement=why)
        plan = _check_plans(text, raw, base)
        verdicts = zero_load_feasibility(plan)
    _refuse_infeasible(verdicts)
    for line in feasibility_warnings(plan, verdicts):  # sources left out of reach (named nodes, too few clusters)
        console.print(f"note: {line}", markup=False, highlight=False)
    if out is not None:
        if out.exists() and not args.force:
            raise NewExperimentError(f"--out {out}: the file exists; pass --force to replace it")
        try:
            replace_atomic(out, lambda tmp: tmp.write_text(text, encoding="utf-8"))
        except OSError as exc:
            raise NewExperimentError(f"--out {out}: cannot write it: {exc.strerror or exc}") from None
    return text, out


def _named(picked: list[tuple[Node, str, float]], cloud: Node | None, chosen: list[Node],
           args: argparse.Namespace) -> tuple[list[Placement], list[Placement], list[App]]:
    """Host names for a new placement, given in the order the first one was named."""
    used: set[str] = set()
    prefix = {"far_edge": "fe", "near_edge": "ne"}
    clusters = [Placement(host_name(x.label, used, prefix[tier]), x, tier, cores) for x, tier, cores in picked]
    if cloud is not None:
        clusters.append(Placement(host_name("cloud", used), cloud, "cloud", TIER_CORES["cloud"]))
    sources = [Placement(host_name(x.label, used, fallback=f"src{x.id}"), x) for x in chosen]
    return clusters, sources, applications(args.family, args.min_accuracy, repo_path("models/zoo"), used)


def _demands(plan: Plan) -> list[Demand]:
    """Each application's deadline and request bytes, and the expected time of its fastest model
    meeting its accuracy at the slowest of the plan's edge clusters (a placement that meets the
    deadline with it meets it at any of them)."""
    out = []
    edge = [c for c in plan.clusters if c.tier != "cloud"] or plan.clusters
    for a in plan.experiment.applications:
        best = [min((f.expected_ms for m, f in plan.services[c.name].items()
                     if plan.models[m].family == a.family and plan.models[m].accuracy >= a.min_accuracy),
                    default=math.inf) for c in edge]
        out.append(Demand(a.name, a.deadline_ms, plan.request_bytes[a.name], max(best)))
    return out


def reach_deadlines(plan: Plan, g: nx.Graph, nodes: list[Node], clusters: list[Placement], sources: list[Placement],
                    n_clusters: int | None, n_sources: int | None) -> tuple[list[tuple[Node, str, float]],
                                                                             list[Node], str]:
    """A placement within every application's deadline at zero load (:mod:`testbed.plan.placement`):

    * ``--clusters auto:N``: clusters picked greedily (:func:`testbed.plan.placement.cover_sources`):
      first to bring every source within reach, then to bring the sources further within their
      deadlines (ties: the more central node). The first pick is near edge, the others far edge.
    * ``--sources auto:N``: the sources a cluster reaches are kept; the others are replaced by the
      least central nodes a cluster reaches (the rest stay, when too few nodes are in reach).

    Returns (the clusters as (node, tier, cores), the source nodes, a line on what was done).
    """
    demands = _demands(plan)
    by_id = {x.id: x for x in nodes}
    sw_of = {s.node_id: s.name for s in plan.switches if s.node_id in by_id}
    node_of = {sw: by_id[i] for i, sw in sw_of.items()}
    central = [sw_of[x.id] for x in _by_centrality(g, by_id) if x.id in sw_of]
    host_mbps = plan.experiment.topology.host_bandwidth_mbps
    edge = [c for c in clusters if c.tier != "cloud"]
    src_nodes = [x.node for x in sources]
    why = []
    if n_clusters is not None:
        reach = {sw_of[x.id]: zero_load_from(plan, sw_of[x.id], True, demands, host_mbps) for x in src_nodes}
        picks, _ = cover_sources(reach, demands, central, n_clusters)
        tiers = ["near_edge"] + ["far_edge"] * (len(picks) - 1)
        picked = [(node_of[sw], t, TIER_CORES[t]) for sw, t in zip(picks, tiers, strict=True)]
        why.append(f"{n_clusters} clusters placed to bring the sources within the deadline at zero load")
    else:
        picked = [(c.node, c.tier, c.cores) for c in edge]
    if n_sources is not None:
        served = {}
        for x, _, _ in picked:
            for sw, times in zero_load_from(plan, sw_of[x.id], False, demands, host_mbps).items():
                served[sw] = served.get(sw, False) or covers(times, demands)
        kept = [x for x in src_nodes if served.get(sw_of[x.id])]
        taken = {x.id for x, _, _ in picked} | {x.id for x in src_nodes}
        fresh = [node_of[sw] for sw in central[::-1] if served.get(sw) and node_of[sw].id not in taken]
        spare = [x for x in src_nodes if x not in kept]
        moved = min(len(spare), len(fresh))
        src_nodes = kept + fresh[:moved] + spare[moved:]
        if moved:
            why.append(f"{moved} source(s) moved to the least central nodes within reach of a cluster")
    return picked, src_nodes, "; ".join(why)


def _refuse_infeasible(verdicts: list[AppFeasibility]) -> None:
    """NewExperimentError naming, per application none of whose queries can meet its deadline at
    zero load, the fastest pair and the nearest deadline that would work."""
    bad = [f for f in verdicts if not f.ok and f.fastest]
    if not bad:
        return
    parts = []
    for f in bad:
        best = min(f.fastest.values(), key=lambda p: p.e2e_ms)
        parts.append(f"application {f.application!r}: no (source, cluster, model) meets its deadline of "
                     f"{f.deadline_ms:g} ms even at zero load (the fastest: {best.parts()}); the nearest deadline "
                     f"that would work: {f.nearest_deadline_ms():g} ms ({f.nearest_deadline_ms(every_source=True):g} "
                     f"ms for every source)")
    longest = max(f.nearest_deadline_ms(every_source=True) or 0 for f in bad)
    raise NewExperimentError("no query could succeed in the experiment these options make: " + "; ".join(parts)
                             + f"; give a longer --deadline (e.g. --deadline {longest:g}ms), or name clusters nearer "
                               f"the sources; nothing was written")


def _check_plans(text: str, raw: RawTopology, base: Path) -> Plan:
    """The text validates and plans (as ``testbed plan``): its plan, or NewExperimentError saying why."""
    try:
        exp = Experiment.model_validate(load_yaml(text))
    except ValidationError as exc:
        raise NewExperimentError(format_validation_error(exc, "the generated experiment", model=Experiment)) from None
    try:
        return build_plan(exp, raw=raw, base_dir=base)
    except (InputError, ConfigError) as exc:
        raise NewExperimentError(f"the experiment these options make does not plan: {exc}; change the options "
                                 f"(--clusters, --sources, --family, --deadline, --rate)") from None


def register(subparsers) -> None:
    """Add the ``new-experiment`` subcommand."""
    what = ("write a commented experiment file for a topology (topohub or a file), clusters and sources; planned "
            "before it is written")
    p = subparsers.add_parser("new-experiment", help=what,
                              description=what[0].upper() + what[1:] + ": every application gets a (source, cluster) "
                              "pair that meets its deadline at zero load, or the command says it cannot and names the "
                              "nearest deadline that would work.")
    p.add_argument("--topology", required=True, help="topohub:GROUP/NAME (e.g. topohub:sndlib/polska), a .graphml or "
                                                     "a .yaml topology file")
    p.add_argument("--clusters", default="auto:3", help="auto:N (the N most central nodes) or NODE[:TIER][:CORES],... "
                                                        "with TIER far_edge|near_edge (default auto:3)")
    p.add_argument("--sources", default="auto:4",
                   help="auto:N (the N least central nodes) or NODE,... (default auto:4)")
    p.add_argument("--cloud", default=None, metavar="NODE|auto", help="add a cloud cluster behind a 20 ms link at NODE")
    p.add_argument("--family", type=lambda s: [f.strip() for f in s.split(",") if f.strip()], default=["digits"],
                   help="zoo families, one application each (default digits)")
    p.add_argument("--deadline", default="100ms", help="every application's deadline, with its unit (default 100ms)")
    p.add_argument("--min-accuracy", type=float, default=None,
                   help="every application's minimum accuracy (default: the lowest of its family's variants)")
    p.add_argument("--rate", type=float, default=2.0, help="queries per second per source and application (default 2)")
    p.add_argument("--duration", default="30s", help="load duration with its unit (default 30s)")
    p.add_argument("--policy", default="closest", help="the sources' policy (default closest)")
    p.add_argument("--bandwidth", default="100Mbit/s", help="capacity of links the topology states none for")
    p.add_argument("--seed", type=int, default=1, help="the experiment's seed (default 1)")
    p.add_argument("--name", default=None, help="the experiment's name (default: the topology's)")
    p.add_argument("--out", type=Path, default=None, help="the file to write (default: print it)")
    p.add_argument("--force", action="store_true", help="replace --out if it exists")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    text, out = write_experiment(args)
    if out is None:
        sys.stdout.write(text)
    else:
        console.print(f"wrote {out}: testbed plan {out} shows its plan", markup=False, highlight=False)
    return 0


__all__ = ["NewExperimentError", "host_name", "place_clusters", "place_sources", "register", "render",
           "write_experiment"]
