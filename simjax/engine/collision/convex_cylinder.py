"""Cylinder contact patches: a cylinder against a box, a mesh or another cylinder;
also a capsule lying on a cylinder's cap or a mesh face.

MuJoCo 4.0 recovers several contacts for these pairs from the final EPA face as it does
for boxes and meshes (its multicontact, engine_collision_gjk.c; the same algorithm is
in MuJoCo Warp's collision_gjk.py), with the cylinder described by:

- **support feature**: every support point of a cylinder carries the index of its cap
  (0: the +z cap, for directions with a non-negative axial component; 1: the -z cap).
  A cap feature (all EPA vertices on one cap) offers the cap as a face; a feature on
  both caps (the normal perpendicular to the axis) offers no face.
- **face**: the cap approximated by a 16-gon, vertex k at angle -k*pi/8 about the
  outward cap normal (clockwise about it, as box faces are ordered), starting on the
  local +x axis.
- **edge**: the side segment through the support point, from its rim to the other rim.

A capsule offers no face and one edge: its surface line facing the other geom.

Then, as for polytopes: two faces facing each other (cosine < -FACE_TOL, each facing
the other geom along the normal) give a face-face patch (geom2's face clipped by geom1's
side planes, polygonQuad beyond 4 points); otherwise an edge lying in a face of the
other geom (|cosine| < EDGE_TOL; edge of geom1 first when its feature is not larger or
it has no face, then the edge of geom2, except a cylinder's rim point) gives at most its
two farthest clipped points; otherwise the single contact of the curved pair.
Witnesses, depths and normals as
:func:`simjax.engine.collision.convex_polytope.poly_contacts`.

Quantities set by EPA's (or, for geoms apart within the margin, GJK's) iterations in
MuJoCo, taken here by rule: whether the cylinder's feature spans both caps (CAP_TOL,
SEP_TOL); a support point along the axis (the cap's
centre here, a rim point at a rounding-set azimuth in MuJoCo: no side segment then);
polygonQuad's choice among quadrilaterals of equal area (QUAD_TIE).
"""
from __future__ import annotations

import numpy as np
import jax.numpy as jnp

from simjax.engine.collision import convex as C
from simjax.engine.collision import convex_polytope as CP
from simjax.engine.collision.common import Pre, dot, one
from simjax.types import GeomType as GT

#: the feature spans both caps when c^2 * 2h < CAP_TOL (c: cosine of the normal with
#: the axis, 2h: the cylinder's length): MuJoCo 4.0.0's EPA separates the caps' support
#: points only above this (measured: |c| ~7.5e-6 for 2h = 0.2, ~4.2e-6 for 2h = 0.6)
CAP_TOL = 1.1e-11
#: geoms apart (within the margin): the feature spans both caps when
#: |c| * 2h * dist < SEP_TOL, the two rims' difference in distance times the distance.
#: MuJoCo 4.0.0 then stops GJK, not EPA, and GJK keeps both rims only below this
#: (measured on a cylinder lying on another's cap, 1 mm to 8 mm apart with margin 0.01,
#: 4 random poses per tilt and distance: products up to 3e-13 gave the side line's 2
#: contacts, from 1.5e-12 one rim point, either in between; the switch near 5e-13 for
#: radii 0.2 and 0.3, near 1e-12 for radius 0.05). Under CAP_TOL alone a cylinder
#: tilted by 1e-5 degrees got 2 contacts where MuJoCo gives 1. Below c's rounding
#: (SEP_EPS units of the dtype's epsilon) the feature spans both caps whatever the
#: distance, so that in float32 a cylinder lying flat keeps its line rather than a rim
#: point picked by rounding (a body resting in the margin, where MuJoCo's contacts with
#: a margin hold it, saw its support jump from rim to rim). Measured, float32, 20 flat
#: poses 5 mm apart (MuJoCo: 2 contacts each): the line kept in 7 with 8 units, 14
#: with 32, 20 with 128 (19 under CAP_TOL alone); float64's floor is 2.8e-14
SEP_TOL = 6e-13
SEP_EPS = 128
#: normal within this cosine of the axis: the support point is the cap's centre here,
#: a rim point at an azimuth set by EPA's rounding in MuJoCo; no side segment is offered
AXIS_TOL = 1e-9
#: relative area gain below which polygonQuad keeps its current quadrilateral: the cap
#: 16-gon is regular, so its clipped arcs offer quadrilaterals of exactly equal area
#: that MuJoCo separates by rounding; simjax takes the exact-arithmetic walk
QUAD_TIE = 1e-12
#: cap polygon: 16 vertices at angles -k*pi/8 (clockwise about the +z cap normal)
_ANG = -np.arange(16) * np.pi / 8
_COS, _SIN = np.cos(_ANG), np.sin(_ANG)


