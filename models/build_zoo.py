#!/usr/bin/env python3
"""Build the model zoo: a real image-classification family trained here, offline, in ~1 minute.

    python models/build_zoo.py [--out models/zoo] [--profiles models/profiles] [--force]

Data: scikit-learn's bundled digits (1797 grey 8x8 images, 10 classes; shipped inside the
package, nothing is downloaded), scaled to [0, 1] (pixel / 16), upscaled bilinearly to 32x32x1
float32, split 70/30 stratified by class with a fixed seed. The held-out 30% is never used for
training: it gives each variant's measured accuracy and is saved as the workload's payloads.

Variants (one family, "digits"; clearly different accuracy and speed):

* ``digits_small``: a tiny MLP on the 4x4 average-pooled image (16 -> 32 -> 10). Fastest, least
  accurate (about 0.93 on the held-out split).
* ``digits_large``: a VGG-style CNN (2x conv40, 2x conv80, 2x conv160 at 32/16/8 px, each with
  BatchNorm, dense 128; ~59 M multiply-adds per image). About 0.98 accurate and ~5-8x slower per
  query than digits_small on one core.

Outputs (``models/zoo`` is git-ignored; ``models/profiles`` is kept):

* ``<out>/<variant>/``: TensorFlow SavedModel, signature ``serving_default``:
  ``x`` float32 [None, 32, 32, 1] -> ``probabilities`` float32 [None, 10] (softmax).
* ``<out>/manifest.json``: recipe version, family, input shape, classes, and per variant its path,
  accuracy (top-1 measured on the held-out split through the saved signature), its source, params.
* ``<out>/payloads.npz``: the held-out images ``x`` float32 [N, 32, 32, 1] and labels ``y`` int64 [N].
* ``<profiles>/<variant>.json``: single-query service time [ms] (mean/p50/p95/p99 of >= 200 calls
  after warm-up) with 1 intra-op and 1 inter-op TensorFlow thread, measured in a fresh subprocess
  through ``testbed.inference.zoo.ZooModel.predict`` -- the call the inference server makes.

Idempotent: if ``<out>/manifest.json`` has this ``RECIPE_VERSION`` and every file is there, it does
nothing (it only re-profiles if a profile is missing). ``--force`` rebuilds. Bump RECIPE_VERSION
whenever anything below changes the models. Seeds are fixed; figures may still differ slightly
across CPUs (floating-point summation order).
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
RECIPE_VERSION = 1
SEED = 0
TEST_FRACTION = 0.3
UPSCALE = 4  # 8x8 -> 32x32
PROFILE_SAMPLES = 300
PROFILE_WARMUP = 50

#: Training recipe per variant (epochs, batch size, peak Adam learning rate with cosine decay).
VARIANTS: dict[str, dict[str, Any]] = {
    "digits_small": {
        "description": "MLP on the 4x4 average-pooled image: avgpool8 -> dense32 relu -> dense10 softmax",
        "epochs": 60, "batch_size": 128, "learning_rate": 3e-2,
    },
    "digits_large": {
        "description": "VGG-style CNN, each conv 3x3 + BatchNorm + ReLU: 2x conv40, pool, 2x conv80, pool, "
                       "2x conv160, pool, dense128 relu, dropout0.3, dense10 softmax",
        "epochs": 2, "batch_size": 16, "learning_rate": 1e-3,
    },
}


def log(msg: str) -> None:
    """Print a progress line (flushed, so a parent process sees it live)."""
    print(f"[build_zoo] {msg}", flush=True)


def load_data() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """sklearn digits -> (x_train, y_train, x_test, y_test); x float32 [N, 32, 32, 1] in [0, 1], y int64.

    Split: stratified, ``TEST_FRACTION`` held out, ``random_state=SEED`` (n_test = 540 of 1797).
    """
    from scipy.ndimage import zoom
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    img = digits.images.astype(np.float32) / 16.0  # [1797, 8, 8], 0..16 -> 0..1
    big = zoom(img, (1, UPSCALE, UPSCALE), order=1, mode="nearest")  # bilinear -> [1797, 32, 32]
    x = np.clip(big, 0.0, 1.0).astype(np.float32)[..., None]
    y = digits.target.astype(np.int64)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=TEST_FRACTION, stratify=y, random_state=SEED)
    return x_tr, y_tr, x_te, y_te


def make_model(name: str) -> Any:
    """The Keras model of variant ``name`` (input [None, 32, 32, 1], softmax output [None, 10])."""
    import keras

    layers = keras.layers
    if name == "digits_small":
        body = [layers.AveragePooling2D(8), layers.Flatten(), layers.Dense(32, activation="relu")]
    elif name == "digits_large":
        body = []
        for i, width in enumerate((40, 80, 160)):
            for j in "ab":  # conv (no bias: BatchNorm has one) -> BatchNorm -> ReLU
                body += [layers.Conv2D(width, 3, padding="same", use_bias=False, name=f"conv{i}{j}"),
                         layers.BatchNormalization(momentum=0.9, name=f"bn{i}{j}"), layers.ReLU()]
            body.append(layers.MaxPooling2D(2))
        body += [layers.Flatten(), layers.Dense(128, activation="relu"), layers.Dropout(0.3)]
    else:
        raise ValueError(f"no architecture for variant {name!r}")
    return keras.Sequential([keras.Input(zoo.INPUT_SHAPE, name=zoo.INPUT_NAME), *body,
                             layers.Dense(zoo.NUM_CLASSES, activation="softmax")], name=name)


def train(name: str, x: np.ndarray, y: np.ndarray) -> tuple[Any, float]:
    """Train variant ``name`` on (x, y) with its recipe and the fixed seed; return (model, seconds)."""
    import keras

    recipe = VARIANTS[name]
    keras.utils.set_random_seed(SEED)
    model = make_model(name)
    steps = recipe["epochs"] * int(np.ceil(len(x) / recipe["batch_size"]))
    lr = keras.optimizers.schedules.CosineDecay(recipe["learning_rate"], decay_steps=steps)
    model.compile(optimizer=keras.optimizers.Adam(lr), loss="sparse_categorical_crossentropy")
    t = time.perf_counter()
    model.fit(x, y, epochs=recipe["epochs"], batch_size=recipe["batch_size"], shuffle=True, verbose=0)
    return model, time.perf_counter() - t


def save_savedmodel(model: Any, path: Path) -> None:
    """Save ``model`` as a SavedModel with signature ``serving_default``: x [None,32,32,1] -> probabilities."""
    import tensorflow as tf

    class Serving(tf.Module):
        def __init__(self, net: Any):
            super().__init__()
            self.net = net

        @tf.function(input_signature=[tf.TensorSpec([None, *zoo.INPUT_SHAPE], tf.float32, name=zoo.INPUT_NAME)])
        def serve(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
            return {zoo.OUTPUT_NAME: self.net(x, training=False)}

    module = Serving(model)
    tf.saved_model.save(module, str(path), signatures={zoo.SIGNATURE_KEY: module.serve})


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


def build(out: Path) -> dict[str, Any]:
    """Train, save and evaluate every variant into a temp dir, then swap it in as ``out``.

    Returns the manifest. Raises ``SystemExit`` if ``out`` exists but is not a zoo (never deletes
    a foreign directory).
    """
    if out.exists() and any(out.iterdir()) and not (out / zoo.MANIFEST).is_file():
        raise SystemExit(f"{out} exists, is not empty and has no {zoo.MANIFEST}: refusing to replace it")
    t0 = time.perf_counter()
    zoo.configure_tf_threads(intra_op=min(2, os.cpu_count() or 1), inter_op=1)  # imports TensorFlow
    import tensorflow as tf

    log(f"tensorflow {tf.__version__} imported in {time.perf_counter() - t0:.1f} s")
    x_tr, y_tr, x_te, y_te = load_data()
    log(f"digits: {len(x_tr)} train / {len(x_te)} held-out images, 32x32x1")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.build-", dir=out.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; the zoo is read by other users / hosts too
    try:
        variants: dict[str, dict[str, Any]] = {}
        for name, recipe in VARIANTS.items():
            model, train_s = train(name, x_tr, y_tr)
            save_savedmodel(model, tmp / name)
            # Accuracy of the artifact the server loads, through the same signature call.
            manifest_stub = {"variants": {name: {"path": name}}}
            served = zoo.ZooModel(tmp, name, manifest_stub)
            probs = np.concatenate([served.predict(x_te[i:i + 256]) for i in range(0, len(x_te), 256)])
            correct = int((probs.argmax(axis=1) == y_te).sum())
            variants[name] = {
                "path": name,
                "accuracy": round(correct / len(y_te), 4),
                "accuracy_source": f"measured on held-out 30% split of sklearn digits (n={len(y_te)})",
                "correct": correct,
                "n_test": len(y_te),
                "params": int(model.count_params()),
                "architecture": recipe["description"],
                "training": {"epochs": recipe["epochs"], "batch_size": recipe["batch_size"],
                             "optimizer": f"Adam, cosine decay from {recipe['learning_rate']}",
                             "seed": SEED, "train_s": round(train_s, 2)},
            }
            log(f"{name}: trained in {train_s:.1f} s, accuracy {correct}/{len(y_te)} = {correct / len(y_te):.4f}")
        np.savez_compressed(tmp / zoo.PAYLOADS, x=x_te.astype(np.float32), y=y_te.astype(np.int64))
        manifest = {
            "recipe_version": RECIPE_VERSION,
            "family": "digits",
            "input_shape": list(zoo.INPUT_SHAPE),
            "classes": zoo.NUM_CLASSES,
            "signature": {"key": zoo.SIGNATURE_KEY, "input": zoo.INPUT_NAME, "output": zoo.OUTPUT_NAME},
            "dataset": {"name": "sklearn.datasets.load_digits", "n_total": len(x_tr) + len(x_te),
                        "n_train": len(x_tr), "n_test": len(x_te), "test_fraction": TEST_FRACTION,
                        "split": f"stratified, random_state={SEED}",
                        "preprocessing": "pixel/16, bilinear upscale 8x8 -> 32x32, clip to [0, 1]"},
            "variants": variants,
            "tensorflow": tf.__version__,
            "built_at": datetime.now(UTC).isoformat(timespec="seconds"),
        }
        write_json(tmp / zoo.MANIFEST, manifest)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return manifest


def profile_all(out: Path, profiles: Path, samples: int) -> None:
    """Measure every variant's single-query service time in THIS process (1 intra/inter-op thread).

    Run it in a fresh process (``--profile-only``): TensorFlow's thread pools are fixed at first use.
    """
    zoo.configure_tf_threads(intra_op=1, inter_op=1)
    manifest = zoo.load_manifest(out)
    x, _ = zoo.load_payloads(out)
    for name in manifest["variants"]:
        model = zoo.ZooModel(out, name, manifest)
        prof = zoo.service_time_profile(model, x, samples=samples, warmup=PROFILE_WARMUP)
        prof = {"variant": name, **prof, "threads": {"intra_op": 1, "inter_op": 1},
                "recipe_version": manifest["recipe_version"], "machine": zoo.machine_info(),
                "measured_at": datetime.now(UTC).isoformat(timespec="seconds")}
        write_json(profiles / f"{name}.json", prof)
        log(f"{name}: p50 {prof['p50_ms']:.3f} ms, p95 {prof['p95_ms']:.3f} ms ({samples} calls)")


def run_profiler(out: Path, profiles: Path, samples: int) -> None:
    """Run :func:`profile_all` in a subprocess. Raises ``SystemExit`` if it fails."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--out", str(out), "--profiles", str(profiles),
           "--samples", str(samples), "--profile-only"]
    rc = subprocess.run(cmd, check=False).returncode
    if rc != 0:
        raise SystemExit(f"profiling failed (exit {rc}): {' '.join(cmd)}")


