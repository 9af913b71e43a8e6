"""Velocity derivatives of the smooth forces, for the implicit integrators.

qDeriv = d(qfrc_actuator + qfrc_passive - qfrc_bias) / d qvel (mjd_smooth_vel), dense
(nv, nv), zero outside M's sparsity as MuJoCo's sparse qDeriv. Actuator and damping terms follow MuJoCo's analytical rules (including what
MuJoCo leaves out, e.g. clamped actuators contribute nothing); fluid and RNE terms are
exact derivatives obtained with forward-mode autodiff of the same functions that compute
the forces, which is what MuJoCo's hand-written derivatives evaluate.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from simjax.engine import actuation as act_mod
from simjax.engine import dcmotor
from simjax.engine import math
from simjax.engine import passive
from simjax.engine import smooth
from simjax.engine import tables
from simjax.types import DisableBit, IntegratorType, JointType


def actuator_vel(m, d):
    """d qfrc_actuator / d qvel (nv, nv) (mjd_actuator_vel): affine gain/bias terms."""
    dtype = d.qpos.dtype
    if not m.nactuator or (m.opt.disableflags & DisableBit.ACTUATION):
        return jnp.zeros((m.nv, m.nv), dtype)
    tab = act_mod.tables(m)
    nact = m.nactuator
    gainprm = jnp.asarray(m.actuator_gainprm, dtype).reshape(nact, -1)
    biasprm = jnp.asarray(m.actuator_biasprm, dtype).reshape(nact, -1)
    kv_bias = (tab.biastype == act_mod._BIAS_AFFINE) | (tab.biastype == act_mod._BIAS_SO3)
    bias_vel = jnp.where(kv_bias, biasprm[:, 2], 0.0)
    gain_vel = jnp.where(tab.gaintype == act_mod._GAIN_AFFINE, gainprm[:, 2], 0.0)
    # MuJoCo multiplies the gain derivative by the raw (unclamped) control
    inp = d.ctrl[tab.ctrladr] if m.nu else jnp.zeros(nact, dtype)
    stateful = tab.actadr >= 0
    if stateful.any():
        last = tab.actadr + np.asarray(m.actuator_actnum).reshape(-1) - 1
        adr = np.where(stateful, last, 0)
        a = d.act[adr]
        if tab.actearly.any():
            nxt = act_mod.next_activation(m, d.act, d.act_dot, d.actuator_velocity)[adr]
            a = jnp.where(tab.actearly, nxt, a)
        inp = jnp.where(tab.dyntype == act_mod._DYN_NONE, inp, a)
    coef = bias_vel + gain_vel * inp
    if np.any(tab.gaintype == act_mod._GAIN_DCMOTOR):
        coef = coef + dcmotor.vel_derivative(m, d)
    skip = act_mod._disabled_mask(m)
    flim = np.asarray(m.actuator_forcelimited, bool).reshape(-1)
    if flim.any():
        rng = jnp.asarray(m.actuator_forcerange, dtype).reshape(nact, 2)
        f = d.actuator_force[tab.outadr]
        clamped = flim & ((f <= rng[:, 0]) | (f >= rng[:, 1]))
        if tab.so3.any():
            # so3: the torque norm is clamped
            rows = tab.outadr[:, None] + np.arange(3)
            nrm = math.norm(d.actuator_force[np.minimum(rows, m.nout - 1)])
            clamped = jnp.where(tab.so3, flim & (nrm >= rng[:, 1]), clamped)
        coef = jnp.where(clamped, 0.0, coef)
    if skip.any():
        coef = jnp.where(skip, 0.0, coef)
    coef = jnp.where(_saturated_targets(m, d, tab), 0.0, coef)
    coef = coef[tab.out_owner]
    mom = d.actuator_moment
    return jnp.einsum("ai,a,aj->ij", mom, coef, mom)


def _saturated_targets(m, d, tab):
    """(nu,) bool: actuators whose joint or tendon total actuator force sits at its
    actuatorfrcrange limit (MuJoCo 4.0 drops their implicit derivatives)."""
    dtype = d.qpos.dtype
    sat = jnp.zeros(m.nactuator, bool)
    joint = tab.kind < 3
    if m.njnt and np.any(np.asarray(m.jnt_actfrclimited, bool)[tab.target[joint]]):
        jid = np.where(joint, tab.target, 0)
        lim = joint & np.asarray(m.jnt_actfrclimited, bool)[jid]
        rng = jnp.asarray(m.jnt_actfrcrange, dtype).reshape(m.njnt, 2)[jid]
        f = d.qfrc_actuator[np.asarray(m.jnt_dofadr)[jid]]
        sat = sat | (lim & ((f <= rng[:, 0]) | (f >= rng[:, 1])))
    ten = tab.kind == 3
    if m.ntendon and ten.any():
        tid = np.where(ten, tab.target, 0)
        lim = ten & np.asarray(m.tendon_actfrclimited, bool)[tid]
        if lim.any():
            onehot = np.zeros((m.ntendon, m.nactuator))
            onehot[tab.target[ten], np.nonzero(ten)[0]] = 1.0
            total = (jnp.asarray(onehot, dtype) @ d.actuator_force[tab.outadr])[tid]
            rng = jnp.asarray(m.tendon_actfrcrange, dtype).reshape(m.ntendon, 2)[tid]
            sat = sat | (lim & ((total <= rng[:, 0]) | (total >= rng[:, 1])))
    return sat


def _local_jacobian(m, d, bodies, points, rots):
    """Jacobians (n, 6, nv) of frames at points on bodies, rows rot:lin in local axes."""
    dtype = d.qpos.dtype
    anc = jnp.asarray(tables.get(m).anc_dof[np.asarray(bodies)], dtype)      # (n, nv)
    offset = points - d.subtree_com[np.asarray(m.body_rootid)[np.asarray(bodies)]]
    rot = d.cdof[None, :, :3]                                               # (1, nv, 3)
    lin = d.cdof[None, :, 3:] + math.cross(rot, offset[:, None, :])         # (n, nv, 3)
    jr = jnp.einsum("nji,nvj->niv", rots, rot * anc[..., None])
    jp = jnp.einsum("nji,nvj->niv", rots, lin * anc[..., None])
    return jnp.concatenate([jr, jp], axis=1)


def fluid_vel(m, d, symmetrize):
    """d qfrc_fluid / d qvel (nv, nv) (mjd_inertiaBoxFluid, mjd_ellipsoidFluid).

    ``symmetrize``: symmetrise each ellipsoid geom's 6x6 block except on standalone free
    bodies (MuJoCo does this for implicitfast).
    """
    dtype = d.qpos.dtype
    dens = tables.concrete(m.opt.density)
    visc = tables.concrete(m.opt.viscosity)
    if dens is not None and visc is not None and dens == 0 and visc == 0:
        return jnp.zeros((m.nv, m.nv), dtype)
    total = jnp.zeros((m.nv, m.nv), dtype)
    free = free_bodies(m)
    for grp in passive.fluid_local(m, d):
        bmat = jax.vmap(jax.jacfwd(grp.force_fn))(grp.lvel, *grp.params)   # (n, 6, 6)
        bmat = bmat * grp.weight[:, None, None]
        if symmetrize and not grp.is_box:
            sym = ~np.isin(grp.bodies, free)
            if sym.any():
                bsym = 0.5 * (bmat + jnp.swapaxes(bmat, 1, 2))
                bmat = jnp.where(sym[:, None, None], bsym, bmat)
        jl = _local_jacobian(m, d, grp.bodies, grp.point, grp.rot)
        total = total + jnp.einsum("nki,nkl,nlj->ij", jl, bmat, jl)
    return total


def passive_vel(m, d, symmetrize=False):
    """d qfrc_passive / d qvel (nv, nv) (mjd_passive_vel): fluid, dof and tendon damping."""
    dtype = d.qpos.dtype
    spring_off = bool(m.opt.disableflags & DisableBit.SPRING)
    damper_off = bool(m.opt.disableflags & DisableBit.DAMPER)
    total = jnp.zeros((m.nv, m.nv), dtype)
    if spring_off and damper_off:
        return total
    total = total + fluid_vel(m, d, symmetrize)
    if damper_off:
        return total
    damping, poly = passive.dof_damping(m, dtype)
    total = total - jnp.diag(passive.poly_force_deriv(damping, poly, d.qvel, True))
    if m.ntendon:
        tdamp, tpoly = passive.tendon_damping(m, dtype)
        b = passive.poly_force_deriv(tdamp, tpoly, d.ten_velocity, True)
        total = total - jnp.einsum("ti,t,tj->ij", d.ten_J, b, d.ten_J)
    return total


def bias_fn(m, d):
    """qvel -> qfrc_bias with positions fixed (for autodiff of the RNE)."""
    def fn(qvel):
        dv = smooth.com_vel(m, d.replace(qvel=qvel))
        return smooth.rne(m, dv)
    return fn


def rne_vel(m, d):
    """d qfrc_bias / d qvel (nv, nv) (mjd_rne_vel), by forward-mode autodiff."""
    return jax.jacfwd(bias_fn(m, d))(d.qvel)


def smooth_vel(m, d, flg_bias):
    """qDeriv = d(qfrc_actuator + qfrc_passive - [qfrc_bias]) / d qvel (mjd_smooth_vel)."""
    symmetrize = m.opt.integrator == IntegratorType.IMPLICITFAST
    qderiv = actuator_vel(m, d) + passive_vel(m, d, symmetrize)
    if flg_bias:
        qderiv = qderiv - rne_vel(m, d)
    # MuJoCo stores qDeriv with the sparsity of M (dof pairs on one ancestor chain):
    # couplings across trees or branches (tendon damping, actuators) are dropped
    mask = tables.get(m).m_mask
    return qderiv * jnp.asarray((mask + mask.T) > 0, qderiv.dtype)


def free_bodies(m):
    """Bodies that are standalone free bodies (mj_isFreeBody): one free joint, a 6-dof
    tree and no massive descendants (judged structurally: no descendants with mass when
    masses are concrete, no descendants at all otherwise)."""
    out = []
    jtype = np.asarray(m.jnt_type)
    tab = tables.get(m)
    try:
        mass = np.asarray(m.body_mass)
    except Exception:
        mass = None
    tree_dofnum = np.asarray(m.tree_dofnum)
    dof_treeid = np.asarray(m.dof_treeid)
    for b in range(1, m.nbody):
        if m.body_jntnum[b] != 1 or jtype[m.body_jntadr[b]] != JointType.FREE:
            continue
        adr = m.jnt_dofadr[m.body_jntadr[b]]
        if tree_dofnum[dof_treeid[adr]] != 6:
            continue
        others = np.nonzero(tab.desc[b])[0]
        others = others[others != b]
        if len(others) and (mass is None or np.any(mass[others] != 0)):
            continue
        out.append(b)
    return np.asarray(out, np.int64)


def free_bias_blocks(m, d, bodies):
    """d qfrc_bias / d qvel blocks (k, 6, 6) for standalone free bodies (mjd_freeBias_vel).

    Only the rotational columns are non-zero (the bias does not depend on the linear
    velocity of a free body).
    """
    dtype = d.qpos.dtype
    dadr = np.asarray(m.jnt_dofadr)[np.asarray(m.body_jntadr)[bodies]]
    rot_dofs = (dadr[:, None] + 3 + np.arange(3)).ravel()
    tangents = jnp.eye(m.nv, dtype=dtype)[rot_dofs]
    fn = bias_fn(m, d)
    out = jax.vmap(lambda t: jax.jvp(fn, (d.qvel,), (t,))[1])(tangents)   # (3k, nv)
    out = out.reshape(len(bodies), 3, m.nv)
    rows = dadr[:, None] + np.arange(6)                                   # (k, 6)
    rot_cols = jnp.take_along_axis(out, rows[:, None, :], axis=2)          # (k, 3, 6)
    rot_cols = jnp.swapaxes(rot_cols, 1, 2)                               # (k, 6, 3)
    return jnp.concatenate([jnp.zeros_like(rot_cols), rot_cols], axis=2)
