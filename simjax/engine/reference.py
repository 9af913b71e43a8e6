"""Reference-pose constants of a compiled model: MuJoCo's set0, setStat, setSpring.

Runs once per model at load time, in float64 numpy (the arrays are small and this is
not part of the traced step): forward kinematics, subtree centres of mass, point
Jacobians, the joint-space inertia M = sum_b (m_b Jp_b^T Jp_b + Jr_b^T I_b Jr_b) + armature,
fixed and spatial tendons (wrapping spheres and cylinders through
:mod:`simjax.engine.reference_wrap`), and actuator transmissions. From these it derives
the quantities listed in :mod:`simjax.engine.setconst` exactly as ``engine_setconst.c``.

Actuator lengths and moments of the transmissions numpy does not compute here (site
transmissions with a reference site, slider-cranks, body and SO3 transmissions) come
from the engine's own tendon and transmission stages, jitted once and evaluated in
float64 at the reference pose (:func:`_engine_eval`); when the engine does not support
a model's actuators the numpy paths below are used (joint, tendon and plain site
transmissions).

The muscle ``actuator_lengthrange`` MuJoCo finds by simulation (mj_setLengthRange) is
computed afterwards by :mod:`simjax.engine.lengthrange`.
"""
from __future__ import annotations

import numpy as np

from simjax.mjcf.orientation import quat_mul, quat_normalize, quat_to_mat, rotate
from simjax.engine import reference_wrap, tables
from simjax.engine.tables import body_simple
from simjax.engine.tendon import tables as tendon_tables
from simjax.types import GainType, EqType, JointType, ObjType, TrnType, WrapType, leaf

_MINVAL = 1e-15


def _axis_angle(axis, ang):
    return np.concatenate([[np.cos(ang / 2)], np.sin(ang / 2) * np.asarray(axis)])


