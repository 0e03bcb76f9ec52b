"""Loading the zoo's models: the inference code paths. :class:`ZooModel` (TensorFlow) and
:class:`LiteRTModel` (``ai-edge-litert``) expose the same ``predict(x) -> probabilities`` call
(:class:`testbed.serve.calls.Model`), the whole per-query inference step of the server, and the
profiler times that same call; :func:`load_model` picks one (or a MediaPipe graph,
:mod:`testbed.serve.graphs`). What is on disk (manifest, payloads, profiles) is read by
:mod:`testbed.plan.zoo`, without TensorFlow.

Errors: :class:`testbed.plan.zoo.ZooError` (``ZooFileMissing`` for a missing file) naming the
variant and the path.
"""

from __future__ import annotations

import os
import platform
import queue
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np

from testbed.plan.zoo import (
    INPUT_NAME,
    OUTPUT_NAME,
    RUNTIMES,
    SIGNATURE_KEY,
    ZooError,
    ZooIntegrityError,
    input_shape,
    known_variant,
    load_manifest,
    load_payloads,
    tflite_path,
    variant_dir,
    verify_model_files,
)
from testbed.serve import graphs
from testbed.serve.calls import warm_up


def configure_tf_threads(intra_op: int = 1, inter_op: int = 1) -> None:
    """Set TensorFlow's thread pools (intra-op: threads inside one op; inter-op: ops in parallel).

    Must run before TensorFlow executes anything in this process.

    Raises:
        ZooError: TensorFlow was already initialised (the pools can no longer change).
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf  # heavy (~4 s, ~525 MB): only a process that runs TensorFlow pays it

    try:
        tf.config.threading.set_intra_op_parallelism_threads(int(intra_op))
        tf.config.threading.set_inter_op_parallelism_threads(int(inter_op))
    except RuntimeError as exc:
        raise ZooError(f"cannot set TensorFlow threads to intra={intra_op} inter={inter_op}: {exc}") from exc


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
        import tensorflow as tf  # heavy (~4 s, ~525 MB): only a process that runs TensorFlow pays it

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
        return warm_up(self, x, calls, batch)


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
                from ai_edge_litert.interpreter import Interpreter  # LiteRT: loaded only when a model runs on it
            except ImportError as exc:
                raise ZooError("the LiteRT runtime needs the ai-edge-litert package (pip install ai-edge-litert)") \
                    from exc
            interp = Interpreter(model_content=self._model_bytes, num_threads=self.num_threads)
            inp = interp.get_input_details()[0]
            if list(inp["shape"][1:]) != list(self.input_shape) or inp["dtype"] != np.float32:
                got = [int(d) for d in inp["shape"]]
                raise ZooError(f"variant {self.name!r}: LiteRT input is {inp['dtype'].__name__} {got}, "
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
        return warm_up(self, x, calls, batch)


def tflite_params(path: Path) -> int:
    """Weights in a ``.tflite`` file: elements of its constant float tensors (float32 / float16).

    Raises:
        ImportError: ``ai-edge-litert`` is not installed.
    """
    from ai_edge_litert import schema_py_generated as fb

    m = fb.Model.GetRootAsModel(path.read_bytes(), 0)
    n = 0
    for i in range(m.SubgraphsLength()):
        sg = m.Subgraphs(i)
        for j in range(sg.TensorsLength()):
            t = sg.Tensors(j)
            b = m.Buffers(t.Buffer())
            if t.Type() in (fb.TensorType.FLOAT32, fb.TensorType.FLOAT16) and (b.DataLength() or b.Size()):
                n += int(np.prod(t.ShapeAsNumpy())) if t.ShapeLength() else 1
    return n


def load_model(zoo_dir: str | os.PathLike[str], name: str, runtime: str = "tensorflow",
               manifest: dict[str, Any] | None = None, threads: int = 1, pool: int = 1) -> Any:
    """Load variant ``name`` with ``runtime`` (``tensorflow`` | ``litert``).

    ``threads``: LiteRT interpreter threads (TensorFlow's pools are process-wide: :func:`configure_tf_threads`);
    ``pool``: LiteRT interpreter slots, one per thread that calls ``predict`` concurrently.
    Returns a :class:`ZooModel`, :class:`LiteRTModel` or (real MediaPipe weights)
    :class:`testbed.serve.graphs.MediaPipeModel`.

    Every file the load reads is first checked against the SHA-256 the zoo recorded
    (:func:`testbed.plan.zoo.verify_model_files`).

    Raises:
        ZooIntegrityError: a file's SHA-256 differs from the zoo's record, or the zoo records none
            (the message names the file; exit code 7).
        ZooError: unknown runtime or variant, missing files, a runtime the variant lacks.
    """
    manifest = manifest if manifest is not None else load_manifest(zoo_dir)
    info = known_variant(zoo_dir, name, manifest)[name]
    if runtime not in RUNTIMES:
        raise ZooError(f"unknown runtime {runtime!r} for variant {name!r} (known: {', '.join(RUNTIMES)})")
    if runtime == "tensorflow":
        variant_dir(zoo_dir, name, manifest)  # a variant without a SavedModel says so first
    verify_model_files(zoo_dir, name, manifest, runtime)
    if info.get("graph") and runtime == "litert":
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


#: The start-up answer check (:func:`check_answers`): labelled payloads a server answers before it
#: serves, and how far below the model's accuracy their share of correct answers may fall. Our
#: choice: at n = 100 and an accuracy of 0.89 or more (every checked variant), the binomial standard
#: deviation of the share is at most 0.032, so 0.2 is over 6 of them (no false alarm), while a model
#: with corrupted weights answers near chance (0.06-0.10 measured for digits with 200 bytes flipped).
ANSWER_CHECK_N = 100
ANSWER_CHECK_MARGIN = 0.2


def check_answers(zoo_dir: str | os.PathLike[str], name: str, model: Any,
                  manifest: dict[str, Any]) -> dict[str, Any] | None:
    """Answer the first :data:`ANSWER_CHECK_N` labelled payloads of variant ``name``'s family with
    ``model`` (one query each, as a server does) and compare the share answered right with the
    variant's accuracy in the manifest (its LiteRT figure for a LiteRT model): what a server does
    before it serves.

    Applies to a classification family with labels (``classes`` >= 2, labels >= 0, tensors on the
    wire) and weights that were trained (not ``random_weights``): the small families (digits,
    parity, cancer). The others have no labelled answer to check (random ImageNet weights, hand
    landmarks without ground truth, face detection judged by a detection rule); their files'
    hashes are their check.

    Returns:
        ``{"n", "correct", "accuracy", "expected", "floor"}``, or None when the check does not apply.

    Raises:
        ZooIntegrityError: the share is below ``expected - ANSWER_CHECK_MARGIN`` (names the model's file).
    """
    v = manifest["variants"][name]
    fam = manifest["families"][v["family"]]
    if int(fam.get("classes") or 0) < 2 or fam.get("wire") == "jpeg_b64" or v.get("random_weights") or v.get("graph"):
        return None
    x, y = load_payloads(zoo_dir, v["family"])
    keep = y >= 0
    x, y = x[keep][:ANSWER_CHECK_N], y[keep][:ANSWER_CHECK_N]
    if not len(y):
        return None
    correct = sum(int(np.argmax(model.predict(x[i:i + 1])[0]) == y[i]) for i in range(len(y)))
    runtime = getattr(model, "runtime", "tensorflow")
    expected = float(v.get(f"accuracy_{runtime}", v["accuracy"]))
    floor = round(expected - ANSWER_CHECK_MARGIN, 4)
    got = {"n": len(y), "correct": correct, "accuracy": round(correct / len(y), 4), "expected": expected,
           "floor": floor}
    if got["accuracy"] < floor:
        raise ZooIntegrityError(
            f"model file {getattr(model, 'path', name)} (variant {name!r}, {runtime}): answered {correct} of "
            f"{len(y)} labelled samples of its family right ({got['accuracy']:.2f}), far below its accuracy "
            f"{expected:.4f} (the floor is {floor:.4f}): its weights are corrupt or not the zoo's; refusing to serve "
            f"it (rebuild the zoo: python models/build_zoo.py --out {zoo_dir} --force)")
    return got


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
    dists = (("tensorflow", "tensorflow-cpu"), ("tensorflow", "tensorflow"), ("ai_edge_litert", "ai-edge-litert"))
    for key, dist in dists:
        try:
            info.setdefault(key, version(dist))
        except PackageNotFoundError:
            pass
    return info


__all__ = ["ANSWER_CHECK_MARGIN", "ANSWER_CHECK_N", "LiteRTModel", "ZooModel", "check_answers",
           "configure_tf_threads", "load_model", "machine_info", "tflite_params"]
