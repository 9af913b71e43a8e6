"""Sphere against a mesh (its convex hull): the exact signed distance of the sphere's
centre to the hull, minus the radius.

MuJoCo 4.0 runs GJK (centre outside the hull) or EPA (centre inside) on this pair
(mjc_Convex, engine_collision_gjk.c); both converge to the same optimum, which for a
point against a convex polytope is found exactly from the hull's triangles and edges,
in the mesh frame (the centre is moved into the mesh frame, not the hull into the world):

- **outside** (some face plane has the centre in front): the closest hull point is in a
  triangle whose plane projection of the centre lies inside it (then the centre's height
  over that plane is the distance: a point of the hull at that distance, and no hull
  point is closer than a supporting plane's height), else on an edge (closest point of
  the segment, vertices included). The normal points from the centre to that point.
- **inside**: the penetration is the smallest depth below a face plane, the normal
  minus that face's outward normal (the exact minimum EPA converges to).

Distance ``d - r``; position the sphere's support point along the normal moved half the
distance along it (as the other curved pairs, :func:`convex._witness`). The features are
chosen without gradient, the distance and normal are then evaluated on the chosen
feature (differentiable in the geom poses and the radius).

Per hull the tables hold its triangles (outward unit normal and offset, the three
inward in-plane edge normals and offsets) and its edges (start, direction, inverse
squared length), padded by repeating rows (duplicates change no minimum).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from simjax.engine import inline
from simjax.engine.collision.common import (
    argmax, argmin, dot, normalize, normalize_c, one, rot, rot_t)
from simjax.engine.math import clip, reduce_fused, unstack, where
from simjax.types import GeomType as GT

#: a projection within this distance (m) outside a triangle's edge still counts inside
#: (the edge gives the same distance there up to second order)
INSIDE_TOL = 1e-9

_CACHE: dict = {}


def _tables_one(verts):
    """(tplane (T, 4), tedge (T, 3, 4), edge (E, 7)) of one mesh's hull."""
    from scipy.spatial import ConvexHull
    hull = ConvexHull(verts)
    tri = np.asarray(hull.simplices, np.int64).copy()
    p0, p1, p2 = (verts[tri[:, k]] for k in range(3))
    n = np.cross(p1 - p0, p2 - p0)
    flip = np.sum(n * hull.equations[:, :3], axis=1) < 0     # counter-clockwise outside
    tri[flip] = tri[flip][:, [0, 2, 1]]
    n = np.where(flip[:, None], -n, n)
    ln = np.linalg.norm(n, axis=1)
    keep = ln > 1e-300
    tri, n = tri[keep], n[keep] / ln[keep, None]
    pts = verts[tri]                                          # (T, 3, 3)
    tplane = np.concatenate([n, np.sum(n * pts[:, 0], 1, keepdims=True)], 1)
    e = np.roll(pts, -1, axis=1) - pts                        # edge k: vertex k -> k+1
    inw = np.cross(n[:, None, :], e)                          # inward in-plane normals
    inw /= np.maximum(np.linalg.norm(inw, axis=2, keepdims=True), 1e-300)
    tedge = np.concatenate([inw, np.sum(inw * pts, 2, keepdims=True)], 2)
    ed = {(min(a, b), max(a, b)) for t in tri.tolist() for a, b in zip(t, t[1:] + t[:1])}
    ed = np.asarray(sorted(ed), np.int64).reshape(-1, 2)
    a, d = verts[ed[:, 0]], verts[ed[:, 1]] - verts[ed[:, 0]]
    inv = 1.0 / np.maximum(np.sum(d * d, 1, keepdims=True), 1e-300)
    return tplane, tedge, np.concatenate([a, d, inv], 1)


