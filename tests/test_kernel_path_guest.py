"""The guest script of the kernel path (benchmarks/kernel_path_guest.sh, not run here: it takes an
hour) parses, and the reduced zoo it installs (build_zoo.py --families) is judged up to date only
as what it is."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "kernel_path_guest.sh"


def test_guest_script_parses():
    res = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
def test_guest_script_is_shellcheck_clean():
    res = subprocess.run(["shellcheck", str(SCRIPT)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout


def _build_zoo():
    sys.path.insert(0, str(REPO / "models"))
    import build_zoo

    return build_zoo


def test_families_option_accepts_trained_families_only():
    bz = _build_zoo()
    assert bz.trained_only("digits") == ["digits"]
    assert bz.trained_variants(["digits"]) == ["digits_small", "digits_medium", "digits_large"]
    with pytest.raises(SystemExit, match="hands not a trained family"):
        bz.trained_only("digits,hands")


def _reduced_zoo(out: Path, bz, variants: list[str]) -> None:
    """A zoo's files as --families digits writes them (empty model files: only their presence counts)."""
    fam = bz.FAMILIES["digits"]
    (out / fam["payloads"]).parent.mkdir(parents=True, exist_ok=True)
    (out / fam["payloads"]).write_bytes(b"")
    entries = {}
    for n in variants:
        (out / n).mkdir(parents=True)
        (out / n / "saved_model.pb").write_bytes(b"")
        (out / f"{n}.tflite").write_bytes(b"")
        entries[n] = {"family": "digits", "path": n, "tflite": f"{n}.tflite", "accuracy": 0.9,
                      "accuracy_source": "test", "params": 1}
    manifest = {"recipe_version": bz.RECIPE_VERSION, "parts": {"trained": bz.PARTS["trained"]},
                "families": {"digits": fam}, "variants": entries}
    (out / "manifest.json").write_text(json.dumps(manifest))


def test_reduced_zoo_is_up_to_date_for_its_families_only(tmp_path):
    bz = _build_zoo()
    _reduced_zoo(tmp_path, bz, bz.trained_variants(["digits"]))
    assert bz.up_to_date(tmp_path, ["digits"])
    assert not bz.up_to_date(tmp_path, ["digits", "parity"])  # parity missing: build it
    assert not bz.up_to_date(tmp_path)  # the full zoo is not there


def test_reduced_zoo_missing_a_variant_is_rebuilt(tmp_path):
    bz = _build_zoo()
    _reduced_zoo(tmp_path, bz, ["digits_small", "digits_medium"])
    assert not bz.up_to_date(tmp_path, ["digits"])
