"""General convex colliders: plane-convex and convex-convex for ellipsoids, cylinders,
capsules, spheres, boxes and meshes (their convex hulls).

MuJoCo 4.0 finds the penetration of a convex pair with GJK + EPA (mjc_ccd,
engine_collision_gjk.c) and, for box/mesh pairs, recovers a contact patch from the
final EPA face (multicontact / polygonClip). simjax computes the same quantities with
a fixed-shape formulation that jit/vmap/grad handle well:

- **Normal and depth.** The signed distance of two convex sets along a unit direction
  ``n`` (geom1 to geom2) is ``sep(n) = -h2(-n) - h1(n)`` (``h``: support functions);
  its maximum over directions is the distance (apart) or minus the penetration depth
  (overlapping): the optimum EPA converges to. Polytopes (boxes, meshes): the maximum
  is attained at a hull face normal or a cross product of hull edges (separating axis
  theorem), all evaluated exactly (beyond ``MAX_EDGE_PAIRS`` pairs of edge directions,
  only the edge pairs that are faces of the Minkowski difference, without support
  searches: convex_edges.py). Apart, the maximum may instead lie along the closest
  points of a vertex and an edge or vertex, no axis: ``corner_axis`` adds that
  direction, from the vertices nearest the other geom along the best axis (all of a
  box's, ``CORNER_K`` of a mesh's). Curved shapes: the best of a set of candidate
  directions is refined by projected gradient ascent (fixed iteration count), with a
  second trial step kept on the ridge where a capsule's or cylinder's support
  switches ends (the optimum when its side crosses the other geom). Apart within a
  margin the separation is flat near the optimum and the ascent may stop short: where
  a margin may be non-zero (``APART``) the curved pairs take GJK's direction and
  witnesses there (MuJoCo's own algorithm apart; gjk.py).
  A mesh's support value along its own face normals is static (precomputed per hull,
  ``hface``), and its other support points are found in bounded chunks of (direction,
  vertex) products, so hulls of thousands of vertices cost little memory per world.
- **Witness point (single contact).** The support features along ``n`` play the role
  of the final EPA face: a vertex of either side gives the unique witness (the
  vertex, moved half the distance along the normal); two edges give their closest
  points. For curved shapes the curved geom's support point is the witness (what
  MuJoCo's inflated point/segment GJK gives for spheres).
- **Box/mesh multi-contact (MuJoCo's multicontact).** Support features (vertex, edge
  or face: vertices within FEATURE_TOL of the support plane) give candidate polygons
  (those containing the feature) and edges (the feature's edge, or every edge at the
  vertex). Two polygons facing each other (cosine < -FACE_TOL) give a face-face
  patch: geom2's polygon clipped by geom1's side planes (Sutherland-Hodgman as
  polygonClip), points below geom1's face kept, more than 4 reduced by MuJoCo's greedy
  polygonQuad. Each kept point and its projection onto the reference plane (along the
  reference normal) are the witnesses; the normal is minus geom2's face normal
  (face-face) or the reference normal, the depth the witnesses' separation along it,
  the position geom1's witness moved half the depth along the normal (MuJoCo 4.0.0,
  matched to 1e-12). Otherwise an edge in a face (|cosine| < EDGE_TOL) clips the edge
  by the face (at most its two farthest points): geom1's edge in geom2's faces when
  geom1's feature is an edge or vertex no larger than geom2's, and, failing that,
  geom2's edge in geom1's faces (MuJoCo 4.0.0 tries both: an edge crossing an edge
  gives their crossing point twice, the clipped edge's other end lying above the
  face). With a positive margin the patch is
  built whenever the pair is within the margin, points up to the margin above the
  reference face kept (as MuJoCo 4.0.0). Hull polygons are formed as MuJoCo's
  compiler does (hull triangles grouped by normal angles rounded to 0.01 rad, boundary
  traced per island).
- **Plane-mesh** (MuJoCo 4.0's mjc_PlaneConvex): the deepest vertex, then the other
  corners of the largest-area quadrilateral of the hull polygon at that vertex most
  opposed to the plane normal (greedy, precomputed per polygon and anchor), each kept
  when below the margin and below the mesh centre. A plane against an SDF geom uses
  the same collider on the SDF geom's mesh (as MuJoCo 4.0; hull tables built by
  ``plane_table``, light enough for meshes of ~5e4 vertices).

This module holds the supports, the SAT search and refine (normal and depth), the
curved pairs' witnesses, plane-convex and the collider tables; the static hull tables
(``mesh_table``, ``plane_table``, ``attach_meshes``) are in convex_hull.py, the box/mesh
multi-contact (``poly_contacts``) in convex_polytope.py.

Measured against MuJoCo 4.0.0 on the corpus (tests/engine/test_collision.py, 20 states
with contacts per model): same contacting pairs and contact counts everywhere;
plane-mesh, box-mesh and mesh-mesh (mjx convex scene) positions and depths to ~1e-8;
trossen wx250s finger meshes (merged, slightly non-planar polygons) within 2e-2 in
position (one patch corner in 3 states of 20), depths to 1e-6.

Differences from MuJoCo (deliberate or not yet implemented):

- Where several polygon pairs (or edge/face pairs) qualify, MuJoCo takes the first in
  its polygon order, simjax the best aligned, except for a cylinder's or capsule's
  edge in a face (the first face in simjax's polygon order). MuJoCo's polygon order
  is the iteration order of its compiler's hash map keyed by rounded face angles
  (mjCMesh::MakePolygons), filled in qhull's facet order; scipy's qhull lists the
  same facets in another order, so that order is not reproduced. Seen on a capsule
  buried deeper than its radius in a random hull: the optimum lies on a hull edge
  whose two faces both hold the capsule's axis within EDGE_TOL, and MuJoCo and simjax
  build the patch on different ones (5 of 53 random two-contact poses, contacts up
  to 7.8e-2 apart). Polygon vertex order (start vertex) may differ from MuJoCo's,
  which can change polygonQuad's pick on polygons of more than 4 clipped points (the
  trossen tolerance above).
- A sphere against a mesh does not go through the SAT candidates: the exact distance
  of its centre to the hull (closest triangle or edge, or the shallowest face when the
  centre is inside) is in convex_sphere.py.
- Cylinder patches (a cylinder against a box, mesh or cylinder, MuJoCo 4.0's
  multicontact with the cap as a 16-gon) and a capsule lying on a mesh face or a
  cylinder cap (2 contacts) are in convex_cylinder.py. Deep penetrations where EPA
  stops on a non-optimal face (its tolerance) report simjax's exact optimum.
- Polygons of more than 4 clipped points: polygonQuad's pick depends on the polygon's
  start vertex, which MuJoCo takes from its compiler's hull triangle order (qhull's
  face order, mjCMesh::MakePolygons); simjax starts at the smallest hull vertex id, so
  e.g. a hexagonal prism face resting on a box may give 4 other corners than MuJoCo.
- Meshes whose hull MuJoCo does not build (no mesh_graph) get polygons here; MuJoCo
  skips multi-contact for them.
- The refine can stop short of the optimum where sep(n) has a ridge it does not step
  along (it steps along a capsule's, cylinder's or box's, and a mesh's between its
  four best support vertices) or in another local optimum: an ellipsoid deep in a
  mesh hull (1 of 120 random deep poses, 1.4e-3 too deep) and deep random
  capsule-cylinder overlaps with several local optima (3 of 108 poses off by up to
  3.6e-3 in depth). (Spheres against meshes, once among these, now take the exact
  distance of convex_sphere.py.)
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from simjax.engine import inline
from simjax.engine.math import clip
from simjax.engine.collision import gjk
from simjax.engine.collision.chunked import _run_or_skip, batch_max
from simjax.engine.collision.common import (MINVAL, Pre, argmax, argmin, cross, dot, normalize,
                                            one, sel, top_k)
# static hull tables (convex_hull.py) and box/mesh multi-contact (convex_polytope.py);
# attach_meshes, mesh_table and plane_table are also read from here
from simjax.engine.collision.convex_hull import (  # noqa: F401
    attach_meshes, mesh_table, plane_table)
from simjax.engine.collision.convex_polytope import _box_verts, poly_contacts
# MAX_EDGE_PAIRS: pairs of edge directions scored with full supports (beyond: edge_axis)
from simjax.engine.collision.convex_edges import MAX_EDGE_PAIRS, edge_axis, uses_search
from simjax.types import GeomType as GT

# the module's own names and the hull tables other modules read from here
__all__ = ["local_support", "support", "refine", "plane_convex", "mesh_support",
           "convex_convex", "CONVEX", "PLANE", "PLANE_SDF", "MAXCON", "REFINE_ITERS",
           "MAX_EDGE_PAIRS", "SUPPORT_CHUNK", "attach_meshes", "mesh_table", "plane_table"]

#: refinement iterations for curved pairs
REFINE_ITERS = 40
#: (direction, vertex) products a mesh support evaluation holds at once, per pair and
#: world: vmapped over a collider's pairs and the worlds, each holds this many (twice,
#: with argmax's stored copy). Trossen wx250s (33 mesh pairs, 168 x 194 per pair):
#: temporaries 31.2 MB per world at 1 << 15 (batch 1024 ran out of memory), 8.7 MB at
#: 1 << 13; mjx_convex 0.40 -> 0.30 MB and 2.37K against 2.17-2.28K steps/s; the
#: bench models' programs unchanged, the shadow hand's speed unchanged (1 << 12: trossen
#: 6.7 MB, convex 9% slower)
SUPPORT_CHUNK = 1 << 13

_FIXED_DIRS = np.array([(x, y, z) for x in (-1, 0, 1) for y in (-1, 0, 1) for z in (-1, 0, 1)
                        if (x, y, z) != (0, 0, 0)], np.float64)
_FIXED_DIRS /= np.linalg.norm(_FIXED_DIRS, axis=1, keepdims=True)


# --------------------------------------------------------------------------- supports
def local_support(t, geo, d):
    """Support point of geom type ``t`` in its own frame for local direction(s) ``d``
    (..., 3)."""
    s = geo.size
    if t == GT.SPHERE:
        u, _ = normalize(d)
        return u * s[0]
    if t == GT.CAPSULE:
        u, _ = normalize(d)
        ez = jnp.asarray([0.0, 0.0, 1.0], d.dtype)
        return u * s[0] + ez * jnp.where(d[..., 2:3] >= 0, s[1], -s[1])
    if t == GT.ELLIPSOID:
        sd = d * s
        u, _ = normalize(sd)
        return u * s
    if t == GT.CYLINDER:
        xy = d * jnp.asarray([1.0, 1.0, 0.0], d.dtype)
        u, n = normalize(xy)
        u = jnp.where((n > 0)[..., None], u, 0.0)
        ez = jnp.asarray([0.0, 0.0, 1.0], d.dtype)
        return u * s[0] + ez * jnp.where(d[..., 2:3] >= 0, s[1], -s[1])
    if t == GT.BOX:
        return jnp.where(d >= 0, s, -s)
    if t == GT.MESH:
        pr = d @ geo.vert.T if d.ndim > 1 else geo.vert @ d
        k = argmax(pr)
        return geo.vert[k]
    raise ValueError(t)


def support(t, geo, d):
    """World support point(s) for world direction(s) ``d``."""
    return local_support(t, geo, d @ geo.mat) @ geo.mat.T + geo.pos


def _faces_edges(t, geo):
    """World face normals and edge directions used as SAT axes (polytopes, and the
    flat/straight features of cylinders and capsules)."""
    dt = geo.mat.dtype
    if t == GT.BOX:
        return geo.mat.T, geo.mat.T
    if t == GT.MESH:
        return geo.extra["normal"] @ geo.mat.T, geo.extra["edge"] @ geo.mat.T
    if t == GT.CYLINDER:
        return geo.mat[:, 2][None], geo.mat[:, 2][None]
    if t == GT.CAPSULE:
        return jnp.zeros((0, 3), dt), geo.mat[:, 2][None]
    return jnp.zeros((0, 3), dt), jnp.zeros((0, 3), dt)


_POLY = (GT.BOX, GT.MESH)


# --------------------------------------------------------------------------- plane
def plane_convex(g1, g2, margin, t2=None):
    """Plane against ellipsoid or mesh (mjc_PlaneConvex, MuJoCo 4.0): the deepest
    point; for meshes also the other corners of the hull polygon at the deepest vertex
    most opposed to the plane normal, pruned to the largest-area quadrilateral anchored
    at that vertex (greedy, precomputed per polygon and anchor), each kept when below
    the margin and below the mesh centre."""
    normal = g1.mat[:, 2]
    p = support(t2, g2, -normal)
    dist = dot(p - g1.pos, normal)
    pos = p - normal * (0.5 * dist)
    first = one(dist, pos, normal, dist <= margin)
    if t2 != GT.MESH:
        return first
    loc = normal @ g2.mat
    k = argmax(g2.vert @ -loc)
    pn = g2.extra["pnorm"][k]                                    # (PV, 3)
    best = argmin(jnp.where(g2.extra["pquad"][k, :, 0] >= 0, pn @ loc, jnp.inf))
    quad = g2.extra["pquad"][k, best]                            # (3,)
    world = g2.vert[jnp.maximum(quad, 0)] @ g2.mat.T + g2.pos
    d2 = (world - g1.pos) @ normal
    ok = (quad >= 0) & (d2 <= margin) & ((world - g2.pos) @ normal <= 0) & (dist <= margin)
    pos2 = world - normal * (0.5 * d2)[:, None]
    return Pre(jnp.concatenate([first.dist, d2]), jnp.concatenate([first.pos, pos2]),
               jnp.broadcast_to(normal, (4, 3)), jnp.zeros((4, 3), dist.dtype),
               jnp.concatenate([first.valid, ok]))


# --------------------------------------------------------------------------- convex
def _sep(t1, g1, t2, g2, n):
    """sep(n) for directions n (..., 3), and the two support points."""
    a = support(t1, g1, n)
    b = support(t2, g2, -n)
    return dot(b - a, n), a, b


def _chunked(f, d, nvert):
    """``f(d)`` for directions d (K, 3) against ``nvert`` vertices, in chunks of at most
    SUPPORT_CHUNK (direction, vertex) products (lax.map, f vmapped over each chunk's
    directions) where the whole would hold more, so memory stays bounded for large
    hulls and many directions."""
    if d.shape[0] * nvert <= SUPPORT_CHUNK:
        return f(d)
    return inline.map(f, d, batch_size=max(1, SUPPORT_CHUNK // nvert))


def mesh_support(vert, mat, pos, d):
    """Support points (K, 3) of a mesh (hull vertices ``vert`` (V, 3) in its frame,
    rotation ``mat``, position ``pos``) for directions d (K, 3) of the outer frame. The
    vertex argmax is taken in bounded chunks (:func:`_chunked`); the points are those
    of the unchunked argmax."""
    k = _chunked(lambda dk: argmax((dk @ mat) @ vert.T), d, vert.shape[0])
    return vert[k] @ mat.T + pos


def mesh_extent(vert, mat, pos, d):
    """Least and greatest ``d . x`` over a mesh's vertices x (world; hull vertices
    ``vert`` (V, 3) in its frame, rotation ``mat``, position ``pos``) for directions d
    (K, 3): ((K,), (K,)), the support values along -d and d without the support
    points (what SAT scoring reads), in bounded chunks (:func:`_chunked`)."""
    def ext(dk):                                  # directions (..., 3)
        loc = dk @ mat
        # three broadcast products: one fused kernel with the reductions (a dot of
        # contraction 3 ran 1.6x slower here)
        pr = sum(loc[..., i, None] * vert[:, i] for i in range(3))
        return jnp.min(pr, -1), jnp.max(pr, -1)
    lo, hi = _chunked(ext, d, vert.shape[0])
    off = d @ pos
    return lo + off, hi + off


def _support_pts(t, geo, d):
    """World support points for world directions d (K, 3) (meshes: mesh_support)."""
    if t != GT.MESH:
        return support(t, geo, d)
    return mesh_support(geo.vert, geo.mat, geo.pos, d)


def _face_dirs(t, geo):
    """World face normals of a geom used as SAT axes, and for meshes their support
    values (+n, -n) from the static hull table (None otherwise)."""
    f, _ = _faces_edges(t, geo)
    if t == GT.MESH:
        off = f @ geo.pos
        return f, (off + geo.extra["hface"][:, 0], -off + geo.extra["hface"][:, 1])
    return f, None


def _candidates(t1, g1, t2, g2, margin):
    """SAT candidate directions (K, 3) and their separation sep (K,) (no gradient:
    only the best direction's index is used). Mesh face normals are scored with the
    hull's static support values on their own side; every other support value is
    evaluated (meshes in bounded chunks, see mesh_support). Two polytopes with many
    edges get their one edge-edge candidate from convex_edges.edge_axis, after the
    others (its search reaches as far as their best separation and the margin)."""
    f1, e1 = _faces_edges(t1, g1)
    f2, e2 = _faces_edges(t2, g2)
    dirs = [f1, -f1, f2, -f2]
    search = uses_search(t1, t2, e1.shape[0], e2.shape[0])
    if e1.shape[0] and e2.shape[0] and not search:
        c = cross(e1[:, None, :], e2[None, :, :]).reshape(-1, 3)
        cn, ln = normalize(c)
        ok = ln > 1e-6
        cn = jnp.where(ok[:, None], cn, f1[:1] if f1.shape[0] else _FIXED_DIRS[:1])
        dirs += [cn, -cn]
    cdif, _ = normalize(g2.pos - g1.pos)
    dirs += [cdif[None], jnp.asarray(_FIXED_DIRS, g1.pos.dtype)]
    for g in (g1, g2):
        dirs += [g.mat.T, -g.mat.T]
    dirs = jnp.concatenate(dirs)
    s = _scores(t1, g1, t2, g2, dirs, f1.shape[0], f2.shape[0])
    if not search:
        return dirs, s
    n = edge_axis(t1, g1, t2, g2, margin - jnp.max(s))[0][None]
    sn = _evaluated(t1, g1, t2, g2, n)
    return jnp.concatenate([dirs, n]), jnp.concatenate([s, sn])


def _scores(t1, g1, t2, g2, dirs, nf1, nf2):
    """sep of _candidates' directions (its order: f1, -f1, f2, -f2, the rest): a
    mesh's support value along its own face normals from its hull table, the other
    geom's along them from one product with its vertices where it is a mesh too
    (:func:`mesh_extent`: the Trossen arm's mesh-mesh group 1276 -> 660 us per
    world-step, float32, batch 64, where the support points were found and dotted
    again), every other support point evaluated (as _sep)."""
    g1, g2, dirs = jax.lax.stop_gradient((g1, g2, dirs))
    n1 = 2 * nf1
    n2 = n1 + 2 * nf2
    m1, m2 = t1 == GT.MESH, t2 == GT.MESH
    if not (m1 or m2):
        return _sep(t1, g1, t2, g2, dirs)[0]

    def evaluated(d):
        return _evaluated(t1, g1, t2, g2, d)
    d1, d2 = dirs[:n1], dirs[n1:n2]
    if m1:                                        # h1 along f1, -f1 from the table
        _, (hp, hm) = _face_dirs(t1, g1)
        if m2:                                    # g2's extent along f1: one product
            lo, hi = mesh_extent(g2.vert, g2.mat, g2.pos, d1[:nf1])
            h2 = jnp.concatenate([lo, -hi])
        else:
            h2 = dot(_support_pts(t2, g2, -d1), d1)
        s1 = h2 - jnp.concatenate([hp, hm])
    else:
        s1 = evaluated(d1)
    if m2:                                        # h2 along -f2 (n = f2), f2 (n = -f2)
        _, (hp, hm) = _face_dirs(t2, g2)
        if m1:
            lo, hi = mesh_extent(g1.vert, g1.mat, g1.pos, d2[:nf2])
            h1 = jnp.concatenate([hi, -lo])
        else:
            h1 = dot(_support_pts(t1, g1, d2), d2)
        s2 = -jnp.concatenate([hm, hp]) - h1
    else:
        s2 = evaluated(d2)
    return jnp.concatenate([s1, s2, evaluated(dirs[n2:])])


def _evaluated(t1, g1, t2, g2, d):
    """sep of directions d (K, 3), every support point evaluated (as _sep; no
    gradient)."""
    g1, g2, d = jax.lax.stop_gradient((g1, g2, d))
    return dot(_support_pts(t2, g2, -d) - _support_pts(t1, g1, d), d)


def refine(t1, g1, t2, g2, n, s, scale, iters=None):
    """Projected gradient ascent of sep(n) (geom1 to geom2, types ``t1``, ``t2``; a
    mesh's Geom needs ``vert`` and ``extra["nvert"]``) over unit directions, ``iters``
    (default REFINE_ITERS) iterations from direction ``n`` (3,) with sep ``s``;
    ``scale`` (length) sets the first step. Returns the best direction (3,) and its
    sep. A
    capsule's support jumps from one end to the other where n crosses the plane
    normal to its axis, so sep has a ridge there (the optimum when the capsule's side
    crosses the other geom); plain steps zigzag across it and stall, so each capsule
    adds a trial step kept on its ridge (the step with the axis component removed).
    A box's support switches vertices where n crosses the plane normal to one of its
    axes (the optimum when an edge of the box is the deepest feature): each box adds
    three such trials. Without them, ellipsoids against boxes stalled on those
    ridges, up to 1e-2 too deep (tests/engine/test_collision_convex.py). A mesh's
    support switches between its four best vertices: each mesh adds six trials
    (:func:`_mesh_ridges`); ellipsoids deep in a random hull still stop short in some
    poses (1 of 120, 1.4e-3 too deep), in another local optimum."""
    axes = [g.mat[:, 2] for t, g in ((t1, g1), (t2, g2)) if t in (GT.CAPSULE, GT.CYLINDER)]
    axes += [g.mat[:, k] for t, g in ((t1, g1), (t2, g2)) if t == GT.BOX for k in range(3)]

    def body(carry, _):
        n, s, eta = carry
        _, a, b = _sep(t1, g1, t2, g2, n)
        v = b - a
        vt = v - n * dot(v, n)
        step = n + eta * vt
        trials = [normalize(step)[0]]
        for ax in axes + _mesh_ridges(t1, g1, t2, g2, n):
            trials.append(normalize(step - dot(step, ax) * ax)[0])
        anyb = False
        for trial in trials:
            st, _, _ = _sep(t1, g1, t2, g2, trial)
            better = st > s
            n, s, anyb = jnp.where(better, trial, n), jnp.where(better, st, s), anyb | better
        eta = jnp.where(anyb, eta * 1.5, eta * 0.3)
        return (n, s, eta), None

    (n, s, _), _ = inline.scan(body, (n, s, 1.0 / scale), None,
                               length=REFINE_ITERS if iters is None else iters)
    return n, s


def _mesh_ridges(t1, g1, t2, g2, n):
    """For each mesh of the pair, the directions (world, unit) between each two of its
    four best support vertices along ``n`` (geom 2: along -n). A mesh's support
    switches between two such vertices where n crosses the plane normal to their
    difference: near a ridge of sep, the ridge is that plane, as a box axis is a box's.
    On a hull face's normal (a SAT candidate) the face's vertices tie, their ranking is
    rounding, and the optimum may lie along any ridge that starts there (one per edge
    of the face): with the two through the first-ranked vertex only, the refine stayed
    on the face normal (ellipsoids and capsules touching a triangle of a hull up to
    2e-3 too deep); with the three best vertices, on a quadrilateral's (a cylinder 1.2
    cm into a height field prism's side, where it was apart). (The hull's padding
    vertices, repeats of its last one, are left out: as a second best they gave no
    direction.)"""
    out = []
    for t, g, sgn in ((t1, g1, 1.0), (t2, g2, -1.0)):
        if t != GT.MESH:
            continue
        pr = jnp.where(jnp.arange(g.vert.shape[0]) < g.extra["nvert"],
                       g.vert @ (g.mat.T @ (sgn * n)), -jnp.inf)
        k = top_k(pr, min(4, g.vert.shape[0]))
        for i in range(k.shape[0]):
            for j in range(i + 1, k.shape[0]):
                e, _ = normalize((g.vert[k[i]] - g.vert[k[j]]) @ g.mat.T)
                out.append(e)
    return out


def convex_convex(g1, g2, margin, t1=None, t2=None, multi=True, apart=False):
    """Convex-convex contact (see the module docstring). Returns 1 slot for curved
    pairs, 5 slots (at most 4 valid) for box/mesh pairs and the cylinder patches;
    without ``multi`` (MuJoCo's DisableBit.MULTICCD, :data:`SINGLE`) 1 slot for every
    pair, the single contact. ``apart`` (:data:`APART`): a curved pair apart within the
    margin takes GJK's direction (:func:`_gjk_apart`)."""
    dirs, s = _candidates(t1, g1, t2, g2, margin)
    k = argmax(s)
    n, sbest = dirs[k], s[k]
    poly = t1 in _POLY and t2 in _POLY
    if not poly:
        scale = jnp.maximum(jnp.max(g1.size) + jnp.max(g2.size), 1e-9)
        n, sbest = refine(t1, g1, t2, g2, n, sbest, scale)
        if t1 == GT.CYLINDER and t2 in _POLY:
            # a vertex against the cylinder's rim: the refine may stop short of the
            # optimum (1e-2 rad off apart within the margin); the vertices nearest the
            # cylinder each have it in closed form
            pts = near_vertices(t2, g2, -n)
            cands = -jax.vmap(lambda p: point_cylinder_dir(
                p, g1.pos, g1.mat[:, 2], g1.size[0], g1.size[1]))(pts)
            cands = jnp.concatenate([n[None], cands])
            n = cands[argmax(_evaluated(t1, g1, t2, g2, cands))]
        if apart:
            n, mid, found = _gjk_apart(t1, g1, t2, g2, n, sbest, margin)
    else:
        # apart within the margin: the closest points' direction when it is not an axis
        nc = corner_axis(near_vertices(t1, g1, n), near_vertices(t2, g2, -n))
        n = jnp.where(_evaluated(t1, g1, t2, g2, nc[None])[0] > sbest, nc, n)
    dist, a, b = _sep(t1, g1, t2, g2, n)
    if poly:
        return poly_contacts(t1, g1, t2, g2, n, dist, margin, single=not multi)
    if (t1, t2) in _CYL_PATCH:
        from simjax.engine.collision.convex_cylinder import cylinder_contacts
        pre = cylinder_contacts(t1, g1, t2, g2, n, dist, margin, single=not multi)
    else:
        if t1 == GT.CAPSULE:
            a = _capsule_witness(g1, n, a, b)
        pre = _witness(t1, t2, n, dist, a, b, margin)
    if apart:
        # a single contact apart: at GJK's witnesses' midpoint (MuJoCo's contact point;
        # unique where a support, a cylinder's cap say, is not), differentiated as the
        # support point (which slides over curved surfaces; GJK's witnesses, fixed in
        # the geoms' frames, do not)
        alone = found & (jnp.sum(pre.valid) == 1)
        moved = pre.pos + jax.lax.stop_gradient(mid - pre.pos)
        pre = pre._replace(pos=jnp.where(alone & pre.valid[:, None], moved, pre.pos))
    return pre


#: vertices per mesh that corner_axis pairs (the nearest to the other geom along the best
#: axis)
CORNER_K = 8


def near_vertices(t, geo, d, k=CORNER_K):
    """World vertices of a box (all 8) or mesh (its hull's ``k`` largest along world
    direction ``d``): those the closest feature toward ``d`` is likely made of."""
    if t == GT.BOX:
        return _box_verts(geo.size) @ geo.mat.T + geo.pos
    idx = top_k(geo.vert @ (geo.mat.T @ d), min(k, geo.vert.shape[0]))
    return geo.vert[idx] @ geo.mat.T + geo.pos


def seg_closest(p, a, b):
    """Closest points of segments ab to points p (..., 3, broadcast together)."""
    ab = b - a
    den = dot(ab, ab)
    s = clip(dot(p - a, ab) / sel(den > MINVAL, den, 1.0), 0.0, 1.0)
    return a + s[..., None] * ab


def corner_axis(pa, pb):
    """Unit direction from the hull of points ``pa`` (A, 3) to that of ``pb`` (B, 3), two
    disjoint convex sets, of their nearest (point, segment) pair: each point of one set
    against the segment between every two points of the other (a point alone
    included). Makes the separating axes exact for polytopes apart: their closest
    points are a vertex and a face, two edges, or a vertex and an edge or vertex; in
    the first two cases (interiors) the face normal or the edges' cross product is an
    axis already, in the last only this direction is (the axes then bound the distance
    from below), when the pair's vertices are among the points given. The segments
    between other points lie in their hulls, never nearer than the distance, so they
    cannot win. Meaningless for overlapping sets, where, as any direction, it separates
    them less than the best axis."""
    ia, ib = np.triu_indices(pb.shape[0])
    ja, jb = np.triu_indices(pa.shape[0])
    ya = seg_closest(pa[:, None], pb[ia][None], pb[ib][None])         # points of B
    xb = seg_closest(pb[:, None], pa[ja][None], pa[jb][None])         # points of A
    d = jnp.concatenate([(ya - pa[:, None]).reshape(-1, 3),
                         (pb[:, None] - xb).reshape(-1, 3)])
    n, _ = normalize(d[argmin(dot(d, d))])
    return n


def point_cylinder_dir(p, c, a, r, h):
    """Direction n maximising the separation of point p from a cylinder (centre c,
    unit axis a, radius r, half length h), from p: towards the cylinder's closest point
    when p is outside, away from the nearest side / cap when inside."""
    x = p - c
    z = dot(a, x)
    rv = x - z * a
    rdir, rho = normalize(rv)
    outside = (rho > r) | (jnp.abs(z) > h)
    q = c + clip(z, -h, h) * a + jnp.minimum(rho, r) * rdir
    n_out, _ = normalize(q - p)
    cap = jnp.abs(z) - h > rho - r
    n_in = jnp.where(cap, -jnp.sign(z) * a, -rdir)
    return jnp.where(outside, n_out, n_in)


#: GJK's tolerance and iterations for curved pairs apart (MuJoCo's ccd_tolerance and
#: ccd_iterations defaults)
CCD_TOL = 1e-6
CCD_ITERS = 35


def _gjk_apart(t1, g1, t2, g2, n, s, margin):
    """A curved pair apart within the margin: the direction of GJK's witness points
    (MuJoCo's mjc_ccd before EPA, :func:`simjax.engine.collision.gjk._search`), where
    the refine's ascent of the flat separation can stop short (up to 6e-5 in distance
    and 0.1 rad in normal between two cylinders); ``n`` elsewhere. ``s``: the refine's
    separation (a lower bound of the distance); GJK runs only where some world of the
    batch has a pair with 0 < s < margin (:func:`chunked.batch_max`). Returns (the
    direction, the witnesses' midpoint, whether GJK found the pair apart): the
    direction's value with the refine's derivative, the midpoint not differentiated
    (the contact's position is, as the support point along the direction)."""
    def run():
        geo = jax.lax.stop_gradient(((g1.pos, g1.mat, g1.size, g1.vert),
                                     (g2.pos, g2.mat, g2.size, g2.vert)))
        dist, x1, x2, status = gjk._search(t1, geo[0], t2, geo[1],
                                           jax.lax.stop_gradient(margin), CCD_TOL,
                                           CCD_ITERS)
        ng, ln = normalize(x2 - x1)
        # (a sphere's or capsule's core apart while the geoms overlap: status 0 too)
        found = (status == 0) & (dist > 0) & (ln > 0)
        # GJK's value with the refine's derivative (the optimum's motion, which GJK's
        # stopped iteration does not give)
        n_out = jnp.where(found, n + jax.lax.stop_gradient(ng - n), n)
        return n_out, 0.5 * (x1 + x2), found

    def skip(types=None):       # (_run_or_skip passes run's output types: unused)
        return n, jnp.zeros_like(n), jnp.zeros((), bool)

    need = batch_max(((s > 0) & (s < margin)).astype(jnp.int32)) > 0
    if _APART_AS_CALL:
        # GJK in its branch as a jit call, batched once under vmap, not twice
        return _run_or_skip(need, run, skip)
    return jax.lax.cond(need, run, skip)


#: :func:`_gjk_apart`'s GJK branch through :func:`chunked._run_or_skip` (a ``jax.jit``
#: call in the branch, which jax batches once under vmap; read at trace time). False:
#: GJK's equations in the branch itself, which jax batches twice (kept to compare).
#: The pusher's step traced at batch 64 under cProfile: _gjk_apart 0.79 and 0.85 ->
#: 0.70 and 0.71 s; outputs bit-identical
_APART_AS_CALL = True


def _capsule_witness(g, n, a, b):
    """A capsule's witness: its support point ``a``, unless the normal is perpendicular
    to its axis (the capsule's side crossing the other geom: the whole surface line
    supports); then the point of that line nearest the other geom's support point
    ``b`` (where EPA's final face puts it)."""
    axis = g.mat[:, 2]
    flat = jnp.abs(dot(n, axis)) < np.sqrt(np.finfo(n.dtype).eps)
    t = clip(dot(b - g.pos, axis), -g.size[1], g.size[1])
    return jnp.where(flat, g.pos + t * axis + g.size[0] * n, a)


def _witness(t1, t2, n, dist, a, b, margin):
    """Single contact of a curved pair: the curved geom's (unique) support point moved
    half the distance along the normal."""
    pos = a + 0.5 * dist * n if t1 not in _POLY else b - 0.5 * dist * n
    return one(dist, pos, n, dist <= margin)


def _make(fn, t1, t2, **kw):
    f = functools.partial(fn, t1=t1, t2=t2, **kw) if fn is convex_convex else \
        functools.partial(fn, t2=t2)
    f.types = (t1, t2)
    return f


_TYPES = (GT.SPHERE, GT.CAPSULE, GT.ELLIPSOID, GT.CYLINDER, GT.BOX, GT.MESH)
CONVEX = {(a, b): _make(convex_convex, a, b) for a in _TYPES for b in _TYPES if a <= b}
# sphere-mesh: the exact point-to-hull distance (convex_sphere.py), not SAT + refinement
from simjax.engine.collision.convex_sphere import sphere_mesh as _sphere_mesh  # noqa: E402
CONVEX[(GT.SPHERE, GT.MESH)] = _sphere_mesh
PLANE = {t: _make(plane_convex, GT.PLANE, t) for t in (GT.ELLIPSOID, GT.MESH)}
#: plane against an SDF geom: MuJoCo 4.0 collides the plane with the SDF geom's mesh
#: (mjc_PlaneConvex on its convex hull), so the geom gets its mesh's hull data
PLANE_SDF = _make(plane_convex, GT.PLANE, GT.MESH)
#: cylinder and capsule pairs with contact patches (convex_cylinder.py)
_CYL_PATCH = ((GT.CYLINDER, GT.CYLINDER), (GT.CYLINDER, GT.BOX), (GT.CYLINDER, GT.MESH),
              (GT.CAPSULE, GT.CYLINDER), (GT.CAPSULE, GT.MESH))
MAXCON = {f: (4 if (k[0] in _POLY and k[1] in _POLY) or k in _CYL_PATCH else 1)
          for k, f in CONVEX.items()}
#: the colliders of pairs with several contacts and their single-contact forms, for
#: models with DisableBit.MULTICCD (MuJoCo's mj_maxContact: 1 contact for the pairs
#: mjc_Convex collides; box-box, capsule-box and the plane pairs have colliders of
#: their own, unaffected)
SINGLE = {f: _make(convex_convex, *k, multi=False) for k, f in CONVEX.items()
          if MAXCON[f] > 1}
MAXCON.update({f: 1 for f in SINGLE.values()})
#: the curved pairs' colliders (and their single-contact forms) that take GJK's
#: direction apart within the margin: chosen by the plan where a margin may be non-zero
#: (pairs.plan); with margin 0 no pair apart makes a contact, and GJK's code (about 3 s
#: of compile per pair type) is left out
APART = {f: _make(convex_convex, *f.types, multi=f.keywords.get("multi", True),
                  apart=True)
         for f in list(CONVEX.values()) + list(SINGLE.values())
         if isinstance(f, functools.partial) and f.func is convex_convex
         and not (f.types[0] in _POLY and f.types[1] in _POLY)}
MAXCON.update({a: MAXCON[f] for f, a in APART.items()})
MAXCON.update({PLANE[GT.ELLIPSOID]: 1, PLANE[GT.MESH]: 4, PLANE_SDF: 4})
