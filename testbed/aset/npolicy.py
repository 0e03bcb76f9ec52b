"""The deployable ASET policy: exported weights (``.npz`` + ``.json``) and a numpy forward pass.

No TensorFlow here: the emulation's source processes and ``testbed evaluate`` load the policy
without the 3-4 s / ~500 MB TensorFlow import. :func:`export_policy` writes ``NAME.npz`` (the
online Q-network's Dense weights W0, b0, W1, b1, ...) and ``NAME.json`` (the observation spec,
applications, clusters and catalogue order); :class:`NumpyPolicy` computes the greedy action with
one matmul + ReLU per layer (no ``model.predict``).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from testbed.aset.config import ObservationSpec

#: Format of the exported JSON; v2 = the observation of issue 13 (measured latency, report age,
#: in-flight per cluster). A v1 file cannot drive this observation: retrain.
FORMAT = "aset-policy-v2"


def export_policy(weights: list[np.ndarray], path: str | Path, *, obs_spec: ObservationSpec,
                  applications: list[str], clusters: list[str], policies: list[str], meta: dict | None = None,
                  deadlines_ms: list[float] | None = None) -> Path:
    """Write the deployable policy: ``PATH.npz`` (W0, b0, W1, b1, ...) and ``PATH.json``.

    The JSON carries everything :class:`NumpyPolicy` and the live selector need to rebuild the same
    observation: ``observation`` (the spec), ``applications`` and ``clusters`` (feature order),
    ``policies`` (action order), ``deadlines_ms`` (per application, for the measured-latency
    feature), ``layers`` and free-form ``meta``. Returns the .npz path.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path.with_suffix(".npz"), **{f"w{i}": w for i, w in enumerate(weights)})
    path.with_suffix(".json").write_text(json.dumps({
        "format": FORMAT, "observation": obs_spec.model_dump(), "applications": list(applications),
        "clusters": list(clusters), "policies": list(policies), "deadlines_ms": list(deadlines_ms or []),
        "layers": len(weights) // 2,
        "meta": meta or {}}, indent=2))
    return path.with_suffix(".npz")


def copy_policy(src: str | Path, dst: str | Path) -> Path:
    """Copy an exported policy (``src.npz`` + ``src.json``) to ``dst``; returns the .npz path."""
    import shutil

    src, dst = Path(src), Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    for suffix in (".npz", ".json"):
        shutil.copyfile(src.with_suffix(suffix), dst.with_suffix(suffix))
    return dst.with_suffix(".npz")


class NumpyPolicy:
    """Greedy policy from exported weights: ReLU MLP forward pass in numpy (float32).

    Raises:
        FileNotFoundError: ``PATH.npz`` or ``PATH.json`` is missing.
        ValueError: the files do not match (layer count or shapes).
    """

    def __init__(self, path: str | Path):
        path = Path(path)
        npz, meta = path.with_suffix(".npz"), path.with_suffix(".json")
        for f in (npz, meta):
            if not f.is_file():
                raise FileNotFoundError(f"ASET checkpoint file {f} is missing")
        self.meta = json.loads(meta.read_text())
        if self.meta.get("format") != FORMAT:
            raise ValueError(f"{meta}: format {self.meta.get('format')!r}, this testbed reads {FORMAT!r} "
                             f"(the observation changed; retrain with testbed train)")
        with np.load(npz) as data:
            ws = [data[f"w{i}"].astype(np.float32) for i in range(len(data.files))]
        if len(ws) != 2 * self.meta["layers"] or len(ws) < 2:
            raise ValueError(f"{npz}: {len(ws)} arrays for {self.meta['layers']} layers")
        self.layers = list(zip(ws[0::2], ws[1::2], strict=True))
        if self.layers[-1][0].shape[1] != len(self.meta["policies"]):
            raise ValueError(f"{npz}: output width {self.layers[-1][0].shape[1]} != "
                             f"{len(self.meta['policies'])} policies in {meta}")
        self.obs_spec = ObservationSpec.model_validate(self.meta["observation"])
        self.obs_size = self.layers[0][0].shape[0]

    @classmethod
    def from_weights(cls, weights: list[np.ndarray], obs_spec: ObservationSpec) -> NumpyPolicy:
        """A policy from in-memory weights (W0, b0, W1, b1, ...), e.g. for rollout workers."""
        self = cls.__new__(cls)
        ws = [np.asarray(w, np.float32) for w in weights]
        self.layers = list(zip(ws[0::2], ws[1::2], strict=True))
        self.meta = {"layers": len(self.layers)}
        self.obs_spec = obs_spec
        self.obs_size = self.layers[0][0].shape[0]
        return self

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        """Q-values, shape (batch, n_actions), for observations (batch, obs_size) or (obs_size,)."""
        x = np.atleast_2d(np.asarray(obs, np.float32))
        for i, (w, b) in enumerate(self.layers):
            x = x @ w + b
            if i < len(self.layers) - 1:
                np.maximum(x, 0.0, out=x)
        return x

    def act(self, obs: np.ndarray) -> np.ndarray:
        """Greedy actions, shape (batch,)."""
        return np.argmax(self.q_values(obs), axis=1)
