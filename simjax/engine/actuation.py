"""Actuation: transmissions, activation dynamics and actuator forces.

Implements the common subset of MuJoCo's mj_transmission and mj_fwdActuation:

- transmissions: joint and joint-in-parent (hinge, slide, ball, free) and (fixed)
  tendon;
- dynamics: none, integrator, filter, filterexact (one activation per actuator);
- gain: fixed, affine; bias: none, affine (covers motor, position, velocity,
  intvelocity, damper, general affine actuators);
- control clamping, bad-control reset, actuator group disabling, tendon and actuator
  force clamping, joint-level actuator force limits, actuator gravity compensation.

Other actuator features (muscles, PID / DC-motor / SO3 types, slider-crank, site and
body transmissions, delays, plugins, multi-input actuators) raise
UnsupportedFeatureError when the model is traced.
"""
from __future__ import annotations

import dataclasses
import hashlib

import jax.numpy as jnp
import numpy as np

from simjax.engine import math
from simjax.engine.data import WARN_BADCTRL
from simjax.plugins import engine as plugins
from simjax.errors import UnsupportedFeatureError
from simjax.types import DisableBit, JointType, TrnType

# MuJoCo enum values of the supported types
_DYN_NONE, _DYN_INTEGRATOR, _DYN_FILTER, _DYN_FILTEREXACT = 0, 1, 2, 3
_GAIN_FIXED, _GAIN_AFFINE = 0, 1
_BIAS_NONE, _BIAS_AFFINE = 0, 1

_CACHE: dict = {}


@dataclasses.dataclass(frozen=True, eq=False)
class ActTables:
    """Static actuator tables (numpy)."""

    kind: np.ndarray        # (nu,) 0 scalar joint, 1 ball, 2 free, 3 tendon
    inparent: np.ndarray    # (nu,) bool: joint-in-parent transmission
    target: np.ndarray      # (nu,) joint or tendon id
    qadr: np.ndarray        # (nu,) qpos address of the target joint (0 for tendons)
    place: np.ndarray       # (nu, 6, nv) one-hot placement of joint moments
    actadr: np.ndarray      # (nu,) activation address, -1 if stateless
    act_owner: np.ndarray   # (na,) actuator of each activation
    dyntype: np.ndarray
    gaintype: np.ndarray
    biastype: np.ndarray
    actearly: np.ndarray
    group: np.ndarray


def tables(m) -> ActTables:
    """Checked, cached actuator tables for ``m``."""
    names = ("actuator_trntype", "actuator_dyntype", "actuator_gaintype",
             "actuator_biastype", "actuator_trnid", "actuator_actadr", "actuator_actnum",
             "actuator_ctrlnum", "actuator_outnum", "actuator_plugin", "actuator_history",
             "jnt_type", "jnt_qposadr", "jnt_dofadr")
    key = (m.nu, m.nv, m.na, m.nout, m.nactuator) + tuple(
        hashlib.sha1(np.ascontiguousarray(getattr(m, n)).tobytes()).hexdigest()
        for n in names)
    tab = _CACHE.get(key)
    if tab is None:
        tab = _CACHE[key] = _build(m)
    return tab


def _unsupported(what):
    raise UnsupportedFeatureError(f"actuator {what}")


