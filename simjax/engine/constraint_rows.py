"""Constraint rows of each kind for make_constraint (constraint.py), as MuJoCo's
engine_core_constraint.c instantiates them: equality (mj_instantiateEquality, anchors as
mj_equalityAnchors: connect, weld, joint and tendon couplings), friction loss
(mj_instantiateFriction), limits (mj_instantiateLimit: hinge / slide, ball, tendon) and
contacts (mj_instantiateContact: rows as mj_jacDifPair projected on the contact frame,
pyramidal or elliptic), with the diagonal approximation inputs (mj_diagApprox: body /
dof / tendon invweight0). Each returns the Jacobian, positions and diagonals of one
static block of rows (constraint_layout.py); impedance, reference and assembly are in
constraint.py.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from simjax.engine import math
from simjax.engine import support
from simjax.engine import tables
from simjax.engine.tables import has_adhesion
from simjax.engine.constraint_layout import CONTACT_KINDS, _LAYOUTS, _disabled, friction_masks
from simjax.types import DisableBit, ObjType
from simjax.types import frictionloss_structure


# --------------------------------------------------------------------------- helpers
def take(x, ids):
    """x[ids] for a static index array; a slice when ids is a contiguous range (a
    gather with constant indices is not simplified to one, and is slow under vmap)."""
    ids = np.asarray(ids)
    if len(ids) and np.array_equal(ids, ids[0] + np.arange(len(ids))):
        return x[int(ids[0]):int(ids[0]) + len(ids)]
    return math.take_rows(x, ids)


def put_at(x, ids, val):
    """x.at[ids].set(val) for a static index array (a slice update when contiguous)."""
    ids = np.asarray(ids)
    if len(ids) and np.array_equal(ids, ids[0] + np.arange(len(ids))):
        return x.at[int(ids[0]):int(ids[0]) + len(ids)].set(val)
    return x.at[ids].set(val)


def _jacs(m, d, points, bodies):
    """Jacobians of world points (n, 3) on bodies (n,): (jacp, jacr), each (n, 3, nv)."""
    return jax.vmap(lambda p, b: support.jac(m, d, p, b))(points, jnp.asarray(bodies))


def _f(x, dtype):
    return jnp.asarray(x, dtype)


def _quat_axis(q, axis):
    """q * (0, axis) (mju_mulQuatAxis)."""
    zero = jnp.zeros(axis.shape[:-1] + (1,), axis.dtype)
    return math.quat_mul(q, jnp.concatenate([zero, axis], -1))


def _anchors(m, d, ids, weld):
    """Global anchor points and bodies of connect/weld equalities (mj_equalityAnchors)."""
    dtype = d.qpos.dtype
    data = _f(m.eq_data, dtype).reshape(m.neq, -1)[ids]
    o1 = np.asarray(m.eq_obj1id)[ids]
    o2 = np.asarray(m.eq_obj2id)[ids]
    site = np.asarray(m.eq_objtype)[ids] == ObjType.SITE
    a1, a2 = (data[:, 3:6], data[:, 0:3]) if weld else (data[:, 0:3], data[:, 3:6])
    bp1 = math.matvec(d.xmat[o1], a1) + d.xpos[o1]
    bp2 = math.matvec(d.xmat[o2], a2) + d.xpos[o2]
    sb = np.asarray(m.site_bodyid)
    if site.any():
        s1 = np.where(site, o1, 0)
        s2 = np.where(site, o2, 0)
        bp1 = math.where(site[:, None], d.site_xpos[s1], bp1)
        bp2 = math.where(site[:, None], d.site_xpos[s2], bp2)
        b1 = np.where(site, sb[s1] if m.nsite else 0, o1)
        b2 = np.where(site, sb[s2] if m.nsite else 0, o2)
    else:
        b1, b2 = o1, o2
    return bp1, bp2, b1, b2, site, o1, o2, data


def _weld_quats(m, d, site, o1, o2, b1, b2, data):
    """(q0 * relpose, neg(q1)) of weld equalities, body or site semantic."""
    q0 = math.quat_mul(d.xquat[b1], data[:, 6:10])
    q1 = d.xquat[b2]
    if site.any():
        sq = _f(m.site_quat, d.qpos.dtype).reshape(-1, 4)
        s1 = np.where(site, o1, 0)
        s2 = np.where(site, o2, 0)
        q0 = math.where(site[:, None], math.quat_mul(d.xquat[b1], sq[s1]), q0)
        q1 = math.where(site[:, None], math.quat_mul(d.xquat[b2], sq[s2]), q1)
    return q0, math.quat_neg(q1)


# --------------------------------------------------------------------------- rows
def _eq_rows(m, d, blk):
    """(J (n,k,nv), pos (n,k), impedance pos (n,), diagA (n,k), active (n,))."""
    dtype = d.qpos.dtype
    ids = blk.ids
    iw = _f(m.body_invweight0, dtype).reshape(m.nbody, 2)
    active = d.eq_active[ids]
    if blk.kind in ("connect", "weld"):
        weld = blk.kind == "weld"
        p1, p2, b1, b2, site, o1, o2, data = _anchors(m, d, ids, weld)
        jp1, jr1 = _jacs(m, d, p1, b1)
        jp2, jr2 = _jacs(m, d, p2, b2)
        cpos = p1 - p2
        jac = jp1 - jp2
        tran = iw[b1, 0] + iw[b2, 0]
        if not weld:
            diag = jnp.repeat(tran[:, None], 3, 1)
            return jac, cpos, math.norm(cpos), diag, active
        ts = data[:, 10]
        q0, nq1 = _weld_quats(m, d, site, o1, o2, b1, b2, data)
        err = math.quat_mul(nq1, q0)[:, 1:] * ts[:, None]
        jr = jnp.swapaxes(jr1 - jr2, 1, 2)                             # (n, nv, 3)
        corr = math.quat_mul(_quat_axis(nq1[:, None], jr), q0[:, None])
        jrot = 0.5 * jnp.swapaxes(corr[..., 1:], 1, 2) * ts[:, None, None]
        jac = jnp.concatenate([jac, jrot], 1)
        cpos = jnp.concatenate([cpos, err], 1)
        rot = iw[b1, 1] + iw[b2, 1]
        diag = jnp.concatenate([jnp.repeat(tran[:, None], 3, 1),
                                jnp.repeat(rot[:, None], 3, 1)], 1)
        return jac, cpos, math.norm(cpos), diag, active
    data = _f(m.eq_data, dtype).reshape(m.neq, -1)[ids]
    o1 = np.asarray(m.eq_obj1id)[ids]
    o2 = np.asarray(m.eq_obj2id)[ids]
    has2 = o2 >= 0
    o2s = np.where(has2, o2, 0)
    if blk.kind == "jointeq":
        qadr = np.asarray(m.jnt_qposadr)
        dadr = np.asarray(m.jnt_dofadr)
        qpos0 = _f(m.qpos0, dtype).reshape(-1)
        pos1 = d.qpos[qadr[o1]] - qpos0[qadr[o1]]
        pos2 = d.qpos[qadr[o2s]] - qpos0[qadr[o2s]]
        eye = jnp.eye(m.nv, dtype=dtype)
        j1, j2 = eye[dadr[o1]], eye[dadr[o2s]]
        dinv = _f(m.dof_invweight0, dtype).reshape(-1)
        w1, w2 = dinv[dadr[o1]], dinv[dadr[o2s]]
    else:
        l0 = _f(m.tendon_length0, dtype).reshape(-1)
        pos1 = d.ten_length[o1] - l0[o1]
        pos2 = d.ten_length[o2s] - l0[o2s]
        j1, j2 = d.ten_J[o1], d.ten_J[o2s]
        tinv = _f(m.tendon_invweight0, dtype).reshape(-1)
        w1, w2 = tinv[o1], tinv[o2s]
    # quartic coupling (polycoef): pos1 = data0 + sum_k data_k pos2^k
    dif = pos2
    c = data[:, 1:5]
    poly = sum(c[:, k] * dif ** (k + 1) for k in range(4))
    deriv = sum((k + 1) * c[:, k] * dif ** k for k in range(4))
    cpos = pos1 - data[:, 0] - math.where(has2, poly, 0.0)
    jac = j1 - math.where(has2[:, None], deriv[:, None] * j2, 0.0)
    diag = w1 + math.where(has2, w2, 0.0)
    return jac[:, None], cpos[:, None], cpos, diag[:, None], active


def _friction_rows(m, d, blk):
    """(J (n, nv), friction loss (n,), diagA (n,), solref (n, 2), solimp (n, 5), J
    statically nonzero) of the block's dofs / tendons."""
    dtype = d.qpos.dtype
    ids = blk.ids
    if blk.kind == "frictiondof":
        jac = np.eye(m.nv)[ids]                # static: every row nonzero
        floss = take(_f(m.dof_frictionloss, dtype).reshape(-1), ids)
        diag = take(_f(m.dof_invweight0, dtype).reshape(-1), ids)
        ref = take(_f(m.dof_solref, dtype).reshape(-1, 2), ids)
        sim = take(_f(m.dof_solimp, dtype).reshape(-1, 5), ids)
        return jac, floss, diag, ref, sim, True
    jac = take(d.ten_J, ids)
    floss = take(_f(m.tendon_frictionloss, dtype).reshape(-1), ids)
    diag = take(_f(m.tendon_invweight0, dtype).reshape(-1), ids)
    ref = take(_f(m.tendon_solref_fri, dtype).reshape(-1, 2), ids)
    sim = take(_f(m.tendon_solimp_fri, dtype).reshape(-1, 5), ids)
    return jac, floss, diag, ref, sim, False


