"""Methods from outside the package: installed distributions and single files.

The built-in methods register when `harness.methods` is imported. A distribution adds methods
by declaring an entry point in the group `dml_harness.methods` (its value a module, or a
function that registers methods when called); `--plugin PATH_OR_MODULE` adds the methods of
one file or importable module for one command. Both go through `register_method`'s checks
(signature, search space, a name registered twice), and every method remembers its source:
the file's path and sha256, or the distribution's name and version, which each result
records (a changed plugin file is a changed run).

A command's plugins reach the processes it starts through the environment variable
DML_HARNESS_PLUGINS (Ray's runtime environment carries it; torchrun's ranks parse the same
command line): `load_methods` in any process loads the built-in methods, the entry points and
the plugins named there.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import os
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from harness.core.errors import HarnessError
from harness.core.method import _REGISTERING, METHODS

ENTRY_POINT_GROUP = "dml_harness.methods"
PLUGINS_ENV = "DML_HARNESS_PLUGINS"

# plugin key (a file's absolute path or a module's name) -> (its sha256, the names it registered)
_LOADED: dict[str, tuple[str, list[str]]] = {}
_ENTRY_POINTS_LOADED: list[bool] = []


def load_methods(plugins: Iterable[str] = ()) -> None:
    """Register the built-in methods (importing `harness.methods`), every installed entry
    point of the group `dml_harness.methods`, and the plugins given here or in
    DML_HARNESS_PLUGINS. Idempotent; the commands, worker processes and Ray tasks that look
    methods up call it first."""
    importlib.import_module("harness.methods")
    if not _ENTRY_POINTS_LOADED:
        _ENTRY_POINTS_LOADED.append(True)
        for entry_point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            _load_entry_point(entry_point)
    from_env = [p for p in os.environ.get(PLUGINS_ENV, "").split(os.pathsep) if p]
    for plugin in [*from_env, *plugins]:
        load_plugin(plugin)


@contextmanager
def plugins_loaded(plugins: list[str]) -> Iterator[list[str]]:
    """A command's `--plugin`s: loaded (resolved to absolute paths, and named in
    DML_HARNESS_PLUGINS for the processes the command starts) for the command's duration,
    then unregistered, so that one process running several commands (a test, a notebook)
    does not carry one command's plugins into the next."""
    if not plugins:  # a command without --plugin loads its methods when it needs them
        yield []
        return
    keys = [_key(p) for p in plugins]
    previous = os.environ.get(PLUGINS_ENV)
    load_methods(keys)
    named = [p for p in (previous or "").split(os.pathsep) if p]
    os.environ[PLUGINS_ENV] = os.pathsep.join([*named, *(k for k in keys if k not in named)])
    try:
        yield keys
    finally:
        if previous is None:
            os.environ.pop(PLUGINS_ENV, None)
        else:
            os.environ[PLUGINS_ENV] = previous
        for key in keys:
            unload_plugin(key)


def plugin_option(method: str) -> str:
    """' --plugin X' for a printed command that names `method`, X the plugin file's absolute
    path or module's name it was loaded from; '' for a built-in or installed method."""
    source = METHODS.get(method).source if method in METHODS else None
    if not source or "plugin" not in source:
        return ""
    return f" --plugin {source.get('module') or source['path']}"


def load_plugin(plugin: str) -> list[str]:
    """Import one plugin (a .py file's path, or an importable module's name) and return the
    methods it registered; a plugin already loaded with the same content is not imported
    again, one whose file changed is reloaded."""
    importlib.import_module("harness.methods")  # first: a plugin's duplicate is the plugin's
    key = _key(plugin)
    path = Path(key)
    if path.suffix == ".py" or path.is_file():
        sha = _sha256(path)
        source = {"plugin": "file", "path": key, "sha256": sha}
    else:
        spec = _find_module(key)
        origin = Path(spec.origin) if spec.origin else None
        sha = _sha256(origin) if origin and origin.is_file() else ""
        source = {"plugin": "module", "module": key, "path": str(origin or ""), "sha256": sha}
    if key in _LOADED:
        if _LOADED[key][0] == sha:
            return _LOADED[key][1]
        unload_plugin(key)  # the file changed since: its methods are registered anew
    names = _registering(source, plugin, lambda: _import(key, source))
    _LOADED[key] = (sha, names)
    return names


