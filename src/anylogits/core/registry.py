"""The registry: every processor type a spec can name, by its ``spec_name``, and the
plugins that add types from installed packages and operator-listed modules.

A spec names a processor by a registry key, never by an import path (a client could
otherwise import any module on a server). Types beyond the catalogue join the registry in
two ways, both read in every process (a vLLM server's frontend and its engine workers
alike):

- an installed package declares the class under the entry-point group
  ``anylogits.processors``, keyed by the class's ``spec_name``::

      [project.entry-points."anylogits.processors"]
      ban_two_back = "my_pkg.processors:BanTwoBack"

- the operator lists modules to import in ``ANYLOGITS_PLUGINS=mod1,mod2`` (for code
  that is not packaged); importing them defines and so registers their classes.

Both are loaded lazily, the first time a spec names a type not yet registered, or all
at once by :func:`load_plugins` (the vLLM adapter calls it at engine start, so a broken
plugin stops the engine there rather than failing requests). The entry-point group is
scanned once per process, so unknown types sent by clients stay cheap.
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
from importlib.metadata import EntryPoint, entry_points
from typing import Any, TypeVar

from anylogits.core.processor import LogitsProcessor, watch_subclasses

ENTRY_POINT_GROUP = "anylogits.processors"
PLUGINS_VARIABLE = "ANYLOGITS_PLUGINS"
HOW_TO_ADD = (
    f"to add a type, install a package that declares its class in the entry-point group "
    f"{ENTRY_POINT_GROUP!r} (key = the class's spec_name), or list the module that defines "
    f"it in the environment variable {PLUGINS_VARIABLE} (comma-separated) of every process "
    "that reads specs, the server's included"
)

# Every processor class with a ``spec_name`` of its own, by that name; filled as classes
# are defined (this module watches every ``LogitsProcessor`` subclass, see the end).
_REGISTRY: dict[str, type[LogitsProcessor]] = {}
# The modules whose classes are the catalogue: imported the first time a type is looked up
# (``import anylogits`` imports no processor).
_PACKAGE = "anylogits."
CATALOGUE_MODULES = ("anylogits.processors", "anylogits.adapters.from_transformers")
_catalogue_loaded = False


def _defined_outside_the_package(cls: type[LogitsProcessor]) -> bool:
    return not cls.__module__.startswith(_PACKAGE)


def load_catalogue() -> None:
    """Register the catalogue's types (once per process)."""
    global _catalogue_loaded
    if _catalogue_loaded:
        return
    with _lock:
        if _catalogue_loaded:
            return
        _catalogue_loaded = True  # first: the catalogue's own classes register as they import
        try:
            for module in CATALOGUE_MODULES:
                importlib.import_module(module)
        except BaseException:
            _catalogue_loaded = False
            raise


def register(cls: type[LogitsProcessor]) -> None:
    """Make a ``LogitsProcessor`` subclass that sets a ``spec_name`` of its own buildable
    from specs of that ``"type"`` (called with each subclass as it is defined)."""
    name = cls.__dict__.get("spec_name")
    if name is None:
        return
    if _defined_outside_the_package(cls):
        load_catalogue()  # a plugin's name is checked against every catalogue type
    if name in _REGISTRY and _REGISTRY[name] is not cls:
        raise TypeError(
            f"spec_name {name!r} of {cls.__qualname__} is already used by "
            f"{_REGISTRY[name].__qualname__}; choose another spec_name"
        )
    _REGISTRY[name] = cls


def _processor_class(value: object) -> type[LogitsProcessor] | None:
    """``value`` when it is a ``LogitsProcessor`` subclass, else ``None``."""
    if isinstance(value, type) and issubclass(value, LogitsProcessor):
        return value if value is not LogitsProcessor else None
    return None


def registered_type(name: str) -> type[LogitsProcessor] | None:
    """The class registered under ``name`` so far (plugins not loaded), or ``None``."""
    load_catalogue()
    return _REGISTRY.get(name)


def registered_processors() -> dict[str, type[LogitsProcessor]]:
    """Every processor class that has a ``spec_name``, by that name, plugins included
    (loads them all: ``ValueError`` when one fails, see :func:`anylogits.load_plugins`)."""
    load_catalogue()
    load_plugins()
    return dict(_REGISTRY)