def _check_friction_structure(m):
    """ValueError where a concrete friction loss is non-zero on a dof / tendon that has
    no friction-loss row in the model's structure (a loss changed after the model was
    built), which would be silently ignored. Traced losses cannot be checked: their rows
    are those of the structure (as MJX's ``dof_hasfrictionloss``)."""
    if _disabled(m, DisableBit.CONSTRAINT) or _disabled(m, DisableBit.FRICTIONLOSS):
        return
    dof, ten = (tables.concrete(x) for x in (m.dof_frictionloss, m.tendon_frictionloss))
    want = frictionloss_structure(np.zeros(m.nv) if dof is None else dof,
                                  np.zeros(m.ntendon) if ten is None else ten)
    for what, need, have in zip(("dof", "tendon"), want.values(), friction_masks(m)):
        lost = np.nonzero(need & ~have)[0]
        if len(lost):
            raise ValueError(
                f"{what}_frictionloss is non-zero on {what} {int(lost[0])}, which has no "
                f"friction-loss row in this Model's structure ({what}_hasfrictionloss): "
                f"after changing which losses are zero, use m.replace(**simjax.types."
                f"frictionloss_structure(m.dof_frictionloss, m.tendon_frictionloss)) "
                f"and a new Data (make_data)")


def _limit_rows(m, d, blk):
    """(J (n,k,nv), dist (n,k), margin (n,), diagA (n,), active (n,k), J statically
    nonzero). Joint limit rows are static unit rows (numpy)."""
    dtype = d.qpos.dtype
    ids = blk.ids
    dinv = _f(m.dof_invweight0, dtype).reshape(-1)
    if blk.kind == "limitten":
        rng = math.take(_f(m.tendon_range, dtype).reshape(-1, 2), ids)
        margin = math.take(_f(m.tendon_margin, dtype).reshape(-1), ids)
        value = math.take(d.ten_length, ids)
        jrow = math.take(d.ten_J, ids)
        diag = math.take(_f(m.tendon_invweight0, dtype).reshape(-1), ids)
        static = False
    else:
        rng = math.take(_f(m.jnt_range, dtype).reshape(-1, 2), ids)
        margin = math.take(_f(m.jnt_margin, dtype).reshape(-1), ids)
        dadr = np.asarray(m.jnt_dofadr)[ids]
        diag = math.take(dinv, dadr)
        if blk.kind == "limitball":
            adr = np.asarray(m.jnt_qposadr)[ids]
            quat = math.quat_normalize(d.qpos[adr[:, None] + np.arange(4)])
            axis, value = math.normalize(math.quat_to_vel(quat))
            dist = jnp.maximum(rng[:, 0], rng[:, 1]) - value
            # -axis on the ball's 3 dofs (a unit vector: never an all-zero row)
            jac = jnp.zeros((len(ids), m.nv), dtype)
            jac = jac.at[np.arange(len(ids))[:, None], dadr[:, None] + np.arange(3)].set(-axis)
            return jac[:, None], dist[:, None], margin, diag, (dist < margin)[:, None], True
        value = math.take(d.qpos, np.asarray(m.jnt_qposadr)[ids])
        jrow = np.eye(m.nv)[dadr]
        static = True
    # side -1 (lower) then +1 (upper), as MuJoCo emits them
    dist = jnp.stack([value - rng[:, 0], rng[:, 1] - value], 1)
    if static:
        jac = np.stack([jrow, -jrow], 1)
    else:
        jac = jnp.stack([jrow, -jrow], 1)
    return jac, dist, margin, diag, dist < margin[:, None], static


