"""``testbed zoo add``: a model of one's own is checked, hashed, profiled and then served by an
experiment; a bad file is refused naming it, with the zoo left as it was.

Each test works on a temporary zoo of the digits family with ``digits_small`` alone (copied from
the shared ``models/zoo``, which is never written) and its own profiles folder. The good file is
made by ``examples/own_model/train.py`` (a real Keras model trained on the zoo's digits training
split, converted to LiteRT); the profiling is real but short (two shares, batch 1, 20 samples).
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from emu_checks import cgroups_usable

from testbed.cli.main import main
from testbed.core.hashing import file_sha256
from testbed.plan import zoo
from testbed.plan.build import plan_experiment
from testbed.plan.profiles import cpu_time
from testbed.serve.loaders import check_answers, load_model
from testbed.serve.zoo_add import ACCURACY_REFUSE_MARGIN, accuracy_verdict

REPO = Path(__file__).resolve().parent.parent
ZOO = REPO / "models" / "zoo"
PROFILES = REPO / "models" / "profiles"
VARIANT = "digits_lenet"


#: Short profiling: what the profiler's options allow at the least (a share below one core and one
#: at it when the CPU quota can be applied, else share 1 at full speed).
FAST = (["--shares", "0.5,1"] if cgroups_usable() else ["--no-cgroup"]) + [
    "--batches", "1", "--samples", "20", "--isolated-samples", "5", "--warmup", "5", "--handling-n", "100"]


def small_zoo(root: Path, variants: tuple[str, ...] = ("digits_small",)) -> tuple[Path, Path]:
    """``(zoo, profiles)`` under ``root``: the digits family with ``variants`` alone (their
    ``.tflite``, SavedModel, payloads, hashes, profiles and handling rows)."""
    src = zoo.load_manifest(ZOO)
    out, prof = root / "zoo", root / "profiles"
    out.mkdir()
    prof.mkdir()
    manifest = {k: v for k, v in src.items() if k not in ("families", "variants")}
    manifest["families"] = {"digits": src["families"]["digits"]}
    manifest["variants"] = {v: src["variants"][v] for v in variants}
    shutil.copy(ZOO / src["families"]["digits"]["payloads"], out / src["families"]["digits"]["payloads"])
    handling = json.loads((PROFILES / "handling.json").read_text())
    handling["variants"] = {v: handling["variants"][v] for v in variants}
    handling.pop("other_runtimes", None)
    for v in variants:
        shutil.copy(ZOO / f"{v}.tflite", out / f"{v}.tflite")
        shutil.copytree(ZOO / v, out / v)
        shutil.copy(PROFILES / f"{v}.json", prof / f"{v}.json")
    (out / zoo.MANIFEST).write_text(json.dumps(manifest, indent=2))
    (prof / "handling.json").write_text(json.dumps(handling))
    return out, prof


@pytest.fixture
def tiny(tmp_path: Path) -> tuple[Path, Path]:
    """:func:`small_zoo` with ``digits_small`` alone."""
    return small_zoo(tmp_path)


@pytest.fixture(scope="module")
def own_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, float]:
    """``(the .tflite, its held-out top-1)`` from examples/own_model/train.py (offline)."""
    out = tmp_path_factory.mktemp("own") / f"{VARIANT}.tflite"
    proc = subprocess.run([sys.executable, str(REPO / "examples" / "own_model" / "train.py"), "--out", str(out)],
                          capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    acc = float(re.search(r"--accuracy (\d\.\d+)", proc.stdout).group(1))
    assert out.is_file() and (out.with_suffix("") / "saved_model.pb").is_file()
    return out, acc


def _add(path: Path, zoo_dir: Path, variant: str = VARIANT, accuracy: float = 0.9, *extra: str) -> int:
    return main(["zoo", "add", str(path), "--family", "digits", "--variant", variant, "--accuracy", str(accuracy),
                 "--accuracy-source", "measured by the test", "--zoo-dir", str(zoo_dir), *FAST, *extra])


def _snapshot(*dirs: Path) -> dict[str, str]:
    """Every file (and directory) under ``dirs``: relative path -> SHA-256 ('' for a directory)."""
    out = {}
    for d in dirs:
        for p in sorted(d.rglob("*")):
            out[str(p)] = "" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def _experiment(tmp_path: Path, zoo_dir: Path, profiles: Path) -> Path:
    """examples/own_model/experiment.yaml on the temporary zoo and profiles (the rest as it is)."""
    import yaml

    exp = yaml.safe_load((REPO / "examples" / "own_model" / "experiment.yaml").read_text())
    exp["topology"]["source"] = str(REPO / "topologies" / "triangle.yaml")
    exp.update(zoo_dir=str(zoo_dir), profiles_dir=str(profiles), runs_dir=str(tmp_path / "runs"))
    path = tmp_path / "own.yaml"
    path.write_text(yaml.safe_dump(exp))
    return path


def test_a_good_file_is_added_profiled_and_served_by_an_experiment(tiny, own_model, tmp_path):
    zoo_dir, profiles = tiny
    src, acc = own_model
    assert _add(src, zoo_dir, VARIANT, acc) == 0
    manifest = zoo.load_manifest(zoo_dir)
    entry = manifest["variants"][VARIANT]
    # the file, its hash recorded as the build records them, the declared and the measured accuracy
    assert entry["tflite"] == f"{VARIANT}.tflite" and entry["path"] is None
    assert entry[zoo.FILES_SHA256] == {f"{VARIANT}.tflite": file_sha256(src)}
    assert file_sha256(zoo_dir / f"{VARIANT}.tflite") == file_sha256(src)
    assert entry["accuracy"] == round(acc, 4) and entry["accuracy_litert"] == pytest.approx(acc, abs=1e-4)
    assert entry[zoo.ADDED]["accuracy_measured"]["n"] == 540 and entry["params"] > 1000
    assert "digits_small" in manifest["variants"]
    assert not list(zoo_dir.glob(".add-*"))  # the staging is gone
    # a real profile: service times measured with LiteRT at the shares asked for
    prof = zoo.load_profile(profiles, VARIANT)
    shares = {m["cpu_cores"] for m in prof["measurements"] if m["runtime"] == "litert"}
    assert shares == ({0.5, 1.0} if "0.5,1" in FAST else {1.0})
    ct = cpu_time(profiles, VARIANT, "litert")
    assert len(ct.samples_ms) >= 20 and (ct.samples_ms > 0).all() and ct.mean_ms < 100
    assert json.loads((profiles / "handling.json").read_text())["variants"][VARIANT]["runtime"] == "litert"
    # the server's load: the file checked against its hash, then the start-up answer check
    model = load_model(zoo_dir, VARIANT, "litert", manifest)
    assert check_answers(zoo_dir, VARIANT, model, manifest)["accuracy"] >= 0.8
    # an experiment deploys it: planned from its profile, simulated, every query answered by it
    exp = _experiment(tmp_path, zoo_dir, profiles)
    plan = plan_experiment(exp)
    fig = plan.services["edgec"][VARIANT]
    assert fig.runtime == "litert" and str(profiles / f"{VARIANT}.json") in fig.source
    factor = fig.samples_ms[0] / ct.samples_ms[0]  # the in-server call factor of its handling row, >= 1
    assert factor >= 1 and fig.samples_ms == pytest.approx(list(ct.samples_ms * factor))
    assert main(["simulate", str(exp), "--runs-dir", str(tmp_path / "runs")]) == 0
    run = next((tmp_path / "runs").iterdir())
    rec = pd.read_csv(run / "records.csv")
    # its application asks for 0.95: digits_small (0.9352) is below, every query goes to the new model
    assert len(rec) > 100 and set(rec["model"]) == {VARIANT} and (rec["inference_ms"] > 0).all()
    assert (rec["outcome"] == "success").mean() > 0.9
    # the name is taken now: refused without --force, before anything is measured
    before = _snapshot(zoo_dir, profiles)
    assert _add(src, zoo_dir, VARIANT, acc) == 2
    assert _snapshot(zoo_dir, profiles) == before


def test_a_savedmodel_is_added_for_the_tensorflow_runtime(tiny, own_model):
    zoo_dir, profiles = tiny
    saved = own_model[0].with_suffix("")
    assert _add(saved, zoo_dir, "digits_lenet_tf", own_model[1], "--shares", "1") == 0  # TensorFlow: one child
    manifest = zoo.load_manifest(zoo_dir)
    entry = manifest["variants"]["digits_lenet_tf"]
    assert entry["path"] == "digits_lenet_tf" and entry["tflite"] is None
    assert zoo.runtimes_of(manifest, "digits_lenet_tf") == ("tensorflow",)
    assert "digits_lenet_tf/saved_model.pb" in entry[zoo.FILES_SHA256]
    zoo.verify_model_files(zoo_dir, "digits_lenet_tf", manifest, "tensorflow")
    assert cpu_time(profiles, "digits_lenet_tf", "tensorflow").mean_ms > 0
    assert entry["params"] > 1000 and entry["accuracy_tensorflow"] == pytest.approx(own_model[1], abs=0.01)


def _truncated(tmp_path: Path, good: Path) -> Path:
    out = tmp_path / "cut.tflite"
    out.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    return out


def _text(tmp_path: Path, good: Path) -> Path:
    out = tmp_path / "notes.tflite"
    out.write_text("these are my notes, not a model\n" * 20)
    return out


def _wrong_shape(tmp_path: Path, good: Path) -> Path:
    out = tmp_path / "parity.tflite"  # a real model, of 16x16x1 inputs (the parity family), not 32x32x1
    shutil.copy(ZOO / "parity_small.tflite", out)
    return out


def _missing(tmp_path: Path, good: Path) -> Path:
    return tmp_path / "nowhere.tflite"


@pytest.mark.parametrize("make,needle", [
    (_truncated, "cannot be loaded and run"),
    (_text, "not a LiteRT model"),
    (_wrong_shape, "expected float32 [1, 32, 32, 1]"),
    (_missing, "no such file or directory"),
], ids=["truncated", "not-a-model", "wrong-input-shape", "missing"])
def test_a_bad_file_is_refused_naming_it_and_the_zoo_is_unchanged(tiny, own_model, tmp_path, capsys, make, needle):
    zoo_dir, profiles = tiny
    bad = make(tmp_path, own_model[0])
    before = _snapshot(zoo_dir, profiles)
    assert _add(bad, zoo_dir) == 2
    out = capsys.readouterr().out
    assert f"error: {bad}" in out and needle in out, out
    assert _snapshot(zoo_dir, profiles) == before  # nothing written, no staging left behind


def test_a_built_variant_is_never_replaced_and_bad_options_name_themselves(tiny, own_model, capsys):
    zoo_dir, profiles = tiny
    before = _snapshot(zoo_dir, profiles)
    src = own_model[0]
    assert _add(src, zoo_dir, "digits_small", 0.9, "--force") == 2
    assert "a variant of the zoo's build" in capsys.readouterr().out
    assert _add(src, zoo_dir, VARIANT, 95) == 2
    assert "a fraction in [0, 1] (a fraction: 0.95, not 95)" in capsys.readouterr().out
    assert main(["zoo", "add", str(src), "--family", "hands", "--variant", "v", "--accuracy", "0.9",
                 "--accuracy-source", "x", "--zoo-dir", str(zoo_dir)]) == 2
    assert "--family 'hands' is not in the zoo" in capsys.readouterr().out
    assert _add(src, zoo_dir, "bad/name") == 2
    assert "--variant 'bad/name'" in capsys.readouterr().out
    assert _snapshot(zoo_dir, profiles) == before


def test_the_accuracy_rule():
    # at the declared 0.95 and n = 540, one binomial standard deviation is 0.0094
    assert accuracy_verdict(0.95, 513, 540)[0] == "ok"  # 0.95
    assert accuracy_verdict(0.95, 500, 540)[0] == "ok"  # 0.926: 2.5 sd below
    assert accuracy_verdict(0.95, 495, 540)[0] == "warn"  # 0.917: 3.5 sd below
    level, text = accuracy_verdict(0.95, 400, 540)  # 0.741: more than the margin below
    assert level == "refuse" and "--accuracy 0.7407" in text and f"{ACCURACY_REFUSE_MARGIN:g} below" in text
    assert accuracy_verdict(1.0, 539, 540)[0] == "warn"  # a perfect declaration: any miss is said
    with pytest.raises(ValueError):
        accuracy_verdict(0.9, 5, 0)


def test_a_rebuild_keeps_the_added_variants(tiny, tmp_path):
    """models/build_zoo.py: an added variant does not make the zoo out of date, and a rebuild
    copies it into the new zoo (its family there) or says it drops it (its family gone)."""
    sys.path.insert(0, str(REPO / "models"))
    try:
        import build_zoo
    finally:
        sys.path.remove(str(REPO / "models"))
    zoo_dir, _ = tiny
    old = zoo.load_manifest(zoo_dir)
    shutil.copy(ZOO / "digits_medium.tflite", zoo_dir / "mine.tflite")
    old["variants"]["mine"] = {"family": "digits", "path": None, "tflite": "mine.tflite", "accuracy": 0.9,
                               "accuracy_source": "x", "params": 1, zoo.ADDED: {"from": "/x/mine.tflite"}}
    assert zoo.added_variants(old) == ["mine"]
    new_dir = tmp_path / "new"
    new_dir.mkdir()
    new = {"families": {"digits": old["families"]["digits"]}, "variants": {}}
    build_zoo.keep_added(old, zoo_dir, new_dir, new)
    assert new["variants"]["mine"] == old["variants"]["mine"]
    assert file_sha256(new_dir / "mine.tflite") == file_sha256(zoo_dir / "mine.tflite")
    gone = {"families": {"parity": {}}, "variants": {}}
    build_zoo.keep_added(old, zoo_dir, tmp_path, gone)
    assert "mine" not in gone["variants"]
    # up to date: the built variants are the build's, whatever was added
    reduced = tmp_path / "reduced"
    entries = {}
    for n in [*build_zoo.trained_variants(["digits"]), "mine"]:
        (reduced / n).mkdir(parents=True)
        (reduced / n / "saved_model.pb").write_bytes(b"")
        (reduced / f"{n}.tflite").write_bytes(b"")
        entries[n] = {"family": "digits", "path": n, "tflite": f"{n}.tflite", "accuracy": 0.9,
                      "accuracy_source": "test", "params": 1}
    (reduced / build_zoo.FAMILIES["digits"]["payloads"]).write_bytes(b"")
    doc = {"recipe_version": build_zoo.RECIPE_VERSION, "parts": {"trained": build_zoo.PARTS["trained"]},
           "families": {"digits": build_zoo.FAMILIES["digits"]}, "variants": entries}
    (reduced / zoo.MANIFEST).write_text(json.dumps(doc))
    assert not build_zoo.up_to_date(reduced, ["digits"])  # "mine" is not the build's and not marked added
    entries["mine"][zoo.ADDED] = {"from": "/x/mine.tflite"}
    (reduced / zoo.MANIFEST).write_text(json.dumps(doc))
    assert build_zoo.up_to_date(reduced, ["digits"])