def defined_elsewhere() -> list[str]:
    """The types registered so far whose classes come from outside this package."""
    return sorted(name for name, cls in _REGISTRY.items() if _defined_outside_the_package(cls))


_P = TypeVar("_P", bound="type[LogitsProcessor]")

# Spec names whose specs run only in the process that made them (they name one of its
# objects): where specs are written by hand or sent to a server, they are not offered.
_IN_PROCESS_ONLY: set[str] = set()


def in_process_only(cls: _P) -> _P:
    """Class decorator: ``cls``'s specs name an object of the process that made them, so
    ``anylogits list`` and the unknown-type message (a server's HTTP 400) leave it out."""
    if cls.spec_name is None:
        raise TypeError(f"{cls.__qualname__} has no spec_name: its specs name no type")
    _IN_PROCESS_ONLY.add(cls.spec_name)
    return cls


def offered(spec_name: str) -> bool:
    """Whether a spec written by hand, or sent to a server, may name ``spec_name``."""
    load_catalogue()
    return spec_name not in _IN_PROCESS_ONLY


def processor_type(kind: Any) -> type[LogitsProcessor]:
    """The class a spec's ``"type"`` names, loading plugins the first time a type is not
    yet registered; ``ValueError`` saying the known types and plugins otherwise."""
    load_catalogue()
    if isinstance(kind, str):
        cls = _REGISTRY.get(kind)
        if cls is not None:
            return cls
        find_plugin_type(kind)
        cls = _REGISTRY.get(kind)
        if cls is not None:
            return cls
    known = ", ".join(
        sorted(name for name in set(_REGISTRY) | set(available_entry_points()) if offered(name))
    )
    raise ValueError(
        f"spec field 'type' is {kind!r}; known processor types: {known}; {describe_plugins()}"
    )


# Loading imports user code, which may define processors (and so register them) or, on
# a server, race another thread's first unknown type; reentrant for imports that build specs.
_lock = threading.RLock()
# Entry points of the group by key, from the one scan of this process (None: not scanned).
_entry_points: dict[str, list[EntryPoint]] | None = None
# Keys of the entry points loaded and checked, with where each came from.
_loaded_entry_points: dict[str, str] = {}
# Entry points that failed, by key: the same error again, without importing again.
_failed_entry_points: dict[str, str] = {}
# The ANYLOGITS_PLUGINS modules imported (None: not yet), or the error importing them gave.
_imported_modules: list[str] | None = None
_modules_error: str | None = None


def listed_modules() -> list[str]:
    """The modules ``ANYLOGITS_PLUGINS`` names."""
    value = os.environ.get(PLUGINS_VARIABLE, "")
    return [name.strip() for name in value.split(",") if name.strip()]


def _find_modules_in_working_directory() -> None:
    """Let ``ANYLOGITS_PLUGINS`` name a module in the current directory, as ``python -m``
    finds one: a console script (``anylogits serve``, ``vllm serve``) puts its own folder
    first on the path instead. Appended: an installed module of the same name wins."""
    working_directory = os.getcwd()
    if not any(os.path.abspath(entry or os.curdir) == working_directory for entry in sys.path):
        sys.path.append(working_directory)


def import_plugin_modules() -> list[str]:
    """Import the modules listed in ``ANYLOGITS_PLUGINS`` (once per process) and return
    their names; ``ValueError`` naming the module and its error when one fails."""
    global _imported_modules, _modules_error
    with _lock:
        if _modules_error is not None:
            raise ValueError(_modules_error)
        if _imported_modules is not None:
            return list(_imported_modules)
        imported = []
        listed = listed_modules()
        if listed:
            _find_modules_in_working_directory()
        for name in listed:
            try:
                importlib.import_module(name)
            except Exception as error:  # any failure of user code is a configuration error
                _modules_error = (
                    f"anylogits plugin module {name!r} (from {PLUGINS_VARIABLE}) failed to "
                    f"import: {type(error).__name__}: {error}"
                )
                raise ValueError(_modules_error) from None
            imported.append(name)
        _imported_modules = imported
        return list(imported)


def available_entry_points() -> dict[str, list[EntryPoint]]:
    """The entry points of the ``anylogits.processors`` group by key, scanned once per
    process (a package installed later is seen by the next process)."""
    global _entry_points
    with _lock:
        if _entry_points is None:
            found: dict[str, list[EntryPoint]] = {}
            for entry_point in entry_points(group=ENTRY_POINT_GROUP):
                found.setdefault(entry_point.name, []).append(entry_point)
            _entry_points = found
        return _entry_points


