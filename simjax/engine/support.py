"""Queries on a computed Data, as pure functions (MuJoCo's engine_support / core_util).

Jacobians (mj_jac, mj_jacBody, mj_jacBodyCom, mj_jacGeom, mj_jacSite,
mj_jacSubtreeCom), inertia-matrix helpers (mj_fullM, mj_mulM, mj_solveM, packing into
MuJoCo's sparse layout), force application (mj_applyFT, mj_xfrcAccumulate), object
velocities (mj_objectVelocity), position integration and differencing
(mj_integratePos, mj_differentiatePos) and energies (mj_energyPos, mj_energyVel).

All require the position stage (kinematics, com_pos, and for inertia helpers crb and
factor_m) to have run on ``d``. Body ids may be Python ints or traced integers; a
concrete id out of range raises IndexError (:func:`checked_id`).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from simjax.engine import math
from simjax.engine import tables
from simjax.types import DisableBit, JointType


# --------------------------------------------------------------------------- Jacobians
def checked_id(i, n, what):
    """``i`` itself (an id or an array of ids), after an IndexError where it is concrete
    and an id lies outside [0, n): jax clamps an out-of-range index (a wrong object,
    silently) and Python's negative indices count from the end, where MuJoCo's ids are
    0..n-1. A traced id (under jit or vmap) cannot be checked and is used as it is."""
    if isinstance(i, jax.core.Tracer):
        return i
    k = np.asarray(i)
    if k.dtype.kind not in "iu":
        return i
    bad = k[(k < 0) | (k >= n)]
    if bad.size:
        have = f"{n} ({what} ids 0..{n - 1})" if n else "none"
        raise IndexError(f"{what} id {int(bad.flat[0])} out of range: the model has {have}")
    return i


def jac(m, d, point, body):
    """Jacobians of a world point attached to ``body`` (mj_jac).

    point: (3,) world position. Returns (jacp, jacr), each (3, nv): translational and
    rotational velocity of the point per unit dof velocity, world frame.
    """
    body = checked_id(body, m.nbody, "body")
    dtype = d.qpos.dtype
    mask = jnp.asarray(tables.get(m).anc_dof, dtype)[body]
    offset = point - d.subtree_com[jnp.asarray(m.body_rootid)[body]]
    rot = d.cdof[:, :3]
    lin = d.cdof[:, 3:] + math.cross(rot, offset)
    return (lin * mask[:, None]).T, (rot * mask[:, None]).T


def jac_body(m, d, body):
    """Jacobians of the body frame origin (mj_jacBody): (jacp, jacr), (3, nv) each."""
    return jac(m, d, d.xpos[checked_id(body, m.nbody, "body")], body)


def jac_body_com(m, d, body):
    """Jacobians of the body centre of mass (mj_jacBodyCom): (jacp, jacr)."""
    return jac(m, d, d.xipos[checked_id(body, m.nbody, "body")], body)


def jac_geom(m, d, geom):
    """Jacobians of a geom centre (mj_jacGeom): (jacp, jacr)."""
    geom = checked_id(geom, m.ngeom, "geom")
    return jac(m, d, d.geom_xpos[geom], jnp.asarray(m.geom_bodyid)[geom])


def jac_site(m, d, site):
    """Jacobians of a site (mj_jacSite): (jacp, jacr)."""
    site = checked_id(site, m.nsite, "site")
    return jac(m, d, d.site_xpos[site], jnp.asarray(m.site_bodyid)[site])


def jac_subtree_com(m, d, body):
    """Translational Jacobian (3, nv) of the subtree centre of mass (mj_jacSubtreeCom)."""
    body = checked_id(body, m.nbody, "body")
    dtype = d.qpos.dtype
    tab = tables.get(m)
    mass = jnp.asarray(m.body_mass, dtype)
    weight = jnp.asarray(tab.desc, dtype)[body] * mass
    anc = jnp.asarray(tab.anc_dof, dtype)                       # (nbody, nv)
    offset = d.xipos - d.subtree_com[np.asarray(m.body_rootid)]  # (nbody, 3)
    rot = d.cdof[:, :3]
    # jacp of every body com: cdof_lin + cdof_rot x offset_b, masked by anc_dof
    lin = d.cdof[None, :, 3:] + math.cross(rot[None], offset[:, None, :])
    total = jnp.einsum("b,bv,bvk->kv", weight, anc, lin)
    return total / jnp.sum(weight)


# --------------------------------------------------------------------------- inertia
def full_m(m, d):
    """Dense inertia matrix (nv, nv) (mj_fullM)."""
    return d.qM


def mul_m(m, d, vec):
    """qM @ vec (mj_mulM); vec (nv,) or (nv, k)."""
    return d.qM @ vec


def solve_m(m, d, vec):
    """qM^-1 vec via the factor qLD (mj_solveM); vec (nv,) or (nv, k)."""
    from simjax.engine import tree_linalg
    return tree_linalg.solve_ld(m, d.qLD, vec)


def m_sparsity(m, layout="M"):
    """Static (rows, cols) of MuJoCo's packed inertia storage.

    layout "M": MuJoCo 4.0's reduced CSR ``mjData.M`` / ``qLD`` (nC entries: row i
    lists i's ancestor dofs in increasing order, ending with the diagonal; the row of a
    dof of a simple body, ``dof_simplenum > 0``, holds the diagonal alone, whose
    off-diagonal entries are zero); "qM": the legacy ``dof_Madr`` layout (nM entries:
    diagonal first, then every ancestor going up the tree).
    """
    mask = tables.get(m).m_mask
    simple = tables.dof_simplenum(m) > 0 if layout == "M" else np.zeros(m.nv, bool)
    rows, cols = [], []
    for i in range(m.nv):
        anc = np.array([i]) if simple[i] else np.nonzero(mask[i])[0]
        order = anc if layout == "M" else anc[::-1]
        rows += [i] * len(anc)
        cols += list(order)
    return np.asarray(rows, np.int64), np.asarray(cols, np.int64)


def pack_m(m, qM, layout="M"):
    """Pack a dense inertia-like matrix into MuJoCo's sparse layout (see m_sparsity)."""
    rows, cols = m_sparsity(m, layout)
    return qM[..., rows, cols]