def _build(m) -> ActTables:
    nu = m.nu
    if nu != m.nactuator or nu != m.nout:
        _unsupported("with several controls or outputs")
    trntype = np.asarray(m.actuator_trntype)
    dyn = np.asarray(m.actuator_dyntype)
    gain = np.asarray(m.actuator_gaintype)
    bias = np.asarray(m.actuator_biastype)
    for i in range(nu):
        if trntype[i] not in (TrnType.JOINT, TrnType.JOINTINPARENT, TrnType.TENDON):
            _unsupported(f"transmission type {int(trntype[i])}")
        if dyn[i] not in (_DYN_NONE, _DYN_INTEGRATOR, _DYN_FILTER, _DYN_FILTEREXACT):
            _unsupported(f"dynamics type {int(dyn[i])}")
        if gain[i] not in (_GAIN_FIXED, _GAIN_AFFINE):
            _unsupported(f"gain type {int(gain[i])}")
        if bias[i] not in (_BIAS_NONE, _BIAS_AFFINE):
            _unsupported(f"bias type {int(bias[i])}")
    if nu and np.any(np.asarray(m.actuator_history).reshape(nu, 2)[:, 0] > 0):
        _unsupported("delay / history buffers")
    if nu and (np.any(np.asarray(m.actuator_ctrlnum) != 1) or
               np.any(np.asarray(m.actuator_outnum) != 1)):
        _unsupported("with several controls or outputs")
    actnum = np.asarray(m.actuator_actnum)
    # plugin actuators keep their own act slots before the dyntype slot
    if nu and np.any((actnum > 1) & (np.asarray(m.actuator_plugin) < 0)):
        _unsupported("with several activation variables")

    trnid = np.asarray(m.actuator_trnid).reshape(nu, 2)[:, 0]
    jtype = np.asarray(m.jnt_type)
    kind = np.zeros(nu, np.int64)
    qadr = np.zeros(nu, np.int64)
    place = np.zeros((nu, 6, m.nv))
    for i in range(nu):
        if trntype[i] == TrnType.TENDON:
            kind[i] = 3
            continue
        j = trnid[i]
        qadr[i] = m.jnt_qposadr[j]
        dadr = m.jnt_dofadr[j]
        t = jtype[j]
        kind[i] = {JointType.HINGE: 0, JointType.SLIDE: 0, JointType.BALL: 1,
                   JointType.FREE: 2}[int(t)]
        for k in range({0: 1, 1: 3, 2: 6}[kind[i]]):
            place[i, k, dadr + k] = 1.0
    actadr = np.asarray(m.actuator_actadr) if nu else np.zeros(0, np.int64)
    owner = np.zeros(m.na, np.int64)
    for i in range(nu):
        if actadr[i] >= 0:
            owner[actadr[i]:actadr[i] + actnum[i]] = i
    return ActTables(kind=kind, inparent=trntype == TrnType.JOINTINPARENT, target=trnid,
                     qadr=qadr, place=place, actadr=actadr, act_owner=owner, dyntype=dyn,
                     gaintype=gain, biastype=bias,
                     actearly=np.asarray(m.actuator_actearly, bool),
                     group=np.asarray(m.actuator_group))


def _gear(m, dtype):
    return jnp.asarray(m.actuator_gear, dtype).reshape(-1, 6)


def transmission(m, d):
    """Actuator lengths (nu,) and dense moment arms (nu, nv) (mj_transmission)."""
    if not m.nu:
        return d
    tab = tables(m)
    dtype = d.qpos.dtype
    gear = _gear(m, dtype)
    kind = tab.kind
    local = jnp.zeros((m.nu, 6), dtype).at[:, 0].set(gear[:, 0])
    length = jnp.zeros(m.nu, dtype)
    if np.any(kind == 0):
        length = jnp.where(kind == 0, d.qpos[tab.qadr] * gear[:, 0], length)
    if np.any((kind == 1) | (kind == 2)):
        # ball: quaternion at qadr; free: quaternion after the position
        off = np.where(kind == 2, 3, 0)
        qi = np.minimum((tab.qadr + off)[:, None] + np.arange(4), m.nq - 1)
        quat = math.quat_normalize(d.qpos[qi])
        gsrc = jnp.where((kind == 2)[:, None], gear[:, 3:], gear[:, :3])
        gaxis = jnp.where(tab.inparent[:, None],
                          math.rot_vec_quat(gsrc, math.quat_neg(quat)), gsrc)
        ball_len = math.dot(math.quat_to_vel(quat), gaxis)
        length = jnp.where(kind == 1, ball_len, length)
        ball_local = jnp.concatenate([gaxis, jnp.zeros_like(gaxis)], -1)
        free_local = jnp.concatenate([gear[:, :3], gaxis], -1)
        local = jnp.where((kind == 1)[:, None], ball_local, local)
        local = jnp.where((kind == 2)[:, None], free_local, local)
    moment = jnp.einsum("ak,akv->av", local, jnp.asarray(tab.place, dtype))
    if np.any(kind == 3):
        tid = np.where(kind == 3, tab.target, 0)
        ten = kind == 3
        length = jnp.where(ten, d.ten_length[tid] * gear[:, 0], length)
        moment = jnp.where(ten[:, None], d.ten_J[tid] * gear[:, :1], moment)
    return d.replace(actuator_length=length, actuator_moment=moment)


