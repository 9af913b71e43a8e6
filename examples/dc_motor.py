"""A DC motor actuator and a thermometer sensor backed by one stateful plugin instance.

The motor is driven by a voltage (ctrl): current i = (V - K w) / R, torque = K i.
Its winding temperature T (Data.plugin_state, one slot per motor) heats with the
Joule losses and cools towards ambient:  C dT/dt = i^2 R - (T - T_amb) / R_th,
integrated after each step in ``advance``. The resistance rises with temperature,
R = R0 (1 + alpha (T - T_amb)), so the thermal state feeds back into the torque. The
thermometer sensor (same instance) reads the temperatures.

Config: ``resistance`` R0 [ohm], ``constant`` K [N m / A], ``capacity`` C [J/K],
``thermal_resistance`` R_th [K/W], ``ambient`` T_amb [deg C], ``alpha`` [1/K].
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

import simjax
from simjax.plugins import Capability, Plugin

NAME = "example.dc_motor"
_DEFAULTS = dict(resistance=2.0, constant=0.05, capacity=5.0, thermal_resistance=3.0,
                 ambient=25.0, alpha=0.004)


def _init(inst, model):
    out = {}
    for key, default in _DEFAULTS.items():
        out[key] = np.float64(inst.config.float(key, default))
    return out


def _validate(inst, model):
    p = _init(inst, model)
    for key in ("resistance", "capacity", "thermal_resistance"):
        if p[key] <= 0:
            raise ValueError(f"{key} must be positive")
    if not inst.actuators:
        raise ValueError("the instance backs no motor")


def _current(m, d, inst, params, temp):
    a = np.asarray(inst.actuators)
    r = params["resistance"] * (1 + params["alpha"] * (temp - params["ambient"]))
    return (d.ctrl[a] - params["constant"] * d.actuator_velocity[a]) / r, r


def _compute(m, d, inst, params, state, capability):
    if capability == Capability.ACTUATOR:
        i, _ = _current(m, d, inst, params, state)
        return params["constant"] * i
    return state            # thermometer: the temperatures


def _advance(m, d, inst, params, state):
    i, r = _current(m, d, inst, params, state)
    h = jnp.asarray(m.opt.timestep, state.dtype)
    heat = i * i * r - (state - params["ambient"]) / params["thermal_resistance"]
    return state + h * heat / params["capacity"]


PLUGIN = Plugin(
    name=NAME, capabilities=Capability.ACTUATOR | Capability.SENSOR,
    attributes=tuple(_DEFAULTS), needstage=simjax.Stage.POS,
    nstate=lambda inst: len(inst.actuators),
    nsensordata=lambda inst, sensor: len(inst.actuators),
    validate=_validate, init=_init,
    reset=lambda inst, params: jnp.full(len(inst.actuators), params["ambient"]),
    compute=_compute, advance=_advance)
PLUGINS = [PLUGIN]


def register():
    if simjax.plugins.find(NAME) is None:
        simjax.plugins.register(PLUGIN)
    return PLUGIN


XML = f"""<mujoco>
  <option timestep="0.002"/>
  <extension><plugin plugin="{NAME}"><instance name="motor">
    <config key="resistance" value="1.5"/><config key="ambient" value="20"/>
  </instance></plugin></extension>
  <worldbody><body><joint name="shaft" axis="0 0 1" damping=".01"/>
    <geom type="cylinder" size=".05 .02" mass=".3"/></body></worldbody>
  <actuator><plugin joint="shaft" instance="motor"/></actuator>
  <sensor><plugin name="thermometer" instance="motor"/></sensor>
</mujoco>"""
