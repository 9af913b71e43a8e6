"""Constraint forces read back from the solver's rows and the post-constraint RNE
pass: contact forces in the contact frame (MuJoCo's mj_contactForce), and body
accelerations and interaction forces after the constraint solve
(mj_rnePostConstraint: ``cacc``, ``cfrc_ext``, ``cfrc_int``), which the acceleration
sensors (:mod:`simjax.engine.sensor`) and contact sensors read.

Rows are read from Data when it has them (``efc_force``, ``efc_type``, ``efc_id``);
where a model needs them and Data has none, UnsupportedFeatureError at trace time.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from simjax.engine import math
from simjax.engine import smooth
from simjax.engine import tables
from simjax.errors import UnsupportedFeatureError
from simjax.types import ConeType, DisableBit, EqType, ObjType

#: mjtConstraint values used to find rows
CNSTR_EQUALITY, CNSTR_LIMIT_JOINT, CNSTR_LIMIT_TENDON = 0, 3, 4


def _f(x, dtype):
    return jnp.asarray(x, dtype)


def transform_force(vec, newpos, oldpos, rot=None):
    """Re-express a 6D force (torque:force) about a new point, optionally rotated into a
    frame (mju_transformSpatial with flg_force=1)."""
    torque = vec[..., :3] - math.cross(newpos - oldpos, vec[..., 3:])
    force = vec[..., 3:]
    if rot is not None:
        torque, force = math.matTvec(rot, torque), math.matTvec(rot, force)
    return jnp.concatenate([torque, force], -1)


# --------------------------------------------------------------------------- constraints
def has_rows(d):
    """Whether Data carries constraint rows and the solver's output (efc_force,
    efc_type)."""
    return getattr(d, "efc_force", None) is not None and getattr(d, "efc_type", None) is not None


def efc_row(d, ctype, ids):
    """(row index (k,), found (k,)) of the first efc row of type ``ctype`` and id
    ``ids`` (static), as MuJoCo's scan of rows ne+nf..nefc."""
    etype, eid = d.efc_type, d.efc_id
    if etype.shape[0] == 0:
        return jnp.zeros(len(ids), jnp.int32), jnp.zeros(len(ids), bool)
    mask = (etype[None, :] == ctype) & (eid[None, :] == jnp.asarray(ids)[:, None])
    active = getattr(d, "efc_active", None)
    if active is not None:                    # fixed-capacity rows: only those in use
        mask = mask & active[None, :]
    else:
        mask = mask & (jnp.arange(etype.shape[0]) < d.nefc)[None, :]
    return jnp.argmax(mask, -1), jnp.any(mask, -1)


def contacts_possible(m):
    return not (m.opt.disableflags & (DisableBit.CONSTRAINT | DisableBit.CONTACT))


#: single entries set by selects against a constant mask (False: .at[] updates, the
#: former way, kept to compare: XLA compiles each as an in-place update kernel of its own)
_ONEHOT = True


def _zero_world(x):
    """``x`` (nbody, ...) with the world body's row zero."""
    if not _ONEHOT:
        return x.at[0].set(0.0)
    first = (np.arange(x.shape[0]) == 0).reshape((-1,) + (1,) * (x.ndim - 1))
    return math.where(first, 0.0, x)


def contact_force(m, d):
    """Contact force:torque in the contact frame for every contact slot (mj_contactForce):
    (ncon_max, 6); zero for empty slots and contacts without efc rows."""
    con = d.contact
    dtype = d.qpos.dtype
    n = con.dist.shape[0]
    out = jnp.zeros((n, 6), dtype)
    if n == 0:
        return out
    if not has_rows(d):
        raise UnsupportedFeatureError("contact forces (Data has no efc_force)")
    dim = con.dim[:, None]
    r = np.arange(10)
    nefc = d.efc_force.shape[0]
    if nefc == 0:
        return out
    ok = con.valid & (con.efc_address >= 0)
    f = _static_rows(m, d)
    if f is None:
        f = d.efc_force[jnp.clip(con.efc_address[:, None] + r, 0, nefc - 1)]    # (n, 10)
    if m.opt.cone == ConeType.PYRAMIDAL:
        # pyramid edges come in pairs per friction direction (mju_decodePyramid)
        nrow = math.where(dim == 1, 1, 2 * (dim - 1))
        normal = jnp.sum(math.where(r < nrow, f, 0.0), -1, keepdims=True)
        mu = con.friction
        tang = (f[:, 0:10:2] - f[:, 1:10:2]) * mu
        tang = math.where(np.arange(5) < dim - 1, tang, 0.0)
        out = jnp.concatenate([normal, tang], -1)[:, :6]
    else:
        out = math.where(r[:6] < dim, f[:, :6], 0.0)
    if _ONEHOT:
        out = math.where(np.arange(out.shape[-1]) == 0, out - con.adhesion[:, None], out)
    else:
        out = out.at[:, 0].add(-con.adhesion)
    return math.where(ok[:, None], out, 0.0)


