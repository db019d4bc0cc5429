"""Plugins: processor types from installed entry points and ANYLOGITS_PLUGINS modules.

Each test installs a real distribution (a package plus its ``.dist-info``) in ``tmp_path``
and runs the lookups in a fresh Python process, where nothing has been imported or
scanned yet, the way a vLLM server's frontend or engine worker starts.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PLUGIN_MODULE = """
from anylogits import LogitsProcessor


class DemoBias(LogitsProcessor):
    spec_name = "demo_bias"

    def __init__(self, token_id: int, bias: float = 5.0) -> None:
        self.token_id = token_id
        self.bias = bias

    def process(self, logits, batch):
        logits[:, self.token_id] += self.bias
        return logits

    def config(self):
        return {"token_id": self.token_id, "bias": self.bias}


class Misnamed(DemoBias):
    spec_name = "not_the_key"


NOT_A_PROCESSOR = 3
"""


def install_distribution(
    root: Path, entry_points: dict[str, str], module_source: str = PLUGIN_MODULE
) -> None:
    """Install ``anylogits-demo-plugin`` into ``root`` the way pip lays it out."""
    package = root / "anylogits_demo_plugin"
    package.mkdir(exist_ok=True)
    (package / "__init__.py").write_text(module_source)
    dist_info = root / "anylogits_demo_plugin-0.1.dist-info"
    dist_info.mkdir(exist_ok=True)
    (dist_info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: anylogits-demo-plugin\nVersion: 0.1\n"
    )
    lines = [f"{key} = {value}" for key, value in entry_points.items()]
    (dist_info / "entry_points.txt").write_text(
        "[anylogits.processors]\n" + "\n".join(lines) + "\n"
    )


def run_fresh(
    root: Path, code: str, plugins: str | None = None, *, as_console_script: bool = False
) -> dict:
    """Run ``code`` in a new interpreter with ``root`` on its path, or, ``as_console_script``,
    started in ``root`` with neither it nor the working directory on its path (``-P``: as
    ``anylogits serve`` runs); it sets ``result`` (a JSON-able value), returned here."""
    inherited = [entry for entry in sys.path if entry and Path(entry).is_dir()]
    path = inherited if as_console_script else [str(root), *inherited]
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    environment.pop("ANYLOGITS_PLUGINS", None)
    if plugins is not None:
        environment["ANYLOGITS_PLUGINS"] = plugins
    program = (
        "import json, sys\n"
        "def error_of(call, *args):\n"
        "    try:\n"
        "        call(*args)\n"
        "    except ValueError as error:\n"
        "        return str(error)\n"
        "    raise AssertionError(f'{call.__name__}{args} raised nothing')\n"
        + textwrap.dedent(code)
        + "\nprint('RESULT=' + json.dumps(result))\n"
    )
    completed = subprocess.run(
        [sys.executable, *(["-P"] if as_console_script else []), "-c", program],
        cwd=root,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stderr
    line = next(line for line in completed.stdout.splitlines() if line.startswith("RESULT="))
    return {"result": json.loads(line.removeprefix("RESULT=")), "stdout": completed.stdout}


def test_an_installed_entry_point_resolves_lazily_in_a_fresh_process(tmp_path: Path) -> None:
    install_distribution(tmp_path, {"demo_bias": "anylogits_demo_plugin:DemoBias"})
    result = run_fresh(
        tmp_path,
        """
        import torch
        import anylogits
        from anylogits.core.specs import parse_specs

        imported = ["anylogits_demo_plugin" in sys.modules]
        anylogits.from_spec({"type": "top_k", "top_k": 2})
        imported.append("anylogits_demo_plugin" in sys.modules)
        processor = anylogits.from_spec({"type": "demo_bias", "token_id": 1})
        imported.append("anylogits_demo_plugin" in sys.modules)
        parse_specs('[{"type": "demo_bias", "token_id": 2, "bias": 1.0}]', "request")
        pipeline = anylogits.Pipeline([processor])
        logits = pipeline(torch.zeros(1, 4), torch.tensor([[0]]))
        result = {
            "imported": imported,
            "module": type(processor).__module__,
            "spec": processor.to_spec(),
            "logits": logits.tolist(),
        }
        """,
    )["result"]
    assert result == {
        "imported": [False, False, True],
        "module": "anylogits_demo_plugin",
        "spec": {"type": "demo_bias", "token_id": 1, "bias": 5.0},
        "logits": [[0.0, 5.0, 0.0, 0.0]],
    }


def test_load_plugins_imports_every_entry_point_at_once(tmp_path: Path) -> None:
    install_distribution(tmp_path, {"demo_bias": "anylogits_demo_plugin:DemoBias"})
    result = run_fresh(
        tmp_path,
        """
        import anylogits
        from anylogits.core.registry import registered_processors

        before = "anylogits_demo_plugin" in sys.modules
        anylogits.load_plugins()
        result = [before, "anylogits_demo_plugin" in sys.modules,
                  "demo_bias" in registered_processors()]
        """,
    )["result"]
    assert result == [False, True, True]


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        (
            "anylogits_demo_plugin:Misnamed",
            "loads Misnamed, whose spec_name is 'not_the_key'; the entry point's key must "
            "equal the class's spec_name",
        ),
        (
            "anylogits_demo_plugin:NOT_A_PROCESSOR",
            "is 3, not a subclass of anylogits.LogitsProcessor",
        ),
        ("anylogits_demo_plugin:Missing", "failed to load: AttributeError"),
        ("no_such_demo_module:DemoBias", "failed to load: ModuleNotFoundError"),
    ],
)
def test_a_bad_entry_point_is_a_value_error_naming_it_and_its_distribution(
    tmp_path: Path, target: str, expected: str
) -> None:
    install_distribution(tmp_path, {"bad_plugin": target})
    errors = run_fresh(
        tmp_path,
        """
        import anylogits
        from anylogits.core.specs import parse_specs

        spec = {"type": "bad_plugin", "token_id": 1}
        result = [
            error_of(anylogits.from_spec, spec),
            error_of(anylogits.from_spec, spec),  # cached: the same answer again
            error_of(parse_specs, [spec], "request"),
            error_of(anylogits.load_plugins),
        ]
        """,
    )["result"]
    origin = (
        f"anylogits plugin entry point 'bad_plugin' = '{target}' "
        "(distribution anylogits-demo-plugin 0.1)"
    )
    assert errors[0] == errors[1]
    assert errors[2] == f"request[0]: {errors[0]}"
    assert errors[3] == errors[0]
    assert errors[0].startswith(origin)
    assert expected in errors[0]


def test_an_unknown_type_says_the_known_types_the_plugins_and_how_to_add_one(
    tmp_path: Path,
) -> None:
    install_distribution(tmp_path, {"demo_bias": "anylogits_demo_plugin:DemoBias"})
    (tmp_path / "operator_processors.py").write_text("")
    messages = run_fresh(
        tmp_path,
        """
        import anylogits

        result = [error_of(anylogits.from_spec, {"type": "no_such_type"})]
        anylogits.from_spec({"type": "demo_bias", "token_id": 1})
        result.append(error_of(anylogits.from_spec, {"type": "no_such_type"}))
        result.append(error_of(anylogits.from_spec, {"type": ["not", "a", "name"]}))
        """,
        plugins="operator_processors",
    )["result"]
    before, after, unhashable = messages
    # Other installed plugins (the example package, in the vLLM session) may be listed too.
    assert before.startswith("spec field 'type' is 'no_such_type'; known processor types: ")
    assert "top_k" in before and "demo_bias" in before
    assert re.search(r"entry points installed, not loaded yet: [\w, ]*\bdemo_bias\b", before)
    assert "ANYLOGITS_PLUGINS modules: operator_processors" in before
    assert "entry-point group 'anylogits.processors'" in before
    assert "environment variable ANYLOGITS_PLUGINS" in before
    assert (
        "plugins loaded: entry point 'demo_bias' = 'anylogits_demo_plugin:DemoBias' "
        "(distribution anylogits-demo-plugin 0.1)" in after
    )
    assert not re.search(r"not loaded yet: [\w, ]*\bdemo_bias\b", after)
    assert unhashable.startswith("spec field 'type' is ['not', 'a', 'name']; known")


def test_the_entry_point_group_is_scanned_once_per_process(tmp_path: Path) -> None:
    result = run_fresh(
        tmp_path,
        """
        import importlib.metadata
        import anylogits
        from pathlib import Path

        spec = {"type": "demo_bias", "token_id": 1}
        first = error_of(anylogits.from_spec, spec)
        # Installed after this process scanned the group: seen by the next process only.
        dist_info = Path("anylogits_demo_plugin-0.1.dist-info")
        dist_info.mkdir()
        (dist_info / "METADATA").write_text("Metadata-Version: 2.1\\nName: late\\nVersion: 1\\n")
        (dist_info / "entry_points.txt").write_text(
            "[anylogits.processors]\\ndemo_bias = anylogits_demo_plugin:DemoBias\\n"
        )
        Path("anylogits_demo_plugin").mkdir()
        Path("anylogits_demo_plugin/__init__.py").write_text("")
        importlib.invalidate_caches()
        installed = importlib.metadata.entry_points(group="anylogits.processors").names
        result = [first, error_of(anylogits.from_spec, spec), sorted(installed)]
        """,
    )["result"]
    first, second, installed = result
    assert "demo_bias" in installed
    assert first.startswith("spec field 'type' is 'demo_bias'; known processor types")
    assert second == first
    install_distribution(tmp_path, {"demo_bias": "anylogits_demo_plugin:DemoBias"})
    next_process = run_fresh(
        tmp_path,
        """
        import anylogits

        result = anylogits.from_spec({"type": "demo_bias", "token_id": 1}).to_spec()
        """,
    )["result"]
    assert next_process == {"type": "demo_bias", "token_id": 1, "bias": 5.0}


OPERATOR_MODULE = """
print("operator module imported")
from anylogits import LogitsProcessor