def sphere_table(m, ids=None):
    """Triangle and edge tables of the hulls of meshes ``ids`` (every mesh when None),
    row k for mesh ``ids[k]``: tplane (n, T, 4), tedge (n, T, 3, 4), edge (n, E, 7)
    (see the module docstring), padded to the largest of these hulls."""
    from simjax.engine.collision import convex_hull as H
    ids = H._mesh_ids(m, ids)
    key = (H._mesh_key(m), ids)
    tab = _CACHE.get(key)
    if tab is not None:
        return tab
    allv = H._mesh_vertices(m)
    one_tabs = [_tables_one(H._hull_vertices(allv[i])) for i in ids]
    T = max(len(t[0]) for t in one_tabs)
    E = max(len(t[2]) for t in one_tabs)

    def pad(x, n):
        return x[np.minimum(np.arange(n), len(x) - 1)]
    tab = dict(tplane=np.stack([pad(t[0], T) for t in one_tabs]),
               tedge=np.stack([pad(t[1], T) for t in one_tabs]),
               edge=np.stack([pad(t[2], E) for t in one_tabs]))
    _CACHE[key] = tab
    return tab


def _select(c, tplane, tedge, edge):
    """Closest hull feature to the local centre c (no gradient): (face?, triangle id,
    edge id)."""
    # written elementwise: per-world matrix-vector products over the tables are
    # separate slow kernels on CPU
    c0, c1, c2 = c[0], c[1], c[2]
    s = tplane[:, 0] * c0 + tplane[:, 1] * c1 + tplane[:, 2] * c2 - tplane[:, 3]
    smax = reduce_fused(s, 0, "max")
    ein = (tedge[..., 0] * c0 + tedge[..., 1] * c1 + tedge[..., 2] * c2 - tedge[..., 3]
           >= -INSIDE_TOL)                                     # (T, 3)
    inside = ein[:, 0] & ein[:, 1] & ein[:, 2]
    dface = where(inside & (s >= 0), s, jnp.inf)
    w = c - edge[:, :3]
    d = edge[:, 3:6]
    t = clip(dot(w, d) * edge[:, 6], 0.0, 1.0)
    r = w - t[:, None] * d
    d2 = dot(r, r)
    te = argmin(d2)
    outside = smax > 0
    if _ONE_ARG:
        # outside: the nearest face with the projection inside; inside: the face of
        # largest height (the first maximum of s is the first minimum of -s), one
        # search over the triangles for either
        tri = argmin(where(outside, dface, -s))
        return ~outside | (dface[tri] * dface[tri] <= d2[te]), tri, te
    tf = argmin(dface)
    face = ~outside | (dface[tf] * dface[tf] <= d2[te])
    tri = where(outside, tf, argmax(s))
    return face, tri, te


#: :func:`_select`'s face chosen by one search over the triangles (off: two, the
#: nearest face and the highest, then picked; shadow hand 6 kernels more; see
#: narrow.AS_GROUP; for paired measurements). Measured variants not done (shadow
#: hand bench rollout; search run: the collision of 1024 worlds of a sphere near a
#: hull each, one process): (1) each search as one variadic reduction (value and
#: index, first index on ties; the triangles' two in one): 823 -> 811 kernels, XLA
#: compile CPU 0.938 [0.859, 0.969] (5 fresh-process pairs), the same features (the
#: face flag aside where face and edge distances tie within rounding), but XLA on
#: CPU runs a variadic reduction as a scalar loop: search run 1.62x [1.54, 1.76]
#: (1.45x without NaN ordering; operands stored first: no change); (2) one
#: loop over all passing (world, pair) items, tables gathered per item, instead of
#: the loop over the pairs: with (1) 811 -> 802 kernels, alone XLA compile CPU
#: 1.036 [0.993, 1.054] (5 pairs) and trace + lowering 1.2-1.6x, contact positions
#: moved by rounding (1 ulp, float64); (3) common.argmin's extreme and index by
#: math.reduce_fused: the search's 4 reduce-window kernels fewer, search run 1.17x
#: [1.00, 1.31]
_ONE_ARG = True


