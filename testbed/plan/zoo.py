"""The model zoo's inventory on disk: manifest, payloads (sample inputs), request bodies and
service-time profiles, read without TensorFlow or LiteRT (the loaders are :mod:`testbed.serve.loaders`).

Layout (written by ``models/build_zoo.py``; nothing here is downloaded)::

    models/zoo/manifest.json          {"recipe_version", "families": {family: {"input_shape", "classes",
                                       "payloads", "dataset", ...}}, "variants": {name: {"family", "path",
                                       "tflite", "accuracy", "accuracy_source", "params", ...}},
                                       "family"/"input_shape"/"classes": the default family "digits"}
    models/zoo/payloads/<family>.npz  x: float32 [N, *input_shape]; y: int64 [N] (held-out split)
    models/zoo/payloads.npz           the same for "digits" (kept for older readers)
    models/zoo/<variant>/             TensorFlow SavedModel, signature "serving_default":
                                      x: float32 [None, *input_shape] -> probabilities: float32 [None, classes]
    models/zoo/<variant>.tflite       the same model converted for LiteRT (float32, no quantisation)
    models/zoo/mediapipe/*.tflite     trained MediaPipe models (LiteRT only; no SavedModel: ``path`` null),
                                      sha256-checked at every load (:mod:`testbed.serve.graphs`)
    models/profiles/<variant>.json    measured service times (see :mod:`testbed.plan.profiles`)

Nothing here imports TensorFlow (it costs ~4 s and ~525 MB per process).

Image families (``hands``, ``faces``, ``imagenet``; ``"wire": "jpeg_b64"`` in the manifest) store
their payloads as uint8 frames plus the JPEG bytes a camera app sends; :func:`load_payloads` gives
them as float32 RGB in [0, 1] and :func:`request_bodies` as ``{"instances": [{"b64": JPEG}]}``.

Errors: every missing or malformed file raises :class:`ZooError` (``ZooFileMissing`` for a missing
file, a ``FileNotFoundError`` too) whose message names the variant / family and the path.

Integrity: the build records the SHA-256 of every model file of every variant (SavedModel files,
``.tflite``, MediaPipe files) in the manifest, ``variants.<name>.files_sha256`` ({path relative to
the zoo: hex digest}; :func:`record_hashes`); a MediaPipe file's is also pinned from its wheel
(``tflite_files``). Every load of a model (:func:`testbed.serve.loaders.load_model`: the inference
server, the profiler, the host-speed check) first checks the files it reads against them
(:func:`verify_model_files`); a mismatch, or a zoo whose manifest records none, is a
:class:`ZooIntegrityError` naming the file, exit code 7
(:data:`testbed.core.errors.EXIT_INTEGRITY`), the one code of every integrity failure. A zoo built
before the hashes were recorded gets them, for the files it holds then, from
``python models/build_zoo.py --out ZOO`` (no rebuild; ``install.sh`` runs it).
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from testbed.core.errors import EXIT_INTEGRITY, InputError
from testbed.core.hashing import file_sha256
from testbed.core.util import REPO_ROOT, replace_atomic

#: Input of the default family "digits": one grey-scale 32x32 image, float32 in [0, 1] (H, W, C).
INPUT_SHAPE: tuple[int, ...] = (32, 32, 1)
#: Classes of the default family "digits" (0-9).
NUM_CLASSES: int = 10
DEFAULT_FAMILY = "digits"
#: SavedModel signature the server calls, and its input / output tensor names (every variant).
SIGNATURE_KEY = "serving_default"
INPUT_NAME = "x"
OUTPUT_NAME = "probabilities"
RUNTIMES = ("tensorflow", "litert")

MANIFEST = "manifest.json"
PAYLOADS = "payloads.npz"
PAYLOADS_DIR = "payloads"
#: The build script, in the repository checkout (an installed package has none of its own).
BUILD_SCRIPT = REPO_ROOT / "models" / "build_zoo.py"


class ZooError(InputError, RuntimeError):
    """The zoo is missing, incomplete or malformed; the message names the file or variant."""


class ZooFileMissing(ZooError, FileNotFoundError):
    """A file or directory of the zoo (or of the profiles) does not exist."""


class ZooIntegrityError(ZooError):
    """A model file whose SHA-256 differs from the zoo's record, a zoo that records none, or a model
    that answers its labelled start-up sample far below its accuracy (the message names the file);
    exit code :data:`~testbed.core.errors.EXIT_INTEGRITY` (7), the one code of every integrity failure."""

    exit_code = EXIT_INTEGRITY


#: The manifest key of a variant's recorded file hashes: {path relative to the zoo: SHA-256 hex}.
FILES_SHA256 = "files_sha256"


def model_files(zoo_dir: str | os.PathLike[str], name: str, manifest: dict[str, Any],
                runtime: str | None = None) -> list[str]:
    """The files (relative to ``zoo_dir``, sorted) a load of variant ``name`` reads: its SavedModel's
    files (``tensorflow``), its ``.tflite`` or MediaPipe files (``litert``), or both (``None``)."""
    v = manifest["variants"][name]
    out: set[str] = set()
    if runtime in (None, "tensorflow") and v.get("path"):
        root = Path(zoo_dir) / v["path"]
        out |= {p.relative_to(zoo_dir).as_posix() for p in root.rglob("*") if p.is_file()}
    if runtime in (None, "litert"):
        if v.get("tflite"):
            out.add(v["tflite"])
        out |= {f["path"] for f in (v.get("tflite_files") or {}).values()}
    return sorted(out)


def recorded_hashes(v: dict[str, Any]) -> dict[str, str]:
    """A variant entry's recorded hashes: ``files_sha256``, with the wheel-pinned hashes of its
    MediaPipe files (``tflite_files``) for the files it does not list."""
    pinned = {f["path"]: f["sha256"] for f in (v.get("tflite_files") or {}).values() if f.get("sha256")}
    return {**pinned, **(v.get(FILES_SHA256) or {})}


def record_variant_hashes(zoo_dir: str | os.PathLike[str], name: str, manifest: dict[str, Any]) -> int:
    """Record in ``manifest["variants"][name]`` (in place; the caller writes the manifest) the
    SHA-256 of every model file of variant ``name`` as it is in ``zoo_dir`` now (``files_sha256``:
    {path relative to ``zoo_dir``: hex digest}); returns the number of files hashed."""
    files = model_files(zoo_dir, name, manifest)
    manifest["variants"][name][FILES_SHA256] = {rel: file_sha256(Path(zoo_dir) / rel) for rel in files}
    return len(files)


def record_hashes(zoo_dir: str | os.PathLike[str], manifest: dict[str, Any]) -> int:
    """Record in ``manifest`` (in place; the caller writes it) the SHA-256 of every model file of
    every variant as it is in ``zoo_dir`` now (:func:`record_variant_hashes`); returns the number
    of files hashed."""
    return sum(record_variant_hashes(zoo_dir, name, manifest) for name in manifest["variants"])


#: The manifest key of a variant added with ``testbed zoo add`` (a model of one's own, not built by
#: ``models/build_zoo.py``): ``{"from": the file given, "at": ISO time, "kind": "tflite" | "savedmodel",
#: "accuracy_measured": {...}}``. A rebuild of the zoo keeps such variants (their files are copied).
ADDED = "added"


def added_variants(manifest: dict[str, Any]) -> list[str]:
    """The variants of ``manifest`` added with ``testbed zoo add`` (they carry :data:`ADDED`)."""
    return [n for n, v in manifest["variants"].items() if v.get(ADDED)]


@contextlib.contextmanager
def zoo_lock(zoo_dir: str | os.PathLike[str]) -> Iterator[None]:
    """Hold the exclusive lock of the zoo at ``zoo_dir`` (a lock file in the system temp dir, keyed
    by the resolved path): a build (``models/build_zoo.py``) and ``testbed zoo add`` never write
    the same zoo at once. Blocks until the lock is free."""
    key = hashlib.sha1(str(Path(zoo_dir).resolve()).encode()).hexdigest()[:12]
    with open(Path(tempfile.gettempdir()) / f"build_zoo-{key}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def missing_hashes(manifest: dict[str, Any]) -> list[str]:
    """The variants of ``manifest`` that record no ``files_sha256``."""
    return [n for n, v in manifest["variants"].items() if not v.get(FILES_SHA256)]


def hash_cache_path() -> Path:
    """Where :func:`cached_file_sha256` keeps what it hashed: ``$XDG_CACHE_HOME/testbed/file-hashes.json``
    (default ``~/.cache``)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "testbed" / "file-hashes.json"