class _Kin:
    """Positions, frames and Jacobians of a model at one configuration ``qpos``."""

    def __init__(self, m, qpos):
        self.m = m
        nb = m.nbody
        self.xpos = np.zeros((nb, 3))
        self.xquat = np.zeros((nb, 4))
        self.xquat[0] = [1, 0, 0, 0]
        self.xanchor = np.zeros((m.njnt, 3))
        self.xaxis = np.zeros((m.njnt, 3))
        bpos, bquat = np.asarray(m.body_pos), np.asarray(m.body_quat)
        jpos, jaxis = np.asarray(m.jnt_pos), np.asarray(m.jnt_axis)
        qpos0 = np.asarray(m.qpos0)
        for b in range(1, nb):
            p = m.body_parentid[b]
            pos = self.xpos[p] + rotate(self.xquat[p], bpos[b])
            quat = quat_mul(self.xquat[p], bquat[b])
            for j in range(m.body_jntadr[b], m.body_jntadr[b] + m.body_jntnum[b]) \
                    if m.body_jntnum[b] else []:
                a = m.jnt_qposadr[j]
                t = m.jnt_type[j]
                if t == JointType.FREE:
                    pos = qpos[a:a + 3].copy()
                    quat = quat_normalize(qpos[a + 3:a + 7])
                    self.xanchor[j], self.xaxis[j] = pos, [0, 0, 1]
                    continue
                anchor = pos + rotate(quat, jpos[j])
                axis = rotate(quat, jaxis[j])
                self.xanchor[j], self.xaxis[j] = anchor, axis
                if t == JointType.BALL:
                    quat = quat_mul(quat, quat_normalize(qpos[a:a + 4]))
                elif t == JointType.HINGE:
                    quat = quat_mul(quat, _axis_angle(jaxis[j], qpos[a] - qpos0[a]))
                else:
                    pos = pos + axis * (qpos[a] - qpos0[a])
                    continue
                pos = anchor - rotate(quat, jpos[j])
            self.xpos[b], self.xquat[b] = pos, quat_normalize(quat)
        self.xmat = np.array([quat_to_mat(q) for q in self.xquat])
        self.xipos = self.xpos + np.einsum("bij,bj->bi", self.xmat, np.asarray(m.body_ipos))
        self.ximat = np.array([quat_to_mat(quat_mul(q, iq)) for q, iq in
                               zip(self.xquat, np.asarray(m.body_iquat))])
        self._subtree_com()

    def _subtree_com(self):
        m = self.m
        mass = np.asarray(m.body_mass)
        acc = mass[:, None] * self.xipos
        tot = mass.copy()
        for b in range(m.nbody - 1, 0, -1):
            acc[m.body_parentid[b]] += acc[b]
            tot[m.body_parentid[b]] += tot[b]
        self.subtree_com = np.where(tot[:, None] > _MINVAL,
                                    acc / np.maximum(tot, _MINVAL)[:, None], self.xipos)

    def frame(self, body, pos, quat):
        """World position and rotation matrix of a frame (pos, quat) on ``body``."""
        return self.xpos[body] + self.xmat[body] @ pos, self.xmat[body] @ quat_to_mat(quat)

    def jac(self, body, point):
        """(jacp, jacr), each (3, nv): point Jacobian of ``point`` fixed to ``body``."""
        m = self.m
        jp, jr = np.zeros((3, m.nv)), np.zeros((3, m.nv))
        b = body
        while b > 0:
            for j in range(m.body_jntadr[b], m.body_jntadr[b] + m.body_jntnum[b]) \
                    if m.body_jntnum[b] else []:
                d = m.jnt_dofadr[j]
                t = m.jnt_type[j]
                if t == JointType.FREE:
                    jp[:, d:d + 3] = np.eye(3)
                    for k in range(3):
                        ax = self.xmat[b][:, k]
                        jr[:, d + 3 + k] = ax
                        jp[:, d + 3 + k] = np.cross(ax, point - self.xanchor[j])
                elif t == JointType.BALL:
                    for k in range(3):
                        ax = self.xmat[b][:, k]
                        jr[:, d + k] = ax
                        jp[:, d + k] = np.cross(ax, point - self.xanchor[j])
                elif t == JointType.HINGE:
                    ax = self.xaxis[j]
                    jr[:, d] = ax
                    jp[:, d] = np.cross(ax, point - self.xanchor[j])
                else:
                    jp[:, d] = self.xaxis[j]
            b = m.body_parentid[b]
        return jp, jr

    def mass_matrix(self, armature):
        m = self.m
        M = np.diag(armature).astype(np.float64)
        mass, inertia = np.asarray(m.body_mass), np.asarray(m.body_inertia)
        for b in range(1, m.nbody):
            jp, jr = self.jac(b, self.xipos[b])
            ib = self.ximat[b] @ np.diag(inertia[b]) @ self.ximat[b].T
            M += mass[b] * jp.T @ jp + jr.T @ ib @ jr
        return M


