"""Constraint rows (MuJoCo's engine_core_constraint): mj_makeConstraint, mj_diagApprox,
mj_makeImpedance and mj_referenceConstraint with static shapes.

Rows keep MuJoCo's order (equality, friction loss, limits, contacts) but every block has
a capacity fixed at trace time, decided by :func:`layout` from static model structure and
the static contact dimension of each slot of ``Data.contact``:

- equality: 3 rows per connect, 6 per weld, 1 per joint / tendon coupling, active when
  ``Data.eq_active`` is set (MuJoCo drops inactive equalities; here they stay as
  inactive rows);
- friction loss: one row per dof and per tendon, active where the friction loss is
  positive (the friction loss is a physical parameter, so it may change under vmap);
- limits: two rows (lower, upper side) per limited hinge / slide joint and tendon, one
  per limited ball joint, active when the distance is below the margin;
- contacts: per slot of dimension ``dim``: 1 row (dim 1), 2 (dim - 1) rows (pyramidal)
  or ``dim`` rows (elliptic), active for valid, non-excluded contacts.

Inactive rows are exactly neutral: ``efc_active`` is false, ``efc_J`` is zero, and the
solvers give them zero force. A non-contact constraint whose rows all have an
identically zero Jacobian is inactive, as MuJoCo skips it; contact rows are kept even
with a zero Jacobian (as MuJoCo). ``ne``, ``nf``, ``nl`` and ``nefc`` count the active rows of each kind.

``efc_id`` holds the element id (equality, dof, tendon, joint) or, for contacts, the
slot index into ``Data.contact``.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from simjax.engine import math
from simjax.engine import support
from simjax.engine import tables
from simjax.engine import tree_linalg
from simjax.errors import UnsupportedFeatureError
from simjax.types import ConeType, DisableBit, EnableBit, EqType, JointType, ObjType
from simjax.types import frictionloss_structure

# mjtConstraint
EQUALITY, FRICTION_DOF, FRICTION_TENDON, LIMIT_JOINT, LIMIT_TENDON = 0, 1, 2, 3, 4
CONTACT_FRICTIONLESS, CONTACT_PYRAMIDAL, CONTACT_ELLIPTIC = 5, 6, 7
# mjtConstraintState
SATISFIED, QUADRATIC, LINEARNEG, LINEARPOS, CONE = 0, 1, 2, 3, 4

MINVAL = 1e-15
# layout block kinds of contact rows (frictionless, pyramidal, elliptic); a prefix test
# would also catch "connect"
CONTACT_KINDS = ("con1", "conpyr", "conell")
MINIMP, MAXIMP = 0.0001, 0.9999

from simjax.engine.data import EFC_FIELDS, EFC_SCALARS, EFC_SHAPES  # noqa: E402


# --------------------------------------------------------------------------- layout
@dataclasses.dataclass(frozen=True)
class Block:
    """A static block of rows: ``n`` elements of ``k`` rows each from row ``start``."""
    kind: str          # connect, weld, jointeq, tendoneq, frictiondof, frictionten,
                       # limitjnt, limitball, limitten, con1, conpyr, conell
    start: int
    n: int
    k: int
    ids: np.ndarray    # (n,) element ids (contacts: slot indices)
    dim: int = 0       # contact dimension (contact blocks)


@dataclasses.dataclass(frozen=True)
class Layout:
    nefc: int
    blocks: tuple
    efc_type: np.ndarray
    efc_id: np.ndarray
    ne: int
    nf: int
    nl: int


def _disabled(m, bit):
    return bool(m.opt.disableflags & bit)


def slot_dims(d):
    """Static contact dimension of every slot of ``d.contact`` (numpy, (ncon_max,))."""
    dims = getattr(d.contact, "slot_dim", None)
    n = d.contact.dist.shape[0]
    if dims is not None and len(dims) == n:
        return np.asarray(dims, np.int32)
    try:
        return np.asarray(d.contact.dim, np.int32).reshape(n)
    except Exception:  # traced without static slot dims
        raise UnsupportedFeatureError(
            "contact buffer without static slot dimensions (build it with make_contact)")


def layout(m, contact_dims) -> Layout:
    """Static row layout for model ``m`` and contact slot dimensions ``contact_dims``."""
    return _layout(m, tuple(int(x) for x in np.asarray(contact_dims).ravel()))


def friction_masks(m):
    """(nv,) and (ntendon,) bool masks (numpy) of the dofs and tendons with a friction-loss
    row: the Model's static ``dof_hasfrictionloss`` / ``tendon_hasfrictionloss`` (every
    one where the Model has none)."""
    dof, ten = m.dof_hasfrictionloss, m.tendon_hasfrictionloss
    dof = np.ones(m.nv, bool) if dof is None else np.asarray(dof, bool).reshape(-1)
    ten = np.ones(m.ntendon, bool) if ten is None else np.asarray(ten, bool).reshape(-1)
    return dof, ten


def _layout_key(m):
    dof_fl, ten_fl = friction_masks(m)
    return (m.nv, m.neq, m.njnt, m.ntendon, int(m.opt.disableflags), int(m.opt.cone),
            np.asarray(m.eq_type).tobytes(), np.asarray(m.eq_objtype).tobytes(),
            np.asarray(m.eq_obj2id).tobytes(), np.asarray(m.jnt_limited).tobytes(),
            np.asarray(m.jnt_type).tobytes(), np.asarray(m.tendon_limited).tobytes(),
            dof_fl.tobytes(), ten_fl.tobytes())


_LAYOUTS = {}


def _layout(m, dims):
    key = (_layout_key(m), dims)
    if key in _LAYOUTS:
        return _LAYOUTS[key]
    blocks, types, ids = [], [], []
    row = 0

    def add(kind, elems, k, ctype, dim=0):
        nonlocal row
        elems = np.asarray(elems, np.int64)
        if not len(elems):
            return
        blocks.append(Block(kind, row, len(elems), k, elems, dim))
        types.append(np.full(len(elems) * k, ctype, np.int32))
        ids.append(np.repeat(elems, k).astype(np.int32))
        row += len(elems) * k

    off = _disabled(m, DisableBit.CONSTRAINT)
    eq_type = np.asarray(m.eq_type).reshape(-1)
    if m.neq and not off and not _disabled(m, DisableBit.EQUALITY):
        bad = [t for t in eq_type if t not in (EqType.CONNECT, EqType.WELD, EqType.JOINT,
                                               EqType.TENDON)]
        if bad:
            raise UnsupportedFeatureError(f"equality constraint type {EqType(bad[0]).name}")
        add("connect", np.nonzero(eq_type == EqType.CONNECT)[0], 3, EQUALITY)
        add("weld", np.nonzero(eq_type == EqType.WELD)[0], 6, EQUALITY)
        add("jointeq", np.nonzero(eq_type == EqType.JOINT)[0], 1, EQUALITY)
        add("tendoneq", np.nonzero(eq_type == EqType.TENDON)[0], 1, EQUALITY)
    ne = row
    if not off and not _disabled(m, DisableBit.FRICTIONLOSS):
        # rows only where the model has a friction loss (a zero loss never activates
        # its row: MuJoCo adds none)
        dof_fl, ten_fl = friction_masks(m)
        add("frictiondof", np.nonzero(dof_fl)[0], 1, FRICTION_DOF)
        add("frictionten", np.nonzero(ten_fl)[0], 1, FRICTION_TENDON)
    nf = row - ne
    if not off and not _disabled(m, DisableBit.LIMIT):
        lim = np.asarray(m.jnt_limited, bool).reshape(-1)
        jt = np.asarray(m.jnt_type).reshape(-1)
        add("limitjnt", np.nonzero(lim & ((jt == JointType.HINGE) | (jt == JointType.SLIDE)))[0],
            2, LIMIT_JOINT)
        add("limitball", np.nonzero(lim & (jt == JointType.BALL))[0], 1, LIMIT_JOINT)
        if m.ntendon:
            add("limitten", np.nonzero(np.asarray(m.tendon_limited, bool).reshape(-1))[0],
                2, LIMIT_TENDON)
    nl = row - ne - nf
    dims = np.asarray(dims, np.int32)
    if len(dims) and not off and not _disabled(m, DisableBit.CONTACT) and m.nv:
        elliptic = m.opt.cone == ConeType.ELLIPTIC
        for dim in (1, 3, 4, 6):
            slots = np.nonzero(dims == dim)[0]
            if dim == 1:
                add("con1", slots, 1, CONTACT_FRICTIONLESS, 1)
            elif elliptic:
                add("conell", slots, dim, CONTACT_ELLIPTIC, dim)
            else:
                add("conpyr", slots, 2 * (dim - 1), CONTACT_PYRAMIDAL, dim)
        other = set(np.unique(dims).tolist()) - {1, 3, 4, 6}
        if other:
            raise UnsupportedFeatureError(f"contact dimension {sorted(other)[0]}")
    cat = (lambda xs: np.concatenate(xs) if xs else np.zeros(0, np.int32))
    out = Layout(row, tuple(blocks), cat(types), cat(ids), ne, nf, nl)
    _LAYOUTS[key] = out
    return out


def nefc_capacity(m, contact_dims) -> int:
    """Number of efc rows (capacity) for ``m`` and the contact slot dimensions."""
    return layout(m, contact_dims).nefc


def make_efc(m, contact_dims, ftype):
    """Zero-initialised efc fields for Data (used by make_data)."""
    lay = layout(m, contact_dims)
    n = lay.nefc
    out = {}
    for name, shape, kind in EFC_FIELDS:
        shp = (n,) + tuple(m.nv if s == "nv" else s for s in shape)
        dt = {"f": ftype, "i": jnp.int32, "b": jnp.bool_}[kind]
        out[name] = jnp.zeros(shp, dt)
    out["efc_type"] = jnp.asarray(lay.efc_type, jnp.int32)
    out["efc_id"] = jnp.asarray(lay.efc_id, jnp.int32)
    for name, kind in EFC_SCALARS:
        out[name] = jnp.zeros(EFC_SHAPES.get(name, ()), {"f": ftype, "i": jnp.int32}[kind])
    return out


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
        rng = _f(m.tendon_range, dtype).reshape(-1, 2)[ids]
        margin = _f(m.tendon_margin, dtype).reshape(-1)[ids]
        value = d.ten_length[ids]
        jrow = d.ten_J[ids]
        diag = _f(m.tendon_invweight0, dtype).reshape(-1)[ids]
        static = False
    else:
        rng = _f(m.jnt_range, dtype).reshape(-1, 2)[ids]
        margin = _f(m.jnt_margin, dtype).reshape(-1)[ids]
        dadr = np.asarray(m.jnt_dofadr)[ids]
        diag = dinv[dadr]
        if blk.kind == "limitball":
            adr = np.asarray(m.jnt_qposadr)[ids]
            quat = math.quat_normalize(d.qpos[adr[:, None] + np.arange(4)])
            axis, value = math.normalize(math.quat_to_vel(quat))
            dist = jnp.maximum(rng[:, 0], rng[:, 1]) - value
            # -axis on the ball's 3 dofs (a unit vector: never an all-zero row)
            jac = jnp.zeros((len(ids), m.nv), dtype)
            jac = jac.at[np.arange(len(ids))[:, None], dadr[:, None] + np.arange(3)].set(-axis)
            return jac[:, None], dist[:, None], margin, diag, (dist < margin)[:, None], True
        value = d.qpos[np.asarray(m.jnt_qposadr)[ids]]
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
    return shifted.reshape(-1)[perm].reshape(6, m.nv)


def _contact_geometry(m, d, lay):
    """Per contact slot (all slots of ``d.contact``), shared by the contact blocks:
    sign (ncon, nv), direction 6-vectors w (ncon, ndir, 6), cdof about the common
    origin, friction (ncon, 5), diag tran / rot and ok.

    Row i of a contact is r_i . (mj_jac(body2, p) - mj_jac(body1, p)) (mj_jacDifPair
    projected on the row's direction): with the 6-vector w = ((p - c) x f, f) of a
    translational direction f ((f, 0) for a rotational one), c one origin for all dofs
    (the world's subtree com, cdof's linear parts moved to it), J_v = s_v (w . cdof_v),
    s_v = +1 for dofs moving body2 alone, -1 for body1 alone, 0 for both or neither."""
    dtype = d.qpos.dtype
    con = d.contact
    ndir = max(b.dim for b in lay.blocks if b.kind in CONTACT_KINDS)
    gb = jnp.asarray(np.asarray(m.geom_bodyid, np.int32))
    b1 = gb[jnp.clip(con.geom[:, 0], 0)]
    b2 = gb[jnp.clip(con.geom[:, 1], 0)]
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
    return dict(sign=_anc_mask(m, b2, dtype) - _anc_mask(m, b1, dtype), w=w,
                cdof=_shifted_cdof_t(m, d, origin), fr=con.friction,
                tran=iw[b1, 0] + iw[b2, 0], rot=iw[b1, 1] + iw[b2, 1], ok=ok)


def _contact_rows(m, d, blk, geo):
    """Contact rows of one block: J (n,k,nv) (zero for inactive contacts), friction,
    diag tran/rot, ok (n,). Pyramidal rows combine the frame's 6-vectors
    (w_0 +- mu_i w_i) before the product with cdof, so each row is one 6-term sum per
    dof in one elementwise pass (no (3, nv) point Jacobians, no batched matrix
    products)."""
    slots = blk.ids
    dim, n, k = blk.dim, blk.n, blk.k
    fr = take(geo["fr"], slots)
    w = take(geo["w"], slots)[:, :dim]                                  # (n, dim, 6)
    if blk.kind == "conpyr":
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


# --------------------------------------------------------------------------- impedance
def _impedance(solimp, pos, margin):
    """Impedance and its derivative w.r.t. pos (getimpedance); solimp: its five
    components, clamped (:func:`_clamp_solimp`)."""
    d0, dw, width, mid, power = solimp
    flat = (d0 == dw) | (width <= MINVAL)
    wsafe = math.where(flat, 1.0, width)
    xr = (pos - margin) / wsafe
    sgn = math.where(xr < 0, -1.0, 1.0)
    x = jnp.abs(xr)
    sat = (x >= 1) | (x <= 0)
    xs = jnp.clip(x, 1e-30, 1.0)
    lin = power == 1
    p = math.where(lin, 2.0, power)
    # a x^p below mid, 1 - b (1-x)^p above, a = 1/mid^(p-1), b = 1/(1-mid)^(p-1):
    # with u = x or 1-x and t = (u / mid or 1-mid)^(p-1), y = u t or 1 - u t and
    # y' = p t (one power per row)
    lo = xs <= mid
    u = math.where(lo, xs, jnp.clip(1 - xs, 1e-30, None))
    # the power as exp(log): XLA CPU vectorises exp and log but calls pow per element
    t = jnp.exp((p - 1) * jnp.log(u / math.where(lo, mid, 1 - mid)))
    y = math.where(lin, xs, math.where(lo, u * t, 1 - u * t))
    yp = math.where(lin, 1.0, p * t)
    imp = math.where(sat, math.where(x >= 1, dw, d0), d0 + y * (dw - d0))
    impp = math.where(sat, 0.0, yp * sgn * (dw - d0) / wsafe)
    return (math.where(flat, 0.5 * (d0 + dw), imp), math.where(flat, 0.0, impp))


def _clamp_solimp(solimp):
    """The five components of solimp (..., 5), clamped (a list, not a stack: on CPU a
    stacked array with several users is a kernel of its own)."""
    s = solimp
    return [jnp.clip(s[..., 0], MINIMP, MAXIMP), jnp.clip(s[..., 1], MINIMP, MAXIMP),
            jnp.maximum(s[..., 2], 0.0), jnp.clip(s[..., 3], MINIMP, MAXIMP),
            jnp.maximum(s[..., 4], 1.0)]


def _safe_solref(m, ref, friction=False):
    """Mixed-sign check and REFSAFE clamp of a solref (..., 2) (getsolparam); its two
    components (see :func:`_clamp_solimp`)."""
    dtype = ref.dtype
    r0, r1 = ref[..., 0], ref[..., 1]
    mixed = (r0 > 0) ^ (r1 > 0)
    r0 = math.where(mixed, 0.0 if friction else 0.02, r0)
    r1 = math.where(mixed, 0.0 if friction else 1.0, r1)
    if not _disabled(m, DisableBit.REFSAFE):
        ts = 2 * _f(m.opt.timestep, dtype)
        r0 = math.where(r0 > 0, jnp.maximum(r0, ts), r0)
    return r0, r1


def _kb(ref, dmax):
    """Stiffness and damping of a reference (standard or direct form); ``ref``: its two
    components (:func:`_safe_solref`)."""
    r0, r1 = ref
    k = math.where(r0 > 0, 1 / jnp.maximum(MINVAL, dmax * dmax * r0 ** 2 * r1 ** 2),
                   -r0 / jnp.maximum(MINVAL, dmax * dmax))
    b = math.where(r1 > 0, 2 / jnp.maximum(MINVAL, dmax * r0),
                   -r1 / jnp.maximum(MINVAL, dmax))
    return k, b


def _override(m):
    return bool(m.opt.enableflags & EnableBit.OVERRIDE)


# --------------------------------------------------------------------------- assembly
def _imp_kb(m, ref, solimp, pos, margin):
    """imp, impp, K, B of elements sharing one solref/solimp (..., 2)/(..., 5) and one
    impedance position/margin (getsolparam, getimpedance, mj_makeImpedance)."""
    solimp = _clamp_solimp(solimp)
    imp, impp = _impedance(solimp, pos, margin)
    K, B = _kb(_safe_solref(m, ref), solimp[1])
    return imp, impp, K, B


def _block(m, d, blk, geo=None):
    """Rows of one block: ``rows`` (J (rows, nv), zero on inactive rows; active, pos,
    margin, frictionloss, diag (diagApprox), each (rows,)), ``el`` (the impedance and
    reference inputs per element whose rows share them: solref (e, 2), solimp (e, 5),
    position and margin (e,)), ``k`` (rows per element), ``kzero`` (numpy (rows,): rows
    with K = 0) and ``bfric`` (None, or for elliptic contacts: (rows,) mask of the
    rows that use the B of solreffriction, and that B)."""
    dtype = d.qpos.dtype
    n, k = blk.n, blk.k
    zero = jnp.zeros(n * k, dtype)
    flat = lambda x: x.reshape((n * k,) + x.shape[2:])
    rep = lambda x: jnp.repeat(x, k, 0) if k > 1 else x
    nok = np.zeros(n * k, bool)
    if blk.kind in ("connect", "weld", "jointeq", "tendoneq"):
        jac, cpos, ipos, dg, act = _eq_rows(m, d, blk)
        ref = _f(m.eq_solref, dtype).reshape(-1, 2)[blk.ids]
        sim = _f(m.eq_solimp, dtype).reshape(-1, 5)[blk.ids]
        # MuJoCo (mj_addConstraint) drops a constraint whose rows are all zero (all
        # 3 / 6 rows of a connect / weld together)
        act = rep(act & jnp.any(jac != 0, axis=(1, 2)))
        rows = dict(J=math.where(act[:, None], flat(jac), 0.0), active=act, pos=flat(cpos),
                    margin=zero, floss=zero, diag=flat(dg))
        return rows, (ref, sim, ipos, jnp.zeros_like(ipos)), k, nok, None
    if blk.kind in ("frictiondof", "frictionten"):
        jac, fl, dg, ref, sim, static = _friction_rows(m, d, blk)
        # MuJoCo: any non-zero dof friction loss, positive tendon friction loss
        act = (fl != 0) if blk.kind == "frictiondof" else (fl > 0)
        if not static:
            act = act & jnp.any(jac != 0, axis=1)
        rows = dict(J=math.where(act[:, None], jac, 0.0), active=act, pos=zero, margin=zero,
                    floss=fl, diag=dg)
        return rows, (ref, sim, zero, zero), 1, ~nok, None
    if blk.kind.startswith("limit"):
        jac, dist, mg, dg, act, static = _limit_rows(m, d, blk)
        if blk.kind == "limitten":
            ref = _f(m.tendon_solref_lim, dtype).reshape(-1, 2)[blk.ids]
            sim = _f(m.tendon_solimp_lim, dtype).reshape(-1, 5)[blk.ids]
        else:
            ref = _f(m.jnt_solref, dtype).reshape(-1, 2)[blk.ids]
            sim = _f(m.jnt_solimp, dtype).reshape(-1, 5)[blk.ids]
        if not static:
            act = act & jnp.any(jac != 0, axis=2)
        act = flat(act)
        rows = dict(J=math.where(act[:, None], flat(jac), 0.0), active=act, pos=flat(dist),
                    margin=rep(mg), floss=zero, diag=rep(dg))
        # the two sides differ in position: one element per row
        return rows, (rep(ref), rep(sim), flat(dist), rep(mg)), 1, nok, None
    # contacts: rows kept even with a zero Jacobian (as MuJoCo)
    jac, fr, tran, rot, ok = _contact_rows(m, d, blk, geo)
    s = blk.ids
    con = d.contact
    dist, incl = take(con.dist, s), take(con.includemargin, s)
    el = (take(con.solref, s), take(con.solimp, s), dist, incl)
    dim = blk.dim
    rows = dict(J=flat(jac), active=rep(ok), floss=zero)
    if blk.kind == "con1":
        diag = tran
    elif blk.kind == "conpyr":
        f2 = fr[:, :dim - 1] ** 2
        w = tran[:, None] + f2 * math.where(np.arange(dim - 1) < 2, tran[:, None],
                                            rot[:, None])
        diag = jnp.repeat(w, 2, 1)
    else:
        diag = math.where(np.arange(dim) < 3, tran[:, None], rot[:, None])
    if blk.kind != "conell":
        return dict(rows, pos=rep(dist), margin=rep(incl), diag=diag.reshape(-1)), el, k, \
            nok, None
    # elliptic friction rows: K = 0, and the B of solreffriction when it is set
    first = np.arange(k) == 0
    srf = _safe_solref(m, take(con.solreffriction, s), True)
    _, bf = _kb(srf, _clamp_solimp(el[1])[1])
    use = (srf[0] != 0) | (srf[1] != 0)
    rows = dict(rows, pos=math.where(first, dist[:, None], 0.0).reshape(-1),
                margin=math.where(first, incl[:, None], 0.0).reshape(-1),
                diag=diag.reshape(-1))
    bfric = ((~first & use[:, None]).reshape(-1), jnp.repeat(bf, k))
    return rows, el, k, np.tile(~first, n), bfric


#: per-row fields of the blocks concatenated along a major axis (off: jnp.concatenate,
#: the former way; for paired measurements). Bench rollout kernels (batch 256): shadow
#: hand 888 -> 876, barkour 689 -> 677, humanoid 681 -> 656, ant 600 -> 588; barkour
#: compile (trace + lowering + XLA, process CPU, in-process pairs) 0.96x; run time
#: barkour 0.97x (14 rounds, range 0.79-1.16), shadow hand 0.96x (6 rounds, 0.90-1.10)
_CAT_MAJOR = True


def _cat_rows(xs):
    """The blocks' rows of one field concatenated; 1-d fields by
    :func:`math.concat_major` (vmapped, a concatenation along the minor axis stores
    every block's part in a kernel of its own and copies them)."""
    if _CAT_MAJOR and xs[0].ndim == 1:
        return math.concat_major(xs)
    return jnp.concatenate(xs)


def make_constraint(m, d):
    """Constraint rows, diagApprox and impedance (mj_makeConstraint).

    Writes efc_J (nefc, nv), efc_pos, efc_margin, efc_frictionloss, efc_diagA (MuJoCo
    4.0's efc_diagA: the diagonal approximation adjusted so that R = (1-imp)/imp diagA),
    efc_KBIP (nefc, 4), efc_R, efc_D, efc_active, ne, nf, nl, nefc. Requires the
    position stage (kinematics, com_pos, tendon) and ``d.contact``.
    Raises UnsupportedFeatureError (trace time) for flex equalities, contact adhesion and
    geom surface velocity; ValueError for a non-zero friction loss outside the Model's
    friction-loss structure (``dof_hasfrictionloss``, ``tendon_hasfrictionloss``).

    Each block of rows is built whole (its Jacobian already zero on inactive rows) and
    the blocks are concatenated once; impedance and reference are computed per element
    where its rows share them (a contact's rows, a connect's three rows).
    """
    _check_friction_structure(m)
    lay = layout(m, slot_dims(d))
    if lay.nefc == 0:
        return d
    _check_unsupported(m, lay)
    if m.opt.enableflags & EnableBit.SLEEP:
        raise UnsupportedFeatureError("sleeping islands (EnableBit.SLEEP) in constraints")
    dtype = d.qpos.dtype
    n = lay.nefc
    geo = None
    if any(blk.kind in CONTACT_KINDS for blk in lay.blocks):
        geo = _contact_geometry(m, d, lay)
    parts = [_block(m, d, blk, geo) for blk in lay.blocks]
    cat = {f: [jnp.asarray(p[0][f], dtype if f != "active" else bool) for p in parts]
           for f in parts[0][0]}
    cat = {f: _cat_rows(x) for f, x in cat.items()}
    J, active, diag = cat["J"], cat["active"], cat["diag"]
    # impedance and reference once for all elements, then spread to their rows
    el = [jnp.concatenate([jnp.asarray(p[1][i], dtype) for p in parts]) for i in range(4)]
    imp, impp, K, B = _imp_kb(m, *el)
    nel = [len(p[0]["active"]) // p[2] for p in parts]
    start = np.concatenate([[0], np.cumsum(nel)[:-1]])
    row_el = np.concatenate([st + np.repeat(np.arange(ne), p[2])
                             for st, ne, p in zip(start, nel, parts)])
    imp, impp, K, B = (take(x, row_el) for x in (imp, impp, K, B))
    K = math.where(np.concatenate([p[3] for p in parts]), 0.0, K)
    if any(p[4] is not None for p in parts):
        use, bf = ([jnp.zeros(len(p[0]["active"]), (bool, dtype)[i]) if p[4] is None
                    else p[4][i] for p in parts] for i in range(2))
        B = math.where(jnp.concatenate(use), jnp.concatenate(bf), B)
    if m.opt.enableflags & EnableBit.DIAGEXACT:
        # mj_makeY with diagexact: diagA = J_i M^-1 J_i' (exact), then impedance again
        minvjt = jax.vmap(lambda v: tree_linalg.solve_ld(m, d.qLD, v))(J)
        diag = math.where(active, jnp.sum(J * minvjt, 1), diag)
    R = jnp.maximum(MINVAL, (1 - imp) * diag / imp)
    R = _contact_R(m, d, lay, R)
    R = math.where(active, R, 1.0)
    D = math.where(active, 1 / R, 0.0)
    diagA = R * imp / (1 - imp)
    kbip = jnp.stack([K, B, imp, impp], 1)
    counts = {}
    for name, lo, hi in (("ne", 0, lay.ne), ("nf", lay.ne, lay.ne + lay.nf),
                         ("nl", lay.ne + lay.nf, lay.ne + lay.nf + lay.nl)):
        counts[name] = math.reduce_fused(active[lo:hi], 0).astype(jnp.int32)
    counts["nefc"] = math.reduce_fused(active, 0).astype(jnp.int32)
    z = jnp.zeros(n, dtype)
    # first efc row of each contact (mjContact.efc_address), -1 when it has none
    adr = d.contact.efc_address
    cblk = [blk for blk in lay.blocks if blk.kind in CONTACT_KINDS]
    firsts = [math.where(active[blk.start:blk.start + blk.n * blk.k:blk.k],
                         jnp.asarray(blk.start + blk.k * np.arange(blk.n), jnp.int32), -1)
              for blk in cblk]
    if cblk and np.array_equal(np.concatenate([blk.ids for blk in cblk]),
                               np.arange(adr.shape[0])):
        # the blocks cover the slots in order (make_data's grouping by dim): one
        # concatenation, not a slice update per block
        adr = jnp.concatenate(firsts)
    else:
        for blk, val in zip(cblk, firsts):
            adr = put_at(adr, blk.ids, val)
    contact = d.contact.replace(efc_address=adr)
    return d.replace(contact=contact, efc_J=J, efc_pos=math.where(active, cat["pos"], 0.0),
                     efc_margin=math.where(active, cat["margin"], 0.0),
                     efc_frictionloss=math.where(active, cat["floss"], 0.0),
                     efc_diagA=math.where(active, diagA, 0.0), efc_KBIP=kbip * active[:, None],
                     efc_R=R, efc_D=D, efc_active=active,
                     efc_type=jnp.asarray(lay.efc_type), efc_id=jnp.asarray(lay.efc_id),
                     efc_force=z, efc_state=jnp.zeros(n, jnp.int32), **counts)


def _contact_R(m, d, lay, R):
    """Contact regulariser in friction directions (second loop of mj_makeImpedance)."""
    impratio = jnp.maximum(MINVAL, _f(m.opt.impratio, R.dtype))
    for blk in lay.blocks:
        if blk.kind not in ("conpyr", "conell"):
            continue
        rows = R[blk.start:blk.start + blk.n * blk.k].reshape(blk.n, blk.k)
        fr = take(d.contact.friction, blk.ids)
        r0 = rows[:, 0]
        r1 = r0 / impratio
        if blk.kind == "conell":
            rest = r1[:, None] * fr[:, :1] ** 2 / fr[:, 1:blk.dim - 1] ** 2
            new = jnp.concatenate([r0[:, None], r1[:, None], rest], 1)
        else:
            mu2 = fr[:, 0] ** 2 * (r1 / r0)
            new = jnp.repeat((2 * mu2 * r0)[:, None], blk.k, 1)
        R = R.at[blk.start:blk.start + blk.n * blk.k].set(new.reshape(-1))
    return R


def _check_unsupported(m, lay):
    if not any(b.kind in CONTACT_KINDS for b in lay.blocks):
        return
    for name, what in (("geom_adhesion", "contact adhesion"),
                       ("pair_adhesion", "contact adhesion"),
                       ("geom_surfacevel", "geom surface velocity")):
        arr = getattr(m, name, None)
        if arr is None:
            continue
        try:
            val = np.asarray(arr)
        except Exception:
            continue
        if val.size and np.any(val != 0):
            raise UnsupportedFeatureError(what)


def inv_constraint(m, d):
    """Inverse constraint stage (mj_invConstraint): efc_force, efc_state and
    qfrc_constraint (nv,) of ``d.qacc``; see :func:`simjax.engine.solver.inv_constraint`
    (the row cost lives with the solvers)."""
    from simjax.engine import solver
    return solver.inv_constraint(m, d)


# --------------------------------------------------------------------------- reference
def _jacdot_v(m, d, points, bodies):
    """(Jdot_p qvel, Jdot_r qvel) of world points on bodies (mj_jacDot), (n, 3) each."""
    tab = tables.get(m)
    dtype = d.qpos.dtype
    jt = np.asarray(m.jnt_type)
    dj = np.asarray(m.dof_jntid)
    dadr = np.asarray(m.jnt_dofadr)[dj]
    is_quat = (jt[dj] == JointType.BALL) | ((jt[dj] == JointType.FREE) &
                                             (np.arange(m.nv) >= dadr + 3))
    cdd = d.cdof_dot
    if is_quat.any():
        alt = math.motion_cross(d.cvel[np.asarray(m.dof_bodyid)], d.cdof)
        cdd = math.where(is_quat[:, None], alt, cdd)
    anc = jnp.asarray(tab.anc_dof, dtype)[jnp.asarray(bodies)]          # (n, nv)
    a = anc @ (cdd * d.qvel[:, None])                                   # (n, 6)
    bvec = anc @ (d.cdof[:, :3] * d.qvel[:, None])                      # (n, 3)
    com = d.subtree_com[np.asarray(m.body_rootid)[np.asarray(bodies)]]
    offset = points - com
    cv = d.cvel[np.asarray(bodies)]
    pvel = cv[:, 3:] + math.cross(cv[:, :3], offset)
    lin = a[:, 3:] + math.cross(a[:, :3], offset) + math.cross(bvec, pvel)
    return lin, a[:, :3]


def _deriv_quat(q, w):
    """0.5 * (0, w) * q (mju_derivQuat)."""
    zero = jnp.zeros(w.shape[:-1] + (1,), w.dtype)
    return 0.5 * math.quat_mul(jnp.concatenate([zero, w], -1), q)


def _jdotv_eq(m, d, blk):
    """Jdot*qvel of connect / weld rows, (n, k)."""
    weld = blk.kind == "weld"
    p1, p2, b1, b2, site, o1, o2, data = _anchors(m, d, blk.ids, weld)
    l1, r1 = _jacdot_v(m, d, p1, b1)
    l2, r2 = _jacdot_v(m, d, p2, b2)
    lin = l1 - l2
    if not weld:
        return lin
    ts = data[:, 10]
    q0r, nq1 = _weld_quats(m, d, site, o1, o2, b1, b2, data)
    w1, w2 = d.cvel[b1, :3], d.cvel[b2, :3]
    dw = w1 - w2
    # d/dt of q0 * relpose and of neg(q1)
    qfull0 = d.xquat[b1]
    qfull1 = d.xquat[b2]
    if site.any():
        sq = _f(m.site_quat, d.qpos.dtype).reshape(-1, 4)
        s1, s2 = np.where(site, o1, 0), np.where(site, o2, 0)
        qfull0 = math.where(site[:, None], math.quat_mul(d.xquat[b1], sq[s1]), qfull0)
        qfull1 = math.where(site[:, None], math.quat_mul(d.xquat[b2], sq[s2]), qfull1)
    qdot0 = _deriv_quat(qfull0, w1)
    qdot0r = math.where(site[:, None], qdot0, math.quat_mul(qdot0, data[:, 6:10]))
    nqdot1 = math.quat_neg(_deriv_quat(qfull1, w2))
    t1 = math.quat_mul(_quat_axis(nqdot1, dw), q0r)
    t2 = math.quat_mul(_quat_axis(nq1, r1 - r2), q0r)
    t3 = math.quat_mul(_quat_axis(nq1, dw), qdot0r)
    rot = 0.5 * (t1 + t2 + t3)[:, 1:] * ts[:, None]
    return jnp.concatenate([lin, rot], 1)


def reference_constraint(m, d):
    """efc_vel = J qvel and efc_aref = -B vel - K imp (pos - margin) - Jdot qvel
    (mj_referenceConstraint; the Jdot*qvel correction applies to connect and weld rows).
    Requires the velocity stage (cvel, cdof_dot)."""
    if not d.efc_J.shape[0]:
        return d
    lay = layout(m, slot_dims(d))
    vel = d.efc_J @ d.qvel
    kbip = d.efc_KBIP
    aref = -kbip[:, 1] * vel - kbip[:, 0] * kbip[:, 2] * (d.efc_pos - d.efc_margin)
    for blk in lay.blocks:
        if blk.kind in ("connect", "weld"):
            jdv = _jdotv_eq(m, d, blk)
            rows = slice(blk.start, blk.start + blk.n * blk.k)
            aref = aref.at[rows].add(-jdv.reshape(-1))
    aref = math.where(d.efc_active, aref, 0.0)
    return d.replace(efc_vel=vel, efc_aref=aref)
