"""Broadphase of the collision driver (:mod:`simjax.engine.collision.driver`): the
geom poses of every candidate pair gathered into one component-major table, the
bounding-sphere / plane test of mj_filterSphere and a separating-axis test of the two
geoms' bounding boxes. All of it vectorised over a collider group's pairs."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from simjax.engine.math import c_dot, take_rows, unstack, where
from simjax.engine.solver_worlds import batched_like
from simjax.engine.tables import concrete
from simjax.types import GeomType as GT


def _broadphase(m, d, g1, g2, margin, cols=None):
    """mj_filterSphere: bounding spheres, or plane vs bounding sphere. ``cols``: the
    pairs' geoms as gathered by :func:`_pair_cols`, when they are."""
    gtype = np.asarray(m.geom_type)
    if cols is None:
        cols = _pair_cols(_pair_table(m, d, g1, g2, d.geom_xpos.dtype))
    (p1, mat1, _, r1), (p2, _, _, r2) = cols
    dif = [p1[i] - p2[i] for i in range(3)]
    sphere = c_dot(dif, dif) <= (r1 + r2 + margin) ** 2
    plane1 = c_dot([p2[i] - p1[i] for i in range(3)], _col(mat1, 2)) <= margin + r2
    out = where((r1 > 0) & (r2 > 0), sphere, where(
        np.asarray(gtype[g1] == GT.PLANE) & (r2 > 0), plane1, True))
    return out


def _segment_filter(m, g1, g2, margin, cols):
    """Capsule pairs' bounding test by segment: a capsule of radius r and half length h
    (its axis, column 2 of its xmat) can touch a geom of bounding radius R only where
    the other geom's centre lies within r + R + ``margin`` of the capsule's segment
    (a point p2 of geom 2 within r + margin of the segment lies within R of its centre).
    Tested from each capsule side of a pair whose other geom has a bounding sphere
    (not a plane, as :func:`_broadphase` tests); other pairs pass. It rejects more than
    the bounding spheres (:func:`_broadphase`): of fallen humanoids' capsule-capsule
    pairs, 7 on average where the spheres pass 19, at most 32 where they pass up to 59,
    so that the compacted group's pair capacity (50) is not outrun. A 1e-3 relative
    allowance covers rounding. ``cols``: the pairs' geoms as :func:`_pair_cols` gives
    them. Returns (n,) bool, or None where no pair has such a side."""
    gtype = np.asarray(m.geom_type)
    out = None
    for (pa, ma, sa, _), (pb, _, _, rb), ga, gb in ((*cols, g1, g2), (*cols[::-1], g2, g1)):
        # only against a bounding sphere: pairs with a plane (rbound 0) keep the plane
        # test; decided from the geom types, a NumPy mask
        use = (gtype[ga] == GT.CAPSULE) & (gtype[gb] != GT.PLANE)
        if not np.any(use):
            continue
        axis = _col(ma, 2)
        dc = [pb[i] - pa[i] for i in range(3)]
        t = jnp.clip(c_dot(dc, axis), -sa[1], sa[1])     # nearest segment point's offset
        res = [dc[i] - t * axis[i] for i in range(3)]
        reach = sa[0] + rb + margin
        near = c_dot(res, res) <= (reach + 1e-3 * (reach + sa[1])) ** 2
        near = near if np.all(use) else where(use, near, True)
        out = near if out is None else out & near
    return out


def _pair_table(m, d, g1, g2, ftype):
    """Both geoms of every pair (g1's, then g2's): ((15, 2n) xpos, xmat (row-major),
    size as rows, one column per geom, by one gather of a per-geom table (one kernel
    instead of one per array and geom side); (2n, 4) size, rbound for the broadphase,
    NumPy constants where the model's are concrete); :func:`_pair_cols` and
    :func:`_pair_rows` slice them. Component-major: vmapped, the gather and the
    broadphase's arithmetic run along the pairs (gathering (2n, 16) rows was ~10x
    slower on CPU). The colliders take their sizes from the gathered rows: as
    constants XLA folds them into the colliders' arithmetic (a division by a size
    becomes a product with its reciprocal), which moved a contact point on a flat
    patch. Pass this pair, not its slices, into a branch or loop (their operands are
    stored, one kernel each)."""
    idx = np.concatenate([g1, g2])
    rows, static = _geom_table(m, d, ftype)
    return rows.T[:, idx], static[idx]


def _col(mat, j):
    """Column j of 3x3 matrices given as a list of their 9 row-major entries."""
    return [mat[j], mat[3 + j], mat[6 + j]]


