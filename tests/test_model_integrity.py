"""Model integrity: every model file's SHA-256 is recorded when the zoo is built and checked when a
model is loaded; a server answers a labelled sample at start; every integrity failure is exit
code 7 (:data:`testbed.core.errors.EXIT_INTEGRITY`) with a message naming the file, and the server
does not serve.

Each test works on a copy of the digits family's small variant in a temporary zoo (the shared
``models/zoo`` is never written): real LiteRT, real server subprocesses on 127.0.0.1."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from testbed.core.errors import EXIT_INTEGRITY
from testbed.core.hashing import file_sha256
from testbed.plan import zoo

REPO = Path(__file__).resolve().parent.parent
ZOO = REPO / "models" / "zoo"
VARIANT = "digits_small"


def _tiny_zoo(tmp_path: Path, variants: tuple[str, ...] = (VARIANT,)) -> Path:
    """``tmp_path/zoo``: the digits family with ``variants`` alone (SavedModel, ``.tflite``,
    payloads), copied from the shared zoo, its hashes recorded as the build records them."""
    src = zoo.load_manifest(ZOO)
    out = tmp_path / "zoo"
    out.mkdir()
    manifest = {k: v for k, v in src.items() if k not in ("families", "variants")}
    manifest["families"] = {"digits": src["families"]["digits"]}
    manifest["variants"] = {}
    shutil.copy(ZOO / src["families"]["digits"]["payloads"], out / src["families"]["digits"]["payloads"])
    for name in variants:
        manifest["variants"][name] = dict(src["variants"][name])
        manifest["variants"][name].pop(zoo.FILES_SHA256, None)
        shutil.copy(ZOO / f"{name}.tflite", out / f"{name}.tflite")
        shutil.copytree(ZOO / name, out / name)
    assert zoo.record_hashes(out, manifest) >= 3
    (out / zoo.MANIFEST).write_text(json.dumps(manifest, indent=2))
    return out


def _flip_weights(tflite: Path, n: int = 200) -> int:
    """Flip ``n`` bytes (XOR 0xFF) spread over the largest constant tensor of a ``.tflite`` file,
    found by its bytes in the file: the weights, not the flatbuffer's header or tables; each the
    most significant byte (sign and exponent) of a float32 weight, little-endian. Returns the
    offset of that tensor."""
    from ai_edge_litert.interpreter import Interpreter

    data = bytearray(tflite.read_bytes())
    interp = Interpreter(model_content=bytes(data))
    best = b""
    for t in interp.get_tensor_details():
        try:
            raw = interp.get_tensor(t["index"]).tobytes()
        except ValueError:  # not a constant tensor
            continue
        if len(raw) > len(best) and data.find(raw) >= 0:
            best = raw
    floats = len(best) // 4
    assert floats >= n, len(best)
    at = data.find(best)
    for i in range(n):
        data[at + 4 * (i * floats // n) + 3] ^= 0xFF
    tflite.write_bytes(bytes(data))
    return at


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(tmp_path: Path, zoo_dir: Path, port: int) -> tuple[subprocess.CompletedProcess, Path]:
    """Run the inference server of one cluster on ``zoo_dir`` (LiteRT) until it exits (60 s at most:
    a server that serves never exits by itself, and the test then fails on the timeout)."""
    from testbed.plan.boundaries import ServerConfig

    ready = tmp_path / "ready.json"
    cfg = ServerConfig(cluster="edge", host="127.0.0.1", port=port, zoo_dir=str(zoo_dir), models=[VARIANT],
                       runtimes={VARIANT: "litert"}, workers=1, threads=1, queue_limit=4, cpu_cores=1.0,
                       warmup_calls=2, ready_file=str(ready))
    path = tmp_path / "server.json"
    path.write_text(cfg.model_dump_json())
    out = subprocess.run([sys.executable, "-m", "testbed.serve.server", str(path)], capture_output=True, text=True,
                         cwd=REPO, timeout=60)
    return out, ready


def _refused_to_serve(out: subprocess.CompletedProcess, ready: Path, port: int) -> None:
    """The server exited 7 before it served: no ready file, nothing listening on its port."""
    assert out.returncode == EXIT_INTEGRITY == 7, out.stderr
    assert not ready.exists()
    with socket.socket() as s, pytest.raises(ConnectionRefusedError):
        s.connect(("127.0.0.1", port))


def test_the_build_records_every_model_file_and_a_load_checks_them(tmp_path):
    out = _tiny_zoo(tmp_path)
    manifest = zoo.load_manifest(out)
    files = manifest["variants"][VARIANT][zoo.FILES_SHA256]
    assert f"{VARIANT}.tflite" in files and f"{VARIANT}/saved_model.pb" in files
    assert any(f.startswith(f"{VARIANT}/variables/") for f in files)
    assert files[f"{VARIANT}.tflite"] == file_sha256(out / f"{VARIANT}.tflite")
    for runtime in ("litert", "tensorflow"):
        zoo.verify_model_files(out, VARIANT, manifest, runtime)
    # a SavedModel's weights are checked too (tensorflow runtime), the .tflite's not read by it
    var = next(p for p in (out / VARIANT / "variables").iterdir() if p.name.startswith("variables.data"))
    raw = bytearray(var.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    var.write_bytes(bytes(raw))
    with pytest.raises(zoo.ZooIntegrityError, match=f"model file {var} .*differs from the") as got:
        zoo.verify_model_files(out, VARIANT, manifest, "tensorflow")
    assert got.value.exit_code == 7
    zoo.verify_model_files(out, VARIANT, manifest, "litert")


def test_a_zoo_without_hashes_is_refused_saying_how_to_record_them(tmp_path):
    """The shared zoo was built before the hashes were recorded: its loads say how to record them,
    and the build script records them without a rebuild (what install.sh runs)."""
    out = _tiny_zoo(tmp_path)
    manifest = zoo.load_manifest(out)
    recorded = manifest["variants"][VARIANT].pop(zoo.FILES_SHA256)
    (out / zoo.MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(zoo.ZooIntegrityError, match=r"records no SHA-256 of it .* python models/build_zoo.py --out"):
        zoo.verify_model_files(out, VARIANT, zoo.load_manifest(out), "litert")
    sys.path.insert(0, str(REPO / "models"))
    try:
        import build_zoo
    finally:
        sys.path.remove(str(REPO / "models"))
    build_zoo.record_missing_hashes(out)
    assert zoo.load_manifest(out)["variants"][VARIANT][zoo.FILES_SHA256] == recorded


def test_a_server_refuses_to_serve_a_model_whose_weights_were_corrupted(tmp_path):
    """With 200 bytes flipped inside a digits model's weights the run
    reported success 1.000 while 6-10 % of its answers were right. The file's hash now differs:
    the server names the file, exits 7 and never serves."""
    out = _tiny_zoo(tmp_path)
    _flip_weights(out / f"{VARIANT}.tflite")
    port = _free_port()
    got, ready = _serve(tmp_path, out, port)
    _refused_to_serve(got, ready, port)
    assert f"model file {out / f'{VARIANT}.tflite'} (variant '{VARIANT}'): SHA-256" in got.stderr
    assert "the file is corrupt or was replaced" in got.stderr


def test_a_server_refuses_a_model_that_answers_its_labelled_sample_far_below_its_accuracy(tmp_path):
    """Weights corrupted before their hash was recorded (the hash then matches): the labelled
    start-up sample catches them; the server exits 7 naming the file and never serves."""
    out = _tiny_zoo(tmp_path)
    _flip_weights(out / f"{VARIANT}.tflite")
    manifest = zoo.load_manifest(out)
    zoo.record_hashes(out, manifest)
    (out / zoo.MANIFEST).write_text(json.dumps(manifest))
    port = _free_port()
    got, ready = _serve(tmp_path, out, port)
    _refused_to_serve(got, ready, port)
    assert f"model file {out / f'{VARIANT}.tflite'} (variant '{VARIANT}', litert): answered" in got.stderr
    assert "labelled samples of its family right" in got.stderr and "refusing to serve" in got.stderr


def test_an_intact_model_passes_its_start_up_sample_and_serves(tmp_path):
    """The same server on the intact copy: ready, its check in the ready file, the port answers."""
    from testbed.serve.loaders import ANSWER_CHECK_N, check_answers, load_model

    out = _tiny_zoo(tmp_path)
    manifest = zoo.load_manifest(out)
    model = load_model(out, VARIANT, "litert", manifest)
    got = check_answers(out, VARIANT, model, manifest)
    assert got is not None and got["n"] == ANSWER_CHECK_N and got["accuracy"] >= got["floor"]
    x, y = zoo.load_payloads(out, "digits")
    expect = np.mean([int(np.argmax(model.predict(x[i:i + 1])[0]) == y[i]) for i in range(ANSWER_CHECK_N)])
    assert got["accuracy"] == pytest.approx(expect)
    # the check does not apply where there is no labelled answer (random ImageNet weights)
    full = zoo.load_manifest(ZOO)
    if "mobilenet_v3_small" in full["variants"]:
        assert check_answers(ZOO, "mobilenet_v3_small", model, full) is None


@pytest.mark.emulation
@pytest.mark.skipif(os.geteuid() != 0, reason="emulation needs root")
def test_testbed_run_on_a_corrupted_model_exits_7_naming_the_file(tmp_path, capsys):
    """The whole command: the triangle on a copy of the zoo whose digits_small SavedModel weights were
    corrupted. The plan checks the hashes of the models the experiment uses, so the run stops with 7
    and the file's name before anything is brought up (the servers' own check is tested above)."""
    import yaml

    from testbed.cli.main import main

    out = _tiny_zoo(tmp_path, (VARIANT, "digits_large"))
    var = next(p for p in (out / VARIANT / "variables").iterdir() if p.name.startswith("variables.data"))
    raw = bytearray(var.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    var.write_bytes(bytes(raw))
    data = yaml.safe_load((REPO / "experiments" / "triangle.yaml").read_text())
    data.update(zoo_dir=str(out), profiles_dir=str(REPO / "models" / "profiles"), runs_dir=str(tmp_path / "runs"))
    data["topology"]["source"] = str(REPO / "topologies" / "triangle.yaml")
    exp = tmp_path / "e.yaml"
    exp.write_text(yaml.safe_dump(data, sort_keys=False))
    for command in ("plan", "simulate", "run"):
        code = main([command, str(exp), *(["--duration", "2"] if command != "plan" else [])])
        said = " ".join(capsys.readouterr().out.split())
        assert code == 7, (command, said)
        assert f"model file {var} (variant '{VARIANT}'): SHA-256" in said and "rebuild the zoo" in said, said
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
