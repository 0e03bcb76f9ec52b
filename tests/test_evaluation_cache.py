"""The evaluation's result cache: a file that cannot be read or is not JSON is a cache miss, said by a
warning, and its result is computed again.
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TRIANGLE = REPO / "experiments" / "triangle.yaml"


def _double(x: int) -> int:
    return 2 * x


def test_a_corrupt_evaluation_cache_file_is_a_miss_with_a_warning(tmp_path):
    from testbed.aset.jobs import run_jobs, task_key

    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / f"{task_key(_double, (2,))}.json").write_text('{"truncat')
    (cache / f"{task_key(_double, (3,))}.json").write_text("7")  # a good entry is still served
    warned: list[str] = []
    assert run_jobs(_double, [(2,), (3,)], cache=cache, workers=1, warn=warned.append) == [4, 7]
    assert len(warned) == 1 and f"evaluation cache file {cache / task_key(_double, (2,))}.json is unreadable " \
        f"(JSONDecodeError" in warned[0]
    assert (cache / f"{task_key(_double, (2,))}.json").read_text() == "4"  # recomputed and written again