def print_table(out: Path, profiles: Path) -> None:
    """Print variant / params / accuracy / service time p50 and p95 [ms]."""
    manifest = zoo.load_manifest(out)
    print(f"{'variant':<14} {'params':>9} {'accuracy':>9} {'p50_ms':>8} {'p95_ms':>8}")
    for name, v in manifest["variants"].items():
        try:
            prof = zoo.load_profile(profiles, name)
            p50, p95 = f"{prof['p50_ms']:.3f}", f"{prof['p95_ms']:.3f}"
        except zoo.ZooError:
            p50 = p95 = "-"
        print(f"{name:<14} {v['params']:>9} {v['accuracy']:>9.4f} {p50:>8} {p95:>8}")
    print(f"zoo: {out}  profiles: {profiles}  (accuracy: {manifest['variants'][name]['accuracy_source']})")


def main(argv: list[str] | None = None) -> int:
    """Command line entry point; returns the exit code."""
    here = Path(__file__).resolve().parent
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(here / "zoo"), help="zoo directory (default: models/zoo)")
    ap.add_argument("--profiles", default=None, help="profiles directory (default: <out>/../profiles)")
    ap.add_argument("--force", action="store_true", help="rebuild even if the zoo is up to date")
    ap.add_argument("--samples", type=int, default=PROFILE_SAMPLES, help="timed calls per profile (>= 200)")
    ap.add_argument("--profile-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    out = Path(args.out).resolve()
    profiles = Path(args.profiles).resolve() if args.profiles else out.parent / "profiles"
    if args.samples < 200:
        ap.error("--samples must be >= 200")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if args.profile_only:
        profile_all(out, profiles, args.samples)
        return 0
    t0 = time.perf_counter()
    with build_lock(out):
        if not args.force and up_to_date(out):
            missing = [n for n in VARIANTS if not (profiles / f"{n}.json").is_file()]
            if not missing:
                log(f"zoo {out} is up to date (recipe {RECIPE_VERSION}); nothing to do (--force rebuilds)")
                print_table(out, profiles)
                return 0
            log(f"zoo is up to date; profiling missing variants: {', '.join(missing)}")
        else:
            build(out)
        run_profiler(out, profiles, args.samples)
    log(f"done in {time.perf_counter() - t0:.1f} s")
    print_table(out, profiles)
    return 0


if __name__ == "__main__":
    sys.exit(main())
