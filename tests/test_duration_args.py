"""Durations take the same forms in every command (seconds, or with a unit) and a bad one is refused
alike everywhere.
"""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TRIANGLE = REPO / "experiments" / "triangle.yaml"
_COMMANDS = {"run": ["run", "e.yaml"], "simulate": ["simulate", "e.yaml"],
             "sweep": ["sweep", "e.yaml", "--out", "o"], "evaluate": ["evaluate", "aset.yaml"]}


@pytest.mark.parametrize("command", sorted(_COMMANDS))
@pytest.mark.parametrize(("given", "seconds"), [("10", 10.0), ("10s", 10.0), ("0.5", 0.5), ("500ms", 0.5),
                                                ("1e2", 100.0), ("2500us", 0.0025)])
def test_duration_takes_the_same_forms_in_every_command(command, given, seconds):
    """One parser (testbed.cli.common.duration_arg): ``run`` took only bare seconds ('10s' was
    refused), simulate, sweep and evaluate only a unit ('10' was refused)."""
    from testbed.cli.main import _parser

    args = _parser().parse_args([*_COMMANDS[command], "--duration", given])
    assert args.duration == pytest.approx(seconds)


@pytest.mark.parametrize("command", sorted(_COMMANDS))
@pytest.mark.parametrize(("given", "said"), [
    ("10min", "duration for --duration: unknown unit 'min' in '10min'"),
    ("0", "'0': the duration must be in (0, 1e+06] s"),
    ("2e6s", "'2e6s': the duration must be in (0, 1e+06] s"),
    ("-1s", "duration for --duration: '-1s' is negative; a duration must be positive"),
    ("-3", "duration for --duration: '-3' is negative; a duration must be positive"),
    ("1e999", "duration for --duration: '1e999' is not finite"),
    ("ten", "duration for --duration: cannot parse 'ten'"),
])
def test_a_bad_duration_is_refused_alike_in_every_command(command, given, said, capsys):
    from testbed.cli.main import _attach_negative_values, _parser, _value_options

    ap = _parser()
    with pytest.raises(SystemExit) as exc:
        ap.parse_args(_attach_negative_values([*_COMMANDS[command], "--duration", given], _value_options(ap)))
    err = " ".join(capsys.readouterr().err.split())
    if command == "evaluate":  # one simulated episode per figure: at most 1 h (MAX_EPISODE_S)
        said = said.replace("(0, 1e+06] s", "(0, 3600] s")
    assert exc.value.code == 2 and f"argument --duration: {said}" in err
