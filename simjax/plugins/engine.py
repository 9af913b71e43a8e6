"""Where plugins enter the pipeline (pure JAX; called by the engine stages).

Each hook loops over the model's plugin *instances* (static, few: one instance may
back any number of elements and computes them in one call), never over elements.
Same order and semantics as MuJoCo:

- :func:`init_state`: initial ``plugin_state`` (mj_resetData -> mjpPlugin.reset);
- :func:`actuator_act_dot`: act_dot of the plugins' own act slots, after the built-in
  activation dynamics (mj_fwdActuation -> actuator_act_dot);
- :func:`compute_actuators`: actuator_force of plugin actuators, after built-in
  forces and before force clamping (mj_fwdActuation -> compute(mjPLUGIN_ACTUATOR));
- :func:`compute_passive`: forces added to qfrc_passive at the end of mj_passive;
- :func:`compute_sensors`: plugin sensordata and cutoff (mj_sensorPos/Vel/Acc);
- :func:`advance`: after integration, in mj_advance (mjpPlugin.advance).
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from simjax.engine.inline import outside
from simjax.plugins import registry
from simjax.plugins.protocol import Capability
from simjax.types import DisableBit, Stage


def _instances(m, capability=None):
    """(spec, plugin, params, ) for the model's instances with ``capability``."""
    out = []
    for spec in getattr(m, "plugin_specs", ()):
        plugin = registry.at_slot(int(np.asarray(m.plugin)[spec.id]))
        if capability is None or plugin.capabilities & capability:
            out.append((spec, plugin, m.plugin_params[spec.id]))
    return out


def _state(d, spec):
    return d.plugin_state[spec.stateadr:spec.stateadr + spec.statenum]


def init_state(m, dtype):
    """(npluginstate,) initial plugin_state: each instance's ``reset`` or zeros."""
    parts = []
    for spec, plugin, params in _instances(m):
        if not spec.statenum:
            continue
        if plugin.reset is None:
            parts.append(jnp.zeros(spec.statenum, dtype))
        else:
            s = jnp.asarray(plugin.reset(spec, params), dtype).reshape(spec.statenum)
            parts.append(s)
    if not parts:
        return jnp.zeros(m.npluginstate, dtype)
    return jnp.concatenate(parts)


def _act_index(m, spec):
    """(len(actuators), actdim) static act addresses of the plugin's own slots."""
    adr = np.asarray(m.actuator_actadr)[list(spec.actuators)]
    return adr[:, None] + np.arange(spec.actdim)[None, :]


def actuator_act_dot(m, d, act_dot):
    """act_dot (na,) with the plugin slots of plugin actuators set: by the plugin's
    ``act_dot`` or to zero (MuJoCo zeroes every slot of a stateful actuator first)."""
    if not m.na:
        return act_dot
    d = d.replace(act_dot=act_dot)
    for spec, plugin, params in _instances(m, Capability.ACTUATOR):
        if not spec.actdim or not spec.actuators:
            continue
        idx = _act_index(m, spec)
        if plugin.act_dot is None:
            vals = jnp.zeros(idx.shape, act_dot.dtype)
        else:
            vals = jnp.asarray(outside(plugin.act_dot)(m, d, spec, params, _state(d, spec)),
                               act_dot.dtype).reshape(idx.shape)
        act_dot = act_dot.at[idx.ravel()].set(vals.ravel())
        d = d.replace(act_dot=act_dot)
    return act_dot


def compute_actuators(m, d, force):
    """actuator_force (nu,) with plugin actuators' forces from their instances."""
    for spec, plugin, params in _instances(m, Capability.ACTUATOR):
        if not spec.actuators:
            continue
        f = outside(plugin.compute)(m, d, spec, params, _state(d, spec), Capability.ACTUATOR)
        f = jnp.asarray(f, force.dtype).reshape(len(spec.actuators))
        force = force.at[np.asarray(spec.actuators)].set(f)
    return force


def compute_passive(m, d):
    """Data with the passive-force plugins' generalised forces added to qfrc_passive."""
    inst = _instances(m, Capability.PASSIVE)
    if not inst or not m.nv:
        return d
    total = d.qfrc_passive
    for spec, plugin, params in inst:
        f = outside(plugin.compute)(m, d, spec, params, _state(d, spec), Capability.PASSIVE)
        total = total + jnp.asarray(f, total.dtype).reshape(m.nv)
    return d.replace(qfrc_passive=total)


def compute_sensors(m, d, stage=None):
    """Data with plugin sensors' sensordata (all stages, or only ``stage``; a plugin
    with needstage NONE counts as POS) and their cutoff applied. Skipped when sensors
    are disabled."""
    if m.opt.disableflags & DisableBit.SENSOR:
        return d
    data = d.sensordata
    for spec, plugin, params in _instances(m, Capability.SENSOR):
        need = Stage(plugin.needstage)
        need = Stage.POS if need == Stage.NONE else need
        if (stage is not None and need != stage) or not spec.sensors:
            continue
        vals = outside(plugin.compute)(m, d, spec, params, _state(d, spec), Capability.SENSOR)
        idx = np.concatenate([a + np.arange(n) for a, n in zip(spec.sensor_adr,
                                                                spec.sensor_dim)])
        vals = jnp.asarray(vals, data.dtype).reshape(len(idx))
        cutoff = jnp.asarray(m.sensor_cutoff, data.dtype)[
            np.repeat(np.asarray(spec.sensors), spec.sensor_dim)]
        vals = jnp.where(cutoff > 0, jnp.clip(vals, -cutoff, cutoff), vals)
        data = data.at[idx].set(vals)
        d = d.replace(sensordata=data)
    return d


def advance(m, d):
    """Data after the plugins' ``advance`` (called after integration): new
    plugin_state and, for actuator plugins that return it, new plugin act slots."""
    for spec, plugin, params in _instances(m):
        if plugin.advance is None:
            continue
        out = outside(plugin.advance)(m, d, spec, params, _state(d, spec))
        act = None
        if isinstance(out, tuple):
            out, act = out
        if spec.statenum:
            new = jnp.asarray(out, d.plugin_state.dtype).reshape(spec.statenum)
            d = d.replace(plugin_state=d.plugin_state.at[
                spec.stateadr:spec.stateadr + spec.statenum].set(new))
        if act is not None and spec.actdim and spec.actuators:
            idx = _act_index(m, spec)
            act = jnp.asarray(act, d.act.dtype).reshape(idx.shape)
            d = d.replace(act=d.act.at[idx.ravel()].set(act.ravel()))
    return d
