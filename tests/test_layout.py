"""The README's maps of the tree stay true: a newcomer finds any processor in one hop."""

from __future__ import annotations

import re
from pathlib import Path

import anylogits
from anylogits.core.processor import LogitsProcessor

README = (Path(__file__).parents[1] / "README.md").read_text()


def _module_table() -> dict[str, set[str]]:
    """README's processors table: module name -> the class names in its row."""
    rows: dict[str, set[str]] = {}
    for line in README.splitlines():
        cells = line.split("|")
        if len(cells) < 4 or not cells[1].strip().startswith("`"):
            continue
        names = set(re.findall(r"`(\w+)`", cells[2]))
        for module in re.findall(r"`(\w+)`", cells[1]):
            rows[module] = names
    return rows


def test_every_public_processor_sits_in_the_row_of_its_module() -> None:
    table = _module_table()
    # Not the backend factories: getting one imports its backend.
    exported = [
        getattr(anylogits, name)
        for name in anylogits.__all__
        if not anylogits._LAZY[name].startswith("anylogits.adapters.")
    ]
    public = [
        value
        for value in exported
        if isinstance(value, type)
        and issubclass(value, LogitsProcessor)
        and value.spec_name is not None
    ]
    assert len(public) > 30
    for cls in public:
        module = cls.__module__.rsplit(".", 1)[-1]
        assert cls.__module__ == f"anylogits.processors.{module}"
        assert cls.__name__ in table.get(module, set()), (
            f"README's processors table does not list {cls.__name__} under `{module}`"
        )


def test_every_file_the_layout_names_exists() -> None:
    root = Path(__file__).parents[1]
    block = README.split("## Layout", 1)[1].split("```")[1]
    folder = root
    named = 0
    for line in block.splitlines():
        top = re.match(r"^(\w[\w/]*/)(?:\s|$)", line)
        sub = re.match(r"^  (\w+/)\s", line)
        if top:
            folder = root / top.group(1)
            assert folder.is_dir(), f"README's layout names {top.group(1)}, which is not there"
        elif sub:
            folder = root / "src/anylogits" / sub.group(1)
            assert folder.is_dir(), f"README's layout names {sub.group(1)}, which is not there"
        heading = top or sub
        rest = line[heading.end() :] if heading else line
        for name in re.findall(r"\b(\w+\.py|\w+/)(?=[\s,;:)]|$)", rest):
            named += 1
            assert (folder / name).exists(), f"README's layout names {folder / name}"
    assert named >= 10


def _core_imports() -> dict[str, set[str]]:
    """Each core module's imports of other core modules, wherever they sit (function
    bodies included), except under ``if TYPE_CHECKING:``."""
    import ast

    core = Path(anylogits.__file__).parent / "core"
    graph: dict[str, set[str]] = {}
    for path in core.glob("*.py"):
        tree = ast.parse(path.read_text())
        skipped = {
            id(child)
            for node in ast.walk(tree)
            if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
            for child in ast.walk(node)
        }
        names: set[str] = set()
        for node in ast.walk(tree):
            if id(node) in skipped or not isinstance(node, ast.ImportFrom) or not node.module:
                continue
            if node.module == "anylogits.core":
                names |= {alias.name for alias in node.names}
            elif node.module.startswith("anylogits.core."):
                names.add(node.module.split(".")[2])
        graph[path.stem] = names - {path.stem, "__init__"}
    return graph


def test_core_has_no_import_loop() -> None:
    graph = _core_imports()
    assert graph["specs"] >= {"registry"} and "specs" not in graph["registry"]
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, f"import loop in anylogits.core: {' -> '.join(path)}"
        if module in done:
            return
        for imported in graph.get(module, ()):
            visit(imported, (*path, module))
        done.add(module)

    for module in graph:
        visit(module, ())


def _imported_names(path: Path, *, type_checking: bool) -> set[str]:
    """Every module ``path`` imports, wherever the import sits, as dotted names (``from a
    import b`` gives ``a`` and ``a.b``); under ``if TYPE_CHECKING:`` too when
    ``type_checking``."""
    import ast

    tree = ast.parse(path.read_text())
    skipped = (
        set()
        if type_checking
        else {
            id(child)
            for node in ast.walk(tree)
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for child in ast.walk(node)
        }
    )
    names: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
    return names


def test_the_processor_contract_stands_below_the_registry_and_the_spec_format() -> None:
    """The registry and the spec format use the processor contract, never the reverse:
    not at module level, not in a function, not for type checking (they install
    themselves on it, see anylogits.core's docstring). A batch keys states by the
    processor object, so it needs no processor either."""
    core = Path(anylogits.__file__).parent / "core"
    contract = _imported_names(core / "processor.py", type_checking=True)
    for above in ("registry", "specs"):
        assert f"anylogits.core.{above}" not in contract, f"processor.py imports {above}"
    batch = _imported_names(core / "batch.py", type_checking=True)
    assert "anylogits.core.processor" not in batch
    graph = _core_imports()
    assert "processor" in graph["registry"] and "processor" in graph["specs"]


def test_the_testing_package_stands_below_the_engines() -> None:
    """The engines use the tiny model, so ``anylogits.testing`` imports no engine; only
    what picks engines by name stands above them: the pytest plugin (a package of its
    own) and ``check_processor`` (defined in ``anylogits.engines.check_backends``)."""
    package = Path(anylogits.__file__).parent
    above = package / "testing" / "pytest_plugin"
    for path in sorted((package / "testing").rglob("*.py")):
        if above in path.parents:
            continue
        for name in _imported_names(path, type_checking=False):
            assert not name.startswith(("anylogits.engines", "anylogits.testing.pytest_plugin")), (
                f"{path.relative_to(package)} imports {name}"
            )
    for path in sorted((package / "engines").rglob("*.py")):
        for name in _imported_names(path, type_checking=True):
            assert not name.startswith("anylogits.testing.pytest_plugin"), (
                f"{path.relative_to(package)} imports {name}"
            )