#: This process's copy of the hash cache (None: not read yet), as :func:`cached_file_sha256` keeps it.
_HASHES: dict[str, list] | None = None


def _hash_cache() -> dict[str, list]:
    global _HASHES
    if _HASHES is None:
        try:
            data = json.loads(hash_cache_path().read_text())
            _HASHES = data if isinstance(data, dict) else {}
        except (OSError, ValueError):  # none yet, or unreadable: hashed again
            _HASHES = {}
    return _HASHES


def cached_file_sha256(path: str | os.PathLike[str]) -> str:
    """:func:`testbed.core.hashing.file_sha256` of ``path``, or the digest recorded for it while its
    size and modification time (ns) were what they are now (:func:`hash_cache_path`): the cheap
    check of ``testbed plan`` and ``simulate``. A change that keeps both (a rewrite in place with
    the time set back) is not seen here; every server still checks the whole bytes when it loads
    a model (:func:`testbed.serve.loaders`). The cache is written back when a file was hashed (a cache
    that cannot be written costs a hash next time, nothing else).

    Raises:
        OSError: the file cannot be read.
    """
    p = Path(path).resolve()
    st = p.stat()
    cache = _hash_cache()
    hit = cache.get(str(p))
    if isinstance(hit, list) and len(hit) == 3 and hit[:2] == [st.st_size, st.st_mtime_ns]:
        return str(hit[2])
    digest = file_sha256(p)
    cache[str(p)] = [st.st_size, st.st_mtime_ns, digest]
    try:
        out = hash_cache_path()
        out.parent.mkdir(parents=True, exist_ok=True)
        replace_atomic(out, lambda t: t.write_text(json.dumps(cache)))
    except OSError:
        pass
    return digest


