"""Architecture rules that a change can break without any other test noticing: no module of npukit imports one that
imports it back (counting imports inside functions too), every CLI verb goes through the verb table, and no function
of npukit is over the line limit."""

from __future__ import annotations

import ast
from pathlib import Path

import npukit
from npukit import cli

SRC = Path(npukit.__file__).parent


def _modules() -> dict[str, Path]:
    out = {}
    for path in SRC.rglob("*.py"):
        parts = ("npukit", *path.relative_to(SRC).with_suffix("").parts)
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("npukit"):
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in modules}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("npukit")}
    return {m for m in found if m in modules and m != "npukit"}  # the package itself: every module's parent


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_module_imports_one_that_imports_it_back() -> None:
    modules = _modules()
    graph = {m: _imports(p, modules) for m, p in modules.items()}
    assert len(graph) > 50 and graph["npukit.quant.qdq"]  # the walk sees the package
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_every_cli_verb_is_in_the_verb_table_and_the_python_api() -> None:
    from npukit import api

    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    assert list(sub.choices) == list(cli.VERBS)
    missing = [v for v in cli.VERBS if v != "demo" and not callable(getattr(api, v.replace("-", "_"), None))]
    assert not missing, f"verbs without a function in npukit.api: {missing}"
    top = [v for v in cli.VERBS if not callable(getattr(npukit, v.replace("-", "_"), None))
           or v.replace("-", "_") not in npukit.__all__]
    assert not top, f"verbs the package does not export (import npukit; npukit.VERB): {top}"


MAX_FUNCTION_LINES = 70  # issue 22: a function, signature and docstring included, reads as a straight line of steps


def _long_functions(path: Path, limit: int) -> list[tuple[str, int, int]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = node.end_lineno - node.lineno + 1
            if length > limit:
                found.append((node.name, node.lineno, length))
    return found


def test_no_function_over_the_line_limit() -> None:
    long = [f"{path.relative_to(SRC)}:{line} {function} ({length} lines)" for path in sorted(SRC.rglob("*.py"))
            for function, line, length in _long_functions(path, MAX_FUNCTION_LINES)]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines (split them into named steps): {long}"


def test_the_line_limit_finds_a_long_function(tmp_path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    (tmp_path / "long.py").write_text(f"def short():\n    pass\n\n\ndef long():\n{body}\n")
    assert _long_functions(tmp_path / "long.py", MAX_FUNCTION_LINES) == [("long", 5, MAX_FUNCTION_LINES + 1)]
