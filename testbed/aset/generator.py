"""Seeded scenario generator: the distribution the general ASET agent trains on, and its held-out set.

:func:`draw_scenario` (``split``, ``seed``) returns one experiment document (the YAML's dict), the
same for the same arguments (everything is drawn from ``numpy.random.default_rng([SALT, split,
seed])``; topohub's data is read, not drawn). It draws:

- a **topology** from topohub's Topology Zoo and Gabriel families with 8 to 60 switches after
  topohub's own drop of nodes without coordinates (:func:`topology_pool`), connected;
- **sources**: 2-8 at distinct sites, names drawn at random (no name is special);
- **clusters**: 1 cloud (attached to a random switch, 10-40 ms), 1-2 near edge (0.5 core) at sites
  without a source, 1-3 far edge (0.25 core) each at a source's site or one hop from it, the
  suite's LiteRT models per tier;
- **applications**: a non-empty subset of the zoo's three real-DNN applications (hands, faces,
  classify: the suite's deadlines and minimum accuracies), deadlines scaled by 1, 1.5 or 2;
- **load**: the clusters' capacity (workers x 1000 / the median expected service time of their
  models, from a first plan) times a level of :data:`LOAD_LEVELS`, light to overloaded, spread over
  the sources by a Dirichlet(1) draw and over the applications evenly;
- **events**: one :data:`PATTERNS` entry, from the built-in kinds: link degradation
  (``link_delay``), congestion (``link_congestion``), link failure (``link_down``/``link_up`` on
  a link whose loss keeps the network connected), cluster failure (``cluster_down``/``up`` of an
  edge cluster), hotspot shifts (two groups of sources swapping load, ``step`` processes), bursts
  (``mmpp`` processes), and two combinations.

**Held out** (never drawn by ``split="train"``, only by ``split="held_out"``): whole topologies
(:data:`HELD_OUT_TOPOLOGIES`) and whole event patterns (:data:`HELD_OUT_PATTERNS`). A held-out
scenario has a held-out topology or a held-out pattern (or both): half of them each way.

**Test and validation** (``split="test"``, ``split="validation"``; the frozen sets
``experiments/generated/test`` and ``.../validation``): every scenario has a topology of
:data:`TEST_TOPOLOGIES` (resp. :data:`VALIDATION_TOPOLOGIES`, disjoint from them) and, half of
the time, a held-out event pattern (else any pattern). ``split="train"`` draws none of the
families of those topologies nor of the held-out ones (:func:`train_topologies`: Geant2012 held
out shuts out every Geant), so training never sees a test or validation topology.
Every document passes ``testbed plan`` (:func:`plan_document` builds it; a test plans a range
of seeds).
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Literal

import networkx as nx
import numpy as np
import yaml

from testbed.plan.build import Plan, build_plan
from testbed.spec.experiment import Experiment
from testbed.spec.topology import RawTopology, load_topohub

Split = Literal["train", "held_out", "validation", "test"]
#: The rng stream of each split (``numpy.random.default_rng([SALT, index, seed])``).
SPLIT_INDEX = {"train": 0, "held_out": 1, "test": 2, "validation": 3}
SALT = 3101
#: Switch-count bounds of a drawn topology.
MIN_SWITCHES, MAX_SWITCHES = 8, 60
#: Topologies training never sees (the suite's Abilene among them: the suite is a test set).
HELD_OUT_TOPOLOGIES: tuple[str, ...] = ("topozoo/Abilene", "topozoo/Geant2012", "topozoo/Cesnet201006",
                                        "topozoo/Bellcanada", "gabriel/25/0", "gabriel/40/1")
#: The frozen test set's topologies (``split="test"``): the held-out ones and six more families.
TEST_TOPOLOGIES: tuple[str, ...] = HELD_OUT_TOPOLOGIES + ("topozoo/Surfnet", "topozoo/Sinet", "topozoo/Rnp",
                                                         "topozoo/Arnes", "topozoo/Uunet", "gabriel/50/3")
#: The validation set's topologies (``split="validation"``), disjoint from the test set's.
VALIDATION_TOPOLOGIES: tuple[str, ...] = ("topozoo/Janetbackbone", "topozoo/Grnet", "topozoo/Karen", "topozoo/Sunet",
                                          "gabriel/30/2", "gabriel/45/3")
#: Event patterns: name -> the kinds it combines.
PATTERNS: dict[str, tuple[str, ...]] = {
    "calm": (), "degradation": ("degradation",), "congestion": ("congestion",), "linkfail": ("linkfail",),
    "cluster_failure": ("cluster_failure",), "hotspot": ("hotspot",), "burst": ("burst",),
    "failure_burst": ("cluster_failure", "burst"), "degradation_hotspot": ("degradation", "hotspot"),
}
#: Event patterns training never sees.
HELD_OUT_PATTERNS: tuple[str, ...] = ("failure_burst", "degradation_hotspot")
#: The zoo's real-DNN applications (the suite's: experiments/scenario-*.yaml say where the figures come from).
APPLICATIONS = ({"family": "hands", "deadline_ms": 33.0, "min_accuracy": 0.9},
                {"family": "faces", "deadline_ms": 50.0, "min_accuracy": 0.75},
                {"family": "imagenet", "deadline_ms": 370.0, "min_accuracy": 0.7})
#: The suite's LiteRT models per tier.
TIER_MODELS = {
    "far_edge": ["hand_lite", "hand_full", "face_short", "face_dual", "mobilenet_v2_035", "mobilenet_v2_100"],
    "near_edge": ["hand_full", "hand_palm", "face_full", "face_dual", "mobilenet_v2_100", "efficientnet_b0"],
    "cloud": ["hand_palm", "face_dual", "efficientnet_b0", "resnet50"],
}
TIER_CORES = {"far_edge": 0.25, "near_edge": 0.5, "cloud": 0.5}
#: Total rate as a share of :func:`_capacity_qps` (an optimistic capacity: every model of every cluster
#: counted, whatever the deadlines allow), from light to overloaded; calibrated on the suite, whose
#: scenarios run at 0.02 (low) to 0.6 (saturation) of it.
LOAD_LEVELS = (0.03, 0.08, 0.15, 0.25, 0.4)
DURATION_S = 30.0


@functools.cache
def _raw(key: str) -> RawTopology:
    return load_topohub(key)


def _graph(key: str) -> nx.Graph:
    """The topology's graph over node labels (nodes with coordinates; the links between them)."""
    raw = _raw(key)
    ids = {n.id: n.label for n in raw.nodes if key.startswith("gabriel/") or (n.lat is not None and n.lon is not None)}
    g = nx.Graph()
    g.add_nodes_from(ids.values())
    g.add_edges_from((ids[lk.a], ids[lk.b]) for lk in raw.links if lk.a in ids and lk.b in ids and lk.a != lk.b)
    return g


