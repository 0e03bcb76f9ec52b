"""Inputs made from ``experiments/triangle.yaml`` for the tests of what the commands refuse: copies
of the experiment (its topology by absolute path) with texts replaced, and a command run in-process
with its output on one line (the console may wrap a message)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from testbed.cli.main import main

REPO = Path(__file__).resolve().parent.parent
TRIANGLE = REPO / "experiments" / "triangle.yaml"
TRIANGLE_TOPO = REPO / "topologies" / "triangle.yaml"


def write(tmp_path: Path, name: str, text: str, **replace: str) -> Path:
    """``text`` with each ``old=new`` replaced (each must be there), written to ``tmp_path/name``."""
    for old, new in replace.items():
        assert old in text, old
        text = text.replace(old, new)
    path = tmp_path / name
    path.write_text(text)
    return path


def triangle(tmp_path: Path, name: str = "e.yaml", topology: Path = TRIANGLE_TOPO, **replace: str) -> Path:
    """experiments/triangle.yaml in ``tmp_path`` with ``topology`` (absolute path), ``old=new`` replaced."""
    text = TRIANGLE.read_text().replace("../topologies/triangle.yaml", str(topology))
    return write(tmp_path, name, text, **replace)


def triangle_data(**top: Any) -> dict[str, Any]:
    """experiments/triangle.yaml as data, its topology by absolute path, with the top-level keys of ``top``."""
    data = yaml.safe_load(TRIANGLE.read_text())
    data["topology"]["source"] = str(TRIANGLE_TOPO)
    data.update(top)
    return data


def write_data(tmp_path: Path, name: str, data: dict[str, Any]) -> Path:
    """``data`` as YAML in ``tmp_path/name``."""
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def topology(tmp_path: Path, **replace: str) -> Path:
    """topologies/triangle.yaml in ``tmp_path/t.yaml``, ``old=new`` replaced."""
    return write(tmp_path, "t.yaml", TRIANGLE_TOPO.read_text(), **replace)


def scenario(folder: Path, stem: str, name: str = "triangle", extra_source: bool = False, **replace: str) -> Path:
    """A copy of the triangle experiment at ``folder/stem.yaml`` (topology by absolute path), renamed,
    with a third source if asked and any text replaced (where it is there)."""
    text = TRIANGLE.read_text().replace("../topologies/triangle.yaml", str(TRIANGLE_TOPO))
    text = text.replace("name: triangle", f"name: {name}", 1)
    if extra_source:
        text = text.replace("  - {name: srcc, site: C}\n", "  - {name: srcc, site: C}\n  - {name: srcb, site: B}\n")
    for old, new in replace.items():
        text = text.replace(old, new)
    path = folder / f"{stem}.yaml"
    folder.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def run_cli(capsys, *argv: str) -> tuple[int, str]:
    """``testbed ARGV`` in-process: exit code and output (stdout and stderr on one line)."""
    code = main(list(argv))
    out = capsys.readouterr()
    return code, " ".join((out.out + out.err).split())


def plan_cli(capsys, path: Path) -> tuple[int, str]:
    """``testbed plan PATH``: exit code and output on one line."""
    return run_cli(capsys, "plan", str(path))
