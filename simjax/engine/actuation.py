"""Actuation: transmissions, activation dynamics and actuator forces.

Implements MuJoCo 4.0's mj_transmission and mj_fwdActuation for single-input,
single-output actuators:

- transmissions: joint and joint-in-parent (hinge, slide, ball, free), tendon (fixed and
  spatial), site (with and without a reference site), slider-crank, and body (adhesion:
  the average contact-normal Jacobian of the body's contacts in ``Data.contact``);
- dynamics: none, integrator, filter, filterexact, muscle (one activation per actuator);
- gain: fixed, affine, muscle; bias: none, affine, muscle (mju_muscleGain,
  mju_muscleBias, mju_muscleDynamics);
- control clamping, bad-control reset, actuator group disabling, activation clamping,
  actearly, tendon and actuator force clamping, joint-level actuator force limits,
  actuator gravity compensation, and the setpoint wrapping MuJoCo 4.0 applies to
  position servos on ball joints and on purely rotational site+refsite transmissions;
- delayed controls (``actuator_delay`` with a history buffer, :mod:`history`).

Other actuator features raise UnsupportedFeatureError naming them when the model is
traced: DC-motor, PID and SO(3) actuators (dyntype/gaintype/biastype dcmotor, pid, so3,
transmission so3), user callbacks and actuators with several
controls or outputs, or several activations (except plugin actuators, which
:mod:`simjax.plugins.engine` drives).
"""
from __future__ import annotations

import dataclasses
import hashlib

import jax.numpy as jnp
import numpy as np

from simjax.engine import history
from simjax.engine import math
from simjax.engine import tables as tables_mod
from simjax.engine.data import WARN_BADCTRL
from simjax.plugins import engine as plugins
from simjax.errors import UnsupportedFeatureError
from simjax.types import BiasType, DisableBit, DynType, GainType, JointType, TrnType

# MuJoCo enum values of the supported types
_DYN_NONE, _DYN_INTEGRATOR, _DYN_FILTER, _DYN_FILTEREXACT, _DYN_MUSCLE = 0, 1, 2, 3, 4
_GAIN_FIXED, _GAIN_AFFINE, _GAIN_MUSCLE = 0, 1, 2
_BIAS_NONE, _BIAS_AFFINE, _BIAS_MUSCLE = 0, 1, 2
_DYNS = (_DYN_NONE, _DYN_INTEGRATOR, _DYN_FILTER, _DYN_FILTEREXACT, _DYN_MUSCLE)
_GAINS = (_GAIN_FIXED, _GAIN_AFFINE, _GAIN_MUSCLE)
_BIASES = (_BIAS_NONE, _BIAS_AFFINE, _BIAS_MUSCLE)
# transmission kinds (ActTables.kind)
_K_SCALAR, _K_BALL, _K_FREE, _K_TENDON, _K_SITE, _K_CRANK, _K_BODY = range(7)

_CACHE: dict = {}


@dataclasses.dataclass(frozen=True, eq=False)
class ActTables:
    """Static actuator tables (numpy)."""

    kind: np.ndarray        # (nu,) _K_*: scalar joint, ball, free, tendon, site, crank, body
    inparent: np.ndarray    # (nu,) bool: joint-in-parent transmission
    target: np.ndarray      # (nu,) joint, tendon, site (crank: crank site) or body id
    target2: np.ndarray     # (nu,) refsite / slider site id, -1 if none
    common: np.ndarray      # (nu, nv) 0 on dofs shared by site and refsite (else 1)
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
             "jnt_type", "jnt_qposadr", "jnt_dofadr", "site_bodyid",
             "body_weldid", "body_dofadr", "body_dofnum", "dof_parentid")
    key = (m.nu, m.nv, m.na, m.nout, m.nactuator) + tuple(
        hashlib.sha1(np.ascontiguousarray(getattr(m, n)).tobytes()).hexdigest()
        for n in names)
    tab = _CACHE.get(key)
    if tab is None:
        tab = _CACHE[key] = _build(m)
    _check_delays(m)
    return tab