def _cyl_side(g, u, dist=None):
    """Support feature of cylinder ``g`` along world direction ``u``; ``dist``: the
    pair's signed distance (positive: apart, :data:`SEP_TOL`), None: penetrating."""
    dt = g.mat.dtype
    axis = g.mat[:, 2]
    c = dot(u, axis)
    both = c * c * 2 * g.size[1] < CAP_TOL
    if dist is not None:
        sep = ((jnp.abs(c) * 2 * g.size[1] * dist < SEP_TOL)
               | (jnp.abs(c) < SEP_EPS * jnp.finfo(dt).eps))
        both = jnp.where(dist > 0, sep, both)
    # a feature on both caps starts on the +z rim: c's sign is rounding there (|c| can
    # be ~1e-33), and XLA may evaluate it in several fusions that round differently, so
    # the edge's start and end took opposite signs and the side segment ran off the
    # cylinder (slider crank at XLA O0: a contact 0.05 m off); c * c decides robustly
    sgn = jnp.where((c >= 0) | both, 1.0, -1.0).astype(dt)
    r, h = g.size[0], g.size[1]
    v = _rim_point(g, u, sgn)
    # cap polygon: local (r cos a, sgn r sin a, sgn h) keeps it clockwise about the
    # outward normal on either cap
    loc = jnp.stack([r * jnp.asarray(_COS, dt), sgn * r * jnp.asarray(_SIN, dt),
                     jnp.broadcast_to(sgn * h, (16,))], axis=-1)
    face = loc @ g.mat.T + g.pos
    edir = -sgn * axis
    flat = jnp.abs(c) > 1 - AXIS_TOL
    return dict(dim=jnp.where(both, 2, 1), fn=(sgn * axis)[None], fok=~both[None],
                faces=face[None], fnum=jnp.asarray([16]), en=edir[None],
                eok=~flat[None], start=v, eend=(v + edir * 2 * h)[None],
                ok=jnp.asarray(True), point=~both & ~flat, line=both)


def _rim_point(g, u, sgn):
    """Cylinder ``g``'s support point along ``u`` on the cap of sign ``sgn``, the sign
    that also orients the side edge (C.local_support with the direction's axial part
    replaced by ``sgn``). C.support decides the cap from u's axial part a second time,
    in other arithmetic: for u across the axis (|c| ~ 1e-15) the two signs could
    differ, and the edge then started on one rim and ran away from the cylinder (seen
    at --xla_backend_optimization_level=0 on the slider crank: a contact 0.05 m off)."""
    d = u @ g.mat
    return C.local_support(GT.CYLINDER, g, d.at[2].set(sgn)) @ g.mat.T + g.pos


def _poly_side(t, g, u):
    """Support feature of box or mesh ``g`` along world direction ``u``."""
    P = CP._polytope(t, g)
    idx, dim = CP._feature(P, u)
    f, fok = CP._feature_faces(P, idx, dim, u)
    e, end, eok = CP._feature_edges(P, idx, dim)
    vw, fvert, fnum = P[0], P[1], P[2]
    return dict(dim=dim, fn=P[3][f], fok=fok, faces=vw[jnp.maximum(fvert[f], 0)],
                fnum=fnum[f], en=e, eok=eok, start=vw[idx[0]], eend=vw[end], ok=P[5],
                point=dim == 1, line=dim == 2, second=vw[idx[1]])


def _capsule_side(g, u, inflate=0.0):
    """A capsule's support feature along ``u``: no face; one edge, the segment of the
    capsule's surface line facing ``u`` (its axis moved by the radius along u's part
    across the axis), as MuJoCo recovers it from the witness point. ``inflate``: extra
    radius (MuJoCo's witness lies on the capsule inflated by half the contact margin)."""
    axis = g.mat[:, 2]
    r, h = g.size[0] + inflate, g.size[1]
    off = r * (u - dot(u, axis) * axis)
    start, end = g.pos - h * axis + off, g.pos + h * axis + off
    dt = g.mat.dtype
    return dict(dim=jnp.asarray(1), fn=jnp.zeros((1, 3), dt), fok=jnp.asarray([False]),
                faces=jnp.zeros((1, 3, 3), dt), fnum=jnp.asarray([3]), en=axis[None],
                eok=jnp.asarray([True]), start=start, eend=end[None],
                ok=jnp.asarray(True), point=jnp.asarray(True), line=jnp.asarray(False))


