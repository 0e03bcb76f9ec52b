"""How the emulation starts a cluster's inference server: its command line from the experiment."""

from __future__ import annotations

import math
import sys
from pathlib import Path

from testbed.config import ClusterSpec


def server_command(spec: ClusterSpec, cpu_cores: float, port: int, zoo_dir: Path, run_dir: Path) -> list[str]:
    """The argv of ``python -m testbed.inference.server`` for cluster ``spec``.

    ``cpu_cores``: the cluster's CPU share (cores), which sets TensorFlow's intra-op threads.
    Stats and ready files go to ``run_dir/clusters/<name>.{stats,ready}.json``.
    """
    name = spec.name
    return [sys.executable, "-m", "testbed.inference.server", "--host", "0.0.0.0",
            "--port", str(port), "--zoo", str(zoo_dir),
            "--models", ",".join(spec.models), "--workers", str(spec.workers),
            "--threads", str(max(1, math.ceil(cpu_cores))), "--queue-limit", str(spec.queue_limit),
            "--stats-file", str(run_dir / "clusters" / f"{name}.stats.json"),
            "--ready-file", str(run_dir / "clusters" / f"{name}.ready.json")]
