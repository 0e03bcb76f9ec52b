"""What the plan needs to know about models: accuracy, family and service-time profiles.

:class:`ZooCatalog` reads them from the model zoo (``models/zoo/manifest.json``) and one profiles
folder (``models/profiles``); :class:`FixedCatalog` holds them in memory (tests, benchmarks with
synthetic models). :func:`testbed.plan.build.build_plan` asks a catalog once per model and cluster;
nothing else reads the zoo's manifest or the profiles to decide anything.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field

from testbed.core.errors import InputError
from testbed.core.util import did_you_mean
from testbed.plan import handling_profiles, profiles, zoo


class CatalogError(InputError):
    """A model, family or profile the experiment needs is not in the catalog (names it)."""


class ModelInfo(BaseModel):
    """One model variant: its family (application input/output kind), accuracy alpha_m in [0, 1]
    and where that figure comes from (measured here, or a published source)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    family: str
    accuracy: float = Field(ge=0, le=1)
    accuracy_source: str = ""


@dataclass(frozen=True)
class Samples:
    """Unthrottled per-call times (ms) of one model at batch 1 as the server makes the call, the
    measured batch sizes' means (ms per call), the file(s) they come from, and the server's other
    CPU costs (:mod:`testbed.model.cpu`): ``handling_ms`` of the event loop per query (CPU ms, one
    thread: reading the request and writing the answer, ``answer_ms`` of it the answer's) and the
    ``cold_factor`` of a call after idleness (>= 1). ``server_factor``: the
    in-server call over the profiler's bare call, already applied to ``samples_ms`` and
    ``batch_mean_ms`` (1.0: none applied). ``note``: what the plan should say about these figures
    (e.g. call factors of another runtime than the one asked for; "" when nothing)."""

    samples_ms: Sequence[float]
    batch_mean_ms: Mapping[int, float]
    source: str
    handling_ms: float = 0.0
    cold_factor: float = 1.0
    server_factor: float = 1.0
    note: str = ""
    answer_ms: float = 0.0


class Catalog(Protocol):
    """What :func:`testbed.plan.build.build_plan` asks about models."""

    def families(self) -> Sequence[str]: ...

    def model(self, name: str) -> ModelInfo: ...

    def samples(self, name: str, runtime: str, threads: int) -> Samples: ...

    def request_bytes(self, family: str) -> int: ...