# --------------------------------------------------------------------------- forces
def apply_ft(m, d, force, torque, point, bodies):
    """Generalised force (nv,) of world forces/torques applied at points (mj_applyFT).

    force, torque: (n, 3) world frame (either may be None); point: (n, 3) world
    application points; bodies: (n,) static body ids. Vectorised over all n at once.
    """
    bodies = np.asarray(checked_id(bodies, m.nbody, "body"))
    # on component arrays (n,): a cross product along a last axis of 3 and a dot over
    # 6 cost XLA CPU concatenations and a reduction kernel (humanoid's xfrc_applied:
    # 0.95 -> 0.67 us per world)
    offset = math.unstack(point - math.take(d.subtree_com, np.asarray(m.body_rootid)[bodies]))
    zero = (jnp.zeros_like(offset[0]),) * 3
    f = zero if force is None else math.unstack(force)
    t = zero if torque is None else math.unstack(torque)
    wrench = math.stack(math.c_add(t, math.c_cross(offset, f)) + f)   # about the tree com
    g = math.unstack(math.const_dot(tables.get(m).anc_dof[bodies].T, wrench))   # (nv, 6)
    cdof = math.unstack(d.cdof)
    out = cdof[0] * g[0]
    for k in range(1, 6):
        out = out + cdof[k] * g[k]
    return out


def xfrc_accumulate(m, d):
    """Generalised force (nv,) of xfrc_applied (force:torque at body coms)."""
    xfrc = d.xfrc_applied[1:]
    bodies = np.arange(1, m.nbody)
    return apply_ft(m, d, xfrc[:, :3], xfrc[:, 3:], d.xipos[1:], bodies)