def _disabled_mask(m):
    """(nu,) bool: actuator disabled through opt.disableactuator groups."""
    group = np.asarray(m.actuator_group)
    bits = int(m.opt.disableactuator)
    ok = (group >= 0) & (group <= 30)
    return ok & ((bits >> np.clip(group, 0, 30)) & 1).astype(bool)


def next_activation(m, act, act_dot):
    """Activations after one timestep (mj_nextActivation), vectorised over na.

    filterexact integrates exactly, others by Euler; limited activations are clamped.
    """
    tab = tables(m)
    dtype = act.dtype
    own = tab.act_owner
    h = jnp.asarray(m.opt.timestep, dtype)
    dynprm = jnp.asarray(m.actuator_dynprm, dtype).reshape(m.nu, -1)
    tau = jnp.maximum(math.MINVAL, dynprm[own, 0])
    exact = tab.dyntype[own] == _DYN_FILTEREXACT
    new = jnp.where(exact, act + act_dot * tau * (1 - jnp.exp(-h / tau)), act + act_dot * h)
    limited = np.asarray(m.actuator_actlimited, bool)[own]
    if limited.any():
        rng = jnp.asarray(m.actuator_actrange, dtype).reshape(m.nu, 2)[own]
        new = jnp.where(limited, jnp.clip(new, rng[:, 0], rng[:, 1]), new)
    return new


