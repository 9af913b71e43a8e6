"""The engine-plugin protocol (mjpPlugin), as pure JAX functions.

A :class:`Plugin` bundles static attributes and pure functions. A plugin *instance*
(:class:`PluginInstance`, one per ``<instance>`` or per element that names a plugin
in place) is a model element: its configuration, the elements it backs, and where its
time-dependent state lives in ``Data.plugin_state`` are static Model structure; the
memoised per-instance data returned by ``init`` (weights, tables) are leaves of the
Model (``Model.plugin_params``), so they are vmappable and differentiable.

Function signatures (``m`` Model, ``d`` Data, ``inst`` PluginInstance, ``params`` the
instance's pytree from ``init``, ``state`` the instance's slice of ``d.plugin_state``,
shape (inst.statenum,)):

compile time (numpy, static; raise ``ValueError`` for invalid configurations, reported
as MJCFError at the element that created the instance):

- ``nstate(inst) -> int``: number of plugin_state slots (mjpPlugin.nstate);
- ``actdim(inst) -> int``: act slots per backed actuator, placed before the slot of a
  built-in ``dyntype`` (MuJoCo's actuator_actdim callback); default 0;
- ``nsensordata(inst, sensor_id) -> int``: dimension of each backed sensor;
- ``validate(inst, model)``: checks needing the compiled model (mjpPlugin.init errors);
- ``init(inst, model) -> params``: per-instance pytree (numpy or jax arrays);
- ``reset(inst, params) -> state``: initial plugin_state (default zeros);

run time (pure JAX, traced; called once per instance and stage):

- ``act_dot(m, d, inst, params, state) -> (len(inst.actuators), actdim)``: derivatives
  of the plugin's act slots; the engine integrates them (mjpPlugin.actuator_act_dot);
- ``compute(m, d, inst, params, state, capability)``: outputs of one stage:
  ``Capability.ACTUATOR`` -> actuator_force of the backed actuators
  (len(inst.actuators),); ``Capability.SENSOR`` -> sensordata of the backed sensors,
  concatenated in sensor order; ``Capability.PASSIVE`` -> generalised force (nv,) added
  to ``qfrc_passive`` (mjpPlugin.compute);
- ``advance(m, d, inst, params, state) -> state`` or ``(state, act)`` after integration
  (``act``: (len(inst.actuators), actdim) replacing the plugin's act slots);
- SDF: ``sdf_distance(params, point) -> ()`` signed distance in the geom's (mesh) frame;
  ``sdf_gradient(params, point) -> (3,)`` (default ``jax.grad`` of the distance);
  ``sdf_aabb(inst) -> (6,)`` center and half sizes (numpy); ``sdf_staticdistance(inst,
  points (n, 3)) -> (n,)`` numpy distances used by the compiler to mesh the shape.
"""
from __future__ import annotations

import dataclasses
import enum
from typing import Callable, Mapping

from simjax.types import Stage


class Capability(enum.IntFlag):
    """mjtPluginCapabilityBit."""

    ACTUATOR = 1
    SENSOR = 2
    PASSIVE = 4
    SDF = 8


@dataclasses.dataclass(frozen=True, eq=False)
class Plugin:
    """An engine plugin (mjpPlugin). See the module docstring for the function
    signatures. ``attributes``: the config keys it accepts, in declaration order (the
    order of mjModel.plugin_attr). ``needstage``: stage of its sensors."""

    name: str
    capabilities: Capability
    attributes: tuple = ()
    needstage: Stage = Stage.ACC
    nstate: Callable | None = None
    actdim: Callable | None = None
    nsensordata: Callable | None = None
    validate: Callable | None = None
    init: Callable | None = None
    reset: Callable | None = None
    act_dot: Callable | None = None
    compute: Callable | None = None
    advance: Callable | None = None
    sdf_distance: Callable | None = None
    sdf_gradient: Callable | None = None
    sdf_aabb: Callable | None = None
    sdf_staticdistance: Callable | None = None

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ValueError("a plugin needs a non-empty name")
        object.__setattr__(self, "capabilities", Capability(self.capabilities))
        object.__setattr__(self, "attributes", tuple(self.attributes))
        caps = self.capabilities
        if not caps:
            raise ValueError(f"plugin '{self.name}' declares no capability")
        if caps & (Capability.ACTUATOR | Capability.SENSOR | Capability.PASSIVE) and \
                self.compute is None:
            raise ValueError(f"plugin '{self.name}' needs a compute function")
        if caps & Capability.SENSOR and self.nsensordata is None:
            raise ValueError(f"sensor plugin '{self.name}' needs nsensordata")
        if caps & Capability.SDF and (self.sdf_distance is None or self.sdf_aabb is None):
            raise ValueError(f"sdf plugin '{self.name}' needs sdf_distance and sdf_aabb")


class Config(Mapping):
    """Read-only configuration of an instance: key -> string value, as written in
    ``<config key= value=>``, restricted to the plugin's declared attributes."""

    def __init__(self, items=()):
        self._items = tuple(items)
        self._d = dict(self._items)

    def __getitem__(self, key):
        return self._d[key]

    def __iter__(self):
        return iter(self._d)

    def __len__(self):
        return len(self._d)

    def __hash__(self):
        return hash(self._items)

    def __eq__(self, other):
        return isinstance(other, Config) and self._items == other._items

    def __repr__(self):
        return f"Config({self._d})"

    def float(self, key, default=None):
        """Value of ``key`` as a float (``default`` when absent or empty); ValueError
        naming the key for anything that is not a number."""
        v = self._d.get(key, "")
        if v.strip() == "":
            return default
        try:
            return float(v)
        except ValueError:
            raise ValueError(f"config '{key}': '{v}' is not a number") from None

    def floats(self, key, n=None, default=None):
        """Value of ``key`` as a tuple of floats (``n`` of them when given)."""
        v = self._d.get(key, "")
        if v.strip() == "":
            return default
        try:
            out = tuple(float(x) for x in v.split())
        except ValueError:
            raise ValueError(f"config '{key}': '{v}' is not a list of numbers") from None
        if n is not None and len(out) != n:
            raise ValueError(f"config '{key}' needs {n} numbers, got '{v}'")
        return out

    def int(self, key, default=None):
        """Value of ``key`` as an integer."""
        v = self._d.get(key, "")
        if v.strip() == "":
            return default
        try:
            return int(v)
        except ValueError:
            raise ValueError(f"config '{key}': '{v}' is not an integer") from None


@dataclasses.dataclass(frozen=True)
class PluginInstance:
    """A plugin instance (static Model structure; hashable).

    ``id``: instance id (index into Model.plugin*); ``plugin``: the plugin's name;
    ``config``: its :class:`Config`; ``actuators`` / ``sensors`` / ``bodies`` /
    ``geoms`` / ``meshes``: ids of the elements it backs, in id order; ``stateadr``,
    ``statenum``: its slice of Data.plugin_state; ``actdim``: plugin act slots per
    actuator; ``sensor_adr`` / ``sensor_dim``: sensordata address and size of each
    backed sensor.
    """

    id: int
    name: str
    plugin: str
    config: Config
    actuators: tuple = ()
    sensors: tuple = ()
    bodies: tuple = ()
    geoms: tuple = ()
    meshes: tuple = ()
    stateadr: int = 0
    statenum: int = 0
    actdim: int = 0
    sensor_adr: tuple = ()
    sensor_dim: tuple = ()

    def state(self, plugin_state):
        """This instance's slice of ``plugin_state`` (statenum,)."""
        return plugin_state[self.stateadr:self.stateadr + self.statenum]