def _pair_cols(table):
    """((xpos, xmat, size, rbound) of geom 1, the same of geom 2) from
    :func:`_pair_table`, component-major: lists of (n,) arrays (3 for xpos and size,
    the 9 row-major entries for xmat) and (n,) rbound."""
    pose, static = table
    n = pose.shape[1] // 2

    def part(k):
        r, st = pose[:, k * n:(k + 1) * n], static[k * n:(k + 1) * n]
        if not _LAZY_ROWS:
            r = unstack(r, 0, 12)
            return (list(r[:3]), list(r[3:]), [st[:, i] for i in range(3)], st[:, 3])
        r = _Rows(r, 12) if isinstance(r, jax.Array) else unstack(r, 0, 12)
        return (r[:3], r[3:], [st[:, i] for i in range(3)], st[:, 3])
    return part(0), part(1)


class _Rows:
    """The first ``count`` rows of ``x`` (k, n) as (n,) arrays, by one split (as
    math.unstack), each row squeezed out (and passed through ``post``) where first read:
    the broadphase alone reads 12 of a pair's 24 pose rows, the entries a group without
    the box filter leaves unread are not traced (about 75 equations fewer on the shadow
    hand, 30 on the humanoid)."""

    def __init__(self, x, count, _parts=None, post=None):
        self._parts = _parts if _parts is not None else lax.split(
            x, (1,) * count + ((x.shape[0] - count,) if count < x.shape[0] else ()), 0)
        self._rows = {}
        self._idx = list(range(count))
        self._post = post

    def __len__(self):
        return len(self._idx)

    def __getitem__(self, i):
        if isinstance(i, slice):
            out = _Rows(None, 0, self._parts, self._post)
            out._rows, out._idx = self._rows, self._idx[i]
            return out
        j = self._idx[i]
        if j not in self._rows:
            row = lax.squeeze(self._parts[j], (0,))
            self._rows[j] = row if self._post is None else self._post(row)
        return self._rows[j]

    def __iter__(self):
        return (self[i] for i in range(len(self)))


#: rows of the pair table squeezed where read (:class:`_Rows`), and the colliders'
#: rows (:func:`_pair_rows`, :func:`_geom_rows`) without the rbound none of them reads;
#: False: all squeezed at once (math.unstack), the rbound gathered, for paired
#: measurements
_LAZY_ROWS = True


def _pair_rows(table, sel=None):
    """((xpos (n, 3), xmat (n, 3, 3), size (n, 3)) of geom 1, the same of geom 2) from
    :func:`_pair_table`: of the pairs ``sel`` (traced) when given. (The colliders read
    no rbound: with ``_LAZY_ROWS`` off it is gathered as well, fourth.)"""
    pose, static = table
    n = pose.shape[1] // 2
    if sel is not None:
        both = jnp.concatenate([sel, sel + n])
        pose = pose[:, both]
        static = None if _LAZY_ROWS else jnp.asarray(static)[both]
        n = sel.shape[0]
    rows = pose.T
    if _LAZY_ROWS:
        return _split_rows(rows[:n]), _split_rows(rows[n:])
    return _split_rows(rows[:n], static[:n]), _split_rows(rows[n:], static[n:])


def _split_rows(r, st=None):
    """(xpos (n, 3), xmat (n, 3, 3), size (n, 3)) of pose rows ``r`` (n, 15), and
    rbound (n,) of static rows ``st`` (n, 4) (:func:`_geom_table`'s columns) if given."""
    pos, mat, size = lax.split(r, (3, 9, 3), 1)[:3] if r.shape[1] == 15 else (
        r[:, :3], r[:, 3:12], r[:, 12:15])
    out = pos, mat.reshape(-1, 3, 3), size
    return out if st is None else out + (st[:, 3],)


def _geom_static(m, ng, ftype):
    """(ng, 4) size, rbound of every geom: NumPy where the model's are concrete."""
    size, rbound = concrete(m.geom_size), concrete(m.geom_rbound)
    if size is not None and rbound is not None:
        return np.concatenate([np.asarray(size, ftype).reshape(-1, 3),
                               np.asarray(rbound, ftype).reshape(-1, 1)], 1)
    return jnp.concatenate([
        jnp.broadcast_to(jnp.asarray(m.geom_size, ftype), (ng, 3)),
        jnp.broadcast_to(jnp.asarray(m.geom_rbound, ftype), (ng,))[:, None]], 1)


def _geom_table(m, d, ftype):
    """Every geom's row (per geom, not per pair): ((ng, 15) xpos, xmat (row-major),
    size; (ng, 4) :func:`_geom_static`), for :func:`_geom_rows`, which gathers pairs'
    rows from it. The sizes are in the rows as in :func:`_pair_table` (not constants
    that XLA folds into the colliders' arithmetic)."""
    ng = d.geom_xpos.shape[0]
    rows = jnp.concatenate([
        d.geom_xpos, d.geom_xmat.reshape(ng, 9),
        jnp.broadcast_to(jnp.asarray(m.geom_size, ftype), (ng, 3))], 1)
    return rows, _geom_static(m, ng, ftype)