def verify_model_files(zoo_dir: str | os.PathLike[str], name: str, manifest: dict[str, Any], runtime: str,
                       cached: bool = False) -> None:
    """Check every file a ``runtime`` load of variant ``name`` reads against the zoo's record; with
    ``cached``, each file's digest may come from :func:`cached_file_sha256` (the plan's check; a
    server loading the model checks the bytes themselves).

    Raises:
        ZooIntegrityError: the manifest records no hash of a file (a zoo built before they were
            recorded: the message says how to record them), or a file's SHA-256 differs (names the
            file, both digests and how to rebuild).
        ZooFileMissing: a file is missing.
    """
    v = manifest["variants"][name]
    known = recorded_hashes(v)
    for rel in model_files(zoo_dir, name, manifest, runtime):
        path = Path(zoo_dir) / rel
        if rel not in known:
            raise ZooIntegrityError(
                f"model file {path} (variant {name!r}): the zoo's manifest records no SHA-256 of it (a zoo built "
                f"before the hashes were recorded, or a file added since); record them for the files there now "
                f"with: python models/build_zoo.py --out {zoo_dir} (no rebuild; ./install.sh runs it), or rebuild "
                f"with --force")
        if not path.is_file():
            raise ZooFileMissing(f"model file {path} (variant {name!r}) does not exist (rebuild: python "
                                 f"models/build_zoo.py --out {zoo_dir} --force)")
        got = cached_file_sha256(path) if cached else file_sha256(path)
        if got != known[rel]:
            raise ZooIntegrityError(
                f"model file {path} (variant {name!r}): SHA-256 {got} differs from the {known[rel]} recorded when "
                f"the zoo was built: the file is corrupt or was replaced; rebuild the zoo: python "
                f"models/build_zoo.py --out {zoo_dir} --force")


