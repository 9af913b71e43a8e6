"""The global plugin table (mjp_registerPlugin, mj_loadPluginLibrary).

Plugins are registered by name into numbered slots (``Model.plugin`` holds the slot of
each instance's plugin, as mjModel.plugin does). The first-party plugins take the slots
MuJoCo's bundled libraries take (actuator, sensor, sdf, in that order), so the slots of
models using them match MuJoCo's; ``mujoco.elasticity.cable`` (not bundled with MuJoCo
4) follows. Third-party plugins are discovered through the Python entry-point group
``simjax.plugins`` (each entry point is a Plugin, a list of them, or a callable that
registers or returns them) the first time the table is consulted, or loaded explicitly
with :func:`load_library`.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import warnings

from simjax.plugins.protocol import Plugin

ENTRY_POINT_GROUP = "simjax.plugins"

_TABLE: list[Plugin] = []
_BY_NAME: dict[str, int] = {}
_STATE = {"builtin": False, "entry_points": False}

#: modules holding the first-party plugins, in slot order
_BUILTIN_MODULES = ("simjax.plugins.pid", "simjax.plugins.touch_grid",
                    "simjax.plugins.sdf", "simjax.plugins.cable")


def _add(plugin: Plugin) -> int:
    if not isinstance(plugin, Plugin):
        raise TypeError(f"expected a simjax.plugins.Plugin, got {type(plugin).__name__}")
    slot = _BY_NAME.get(plugin.name)
    if slot is not None:
        if _TABLE[slot] is plugin:
            return slot
        raise ValueError(f"a plugin named '{plugin.name}' is already registered")
    _TABLE.append(plugin)
    _BY_NAME[plugin.name] = len(_TABLE) - 1
    return len(_TABLE) - 1


def _ensure_builtin():
    if _STATE["builtin"]:
        return
    _STATE["builtin"] = True
    for mod in _BUILTIN_MODULES:
        for p in importlib.import_module(mod).PLUGINS:
            _add(p)


def _ensure_entry_points():
    if _STATE["entry_points"]:
        return
    _STATE["entry_points"] = True
    from importlib import metadata
    try:
        eps = metadata.entry_points(group=ENTRY_POINT_GROUP)
    except TypeError:  # Python < 3.10 API
        eps = metadata.entry_points().get(ENTRY_POINT_GROUP, [])
    for ep in eps:
        try:
            _register_any(ep.load())
        except Exception as err:  # a broken third-party package must not break loading
            warnings.warn(f"simjax plugin entry point '{ep.name}' failed to load: {err}",
                          RuntimeWarning)


def _register_any(obj):
    if isinstance(obj, Plugin):
        return [register(obj)]
    if isinstance(obj, (list, tuple)):
        return [s for o in obj for s in _register_any(o)]
    if callable(obj):
        out = obj()
        return _register_any(out) if out is not None else []
    raise TypeError(f"cannot register {obj!r} as a simjax plugin")


def register(plugin: Plugin) -> int:
    """Register ``plugin``; returns its slot. Registering the same object twice is a
    no-op; a different plugin under a registered name raises ValueError."""
    _ensure_builtin()
    return _add(plugin)


def load_library(module_or_path) -> list[str]:
    """Import a module (dotted name, module object or path to a .py file) and register
    the plugins it defines: every :class:`Plugin` in its ``PLUGINS`` list, or, without
    one, every module-level Plugin. Plugins it registers itself on import count too.
    Returns the names of the plugins registered (mj_loadPluginLibrary)."""
    _ensure_builtin()
    before = len(_TABLE)
    if isinstance(module_or_path, str) and (module_or_path.endswith(".py") or
                                             os.path.sep in module_or_path):
        path = os.path.abspath(module_or_path)
        if not os.path.exists(path):
            raise FileNotFoundError(f"plugin library '{module_or_path}' not found")
        name = "simjax_plugin_lib_" + os.path.splitext(os.path.basename(path))[0]
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    elif isinstance(module_or_path, str):
        module = importlib.import_module(module_or_path)
    else:
        module = module_or_path
    found = getattr(module, "PLUGINS", None)
    if found is None:
        found = [v for v in vars(module).values() if isinstance(v, Plugin)]
    for p in found:
        if p.name not in _BY_NAME:
            _add(p)
    return [p.name for p in _TABLE[before:]]


def unregister(name: str) -> None:
    """Remove a plugin registered by the user (its slot stays reserved). First-party
    plugins cannot be removed."""
    slot = _BY_NAME.get(name)
    if slot is None:
        return
    if _is_builtin(slot):
        raise ValueError(f"first-party plugin '{name}' cannot be unregistered")
    del _BY_NAME[name]


def _is_builtin(slot):
    return any(p is _TABLE[slot] for mod in _BUILTIN_MODULES
               for p in importlib.import_module(mod).PLUGINS)


def find(name: str) -> tuple[int, Plugin] | None:
    """(slot, plugin) of the plugin registered as ``name``, or None."""
    _ensure_builtin()
    _ensure_entry_points()
    slot = _BY_NAME.get(name)
    return None if slot is None else (slot, _TABLE[slot])


def at_slot(slot: int) -> Plugin:
    """The plugin in ``slot`` (Model.plugin[i])."""
    _ensure_builtin()
    _ensure_entry_points()
    return _TABLE[slot]


def names() -> list[str]:
    """Names of all registered plugins, by slot."""
    _ensure_builtin()
    _ensure_entry_points()
    return [p.name for i, p in enumerate(_TABLE) if _BY_NAME.get(p.name) == i]