def object_velocity(m, d, bodies, pos, rot=None):
    """6D velocity (n, 6, rot:lin) of frames at ``pos`` rigidly attached to ``bodies``
    (mj_objectVelocity); in the frames ``rot`` (n, 3, 3) if given, else world axes."""
    bodies = np.asarray(checked_id(bodies, m.nbody, "body"))
    vel = math.transform_motion(
        math.take(d.cvel, bodies), pos,
        math.take(d.subtree_com, np.asarray(m.body_rootid)[bodies]), rot)
    static = np.asarray(m.body_dofnum)[np.asarray(m.body_weldid)[bodies]] == 0
    if static.any():
        vel = math.where(static[:, None], 0.0, vel)
    return vel


# --------------------------------------------------------------------------- qpos algebra
def _joint_groups(m):
    jtype = np.asarray(m.jnt_type)
    return {t: np.nonzero(jtype == t)[0] for t in JointType}


def integrate_pos(m, qpos, qvel, dt):
    """qpos advanced by qvel over dt (mj_integratePos); quaternions via exp map.

    qpos (nq,), qvel (nv,). Hinge/slide add dt*v; ball and the rotation of free joints
    rotate by the local angular velocity; free positions add dt*v.
    """
    if not m.njnt:
        return qpos
    qadr, dadr = np.asarray(m.jnt_qposadr), np.asarray(m.jnt_dofadr)
    g = _joint_groups(m)
    idx, vals = [], []
    take = math.take
    scalar = np.concatenate([g[JointType.HINGE], g[JointType.SLIDE]])
    if len(scalar):
        idx.append(qadr[scalar])
        vals.append(take(qpos, qadr[scalar]) + dt * take(qvel, dadr[scalar]))
    free = g[JointType.FREE]
    if len(free):
        pi = (qadr[free][:, None] + np.arange(3)).ravel()
        idx.append(pi)
        vals.append(take(qpos, pi) +
                    dt * take(qvel, (dadr[free][:, None] + np.arange(3)).ravel()))
    rot = np.concatenate([free, g[JointType.BALL]])
    if len(rot):
        off = np.where(np.asarray(m.jnt_type)[rot] == JointType.FREE, 3, 0)
        qi = (qadr[rot] + off)[:, None] + np.arange(4)
        vi = (dadr[rot] + off)[:, None] + np.arange(3)
        idx.append(qi.ravel())
        vals.append(_quat_integrate(take(qpos, qi), take(qvel, vi), dt).ravel())
    return _assemble(m.nq, qpos, idx, vals)


def _quat_integrate(q, vel, dt):
    """:func:`math.quat_integrate` of (k, 4) quaternions on component arrays: one
    fused kernel, where the norms over a last axis of 3 and 4 cost XLA CPU separate
    reduction, sqrt and division kernels."""
    v = math.unstack(vel)
    n = math.safe_sqrt(v[0] * v[0] + v[1] * v[1] + v[2] * v[2])
    s = math._sin_half_over(n, dt)
    rot = (jnp.cos(0.5 * (dt * n)),) + tuple(c * s for c in v)
    return math.stack(math.c_qmul(math.c_quat_normalize(math.unstack(q)), rot))


def _assemble(n, base, idx, vals):
    """Vector of length n with entries idx[k] <- vals[k] (each index once), gather-only."""
    idx = np.concatenate(idx)
    vals = jnp.concatenate(vals)
    src = np.arange(len(idx), len(idx) + n)
    src[idx] = np.arange(len(idx))
    return math.take(jnp.concatenate([vals, base]), src)


