"""Real MediaPipe models (trained TFLite files from the mediapipe 0.10.21 wheel) run with LiteRT.

MediaPipe itself is not installed (its numpy<2 / protobuf pins clash with TensorFlow 2.21); this
module does the pre- and post-processing its calculator graphs do around each model, from the
options in the graph files of MediaPipe v0.10.21 (cited per constant below, paths under
``mediapipe/modules/``). Every variant takes a camera frame float32 [N, H, W, 3], RGB in [0, 1]
(the family's frame size), resizes it to its model's input (bilinear), runs the model(s) and
decodes the raw tensors into small named outputs (:class:`testbed.serve.calls.NamedOutputs`):

* ``blazeface`` (``face_detection_short_range``, 128x128, or ``face_detection_full_range_sparse``,
  192x192; pixels scaled to [-1, 1]) and ``blazeface_dual`` (both, the higher-scoring detection
  wins): ``score`` [N] (sigmoid of the best anchor), ``box`` [N, 4] (xmin, ymin, xmax, ymax,
  normalised to the frame), ``keypoints`` [N, 6, 2] (eyes, nose, mouth, ears; normalised).
* ``hand_landmark`` (``hand_landmark_lite`` / ``_full``, 224x224, [0, 1]; the frame is the hand's
  region of interest, as in MediaPipe's tracking mode): ``landmarks`` [N, 21, 3] (x, y normalised
  to the frame, z relative depth in the same scale as x), ``presence`` [N] (hand-presence
  probability), ``handedness`` [N] (probability of a right hand), ``world_landmarks`` [N, 21, 3]
  [m], ``palm_score`` [N] (1.0: no palm detector ran).
* ``palm_hand`` (``palm_detection_full`` 192x192 [0, 1], then ``hand_landmark_full`` on the
  palm's region; MediaPipe's static-image mode): the same outputs, ``palm_score`` the palm
  detection's score; below the detection threshold the whole frame is the region.

A batch of N frames is N model invocations (these models have a fixed batch of 1).
"""

from __future__ import annotations

import os
import queue
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from testbed.core.errors import InputError
from testbed.core.hashing import bytes_sha256
from testbed.serve.calls import NamedOutputs, warm_up

#: Which decoder each variant's ``graph`` names, and the models it runs in order.
GRAPH_KINDS = ("blazeface", "blazeface_dual", "hand_landmark", "palm_hand")


class GraphError(InputError, RuntimeError):
    """A MediaPipe model file is missing, has the wrong hash, or does not match its decoder."""


@dataclass(frozen=True)
class Detector:
    """SSD detector options (MediaPipe ``SsdAnchorsCalculator`` + ``TensorsToDetectionsCalculator``).

    ``size``: input width = height [px]; ``layers``: (stride [px], anchors per cell) after merging
    the consecutive layers of equal stride, as ``SsdAnchorsCalculator`` does with
    ``fixed_anchor_size: true``; ``scale``: x/y/w/h_scale [px]; ``signed``: pixels in [-1, 1]
    (else [0, 1]); ``keypoints``: keypoints per box; ``threshold``: ``min_score_thresh``.
    """

    size: int
    layers: tuple[tuple[int, int], ...]
    scale: float
    signed: bool
    keypoints: int
    threshold: float = 0.5


#: face_detection/face_detection_short_range.pbtxt: 128x128, num_layers 4, strides 8,16,16,16,
#: 2 anchors per layer and location -> 16x16x2 + 8x8x6 = 896 anchors; x_scale 128; [-1, 1]; 6 keypoints.
FACE_SHORT = Detector(128, ((8, 2), (16, 6)), 128.0, True, 6)
#: face_detection/face_detection_full_range.pbtxt: 192x192, num_layers 1, stride 4,
#: interpolated_scale_aspect_ratio 0 -> 48x48x1 = 2304 anchors; x_scale 192; [-1, 1]; min_score 0.5.
FACE_FULL = Detector(192, ((4, 1),), 192.0, True, 6)
#: palm_detection/palm_detection_cpu.pbtxt: 192x192, strides 8,16,16,16 -> 24x24x2 + 12x12x6 = 2016
#: anchors; x_scale 192; output_tensor_float_range [0, 1]; 7 keypoints; min_score_thresh 0.5.
PALM = Detector(192, ((8, 2), (16, 6)), 192.0, False, 7)
#: hand_landmark/hand_landmark_cpu.pbtxt: 224x224 input in [0, 1]; landmarks in input pixels.
HAND_SIZE = 224
#: palm_detection_detection_to_roi.pbtxt (hand_landmark module): RectTransformationCalculator
#: scale_x = scale_y = 2.6, shift_y = -0.5, square_long; we keep the box axis-aligned (no rotation).
PALM_ROI_SCALE, PALM_ROI_SHIFT_Y = 2.6, -0.5


