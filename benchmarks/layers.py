"""The package's structure in figures: imports that run against the layers, import cycles, imports
inside functions, loose top-level modules and long modules, for this tree or any git revision.

Run: ``.venv/bin/python benchmarks/layers.py [--rev REV] [--json]``.

The layers are the ones of the import-linter contract in ``.importlinter`` (``lint-imports`` holds
CI to them; this script only counts). A module of an older revision is placed in the layer of the
file it became, by git's rename detection followed commit by commit from that revision to the work
tree (``git diff -M --name-status``); a module that never moved into a layer is left unplaced.

Counted, for the modules of ``testbed/``:

- ``against the layers``: imports from a module to one of a higher layer, or to a sibling of the
  same layer (``aset | results``), which the contract forbids; direct imports, module level or not;
- ``cycles``: strongly connected groups of two or more modules in the graph of every ``testbed``
  import (module level and inside functions: an import moved into a function still ties the two);
- ``in functions``: ``import testbed...`` / ``from testbed... import`` statements inside a function;
- ``top-level modules``: modules directly under ``testbed/`` besides ``__init__``;
- ``over 600 lines``: modules longer than 600 lines.
"""

from __future__ import annotations

import argparse
import ast
import configparser
import json
import subprocess
import sys
from pathlib import Path

import networkx as nx

REPO = Path(__file__).resolve().parent.parent
PACKAGE = "testbed"
LONG_LINES = 600


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout


def layers_of_contract(path: Path = REPO / ".importlinter") -> list[list[str]]:
    """The contract's layers, lowest first, each a list of sibling packages (``testbed.x``)."""
    cp = configparser.ConfigParser()
    cp.read(path)
    for section in cp.sections():
        if cp[section].get("type", "").strip() == "layers":
            lines = [ln.strip() for ln in cp[section]["layers"].splitlines() if ln.strip()]
            return [[f"{PACKAGE}.{p.strip()}" for p in ln.split("|")] for ln in reversed(lines)]
    raise SystemExit(f"{path}: no layers contract")


def sources(rev: str | None) -> dict[str, str]:
    """{path: text} of the package's Python files, at ``rev`` or in the work tree."""
    if rev is None:
        return {str(p.relative_to(REPO)): p.read_text() for p in sorted((REPO / PACKAGE).rglob("*.py"))}
    names = _git("ls-tree", "-r", "--name-only", rev, "--", PACKAGE).split()
    return {n: _git("show", f"{rev}:{n}") for n in names if n.endswith(".py")}


def renamed_to(rev: str | None) -> dict[str, str]:
    """{path at rev: its latest name} for files git sees renamed on the way from ``rev`` to the work
    tree, followed commit by commit (first parents), so that a file moved and later split or
    renamed again keeps the folder it moved to (its layer)."""
    if rev is None:
        return {}
    commits = _git("rev-list", "--reverse", "--first-parent", f"{rev}..HEAD").split()
    latest: dict[str, str] = {}
    for older, newer in zip([rev, *commits], [*commits, None], strict=True):
        args = ["diff", "-M", "--name-status", older] + ([newer] if newer else []) + ["--", PACKAGE]
        step = {}
        for line in _git(*args).splitlines():
            parts = line.split("\t")
            if parts[0].startswith("R") and len(parts) == 3:
                step[parts[1]] = parts[2]
        latest = {k: step.get(v, v) for k, v in latest.items()}
        latest.update({k: v for k, v in step.items() if k not in latest.values() and k not in latest})
    return latest


def module_name(path: str) -> str:
    name = path[:-3].replace("/", ".")
    return name[: -len(".__init__")] if name.endswith(".__init__") else name


def _imports(tree: ast.AST, module: str, is_pkg: bool, known: set[str]) -> list[tuple[str, bool]]:
    """(imported testbed module, inside a function?) for each import statement's targets."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            inside.update(id(c) for c in ast.walk(node) if isinstance(c, (ast.Import, ast.ImportFrom)))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = module.split(".") if is_pkg else module.split(".")[:-1]
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join(parts + ([node.module] if node.module else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for t in targets:
            while t not in known and "." in t:
                t = t.rsplit(".", 1)[0]
            if t in known and t != module:
                found.append((t, id(node) in inside))
    return found


def layer_index(module: str, layers: list[list[str]]) -> tuple[int, str] | None:
    for i, siblings in enumerate(layers):
        for pkg in siblings:
            if module == pkg or module.startswith(pkg + "."):
                return i, pkg
    return None


def measure(rev: str | None) -> dict:
    """The figures of one tree (see the module docstring)."""
    files = sources(rev)
    moved = renamed_to(rev)
    layers = layers_of_contract()
    known = {module_name(p) for p in files}
    graph = nx.DiGraph()
    graph.add_nodes_from(known)
    against, local, long_modules = [], [], []
    reverse = {module_name(k): module_name(v) for k, v in moved.items()}
    for path, text in files.items():
        mod = module_name(path)
        if len(text.splitlines()) > LONG_LINES:
            long_modules.append(path)
        now = layer_index(module_name(moved.get(path, path)), layers)
        for target, in_function in _imports(ast.parse(text), mod, path.endswith("__init__.py"), known):
            graph.add_edge(mod, target)
            if in_function:
                local.append(f"{mod} -> {target}")
            there = layer_index(reverse.get(target, target), layers)
            if now and there and (there[0] > now[0] or (there[0] == now[0] and there[1] != now[1])):
                against.append(f"{mod} -> {target}")
    cycles = [sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1]
    top = [p for p in files if p.count("/") == 1 and not p.endswith("__init__.py")]
    return {"revision": rev or "work tree", "modules": len(files), "top-level modules": len(top),
            "against the layers": sorted(set(against)), "cycles": cycles, "in functions": sorted(local),
            f"over {LONG_LINES} lines": sorted(long_modules)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rev", help="a git revision to measure instead of the work tree")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    m = measure(args.rev)
    if args.json:
        print(json.dumps(m, indent=1))
        return 0
    print(f"{m['revision']}: {m['modules']} modules, {m['top-level modules']} at the top of {PACKAGE}/")
    print(f"  imports against the layers: {len(m['against the layers'])}")
    for a in m["against the layers"]:
        print(f"    {a}")
    print(f"  cycles: {len(m['cycles'])}")
    for c in m["cycles"]:
        print(f"    {' <-> '.join(c)}")
    print(f"  imports of {PACKAGE} inside functions: {len(m['in functions'])}")
    if len(m["in functions"]) <= 20:
        for a in m["in functions"]:
            print(f"    {a}")
    print(f"  modules over {LONG_LINES} lines: {len(m[f'over {LONG_LINES} lines'])}: "
          f"{', '.join(m[f'over {LONG_LINES} lines'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
