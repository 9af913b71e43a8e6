"""Engine plugins: custom actuators, sensors, passive forces and SDF shapes as pure JAX
functions with explicit state (MuJoCo's mjpPlugin).

``Plugin`` describes a plugin (see :mod:`simjax.plugins.protocol` for every function's
signature); ``register(plugin)`` adds it to the global table, ``load_library(module or
path)`` imports a module and registers its plugins, and packages can expose plugins
through the entry-point group ``simjax.plugins`` (discovered automatically). A model
declares the plugins it needs in ``<extension>``; per-instance parameters live in
``Model.plugin_params`` and time-dependent state in ``Data.plugin_state`` at
``Model.plugin_stateadr``.

First-party plugins, under MuJoCo's names: ``mujoco.pid`` (actuator),
``mujoco.sensor.touch_grid`` (sensor), ``mujoco.sdf.torus`` / ``bowl`` / ``gear`` /
``nut`` / ``bolt`` (SDF shapes) and ``mujoco.elasticity.cable`` (passive).
"""
from simjax.plugins.protocol import Capability, Config, Plugin, PluginInstance
from simjax.plugins.registry import (ENTRY_POINT_GROUP, at_slot, find, load_library, names,
                                     register, unregister)

__all__ = ["Capability", "Config", "Plugin", "PluginInstance", "register", "load_library",
           "unregister", "find", "at_slot", "names", "ENTRY_POINT_GROUP"]