def _side(t, g, u, dist):
    if t == GT.CAPSULE:
        return _capsule_side(g, u)
    return _cyl_side(g, u, dist) if t == GT.CYLINDER else _poly_side(t, g, u)


def _pad(x, n):
    return jnp.concatenate([x, jnp.zeros((n - x.shape[0], 3), x.dtype)])


def cylinder_contacts(t1, g1, t2, g2, n, dist, margin, single=False):
    """Contacts of a cylinder (geom1) against a box, mesh or cylinder (geom2), given
    the penetration normal ``n`` (geom1 to geom2) and signed distance ``dist`` (see the
    module docstring). Returns a Pre of 5 slots: the single contact, then up to 4 patch
    contacts (either the first or the others valid); with ``single`` (MuJoCo's
    DisableBit.MULTICCD) a Pre of 1 slot, the single contact."""
    A, B = _side(t1, g1, n, dist), _side(t2, g2, -n, dist)
    if single:
        return one(dist, _single_contact(t1, g1, A, B, n, dist), n, dist <= margin)
    na, nb = A["fn"], B["fn"]
    nna, nnb = jnp.sum(A["fok"]), jnp.sum(B["fok"])
    # faces facing each other, each towards the other geom; the most opposed pair
    cosf = na @ nb.T
    okf = (A["fok"] & (na @ n > CP.EDGE_TOL))[:, None] & (B["fok"] & (nb @ n < -CP.EDGE_TOL))[None]
    (i, j), ff = CP._first(okf & (cosf < -CP.FACE_TOL), cosf)
    # an edge of geom1 in a face of geom2 (first face, then first edge), or conversely
    try1 = ~ff & (A["dim"] < 3) & (nnb > 0) & ((A["dim"] <= B["dim"]) | (nna == 0))
    m1 = (B["fok"] & (nb @ n < 0))[:, None] & A["eok"][None] & (
        jnp.abs(nb @ A["en"].T) < CP.EDGE_TOL)
    # a cylinder geom2's rim point offers no side edge to geom1's faces (measured on
    # MuJoCo 4.0.0: cylinder pairs with the cap of geom1 against the rim of geom2)
    eok2 = B["eok"] & ~B["point"] if t2 == GT.CYLINDER else B["eok"]
    m2 = (A["fok"] & (na @ n > 0))[:, None] & eok2[None] & (
        jnp.abs(na @ B["en"].T) < CP.EDGE_TOL)
    (jb, iea), ef = CP._first(m1)
    (ja, ieb), fe = CP._first(m2)
    ef = try1 & ef
    # geom2's edge in geom1's faces when geom1's edge was not tried or gave no pair
    # (MuJoCo 4.0.0, as convex_polytope.poly_contacts): a cap standing on a mesh's or
    # box's ridge clips the ridge
    fe = ~ff & ~ef & (B["dim"] < 3) & fe
    multi = (ff | ef | fe) & A["ok"] & B["ok"] & (dist < margin)
    # a capsule's edge (geom1) in a face: MuJoCo 4.0.0 takes the edge through its
    # witness on the capsule inflated by half the margin, keeps clipped points up to
    # half the margin above the face, puts their partners on the face raised by half
    # the margin, and reports the depth plus the margin (its ccd works on shapes
    # inflated by margin / 2 each; only the face side is un-inflated afterwards)
    half = 0.5 * margin if t1 == GT.CAPSULE else 0.0
    A0 = A
    if t1 == GT.CAPSULE:
        A = _capsule_side(g1, n, half)

    # reference polygon: geom1's face (face-face, face-edge) or geom2's face (edge-face)
    K = max(A["faces"].shape[1], B["faces"].shape[1])
    fa = jnp.where(ff, i, ja)
    ref = jnp.where(ef, _pad(B["faces"][jb], K), _pad(A["faces"][fa], K))
    kref = jnp.where(ef, B["fnum"][jb], A["fnum"][fa])
    nref = jnp.where(ef, nb[jb], na[fa])
    # incident polygon: geom2's face, geom1's edge or geom2's edge
    L = max(B["faces"].shape[1], 2)
    edge_a = jnp.stack([A["start"], A["eend"][iea]])
    edge_b = jnp.stack([B["start"], B["eend"][ieb]])
    inc = jnp.where(ff, _pad(B["faces"][j], L),
                    jnp.where(ef, _pad(edge_a, L), _pad(edge_b, L)))
    kinc = jnp.where(ff, B["fnum"][j], 2)
    pts, cnt = CP._clip(ref, kref, nref, inc, kinc, K + L, margin - half)
    sel = jnp.where(cnt > 4, CP._polygon_quad(pts, cnt, QUAD_TIE),
                    jnp.where((kinc == 2) & (cnt > 2),
                              jnp.concatenate([CP._farthest2(pts, cnt),
                                               jnp.zeros(2, jnp.int32)]),
                              jnp.arange(4)))
    nsel = jnp.where(cnt > 4, 4, jnp.where((kinc == 2) & (cnt > 2), 2, cnt))
    v = pts[sel]
    # witnesses: the clipped point and its projection onto the reference plane; the
    # normal is minus geom2's face normal (face-face) or the reference normal oriented
    # from geom1 to geom2; position: geom1's witness moved half the depth along it
    proj = v - dot(v - ref[0], nref)[:, None] * nref
    x1, x2 = jnp.where(ef, v, proj + half * nref), jnp.where(ef, proj + half * nref, v)
    mnrm = jnp.broadcast_to(jnp.where(ff, nb[j], jnp.where(ef, -nref, nref))
                            * jnp.where(ff, -1.0, 1.0), v.shape)
    dd = dot(x2 - x1, mnrm)
    mpos = x1 + 0.5 * dd[:, None] * mnrm
    dd = dd + 2 * half
    live = jnp.arange(4) < nsel
    mvalid = multi & (cnt >= 1) & live & (jnp.min(jnp.where(live, dd, jnp.inf)) < margin)
    spos = _single_contact(t1, g1, A0, B, n, dist)
    svalid = (dist <= margin) & ~(multi & (cnt >= 1))
    return Pre(jnp.concatenate([dist[None], dd]), jnp.concatenate([spos[None], mpos]),
               jnp.concatenate([n[None], jnp.where(multi, mnrm, n)]),
               jnp.zeros((5, 3), n.dtype), jnp.concatenate([svalid[None], mvalid]))


