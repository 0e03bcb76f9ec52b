"""The deployable ASET policy: exported weights (``.npz`` + ``.json``) and a numpy forward pass.

No TensorFlow here: the emulation's source processes and ``testbed evaluate`` load the policy
without the 3-4 s / ~500 MB TensorFlow import. :func:`export_policy` writes ``NAME.npz`` (the
online Q-network's Dense weights W0, b0, W1, b1, ...) and ``NAME.json`` (the observation spec,
applications, clusters, sources and catalogue order); :class:`NumpyPolicy` computes the greedy
action with one matmul + ReLU per layer (no ``model.predict``).

The observation size is part of the checkpoint (the first layer's input width, and ``obs_size`` in
the JSON); every user checks it against the observation it builds
(:meth:`NumpyPolicy.check_size`, :meth:`NumpyPolicy.check_contexts`) and fails with
:class:`ObservationSizeError` naming both sizes, never with a numpy shape error.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from testbed.agent.observation import SourceContext, context_size, observation_size
from testbed.core.errors import InputError, counted
from testbed.spec.aset import ObservationSpec

#: Format of the exported JSON; v3 = v2 + the source-identity one-hot (and ``sources``,
#: ``obs_size`` in the JSON); v2 = the observation with measured latency, report age and
#: in-flight queries per cluster. v1 files are refused; v2 files open, so that the size check can say
#: what changed, but cannot drive this observation: retrain.
FORMAT = "aset-policy-v3"
#: Older formats :class:`NumpyPolicy` opens (for the size error), with what their observation lacks.
OLDER_FORMATS = {"aset-policy-v2": "no source identity"}


def policy_files(path: str | Path) -> tuple[Path, Path]:
    """The two files of an exported policy, ``(NAME.npz, NAME.json)``. A path given with either
    suffix names the same pair; any other dot belongs to the name (``aset-v1.2`` ->
    ``aset-v1.2.npz``, where ``Path.with_suffix`` would give ``aset-v1.npz``)."""
    p = Path(path)
    if p.suffix in (".npz", ".json"):
        p = p.with_suffix("")
    return p.with_name(p.name + ".npz"), p.with_name(p.name + ".json")


#: What :class:`NumpyPolicy` reads from a policy's JSON besides ``format``.
META_KEYS = ("layers", "policies", "observation")


def _read_meta(path: Path) -> dict:
    """The policy JSON as a dict.

    Raises:
        ValueError: unreadable, not JSON (a cut file) or not an object, naming ``path`` and what is wrong.
    """
    try:
        meta = json.loads(path.read_bytes())
    except (OSError, ValueError) as exc:  # ValueError: JSONDecodeError, UnicodeDecodeError
        raise ValueError(f"ASET checkpoint file {path} is unreadable or not JSON (cut short? export the policy "
                         f"again): {exc}") from None
    if not isinstance(meta, dict):
        raise ValueError(f"ASET checkpoint file {path}: a JSON {type(meta).__name__}, not an object")
    return meta


def _read_weights(path: Path) -> list[np.ndarray]:
    """The arrays ``w0, w1, ...`` of a policy's ``.npz``, as float32.

    Raises:
        ValueError: not a readable numpy archive (a cut or corrupt file), or its arrays are not
            named ``w0`` .. ``w<n-1>``, naming ``path`` and what is wrong.
    """
    import zipfile
    import zlib

    try:
        with np.load(path, allow_pickle=False) as data:
            names = sorted(data.files)
            expected = sorted(f"w{i}" for i in range(len(names)))
            if names != expected:
                raise ValueError(f"ASET checkpoint file {path}: arrays {', '.join(names) or 'none'}, expected "
                                 f"{', '.join(expected) or 'w0, w1, ...'}")
            return [data[f"w{i}"].astype(np.float32) for i in range(len(names))]
    except (OSError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
        raise ValueError(f"ASET checkpoint file {path} is not a readable numpy archive (cut short? export the "
                         f"policy again): {type(exc).__name__}: {exc}") from None
    except ValueError as exc:
        if str(path) in str(exc):
            raise
        raise ValueError(f"ASET checkpoint file {path} is not a readable numpy archive (export the policy "
                         f"again): {exc}") from None


def application_names_problem(where: str, applications, trained) -> str | None:
    """What keeps a plan-based checkpoint trained on the applications ``trained`` (feature order)
    from observing ``applications``, or None: ONE message for the live selector (a source's
    applications must all be known to it) and for ``testbed evaluate`` (an experiment's must be
    exactly them: its observation places each application's features by position)."""
    unknown = sorted(set(applications) - set(trained))
    if unknown:
        return f"{where}: applications {unknown} unknown to the checkpoint (trained on {list(trained)})"
    return None


class ObservationSizeError(InputError):
    """A checkpoint's network input width differs from the observation built for it."""


def plan_scores(q, obs, margin: float, n_actions: int):
    """The scores the greedy decision maximises: ``q + margin * plan``, ``plan`` being the
    observation's last ``n_actions`` features (the planned-policy one-hot of
    :mod:`testbed.agent.observation`); ``q`` itself when ``margin`` is 0 (no plan block needed).

    ONE rule for the agent's acting and its double-DQN target (TensorFlow tensors) and for the
    exported policy (numpy arrays): shapes (batch, n_actions) and (batch, obs_size).
    """
    if not margin:
        return q
    return q + margin * obs[:, -n_actions:]


def export_policy(weights: list[np.ndarray], path: str | Path, *, obs_spec: ObservationSpec,
                  applications: list[str], clusters: list[str], policies: list[str], sources: list[str],
                  meta: dict | None = None, deadlines_ms: list[float] | None = None,
                  plan_margin: float = 0.0) -> Path:
    """Write the deployable policy: ``PATH.npz`` (W0, b0, W1, b1, ...) and ``PATH.json``.

    The JSON carries everything :class:`NumpyPolicy` and the live selector need to rebuild the same
    observation: ``observation`` (the spec), ``applications`` and ``clusters`` (feature order),
    ``sources`` (source-id order), ``policies`` (action order), ``deadlines_ms`` (per application,
    for the measured-latency feature), ``obs_size``, ``layers``, ``plan_margin`` (the decision
    rule, :func:`plan_scores`) and free-form ``meta``. Returns the .npz path.

    Raises:
        ObservationSizeError: the weights' input width is not the observation size of these names.
    """
    size = observation_size(len(applications), len(clusters), len(policies), obs_spec.history_windows, len(sources),
                            obs_spec.plans is not None)
    if np.shape(weights[0])[0] != size:
        raise ObservationSizeError(f"export {path}: network input {np.shape(weights[0])[0]} != observation size "
                                   f"{size} of {counted(len(sources), 'source')}, "
                                   f"{counted(len(applications), 'application')}, {counted(len(clusters), 'cluster')}, "
                                   f"{counted(len(policies), 'policy', 'policies')}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    npz, meta_file = policy_files(path)
    np.savez(npz, **{f"w{i}": w for i, w in enumerate(weights)})
    meta_file.write_text(json.dumps({
        "format": FORMAT, "observation": obs_spec.model_dump(), "applications": list(applications),
        "clusters": list(clusters), "sources": list(sources), "policies": list(policies),
        "deadlines_ms": list(deadlines_ms or []), "obs_size": size, "layers": len(weights) // 2,
        "plan_margin": float(plan_margin), "meta": meta or {}}, indent=2))
    return npz


def copy_policy(src: str | Path, dst: str | Path) -> Path:
    """Copy an exported policy (``src.npz`` + ``src.json``) to ``dst``; returns the .npz path."""
    import shutil

    src, dst = Path(src), Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    for a, b in zip(policy_files(src), policy_files(dst), strict=True):
        shutil.copyfile(a, b)
    return policy_files(dst)[0]


class NumpyPolicy:
    """Greedy policy from exported weights: ReLU MLP forward pass in numpy (float32).

    ``obs_size``: the network's input width; ``sources``: the source-id order (empty for an
    older format, whose observation has no source identity: :meth:`check_size` then refuses it).

    Raises:
        FileNotFoundError: ``PATH.npz`` or ``PATH.json`` is missing, or is not a regular file.
        ValueError: a file that cannot be read (a cut ``.npz`` or ``.json``, a JSON without
            :data:`META_KEYS`), naming it; unknown format, or the files do not match (layer count or shapes);
            :class:`ObservationSizeError` when the JSON's observation size is not the network's.
    """

    def __init__(self, path: str | Path):
        path = Path(path)
        self.path = path
        npz, meta = policy_files(path)
        for f in (npz, meta):
            if f.exists() and not f.is_file():  # a folder, a device, a FIFO (reading one could block)
                raise FileNotFoundError(f"ASET checkpoint file {f} is not a regular file")
            if not f.is_file():
                raise FileNotFoundError(f"ASET checkpoint file {f} is missing")
        self.meta = _read_meta(meta)
        self.format = self.meta.get("format")
        if self.format != FORMAT and self.format not in OLDER_FORMATS:
            raise ValueError(f"{meta}: format {self.format!r}, this testbed reads {FORMAT!r} "
                             f"(the observation changed; retrain with testbed train)")
        missing = [k for k in META_KEYS if k not in self.meta]
        if missing:
            raise ValueError(f"{meta}: no {', '.join(missing)} (an incomplete export: export the policy again)")
        ws = _read_weights(npz)
        if len(ws) != 2 * self.meta["layers"] or len(ws) < 2:
            raise ValueError(f"{npz}: {len(ws)} arrays for {self.meta['layers']} layers")
        self.layers = list(zip(ws[0::2], ws[1::2], strict=True))
        if self.layers[-1][0].shape[1] != len(self.meta["policies"]):
            raise ValueError(f"{npz}: output width {self.layers[-1][0].shape[1]} != "
                             f"{counted(len(self.meta['policies']), 'policy', 'policies')} in {meta}")
        self.obs_spec = ObservationSpec.model_validate(self.meta["observation"])
        self.obs_size = self.layers[0][0].shape[0]
        self.sources = tuple(self.meta.get("sources") or ())
        self.plan_margin = float(self.meta.get("plan_margin") or 0.0)
        if self.plan_margin and self.obs_spec.plans is None:
            raise ValueError(f"{meta}: plan_margin {self.plan_margin:g} without observation plans")
        if self.format == FORMAT:
            m = self.meta
            size = observation_size(len(m["applications"]), len(m["clusters"]), len(m["policies"]),
                                    self.obs_spec.history_windows, len(self.sources), self.obs_spec.plans is not None)
            if size != self.obs_size or m.get("obs_size", size) != size:
                raise ObservationSizeError(f"{npz}: network input {self.obs_size} features, but {meta} describes "
                                           f"an observation of {size} (obs_size {m.get('obs_size')})")

    @classmethod
    def from_weights(cls, weights: list[np.ndarray], obs_spec: ObservationSpec,
                     plan_margin: float = 0.0) -> NumpyPolicy:
        """A policy from in-memory weights (W0, b0, W1, b1, ...), e.g. for rollout workers;
        ``plan_margin`` as the agent's (:func:`plan_scores`)."""
        self = cls.__new__(cls)
        ws = [np.asarray(w, np.float32) for w in weights]
        self.layers = list(zip(ws[0::2], ws[1::2], strict=True))
        self.meta = {"layers": len(self.layers)}
        self.path, self.format, self.sources = Path("<weights>"), FORMAT, ()
        self.obs_spec = obs_spec
        self.obs_size = self.layers[0][0].shape[0]
        self.plan_margin = float(plan_margin)
        return self

    def check_size(self, size: int, what: str) -> None:
        """Refuse an observation of ``size`` features (built by ``what``) that is not the network's.

        Raises:
            ObservationSizeError: naming both sizes (and, for an older format, what it lacks).
        """
        if size != self.obs_size:
            old = f", format {self.format}: {OLDER_FORMATS[self.format]}" if self.format in OLDER_FORMATS else ""
            raise ObservationSizeError(f"ASET checkpoint {self.path}: its network takes observations of "
                                       f"{self.obs_size} features{old}; {what} builds {size}: retrain with "
                                       f"testbed train (docs/aset.md)")

    def check_contexts(self, contexts: Sequence[SourceContext], what: str) -> None:
        """Refuse contexts (one per source, e.g. an env's) that this policy cannot drive: other
        applications (named as the live selector names them, :func:`application_names_problem`),
        clusters or sources (the source-id order) than the checkpoint's, or another observation size.

        Raises:
            ValueError: the names differ (the message names both lists); ObservationSizeError.
        """
        ctx = contexts[0]
        if "applications" in self.meta:
            trained = list(self.meta["applications"])
            problem = application_names_problem(what, ctx.applications, trained)
            if problem is None and list(ctx.applications) != trained:
                problem = (f"{what}: applications {list(ctx.applications)} are not the checkpoint's {trained} (its "
                           f"observation places them by position)")
            if problem:
                raise ValueError(f"{problem} ({self.path})")
        if "clusters" in self.meta and list(ctx.clusters) != list(self.meta["clusters"]):
            raise ValueError(f"{what}: clusters {list(ctx.clusters)} differ from the checkpoint's "
                             f"{self.meta['clusters']} ({self.path})")
        if self.sources and list(ctx.sources) != list(self.sources):
            raise ValueError(f"{what}: sources {list(ctx.sources)} differ from the checkpoint's {list(self.sources)} "
                             f"({self.path}; the source identity is a one-hot in this order)")
        self.check_size(context_size(ctx, self.obs_spec), what)

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        """Q-values, shape (batch, n_actions), for observations (batch, obs_size) or (obs_size,)."""
        x = np.atleast_2d(np.asarray(obs, np.float32))
        for i, (w, b) in enumerate(self.layers):
            x = x @ w + b
            if i < len(self.layers) - 1:
                np.maximum(x, 0.0, out=x)
        return x

    def act(self, obs: np.ndarray) -> np.ndarray:
        """Greedy actions, shape (batch,): the argmax of :func:`plan_scores` (the plain Q-values
        for a checkpoint without a plan margin)."""
        x = np.atleast_2d(np.asarray(obs, np.float32))
        q = self.q_values(x)
        return np.argmax(plan_scores(q, x, self.plan_margin, q.shape[1]), axis=1)
