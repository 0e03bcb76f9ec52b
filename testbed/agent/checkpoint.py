"""ONE container for every trained agent, and the registry that turns one into a selector.

A checkpoint is a pair of files, ``NAME.json`` and ``NAME.npz`` (``NAME`` is what ``aset.checkpoint``,
``testbed evaluate --checkpoint`` and the trainers' ``export_to`` give, without suffix):

``NAME.json``::

    {"kind": "general",            # which selector factory reads it (the registry below)
     "version": 1,                 # the kind's format version (the factory says which it reads)
     "policies": ["closest", ...], # the action space, in action-index order
     "features": {...},            # the feature spec: the observation settings and the feature names
     "provenance": {...},          # how it was made: trainer, config, seeds, data, code (free-form)
     ...}                          # the kind's own keys (e.g. a decision rule, the layer count)

``NAME.npz``: the kind's arrays (numpy, no pickle), e.g. the network's weights ``w0, w1, ...``.

Checkpoints written before this container carried ``"format"`` instead of ``kind`` / ``version``;
they read as :data:`LEGACY_FORMATS` says (``aset-general-v1`` = ``general`` 1, ``aset-policy-v3``
= ``qnetwork`` 3), so ``models/aset/*`` load unchanged.

**Registering a kind** (a new agent is one entry)::

    from testbed.agent.checkpoint import register_kind

    def make(ckpt: Checkpoint, setup: SourceSetup) -> MySelector:   # one selector per source
        ...                                                         # raise ValueError if it cannot drive it
    register_kind("specialized", make, versions=(1,))

``make(ckpt, setup)`` gets the :class:`Checkpoint` (its arrays, its JSON) and the source's
:class:`SourceSetup` (its name, (cluster, model) options and applications in emulated time, the
experiment's names, the decision window) and returns an object with ``select(obs) -> policy``
and ``reset()`` (the protocol of :mod:`testbed.agent.selector`: ``obs`` an
:class:`~testbed.agent.selector.Observation`, whose ``state`` is the raw window state; a policy
returned as a name of ``ckpt.policies`` or an index). It raises ``ValueError`` (or
:class:`CheckpointError`) naming what does not fit; the message is shown as the run's plan error.
A built-in kind lives in ``testbed/agent/`` (every engine imports it: simulator, evaluation and
the emulation's source processes) and is listed in :data:`BUILTIN_KINDS` (module imported on
first use, which calls :func:`register_kind`). The built-ins: ``general`` (:mod:`testbed.agent.general`),
``qnetwork`` (:mod:`testbed.agent.npolicy`: the paper's double DQN and the rollout regression) and
``gated`` (:mod:`testbed.agent.gate`: a bootstrap ensemble that leaves its reference policy only
with confidence; the shipped general checkpoint and ``testbed specialize``'s).

A selector may name the policy its source applies before its first decision with an attribute
``initial_policy`` (a name of ``ckpt.policies``; a gated checkpoint's reference); without it the
source starts on ``aset.options.initial_policy`` (:attr:`testbed.agent.live.SourceSelector.initial`).

:func:`write_checkpoint` writes the pair (the JSON last, each file atomically);
:func:`read_checkpoint` reads it once per file version (kept by path, size and modification time).
Every failure is a :class:`CheckpointError` naming the file.
"""

from __future__ import annotations

import importlib
import json
import zipfile
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from testbed.agent.features import AppView
from testbed.core.errors import InputError
from testbed.core.util import REPO_ROOT, replace_atomic
from testbed.model.dispatch import OptionSpec
from testbed.plan.boundaries import SelectorContext

#: ``format`` of a checkpoint written before the container -> (kind, version).
LEGACY_FORMATS: dict[str, tuple[str, int]] = {"aset-general-v1": ("general", 1), "aset-policy-v3": ("qnetwork", 3),
                                              "aset-policy-v2": ("qnetwork", 2)}
#: Built-in kinds -> the module that registers it (imported on first use).
BUILTIN_KINDS: dict[str, str] = {"general": "testbed.agent.general", "qnetwork": "testbed.agent.npolicy",
                                  "gated": "testbed.agent.gate"}


class CheckpointError(InputError):
    """A checkpoint that cannot be used: missing, cut short or corrupt, of an unknown kind or
    version, or that does not fit the source it should drive (exit code 2); the message names the
    file."""


def checkpoint_files(path: str | Path) -> tuple[Path, Path]:
    """The two files of a checkpoint, ``(NAME.npz, NAME.json)``. A path given with either suffix
    names the same pair; any other dot belongs to the name (``aset-v1.2`` -> ``aset-v1.2.npz``)."""
    p = Path(path)
    if p.suffix in (".npz", ".json"):
        p = p.with_suffix("")
    return p.with_name(p.name + ".npz"), p.with_name(p.name + ".json")