def _tendons(m, kin, qpos):
    """Tendon lengths (ntendon,) and Jacobians (ntendon, nv): fixed tendons, and
    spatial ones over the engine's segment tables (sites, pulleys, and spheres and
    cylinders wrapped by :mod:`simjax.engine.reference_wrap`), summed as mj_tendon does:
    per straight piece between points on different bodies, dir . (jacp(end) -
    jacp(start)) / divisor; the arc over a geom adds length only."""
    length, J = np.zeros(m.ntendon), np.zeros((m.ntendon, m.nv))
    wt, wo, wp = np.asarray(m.wrap_type), np.asarray(m.wrap_objid), np.asarray(m.wrap_prm)
    for t in range(m.ntendon):
        adr, num = m.tendon_adr[t], m.tendon_num[t]
        if num and wt[adr] == WrapType.JOINT:
            for k in range(adr, adr + num):
                j = wo[k]
                length[t] += wp[k] * qpos[m.jnt_qposadr[j]]
                J[t, m.jnt_dofadr[j]] += wp[k]
    if not m.ntendon:
        return length, J
    tab = tendon_tables(m)
    spos = [kin.frame(m.site_bodyid[s], np.asarray(m.site_pos)[s],
                      np.asarray(m.site_quat)[s])[0] for s in range(m.nsite)]
    sbody, gbody = np.asarray(m.site_bodyid), np.asarray(m.geom_bodyid)
    gpos_l, gquat_l = np.asarray(m.geom_pos), np.asarray(m.geom_quat)
    radius = np.asarray(m.geom_size)[:, 0]
    for i, t in enumerate(tab.seg_tendon):
        s0, s1, g = tab.seg_s0[i], tab.seg_s1[i], tab.seg_geom[i]
        div = wp[tab.seg_div[i]] if tab.seg_div[i] >= 0 else 1.0
        p0, p1 = spos[s0], spos[s1]
        seg = np.linalg.norm(p1 - p0)
        pieces = [(p0, p1, sbody[s0], sbody[s1])]
        if g >= 0:
            gpos, gmat = kin.frame(gbody[g], gpos_l[g], gquat_l[g])
            sid = int(np.round(wp[tab.seg_side[i]])) if tab.seg_side[i] >= 0 else -1
            wlen, w0, w1 = reference_wrap.wrap(p0, p1, gpos, gmat, float(radius[g]),
                                               bool(tab.seg_cyl[i]),
                                               spos[sid] if sid >= 0 else None)
            if wlen >= 0:
                seg = np.linalg.norm(w0 - p0) + wlen + np.linalg.norm(p1 - w1)
                pieces = [(p0, w0, sbody[s0], gbody[g]), (w1, p1, gbody[g], sbody[s1])]
        length[t] += seg / div
        for a, b, ba, bb in pieces:
            if ba != bb:
                direction = reference_wrap.normalize3(b - a)
                J[t] += direction @ (kin.jac(bb, b)[0] - kin.jac(ba, a)[0]) / div
    return length, J


def _transmission(m, kin, qpos, ten_len, ten_J):
    """Actuator lengths (nout,) and moment rows (nout, nv) for the single-output
    transmissions (the others go through the engine, :func:`_engine_eval`)."""
    length, moment = np.zeros(m.nout), np.zeros((m.nout, m.nv))
    gear = np.asarray(m.actuator_gear)
    for a in range(m.nactuator):
        i = int(m.actuator_outadr[a])      # the actuator's (single) output row
        tid = m.actuator_trnid[a, 0]
        tt = m.actuator_trntype[a]
        if tt in (TrnType.JOINT, TrnType.JOINTINPARENT):
            jt = m.jnt_type[tid]
            d = m.jnt_dofadr[tid]
            if jt in (JointType.HINGE, JointType.SLIDE):
                length[i] = qpos[m.jnt_qposadr[tid]] * gear[i, 0]
                moment[i, d] = gear[i, 0]
            else:
                n = 6 if jt == JointType.FREE else 3
                moment[i, d:d + n] = gear[i, :n]
        elif tt == TrnType.TENDON:
            length[i] = ten_len[tid] * gear[i, 0]
            moment[i] = ten_J[tid] * gear[i, 0]
        elif tt == TrnType.SITE and m.actuator_trnid[a, 1] < 0:
            b = m.site_bodyid[tid]
            p, r = kin.frame(b, np.asarray(m.site_pos)[tid], np.asarray(m.site_quat)[tid])
            jp, jr = kin.jac(b, p)
            moment[i] = (r @ gear[i, :3]) @ jp + (r @ gear[i, 3:]) @ jr
    return length, moment


def _engine_stages(m, qpos):
    import jax.numpy as jnp
    from simjax.engine import actuation, io, smooth
    d = io.make_data(m, dtype=jnp.float64).replace(qpos=qpos)
    d = smooth.tendon(m, smooth.com_pos(m, smooth.kinematics(m, d)))
    d = actuation.transmission(m, d)
    return d.ten_length, d.ten_J, d.actuator_length, d.actuator_moment


