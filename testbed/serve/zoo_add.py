"""A model of one's own in the zoo (``testbed zoo add``): check it, hash it, profile it, add it.

    testbed zoo add FILE --family F --variant V --accuracy A --accuracy-source "..." [--zoo-dir DIR] [--force]

``FILE`` is a LiteRT flatbuffer (``.tflite``: served with runtime ``litert``) or a TensorFlow
SavedModel directory (runtime ``tensorflow``) of a classifier of family ``F``, the zoo's contract
(:mod:`testbed.plan.zoo`): input float32 ``[batch, *input_shape]`` of the family, output
``[batch, classes]`` (probabilities; the SavedModel's signature ``serving_default``: ``x`` ->
``probabilities``). Families served through MediaPipe graphs (``hands``, ``faces``) take no
model of one's own.

Steps (:func:`add_model`), every one before anything in the zoo or the profiles is written:

1. the request (:func:`check_request`): the file exists and is a model file, the family is in the
   zoo, the name is free (``--force`` replaces a variant added before, never one the build made),
   the accuracy is a fraction in [0, 1] with its source;
2. staging (:func:`stage`): a temporary directory inside the zoo holds the file (``<V>.tflite``
   or ``<V>/``), a copy of the family's held-out payloads and a manifest of that one variant: a
   zoo of its own; the SHA-256 of the model files is recorded as the build records it
   (:func:`testbed.plan.zoo.record_variant_hashes`);
3. the check (:func:`check_model`): the model is loaded as a server loads it
   (:func:`testbed.serve.loaders.load_model`, hashes verified), answers one query of each of the
   family's held-out samples, each answer ``[1, classes]`` and finite, and its top-1 accuracy on
   the labelled ones is measured and judged against the declared one (:func:`accuracy_verdict`);
   then the server's start-up check (:func:`testbed.serve.loaders.check_answers`);
4. the measurements: its service-time profile (:func:`testbed.serve.profiler.run`, by default at
   the shares and batch sizes of every profile in the zoo, ``DEFAULT_SHARES`` x
   ``DEFAULT_BATCHES``) and its request-handling row (:func:`testbed.serve.handling.run`), made
   on the staged zoo into a staged profiles directory;
5. the commit (:func:`commit`): profile, ``handling.json``, model files and last the manifest
   are moved in, each replacing its old version, which is kept aside until the manifest (the
   commit point) is written; on any failure every one is put back.

The accuracy rule (:func:`accuracy_verdict`), with ``A`` the declared accuracy and ``a`` the share
of the ``n`` labelled held-out samples answered right: refused when ``a < A - 0.2``
(:data:`testbed.serve.loaders.ANSWER_CHECK_MARGIN`: the margin below which a server refuses to serve a
model at start-up), a warning when ``a < A - 3 sqrt(A (1 - A) / n)`` (three binomial standard
deviations of the share at accuracy ``A``). A family without labels (``imagenet``'s photographs)
has no measured accuracy: a warning says so and the declared figure stands. The manifest keeps
the declared accuracy (what the plan uses) and the measured one (``added.accuracy_measured``,
and ``accuracy_<runtime>``, what the server's start-up check compares with).

A variant added here carries ``added`` in the manifest (:data:`testbed.plan.zoo.ADDED`): a
rebuild of the zoo (``models/build_zoo.py``) keeps it.

Errors: :class:`AddError` (exit 2) naming the file or the option, raised before anything is
written; a measurement that fails is a :class:`testbed.core.errors.RunFailure` (exit 3) and
leaves the zoo as it was.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from testbed.core.errors import RunFailure
from testbed.core.util import native_stderr_to, write_json_atomic
from testbed.plan import zoo
from testbed.plan.handling_profiles import FILE as HANDLING_FILE
from testbed.plan.handling_profiles import MIN_N
from testbed.serve import handling, profiler
from testbed.serve.loaders import ANSWER_CHECK_MARGIN, check_answers, load_model, tflite_params

#: A variant's name: a file name in the zoo and a path segment of the server's URL.
VARIANT_RE = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"
#: Refusal: measured top-1 more than this below the declared accuracy (the server's start-up margin).
ACCURACY_REFUSE_MARGIN = ANSWER_CHECK_MARGIN
#: Warning: measured top-1 more than this many binomial standard deviations below the declared accuracy.
ACCURACY_WARN_SIGMAS = 3.0
#: A row of probabilities sums to 1 within this.
PROBABILITY_TOLERANCE = 1e-3
KINDS = {"tflite": "litert", "savedmodel": "tensorflow"}


class AddError(zoo.ZooError):
    """A model file that cannot be added (the message names the file) or a bad option (names it);
    raised before anything is written."""


@dataclass(frozen=True)
class Measuring:
    """How the added model is profiled: CPU ``shares`` (cores) x ``batches`` (inputs per call),
    ``samples`` back-to-back calls and ``isolated_samples`` isolated ones per measurement (the
    profiler's options, :mod:`testbed.serve.profiler`), ``use_cgroup`` (False: share 1 only, at
    full speed), and ``handling_n`` queries of the request-handling measurement (>= 100)."""

    shares: tuple[float, ...] = profiler.DEFAULT_SHARES
    batches: tuple[int, ...] = profiler.DEFAULT_BATCHES
    samples: int = profiler.DEFAULT_SAMPLES
    isolated_samples: int = profiler.DEFAULT_ISOLATED_SAMPLES
    max_seconds: float = profiler.DEFAULT_MAX_SECONDS
    warmup: int = profiler.DEFAULT_WARMUP
    use_cgroup: bool = True
    handling_n: int = 200


@dataclass(frozen=True)
class AddRequest:
    """One ``testbed zoo add``: the model ``source`` (a ``.tflite`` file or a SavedModel
    directory), its ``family`` and new ``variant`` name, the declared ``accuracy`` (top-1 in
    [0, 1]) and where it comes from, the zoo and profiles directories, ``force`` (replace a
    variant added before) and how to measure it."""

    source: Path
    family: str
    variant: str
    accuracy: float
    accuracy_source: str
    zoo_dir: Path
    profiles_dir: Path
    force: bool = False
    measuring: Measuring = Measuring()


@dataclass
class AddResult:
    """What :func:`add_model` added: the variant's manifest ``entry``, the files written
    (absolute paths), its measured accuracy (None: the family has no labels) and the warnings."""

    variant: str
    entry: dict[str, Any]
    written: list[Path]
    measured: dict[str, Any] | None
    warnings: list[str] = field(default_factory=list)


def model_kind(path: Path) -> str:
    """``tflite`` (a file with the LiteRT flatbuffer identifier ``TFL3`` at bytes 4-8) or
    ``savedmodel`` (a directory with ``saved_model.pb``).

    Raises:
        AddError: ``path`` does not exist, or is neither (the message names it).
    """
    if not path.exists():
        raise AddError(f"{path}: no such file or directory")
    if path.is_dir():
        if not (path / "saved_model.pb").is_file():
            raise AddError(f"{path}: a directory without saved_model.pb is not a TensorFlow SavedModel")
        return "savedmodel"
    if not path.is_file():
        raise AddError(f"{path}: not a regular file")
    with open(path, "rb") as f:
        head = f.read(8)
    if len(head) < 8 or head[4:8] != b"TFL3":
        raise AddError(f"{path}: not a LiteRT model (a .tflite flatbuffer has 'TFL3' at bytes 4-8; this file has "
                       f"{head[4:8]!r}) nor a SavedModel directory")
    return "tflite"


def check_request(req: AddRequest) -> tuple[dict[str, Any], str]:
    """Check ``req`` against the zoo; returns (the zoo's manifest, :func:`model_kind` of the file).

    Raises:
        AddError: a missing or non-model file, an unknown family or one served through MediaPipe
            graphs, a bad or taken variant name, an accuracy outside [0, 1], an empty source.
        zoo.ZooError: the zoo's manifest is missing or malformed.
    """
    kind = model_kind(req.source)
    manifest = zoo.load_manifest(req.zoo_dir)
    fams = zoo.families(manifest)
    if req.family not in fams:
        raise AddError(f"--family {req.family!r} is not in the zoo {req.zoo_dir} (has: {', '.join(sorted(fams))})")
    graphs = {f: [n for n in vs if manifest["variants"][n].get("graph")] for f, vs in fams.items()}
    if graphs[req.family]:
        raise AddError(f"--family {req.family!r}: its models are served through MediaPipe graphs "
                       f"({', '.join(graphs[req.family])}) with their own outputs; a model of one's own must be a "
                       f"classifier of a family {', '.join(f for f, g in graphs.items() if not g)}")
    if not re.fullmatch(VARIANT_RE, req.variant):
        raise AddError(f"--variant {req.variant!r}: a name is 1-64 letters, digits, '_' or '-', starting with a letter "
                       f"or digit")
    old = manifest["variants"].get(req.variant)
    if old is not None and not old.get(zoo.ADDED):
        raise AddError(f"--variant {req.variant!r} is a variant of the zoo's build (models/build_zoo.py); choose "
                       f"another name (--force replaces only a variant added with testbed zoo add)")
    if old is not None and not req.force:
        raise AddError(f"--variant {req.variant!r} is in the zoo already (added from {old[zoo.ADDED].get('from')}); "
                       f"choose another name, or --force to replace it")
    _check_free_paths(req, kind, old)
    if not (isinstance(req.accuracy, (int, float)) and math.isfinite(req.accuracy) and 0 <= req.accuracy <= 1):
        hint = f" (a fraction: {req.accuracy / 100:g}, not {req.accuracy:g})" if 1 < req.accuracy <= 100 else ""
        raise AddError(f"--accuracy {req.accuracy!r}: the top-1 accuracy is a fraction in [0, 1]{hint}")
    if not req.accuracy_source.strip():
        raise AddError("--accuracy-source is empty: say where the accuracy comes from (a paper, a measurement)")
    _check_measuring(req.measuring)
    return manifest, kind


def _check_measuring(m: Measuring) -> None:
    """The measuring options, as the profiler and the handling measurement would refuse them."""
    if not m.shares or any(not (math.isfinite(s) and s > 0) for s in m.shares):
        raise AddError(f"--shares {','.join(map(str, m.shares))}: every CPU share must be > 0 cores")
    if not m.batches or any(not 1 <= b <= 256 for b in m.batches):
        raise AddError(f"--batches {','.join(map(str, m.batches))}: every batch size must be in 1..256")
    if m.samples < 20 or m.isolated_samples < 1 or m.warmup < 0 or not m.max_seconds > 0:
        raise AddError(f"--samples {m.samples} (>= 20), --isolated-samples {m.isolated_samples} (>= 1), --warmup "
                       f"{m.warmup} (>= 0), --max-seconds {m.max_seconds:g} (> 0): one is out of range")
    if m.handling_n < MIN_N:
        raise AddError(f"--handling-n {m.handling_n}: at least {MIN_N} queries (the CPU clock ticks at 10 ms)")


def _paths_of(kind: str, variant: str) -> list[str]:
    """The zoo paths (relative) a variant of ``kind`` occupies."""
    return [f"{variant}.tflite"] if kind == "tflite" else [variant]


def _entry_paths(entry: dict[str, Any]) -> list[str]:
    return [p for p in (entry.get("tflite"), entry.get("path")) if p]


def _check_free_paths(req: AddRequest, kind: str, old: dict[str, Any] | None) -> None:
    owned = set(_entry_paths(old)) if old else set()
    for rel in _paths_of(kind, req.variant):
        if (req.zoo_dir / rel).exists() and rel not in owned:
            raise AddError(f"--variant {req.variant!r}: {req.zoo_dir / rel} exists and is not a model of the zoo's "
                           f"manifest; choose another name")


def _entry(req: AddRequest, kind: str) -> dict[str, Any]:
    """The manifest entry of the new variant (hashes, params and measurements are added later)."""
    return {"family": req.family, "path": req.variant if kind == "savedmodel" else None,
            "tflite": f"{req.variant}.tflite" if kind == "tflite" else None,
            "accuracy": round(float(req.accuracy), 4), "accuracy_source": req.accuracy_source.strip(), "params": 0,
            "weights": "the user's own (testbed zoo add)",
            zoo.ADDED: {"from": str(req.source.resolve()), "kind": kind,
                        "at": datetime.now(UTC).isoformat(timespec="seconds")}}


def stage(req: AddRequest, kind: str, manifest: dict[str, Any], where: Path) -> dict[str, Any]:
    """Make ``where`` a zoo of the one new variant: its model file(s), the family's payloads and
    its manifest (written), with the model files' SHA-256 recorded. Returns that manifest.

    Raises:
        OSError: a copy failed (disk full, permissions).
    """
    info = manifest["families"][req.family]
    payloads = where / info["payloads"]
    payloads.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(req.zoo_dir / info["payloads"], payloads)
    except OSError:
        shutil.copy2(req.zoo_dir / info["payloads"], payloads)
    entry = _entry(req, kind)
    if kind == "tflite":
        shutil.copyfile(req.source, where / entry["tflite"])
    else:
        shutil.copytree(req.source, where / entry["path"])
    mini = {"recipe_version": manifest["recipe_version"], "families": {req.family: info},
            "variants": {req.variant: entry}}
    zoo.record_variant_hashes(where, req.variant, mini)
    entry["size_bytes"] = sum(p.stat().st_size for rel in _entry_paths(entry) for p in _files(where / rel))
    write_json_atomic(where / zoo.MANIFEST, mini, indent=2)
    return mini


def _files(path: Path) -> Iterator[Path]:
    return iter([path]) if path.is_file() else (p for p in path.rglob("*") if p.is_file())


def accuracy_verdict(declared: float, correct: int, n: int) -> tuple[str, str]:
    """Judge a measured top-1 (``correct`` of ``n``) against the ``declared`` accuracy (module doc).

    Returns ``(level, text)``: level ``ok``, ``warn`` (more than :data:`ACCURACY_WARN_SIGMAS`
    binomial standard deviations ``sqrt(A (1 - A) / n)`` below) or ``refuse`` (more than
    :data:`ACCURACY_REFUSE_MARGIN` below); text says the figures and the rule.

    Raises:
        ValueError: ``n`` < 1 or ``correct`` outside 0..n.
    """
    if n < 1 or not 0 <= correct <= n:
        raise ValueError(f"correct {correct} of n {n}: need n >= 1 and 0 <= correct <= n")
    got = correct / n
    sigma = math.sqrt(declared * (1 - declared) / n)
    text = f"top-1 {correct}/{n} = {got:.4f} on the family's held-out samples, declared {declared:.4f}"
    if got < declared - ACCURACY_REFUSE_MARGIN:
        return "refuse", (f"{text}: more than {ACCURACY_REFUSE_MARGIN:g} below (the margin below which a server "
                          f"refuses to serve a model); declare what it measures (--accuracy {got:.4f}) or fix the "
                          f"model")
    if got < declared - ACCURACY_WARN_SIGMAS * sigma:
        return "warn", (f"{text}: more than {ACCURACY_WARN_SIGMAS:g} standard deviations ({sigma:.4f} each at "
                        f"n = {n}) below; the plan uses the declared figure: is it right?")
    return "ok", text


def check_model(where: Path, req: AddRequest, mini: dict[str, Any], runtime: str,
                warnings: list[str]) -> dict[str, Any] | None:
    """Load the staged model as a server does and have it answer every held-out sample of its
    family, one query each; measure its top-1 on the labelled ones (:func:`accuracy_verdict`),
    record it in ``mini`` (``accuracy_<runtime>``, ``added.accuracy_measured``; rewritten), and
    run the server's start-up check. Appends warnings to ``warnings``.

    Returns the measured accuracy ``{"correct", "n", "accuracy", "runtime"}``, or None (no labels).

    Raises:
        AddError: the model does not load, takes another input, answers with another shape or
            non-finite numbers, or is far below its declared accuracy (names the file).
    """
    src, name = req.source, req.variant
    what = f"{src}: as a {runtime} model of family {req.family!r}"
    try:
        model = load_model(where, name, runtime, mini)
        x, y = zoo.load_payloads(where, req.family)
        first = np.asarray(model.predict(x[:1]))
    except Exception as exc:  # noqa: BLE001 - whatever the runtime raises on a file it cannot run: named
        raise AddError(f"{what}: {_why(exc, runtime, mini['families'][req.family])}") from None
    classes = int(mini["families"][req.family]["classes"])
    if first.shape != (1, classes):
        raise AddError(f"{what}: answers one input with shape {list(first.shape)}, expected [1, {classes}] (one score "
                       f"per class of the family)")
    out = np.concatenate([first] + [np.asarray(model.predict(x[i:i + 1])) for i in range(1, len(x))])
    if not np.isfinite(out).all():
        bad = int((~np.isfinite(out)).any(axis=1).sum())
        raise AddError(f"{what}: answers with non-finite numbers (NaN or inf) on {bad} of {len(x)} held-out samples")
    if np.abs(out.sum(axis=1) - 1).max() > PROBABILITY_TOLERANCE or out.min() < -PROBABILITY_TOLERANCE:
        warnings.append(f"{src}: its answers are not probabilities (rows do not sum to 1: a missing softmax?); the "
                        f"server returns them as they are, top-1 is their largest")
    keep = y >= 0
    if not keep.any():
        warnings.append(f"family {req.family!r} has no labelled samples: the accuracy of {src} is not measured; the "
                        f"declared {req.accuracy:g} stands")
        return None
    correct = int((out[keep].argmax(axis=1) == y[keep]).sum())
    level, text = accuracy_verdict(req.accuracy, correct, int(keep.sum()))
    if level == "refuse":
        raise AddError(f"{src}: {text}")
    if level == "warn":
        warnings.append(f"{src}: {text}")
    n = int(keep.sum())
    measured = {"runtime": runtime, "correct": correct, "n": n, "accuracy": round(correct / n, 4)}
    entry = mini["variants"][name]
    entry[f"accuracy_{runtime}"] = measured["accuracy"]
    entry[zoo.ADDED]["accuracy_measured"] = {**measured, "rule": f"refused below declared - "
                                             f"{ACCURACY_REFUSE_MARGIN:g}, warned below declared - "
                                             f"{ACCURACY_WARN_SIGMAS:g} binomial standard deviations"}
    write_json_atomic(where / zoo.MANIFEST, mini, indent=2)
    try:
        check_answers(where, name, model, mini)
    except zoo.ZooIntegrityError as exc:
        raise AddError(f"{src}: {exc}") from None
    return measured


def _why(exc: BaseException, runtime: str, family: dict[str, Any]) -> str:
    """What went wrong loading a model file, with the contract it must meet."""
    shape = ", ".join(map(str, family["input_shape"]))
    contract = (f"a .tflite with one float32 input [1, {shape}] and an output [1, {family['classes']}]"
                if runtime == "litert" else
                f"a SavedModel with signature {zoo.SIGNATURE_KEY!r}: input {zoo.INPUT_NAME!r} float32 [None, {shape}] "
                f"-> output {zoo.OUTPUT_NAME!r} [None, {family['classes']}]")
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return f"cannot be loaded and run ({text}); the zoo takes {contract}"


def _params(where: Path, entry: dict[str, Any]) -> int:
    """Weights of the staged model: constant float tensors (.tflite), or the variables its
    SavedModel's serving signature reads."""
    if entry.get("tflite"):
        return tflite_params(where / entry["tflite"])
    import tensorflow as tf  # only for a SavedModel, whose check has imported it already

    loaded = tf.saved_model.load(str(where / entry["path"]))  # kept alive: the signature holds weak references
    fn = loaded.signatures[zoo.SIGNATURE_KEY]
    return int(sum(int(np.prod(v.shape)) for v in fn.variables))  # what the call reads: no optimizer state


def measure(where: Path, profiles: Path, req: AddRequest, runtime: str, log: Callable[[str], None]) -> None:
    """Profile the staged variant (:func:`testbed.serve.profiler.run`) and measure its request
    handling (:func:`testbed.serve.handling.run`) into ``profiles``.

    Raises:
        RunFailure: a measurement failed or an option is out of range (the message says which).
    """
    m = req.measuring
    try:
        profiler.run(where, profiles, variants=[req.variant], runtimes=[runtime], shares=list(m.shares),
                     batches=list(m.batches), samples=m.samples, warmup=m.warmup, use_cgroup=m.use_cgroup,
                     make_plot=False, log=log, isolated_samples=m.isolated_samples, max_seconds=m.max_seconds)
        handling.run(where, profiles, [req.variant], m.handling_n, log=log)
    except (RunFailure, zoo.ZooError, ValueError, RuntimeError, OSError) as exc:
        raise RunFailure(f"{req.source}: measuring it failed, nothing was added: {exc}") from None


class _Swap:
    """Files moved into place one by one, each old version kept aside, until :meth:`done`;
    :meth:`undo` puts every old version back (and removes the new ones)."""

    def __init__(self) -> None:
        self.moves: list[tuple[Path, Path | None]] = []

    def put(self, src: Path, dst: Path) -> None:
        """Move ``src`` (file or directory) to ``dst``, keeping what was at ``dst`` aside."""
        dst.parent.mkdir(parents=True, exist_ok=True)
        near = dst.with_name(f".{dst.name}.new-{os.getpid()}")
        shutil.move(str(src), str(near))  # a rename on the same file system, else a copy: then one rename
        aside = None
        if dst.exists():
            aside = dst.with_name(f".{dst.name}.old-{os.getpid()}")
            os.replace(dst, aside)
        self.moves.append((dst, aside))
        os.replace(near, dst)

    def remove(self, dst: Path) -> None:
        """Take ``dst`` away (kept aside until :meth:`done`); nothing if it does not exist."""
        if dst.exists():
            aside = dst.with_name(f".{dst.name}.old-{os.getpid()}")
            os.replace(dst, aside)
            self.moves.append((dst, aside))

    def undo(self) -> None:
        for dst, aside in reversed(self.moves):
            _remove(dst)
            if aside is not None:
                os.replace(aside, dst)
        self.moves.clear()

    def done(self) -> None:
        for _, aside in self.moves:
            if aside is not None:
                _remove(aside)
        self.moves.clear()


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def _merged_handling(staged: Path, real: Path, variant: str) -> dict[str, Any]:
    """``real``'s handling.json (or the staged one when there is none) with ``variant``'s rows
    from the staged one (its old rows of other runtimes dropped: they were another model's)."""
    new = json.loads((staged / HANDLING_FILE).read_text())
    path = real / HANDLING_FILE
    if not path.is_file():
        return new
    try:
        doc = json.loads(path.read_text())
        doc["variants"][variant] = new["variants"][variant]
    except (ValueError, KeyError, TypeError) as exc:
        raise AddError(f"{path}: malformed ({exc}); fix or remove it before adding a model") from None
    if isinstance(doc.get("other_runtimes"), dict):
        doc["other_runtimes"].pop(variant, None)
    return doc


def commit(where: Path, profiles: Path, req: AddRequest, entry: dict[str, Any]) -> list[Path]:
    """Move the staged profile, handling row, model files and (last: the commit point) manifest
    entry into the zoo and the profiles directory; on any failure before the manifest is
    written, put everything back. Returns the paths written.

    Raises:
        AddError: the profiles' handling.json is malformed.
        OSError: a move failed (everything was put back).
    """
    manifest = zoo.load_manifest(req.zoo_dir)  # again, under the lock: what is there now
    old = manifest["variants"].get(req.variant)
    manifest["variants"][req.variant] = entry
    write_json_atomic(where / ".handling.merged.json", _merged_handling(profiles, req.profiles_dir, req.variant))
    write_json_atomic(where / ".manifest.merged.json", manifest, indent=2)
    swap = _Swap()
    written = [req.profiles_dir / f"{req.variant}.json", req.profiles_dir / HANDLING_FILE,
               *(req.zoo_dir / rel for rel in _entry_paths(entry)), req.zoo_dir / zoo.MANIFEST]
    try:
        swap.put(profiles / f"{req.variant}.json", written[0])
        swap.put(where / ".handling.merged.json", written[1])
        for rel in _entry_paths(old or {}):
            if rel not in _entry_paths(entry):  # e.g. a .tflite replaced by a SavedModel
                swap.remove(req.zoo_dir / rel)
        for rel in _entry_paths(entry):
            swap.put(where / rel, req.zoo_dir / rel)
        swap.put(where / ".manifest.merged.json", written[-1])
    except BaseException:
        swap.undo()
        raise
    swap.done()
    return written


@contextmanager
def _staging(zoo_dir: Path, variant: str) -> Iterator[tuple[Path, Path]]:
    """A staging directory inside the zoo (same file system: the commit renames) and a profiles
    directory inside it; both removed at the end, whatever happens."""
    where = Path(tempfile.mkdtemp(prefix=f".add-{variant}-", dir=zoo_dir))
    where.chmod(0o755)  # the zoo is read by servers of other users too
    try:
        profiles = where / ".profiles"
        profiles.mkdir()
        yield where, profiles
    finally:
        shutil.rmtree(where, ignore_errors=True)


def add_model(req: AddRequest, log: Callable[[str], None] = print) -> AddResult:
    """Add the model file ``req.source`` to the zoo as variant ``req.variant`` (module doc):
    check, stage, check that it answers, measure, commit, under the zoo's lock.

    Raises:
        AddError: the file or an option is bad (before anything is written; names it).
        RunFailure: a measurement failed (nothing was added).
        zoo.ZooError: the zoo is missing or malformed.
    """
    warnings: list[str] = []
    with zoo.zoo_lock(req.zoo_dir):  # no build and no other zoo add writes the zoo meanwhile
        manifest, kind = check_request(req)
        for old in req.zoo_dir.glob(".add-*"):  # under the lock: left by an add that was killed
            log(f"[zoo add] removing {old}, the staging of an earlier zoo add that did not finish")
            shutil.rmtree(old, ignore_errors=True)
        runtime = KINDS[kind]
        with _staging(req.zoo_dir, req.variant) as (where, profiles):
            mini = stage(req, kind, manifest, where)
            entry = mini["variants"][req.variant]
            with native_stderr_to(where / "native.log"):  # LiteRT's / TensorFlow's C++ log lines
                measured = check_model(where, req, mini, runtime, warnings)
                entry["params"] = _params(where, entry)
            write_json_atomic(where / zoo.MANIFEST, mini, indent=2)
            log(f"[zoo add] {req.source}: loads and answers as {runtime}"
                + (f"; top-1 {measured['correct']}/{measured['n']} = {measured['accuracy']:.4f}" if measured else "")
                + f"; profiling at {', '.join(f'{s:g}' for s in req.measuring.shares)} cores")
            measure(where, profiles, req, runtime, log)
            written = commit(where, profiles, req, entry)
    return AddResult(req.variant, entry, written, measured, warnings)


def default_profiles_dir(zoo_dir: Path) -> Path:
    """The profiles directory next to a zoo (``models/zoo`` -> ``models/profiles``), as the build uses."""
    return zoo_dir.resolve().parent / "profiles"


__all__ = ["ACCURACY_REFUSE_MARGIN", "ACCURACY_WARN_SIGMAS", "VARIANT_RE", "AddError", "AddRequest", "AddResult",
           "Measuring", "accuracy_verdict", "add_model", "check_model", "check_request", "commit",
           "default_profiles_dir", "model_kind", "stage"]