def _read_json(path: Path, what: str) -> dict[str, Any]:
    if not path.is_file():
        raise ZooFileMissing(f"{what}: {path} does not exist (build it: python models/build_zoo.py)")
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ZooError(f"{what}: {path} is not valid JSON ({exc}); rebuild with --force") from exc
    if not isinstance(data, dict):
        raise ZooError(f"{what}: {path} must hold a JSON object, got {type(data).__name__}")
    return data


def load_manifest(zoo_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and check ``<zoo_dir>/manifest.json``.

    Returns the manifest dict: ``recipe_version``, ``families`` (family -> ``input_shape``,
    ``classes``, ``payloads``, ``dataset``), ``variants`` (name -> ``family``, ``path`` (SavedModel
    dir relative to ``zoo_dir``), ``tflite``, ``accuracy`` (top-1 in [0, 1]), ``accuracy_source``,
    ``params``), and for older readers ``family`` / ``input_shape`` / ``classes`` of "digits".
    A manifest of recipe 1 (one family, no ``families``) is read as a one-family zoo.

    Raises:
        ZooFileMissing: the manifest does not exist.
        ZooError: it is not JSON, lacks a key, or a variant lacks a key or names an unknown family.
    """
    path = Path(zoo_dir) / MANIFEST
    data = _read_json(path, "zoo manifest")
    for key in ("recipe_version", "variants"):
        if key not in data:
            raise ZooError(f"zoo manifest {path} has no {key!r}; rebuild with --force")
    if "families" not in data:  # recipe 1: one family, described at the top level
        for key in ("family", "input_shape", "classes"):
            if key not in data:
                raise ZooError(f"zoo manifest {path} has no {key!r}; rebuild with --force")
        data["families"] = {data["family"]: {"input_shape": data["input_shape"], "classes": data["classes"],
                                             "payloads": PAYLOADS}}
        for v in data["variants"].values():
            if isinstance(v, dict):
                v.setdefault("family", data["family"])
    if not isinstance(data["families"], dict) or not data["families"]:
        raise ZooError(f"zoo manifest {path}: 'families' must be a non-empty object")
    for fam, f in data["families"].items():
        for key in ("input_shape", "classes", "payloads"):
            if not isinstance(f, dict) or key not in f:
                raise ZooError(f"zoo manifest {path}: family {fam!r} has no {key!r}")
    if not isinstance(data["variants"], dict) or not data["variants"]:
        raise ZooError(f"zoo manifest {path}: 'variants' must be a non-empty object")
    for name, v in data["variants"].items():
        for key in ("family", "path", "accuracy", "accuracy_source", "params"):
            if not isinstance(v, dict) or key not in v:
                raise ZooError(f"zoo manifest {path}: variant {name!r} has no {key!r}")
        if v["family"] not in data["families"]:
            raise ZooError(f"zoo manifest {path}: variant {name!r} names unknown family {v['family']!r}")
    return data


def families(manifest: dict[str, Any]) -> dict[str, list[str]]:
    """Application families of a loaded manifest -> their variant names (manifest order)."""
    out: dict[str, list[str]] = {f: [] for f in manifest["families"]}
    for name, v in manifest["variants"].items():
        out[v["family"]].append(name)
    return out


def family_info(manifest: dict[str, Any], family: str) -> dict[str, Any]:
    """The manifest entry of ``family`` (``input_shape``, ``classes``, ``payloads``, ...).

    Raises:
        ZooError: ``family`` is not in the zoo (the message lists the known families).
    """
    if family not in manifest["families"]:
        raise ZooError(f"family {family!r} is not in the zoo (has: {', '.join(sorted(manifest['families']))})")
    return manifest["families"][family]


def input_shape(manifest: dict[str, Any], variant: str) -> tuple[int, ...]:
    """Shape of one input of ``variant`` (without the batch dimension)."""
    return tuple(int(d) for d in manifest["families"][manifest["variants"][variant]["family"]]["input_shape"])


def variant_dir(zoo_dir: str | os.PathLike[str], name: str, manifest: dict[str, Any] | None = None) -> Path:
    """Directory of variant ``name``'s SavedModel.

    Raises:
        ZooError: ``name`` is not in the manifest (the message lists the known variants).
        ZooFileMissing: the manifest or the variant's SavedModel (``saved_model.pb``) is missing.
    """
    manifest = manifest if manifest is not None else load_manifest(zoo_dir)
    variants = known_variant(zoo_dir, name, manifest)
    if not variants[name]["path"]:
        raise ZooError(f"variant {name!r} has no TensorFlow SavedModel: {variants[name].get('weights_source', 'it')} "
                       "ships as TFLite only; serve it with runtime litert")
    path = Path(zoo_dir) / variants[name]["path"]
    if not (path / "saved_model.pb").is_file():
        raise ZooFileMissing(f"variant {name!r}: no SavedModel at {path} (rebuild: python models/build_zoo.py "
                             "--force)")
    return path


def known_variant(zoo_dir: str | os.PathLike[str], name: str, manifest: dict[str, Any]) -> dict[str, Any]:
    """The manifest's variants, after checking ``name`` is one of them.

    Raises:
        ZooError: ``name`` is not in the manifest (the message lists the known variants).
    """
    variants = manifest["variants"]
    if name not in variants:
        raise ZooError(f"unknown model variant {name!r} in zoo {zoo_dir} (known: {', '.join(sorted(variants))})")
    return variants


def runtimes_of(manifest: dict[str, Any], name: str) -> tuple[str, ...]:
    """The runtimes variant ``name`` can be served with: ``tensorflow`` iff it has a SavedModel,
    ``litert`` iff it has a ``.tflite`` (converted) or MediaPipe model files."""
    v = manifest["variants"][name]
    return tuple(rt for rt, ok in (("tensorflow", bool(v.get("path"))),
                                   ("litert", bool(v.get("tflite") or v.get("tflite_files")))) if ok)


def tflite_path(zoo_dir: str | os.PathLike[str], name: str, manifest: dict[str, Any] | None = None) -> Path:
    """The LiteRT flatbuffer of variant ``name`` (a MediaPipe variant: its first model file; all must exist).

    Raises:
        ZooError: unknown variant, or the zoo has no LiteRT conversion of it (recipe 1).
        ZooFileMissing: the ``.tflite`` file is missing.
    """
    manifest = manifest if manifest is not None else load_manifest(zoo_dir)
    known_variant(zoo_dir, name, manifest)
    files = manifest["variants"][name].get("tflite_files")
    if files:
        paths = [Path(zoo_dir) / f["path"] for f in files.values()]
        for p in paths:
            if not p.is_file():
                raise ZooFileMissing(f"variant {name!r}: no MediaPipe model at {p} "
                                     "(rebuild: python models/build_zoo.py)")
        return paths[0]
    rel = manifest["variants"][name].get("tflite")
    if not rel:
        raise ZooError(f"variant {name!r} has no LiteRT model in zoo {zoo_dir}; rebuild: python models/build_zoo.py")
    path = Path(zoo_dir) / rel
    if not path.is_file():
        raise ZooFileMissing(f"variant {name!r}: no LiteRT model at {path} (rebuild: python models/build_zoo.py)")
    return path


def load_payloads(zoo_dir: str | os.PathLike[str], family: str = DEFAULT_FAMILY) -> tuple[np.ndarray, np.ndarray]:
    """The held-out inputs and labels of ``family``: ``x`` float32 [N, *input_shape], ``y`` int64 [N].

    These are the real queries the workload sends (never seen in training).

    Raises:
        ZooError: unknown family, or the file lacks ``x`` / ``y`` or their shapes disagree.
        ZooFileMissing: the payload file does not exist.
    """
    manifest = load_manifest(zoo_dir)
    info = family_info(manifest, family)
    path = Path(zoo_dir) / info["payloads"]
    if not path.is_file():
        raise ZooFileMissing(f"zoo payloads of {family!r}: {path} does not exist (build: python models/build_zoo.py)")
    x, y = _read_arrays(path, ("x", "y"))
    shape = tuple(info["input_shape"])
    if tuple(x.shape[1:]) != shape or y.shape != (x.shape[0],):
        raise ZooError(f"zoo payloads {path}: x {list(x.shape)} / y {list(y.shape)}, expected [N, "
                       f"{', '.join(map(str, shape))}] / [N]")
    return as_inputs(x), y.astype(np.int64, copy=False)


def as_inputs(x: np.ndarray) -> np.ndarray:
    """Stored payloads as the models take them: float32, same shape; 8-bit RGB frames (the image
    families store ``uint8``) scaled to [0, 1], anything else as it is."""
    if x.dtype == np.uint8:
        return x.astype(np.float32) / np.float32(255.0)
    return x.astype(np.float32, copy=False)


def _read_arrays(path: Path, keys: tuple[str, ...]) -> list[np.ndarray]:
    try:
        with np.load(path) as data:
            return [data[k] for k in keys]
    except (OSError, ValueError, KeyError) as exc:
        raise ZooError(f"zoo payloads {path}: cannot read arrays {', '.join(map(repr, keys))} ({exc})") from exc


def load_jpegs(zoo_dir: str | os.PathLike[str], family: str) -> list[bytes]:
    """The JPEG files [bytes] of an image family's payload frames (what its camera app sends), in payload order.

    Raises:
        ZooError: ``family`` is not an image family (no ``"wire": "jpeg_b64"``) or its payloads lack them.
    """
    manifest = load_manifest(zoo_dir)
    info = family_info(manifest, family)
    if info.get("wire") != "jpeg_b64":
        raise ZooError(f"family {family!r} sends tensors, not JPEG frames")
    buf, offsets = _read_arrays(Path(zoo_dir) / info["payloads"], ("jpeg", "jpeg_offsets"))
    raw = buf.tobytes()
    return [raw[int(a):int(b)] for a, b in zip(offsets[:-1], offsets[1:], strict=True)]


def request_bodies(zoo_dir: str | os.PathLike[str], family: str, n: int = 128) -> tuple[list[bytes], list[int]]:
    """Ready-to-send TensorFlow Serving REST bodies for application family ``family``.

    Returns ``(bodies, labels)``: up to ``n`` JSON bodies (bytes) and each one's label (-1: the
    family has no ground truth for it). Tensor families: ``{"instances": [<one input>]}`` from the
    held-out payloads; image families: ``{"instances": [{"b64": "<JPEG>"}]}``, the frame as the
    camera app sends it (decoded and resized server-side). Built once per source so that
    serialising a query costs nothing on the measured path.

    Raises:
        ZooError: ``family`` is not in the zoo, or its payloads are missing / malformed.
    """
    x, y = load_payloads(zoo_dir, family)
    k = min(len(x), n)
    if family_info(load_manifest(zoo_dir), family).get("wire") == "jpeg_b64":
        jpegs = load_jpegs(zoo_dir, family)[:k]
        return ([json.dumps({"instances": [{"b64": base64.b64encode(j).decode()}]}).encode() for j in jpegs],
                [int(v) for v in y[:k]])
    bodies = [json.dumps({"instances": [np.round(x[i], 4).tolist()]}).encode() for i in range(k)]
    return bodies, [int(v) for v in y[:k]]


def load_profile(profiles_dir: str | os.PathLike[str], variant: str) -> dict[str, Any]:
    """Read ``<profiles_dir>/<variant>.json`` (format: :mod:`testbed.plan.profiles`).

    Top-level keys ``mean_ms``, ``p50_ms``, ``p95_ms``, ``p99_ms``, ``cpu_cores``, ``batch_size``
    (the reference point: TensorFlow, 1 core, batch 1), ``machine``, ``measured_at``; profiles of
    schema 2 add ``measurements`` (one per runtime x CPU share x batch, with raw ``samples_ms``).

    Raises:
        ZooFileMissing: no profile for ``variant``.
        ZooError: the file is not JSON or lacks a timing key.
    """
    path = Path(profiles_dir) / f"{variant}.json"
    data = _read_json(path, f"service-time profile of variant {variant!r}")
    for key in ("mean_ms", "p50_ms", "p95_ms", "p99_ms", "cpu_cores", "batch_size"):
        if key not in data:
            raise ZooError(f"profile {path} of variant {variant!r} has no {key!r}; re-measure: testbed profile")
    return data


def zoo_complete(zoo_dir: str | os.PathLike[str]) -> bool:
    """True iff the manifest, every family's payloads and every SavedModel / .tflite exist (no TensorFlow)."""
    try:
        manifest = load_manifest(zoo_dir)
        for name, v in manifest["variants"].items():
            if v.get("path"):
                variant_dir(zoo_dir, name, manifest)
            if v.get("tflite") or v.get("tflite_files"):
                tflite_path(zoo_dir, name, manifest)
        for f in manifest["families"].values():
            if not (Path(zoo_dir) / f["payloads"]).is_file():
                return False
    except ZooError:
        return False
    return True


