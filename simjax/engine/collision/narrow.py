"""Broadphase and narrow phase of one collider group of the static plan
(:mod:`simjax.engine.collision.pairs`; mj_collision's per-pair mj_filterSphere and
collider calls, engine_collision_driver.c): the group's geom rows (a pair table, or the
per-geom table for few pairs), the broadphase and bounding-box filter
(:mod:`simjax.engine.collision.broadphase`), and the collider run on every candidate,
compacted to the group's pair capacity (cheap colliders), in chunks
(:mod:`simjax.engine.collision.chunked`), or skipped where no pair passes
(:func:`narrow_group`). :mod:`simjax.engine.collision.driver` orders the groups'
contacts into ``Data.contact``."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from simjax.engine.collision import convex
from simjax.engine.collision import primitive as P
from simjax.engine.collision.broadphase import (
    _BOXED, _box_filter, _broadphase, _geom_cols, _geom_rows, _geom_table, _pair_cols,
    _pair_rows, _pair_table, _segment_filter)
from simjax.engine.collision.chunked import (
    _chunked, _chunks, _mesh_sat, _pack, _run_or_skip, _zeros, batch_max, chunk_of,
    first_k)
from simjax.engine.collision.common import once
from simjax.engine.collision.pairs import Group, sdf_pair
from simjax.engine.collision.primitive import Geom
from simjax.engine.math import reduce_fused, where


def _geoms(m, d, g, sel, ftype):
    """Geom tuples of the geoms ``g[sel]``."""
    gg = jnp.asarray(g)[sel]
    size = jnp.asarray(m.geom_size, ftype)[gg]
    return gg, Geom(d.geom_xpos[gg], d.geom_xmat[gg], size)


def _sdf_group(m, d, g1, g2):
    """SDF pairs: sdf.collide_pairs (one vmapped descent per kind of pair)."""
    from simjax.engine.collision import sdf
    from simjax.engine.collision.common import Pre
    dist, pos, frame, valid = sdf.collide_pairs(m, d, g1, g2)
    return Pre(dist, pos, frame[..., 0, :], frame[..., 1, :], valid)


#: colliders within a few times the bounding-box filter's cost (~50 ns per pair, batched
#: on CPU): they always run, without the filter (it would cost about what skipping saves)
#: cheap colliders' narrow-phase pairs per contact slot: when a cheap group has more
#: candidates than PAIRS_PER_SLOT * (slots of its contact dims) + 16, its
#: broadphase-passing pairs are compacted to that many first; pairs beyond are dropped
#: (WARN_CONTACTFULL)
PAIRS_PER_SLOT = 2
CHEAP = (P.plane_sphere, P.plane_capsule, P.sphere_sphere, P.sphere_capsule, P.sphere_box,
         P.capsule_capsule)


#: a group of pairs whose collider is a special case of another group's: run as that
#: group, geom 2's sizes scaled by a static factor (a sphere is a capsule of
#: half-length 0: sphere_capsule gives sphere_sphere's contact exactly, the segment's
#: nearest point being the centre; plane_capsule plane_sphere's, see there). One
#: group's kernels fewer each (bench rollouts, with driver._SHARED_FIELDS and
#: convex_sphere._ONE_ARG: shadow hand 854 -> 833 kernels, humanoid 649 -> 631, ant
#: 585 -> 574, barkour 638 -> 632; shadow hand XLA compile CPU off / on 1.067 [0.980,
#: 1.096], 6 rounds in one process, load 10-15; humanoid step off / on 1.011 [0.895,
#: 1.049], 8 rounds). Empty: every collider its own group (for paired measurements)
AS_GROUP = {P.sphere_sphere: (P.sphere_capsule, (1.0, 0.0, 1.0)),
            P.plane_sphere: (P.plane_capsule, (1.0, 0.0, 1.0))}


def run_groups(p):
    """The plan's groups as the driver runs them: a group listed in ``AS_GROUP`` joins
    the group of the collider it is a special case of, where the plan has that group
    (pairs in MuJoCo's order, ``Group.size2`` the factors of geom 2's sizes,
    ``Group.pairmax`` each pair's most valid contacts)."""
    fns = {grp.fn: grp for grp in p.groups}
    out, joined = [], {}
    for grp in p.groups:
        to = AS_GROUP.get(grp.fn)
        if to is not None and to[0] in fns and fns[to[0]].size2 is None:
            joined.setdefault(to[0], []).append((grp, to[1]))
        else:
            out.append(grp)
    for k, grp in enumerate(out):
        if grp.fn not in joined:
            continue
        parts = [(grp, (1.0, 1.0, 1.0))] + joined[grp.fn]
        cand = np.concatenate([g.cand for g, _ in parts])
        size2 = np.concatenate([np.broadcast_to(np.asarray(f), (len(g.cand), 3))
                                for g, f in parts])
        most = np.concatenate([np.full(len(g.cand), g.maxcon) for g, _ in parts])
        order = np.argsort(p.rank[cand], kind="stable")
        out[k] = Group(grp.fn, cand[order], max(g.maxcon for g, _ in parts),
                       size2[order], most[order])
    return tuple(out)


def _scale2(r2, size2, sel):
    """Geom 2's rows ``r2`` (xpos, xmat, size, rbound) with the sizes scaled by the
    group's ``size2`` (of the pairs ``sel`` when given)."""
    if size2 is None:
        return r2
    f = jnp.asarray(size2, r2[2].dtype)
    return (r2[0], r2[1], r2[2] * (f if sel is None else f[sel])) + tuple(r2[3:])


def _group_args(m, d, fn, g1, g2, dm, ftype):
    """The collider's arguments for every pair of a group (geoms with their mesh data)."""
    return _pose_args(m, fn, g1, g2, dm, (d.geom_xpos[g1], d.geom_xmat[g1]),
                      (d.geom_xpos[g2], d.geom_xmat[g2]), ftype)


def _pair_cap(m, p, grp, split):
    """Narrow-phase pairs of a cheap collider group: PAIRS_PER_SLOT per contact slot of
    the group's contact dims (plus 16)."""
    nslot = sum(split.get(int(dim), 0) for dim in np.unique(p.dim[grp.cand]))
    return PAIRS_PER_SLOT * nslot + 16


def _pose_args(m, fn, g1, g2, dm, pose1, pose2, ftype, sizes=None):
    """The collider's arguments from the pairs' gathered poses and sizes (``sizes``:
    (size1, size2) when already gathered)."""
    if sizes is None:
        size = jnp.asarray(m.geom_size, ftype)
        sizes = size[g1], size[g2]
    geo1, geo2 = Geom(*pose1, sizes[0]), Geom(*pose2, sizes[1])
    geo1, geo2 = convex.attach_meshes(m, fn, geo1, geo2, jnp.asarray(g1), jnp.asarray(g2),
                                      ftype, geoms=(g1, g2))
    return geo1, geo2, dm


def narrow_group(m, d, p, grp, det_margin, split):
    """Broadphase and narrow phase of one collider group.

    The collider runs on every candidate pair of the group (vmapped), unless no pair
    passes the broadphase: then a ``lax.cond`` skips it (under ``vmap``: no pair in
    any world, :func:`batch_max`). Cheap colliders (``CHEAP``) and SDF pairs always run;
    a cheap group of more candidates than its pair capacity (:func:`_pair_cap`) and
    at least ``_COMPACT_MIN`` of them runs on its broadphase-passing pairs (capsule
    sides also tested by their segment, :func:`_segment_filter`) compacted to that
    capacity (pairs beyond are dropped);
    a chunked group keeps as many (``_CHUNK_CAP``).
    Returns (pre, ok, count, overflow, sel): collider output with a leading pair axis,
    which of its rows are broadphase-passing pairs (rows of the others are not
    contacts, whatever their ``valid``), how many pass, whether passing pairs were
    dropped, and the group-local pair of each row when compacted (traced; else None:
    one row per candidate in ``grp.cand`` order). The group gathers its own geom
    poses: gathered once for all groups and sliced, they cost run time (humanoid
    collision ~2x). A pair table (:func:`_pair_table`) is written for a collider that
    runs on every pair; for a group of geoms with box bounds whose collider runs on few
    pairs (compacted, chunked or skipped) the broadphase gathers from the per-geom
    poses (fused into its arithmetic) and the collider takes the rows of the pairs it
    runs on from the per-geom table (:func:`_geom_table`; shadow_hand's step ~0.9x:
    its 120-pair capsule-box table was written every step)."""
    ftype = d.geom_xpos.dtype
    g1, g2 = p.g1[grp.cand], p.g2[grp.cand]
    dm = jnp.asarray(det_margin[grp.cand])     # NumPy (model constants): read traced
    n = len(grp.cand)
    cap = _pair_cap(m, p, grp, split) if grp.fn in CHEAP else None
    # a cheap group within its capacity, or of few candidates, runs on every pair
    whole = cap is not None and (cap >= n or n < _COMPACT_MIN)
    every = grp.fn is sdf_pair or whole
    gtype = np.asarray(m.geom_type)
    boxed = bool(np.all(np.isin(gtype[g1], _BOXED) & np.isin(gtype[g2], _BOXED)))
    if every or not _GEOM_ROWS or not (boxed or _GEOM_ROWS_PLANE):
        # the collider runs on every pair: the pair table feeds it and the broadphase.
        # So do groups with a plane or height field (see _GEOM_ROWS_PLANE)
        table = _pair_table(m, d, g1, g2, ftype)
        cols = _pair_cols(table)

        def rows(sel=None):
            r1, r2 = _pair_rows(table, sel)
            return r1, _scale2(r2, grp.size2, sel)
    else:
        # it runs on few pairs (compacted, or skipped when none passes): the broadphase
        # gathers its operands itself (fused, no pair table) and the collider its pairs'
        # rows from the per-geom table (passed whole into branches and loops)
        gtable = _geom_table(m, d, ftype)
        cols = _geom_cols(m, d, g1, g2, ftype)

        def rows(sel=None):
            r1, r2 = _geom_rows(gtable, g1, g2, sel)
            return r1, _scale2(r2, grp.size2, sel)
    ok = _broadphase(m, d, g1, g2, dm, cols)

    def args():          # sliced where used (inside the branches below)
        r1, r2 = rows()
        return _pose_args(m, grp.fn, g1, g2, dm, r1[:2], r2[:2], ftype,
                          sizes=(r1[2], r2[2]))

    def take(idx):       # the arguments of pairs idx, mesh data gathered by geom id
        r1, r2 = rows(idx)
        geo1, geo2 = Geom(*r1[:3]), Geom(*r2[:3])
        if _mesh_sat(grp.fn):          # the one kind of mesh group run in chunks
            geo1, geo2 = convex.attach_meshes(
                m, grp.fn, geo1, geo2, jnp.asarray(g1)[idx], jnp.asarray(g2)[idx], ftype,
                geoms=(g1, g2), traced=True)
        return geo1, geo2, dm[idx]
    no = jnp.zeros((), bool)
    if grp.fn is sdf_pair:
        return _sdf_group(m, d, g1, g2), ok, reduce_fused(ok, 0), no, None
    group = getattr(grp.fn, "group", None)    # takes ``ok`` as it is when run is called

    def run():
        return group(*args(), ok) if group else jax.vmap(grp.fn)(*args())

    if grp.fn in CHEAP:
        if whole:
            return run(), ok, reduce_fused(ok, 0), no, None
        seg = _segment_filter(m, g1, g2, dm, cols) if _SEGMENT_FILTER else None
        if seg is not None:
            ok = ok & seg
        if _ONCE_CHEAP:
            # stored once: the pair count, its padded input and the compaction's keys
            # each evaluated the broadphase and the segment test again, from gathers
            # of the geom poses that were kernels of their own (two consumers)
            ok = once(ok)
        count = reduce_fused(ok, 0)
        ar = np.arange(n)
        sel = first_k(where(ok, ar, n + ar), cap)    # passing pairs, in order
        r1, r2 = rows(sel)
        pre = jax.vmap(grp.fn)(Geom(*r1[:3]), Geom(*r2[:3]), dm[sel])
        return pre, jnp.arange(cap) < count, count, count > cap, sel
    chunks = _chunks(grp.fn, len(grp.cand))
    if boxed:
        ok = ok & _box_filter(m, d, g1, g2, dm, cols)
        if _ONCE_OK and not chunks and not group and not getattr(grp.fn, "hfield", False):
            # the passing pairs stored once: the pair count and the contacts' validity
            # (two consumers) each evaluated the broadphase and the bounding-box
            # filter again, the per-component gathers of the geom poses (shadow hand's
            # box-box group) as 24 kernels of their own
            ok = once(ok)
    count = reduce_fused(ok, 0)
    if chunks:
        # the chunk scan skipped whole when no world has a passing pair (its rows
        # are then zeros, and those of the pairs past the passing ones the last pair)
        ch = chunk_of(grp.fn)
        nrow = -(-min(n, _pair_cap(m, p, grp, split) if _CHUNK_CAP else n) // ch) * ch
        idx = np.minimum(np.arange(nrow), len(grp.cand) - 1)

        found = {}

        def skip(types):
            return jnp.zeros(types[0].shape, types[0].dtype), jnp.asarray(idx, jnp.int32)

        # the batch's most passing pairs reduced once, for the skip and the chunks
        most = batch_max(count)
        out, sel = _run_or_skip(
            most > 0, lambda: _chunked(grp.fn, take, ok, count, most, found, ftype, nrow),
            skip)
        # which rows hold passing pairs, outside the branches (either branch's: none
        # when skipped, every world's count being 0; an output of both, a kernel more)
        rows = jnp.arange(nrow) < count
        return found["unpack"](out), rows, count, count > nrow if nrow < n else no, sel
    if getattr(grp.fn, "hfield", False) and not _PACK_HFIELD:
        # height-field colliders return their leaves as they are (a zero fill each when
        # skipped): packed, the concatenation of the leaves was one kernel that cost
        # barkour's collision about a third of its time
        return _run_or_skip(batch_max(count) > 0, run, _zeros), ok, count, no, None
    # the branches return the collider output packed in one array: the skip branch is
    # one zero fill, not one per output leaf
    found = {}

    def packed():
        out, found["unpack"] = _pack(run())
        return out
    out = _run_or_skip(batch_max(count) > 0, packed, _zeros)
    return found["unpack"](out), ok, count, no, None


#: cheap groups of fewer candidates than this run on every pair, even past their pair
#: capacity (:func:`_pair_cap`): the compaction (the passing pairs stored, counted,
#: picked by a top_k, their rows gathered) is about 20 kernels, while such a collider
#: costs little per pair, and no passing pair is dropped. The bench humanoid's
#: capsule-capsule group (98 candidates, capacity 50): rollout 613 -> 593 kernels, XLA
#: compile CPU 0.898 [0.849, 0.996] and 0.998 [0.924, 1.069] (8 and 10 rounds in one
#: process, load 7-9), run 0.999 [0.897, 1.937] (12 rounds); the other bench models
#: have no compacted group. 0: compact every cheap group past its capacity (the former
#: way; for paired measurements and tests)
_COMPACT_MIN = 128

#: a compacted cheap group with capsules tests its sphere-passing pairs by segment too
#: (:func:`broadphase._segment_filter`) before compaction: the fallen bench humanoid's
#: capsule-capsule group (98 candidates, capacity 50) passed up to 59 pairs by spheres,
#: and the pairs past 50 were dropped with their contacts (2 of 1024 worlds at step 200
#: had 8 contacts where MuJoCo has 10 and 12); by segment at most 32 pass, and those
#: worlds' contacts are MuJoCo's. Humanoid step off / on 1.021 [0.900, 1.224] (16
#: rounds in one process, load 7-8; that group runs whole since _COMPACT_MIN). Off:
#: spheres alone (for paired measurements)
_SEGMENT_FILTER = True

#: boxed groups whose collider runs on few pairs gather from the per-geom table, not a
#: pair table (off: the pair table for every group; for paired measurements)
_GEOM_ROWS = True

#: with _GEOM_ROWS: groups with a plane or height field whose collider runs on few pairs
#: take the per-geom table too (off: the pair table). Measured: barkour's height-field
#: group (the one such group of the four bench models) 576 -> 586 kernels, XLA compile CPU
#: 1.063 [0.899, 1.149] (3 fresh-process pairs), step 0.989 [0.780, 1.329] (12 rounds in
#: one process), outputs bit-identical: not taken. (Its contact derivatives, once wrong
#: at --xla_backend_optimization_level=0, were sphere_box's jnp.clip tangent, mended by
#: math.clip: test_collision.test_grad_vs_finite_differences passes with it on.)
_GEOM_ROWS_PLANE = False

#: a chunked group keeps at most its pair capacity (:func:`_pair_cap`) of passing pairs,
#: as a compacted cheap group does (pairs beyond it dropped, WARN_CONTACTFULL): its
#: output rows are that many, not one per candidate (the shadow hand's capsule-box
#: group: 48 rows, not 120, of which the bench states pass at most one; its step:
#: without / with 1.043 [0.969, 1.083] and 1.068 [0.992, 1.123], with / without 0.972
#: [0.821, 1.009], 8-12 pairs in one process; compile 1.015 [0.964, 1.051] without /
#: with). Off: a row per candidate, every passing pair runs
_CHUNK_CAP = True

#: a boxed group run whole in a branch gets its passing pairs stored once (off: the
#: former way; for paired measurements)
_ONCE_OK = True

#: pack height-field colliders' outputs too (the former way; for paired measurements)
_PACK_HFIELD = False

#: a compacted cheap group gets its passing pairs stored once (off: the former way; for
#: paired measurements). The bench humanoid's rollout (its capsule-capsule group, 98
#: candidates): 624 -> 613 kernels (the twelve gathers of the poses fuse into the one
#: store), 8654 -> 8435 fused HLO instructions, outputs bit-identical (float32 and
#: float64); XLA compile CPU 0.991 [0.853, 1.225] and 0.985 [0.847, 1.062] (10 rounds
#: each, load 7-9), whole compile in fresh processes wall 0.985 [0.857, 1.336], CPU
#: 1.046 [0.887, 1.419] (7 pairs), run 1.001 [0.591, 1.181] (10 rounds): below the
#: noise (that group runs whole since _COMPACT_MIN). The other bench rollouts have no
#: such group (their programs unchanged)
_ONCE_CHEAP = True
