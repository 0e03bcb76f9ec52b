"""The model zoo on disk: manifest, payloads, service-time profiles, and the one inference code path.

Layout (written by ``models/build_zoo.py``; nothing here is downloaded)::

    models/zoo/manifest.json          {"recipe_version", "family": "digits", "input_shape": [32, 32, 1],
                                       "classes": 10, "variants": {name: {"path", "accuracy",
                                       "accuracy_source", "params", ...}}}
    models/zoo/payloads.npz           x: float32 [N, 32, 32, 1] in [0, 1]; y: int64 [N] (held-out split)
    models/zoo/<variant>/             TensorFlow SavedModel, signature "serving_default":
                                      x: float32 [None, 32, 32, 1] -> probabilities: float32 [None, 10]
    models/profiles/<variant>.json    single-query service time t_m [ms] on 1 core (mean/p50/p95/p99)

The functions that only read JSON / NumPy files never import TensorFlow (it costs ~4 s and ~525 MB
per process). :class:`ZooModel` does, and is the exact call the inference server makes per query
(``ZooModel.predict``); the build script profiles that same call, so a profile's ``t_m`` is what
the server's T3 - T2 measures, minus contention.

Errors: every missing or malformed file raises :class:`ZooError` (``ZooFileMissing`` for a missing
file, a ``FileNotFoundError`` too) whose message names the variant and the path, and how to fix it.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

#: Input of every variant: one grey-scale 32x32 image, float32 in [0, 1] (height, width, channels).
INPUT_SHAPE: tuple[int, int, int] = (32, 32, 1)
#: Number of classes (digits 0-9); every variant answers a probability per class.
NUM_CLASSES: int = 10
#: SavedModel signature the server calls, and its input / output tensor names.
SIGNATURE_KEY = "serving_default"
INPUT_NAME = "x"
OUTPUT_NAME = "probabilities"

MANIFEST = "manifest.json"
PAYLOADS = "payloads.npz"
#: The build script, relative to the repository root (this file is testbed/inference/zoo.py).
BUILD_SCRIPT = Path(__file__).resolve().parents[2] / "models" / "build_zoo.py"


class ZooError(RuntimeError):
    """The zoo is missing, incomplete or malformed; the message names the file or variant."""


class ZooFileMissing(ZooError, FileNotFoundError):
    """A file or directory of the zoo (or of the profiles) does not exist."""


def _read_json(path: Path, what: str) -> dict[str, Any]:
    if not path.is_file():
        raise ZooFileMissing(f"{what}: {path} does not exist (build it: python models/build_zoo.py)")
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ZooError(f"{what}: {path} is not valid JSON ({exc}); rebuild with --force") from exc
    if not isinstance(data, dict):
        raise ZooError(f"{what}: {path} must hold a JSON object, got {type(data).__name__}")
    return data


def load_manifest(zoo_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and check ``<zoo_dir>/manifest.json``.

    Returns the manifest dict (keys ``recipe_version``, ``family``, ``input_shape``, ``classes``,
    ``variants``; each variant has ``path`` (relative to ``zoo_dir``), ``accuracy`` (top-1 in
    [0, 1], measured on the held-out split), ``accuracy_source`` and ``params``).

    Raises:
        ZooFileMissing: the manifest does not exist.
        ZooError: it is not JSON, or lacks a key, or a variant lacks ``path`` / ``accuracy``.
    """
    path = Path(zoo_dir) / MANIFEST
    data = _read_json(path, "zoo manifest")
    for key in ("recipe_version", "family", "input_shape", "classes", "variants"):
        if key not in data:
            raise ZooError(f"zoo manifest {path} has no {key!r}; rebuild with --force")
    if not isinstance(data["variants"], dict) or not data["variants"]:
        raise ZooError(f"zoo manifest {path}: 'variants' must be a non-empty object")
    for name, v in data["variants"].items():
        for key in ("path", "accuracy", "accuracy_source", "params"):
            if not isinstance(v, dict) or key not in v:
                raise ZooError(f"zoo manifest {path}: variant {name!r} has no {key!r}")
    return data


