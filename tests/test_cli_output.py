"""What the command line prints: every subcommand's help has a description, the text plan lists
the events, and a reader that goes away early (``testbed ... | head``) changes nothing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TESTBED = [sys.executable, "-m", "testbed.cli.main"]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*TESTBED, *args], cwd=REPO, capture_output=True, text=True, timeout=300, check=False)


@pytest.mark.parametrize("cmd", ["plan", "run"])
def test_plan_and_run_help_describe_the_command(cmd):
    out = _run(cmd, "--help")
    assert out.returncode == 0
    usage, _, rest = out.stdout.partition("\n\n")
    assert usage.startswith(f"usage: testbed {cmd}")
    assert not rest.lstrip().startswith(("positional", "options")), "no description before the arguments"


def test_the_text_plan_lists_the_events():
    out = _run("plan", "experiments/scenario-failure.yaml")
    assert out.returncode == 0, out.stderr
    events = out.stdout[out.stdout.index("Events"):]
    assert "cluster_down" in events and "cluster_up" in events and "fedc" in events


@pytest.mark.parametrize("args", [("plan", "experiments/default.yaml"), ("plan", "experiments/default.yaml", "--json")])
def test_a_reader_that_stops_early_leaves_the_exit_code_and_no_traceback(args):
    """`testbed plan ... | head -1`: the pipe closes after the first line; the command still exits 0
    and prints no traceback."""
    proc = subprocess.Popen([*TESTBED, *args], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline()
    proc.stdout.close()  # the reader goes away, as head does
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "BrokenPipe" not in err