def _dof_ranges(m):
    """(lo, hi) per dof with ``anc_dof[b, v] = lo[v] <= b <= hi[v]`` when every
    subtree is a contiguous range of body ids (MuJoCo's depth-first body order), else
    None."""
    key = ("dofrange", m.nbody, m.nv, np.asarray(m.body_parentid).tobytes(),
           np.asarray(m.dof_bodyid).tobytes())
    if key in _LAYOUTS:
        return _LAYOUTS[key]
    desc = tables.get(m).desc > 0
    lo = np.asarray(m.dof_bodyid, np.int64).reshape(-1)
    hi = np.zeros_like(lo)
    out = (lo, hi)
    ids = np.arange(m.nbody)
    for v, b in enumerate(lo):
        sub = np.nonzero(desc[b])[0]
        hi[v] = sub.max()
        if not np.array_equal(desc[b], (ids >= b) & (ids <= hi[v])):
            out = None
            break
    _LAYOUTS[key] = out
    return out


def _anc_mask(m, bodies, dtype):
    """anc_dof[bodies] (n, nv) as 0/1: two compares per entry when subtrees are
    contiguous body ranges (no gather of table rows), else a gather."""
    rng = _dof_ranges(m)
    if rng is None:
        return jnp.asarray(tables.get(m).anc_dof, dtype)[bodies]
    lo, hi = rng
    b = bodies[:, None]
    return ((b >= lo) & (b <= hi)).astype(dtype)


