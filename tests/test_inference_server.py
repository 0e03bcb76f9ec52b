"""Inference server and model zoo, end to end: real TensorFlow, real server subprocesses on 127.0.0.1.

The zoo is the repository's ``models/zoo`` (built once by ``ensure_zoo`` if missing, ~1 min).
Three servers start in parallel (port 0: each picks a free port and reports it in its ready file):
``main`` (both variants), ``overload`` (digits_large, 1 worker, queue limit 2) and ``term``
(digits_small, stopped with SIGTERM by its test). Total ~20-30 s on 2 cores.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from testbed.inference import zoo

REPO = Path(__file__).resolve().parent.parent
ZOO = REPO / "models" / "zoo"
READY_TIMEOUT_S = 120.0


@dataclass
class Server:
    """A server subprocess and its files; ``url`` is http://127.0.0.1:PORT."""

    proc: subprocess.Popen
    url: str
    ready: dict[str, Any]
    stats_file: Path
    log: Path


def _launch(tmp: Path, name: str, *args: str) -> tuple[subprocess.Popen, Path, Path, Path]:
    ready, stats, log = tmp / f"{name}.ready.json", tmp / f"{name}.stats.json", tmp / f"{name}.log"
    cmd = [sys.executable, "-m", "testbed.inference.server", "--host", "127.0.0.1", "--port", "0",
           "--zoo", str(ZOO), "--threads", "1", "--stats-file", str(stats), "--ready-file", str(ready), *args]
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=REPO)
    return proc, ready, stats, log


