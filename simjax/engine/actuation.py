"""Actuation: transmissions, activation dynamics and actuator forces.

Implements MuJoCo 4.0's mj_transmission and mj_fwdActuation:

- transmissions: joint and joint-in-parent (hinge, slide, ball, free), tendon (fixed and
  spatial), site (with and without a reference site), slider-crank, body (adhesion:
  the average contact-normal Jacobian of the body's contacts in ``Data.contact``), and
  SO(3) (ball joint, or site + refsite: three outputs, the exponential-map orientation
  and the rotational Jacobian rows in the child frame);
- dynamics: none, integrator (one state per control), filter, filterexact, muscle, pid
  (states [slew, integral]: rate-limited setpoint and anti-windup integral), dcmotor
  (states [slew, integral, temperature, LuGre bristle, current], present as the
  parameters ask, mj_dcmotorSlots);
- gain: fixed, affine, muscle, pid, so3, dcmotor; bias: none, affine, muscle, so3,
  dcmotor (DC motor: K i or K/R (V - K w) from the terminal voltage of the on-board
  controller, with cogging and LuGre friction added after force clamping)
  (mju_muscleGain, mju_muscleBias, mju_muscleDynamics; the pid force
  kp (pos - l) + kv (vel - v) + ff + ki z; the geodesic orientation servo
  kp log(q^-1 q_target) - kv w with expmap or quaternion commands);
- several controls per actuator (``actuator_ctrladr/ctrlnum/ctrlspec``) and several
  outputs (``actuator_outadr/outnum``: per-output lengths, moments, forces, gear);
- control clamping, bad-control reset, actuator group disabling, activation clamping,
  actearly, tendon and actuator force clamping (norm clamping for so3), joint-level
  actuator force limits, actuator gravity compensation, the setpoint wrapping MuJoCo 4.0
  applies to servos and pid on ball joints and purely rotational site+refsite
  transmissions, and the post-step re-anchoring of rotational integrator setpoints;
- delayed controls (``actuator_delay`` with a history buffer, :mod:`history`).

Other actuator features raise UnsupportedFeatureError naming them when the model is
traced: user callbacks (dyn/gain/bias user), dcmotor dynamics/gain/bias used apart from
each other, and several activations outside pid, dcmotor, so3 integrators and plugin
actuators (which :mod:`simjax.plugins.engine` drives).
"""
from __future__ import annotations

import dataclasses
import hashlib

import jax.numpy as jnp
import numpy as np

from simjax.engine import history
from simjax.engine import dcmotor
from simjax.engine import math
from simjax.engine.muscle import muscle_bias, muscle_dynamics, muscle_gain  # noqa: F401
from simjax.engine import tables as tables_mod
from simjax.engine.data import WARN_BADCTRL, count_warning, put
from simjax.plugins import engine as plugins
from simjax.errors import UnsupportedFeatureError
from simjax.types import BiasType, DisableBit, DynType, GainType, JointType, TrnType

# MuJoCo enum values of the supported types
_DYN_NONE, _DYN_INTEGRATOR, _DYN_FILTER, _DYN_FILTEREXACT, _DYN_MUSCLE = 0, 1, 2, 3, 4
_DYN_DCMOTOR, _DYN_PID = 5, 6
_GAIN_FIXED, _GAIN_AFFINE, _GAIN_MUSCLE, _GAIN_DCMOTOR, _GAIN_SO3, _GAIN_PID = 0, 1, 2, 3, 4, 5
_BIAS_NONE, _BIAS_AFFINE, _BIAS_MUSCLE, _BIAS_DCMOTOR, _BIAS_SO3 = 0, 1, 2, 3, 4
_DYNS = (_DYN_NONE, _DYN_INTEGRATOR, _DYN_FILTER, _DYN_FILTEREXACT, _DYN_MUSCLE, _DYN_PID,
         _DYN_DCMOTOR)
_GAINS = (_GAIN_FIXED, _GAIN_AFFINE, _GAIN_MUSCLE, _GAIN_SO3, _GAIN_PID, _GAIN_DCMOTOR)
_BIASES = (_BIAS_NONE, _BIAS_AFFINE, _BIAS_MUSCLE, _BIAS_SO3, _BIAS_DCMOTOR)
# actuator_ctrlspec bits (servo inputs) and the so3 quaternion chart
_IN_POS, _IN_VEL, _IN_FF, _IN_VOLTAGE = 1, 2, 4, 8
_CHART_QUAT = 2
# transmission kinds (ActTables.kind)
_K_SCALAR, _K_BALL, _K_FREE, _K_TENDON, _K_SITE, _K_CRANK, _K_BODY, _K_SO3 = range(8)

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
    ctrladr: np.ndarray     # (nact,) first control
    ctrlnum: np.ndarray     # (nact,)
    ctrlspec: np.ndarray    # (nact,)
    outadr: np.ndarray      # (nact,) first output
    outnum: np.ndarray      # (nact,)
    out_owner: np.ndarray   # (nout,) actuator of each output
    act_k: np.ndarray       # (na,) index of each activation within its actuator
    act_ctrl: np.ndarray    # (na,) control integrated by an integrator activation
    so3: np.ndarray         # (nact,) bool: so3 gain (three outputs)


