"""Topology input: topohub datasets, Topology Zoo GraphML files and our own YAML.

Each loader returns a :class:`RawTopology`: nodes and links exactly as the source gives them
(nothing merged or dropped yet). :mod:`testbed.plan.build` applies the validation rules.

GraphML link capacities (Topology Zoo edge keys), first that applies, in Mbit/s (10^6 bit/s):

1. ``LinkSpeedRaw``: a number of bit/s (> 0), divided by 10^6.
2. ``LinkSpeed`` with ``LinkSpeedUnits`` (``K``, ``M``, ``G``, ``T``: 10^-3, 1, 10^3, 10^6 Mbit/s).
3. ``LinkLabel`` when it reads as a rate: ``"2.5 Gbps"``, ``"45Mbit/s"``, ``"10G"``, ``"155 Mb/s"``.
   A range (``"100-155 Mbit/s"``, ``"10-20Gbps"``, also in ``LinkSpeed``) gives its LOWER bound (our
   choice: the capacity the operator states at least). Bytes (``"1 GB/s"``), bounds (``"< 10 Gbps"``)
   and names (``"OC-3"``) are not guessed.
4. Otherwise the experiment's ``topology.bandwidth``.

:func:`testbed.plan.build.build_plan` reports which rule gave each link's capacity.

Our YAML format (see ``topologies/triangle.yaml``)::

    name: triangle
    nodes:
      - {id: A, lat: 45.0, lon: 7.0}            # optional: label, name (Mininet switch name), dpid
    links:
      - {a: A, b: B, delay: 5ms, bandwidth: 100Mbit/s}   # delay/bandwidth optional, loss_pct optional
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import Field

from testbed.core.errors import InputError
from testbed.core.util import REPO_ROOT, did_you_mean
from testbed.spec.experiment import load_yaml_model
from testbed.spec.schema import StrictModel
from testbed.spec.units import MAX_DELAY_MS, MAX_RATE_MBPS, parse_delay_ms, parse_rate_mbps

TOPOLOGIES_DIR = REPO_ROOT / "topologies"
EARTH_RADIUS_KM = 6371.0088  # IUGG mean Earth radius


class TopologyError(InputError):
    """The topology is invalid or cannot be loaded; the message names the offending item."""


@dataclass
class RawNode:
    """A topology node as given by its source. ``lat``/``lon`` in degrees, or None if unknown."""

    id: str
    label: str
    lat: float | None = None
    lon: float | None = None
    name: str | None = None
    dpid: int | None = None


@dataclass
class RawLink:
    """An undirected link as given by its source; None means 'derive it' (delay) or 'default'."""

    a: str
    b: str
    delay_ms: float | None = None
    bandwidth_mbps: float | None = None
    loss_pct: float = 0.0
    bandwidth_from: str | None = None  # a dataset's rule that gave bandwidth_mbps (module docstring)
    km: float | None = None  # the link's length as the dataset gives it (planar graphs), km


@dataclass
class RawTopology:
    """Nodes and links before validation. ``origin`` decides how lenient the rules are."""

    name: str
    origin: Literal["yaml", "topohub", "graphml"]
    nodes: list[RawNode]
    links: list[RawLink]
    notes: list[str] = field(default_factory=list)


def great_circle_km(lat1: float, lon1: float, lat2: float, lon2: float) -> float:
    """Haversine great-circle distance in km between two (lat, lon) points in degrees."""
    p1, p2 = math.radians(lat1), math.radians(lat2)
    dp, dl = p2 - p1, math.radians(lon2 - lon1)
    h = math.sin(dp / 2) ** 2 + math.cos(p1) * math.cos(p2) * math.sin(dl / 2) ** 2
    return 2 * EARTH_RADIUS_KM * math.asin(min(1.0, math.sqrt(h)))


# --- our YAML -------------------------------------------------------------------------------

class _YNode(StrictModel):
    id: str | int
    label: str | None = None
    lat: float | None = Field(None, ge=-90, le=90)
    lon: float | None = Field(None, ge=-180, le=180)
    name: str | None = None
    dpid: int | str | None = None


class _YLink(StrictModel):
    a: str | int
    b: str | int
    delay_ms: float | None = Field(None, ge=0, le=MAX_DELAY_MS)
    bandwidth_mbps: float | None = Field(None, gt=0, le=MAX_RATE_MBPS)
    loss_pct: float = Field(0.0, ge=0, le=100)

    unit_keys = (("delay", parse_delay_ms, "ms"), ("bandwidth", parse_rate_mbps, "mbps"))


class _YTopo(StrictModel):
    name: str
    nodes: list[_YNode] = Field(min_length=1)
    links: list[_YLink]


def _parse_dpid(value: int | str | None, item: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool):
        raise TopologyError(f"{item}: dpid {value!r} is a boolean; give an integer or a hex string")
    if isinstance(value, int):
        return value
    try:
        return int(value, 16)
    except ValueError:
        raise TopologyError(f"{item}: dpid {value!r} is neither an integer nor a hex string") from None


def load_yaml_topology(path: Path) -> RawTopology:
    """Load our YAML topology format.

    Raises:
        TopologyError: unreadable file, invalid YAML, or schema errors (each located, e.g. ``links.2.delay``).
    """
    topo = load_yaml_model(path, _YTopo, "topology", TopologyError)
    nodes = [
        RawNode(id=str(n.id), label=n.label or str(n.id), lat=n.lat, lon=n.lon, name=n.name,
                dpid=_parse_dpid(n.dpid, f"node {n.id}"))
        for n in topo.nodes
    ]
    links = [RawLink(str(lk.a), str(lk.b), lk.delay_ms, lk.bandwidth_mbps, lk.loss_pct) for lk in topo.links]
    return RawTopology(topo.name, "yaml", nodes, links)


# --- topohub --------------------------------------------------------------------------------

#: A topohub key: parts of letters, digits, ``_``, ``-`` and ``.`` (not ``.`` or ``..`` alone) joined by
#: ``/``. topohub reads ``data/<key>.json`` inside its package: a key is a name, never a path.
TOPOHUB_KEY_RE = re.compile(r"(?!\.{1,2}(?:/|$))[A-Za-z0-9_.-]+(?:/(?!\.{1,2}(?:/|$))[A-Za-z0-9_.-]+)*")


def topohub_keys() -> list[str]:
    """Every key of topohub's embedded repository (``group/name``), sorted: the JSON files under
    its ``data`` folder (topohub has no listing function of its own)."""
    import importlib.resources

    import topohub

    root = importlib.resources.files(topohub) / "data"
    out: list[str] = []
    todo = [(root, "")]
    while todo:
        folder, prefix = todo.pop()
        for entry in folder.iterdir():
            if entry.is_dir() and not entry.name.startswith("_"):
                todo.append((entry, f"{prefix}{entry.name}/"))
            elif entry.name.endswith(".json"):
                out.append(prefix + entry.name.removesuffix(".json"))
    return sorted(out)


def load_topohub(key: str) -> RawTopology:
    """Load ``group/name`` from topohub's embedded repository (positions are (lon, lat)).

    Note: topohub drops nodes that lack coordinates before we see them; the plan says so.

    Raises:
        TopologyError: unknown key.
    """
    import topohub

    if not TOPOHUB_KEY_RE.fullmatch(key):
        raise TopologyError(f"topohub key {key!r}: expected GROUP/NAME (letters, digits, '_', '-', '.', parts "
                            f"joined by '/'), e.g. topozoo/Abilene, sndlib/polska, gabriel/25/0")
    try:
        data = topohub.get(key)
    except (KeyError, FileNotFoundError, ValueError):
        keys = topohub_keys()
        close = did_you_mean(key, keys) or did_you_mean(key.lower(), {k.lower(): k for k in keys})
        group = key.split("/", 1)[0]
        in_group = [k for k in keys if k.startswith(group + "/")]
        listed = (f"; {group} has {len(in_group)}: {', '.join(in_group[:30])}{' ...' if len(in_group) > 30 else ''}"
                  if in_group and not close else "")
        raise TopologyError(
            f"topohub has no topology {key!r}{close} (examples: topozoo/Abilene, sndlib/polska, gabriel/25/0; "
            f"groups: {', '.join(sorted({k.split('/', 1)[0] for k in keys}))}){listed}"
        ) from None
    planar = key.split("/", 1)[0] == "gabriel"  # synthetic graphs: positions on a plane, not lon/lat
    nodes = []
    for n in data["nodes"]:
        pos = n.get("pos")
        lon, lat = (pos[0], pos[1]) if pos and not planar else (None, None)
        nodes.append(RawNode(id=str(n["id"]), label=str(n.get("name", n["id"])), lat=lat, lon=lon))
    links = [RawLink(str(e["source"]), str(e["target"]), km=_positive(e.get("dist")) if planar else None)
             for e in data["edges"]]
    notes = [f"topohub {key}: nodes without coordinates are dropped by topohub itself, before loading"]
    if planar:
        notes.append(f"topohub {key}: a planar graph (positions are not lon/lat): link lengths are topohub's "
                     f"edge 'dist' in km")
    return RawTopology(str(data["graph"].get("name", key)), "topohub", nodes, links, notes)


# --- Topology Zoo GraphML -------------------------------------------------------------------

_PREFIX_MBPS = {"k": 1e-3, "m": 1.0, "g": 1e3, "t": 1e6}
_RATE_RE = re.compile(r"\s*(?P<a>\d+(?:\.\d+)?)(?:\s*-\s*(?P<b>\d+(?:\.\d+)?))?\s*"
                      r"(?P<prefix>[kKmMgGtT])(?P<bits>bps|bit/s|bits/s|b/s|bit|bits|b)?\s*")
_NUMBER_RE = re.compile(r"\s*(?P<a>\d+(?:\.\d+)?)(?:\s*-\s*(?P<b>\d+(?:\.\d+)?))?\s*")


def _positive(value: object) -> float | None:
    try:
        v = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) and v > 0 else None


def graphml_link_speed(attrs: dict) -> tuple[float | None, str | None]:
    """A GraphML edge's capacity in Mbit/s and the rule that gave it (module docstring), or
    ``(None, None)`` when the edge states none that can be read without guessing."""
    raw = _positive(attrs.get("LinkSpeedRaw"))
    if raw is not None:
        return raw / 1e6, "LinkSpeedRaw"
    speed, units = attrs.get("LinkSpeed"), str(attrs.get("LinkSpeedUnits") or "").strip().lower()
    if speed is not None and units in _PREFIX_MBPS:
        m = _NUMBER_RE.fullmatch(str(speed))
        if m and _positive(m["a"]):
            rng = f" (range {speed} {units.upper()}, lower bound)" if m["b"] else ""
            return float(m["a"]) * _PREFIX_MBPS[units], f"LinkSpeed{rng}"
    label = attrs.get("LinkLabel")
    if label is not None:
        m = _RATE_RE.fullmatch(str(label))
        if m and _positive(m["a"]):
            rng = f" range {str(label).strip()!r}, lower bound" if m["b"] else f" {str(label).strip()!r}"
            return float(m["a"]) * _PREFIX_MBPS[m["prefix"].lower()], f"LinkLabel{rng}"
    return None, None

def load_graphml(path: Path) -> RawTopology:
    """Load a Topology Zoo GraphML file (node keys ``Latitude``/``Longitude``/``label``).

    Parallel edges are kept (read as a multigraph) so the plan can report them.

    Raises:
        TopologyError: unreadable or malformed file.
    """
    import networkx as nx

    try:
        g = nx.read_graphml(path, force_multigraph=True)
    except (OSError, nx.NetworkXError, SyntaxError, ValueError) as exc:
        raise TopologyError(f"cannot read GraphML {path}: {exc}") from None
    nodes = []
    for nid, attrs in g.nodes(data=True):
        coords = []
        for key in ("Latitude", "Longitude"):
            value = attrs.get(key)
            try:
                coords.append(None if value is None else float(value))
            except (TypeError, ValueError):
                label = attrs.get("label", nid)
                raise TopologyError(f"{path}: node {label!r}: {key} {value!r} is not a number") from None
        nodes.append(RawNode(id=str(nid), label=str(attrs.get("label", nid)), lat=coords[0], lon=coords[1]))
    links = []
    for a, b, attrs in g.edges(data=True):
        mbps, rule = graphml_link_speed(attrs)
        links.append(RawLink(str(a), str(b), bandwidth_mbps=mbps, bandwidth_from=rule))
    return RawTopology(str(g.graph.get("label", g.graph.get("Network", path.stem))), "graphml", nodes, links)


def resolve_topology_path(source: str, base_dir: Path) -> Path:
    """Find a topology file named in an experiment: relative to the experiment, then ``topologies/``.

    Raises:
        TopologyError: no candidate is a regular file: one that is a directory, or another kind of
            file (a device such as /dev/null, a FIFO), is named as such, else "not found" with the
            folders looked in.
    """
    p = Path(source)
    cands = [p] if p.is_absolute() else [base_dir / p, TOPOLOGIES_DIR / p, p]
    for cand in cands:
        if cand.is_file():
            return cand
    folder = next((c for c in cands if c.is_dir()), None)
    if folder is not None:
        raise TopologyError(f"topology file {source!r}: {folder} is a directory, not a topology file")
    special = next((c for c in cands if c.exists()), None)
    if special is not None:  # a device, a FIFO or a socket: reading it could block or never end
        raise TopologyError(f"topology file {source!r}: {special} is not a regular file")
    raise TopologyError(f"topology file {source!r} not found (looked in {base_dir} and {TOPOLOGIES_DIR})")


def load_topology(source: str, base_dir: Path = Path(".")) -> RawTopology:
    """Load a topology from ``topohub:GROUP/NAME``, a ``.graphml`` file or a ``.yaml`` file.

    Raises:
        TopologyError: unknown scheme/extension, missing file, or a loader error.
    """
    if source.startswith("topohub:"):
        return load_topohub(source.removeprefix("topohub:"))
    path = resolve_topology_path(source, base_dir)
    if path.suffix.lower() == ".graphml":
        return load_graphml(path)
    if path.suffix.lower() in (".yaml", ".yml"):
        return load_yaml_topology(path)
    raise TopologyError(f"topology {source!r}: expected topohub:GROUP/NAME, a .graphml or a .yaml file")


def raw_from_dict(data: dict, origin: Literal["yaml", "topohub", "graphml"] = "yaml") -> RawTopology:
    """Build a :class:`RawTopology` from plain dicts (tests and programmatic use)."""
    nodes = [RawNode(**n) for n in data["nodes"]]
    links = [RawLink(**lk) for lk in data["links"]]
    return RawTopology(data.get("name", "topology"), origin, nodes, links)