def _check_delays(m):
    """A delay needs a history buffer (MuJoCo's compiler refuses it otherwise). Delays
    are parameters: checked when concrete (traced ones come from a checked model)."""
    try:
        delay = np.asarray(m.actuator_delay).reshape(-1)
    except Exception:
        return
    if m.nu and np.any((delay != 0) &
                       (np.asarray(m.actuator_history).reshape(m.nu, 2)[:, 0] <= 0)):
        _unsupported("delay without a history buffer (nsample 0)")


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
    names = {"trn": {int(t): t.name.lower() for t in TrnType},
             "dyn": {int(t): t.name.lower() for t in DynType},
             "gain": {int(t): t.name.lower() for t in GainType},
             "bias": {int(t): t.name.lower() for t in BiasType}}
    ok_trn = (TrnType.JOINT, TrnType.JOINTINPARENT, TrnType.TENDON, TrnType.SITE,
              TrnType.SLIDERCRANK, TrnType.BODY)
    for i in range(nu):
        for what, val, ok in (("transmission", trntype[i], ok_trn),
                              ("dynamics", dyn[i], _DYNS), ("gain", gain[i], _GAINS),
                              ("bias", bias[i], _BIASES)):
            if val not in ok:
                key = {"transmission": "trn", "dynamics": "dyn"}.get(what, what)
                label = names[key].get(int(val), str(int(val)))
                _unsupported(f"{what} type '{label}' (actuator {i})")
    if nu and (np.any(np.asarray(m.actuator_ctrlnum) != 1) or
               np.any(np.asarray(m.actuator_outnum) != 1)):
        _unsupported("with several controls or outputs")
    actnum = np.asarray(m.actuator_actnum)
    # plugin actuators keep their own act slots before the dyntype slot
    if nu and np.any((actnum > 1) & (np.asarray(m.actuator_plugin) < 0)):
        _unsupported("with several activation variables")

    trnid2 = np.asarray(m.actuator_trnid).reshape(nu, 2)
    trnid = trnid2[:, 0]
    jtype = np.asarray(m.jnt_type)
    kind = np.zeros(nu, np.int64)
    qadr = np.zeros(nu, np.int64)
    place = np.zeros((nu, 6, m.nv))
    common = np.ones((nu, m.nv))
    other = {TrnType.TENDON: _K_TENDON, TrnType.SITE: _K_SITE,
             TrnType.SLIDERCRANK: _K_CRANK, TrnType.BODY: _K_BODY}
    for i in range(nu):
        if trntype[i] in other:
            kind[i] = other[int(trntype[i])]
            if trntype[i] == TrnType.SITE and trnid2[i, 1] >= 0:
                common[i, _common_dofs(m, trnid[i], trnid2[i, 1])] = 0.0
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
                     target2=trnid2[:, 1], common=common,
                     qadr=qadr, place=place, actadr=actadr, act_owner=owner, dyntype=dyn,
                     gaintype=gain, biastype=bias,
                     actearly=np.asarray(m.actuator_actearly, bool),
                     group=np.asarray(m.actuator_group))


def _common_dofs(m, site, refsite):
    """Dofs moving both the site and the reference site (the parent chain of their
    deepest common ancestral dof), cleared from the relative Jacobian as MuJoCo does."""
    weld = np.asarray(m.body_weldid)
    sbody = np.asarray(m.site_bodyid)
    dadr, dnum = np.asarray(m.body_dofadr), np.asarray(m.body_dofnum)
    parent = np.asarray(m.dof_parentid)
    b0, b1 = weld[sbody[site]], weld[sbody[refsite]]
    d0, d1 = dadr[b0] + dnum[b0] - 1, dadr[b1] + dnum[b1] - 1
    common = -1
    if d0 >= 0 and d1 >= 0:
        while d0 != d1:
            if d0 < d1:
                d1 = parent[d1]
            else:
                d0 = parent[d0]
            if d0 == -1 or d1 == -1:
                break
        if d0 == d1:
            common = d0
    out = []
    while common >= 0:
        out.append(common)
        common = parent[common]
    return np.asarray(out, np.int64)


def _gear(m, dtype):
    return jnp.asarray(m.actuator_gear, dtype).reshape(-1, 6)