def variant_dir(zoo_dir: str | os.PathLike[str], name: str, manifest: dict[str, Any] | None = None) -> Path:
    """Directory of variant ``name``'s SavedModel.

    Raises:
        ZooError: ``name`` is not in the manifest (the message lists the known variants).
        ZooFileMissing: the manifest or the variant's SavedModel (``saved_model.pb``) is missing.
    """
    manifest = manifest if manifest is not None else load_manifest(zoo_dir)
    variants = manifest["variants"]
    if name not in variants:
        raise ZooError(f"unknown model variant {name!r} in zoo {zoo_dir} (known: {', '.join(sorted(variants))})")
    path = Path(zoo_dir) / variants[name]["path"]
    if not (path / "saved_model.pb").is_file():
        raise ZooFileMissing(f"variant {name!r}: no SavedModel at {path} (rebuild: python models/build_zoo.py "
                             "--force)")
    return path


def load_payloads(zoo_dir: str | os.PathLike[str]) -> tuple[np.ndarray, np.ndarray]:
    """The held-out images and labels: ``x`` float32 [N, 32, 32, 1] in [0, 1], ``y`` int64 [N] in 0..9.

    These are the real queries the workload sends (sklearn's digits, never seen in training).

    Raises:
        ZooFileMissing: ``<zoo_dir>/payloads.npz`` does not exist.
        ZooError: it lacks ``x`` / ``y`` or their shapes disagree.
    """
    path = Path(zoo_dir) / PAYLOADS
    if not path.is_file():
        raise ZooFileMissing(f"zoo payloads: {path} does not exist (build it: python models/build_zoo.py)")
    try:
        with np.load(path) as data:
            x, y = data["x"], data["y"]
    except (OSError, ValueError, KeyError) as exc:
        raise ZooError(f"zoo payloads {path}: cannot read arrays 'x' and 'y' ({exc})") from exc
    if x.ndim != 4 or tuple(x.shape[1:]) != INPUT_SHAPE or y.shape != (x.shape[0],):
        raise ZooError(f"zoo payloads {path}: x {x.shape} / y {y.shape}, expected [N, 32, 32, 1] / [N]")
    return x.astype(np.float32, copy=False), y.astype(np.int64, copy=False)


def request_bodies(zoo_dir: str | os.PathLike[str], family: str, n: int = 128) -> tuple[list[bytes], list[int]]:
    """Ready-to-send TensorFlow Serving REST bodies for application family ``family``.

    Returns ``(bodies, labels)``: up to ``n`` JSON bodies ``{"instances": [<one input>]}`` (bytes)
    built from the held-out payloads, and each one's true label. Built once per source so that
    serialising a query costs nothing on the measured path.

    Raises:
        ZooError: ``family`` is not in the zoo, or its payloads are missing / malformed.
    """
    manifest = load_manifest(zoo_dir)
    if family != manifest["family"]:
        raise ZooError(f"family {family!r} is not in the zoo {zoo_dir} (has {manifest['family']!r})")
    x, y = load_payloads(zoo_dir)
    k = min(len(x), n)
    bodies = [json.dumps({"instances": [np.round(x[i], 4).tolist()]}).encode() for i in range(k)]
    return bodies, [int(v) for v in y[:k]]


def load_profile(profiles_dir: str | os.PathLike[str], variant: str) -> dict[str, Any]:
    """Read ``<profiles_dir>/<variant>.json``: the variant's measured single-query service time.

    Keys: ``variant``, ``cpu_cores``, ``batch_size``, ``samples``, ``mean_ms``, ``p50_ms``, ``p95_ms``,
    ``p99_ms`` (milliseconds of ``ZooModel.predict`` on one image with 1 intra-op thread, after
    warm-up), ``machine``, ``measured_at``.

    Raises:
        ZooFileMissing: no profile for ``variant``.
        ZooError: the file is not JSON or lacks a timing key.
    """
    path = Path(profiles_dir) / f"{variant}.json"
    data = _read_json(path, f"service-time profile of variant {variant!r}")
    for key in ("mean_ms", "p50_ms", "p95_ms", "p99_ms", "cpu_cores", "batch_size"):
        if key not in data:
            raise ZooError(f"profile {path} of variant {variant!r} has no {key!r}; rebuild with --force")
    return data