def _static_rows(m, d):
    """Every contact slot's efc_force rows (ncon_max, 10), zero past the slot's rows,
    as static slices of efc_force when the rows of each slot are fixed by the row
    layout (make_constraint's blocks of contact slots); None when they are not (a
    gather at efc_address then). Entries of slots without rows are masked by the
    caller."""
    from simjax.engine import constraint
    try:
        lay = constraint.layout(m, constraint.slot_dims(d))
    except UnsupportedFeatureError:
        return None
    n = d.contact.dist.shape[0]
    blocks = [b for b in lay.blocks if b.kind in constraint.CONTACT_KINDS]
    if d.efc_force.shape[0] != lay.nefc or sum(b.n for b in blocks) != n:
        return None
    parts, slots = [], []
    for b in blocks:
        rows = d.efc_force[b.start:b.start + b.n * b.k].reshape(b.n, b.k)
        parts.append(jnp.pad(rows[:, :10], ((0, 0), (0, 10 - min(b.k, 10)))))
        slots.append(np.asarray(b.ids))
    order = np.concatenate(slots)
    f = jnp.concatenate(parts)
    if not np.array_equal(order, np.arange(n)):
        f = f[np.argsort(order)]
    return f


def contact_bodies(m, con):
    gb = jnp.asarray(np.asarray(m.geom_bodyid), jnp.int32)
    g = jnp.maximum(con.geom, 0)
    return gb[g[:, 0]], gb[g[:, 1]]


# --------------------------------------------------------------------------- rne post
def rne_post_constraint(m, d):
    """Body accelerations and interaction forces after the constraint solve
    (mj_rnePostConstraint).

    cacc (nbody, 6): com-based acceleration (world at -gravity); cfrc_ext (nbody, 6):
    external forces (xfrc_applied, contacts, connect and weld constraints) as com-based
    torque:force; cfrc_int (nbody, 6): force each body receives from its parent
    (cinert cacc + cvel x* cinert cvel - cfrc_ext, summed over the subtree).
    """
    tab = tables.get(m)
    dtype = d.qpos.dtype
    nbody = m.nbody
    root = np.asarray(m.body_rootid)
    world = jnp.concatenate([jnp.zeros(3, dtype), -smooth.gravity(m, dtype)])
    if m.nv:
        acc_dof = d.cdof_dot * d.qvel[:, None] + d.cdof * d.qacc[:, None]
        cacc = math.const_dot(tab.anc_dof, acc_dof) + world
    else:
        cacc = jnp.broadcast_to(world, (nbody, 6))
    # external forces: perturbations applied at the body com
    xfrc = d.xfrc_applied
    wrench = jnp.concatenate([xfrc[:, 3:], xfrc[:, :3]], -1)
    ext = transform_force(wrench, math.take(d.subtree_com, root), d.xipos)
    ext = _zero_world(ext)
    ext = ext + _contact_ext(m, d) + _equality_ext(m, d)
    body = math.inert_mul(d.cinert, cacc) + math.force_cross(
        d.cvel, math.inert_mul(d.cinert, d.cvel))
    own = _zero_world(body - ext)
    cfrc_int = math.const_dot(tab.desc, own)
    return d.replace(cacc=cacc, cfrc_ext=ext, cfrc_int=cfrc_int)


def _contact_body_set(m, side=None):
    """Bodies (> 0, static) that a contact's geom can belong to: those of the geom pairs
    the collision driver may test (``candidate_pairs``; with ``side`` 0 or 1, those of
    the pairs' first or second geom, the contact's geom[side]); every body > 0 when the
    geoms' contype or conaffinity are traced."""
    from simjax.engine.collision.pairs import candidate_pairs
    if tables.concrete(m.geom_contype) is None or tables.concrete(m.geom_conaffinity) is None:
        return np.arange(1, m.nbody)
    g1, g2, _ = candidate_pairs(m)
    g = np.concatenate([g1, g2]) if side is None else (g1, g2)[side]
    bodies = np.unique(np.asarray(m.geom_bodyid)[g])
    return bodies[bodies > 0]


def _contact_ext(m, d):
    dtype = d.qpos.dtype
    con = d.contact
    n = con.dist.shape[0]
    cand = _contact_body_set(m)
    if n == 0 or not contacts_possible(m) or not len(cand):
        return jnp.zeros((m.nbody, 6), dtype)
    lfrc = contact_force(m, d)
    frame = con.frame
    cfrc = jnp.concatenate([math.matTvec(frame, lfrc[:, 3:]), math.matTvec(frame, lfrc[:, :3])], -1)
    ok = con.valid & (con.efc_address >= 0) & (con.geom[:, 0] >= 0) & (con.geom[:, 1] >= 0)
    b1, b2 = contact_bodies(m, con)
    root = jnp.asarray(np.asarray(m.body_rootid), jnp.int32)
    # per candidate body, the contacts' wrenches added in slot order, written out:
    # vmapped, a product with a one-hot matrix is a slow batched kernel on CPU
    ids = jnp.asarray(cand, jnp.int32)
    acc = jnp.zeros((len(cand), 6), dtype)
    for side, b, sign in ((0, b1, -1.0), (1, b2, 1.0)):
        # a side whose geoms all belong to the world (a floor, a height field: the
        # first geom of its pairs) adds nothing to the bodies > 0
        if not len(_contact_body_set(m, side)):
            continue
        w = transform_force(cfrc, d.subtree_com[root[b]], con.pos)
        hit = (b[:, None] == ids[None, :]) & ok[:, None]
        terms = jnp.split(math.where(hit[:, :, None], w[:, None, :], 0.0), n)  # (1, K, 6)
        part = terms[0]
        for t in terms[1:]:
            part = part + t
        part = part[0]
        acc = acc + sign * part
    row = np.zeros(m.nbody, np.int64)
    row[cand] = 1 + np.arange(len(cand))
    return math.take(jnp.concatenate([jnp.zeros((1, 6), dtype), acc]), row)