@functools.cache
def topology_pool() -> tuple[str, ...]:
    """Every topohub Topology Zoo and Gabriel key whose graph is connected, with 8-60 nodes and
    distinct labels (sorted). Gabriel: sizes 10-60, the first 5 graphs of each."""
    import topohub

    keys = [f"topozoo/{p.stem}" for p in sorted((Path(topohub.__file__).parent / "data" / "topozoo").glob("*.json"))]
    keys += [f"gabriel/{n}/{i}" for n in range(10, 61, 5) for i in range(5)]
    out = []
    for k in keys:
        try:
            raw = _raw(k)
            g = _graph(k)
        except Exception:  # noqa: BLE001 - a topology topohub cannot give is simply not in the pool
            continue
        labels = [n.label for n in raw.nodes]
        if MIN_SWITCHES <= g.number_of_nodes() <= MAX_SWITCHES and nx.is_connected(g) and \
                len(set(labels)) == len(labels):
            out.append(k)
    return tuple(sorted(out))


def _pick(rng: np.random.Generator, items, k: int = 1) -> list:
    idx = rng.choice(len(items), size=k, replace=False)
    return [items[int(i)] for i in idx]


def _name(rng: np.random.Generator, used: set[str], prefix: str) -> str:
    while True:
        n = prefix + "".join(chr(97 + int(x)) for x in rng.integers(0, 26, 3))
        if n not in used:
            used.add(n)
            return n


def family(key: str) -> str:
    """A topology's family: a Topology Zoo key without its trailing year or digits (Geant2012 ->
    topozoo/Geant, Cesnet201006 -> topozoo/Cesnet), a Gabriel key itself (each is its own graph)."""
    return key if key.startswith("gabriel/") else re.sub(r"\d+$", "", key)


def train_topologies() -> list[str]:
    """The topologies ``split="train"`` draws from: the pool without any family of the held-out,
    test or validation topologies (sorted)."""
    shut = {family(k) for k in HELD_OUT_TOPOLOGIES + TEST_TOPOLOGIES + VALIDATION_TOPOLOGIES}
    return [k for k in topology_pool() if family(k) not in shut]


