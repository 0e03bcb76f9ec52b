"""The model zoo on disk: manifest, payloads, service-time profiles, and the inference code paths.

Layout (written by ``models/build_zoo.py``; nothing here is downloaded)::

    models/zoo/manifest.json          {"recipe_version", "families": {family: {"input_shape", "classes",
                                       "payloads", "dataset", ...}}, "variants": {name: {"family", "path",
                                       "tflite", "accuracy", "accuracy_source", "params", ...}},
                                       "family"/"input_shape"/"classes": the default family "digits"}
    models/zoo/payloads/<family>.npz  x: float32 [N, *input_shape]; y: int64 [N] (held-out split)
    models/zoo/payloads.npz           the same for "digits" (kept for older readers)
    models/zoo/<variant>/             TensorFlow SavedModel, signature "serving_default":
                                      x: float32 [None, *input_shape] -> probabilities: float32 [None, classes]
    models/zoo/<variant>.tflite       the same model converted for LiteRT (float32, no quantisation)
    models/zoo/mediapipe/*.tflite     trained MediaPipe models (LiteRT only; no SavedModel: ``path`` null),
                                      sha256-checked at every load (:mod:`testbed.serve.graphs`)
    models/profiles/<variant>.json    measured service times (see testbed.serve.profiles)

The functions that only read JSON / NumPy files never import TensorFlow (it costs ~4 s and ~525 MB
per process). :class:`ZooModel` (TensorFlow) and :class:`LiteRTModel` (``ai-edge-litert``) do; both
expose the same ``predict(x) -> probabilities`` call, the whole per-query inference step of the
server, and the profiler times that same call.

Image families (``hands``, ``faces``, ``imagenet``; ``"wire": "jpeg_b64"`` in the manifest) store
their payloads as uint8 frames plus the JPEG bytes a camera app sends; :func:`load_payloads` gives
them as float32 RGB in [0, 1] and :func:`request_bodies` as ``{"instances": [{"b64": JPEG}]}``.

Errors: every missing or malformed file raises :class:`ZooError` (``ZooFileMissing`` for a missing
file, a ``FileNotFoundError`` too) whose message names the variant / family and the path.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from testbed.core.errors import InputError

#: Input of the default family "digits": one grey-scale 32x32 image, float32 in [0, 1] (H, W, C).
INPUT_SHAPE: tuple[int, ...] = (32, 32, 1)
#: Classes of the default family "digits" (0-9).
NUM_CLASSES: int = 10
DEFAULT_FAMILY = "digits"
#: SavedModel signature the server calls, and its input / output tensor names (every variant).
SIGNATURE_KEY = "serving_default"
INPUT_NAME = "x"
OUTPUT_NAME = "probabilities"
RUNTIMES = ("tensorflow", "litert")

MANIFEST = "manifest.json"
PAYLOADS = "payloads.npz"
PAYLOADS_DIR = "payloads"
#: The build script, relative to the repository root (this file is testbed/serve/zoo.py).
BUILD_SCRIPT = Path(__file__).resolve().parents[2] / "models" / "build_zoo.py"


class ZooError(InputError, RuntimeError):
    """The zoo is missing, incomplete or malformed; the message names the file or variant."""


class ZooFileMissing(ZooError, FileNotFoundError):
    """A file or directory of the zoo (or of the profiles) does not exist."""


class NamedOutputs(dict):
    """Named output arrays of one model call (TF Serving's multi-output shape), each [N, ...].

    Indexing with a slice slices every array (``out[i:j]``: the outputs of inputs i..j-1), which
    is how the server's scheduler splits a batched call among its queries; a string key gives one
    array as usual.
    """

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, slice):
            return NamedOutputs({k: v[key] for k, v in self.items()})
        return super().__getitem__(key)


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

    Returns the manifest dict: ``recipe_version``, ``families`` (family -> ``input_shape``,
    ``classes``, ``payloads``, ``dataset``), ``variants`` (name -> ``family``, ``path`` (SavedModel
    dir relative to ``zoo_dir``), ``tflite``, ``accuracy`` (top-1 in [0, 1]), ``accuracy_source``,
    ``params``), and for older readers ``family`` / ``input_shape`` / ``classes`` of "digits".
    A manifest of recipe 1 (one family, no ``families``) is read as a one-family zoo.

    Raises:
        ZooFileMissing: the manifest does not exist.
        ZooError: it is not JSON, lacks a key, or a variant lacks a key or names an unknown family.
    """
    path = Path(zoo_dir) / MANIFEST
    data = _read_json(path, "zoo manifest")
    for key in ("recipe_version", "variants"):
        if key not in data:
            raise ZooError(f"zoo manifest {path} has no {key!r}; rebuild with --force")
    if "families" not in data:  # recipe 1: one family, described at the top level
        for key in ("family", "input_shape", "classes"):
            if key not in data:
                raise ZooError(f"zoo manifest {path} has no {key!r}; rebuild with --force")
        data["families"] = {data["family"]: {"input_shape": data["input_shape"], "classes": data["classes"],
                                             "payloads": PAYLOADS}}
        for v in data["variants"].values():
            if isinstance(v, dict):
                v.setdefault("family", data["family"])
    if not isinstance(data["families"], dict) or not data["families"]:
        raise ZooError(f"zoo manifest {path}: 'families' must be a non-empty object")
    for fam, f in data["families"].items():
        for key in ("input_shape", "classes", "payloads"):
            if not isinstance(f, dict) or key not in f:
                raise ZooError(f"zoo manifest {path}: family {fam!r} has no {key!r}")
    if not isinstance(data["variants"], dict) or not data["variants"]:
        raise ZooError(f"zoo manifest {path}: 'variants' must be a non-empty object")
    for name, v in data["variants"].items():
        for key in ("family", "path", "accuracy", "accuracy_source", "params"):
            if not isinstance(v, dict) or key not in v:
                raise ZooError(f"zoo manifest {path}: variant {name!r} has no {key!r}")
        if v["family"] not in data["families"]:
            raise ZooError(f"zoo manifest {path}: variant {name!r} names unknown family {v['family']!r}")
    return data


def families(manifest: dict[str, Any]) -> dict[str, list[str]]:
    """Application families of a loaded manifest -> their variant names (manifest order)."""
    out: dict[str, list[str]] = {f: [] for f in manifest["families"]}
    for name, v in manifest["variants"].items():
        out[v["family"]].append(name)
    return out


def family_info(manifest: dict[str, Any], family: str) -> dict[str, Any]:
    """The manifest entry of ``family`` (``input_shape``, ``classes``, ``payloads``, ...).

    Raises:
        ZooError: ``family`` is not in the zoo (the message lists the known families).
    """
    if family not in manifest["families"]:
        raise ZooError(f"family {family!r} is not in the zoo (has: {', '.join(sorted(manifest['families']))})")
    return manifest["families"][family]


def input_shape(manifest: dict[str, Any], variant: str) -> tuple[int, ...]:
    """Shape of one input of ``variant`` (without the batch dimension)."""
    return tuple(int(d) for d in manifest["families"][manifest["variants"][variant]["family"]]["input_shape"])


def variant_dir(zoo_dir: str | os.PathLike[str], name: str, manifest: dict[str, Any] | None = None) -> Path:
    """Directory of variant ``name``'s SavedModel.

    Raises:
        ZooError: ``name`` is not in the manifest (the message lists the known variants).
        ZooFileMissing: the manifest or the variant's SavedModel (``saved_model.pb``) is missing.
    """
    manifest = manifest if manifest is not None else load_manifest(zoo_dir)
    variants = _known(zoo_dir, name, manifest)
    if not variants[name]["path"]:
        raise ZooError(f"variant {name!r} has no TensorFlow SavedModel: {variants[name].get('weights_source', 'it')} "
                       "ships as TFLite only; serve it with runtime litert")
    path = Path(zoo_dir) / variants[name]["path"]
    if not (path / "saved_model.pb").is_file():
        raise ZooFileMissing(f"variant {name!r}: no SavedModel at {path} (rebuild: python models/build_zoo.py "
                             "--force)")
    return path


def _known(zoo_dir: str | os.PathLike[str], name: str, manifest: dict[str, Any]) -> dict[str, Any]:
    variants = manifest["variants"]
    if name not in variants:
        raise ZooError(f"unknown model variant {name!r} in zoo {zoo_dir} (known: {', '.join(sorted(variants))})")
    return variants


def runtimes_of(manifest: dict[str, Any], name: str) -> tuple[str, ...]:
    """The runtimes variant ``name`` can be served with: ``tensorflow`` iff it has a SavedModel,
    ``litert`` iff it has a ``.tflite`` (converted) or MediaPipe model files."""
    v = manifest["variants"][name]
    return tuple(rt for rt, ok in (("tensorflow", bool(v.get("path"))),
                                   ("litert", bool(v.get("tflite") or v.get("tflite_files")))) if ok)


def tflite_path(zoo_dir: str | os.PathLike[str], name: str, manifest: dict[str, Any] | None = None) -> Path:
    """The LiteRT flatbuffer of variant ``name`` (a MediaPipe variant: its first model file; all must exist).

    Raises:
        ZooError: unknown variant, or the zoo has no LiteRT conversion of it (recipe 1).
        ZooFileMissing: the ``.tflite`` file is missing.
    """
    manifest = manifest if manifest is not None else load_manifest(zoo_dir)
    _known(zoo_dir, name, manifest)
    files = manifest["variants"][name].get("tflite_files")
    if files:
        paths = [Path(zoo_dir) / f["path"] for f in files.values()]
        for p in paths:
            if not p.is_file():
                raise ZooFileMissing(f"variant {name!r}: no MediaPipe model at {p} "
                                     "(rebuild: python models/build_zoo.py)")
        return paths[0]
    rel = manifest["variants"][name].get("tflite")
    if not rel:
        raise ZooError(f"variant {name!r} has no LiteRT model in zoo {zoo_dir}; rebuild: python models/build_zoo.py")
    path = Path(zoo_dir) / rel
    if not path.is_file():
        raise ZooFileMissing(f"variant {name!r}: no LiteRT model at {path} (rebuild: python models/build_zoo.py)")
    return path


def load_payloads(zoo_dir: str | os.PathLike[str], family: str = DEFAULT_FAMILY) -> tuple[np.ndarray, np.ndarray]:
    """The held-out inputs and labels of ``family``: ``x`` float32 [N, *input_shape], ``y`` int64 [N].

    These are the real queries the workload sends (never seen in training).

    Raises:
        ZooError: unknown family, or the file lacks ``x`` / ``y`` or their shapes disagree.
        ZooFileMissing: the payload file does not exist.
    """
    manifest = load_manifest(zoo_dir)
    info = family_info(manifest, family)
    path = Path(zoo_dir) / info["payloads"]
    if not path.is_file():
        raise ZooFileMissing(f"zoo payloads of {family!r}: {path} does not exist (build: python models/build_zoo.py)")
    x, y = _read_arrays(path, ("x", "y"))
    shape = tuple(info["input_shape"])
    if tuple(x.shape[1:]) != shape or y.shape != (x.shape[0],):
        raise ZooError(f"zoo payloads {path}: x {list(x.shape)} / y {list(y.shape)}, expected [N, "
                       f"{', '.join(map(str, shape))}] / [N]")
    if x.dtype == np.uint8:  # image families: 8-bit RGB frames
        return x.astype(np.float32) / np.float32(255.0), y.astype(np.int64, copy=False)
    return x.astype(np.float32, copy=False), y.astype(np.int64, copy=False)


def _read_arrays(path: Path, keys: tuple[str, ...]) -> list[np.ndarray]:
    try:
        with np.load(path) as data:
            return [data[k] for k in keys]
    except (OSError, ValueError, KeyError) as exc:
        raise ZooError(f"zoo payloads {path}: cannot read arrays {', '.join(map(repr, keys))} ({exc})") from exc


def load_jpegs(zoo_dir: str | os.PathLike[str], family: str) -> list[bytes]:
    """The JPEG files [bytes] of an image family's payload frames (what its camera app sends), in payload order.

    Raises:
        ZooError: ``family`` is not an image family (no ``"wire": "jpeg_b64"``) or its payloads lack them.
    """
    manifest = load_manifest(zoo_dir)
    info = family_info(manifest, family)
    if info.get("wire") != "jpeg_b64":
        raise ZooError(f"family {family!r} sends tensors, not JPEG frames")
    buf, offsets = _read_arrays(Path(zoo_dir) / info["payloads"], ("jpeg", "jpeg_offsets"))
    raw = buf.tobytes()
    return [raw[int(a):int(b)] for a, b in zip(offsets[:-1], offsets[1:], strict=True)]


def request_bodies(zoo_dir: str | os.PathLike[str], family: str, n: int = 128) -> tuple[list[bytes], list[int]]:
    """Ready-to-send TensorFlow Serving REST bodies for application family ``family``.

    Returns ``(bodies, labels)``: up to ``n`` JSON bodies (bytes) and each one's label (-1: the
    family has no ground truth for it). Tensor families: ``{"instances": [<one input>]}`` from the
    held-out payloads; image families: ``{"instances": [{"b64": "<JPEG>"}]}``, the frame as the
    camera app sends it (decoded and resized server-side). Built once per source so that
    serialising a query costs nothing on the measured path.

    Raises:
        ZooError: ``family`` is not in the zoo, or its payloads are missing / malformed.
    """
    x, y = load_payloads(zoo_dir, family)
    k = min(len(x), n)
    if family_info(load_manifest(zoo_dir), family).get("wire") == "jpeg_b64":
        import base64

        jpegs = load_jpegs(zoo_dir, family)[:k]
        return ([json.dumps({"instances": [{"b64": base64.b64encode(j).decode()}]}).encode() for j in jpegs],
                [int(v) for v in y[:k]])
    bodies = [json.dumps({"instances": [np.round(x[i], 4).tolist()]}).encode() for i in range(k)]
    return bodies, [int(v) for v in y[:k]]


def load_profile(profiles_dir: str | os.PathLike[str], variant: str) -> dict[str, Any]:
    """Read ``<profiles_dir>/<variant>.json`` (format: :mod:`testbed.serve.profiles`).

    Top-level keys ``mean_ms``, ``p50_ms``, ``p95_ms``, ``p99_ms``, ``cpu_cores``, ``batch_size``
    (the reference point: TensorFlow, 1 core, batch 1), ``machine``, ``measured_at``; profiles of
    schema 2 add ``measurements`` (one per runtime x CPU share x batch, with raw ``samples_ms``).

    Raises:
        ZooFileMissing: no profile for ``variant``.
        ZooError: the file is not JSON or lacks a timing key.
    """
    path = Path(profiles_dir) / f"{variant}.json"
    data = _read_json(path, f"service-time profile of variant {variant!r}")
    for key in ("mean_ms", "p50_ms", "p95_ms", "p99_ms", "cpu_cores", "batch_size"):
        if key not in data:
            raise ZooError(f"profile {path} of variant {variant!r} has no {key!r}; re-measure: testbed profile")
    return data


def zoo_complete(zoo_dir: str | os.PathLike[str]) -> bool:
    """True iff the manifest, every family's payloads and every SavedModel / .tflite exist (no TensorFlow)."""
    try:
        manifest = load_manifest(zoo_dir)
        for name, v in manifest["variants"].items():
            if v.get("path"):
                variant_dir(zoo_dir, name, manifest)
            if v.get("tflite") or v.get("tflite_files"):
                tflite_path(zoo_dir, name, manifest)
        for f in manifest["families"].values():
            if not (Path(zoo_dir) / f["payloads"]).is_file():
                return False
    except ZooError:
        return False
    return True


def ensure_zoo(zoo_dir: str | os.PathLike[str] = "models/zoo", profiles_dir: str | os.PathLike[str] | None = None,
               timeout_s: float = 1800.0) -> dict[str, Any]:
    """Return the zoo's manifest, building the zoo first if missing or stale.

    Runs ``models/build_zoo.py --out zoo_dir --profiles profiles_dir`` in a subprocess (so this
    process does not pay TensorFlow's import). The script is idempotent: on an up-to-date zoo it
    returns in well under a second; it rebuilds a missing or older-recipe zoo (minutes from nothing:
    docs/models-and-servers.md; parts that did not change are copied) and measures a minimal profile
    only for variants that have none (tracked profiles are measured data: never overwritten).
    Without the build script (an installed copy of the package), the zoo and profiles must
    already be complete.

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


class Model(Protocol):
    """What the server and the profiler need from a loaded variant (TensorFlow, LiteRT or a test fake)."""

    name: str
    runtime: str
    input_shape: tuple[int, ...]
    classes: int
    info: dict[str, Any]

    def predict(self, x: np.ndarray) -> np.ndarray | NamedOutputs:
        """Probabilities float32 [N, classes] (or :class:`NamedOutputs`) for inputs float32 [N, *input_shape]."""
        ...


class ZooModel:
    """One variant through TensorFlow: the SavedModel's ``serving_default`` signature, called directly.

    ``model.predict`` through Keras costs ~3x more per query; the signature's concrete (compiled
    ``tf.function``) function does not. Thread-safe: several server workers may call :meth:`predict`.
    """

    runtime = "tensorflow"

    def __init__(self, zoo_dir: str | os.PathLike[str], name: str, manifest: dict[str, Any] | None = None):
        """Load variant ``name`` from ``zoo_dir``.

        Raises:
            ZooError / ZooFileMissing: unknown variant, missing SavedModel, or no ``serving_default``
                signature with input ``x`` [None, *input_shape] and output ``probabilities``.
        """
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        import tensorflow as tf

        self._tf = tf
        manifest = manifest if manifest is not None else load_manifest(zoo_dir)
        self.name = name
        self.path = variant_dir(zoo_dir, name, manifest)
        self.info: dict[str, Any] = dict(manifest["variants"][name])
        self.input_shape = input_shape(manifest, name)
        self.classes = int(manifest["families"][self.info["family"]]["classes"])
        self._loaded = tf.saved_model.load(str(self.path))  # keeps the variables alive
        sigs = self._loaded.signatures
        if SIGNATURE_KEY not in sigs:
            raise ZooError(f"variant {name!r} at {self.path} has no {SIGNATURE_KEY!r} signature "
                           f"(has: {', '.join(sigs) or 'none'})")
        self._fn = sigs[SIGNATURE_KEY]
        spec = self._fn.structured_input_signature[1].get(INPUT_NAME)
        if spec is None or spec.shape.as_list() != [None, *self.input_shape]:
            raise ZooError(f"variant {name!r}: signature input {INPUT_NAME!r} is {spec}, expected "
                           f"float32 [None, {', '.join(map(str, self.input_shape))}]")
        if OUTPUT_NAME not in self._fn.structured_outputs:
            raise ZooError(f"variant {name!r}: signature has no output {OUTPUT_NAME!r}")

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Class probabilities float32 [N, classes] (rows sum to 1) for inputs ``x`` float32 [N, *input_shape]."""
        out = self._fn(x=self._tf.constant(np.asarray(x, dtype=np.float32)))
        return out[OUTPUT_NAME].numpy()

    def warm_up(self, x: np.ndarray, calls: int = 20, batch: int = 1) -> float:
        """Run ``calls`` predictions of ``batch`` inputs from ``x``; return their total wall time [ms]."""
        return _warm_up(self, x, calls, batch)


