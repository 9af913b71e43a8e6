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

from simjax.engine.collision.common import argmax, argmin, dot, normalize, one
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
    from simjax.engine.collision import convex as C
    ids = C._mesh_ids(m, ids)
    key = (C._mesh_key(m), ids)
    tab = _CACHE.get(key)
    if tab is not None:
        return tab
    allv = C._mesh_vertices(m)
    one_tabs = [_tables_one(C._hull_vertices(allv[i])) for i in ids]
    T = max(len(t[0]) for t in one_tabs)
    E = max(len(t[2]) for t in one_tabs)
    pad = lambda x, n: x[np.minimum(np.arange(n), len(x) - 1)]
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
    smax = jnp.max(s)
    ein = (tedge[..., 0] * c0 + tedge[..., 1] * c1 + tedge[..., 2] * c2 - tedge[..., 3]
           >= -INSIDE_TOL)                                     # (T, 3)
    inside = ein[:, 0] & ein[:, 1] & ein[:, 2]
    dface = jnp.where(inside & (s >= 0), s, jnp.inf)
    tf = argmin(dface)
    w = c - edge[:, :3]
    d = edge[:, 3:6]
    t = jnp.clip(dot(w, d) * edge[:, 6], 0.0, 1.0)
    r = w - t[:, None] * d
    d2 = dot(r, r)
    te = argmin(d2)
    outside = smax > 0
    face = ~outside | (dface[tf] * dface[tf] <= d2[te])
    tri = jnp.where(outside, tf, argmax(s))
    return face, tri, te


def sphere_mesh(g1, g2, margin, t2=None):
    """Contact of sphere ``g1`` with mesh ``g2`` (one slot; see the module docstring)."""
    ex = g2.extra
    tplane, tedge, edge = ex["tplane"], ex["tedge"], ex["edge"]
    c = (g1.pos - g2.pos) @ g2.mat                            # centre in the mesh frame
    face, tri, te = jax.lax.stop_gradient(
        _select(jax.lax.stop_gradient(c), tplane, tedge, edge))
    r = g1.size[0]
    pl = tplane[tri]
    hface = dot(pl[:3], c) - pl[3]
    er = edge[te]
    tt = jnp.clip(dot(c - er[:3], er[3:6]) * er[6], 0.0, 1.0)
    nedge, dedge = normalize(er[:3] + tt * er[3:6] - c)
    nloc = jnp.where(face, -pl[:3], nedge)
    dist = jnp.where(face, hface, dedge) - r
    n = g2.mat @ nloc
    pos = g1.pos + (r + 0.5 * dist) * n
    return one(dist, pos, n, dist <= margin)


sphere_mesh.types = (GT.SPHERE, GT.MESH)
#: the tables attach_meshes gives the mesh geom (instead of the SAT ones)
sphere_mesh.mesh_tables = (sphere_table, ("tplane", "tedge", "edge"))