def _choose(rng: np.random.Generator, split: Split) -> tuple[str, str]:
    """(topology key, pattern name) of a scenario of ``split``."""
    pool = topology_pool()
    train_pats = [p for p in PATTERNS if p not in HELD_OUT_PATTERNS]
    if split == "train":
        return _pick(rng, train_topologies())[0], _pick(rng, train_pats)[0]
    if split in ("test", "validation"):  # always a topology training never sees; half the time a held-out pattern
        topos = TEST_TOPOLOGIES if split == "test" else VALIDATION_TOPOLOGIES
        pats = list(HELD_OUT_PATTERNS) if rng.random() < 0.5 else list(PATTERNS)
        return _pick(rng, list(topos))[0], _pick(rng, pats)[0]
    train_topos = [k for k in pool if k not in HELD_OUT_TOPOLOGIES]  # the held-out set as it was drawn
    if rng.random() < 0.5:  # a held-out topology, any pattern
        return _pick(rng, list(HELD_OUT_TOPOLOGIES))[0], _pick(rng, list(PATTERNS))[0]
    return _pick(rng, train_topos)[0], _pick(rng, list(HELD_OUT_PATTERNS))[0]


def _skeleton(rng: np.random.Generator, key: str, name: str, seed: int) -> tuple[dict, nx.Graph]:
    g = _graph(key)
    nodes = sorted(g.nodes)
    n_far, n_near = int(rng.integers(1, 4)), int(rng.integers(1, 3))
    n_src = min(int(rng.integers(2, 9)), len(nodes) - n_near)
    src_sites = _pick(rng, nodes, n_src)
    near_sites = _pick(rng, [n for n in nodes if n not in src_sites], n_near)
    # far edges next to users: at a source's site or one hop from it
    far_sites = []
    for s in _pick(rng, src_sites, min(n_far, n_src)):
        around = sorted(set(g.neighbors(s)) | {s})
        far_sites.append(around[int(rng.integers(len(around)))])
    sites = far_sites + near_sites + src_sites
    n_far = len(far_sites)
    attach = _pick(rng, nodes)[0]
    used: set[str] = set()
    clusters = []
    for i, tier in enumerate(["far_edge"] * n_far + ["near_edge"] * n_near):
        clusters.append({"name": _name(rng, used, "c"), "site": sites[i], "tier": tier, "cpu_cores": TIER_CORES[tier],
                         "workers": 1, "queue_limit": 16 if tier == "far_edge" else 32,
                         "server": {"runtime": "litert"}, "models": list(TIER_MODELS[tier])})
    clusters.append({"name": _name(rng, used, "c"), "site": "cloud", "tier": "cloud", "cpu_cores": TIER_CORES["cloud"],
                     "workers": 1, "queue_limit": 64, "server": {"runtime": "litert"},
                     "models": list(TIER_MODELS["cloud"])})
    sources = [{"name": _name(rng, used, "s"), "site": s} for s in sites[n_far + n_near:n_far + n_near + n_src]]
    k = int(rng.integers(1, 8))  # a non-empty subset of the three applications (bit mask)
    scale = float(rng.choice([1.0, 1.5, 2.0]))
    apps = [{"name": _name(rng, used, "a"), "family": a["family"], "deadline": f"{a['deadline_ms'] * scale:g}ms",
             "min_accuracy": a["min_accuracy"]} for i, a in enumerate(APPLICATIONS) if k >> i & 1]
    doc = {"name": name, "seed": int(seed), "duration": f"{DURATION_S:g}s", "policy": "min_latency",
           "report_interval": "500ms",
           "topology": {"source": f"topohub:{key}", "bandwidth": "100Mbit/s", "host_bandwidth": "1Gbit/s"},
           "cloud": {"attach_to": attach, "delay": f"{int(rng.integers(10, 41))}ms", "bandwidth": "1Gbit/s"},
           "clusters": clusters, "sources": sources, "applications": apps}
    return doc, g


def plan_document(doc: dict) -> Plan:
    """The plan of a generated document (what ``testbed plan`` builds from its file).

    Raises:
        pydantic.ValidationError, PlanError, TopologyError: the document is not a valid experiment.
    """
    exp = Experiment.model_validate(doc)
    return build_plan(exp, raw=_raw(doc["topology"]["source"].removeprefix("topohub:")))


def _capacity_qps(plan: Plan) -> float:
    return sum(c.workers * 1e3 / float(np.median([f.expected_ms for f in plan.services[c.name].values()]))
               for c in plan.clusters)


