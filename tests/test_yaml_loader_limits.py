"""YAML the loader cannot read safely, refused by ``testbed plan`` and every command that reads the same
files, with exit code 2 and a message naming the item and its bound: an anchor loop, an alias bomb,
a file past the stated size, a YAML 1.1 boolean where an id belongs. Fast: no emulation.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from triangle_inputs import run_cli, topology, triangle

from testbed.spec.schema import MAX_YAML_BYTES, MAX_YAML_NODES, YamlLimitError, YamlValueError, load_yaml

REPO = Path(__file__).resolve().parent.parent
TRIANGLE = REPO / "experiments" / "triangle.yaml"
TRIANGLE_TOPO = REPO / "topologies" / "triangle.yaml"


@pytest.mark.parametrize("command", [["plan", "--json"], ["simulate"], ["run"]])
def test_an_anchor_loop_is_a_clear_error_in_every_command(tmp_path, capsys, command):
    """An alias inside its own anchor was a Python traceback (RecursionError) in plan --json,
    simulate and run."""
    path = triangle(tmp_path, **{"name: triangle": "name: triangle\nloop: &x [*x]"})
    args = [command[0], str(path), *command[1:]]
    if command[0] != "plan":
        args += ["--runs-dir", str(tmp_path / "runs")]
    code, out = run_cli(capsys, *args)
    assert code == 2, out
    assert "the anchor &x contains an alias to itself (*x), a loop" in out and str(path) in out
    assert "Traceback" not in out and not (tmp_path / "runs").exists()


def test_an_alias_bomb_is_refused_before_it_is_expanded(tmp_path, capsys):
    """Ten levels of ten aliases each: 10^10 nodes once expanded, from 600 bytes of text."""
    lines = ["a0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 10)]
    path = triangle(tmp_path, **{"name: triangle": "name: triangle\n" + "\n".join(lines)})
    code, out = run_cli(capsys, "plan", str(path))
    assert code == 2 and f"more than {MAX_YAML_NODES} nodes once its aliases are expanded" in out


@pytest.mark.parametrize("what", ["experiment", "topology"])
def test_a_file_past_the_stated_size_is_refused_before_it_is_parsed(tmp_path, capsys, what):
    """A 50 MB experiment took 111 s to plan; a 38 MB topology was still being read at 3.4 GB."""
    pad = "# " + "x" * 1000 + "\n"
    filler = pad * (MAX_YAML_BYTES // len(pad) + 1)
    if what == "experiment":
        path = triangle(tmp_path, **{"name: triangle": filler + "name: triangle"})
    else:
        topo = topology(tmp_path, **{"name: triangle": filler + "name: triangle"})
        path = triangle(tmp_path, topology=topo)
    code, out = run_cli(capsys, "plan", str(path))
    assert code == 2 and f"more than the {MAX_YAML_BYTES} read" in out and what in out


def test_a_yaml11_boolean_where_an_id_belongs_is_an_error_naming_it(tmp_path, capsys):
    """A node written NO became the boolean false, then node 0, and the error said "unknown node 'NO'"."""
    topo = topology(tmp_path, **{"{id: C,": "{id: NO,", "{a: B, b: C,": "{a: B, b: NO,",
                                  "{a: A, b: C,": "{a: A, b: NO,"})
    path = triangle(tmp_path, topology=topo, **{"site: C, tier": "site: 'NO', tier", "{name: srcc, site: C}":
                                                 "{name: srcc, site: 'NO'}"})
    code, out = run_cli(capsys, "plan", str(path))
    assert code == 2
    assert "'NO' is a boolean in YAML 1.1 and a string in YAML 1.2" in out and 'quote it ("NO")' in out
    assert "line 6" in out and str(topo) in out
    # quoted, it is the node's name
    topo.write_text(topo.read_text().replace("id: NO", "id: 'NO'").replace("b: NO", "b: 'NO'"))
    assert run_cli(capsys, "plan", str(path))[0] == 0


@pytest.mark.parametrize("word", ["yes", "on", "Off"])
def test_every_yaml11_boolean_word_is_named(word):
    with pytest.raises(YamlValueError, match=f"'{word}' is a boolean in YAML 1.1"):
        load_yaml(f"nodes:\n  - {{id: {word}}}\n")
    assert load_yaml(f"id: '{word}'\nflag: true") == {"id": word, "flag": True}


def test_the_loader_limits_hold_for_an_aset_config(tmp_path, capsys):
    """One loader for every YAML input: an ASET config with a loop is refused the same way."""
    path = tmp_path / "aset.yaml"
    path.write_text((REPO / "experiments" / "aset-tiny.yaml").read_text() + "\nloop: &y {a: [*y]}\n")
    code, out = run_cli(capsys, "plan", str(path))
    assert code == 2 and "the anchor &y contains an alias to itself" in out
    with pytest.raises(YamlLimitError):
        load_yaml("[" * 200 + "]" * 200)