def verified_bytes(path: Path, sha256: str) -> bytes:
    """The bytes of ``path`` after checking their sha256.

    Raises:
        GraphError: missing file, or its sha256 is not ``sha256`` (the message names the file).
    """
    if not path.is_file():
        raise GraphError(f"MediaPipe model file {path} does not exist (build: python models/build_zoo.py)")
    data = path.read_bytes()
    got = bytes_sha256(data)
    if got != sha256:
        raise GraphError(f"MediaPipe model file {path}: sha256 {got} != pinned {sha256}; the file is corrupt or "
                         "not the one from mediapipe 0.10.21 (rebuild: python models/build_zoo.py --force)")
    return data


def ssd_anchors(det: Detector) -> np.ndarray:
    """Anchor centres [A, 2] (x, y in [0, 1]), in the model's output order (rows, then columns)."""
    out = []
    for stride, per_cell in det.layers:
        n = det.size // stride
        ys, xs = np.meshgrid((np.arange(n) + 0.5) / n, (np.arange(n) + 0.5) / n, indexing="ij")
        out.append(np.repeat(np.stack([xs.ravel(), ys.ravel()], axis=1), per_cell, axis=0))
    return np.concatenate(out).astype(np.float32)


def resize(frame: np.ndarray, height: int, width: int) -> np.ndarray:
    """Bilinear resize of one image float32 [H, W, C] to [height, width, C] (PIL, per channel)."""
    if frame.shape[:2] == (height, width):
        return frame
    from PIL import Image

    chans = [np.asarray(Image.fromarray(np.ascontiguousarray(frame[..., c]), mode="F")
                        .resize((width, height), Image.BILINEAR)) for c in range(frame.shape[2])]
    return np.stack(chans, axis=-1).astype(np.float32)


def crop(frame: np.ndarray, box: tuple[float, float, float, float], size: int) -> np.ndarray:
    """The region ``box`` (x0, y0, x1, y1 in frame pixels, may extend past the edges: zeros there)
    of one image float32 [H, W, C], resampled bilinearly to [size, size, C]."""
    from PIL import Image

    chans = [np.asarray(Image.fromarray(np.ascontiguousarray(frame[..., c]), mode="F")
                        .transform((size, size), Image.EXTENT, box, Image.BILINEAR)) for c in range(frame.shape[2])]
    return np.stack(chans, axis=-1).astype(np.float32)


class _Pool:
    """``slots`` LiteRT interpreters of one model file (an interpreter is not thread-safe)."""

    def __init__(self, model: bytes, threads: int, slots: int, name: str):
        from ai_edge_litert.interpreter import Interpreter  # LiteRT: loaded only when a model runs on it

        self._q: queue.SimpleQueue[tuple[Any, dict[str, Any], list[dict[str, Any]]]] = queue.SimpleQueue()
        for _ in range(max(1, slots)):
            it = Interpreter(model_content=model, num_threads=threads)
            it.allocate_tensors()
            self._q.put((it, it.get_input_details()[0], it.get_output_details()))
        it, inp, outs = self._q.get()
        self.input_shape = tuple(int(d) for d in inp["shape"][1:])
        self.outputs = [d["name"] for d in outs]
        self._q.put((it, inp, outs))
        if inp["dtype"] != np.float32 or int(inp["shape"][0]) != 1:
            raise GraphError(f"{name}: input is {inp['dtype'].__name__} {list(inp['shape'])}, "
                             "expected float32 [1, ...]")

    def run(self, x: np.ndarray) -> list[np.ndarray]:
        """Invoke once on x [1, *input_shape]; the outputs in the model's output order (copies)."""
        it, inp, outs = self._q.get()
        try:
            it.set_tensor(inp["index"], np.ascontiguousarray(x, dtype=np.float32))
            it.invoke()
            return [it.get_tensor(d["index"]).copy() for d in outs]
        finally:
            self._q.put((it, inp, outs))


def _sigmoid(v: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.clip(v.astype(np.float64), -100.0, 100.0)))  # score_clipping_thresh: 100