def actuation(m, d):
    """Actuator forces and activation derivatives (mj_fwdActuation).

    Sets act_dot (na,), actuator_force (nu,) in actuator space and qfrc_actuator (nv,).
    """
    dtype = d.qpos.dtype
    if not m.nu or (m.opt.disableflags & DisableBit.ACTUATION):
        return d.replace(actuator_force=jnp.zeros(m.nout, dtype),
                         qfrc_actuator=jnp.zeros(m.nv, dtype),
                         act_dot=jnp.zeros(m.na, dtype))
    tab = tables(m)
    ctrl = d.ctrl
    if not (m.opt.disableflags & DisableBit.CLAMPCTRL):
        limited = np.asarray(m.actuator_ctrllimited, bool)
        if limited.any():
            rng = jnp.asarray(m.actuator_ctrlrange, dtype).reshape(m.nu, 2)
            ctrl = jnp.where(limited, jnp.clip(ctrl, rng[:, 0], rng[:, 1]), ctrl)
    bad = jnp.any(jnp.isnan(ctrl) | (jnp.abs(ctrl) > 1e10))
    ctrl = jnp.where(bad, 0.0, ctrl)
    warning = d.warning.at[WARN_BADCTRL].add(bad.astype(d.warning.dtype))

    # activation dynamics
    act_dot = jnp.zeros(m.na, dtype)
    if m.na:
        own = tab.act_owner
        dynprm = jnp.asarray(m.actuator_dynprm, dtype).reshape(m.nu, -1)
        tau = jnp.maximum(math.MINVAL, dynprm[own, 0])
        integ = tab.dyntype[own] == _DYN_INTEGRATOR
        act_dot = jnp.where(integ, ctrl[own], (ctrl[own] - d.act) / tau)
        act_dot = jnp.where(tab.dyntype[own] == _DYN_NONE, 0.0, act_dot)
        if m.nplugin:
            act_dot = plugins.actuator_act_dot(m, d.replace(ctrl=ctrl), act_dot)

    # force = gain * input + bias
    length, velocity = d.actuator_length, d.actuator_velocity
    gainprm = jnp.asarray(m.actuator_gainprm, dtype).reshape(m.nu, -1)
    biasprm = jnp.asarray(m.actuator_biasprm, dtype).reshape(m.nu, -1)
    gain = jnp.where(tab.gaintype == _GAIN_AFFINE,
                     gainprm[:, 0] + gainprm[:, 1] * length + gainprm[:, 2] * velocity,
                     gainprm[:, 0])
    inp = ctrl
    stateful = tab.actadr >= 0
    if stateful.any():
        adr = np.where(stateful, tab.actadr, 0)
        act = d.act[adr]
        if tab.actearly.any():
            nxt = next_activation(m, d.act, act_dot)[adr]
            act = jnp.where(tab.actearly, nxt, act)
        inp = jnp.where(stateful, act, ctrl)
    bias = jnp.where(tab.biastype == _BIAS_AFFINE,
                     biasprm[:, 0] + biasprm[:, 1] * length + biasprm[:, 2] * velocity, 0.0)
    force = gain * inp + bias
    disabled = _disabled_mask(m)
    if disabled.any():
        force = jnp.where(disabled, 0.0, force)
    if m.nplugin:
        force = plugins.compute_actuators(m, d.replace(act_dot=act_dot), force)
    force = _clamp_tendon_force(m, force, tab, dtype)
    flim = np.asarray(m.actuator_forcelimited, bool)
    if flim.any():
        rng = jnp.asarray(m.actuator_forcerange, dtype).reshape(m.nu, 2)
        force = jnp.where(flim, jnp.clip(force, rng[:, 0], rng[:, 1]), force)

    qfrc = force @ d.actuator_moment
    qfrc = _actuator_gravcomp(m, d, qfrc)
    jlim = np.asarray(m.jnt_actfrclimited, bool)
    if m.njnt and jlim.any():
        dof = np.asarray(m.jnt_dofadr)[jlim]
        rng = jnp.asarray(m.jnt_actfrcrange, dtype).reshape(m.njnt, 2)[jlim]
        limited = np.zeros(m.nv, bool)
        limited[dof] = True
        lo = jnp.full(m.nv, -jnp.inf, dtype).at[dof].set(rng[:, 0])
        hi = jnp.full(m.nv, jnp.inf, dtype).at[dof].set(rng[:, 1])
        qfrc = jnp.where(limited, jnp.clip(qfrc, lo, hi), qfrc)
    return d.replace(act_dot=act_dot, actuator_force=force, qfrc_actuator=qfrc,
                     warning=warning)


def _clamp_tendon_force(m, force, tab, dtype):
    """Scale tendon-transmission forces so each tendon's total is within its range."""
    if not m.ntendon:
        return force
    limited = np.asarray(m.tendon_actfrclimited, bool)
    ten = (tab.kind == 3) & limited[np.where(tab.kind == 3, tab.target, 0)]
    if not ten.any():
        return force
    onehot = np.zeros((m.ntendon, m.nu))
    onehot[tab.target[ten], np.nonzero(ten)[0]] = 1.0
    total = jnp.asarray(onehot, dtype) @ force            # per-tendon total force
    rng = jnp.asarray(m.tendon_actfrcrange, dtype).reshape(m.ntendon, 2)
    safe = jnp.where(total == 0, 1.0, total)
    scale = jnp.where(total < rng[:, 0], rng[:, 0] / safe,
                      jnp.where(total > rng[:, 1], rng[:, 1] / safe, 1.0))
    scale = jnp.where(total == 0, 1.0, scale)
    tid = np.where(ten, tab.target, 0)
    return jnp.where(ten, force * scale[tid], force)


def _actuator_gravcomp(m, d, qfrc):
    """Add gravity compensation of joints flagged jnt_actgravcomp to qfrc_actuator."""
    if not m.ngravcomp or (m.opt.disableflags & DisableBit.GRAVITY) or not m.njnt:
        return qfrc
    actgc = np.asarray(m.jnt_actgravcomp, bool)[np.asarray(m.dof_jntid)]
    if not actgc.any():
        return qfrc
    return qfrc + jnp.where(actgc, d.qfrc_gravcomp, 0.0)