def _single_contact(t1, g1, A, B, n, dist):
    """Position of the single contact of geom1 (type ``t1``, side ``A``) against
    geom2 (side ``B``)."""
    if t1 == GT.CAPSULE:
        return _capsule_pos(g1, A, B, n, dist)
    return _single_pos(A, B, n, dist)


def _capsule_pos(g, A, B, n, dist):
    """Single-contact position of a capsule (geom1): its support point moved half the
    distance along ``n`` when that point is unique; when the normal is perpendicular to
    the capsule's axis (the capsule's side crossing the other geom, a common optimum)
    its whole surface line supports, and the witness is where that line comes closest
    to the other geom's support feature (point or segment), as EPA's final face gives
    it (MuJoCo 4.0.0: e.g. a capsule's end buried in a cylinder's side)."""
    dt = n.dtype
    flat = jnp.abs(dot(n, g.mat[:, 2])) < np.sqrt(np.finfo(dt).eps)
    b0, b1 = _segment(B, -n)
    b1 = jnp.where(B["point"], b0, b1)
    ca, cb = CP._segments(A["start"], A["eend"][0], b0, b1)
    return jnp.where(flat, 0.5 * (ca + cb), C.support(GT.CAPSULE, g, n) + 0.5 * dist * n)


def _segment(S, u):
    """A side's support segment (two points): the side line of a cylinder or the edge
    of a polytope."""
    return S["start"], S["second"] if "second" in S else S["eend"][0]


def _single_pos(A, B, n, dist):
    """Position of the single contact (EPA's witness): a support point that is unique
    (a cylinder's rim point or a polytope vertex) moved half the distance along the
    normal, else the midpoint of the closest points of two support segments."""
    a0, a1 = _segment(A, n)
    b0, b1 = _segment(B, -n)
    ca, cb = CP._segments(a0, a1, b0, b1)
    return jnp.where(A["point"], A["start"] + 0.5 * dist * n,
                     jnp.where(B["point"], B["start"] - 0.5 * dist * n, 0.5 * (ca + cb)))
