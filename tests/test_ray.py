"""Sweeps on a local two-node Ray cluster (head + one worker, every service on 127.0.0.1): the same
table as the local process pool, and emulation cells only where the ``mininet`` resource is."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pandas as pd
import pytest

# before Ray is imported: no usage statistics, and services on loopback (testbed.core.distributed)
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
ray = pytest.importorskip("ray")

from ray.cluster_utils import Cluster  # noqa: E402

from testbed.core.distributed import DistributedError, imap_unordered  # noqa: E402
from testbed.results.sweep_runner import sweep  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def cluster():
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    worker = c.add_node(num_cpus=1, resources={"mininet": 1})
    c.wait_for_nodes()
    yield c, worker.node_id
    c.shutdown()


def where(x: int) -> tuple[int, str]:
    """Which node ran this task."""
    return x, ray.get_runtime_context().get_node_id()


def test_sweep_on_ray_cluster_gives_the_local_table(cluster, tmp_path):
    c, _ = cluster
    exps = [str(REPO / "experiments/triangle.yaml"), str(REPO / "experiments/scenario-low.yaml")]
    args = (exps, ["closest", "random"], [1, 2])
    local = sweep(*args, tmp_path / "local", jobs=2, duration_s=4.0)
    on_ray = sweep(*args, tmp_path / "ray", duration_s=4.0, ray_address=c.address)
    pd.testing.assert_frame_equal(local, on_ray)
    assert (tmp_path / "local" / "table.md").read_text() == (tmp_path / "ray" / "table.md").read_text()
    runs = [pd.read_parquet(tmp_path / d / "runs.parquet").drop(columns="wall_s") for d in ("local", "ray")]
    pd.testing.assert_frame_equal(*runs)
    assert len(runs[0]) == 8 and runs[0]["queries"].min() > 0


def test_custom_resource_places_tasks_on_its_node(cluster):
    c, worker_id = cluster
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import tests/
    got = dict(imap_unordered(where, [(i,) for i in range(3)], backend="ray", ray_address=c.address,
                              resources={"mininet": 1}))
    assert sorted(got) == [0, 1, 2] and {n for _, n in got.values()} == {worker_id}
    with pytest.raises(DistributedError, match="no Ray node offers {'gpu_box': 1}"):
        list(imap_unordered(where, [(0,)], backend="ray", ray_address=c.address, resources={"gpu_box": 1}))