class OperatorBias(LogitsProcessor):
    spec_name = "operator_bias"

    def __init__(self, bias: float) -> None:
        self.bias = bias

    def process(self, logits, batch):
        return logits + self.bias

    def config(self):
        return {"bias": self.bias}
"""


def test_anylogits_plugins_modules_are_imported_once_at_the_first_unknown_type(
    tmp_path: Path,
) -> None:
    (tmp_path / "operator_processors.py").write_text(OPERATOR_MODULE)
    ran = run_fresh(
        tmp_path,
        """
        import anylogits

        imported = ["operator_processors" in sys.modules]
        anylogits.from_spec({"type": "top_k", "top_k": 2})
        imported.append("operator_processors" in sys.modules)
        processor = anylogits.from_spec({"type": "operator_bias", "bias": 1.0})
        imported.append("operator_processors" in sys.modules)
        error_of(anylogits.from_spec, {"type": "still_unknown"})
        anylogits.load_plugins()
        result = {"imported": imported, "spec": processor.to_spec()}
        """,
        plugins=" operator_processors , ",
    )
    assert ran["result"] == {
        "imported": [False, False, True],
        "spec": {"type": "operator_bias", "bias": 1.0},
    }
    assert ran["stdout"].count("operator module imported") == 1


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (None, "ModuleNotFoundError: No module named 'broken_processors'"),
        ("raise RuntimeError('boom')", "RuntimeError: boom"),
    ],
)
def test_an_anylogits_plugins_module_that_fails_is_a_value_error_naming_it(
    tmp_path: Path, source: str | None, expected: str
) -> None:
    if source is not None:
        (tmp_path / "broken_processors.py").write_text(source)
    errors = run_fresh(
        tmp_path,
        """
        import anylogits
        from anylogits.core.specs import parse_specs

        result = [
            error_of(anylogits.load_plugins),
            error_of(anylogits.from_spec, {"type": "anything"}),
            error_of(parse_specs, [{"type": "anything"}], "request"),
        ]
        # A registered type needs no plugin, so it never meets the broken module.
        anylogits.from_spec({"type": "top_k", "top_k": 2})
        """,
        plugins="broken_processors",
    )["result"]
    message = (
        "anylogits plugin module 'broken_processors' (from ANYLOGITS_PLUGINS) failed to "
        f"import: {expected}"
    )
    assert errors == [message, message, f"request[0]: {message}"]


def test_anylogits_plugins_modules_are_found_in_the_working_directory(tmp_path: Path) -> None:
    # Started as a console script (anylogits serve, vllm serve) is: the current directory
    # is not on its path; the module is found there anyway.
    (tmp_path / "operator_processors.py").write_text(OPERATOR_MODULE)
    ran = run_fresh(
        tmp_path,
        """
        import os

        assert os.getcwd() not in sys.path and '' not in sys.path, sys.path
        import anylogits

        anylogits.load_plugins()
        result = anylogits.from_spec({"type": "operator_bias", "bias": 1.0}).to_spec()
        """,
        plugins="operator_processors",
        as_console_script=True,
    )
    assert ran["result"] == {"type": "operator_bias", "bias": 1.0}


def test_a_type_of_in_process_objects_is_not_offered_where_specs_are_written() -> None:
    # transformers_object specs name an object of the process that made them: no server
    # accepts them, so neither the unknown-type message nor anylogits list offers them.
    from anylogits.adapters.from_transformers import SPEC_NAME
    from anylogits.cli.listing import catalogue_entries
    from anylogits.core.registry import offered, processor_type

    assert not offered(SPEC_NAME) and offered("top_k")
    with pytest.raises(ValueError, match="known processor types: ") as raised:
        processor_type("no_such_type")
    assert "top_k" in str(raised.value) and SPEC_NAME not in str(raised.value)
    listed = {entry["spec_name"] for entry in catalogue_entries()}
    assert "top_k" in listed and SPEC_NAME not in listed
    assert processor_type(SPEC_NAME).__name__ == "TransformersProcessor"  # still runs here


def test_a_spec_name_already_used_fails_the_class_statement() -> None:
    # Checked as the class is defined (the registry watches every processor class), so
    # a clash never reaches a spec; a plugin's name is checked against the catalogue's.
    from anylogits import LogitsProcessor
    from anylogits.core.registry import registered_type

    with pytest.raises(TypeError) as raised:

        class ClashingTopK(LogitsProcessor):
            spec_name = "top_k"

    assert str(raised.value) == (
        "spec_name 'top_k' of test_a_spec_name_already_used_fails_the_class_statement."
        "<locals>.ClashingTopK is already used by TopK; choose another spec_name"
    )
    registered = registered_type("top_k")
    assert registered is not None and registered.__name__ == "TopK"


def test_every_processor_class_defined_is_registered_as_it_is_defined() -> None:
    from anylogits import LogitsProcessor
    from anylogits.core.registry import registered_type

    class Defined(LogitsProcessor):
        spec_name = "test_registry.defined"

    class Subclassed(Defined):
        pass  # no spec_name of its own: registers nothing

    assert registered_type("test_registry.defined") is Defined
