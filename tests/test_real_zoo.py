"""The real edge DNNs of the zoo: MediaPipe models (trained weights, LiteRT) and Keras architectures.

Against the repository's ``models/zoo`` (``ensure_zoo`` builds it if missing, ~3-4 min; the
wheels come from PyPI at that point, once). Every variant answers a predict on a real frame
(scikit-image photographs; never noise) with outputs of the documented shapes; TensorFlow and
LiteRT agree where a variant has both; a model file whose sha256 is wrong is an error naming it;
the sources are hash-pinned registry wheels, and MediaPipe's runtime is not installed.
"""

from __future__ import annotations

import base64
import importlib.util
import io
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from testbed.core.hashing import bytes_sha256
from testbed.plan import zoo
from testbed.serve import calls, graphs, loaders, payload

REPO = Path(__file__).resolve().parent.parent
ZOO = REPO / "models" / "zoo"
sys.path.insert(0, str(REPO / "models"))
import zoo_sources as src  # noqa: E402

#: Documented output shapes per input (testbed/serve/graphs.py, docs/models-and-servers.md).
SHAPES = {
    "hands": {"landmarks": (21, 3), "presence": (), "handedness": (), "world_landmarks": (21, 3), "palm_score": ()},
    "faces": {"score": (), "box": (4,), "keypoints": (6, 2)},
}
APPS = {"hands": ["hand_lite", "hand_full", "hand_palm"], "faces": ["face_short", "face_full", "face_dual"],
        "imagenet": ["mobilenet_v3_small", "mobilenet_v2_035", "mobilenet_v2_100", "efficientnet_b0", "resnet50"]}


@pytest.fixture(scope="module")
def manifest() -> dict:
    return zoo.ensure_zoo(ZOO)


def test_three_applications_with_at_least_three_variants_and_cited_quality(manifest):
    fams = zoo.families(manifest)
    for fam, names in APPS.items():
        assert fams[fam] == names, fam
        for n in names:
            v = manifest["variants"][n]
            assert 0.5 < v["accuracy"] <= 1.0, n
            assert v["accuracy_source"].startswith(("measured here", "published:")), n
            assert v["params"] > 50_000, n
    for n in APPS["imagenet"]:  # random weights, said plainly
        v = manifest["variants"][n]
        assert v["random_weights"] is True and "RANDOM" in v["accuracy_source"], n
    for n in APPS["hands"] + APPS["faces"]:
        assert manifest["variants"][n]["weights"].startswith("trained (Google MediaPipe)"), n
        assert zoo.runtimes_of(manifest, n) == ("litert",), n
    assert manifest["variants"]["face_dual"]["n_test"] == 200


@pytest.mark.parametrize("fam", list(APPS))
def test_every_variant_answers_a_real_frame_with_documented_shapes(manifest, fam):
    x, y = zoo.load_payloads(ZOO, fam)
    shape = tuple(manifest["families"][fam]["input_shape"])
    assert x.dtype == np.float32 and x.shape[1:] == shape and 0.0 <= x.min() and x.max() <= 1.0
    assert x.std() > 0.05 and len(np.unique(x[:8].reshape(8, -1), axis=0)) == 8  # real, distinct frames
    for name in APPS[fam]:
        for rt in zoo.runtimes_of(manifest, name):
            model = loaders.load_model(ZOO, name, rt, manifest)
            assert model.input_shape == shape
            out = model.predict(x[:3])
            if fam == "imagenet":
                assert out.shape == (3, 1000) and np.allclose(out.sum(axis=1), 1.0, atol=1e-4), (name, rt)
                continue
            assert isinstance(out, calls.NamedOutputs) and set(out) == set(SHAPES[fam]), name
            for k, dims in SHAPES[fam].items():
                assert out[k].shape == (3, *dims) and np.isfinite(out[k]).all(), (name, k)
            part = out[1:3]  # the scheduler splits a batch this way
            assert part["landmarks" if fam == "hands" else "score"].shape[0] == 2


def test_tensorflow_and_litert_agree_on_every_keras_variant(manifest):
    x, _ = zoo.load_payloads(ZOO, "imagenet")
    x = x[:16]
    for name in APPS["imagenet"]:
        tf_p = loaders.load_model(ZOO, name, "tensorflow", manifest).predict(x)
        lite_p = np.concatenate([loaders.load_model(ZOO, name, "litert", manifest).predict(x[i:i + 1])
                                 for i in range(len(x))])
        assert np.std(tf_p, axis=0).max() > 1e-6, f"{name}: the same answer for every frame"
        np.testing.assert_allclose(lite_p, tf_p, atol=1e-5, err_msg=name)
        assert (tf_p.argmax(1) == lite_p.argmax(1)).mean() >= 0.9, name


