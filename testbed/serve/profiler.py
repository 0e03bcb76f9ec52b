"""Service-time profiler: each variant's per-call time per runtime, CPU share and batch size.

    python -m testbed.serve.profiler [--variants all|a,b] [--families f,g] [--runtimes tensorflow,litert]
        [--shares 0.1,0.25,0.5,1,2] [--batches 1,8] [--samples 200] [--isolated-samples 50] [--max-seconds 15]
        [--warmup 30] [--no-cgroup] [--no-plot]
    (also: ``testbed profile`` with the same options)

Method: one child process per (runtime, CPU share). The child loads the selected variants (with
TensorFlow: intra-op threads = ceil(share), inter-op 1, exactly as the inference server does; with
LiteRT: ceil(share) interpreter threads), says READY; the parent then moves it into a fresh cgroup
whose CFS quota is ``share`` cores (``testbed.core.cgroups``, period 100 ms: the limit the
emulation puts on a cluster's server) and says GO. So imports and loading run at full speed and
only the measurement runs under the quota. Per variant and batch size: ``--warmup`` calls first
(not recorded), then the timed calls, each timed with ``time.perf_counter`` around the same
``predict`` the server makes, inputs cycling through the family's payloads (real images for the
image families). A variant is measured only with the runtimes it has (MediaPipe: LiteRT only).

Two loads per CPU share (field ``load`` of each measurement):

* ``back_to_back``: ``--samples`` calls one after the other (high load). At a share >= threads
  (``role: "cpu_time"``) no call is ever throttled: this is the per-call CPU demand the CPU-share
  model of the simulator takes (:func:`testbed.plan.profiles.cpu_time`).
* ``isolated`` (only at a share < threads): ``--isolated-samples`` calls, each one
  ``ISOLATED_GAP_MS`` (the CFS period) after the previous one ended, so every call starts with a
  refilled quota (low load). Fractional-share measurements of both loads are ``role:
  "validation"``: what the emulation sees, kept to check the CPU-share model, not its input.

A measurement stops early after ``--max-seconds`` once it has MIN_SAMPLES samples (slow models at
small shares); its ``samples`` field says how many it has. Each keeps its raw samples and mean /
p50 / p95 / p99 and the 1-minute load average of the machine before and after it.
``--no-cgroup`` (no root, or no cgroups) measures at the machine's full speed and records only
share 1 -- say so when quoting such figures.

Results are merged into ``<profiles>/<variant>.json`` (schema: :mod:`testbed.plan.profiles`;
a measurement replaces the one with the same runtime, share and batch) together with the machine
(CPU model, cores, kernel, library versions), and plotted to ``<profiles>/service_times.png``.
Timings on a shared machine are noisy: other processes steal CPU from the quota.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from testbed.core import cgroups
from testbed.core.errors import RunFailure
from testbed.core.util import REPO_ROOT
from testbed.plan import zoo
from testbed.plan.profiles import measurements
from testbed.serve.calls import Model
from testbed.serve.loaders import configure_tf_threads, load_model, machine_info

DEFAULT_SHARES = (0.1, 0.25, 0.5, 1.0, 2.0)
DEFAULT_BATCHES = (1, 8)
DEFAULT_SAMPLES = 200
DEFAULT_ISOLATED_SAMPLES = 50
DEFAULT_MAX_SECONDS = 15.0
DEFAULT_WARMUP = 30
#: Fewest samples a measurement stops at when it runs past --max-seconds.
MIN_SAMPLES = 30
#: Pause [ms] before each isolated call: the CFS period (testbed.core.cgroups, 100 ms), so the
#: quota is refilled when the call starts.
ISOLATED_GAP_MS = 100.0
LOADS = ("back_to_back", "isolated")
SCHEMA = 3
PLOT = "service_times.png"


class ProfileError(RunFailure):
    """Bad options (the message names the option) or a failed measurement child."""


def _floats(text: str, what: str) -> list[float]:
    try:
        vals = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ProfileError(f"--{what}: {text!r} is not a comma-separated list of numbers") from None
    if not vals or any(not math.isfinite(v) or v <= 0 for v in vals):
        raise ProfileError(f"--{what}: {text!r}: every value must be > 0")
    return vals


def _ints(text: str, what: str) -> list[int]:
    vals = _floats(text, what)
    if any(v != int(v) or v > 256 for v in vals):
        raise ProfileError(f"--{what}: {text!r}: every value must be an integer in 1..256")
    return [int(v) for v in vals]


def summarize(ms: np.ndarray) -> dict[str, Any]:
    """mean / p50 / p95 / p99 [ms] (rounded to 1 us) of per-call times ``ms``, and the raw samples."""
    return {"samples": int(len(ms)), "mean_ms": round(float(ms.mean()), 4),
            "p50_ms": round(float(np.percentile(ms, 50)), 4), "p95_ms": round(float(np.percentile(ms, 95)), 4),
            "p99_ms": round(float(np.percentile(ms, 99)), 4), "samples_ms": [round(float(v), 4) for v in ms]}


def measure(model: Model, x: np.ndarray, batch: int, samples: int, warmup: int, gap_ms: float = 0.0,
            max_seconds: float = math.inf) -> dict[str, Any]:
    """Time up to ``samples`` calls of ``model.predict`` on ``batch`` inputs from ``x`` after ``warmup`` calls.

    ``gap_ms``: sleep before each timed call (0: back to back). Stops after ``max_seconds`` [s] once
    MIN_SAMPLES calls are timed. Returns :func:`summarize` of the per-call wall times [ms] plus
    ``batch``, ``warmup_calls``, ``gap_ms`` and ``loadavg_1min`` (before, after).
    """
    n = len(x)
    for i in range(warmup):
        model.predict(x[(np.arange(batch) + i * batch) % n])
    load0 = os.getloadavg()[0]
    times: list[float] = []
    start = time.monotonic()
    for i in range(samples):
        if i >= MIN_SAMPLES and time.monotonic() - start > max_seconds:
            break
        xb = x[(np.arange(batch) + i * batch) % n]
        if gap_ms > 0:
            time.sleep(gap_ms / 1e3)
        t = time.perf_counter()
        model.predict(xb)
        times.append(time.perf_counter() - t)
    return {"batch": batch, "warmup_calls": warmup, "gap_ms": gap_ms,
            "loadavg_1min": [round(load0, 2), round(os.getloadavg()[0], 2)],
            **summarize(np.asarray(times) * 1e3)}


def child_main(args: argparse.Namespace) -> int:
    """The measuring child: load, say READY, wait for GO (now under the quota), measure, print JSON."""
    threads = max(1, math.ceil(args.share))
    manifest = zoo.load_manifest(args.zoo)
    names = args.variants.split(",")
    if args.runtime == "tensorflow":
        configure_tf_threads(intra_op=threads, inter_op=1)
    models = {n: load_model(args.zoo, n, args.runtime, manifest, threads=threads) for n in names}
    payloads = {f: zoo.load_payloads(args.zoo, f)[0] for f in {manifest["variants"][n]["family"] for n in names}}
    for m in models.values():  # first calls (graph / kernel / tensor allocation) outside the quota
        for b in _ints(args.batches, "batches"):
            m.warm_up(payloads[m.info["family"]], calls=3, batch=b)
    print("READY", flush=True)
    if sys.stdin.readline().strip() != "GO":
        return 1
    rows = []
    unthrottled = args.share >= threads
    for n, m in models.items():
        for b in _ints(args.batches, "batches"):
            for load in LOADS if not unthrottled else LOADS[:1]:
                iso = load == "isolated"
                r = measure(m, payloads[m.info["family"]], b, args.isolated_samples if iso else args.samples,
                            args.warmup, ISOLATED_GAP_MS if iso else 0.0, args.max_seconds)
                rows.append({"variant": n, "runtime": args.runtime, "cpu_cores": args.share, "threads": threads,
                             "cgroup": not args.no_cgroup, "load": load,
                             "role": "cpu_time" if unthrottled else "validation", **r})
    print("RESULT " + json.dumps(rows), flush=True)
    return 0


def run_child(zoo_dir: Path, variants: list[str], runtime: str, share: float, batches: list[int], samples: int,
              warmup: int, use_cgroup: bool, timeout_s: float = 3600.0,
              isolated_samples: int = DEFAULT_ISOLATED_SAMPLES,
              max_seconds: float = DEFAULT_MAX_SECONDS) -> list[dict[str, Any]]:
    """Measure ``variants`` with ``runtime`` at CPU ``share`` in a child process (see the module doc).

    Raises:
        ProfileError: the child failed or timed out (its output is in the message).
        testbed.core.cgroups.CgroupError: the quota cannot be applied.
    """
    cmd = [sys.executable, "-m", "testbed.serve.profiler", "--child", "--zoo", str(zoo_dir), "--variants",
           ",".join(variants), "--runtime", runtime, "--share", repr(share), "--batches", ",".join(map(str, batches)),
           "--samples", str(samples), "--warmup", str(warmup), "--isolated-samples", str(isolated_samples),
           "--max-seconds", repr(float(max_seconds))] + (["--no-cgroup"] if not use_cgroup else [])
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)
    dirs: list[Path] = []
    try:
        line = proc.stdout.readline()
        if line.strip() != "READY":
            proc.wait(timeout=30)
            raise ProfileError(f"profiler child ({runtime}, {share} cores) failed before measuring: "
                               f"{(line + proc.stderr.read())[-2000:]}")
        if use_cgroup:
            dirs = cgroups.create_limited_group(f"aset-profile-{os.getpid()}-{runtime}-{share:g}".replace(".", "p"),
                                                share, 4096)
            cgroups.add_process(dirs, proc.pid)
        proc.stdin.write("GO\n")
        proc.stdin.flush()
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise ProfileError(f"profiler child ({runtime}, {share} cores) took more than {timeout_s:g} s") from None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        cgroups.remove_groups(dirs)
    results = [ln[len("RESULT "):] for ln in out.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not results:
        raise ProfileError(f"profiler child ({runtime}, {share} cores) exited {proc.returncode}: {err[-2000:]}")
    return json.loads(results[-1])


def merge_profile(profiles_dir: Path, variant: str, family: str, rows: list[dict[str, Any]],
                  recipe_version: int, variant_info: dict[str, Any] | None = None) -> dict[str, Any]:
    """Merge measurement ``rows`` of ``variant`` into ``<profiles_dir>/<variant>.json``; return the profile.

    Rows replace earlier ones with the same (runtime, cpu_cores, batch, load; rows of schema 2 have
    no ``load``: back_to_back). The top-level reference figures are the 1-core, batch-1
    measurement of TensorFlow (else LiteRT, else the first one). The profile records the machine
    (CPU, cores, kernel, versions, load average when merged) and, per measurement, the load average.
    """
    variant_info = variant_info or {}
    path = profiles_dir / f"{variant}.json"
    old: list[dict[str, Any]] = []
    if path.is_file():
        try:
            old = json.loads(path.read_text()).get("measurements") or []
        except ValueError:
            old = []
    key = lambda r: (r["runtime"], float(r["cpu_cores"]), int(r["batch"]), r.get("load", "back_to_back"))  # noqa: E731
    new = {key(r): {k: v for k, v in r.items() if k != "variant"} for r in rows}
    merged = [r for r in old if key(r) not in new] + list(new.values())
    merged.sort(key=key)
    ref = next((r for rt in zoo.RUNTIMES for r in merged if key(r) == (rt, 1.0, 1, "back_to_back")), merged[0])
    prof = {"schema": SCHEMA, "variant": variant, "family": family, "recipe_version": recipe_version,
            "runtime": ref["runtime"], "cpu_cores": ref["cpu_cores"], "batch_size": ref["batch"],
            **{k: ref[k] for k in ("mean_ms", "p50_ms", "p95_ms", "p99_ms")},
            "method": "per-call wall time of predict() (TensorFlow SavedModel signature or LiteRT interpreter) in a "
                      "child process under a CFS quota of cpu_cores (cgroup, period 100 ms), threads = "
                      "ceil(cpu_cores), after warm-up; load back_to_back (calls one after the other) or isolated "
                      f"(each call {ISOLATED_GAP_MS:g} ms after the previous: quota refilled); role cpu_time = "
                      "unthrottled (share >= threads), validation = throttled share; see "
                      "testbed/serve/profiler.py",
            "weights": variant_info.get("weights", ""), "random_weights": bool(variant_info.get("random_weights")),
            "machine": {**machine_info(), "loadavg_at_merge": [round(v, 2) for v in os.getloadavg()]},
            "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "measurements": merged}
    profiles_dir.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(prof, indent=1) + "\n")
    os.replace(tmp, path)
    return prof


def plot(profiles_dir: Path, variants: list[str], out: Path | None = None) -> Path:
    """Plot p50 (line) and p95 (dashed) per-call time vs CPU share, per runtime and batch; one panel per variant."""
    import matplotlib  # heavy (~1 s): only when a plot is asked for
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt


    out = out or profiles_dir / PLOT
    cols = 3
    rows = max(1, math.ceil(len(variants) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False)
    for ax, v in zip(axes.flat, variants, strict=False):
        prof = zoo.load_profile(profiles_dir, v)
        ms = measurements(prof)
        series = sorted({(r.get("runtime", "tensorflow"), int(r["batch"]), r.get("load", "back_to_back")) for r in ms})
        for (rt, b, load) in series:
            pts = sorted((float(r["cpu_cores"]), r["p50_ms"], r["p95_ms"]) for r in ms
                         if (r.get("runtime", "tensorflow"), int(r["batch"]), r.get("load", "back_to_back"))
                         == (rt, b, load))
            xs = [p[0] for p in pts]
            line, = ax.plot(xs, [p[1] for p in pts], marker="o" if load == "back_to_back" else "x",
                            label=f"{rt} b={b} {load.replace('_', '-')}")
            ax.plot(xs, [p[2] for p in pts], ls="--", color=line.get_color())
        ax.set_xscale("log")
        ax.set_yscale("log")
        shares = sorted({float(r["cpu_cores"]) for r in ms})
        ax.set_xticks(shares, [f"{x:g}" for x in shares])
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_title(v + (" (random weights)" if prof.get("random_weights") else ""), fontsize=10)
        ax.set_xlabel("CPU share [cores]")
        ax.set_ylabel("per-call time [ms]")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6)
    for ax in list(axes.flat)[len(variants):]:
        ax.axis("off")
    fig.suptitle("Service time per call: p50 (solid), p95 (dashed)", fontsize=11)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out


def run(zoo_dir: Path, profiles_dir: Path, variants: list[str] | None = None, families: list[str] | None = None,
        runtimes: list[str] | None = None, shares: list[float] | None = None, batches: list[int] | None = None,
        samples: int = DEFAULT_SAMPLES, warmup: int = DEFAULT_WARMUP, use_cgroup: bool = True,
        make_plot: bool = True, log: Any = print, isolated_samples: int = DEFAULT_ISOLATED_SAMPLES,
        max_seconds: float = DEFAULT_MAX_SECONDS) -> dict[str, dict[str, Any]]:
    """Profile the selection (default: every variant, its runtimes, DEFAULT_SHARES x DEFAULT_BATCHES).

    Each variant is measured with the requested runtimes it has (``zoo.runtimes_of``). Returns
    variant -> merged profile. Raises ProfileError naming a bad option (unknown variant,
    family or runtime; samples < 20) before measuring anything.
    """
    manifest = zoo.load_manifest(zoo_dir)
    known = manifest["variants"]
    variants = list(variants or known)
    for v in variants:
        if v not in known:
            raise ProfileError(f"--variants: unknown variant {v!r} (known: {', '.join(known)})")
    if families:
        for f in families:
            zoo.family_info(manifest, f)
        variants = [v for v in variants if known[v]["family"] in families]
    runtimes = list(runtimes or zoo.RUNTIMES)
    for r in runtimes:
        if r not in zoo.RUNTIMES:
            raise ProfileError(f"--runtimes: unknown runtime {r!r} (known: {', '.join(zoo.RUNTIMES)})")
    if samples < 20:
        raise ProfileError(f"--samples: {samples} is too few for a p95 (>= 20; 200 recommended)")
    shares = list(shares or DEFAULT_SHARES) if use_cgroup else [1.0]
    batches = list(batches or DEFAULT_BATCHES)
    if not variants:
        raise ProfileError("nothing to profile: the selection is empty")
    rows: list[dict[str, Any]] = []
    for rt in runtimes:
        names = [v for v in variants if rt in zoo.runtimes_of(manifest, v)]
        for s in shares if names else []:
            t = time.perf_counter()
            got = run_child(zoo_dir, names, rt, s, batches, samples, warmup, use_cgroup,
                            isolated_samples=isolated_samples, max_seconds=max_seconds)
            rows += got
            log(f"[profile] {rt} at {s:g} cores (load average {os.getloadavg()[0]:.2f}): " + ", ".join(
                f"{r['variant']} b{r['batch']} {r['load']} p50 {r['p50_ms']:.3f} p95 {r['p95_ms']:.3f} ms"
                for r in got) + f" ({time.perf_counter() - t:.0f} s)")
            for v in names:  # merge after each child: a long run keeps what it measured
                mine = [r for r in got if r["variant"] == v]
                if mine:
                    merge_profile(profiles_dir, v, known[v]["family"], mine, manifest["recipe_version"], known[v])
    out = {v: zoo.load_profile(profiles_dir, v) for v in variants if (profiles_dir / f"{v}.json").is_file()}
    if make_plot:
        have = [v for v in known if (profiles_dir / f"{v}.json").is_file()]
        log(f"[profile] plot: {plot(profiles_dir, have)}")
    return out


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The profiler's options (shared by ``python -m testbed.serve.profiler`` and ``testbed profile``)."""
    repo = REPO_ROOT
    ap.add_argument("--zoo", default=str(repo / "models" / "zoo"), help="zoo directory (default: models/zoo)")
    ap.add_argument("--profiles", default=str(repo / "models" / "profiles"), help="profiles directory")
    ap.add_argument("--variants", default="all", help="comma-separated variants, or all (default)")
    ap.add_argument("--families", default="", help="only variants of these comma-separated families")
    ap.add_argument("--runtimes", default="tensorflow,litert", help="comma-separated: tensorflow, litert")
    ap.add_argument("--shares", default=",".join(f"{s:g}" for s in DEFAULT_SHARES),
                    help="CPU shares [cores] (CFS quota), comma-separated")
    ap.add_argument("--batches", default=",".join(map(str, DEFAULT_BATCHES)), help="batch sizes, comma-separated")
    ap.add_argument("--samples", type=int, default=DEFAULT_SAMPLES, help="timed calls per back-to-back measurement")
    ap.add_argument("--isolated-samples", type=int, default=DEFAULT_ISOLATED_SAMPLES,
                    help="timed calls per isolated measurement (fractional shares)")
    ap.add_argument("--max-seconds", type=float, default=DEFAULT_MAX_SECONDS,
                    help=f"stop a measurement after this long once it has {MIN_SAMPLES} samples")
    ap.add_argument("--warmup", type=int, default=DEFAULT_WARMUP, help="untimed calls before each measurement")
    ap.add_argument("--no-cgroup", action="store_true", help="no CPU quota: measure share 1 at full speed")
    ap.add_argument("--no-plot", action="store_true", help="do not write the PNG")