_ENGINE_JIT = []
#: XLA options for programs that run once at load time: compiling without backend
#: optimisation costs 2-3x less than the default and they run only a few times
ONE_SHOT_OPTIONS = {"xla_backend_optimization_level": 0}
_ONE_SHOT = {}


def run_once(key, jitted, *args):
    """``jitted(*args)`` compiled with :data:`ONE_SHOT_OPTIONS`; executables are kept
    per (key, argument structure, shapes), so loading the same model again reuses them."""
    import jax
    flat, tree = jax.tree_util.tree_flatten(args)
    sig = (key, tree, tuple((np.shape(x), str(getattr(x, "dtype", type(x))),
                             getattr(x, "weak_type", None)) for x in flat))
    exe = _ONE_SHOT.get(sig)
    if exe is None:
        exe = jitted.lower(*args).compile(compiler_options=ONE_SHOT_OPTIONS)
        if len(_ONE_SHOT) > 64:
            _ONE_SHOT.clear()
        _ONE_SHOT[sig] = exe
    return exe(*args)


def _needs_engine(m):
    """Whether the model has transmissions the numpy paths below cannot compute
    (slider-cranks, body and SO3 transmissions, sites with a reference site)."""
    trn = np.asarray(m.actuator_trntype)
    ref = np.asarray(m.actuator_trnid).reshape(-1, 2)[:, 1] if m.nactuator else np.zeros(0)
    special = (trn == TrnType.SLIDERCRANK) | (trn == TrnType.BODY) | (trn == TrnType.SO3) | (
        (trn == TrnType.SITE) & (ref >= 0))
    return bool(np.any(special))


def _engine_eval(m, qpos):
    """Engine tendon and transmission outputs in float64 at each row of ``qpos`` (k, nq):
    (ten_length (k, ntendon), ten_J (k, ntendon, nv), actuator_length (k, nu),
    actuator_moment (k, nu, nv)). One jitted, vmapped evaluation; None when the engine
    does not support the model's actuators."""
    import jax
    from simjax.errors import UnsupportedFeatureError
    if not _ENGINE_JIT:
        _ENGINE_JIT.append(jax.jit(jax.vmap(_engine_stages, in_axes=(None, 0))))
    with jax.enable_x64(True):
        q = leaf(np.asarray(qpos, np.float64).reshape(-1, m.nq))
        try:
            out = run_once("engine", _ENGINE_JIT[0], m, q)
        except UnsupportedFeatureError:
            return None
    return tuple(np.asarray(x, np.float64) for x in out)