def zoo_complete(zoo_dir: str | os.PathLike[str]) -> bool:
    """True iff the manifest, the payloads and every listed SavedModel exist (no TensorFlow needed)."""
    try:
        manifest = load_manifest(zoo_dir)
        for name in manifest["variants"]:
            variant_dir(zoo_dir, name, manifest)
    except ZooError:
        return False
    return (Path(zoo_dir) / PAYLOADS).is_file()


def ensure_zoo(zoo_dir: str | os.PathLike[str] = "models/zoo", profiles_dir: str | os.PathLike[str] | None = None,
               timeout_s: float = 600.0) -> dict[str, Any]:
    """Return the zoo's manifest, building the zoo (and its profiles) first if missing or stale.

    Runs ``models/build_zoo.py --out zoo_dir --profiles profiles_dir`` in a subprocess (so this
    process does not pay TensorFlow's import). The script is idempotent and knows the recipe
    version: on an up-to-date zoo it returns in well under a second without importing TensorFlow;
    it rebuilds a missing or older-recipe zoo (~1 min) and re-profiles missing profiles.
    ``profiles_dir`` defaults to ``<zoo_dir>/../profiles`` (the script's default). Without the build
    script (an installed copy of the package), the zoo and profiles must already be complete.

    Raises:
        ZooFileMissing: no build script and the zoo or a profile is missing.
        ZooError: the build fails or times out (its output is in the message).
    """
    profiles = Path(profiles_dir) if profiles_dir is not None else Path(zoo_dir).resolve().parent / "profiles"
    if not BUILD_SCRIPT.is_file():
        manifest = load_manifest(zoo_dir)
        if not zoo_complete(zoo_dir):
            raise ZooFileMissing(f"zoo {zoo_dir} is incomplete and the build script {BUILD_SCRIPT} is not there")
        for name in manifest["variants"]:
            load_profile(profiles, name)
        return manifest
    cmd = [sys.executable, str(BUILD_SCRIPT), "--out", str(zoo_dir), "--profiles", str(profiles)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as exc:
        raise ZooError(f"building the zoo ({' '.join(cmd)}) took more than {timeout_s:.0f} s") from exc
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr)[-3000:]
        raise ZooError(f"building the zoo failed (exit {proc.returncode}): {' '.join(cmd)}\n{tail}")
    return load_manifest(zoo_dir)