def unload_plugin(plugin: str) -> None:
    """Unregister the methods a plugin registered (nothing if it was not loaded)."""
    _, names = _LOADED.pop(_key(plugin), ("", []))
    for name in names:
        METHODS.remove(name)


def _key(plugin: str) -> str:
    """A file plugin by its absolute path (ranks and workers may start elsewhere); a module
    by its name."""
    path = Path(plugin).expanduser()
    if plugin.endswith(".py") or os.sep in plugin or path.is_file():
        if not path.is_file():
            raise HarnessError(f"--plugin {plugin}: no such file; give a .py file's path or an "
                               "importable module's name")  # fmt: skip
        return str(path.resolve())
    return plugin


def _find_module(name: str) -> importlib.machinery.ModuleSpec:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError) as exc:
        spec, why = None, f": {exc}"
    else:
        why = ""
    if spec is None:
        raise HarnessError(f"--plugin {name}: no such file or importable module{why}; give a .py "
                           "file's path or install the module (pip install ...)")  # fmt: skip
    return spec


def _import(key: str, source: dict[str, str]) -> None:
    if source["plugin"] == "module":
        importlib.import_module(key)
        return
    module_name = f"dml_harness_plugin_{Path(key).stem}_{source['sha256'][:12]}"
    spec = importlib.util.spec_from_file_location(module_name, key)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # so that inspect finds its docstrings
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(module_name, None)
        raise


def _load_entry_point(entry_point: importlib.metadata.EntryPoint) -> None:
    dist = entry_point.dist
    source = {
        "distribution": dist.name if dist else "?",
        "version": dist.version if dist else "?",
        "entry_point": f"{entry_point.name} = {entry_point.value}",
    }
    what = f"entry point {source['entry_point']!r} of {source['distribution']}"

    def load() -> None:
        loaded = entry_point.load()
        if callable(loaded) and not isinstance(loaded, type(sys)):
            loaded()

    _registering(source, what, load)


def _registering(source: dict[str, str], what: str, load: object) -> list[str]:
    """Run `load` with `source` as the source of what it registers; return the names it
    registered. Whatever goes wrong is one line naming the plugin; nothing it registered
    before failing stays registered."""
    before = set(METHODS.names())
    _REGISTERING["source"] = source
    try:
        load()  # type: ignore[operator]
    except HarnessError as exc:
        _forget(set(METHODS.names()) - before)
        raise HarnessError(f"plugin {what}: {exc}") from None
    except Exception as exc:
        _forget(set(METHODS.names()) - before)
        where = _where(exc, source.get("path"))
        raise HarnessError(f"plugin {what} failed to import: {type(exc).__name__}: {exc}{where}; "
                           "fix it, or drop the --plugin / uninstall the distribution") from None  # fmt: skip
    finally:
        _REGISTERING["source"] = None
    names = sorted(set(METHODS.names()) - before)
    if not names:
        raise HarnessError(f"plugin {what} registers no method: decorate a build function with "
                           "@harness.register_method(...) (see docs/own-loss.md)")  # fmt: skip
    return names


def _forget(names: set[str]) -> None:
    for name in names:
        METHODS.remove(name)


def _where(exc: BaseException, path: str | None) -> str:
    """' (file:line)': the plugin file's innermost line in the traceback, else the innermost."""
    frames, tb = [], exc.__traceback__
    while tb is not None:
        frames.append((tb.tb_frame.f_code.co_filename, tb.tb_lineno))
        tb = tb.tb_next
    own = [f for f in frames if f[0] == path]
    frame = (own or frames or [None])[-1]
    return f" ({frame[0]}:{frame[1]})" if frame else ""


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
