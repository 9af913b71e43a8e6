"""Contacts of two polytopes (boxes, meshes) from a given normal and signed distance:
MuJoCo 4.0's multicontact (engine_collision_gjk.c: multicontact, polygonClip,
polygonQuad, boxNormals / meshNormals, boxEdgeNormals / meshEdgeNormals) and, when no
face-face or edge-face patch qualifies, the single EPA witness of the support features.
The normal and distance come from convex.py's SAT search (``convex_convex``); see its
module docstring for the method and the differences from MuJoCo. The feature, clipping
and polygonQuad helpers here also serve the cylinder patches (convex_cylinder.py).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from simjax.engine import inline
from simjax.engine.math import clip
from simjax.engine.solver_gather import cumcount
from simjax.engine.solver_worlds import any_world, batched_like
from simjax.engine.collision.common import (Pre, argmax, cross, dot, normalize, one,
                                            safe_norm, top_k, first_where as _first)
from simjax.types import GeomType as GT


#: MuJoCo's feature alignment tolerances (engine_collision_gjk.h): faces facing each
#: other (cosine), and an edge lying in a face (|cosine| with the face normal)
FACE_TOL = 0.996
EDGE_TOL = 0.0888
#: support values within this distance of the maximum belong to one support feature
#: (the EPA tolerance, opt.ccd_tolerance's default)
FEATURE_TOL = 1e-6


def _box_verts(size):
    s = jnp.asarray([[(1 if i & 1 else -1), (1 if i & 2 else -1), (1 if i & 4 else -1)]
                     for i in range(8)], size.dtype)
    return s * size


# box faces in MuJoCo's order (+x, -x, +y, -y, +z, -z) and corner order (clockwise about
# the outward normal); corner index bits x = 1, y = 2, z = 4 (as _box_verts)
_BOX_FACES = np.array([[7, 3, 1, 5], [2, 6, 4, 0], [2, 3, 7, 6],
                       [4, 5, 1, 0], [6, 7, 5, 4], [3, 2, 0, 1]])
_BOX_NORMALS = np.array([[1, 0, 0], [-1, 0, 0], [0, 1, 0], [0, -1, 0], [0, 0, 1],
                         [0, 0, -1]], np.float64)
_BOX_VFACE = np.array([[0 if v & 1 else 1, 2 if v & 2 else 3, 4 if v & 4 else 5]
                       for v in range(8)])


def _witness(A, B, ia, da, ib, db, n, dist):
    """Position of the single contact (EPA's witness) of the support features ``ia``
    of ``A`` (dimension ``da``) and ``ib`` of ``B``: a vertex against anything, moved
    half the distance along ``n``, or the midpoint of the closest points of two
    edges."""
    a0, b0 = A[0][ia[0]], B[0][ib[0]]
    ca, cb = _segments(a0, A[0][ia[1]], b0, B[0][ib[1]])
    return jnp.where(da == 1, a0 + 0.5 * dist * n,
                     jnp.where(db == 1, b0 - 0.5 * dist * n, 0.5 * (ca + cb)))


def _polytope(t, geo):
    """World vertices (V, 3), polygons (F, PV) in clipping order, their vertex counts
    (F,), world normals (F, 3), polygons at each vertex (V, D) and whether polygon data
    exists (MuJoCo skips multi-contact for meshes without it)."""
    if t == GT.BOX:
        v = _box_verts(geo.size) @ geo.mat.T + geo.pos
        return (v, jnp.asarray(_BOX_FACES), jnp.full(6, 4),
                jnp.asarray(_BOX_NORMALS, v.dtype) @ geo.mat.T, jnp.asarray(_BOX_VFACE),
                jnp.asarray(True), jnp.asarray(8))
    ex = geo.extra
    return (geo.vert @ geo.mat.T + geo.pos, ex["fvert"], ex["fnum"],
            ex["fnormal"] @ geo.mat.T, ex["vface"], ex["npoly"] > 0, ex["nvert"])


def best3(vert, nvert, u):
    """Ids (3,) of the 3 vertices of ``vert`` (V, 3; the first ``nvert`` real, the rest
    padding) farthest along ``u`` (in vert's frame), best first, and every vertex's
    projection (padding -inf)."""
    pr = jnp.where(jnp.arange(vert.shape[0]) < nvert, vert @ u, -jnp.inf)
    return top_k(pr, 3), pr


def _feature(poly, u):
    """Support feature of a polytope along u: its 3 best vertex ids and dimension
    (1 vertex, 2 edge, 3 face), as the vertices of the final EPA face on that side."""
    idx, pr = best3(poly[0], poly[6], u)
    close = pr[idx] >= pr[idx[0]] - FEATURE_TOL
    dim = 1 + close[1].astype(jnp.int32) + (close[1] & close[2]).astype(jnp.int32)
    return idx, dim


def _feature_faces(poly, idx, dim, u):
    """Polygons adjacent to a support feature along ``u`` (meshNormals/boxNormals): ids
    (D,), mask. A face feature whose three vertices share no polygon (a flat region of
    a mesh split into several polygons, its vertices tied to rounding) takes the
    polygons at its first vertex that face ``u`` (cosine > FACE_TOL): MuJoCo's EPA face
    there has vertices of one polygon, simjax's three best vertices may not."""
    fvert, vface = poly[1], poly[4]
    cand = vface[idx[0]]
    ok = cand >= 0
    fv = fvert[jnp.maximum(cand, 0)]                               # (D, PV)
    has1 = jnp.any(fv == idx[1], axis=-1)
    has2 = jnp.any(fv == idx[2], axis=-1)
    common = ok & ((dim < 2) | has1) & ((dim < 3) | has2)
    facing = ok & (poly[3][jnp.maximum(cand, 0)] @ u > FACE_TOL)
    ok = jnp.where((dim == 3) & ~jnp.any(common), facing, common)
    return jnp.maximum(cand, 0), ok


def _feature_edges(poly, idx, dim):
    """Edges at a support feature (meshEdgeNormals/boxEdgeNormals): the edge itself, or
    every edge at the vertex. Returns unit directions (D, 3), end vertex ids, mask."""
    vw, fvert, fnum, vface = poly[0], poly[1], poly[2], poly[4]
    cand = vface[idx[0]]
    ok = cand >= 0
    fv = fvert[jnp.maximum(cand, 0)]                               # (D, PV)
    n = fnum[jnp.maximum(cand, 0)]
    j = jnp.argmax(fv == idx[0], axis=-1)
    # the neighbour that precedes the vertex counter-clockwise: next in clipping order
    end = fv[jnp.arange(fv.shape[0]), jnp.where(j + 1 >= n, 0, j + 1)]
    end = jnp.where(dim == 2, jnp.full_like(end, idx[1]), end)
    ok = jnp.where(dim == 2, jnp.arange(ok.shape[0]) == 0, ok)
    e, _ = normalize(vw[end] - vw[idx[0]])
    return e, end, ok


def _clip(ref, kref, nref, inc, kinc, size, margin=0.0):
    """Sutherland-Hodgman clipping of polygon ``inc`` (kinc vertices) by the side planes
    of polygon ``ref`` (kref vertices, normal nref), then only points at most ``margin``
    above ref's plane kept (polygonClip). Returns points (size, 3) and their count."""
    K = ref.shape[0]
    i = jnp.arange(K)
    nxt = jnp.where(i + 1 >= kref, 0, i + 1)
    pn, _ = normalize(cross(ref[nxt] - ref, nref[None]))
    pd = dot(pn, ref)
    poly = jnp.zeros((size, 3), ref.dtype).at[:inc.shape[0]].set(inc)
    slot = jnp.arange(size)

    def edge(carry, e):
        # the scan runs to the largest polygon of the hulls (K); past every world's
        # reference polygon (kref) a step is skipped, not run masked: the Trossen
        # fingers' patch (kref 9 of K 22; batch 64, float32) 56 -> 38 us per world, the
        # arm's step 213-223 -> 192-201; the same outputs and gradients
        return jax.lax.cond(any_world(e < kref), clip_by, lambda c, e: c, carry, e), None

    def clip_by(carry, e):
        poly, cnt = carry
        P = poly
        Q = jnp.where((slot < cnt - 1)[:, None], jnp.roll(poly, -1, axis=0), poly[0])
        in1 = dot(P - ref[e], pn[e]) > -1e-15
        in2 = dot(Q - ref[e], pn[e]) > -1e-15
        live = slot < cnt
        PQ = Q - P
        tmp = dot(PQ, pn[e])
        t = (pd[e] - dot(P, pn[e])) / jnp.where(tmp != 0, tmp, 1.0)
        s0 = live & (in1 != in2) & (tmp != 0) & (t >= 0) & (t <= 1)
        s1 = live & in2
        pts = jnp.stack([P + t[:, None] * PQ, Q], 1).reshape(-1, 3)
        val = jnp.stack([s0, s1], 1).reshape(-1)
        # cumcount's triangular products, not jnp.cumsum (two reduce-windows on XLA
        # CPU): the Trossen finger pair's collider 507 -> 430 us per world (float32,
        # batch 64, paired rounds), outputs bit-identical
        # the write below is a scatter (XLA CPU loops over its rows); finding each
        # slot's source row by a (slot, row) compare and sum and gathering it instead
        # made the Trossen fingers' mesh-mesh group 3.55x [2.91, 4.65] slower (batch
        # 64, 8 paired rounds)
        pos = jnp.where(val, cumcount(val) - 1, 2 * size)
        new = jnp.zeros_like(poly).at[pos].set(pts, mode="drop")
        use = e < kref
        return (jnp.where(use, new, poly),
                jnp.where(use, jnp.minimum(jnp.sum(val), size), cnt))

    (poly, cnt), _ = inline.scan(edge, (poly, kinc), jnp.arange(K))
    below = (slot < cnt) & (dot(poly - ref[0], nref) <= jnp.maximum(margin, 0.0))
    pos = jnp.where(below, cumcount(below) - 1, 2 * size)
    poly = jnp.zeros_like(poly).at[pos].set(poly, mode="drop")
    return poly, jnp.sum(below)


def _area4(a, b, c, d):
    """Area of the quadrilateral abcd (half its diagonals' cross product), the measure
    MuJoCo 4.0.0's polygonQuad maximises."""
    return 0.5 * safe_norm(cross(a - c, b - d))


def _polygon_quad(poly, n, tie=0.0):
    """Indices (4,) of the greedy maximum-area quadrilateral of polygon ``poly`` (n
    vertices, n > 4) as MuJoCo's polygonQuad walks it (index choice only: no gradient).
    A step is taken when it grows the area by more than ``tie`` (relative).

    MuJoCo's walk nests three loops in one per corner a (advance d while the area
    grows; after each advance, c then b likewise). Here it is one loop: each iteration
    evaluates the one candidate area of the walk's phase (0: advance d, 1: c, 2: b),
    and a failed advance of d closes corner a (b, c, d moved off it, as MuJoCo does)
    and starts a + 1: the same comparisons in the same order. Under vmap the nested
    loops each ran to the largest count of any world at every level: the Trossen
    arm's step (batch 64, float32) 222-237 -> 214-218 us per world, the same indices
    on 4000 random polygons of 5-29 vertices."""
    p = jax.lax.stop_gradient(poly)
    n = n.astype(jnp.int32)

    def nx(i):
        return jnp.where(i >= n - 1, 0, i + 1)

    def ar(a, b, c, d):
        return _area4(p[a], p[b], p[c], p[d])

    def body(s):
        a, b, c, d, m, res, ph = s
        nb, nc, nd = (jnp.where(ph == 2, nx(b), b), jnp.where(ph == 1, nx(c), c),
                      jnp.where(ph == 0, nx(d), d))
        area = ar(a, nb, nc, nd)
        grow = area > m * (1.0 + tie)
        m = jnp.where(grow, area, m)
        b, c, d = jnp.where(grow, nb, b), jnp.where(grow, nc, c), jnp.where(grow, nd, d)
        res = jnp.where(grow, jnp.stack([a, b, c, d]), res)
        # phase: d grown -> 1; c grown stays 1, else 2; b grown stays 2, else 0
        ph_next = jnp.where(ph == 0, 1, jnp.where(grow, ph, (ph + 1) % 3))
        # d not grown: corner a closes (b, c, d moved off a), the walk goes on at a + 1
        close = (ph == 0) & ~grow
        b1 = jnp.where(b == a, nx(b), b)
        c1 = jnp.where((b == a) & (c == b1), nx(c), c)
        d1 = jnp.where((b == a) & (c == b1) & (d == c1), nx(d), d)
        b, c, d = jnp.where(close, b1, b), jnp.where(close, c1, c), jnp.where(close, d1, d)
        a = jnp.where(close, a + 1, a)
        return a, b, c, d, m, res, jnp.where(close, 0, ph_next)

    i0 = jnp.asarray(0, jnp.int32)
    st = (i0, i0 + 1, i0 + 2, i0 + 3, ar(0, 1, 2, 3), jnp.arange(4, dtype=jnp.int32), i0)
    # under vmap every value batched from the start: the body batched once, not again
    # for the indices found batched in it
    st = batched_like(st, jax.lax.stop_gradient(n))
    return inline.while_loop(lambda s: s[0] < n, body, st)[5]


def _farthest2(poly, n):
    """The two most distant points of the first n (first pair wins ties)."""
    P = poly.shape[0]
    dp = poly[:, None] - poly[None]
    d2 = dot(dp, dp)
    i, j = jnp.arange(P)[:, None], jnp.arange(P)[None]
    d2 = jnp.where((i < j) & (j < n), d2, -1.0)
    a, b = jnp.unravel_index(argmax(d2.reshape(-1)), d2.shape)
    return jnp.stack([a, b])


def _segments(a0, a1, b0, b1):
    """Closest points of segments a0a1 and b0b1."""
    u, v, w = a1 - a0, b1 - b0, a0 - b0
    uu, uv, vv, uw, vw = dot(u, u), dot(u, v), dot(v, v), dot(u, w), dot(v, w)
    den = uu * vv - uv * uv
    s = clip(jnp.where(den > 1e-30, (uv * vw - vv * uw) / jnp.where(den > 1e-30, den, 1),
                       0.0), 0, 1)
    t = clip((uv * s + vw) / jnp.where(vv > 1e-30, vv, 1), 0, 1)
    s = clip((uv * t - uw) / jnp.where(uu > 1e-30, uu, 1), 0, 1)
    return a0 + s * u, b0 + t * v


def poly_contacts(t1, g1, t2, g2, n, dist, margin, single=False):
    """Contacts of two polytopes (boxes, meshes) given the penetration normal ``n`` and
    signed distance ``dist``: MuJoCo's multicontact (face-face or edge-face: the
    incident feature clipped by the reference face, at most 4 points by polygonQuad),
    else the single EPA witness of the support features. Returns a Pre of 5 slots;
    with ``single`` (MuJoCo's DisableBit.MULTICCD) a Pre of 1 slot, the witness."""
    A, B = _polytope(t1, g1), _polytope(t2, g2)
    ia, da = _feature(A, n)
    ib, db = _feature(B, -n)
    spos = _witness(A, B, ia, da, ib, db, n, dist)
    if single:
        return one(dist, spos, n, dist <= margin)
    fa, oka = _feature_faces(A, ia, da, n)
    fb, okb = _feature_faces(B, ib, db, -n)
    na, nb = A[3][fa], B[3][fb]                                   # (D, 3)
    # MuJoCo takes the first qualifying pair in its polygon order; simjax the best
    # aligned (the same whenever one pair qualifies)
    cosf = na @ nb.T
    (i, j), ff = _first((cosf < -FACE_TOL) & oka[:, None] & okb[None], cosf)
    # edge of A lying in a face of B, or the other way round
    ea, enda, okea = _feature_edges(A, ia, da)
    eb, endb, okeb = _feature_edges(B, ib, db)
    cosa, cosb = jnp.abs(nb @ ea.T), jnp.abs(na @ eb.T)
    (jb, iea), ef = _first((cosa < EDGE_TOL) & okb[:, None] & okea[None], cosa)
    (ja, ieb), fe = _first((cosb < EDGE_TOL) & oka[:, None] & okeb[None], cosb)
    ef = ~ff & (da < 3) & (da <= db) & ef
    # B's edge in A's faces when A's edge was not tried or gave no pair: MuJoCo 4.0.0
    # (measured; its 3.12 source returned there instead)
    fe = ~ff & ~ef & (db < 3) & fe
    # MuJoCo 4.0 builds the patch whenever the pair is within the margin (points up to
    # the margin above the reference face kept)
    multi = (ff | ef | fe) & A[5] & B[5] & (dist < margin)

    def face(P, f):
        vw, fvert, fnum = P[0], P[1], P[2]
        return vw[jnp.maximum(fvert[f], 0)], fnum[f]

    # reference polygon: A's face (face-face, face-edge) or B's face (edge-face)
    fa_ref = jnp.where(ff, fa[i], fa[ja])
    ra, ka = face(A, fa_ref)
    rb, kb = face(B, fb[jb])
    K = max(ra.shape[0], rb.shape[0])

    def pad(x):
        return jnp.concatenate([x, jnp.zeros((K - x.shape[0], 3), x.dtype)])
    ref = jnp.where(ef, pad(rb), pad(ra))
    kref = jnp.where(ef, kb, ka)
    nref = jnp.where(ef, B[3][fb[jb]], A[3][fa_ref])
    # incident polygon: B's face, A's edge or B's edge
    ib_face, kb_face = face(B, fb[j])
    L = max(ib_face.shape[0], 2)

    def pad(x):
        return jnp.concatenate([x, jnp.zeros((L - x.shape[0], 3), x.dtype)])
    edge_a = jnp.stack([A[0][ia[0]], A[0][enda[iea]]])
    edge_b = jnp.stack([B[0][ib[0]], B[0][endb[ieb]]])
    inc = jnp.where(ff, pad(ib_face), jnp.where(ef, pad(edge_a), pad(edge_b)))
    kinc = jnp.where(ff, kb_face, 2)
    # witness direction: B's face normal (face-face), minus the reference normal
    wit = jnp.where(ff, nb[j], -nref)
    pts, cnt = _clip(ref, kref, nref, inc, kinc, K + L, margin)
    sel = jnp.where(cnt > 4, _polygon_quad(pts, cnt),
                    jnp.where((kinc == 2) & (cnt > 2),
                              jnp.concatenate([_farthest2(pts, cnt), jnp.zeros(2, jnp.int32)]),
                              jnp.arange(4)))
    nsel = jnp.where(cnt > 4, 4, jnp.where((kinc == 2) & (cnt > 2), 2, cnt))
    v = pts[sel]
    dd = dot(v - ref[0], nref)
    # witnesses (MuJoCo 4.0): the clipped point and its projection onto the reference
    # plane along the reference normal; the normal is minus the incident face's normal
    # (face-face) or the reference normal pointing from geom1 to geom2; the depth is
    # the witnesses' separation along the normal, the position geom1's witness moved
    # half of it along the normal
    proj = v - dd[:, None] * nref
    x1, x2 = jnp.where(ef, v, proj), jnp.where(ef, proj, v)
    mnrm = jnp.broadcast_to(jnp.where(ff, -wit, jnp.where(ef, -nref, nref)), v.shape)
    dd = dot(x2 - x1, mnrm)
    mpos = x1 + 0.5 * dd[:, None] * mnrm
    mvalid = multi & (cnt >= 1) & (jnp.arange(4) < nsel) & (jnp.min(
        jnp.where(jnp.arange(4) < nsel, dd, jnp.inf)) < margin)
    svalid = ~(multi & (cnt >= 1)) & (dist <= margin)
    return Pre(jnp.concatenate([dist[None], dd]), jnp.concatenate([spos[None], mpos]),
               jnp.concatenate([n[None], jnp.where(multi, mnrm, n)]),
               jnp.zeros((5, 3), n.dtype), jnp.concatenate([svalid[None], mvalid]))