class LiteRTModel:
    """One variant through LiteRT (``ai_edge_litert.interpreter.Interpreter``) on its ``.tflite`` file.

    An interpreter is not thread-safe, so the model holds ``pool`` slots (one per server worker);
    a call takes a free slot (waiting if none), and each slot keeps one interpreter per batch size
    it has seen (``num_threads`` CPU threads each), so alternating batch sizes never re-allocate
    tensors. The first call at a new batch size in a slot builds that interpreter (warm up every
    batch size used).
    """

    runtime = "litert"

    def __init__(self, zoo_dir: str | os.PathLike[str], name: str, manifest: dict[str, Any] | None = None,
                 num_threads: int = 1, pool: int = 1):
        """Load variant ``name``'s ``.tflite`` from ``zoo_dir``.

        Raises:
            ZooError / ZooFileMissing: unknown variant or missing ``.tflite``; ``ai-edge-litert`` not
                installed; the model's input is not float32 [1, *input_shape].
        """
        import queue

        manifest = manifest if manifest is not None else load_manifest(zoo_dir)
        self.name = name
        self.path = tflite_path(zoo_dir, name, manifest)
        self.info = dict(manifest["variants"][name])
        self.input_shape = input_shape(manifest, name)
        self.classes = int(manifest["families"][self.info["family"]]["classes"])
        self.num_threads = int(num_threads)
        self._model_bytes = self.path.read_bytes()
        self._slots: queue.SimpleQueue[dict[int, tuple[Any, int, int]]] = queue.SimpleQueue()
        for _ in range(max(1, int(pool))):
            slot: dict[int, tuple[Any, int, int]] = {}
            self._entry(slot, 1)  # fail now, not at the first query
            self._slots.put(slot)

    def _entry(self, slot: dict[int, tuple[Any, int, int]], batch: int) -> tuple[Any, int, int]:
        if batch not in slot:
            try:
                from ai_edge_litert.interpreter import Interpreter
            except ImportError as exc:
                raise ZooError("the LiteRT runtime needs the ai-edge-litert package (pip install ai-edge-litert)") \
                    from exc
            interp = Interpreter(model_content=self._model_bytes, num_threads=self.num_threads)
            inp = interp.get_input_details()[0]
            if list(inp["shape"][1:]) != list(self.input_shape) or inp["dtype"] != np.float32:
                raise ZooError(f"variant {self.name!r}: LiteRT input is {inp['dtype'].__name__} {list(inp['shape'])}, "
                               f"expected float32 [1, {', '.join(map(str, self.input_shape))}]")
            if batch != int(inp["shape"][0]):
                interp.resize_tensor_input(inp["index"], [batch, *self.input_shape], strict=False)
            interp.allocate_tensors()
            slot[batch] = (interp, inp["index"], interp.get_output_details()[0]["index"])
        return slot[batch]

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Class probabilities float32 [N, classes] for inputs ``x`` float32 [N, *input_shape]."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        slot = self._slots.get()
        try:
            interp, inp, out = self._entry(slot, x.shape[0])
            interp.set_tensor(inp, x)
            interp.invoke()
            return interp.get_tensor(out).copy()
        finally:
            self._slots.put(slot)

    def warm_up(self, x: np.ndarray, calls: int = 20, batch: int = 1) -> float:
        """Run ``calls`` predictions of ``batch`` inputs from ``x``; return their total wall time [ms]."""
        return _warm_up(self, x, calls, batch)


