"""docs/results.md is generated, never edited: it is exactly what benchmarks/results.py renders from
benchmarks/results/*.json, every section names a source file that exists, and the one writer of those
files (benchmarks/resultfile.py: write_result) refuses what would not render."""

import json
import re
from pathlib import Path

import pytest
from bench_modules import load_benchmark

REPO = Path(__file__).resolve().parent.parent



results = load_benchmark("results")
resultfile = load_benchmark("resultfile")

TABLE = {"caption": "per rate", "columns": ["rate q/s", "success"], "rows": [[100, 0.996], [300, 0.53]]}


def _sections(page: str) -> list[tuple[str, str | None]]:
    """(title, the source file the section names, or None) per '## ' section of the page."""
    out = []
    for block in re.split(r"^## ", page, flags=re.M)[1:]:
        m = re.search(r"Source: `([^`]+)`", block)
        out.append((block.splitlines()[0], m.group(1) if m else None))
    return out


def test_the_page_is_what_the_source_files_render():
    page = (REPO / "docs" / "results.md").read_text()
    assert page == results.render(), ("docs/results.md differs from benchmarks/results/*.json: a figure typed by "
                                      "hand, or a source file without its section; run "
                                      ".venv/bin/python benchmarks/results.py")
    assert results.main(["--check"]) == 0


def test_every_section_names_a_source_file_that_exists_and_every_file_has_its_section():
    page = (REPO / "docs" / "results.md").read_text()
    named = []
    for title, source in _sections(page):
        assert source, f"section {title!r} names no source file"
        assert (REPO / source).is_file(), f"section {title!r}: {source} does not exist"
        named.append(source)
    assert sorted(named) == sorted(str(p.relative_to(REPO)) for p in results.sources())


def test_the_check_fails_on_a_figure_typed_by_hand_and_on_a_file_without_its_section(tmp_path, monkeypatch, capsys):
    out = tmp_path / "results"
    resultfile.write_result("scale", "Load ceiling", "sudo .venv/bin/python benchmarks/scale_bench.py load",
                            [TABLE], summary="100-300 q/s.", out_dir=out)
    page = tmp_path / "results.md"
    monkeypatch.setattr(results, "RESULTS_DIR", out)
    monkeypatch.setattr(results, "PAGE", page)
    assert results.main([]) == 0
    text = page.read_text()
    assert "## Load ceiling" in text and "| 300 | 0.53 |" in text
    assert [s for _, s in _sections(text)] == [str(out / "scale.json")]
    assert results.main(["--check"]) == 0

    page.write_text(text.replace("| 300 | 0.53 |", "| 300 | 0.93 |"))            # a figure typed by hand
    assert results.main(["--check"]) == 1
    assert "is not what benchmarks/results/ gives" in capsys.readouterr().err

    page.write_text(text)
    resultfile.write_result("aaa", "Another", "cmd", [], out_dir=out)              # a source file without its section
    assert results.main(["--check"]) == 1
    results.main([])
    assert [t for t, _ in _sections(page.read_text())] == ["Load ceiling", "Another"]   # ORDER first, then by name


def test_a_file_that_is_not_a_result_is_named(tmp_path):
    (tmp_path / "broken.json").write_text(json.dumps({"title": "no command"}))
    with pytest.raises(ValueError, match="broken.json: not a result file"):
        results.render(tmp_path)


def test_a_written_result_carries_its_command_commit_date_and_machine(tmp_path):
    path = resultfile.write_result("x_1", "T", "cmd --flag", [TABLE], notes=["n"], out_dir=tmp_path)
    doc = json.loads(path.read_text())
    assert path == tmp_path / "x_1.json" and not list(tmp_path.glob("*.tmp"))
    assert doc["command"] == "cmd --flag" and doc["tables"] == [TABLE] and doc["notes"] == ["n"]
    assert re.fullmatch(r"[0-9a-f]{4,40}(-dirty)?|unknown", doc["commit"])
    assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00$", doc["measured_at"])
    assert "CPUs" in doc["machine"] and "load average" in doc["machine"]


@pytest.mark.parametrize("name", ["", "a b", "../x", "x/y", "x.json", "a;b"])
def test_write_result_refuses_a_bad_name_and_writes_nothing(tmp_path, name):
    with pytest.raises(ValueError, match="result name"):
        resultfile.write_result(name, "T", "cmd", [], out_dir=tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_write_result_refuses_a_row_of_another_length_naming_it(tmp_path):
    bad = {"caption": "per rate", "columns": ["a", "b"], "rows": [[1, 2], [3]]}
    with pytest.raises(ValueError, match=r"table 'per rate': row 1 has 1 values for 2 columns"):
        resultfile.write_result("ok", "T", "cmd", [TABLE, bad], out_dir=tmp_path / "out")
    assert not (tmp_path / "out").exists()