def _workload(rng: np.random.Generator, doc: dict, total_qps: float, kinds: tuple[str, ...]) -> list[dict]:
    srcs = [s["name"] for s in doc["sources"]]
    share = rng.dirichlet(np.ones(len(srcs)))
    apps = [a["name"] for a in doc["applications"]]
    order = list(rng.permutation(len(srcs)))
    group_a = {srcs[int(i)] for i in order[:max(1, len(srcs) // 2)]}
    out = []
    for s, w in zip(srcs, share, strict=True):
        for a in apps:
            r = max(0.2, round(float(total_qps * w / len(apps)), 2))
            if "hotspot" in kinds:
                hi, lo = round(r * 1.6, 2), round(r * 0.4, 2)
                first, then = (hi, lo) if s in group_a else (lo, hi)
                steps = [{"at": "0s", "rate_qps": first}, {"at": f"{DURATION_S / 2:g}s", "rate_qps": then}]
                out.append({"application": a, "sources": [s], "process": "step", "steps": steps})
            elif "burst" in kinds:
                out.append({"application": a, "sources": [s], "process": "mmpp",
                            "rates_qps": [round(r * 0.5, 2), round(r * 2.5, 2)], "dwell_s": [3, 1.5]})
            else:
                out.append({"application": a, "sources": [s], "rate_qps": r})
    return out


def _events(rng: np.random.Generator, doc: dict, g: nx.Graph, plan: Plan, kinds: tuple[str, ...]) -> list[dict]:
    t1, t2 = f"{DURATION_S / 3:g}s", f"{2 * DURATION_S / 3:g}s"
    label = {s.name: s.label for s in plan.switches}
    # links on the planned paths (where a change matters), as label pairs
    on_path = sorted({tuple(sorted((label.get(a, a), label.get(b, b))))
                      for p in plan.paths for a, b in zip(p.switches, p.switches[1:], strict=False)
                      if a in label and b in label})
    out: list[dict] = []
    if "degradation" in kinds and on_path:
        a, b = on_path[int(rng.integers(len(on_path)))]
        out.append({"at": t1, "kind": "link_delay", "link": [a, b], "delay": f"{int(rng.integers(15, 45))}ms"})
    if "congestion" in kinds and on_path:
        a, b = on_path[int(rng.integers(len(on_path)))]
        bg = f"{int(rng.integers(85, 99))}Mbit/s"
        out += [{"at": t1, "kind": "link_congestion", "link": [a, b], "background": bg},
                {"at": t2, "kind": "link_congestion", "link": [a, b], "background": "0Mbit/s"}]
    if "linkfail" in kinds:
        bridges = {tuple(sorted(e)) for e in nx.bridges(g)}
        cand = [e for e in on_path if e not in bridges and g.has_edge(*e)]
        if cand:
            a, b = cand[int(rng.integers(len(cand)))]
            out += [{"at": t1, "kind": "link_down", "link": [a, b]}, {"at": t2, "kind": "link_up", "link": [a, b]}]
    if "cluster_failure" in kinds:
        edge = [c["name"] for c in doc["clusters"] if c["tier"] != "cloud"]
        c = edge[int(rng.integers(len(edge)))]
        out += [{"at": t1, "kind": "cluster_down", "cluster": c}, {"at": t2, "kind": "cluster_up", "cluster": c}]
    return out


def draw_scenario(split: Split, seed: int) -> dict:
    """One generated experiment document (module docstring), named ``gen-<split>-<seed>``; its
    ``x_generated`` key is not part of it (:func:`write_scenarios` keeps it as a comment)."""
    rng = np.random.default_rng([SALT, SPLIT_INDEX[split], int(seed)])
    key, pattern = _choose(rng, split)
    kinds = PATTERNS[pattern]
    doc, g = _skeleton(rng, key, f"gen-{split.replace('_', '')}-{seed}", seed)
    level = float(rng.choice(LOAD_LEVELS))
    probe = dict(doc, workload=[{"application": a["name"], "sources": "all", "rate_qps": 1}
                                for a in doc["applications"]])
    plan = plan_document(probe)
    doc["workload"] = _workload(rng, doc, level * _capacity_qps(plan), kinds)
    events = _events(rng, doc, g, plan, kinds)
    if events:
        doc["events"] = events
    doc["x_generated"] = {"split": split, "seed": int(seed), "topology": key, "pattern": pattern, "load": level}
    return doc


def write_scenarios(out: Path, split: Split, seeds: list[int]) -> list[Path]:
    """Write ``gen-<split>-<seed>.yaml`` for each seed into ``out``, each planned first (a document
    that does not plan is an error, never a file); returns the paths."""
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for s in seeds:
        doc = draw_scenario(split, s)
        info = doc.pop("x_generated")
        plan_document(doc)
        p = out / f"{doc['name']}.yaml"
        head = (f"# Generated by testbed.aset.generator (split {split}, seed {s}): topology {info['topology']}, "
                f"events {info['pattern']}, load {info['load']:g} x capacity.\n")
        p.write_text(head + yaml.safe_dump(doc, sort_keys=False, width=120))
        paths.append(p)
    return paths


__all__ = ["HELD_OUT_PATTERNS", "HELD_OUT_TOPOLOGIES", "PATTERNS", "SPLIT_INDEX", "TEST_TOPOLOGIES",
           "VALIDATION_TOPOLOGIES", "draw_scenario", "family", "plan_document", "topology_pool", "train_topologies",
           "write_scenarios"]