def tables(m) -> ActTables:
    """Checked, cached actuator tables for ``m``."""
    names = ("actuator_trntype", "actuator_dyntype", "actuator_gaintype",
             "actuator_biastype", "actuator_trnid", "actuator_actadr", "actuator_actnum",
             "actuator_ctrlnum", "actuator_outnum", "actuator_plugin", "actuator_history",
             "actuator_ctrladr", "actuator_outadr", "actuator_ctrlspec",
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
    if m.nactuator and np.any((delay != 0) &
                              (np.asarray(m.actuator_history).reshape(-1, 2)[:, 0] <= 0)):
        _unsupported("delay without a history buffer (nsample 0)")


def _unsupported(what):
    raise UnsupportedFeatureError(f"actuator {what}")


def _build(m) -> ActTables:
    nu = m.nactuator
    trntype = np.asarray(m.actuator_trntype).reshape(-1)
    dyn = np.asarray(m.actuator_dyntype).reshape(-1)
    gain = np.asarray(m.actuator_gaintype).reshape(-1)
    bias = np.asarray(m.actuator_biastype).reshape(-1)
    names = {"trn": {int(t): t.name.lower() for t in TrnType},
             "dyn": {int(t): t.name.lower() for t in DynType},
             "gain": {int(t): t.name.lower() for t in GainType},
             "bias": {int(t): t.name.lower() for t in BiasType}}
    ok_trn = (TrnType.JOINT, TrnType.JOINTINPARENT, TrnType.TENDON, TrnType.SITE,
              TrnType.SLIDERCRANK, TrnType.BODY, TrnType.SO3)
    for i in range(nu):
        for what, val, ok in (("transmission", trntype[i], ok_trn),
                              ("dynamics", dyn[i], _DYNS), ("gain", gain[i], _GAINS),
                              ("bias", bias[i], _BIASES)):
            if val not in ok:
                key = {"transmission": "trn", "dynamics": "dyn"}.get(what, what)
                label = names[key].get(int(val), str(int(val)))
                _unsupported(f"{what} type '{label}' (actuator {i})")
    ctrlnum = np.asarray(m.actuator_ctrlnum).reshape(-1)
    outnum = np.asarray(m.actuator_outnum).reshape(-1)
    so3 = gain == _GAIN_SO3
    multi = ~so3 & (gain != _GAIN_PID) & (gain != _GAIN_DCMOTOR)
    dc = (dyn == _DYN_DCMOTOR) | (gain == _GAIN_DCMOTOR) | (bias == _BIAS_DCMOTOR)
    if nu and np.any(dc & ~((dyn == _DYN_DCMOTOR) & (gain == _GAIN_DCMOTOR) &
                            (bias == _BIAS_DCMOTOR))):
        _unsupported("dcmotor dynamics, gain and bias used separately")
    if nu and (np.any(multi & (ctrlnum != 1)) or np.any(dc & (ctrlnum > 4)) or np.any(~so3 & (outnum != 1)) or
               np.any(so3 & ((outnum != 3) | (trntype != TrnType.SO3))) or
               np.any(~so3 & (trntype == TrnType.SO3))):
        _unsupported("with several controls or outputs outside pid and so3")
    actnum = np.asarray(m.actuator_actnum).reshape(-1)
    # plugin actuators keep their own act slots before the dyntype slot
    several = (actnum > 1) & (np.asarray(m.actuator_plugin).reshape(-1) < 0)
    several &= ~(dyn == _DYN_PID) & ~(dyn == _DYN_DCMOTOR) & ~(so3 & (dyn == _DYN_INTEGRATOR))
    if nu and np.any(several):
        _unsupported("with several activation variables")

    trnid2 = np.asarray(m.actuator_trnid).reshape(nu, 2)
    trnid = trnid2[:, 0]
    jtype = np.asarray(m.jnt_type)
    kind = np.zeros(nu, np.int64)
    qadr = np.zeros(nu, np.int64)
    place = np.zeros((nu, 6, m.nv))
    common = np.ones((nu, m.nv))
    other = {TrnType.TENDON: _K_TENDON, TrnType.SITE: _K_SITE,
             TrnType.SLIDERCRANK: _K_CRANK, TrnType.BODY: _K_BODY, TrnType.SO3: _K_SO3}
    for i in range(nu):
        if trntype[i] in other:
            kind[i] = other[int(trntype[i])]
            if trntype[i] == TrnType.SO3 and trnid2[i, 1] < 0:
                qadr[i] = m.jnt_qposadr[trnid[i]]
            if trntype[i] in (TrnType.SITE, TrnType.SO3) and trnid2[i, 1] >= 0:
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
    actadr = np.asarray(m.actuator_actadr).reshape(-1) if nu else np.zeros(0, np.int64)
    ctrladr = np.asarray(m.actuator_ctrladr).reshape(-1) if nu else np.zeros(0, np.int64)
    outadr = np.asarray(m.actuator_outadr).reshape(-1) if nu else np.zeros(0, np.int64)
    owner = np.zeros(m.na, np.int64)
    act_k = np.zeros(m.na, np.int64)
    act_ctrl = np.zeros(m.na, np.int64)
    for i in range(nu):
        if actadr[i] >= 0:
            owner[actadr[i]:actadr[i] + actnum[i]] = i
            act_k[actadr[i]:actadr[i] + actnum[i]] = np.arange(actnum[i])
            # integrators: one state per control, the last ctrlnum states
            first = actnum[i] - ctrlnum[i]
            act_ctrl[actadr[i]:actadr[i] + actnum[i]] = ctrladr[i] + np.clip(
                np.arange(actnum[i]) - first, 0, None)
    out_owner = np.zeros(m.nout, np.int64)
    for i in range(nu):
        out_owner[outadr[i]:outadr[i] + outnum[i]] = i
    return ActTables(kind=kind, inparent=trntype == TrnType.JOINTINPARENT, target=trnid,
                     target2=trnid2[:, 1], common=common,
                     qadr=qadr, place=place, actadr=actadr, act_owner=owner, dyntype=dyn,
                     gaintype=gain, biastype=bias,
                     actearly=np.asarray(m.actuator_actearly, bool).reshape(-1),
                     group=np.asarray(m.actuator_group).reshape(-1),
                     ctrladr=ctrladr, ctrlnum=ctrlnum,
                     ctrlspec=np.asarray(m.actuator_ctrlspec).reshape(-1),
                     outadr=outadr, outnum=outnum, out_owner=out_owner, act_k=act_k,
                     act_ctrl=act_ctrl, so3=so3)


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
    """(nact, 6) gear of each actuator's first output."""
    return math.take(jnp.asarray(m.actuator_gear, dtype).reshape(-1, 6),
                          tables(m).outadr)


def _to_outputs(m, tab, siso, so3_rows):
    """Per-output array (nout, ...) from per-actuator values ``siso`` (nact, ...) and
    the rows of so3 actuators ``so3_rows`` (nso3, 3, ...), or ``siso`` itself when every
    actuator has one output."""
    if so3_rows is None:
        return siso
    idx = np.nonzero(tab.so3)[0]
    flat = so3_rows.reshape((3 * len(idx),) + so3_rows.shape[2:])
    src = np.zeros(m.nout, np.int64)
    one = ~tab.so3
    src[tab.outadr[one]] = np.nonzero(one)[0]
    for r, i in enumerate(idx):
        src[tab.outadr[i] + np.arange(3)] = m.nactuator + 3 * r + np.arange(3)
    return jnp.concatenate([siso, flat])[src]


def _so3_trn(m, d, tab, idx):
    """Lengths (n, 3) and moment rows (n, 3, nv) of so3 transmissions: the joint
    quaternion's expmap and identity rows on a ball joint; with a refsite the relative
    orientation's expmap and the relative rotational Jacobian (common dofs cleared)
    projected on the site axes (mj_transmission, mjTRN_SO3)."""
    dtype = d.qpos.dtype
    ball = tab.target2[idx] < 0
    n = len(idx)
    length = jnp.zeros((n, 3), dtype)
    moment = jnp.zeros((n, 3, m.nv), dtype)
    if ball.any():
        qadr = tab.qadr[idx]
        quat = math.quat_normalize(d.qpos[qadr[:, None] + np.arange(4)])
        place = np.zeros((n, 3, m.nv))
        for r in np.nonzero(ball)[0]:
            dadr = m.jnt_dofadr[tab.target[idx[r]]]
            place[r, np.arange(3), dadr + np.arange(3)] = 1.0
        length = math.where(ball[:, None], math.quat_to_vel(quat), length)
        moment = math.where(ball[:, None, None], jnp.asarray(place, dtype), moment)
    if (~ball).any():
        sid = tab.target[idx]
        rid = np.where(ball, sid, tab.target2[idx])
        sbody = np.asarray(m.site_bodyid)
        _, jr = point_jacs(m, d, sbody[sid], d.site_xpos[sid])
        _, jrr = point_jacs(m, d, sbody[rid], d.site_xpos[rid])
        rel = (jr - jrr) * jnp.asarray(tab.common[idx], dtype)[:, None, :]
        rows = jnp.einsum("nik,niv->nkv", d.site_xmat[sid], rel)
        qs, qr = _site_quat(m, d, sid, dtype), _site_quat(m, d, rid, dtype)
        vec = math.sub_quat(qs, qr)
        length = math.where(ball[:, None], length, vec)
        moment = math.where(ball[:, None, None], moment, rows)
    return length, moment


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
    """World orientation of sites, xquat * site_quat, as MuJoCo 4.0's site and so3
    transmissions compose it."""
    body = np.asarray(m.site_bodyid)[sites]
    return math.quat_mul(d.xquat[body], jnp.asarray(m.site_quat, dtype).reshape(-1, 4)[sites])


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
    length = math.where(has_ref, len_rel, 0.0)
    moment = math.where(has_ref[:, None], mom_rel, mom_abs)
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
    sdet = math.safe_sqrt(math.where(ok, det, 0.0))
    safe = math.where(ok, sdet, 1.0)
    length = math.where(ok, av - sdet, av)
    dldv = math.where(ok[:, None], axis * (1 - av / safe)[:, None] + vec / safe[:, None], axis)
    dlda = math.where(ok[:, None], vec * (1 - av / safe)[:, None], vec)
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
    """Actuator lengths (nout,) and dense moment arms (nout, nv) (mj_transmission)."""
    if not m.nactuator:
        return d
    tab = tables(m)
    dtype = d.qpos.dtype
    gear = _gear(m, dtype)
    kind = tab.kind
    nact = m.nactuator
    local = jnp.zeros((nact, 6), dtype).at[:, 0].set(gear[:, 0])
    length = jnp.zeros(nact, dtype)
    if np.any(kind == _K_SCALAR):
        length = math.where(kind == _K_SCALAR, math.take(d.qpos, tab.qadr) * gear[:, 0],
                            length)
    if np.any((kind == _K_BALL) | (kind == _K_FREE)):
        # ball: quaternion at qadr; free: quaternion after the position
        off = np.where(kind == _K_FREE, 3, 0)
        qi = np.minimum((tab.qadr + off)[:, None] + np.arange(4), m.nq - 1)
        quat = math.quat_normalize(d.qpos[qi])
        gsrc = math.where((kind == _K_FREE)[:, None], gear[:, 3:], gear[:, :3])
        gaxis = math.where(tab.inparent[:, None],
                           math.rot_vec_quat(gsrc, math.quat_neg(quat)), gsrc)
        ball_len = math.dot(math.quat_to_vel(quat), gaxis)
        length = math.where(kind == _K_BALL, ball_len, length)
        ball_local = jnp.concatenate([gaxis, jnp.zeros_like(gaxis)], -1)
        free_local = jnp.concatenate([gear[:, :3], gaxis], -1)
        local = math.where((kind == _K_BALL)[:, None], ball_local, local)
        local = math.where((kind == _K_FREE)[:, None], free_local, local)
    moment = jnp.einsum("ak,akv->av", local, jnp.asarray(tab.place, dtype))
    if np.any(kind == _K_TENDON):
        tid = np.where(kind == _K_TENDON, tab.target, 0)
        ten = kind == _K_TENDON
        length = math.where(ten, d.ten_length[tid] * gear[:, 0], length)
        moment = math.where(ten[:, None], d.ten_J[tid] * gear[:, :1], moment)
    for k, fn in ((_K_SITE, _site_trn), (_K_CRANK, _crank_trn), (_K_BODY, _body_trn)):
        idx = np.nonzero(kind == k)[0]
        if not len(idx):
            continue
        ln, mo = fn(m, d, tab, idx, gear) if k != _K_BODY else fn(m, d, tab, idx)
        src = np.full(nact, len(idx))
        src[idx] = np.arange(len(idx))
        sel = kind == k
        length = math.where(sel, jnp.concatenate([ln, jnp.zeros(1, dtype)])[src], length)
        moment = math.where(sel[:, None],
                            jnp.concatenate([mo, jnp.zeros((1, m.nv), dtype)])[src], moment)
    so3_len = so3_mom = None
    if tab.so3.any():
        so3_len, so3_mom = _so3_trn(m, d, tab, np.nonzero(tab.so3)[0])
    length = _to_outputs(m, tab, length, so3_len)
    moment = _to_outputs(m, tab, moment, so3_mom)
    return d.replace(actuator_length=length, actuator_moment=moment)


def initial_ctrl(m, dtype):
    """(nu,) controls of a reset Data: zero, except the identity quaternion in the control
    block of so3 actuators using the quaternion chart (mj_resetData)."""
    ctrl = np.zeros(m.nu)
    if m.nactuator:
        gain = np.asarray(m.actuator_gaintype).reshape(-1)
        spec = np.asarray(m.actuator_ctrlspec).reshape(-1)
        adr = np.asarray(m.actuator_ctrladr).reshape(-1)
        ctrl[adr[(gain == _GAIN_SO3) & (spec == _CHART_QUAT)]] = 1.0
    return put(ctrl.astype(dtype))


def _disabled_mask(m):
    """(nu,) bool: actuator disabled through opt.disableactuator groups."""
    group = np.asarray(m.actuator_group).reshape(-1)
    bits = int(m.opt.disableactuator)
    ok = (group >= 0) & (group <= 30)
    return ok & ((bits >> np.clip(group, 0, 30)) & 1).astype(bool)


def next_activation(m, act, act_dot, velocity=None):
    """Activations after one timestep (mj_nextActivation), vectorised over na.

    filterexact and the dcmotor current integrate exactly, the LuGre bristle state by
    exact zero-order hold (needs ``velocity``, actuator_velocity (nout,)), others by
    Euler; limited activations are clamped (dcmotor: the integral at +-Imax instead).
    """
    tab = tables(m)
    dtype = act.dtype
    own = tab.act_owner
    h = jnp.asarray(m.opt.timestep, dtype)
    dynprm = jnp.asarray(m.actuator_dynprm, dtype).reshape(m.nactuator, -1)
    tau = jnp.maximum(math.MINVAL, dynprm[own, 0])
    exact = tab.dyntype[own] == _DYN_FILTEREXACT
    new = math.where(exact, act + act_dot * tau * (1 - jnp.exp(-h / tau)), act + act_dot * h)
    if np.any(tab.dyntype == _DYN_DCMOTOR):
        if velocity is None:
            _unsupported("dcmotor states advanced without actuator velocities")
        new = dcmotor.next_activation(m, tab, act, act_dot, new, velocity, dtype)
    limited = np.asarray(m.actuator_actlimited, bool).reshape(-1)[own]
    limited = limited & (tab.dyntype[own] != _DYN_DCMOTOR)
    if limited.any():
        rng = jnp.asarray(m.actuator_actrange, dtype).reshape(m.nactuator, 2)[own]
        new = math.where(limited, math.clip_as_jnp(new, rng[:, 0], rng[:, 1]), new)
    return new


def advance_activation(m, d, act_dot):
    """Activations after one step as mj_advance leaves them: :func:`next_activation`,
    then rotational setpoints held by integrators re-anchored (per-axis servos: the
    representative nearest the length; so3: the expmap of angle at most pi)."""
    act = next_activation(m, d.act, act_dot, d.actuator_velocity)
    tab = tables(m)
    integ = tab.dyntype == _DYN_INTEGRATOR
    if not integ.any():
        return act
    dtype = act.dtype
    gainprm = jnp.asarray(m.actuator_gainprm, dtype).reshape(m.nactuator, -1)
    biasprm = jnp.asarray(m.actuator_biasprm, dtype).reshape(m.nactuator, -1)
    period = _wrap_period(m, tab, gainprm, biasprm, dtype)
    servo = integ & ~tab.so3 & _wrap_candidates(m, tab)
    if servo.any():
        sel = np.nonzero(servo)[0]
        last = tab.actadr[sel] + np.asarray(m.actuator_actnum).reshape(-1)[sel] - 1
        length = d.actuator_length[tab.outadr[sel]]
        act = act.at[last].set(_wrap(act[last], length, period[sel]))
    so3i = integ & tab.so3
    for i in np.nonzero(so3i)[0]:
        adr = tab.actadr[i] + np.arange(3)
        v = act[adr]
        angle = math.norm(v)
        two_pi = 2 * jnp.pi
        scale = (angle - two_pi * jnp.round(angle / two_pi)) / math.where(angle > 0, angle, 1.0)
        act = act.at[adr].set(math.where(angle > jnp.pi, v * scale, v))
    return act


def _wrap(u, length, period):
    """Representative of u nearest ``length`` modulo ``period`` (wrapSetpoint), or u
    where period is 0."""
    safe = math.where(period > 0, period, 1.0)
    return math.where(period > 0, u - safe * jnp.round((u - length) / safe), u)


def _wrap_candidates(m, tab):
    """(nact,) bool: rotational transmissions a setpoint may wrap on (ball joints, site
    + refsite); the gear and servo shape decide at run time (:func:`_wrap_period`)."""
    trn = np.asarray(m.actuator_trntype).reshape(-1)
    jtype = np.asarray(m.jnt_type)
    joint = (trn == TrnType.JOINT) | (trn == TrnType.JOINTINPARENT)
    ball = joint & (jtype[np.where(joint, tab.target, 0)] == JointType.BALL) if m.njnt \
        else np.zeros(m.nactuator, bool)
    refsite = (trn == TrnType.SITE) & (tab.target2 >= 0)
    return ball | refsite


def _wrap_period(m, tab, gainprm, biasprm, dtype):
    """(nact,) period of rotational setpoints (MuJoCo 4.0's wrapPeriod): position servos
    (fixed gain kp = -biasprm[1], affine bias, no or integrator dynamics) and pid
    actuators on ball joints (2 pi |gear[:3]|) or on site + refsite transmissions with a
    purely rotational gear (2 pi |gear[3:]|); 0 elsewhere."""
    cand = _wrap_candidates(m, tab)
    if not cand.any():
        return jnp.zeros(m.nactuator, dtype)
    trn = np.asarray(m.actuator_trntype).reshape(-1)
    ball = cand & (trn != TrnType.SITE)
    shape = ((tab.gaintype == _GAIN_FIXED) & (tab.biastype == _BIAS_AFFINE) &
             ((tab.dyntype == _DYN_NONE) | (tab.dyntype == _DYN_INTEGRATOR)))
    gear = _gear(m, dtype)
    servo = (shape & (gainprm[:, 0] == -biasprm[:, 1])) | (tab.gaintype == _GAIN_PID)
    rot_only = jnp.all(gear[:, :3] == 0, -1)
    period = math.where(ball, 2 * jnp.pi * math.norm(gear[:, :3]),
                        math.where(rot_only, 2 * jnp.pi * math.norm(gear[:, 3:]), 0.0))
    return math.where(jnp.asarray(cand) & servo, period, 0.0)


def _servo_inputs(tab, ctrl):
    """(pos, vel, ff, voltage) inputs (nact,) of servo-family actuators from their
    control blocks (present inputs in canonical order, absent ones 0;
    unpackServoInputs)."""
    spec = tab.ctrlspec
    has = [(spec & b) != 0 for b in (_IN_POS, _IN_VEL, _IN_FF, _IN_VOLTAGE)]
    off = np.zeros_like(spec)
    out = []
    for h in has:
        idx = np.clip(tab.ctrladr + off, 0, max(ctrl.shape[0] - 1, 0))
        out.append(math.where(h, ctrl[idx], 0.0) if ctrl.shape[0] else
                   jnp.zeros(len(spec), ctrl.dtype))
        off = off + h
    return out


def _expmap_quat(v):
    """Unit quaternion of an exponential-map vector (n, 3) (identity below MINVAL)."""
    angle = math.norm(v)
    small = angle < math.MINVAL
    axis = v / math.where(small, 1.0, angle)[..., None]
    q = math.axis_angle_to_quat(axis, angle)
    ident = jnp.zeros_like(q).at[..., 0].set(1.0)
    return math.where(small[..., None], ident, q)


def _so3_force(m, d, tab, ctrl, act_dot, gainprm, biasprm):
    """(nso3, 3) forces of geodesic orientation servos: kp log(q_cur^-1 q_target) +
    biasprm[0] + biasprm[2] w, in the child frame (mj_fwdActuation, mjGAIN_SO3)."""
    idx = np.nonzero(tab.so3)[0]
    rows = tab.outadr[idx][:, None] + np.arange(3)
    quat_chart = tab.ctrlspec[idx] == _CHART_QUAT
    cidx = np.minimum(tab.ctrladr[idx][:, None] + np.arange(4), max(m.nu - 1, 0))
    q_quat = math.quat_normalize(ctrl[cidx])
    u = ctrl[cidx[:, :3]]
    integ = tab.dyntype[idx] == _DYN_INTEGRATOR
    if integ.any():
        aadr = np.where(integ, tab.actadr[idx], 0)[:, None] + np.arange(3)
        a = d.act[aadr]
        if np.any(tab.actearly[idx] & integ):
            nxt = next_activation(m, d.act, act_dot, d.actuator_velocity)[aadr]
            a = math.where(tab.actearly[idx][:, None], nxt, a)
        u = math.where(integ[:, None], a, u)
    q_tgt = math.where(quat_chart[:, None], q_quat, _expmap_quat(u))
    q_cur = _expmap_quat(d.actuator_length[rows])
    err = math.sub_quat(q_tgt, q_cur)
    kp = gainprm[idx, 0][:, None]
    return kp * err + biasprm[idx, 0][:, None] + biasprm[idx, 2][:, None] * \
        d.actuator_velocity[rows]


def _pid_dynamics(m, d, tab, ctrl, length, period, dynprm, gainprm, act_dot):
    """PID states (mjDYN_PID, slots [slew, integral]): the slew state's rate (the
    rate-limited first input minus the previous effective setpoint, over dt) and the
    integral's rate (the position error, on the circle for rotational transmissions,
    frozen beyond +-imax). Returns (ctrl with rate-limited first inputs, act_dot)."""
    dtype = d.qpos.dtype
    pid = tab.dyntype == _DYN_PID
    if not pid.any():
        return ctrl, act_dot
    h = jnp.asarray(m.opt.timestep, dtype)
    actnum = np.asarray(m.actuator_actnum).reshape(-1)
    first = np.where(pid, tab.actadr, 0)
    last = np.where(pid, tab.actadr + actnum - 1, 0)
    slew_s = dynprm[:, 1]
    has_slew = jnp.asarray(pid) & (slew_s > 0)
    prev = d.act[first]
    u = ctrl[tab.ctrladr]
    uw = math.where(period > 0, _wrap(u, prev, period), u)
    step = slew_s * h
    u_eff = math.clip_as_jnp(uw, prev - step, prev + step)
    slew_dot = (u_eff - prev) / h
    u_new = math.where(has_slew, u_eff, u)
    pid_idx = np.nonzero(pid)[0]
    ctrl = ctrl.at[tab.ctrladr[pid_idx]].set(u_new[pid_idx])
    # integral slot: the last slot unless it is the slew slot
    err = u_new - length
    safe = math.where(period > 0, period, 1.0)
    err = math.where(period > 0, err - safe * jnp.round(err / safe), err)
    imax = dynprm[:, 0]
    z = d.act[last]
    err = math.where(imax > 0, math.where(z >= imax, math.minimum(err, 0.0),
                                          math.where(z <= -imax, math.maximum(err, 0.0), err)),
                     err)
    has_int = jnp.asarray(pid) & (gainprm[:, 0] > 0)
    own, k = tab.act_owner, tab.act_k
    is_pid = pid[own]
    slot_slew = is_pid & (k == 0) & has_slew[own]
    slot_int = is_pid & (k == actnum[own] - 1) & ~slot_slew & has_int[own]
    act_dot = math.where(jnp.asarray(is_pid), 0.0, act_dot)
    act_dot = math.where(slot_slew, slew_dot[own], act_dot)
    act_dot = math.where(slot_int, err[own], act_dot)
    return ctrl, act_dot


def _controls(m, d):
    """(controls actuation reads (nu,): delayed, clamped, zeroed when any is bad; bad)."""
    dtype = d.qpos.dtype
    ctrl = history.delayed_ctrl(m, d, d.ctrl) if m.nhistory else d.ctrl
    if not (m.opt.disableflags & DisableBit.CLAMPCTRL) and m.nu:
        limited = np.asarray(m.actuator_ctrllimited, bool).reshape(-1)
        if limited.any():
            rng = jnp.asarray(m.actuator_ctrlrange, dtype).reshape(m.nu, 2)
            ctrl = math.where(limited, math.clip_as_jnp(ctrl, rng[:, 0], rng[:, 1]), ctrl)
    bad = jnp.any(jnp.isnan(ctrl) | (jnp.abs(ctrl) > 1e10))
    return math.where(bad, 0.0, ctrl), bad


def actuation(m, d):
    """Actuator forces and activation derivatives (mj_fwdActuation).

    Sets act_dot (na,), actuator_force (nout,) in actuator space and qfrc_actuator (nv,).
    """
    dtype = d.qpos.dtype
    if not m.nactuator or (m.opt.disableflags & DisableBit.ACTUATION):
        return d.replace(actuator_force=jnp.zeros(m.nout, dtype),
                         qfrc_actuator=jnp.zeros(m.nv, dtype),
                         act_dot=jnp.zeros(m.na, dtype))
    tab = tables(m)
    nact = m.nactuator
    ctrl, bad = _controls(m, d)
    warning = count_warning(d.warning, WARN_BADCTRL, bad)

    length = math.take(d.actuator_length, tab.outadr)
    velocity = math.take(d.actuator_velocity, tab.outadr)
    dynprm = jnp.asarray(m.actuator_dynprm, dtype).reshape(nact, -1)
    gainprm = jnp.asarray(m.actuator_gainprm, dtype).reshape(nact, -1)
    biasprm = jnp.asarray(m.actuator_biasprm, dtype).reshape(nact, -1)
    period = _wrap_period(m, tab, gainprm, biasprm, dtype)
    has_ctrl = tab.ctrlnum > 0
    cfirst = math.where(has_ctrl, math.take(ctrl, np.where(has_ctrl, tab.ctrladr, 0)),
                        0.0) if m.nu \
        else jnp.zeros(nact, dtype)

    # activation dynamics
    act_dot = jnp.zeros(m.na, dtype)
    if m.na:
        own = tab.act_owner
        tau = jnp.maximum(math.MINVAL, dynprm[own, 0])
        integ = tab.dyntype[own] == _DYN_INTEGRATOR
        c_own = cfirst[own]
        act_dot = math.where(integ, ctrl[tab.act_ctrl] if m.nu else 0.0,
                             (c_own - d.act) / tau)
        muscle = tab.dyntype[own] == _DYN_MUSCLE
        if muscle.any():
            act_dot = math.where(muscle, muscle_dynamics(c_own, d.act, dynprm[own]), act_dot)
        act_dot = math.where(tab.dyntype[own] == _DYN_NONE, 0.0, act_dot)
        ctrl, act_dot = _pid_dynamics(m, d, tab, ctrl, length, period, dynprm, gainprm,
                                      act_dot)
        ctrl, act_dot = dcmotor.dynamics(m, d, tab, ctrl, length, velocity, dynprm,
                                          gainprm, biasprm, act_dot)
        cfirst = math.where(has_ctrl, ctrl[np.where(has_ctrl, tab.ctrladr, 0)], 0.0)
        if m.nplugin:
            act_dot = plugins.actuator_act_dot(m, d.replace(ctrl=ctrl), act_dot)

    # force = gain * input + bias
    gain = math.where(tab.gaintype == _GAIN_AFFINE,
                      gainprm[:, 0] + gainprm[:, 1] * length + gainprm[:, 2] * velocity,
                      gainprm[:, 0])
    is_muscle = (tab.gaintype == _GAIN_MUSCLE) | (tab.biastype == _BIAS_MUSCLE)
    if is_muscle.any():
        lrange = jnp.asarray(m.actuator_lengthrange, dtype).reshape(m.nout, 2)[tab.outadr]
        acc0 = jnp.asarray(m.actuator_acc0, dtype).reshape(m.nout)[tab.outadr]
        gain = math.where(tab.gaintype == _GAIN_MUSCLE,
                          muscle_gain(length, velocity, lrange, acc0, gainprm), gain)
    inp = cfirst
    actnum = np.asarray(m.actuator_actnum).reshape(-1)
    stateful = tab.actadr >= 0
    if stateful.any():
        adr = np.where(stateful, tab.actadr + actnum - 1, 0)
        act = d.act[adr]
        if tab.actearly.any():
            nxt = next_activation(m, d.act, act_dot, d.actuator_velocity)[adr]
            act = math.where(tab.actearly, nxt, act)
        inp = math.where(stateful, act, inp)
    inp = _wrap(inp, length, math.where(jnp.asarray(tab.gaintype == _GAIN_PID), 0.0, period))
    bias = math.where(tab.biastype == _BIAS_AFFINE,
                      biasprm[:, 0] + biasprm[:, 1] * length + biasprm[:, 2] * velocity, 0.0)
    if is_muscle.any():
        bias = math.where(tab.biastype == _BIAS_MUSCLE,
                          muscle_bias(length, lrange, acc0, biasprm), bias)
    force = gain * inp
    pid = tab.gaintype == _GAIN_PID
    if pid.any():
        # kp (qref - l) + kv (vref - v) + ff [+ ki z]: the input side here, the state
        # side through the affine bias
        qref, vref, ff, _ = _servo_inputs(tab, ctrl)
        qref = _wrap(qref, length, period)
        fpid = -biasprm[:, 1] * qref - biasprm[:, 2] * vref + ff
        if stateful.any():
            fpid = fpid + math.where(stateful & (gainprm[:, 0] > 0), gainprm[:, 0] * inp, 0.0)
        force = math.where(pid, fpid, force)
    force = force + bias
    dc = tab.gaintype == _GAIN_DCMOTOR
    if dc.any():
        force = math.where(dc, dcmotor.force(m, d, tab, ctrl, act_dot, length, velocity,
                                             dynprm, gainprm), force)
    so3_rows = None
    if tab.so3.any():
        so3_rows = _so3_force(m, d, tab, ctrl, act_dot, gainprm, biasprm)
    disabled = _disabled_mask(m)
    if disabled.any():
        force = math.where(disabled, 0.0, force)
        if so3_rows is not None:
            so3_rows = math.where(disabled[tab.so3][:, None], 0.0, so3_rows)
    if m.nplugin:
        force = plugins.compute_actuators(m, d.replace(act_dot=act_dot), force)
    force = _clamp_tendon_force(m, force, tab, dtype)
    flim = np.asarray(m.actuator_forcelimited, bool).reshape(-1)
    if flim.any():
        rng = jnp.asarray(m.actuator_forcerange, dtype).reshape(nact, 2)
        force = math.where(flim, math.clip_as_jnp(force, rng[:, 0], rng[:, 1]), force)
        if so3_rows is not None and flim[tab.so3].any():
            # so3: the torque's norm, direction kept
            hi = rng[tab.so3, 1][:, None]
            nrm = math.norm(so3_rows)[:, None]
            scaled = so3_rows * hi / math.where(nrm > 0, nrm, 1.0)
            so3_rows = math.where(flim[tab.so3][:, None] & (nrm > hi), scaled, so3_rows)
    if dc.any():
        force = force + dcmotor.mechanical(m, d, tab, act_dot, length, velocity, dynprm,
                                            gainprm, biasprm)
    force = _to_outputs(m, tab, force, so3_rows)

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
        qfrc = math.where(limited, math.clip_as_jnp(qfrc, lo, hi), qfrc)
    return d.replace(act_dot=act_dot, actuator_force=force, qfrc_actuator=qfrc,
                     warning=warning)


def _clamp_tendon_force(m, force, tab, dtype):
    """Scale tendon-transmission forces so each tendon's total is within its range."""
    if not m.ntendon:
        return force
    limited = np.asarray(m.tendon_actfrclimited, bool)
    ten = (tab.kind == _K_TENDON) & limited[np.where(tab.kind == _K_TENDON, tab.target, 0)]
    if not ten.any():
        return force
    onehot = np.zeros((m.ntendon, m.nactuator))
    onehot[tab.target[ten], np.nonzero(ten)[0]] = 1.0
    total = jnp.asarray(onehot, dtype) @ force            # per-tendon total force
    rng = jnp.asarray(m.tendon_actfrcrange, dtype).reshape(m.ntendon, 2)
    safe = math.where(total == 0, 1.0, total)
    scale = math.where(total < rng[:, 0], rng[:, 0] / safe,
                       math.where(total > rng[:, 1], rng[:, 1] / safe, 1.0))
    scale = math.where(total == 0, 1.0, scale)
    tid = np.where(ten, tab.target, 0)
    return math.where(ten, force * scale[tid], force)


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
    return qfrc + math.where(actgc, d.qfrc_gravcomp, 0.0)