def _wait_ready(proc: subprocess.Popen, ready: Path, stats: Path, log: Path) -> Server:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not ready.is_file():
        if proc.poll() is not None:
            pytest.fail(f"server exited with {proc.returncode} before ready:\n{log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"server not ready after {READY_TIMEOUT_S} s:\n{log.read_text()[-3000:]}")
        time.sleep(0.1)
    info = json.loads(ready.read_text())
    return Server(proc, f"http://127.0.0.1:{info['port']}", info, stats, log)


@pytest.fixture(scope="module")
def payloads() -> tuple[np.ndarray, np.ndarray]:
    """Held-out images float32 [N, 32, 32, 1] and labels [N] (the zoo is built first if missing)."""
    zoo.ensure_zoo(ZOO)
    return zoo.load_payloads(ZOO)


@pytest.fixture(scope="module")
def servers(payloads, tmp_path_factory) -> dict[str, Server]:
    """Start the three servers at once, wait until all are ready, stop the survivors at the end."""
    tmp = tmp_path_factory.mktemp("inference")
    specs = {
        "main": ("--models", "digits_small,digits_large", "--workers", "1", "--queue-limit", "64"),
        "overload": ("--models", "digits_large", "--workers", "1", "--queue-limit", "2"),
        "term": ("--models", "digits_small", "--workers", "1", "--queue-limit", "8"),
    }
    launched = {name: _launch(tmp, name, *args) for name, args in specs.items()}
    try:
        started = {name: _wait_ready(*parts) for name, parts in launched.items()}
        yield started
    finally:
        for proc, *_ in launched.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc, *_ in launched.values():
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()


def http(method: str, url: str, body: Any = None, raw: bytes | None = None) -> tuple[int, dict[str, str], Any]:
    """One request; returns (status, headers, decoded JSON body) for any status."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, dict(resp.headers), json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), json.loads(err.read())


def predict(server: Server, model: str, body: Any = None, raw: bytes | None = None):
    """POST /v1/models/{model}:predict."""
    return http("POST", f"{server.url}/v1/models/{model}:predict", body, raw)


def _check_probs(rows: list[list[float]], n: int) -> np.ndarray:
    p = np.asarray(rows, dtype=np.float64)
    assert p.shape == (n, 10)
    assert np.all(p >= 0)
    np.testing.assert_allclose(p.sum(axis=1), 1.0, atol=1e-4)
    return p


# --- zoo ----------------------------------------------------------------------------------


def test_zoo_manifest_payloads_profiles(payloads):
    manifest = zoo.load_manifest(ZOO)
    assert manifest["family"] == "digits" and manifest["input_shape"] == [32, 32, 1] and manifest["classes"] == 10
    x, y = payloads
    assert x.dtype == np.float32 and x.shape[1:] == (32, 32, 1) and 0.0 <= x.min() and x.max() <= 1.0
    assert y.shape == (len(x),) and set(np.unique(y)) == set(range(10))
    small, large = manifest["variants"]["digits_small"], manifest["variants"]["digits_large"]
    assert f"(n={len(y)})" in large["accuracy_source"]
    assert large["accuracy"] > small["accuracy"]
    for name in ("digits_small", "digits_large"):
        prof = zoo.load_profile(REPO / "models" / "profiles", name)
        assert prof["variant"] == name and prof["samples"] >= 200 and prof["batch_size"] == 1
        assert 0 < prof["p50_ms"] <= prof["p95_ms"] <= prof["p99_ms"]
    assert (zoo.load_profile(REPO / "models" / "profiles", "digits_large")["p50_ms"]
            > 2 * zoo.load_profile(REPO / "models" / "profiles", "digits_small")["p50_ms"])


def test_zoo_errors_name_what_is_missing(tmp_path):
    with pytest.raises(zoo.ZooFileMissing, match="manifest.json"):
        zoo.load_manifest(tmp_path)
    with pytest.raises(zoo.ZooFileMissing, match="payloads.npz"):
        zoo.load_payloads(tmp_path)
    with pytest.raises(zoo.ZooFileMissing, match="digits_huge"):
        zoo.load_profile(tmp_path, "digits_huge")
    with pytest.raises(zoo.ZooError, match="digits_huge"):
        zoo.variant_dir(ZOO, "digits_huge")


def test_server_refuses_unknown_variant_at_start(payloads, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "testbed.inference.server", "--zoo", str(ZOO), "--port", "0",
                           "--models", "digits_small,nope"], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 2
    assert "'nope'" in proc.stderr


# --- predict ------------------------------------------------------------------------------


def test_predict_row_and_columnar_forms(servers, payloads):
    x, y = payloads
    s = servers["main"]
    status, _, body = predict(s, "digits_small", {"instances": x[:3].tolist()})
    assert status == 200 and set(body) == {"predictions"}
    _check_probs(body["predictions"], 3)
    status, _, body = predict(s, "digits_large", {"inputs": x[:4].tolist()})
    assert status == 200 and set(body) == {"outputs"}
    _check_probs(body["outputs"], 4)
    status, _, body = predict(s, "digits_large", {"inputs": {"x": x[:2].tolist()}})
    assert status == 200
    _check_probs(body["outputs"], 2)


def test_large_model_is_accurate_on_held_out_samples(servers, payloads):
    x, y = payloads
    n = 50
    correct = 0
    for i in range(n):
        status, _, body = predict(servers["main"], "digits_large", {"instances": [np.round(x[i], 4).tolist()]})
        assert status == 200
        correct += int(np.argmax(_check_probs(body["predictions"], 1)[0]) == y[i])
    assert correct >= 0.9 * n, f"digits_large: {correct}/{n} correct"


def test_timestamps_on_the_shared_clock(servers, payloads):
    x, _ = payloads
    before = time.time_ns()
    status, headers, _ = predict(servers["main"], "digits_large", {"instances": [x[0].tolist()]})
    after = time.time_ns()
    assert status == 200
    t1, t2, t3 = (int(headers[f"X-Testbed-T{i}"]) for i in (1, 2, 3))
    assert before <= t1 <= t2 <= t3 <= after
    assert int(headers["X-Testbed-Queue-Len"]) >= 0


def test_unknown_model_is_404(servers, payloads):
    x, _ = payloads
    status, _, body = predict(servers["main"], "resnet9000", {"instances": [x[0].tolist()]})
    assert status == 404 and "resnet9000" in body["error"]
    status, _, body = http("GET", f"{servers['main'].url}/v1/models/resnet9000")
    assert status == 404 and "resnet9000" in body["error"]


def test_model_status(servers):
    status, _, body = http("GET", f"{servers['main'].url}/v1/models/digits_small")
    assert status == 200
    assert body == {"model_version_status": [
        {"version": "1", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}]}


@pytest.mark.parametrize("raw,needle", [
    (b"{not json", "malformed JSON"),
    (b"\xff\xfe\x00", "malformed JSON"),
    (b"[1, 2]", "JSON object"),
    (b"{}", "exactly one of"),
    (b'{"instances": [], "inputs": []}', "exactly one of"),
    (b'{"instances": []}', "non-empty"),
    (b'{"instances": [["a", "b"]]}', "numbers"),
    (b'{"inputs": {"y": [1]}}', "'x'"),
])
def test_malformed_body_is_400(servers, raw, needle):
    status, _, body = predict(servers["main"], "digits_small", raw=raw)
    assert status == 400
    assert needle in body["error"]


def test_wrong_shape_is_400(servers, payloads):
    x, _ = payloads
    for bad in ([[0.0] * 8] * 8, x[0][:16].tolist(), [[[0.0, 0.0]] * 32] * 32):
        status, _, body = predict(servers["main"], "digits_small", {"instances": [bad]})
        assert status == 400 and "wrong shape" in body["error"] and "[1, 32, 32, 1]" in body["error"]
    status, _, body = predict(servers["main"], "digits_small", {"instances": [x[0].tolist(), [[1.0]]]})
    assert status == 400 and "rectangular" in body["error"]
    # the server is still fine afterwards
    status, _, _ = predict(servers["main"], "digits_small", {"instances": [x[0].tolist()]})
    assert status == 200


# --- overload, stats, shutdown --------------------------------------------------------------


async def _burst(url: str, bodies: list[bytes]) -> list[tuple[int, dict]]:
    import aiohttp

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        async def one(body: bytes) -> tuple[int, dict]:
            async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as resp:
                return resp.status, await resp.json()

        return await asyncio.gather(*(one(b) for b in bodies))


def test_queue_overload_drops_with_503(servers, payloads):
    x, _ = payloads
    s = servers["overload"]
    # 16 images per query: each takes tens of ms on digits_large, so 30 at once overflow a queue of 2.
    bodies = [json.dumps({"instances": x[i:i + 16].tolist()}).encode() for i in range(30)]
    results = asyncio.run(_burst(f"{s.url}/v1/models/digits_large:predict", bodies))
    codes = [c for c, _ in results]
    assert set(codes) <= {200, 503}, codes
    assert codes.count(503) >= 1 and codes.count(200) >= 3, codes
    for code, body in results:
        if code == 503:
            assert body == {"error": "queue full (limit 2)"}
        else:
            _check_probs(body["predictions"], 16)
    status, _, stats = http("GET", f"{s.url}/v1/stats")
    assert status == 200
    assert stats["served"] == codes.count(200) and stats["dropped"] == codes.count(503)
    assert stats["served"] + stats["dropped"] == 30
    assert stats["workers"] == 1 and stats["queue_len"] == 0 and stats["busy_workers"] == 0
    assert stats["busy_s"] > 0 and 0 < stats["utilization"] <= 1


def test_stats_endpoint_and_file(servers):
    s = servers["main"]
    status, _, stats = http("GET", f"{s.url}/v1/stats")
    assert status == 200
    for key in ("queue_len", "busy_workers", "workers", "served", "dropped", "errors", "busy_s", "uptime_s",
                "utilization"):
        assert key in stats
    deadline = time.monotonic() + 5
    while not s.stats_file.is_file() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert set(stats) <= set(json.loads(s.stats_file.read_text()))


def test_sigterm_exits_0_with_final_stats(servers, payloads):
    x, _ = payloads
    s = servers["term"]
    for i in range(5):
        assert predict(s, "digits_small", {"instances": [x[i].tolist()]})[0] == 200
    s.proc.send_signal(signal.SIGTERM)
    assert s.proc.wait(timeout=20) == 0, s.log.read_text()[-2000:]
    final = json.loads(s.stats_file.read_text())
    assert final["served"] == 5 and final["pid"] == s.ready["pid"]
    assert not any(p.name.startswith(".") for p in s.stats_file.parent.iterdir() if "stats" in p.name)
    assert os.path.getsize(s.stats_file) > 0
