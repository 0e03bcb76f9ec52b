"""The models an experiment uses are checked against the zoo's recorded SHA-256 when it is planned
(``testbed plan``, ``simulate``): a corrupt file is a plan error naming it (exit code 7, the one code
of every integrity failure), not a bring-up failure seconds later. The digests are cached by size
and modification time, so a second plan reads no model file again.

The zoo here is a copy of the digits family's two variants the triangle uses, in a temporary folder
(the shared ``models/zoo`` is never written); the hash cache is a temporary one.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import yaml

from testbed.cli.main import main
from testbed.core.errors import EXIT_INTEGRITY
from testbed.plan import zoo

REPO = Path(__file__).resolve().parent.parent
ZOO = REPO / "models" / "zoo"
TRIANGLE = REPO / "experiments" / "triangle.yaml"
VARIANTS = ("digits_small", "digits_large")


@pytest.fixture()
def tiny_zoo(tmp_path, monkeypatch) -> Path:
    """A copy of the digits variants of the triangle, hashes recorded; a fresh hash cache."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(zoo, "_HASHES", None, raising=False)
    src = zoo.load_manifest(ZOO)
    out = tmp_path / "zoo"
    out.mkdir()
    manifest = {k: v for k, v in src.items() if k not in ("families", "variants")}
    manifest["families"] = {"digits": src["families"]["digits"]}
    shutil.copy(ZOO / src["families"]["digits"]["payloads"], out / src["families"]["digits"]["payloads"])
    manifest["variants"] = {}
    for name in VARIANTS:
        manifest["variants"][name] = dict(src["variants"][name])
        shutil.copy(ZOO / f"{name}.tflite", out / f"{name}.tflite")
        shutil.copytree(ZOO / name, out / name)
    zoo.record_hashes(out, manifest)
    (out / zoo.MANIFEST).write_text(__import__("json").dumps(manifest, indent=2))
    return out


def _experiment(tmp_path: Path, zoo_dir: Path, runtime: str = "tensorflow") -> Path:
    data = yaml.safe_load(TRIANGLE.read_text())
    data["topology"]["source"] = str(REPO / "topologies" / "triangle.yaml")
    data.update(zoo_dir=str(zoo_dir), profiles_dir=str(REPO / "models" / "profiles"))
    for c in data["clusters"]:
        c["server"] = {"runtime": runtime}
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("runtime, file", [("tensorflow", "digits_large/saved_model.pb"),
                                           ("litert", "digits_small.tflite")])
def test_a_corrupt_model_file_fails_plan_and_simulate_naming_it(tiny_zoo, tmp_path, capsys, runtime, file):
    exp = _experiment(tmp_path, tiny_zoo, runtime)
    assert main(["plan", str(exp)]) == 0, capsys.readouterr().out
    target = tiny_zoo / file
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0xFF
    target.write_bytes(bytes(data))
    for args in (["plan", str(exp)], ["simulate", str(exp), "--runs-dir", str(tmp_path / "runs")]):
        assert main(args) == EXIT_INTEGRITY
        out = capsys.readouterr().out
        assert f"model file {target}" in out and "differs from the" in out and "rebuild the zoo" in out
    assert not (tmp_path / "runs").exists()


def test_a_second_plan_reads_no_model_file_again(tiny_zoo, tmp_path, capsys, monkeypatch):
    exp = _experiment(tmp_path, tiny_zoo)
    assert main(["plan", str(exp)]) == 0
    assert zoo.hash_cache_path().is_file()
    hashed: list[str] = []
    real = zoo.file_sha256
    monkeypatch.setattr(zoo, "file_sha256", lambda p: hashed.append(str(p)) or real(p))
    monkeypatch.setattr(zoo, "_HASHES", None, raising=False)  # as a new process: read back from the file
    assert main(["plan", str(exp)]) == 0
    assert hashed == []
    # a file rewritten (size or modification time changed) is hashed again, and its change is seen
    target = tiny_zoo / "digits_small.tflite"
    os.utime(target, ns=(target.stat().st_atime_ns, target.stat().st_mtime_ns + 10**9))
    exp_lite = _experiment(tmp_path, tiny_zoo, "litert")
    assert main(["plan", str(exp_lite)]) == 0
    assert str(target.resolve()) in hashed
