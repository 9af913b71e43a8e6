"""Edge-edge separating axes of two large polytopes (meshes, boxes) for the SAT search of
:mod:`simjax.engine.collision.convex`, without evaluating every pair of edge directions.

The penetration of two convex polytopes is the distance of the origin to the boundary
of their Minkowski difference; its faces are a face of one polytope with a vertex of the
other, or an edge of each whose arcs on the Gauss map (the arc between the normals of
the edge's two faces; the second polytope's arc negated) cross (Gregorius, "The
Separating Axis Test between Convex Polyhedra", GDC 2013). Only those edge pairs can
give the optimum, and along their axis ``n = eA x eB`` (oriented out of the first
polytope) the two edges are the supports, so the separation is
``n . (pB - pA) / |n|`` without a support search. convex.py scores face normals and,
for small hulls, every pair of edge directions with full supports
(``MAX_EDGE_PAIRS``); beyond that (hulls of hundreds of edges: Trossen's arm meshes,
446 x 493 edges) it used face normals alone, which missed edge-edge contacts (6 of 20
random overlaps of two of its meshes off MuJoCo's depth, by up to 4.5e-4 m and 2.4 deg).
Here the edge pairs are tested with eight 3-vector products each (``_block``), only
among the edges that come near the other polytope (``edge_axis``: the two edges of the
optimal face are at most the penetration depth apart), in blocks, keeping the best;
convex.py adds the best axis to its candidates and scores it with full supports like
the others (a pair let through by rounding can then not score above its true
separation). On those two Trossen meshes about 20-220 edges per side came near the
other's bounding box at 0.5-4 mm of penetration; the face planes keep fewer.

Edge tables (own frame, one row per hull edge between faces not coplanar): the face
normals ``a``, ``b`` at the edge, ``x = b x a`` (the arc's plane normal), the edge vector
``e`` (from ``p0``), ``u = (p0 - c) x e`` (``c``: an interior point) and ``v = p0 x e``;
with them the products are bilinear in one row of each table. Meshes get them from
their hull (``edge_table``, static, built once per model), boxes from their size.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from simjax.engine import inline
from simjax.engine.collision.chunked import first_k
from simjax.engine.collision.common import argmax, cross, normalize
from simjax.types import GeomType as GT

#: maximum number of edge-direction pairs convex.py scores with full supports; two
#: polytopes with more use this module's search instead
MAX_EDGE_PAIRS = 4096
#: edges per side of a block of the search (a block: BLOCK_SIDE^2 pairs per pair of
#: geoms and world). The Trossen fingers' pair (37 edges per side kept, batch 64,
#: float32): its SAT candidates 134 us per world with blocks of 96, 74 with 48, 70 with
#: 40, 110 with 32
BLOCK_SIDE = 48
#: the edge filter's planes are grown by this fraction of the hulls' size (their
#: rounding must not drop an edge)
PLANE_TOL = 1e-5
#: the most (edge, face plane) products of one side's edge filter; beyond, the edges
#: are filtered by the other polytope's bounding box (a 1500-vertex hull's 4e3 edges
#: and 3e3 faces: 29 MB of temporaries instead of 4 MB)
PLANES_MAX = 1 << 16
#: faces whose normals' cosine passes 1 - COPLANAR are one face: the edge between them
#: is not a hull edge (as the SAT face normals are merged in convex_hull._hull)
COPLANAR = 1e-9
#: the table names a mesh geom carries for the search
NAMES = ("ega", "egb", "egx", "ege", "egu", "egv", "egp", "egbox")

_CACHE: dict = {}


def uses_search(t1, t2, n1, n2):
    """Whether a pair of geom types with ``n1``, ``n2`` SAT edge directions (padded
    counts) finds its edge axes here rather than from every pair of directions."""
    return t1 in (GT.BOX, GT.MESH) and t2 in (GT.BOX, GT.MESH) and n1 * n2 > MAX_EDGE_PAIRS


def _hull_edges(hv):
    """Edge table rows of one hull (vertices ``hv`` (n, 3), float64): dict of (E, 3)."""
    from scipy.spatial import ConvexHull
    try:
        hull = ConvexHull(hv)
    except Exception:  # flat: no faces, no edges
        return _empty(hv)
    normals = hull.equations[:, :3]
    faces = {}
    for f, s in enumerate(hull.simplices):
        for a, b in ((s[0], s[1]), (s[1], s[2]), (s[2], s[0])):
            faces.setdefault((min(a, b), max(a, b)), []).append(f)
    centre = hv.mean(axis=0)
    rows = []
    for (i, j), fs in sorted(faces.items()):
        na, nb = normals[fs[0]], normals[fs[-1]]
        if len(fs) != 2 or np.dot(na, nb) > 1 - COPLANAR:
            continue
        p0, e = hv[i], hv[j] - hv[i]
        rows.append((na, nb, np.cross(nb, na), e, np.cross(p0 - centre, e), np.cross(p0, e),
                     p0))
    if not rows:
        return _empty(hv)
    cols = [np.asarray(c) for c in zip(*rows)]
    return dict(zip(NAMES, cols), egbox=np.stack([hv.min(0), hv.max(0)]))


def _empty(hv):
    return dict({k: np.zeros((0, 3)) for k in NAMES[:-1]},
                egbox=np.stack([hv.min(0), hv.max(0)]))


def edge_table(hull_vertices, key):
    """The edge tables of meshes with hull vertices ``hull_vertices`` (list of (n, 3)),
    padded with zero rows (a zero edge is never a Minkowski face) to the longest: dict of
    (nmesh, E, 3), and "egbox" (nmesh, 2, 3) the local box; cached by ``key``."""
    tab = _CACHE.get(key)
    if tab is None:
        per = [_hull_edges(np.asarray(hv, np.float64)) for hv in hull_vertices]
        E = max([1] + [len(p["ege"]) for p in per])
        tab = {k: np.zeros((len(per), E, 3)) for k in NAMES[:-1]}
        tab["egbox"] = np.stack([p["egbox"] for p in per])
        for i, p in enumerate(per):
            for k in NAMES[:-1]:
                tab[k][i, :len(p[k])] = p[k]
        _CACHE[key] = tab
    return tab


def _box_edges(size):
    """A box's edge table from its half sizes (3,): 12 edges, centre at the origin."""
    rows = []
    eye = np.eye(3)
    for k in range(3):
        k1, k2 = (k + 1) % 3, (k + 2) % 3
        for s1 in (-1.0, 1.0):
            for s2 in (-1.0, 1.0):
                rows.append((k, k1, k2, s1, s2))
    k, k1, k2, s1, s2 = (np.asarray(c) for c in zip(*rows))
    na = eye[k1] * s1[:, None]
    nb = eye[k2] * s2[:, None]
    ax = jnp.asarray(eye[k], size.dtype)
    p0 = (-ax + jnp.asarray(na + nb, size.dtype)) * size
    e = 2 * ax * size
    tab = dict(ega=jnp.asarray(na, size.dtype), egb=jnp.asarray(nb, size.dtype),
               egx=jnp.asarray(np.cross(nb, na), size.dtype), ege=e)
    tab["egu"] = tab["egv"] = cross(p0, e)
    tab["egp"] = p0
    tab["egbox"] = jnp.stack([-size, size])
    return tab


