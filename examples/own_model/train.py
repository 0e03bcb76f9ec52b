#!/usr/bin/env python3
"""Train a small model of one's own on the zoo's digits data, offline, and write it as a LiteRT file.

    python examples/own_model/train.py [--out examples/own_model/build/digits_lenet.tflite] [--epochs 8]

Data: the digits family's training split, the same 70 % that ``models/build_zoo.py`` trains the
zoo's digits variants on (``build_zoo.load_data``: scikit-learn's bundled digits, pixel/16,
upscaled to 32x32x1; nothing is downloaded). Its held-out 30 % is never trained on: it is the
zoo's payloads, which ``testbed zoo add`` measures the model's accuracy on again.

Model: a LeNet-style CNN (conv 6 5x5 stride 2, conv 12 3x3 stride 2, dense 32, softmax 10),
trained with Adam, seed 0. Export: the zoo's contract, written by the build's own helpers
(``build_zoo.save_savedmodel``: signature ``serving_default``, input ``x`` float32 [None, 32, 32, 1]
-> ``probabilities`` [None, 10]; ``build_zoo.save_tflite``: float32, variables frozen), so the
SavedModel directory written next to the ``.tflite`` can be added as well (runtime ``tensorflow``).

Prints the top-1 accuracy of the ``.tflite`` on the held-out split (LiteRT, one input per call, as
a server answers) and the ``testbed zoo add`` command line that adds it with that figure.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "models"))  # the zoo build's data and export helpers
sys.path.insert(0, str(REPO))

import build_zoo  # noqa: E402


def make_model(classes: int = 10) -> object:
    """The LeNet-style CNN (softmax output) on 32x32x1 inputs."""
    import keras

    layers = keras.layers
    return keras.Sequential([
        keras.Input((32, 32, 1), name="x"),
        layers.Conv2D(6, 5, strides=2, padding="same", activation="relu"),
        layers.Conv2D(12, 3, strides=2, padding="same", activation="relu"),
        layers.Flatten(),
        layers.Dense(32, activation="relu"),
        layers.Dense(classes, activation="softmax"),
    ], name="digits_lenet")


def litert_top1(path: Path, x: np.ndarray, y: np.ndarray) -> int:
    """Inputs of ``x`` answered right by the ``.tflite`` at ``path``, one per call."""
    from ai_edge_litert.interpreter import Interpreter

    interp = Interpreter(model_path=str(path))
    interp.allocate_tensors()
    inp, out = interp.get_input_details()[0]["index"], interp.get_output_details()[0]["index"]
    right = 0
    for i in range(len(x)):
        interp.set_tensor(inp, x[i:i + 1])
        interp.invoke()
        right += int(np.argmax(interp.get_tensor(out)[0]) == y[i])
    return right


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=HERE / "build" / "digits_lenet.tflite", help="the .tflite to write")
    ap.add_argument("--epochs", type=int, default=8)
    args = ap.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras

    x_tr, y_tr, x_te, y_te = build_zoo.load_data()["digits"]
    keras.utils.set_random_seed(0)
    model = make_model()
    model.compile(optimizer=keras.optimizers.Adam(3e-3), loss="sparse_categorical_crossentropy")
    t = time.perf_counter()
    model.fit(x_tr, y_tr, epochs=args.epochs, batch_size=32, shuffle=True, verbose=0)
    print(f"trained on {len(x_tr)} digits in {time.perf_counter() - t:.1f} s ({model.count_params()} params)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    saved = args.out.with_suffix("")  # the SavedModel directory beside the .tflite
    build_zoo.save_savedmodel(model, saved, [32, 32, 1])
    build_zoo.save_tflite(saved, args.out)
    right = litert_top1(args.out, x_te, y_te)
    acc = right / len(y_te)
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes) and the SavedModel {saved}/")
    print(f"top-1 on the held-out split (LiteRT, one input per call): {right}/{len(y_te)} = {acc:.4f}")
    shown = os.path.relpath(args.out) if not os.path.relpath(args.out).startswith("..") else str(args.out)
    print("add it to the zoo:")
    print(f"  testbed zoo add {shown} --family digits --variant digits_lenet --accuracy {acc:.4f} "
          f"--accuracy-source \"measured: top-1 {right}/{len(y_te)} on the digits held-out split "
          f"(examples/own_model/train.py, seed 0)\"")
    return 0


if __name__ == "__main__":
    sys.exit(main())
