"""Collision detection driver (MuJoCo's mj_collision, engine_collision_driver.c).

Three steps:

1. **Candidate pairs, at trace time** (numpy, cached per model structure): every geom
   pair MuJoCo could ever test, with mj_collision's filters applied statically: body
   pairs welded together, both dof-less, or parent/child (unless
   ``DisableBit.FILTERPARENT``), contype/conaffinity at body and geom level,
   ``<exclude>`` signatures; explicit ``<pair>`` entries always, replacing the
   automatic pair of the same geoms; type pairs without a collider are dropped. Geom
   order is MuJoCo's (``geom_type[g1] <= geom_type[g2]``). Candidates are grouped by
   collider (height-field pairs by their per-pair collider from
   ``hfield.collider_for``: grid data and sub-grid window are static).
2. **Broadphase, at run time**: per candidate pair the bounding-sphere / plane test of
   mj_filterSphere with margin + gap, and for two convex geoms also a separating-axis
   test of their bounding boxes (the 6 face axes; conservative: a pair it rejects has
   no contact within the margin, so the narrow phase would give none either).
3. **Narrow phase**: each group's collider is vmapped over its pairs; a group none of
   whose pairs passes the broadphase is skipped by a ``lax.cond`` (under ``vmap``: none
   in any world of the batch, :func:`batch_max`), except cheap colliders (their
   broadphase-passing pairs compacted to a pair capacity first when a group has more
   candidates, ``PAIRS_PER_SLOT``; pairs beyond it are dropped, WARN_CONTACTFULL; a
   group run in chunks keeps as many passing pairs). Valid contacts get their
   parameters (mj_contactParam / pair parameters, ``EnableBit.OVERRIDE``, mj_setContact)
   and are compacted into ``Data.contact``: slots grouped by static contact dimension,
   valid slots first in each group, in MuJoCo's contact order (mj_collision's order of
   pairs, :func:`mujoco_rank`; :func:`contact_order` merges the dims), ``Data.ncon``
   valid in all. When a world's valid contacts of a dim exceed
   its slots, the deepest ones (smallest dist, as MJX keeps them) fill the slots, still
   in MuJoCo's order, and ``Data.warning[WARN_CONTACTFULL]`` is raised.

Capacity: ``contact_capacity(model)`` gives the default (sized for moving geoms resting
on partners, far below the sum of per-pair maxima, and at most the model's custom
numeric ``max_contact_points`` per contact dim when it declares one, as MJX reads it);
``make_data(model, ncon_max=...)`` overrides it.

This module holds the contact parameters and the ordering of the groups' contacts into
``Data.contact`` (:func:`collision`, :func:`contact_order`); the static plan, candidate
pairs and capacity are in :mod:`simjax.engine.collision.pairs`, the broadphase and narrow
phase of one group in :mod:`simjax.engine.collision.narrow`.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from simjax.engine.collision.chunked import first_k
from simjax.engine.collision.common import (
    cross, frame_cols, frame_rows, make_frame, reduce_shared)
from simjax.engine.collision.narrow import narrow_group, run_groups
from simjax.engine.collision.pairs import (
    Group, Plan, candidate_pairs, contact_capacity, dim_split, make_contacts, mujoco_rank,
    plan, register_collider, sdf_pair)
from simjax.engine.data import WARN_CONTACTFULL, count_warning
from simjax.engine.math import fill, reduce_fused, unstack, where
from simjax.engine.tables import concrete, has_adhesion
from simjax.types import EnableBit

#: the run-time steps, and (re-exported) the static plan's public names
#: (:mod:`simjax.engine.collision.pairs`) and the group's narrow phase
#: (:mod:`simjax.engine.collision.narrow`)
__all__ = ["collision", "contact_order", "pair_params", "Group", "Plan", "candidate_pairs",
           "contact_capacity", "dim_split", "make_contacts", "mujoco_rank", "plan",
           "register_collider", "sdf_pair", "narrow_group"]

#: mjMINMU: lower bound of contact friction coefficients
MINMU = 1e-5


# --------------------------------------------------------------------------- parameters
def _override(m):
    return bool(m.opt.enableflags & EnableBit.OVERRIDE)


def _params_concrete(m):
    """Whether every model field :func:`pair_params` reads is a constant (NumPy-able)."""
    names = ["geom_margin", "geom_gap", "geom_priority", "geom_solmix", "geom_solref",
             "geom_solimp", "geom_friction"]
    if m.npair:
        names += ["pair_margin", "pair_gap", "pair_friction", "pair_solref",
                  "pair_solimp", "pair_solreffriction"]
    if has_adhesion(m):
        names += ["geom_adhesion"] + (["pair_adhesion"] if m.npair else [])
    vals = [getattr(m, k) for k in names]
    if _override(m):
        vals += [m.opt.o_margin, m.opt.o_friction, m.opt.o_solref, m.opt.o_solimp]
    return all(concrete(v) is not None for v in vals)


def pair_params(m, p: Plan, dtype):
    """Per candidate pair: margin, gap, friction (5), solref, solreffriction, solimp
    (mj_contactParam, explicit pair parameters, mj_assign* with override), and
    adhesion (force, N) where the model has any (:func:`has_adhesion`): the sum of the
    geoms', the higher-priority geom's where priorities differ, an explicit pair's own
    (not overridden by ``EnableBit.OVERRIDE``, as mj_setContact). NumPy where
    the model's fields are constants (as usual): jnp's operations on constants are
    traced equations (about 80 per step)."""
    g1, g2, ip = p.g1, p.g2, p.ipair
    xp, wh = (np, np.where) if _params_concrete(m) else (jnp, where)

    def f(x):
        return xp.asarray(x, dtype)

    margin = f(m.geom_margin)[g1] + f(m.geom_margin)[g2]
    gap = f(m.geom_gap)[g1] + f(m.geom_gap)[g2]
    pr = np.asarray(m.geom_priority)
    hi1 = (pr[g1] > pr[g2])[:, None]
    hi2 = (pr[g1] < pr[g2])[:, None]
    sm = f(m.geom_solmix)
    s1, s2 = sm[g1], sm[g2]
    both = (s1 >= 1e-15) & (s2 >= 1e-15)
    mix = wh(both, s1 / wh(both, s1 + s2, f(1.0)),
             wh((s1 < 1e-15) & (s2 < 1e-15), f(0.5),
                wh(s1 < 1e-15, f(0.0), f(1.0))))[:, None]
    sr = f(m.geom_solref)
    r1, r2 = sr[g1], sr[g2]
    solref = wh(((r1[:, :1] > 0) & (r2[:, :1] > 0)), mix * r1 + (1 - mix) * r2,
                xp.minimum(r1, r2))
    si = f(m.geom_solimp)
    i1, i2 = si[g1], si[g2]
    solimp = mix * i1 + (1 - mix) * i2
    fr = f(m.geom_friction)
    fr1, fr2 = fr[g1], fr[g2]
    fri = xp.maximum(fr1, fr2)
    solref = wh(hi1, r1, wh(hi2, r2, solref))
    solimp = wh(hi1, i1, wh(hi2, i2, solimp))
    fri = wh(hi1, fr1, wh(hi2, fr2, fri))
    friction = fri[:, np.asarray([0, 0, 1, 2, 2])]
    solreffriction = xp.zeros_like(solref)
    adhesion = None
    if has_adhesion(m):
        ad = f(m.geom_adhesion)
        adhesion = wh(hi1[:, 0], ad[g1], wh(hi2[:, 0], ad[g2], ad[g1] + ad[g2]))
    if m.npair and np.any(ip >= 0):
        isp = ip >= 0
        k = np.maximum(ip, 0)

        def sel(a, b):
            return wh(isp.reshape((-1,) + (1,) * (a.ndim - 1)), a, b)

        margin = sel(f(m.pair_margin)[k], margin)
        gap = sel(f(m.pair_gap)[k], gap)
        friction = sel(f(m.pair_friction)[k], friction)
        solref = sel(f(m.pair_solref)[k], solref)
        solimp = sel(f(m.pair_solimp)[k], solimp)
        srf = f(m.pair_solreffriction)[k]
        srf = wh(xp.any(srf != 0, axis=1, keepdims=True), srf, f(0.0))
        solreffriction = sel(srf, solreffriction)
        if adhesion is not None:
            adhesion = sel(f(m.pair_adhesion)[k], adhesion)
    n = len(g1)
    if _override(m):
        margin = xp.broadcast_to(f(m.opt.o_margin), (n,))
        friction = xp.broadcast_to(f(m.opt.o_friction), (n, 5))
        solref = xp.broadcast_to(f(m.opt.o_solref), (n, 2))
        solreffriction = xp.broadcast_to(f(m.opt.o_solref), (n, 2))
        solimp = xp.broadcast_to(f(m.opt.o_solimp), (n, 5))
    friction = xp.maximum(f(MINMU), friction)
    out = dict(margin=margin, gap=gap, friction=friction, solref=solref,
               solreffriction=solreffriction, solimp=solimp)
    if adhesion is not None:
        out["adhesion"] = adhesion
    return out


# --------------------------------------------------------------------------- run time


#: use the collider's proven bound on valid contacts (``fn.bound``) to take the
#: selection without overflow when a dim's valid entries can never exceed its slots
_PROVEN = True


def _select(pos, mine, dist, over, k, fits=False):
    """Indices of the ``k`` entries of a contact dim that fill its slots, in MuJoCo's
    order: ``pos`` (E,) the entries' table positions (distinct ints below 2**24, the
    dim's valid entries ``mine`` first), ``dist`` (E,) their depths, ``over`` whether the
    dim's valid entries exceed its ``k`` slots. Without overflow: the ``k`` smallest
    positions (:func:`first_k`). With overflow (MJX's rule): the ``k`` deepest valid
    entries (smallest dist; a tie by entry order, which is MuJoCo's order within a
    collider group), then sorted by position. One ``top_k`` over the entries either way
    (its key picked per world) and one over the ``k`` picks; without overflow the picks
    already are in position order, so the output is the :func:`first_k` one. Invalid
    entries get key -inf and are never picked with overflow (more than ``k`` valid);
    a NaN depth of a valid entry counts as the largest depth. ``fits`` (static): the
    dim's valid entries can never exceed ``k`` (a bound from the colliders, e.g. the
    height-field disc cover), so the selection without overflow is taken."""
    if k >= pos.shape[-1] or (fits and _PROVEN):          # no overflow possible
        return first_k(pos, k)
    kt = dist.dtype if dist.dtype == jnp.float64 else jnp.float32
    big = jnp.finfo(kt).max
    depth = jax.lax.stop_gradient(dist).astype(kt)
    depth = where(jnp.isnan(depth), big, jnp.clip(depth, -big, big))
    kf = where(over, -where(mine, depth, jnp.inf), -pos.astype(kt))
    idx = jax.lax.top_k(kf, k)[1]
    return idx[first_k(pos[idx], k)]


def _table_start(p, parts):
    """Start of every candidate pair's run of entries in a table laid out in MuJoCo's
    pair order (:func:`mujoco_rank`; run length: its collider's slot count), and the
    table's length. One order over all contact dims: entries are only compared within
    a dim, where it is mj_collision's order."""
    width = np.zeros(len(p.g1), np.int64)
    for pre, vd, cand, members in parts:
        width[members] = vd.shape[1]
    order = np.argsort(p.rank, kind="stable")
    start = np.zeros(len(p.g1), np.int64)
    start[order] = np.concatenate([[0], np.cumsum(width[order])[:-1]])
    return start, int(np.sum(width))


def _entries(p, parts):
    """Concatenated candidate contacts of all groups (entry ``e``): (fields (E, 10):
    dist, pos, normal, tangent; dist (E,) again, its own concatenation (a second
    consumer of ``fields`` would materialise all E rows where the slots' gather reads
    only theirs); valid (E,); table position (E,); contact dim (E,) (None with one dim);
    candidate pair (E,)), numpy where static."""
    start, total = _table_start(p, parts)
    one_dim = len(np.unique(p.dim)) == 1
    fields, depths, valids, keys, dims, cands = [], [], [], [], [], []
    for pre, vd, cand, members in parts:
        n, k = vd.shape
        fields.append(jnp.concatenate([pre.dist.reshape(n * k, 1), pre.pos.reshape(-1, 3),
                                       pre.normal.reshape(-1, 3),
                                       pre.tangent.reshape(-1, 3)], axis=1))
        depths.append(pre.dist.reshape(n * k))
        valids.append(vd.reshape(-1))
        lib = np if isinstance(cand, np.ndarray) else jnp
        keys.append((lib.asarray(start)[cand][:, None] + np.arange(k)).reshape(-1))
        gd = p.dim[members]
        if one_dim or np.all(gd == gd[0]):     # static: the group has one dim
            dims.append(np.full(n * k, gd[0]))
        else:
            dims.append(lib.broadcast_to(lib.asarray(p.dim)[cand][:, None],
                                         (n, k)).reshape(-1))
        cands.append(lib.broadcast_to(cand[:, None], (n, k)).reshape(-1))
    return (jnp.concatenate(fields), jnp.concatenate(depths), jnp.concatenate(valids),
            _cat(keys), None if one_dim else _cat(dims), _cat(cands), total)


# Measured, not done (shadow hand bench rollout, batch 1024, float32, paired rounds in
# one process): the validity masks joined by ORs of padded parts stored once
# (common.once) instead of their concatenation, 7 kernels fewer, but run time without /
# with 0.892 [0.628, 1.143] (10 rounds); the depths joined by selects of padded parts
# (fused into the overflow selection), 6 kernels fewer, run time without / with 0.867
# [0.661, 0.950] (8 rounds)


def _cat(xs):
    """Concatenation of 1-d int arrays, numpy (static) or traced: the static parts as
    one constant and each traced part padded into place and added (under vmap a
    concatenation broadcasts every static part to the batch, a kernel each)."""
    if all(isinstance(x, np.ndarray) for x in xs):
        return np.concatenate(xs)
    static = np.concatenate([x if isinstance(x, np.ndarray) else np.zeros(x.shape, x.dtype)
                             for x in xs])
    out, off = jnp.asarray(static), 0
    for x in xs:
        if not isinstance(x, np.ndarray):
            out = out + jnp.pad(x.astype(out.dtype), (off, len(static) - off - len(x)))
        off += len(x)
    return out


def _contact_params(m, p, prm, ftype):
    """Per candidate pair, one row: includemargin, friction (5), solref (2),
    solreffriction (2), solimp (5), geom1, geom2 (as floats: exact below 2**24), and
    adhesion where ``prm`` has it, so that the contacts' parameters are one gather."""
    n = len(p.g1)
    xp = np if all(isinstance(v, np.ndarray) for v in prm.values()) else jnp
    cols = [prm["margin"].reshape(n, 1), prm["friction"], prm["solref"],
            prm["solreffriction"], prm["solimp"],
            xp.asarray(np.stack([p.g1, p.g2], 1), ftype)]
    if "adhesion" in prm:
        cols.append(xp.asarray(prm["adhesion"], ftype).reshape(n, 1))
    return xp.concatenate(cols, axis=1)


#: the contacts' fields of one shape stored by one kernel (:func:`common.reduce_shared`),
#: the frame's rows zeroed before they are stacked (the stack and its zeroing are one
#: kernel), where each field was a kernel of its own; ``ncon`` from the dims' counts, not
#: a count of the slots (see narrow.AS_GROUP for the measurements; off: the former way,
#: for paired measurements)
_SHARED_FIELDS = True

#: with _SHARED_FIELDS: the frame's nine components (:func:`common.frame_cols`) stored
#: by the reduction that stores dist, includemargin and exclude (the frame's
#: normalisations fused into it, evaluated once per slot), then stacked. Bench rollouts
#: (fresh-process pairs, load 9-16): 8 kernels fewer (ant 523 -> 515, barkour 584 ->
#: 576, shadow hand 793 -> 785), XLA compile CPU ant 0.918 [0.850, 1.070], barkour 0.929
#: [0.836, 1.243] (7 pairs each), shadow hand 0.953 [0.889, 1.017] (2); ant 78 traced
#: equations more (3705 -> 3783), trace 1.017 [0.745, 1.187]; ant step 0.948 [0.883,
#: 1.185] (12 rounds in one process); float outputs within rounding. The components
#: by one unstack, the fills and the valid masks traced once (``zero``): the ant's 78
#: equations more down to 48 (3751 against 3703 off), the same optimised program. Off:
#: the former way (for paired measurements)
_FRAME_SHARED = True


def _fill(con, valid, row, par):
    """``con`` (``Data.contact``) with the fields of the slots: ``row`` (slots, 10) their
    entries' dist, pos, normal, tangent, ``par`` (slots, 17, or 18 with adhesion) their
    pairs' :func:`_contact_params`; zeros (geom -1) in the slots not ``valid``.

    Adhesive contacts (mj_setContact) are not excluded in the gap (dist >=
    includemargin): their rows pull the geoms together there, and their dim is 1 (no
    friction at a distance)."""
    dist, includemargin = row[:, 0], par[:, 0]
    gap = dist >= includemargin
    extra = {}
    if par.shape[1] > 17:
        adhesion = where(valid, par[:, 17], 0.0)
        sticky = adhesion != 0
        extra = dict(adhesion=adhesion,
                     dim=where(valid & sticky & gap, 1,
                               jnp.asarray(np.asarray(con.slot_dim, np.int32))))
        gap = gap & ~sticky

    # valid broadcast once per shape (and the zeros once per trace, by math.fill) for
    # all fields of it (XLA merges repeated ones: the same program, fewer traced
    # equations)
    masks = {}

    def zero(x):
        if x.shape not in masks:
            masks[x.shape] = (valid if x.shape == valid.shape else
                              lax.broadcast_in_dim(valid, x.shape, (0,)))
        return lax.select(masks[x.shape], x, fill(x.shape, 0, x.dtype))

    fields = dict(
        dist=zero(dist), pos=zero(row[:, 1:4]), includemargin=zero(includemargin),
        friction=zero(par[:, 1:6]), solref=zero(par[:, 6:8]),
        solreffriction=zero(par[:, 8:10]), solimp=zero(par[:, 10:15]),
        geom=where(valid[:, None], par[:, 15:17].astype(jnp.int32), -1),
        exclude=(valid & gap).astype(jnp.int32))
    if _SHARED_FIELDS and _FRAME_SHARED:
        c = unstack(row[:, 4:10], 1)
        cols = [zero(x) for x in frame_cols(c[:3], c[3:])]
        keys = ("dist", "includemargin", "exclude")
        out = reduce_shared(*(fields[k] for k in keys), *cols)
        fields.update(zip(keys, out[:3]))
        frame = jnp.stack(out[3:], axis=-1).reshape(-1, 3, 3)
        for keys in (("friction", "solimp"), ("solref", "solreffriction", "geom")):
            fields.update(zip(keys, reduce_shared(*(fields[k] for k in keys))))
    elif _SHARED_FIELDS:
        n, t = (zero(x) for x in frame_rows(row[:, 4:7], row[:, 7:10]))
        frame = jnp.stack([n, t, cross(n, t)], axis=-2)
        for keys in (("dist", "includemargin", "exclude"), ("friction", "solimp"),
                     ("solref", "solreffriction", "geom")):
            fields.update(zip(keys, reduce_shared(*(fields[k] for k in keys))))
    else:
        frame = zero(make_frame(row[:, 4:7], row[:, 7:10]))
    return con.replace(frame=frame, efc_address=jnp.full(valid.shape, -1, jnp.int32),
                       valid=valid, **fields, **extra)


def collision(m, d):
    """Collision detection (mj_collision): fills ``d.contact`` and ``d.ncon``.

    Shapes: ``d.contact`` keeps its capacity (``ncon_max`` slots, grouped by contact
    dim as made by ``make_data``; an adhesive contact in the gap has ``dim`` 1 in a slot
    of any dim). Frames: contact pos and frame are global; the frame's first row is the
    normal from geom[0] to geom[1]. Raises UnsupportedFeatureError at trace time for
    geom pairs without a collider here (e.g. SDF without its plugin).

    Every group's candidate contacts go into one entry table; per contact dim, the
    valid entries of the dim fill the dim's slots ordered by table position (MuJoCo's
    pair order, slot order within a pair); in a world with more of them than slots,
    the deepest ones (:func:`_select`). Then one gather takes their fields and one
    their pair parameters.
    """
    ftype = d.geom_xpos.dtype
    cap = d.contact.dist.shape[0]
    p = plan(m)
    if not len(p.g1) or cap == 0:
        return d.replace(ncon=jnp.zeros((), jnp.int32))
    split = dim_split(m, cap)
    prm = pair_params(m, p, ftype)
    det_margin = prm["margin"] + prm["gap"]
    overflow = jnp.zeros((), bool)
    parts = []
    most = {}               # contact dim -> most valid entries (static)
    for grp in run_groups(p):
        pre, ok, _, over, sel = narrow_group(m, d, p, grp, det_margin, split)
        overflow = overflow | over
        cand = grp.cand if sel is None else jnp.asarray(grp.cand)[sel]
        mine = np.isin(p.dim[grp.cand], list(split))
        if not np.any(mine):
            continue
        vd = pre.valid & ok[:, None]
        if not np.all(mine):          # dims without slots (capacity split to zero)
            m_ = mine[:, None] if sel is None else jnp.asarray(mine)[sel][:, None]
            vd = vd & m_
        parts.append((pre, vd, cand, grp.cand[mine]))
        per = np.full(len(grp.cand), min(vd.shape[1], getattr(grp.fn, "bound", vd.shape[1])))
        if grp.pairmax is not None:
            per = np.minimum(per, grp.pairmax)
        for dm in np.unique(p.dim[grp.cand[mine]]):
            # the pairs of the dim with the most valid contacts, at most a row each
            top = np.sort(per[mine & (p.dim[grp.cand] == dm)])[::-1][:vd.shape[0]]
            most[int(dm)] = most.get(int(dm), 0) + int(np.sum(top))
    fields, depth, valid, key, dim, cand, total = _entries(p, parts)
    nent = valid.shape[0]
    ar = np.arange(nent)
    idx, vtake, ncon = [], [], 0
    for dm in sorted(split):
        nslot = split[dm]
        mine = valid if dim is None else valid & (dim == dm)
        count = reduce_fused(mine, 0)
        overflow = overflow | (count > nslot)
        idx.append(_select(where(mine, key, total + ar), mine, depth,
                           count > nslot, nslot, most.get(dm, 0) <= nslot))
        vtake.append(jnp.arange(nslot) < count)
        ncon = ncon + jnp.minimum(count, nslot)        # the dim's valid slots
    idx = jnp.minimum(jnp.concatenate(idx), nent - 1)
    valid = jnp.concatenate(vtake)
    row = fields[idx]
    cand = jnp.asarray(cand)[idx]
    par = jnp.asarray(_contact_params(m, p, prm, ftype))[cand]
    con = _fill(d.contact, valid, row, par)
    warning = count_warning(d.warning, WARN_CONTACTFULL, overflow)
    if not _SHARED_FIELDS:
        ncon = reduce_fused(valid, 0)
    return d.replace(contact=con, ncon=jnp.asarray(ncon).astype(jnp.int32), warning=warning)


def contact_order(m, d):
    """(ncon_max,) int32 slot indices of ``d.contact`` in MuJoCo's contact order: slot
    ``contact_order(m, d)[i]`` holds MuJoCo's ``d.contact[i]`` for i < ``d.ncon``, the
    empty slots follow. Within a contact dim the slots already are in this order; with
    several dims (slots grouped by dim) the groups interleave by geom pair
    (:func:`mujoco_rank` of the contact's geom pair)."""
    n = d.contact.dist.shape[0]
    if len(set(d.contact.slot_dim)) <= 1:
        return jnp.arange(n, dtype=jnp.int32)
    key, bound = contact_keys(m, d)
    if bound <= np.iinfo(np.int32).max:
        # the keys are distinct, the slot their remainder: one sort of the keys (XLA CPU
        # sorts one operand several times faster than keys with their indices)
        return (jnp.sort(key) % n).astype(jnp.int32)
    rank, slots = key
    return jnp.lexsort((slots, rank)).astype(jnp.int32)


def contact_keys(m, d):
    """(keys (ncon_max,) int32, bound): keys in MuJoCo's contact order (the slots of
    :func:`contact_order` sort by them: distinct, increasing along that order) and a
    static bound above every key, without sorting: the slot index where every slot has
    one contact dim, else the geom pair's rank times ``ncon_max`` plus the slot. Where
    that bound passes int32, keys is the pair (rank, slot) instead, to sort on both."""
    n = d.contact.dist.shape[0]
    slots = jnp.arange(n, dtype=jnp.int32)
    if len(set(d.contact.slot_dim)) <= 1:
        return slots, n
    p = plan(m)
    table = np.full((m.ngeom, m.ngeom), len(p.g1), np.int32)
    table[p.g1, p.g2] = p.rank
    valid = d.contact.valid
    g = where(valid[:, None], d.contact.geom, 0)
    rank = where(valid, jnp.asarray(table)[g[:, 0], g[:, 1]], len(p.g1))
    bound = (len(p.g1) + 1) * n
    if bound > np.iinfo(np.int32).max:
        return (rank, slots), bound
    return rank * n + slots, bound
