"""How the emulation starts a cluster's inference server: its command line from the experiment."""

from __future__ import annotations

import math
import sys
from pathlib import Path

from testbed.config import ClusterSpec


def server_command(spec: ClusterSpec, cpu_cores: float, port: int, zoo_dir: Path, run_dir: Path,
                   profiles_dir: Path | None = None) -> list[str]:
    """The argv of ``python -m testbed.inference.server`` for cluster ``spec``.

    ``cpu_cores``: the cluster's CPU share (cores); it sets TensorFlow's intra-op / LiteRT threads
    (ceil(cpu_cores)) and picks the profile the admission rule uses. Every ``spec.server``
    (:class:`testbed.inference.spec.ServerSpec`) setting is passed through. ``profiles_dir``:
    service-time profiles (default ``<zoo_dir>/../profiles``). Stats and ready files go to
    ``run_dir/clusters/<name>.{stats,ready}.json``.
    """
    name, srv = spec.name, spec.server
    profiles = profiles_dir if profiles_dir is not None else Path(zoo_dir).parent / "profiles"
    cmd = [sys.executable, "-m", "testbed.inference.server", "--host", "0.0.0.0",
           "--port", str(port), "--zoo", str(zoo_dir),
           "--models", ",".join(spec.models), "--workers", str(spec.workers),
           "--threads", str(max(1, math.ceil(cpu_cores))), "--queue-limit", str(spec.queue_limit),
           "--runtime", srv.runtime, "--discipline", srv.discipline,
           "--max-batch", str(srv.max_batch), "--max-queue-delay-ms", repr(float(srv.max_queue_delay_ms)),
           "--warmup", str(srv.warmup_calls), "--profiles", str(profiles), "--cpu-cores", repr(float(cpu_cores)),
           "--stats-file", str(run_dir / "clusters" / f"{name}.stats.json"),
           "--ready-file", str(run_dir / "clusters" / f"{name}.ready.json")]
    overrides = {m: rt for m, rt in srv.model_runtimes.items() if m in spec.models}
    if overrides:
        cmd += ["--model-runtimes", ",".join(f"{m}={rt}" for m, rt in sorted(overrides.items()))]
    if srv.admission:
        cmd.append("--admission")
    return cmd