def _imported_modules(path: Path) -> list[str]:
    """Every module ``path`` imports, wherever the import sits."""
    import ast

    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
        elif isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
    return names


def _house() -> dict:
    """``tools/house.py``'s drawing of the package (rooms, floors, arrows, circles)."""
    import importlib.util

    path = Path(__file__).parents[1] / "tools" / "house.py"
    spec = importlib.util.spec_from_file_location("house", path)
    assert spec is not None and spec.loader is not None
    house = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(house)
    return house.draw()


def test_the_rooms_of_the_package_form_no_circle_and_the_kernels_stand_on_the_ground() -> None:
    house = _house()
    assert house["circles"] == [], house["circles"]
    assert house["arrows_up"] == [], house["arrows_up"]
    # The kernels import only torch and triton: the core hands them what they need.
    assert "kernels" in house["by_floor"][0]


def test_unit_tests_do_not_import_the_conformance_suite() -> None:
    """``tests/`` runs without any backend and stands alone (``nox -s tests``)."""
    for path in sorted(Path(__file__).parent.glob("*.py")):
        for name in _imported_modules(path):
            assert not name.startswith("conformance_tests"), f"{path.name} imports {name}"


def test_the_package_never_imports_the_test_fixtures() -> None:
    """``test_support`` does not ship: a shipped module importing it breaks on install."""
    package = Path(anylogits.__file__).parent
    for path in sorted(package.rglob("*.py")):
        for name in _imported_modules(path):
            assert name.split(".")[0] not in {"test_support", "tests", "conformance_tests"}, (
                f"{path.relative_to(package)} imports {name}"
            )


def test_every_path_contributing_names_exists() -> None:
    root = Path(__file__).parents[1]
    text = (root / "CONTRIBUTING.md").read_text()
    paths = set(
        re.findall(r"`((?:src|tests|conformance_tests|docs|asv_bench|tools)/[\w./*-]+)`", text)
    )
    assert len(paths) >= 8, paths
    for path in sorted(paths):
        assert list(root.glob(path)), f"CONTRIBUTING.md names {path}, which is not there"


def test_every_oracle_file_is_named_after_a_processor_module() -> None:
    """The oracle tests are filed by the code they test: ``test_oracles_<module>.py`` holds
    every library's oracle of ``anylogits.processors.<module>``."""
    processors = Path(anylogits.__file__).parent / "processors"
    oracles = sorted((Path(__file__).parents[1] / "conformance_tests").glob("test_oracles_*.py"))
    assert len(oracles) >= 10
    for path in oracles:
        module = path.stem.removeprefix("test_oracles_")
        assert (processors / f"{module}.py").is_file(), f"{path.name} names no processor module"


def test_every_nox_session_lists_with_a_whole_sentence() -> None:
    # `nox -l` shows a session's first docstring line: it must say what the session
    # does by itself, not stop mid-sentence.
    import ast

    tree = ast.parse((Path(__file__).parents[1] / "noxfile.py").read_text())
    sessions = [
        node
        for node in tree.body
        if isinstance(node, ast.FunctionDef)
        and any("session" in ast.unparse(decorator) for decorator in node.decorator_list)
    ]
    assert len(sessions) >= 8
    for session in sessions:
        first = (ast.get_docstring(session) or "").split("\n", 1)[0]
        assert first.endswith(".") and len(first) <= 100, (session.name, first)


def test_contributing_names_every_nox_session_as_nox_spells_it() -> None:
    """Each session in noxfile.py has a bullet in CONTRIBUTING.md under the name `nox -s`
    takes: ``name``, or ``name(parameter='<value>')`` for a parametrized one."""
    import ast

    root = Path(__file__).parents[1]
    tree = ast.parse((root / "noxfile.py").read_text())
    sessions: dict[str, str | None] = {}
    for node in tree.body:
        decorators = [ast.unparse(d) for d in getattr(node, "decorator_list", [])]
        if isinstance(node, ast.FunctionDef) and "nox.session" in decorators:
            parametrized = [d for d in decorators if d.startswith("nox.parametrize(")]
            sessions[node.name] = (
                ast.literal_eval(parametrized[0].split("(", 1)[1].split(",")[0])
                if parametrized
                else None
            )
    listed = re.findall(r"^- `([^`]+)`:", (root / "CONTRIBUTING.md").read_text(), re.MULTILINE)
    expected = {
        name if parameter is None else f"{name}({parameter}='<"
        for name, parameter in sessions.items()
    }
    for name in expected:
        assert any(item == name or item.startswith(name) for item in listed), (name, listed)
    for item in listed:
        assert item.split("(")[0] in sessions, f"CONTRIBUTING.md lists {item}, not a nox session"


def test_every_example_package_has_a_readme_with_its_entry_point() -> None:
    root = Path(__file__).parents[1] / "examples"
    packages = [path for path in sorted(root.iterdir()) if (path / "pyproject.toml").is_file()]
    assert packages
    for package in packages:
        readme = package / "README.md"
        assert readme.is_file(), f"{package.name} has no README.md"
        pyproject = (package / "pyproject.toml").read_text()
        section = pyproject.split('[project.entry-points."anylogits.processors"]')[1]
        entry_point = re.search(r'^(\w+) = "([\w.:]+)"$', section, re.MULTILINE)
        assert entry_point is not None and entry_point[0] in readme.read_text(), package.name