def _tables(t, geo):
    if t == GT.BOX:
        return _box_edges(geo.size)
    return {k: geo.extra[k] for k in NAMES}


def _dot(p, q):
    """(k, 3) x (m, 3) -> (k, m) row dot products, as three broadcast products (one
    fused kernel with their consumers, not a dot of contraction 3)."""
    return sum(p[:, None, i] * q[None, :, i] for i in range(3))


def _block(A, B):
    """Separation along the axis of every edge pair of a block (``A``: the first
    polytope's rows, ``B``: the second's, in the first's frame), -inf where the pair is
    not a Minkowski face or its edges are parallel."""
    cba, dba = _dot(A["egx"], B["c"]), _dot(A["egx"], B["d"])
    adc, bdc = _dot(A["ega"], B["dxc"]), _dot(A["egb"], B["dxc"])
    face = (cba * dba < 0) & (adc * bdc < 0) & (cba * bdc > 0)
    g = _dot(A["ege"], B["e"])
    l2 = jnp.sum(A["ege"] ** 2, -1)[:, None] * jnp.sum(B["e"] ** 2, -1)[None, :]
    x2 = l2 - g * g
    # nearly parallel edges (sine under 1e-6, or where the dtype's rounding of x2 is a
    # percent of it): their axis is ill-conditioned and faces beside it score the same
    ok = face & (x2 > max(1e-12, 100 * float(jnp.finfo(x2.dtype).eps)) * l2)
    side = _dot(A["egu"], B["e"])
    num = _dot(A["ege"], B["w"]) - _dot(A["egv"], B["e"])
    val = jnp.where(side >= 0, num, -num) * jax.lax.rsqrt(jnp.where(ok, x2, 1.0))
    return jnp.where(ok, val, -jnp.inf)


