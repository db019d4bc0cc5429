"""Draw the package as a house: rooms (subpackages, and the top-level modules), the
arrows between them (one room importing another, wherever the import sits: a function
body's import is put off, not gone), the floors the arrows give, and what breaks the
order.

- A room's floor is one above the highest room it imports (the ground floor imports
  none); the rooms of a circle share the floor of its lowest possible placement.
- A circle is a set of rooms that reach each other by arrows.
- An arrow up points to a room on the same floor or higher: one inside a circle.

``python tools/house.py`` prints the floors, then the arrows up and the circles, one a
line, and a summary line; ``--json`` prints the same as JSON. ``--package DIR`` draws
another checkout's ``src/anylogits``. Imports under ``if TYPE_CHECKING:`` do not count:
they run at no time.
"""

from __future__ import annotations

import ast
import json
import sys
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "anylogits"


def room_of(module: str) -> str | None:
    """The room of a dotted ``anylogits...`` module name (``None`` outside the package)."""
    parts = module.split(".")
    if parts[0] != "anylogits":
        return None
    if len(parts) == 1:
        return "__init__"
    for depth in range(len(parts), 1, -1):
        folder = PACKAGE.joinpath(*parts[1:depth])
        if folder.is_dir():
            return "/".join(parts[1:depth])
    if (PACKAGE / f"{parts[1]}.py").is_file():
        return parts[1]  # a top-level module
    return "__init__"  # a name the package itself defines


def _module_name(path: Path) -> str:
    relative = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(relative.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> list[str]:
    """The room of each import of ``path`` outside TYPE_CHECKING."""
    tree = ast.parse(path.read_text())
    skipped = {
        id(child)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for child in ast.walk(node)
    }
    package = _module_name(path)
    if path.name != "__init__.py":
        package = package.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            targets = [module] + [f"{module}.{alias.name}" for alias in node.names]
            # `from anylogits.core import tracker` names a module; take the deepest room.
            rooms = [room_of(target) for target in targets if target]
            known = [room for room in rooms if room is not None]
            if known:
                found.append(max(known, key=len))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                room = room_of(alias.name)
                if room is not None:
                    found.append(room)
    return found


def draw() -> dict[str, object]:
    arrows: set[tuple[str, str]] = set()
    rooms: set[str] = set()
    lines: dict[str, int] = defaultdict(int)
    for path in sorted(PACKAGE.rglob("*.py")):
        room = room_of(_module_name(path)) or "__init__"
        rooms.add(room)
        lines[room] += len(path.read_text().splitlines())
        for target in _imports(path):
            if target != room:
                arrows.add((room, target))
    circles = _circles(rooms, arrows)
    circle_of = {room: tuple(circle) for circle in circles for room in circle}
    floors: dict[str, int] = {}

    def floor(room: str) -> int:
        if room in floors:
            return floors[room]
        members = circle_of.get(room, (room,))
        for member in members:
            floors[member] = 0  # while the circle's floor is computed
        below = [
            floor(target)
            for (source, target) in arrows
            if source in members and target not in members
        ]
        for member in members:
            floors[member] = 1 + max(below) if below else 0
        return floors[room]

    for room in sorted(rooms):
        floor(room)
    up = sorted(
        f"{source} -> {target}" for (source, target) in arrows if floors[target] >= floors[source]
    )
    return {
        "rooms": len(rooms),
        "floors": 1 + max(floors.values()),
        "arrows": len(arrows),
        "arrows_up": up,
        "circles": circles,
        "lines": sum(lines.values()),
        "by_floor": {
            level: sorted(room for room in rooms if floors[room] == level)
            for level in range(1 + max(floors.values()))
        },
    }


def _circles(rooms: set[str], arrows: set[tuple[str, str]]) -> list[list[str]]:
    """The strongly connected sets of more than one room (Tarjan)."""
    edges: dict[str, list[str]] = defaultdict(list)
    for source, target in arrows:
        edges[source].append(target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(room: str) -> None:
        index[room] = low[room] = len(index)
        stack.append(room)
        on_stack.add(room)
        for target in edges[room]:
            if target not in index:
                visit(target)
                low[room] = min(low[room], low[target])
            elif target in on_stack:
                low[room] = min(low[room], index[target])
        if low[room] == index[room]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == room:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for room in sorted(rooms):
        if room not in index:
            visit(room)
    return sorted(found)


def main() -> None:
    global PACKAGE
    if "--package" in sys.argv[1:]:
        PACKAGE = Path(sys.argv[sys.argv.index("--package") + 1]).resolve() / "src" / "anylogits"
    house = draw()
    if "--json" in sys.argv[1:]:
        print(json.dumps(house, indent=2))
        return
    for level, names in reversed(list(house["by_floor"].items())):  # type: ignore[attr-defined]
        print(f"floor {level}: {', '.join(names)}")
    for arrow in house["arrows_up"]:  # type: ignore[attr-defined]
        print(f"up: {arrow}")
    for circle in house["circles"]:  # type: ignore[attr-defined]
        print(f"circle: {' <-> '.join(circle)}")
    print(
        f"{house['lines']} lines, {house['rooms']} rooms on {house['floors']} floors, "
        f"{house['arrows']} arrows, {len(house['arrows_up'])} up, "  # type: ignore[arg-type]
        f"{len(house['circles'])} circles"  # type: ignore[arg-type]
    )


if __name__ == "__main__":
    main()