def test_faces_accuracy_is_measured_on_the_stored_frames(manifest):
    """Recomputed from the stored frames and boxes: a face found where it was pasted, none elsewhere."""
    import build_zoo

    x, y = zoo.load_payloads(ZOO, "faces")
    assert sorted(np.unique(y)) == [0, 1] and list(y[:4]) == [1, 0, 1, 0]
    with np.load(ZOO / manifest["families"]["faces"]["payloads"]) as data:
        truth = data["boxes"]
    assert truth.shape == (200, 4) and (truth[:, 2] > truth[:, 0]).all()
    for name in APPS["faces"]:
        out = loaders.load_model(ZOO, name, "litert", manifest).predict(x)
        hit = out["score"] >= 0.5
        right = np.where(y == 1, hit & (build_zoo.iou(out["box"], truth) >= 0.5), ~hit)
        assert int(right.sum()) == manifest["variants"][name]["correct"], name


def test_a_corrupt_model_file_is_an_error_naming_it(manifest, tmp_path):
    v = manifest["variants"]["hand_palm"]
    (tmp_path / src.MP_DIR).mkdir()
    for f in v["tflite_files"].values():
        shutil.copy2(ZOO / f["path"], tmp_path / f["path"])
    bad = tmp_path / v["tflite_files"]["palm"]["path"]
    data = bytearray(bad.read_bytes())
    data[len(data) // 2] ^= 0xFF
    bad.write_bytes(bytes(data))
    (tmp_path / zoo.MANIFEST).write_text(json.dumps({**manifest, "variants": {"hand_palm": v}}))
    with pytest.raises(zoo.ZooIntegrityError, match=r"palm_detection_full\.tflite \(variant 'hand_palm'\): SHA-256 "
                                                    r"[0-9a-f]{64} differs from the [0-9a-f]{64} recorded") as got:
        loaders.load_model(tmp_path, "hand_palm", "litert")
    assert got.value.exit_code == 7  # the one code of every integrity failure
    with pytest.raises(zoo.ZooError, match="no TensorFlow SavedModel.*runtime litert"):
        loaders.load_model(tmp_path, "hand_palm", "tensorflow")
    member = v["tflite_files"]["palm"]["wheel_member"]
    wheel = REPO / "models" / ".cache" / "wheels" / src.MEDIAPIPE_WHEEL[2]
    with pytest.raises(src.SourceError, match=r"palm_detection_full\.tflite: sha256"):
        src.extract(wheel, {member: "0" * 64}, tmp_path / "x")
    with pytest.raises(graphs.GraphError, match="does not exist"):
        graphs.verified_bytes(tmp_path / "nope.tflite", "0" * 64)


def test_sources_are_hash_pinned_registry_wheels_and_no_mediapipe_runtime(manifest, monkeypatch):
    """The build needs only PyPI: two pinned wheels (pip download --require-hashes), read as zip files."""
    assert importlib.util.find_spec("mediapipe") is None  # its runtime is never installed
    cache = REPO / "models" / ".cache" / "wheels"
    calls = []
    monkeypatch.setattr(src.subprocess, "run", lambda *a, **k: calls.append(a) or pytest.fail("downloaded again"))
    for wheel in (src.MEDIAPIPE_WHEEL, src.SKIMAGE_WHEEL):
        path = src.fetch_wheel(wheel, cache)  # cached and matching its pin: no download
        assert path.name == wheel[2] and bytes_sha256(path.read_bytes()) == wheel[3]
        assert manifest["sources"]["mediapipe_wheel" if wheel is src.MEDIAPIPE_WHEEL else "skimage_wheel"]["sha256"] \
            == wheel[3]
    assert not calls
    text = (REPO / "models" / "zoo_sources.py").read_text()
    assert '"pip", "download", "--no-deps", "--require-hashes"' in text


def test_jpeg_requests_decode_resize_and_answer_in_tf_serving_shapes(manifest):
    bodies, labels = zoo.request_bodies(ZOO, "faces", 4)
    assert labels == [1, 0, 1, 0]
    item = json.loads(bodies[0])["instances"][0]
    raw = base64.b64decode(item["b64"])
    assert raw[:3] == payload.JPEG_MAGIC
    x, columnar = payload.parse_predict_body(bodies[0], (192, 192, 3))
    stored, _ = zoo.load_payloads(ZOO, "faces")
    np.testing.assert_array_equal(x[0], stored[0])  # the server sees the stored pixels
    from PIL import Image

    buf = io.BytesIO()
    Image.open(io.BytesIO(raw)).resize((640, 480)).save(buf, format="JPEG")  # another camera size
    big = json.dumps({"inputs": [{"b64": base64.b64encode(buf.getvalue()).decode()}]}).encode()
    x2, columnar = payload.parse_predict_body(big, (192, 192, 3))
    assert x2.shape == (1, 192, 192, 3) and columnar
    with pytest.raises(payload.RequestError, match="cannot decode image"):
        payload.parse_predict_body(json.dumps({"instances": [{"b64": base64.b64encode(
            payload.JPEG_MAGIC + b"junk").decode()}]}).encode(), (192, 192, 3))
    out = loaders.load_model(ZOO, "face_short", "litert", manifest).predict(np.concatenate([x, x2]))
    rows = payload.predict_response(out, columnar=False)["predictions"]
    assert len(rows) == 2 and set(rows[0]) == {"score", "box", "keypoints"} and len(rows[0]["keypoints"]) == 6
    cols = payload.predict_response(out, columnar=True)["outputs"]
    assert np.asarray(cols["box"]).shape == (2, 4)
    meta = payload.metadata_response("face_short", loaders.load_model(ZOO, "face_short", "litert", manifest))
    sig = meta["metadata"]["signature_def"]["signature_def"]["serving_default"]
    assert set(sig["outputs"]) == {"score", "box", "keypoints"}


@pytest.mark.parametrize("mode", ["RGB", "L", "CMYK"])
def test_frame_decode_gives_pils_pixels_for_every_jpeg_colour_space(mode):
    """The server decodes JPEGs with simplejpeg where it can (RGB/YCbCr, grey) and with PIL
    otherwise (CMYK); either way the pixels are PIL's, resized or not."""
    from PIL import Image

    rng = np.random.default_rng(3)
    buf = io.BytesIO()
    Image.fromarray((rng.random((60, 70, 3)) * 255).astype(np.uint8)).convert(mode).save(buf, format="JPEG")
    raw = buf.getvalue()
    assert (payload._jpeg_rgb(raw, "x") is None) == (mode == "CMYK")
    for shape in [(60, 70, 3), (32, 40, 3)]:
        with Image.open(io.BytesIO(raw)) as img:
            ref = img.convert("RGB").resize((shape[1], shape[0]), Image.BILINEAR)
        np.testing.assert_array_equal(payload.decode_frame(raw, shape, "x"),
                                      np.asarray(ref, dtype=np.float32) / np.float32(255.0))


def test_an_oversized_jpeg_is_refused_from_its_header():
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (4097, 4096), (10, 20, 30)).save(buf, format="JPEG", quality=10)
    with pytest.raises(payload.RequestError, match="image of 4097x4096 pixels; at most 16777216"):
        payload.decode_frame(buf.getvalue(), (224, 224, 3), "instances[0]")