def _weld_torque(m, d, ids, data, lam):
    """World torque of weld constraints' rotational rows: their Jacobian is
    0.5 torquescale vec(neg(q1) (0, w) q0 relpose), so the torque is that map's
    transpose applied to the row forces (MuJoCo 4.0)."""
    dtype = d.qpos.dtype
    body_sem = np.asarray(m.eq_objtype)[ids] == ObjType.BODY
    o1, o2 = np.asarray(m.eq_obj1id)[ids], np.asarray(m.eq_obj2id)[ids]
    sbody = np.asarray(m.site_bodyid) if m.nsite else np.zeros(1, np.int64)
    squat = _f(m.site_quat, dtype) if m.nsite else jnp.zeros((1, 4), dtype)
    b1 = np.where(body_sem, o1, sbody[np.where(body_sem, 0, o1)])
    b2 = np.where(body_sem, o2, sbody[np.where(body_sem, 0, o2)])
    local1 = math.where(jnp.asarray(body_sem)[:, None], data[:, 6:10],
                        squat[np.where(body_sem, 0, o1)])
    local2 = math.where(jnp.asarray(body_sem)[:, None], jnp.array([1.0, 0, 0, 0], dtype),
                        squat[np.where(body_sem, 0, o2)])
    q0 = math.quat_mul(d.xquat[b1], local1)
    q1 = math.quat_neg(math.quat_mul(d.xquat[b2], local2))
    basis = jnp.asarray(np.eye(4)[1:], dtype)                              # (3, 4)
    cols = math.quat_mul(math.quat_mul(q1[:, None], basis[None]), q0[:, None])[..., 1:]
    scale = 0.5 * data[:, 10]
    return scale[:, None] * jnp.einsum("kjc,kc->kj", cols, lam)       # G^T lam


def _equality_ext(m, d):
    dtype = d.qpos.dtype
    out = jnp.zeros((m.nbody, 6), dtype)
    if not m.neq or m.opt.disableflags & (DisableBit.CONSTRAINT | DisableBit.EQUALITY):
        return out
    etype = np.asarray(m.eq_type)
    ids = np.nonzero((etype == EqType.CONNECT) | (etype == EqType.WELD))[0]
    if not len(ids):
        return out
    if not has_rows(d):
        raise UnsupportedFeatureError("cfrc_ext of connect/weld constraints "
                                      "(Data has no efc rows)")
    row, found = efc_row(d, CNSTR_EQUALITY, ids)
    weld = etype[ids] == EqType.WELD
    nrow = d.efc_force.shape[0]
    f = d.efc_force[jnp.clip(row[:, None] + np.arange(6), 0, nrow - 1)]
    force = f[:, :3]
    body_sem = np.asarray(m.eq_objtype)[ids] == ObjType.BODY
    data = _f(m.eq_data, dtype).reshape(-1, 12)[ids]
    torque = math.where(jnp.asarray(weld)[:, None], _weld_torque(m, d, ids, data, f[:, 3:6]),
                        0.0)
    cfrc = math.where(found[:, None], jnp.concatenate([torque, force], -1), 0.0)
    site_pos = _f(m.site_pos, dtype) if m.nsite else jnp.zeros((1, 3), dtype)
    sbody = np.asarray(m.site_bodyid) if m.nsite else np.zeros(1, np.int64)
    root = np.asarray(m.body_rootid)
    for obj, sign, first in ((np.asarray(m.eq_obj1id)[ids], 1.0, True),
                             (np.asarray(m.eq_obj2id)[ids], -1.0, False)):
        k = np.where(body_sem, obj, sbody[np.where(body_sem, 0, obj)])
        # anchor on body 1: connect eq_data[0:3], weld eq_data[3:6]; on body 2 the other
        use_hi = weld if first else ~weld
        anchor = math.where(jnp.asarray(use_hi)[:, None], data[:, 3:6], data[:, 0:3])
        offset = math.where(jnp.asarray(body_sem)[:, None], anchor,
                            site_pos[np.where(body_sem, 0, obj)])
        pos = d.xpos[k] + math.matvec(d.xmat[k], offset)
        w = transform_force(cfrc, d.subtree_com[root[k]], pos)
        w = math.where(jnp.asarray(k > 0)[:, None], w, 0.0)
        onehot = np.zeros((len(ids), m.nbody))
        onehot[np.arange(len(ids)), k] = 1.0
        out = out + sign * (jnp.asarray(onehot, dtype).T @ w)
    return out