def _geom_cols(m, d, g1, g2, ftype):
    """:func:`_pair_cols` of the pairs (g1, g2), gathered component by component from
    the geoms' component-major poses, without a pair table: each gather is small, and
    XLA fuses it into the broadphase's arithmetic, which then reads the per-geom poses
    (shadow_hand's capsule-box broadphase and bounding-box filter, 120 pairs: 1.1 us
    per world, 3.9 us through the pair table)."""
    ng = d.geom_xpos.shape[0]
    pos, mat = d.geom_xpos.T, d.geom_xmat.reshape(ng, 9).T
    static = _geom_static(m, ng, ftype)

    def part(g):
        st = static[g]
        # split per pair side, not shared by both: shared, XLA fused the broadphase
        # differently (float64 results moved by an ulp)
        if _LAZY_ROWS and isinstance(mat, jax.Array):
            return ([take_rows(x, g) for x in unstack(pos, 0)],
                    _Rows(mat, 9, post=lambda x: take_rows(x, g)),
                    [st[:, i] for i in range(3)], st[:, 3])
        p, r = unstack(pos, 0), unstack(mat, 0)
        return ([take_rows(p[i], g) for i in range(3)],
                [take_rows(r[i], g) for i in range(9)],
                [st[:, i] for i in range(3)], st[:, 3])
    return part(g1), part(g2)


def _geom_rows(gtable, g1, g2, sel=None):
    """:func:`_pair_rows` of the pairs (g1, g2) (of those ``sel``, traced, when given)
    gathered from :func:`_geom_table`'s per-geom rows."""
    rows, static = gtable
    if sel is not None:
        g1, g2 = jnp.asarray(g1)[sel], jnp.asarray(g2)[sel]

    def part(g):
        if _LAZY_ROWS:
            return _split_rows(rows[g])
        st = static[g] if isinstance(g, np.ndarray) else jnp.asarray(static)[g]
        return _split_rows(rows[g], st)
    return part(g1), part(g2)


#: geom types with a box bound (geom frame): size-based for primitives, geom_aabb for meshes
_BOXED = (GT.SPHERE, GT.CAPSULE, GT.ELLIPSOID, GT.CYLINDER, GT.BOX, GT.MESH)


def _half_extent(m, g, ftype, pos, mat, size):
    """(center, half sizes (geom frame)) of the geoms' bounding boxes, component-major
    as :func:`_pair_cols` (lists of three (n,) arrays): from geom_size for primitives
    (exact), geom_aabb for meshes. ``pos``, ``mat``, ``size``: the geoms' xpos, xmat
    and size, component-major."""
    gtype = np.asarray(m.geom_type)[g]
    r = size[0]
    # NumPy where the sizes (and mesh boxes) are constants: jnp's operations on
    # constants are traced equations
    aabb = concrete(m.geom_aabb) if np.any(gtype == GT.MESH) else None
    static = all(isinstance(x, np.ndarray) for x in size) and (
        aabb is not None or not np.any(gtype == GT.MESH))
    lib, wh = (np, np.where) if static else (jnp, where)
    # sphere (r, r, r), capsule (r, r, r + h), cylinder (r, r, h), ellipsoid/box sizes
    sph, cap, cyl = (lib.asarray(gtype == t) for t in (GT.SPHERE, GT.CAPSULE, GT.CYLINDER))
    hs = [wh(sph, r, size[i]) for i in range(3)]
    hs = [wh(cap, x, h) for x, h in zip((r, r, r + size[1]), hs)]
    hs = [wh(cyl, x, h) for x, h in zip((r, r, size[1]), hs)]
    if np.any(gtype == GT.MESH):
        aabb = (np.asarray(aabb, ftype) if static else jnp.asarray(m.geom_aabb, ftype))[g]
        mesh = lib.asarray(gtype == GT.MESH)
        hs = [wh(mesh, aabb[:, 3 + i], hs[i]) for i in range(3)]
        off = [wh(mesh, aabb[:, i], lib.zeros((), ftype)) for i in range(3)]
        pos = [pos[i] + off[0] * mat[3 * i] + off[1] * mat[3 * i + 1] +
               off[2] * mat[3 * i + 2] for i in range(3)]
    return pos, hs