def point_jacs(m, d, bodies, points):
    """Translational and rotational Jacobians (n, 3, nv) of world points attached to
    bodies (mj_jac for many points); ``bodies`` static or traced (n,) ids."""
    dtype = d.qpos.dtype
    anc = jnp.asarray(tables_mod.get(m).anc_dof, dtype)[bodies]           # (n, nv)
    off = points - d.subtree_com[jnp.asarray(m.body_rootid)[bodies]]        # (n, 3)
    rot = d.cdof[:, :3]                                                     # (nv, 3)
    lin = d.cdof[None, :, 3:] + math.cross(rot[None], off[:, None, :])      # (n, nv, 3)
    jacp = jnp.swapaxes(lin, 1, 2) * anc[:, None, :]
    jacr = rot.T[None] * anc[:, None, :]
    return jacp, jacr


def _site_quat(m, d, sites, dtype):
    """Site orientation as MuJoCo's site transmission forms it: site_quat * xquat."""
    body = np.asarray(m.site_bodyid)[sites]
    return math.quat_mul(jnp.asarray(m.site_quat, dtype).reshape(-1, 4)[sites], d.xquat[body])


def _site_trn(m, d, tab, idx, gear):
    """Lengths and moments of site transmissions (rows ``idx``)."""
    dtype = d.qpos.dtype
    sid = tab.target[idx]
    ref = tab.target2[idx]
    has_ref = ref >= 0
    rid = np.where(has_ref, ref, sid)
    g = gear[idx]
    sbody = np.asarray(m.site_bodyid)
    jp, jr = point_jacs(m, d, sbody[sid], d.site_xpos[sid])
    jpr, jrr = point_jacs(m, d, sbody[rid], d.site_xpos[rid])
    # without refsite: gear in the site frame, absolute Jacobian
    smat = d.site_xmat[sid]
    mom_abs = (jnp.einsum("nk,nkv->nv", math.matvec(smat, g[:, :3]), jp) +
               jnp.einsum("nk,nkv->nv", math.matvec(smat, g[:, 3:]), jr))
    # with refsite: gear in the refsite frame, relative Jacobian without common dofs
    rmat = d.site_xmat[rid]
    keep = jnp.asarray(tab.common[idx], dtype)
    mom_rel = (jnp.einsum("nk,nkv->nv", math.matvec(rmat, g[:, :3]), jp - jpr) +
               jnp.einsum("nk,nkv->nv", math.matvec(rmat, g[:, 3:]), jr - jrr)) * keep
    vec = math.matTvec(rmat, d.site_xpos[sid] - d.site_xpos[rid])
    rot = math.sub_quat(_site_quat(m, d, sid, dtype), _site_quat(m, d, rid, dtype))
    len_rel = math.dot(vec, g[:, :3]) + math.dot(rot, g[:, 3:])
    length = jnp.where(has_ref, len_rel, 0.0)
    moment = jnp.where(has_ref[:, None], mom_rel, mom_abs)
    return length, moment


def _crank_trn(m, d, tab, idx, gear):
    """Lengths and moments of slider-crank transmissions (rows ``idx``)."""
    dtype = d.qpos.dtype
    crank, slider = tab.target[idx], tab.target2[idx]
    rod = jnp.asarray(m.actuator_cranklength, dtype)[idx]
    axis = d.site_xmat[slider][:, :, 2]
    vec = d.site_xpos[crank] - d.site_xpos[slider]
    av = math.dot(vec, axis)
    det = av * av + rod * rod - math.dot(vec, vec)
    ok = det > 0
    sdet = math.safe_sqrt(jnp.where(ok, det, 0.0))
    safe = jnp.where(ok, sdet, 1.0)
    length = jnp.where(ok, av - sdet, av)
    dldv = jnp.where(ok[:, None], axis * (1 - av / safe)[:, None] + vec / safe[:, None], axis)
    dlda = jnp.where(ok[:, None], vec * (1 - av / safe)[:, None], vec)
    sbody = np.asarray(m.site_bodyid)
    jps, jrs = point_jacs(m, d, sbody[slider], d.site_xpos[slider])
    jpc, _ = point_jacs(m, d, sbody[crank], d.site_xpos[crank])
    # d axis / dq: rotational Jacobian columns crossed with the axis
    jaxis = math.cross(jnp.swapaxes(jrs, 1, 2), axis[:, None, :])          # (n, nv, 3)
    moment = (jnp.einsum("nk,nvk->nv", dlda, jaxis) +
              jnp.einsum("nk,nkv->nv", dldv, jpc - jps))
    g0 = gear[idx, 0]
    return length * g0, moment * g0[:, None]


