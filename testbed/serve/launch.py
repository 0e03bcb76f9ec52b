"""How the emulation starts a cluster's inference server: its config file and command line."""

from __future__ import annotations

import sys
from pathlib import Path

from testbed.core.util import write_json_atomic
from testbed.plan.boundaries import ServerConfig
from testbed.plan.speeds import SpeedTarget


def write_server_config(plan, cluster: str, port: int, run_dir: Path, speed: SpeedTarget | None = None,
                        cpu_stat_file: Path | None = None) -> Path:
    """Write ``run_dir/clusters/<cluster>.server.json`` (:class:`ServerConfig` from the plan, with
    the speed check ``speed`` and its cgroup's ``cpu_stat_file``)."""
    path = Path(run_dir) / "clusters" / f"{cluster}.server.json"
    write_json_atomic(path, ServerConfig.from_plan(plan, cluster, port, run_dir, speed, cpu_stat_file))
    return path


def server_command(config_path: Path) -> list[str]:
    """The argv that runs the inference server of ``config_path`` with this Python."""
    return [sys.executable, "-m", "testbed.serve.server", str(config_path)]