def sphere_mesh(g1, g2, margin, t2=None, feature=None):
    """Contact of sphere ``g1`` with mesh ``g2`` (one slot; see the module docstring).
    ``feature``: the closest feature (face?, triangle id, edge id) when already chosen
    (:func:`sphere_mesh_group`)."""
    ex = g2.extra
    tplane, tedge, edge = ex["tplane"], ex["tedge"], ex["edge"]
    # products written out (common.rot_t, common.rot): vmapped, a matrix-vector
    # product is a batched dot, an unfused kernel of its own on CPU
    c = rot_t(g2.mat, g1.pos - g2.pos)                        # centre in the mesh frame
    if feature is None:
        feature = _select(jax.lax.stop_gradient(c), tplane, tedge, edge)
    face, tri, te = jax.lax.stop_gradient(feature)
    r = g1.size[0]
    pl = tplane[tri]
    hface = dot(pl[:3], c) - pl[3]
    er = edge[te]
    if _SCALAR_TAIL:
        return _tail(g1, g2, margin, face, pl, hface, er, c, r)
    tt = clip(dot(c - er[:3], er[3:6]) * er[6], 0.0, 1.0)
    nedge, dedge = normalize(er[:3] + tt * er[3:6] - c)
    nloc = where(face, -pl[:3], nedge)
    dist = where(face, hface, dedge) - r
    n = rot(g2.mat, nloc)
    pos = g1.pos + (r + 0.5 * dist) * n
    return one(dist, pos, n, dist <= margin)


#: :func:`sphere_mesh`'s contact from its feature on component scalars (:func:`_tail`;
#: off: on 3-vectors, the former way, for paired measurements). Shadow hand's
#: sphere-mesh group 3 kernels fewer; the sphere-mesh test scene's collision (1024
#: worlds, float32) on / off 0.962 [0.78, 1.10] (10 rounds, idle); float64 contacts of
#: that scene within 3e-17 in position, 3.3e-16 in frame. Measured, not done: the
#: triangles' and the edges' searches of :func:`_select` as one (2, L) search, rows
#: padded with +inf (6 kernels fewer, but that collision 1.39x [1.31, 1.59] slower)
_SCALAR_TAIL = True


def _tail(g1, g2, margin, face, pl, hface, er, c, r):
    """The contact of :func:`sphere_mesh` from the chosen feature: the face (plane
    ``pl``, height ``hface``) or the edge (row ``er`` of the edge table; ``c`` the
    centre in the mesh frame), with the operations of the edge's nearest point,
    :func:`normalize` and :func:`rot` written on component scalars (a per-pair value
    read by broadcasts over 3 components is stored by XLA on CPU as a kernel of its
    own: the norm, the products, the unit vector)."""
    e, c = unstack(er, 0), unstack(c, 0)
    w = [c[k] - e[k] for k in range(3)]
    tt = clip((w[0] * e[3] + w[1] * e[4] + w[2] * e[5]) * e[6], 0.0, 1.0)
    v = [e[k] + tt * e[3 + k] - c[k] for k in range(3)]
    nedge, dedge = normalize_c(v)
    p = unstack(pl, 0)
    nloc = [where(face, -p[k], nedge[k]) for k in range(3)]
    dist = where(face, hface, dedge) - r
    m = [unstack(col, 0) for col in unstack(g2.mat, 1)]      # m[k][i] = mat[i, k]
    n = [m[0][i] * nloc[0] + m[1][i] * nloc[1] + m[2][i] * nloc[2] for i in range(3)]
    p1 = unstack(g1.pos, 0)
    pos = [p1[i] + (r + 0.5 * dist) * n[i] for i in range(3)]
    return one(dist, jnp.stack(pos), jnp.stack(n), dist <= margin)


def sphere_mesh_group(g1, g2, margin, ok):
    """:func:`sphere_mesh` of every pair of a group (leading pair axis on every
    argument; ``ok``: (n,) the pairs that pass the broadphase). The closest features
    are chosen (the costly search over the hull's triangles and edges) only for the
    passing pairs (:func:`_select_passing`): in a batch, a pair's search runs on the
    worlds where it passes, not on the whole batch. Rows of the other pairs are not
    contacts (their feature is triangle 0)."""
    if not _PASSING:
        return jax.vmap(sphere_mesh)(g1, g2, margin)
    c = jax.vmap(lambda a, b: rot_t(b.mat, a.pos - b.pos))(g1, g2)
    ex = g2.extra
    feature = _select_passing(jax.lax.stop_gradient(c), ok, ex["tplane"], ex["tedge"],
                              ex["edge"])
    return jax.vmap(lambda a, b, m_, f: sphere_mesh(a, b, m_, feature=f))(
        g1, g2, margin, feature)