def _body_trn(m, d, tab, idx):
    """Moments of body (adhesion) transmissions: minus the average normal Jacobian of
    the contacts involving the body (mj_transmission, mjTRN_BODY); lengths are 0."""
    dtype = d.qpos.dtype
    con = d.contact
    n = len(idx)
    if con.dist.shape[0] == 0:
        return jnp.zeros(n, dtype), jnp.zeros((n, m.nv), dtype)
    geom = con.geom
    okg = con.valid & jnp.all(geom >= 0, -1)
    gb = jnp.asarray(m.geom_bodyid)[jnp.maximum(geom, 0)]                  # (ncon, 2)
    jp1, _ = point_jacs(m, d, gb[:, 0], con.pos)
    jp2, _ = point_jacs(m, d, gb[:, 1], con.pos)
    normal_j = jnp.einsum("ck,ckv->cv", con.frame[:, 0], jp2 - jp1)        # (ncon, nv)
    counted = okg & ((con.exclude == 0) | (con.exclude == 1))
    body = tab.target[idx][:, None]
    inv = counted[None] & ((gb[None, :, 0] == body) | (gb[None, :, 1] == body))
    w = inv.astype(dtype)
    count = jnp.sum(w, -1)
    moment = -(w @ normal_j) / jnp.maximum(count, 1.0)[:, None]
    return jnp.zeros(n, dtype), moment


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
    if np.any(kind == _K_SCALAR):
        length = jnp.where(kind == _K_SCALAR, d.qpos[tab.qadr] * gear[:, 0], length)
    if np.any((kind == _K_BALL) | (kind == _K_FREE)):
        # ball: quaternion at qadr; free: quaternion after the position
        off = np.where(kind == _K_FREE, 3, 0)
        qi = np.minimum((tab.qadr + off)[:, None] + np.arange(4), m.nq - 1)
        quat = math.quat_normalize(d.qpos[qi])
        gsrc = jnp.where((kind == _K_FREE)[:, None], gear[:, 3:], gear[:, :3])
        gaxis = jnp.where(tab.inparent[:, None],
                          math.rot_vec_quat(gsrc, math.quat_neg(quat)), gsrc)
        ball_len = math.dot(math.quat_to_vel(quat), gaxis)
        length = jnp.where(kind == _K_BALL, ball_len, length)
        ball_local = jnp.concatenate([gaxis, jnp.zeros_like(gaxis)], -1)
        free_local = jnp.concatenate([gear[:, :3], gaxis], -1)
        local = jnp.where((kind == _K_BALL)[:, None], ball_local, local)
        local = jnp.where((kind == _K_FREE)[:, None], free_local, local)
    moment = jnp.einsum("ak,akv->av", local, jnp.asarray(tab.place, dtype))
    if np.any(kind == _K_TENDON):
        tid = np.where(kind == _K_TENDON, tab.target, 0)
        ten = kind == _K_TENDON
        length = jnp.where(ten, d.ten_length[tid] * gear[:, 0], length)
        moment = jnp.where(ten[:, None], d.ten_J[tid] * gear[:, :1], moment)
    for k, fn in ((_K_SITE, _site_trn), (_K_CRANK, _crank_trn), (_K_BODY, _body_trn)):
        idx = np.nonzero(kind == k)[0]
        if not len(idx):
            continue
        ln, mo = fn(m, d, tab, idx, gear) if k != _K_BODY else fn(m, d, tab, idx)
        src = np.full(m.nu, len(idx))
        src[idx] = np.arange(len(idx))
        sel = kind == k
        length = jnp.where(sel, jnp.concatenate([ln, jnp.zeros(1, dtype)])[src], length)
        moment = jnp.where(sel[:, None],
                           jnp.concatenate([mo, jnp.zeros((1, m.nv), dtype)])[src], moment)
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
    ctrl = history.delayed_ctrl(m, d, d.ctrl) if m.nhistory else d.ctrl
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
        muscle = tab.dyntype[own] == _DYN_MUSCLE
        if muscle.any():
            act_dot = jnp.where(muscle, muscle_dynamics(ctrl[own], d.act, dynprm[own]),
                                act_dot)
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
    is_muscle = (tab.gaintype == _GAIN_MUSCLE) | (tab.biastype == _BIAS_MUSCLE)
    if is_muscle.any():
        lrange = jnp.asarray(m.actuator_lengthrange, dtype).reshape(m.nu, 2)
        acc0 = jnp.asarray(m.actuator_acc0, dtype).reshape(m.nu)
        gain = jnp.where(tab.gaintype == _GAIN_MUSCLE,
                         muscle_gain(length, velocity, lrange, acc0, gainprm), gain)
    inp = ctrl
    stateful = tab.actadr >= 0
    if stateful.any():
        adr = np.where(stateful, tab.actadr, 0)
        act = d.act[adr]
        if tab.actearly.any():
            nxt = next_activation(m, d.act, act_dot)[adr]
            act = jnp.where(tab.actearly, nxt, act)
        inp = jnp.where(stateful, act, ctrl)
    inp = _wrap_setpoint(m, tab, inp, length, gainprm, biasprm)
    bias = jnp.where(tab.biastype == _BIAS_AFFINE,
                     biasprm[:, 0] + biasprm[:, 1] * length + biasprm[:, 2] * velocity, 0.0)
    if is_muscle.any():
        bias = jnp.where(tab.biastype == _BIAS_MUSCLE,
                         muscle_bias(length, lrange, acc0, biasprm), bias)
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