def _shifted_cdof_t(m, d, origin):
    """cdof transposed (6, nv), every dof's linear part taken about ``origin`` (3,)
    instead of the subtree com c of the dof's own tree root: lin - ang x (c - origin).
    One origin for all dofs makes a contact row one 6-term product per dof whichever
    trees its two bodies belong to (not one product per body about each tree's origin);
    the transposed copy (computed, so materialised once) makes each term's nv values
    contiguous for the row products."""
    cd = d.cdof
    roots = np.asarray(m.body_rootid)[np.asarray(m.dof_bodyid)]
    off = take(d.subtree_com, roots) - origin                           # (nv, 3)
    ang = cd[:, :3]
    shifted = jnp.concatenate([ang, cd[:, 3:] - math.cross(ang, off)], 1)
    # transposed by a gather, a kernel of its own: a transpose (or a stack of columns)
    # is fused into the row products as a strided read, recomputed per row
    perm = np.arange(6 * m.nv).reshape(m.nv, 6).T.reshape(-1)
    return math.take(shifted.reshape(-1), perm).reshape(6, m.nv)


def _slot_bodies(m, d):
    """(body1, body2, sign): the bodies of every contact slot's geoms (ncon,) and
    ``sign`` (ncon, nv), +1 on dofs moving body2 alone, -1 on those moving body1 alone,
    0 elsewhere (mj_jacDifPair's difference of the two bodies' Jacobians)."""
    con = d.contact
    gb = jnp.asarray(np.asarray(m.geom_bodyid, np.int32))
    b1 = gb[jnp.clip(con.geom[:, 0], 0)]
    b2 = gb[jnp.clip(con.geom[:, 1], 0)]
    dtype = d.qpos.dtype
    return b1, b2, _anc_mask(m, b2, dtype) - _anc_mask(m, b1, dtype)


