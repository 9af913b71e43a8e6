"""``mujoco.pid``: a PID controller actuator (MuJoCo's plugin/actuator/pid.cc).

Config: ``kp``, ``ki``, ``kd`` (gains, default 0), ``imax`` (clamp of the integral
term, in force units), ``slewmax`` (maximum setpoint rate, units/s). Force on each
backed actuator (semantics of MuJoCo's plugin README):

    force = kp * e + kd * (d setpoint/dt - actuator_velocity) + ki * clamp(I + e h)

with e = setpoint - actuator_length, h the timestep. The setpoint is ``ctrl``
(clamped to ctrlrange) or, when the actuator has a dyntype, its last act slot. The
integral I (when ki != 0) and the previous setpoint (when slewmax is set) live in the
actuator's act slots (integral first), so the engine integrates them: their act_dot
is (new value - act) / h. An actuator needs actdim = (ki != 0) + (slewmax given) +
(1 if it has a stateful dyntype).

Parameters (leaves of Model.plugin_params, differentiable): kp, ki, kd, imax (the
integral bound, imax / ki), slewmax.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from simjax.plugins.protocol import Capability, Plugin
from simjax.types import Stage

_DYN_NONE, _DYN_FILTEREXACT = 0, 3


def _flags(inst):
    ki = inst.config.float("ki", 0.0)
    return ki != 0.0, inst.config.float("slewmax") is not None


def _actdim(inst):
    has_i, has_slew = _flags(inst)
    return int(has_i) + int(has_slew)


def _validate(inst, model):
    cfg = inst.config
    for key in ("kp", "kd", "ki"):
        cfg.float(key, 0.0)
    imax = cfg.float("imax")
    ki = cfg.float("ki", 0.0)
    if imax is not None and ki and imax / ki < 0:
        raise ValueError("negative imax")
    if (cfg.float("slewmax") or 0.0) < 0:
        raise ValueError("slewmax must be non-negative")
    if not inst.actuators:
        raise ValueError(f"actuator not found for plugin instance {inst.id}")


def _init(inst, model):
    cfg = inst.config
    ki = cfg.float("ki", 0.0)
    imax = cfg.float("imax")
    return dict(kp=np.float64(cfg.float("kp", 0.0)), ki=np.float64(ki),
                kd=np.float64(cfg.float("kd", 0.0)),
                imax=np.float64(imax / ki if (imax is not None and ki) else np.inf),
                slewmax=np.float64(cfg.float("slewmax", 0.0)))


class _Tab:
    """Static per-instance tables of the backed actuators."""

    def __init__(self, m, inst):
        a = np.asarray(inst.actuators)
        self.a = a
        self.dyn = np.asarray(m.actuator_dyntype)[a]
        adr = np.asarray(m.actuator_actadr)[a]
        self.first = np.maximum(adr, 0)
        self.last = np.maximum(adr + np.asarray(m.actuator_actnum)[a] - 1, 0)
        self.limited = np.asarray(m.actuator_ctrllimited, bool)[a]
        self.actearly = np.asarray(m.actuator_actearly, bool)[a]
        self.actlimited = np.asarray(m.actuator_actlimited, bool)[a]
        self.has_i, self.has_slew = _flags(inst)


def _next_act(m, d, tab, dtype):
    """Next value of the last act slot (pid.cc NextActivation)."""
    h = jnp.asarray(m.opt.timestep, dtype)
    act, act_dot = d.act[tab.last], d.act_dot[tab.last]
    tau = jnp.maximum(1e-15, jnp.asarray(m.actuator_dynprm, dtype).reshape(m.nu, -1)[tab.a, 0])
    new = jnp.where(tab.dyn == _DYN_FILTEREXACT, act + act_dot * tau * (1 - jnp.exp(-h / tau)),
                    act + act_dot * h)
    if tab.actlimited.any():
        rng = jnp.asarray(m.actuator_actrange, dtype).reshape(m.nu, 2)[tab.a]
        new = jnp.where(tab.actlimited, jnp.clip(new, rng[:, 0], rng[:, 1]), new)
    return new


def _setpoint(m, d, tab, params, actearly):
    dtype = d.qpos.dtype
    ctrl = d.ctrl[tab.a]
    if tab.limited.any():
        rng = jnp.asarray(m.actuator_ctrlrange, dtype).reshape(m.nu, 2)[tab.a]
        ctrl = jnp.where(tab.limited, jnp.clip(ctrl, rng[:, 0], rng[:, 1]), ctrl)
    if m.na and (tab.dyn != _DYN_NONE).any():
        from_act = d.act[tab.last]
        if actearly and tab.actearly.any():
            from_act = jnp.where(tab.actearly, _next_act(m, d, tab, dtype), from_act)
        ctrl = jnp.where(tab.dyn == _DYN_NONE, ctrl, from_act)
    if tab.has_slew:
        prev = d.act[tab.first + int(tab.has_i)]
        step = params["slewmax"] * jnp.asarray(m.opt.timestep, dtype)
        clipped = jnp.clip(ctrl, prev - step, prev + step)
        ctrl = jnp.where(d.time > 0, clipped, ctrl)   # previous setpoint exists
    return ctrl


def _integral(m, d, tab, params, error):
    h = jnp.asarray(m.opt.timestep, error.dtype)
    integral = d.act[tab.first] + error * h
    return jnp.clip(integral, -params["imax"], params["imax"])


def _act_dot(m, d, inst, params, state):
    tab = _Tab(m, inst)
    h = jnp.asarray(m.opt.timestep, d.qpos.dtype)
    ctrl = _setpoint(m, d, tab, params, actearly=False)
    cols = []
    if tab.has_i:
        error = ctrl - d.actuator_length[tab.a]
        cols.append((_integral(m, d, tab, params, error) - d.act[tab.first]) / h)
    if tab.has_slew:
        cols.append((ctrl - d.act[tab.first + int(tab.has_i)]) / h)
    return jnp.stack(cols, axis=-1)


def _compute(m, d, inst, params, state, capability):
    tab = _Tab(m, inst)
    ctrl = _setpoint(m, d, tab, params, actearly=True)
    error = ctrl - d.actuator_length[tab.a]
    ctrl_dot = jnp.zeros_like(ctrl)
    if m.na and (tab.dyn != _DYN_NONE).any():
        ctrl_dot = jnp.where(tab.dyn == _DYN_NONE, 0.0, d.act_dot[tab.last])
    error_dot = ctrl_dot - d.actuator_velocity[tab.a]
    force = params["kp"] * error + params["kd"] * error_dot
    if tab.has_i:
        force = force + params["ki"] * _integral(m, d, tab, params, error)
    return force


PID = Plugin(name="mujoco.pid", capabilities=Capability.ACTUATOR,
             attributes=("kp", "ki", "kd", "imax", "slewmax"), needstage=Stage.NONE,
             nstate=lambda inst: 0, actdim=_actdim, validate=_validate, init=_init,
             act_dot=_act_dot, compute=_compute)

PLUGINS = [PID]