def _box_filter(m, d, g1, g2, margin, cols=None):
    """Separating-axis test of the two geoms' bounding boxes on their 6 face axes:
    False only when a face axis separates them by more than ``margin`` plus a 1e-3
    relative allowance (rounding, collider tolerances), so a rejected pair has no
    contact. Pairs with a geom without a box bound pass. ``cols``: the pairs' geoms as
    gathered by :func:`_pair_cols`, when they are."""
    ftype = d.geom_xpos.dtype
    if cols is None:
        cols = _pair_cols(_pair_table(m, d, g1, g2, ftype))
    (p1, m1, s1_, _), (p2, m2, s2_, _) = cols
    c1, h1 = _half_extent(m, g1, ftype, p1, m1, s1_)
    c2, h2 = _half_extent(m, g2, ftype, p2, m2, s2_)
    cap = np.asarray(m.geom_type)[g1] == GT.CAPSULE
    seg = _SEGMENT_AXES and bool(np.any(cap))
    # the half sizes, margins and capsule sizes (constants of the model) broadcast
    # over the worlds once: vmap broadcasts an unbatched operand for every operation
    # that reads it (about 100 traced equations fewer on the shadow hand). Without gradients: the filter's
    # output is a mask, and batched_like's custom batching rule has no reverse mode
    consts = jax.tree_util.tree_map(
        lambda v: lax.stop_gradient(v) if isinstance(v, jax.core.Tracer) else v,
        (h1, h2, margin, s1_[:2] if seg else s1_))
    h1, h2, margin, s1_ = batched_like(consts, lax.stop_gradient(p1[0]))
    dc = [c2[i] - c1[i] for i in range(3)]
    # rabs[i][j] = |m1[:, i] . m2[:, j]|
    rabs = [[jnp.abs(c_dot(_col(m1, i), _col(m2, j))) for j in range(3)] for i in range(3)]
    t1 = [c_dot(dc, _col(m1, i)) for i in range(3)]
    t2 = [c_dot(dc, _col(m2, j)) for j in range(3)]
    r12 = [rabs[i][0] * h2[0] + rabs[i][1] * h2[1] + rabs[i][2] * h2[2]
           for i in range(3)]                                       # h2 on box1 axes
    r21 = [rabs[0][j] * h1[0] + rabs[1][j] * h1[1] + rabs[2][j] * h1[2]
           for j in range(3)]                                       # h1 on box2 axes
    if seg:
        # a capsule's own extent along box2's axes, r + h |a . b_j| (its box bound's
        # is larger, up to (r + h) |a . b_j| + r (|x . b_j| + |y . b_j|))
        capj = jnp.asarray(cap)
        r, hl = s1_[0], s1_[1]
        r21 = [where(capj, r + hl * rabs[2][j], r21[j]) for j in range(3)]
    sep = None
    for t, h, r in zip(t1 + t2, h1 + h2, r12 + r21):
        at = jnp.abs(t)
        out = at - h - r > margin + 1e-3 * (at + h + r)
        sep = out if sep is None else sep | out
    if seg:
        sep = sep | (capj & _segment_cross_sep(m1, m2, dc, s1_, h2, rabs, margin))
    return ~sep


#: capsule pairs in :func:`_box_filter`: the capsule's exact extent on the other box's
#: axes and the three axes across the capsule's (off: its bounding box's face axes
#: alone; for paired measurements)
_SEGMENT_AXES = True


def _segment_cross_sep(m1, m2, dc, s1, h2, rabs, margin):
    """Whether an axis a x b_j (a: the capsule axis, column 2 of ``m1``; b_j: box2's
    axes) separates capsule 1 (a segment of half length s1[1], radius s1[0]) from box 2
    (half sizes ``h2``, centre offset ``dc``) by more than ``margin`` (a 1e-3 relative
    allowance, taken on the centre offset too). Along a unit axis L the separation is
    at most the distance of the two, so a pair with a contact is never rejected. Axes
    nearly parallel to a (|a x b_j| < 0.01) are not tested (rounding). Component-major
    lists as :func:`_box_filter`'s."""
    a = _col(m1, 2)
    # dc . (a x b_j) = (dc x a) . b_j; b_k . (a x b_j) = +-a . b_i for {i, j, k} = 0..2
    w = [dc[1] * a[2] - dc[2] * a[1], dc[2] * a[0] - dc[0] * a[2],
         dc[0] * a[1] - dc[1] * a[0]]
    tol = jnp.abs(dc[0]) + jnp.abs(dc[1]) + jnp.abs(dc[2])
    sep = jnp.zeros(margin.shape, bool)
    for j in range(3):
        j1, j2 = (j + 1) % 3, (j + 2) % 3
        ln2 = 1 - rabs[2][j] * rabs[2][j]               # |a x b_j|^2
        use = ln2 > 1e-4
        ln = jnp.sqrt(where(use, ln2, 1.0))
        t = jnp.abs(c_dot(w, _col(m2, j)))
        e = h2[j1] * rabs[2][j2] + h2[j2] * rabs[2][j1]  # box2 extent, times ln
        gap = t - e - s1[0] * ln
        sep = sep | (use & (gap > margin * ln + 1e-3 * (t + e + (s1[0] + tol) * ln)))
    return sep