def _planes(t, geo):
    """A polytope's face planes in its own frame: unit normals (F, 3) and support values
    (F,) (meshes: the hull's SAT face normals and their static support values)."""
    if t == GT.BOX:
        eye = jnp.eye(3, dtype=geo.size.dtype)
        return jnp.concatenate([eye, -eye]), jnp.concatenate([geo.size, geo.size])
    return geo.extra["normal"], geo.extra["hface"][:, 0]


def _near_box(p0, e, box, r):
    """Edges (rows ``p0``, ``e`` (E, 3) of the other polytope, in this geom's frame) whose
    segment's bounding box meets this polytope's local box ``box`` (2, 3) grown by
    ``r``: (E,) bool."""
    lo = jnp.minimum(p0, p0 + e)
    hi = jnp.maximum(p0, p0 + e)
    return jnp.all((lo <= box[1] + r) & (hi >= box[0] - r), axis=-1)


def _near(p0, e, nrm, h, box, r):
    """_near_planes where the (edge, plane) products are at most ``PLANES_MAX``, else
    _near_box (large hulls: their products' memory)."""
    if p0.shape[0] * nrm.shape[0] > PLANES_MAX:
        return _near_box(p0, e, box, r)
    return _near_planes(p0, e, nrm, h, r)


def _near_planes(p0, e, nrm, h, r):
    """Edges (rows ``p0``, ``e`` (E, 3) of the other polytope, in this geom's frame) not
    wholly beyond one face plane of this polytope grown by ``r`` (normals ``nrm`` (F, 3),
    support values ``h`` (F,)): (E,) bool. A point within ``r`` of the polytope is
    within ``r`` of every face plane, so an edge with such a point passes."""
    b0 = _dot(p0, nrm) - h[None]                      # (E, F) the start's plane values
    b1 = b0 + _dot(e, nrm)                             # the end's
    return jnp.all(jnp.minimum(b0, b1) <= r, -1)


def _order(mask):
    """Indices of the true entries of ``mask`` (n,) first, in order, then the others
    (the driver's compaction, ``first_k``); and their count."""
    n = mask.shape[0]
    ids = np.arange(n, dtype=np.int32)
    return first_k(jnp.where(mask, ids, n + ids), n)[:n], jnp.sum(mask.astype(jnp.int32))


