"""No long units: a module or class of the package at most 350 lines, a function at most 60.

The import graph's neighbour (``test_import_graph.py``): where that test keeps each module on its
floor, this one keeps each unit short enough to read at once. A unit's length is its lines as the
file holds them, docstrings and comments included (``end_lineno - lineno + 1``; a module: the
file's lines). A unit that outgrows its limit is split along its concepts, not allowed: the list
of exceptions this test started with (22 units) is empty.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "rllib_arpo"
MODULE_LINES = 350
CLASS_LINES = 350
FUNCTION_LINES = 60


def units(tree: ast.AST, prefix: str = "") -> list[tuple[str, ast.AST]]:
    """Every class and function under ``tree`` with its dotted name (``Class.method``, ``f.inner``)."""
    found = []
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            name = f"{prefix}{node.name}"
            found.append((name, node))
            found.extend(units(node, f"{name}."))
        else:
            found.extend(units(node, prefix))
    return found


def units_over_the_limit(root: Path = PACKAGE) -> dict[str, int]:
    """``path`` (a module) or ``path:dotted.name`` (a class or function) -> its lines, for every
    unit of the package past its limit."""
    over = {}
    for path in sorted(root.rglob("*.py")):
        source = path.read_text()
        where = path.relative_to(root.parent).as_posix()
        if len(source.splitlines()) > MODULE_LINES:
            over[where] = len(source.splitlines())
        for name, node in units(ast.parse(source, where)):
            lines = node.end_lineno - node.lineno + 1
            if lines > (CLASS_LINES if isinstance(node, ast.ClassDef) else FUNCTION_LINES):
                over[f"{where}:{name}"] = lines
    return over


def test_the_measure_names_and_counts_each_kind_of_unit(tmp_path):
    package = tmp_path / "rllib_arpo"
    package.mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(60))
    long_function = f"def long():\n{body}\n"  # 61 lines
    short_method = "    def short(self):\n        return 1\n"
    nested = f"def outer():\n    def inner():\n{body.replace('    ', '        ')}\n    return inner\n"  # inner: 61
    big_class = "class Big:\n" + "".join(f"    a{i} = {i}\n" for i in range(350)) + short_method  # 353 lines
    (package / "a.py").write_text(long_function + nested + big_class)
    (package / "b.py").write_text("x = 1\n" * 351)
    found = units_over_the_limit(package)
    assert {name.split("/")[-1]: lines for name, lines in found.items()} == {
        "a.py": 61 + 63 + 353,
        "a.py:long": 61,
        "a.py:outer": 63,
        "a.py:outer.inner": 61,
        "a.py:Big": 353,
        "b.py": 351,
    }


def test_no_unit_is_over_its_limit():
    over = units_over_the_limit()
    assert not over, f"over the limit (module and class {MODULE_LINES} lines, function {FUNCTION_LINES}): {over}"