def ensure_zoo(zoo_dir: str | os.PathLike[str] = "models/zoo", profiles_dir: str | os.PathLike[str] | None = None,
               timeout_s: float = 1800.0) -> dict[str, Any]:
    """Return the zoo's manifest, building the zoo first if missing or stale.

    Runs ``models/build_zoo.py --out zoo_dir --profiles profiles_dir`` in a subprocess (so this
    process does not pay TensorFlow's import). The script is idempotent: on an up-to-date zoo it
    returns in well under a second; it rebuilds a missing or older-recipe zoo (minutes from nothing:
    docs/models-and-servers.md; parts that did not change are copied) and measures a minimal profile
    only for variants that have none (tracked profiles are measured data: never overwritten).
    Without the build script (an installed copy of the package), the zoo and profiles must
    already be complete.

    Raises:
        ZooFileMissing: no build script and the zoo or a profile is missing.
        ZooError: the build fails or times out (its output is in the message).
    """
    profiles = Path(profiles_dir) if profiles_dir is not None else Path(zoo_dir).resolve().parent / "profiles"
    if not BUILD_SCRIPT.is_file():
        manifest = load_manifest(zoo_dir)
        if not zoo_complete(zoo_dir):
            raise ZooFileMissing(f"zoo {zoo_dir} is incomplete and the build script {BUILD_SCRIPT} is not there")
        for name in manifest["variants"]:
            load_profile(profiles, name)
        return manifest
    cmd = [sys.executable, str(BUILD_SCRIPT), "--out", str(zoo_dir), "--profiles", str(profiles)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as exc:
        raise ZooError(f"building the zoo ({' '.join(cmd)}) took more than {timeout_s:.0f} s") from exc
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr)[-3000:]
        raise ZooError(f"building the zoo failed (exit {proc.returncode}): {' '.join(cmd)}\n{tail}")
    return load_manifest(zoo_dir)


__all__ = ["ADDED", "BUILD_SCRIPT", "DEFAULT_FAMILY", "FILES_SHA256", "INPUT_NAME", "INPUT_SHAPE", "MANIFEST",
           "NUM_CLASSES", "OUTPUT_NAME", "PAYLOADS", "PAYLOADS_DIR", "RUNTIMES", "SIGNATURE_KEY", "ZooError",
           "ZooFileMissing", "ZooIntegrityError", "added_variants", "ensure_zoo", "families", "family_info",
           "input_shape", "known_variant", "load_jpegs", "load_manifest", "load_payloads", "load_profile",
           "missing_hashes", "model_files", "record_hashes", "record_variant_hashes", "recorded_hashes",
           "request_bodies", "runtimes_of", "tflite_path", "variant_dir", "verify_model_files", "cached_file_sha256",
           "hash_cache_path",
           "zoo_complete", "zoo_lock"]