def _wrap_setpoint(m, tab, inp, length, gainprm, biasprm):
    """Position servos on rotational transmissions (ball joints; site + refsite with a
    purely rotational gear) use the setpoint representative nearest the current length,
    modulo the period 2 pi |gear| (MuJoCo 4.0's wrapPeriod / wrapSetpoint)."""
    trn = np.asarray(m.actuator_trntype)
    jtype = np.asarray(m.jnt_type)
    joint = (trn == TrnType.JOINT) | (trn == TrnType.JOINTINPARENT)
    ball = joint & (jtype[np.where(joint, tab.target, 0)] == JointType.BALL) if m.njnt \
        else np.zeros(m.nu, bool)
    refsite = (trn == TrnType.SITE) & (tab.target2 >= 0)
    shape = ((tab.gaintype == _GAIN_FIXED) & (tab.biastype == _BIAS_AFFINE) &
             ((tab.dyntype == _DYN_NONE) | (tab.dyntype == _DYN_INTEGRATOR)))
    cand = shape & (ball | refsite)
    if not cand.any():
        return inp
    gear = _gear(m, inp.dtype)
    servo = gainprm[:, 0] == -biasprm[:, 1]
    rot_only = jnp.all(gear[:, :3] == 0, -1)
    period = jnp.where(ball, 2 * jnp.pi * math.norm(gear[:, :3]),
                       jnp.where(rot_only, 2 * jnp.pi * math.norm(gear[:, 3:]), 0.0))
    period = jnp.where(cand & servo, period, 0.0)
    wrap = period > 0
    safe = jnp.where(wrap, period, 1.0)
    wrapped = inp - safe * jnp.round((inp - length) / safe)
    return jnp.where(wrap, wrapped, inp)


# --------------------------------------------------------------------------- muscles
def muscle_gain_length(length, lmin, lmax):
    """Normalised active force-length curve (mju_muscleGainLength)."""
    a = 0.5 * (lmin + 1)
    b = 0.5 * (1 + lmax)
    x1 = (length - lmin) / jnp.maximum(math.MINVAL, a - lmin)
    x2 = (1 - length) / jnp.maximum(math.MINVAL, 1 - a)
    x3 = (length - 1) / jnp.maximum(math.MINVAL, b - 1)
    x4 = (lmax - length) / jnp.maximum(math.MINVAL, lmax - b)
    val = jnp.where(length <= a, 0.5 * x1 * x1,
                    jnp.where(length <= 1, 1 - 0.5 * x2 * x2,
                              jnp.where(length <= b, 1 - 0.5 * x3 * x3, 0.5 * x4 * x4)))
    return jnp.where((lmin <= length) & (length <= lmax), val, 0.0)