def test_bytes_on_the_wire_per_application(manifest):
    """A query is one JPEG frame in b64 JSON: about 4/3 of the JPEG plus ~40 bytes of JSON."""
    for fam in APPS:
        bodies, _ = zoo.request_bodies(ZOO, fam, 64)
        jpegs = zoo.load_jpegs(ZOO, fam)
        assert np.mean([len(j) for j in jpegs]) == pytest.approx(manifest["families"][fam]["jpeg"]["jpeg_bytes_mean"],
                                                                 abs=1)
        for body, j in zip(bodies, jpegs, strict=False):
            assert 4 / 3 * len(j) <= len(body) <= 4 / 3 * len(j) + 64, fam
        assert 5_000 < np.mean([len(b) for b in bodies]) < 40_000, fam


def test_local_imagenet_weights_file_is_loaded_by_the_same_variant(tmp_path, monkeypatch):
    """With a weights file under $ASET_KERAS_WEIGHTS, the variant loads it and the manifest says so."""
    import build_zoo
    import keras

    spec = src.KERAS_VARIANTS["mobilenet_v2_035"]
    keras.utils.set_random_seed(1)
    donor = keras.applications.MobileNetV2(alpha=0.35, weights=None, input_shape=(224, 224, 3))
    wdir = tmp_path / "weights"
    wdir.mkdir()
    import h5py
    from keras.src.legacy.saving import legacy_h5_format

    with h5py.File(wdir / spec["weights_file"], "w") as f:  # the legacy layout of Keras' ImageNet files
        legacy_h5_format.save_weights_to_hdf5_group(f, donor)
    monkeypatch.setenv(src.KERAS_WEIGHTS_ENV, str(wdir))
    x, _ = zoo.load_payloads(ZOO, "imagenet")
    entry = build_zoo.build_keras_variant(tmp_path, "mobilenet_v2_035", x[:8])
    assert entry["weights"].startswith("imagenet: ") and entry["random_weights"] is False
    assert entry["batchnorm_calibrated_layers"] == 0 and "RANDOM" not in entry["accuracy_source"]
    from ai_edge_litert.interpreter import Interpreter

    it = Interpreter(model_path=str(tmp_path / entry["tflite"]))
    it.allocate_tensors()
    it.set_tensor(it.get_input_details()[0]["index"], x[:1])
    it.invoke()
    got = it.get_tensor(it.get_output_details()[0]["index"])
    np.testing.assert_allclose(got, np.asarray(donor(x[:1] * 2.0 - 1.0)), atol=1e-5)  # the file's weights
    monkeypatch.setenv(src.KERAS_WEIGHTS_ENV, str(tmp_path / "empty"))
    assert build_zoo._keras_weights("mobilenet_v2_035") == (None, "random")