def configure_tf_threads(intra_op: int = 1, inter_op: int = 1) -> None:
    """Set TensorFlow's thread pools (intra-op: threads inside one op; inter-op: ops in parallel).

    Must run before TensorFlow executes anything in this process.

    Raises:
        ZooError: TensorFlow was already initialised (the pools can no longer change).
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    try:
        tf.config.threading.set_intra_op_parallelism_threads(int(intra_op))
        tf.config.threading.set_inter_op_parallelism_threads(int(inter_op))
    except RuntimeError as exc:
        raise ZooError(f"cannot set TensorFlow threads to intra={intra_op} inter={inter_op}: {exc}") from exc


class ZooModel:
    """One loaded variant: the SavedModel's ``serving_default`` signature, called directly.

    ``model.predict`` through Keras costs ~3x more per query; the signature's concrete function
    does not. Thread-safe: several server workers may call :meth:`predict` at once.
    """

    def __init__(self, zoo_dir: str | os.PathLike[str], name: str, manifest: dict[str, Any] | None = None):
        """Load variant ``name`` from ``zoo_dir``.

        Raises:
            ZooError / ZooFileMissing: unknown variant, missing SavedModel, or no ``serving_default``
                signature with input ``x`` [None, 32, 32, 1] and output ``probabilities``.
        """
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        import tensorflow as tf

        self._tf = tf
        manifest = manifest if manifest is not None else load_manifest(zoo_dir)
        self.name = name
        self.path = variant_dir(zoo_dir, name, manifest)
        self.info: dict[str, Any] = dict(manifest["variants"][name])
        self._loaded = tf.saved_model.load(str(self.path))  # keeps the variables alive
        sigs = self._loaded.signatures
        if SIGNATURE_KEY not in sigs:
            raise ZooError(f"variant {name!r} at {self.path} has no {SIGNATURE_KEY!r} signature "
                           f"(has: {', '.join(sigs) or 'none'})")
        self._fn = sigs[SIGNATURE_KEY]
        spec = self._fn.structured_input_signature[1].get(INPUT_NAME)
        if spec is None or spec.shape.as_list() != [None, *INPUT_SHAPE]:
            raise ZooError(f"variant {name!r}: signature input {INPUT_NAME!r} is {spec}, expected "
                           f"float32 [None, {', '.join(map(str, INPUT_SHAPE))}]")
        if OUTPUT_NAME not in self._fn.structured_outputs:
            raise ZooError(f"variant {name!r}: signature has no output {OUTPUT_NAME!r}")

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Class probabilities float32 [N, 10] (rows sum to 1) for images ``x`` float32 [N, 32, 32, 1].

        This is the whole per-query inference step of the server (T2..T3).
        """
        out = self._fn(x=self._tf.constant(np.asarray(x, dtype=np.float32)))
        return out[OUTPUT_NAME].numpy()

    def warm_up(self, x: np.ndarray, calls: int = 20) -> float:
        """Run ``calls`` single-image predictions on ``x[i % N]``; return their total wall time [ms].

        The first calls build TensorFlow's kernels and caches; measured times exclude them.
        """
        t = time.perf_counter()
        for i in range(calls):
            self.predict(x[i % len(x)][None])
        return (time.perf_counter() - t) * 1e3


def service_time_profile(model: ZooModel, x: np.ndarray, samples: int = 300, warmup: int = 50) -> dict[str, Any]:
    """Measure single-query (batch 1) service time of ``model.predict`` on real images ``x``.

    ``warmup`` calls first (not recorded), then ``samples`` calls, each timed with
    ``time.perf_counter``. Call it in a process whose TensorFlow runs 1 intra-op and 1 inter-op
    thread (:func:`configure_tf_threads`) to get the 1-core figure. Returns the profile fields
    (milliseconds) without ``variant`` / ``measured_at``.
    """
    model.warm_up(x, warmup)
    times = np.empty(samples)
    for i in range(samples):
        img = x[i % len(x)][None]
        t = time.perf_counter()
        model.predict(img)
        times[i] = time.perf_counter() - t
    ms = times * 1e3
    return {"cpu_cores": 1.0, "batch_size": 1, "samples": int(samples), "warmup_calls": int(warmup),
            "mean_ms": round(float(ms.mean()), 4), "p50_ms": round(float(np.percentile(ms, 50)), 4),
            "p95_ms": round(float(np.percentile(ms, 95)), 4), "p99_ms": round(float(np.percentile(ms, 99)), 4),
            "method": "ZooModel.predict (SavedModel serving_default signature), 1 intra-op + 1 inter-op "
                      "thread, sequential calls after warm-up"}


def machine_info() -> dict[str, Any]:
    """CPU model, logical cores, Python and TensorFlow versions of this machine (for profiles)."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info: dict[str, Any] = {"cpu_model": cpu, "cores": os.cpu_count(), "python": platform.python_version()}
    if "tensorflow" in sys.modules:
        info["tensorflow"] = sys.modules["tensorflow"].__version__
    return info