def _muscle_scale(lengthrange, acc0, prm):
    """Peak force (force, or scale / acc0 when force < 0) and optimal length L0."""
    force = jnp.where(prm[:, 2] < 0, prm[:, 3] / jnp.maximum(math.MINVAL, acc0), prm[:, 2])
    l0 = (lengthrange[:, 1] - lengthrange[:, 0]) / jnp.maximum(math.MINVAL,
                                                               prm[:, 1] - prm[:, 0])
    return force, l0


def muscle_gain(length, velocity, lengthrange, acc0, prm):
    """Muscle active force per unit activation (mju_muscleGain), vectorised: (n,).

    prm: (n, >=9) gainprm rows (range[2], force, scale, lmin, lmax, vmax, fpmax, fvmax).
    """
    force, l0 = _muscle_scale(lengthrange, acc0, prm)
    L = prm[:, 0] + (length - lengthrange[:, 0]) / jnp.maximum(math.MINVAL, l0)
    V = velocity / jnp.maximum(math.MINVAL, l0 * prm[:, 6])
    fl = muscle_gain_length(L, prm[:, 4], prm[:, 5])
    fvmax = prm[:, 8]
    y = fvmax - 1
    fv = jnp.where(V <= -1, 0.0,
                   jnp.where(V <= 0, (V + 1) * (V + 1),
                             jnp.where(V <= y, fvmax - (y - V) * (y - V) /
                                       jnp.maximum(math.MINVAL, y), fvmax)))
    return -force * fl * fv


def muscle_bias(length, lengthrange, acc0, prm):
    """Muscle passive force (mju_muscleBias), vectorised: (n,)."""
    force, l0 = _muscle_scale(lengthrange, acc0, prm)
    L = prm[:, 0] + (length - lengthrange[:, 0]) / jnp.maximum(math.MINVAL, l0)
    b = 0.5 * (1 + prm[:, 5])
    x = (L - 1) / jnp.maximum(math.MINVAL, b - 1)
    xb = (L - b) / jnp.maximum(math.MINVAL, b - 1)
    fpmax = prm[:, 7]
    return jnp.where(L <= 1, 0.0, jnp.where(L <= b, -force * fpmax * 0.5 * x * x,
                                             -force * fpmax * (0.5 + xb)))


def muscle_dynamics(ctrl, act, prm):
    """Muscle activation derivative (mju_muscleDynamics; Millard et al. 2013 time
    constants, optional sigmoid smoothing of width prm[2]), vectorised: (n,)."""
    ctrlc = jnp.clip(ctrl, 0.0, 1.0)
    actc = jnp.clip(act, 0.0, 1.0)
    tau_act = prm[:, 0] * (0.5 + 1.5 * actc)
    tau_deact = prm[:, 1] / (0.5 + 1.5 * actc)
    width = prm[:, 2]
    dctrl = ctrlc - act
    hard = jnp.where(dctrl > 0, tau_act, tau_deact)
    x = dctrl / jnp.where(width < math.MINVAL, 1.0, width) + 0.5
    # mju_sigmoid: quintic smoothstep on [0, 1]
    xc = jnp.clip(x, 0.0, 1.0)
    sig = xc * xc * xc * (3 * xc * (2 * xc - 5) + 10)
    smooth = tau_deact + (tau_act - tau_deact) * sig
    tau = jnp.where(width < math.MINVAL, hard, smooth)
    return dctrl / jnp.maximum(math.MINVAL, tau)


def _clamp_tendon_force(m, force, tab, dtype):
    """Scale tendon-transmission forces so each tendon's total is within its range."""
    if not m.ntendon:
        return force
    limited = np.asarray(m.tendon_actfrclimited, bool)
    ten = (tab.kind == _K_TENDON) & limited[np.where(tab.kind == _K_TENDON, tab.target, 0)]
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
    try:                         # MuJoCo skips it for zero gravity (when known here)
        if not np.any(np.asarray(m.opt.gravity)):
            return qfrc
    except Exception:            # traced gravity: qfrc_gravcomp is zero anyway
        pass
    actgc = np.asarray(m.jnt_actgravcomp, bool)[np.asarray(m.dof_jntid)]
    if not actgc.any():
        return qfrc
    return qfrc + jnp.where(actgc, d.qfrc_gravcomp, 0.0)