def _contact_geometry(m, d, lay):
    """Per contact slot (all slots of ``d.contact``), shared by the contact blocks:
    sign (ncon, nv), direction 6-vectors w (ncon, ndir, 6), cdof about the common
    origin, friction (ncon, 5), diag tran / rot, ok, and ``one`` (ncon,): contacts of
    runtime dim 1 (adhesive contacts in the gap, whatever their slot's dim; None where
    the model has no adhesion).

    Row i of a contact is r_i . (mj_jac(body2, p) - mj_jac(body1, p)) (mj_jacDifPair
    projected on the row's direction): with the 6-vector w = ((p - c) x f, f) of a
    translational direction f ((f, 0) for a rotational one), c one origin for all dofs
    (the world's subtree com, cdof's linear parts moved to it), J_v = s_v (w . cdof_v),
    s_v = +1 for dofs moving body2 alone, -1 for body1 alone, 0 for both or neither."""
    dtype = d.qpos.dtype
    con = d.contact
    ndir = max(b.dim for b in lay.blocks if b.kind in CONTACT_KINDS)
    b1, b2, sign = _slot_bodies(m, d)
    frame = con.frame
    origin = d.subtree_com[0]
    f = frame[:, :min(ndir, 3)]
    w = jnp.concatenate([math.cross((con.pos - origin)[:, None], f), f], -1)
    if ndir > 3:
        rot = frame[:, :ndir - 3]
        w = jnp.concatenate([w, jnp.concatenate([rot, jnp.zeros_like(rot)], -1)], 1)
    iw = _f(m.body_invweight0, dtype).reshape(m.nbody, 2)
    # MuJoCo skips a contact only when its bodies' kinematic chains hold no dof (a
    # structural count, never the Jacobian's values; such pairs are not collision
    # candidates): a contact whose rows are numerically zero (an object on slide x/y
    # joints touching the table) keeps its rows
    ok = con.valid & (con.exclude == 0)
    one = (con.dim == 1) if has_adhesion(m) else None
    return dict(sign=sign, w=w,
                cdof=_shifted_cdof_t(m, d, origin), fr=con.friction,
                tran=iw[b1, 0] + iw[b2, 0], rot=iw[b1, 1] + iw[b2, 1], ok=ok, one=one)


def normal_jacobian(m, d):
    """Normal rows of every contact slot (ncon_max, nv): frame[0] . (jac(body2, pos) -
    jac(body1, pos)), the Jacobian of the contact's normal separation velocity
    (mj_contactJacobian's first row); zero for empty slots."""
    con = d.contact
    origin = d.subtree_com[0]
    f = con.frame[:, 0]
    w = jnp.concatenate([math.cross(con.pos - origin, f), f], -1)       # (n, 6)
    jac = w @ _shifted_cdof_t(m, d, origin)
    sign = _slot_bodies(m, d)[2]
    return math.where(con.valid[:, None], sign * jac, 0.0)


#: pyramidal rows' vectors by a sign (no stack), the contact R of the friction rows and
#: efc_active joined by concatenations (off: a stack, a slice update and a concatenation
#: along a major axis; for paired measurements)
_MAKECON = True


def _contact_rows(m, d, blk, geo):
    """Contact rows of one block: J (n,k,nv) (zero for inactive contacts), friction,
    diag tran/rot, ok (n,). Pyramidal rows combine the frame's 6-vectors
    (w_0 +- mu_i w_i) before the product with cdof, so each row is one 6-term sum per
    dof in one elementwise pass (no (3, nv) point Jacobians, no batched matrix
    products)."""
    slots = blk.ids
    dim, n, k = blk.dim, blk.n, blk.k
    fr = take(geo["fr"], slots)
    if geo["one"] is not None and dim > 1:
        # a contact of runtime dim 1 in a slot of more: its pyramid edges are all its
        # normal (the caller keeps the first alone), with the normal's diagApprox
        fr = math.where(take(geo["one"], slots)[:, None], 0.0, fr)
    w = take(geo["w"], slots)[:, :dim]                                  # (n, dim, 6)
    if blk.kind == "conpyr" and _MAKECON:
        # w_0 + fw and w_0 - fw as w_0 + s fw, s = +-1 (s fw exact): no stack, so the
        # rows' vectors fuse into the row products (a stack of them is a kernel of its
        # own)
        fw = fr[:, :dim - 1, None] * w[:, 1:dim]                        # (n, dim-1, 6)
        sgn = np.array([1.0, -1.0])[:, None]
        w = (w[:, :1, None] + sgn * fw[:, :, None]).reshape(n, k, 6)
    elif blk.kind == "conpyr":
        fw = fr[:, :dim - 1, None] * w[:, 1:dim]                        # (n, dim-1, 6)
        w = jnp.stack([w[:, :1] + fw, w[:, :1] - fw], 2).reshape(n, k, 6)
    cd = geo["cdof"]
    # each row's 6-vector times cdof as 6 products summed in one elementwise pass (a
    # batched matrix product or a minor-axis reduction of size 6 is several times
    # slower on CPU)
    wc = jax.lax.split(w, (1,) * 6, 2)                  # w[:, :, c, None]: one split
    jac = sum(a * b for a, b in zip(wc, math.unstack(cd, 0)))
    ok = take(geo["ok"], slots)
    jac = math.where(ok[:, None, None], take(geo["sign"], slots)[:, None, :] * jac, 0.0)
    return jac, fr, take(geo["tran"], slots), take(geo["rot"], slots), ok
