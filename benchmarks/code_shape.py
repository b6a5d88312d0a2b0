"""The code's shape, counted from the source: longest functions, largest modules, import cycles.

    .venv/bin/python benchmarks/code_shape.py [--src src/headway] [--top 10] [--graph] [--json]

Functions are counted by lines from `def` to their last line (nested functions count inside their
parent and again on their own). The import graph has an edge a -> b when module a imports b at module
level or inside a function (TYPE_CHECKING imports are left out: they never run); a cycle is a set of
modules that import each other round.
"""

from __future__ import annotations

import argparse
import ast
import json
from pathlib import Path
from typing import Any


def _module(path: Path, src: Path) -> str:
    parts = list(path.relative_to(src.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.Module, mod: str, pkg: str) -> set[str]:
    out: set[str] = set()
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _type_checking(node):
            skip.update(id(n) for n in ast.walk(node))
    base = mod.split(".")
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith(pkg))
        elif isinstance(node, ast.ImportFrom):
            name = node.module or ""
            if node.level:
                name = ".".join(base[: len(base) - node.level] + ([name] if name else []))
            if name.startswith(pkg):
                out.add(name)
                out.update(f"{name}.{a.name}" for a in node.names)
    return out


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def shape(src: Path) -> dict[str, Any]:
    funcs: list[tuple[int, str]] = []
    modules: list[tuple[int, str]] = []
    graph: dict[str, set[str]] = {}
    files = sorted(src.rglob("*.py"))
    names = {_module(p, src) for p in files}
    for path in files:
        mod = _module(path, src)
        text = path.read_text()
        tree = ast.parse(text)
        modules.append((len(text.splitlines()), str(path.relative_to(src.parent))))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                funcs.append((n, f"{path.relative_to(src.parent)}:{node.lineno} {node.name}"))
        graph[mod] = {m for m in _imports(tree, mod, src.name) if m in names and m != mod}
    funcs.sort(reverse=True)
    modules.sort(reverse=True)
    return {"functions": funcs, "modules": modules, "graph": {k: sorted(v) for k, v in graph.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", type=Path, default=Path(__file__).resolve().parents[1] / "src" / "headway")
    ap.add_argument("--top", type=int, default=10)
    ap.add_argument(
        "--graph", action="store_true", help="print the import graph of sim/, policy/, local/, slurm/"
    )
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    s = shape(a.src)
    cycles = _cycles({k: set(v) for k, v in s["graph"].items()})
    core = ("sim", "policy")
    over = [(n, f) for n, f in s["functions"] if n > 100 and f.split("/")[1] in core]
    if a.json:
        print(json.dumps({"top_functions": s["functions"][: a.top], "top_modules": s["modules"][: a.top],
                          "cycles": cycles, "core_functions_over_100": over}))  # fmt: skip
        return
    print(f"longest functions (of {len(s['functions'])}):")
    for n, f in s["functions"][: a.top]:
        print(f"  {n:5d}  {f}")
    print(f"largest modules (of {len(s['modules'])}):")
    for n, f in s["modules"][: a.top]:
        print(f"  {n:5d}  {f}")
    print(f"functions over 100 lines in sim/ and policy/: {len(over)}")
    for n, f in over:
        print(f"  {n:5d}  {f}")
    print(f"import cycles: {len(cycles)}")
    for c in cycles:
        print("  " + " <-> ".join(c))
    if a.graph:
        for k, v in s["graph"].items():
            if any(f".{p}" in k for p in ("sim", "policy", "local", "slurm")):
                print(f"  {k} -> {', '.join(x.removeprefix('headway.') for x in v)}")


if __name__ == "__main__":
    main()
