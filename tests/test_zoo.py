"""Model zoo: families and variants in the manifest, payloads, TensorFlow vs LiteRT, profile reading.

The zoo is the repository's ``models/zoo`` (built by ``ensure_zoo`` if missing, ~3-4 min).
The real image families (hands, faces, imagenet) have their own tests: tests/test_real_zoo.py.
The profile-reading tests use small profile files written here, so their expected values are exact.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from testbed.plan import profiles, zoo
from testbed.serve import loaders

REPO = Path(__file__).resolve().parent.parent
ZOO = REPO / "models" / "zoo"
PROFILES = REPO / "models" / "profiles"


@pytest.fixture(scope="module")
def manifest() -> dict:
    return zoo.ensure_zoo(ZOO)


TRAINED = ("digits", "parity", "cancer")


def test_three_families_of_three_variants_with_measured_accuracy(manifest):
    fams = {f: v for f, v in zoo.families(manifest).items() if f in TRAINED}
    assert set(fams) == set(TRAINED)
    assert all(len(v) >= 3 for v in fams.values()), fams
    assert {"digits_small", "digits_large"} <= set(fams["digits"])  # the experiments use these names
    shapes = {f: tuple(manifest["families"][f]["input_shape"]) for f in fams}
    assert shapes["digits"] == (32, 32, 1) and shapes["parity"] == (16, 16, 1) and shapes["cancer"] == (30,)
    for name, v in manifest["variants"].items():
        if v["family"] not in TRAINED:
            continue
        n = manifest["families"][v["family"]]["dataset"]["n_test"]
        assert v["accuracy_source"].startswith("measured on held-out") and f"(n={n})" in v["accuracy_source"]
        assert v["accuracy"] == round(v["correct"] / n, 4) and 0.5 < v["accuracy"] <= 1.0
        assert v["top1_agreement_litert"] >= 0.99, name
    for fam, names in fams.items():  # a real accuracy range inside each family
        acc = [manifest["variants"][n]["accuracy"] for n in names]
        params = [manifest["variants"][n]["params"] for n in names]
        assert max(params) > 20 * min(params), fam
        assert max(acc) - min(acc) >= 0.02, (fam, acc)


def test_payloads_and_request_bodies_per_family(manifest):
    for fam, info in manifest["families"].items():
        if fam not in TRAINED:
            continue
        x, y = zoo.load_payloads(ZOO, fam)
        assert x.dtype == np.float32 and x.shape == (info["dataset"]["n_test"], *info["input_shape"])
        assert set(np.unique(y)) == set(range(info["classes"]))
        bodies, labels = zoo.request_bodies(ZOO, fam, 5)
        assert len(bodies) == 5 and labels == [int(v) for v in y[:5]]
        inst = json.loads(bodies[0])["instances"]
        assert np.asarray(inst).shape == (1, *info["input_shape"])
    with pytest.raises(zoo.ZooError, match="'imagenet1k'.*cancer, digits, faces"):
        zoo.request_bodies(ZOO, "imagenet1k", 1)


def test_tensorflow_and_litert_give_the_same_top1(manifest):
    """Every trained variant, every held-out input of its family: same top-1, probabilities within 1e-4."""
    for name, v in manifest["variants"].items():
        if v["family"] not in TRAINED:
            continue
        x, _ = zoo.load_payloads(ZOO, v["family"])
        tf_p = np.concatenate([loaders.load_model(ZOO, name, "tensorflow", manifest).predict(x[i:i + 128])
                               for i in range(0, len(x), 128)])
        lite = loaders.load_model(ZOO, name, "litert", manifest)
        lite_p = np.concatenate([lite.predict(x[i:i + 128]) for i in range(0, len(x), 128)])
        single = np.concatenate([lite.predict(x[i:i + 1]) for i in range(10)])  # batch-size changes
        assert (tf_p.argmax(axis=1) == lite_p.argmax(axis=1)).all(), name
        np.testing.assert_allclose(lite_p, tf_p, atol=1e-4, err_msg=name)
        np.testing.assert_allclose(single, lite_p[:10], atol=1e-5, err_msg=name)


def test_every_variant_has_a_profile(manifest):
    """Every variant, every runtime it has: a 1-core batch-1 profile (unthrottled: the CPU-share model's input)."""
    from testbed.serve.profiler import MIN_SAMPLES

    for name in manifest["variants"]:
        for rt in zoo.runtimes_of(manifest, name):
            st = profiles.service_time(PROFILES, name, 1.0, 1, rt)
            assert 0 < st.p50_ms <= st.p95_ms and len(st.samples_ms) >= MIN_SAMPLES, (name, rt)
            ct = profiles.cpu_time(PROFILES, name, rt)
            assert ct.measured_cpu_cores >= 1.0 and ct.p50_ms > 0, (name, rt)


def test_zoo_errors_name_what_is_missing(tmp_path):
    with pytest.raises(zoo.ZooFileMissing, match="manifest.json"):
        zoo.load_manifest(tmp_path)
    with pytest.raises(zoo.ZooFileMissing, match="digits_huge"):
        zoo.load_profile(tmp_path, "digits_huge")
    with pytest.raises(zoo.ZooError, match="digits_huge"):
        zoo.variant_dir(ZOO, "digits_huge")
    with pytest.raises(zoo.ZooError, match="unknown runtime 'onnx'"):
        loaders.load_model(ZOO, "digits_small", "onnx")


def test_recipe1_manifest_is_read_as_one_family(tmp_path):
    (tmp_path / "manifest.json").write_text(json.dumps({
        "recipe_version": 1, "family": "digits", "input_shape": [32, 32, 1], "classes": 10,
        "variants": {"digits_small": {"path": "digits_small", "accuracy": 0.9, "accuracy_source": "x", "params": 1}}}))
    m = zoo.load_manifest(tmp_path)
    assert zoo.families(m) == {"digits": ["digits_small"]}
    assert m["families"]["digits"]["payloads"] == "payloads.npz"


def _row(rt: str, share: float, batch: int, samples: list[float]) -> dict:
    a = np.asarray(samples)
    return {"runtime": rt, "cpu_cores": share, "batch": batch, "mean_ms": float(a.mean()),
            "p50_ms": float(np.percentile(a, 50)), "p95_ms": float(np.percentile(a, 95)),
            "p99_ms": float(np.percentile(a, 99)), "samples_ms": samples}


def test_service_time_picks_and_scales_measurements(tmp_path):
    rows = [_row("tensorflow", 1.0, 1, [1.0, 2.0, 3.0]), _row("tensorflow", 1.0, 8, [4.0, 5.0, 6.0]),
            _row("tensorflow", 0.25, 1, [7.0, 8.0, 9.0]), _row("litert", 1.0, 1, [0.5, 0.5, 0.5])]
    ref = rows[0]
    (tmp_path / "m.json").write_text(json.dumps({"schema": 2, "variant": "m", "cpu_cores": 1.0, "batch_size": 1,
                                                 **{k: ref[k] for k in ("mean_ms", "p50_ms", "p95_ms", "p99_ms")},
                                                 "measurements": rows}))
    st = profiles.service_time(tmp_path, "m", 1.0)
    assert (st.mean_ms, st.p50_ms, st.scale) == (2.0, 2.0, 1.0) and list(st.samples_ms) == [1.0, 2.0, 3.0]
    st = profiles.service_time(tmp_path, "m", 0.25)  # measured share: its own samples, no scaling
    assert st.mean_ms == 8.0 and st.measured_cpu_cores == 0.25
    st = profiles.service_time(tmp_path, "m", 0.5)  # nearest share in ratio: 1.0 and 0.25 tie -> larger (1.0)
    assert st.measured_cpu_cores == 1.0 and st.mean_ms == 4.0 and list(st.samples_ms) == [2.0, 4.0, 6.0]
    st = profiles.service_time(tmp_path, "m", 1.0, batch=4)  # nearest b1, scaled to 2 + 3 x 3/7 (b1 2 ms, b8 5 ms)
    assert st.measured_batch == 1 and st.mean_ms == pytest.approx(2 + 3 * 3 / 7)
    st = profiles.service_time(tmp_path, "m", 2.0, batch=8)  # above one core: no faster
    assert st.mean_ms == 5.0
    assert profiles.service_time(tmp_path, "m", 1.0, runtime="litert").mean_ms == 0.5
    rng = np.random.default_rng(0)
    assert set(profiles.service_time(tmp_path, "m", 1.0).sample(rng, 50)) <= {1.0, 2.0, 3.0}
    with pytest.raises(zoo.ZooError, match="no 'onnx' measurement"):
        profiles.service_time(tmp_path, "m", 1.0, runtime="onnx")
    with pytest.raises(ValueError):
        profiles.service_time(tmp_path, "m", 0.0)


def test_schema1_profile_is_still_read(tmp_path):
    (tmp_path / "old.json").write_text(json.dumps({"variant": "old", "cpu_cores": 1.0, "batch_size": 1,
                                                   "mean_ms": 2.0, "p50_ms": 1.5, "p95_ms": 3.0, "p99_ms": 4.0}))
    st = profiles.service_time(tmp_path, "old", 0.5)
    assert (st.mean_ms, st.p50_ms, st.p95_ms) == (4.0, 3.0, 6.0)


def test_service_time_prefers_isolated_rows_and_cpu_time_the_unthrottled_ones(tmp_path):
    """At a fractional share the isolated (low-load) rows by default, back to back on request;
    cpu_time: the back-to-back row at >= threads cores (never throttled)."""
    rows = [{**_row("litert", 0.25, 1, [90.0, 4.0, 4.0]), "load": "back_to_back", "role": "validation"},
            {**_row("litert", 0.25, 1, [4.0, 4.5, 5.0]), "load": "isolated", "role": "validation"},
            {**_row("litert", 1.0, 1, [3.0, 3.0, 3.5]), "load": "back_to_back", "role": "cpu_time"}]
    (tmp_path / "m.json").write_text(json.dumps({"schema": 3, "variant": "m", "cpu_cores": 1.0, "batch_size": 1,
                                                 **{k: rows[2][k] for k in ("mean_ms", "p50_ms", "p95_ms", "p99_ms")},
                                                 "measurements": rows}))
    assert list(profiles.service_time(tmp_path, "m", 0.25, runtime="litert").samples_ms) == [4.0, 4.5, 5.0]
    assert profiles.service_time(tmp_path, "m", 0.25, runtime="litert", load="back_to_back").mean_ms == 98 / 3
    assert profiles.service_time(tmp_path, "m", 1.0, runtime="litert").mean_ms == pytest.approx(9.5 / 3)  # b2b only
    ct = profiles.cpu_time(tmp_path, "m", "litert")
    assert ct.measured_cpu_cores == 1.0 and list(ct.samples_ms) == [3.0, 3.0, 3.5]
