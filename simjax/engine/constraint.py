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
  or ``dim`` rows (elliptic), active for valid, non-excluded contacts. An adhesive
  contact in the gap has runtime dim 1 (``Data.contact.dim``) in a slot of any dim:
  its slot's first row is its normal row (efc_type frictionless), the others inactive.

Inactive rows are exactly neutral: ``efc_active`` is false, ``efc_J`` is zero, and the
solvers give them zero force. A non-contact constraint whose rows all have an
identically zero Jacobian is inactive, as MuJoCo skips it; contact rows are kept even
with a zero Jacobian (as MuJoCo). ``ne``, ``nf``, ``nl`` and ``nefc`` count the active
rows of each kind.

``efc_id`` holds the element id (equality, dof, tendon, joint) or, for contacts, the
slot index into ``Data.contact``.

This module holds the impedance (mj_makeImpedance), the assembly of the rows
(make_constraint) and the reference (mj_referenceConstraint); the static row layout is
in constraint_layout.py, the rows of each kind (and mj_diagApprox's inputs) in
constraint_rows.py.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from simjax.engine import constraint_rows
from simjax.engine import math
from simjax.engine import tables
from simjax.engine import tree_linalg
# the row layout (constraint_layout.py) and the rows of each kind (constraint_rows.py);
# the mjtConstraint values, the layout and take are also read from here
from simjax.engine.constraint_layout import (  # noqa: F401
    CONTACT_ELLIPTIC, CONTACT_FRICTIONLESS, CONTACT_KINDS, CONTACT_PYRAMIDAL, EQUALITY,
    FRICTION_DOF, FRICTION_TENDON, LIMIT_JOINT, LIMIT_TENDON, _disabled, friction_masks,
    data_layout, layout, make_efc, nefc_capacity, slot_dims)
from simjax.engine.constraint_rows import (  # noqa: F401
    _anchors, _check_friction_structure, _contact_geometry, _contact_rows, _eq_rows, _f,
    _friction_rows, _limit_rows, _quat_axis, _weld_quats, put_at, take)
from simjax.types import DisableBit, EnableBit, JointType

# the module's own names and the layout names other modules read from here
__all__ = ["make_constraint", "inv_constraint", "reference_constraint", "SATISFIED", "QUADRATIC",
           "LINEARNEG", "LINEARPOS", "CONE", "MINVAL", "MINIMP", "MAXIMP", "CONTACT_ELLIPTIC",
           "CONTACT_FRICTIONLESS", "CONTACT_KINDS", "CONTACT_PYRAMIDAL", "EQUALITY",
           "FRICTION_DOF", "FRICTION_TENDON", "LIMIT_JOINT", "LIMIT_TENDON", "friction_masks",
           "layout", "make_efc", "nefc_capacity", "slot_dims", "put_at", "take"]

# mjtConstraintState
SATISFIED, QUADRATIC, LINEARNEG, LINEARPOS, CONE = 0, 1, 2, 3, 4

MINVAL = 1e-15
MINIMP, MAXIMP = 0.0001, 0.9999


# --------------------------------------------------------------------------- impedance
def _impedance(solimp, pos, margin):
    """Impedance and its derivative w.r.t. pos (getimpedance); solimp: its five
    components, clamped (:func:`_clamp_solimp`).

    Measured and not kept: the power as a product of factors where every row's power is
    known at trace time (the Model closed over, all powers 2): optimised LLVM IR 1.7%
    (shadow hand) and 1.6% (ant) fewer lines, compile within noise, run time 0.97-1.00
    (12 paired rounds). For contact rows the power would have to be taken from the
    model's geoms and pairs, not from the contacts' solimp that is read here, so a
    contact edited between collision and this call would lose its power."""
    d0, dw, width, mid, power = solimp
    flat = (d0 == dw) | (width <= MINVAL)
    wsafe = math.where(flat, 1.0, width)
    xr = (pos - margin) / wsafe
    sgn = math.where(xr < 0, -1.0, 1.0)
    x = jnp.abs(xr)
    sat = (x >= 1) | (x <= 0)
    xs = math.clip_as_jnp(x, 1e-30, 1.0)
    lin = power == 1
    p = math.where(lin, 2.0, power)
    # a x^p below mid, 1 - b (1-x)^p above, a = 1/mid^(p-1), b = 1/(1-mid)^(p-1):
    # with u = x or 1-x and t = (u / mid or 1-mid)^(p-1), y = u t or 1 - u t and
    # y' = p t (one power per row)
    lo = xs <= mid
    u = math.where(lo, xs, math.maximum(1 - xs, 1e-30))
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
    clip = math.clip_as_jnp
    return [clip(s[..., 0], MINIMP, MAXIMP), clip(s[..., 1], MINIMP, MAXIMP),
            math.maximum(s[..., 2], 0.0), clip(s[..., 3], MINIMP, MAXIMP),
            math.maximum(s[..., 4], 1.0)]


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
        r0 = math.where(r0 > 0, math.maximum(r0, ts), r0)
    return r0, r1


def _kb(ref, dmax):
    """Stiffness and damping of a reference (standard or direct form); ``ref``: its two
    components (:func:`_safe_solref`)."""
    r0, r1 = ref
    k = math.where(r0 > 0, 1 / math.maximum(MINVAL, dmax * dmax * r0 ** 2 * r1 ** 2),
                   -r0 / math.maximum(MINVAL, dmax * dmax))
    b = math.where(r1 > 0, 2 / math.maximum(MINVAL, dmax * r0),
                   -r1 / math.maximum(MINVAL, dmax))
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

    def flat(x):
        return x.reshape((n * k,) + x.shape[2:])

    def rep(x):
        return jnp.repeat(x, k, 0) if k > 1 else x
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
            ref = math.take(_f(m.tendon_solref_lim, dtype).reshape(-1, 2), blk.ids)
            sim = math.take(_f(m.tendon_solimp_lim, dtype).reshape(-1, 5), blk.ids)
        else:
            ref = math.take(_f(m.jnt_solref, dtype).reshape(-1, 2), blk.ids)
            sim = math.take(_f(m.jnt_solimp, dtype).reshape(-1, 5), blk.ids)
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
    act = rep(ok)
    if geo["one"] is not None and k > 1:
        # a contact of runtime dim 1 keeps its slot's first row alone
        one = take(geo["one"], s)
        act = act & (np.tile(np.arange(k) == 0, n) | ~rep(one))
        jac = math.where((np.arange(k) == 0)[:, None] | ~one[:, None, None], jac, 0.0)
    rows = dict(J=flat(jac), active=act, floss=zero)
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


#: elements' impedance and reference spread to their rows by repeats (off: one gather
#: by the rows' element ids, the former way; for paired measurements)
_SPREAD_REPEAT = True


def _spread(x, nel, k):
    """Rows of the elements' values ``x`` (elements, ...): block b's ``nel[b]`` elements,
    which follow the blocks before it, each repeated ``k[b]`` times.

    As repeats (a broadcast and reshape per block) rather than a gather: XLA CPU fuses
    the values' arithmetic into a gather and runs it per row in a scalar loop. With the
    model closed over, a contact's K and B are constants; traced (``jax.jit(step)(m,
    d)``), they are computed, and the ant's gather took 0.9 -> 3 ms a step at 256
    worlds. Rollouts of 256 worlds, 20 steps, float32, process CPU time, 10-12 paired
    rounds, repeats / gather: model as an argument ant (timestep alone traced) 0.897,
    humanoid 0.968, barkour 0.899, shadow hand 0.947; closed over ant 0.979, humanoid
    1.009, barkour 0.954, shadow hand 1.008. Outputs bit-identical."""
    start = np.concatenate([[0], np.cumsum(nel)[:-1]]).astype(int)
    if not _SPREAD_REPEAT:
        return take(x, np.concatenate([s + np.repeat(np.arange(n), r)
                                       for s, n, r in zip(start, nel, k)]))
    parts = [x[s:s + n] if r == 1 else jnp.repeat(x[s:s + n], r, 0)
             for s, n, r in zip(start, nel, k)]
    return parts[0] if len(parts) == 1 else jnp.concatenate(parts)


def make_constraint(m, d):
    """Constraint rows, diagApprox and impedance (mj_makeConstraint).

    Writes efc_J (nefc, nv), efc_pos, efc_margin, efc_frictionloss, efc_diagA (MuJoCo
    4.0's efc_diagA: the diagonal approximation adjusted so that R = (1-imp)/imp diagA),
    efc_KBIP (nefc, 4), efc_R, efc_D, efc_active, ne, nf, nl, nefc. Requires the
    position stage (kinematics, com_pos, tendon) and ``d.contact``.
    Raises UnsupportedFeatureError (trace time) for flex equalities; ValueError for a
    non-zero friction loss outside the Model's friction-loss structure
    (``dof_hasfrictionloss``, ``tendon_hasfrictionloss``).

    Each block of rows is built whole (its Jacobian already zero on inactive rows) and
    the blocks are concatenated once; impedance and reference are computed per element
    where its rows share them (a contact's rows, a connect's three rows).
    """
    _check_friction_structure(m)
    lay = data_layout(m, d)
    if lay.nefc == 0:
        return d
    dtype = d.qpos.dtype
    n = lay.nefc
    geo = None
    if any(blk.kind in CONTACT_KINDS for blk in lay.blocks):
        geo = _contact_geometry(m, d, lay)
    parts = [_block(m, d, blk, geo) for blk in lay.blocks]
    cat = {f: [jnp.asarray(p[0][f], dtype if f != "active" else bool) for p in parts]
           for f in parts[0][0]}
    # efc_active along the minor axis where that fuses (along a major axis it is stored
    # twice, in two layouts)
    minor = constraint_rows._MAKECON and n <= math.MINOR_CAT_MAX
    cat = {f: jnp.concatenate(x) if f == "active" and minor else _cat_rows(x)
           for f, x in cat.items()}
    J, active, diag = cat["J"], cat["active"], cat["diag"]
    # impedance and reference once for all elements, then spread to their rows
    el = [jnp.concatenate([jnp.asarray(p[1][i], dtype) for p in parts]) for i in range(4)]
    imp, impp, K, B = _imp_kb(m, *el)
    nel = [len(p[0]["active"]) // p[2] for p in parts]
    # spread to the rows as one (elements, 4) array: taken one by one, the impedance's
    # exponential and the rows' impedance were two kernels of their own (the bench
    # rollouts: 2 kernels fewer on each of barkour, ant, humanoid, shadow hand; float64
    # outputs bit-identical)
    kbip = jnp.stack([K, B, imp, impp], 1)
    K, B, imp, impp = math.unstack(_spread(kbip, nel, [p[2] for p in parts]), 1)
    K = math.where(np.concatenate([p[3] for p in parts]), 0.0, K)
    if any(p[4] is not None for p in parts):
        use, bf = ([jnp.zeros(len(p[0]["active"]), (bool, dtype)[i]) if p[4] is None
                    else p[4][i] for p in parts] for i in range(2))
        B = math.where(jnp.concatenate(use), jnp.concatenate(bf), B)
    if m.opt.enableflags & EnableBit.DIAGEXACT:
        # mj_makeY with diagexact: diagA = J_i M^-1 J_i' (exact), then impedance again
        minvjt = jax.vmap(lambda v: tree_linalg.solve_ld(m, d.qLD, v))(J)
        diag = math.where(active, jnp.sum(J * minvjt, 1), diag)
    R = math.maximum(MINVAL, (1 - imp) * diag / imp)
    R = _contact_R(m, d, lay, R, geo)
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
    efc_type = jnp.asarray(lay.efc_type)
    if geo is not None and geo["one"] is not None:
        # contacts of runtime dim 1 in slots of more (adhesive, in the gap)
        one = _contact_rows_of(lay, lambda blk: jnp.broadcast_to(
            take(geo["one"], blk.ids)[:, None], (blk.n, blk.k)), bool)
        efc_type = math.where(one, CONTACT_FRICTIONLESS, efc_type)
    return d.replace(contact=contact, efc_J=J, efc_pos=math.where(active, cat["pos"], 0.0),
                     efc_margin=math.where(active, cat["margin"], 0.0),
                     efc_frictionloss=math.where(active, cat["floss"], 0.0),
                     efc_diagA=math.where(active, diagA, 0.0), efc_KBIP=kbip * active[:, None],
                     efc_R=R, efc_D=D, efc_active=active,
                     efc_type=efc_type, efc_id=jnp.asarray(lay.efc_id),
                     efc_force=z, efc_state=jnp.zeros(n, jnp.int32), **counts)


def _contact_rows_of(lay, fn, dtype, kinds=("conpyr", "conell")):
    """(nefc,) values of the rows of the contact blocks of ``kinds``, ``fn(blk)`` (n, k)
    per block, zero on the other rows."""
    parts = []
    for blk in lay.blocks:
        if blk.kind in kinds:
            parts.append(fn(blk).reshape(-1).astype(dtype))
        else:
            parts.append(jnp.zeros(blk.n * blk.k, dtype))
    return jnp.concatenate(parts) if parts else jnp.zeros(0, dtype)


def _contact_R(m, d, lay, R, geo=None):
    """Contact regulariser in friction directions (second loop of mj_makeImpedance);
    a contact of runtime dim 1 (``geo["one"]``) keeps its normal row's."""
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
            rp = 2 * mu2 * r0
            if geo is not None and geo["one"] is not None:
                rp = math.where(take(geo["one"], blk.ids), r0, rp)
            new = jnp.repeat(rp[:, None], blk.k, 1)
        if constraint_rows._MAKECON and len(R) <= math.MINOR_CAT_MAX:
            # a concatenation fuses into R's users (a slice update is a kernel)
            end = blk.start + blk.n * blk.k
            R = jnp.concatenate([R[:blk.start], new.reshape(-1), R[end:]])
        elif _SLICE_SELECT:
            # a select of the padded rows: elementwise, it fuses as the concatenation
            # does (``.at[].set`` is a scatter, a loop of its own on XLA CPU, after
            # whose expansion the simplification passes run over the program again)
            end = blk.start + blk.n * blk.k
            mask = np.zeros(len(R), bool)
            mask[blk.start:end] = True
            R = math.where(mask, jnp.pad(new.reshape(-1), (blk.start, len(R) - end)), R)
        else:
            R = R.at[blk.start:blk.start + blk.n * blk.k].set(new.reshape(-1))
    return R


#: whether :func:`_contact_R` writes rows past the concatenation limit by a select (read
#: at trace time; False: ``.at[].set``, a scatter, kept to compare)
_SLICE_SELECT = True


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
    is_quat = (jt[dj] == JointType.BALL) | ((jt[dj] == JointType.FREE)
                                            & (np.arange(m.nv) >= dadr + 3))
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


def _surface_vel(m, d):
    """(ncon_max, 6) velocity of the contacts' geom surfaces, geom 2's minus geom 1's,
    in the contact frame (normal, tangent1, tangent2, spin, roll1, roll2), m/s and
    rad/s, with the normal and rolling parts zero (mj_addSurfaceVel): a geom's surface
    moves by ``geom_surfacevel`` (linear, angular; geom frame) about the geom's origin
    (mj_geomSurfaceVelocity)."""
    dtype = d.qpos.dtype
    con = d.contact
    sv = _f(m.geom_surfacevel, dtype).reshape(-1, 6)
    lin = ang = 0.0
    for side, sgn in ((0, -1.0), (1, 1.0)):
        g = jnp.clip(con.geom[:, side], 0)
        mat = d.geom_xmat[g]
        w = jnp.einsum("nij,nj->ni", mat, sv[g, 3:])
        v = (jnp.einsum("nij,nj->ni", mat, sv[g, :3])
             + math.cross(w, con.pos - d.geom_xpos[g]))
        lin, ang = lin + sgn * v, ang + sgn * w
    t = jnp.einsum("nij,nj->ni", con.frame, lin)
    r = jnp.einsum("nij,nj->ni", con.frame, ang)
    z = jnp.zeros_like(t[:, 0])
    return jnp.stack([z, t[:, 1], t[:, 2], r[:, 0], z, z], 1)


def _surface_rows(m, d, lay):
    """(nefc,) surface velocity of the contact rows (mj_addSurfaceVel): an elliptic
    contact's rows take its components, a pyramid's edges 2(j-1), 2(j-1)+1 take +-mu_j
    times component j; contacts of runtime dim 1 none."""
    cs = _surface_vel(m, d)
    dims = d.contact.dim

    def rows(blk):
        c = take(cs, blk.ids)[:, :blk.dim]
        if blk.kind == "conell":
            return c
        fr = take(d.contact.friction, blk.ids)[:, :blk.dim - 1]
        edge = (fr * c[:, 1:])[:, :, None] * np.array([1.0, -1.0])
        edge = edge.reshape(blk.n, blk.k)
        return math.where((take(dims, blk.ids) > 1)[:, None], edge, 0.0)
    return _contact_rows_of(lay, rows, d.qpos.dtype)


def _add_surface_vel(m, d, lay, vel):
    """``vel`` with the surface velocities added (:func:`_surface_rows`). A traced
    ``geom_surfacevel`` (the model a jit argument) adds them under a ``lax.cond`` on
    any being non-zero, which skips them at run time for the usual zeros (the ant's
    rollout with the model a jit argument: 1.11 -> 1.05x the closed-over time),
    except where they are differentiated (:func:`tables.run_if_nonzero`)."""
    def add(vel):
        return math.where(d.efc_active, vel + _surface_rows(m, d, lay), 0.0)
    return tables.run_if_nonzero(m, ("geom_surfacevel",), add, lambda v: v, vel)


def _adhesion_rows(m, d, lay):
    """(nefc,) the adhesive contacts' reference bias R adhesion (mj_adhesionRef): the
    normal row's (frictionless and elliptic contacts, and those of runtime dim 1), or
    an equal share on each pyramid edge."""
    con = d.contact

    def rows(blk):
        a = take(con.adhesion, blk.ids)[:, None]
        first = np.arange(blk.k) == 0
        if blk.kind != "conpyr":
            return math.where(first, a, 0.0)
        one = take(con.dim, blk.ids)[:, None] == 1
        return math.where(one, math.where(first, a, 0.0), a / blk.k)
    return d.efc_R * _contact_rows_of(lay, rows, d.qpos.dtype, CONTACT_KINDS)


def reference_constraint(m, d):
    """efc_vel = J qvel and efc_aref = -B vel - K imp (pos - margin) - Jdot qvel
    (mj_referenceConstraint; the Jdot*qvel correction applies to connect and weld rows).
    Contact rows' efc_vel include the relative velocity of the geoms' surfaces
    (``geom_surfacevel``, mj_addSurfaceVel) and adhesive contacts' aref the bias R
    adhesion (mj_adhesionRef). Requires the velocity stage (cvel, cdof_dot)."""
    if not d.efc_J.shape[0]:
        return d
    lay = layout(m, slot_dims(d))
    vel = math.matvec(d.efc_J, d.qvel)
    if tables.has_surfacevel(m) and any(b.kind in ("conpyr", "conell") for b in lay.blocks):
        vel = _add_surface_vel(m, d, lay, vel)
    kbip = d.efc_KBIP
    aref = -kbip[:, 1] * vel - kbip[:, 0] * kbip[:, 2] * (d.efc_pos - d.efc_margin)
    if tables.has_adhesion(m) and any(b.kind in CONTACT_KINDS for b in lay.blocks):
        aref = tables.run_if_nonzero(m, tables.ADHESION, lambda a: a + _adhesion_rows(
            m, d, lay), lambda a: a, aref)
    for blk in lay.blocks:
        if blk.kind in ("connect", "weld"):
            jdv = _jdotv_eq(m, d, blk)
            rows = slice(blk.start, blk.start + blk.n * blk.k)
            aref = aref.at[rows].add(-jdv.reshape(-1))
    aref = math.where(d.efc_active, aref, 0.0)
    return d.replace(efc_vel=vel, efc_aref=aref)
