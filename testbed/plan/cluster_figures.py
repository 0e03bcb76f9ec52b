"""The clusters of a plan: every served model and application family from the catalog, each
cluster's service times (:func:`testbed.model.service.service_figures`, once, for both engines),
and the request bytes of each application."""

from __future__ import annotations

from testbed.core.util import did_you_mean
from testbed.model.cpu import threads_per_call
from testbed.model.service import ServiceFigures, service_figures
from testbed.plan.catalog import Catalog, CatalogError, ModelInfo
from testbed.plan.resolved import PlanError
from testbed.spec.experiment import ClusterSpec, Experiment


def check_families(exp: Experiment, catalog: Catalog) -> None:
    """Every application's family is in the catalog.

    Raises:
        PlanError: naming the application and the catalog's families.
    """
    families = set(catalog.families())
    for a in exp.applications:
        if a.family not in families:
            raise PlanError(f"application {a.name!r}: family {a.family!r} is not in the model zoo"
                            f"{did_you_mean(a.family, families)} (has: {', '.join(sorted(families))})")


def cluster_services(c: ClusterSpec, catalog: Catalog, models: dict[str, ModelInfo],
                     notes: list[str]) -> dict[str, ServiceFigures]:
    """The service times of each model ``c`` serves, at its share, W and threads per call; adds
    each model's :class:`ModelInfo` to ``models`` and a catalog's note to ``notes`` (once).

    Raises:
        PlanError: the catalog lacks the model or its profile (names the cluster).
    """
    threads = threads_per_call(c.cpu_cores, c.workers)
    out: dict[str, ServiceFigures] = {}
    for m in c.models:
        try:
            models[m] = catalog.model(m)
            rt = c.server.runtime_of(m)
            smp = catalog.samples(m, rt, threads)
        except CatalogError as exc:
            raise PlanError(f"cluster {c.name!r}: {exc}") from None
        if smp.note and smp.note not in notes:  # said once, however many clusters serve it
            notes.append(smp.note)
        out[m] = service_figures(m, rt, c.cpu_cores, c.workers, threads, smp.samples_ms, smp.batch_mean_ms,
                                 smp.source, smp.handling_ms, smp.cold_factor, smp.answer_ms)
    return out


def check_served(exp: Experiment, models: dict[str, ModelInfo]) -> None:
    """Every application has a served model of its family that reaches its ``min_accuracy``.

    Raises:
        PlanError: naming the application, what the clusters serve and the best accuracy.
    """
    served = {info.family for info in models.values()}
    for a in exp.applications:
        if a.family not in served:
            raise PlanError(f"application {a.name!r}: no cluster serves a model of its family {a.family!r} "
                            f"(the clusters serve: {', '.join(sorted(served))}); add one to a cluster's models")
        best = max((m for m in models.values() if m.family == a.family), key=lambda m: m.accuracy)
        if best.accuracy < a.min_accuracy:
            raise PlanError(f"application {a.name!r}: min_accuracy {a.min_accuracy:g} is above every model of its "
                            f"family {a.family!r} the clusters serve (the best: {best.name} {best.accuracy:g}), so "
                            f"every query would fail 'accuracy'; lower min_accuracy or serve a better model")


def resolve_models(exp: Experiment, catalog: Catalog,
                   notes: list[str]) -> tuple[dict[str, ModelInfo], dict[str, dict[str, ServiceFigures]]]:
    """Every served model and application family from the catalog; each cluster's service times
    (``services[cluster][model]``).

    Raises:
        PlanError: a family, model or profile is missing, or an application cannot be served.
    """
    check_families(exp, catalog)
    models: dict[str, ModelInfo] = {}
    services = {}
    for i, c in enumerate(exp.clusters):
        try:
            services[c.name] = cluster_services(c, catalog, models, notes)
        except PlanError as exc:
            raise PlanError(f"clusters.{i}.models: {exc}") from None
    check_served(exp, models)
    return models, services


def request_sizes(exp: Experiment, catalog: Catalog) -> dict[str, int]:
    """Request body bytes per application: ``simulation.request_bytes`` if set, else the mean
    size of the catalog's request bodies for the application's family."""
    fixed = exp.simulation.request_bytes
    return {a.name: int(fixed or catalog.request_bytes(a.family)) for a in exp.applications}


__all__ = ["check_families", "check_served", "cluster_services", "request_sizes", "resolve_models"]