def set0(model):
    """Fill every reference-pose constant of ``model`` (see module doc)."""
    m = model
    qpos0 = np.asarray(m.qpos0, dtype=np.float64)
    kin = _Kin(m, qpos0)
    armature = np.asarray(m.dof_armature, dtype=np.float64).copy()
    act_arm = np.asarray(m.actuator_armature)
    for i in range(m.nactuator):
        if act_arm[i] and m.actuator_trntype[i] in (TrnType.JOINT, TrnType.JOINTINPARENT):
            j = m.actuator_trnid[i, 0]
            g = np.asarray(m.actuator_gear)[m.actuator_outadr[i], 0]
            armature[m.jnt_dofadr[j]] += act_arm[i] * g ** 2
    M = kin.mass_matrix(armature)
    out = {"dof_M0": np.diag(M).copy()}
    qspring = np.asarray(m.qpos_spring, dtype=np.float64)
    spring_len = None
    engine = _engine_eval(m, np.stack([qpos0, qspring])) if _needs_engine(m) else None
    if engine is not None:
        ten_l, ten_j, act_l, act_m = engine
        ten_len, ten_J, spring_len = ten_l[0], ten_j[0], ten_l[1]
        act_len, moment = act_l[0], act_m[0]
    else:
        ten_len, ten_J = _tendons(m, kin, qpos0)
        act_len = moment = None
    # the inverse weights and the mean inertia see the tendons' armature (mj_setConst
    # reads qM after mj_makeM added it); dof_M0 does not
    M = M + _tendon_armature_m(m, ten_J)
    Minv = np.linalg.inv(M) if m.nv else np.zeros((0, 0))
    out["body_invweight0"] = _body_invweight(m, kin, Minv)
    out["dof_invweight0"] = _dof_invweight(m, Minv)
    out["tendon_length0"] = ten_len
    out["tendon_invweight0"] = np.einsum("ti,ij,tj->t", ten_J, Minv, ten_J)
    if act_len is None:
        act_len, moment = _transmission(m, kin, qpos0, ten_len, ten_J)
    out["actuator_length0"] = act_len
    out["actuator_acc0"] = np.linalg.norm(moment @ Minv, axis=1) if m.nv else np.zeros(m.nout)
    out["eq_data"] = _eq_data(m, kin)
    out["actuator_biasprm"] = _dampratio(m, moment, Minv)
    out.update(_cameras(m, kin))
    stat, dof_length = _stat(m, kin, M)
    out["dof_length"] = dof_length
    out["tendon_lengthspring"] = _lengthspring(m, spring_len)
    if getattr(m, "nplastic", 0) and m.nkey:
        out["key_plastic"] = _key_plastic(m, qspring, out["tendon_lengthspring"])
    arrays = {k: leaf(v) for k, v in out.items() if k not in _STATIC_OUT}
    arrays.update({k: np.asarray(v) for k, v in out.items() if k in _STATIC_OUT})
    old = model.stat
    new_stat = {}
    for k, v in stat.items():
        given = np.asarray(getattr(old, k))
        new_stat[k] = getattr(old, k) if not np.any(np.isnan(given)) else leaf(v)
    return model.replace(stat=old.replace(**new_stat), **arrays)


_STATIC_OUT = frozenset({"cam_pos0", "cam_poscom0", "cam_mat0"})


def _tendon_armature_m(m, ten_J):
    """Tendon armature's part of the mass matrix (nv, nv): J' diag(a) J with a the
    tendons' armature plus that of actuators on them (times gear squared), kept only
    where M's tree sparsity has room (dofs on one ancestor chain), as mj_makeM (the
    engine's :func:`simjax.engine.smooth.crb_lower`)."""
    if not m.ntendon or not m.nv:
        return np.zeros((m.nv, m.nv))
    arm = np.array(m.tendon_armature, np.float64).reshape(-1)
    act_arm = np.asarray(m.actuator_armature)
    for i in range(m.nactuator):
        if act_arm[i] and m.actuator_trntype[i] == TrnType.TENDON:
            g = np.asarray(m.actuator_gear)[m.actuator_outadr[i], 0]
            arm[m.actuator_trnid[i, 0]] += act_arm[i] * g ** 2
    if not arm.any():
        return np.zeros((m.nv, m.nv))
    mask = tables.get(m).m_mask                  # dof i and its ancestors
    chain = mask + mask.T - np.eye(m.nv)
    return np.einsum("ti,t,tj->ij", ten_J, arm, ten_J) * chain


def _body_invweight(m, kin, Minv):
    out = np.zeros((m.nbody, 2))
    simple = body_simple(m)
    mass = np.asarray(m.body_mass)
    for b in range(1, m.nbody):
        if m.body_dofnum[m.body_weldid[b]] == 0 or m.nv == 0:
            continue
        if simple[b] == 2:
            out[b] = [1 / max(_MINVAL, mass[b]), 0.0]
            continue
        jp, jr = kin.jac(b, kin.xipos[b])
        J = np.vstack([jp, jr])
        A = J @ Minv @ J.T
        out[b] = [np.trace(A[:3, :3]) / 3, np.trace(A[3:, 3:]) / 3]
    return out