def detect(pool: _Pool, det: Detector, anchors: np.ndarray, frame: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    """Best detection of one frame [H, W, 3] in [0, 1]: (score, box [4] xmin ymin xmax ymax, keypoints [K, 2]),
    all normalised to the frame (centre-size boxes decoded against the anchors, reverse_output_order)."""
    x = resize(frame, det.size, det.size)
    raw, logits = pool.run((x * 2.0 - 1.0 if det.signed else x)[None])
    raw, scores = raw[0], _sigmoid(logits[0, :, 0])
    i = int(scores.argmax())
    cx, cy = raw[i, 0] / det.scale + anchors[i, 0], raw[i, 1] / det.scale + anchors[i, 1]
    w, h = raw[i, 2] / det.scale, raw[i, 3] / det.scale
    kp = raw[i, 4:4 + 2 * det.keypoints].reshape(det.keypoints, 2) / det.scale + anchors[i]
    return float(scores[i]), np.array([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], np.float32), kp


class MediaPipeModel:
    """One MediaPipe variant (``graph`` in :data:`GRAPH_KINDS`) through LiteRT; same calls as ``zoo.LiteRTModel``.

    ``info["tflite_files"]``: the model files (relative to the zoo) with their sha256, checked at
    load (:class:`GraphError` naming the file on a mismatch). ``pool``: interpreter slots per file
    (one per server worker); ``num_threads``: LiteRT threads per interpreter.
    """

    runtime = "litert"

    def __init__(self, zoo_dir: str | os.PathLike[str], name: str, info: dict[str, Any], frame_shape: tuple[int, ...],
                 num_threads: int = 1, pool: int = 1):
        self.name = name
        self.info = dict(info)
        self.input_shape = tuple(frame_shape)
        self.classes = 0
        self.graph = info["graph"]
        if self.graph not in GRAPH_KINDS:
            raise GraphError(f"variant {name!r}: unknown MediaPipe graph {self.graph!r} "
                             f"(known: {', '.join(GRAPH_KINDS)})")
        self.pools = {}
        for role, f in info["tflite_files"].items():
            data = verified_bytes(Path(zoo_dir) / f["path"], f["sha256"])
            self.pools[role] = _Pool(data, int(num_threads), pool, f"variant {name!r} ({f['path']})")
        self.detectors: list[tuple[_Pool, Detector, np.ndarray]] = []
        for role, det in (("face_short", FACE_SHORT), ("face_full", FACE_FULL), ("palm", PALM)):
            if role in self.pools:
                if self.pools[role].input_shape != (det.size, det.size, 3):
                    raise GraphError(f"variant {name!r}: {role} model input {self.pools[role].input_shape} "
                                     f"does not match the decoder ({det.size}x{det.size}x3)")
                self.detectors.append((self.pools[role], det, ssd_anchors(det)))

    def predict(self, x: np.ndarray) -> Any:
        """Named outputs (module doc) for frames ``x`` float32 [N, *input_shape] RGB in [0, 1]."""
        rows = [self._one(np.asarray(f, dtype=np.float32)) for f in x]
        return NamedOutputs({k: np.stack([r[k] for r in rows]) for k in rows[0]})

    def _one(self, frame: np.ndarray) -> dict[str, np.ndarray]:
        if self.graph.startswith("blazeface"):
            best = max((detect(p, d, a, frame) for p, d, a in self.detectors), key=lambda r: r[0])
            return {"score": np.float32(best[0]), "box": best[1], "keypoints": best[2].astype(np.float32)}
        h, w = frame.shape[:2]
        region = (0.0, 0.0, float(w), float(h))
        palm_score = 1.0
        if self.graph == "palm_hand":
            palm_score, box, _ = detect(*self.detectors[0], frame)
            if palm_score >= PALM.threshold:
                side = max((box[2] - box[0]) * w, (box[3] - box[1]) * h) * PALM_ROI_SCALE
                cx, cy = (box[0] + box[2]) / 2 * w, (box[1] + box[3]) / 2 * h + PALM_ROI_SHIFT_Y * (box[3] - box[1]) * h
                region = (cx - side / 2, cy - side / 2, cx + side / 2, cy + side / 2)
        return self._landmarks(frame, region, palm_score)

    def _landmarks(self, frame: np.ndarray, region: tuple[float, float, float, float],
                   palm_score: float) -> dict[str, np.ndarray]:
        h, w = frame.shape[:2]
        x0, y0, x1, y1 = region
        roi = crop(frame, region, HAND_SIZE) if region != (0.0, 0.0, float(w), float(h)) \
            else resize(frame, HAND_SIZE, HAND_SIZE)
        lm, presence, handedness, world = self.pools["hand"].run(roi[None])
        lm = lm.reshape(21, 3) / HAND_SIZE  # crop-normalised
        out = np.empty_like(lm)
        out[:, 0] = (x0 + lm[:, 0] * (x1 - x0)) / w
        out[:, 1] = (y0 + lm[:, 1] * (y1 - y0)) / h
        out[:, 2] = lm[:, 2] * (x1 - x0) / w
        return {"landmarks": out.astype(np.float32), "presence": np.float32(presence.ravel()[0]),
                "handedness": np.float32(handedness.ravel()[0]),
                "world_landmarks": world.reshape(21, 3).astype(np.float32), "palm_score": np.float32(palm_score)}

    def warm_up(self, x: np.ndarray, calls: int = 20, batch: int = 1) -> float:
        """Run ``calls`` predictions of ``batch`` frames from ``x``; return their total wall time [ms]."""
        return warm_up(self, x, calls, batch)