def _warm_up(model: Model, x: np.ndarray, calls: int, batch: int) -> float:
    t = time.perf_counter()
    for i in range(calls):
        idx = (np.arange(batch) + i * batch) % len(x)
        model.predict(x[idx])
    return (time.perf_counter() - t) * 1e3


def load_model(zoo_dir: str | os.PathLike[str], name: str, runtime: str = "tensorflow",
               manifest: dict[str, Any] | None = None, threads: int = 1, pool: int = 1) -> Any:
    """Load variant ``name`` with ``runtime`` (``tensorflow`` | ``litert``).

    ``threads``: LiteRT interpreter threads (TensorFlow's pools are process-wide: :func:`configure_tf_threads`);
    ``pool``: LiteRT interpreter slots, one per thread that calls ``predict`` concurrently.
    Returns a :class:`ZooModel`, :class:`LiteRTModel` or (real MediaPipe weights)
    :class:`testbed.serve.graphs.MediaPipeModel`.

    Raises:
        ZooError: unknown runtime or variant, missing files, a MediaPipe file whose sha256 does not
            match the manifest (the message names the file), a runtime the variant lacks.
    """
    manifest = manifest if manifest is not None else load_manifest(zoo_dir)
    info = _known(zoo_dir, name, manifest)[name]
    if info.get("graph") and runtime == "litert":
        from testbed.serve import graphs

        tflite_path(zoo_dir, name, manifest)
        try:
            return graphs.MediaPipeModel(zoo_dir, name, info, input_shape(manifest, name), threads, pool)
        except graphs.GraphError as exc:
            raise ZooError(str(exc)) from exc
    if runtime == "tensorflow":
        return ZooModel(zoo_dir, name, manifest)
    if runtime == "litert":
        return LiteRTModel(zoo_dir, name, manifest, num_threads=threads, pool=pool)
    raise ZooError(f"unknown runtime {runtime!r} for variant {name!r} (known: {', '.join(RUNTIMES)})")


def machine_info() -> dict[str, Any]:
    """CPU model, logical cores, kernel, Python / TensorFlow / LiteRT versions of this machine (for profiles)."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info: dict[str, Any] = {"cpu_model": cpu, "cores": os.cpu_count(), "kernel": platform.release(),
                            "python": platform.python_version()}
    from importlib.metadata import PackageNotFoundError, version

    dists = (("tensorflow", "tensorflow-cpu"), ("tensorflow", "tensorflow"), ("ai_edge_litert", "ai-edge-litert"))
    for key, dist in dists:
        try:
            info.setdefault(key, version(dist))
        except PackageNotFoundError:
            pass
    return info