def entry_point_origin(entry_point: EntryPoint) -> str:
    """The entry point and the distribution declaring it, for messages and listings."""
    distribution = getattr(entry_point, "dist", None)
    where = (
        f"distribution {distribution.name} {distribution.version}"
        if distribution is not None
        else "an unknown distribution"
    )
    return f"entry point {entry_point.name!r} = {entry_point.value!r} ({where})"


def load_entry_point(name: str) -> None:
    """Import the entry point keyed ``name`` and check it registered itself under that
    key; ``ValueError`` naming the entry point and its distribution otherwise."""
    with _lock:
        if name in _loaded_entry_points:
            return
        if name in _failed_entry_points:
            raise ValueError(_failed_entry_points[name])
        declared = available_entry_points()[name]
        problem = None
        if len(declared) > 1:
            origins = "; ".join(entry_point_origin(entry_point) for entry_point in declared)
            problem = f"anylogits plugin type {name!r} is declared more than once: {origins}"
        else:
            entry_point = declared[0]
            try:
                loaded = entry_point.load()
            except Exception as error:  # any failure of user code is a plugin error
                loaded = None
                problem = (
                    f"anylogits plugin {entry_point_origin(entry_point)} failed to load: "
                    f"{type(error).__name__}: {error}"
                )
            if problem is None:
                cls = _processor_class(loaded)
                if cls is None:
                    problem = (
                        f"anylogits plugin {entry_point_origin(entry_point)} is {loaded!r}, not a "
                        "subclass of anylogits.LogitsProcessor"
                    )
                elif cls.spec_name != name:
                    problem = (
                        f"anylogits plugin {entry_point_origin(entry_point)} loads "
                        f"{cls.__qualname__}, whose spec_name is {cls.spec_name!r}; "
                        "the entry point's key must equal the class's spec_name"
                    )
                elif registered_type(name) is not cls:
                    problem = (
                        f"anylogits plugin {entry_point_origin(entry_point)} loads "
                        f"{cls.__qualname__}, but spec_name {name!r} is registered to "
                        f"{registered_type(name)!r}"
                    )
        if problem is not None:
            _failed_entry_points[name] = problem
            raise ValueError(problem)
        _loaded_entry_points[name] = entry_point_origin(declared[0])


def find_plugin_type(name: str) -> bool:
    """Load what could define the processor type ``name``: the ``ANYLOGITS_PLUGINS``
    modules, then the entry point keyed ``name`` if one is installed. ``True`` when an
    entry point was loaded for it; ``ValueError`` when a plugin fails."""

    with _lock:
        import_plugin_modules()
        if registered_type(name) is not None:
            return False
        if name not in available_entry_points():
            return False
        load_entry_point(name)
        return True


def load_plugins() -> None:
    """Import every plugin now: the ``ANYLOGITS_PLUGINS`` modules and every entry point
    of the ``anylogits.processors`` group. ``ValueError`` naming the first that fails.

    Engines call it at start so a broken plugin stops them there; elsewhere plugins load
    by themselves when a spec names their type.
    """
    with _lock:
        import_plugin_modules()
        for name in sorted(available_entry_points()):
            load_entry_point(name)


def describe_plugins() -> str:
    """Which plugins this process has loaded, and how to add one (for error messages)."""
    with _lock:
        loaded = [_loaded_entry_points[name] for name in sorted(_loaded_entry_points)]
        installed = sorted(available_entry_points())
        unloaded = [name for name in installed if name not in _loaded_entry_points]
        modules = _imported_modules if _imported_modules is not None else []
    parts = [
        "plugins loaded: "
        + ("; ".join(loaded) if loaded else f"no entry points of {ENTRY_POINT_GROUP!r}"),
        (
            f"{PLUGINS_VARIABLE} modules: {', '.join(modules)}"
            if modules
            else f"no {PLUGINS_VARIABLE} modules"
        ),
    ]
    if unloaded:
        parts.append(f"entry points installed, not loaded yet: {', '.join(unloaded)}")
    return "; ".join(parts) + f". {HOW_TO_ADD}"


# Last: registering a class may load the catalogue, which needs all of the above.
watch_subclasses(register)