def checkpoint_path(checkpoint: str | Path, repo_dir: str | Path | None = None) -> Path:
    """An ``aset.checkpoint`` as a path: a relative one against ``repo_dir`` (default the repository)."""
    p = Path(checkpoint)
    return p if p.is_absolute() else Path(repo_dir or REPO_ROOT) / p


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint read by :func:`read_checkpoint`: ``path`` (without suffix), ``kind``,
    ``version``, ``policies`` (the action space), ``features`` (the feature spec), ``provenance``,
    ``meta`` (the whole JSON) and ``arrays`` (the ``.npz``'s arrays by name)."""

    path: Path
    kind: str
    version: int
    policies: tuple[str, ...]
    features: Mapping[str, Any]
    provenance: Mapping[str, Any]
    meta: Mapping[str, Any]
    arrays: Mapping[str, np.ndarray] = field(repr=False)

    @property
    def window_s(self) -> float | None:
        """The decision window the features are computed per (s; ``features.observation.window_ms``),
        None for a kind without one (the report interval is then the window)."""
        obs = self.features.get("observation") or {}
        return float(obs["window_ms"]) / 1e3 if "window_ms" in obs else None

    def layers(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """The arrays ``w0, w1, ...`` as (W, b) pairs of a dense network (``meta.layers`` of them).

        Raises:
            CheckpointError: the arrays are not ``2 x layers`` of them, naming the file.
        """
        n = int(self.meta.get("layers") or 0)
        names = sorted(self.arrays)
        if n < 1 or names != sorted(f"w{i}" for i in range(2 * n)):
            raise CheckpointError(f"ASET checkpoint {self.path}.npz: arrays {', '.join(names) or 'none'}, expected "
                                  f"w0 .. w{2 * n - 1} for {n} layers (export it again)")
        ws = [np.asarray(self.arrays[f"w{i}"], np.float32) for i in range(2 * n)]
        return list(zip(ws[0::2], ws[1::2], strict=True))


@dataclass(frozen=True)
class SourceSetup:
    """What one source's selector is built for, in emulated time (under time dilation k the
    source config's times are divided by k here: :func:`testbed.agent.live.source_setup`).

    ``source``: its name. ``options``: its (cluster, model) options (the plan's, RTT and service
    times in ms). ``applications``: the applications it creates queries of (deadline ms, minimum
    accuracy, family). ``context``: the experiment's names in feature order (every application,
    cluster and source sorted by name, this source's RTT to each cluster, the action space
    ``policies``). ``scenario``: the name a plan-based checkpoint looks this experiment's plan up
    by (``aset.plan``, else the experiment's name). ``window_s``: the configured decision window
    (``aset.window``; None: the checkpoint's own)."""

    source: str
    options: tuple[OptionSpec, ...]
    applications: tuple[AppView, ...]
    context: SelectorContext
    scenario: str
    window_s: float | None = None


@dataclass(frozen=True)
class AgentKind:
    """A registered checkpoint kind: ``make(ckpt, setup)`` builds one source's selector;
    ``versions``: the format versions it reads."""

    name: str
    make: Callable[..., Any]
    versions: tuple[int, ...]


KINDS: dict[str, AgentKind] = {}


def register_kind(name: str, make: Callable[..., Any], versions: Sequence[int] = (1,)) -> None:
    """Register a checkpoint kind (module docstring): ``make(ckpt, setup) -> selector``."""
    KINDS[name] = AgentKind(name, make, tuple(int(v) for v in versions))


def agent_kind(name: str, where: str = "") -> AgentKind:
    """The registered kind ``name`` (a built-in one imported on first use).

    Raises:
        CheckpointError: no such kind, naming ``where`` and the known kinds.
    """
    if name not in KINDS and name in BUILTIN_KINDS:
        importlib.import_module(BUILTIN_KINDS[name])
    if name not in KINDS:
        known = sorted(set(KINDS) | set(BUILTIN_KINDS))
        raise CheckpointError(f"{where}: kind {name!r} is not a known agent kind (known: {', '.join(known)})")
    return KINDS[name]


_CACHE: dict[tuple[str, int, int, int, int], Checkpoint] = {}


def _stat_key(npz: Path, meta: Path) -> tuple[str, int, int, int, int]:
    a, b = npz.stat(), meta.stat()
    return str(meta.resolve()), a.st_size, a.st_mtime_ns, b.st_size, b.st_mtime_ns


def read_checkpoint(path: str | Path) -> Checkpoint:
    """The checkpoint at ``path`` (without suffix, or with either one), its kind known to the
    registry and its version one the kind reads.

    Raises:
        CheckpointError: a file missing or not a regular file, a JSON that is not an object or has
            no ``kind`` (or legacy ``format``), an ``.npz`` cut short or corrupt, an unknown kind or
            version, no ``policies``; each naming the file.
    """
    npz, meta_file = checkpoint_files(path)
    for f in (npz, meta_file):
        if not f.is_file():
            what = "is not a regular file" if f.exists() else "is missing"
            raise CheckpointError(f"ASET checkpoint file {f} {what}")
    key = _stat_key(npz, meta_file)
    if key in _CACHE:
        return _CACHE[key]
    try:
        meta = json.loads(meta_file.read_bytes())
    except (OSError, ValueError) as exc:  # ValueError: JSONDecodeError, UnicodeDecodeError
        raise CheckpointError(f"ASET checkpoint file {meta_file} is unreadable or not JSON (cut short? export it "
                              f"again): {exc}") from None
    if not isinstance(meta, dict):
        raise CheckpointError(f"ASET checkpoint file {meta_file}: a JSON {type(meta).__name__}, not an object")
    kind, version = _kind_version(meta, meta_file)
    ak = agent_kind(kind, f"ASET checkpoint file {meta_file}")
    if version not in ak.versions:
        raise CheckpointError(f"ASET checkpoint file {meta_file}: {kind} version {version}, this testbed reads "
                              f"{', '.join(map(str, ak.versions))} (the features changed: retrain)")
    policies = meta.get("policies")
    if not isinstance(policies, list) or len(policies) < 2 or not all(isinstance(p, str) for p in policies):
        raise CheckpointError(f"ASET checkpoint file {meta_file}: no list of at least 2 policies (export it again)")
    try:
        with np.load(npz, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except (OSError, EOFError, ValueError, zipfile.BadZipFile, zlib.error) as exc:
        raise CheckpointError(f"ASET checkpoint file {npz} is not a readable numpy archive (cut short? export it "
                              f"again): {type(exc).__name__}: {exc}") from None
    features = meta.get("features")
    if not isinstance(features, dict):  # a legacy file: its observation spec and feature names at the top
        features = {k: meta[k] for k in ("observation", "local_features", "policy_features") if k in meta}
    ckpt = Checkpoint(npz.with_suffix(""), kind, version, tuple(policies), features,
                      dict(meta.get("provenance") or meta.get("meta") or {}), meta, arrays)
    _CACHE[key] = ckpt
    return ckpt


def _kind_version(meta: dict, meta_file: Path) -> tuple[str, int]:
    if "kind" in meta:
        kind, version = meta.get("kind"), meta.get("version")
        if not isinstance(kind, str) or not isinstance(version, int):
            raise CheckpointError(f"ASET checkpoint file {meta_file}: 'kind' must be a name and 'version' an integer")
        return kind, version
    fmt = meta.get("format")
    if fmt in LEGACY_FORMATS:
        return LEGACY_FORMATS[fmt]
    what = f"format {fmt!r}" if fmt is not None else "no 'kind'"
    raise CheckpointError(f"ASET checkpoint file {meta_file}: {what}; not a checkpoint this testbed reads "
                          f"(known kinds: {', '.join(sorted(set(KINDS) | set(BUILTIN_KINDS)))}); retrain")


def write_checkpoint(path: str | Path, *, kind: str, version: int, policies: Sequence[str],
                     features: Mapping[str, Any], arrays: Mapping[str, np.ndarray],
                     provenance: Mapping[str, Any] | None = None, **extra: Any) -> Path:
    """Write ``PATH.npz`` then ``PATH.json`` (module docstring; each replaced atomically);
    ``extra``: the kind's own JSON keys. Returns the path without suffix.

    Raises:
        ValueError: an unregistered kind, or a version the kind does not read.
    """
    ak = agent_kind(kind, f"export {path}")
    if version not in ak.versions:
        raise ValueError(f"export {path}: {kind} version {version}, the kind reads {ak.versions}")
    npz, meta_file = checkpoint_files(path)
    npz.parent.mkdir(parents=True, exist_ok=True)
    replace_atomic(npz, lambda tmp: _savez(tmp, arrays))
    doc = {"kind": kind, "version": int(version), "policies": list(policies), "features": dict(features),
           "provenance": dict(provenance or {}), **extra}
    text = json.dumps(doc, indent=1, default=_jsonable)
    replace_atomic(meta_file, lambda tmp: tmp.write_text(text))
    return npz.with_suffix("")


def _savez(tmp: Path, arrays: Mapping[str, np.ndarray]) -> None:
    with open(tmp, "wb") as f:  # a file object: numpy would append .npz to a name without it
        np.savez_compressed(f, **{k: np.asarray(v) for k, v in arrays.items()})


def _jsonable(x: Any) -> Any:
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    raise TypeError(f"{type(x).__name__} is not JSON")


def copy_checkpoint(src: str | Path, dst: str | Path) -> Path:
    """Copy a checkpoint's two files to ``dst`` (without suffix); returns ``dst``."""
    import shutil

    for a, b in zip(checkpoint_files(src), checkpoint_files(dst), strict=True):
        b.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(a, b)
    return checkpoint_files(dst)[0].with_suffix("")


__all__ = ["BUILTIN_KINDS", "LEGACY_FORMATS", "AgentKind", "Checkpoint", "CheckpointError", "SourceSetup", "agent_kind",
           "checkpoint_files", "checkpoint_path", "copy_checkpoint", "read_checkpoint", "register_kind",
           "write_checkpoint"]