def main_args(args: argparse.Namespace, log: Any = print) -> int:
    """Run the profiler for parsed ``args``; returns the exit code (2 on a bad option)."""
    try:
        run(Path(args.zoo), Path(args.profiles),
            variants=None if args.variants == "all" else [v.strip() for v in args.variants.split(",") if v.strip()],
            families=[f.strip() for f in args.families.split(",") if f.strip()] or None,
            runtimes=[r.strip() for r in args.runtimes.split(",") if r.strip()],
            shares=_floats(args.shares, "shares"), batches=_ints(args.batches, "batches"),
            samples=args.samples, warmup=args.warmup, use_cgroup=not args.no_cgroup, make_plot=not args.no_plot,
            log=log, isolated_samples=args.isolated_samples, max_seconds=args.max_seconds)
    except (ProfileError, zoo.ZooError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    """Command line (see the module doc); ``--child`` is the internal measuring process."""
    ap = argparse.ArgumentParser(prog="python -m testbed.serve.profiler", description=__doc__.split("\n\n")[0])
    add_arguments(ap)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--runtime", default="tensorflow", help=argparse.SUPPRESS)
    ap.add_argument("--share", type=float, default=1.0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if args.child:
        return child_main(args)
    return main_args(args)


if __name__ == "__main__":
    sys.exit(main())