class ZooCatalog:
    """The model zoo on disk and one profiles folder.

    Raises (from the methods): CatalogError naming the missing model, family or profile.
    """

    def __init__(self, zoo_dir: str | os.PathLike[str], profiles_dir: str | os.PathLike[str]):
        self.zoo_dir, self.profiles_dir = Path(zoo_dir), Path(profiles_dir)
        self._checked: set[tuple[str, str]] = set()  # (model, runtime) whose files matched their record
        try:
            self.manifest = zoo.load_manifest(self.zoo_dir)
        except zoo.ZooError as exc:
            raise CatalogError(f"model zoo: {exc}") from None

    def families(self) -> list[str]:
        return sorted(self.manifest["families"])

    def model(self, name: str) -> ModelInfo:
        variants = self.manifest["variants"]
        if name not in variants:
            raise CatalogError(f"model {name!r} is not in the zoo {self.zoo_dir}{did_you_mean(name, variants)} "
                               f"(has: {', '.join(sorted(variants))})")
        v = variants[name]
        return ModelInfo(name=name, family=v["family"], accuracy=float(v["accuracy"]),
                         accuracy_source=str(v.get("accuracy_source", "")))

    def samples(self, name: str, runtime: str, threads: int) -> Samples:
        self.model(name)
        have = zoo.runtimes_of(self.manifest, name)
        if runtime not in have:  # no file to serve it with: measuring cannot help
            fix = (f"server: {{runtime: {have[0]}}} (or model_runtimes: {{{name}: {have[0]}}})" if have else
                   "another model")
            raise CatalogError(f"model {name!r} has no {runtime} model file in the zoo {self.zoo_dir} (has: "
                               f"{', '.join(have) or 'none'}); give the cluster {fix}")
        self._check_files(name, runtime)
        try:
            ct = profiles.cpu_time(self.profiles_dir, name, runtime, 1, threads)
            prof = zoo.load_profile(self.profiles_dir, name)
        except (zoo.ZooError, ValueError) as exc:
            raise CatalogError(f"model {name!r}: no service-time profile to plan with: {exc}") from None
        rows = [r for r in profiles.measurements(prof) if r.get("runtime", "tensorflow") == runtime
                and float(r["cpu_cores"]) == ct.measured_cpu_cores]
        means = {int(r["batch"]): float(r["mean_ms"]) for r in rows}
        handling, server, cold, source, note, answer = self._server_costs(name, runtime)
        return Samples([float(s) * server for s in ct.samples_ms], {b: m * server for b, m in means.items()},
                       str(self.profiles_dir / f"{name}.json") + source, handling, cold, server, note, answer)

    def _check_files(self, name: str, runtime: str) -> None:
        """The files a ``runtime`` load of ``name`` reads match the zoo's recorded SHA-256, checked
        once per catalog (:func:`testbed.plan.zoo.verify_model_files`, digests cached by size and
        modification time): a corrupt model is a plan error, not a bring-up failure.

        Raises:
            testbed.plan.zoo.ZooIntegrityError: a file differs from its record, or none is recorded
                (exit code 7, naming the file).
            testbed.plan.zoo.ZooFileMissing: a file is missing.
        """
        if (name, runtime) in self._checked:
            return
        zoo.verify_model_files(self.zoo_dir, name, self.manifest, runtime, cached=True)
        self._checked.add((name, runtime))

    def _server_costs(self, name: str, runtime: str) -> tuple[float, float, float, str, str, float]:
        """(handling ms, in-server factor, cold factor, source suffix, plan note, answer ms) of ``name`` from
        ``handling.json`` (:mod:`testbed.plan.handling_profiles`). Without a row of ``runtime``, the
        call factors of the row there are not applied, and the note says so."""
        try:
            row = handling_profiles.measured_row(self.profiles_dir, name, runtime)
            server, cold = handling_profiles.factors_of(row)
        except (zoo.ZooError, ValueError) as exc:
            raise CatalogError(f"model {name!r}: no request-handling figures to plan with: {exc}") from None
        path = self.profiles_dir / handling_profiles.FILE
        if row["runtime"] != runtime:
            note = (f"model {name!r} runs on {runtime}, but {path} has only {row['runtime']}'s row for it: its "
                    f"request handling is taken, its call factors are not (in-server and cold calls charged at "
                    f"1.0); measure them: python -m testbed.serve.handling --runtime {runtime} "
                    f"--variants {name} -n 1000")
            return row["handling_ms"], 1.0, 1.0, (f" + {path} (handling only: its call factors are of "
                                                   f"{row['runtime']}, not {runtime})"), note, row["answer_ms"]
        return row["handling_ms"], server, cold, f" + {path}", "", row["answer_ms"]

    def request_bytes(self, family: str) -> int:
        """Mean size (bytes) of the zoo's request bodies for ``family`` (what the sources send)."""
        try:
            bodies, _ = zoo.request_bodies(self.zoo_dir, family, n=16)
        except zoo.ZooError as exc:
            raise CatalogError(f"family {family!r}: no request bodies in the zoo: {exc}") from None
        return int(sum(len(b) for b in bodies) / len(bodies))


@dataclass
class FixedCatalog:
    """Models held in memory: ``models`` name -> (family, accuracy, batch-1 samples in ms); the
    same samples for every runtime and thread count; ``body_bytes`` per request; the same
    ``handling_ms`` and ``cold_factor`` for every model (default: none) (tests, synthetic
    benchmarks)."""

    models: Mapping[str, tuple[str, float, Sequence[float]]]
    batch_mean_ms: Mapping[str, Mapping[int, float]] = field(default_factory=dict)
    body_bytes: int = 1000
    handling_ms: float = 0.0
    cold_factor: float = 1.0
    answer_ms: float = 0.0

    def families(self) -> list[str]:
        return sorted({f for f, _, _ in self.models.values()})

    def model(self, name: str) -> ModelInfo:
        if name not in self.models:
            raise CatalogError(f"model {name!r} is not in the catalog (has: {', '.join(sorted(self.models))})")
        fam, acc, _ = self.models[name]
        return ModelInfo(name=name, family=fam, accuracy=acc, accuracy_source="fixed (test catalog)")

    def samples(self, name: str, runtime: str, threads: int) -> Samples:
        self.model(name)
        s = [float(x) for x in self.models[name][2]]
        return Samples(s, self.batch_mean_ms.get(name) or {1: sum(s) / len(s)}, "fixed", self.handling_ms,
                       self.cold_factor, answer_ms=self.answer_ms)

    def request_bytes(self, family: str) -> int:
        return self.body_bytes


__all__ = ["Catalog", "CatalogError", "FixedCatalog", "ModelInfo", "Samples", "ZooCatalog"]
