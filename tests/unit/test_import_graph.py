"""The package's import graph: no loops, and the floors that docs/architecture.md draws.

docs/architecture.md lists the package's rooms (a folder such as ``rollout/`` or a top-level
module such as ``algorithm.py``) floor by floor. A module may import modules of its own room and
of rooms on lower floors only, never a room on its own floor or above: so ``rollout/`` and
``learner/``, both on one floor, import neither each other. Every ``import`` statement counts,
those inside functions too, since they load the module all the same when the function runs.

The rewards room, ``rewards/``, holds every reward entry and their registry. It stands above
``core/`` (the pure scoring it builds on) and ``data/`` (the reasoning_gym and verifiers scorers
read what their loaders loaded), and below ``rollout/``, ``eval/`` and the config that score with it:
no module of a lower floor imports it back, so a dataset loader never reaches for its reward.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "rllib_arpo"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
FLOORS_BLOCK = re.compile(r"<!-- floors -->\s*```text\n(.*?)```\s*<!-- /floors -->", re.S)


def module_name(path: Path) -> str:
    """``rllib_arpo/rollout/env_runner.py`` -> ``rllib_arpo.rollout.env_runner`` (a package: its name)."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imported_modules(name: str) -> set[str]:
    """The package's modules that module ``name`` imports, anywhere in its code. ``from a import b``
    imports ``a.b`` where that is a module, else ``a``; relative imports are resolved."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module
            for alias in node.names:
                found.add(f"{source}.{alias.name}" if f"{source}.{alias.name}" in MODULES else source)
    return {module for module in found if module in MODULES and module != name}


GRAPH = {name: imported_modules(name) for name in MODULES}


def room(name: str) -> str:
    """The room of a module: its top-level folder (``rollout/``) or its top-level file (``algorithm.py``)."""
    path = MODULES[name].relative_to(PACKAGE)
    return f"{path.parts[0]}/" if len(path.parts) > 1 else path.name


def drawn_floors() -> dict[str, int]:
    """Room -> floor, as docs/architecture.md draws them (a line per floor: its number, then its rooms)."""
    block = FLOORS_BLOCK.search(ARCHITECTURE.read_text())
    assert block, "docs/architecture.md has no <!-- floors --> block"
    floors = {}
    for line in block.group(1).splitlines():
        number, *rooms = line.split()
        if not number.isdigit():
            continue  # the header line
        for drawn in rooms:
            assert drawn not in floors, f"{drawn} is drawn on two floors"
            floors[drawn] = int(number)
    return floors


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each a loop of imports."""
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return cycles


def test_the_package_has_no_import_cycle():
    assert import_cycles(GRAPH) == []


def test_cycle_finder_finds_a_loop_through_three_modules():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert import_cycles(graph) == [["a", "b", "c"]]


def test_the_floors_drawn_in_the_architecture_page_are_the_package_rooms():
    assert sorted(drawn_floors()) == sorted({room(name) for name in MODULES})


def test_the_package_root_holds_at_most_five_modules_besides_init_and_cli():
    """The rest stands in rooms whose names say what they hold (``config/``, ``experiment/``,
    ``runtime/``, ...); ``algorithm.py`` stays at the root, as in RLlib's own algorithm folders."""
    own = sorted(path.name for path in PACKAGE.glob("*.py") if path.name not in {"__init__.py", "cli.py"})
    assert "algorithm.py" in own
    assert len(own) <= 5, own


def test_every_import_goes_to_its_own_room_or_a_lower_floor():
    floors = drawn_floors()
    upward = [
        f"{name} (floor {floors[room(name)]}) imports {target} (floor {floors[room(target)]})"
        for name, targets in GRAPH.items()
        for target in sorted(targets)
        if room(name) != room(target) and floors[room(target)] >= floors[room(name)]
    ]
    assert upward == []


@pytest.mark.parametrize("first, second", [("rollout/", "learner/")])
def test_rollout_and_learner_are_siblings(first, second):
    """Neither imports the other, whatever floors the page draws."""
    crossing = [
        (name, target)
        for name, targets in GRAPH.items()
        for target in targets
        if {room(name), room(target)} == {first, second}
    ]
    assert crossing == []


@pytest.mark.parametrize("lower", ["core/", "data/", "environments/", "tools/", "models/"])
def test_the_rooms_below_the_rewards_room_import_nothing_from_it(lower):
    """``rewards/`` imports ``core/`` and ``data/``; neither, nor any other room it may build on,
    imports it back, whatever floors the page draws (module docstring)."""
    floors = drawn_floors()
    assert floors[lower] < floors["rewards/"]
    back = [
        (name, target)
        for name, targets in GRAPH.items()
        for target in targets
        if room(name) == lower and room(target) == "rewards/"
    ]
    assert back == []
