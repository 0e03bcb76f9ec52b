"""An integer too long to read (Python's limit on int digits) is an input error naming its file and
line, in an experiment, a YAML topology and an ASET config; an ASET config is read like an
experiment (a repeated key is refused).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from triangle_inputs import plan_cli, triangle

from testbed.cli.main import main

REPO = Path(__file__).resolve().parent.parent
TRIANGLE = REPO / "experiments" / "triangle.yaml"
_COMMANDS = {"run": ["run", "e.yaml"], "simulate": ["simulate", "e.yaml"],
             "sweep": ["sweep", "e.yaml", "--out", "o"], "evaluate": ["evaluate", "aset.yaml"]}


def test_an_integer_too_long_to_read_is_an_input_error_naming_its_line(tmp_path, capsys):
    """5001 digits: PyYAML's int() raised ValueError past Python's 4300-digit limit, a traceback
    and exit 1."""
    code, out = plan_cli(capsys, triangle(tmp_path, **{"rate_qps: 4": "rate_qps: 1" + "0" * 5000}))
    assert code == 2 and "Traceback" not in out
    assert ("e.yaml: line 24: an integer of 5001 digits, over the 4300 digits Python reads, and far over every bound "
            "of the testbed; write a smaller number") in out


def test_an_integer_too_long_in_a_yaml_topology_names_the_file_and_line(tmp_path):
    from testbed.spec.topology import TopologyError, load_yaml_topology

    f = tmp_path / "t.yaml"
    f.write_text("name: t\nnodes:\n  - {id: A, dpid: " + "9" * 4400 + "}\nlinks: []\n")
    with pytest.raises(TopologyError, match=r"t\.yaml: line 3: an integer of 4400 digits, over the 4300 digits"):
        load_yaml_topology(f)


@pytest.mark.parametrize("text, said", [("name: a\nname: b\n", "key 'name' appears twice"),
                                        ("name: a\nseed: 1" + "0" * 5000 + "\n", "digits")])
def test_an_aset_config_is_read_like_an_experiment(tmp_path, capsys, text, said):
    """ASET configs go through the experiments' YAML reader: a repeated key or an integer too long
    to read is exit 2 naming the line, not a silent overwrite or a traceback."""
    cfg = tmp_path / "aset.yaml"
    cfg.write_text(text)
    assert main(["train", str(cfg)]) == 2
    said_out = capsys.readouterr()
    assert said in said_out.out + said_out.err and "Traceback" not in said_out.out + said_out.err
