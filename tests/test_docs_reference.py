"""README and docs/ stay a reference a newcomer can read: README at most 150 lines with its two commands
as given, each docs page at most 600 lines and docs/ at most 4,000 in all (docs/history.md aside), and
every link between them, and every "page, section" reference, resolving inside the repository."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
COMMANDS = ("sudo ./install.sh && sudo .venv/bin/testbed run experiments/default.yaml",
            "sudo ./install.sh --with-tests && sudo tests/run")


def _pages() -> list[Path]:
    return [REPO / "README.md", *sorted(DOCS.glob("*.md"))]


def _lines(p: Path) -> int:
    return len(p.read_text().splitlines())


def test_readme_is_short_and_gives_the_two_commands_as_they_are():
    text = (REPO / "README.md").read_text()
    assert _lines(REPO / "README.md") <= 150
    for cmd in COMMANDS:
        assert f"\n{cmd}\n" in text, cmd


def test_each_page_and_docs_in_all_stay_within_their_limits():
    counts = {p.name: _lines(p) for p in DOCS.glob("*.md") if p.name != "history.md"}
    assert {n: c for n, c in counts.items() if c > 600} == {}
    assert sum(counts.values()) <= 4000, counts


def test_every_link_resolves_inside_the_repository():
    bad = []
    for page in _pages():
        text = page.read_text()
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if re.match(r"[a-z]+://", target):
                continue
            path = (page.parent / target).resolve()
            if not path.is_relative_to(REPO) or not path.exists():
                bad.append(f"{page.name}: ({target})")
        bad += [f"{page.name}: {m}" for m in re.findall(r"docs/[\w-]+\.md", text)
                if not (REPO / m).is_file()]
        bad += [f"{page.name}: {m}" for m in re.findall(r"\.\./shared\S*|(?<![\w.-])/work/\S+", text)]
    assert bad == []


def test_every_page_section_reference_names_a_heading_of_that_page():
    headings = {p.name: [h.lower() for h in re.findall(r"^#+ (.+)$", p.read_text(), re.M)]
                for p in DOCS.glob("*.md")}
    bad = []
    for page in _pages():
        if page.name == "history.md":  # history quotes the sections pages had then
            continue
        text = re.sub(r"\s*\n\s*", " ", page.read_text())
        for name, section in re.findall(r"docs/([\w-]+\.md)`?\)?, \"([^\"]+)\"", text):
            if name in headings and not any(section.lower() in h for h in headings[name]):
                bad.append(f"{page.name}: {name}, \"{section}\"")
    assert bad == []