def differentiate_pos(m, qpos1, qpos2, dt):
    """Velocity (nv,) taking qpos1 to qpos2 over dt (mj_differentiatePos)."""
    if not m.njnt:
        return jnp.zeros(m.nv, qpos1.dtype)
    qadr, dadr = np.asarray(m.jnt_qposadr), np.asarray(m.jnt_dofadr)
    g = _joint_groups(m)
    idx, vals = [], []
    scalar = np.concatenate([g[JointType.HINGE], g[JointType.SLIDE]])
    if len(scalar):
        idx.append(dadr[scalar])
        vals.append((qpos2[qadr[scalar]] - qpos1[qadr[scalar]]) / dt)
    free = g[JointType.FREE]
    if len(free):
        pi = (qadr[free][:, None] + np.arange(3)).ravel()
        idx.append((dadr[free][:, None] + np.arange(3)).ravel())
        vals.append((qpos2[pi] - qpos1[pi]) / dt)
    rot = np.concatenate([free, g[JointType.BALL]])
    if len(rot):
        off = np.where(np.asarray(m.jnt_type)[rot] == JointType.FREE, 3, 0)
        qi = (qadr[rot] + off)[:, None] + np.arange(4)
        idx.append(((dadr[rot] + off)[:, None] + np.arange(3)).ravel())
        vals.append((math.sub_quat(qpos2[qi], qpos1[qi]) / dt).ravel())
    return _assemble(m.nv, jnp.zeros(m.nv, qpos1.dtype), idx, vals)


# --------------------------------------------------------------------------- energy
def energy_pos(m, d):
    """Potential energy (mj_energyPos): gravity plus joint and tendon springs (their
    references the plastic ones where they yield, :mod:`simjax.engine.plastic`)."""
    from simjax.engine.passive import poly_potential
    from simjax.engine.plastic import spring_refs
    dtype = d.qpos.dtype
    energy = jnp.zeros((), dtype)
    if not (m.opt.disableflags & DisableBit.GRAVITY):
        g = jnp.asarray(m.opt.gravity, dtype).reshape(3)
        energy = energy - jnp.sum(jnp.asarray(m.body_mass, dtype)[1:] * (d.xipos[1:] @ g))
    if m.opt.disableflags & DisableBit.SPRING:
        return energy
    if m.njnt:
        k = jnp.asarray(m.jnt_stiffness, dtype)
        poly = jnp.asarray(m.jnt_stiffnesspoly, dtype).reshape(m.njnt, 2)
        qs = spring_refs(m, d, dtype)[0]
        qadr = np.asarray(m.jnt_qposadr)
        g = _joint_groups(m)
        scalar = np.concatenate([g[JointType.HINGE], g[JointType.SLIDE]])
        if len(scalar):
            x = d.qpos[qadr[scalar]] - qs[qadr[scalar]]
            energy = energy + jnp.sum(poly_potential(k[scalar], poly[scalar], x, False))
        free = g[JointType.FREE]
        if len(free):
            pi = qadr[free][:, None] + np.arange(3)
            r = math.norm(d.qpos[pi] - qs[pi])
            energy = energy + jnp.sum(poly_potential(k[free], poly[free], r, False))
        rot = np.concatenate([free, g[JointType.BALL]])
        if len(rot):
            off = np.where(np.asarray(m.jnt_type)[rot] == JointType.FREE, 3, 0)
            qi = (qadr[rot] + off)[:, None] + np.arange(4)
            # MuJoCo differences the raw (unnormalised) qpos quaternion here
            r = math.norm(math.sub_quat(d.qpos[qi], qs[qi]))
            energy = energy + jnp.sum(poly_potential(k[rot], poly[rot], r, False))
    if m.ntendon:
        length = d.ten_length
        rng = spring_refs(m, d, dtype)[1]
        x = math.where(length > rng[:, 1], length - rng[:, 1],
                       math.where(length < rng[:, 0], length - rng[:, 0], 0.0))
        spoly = jnp.asarray(m.tendon_stiffnesspoly, dtype).reshape(m.ntendon, 2)
        energy = energy + jnp.sum(poly_potential(
            jnp.asarray(m.tendon_stiffness, dtype), spoly, x, False))
    return energy


def energy_vel(m, d):
    """Kinetic energy 0.5 qvel' qM qvel (mj_energyVel)."""
    return 0.5 * d.qvel @ (d.qM @ d.qvel)
