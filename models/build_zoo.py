#!/usr/bin/env python3
"""Build the model zoo: three application families x three variants, trained here, offline, in ~1.5 min.

    python models/build_zoo.py [--out models/zoo] [--profiles models/profiles] [--force]

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
  and its source, LiteRT accuracy and top-1 agreement with TensorFlow, params, architecture.
* ``<out>/payloads.npz`` (digits), ``<out>/payloads/<family>.npz``: held-out ``x`` / ``y``.
* ``<profiles>/<variant>.json``: ONLY for a variant that has no profile yet, a minimal one (1 core,
  batch 1, both runtimes) from ``testbed.inference.profiler``; the full grid is ``testbed profile``.
  Existing (tracked) profiles are never overwritten here.

Idempotent: if ``<out>/manifest.json`` has this ``RECIPE_VERSION`` and every file is there, it does
nothing. ``--force`` rebuilds. Bump RECIPE_VERSION whenever anything below changes the models.
Seeds are fixed; figures may still differ slightly across CPUs (floating-point summation order).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without install
from testbed.inference import zoo  # noqa: E402

#: Bump when data preparation, split, architectures or training change.
RECIPE_VERSION = 4
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


@contextlib.contextmanager
def build_lock(out: Path) -> Iterator[None]:
    """Serialise concurrent builds of the same ``out`` (lock file in the system temp dir)."""
    key = hashlib.sha1(str(out).encode()).hexdigest()[:12]
    with open(Path(tempfile.gettempdir()) / f"build_zoo-{key}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def up_to_date(out: Path) -> bool:
    """True iff ``out`` holds a complete zoo built with this RECIPE_VERSION and these variants."""
    if not zoo.zoo_complete(out):
        return False
    manifest = zoo.load_manifest(out)
    return manifest["recipe_version"] == RECIPE_VERSION and set(manifest["variants"]) == set(VARIANTS)


def _predict_all(model: Any, x: np.ndarray) -> np.ndarray:
    return np.concatenate([model.predict(x[i:i + 256]) for i in range(0, len(x), 256)])


def build(out: Path) -> dict[str, Any]:
    """Train, save, convert and evaluate every variant into a temp dir, then swap it in as ``out``.

    Returns the manifest. Raises ``SystemExit`` if ``out`` exists but is not a zoo (never deletes
    a foreign directory).
    """
    if out.exists() and any(out.iterdir()) and not (out / zoo.MANIFEST).is_file():
        raise SystemExit(f"{out} exists, is not empty and has no {zoo.MANIFEST}: refusing to replace it")
    t0 = time.perf_counter()
    zoo.configure_tf_threads(intra_op=min(2, os.cpu_count() or 1), inter_op=1)  # imports TensorFlow
    import tensorflow as tf

    log(f"tensorflow {tf.__version__} imported in {time.perf_counter() - t0:.1f} s")
    data = load_data()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.build-", dir=out.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; the zoo is read by other users / hosts too
    try:
        families = {}
        for fam, f in FAMILIES.items():
            x_tr, y_tr, x_te, y_te = data[fam]
            (tmp / f["payloads"]).parent.mkdir(parents=True, exist_ok=True)
            np.savez_compressed(tmp / f["payloads"], x=x_te.astype(np.float32), y=y_te.astype(np.int64))
            families[fam] = {**f, "dataset": {**f["dataset"], "n_total": len(x_tr) + len(x_te), "n_train": len(x_tr),
                                              "n_test": len(x_te), "test_fraction": TEST_FRACTION,
                                              "split": f"stratified, random_state={SEED}"},
                             "binary_input": "b64 of raw little-endian float32, row-major, one input "
                                             f"{f['input_shape']}" + (" (or an 8-bit greyscale PNG, pixel/255)"
                                                                      if len(f["input_shape"]) == 3 else "")}
        manifest: dict[str, Any] = {
            "recipe_version": RECIPE_VERSION, "families": families, "variants": {},
            # The default family at the top level, for readers of recipe 1.
            "family": zoo.DEFAULT_FAMILY, "input_shape": FAMILIES["digits"]["input_shape"],
            "classes": FAMILIES["digits"]["classes"],
            "signature": {"key": zoo.SIGNATURE_KEY, "input": zoo.INPUT_NAME, "output": zoo.OUTPUT_NAME},
        }
        for name, recipe in VARIANTS.items():
            fam = recipe["family"]
            x_tr, y_tr, x_te, y_te = data[fam]
            model, train_s = train(name, x_tr, y_tr)
            save_savedmodel(model, tmp / name, FAMILIES[fam]["input_shape"])
            save_tflite(tmp / name, tmp / f"{name}.tflite")
            manifest["variants"][name] = {"family": fam, "path": name, "tflite": f"{name}.tflite",
                                          "accuracy": 0.0, "accuracy_source": "", "params": 0}
            # Accuracy of the artifacts the server loads, through the same calls.
            tf_top1 = _predict_all(zoo.ZooModel(tmp, name, manifest), x_te).argmax(axis=1)
            lite_top1 = _predict_all(zoo.LiteRTModel(tmp, name, manifest), x_te).argmax(axis=1)
            correct, correct_lite = int((tf_top1 == y_te).sum()), int((lite_top1 == y_te).sum())
            if (tf_top1 == lite_top1).mean() < 0.99:
                raise SystemExit(f"{name}: LiteRT and TensorFlow disagree on top-1 for "
                                 f"{int((tf_top1 != lite_top1).sum())} of {len(y_te)} inputs: conversion is broken")
            ds = FAMILIES[fam]["dataset"]["name"]
            manifest["variants"][name] = {
                "family": fam, "path": name, "tflite": f"{name}.tflite",
                "accuracy": round(correct / len(y_te), 4),
                "accuracy_source": f"measured on held-out 30% split of {ds} (n={len(y_te)})",
                "correct": correct, "n_test": len(y_te),
                "accuracy_litert": round(correct_lite / len(y_te), 4),
                "top1_agreement_litert": round(float((tf_top1 == lite_top1).mean()), 4),
                "params": int(model.count_params()),
                "architecture": recipe["description"],
                "training": {"epochs": recipe["epochs"], "batch_size": recipe["batch_size"],
                             "optimizer": f"Adam, cosine decay from {recipe['learning_rate']}",
                             "seed": SEED, "train_s": round(train_s, 2)},
            }
            log(f"{name}: trained in {train_s:.1f} s, accuracy {correct}/{len(y_te)} = {correct / len(y_te):.4f}"
                f" (LiteRT {correct_lite}/{len(y_te)})")
        manifest["tensorflow"] = tf.__version__
        manifest["built_at"] = datetime.now(UTC).isoformat(timespec="seconds")
        write_json(tmp / zoo.MANIFEST, manifest)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return manifest


def profile_missing(out: Path, profiles: Path) -> None:
    """Measure a minimal profile (1 core, batch 1, both runtimes) for variants without one.

    Never touches an existing profile: those are measured data, kept in the repository.
    Raises ``SystemExit`` if the profiler fails.
    """
    missing = [n for n in zoo.load_manifest(out)["variants"] if not (profiles / f"{n}.json").is_file()]
    if not missing:
        return
    log(f"no profile yet for {', '.join(missing)}: measuring a minimal one (full grid: testbed profile)")
    cmd = [sys.executable, "-m", "testbed.inference.profiler", "--zoo", str(out), "--profiles", str(profiles),
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
    args = ap.parse_args(argv)
    out = Path(args.out).resolve()
    profiles = Path(args.profiles).resolve() if args.profiles else out.parent / "profiles"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    t0 = time.perf_counter()
    with build_lock(out):
        if not args.force and up_to_date(out):
            log(f"zoo {out} is up to date (recipe {RECIPE_VERSION}); nothing to build (--force rebuilds)")
        else:
            build(out)
        if not args.no_profile:
            profile_missing(out, profiles)
    log(f"done in {time.perf_counter() - t0:.1f} s")
    print_table(out, profiles)
    return 0


if __name__ == "__main__":
    sys.exit(main())