#: search features for passing pairs only (off: every pair; for paired measurements)
_PASSING = True

#: worlds per block of a pair's feature search in a batch (:func:`_select_passing`)
SELECT_BLOCK = 64


@jax.custom_batching.custom_vmap
def _select_passing(c, ok, tplane, tedge, edge):
    """(face (n,), triangle (n,), edge (n,)) of :func:`_select` for pairs' local centres
    ``c`` (n, 3) and hull tables (leading pair axis); those of pairs not ``ok`` are
    False, 0, 0 (unused). One world: every pair searched. Under ``vmap`` (tables
    unbatched) a loop over the pairs, each searched on its passing worlds only,
    gathered SELECT_BLOCK at a time (the searches' inputs carry no gradient and
    their outputs are integers: nothing to differentiate)."""
    face, tri, te = jax.vmap(_select)(c, tplane, tedge, edge)
    return face & ok, where(ok, tri, 0), where(ok, te, 0)


@_select_passing.def_vmap
@inline.inlined
def _select_passing_rule(size, batched, c, ok, tplane, tedge, edge):
    """The batch's searches, pair by pair on the pair's passing worlds (a sort puts
    them first), SELECT_BLOCK worlds a trip; batched tables: every pair searched."""
    if any(batched[2:]) or not (batched[0] or batched[1]):
        axes = tuple(0 if b else None for b in batched)
        return jax.vmap(_select_passing.fun, in_axes=axes)(c, ok, tplane, tedge,
                                                           edge), (True, True, True)
    c = c if batched[0] else jnp.broadcast_to(c, (size,) + c.shape)
    ok = ok if batched[1] else jnp.broadcast_to(ok, (size,) + ok.shape)
    n = c.shape[1]
    blk = min(SELECT_BLOCK, size)
    nblk = -(-size // blk)
    ids = jnp.arange(size, dtype=jnp.int32)
    zero = jnp.zeros((size, n, 3), jnp.int32)      # face, triangle, edge

    def pair(k, out):
        need = jax.lax.dynamic_index_in_dim(ok, k, 1, keepdims=False)
        count = reduce_fused(need.astype(jnp.int32), 0, "sum")
        # the passing worlds in order, then the others (padding reads them, its
        # results are not taken); each world's place in that order by a second sort
        pos = jnp.sort(where(need, ids, size + ids)) % size
        place = jax.lax.sort((pos, ids), num_keys=1)[1]
        pos = jnp.concatenate([pos, jnp.full((nblk * blk - size,), size - 1, jnp.int32)])
        tab = [jax.lax.dynamic_index_in_dim(t, k, 0, keepdims=False)
               for t in (tplane, tedge, edge)]

        def body(carry):
            b, buf = carry
            w = jax.lax.dynamic_slice_in_dim(pos, b * blk, blk)
            # the block's centres gathered from all pairs' (a slice of the pair's
            # first was a kernel of its own)
            f = jax.vmap(_select, in_axes=(0, None, None, None))(c[w, k], *tab)
            f = jnp.stack([x.astype(jnp.int32) for x in f], -1)
            return b + 1, jax.lax.dynamic_update_slice_in_dim(buf, f, b * blk, 0)
        buf = inline.while_loop(lambda cr: cr[0] * blk < count, body,
                                (jnp.zeros((), jnp.int32),
                                 jnp.zeros((nblk * blk, 3), jnp.int32)))[1]
        res = where(need[:, None], buf[place], 0)
        return jax.lax.dynamic_update_index_in_dim(out, res, k, 1)
    out = inline.fori_loop(0, n, pair, zero)
    return (out[..., 0] > 0, out[..., 1], out[..., 2]), (True, True, True)


sphere_mesh.types = (GT.SPHERE, GT.MESH)
#: the group's pairs at once, features searched for passing pairs only
sphere_mesh.group = sphere_mesh_group
#: the tables attach_meshes gives the mesh geom (instead of the SAT ones)
sphere_mesh.mesh_tables = (sphere_table, ("tplane", "tedge", "edge"))