def _dof_invweight(m, Minv):
    out = np.zeros(m.nv)
    simple = body_simple(m)
    for j in range(m.njnt):
        d = m.jnt_dofadr[j]
        t = m.jnt_type[j]
        if simple[m.jnt_bodyid[j]] == 2:
            out[d] = 1 / max(_MINVAL, float(np.asarray(m.body_mass)[m.jnt_bodyid[j]]))
        elif t == JointType.FREE:
            out[d:d + 3] = np.trace(Minv[d:d + 3, d:d + 3]) / 3
            out[d + 3:d + 6] = np.trace(Minv[d + 3:d + 6, d + 3:d + 6]) / 3
        elif t == JointType.BALL:
            out[d:d + 3] = np.trace(Minv[d:d + 3, d:d + 3]) / 3
        else:
            out[d] = Minv[d, d]
    return out


def _eq_data(m, kin):
    data = np.array(m.eq_data, dtype=np.float64)
    for i in range(m.neq):
        if m.eq_objtype[i] != ObjType.BODY:
            continue
        b1, b2 = m.eq_obj1id[i], m.eq_obj2id[i]
        if m.eq_type[i] == EqType.CONNECT:
            pos = kin.xpos[b1] + kin.xmat[b1] @ data[i, 0:3]
            data[i, 3:6] = kin.xmat[b2].T @ (pos - kin.xpos[b2])
        elif m.eq_type[i] == EqType.WELD:
            if np.any(data[i, 6:10]):
                data[i, 6:10] = quat_normalize(data[i, 6:10])
                continue
            pos = kin.xpos[b2] + kin.xmat[b2] @ data[i, 0:3]
            data[i, 3:6] = kin.xmat[b1].T @ (pos - kin.xpos[b1])
            q1 = kin.xquat[b1] * np.array([1, -1, -1, -1])
            data[i, 6:10] = quat_mul(q1, kin.xquat[b2])
    return data


def _dampratio(m, moment, Minv):
    """biasprm[2] > 0 on position-like actuators is a damping ratio: turn it into -kv.

    The mass is the inertia reflected through the transmission at qpos0,
    1 / (moment M^-1 moment^T) (MuJoCo 4.0; armature included in M; for several
    outputs the mean of the per-row values is inverted), and
    kv = dampratio * 2 sqrt(kp * mass). A zero moment gives zero damping."""
    bias = np.array(m.actuator_biasprm, dtype=np.float64)
    gain = np.asarray(m.actuator_gainprm)
    pid = np.asarray(m.actuator_gaintype).reshape(-1) == GainType.PID
    for i in range(m.nactuator):
        # a pid keeps kp only in -biasprm[1] (gainprm[0] is its ki)
        if (not pid[i] and gain[i, 0] != -bias[i, 1]) or bias[i, 2] <= 0:
            continue
        # several outputs (so3): the mean inverse inertia over the output rows
        adr, num = int(m.actuator_outadr[i]), int(m.actuator_outnum[i])
        rows = moment[adr:adr + num]
        inv = float(np.einsum("ki,ij,kj->", rows, Minv, rows)) / num if m.nv else 0.0
        mass = 1.0 / inv if inv > _MINVAL else 0.0
        kp = -bias[i, 1] if pid[i] else gain[i, 0]
        bias[i, 2] = -bias[i, 2] * 2 * np.sqrt(kp * mass)
    return bias


def _cameras(m, kin):
    pos0, com0, mat0 = np.zeros((m.ncam, 3)), np.zeros((m.ncam, 3)), np.zeros((m.ncam, 9))
    for c in range(m.ncam):
        b = m.cam_bodyid[c]
        p, r = kin.frame(b, np.asarray(m.cam_pos)[c], np.asarray(m.cam_quat)[c])
        tgt = m.cam_targetbodyid[c]
        pos0[c] = p - kin.xpos[b]
        com0[c] = p - kin.subtree_com[tgt if tgt >= 0 else b]
        mat0[c] = r.reshape(-1)
    return {"cam_pos0": pos0, "cam_poscom0": com0, "cam_mat0": mat0}