def edge_axis(t1, g1, t2, g2, reach):
    """The best edge-edge axis of two polytopes: (n (3,) world unit direction from geom1
    to geom2, found (bool)). Its separation is scored by the caller with full supports.

    ``reach`` (scalar): the penetration depth bound (minus the best separation found
    along the face normals) plus the margin. The two edges of a Minkowski face nearest
    the origin have points ``reach`` or less apart (the face's closest point to the
    origin is inside the face), so only edges whose segment comes within ``reach`` of
    the other polytope can give the optimum of a penetrating pair; the others are not
    tested. An edge is kept unless one face plane of the other polytope, grown by
    ``reach``, has the whole edge beyond it (``_near``; hulls of more than
    ``PLANES_MAX`` (edge, face) pairs: unless it lies beyond the other's bounding box
    grown by ``reach``). With the bounding boxes in place of the planes, the Trossen
    fingers kept all 65 of their edges at 4 mm of penetration, with the planes 37.
    Where the pair is apart but within the margin, an edge pair farther apart than the
    margin from the other polytope is not tested (its axis could only raise a
    separation that the face normals found already within the margin). The edges kept
    on each side are taken in blocks of ``BLOCK_SIDE`` (a loop, to the blocks of the
    world that keeps most). Where no edge pair is a Minkowski face (or every such pair
    is parallel), ``found`` is False and ``n`` is geom1's local z axis
    (any direction: it only adds a candidate)."""
    A, B = _tables(t1, g1), _tables(t2, g2)
    A, B, m1, m2, p1, p2, reach, h1, h2 = jax.lax.stop_gradient(
        (A, B, g1.mat, g2.mat, g1.pos, g2.pos, reach, _planes(t1, g1), _planes(t2, g2)))
    rot = m1.T @ m2                                  # geom2 frame -> geom1 frame
    off = m1.T @ (p2 - p1)
    e = B["ege"] @ rot.T
    side2 = dict(c=-(B["ega"] @ rot.T), d=-(B["egb"] @ rot.T), dxc=B["egx"] @ rot.T, e=e,
                 w=cross(e, jnp.broadcast_to(off, e.shape)) - B["egv"] @ rot.T)
    side1 = {k: A[k] for k in ("ega", "egb", "egx", "ege", "egu", "egv")}
    r = jnp.maximum(reach, 0.0)
    r = r + PLANE_TOL * jnp.maximum(jnp.max(jnp.abs(A["egbox"])),
                                    jnp.max(jnp.abs(B["egbox"])))
    near1 = _near((A["egp"] - off) @ rot, A["ege"] @ rot, *h2, B["egbox"], r)
    near2 = _near(B["egp"] @ rot.T + off, e, *h1, A["egbox"], r)
    order1, k1 = _order(near1 & jnp.any(A["ege"] != 0, -1))
    order2, k2 = _order(near2 & jnp.any(B["ege"] != 0, -1))
    c1, c2 = min(BLOCK_SIDE, order1.shape[0]), min(BLOCK_SIDE, order2.shape[0])
    nb2 = (k2 + c2 - 1) // c2
    trips = ((k1 + c1 - 1) // c1) * nb2
    pad1 = jnp.concatenate([order1, jnp.full((c1,), -1, jnp.int32)])
    pad2 = jnp.concatenate([order2, jnp.full((c2,), -1, jnp.int32)])

    def rows(tab, order, k, b, c):
        idx = jax.lax.dynamic_slice(order, (b * c,), (c,))
        ok = (b * c + np.arange(c)) < k
        return {n: v[jnp.maximum(idx, 0)] for n, v in tab.items()}, idx, ok

    def body(carry):
        t, best, i, j = carry
        a, ia, oka = rows(side1, pad1, k1, t // nb2, c1)
        b, ib, okb = rows(side2, pad2, k2, t % nb2, c2)
        val = jnp.where(oka[:, None] & okb[None, :], _block(a, b), -jnp.inf).reshape(-1)
        q = argmax(val)
        better = val[q] > best
        return (t + 1, jnp.where(better, val[q], best), jnp.where(better, ia[q // c2], i),
                jnp.where(better, ib[q % c2], j))

    init = (jnp.zeros((), jnp.int32), jnp.asarray(-jnp.inf, e.dtype),
            jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32))
    _, best, i, j = inline.while_loop(lambda c: c[0] < trips, body, init)
    side = jnp.dot(A["egu"][i], e[j])
    # the edges' world directions carry the poses' gradient, as convex.py's axes do
    n, _ = normalize(cross(g1.mat @ A["ege"][i], g2.mat @ B["ege"][j]))
    found = best > -jnp.inf
    n = jnp.where(side >= 0, n, -n)
    return jnp.where(found, n, g1.mat[:, 2]), found