def _stat(m, kin, M):
    """MuJoCo's setStat: bounding box, mean body size, dof length scales, means."""
    lo, hi = np.full(3, 1e10), np.full(3, -1e10)

    def upd(p, r=0.0):
        nonlocal lo, hi
        lo, hi = np.minimum(lo, p - r), np.maximum(hi, p + r)
    for b in range(1, m.nbody):
        upd(kin.xpos[b])
        upd(kin.xipos[b])
    for j in range(m.njnt):
        upd(kin.xanchor[j])
    sizes = np.asarray(m.geom_size)
    rb = np.asarray(m.geom_rbound)
    gxpos = []
    for s in range(m.nsite):
        upd(kin.frame(m.site_bodyid[s], np.asarray(m.site_pos)[s],
                      np.asarray(m.site_quat)[s])[0])
    for g in range(m.ngeom):
        p = kin.frame(m.geom_bodyid[g], np.asarray(m.geom_pos)[g], np.asarray(m.geom_quat)[g])[0]
        gxpos.append(p)
        r = 0.0
        if rb[g] > 0:
            r = rb[g]
        elif m.geom_type[g] == 0:
            r = max(sizes[g, 0], sizes[g, 1]) * 0.1 if (sizes[g, 0] or sizes[g, 1]) else 0.01
        elif m.geom_type[g] == 1:
            r = np.max(np.asarray(m.hfield_size)[m.geom_dataid[g]]) * 0.1
        upd(p, r)
    stat = {"center": (lo + hi) / 2, "extent": 2.0, "meansize": 0.2, "meanmass": 1.0,
            "meaninertia": 1.0}
    if hi[0] > lo[0]:
        stat["extent"] = max(1e-5, np.max(hi - lo))
    body = np.zeros(m.nbody)
    for j in range(m.njnt):
        b = m.jnt_bodyid[j]
        body[b] = max(body[b], np.linalg.norm(kin.xipos[b] - kin.xanchor[j]))
        p = m.body_parentid[b]
        body[p] = max(body[p], np.linalg.norm(kin.xipos[p] - kin.xanchor[j]))
    body[0] = 0
    for g in range(m.ngeom):
        b = m.geom_bodyid[g]
        if b > 0 and rb[g] > 0:
            body[b] = max(body[b], rb[g] + np.linalg.norm(kin.xipos[b] - gxpos[g]))
    if m.nbody > 1:
        body[1:] = np.maximum(body[1:], 1e-5)
        stat["meansize"] = body[1:].sum() / (m.nbody - 1)
        stat["meanmass"] = np.asarray(m.body_mass)[1:].sum() / (m.nbody - 1)
    dof_length = np.ones(m.nv)
    for d in range(m.nv):
        j = m.dof_jntid[d]
        t = m.jnt_type[j]
        if t in (JointType.BALL, JointType.HINGE) or (t == JointType.FREE and
                                                       d - m.jnt_dofadr[j] >= 3):
            dof_length[d] = body[m.dof_bodyid[d]]
    stat["extent"] = max(stat["extent"], 2 * stat["meansize"])
    if m.nv:
        stat["meaninertia"] = np.trace(M) / m.nv
    return stat, dof_length


def _key_plastic(m, qspring, lengthspring):
    """The keyframes' plastic states, the entries a keyframe leaves unset (NaN, from
    the compiler) the initial ones (:func:`simjax.engine.plastic.init`)."""
    from simjax.engine.plastic import sources
    key = np.array(m.key_plastic, dtype=np.float64).reshape(m.nkey, m.nplastic)
    init = np.concatenate([qspring, np.asarray(lengthspring).reshape(-1)])
    return np.where(np.isnan(key), init[sources(m)], key)


def _lengthspring(m, length=None):
    ls = np.array(m.tendon_lengthspring, dtype=np.float64)
    if not m.ntendon:
        return ls
    if length is None:
        qs = np.asarray(m.qpos_spring, dtype=np.float64)
        length, _ = _tendons(m, _Kin(m, qs), qs)
    unset = (ls[:, 0] == -1) & (ls[:, 1] == -1)
    ls[unset] = length[unset, None]
    return ls

