"""Analytic colliders for primitive geom pairs (MuJoCo's engine_collision_primitive.c
and engine_collision_box.c, mjc_* functions), one geom pair per call (vmapped by the
driver).

Each collider ``f(g1, g2, margin) -> Pre`` takes two :class:`Geom` (world position,
rotation matrix, size) in MuJoCo's geom order (``geom_type[g1] <= geom_type[g2]``) and
the detection margin (margin + gap), and returns a fixed number of candidate contact
slots with a validity mask, at most ``MAXCON[f]`` valid (mj_maxContact). Contact
counts, positions, normals and first tangents follow MuJoCo 4.0 case by case; where
MuJoCo stops early (e.g. plane-box keeps the first four corners below the plane), the
same slots are selected by masks.
"""
from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from simjax.engine import inline
from simjax.engine.collision.common import (MINVAL, Pre, argmin, cross, dot, normalize,
                                            normalize_c, once, one, pick3, safe_norm,
                                            sel, stack)
from simjax.engine.collision.common import rot as _rot, rot_t as _rot_t
from simjax.engine.math import c_cross, c_dot, clip, unstack, where
from simjax.engine.solver_gather import cumcount


class Geom(NamedTuple):
    pos: Any      # (3,) world position
    mat: Any      # (3, 3) world rotation (columns: geom axes)
    size: Any     # (3,) geom_size
    vert: Any = None   # (V, 3) convex hull vertices in the geom frame (meshes)
    extra: Any = None  # collider-specific static data (e.g. hull neighbours)


def _zeros3(x):
    return jnp.zeros(3, x.dtype)


# --------------------------------------------------------------------------- plane
def _plane_sphere_raw(ppos, pmat, center, radius, margin):
    normal = pmat[:, 2]
    cdist = dot(center - ppos, normal)
    dist = cdist - radius
    pos = center - normal * (dist / 2 + radius)
    return dist, pos, normal, cdist <= margin + radius


def plane_sphere(g1, g2, margin):
    d, p, n, v = _plane_sphere_raw(g1.pos, g1.mat, g2.pos, g2.size[0], margin)
    return one(d, p, n, v)


def plane_capsule(g1, g2, margin):
    """Two contacts, one per capsule end; frames aligned with the capsule axis. A
    capsule of half-length 0 (a sphere run in this group, ``narrow.AS_GROUP``; MuJoCo's
    capsules have a positive one) gives :func:`plane_sphere`'s contact: no tangent,
    the second slot not valid."""
    axis = g2.mat[:, 2]
    seg = axis * g2.size[1]
    long = g2.size[1] > 0
    tangent = sel(long, axis, 0.0)
    out = []
    for k, end in enumerate((g2.pos + seg, g2.pos - seg)):
        d, p, n, v = _plane_sphere_raw(g1.pos, g1.mat, end, g2.size[0], margin)
        out.append(one(d, p, n, v & long if k else v, tangent=tangent))
    pre = stack(out)
    # the depths stored by one kernel (:func:`once`): read by the driver's contact table
    # twice (its fields and its depths), each evaluated them (the humanoid's two
    # kernels; the ant's count the same)
    return pre._replace(dist=once(pre.dist))


def plane_cylinder(g1, g2, margin):
    """Up to 4 contacts: nearest rim point, opposite-cap rim point, and two points of
    an inscribed triangle on the nearer cap (mjc_PlaneCylinder)."""
    normal = g1.mat[:, 2]
    axis = g2.mat[:, 2]
    prjaxis = dot(normal, axis)
    flip = prjaxis > 0
    axis = sel(flip, -axis, axis)
    prjaxis = sel(flip, -prjaxis, prjaxis)
    dist0 = dot(g2.pos - g1.pos, normal)
    vec = axis * prjaxis - normal
    lsq = dot(vec, vec)
    general = lsq >= MINVAL * MINVAL
    rad = g2.size[0]
    vec = sel(general, vec * (rad / jnp.sqrt(sel(general, lsq, 1.0))),
              g2.mat[:, 0] * rad)
    prjvec = dot(vec, normal)
    axis = axis * g2.size[1]
    prjaxis = prjaxis * g2.size[1]

    d1 = dist0 + prjaxis + prjvec
    v1 = d1 <= margin
    p1 = g2.pos + vec + axis - normal * (d1 * 0.5)
    d2 = dist0 - prjaxis + prjvec
    v2 = v1 & (d2 <= margin)
    p2 = g2.pos + vec - axis - normal * (d2 * 0.5)
    prjvec1 = -prjvec * 0.5
    d3 = dist0 + prjaxis + prjvec1
    v3 = v1 & (d3 <= margin)
    vec1, _ = normalize(cross(vec, axis))
    vec1 = vec1 * (rad * np.sqrt(3.0) / 2)
    base = g2.pos + axis - vec * 0.5 - normal * (d3 * 0.5)
    pa, pb = base + vec1, base - vec1
    return Pre(jnp.stack([d1, d2, d3, d3]), jnp.stack([p1, p2, pa, pb]),
               jnp.broadcast_to(normal, (4, 3)), jnp.zeros((4, 3), normal.dtype),
               jnp.stack([v1, v2, v3, v3]))


_BOX_CORNERS = np.array([[(1 if i & 1 else -1), (1 if i & 2 else -1), (1 if i & 4 else -1)]
                         for i in range(8)], np.float64)


def _first_k(valid, k):
    """Keep the first ``k`` true entries of ``valid`` (in slot order)."""
    return valid & (cumcount(valid) <= k)


def plane_box(g1, g2, margin):
    """Box corners below the plane (pointing down), first four in corner order."""
    normal = g1.mat[:, 2]
    dist = dot(g2.pos - g1.pos, normal)
    corners = (_BOX_CORNERS * g2.size) @ g2.mat.T           # (8, 3) relative to center
    ldist = corners @ normal
    d = dist + ldist
    valid = ~((d > margin) | (ldist > 0))
    valid = _first_k(valid, 4)
    pos = corners + g2.pos - normal * (d / 2)[:, None]
    return Pre(d, pos, jnp.broadcast_to(normal, (8, 3)), jnp.zeros((8, 3), d.dtype), valid)


# --------------------------------------------------------------------------- spheres
def _alt_normal(z1, z2):
    """The normal of coincident sphere centres, z1 x z2 normalised (x when parallel), as
    MuJoCo; from the components of the two geoms' z axes, as components (the
    reciprocal norm's product, as :func:`normalize` computes it)."""
    return normalize_c(c_cross(z1, z2), reciprocal=True)[0]


def _sphere_sphere_c(p1, r1, p2, r2, margin, alt):
    """:func:`_sphere_sphere_raw` on components: ``p1``, ``p2`` and ``alt`` (the normal
    of coincident centres, :func:`_alt_normal`) lists of three arrays, the radii and
    margin arrays (or scalars) that broadcast with them; (dist, pos, normal, valid),
    pos and normal as lists of three. The same operations in the same order as on
    3-vectors (the normal times its norm's reciprocal: XLA rewrote the division by a
    broadcast norm so), so the same values but for the multiply-adds LLVM contracts
    (float64 contacts of the bench humanoid and shadow hand bit for bit the former
    ones with ``--xla_cpu_max_isa=AVX``, within 1-2 ulp with FMA). On 3-vectors each
    norm and quotient read by a broadcast over the last axis was a kernel of its own
    (the humanoid's sphere-capsule group 7, capsule-capsule 8 and its stacked
    centres 2); here the depth, the normal's reciprocal norm, the flags and the
    centres' difference are stored by one kernel (:func:`once`; the normal and
    position are computed from them where read: stored too, a reduction of more
    outputs, XLA put the difference in kernels of its own)."""
    dif = [a - b for a, b in zip(p1, p2)]
    sq = c_dot(dif, dif)
    valid = sq <= (margin + r1 + r2) ** 2
    ok = sq > MINVAL * MINVAL
    dist = sel(ok, jnp.sqrt(sel(ok, sq, 1.0)), 0.0) - r1 - r2
    # the normal: normalize_c(v, reciprocal=True), in parts
    v = [b - a for a, b in zip(p1, p2)]
    sqv = c_dot(v, v)
    okv = sqv > MINVAL * MINVAL
    ln = sel(okv, jnp.sqrt(sel(okv, sqv, 1.0)), 0.0)
    okv = ln >= MINVAL
    dist, inv, okv, coincide, valid, *v = once(dist, 1 / sel(okv, ln, 1.0), okv,
                                               ln < MINVAL, valid, *v)
    n = [sel(coincide, a, sel(okv, x * inv, 1.0 if k == 0 else 0.0))
         for k, (a, x) in enumerate(zip(alt, v))]
    h = r1 + dist / 2
    return dist, [a + x * h for a, x in zip(p1, n)], n, valid


def _sphere_sphere_raw(p1, m1, r1, p2, m2, r2, margin):
    alt = _alt_normal(unstack(m1[:, 2]), unstack(m2[:, 2]))
    dist, pos, n, valid = _sphere_sphere_c(unstack(p1), r1, unstack(p2), r2, margin, alt)
    return dist, jnp.stack(pos, -1), jnp.stack(n, -1), valid


def sphere_sphere(g1, g2, margin):
    return one(*_sphere_sphere_raw(g1.pos, g1.mat, g1.size[0], g2.pos, g2.mat,
                                   g2.size[0], margin))


def sphere_capsule(g1, g2, margin):
    """The sphere against the capsule segment's nearest point (component-wise, see
    :func:`_sphere_sphere_c`). The sphere's centre, the nearest point and z1 x z2
    (normalised where read: the normal of coincident centres) stored by one kernel
    first: read from the pair table (transposed) by the sphere test, they were kernels
    of their own (the humanoid's sphere-capsule group 6 kernels, now 2)."""
    p1, p2, axis = unstack(g1.pos), unstack(g2.pos), unstack(g2.mat[:, 2])
    d = [a - b for a, b in zip(p1, p2)]
    x = clip(c_dot(axis, d), -g2.size[1], g2.size[1])
    near = [b + a * x for a, b in zip(axis, p2)]
    out = once(*p1, *near, *c_cross(unstack(g1.mat[:, 2]), axis))
    p1, near = out[:3], out[3:6]
    alt = normalize_c(out[6:], reciprocal=True)[0]
    dist, pos, n, valid = _sphere_sphere_c(p1, g1.size[0], near, g2.size[0], margin, alt)
    return one(dist, jnp.stack(pos, -1), jnp.stack(n, -1), valid)


def sphere_cylinder(g1, g2, margin):
    """Side (sphere-sphere), cap (plane-sphere) or rim-corner contact."""
    radius, height = g2.size[0], g2.size[1]
    axis = g2.mat[:, 2]
    vec = g1.pos - g2.pos
    x = dot(axis, vec)
    a_proj = axis * x
    p_proj = vec - a_proj
    psq = dot(p_proj, p_proj)
    side = jnp.abs(x) < height
    cap = psq < radius * radius
    deep = side & cap
    pn = safe_norm(p_proj)
    cap_first = (height - jnp.abs(x)) < (radius - pn)
    side = sel(deep, ~cap_first, side)
    cap = sel(deep, cap_first, cap)

    r1 = g1.size[0]
    ds, ps, ns, vs = _sphere_sphere_raw(g1.pos, g1.mat, r1, a_proj + g2.pos, g2.mat, radius,
                                        margin)
    flipmat = g2.mat * jnp.asarray([-1.0, 1.0, -1.0], g2.mat.dtype)
    top = x > 0
    pos_cap = g2.pos + axis * sel(top, height, -height)
    mat_cap = sel(top, g2.mat, flipmat)
    dc, pc, nc, vc = _plane_sphere_raw(pos_cap, mat_cap, g1.pos, r1, margin)
    nc = -nc
    scale = radius / sel(pn > 0, pn, 1.0)
    corner = p_proj * scale + axis * sel(top, height, -height) + g2.pos
    dk, pk, nk, vk = _sphere_sphere_raw(g1.pos, g1.mat, r1, corner, g2.mat, 0.0, margin)

    def pick(a, b, c):
        cs = jnp.broadcast_to(side, jnp.shape(a)) if jnp.ndim(a) else side
        cc = jnp.broadcast_to(cap, jnp.shape(a)) if jnp.ndim(a) else cap
        return jnp.where(cs, a, jnp.where(cc, b, c))

    return one(pick(ds, dc, dk), pick(ps, pc, pk), pick(ns, nc, nk), pick(vs, vc, vk))


def sphere_box(g1, g2, margin):
    """Sphere-box (mjraw_SphereBox): nearest box point, or nearest face when the centre
    is inside."""
    size = g2.size
    center = _rot_t(g2.mat, g1.pos - g2.pos)
    clamped = clip(center, -size, size)
    tmp, dist = normalize(clamped - center)
    r = g1.size[0]
    valid = dist - r <= margin
    inside = dist <= MINVAL
    # inside: nearest face (first minimum in the order -x, +x, -y, +y, -z, +z)
    sgn = jnp.asarray([-1.0, 1.0, -1.0, 1.0, -1.0, 1.0], center.dtype)
    face = jnp.abs(sgn * jnp.repeat(size, 2) - jnp.repeat(center, 2))
    k = argmin(face)
    closest = face[k]
    nearest = sel(jnp.arange(3) == k // 2, sel(k % 2 == 1, -1.0, 1.0),
                  0.0).astype(center.dtype)
    pos_in = center + nearest * ((r - closest) / 2)
    pos_out = 0.5 * clamped + 0.5 * (center + tmp * r)
    pos = sel(inside, pos_in, pos_out)
    normal = _rot(g2.mat, sel(inside, nearest, tmp))
    d = sel(inside, -closest, dist) - r
    return one(d, _rot(g2.mat, pos) + g2.pos, normal, valid)


# --------------------------------------------------------------------------- capsules
#: capsule_capsule's products, quotients and segment parameters stored by three
#: kernels (off: fused where read, for paired measurements). With two of them (the
#: products, the segment parameters), humanoid off / on: XLA compile CPU 1.044 [0.952,
#: 1.077] (6 rounds), one kernel fewer, bench step 1.023 [0.781, 1.127] (10 rounds,
#: load 10); the collider alone (1024 x 40 pairs) run on / off 0.942 [0.703, 1.244]
#: and 0.874 [0.785, 1.132]
_CC_ONCE = True


#: axes whose angle's sine is below 1e-4 count as parallel: det = ma mc sin^2 below
#: this times ma mc (MuJoCo 4.0, measured: scale-free, at sin = 1e-4 to 5e-13)
_PARALLEL = 1e-8


def capsule_capsule(g1, g2, margin):
    """Nearest points of the two segments (general), or, for parallel axes, the two
    ends of the segments' overlap (mjraw_CapsuleCapsule of MuJoCo 4.0).

    Parallel means the axes' angle has a sine under 1e-4 (:data:`_PARALLEL`). The two
    contacts then come in the order of segment 1's parameter: each end of segment 2,
    at its projection onto segment 1 where that lies on it, else segment 1's end
    against its own projection onto segment 2 (clipped). Segments that do not overlap
    give the same contact twice, as MuJoCo. This is MuJoCo 4.0.0's behaviour,
    measured: 240 random parallel, antiparallel, nearly parallel (sines 1e-6, 5e-5)
    and crossing pairs match its contacts within 1e-12. MuJoCo 3.x's source, which
    simjax followed before, tested the segments' ends against each other instead,
    and took axes as parallel only where det fell below mjMINVAL: deep parallel
    pairs then got tilted normals (dm_control's CMU humanoid at qpos0, qacc 5%
    off)."""
    z1, z2 = unstack(g1.mat[:, 2]), unstack(g2.mat[:, 2])
    p1, p2 = unstack(g1.pos), unstack(g2.pos)
    a1 = [z * g1.size[1] for z in z1]
    a2 = [z * g2.size[1] for z in z2]
    dif = [x - y for x, y in zip(p1, p2)]
    ma, mb, mc = c_dot(a1, a1), -c_dot(a1, a2), c_dot(a2, a2)
    u, v = -c_dot(a1, dif), c_dot(a2, dif)
    # the normal of coincident centres, for the two sphere tests below
    alt = _alt_normal(z1, z2)
    if _CC_ONCE:
        # the products stored by one kernel (:func:`once`): the kernels of the
        # divisions below each evaluated the dot products they read again. With them
        # the components the sphere tests read: read there from the pair table (a
        # transposing read), the axes and positions were kernels of their own
        ma, mb, mc, u, v, *rest = once(ma, mb, mc, u, v, *alt, *p1, *p2, *a1, *a2)
        alt, p1, p2, a1, a2 = (rest[k:k + 3] for k in range(0, 15, 3))
    det = ma * mc - mb * mb
    general = det >= _PARALLEL * (ma * mc)
    sdet = sel(general, det, 1.0)
    # segment 2's ends projected onto segment 1 (q1p: its +1 end), segment 1's ends
    # onto segment 2 (q2p: its +1 end)
    q = [(mc * u - mb * v) / sdet, (ma * v - mb * u) / sdet, (v - mb) / mc, (v + mb) / mc,
         (u - mb) / ma, (u + mb) / ma]
    if _CC_ONCE:
        # the quotients stored by one kernel (:func:`once`), with ``general`` (read
        # by the selects below): each read by several selects, the quotients were
        # kernels of their own (three)
        *q, general = once(*q, general)
    x1, x2, q2p, q2m, q1p, q1m = q
    x2 = sel(x1 > 1, q2p, sel(x1 < -1, q2m, x2))
    x1 = clip(x1, -1, 1)
    e1p, e1m = clip(q1p, -1, 1), clip(q1m, -1, 1)
    x1 = sel(x2 > 1, e1p, sel(x2 < -1, e1m, x1))
    x2 = clip(x2, -1, 1)
    # parallel: the overlap's ends, lower parameter on segment 1 first
    one_ = jnp.ones_like(x1)
    plo = q1p <= q1m
    ends = []
    for qe, e in ((sel(plo, q1p, q1m), sel(plo, one_, -one_)),
                  (sel(plo, q1m, q1p), sel(plo, -one_, one_))):
        t1 = clip(qe, -1, 1)
        t2 = sel(qe == t1, e, clip(sel(t1 > 0, q2p, q2m), -1, 1))
        ends.append((t1, t2))
    if _CC_ONCE:
        # the segment parameters stored by one kernel (:func:`once`): read by the two
        # tests' selects, they were kernels of their own
        x1, x2, *tt = once(x1, x2, *ends[0], *ends[1])
        ends = [tt[:2], tt[2:]]
    r1, r2 = g1.size[0], g2.size[0]
    # the general contact or the overlap's first end, then its second end: two
    # sphere-sphere tests in one call on arrays of two (one set of kernels instead of
    # two), component-wise (:func:`_sphere_sphere_c`). The centres as pos + axis * t
    # (p + a * 1 is p + a and p + a * -1 is p - a, exactly), t picked per test by
    # selects on a constant mask (the stacked centres, or t stacked, were kernels)
    k0 = jnp.asarray(np.arange(2) == 0)
    t1 = where(k0, sel(general, x1, ends[0][0]), ends[1][0])
    t2 = where(k0, sel(general, x2, ends[0][1]), ends[1][1])
    c1 = [p + a * t1 for p, a in zip(p1, a1)]
    c2 = [p + a * t2 for p, a in zip(p2, a2)]
    dist, pos, nrm, ok = _sphere_sphere_c(c1, r1, c2, r2, margin, alt)
    pos, nrm = jnp.stack(pos, -1), jnp.stack(nrm, -1)
    valid = ok & jnp.stack([True, ~general])
    return Pre(dist, pos, nrm, jnp.zeros_like(pos), valid)


# --------------------------------------------------------------------------- boxes
_SEPEPS, _PAREPS, _SGNEPS, _DUPEPS, _EDGEBIAS = 1e-13, 1e-16, 1e-9, 1e-14, 1e-6


def _onehot(i, dtype):
    return (jnp.arange(3) == i).astype(dtype)


#: :func:`_box_edge`'s set-up stored once before the candidates (off: fused into them,
#: the former way; for paired measurements)
_EDGE_STAGED = True


def _box_edge(g1, R, p21, s1, s2, i, j):
    """Edge-edge contact for edge axis e_i x rot[:, j] (box1 frame; ``R[r][c]`` the
    entries of rot, ``p21``, ``s1``, ``s2`` the components of pos21 and the two boxes'
    sizes, as :func:`box_box` read them); (dist, pos, normal), the vectors as lists of
    three scalars.
    Written on component lists (scalars): picks of traced components by selects
    (:func:`pick3`), no stacked vectors (on CPU a stacked vector with several users, or
    a vmapped gather, is a kernel of its own).

    Measured, not done: the four candidates vmapped, the winner by one variadic
    reduction (a candidate's code emitted once): shadow hand 823 -> 818 kernels,
    optimised LLVM IR -2%, outputs bit-identical, but its XLA compile CPU 1/0.947 [0.928,
    0.986] slower (6 paired rounds) and box_box alone 1.095x slower (the shared axis
    computed per candidate). This code's size is not what compile pays for: box_box
    compiled alone with / without it 1.016 [0.804, 1.093], with / without the four
    clipping passes 1.184 [1.025, 1.307]; box_box is 0.13 of the hand's XLA compile CPU
    (without / with 0.866 [0.796, 1.030]) for 3 pairs the bench states never pass."""
    i1, i2, j1, j2 = _next3(i), _prev3(i), _next3(j), _prev3(j)
    d2 = [pick3(R[r], j) for r in range(3)]                          # rot[:, j]
    if _EDGE_STAGED:
        # read by all of the set-up's values: stored by one kernel (they were three,
        # and the indices two)
        d2 = once(*d2, i1, i2)
        d2, i1, i2 = list(d2[:3]), d2[3], d2[4]
    u, v = -pick3(d2, i2), pick3(d2, i1)
    ax = [sel(i1 == c, u, sel(i2 == c, v, 0.0)) for c in range(3)]
    ax = _normalize3(ax)
    flip = ax[0] * p21[0] + ax[1] * p21[1] + ax[2] * p21[2] < 0
    ax = [sel(flip, -x, x) for x in ax]
    a2 = [R[0][c] * ax[0] + R[1][c] * ax[1] + R[2][c] * ax[2] for c in range(3)]
    amb1 = sel(jnp.abs(pick3(ax, i1)) < _SGNEPS, i1,
               sel(jnp.abs(pick3(ax, i2)) < _SGNEPS, i2, -1))
    amb2 = sel(jnp.abs(pick3(a2, j1)) < _SGNEPS, j1,
               sel(jnp.abs(pick3(a2, j2)) < _SGNEPS, j2, -1))
    b = pick3(d2, i)
    small = 1 - b * b < MINVAL
    idenom = 1 / sel(small, 1.0, 1 - b * b)
    # the index tests once each (every test and constant fill is traced equations)
    ieq, jeq = [i == c for c in range(3)], [j == c for c in range(3)]
    c1 = [sel(ieq[c], 0.0, sel(ax[c] >= 0, s1[c], -s1[c])) for c in range(3)]
    cc = [sel(jeq[c], 0.0, sel(a2[c] >= 0, -s2[c], s2[c])) for c in range(3)]
    am1, am2 = [amb1 == c for c in range(3)], [amb2 == c for c in range(3)]
    s1i, s2j = pick3(s1, i), pick3(s2, j)
    if _EDGE_STAGED:
        # the edges' set-up stored by one kernel: read by the four candidates, its
        # values were kernels of their own (XLA on CPU stores a value that a kernel
        # would evaluate too many times)
        st = once(*d2, *ax, *c1, *cc, b, idenom, s1i, s2j, small, amb1, amb2)
        d2, ax, c1, cc = (list(st[k:k + 3]) for k in (0, 3, 6, 9))
        b, idenom, s1i, s2j, small, amb1, amb2 = st[12:]
        am1, am2 = [amb1 == c for c in range(3)], [amb2 == c for c in range(3)]
    # the four candidate edge pairs (the ambiguous corner of either edge flipped or
    # not); first minimum of the gap in MuJoCo's order
    def cand(f1, f2):
        """(gap2, p1, p2) of the candidate with box 1's (``f1``) / box 2's (``f2``)
        ambiguous corner flipped."""
        def flip(f, am, x):
            return [sel(am[c], -x[c], x[c]) for c in range(3)] if f else x
        c1v, ccv = flip(f1, am1, c1), flip(f2, am2, cc)
        c2 = [R[r][0] * ccv[0] + R[r][1] * ccv[1] + R[r][2] * ccv[2] + p21[r]
              for r in range(3)]
        e = [c2[c] - c1v[c] for c in range(3)]
        d1e, d2e = pick3(e, i), e[0] * d2[0] + e[1] * d2[1] + e[2] * d2[2]
        sp = sel(small, 0.0, (d1e - b * d2e) * idenom)
        sp = clip(sp, -s1i, s1i)
        t = clip(b * sp - d2e, -s2j, s2j)
        sp = clip(d1e + b * t, -s1i, s1i)
        p1 = [c1v[c] + sel(ieq[c], sp, 0.0) for c in range(3)]
        p2 = [c2[c] + d2[c] * t for c in range(3)]
        dp = [p2[c] - p1[c] for c in range(3)]
        return dp[0] * dp[0] + dp[1] * dp[1] + dp[2] * dp[2], p1, p2

    gaps, ends = [], []
    for k in range(4):
        f1, f2 = k >= 2, k % 2 == 1
        gap2, p1, p2 = cand(f1, f2)
        if f1 or f2:                # a flipped corner exists only where ambiguous
            okv = (amb1 >= 0) & (amb2 >= 0) if f1 and f2 else (amb1 >= 0 if f1 else
                                                                  amb2 >= 0)
            gap2 = sel(okv, gap2, jnp.inf)
        gaps.append(gap2)
        ends.append((p1, p2))
    # measured, not done: the winner's index stored and its candidate evaluated again
    # (box_box alone 27 -> 28 kernels, XLA compile CPU 0.933 [0.741, 1.152], 10 rounds,
    # but the shadow hand's bench rollout compile 1.085-1.128 in three paired runs)
    _, (w1, w2) = _first_best(gaps, ends, jnp.less)
    dist = sum((w2[c] - w1[c]) * ax[c] for c in range(3))
    mid = [0.5 * (w1[c] + w2[c]) for c in range(3)]
    mat = [unstack(r, 0) for r in unstack(g1.mat, 0)]
    p1w = unstack(g1.pos, 0)
    pos = [mat[c][0] * mid[0] + mat[c][1] * mid[1] + mat[c][2] * mid[2] + p1w[c]
           for c in range(3)]
    return dist, pos, [mat[c][0] * ax[0] + mat[c][1] * ax[1] + mat[c][2] * ax[2]
                       for c in range(3)]


#: vertex capacity of the clipped incident face (a quad cut by four half-planes)
_CLIPMAX = 8


def _clip_half_plane(poly, n, coord, sign, lim):
    """One Sutherland-Hodgman pass (MuJoCo's clipHalfPlane): the first ``n`` vertices of
    ``poly`` (_CLIPMAX, 3), a closed polygon, cut by sign * v[c] <= lim (c = x if ``coord``
    is 1.0, y if 0.0: a traced choice, selected by a product); each vertex
    emits itself if inside, then the crossing of its outgoing edge if the edge strictly
    crosses the line (z interpolated). Compaction by one-hot sums (no scatter)."""
    k = jnp.arange(_CLIPMAX)
    live = k < n
    d = sign * (coord * poly[:, 0] + (1 - coord) * poly[:, 1]) - lim
    last = k == n - 1
    q = sel(last[:, None], poly[:1], jnp.roll(poly, -1, axis=0))
    dq = sel(last, d[0], jnp.roll(d, -1))
    keep = live & (d <= 0)
    cross = live & (((d < 0) & (dq > 0)) | ((d > 0) & (dq < 0)))
    t = d / sel(cross, d - dq, 1.0)
    x = poly + t[:, None] * (q - poly)
    cnt = keep.astype(jnp.int32) + cross.astype(jnp.int32)
    # (a masked sum over the earlier vertices instead of the cumulative count: no kernel
    # fewer, box_box alone 1.066 [1.027, 1.199] slower)
    slot_p = cumcount(cnt) - cnt
    slot_x = slot_p + keep.astype(jnp.int32)
    op = (keep[:, None] & (slot_p[:, None] == k[None])).astype(poly.dtype)
    ox = (cross[:, None] & (slot_x[:, None] == k[None])).astype(poly.dtype)
    out = jnp.sum(op[:, :, None] * poly[:, None, :] + ox[:, :, None] * x[:, None, :], 0)
    return out, jnp.minimum(jnp.sum(cnt), _CLIPMAX).astype(n.dtype)


# box_box's separating-axis test (:func:`_box_sat`) is written on component scalars
# throughout, with _SAT_STORES and _EDGE_STAGED. Against its former form on (3, 3)
# arrays: box_box alone (1024 worlds x 3 pairs, float32) 46 -> 27 kernels, XLA compile
# CPU 0.873 [0.791, 0.932] (10 rounds in one process); the shadow hand's box-box group
# 54 -> 34 kernels (bench rollout 733 -> 713), its XLA compile CPU 0.972 [0.895, 1.041]
# (10 rounds); contacts bit-identical (20000 random pairs, float64 and float32).
# Measured, not done: the incident face and its normal on scalars, stored by one
# reduction (27 -> 29 kernels); sphere_box on component scalars (its group 10 -> 7
# kernels, but sphere_box alone, 1024 x 40 pairs, 1.96x [1.23, 4.29] slower)

#: the rotation's entries, the relative positions and the tolerance
#: stored by the test's reduction (off: recomputed where read; for paired measurements)
_SAT_STORES = True


def _rows3(m):
    """The entries ``m[r][c]`` of a (3, 3) matrix as lists of scalars (a slice each)."""
    return [[m[r, c] for c in range(3)] for r in range(3)]


def _box_sat(g1, g2, margin):
    """Separating-axis test of :func:`box_box` (15 axes, face preference): (rot's entries
    ``R[r][c]``, pos21, pos12, size1, size2 as lists of scalars, the separation
    tolerance, the winning axis code (0-2 box 1's faces, 3-5 box 2's, 6 + 3 i + j the
    edge pair), whether the boxes are separated).
    Every value is a scalar read from the geoms' entries: no (3, 3) array, no vector
    sliced again, so that XLA on CPU fuses the whole test into the one kernel that
    stores its results (an array read back by slices, broadcasts or transposes is
    stored by a kernel of its own, and so is an expensive value several kernels read)."""
    M1, M2 = _rows3(g1.mat), _rows3(g2.mat)
    s1, s2 = [g1.size[c] for c in range(3)], [g2.size[c] for c in range(3)]
    x1, x2 = [g1.pos[c] for c in range(3)], [g2.pos[c] for c in range(3)]
    # rot = m1.T @ m2, pos21 = m1.T (pos2 - pos1), pos12 = m2.T (pos1 - pos2)
    R = [[M1[0][i] * M2[0][j] + M1[1][i] * M2[1][j] + M1[2][i] * M2[2][j]
          for j in range(3)] for i in range(3)]
    if _SAT_STORES:
        # stored by one kernel: read by many of the test's values, each entry was
        # stored by a kernel of its own
        R = once(*R[0], *R[1], *R[2])
        R = [list(R[0:3]), list(R[3:6]), list(R[6:9])]
    d21 = [x2[c] - x1[c] for c in range(3)]
    d12 = [x1[c] - x2[c] for c in range(3)]
    p21 = [d21[0] * M1[0][c] + d21[1] * M1[1][c] + d21[2] * M1[2][c] for c in range(3)]
    p12 = [d12[0] * M2[0][c] + d12[1] * M2[1][c] + d12[2] * M2[2][c] for c in range(3)]
    A = [[jnp.abs(x) for x in r] for r in R]
    septol = margin + _SEPEPS * ((s1[0] + s1[1] + s1[2]) + (s2[0] + s2[1] + s2[2]))
    seps = ([jnp.abs(p21[r]) - s1[r] - (s2[0] * A[r][0] + s2[1] * A[r][1] + s2[2] * A[r][2])
             for r in range(3)] +
            [jnp.abs(p12[r]) - s2[r] - (s1[0] * A[0][r] + s1[1] * A[1][r] + s1[2] * A[2][r])
             for r in range(3)])
    separated = functools.reduce(jnp.logical_or, [x > septol for x in seps])
    sep_face, code = _first_best(seps, [jnp.asarray(k, jnp.int32) for k in range(6)],
                                 jnp.greater)
    code_face, sep_best = code, sep_face
    # edge axes e_i x rot[:, j] (box 1's frame, component i zero): components
    # (i + 1, i + 2) = (-rot[i + 2][j], rot[i + 1][j]), normalised
    for i in range(3):
        i1, i2 = (i + 1) % 3, (i + 2) % 3
        for j in range(3):
            j1, j2 = (j + 1) % 3, (j + 2) % 3
            a1, a2 = -R[i2][j], R[i1][j]
            n2 = a1 * a1 + a2 * a2
            use = n2 >= _PAREPS
            inv = 1 / jnp.sqrt(sel(use, n2, 1.0))
            a1, a2 = a1 * inv, a2 * inv
            r1 = s1[i1] * jnp.abs(a1) + s1[i2] * jnp.abs(a2)
            b1 = a1 * R[i1][j1] + a2 * R[i2][j1]
            b2 = a1 * R[i1][j2] + a2 * R[i2][j2]
            r2 = s2[j1] * jnp.abs(b1) + s2[j2] * jnp.abs(b2)
            sep = jnp.abs(a1 * p21[i1] + a2 * p21[i2]) - r1 - r2
            separated = separated | (use & (sep > septol))
            # sequential: each winner raises the bar for the next
            adj = sep - _EDGEBIAS * jnp.abs(sep)
            win = use & (adj > sep_best) & (sep > sep_face)
            sep_best = sel(win, sep, sep_best)
            code = sel(win, 6 + 3 * i + j, code)
    # edge axis nearly parallel to the best face axis: prefer the face
    is_edge = code >= 6
    ei, ej = _divmod_small(sel(is_edge, code - 6, 0), 3, 3)
    rcol = [pick3(R[r], ej) for r in range(3)]                      # rot[:, ej]
    rot_e = pick3(rcol, _prev3(ei)), pick3(rcol, _next3(ei))
    cf = sel(code_face < 3, code_face, code_face - 3)
    ni, pi = _next3(ei), _prev3(ei)
    ev = [(ni == c).astype(rot_e[0].dtype) * -rot_e[0] +
          (pi == c).astype(rot_e[0].dtype) * rot_e[1] for c in range(3)]
    ev, _ = normalize_c(ev)
    q = [pick3(R[c], cf) for c in range(3)]                          # rot[:, cf]
    face_dot = sel(code_face < 3, jnp.abs(pick3(ev, cf)),
                   jnp.abs(ev[0] * q[0] + ev[1] * q[1] + ev[2] * q[2]))
    close = sep_best < sep_face + 0.05 * jnp.abs(sep_face) + MINVAL
    subst = is_edge & (face_dot > 0.99) & close
    code = sel(subst, code_face, code)
    if not _SAT_STORES:
        code, separated = once(code, separated)
        return R, p21, p12, s1, s2, septol, code, separated
    # rot's entries, pos21, pos12 and the tolerance stored by the same reduction as
    # the results: read by several later kernels, each was a kernel of its own
    out = once(code, separated, septol, *p21, *p12)
    code, separated, septol = out[:3]
    return R, list(out[3:6]), list(out[6:9]), s1, s2, septol, code, separated


def box_box(g1, g2, margin):
    """Box-box (mjc_BoxBox, MuJoCo 4.0): separating-axis test over 15 axes with face
    preference; a face axis clips the incident face against the reference face (up to
    8 contacts), an edge axis gives one contact between the supporting edges.

    The incident face is clipped by Sutherland-Hodgman passes as MuJoCo's, so the
    contacts come in MuJoCo's order; near-duplicates are merged as MuJoCo does."""
    dt = g1.size.dtype
    R, p21c, p12c, s1c, s2c, septol, code, separated = _box_sat(g1, g2, margin)
    is_edge = code >= 6

    # edge-edge contact for the winning (i, j) (dynamic indices)
    eidx = jnp.clip(code - 6, 0, 8)
    e_dist, e_pos, e_nrm = _box_edge(g1, R, p21c, s1c, s2c, *_divmod_small(eidx, 3, 3))
    # stored once (:func:`once`): each field of the packed output (chunked._pack)
    # evaluated the edge search again
    e = once(e_dist, *e_pos, *e_nrm)
    e_dist, e_pos, e_nrm = e[0], _vec3(e[1:4]), _vec3(e[4:7])
    e_valid = is_edge & ~separated & (e_dist <= septol)

    # face contact
    ref1 = code < 3
    a = sel(ref1, code, code - 3)           # code < 6 wherever the face is used
    a = jnp.clip(a, 0, 2)
    # component lists (scalars): a stacked vector with several users or picks is a
    # kernel of its own on CPU
    sizeref = [sel(ref1, s1c[c], s2c[c]) for c in range(3)]
    sizeinc = [sel(ref1, s2c[c], s1c[c]) for c in range(3)]
    posoi = [sel(ref1, p21c[c], p12c[c]) for c in range(3)]
    rinc = [[sel(ref1, R[r][c], R[c][r]) for c in range(3)] for r in range(3)]
    matref = sel(ref1, g1.mat, g2.mat)
    posref = sel(ref1, g1.pos, g2.pos)
    sgn = sel(pick3(posoi, a) >= 0, 1.0, -1.0)
    ra = [jnp.abs(pick3([rinc[0][c], rinc[1][c], rinc[2][c]], a)) for c in range(3)]
    _, binc = _first_best(ra, [jnp.asarray(k, jnp.int32) for k in range(3)], jnp.greater)
    ax, ay = _next3(a), _prev3(a)
    bu, bv = _next3(binc), _prev3(binc)
    # the (ax, ay, a) components: picks of a traced cyclic shift
    cyc = lambda v: [pick3(v, ax), pick3(v, ay), pick3(v, a)]
    rcinc = lambda bb: cyc([pick3(rinc[r], bb) for r in range(3)])  # rinc[(ax,ay,a), bb]
    rb = rcinc(binc)
    tinc = sel(sgn * rb[2] > 0, -1.0, 1.0)
    tb = tinc * pick3(sizeinc, binc)
    zs = [1.0, 1.0, sgn]
    sra = pick3(sizeref, a)
    cx = [(p + tb * r) * z for p, r, z in zip(cyc(posoi), rb, zs)]
    cx[2] = cx[2] - sra
    su, sv = pick3(sizeinc, bu), pick3(sizeinc, bv)
    du = [su * r * z for r, z in zip(rcinc(bu), zs)]
    dv = [sv * r * z for r, z in zip(rcinc(bv), zs)]
    sx, sy = pick3(sizeref, ax), pick3(sizeref, ay)
    signs = np.asarray([[1, 1], [-1, 1], [-1, -1], [1, -1]], np.float64)
    quad = (_vec3(cx)[None, :] + signs[:, :1].astype(dt) * _vec3(du)[None, :] +
            signs[:, 1:].astype(dt) * _vec3(dv)[None, :])                    # (4, 3)
    nsign = sel(ref1, sgn, -sgn)
    normal = nsign * pick3(matref.T, a)
    quad, sx, sy, sgn, sra, normal = once(quad, sx, sy, sgn, sra, normal)
    # Sutherland-Hodgman against the four side planes, in MuJoCo's pass order: the
    # clipped polygon's vertex order is the contacts' order, which the PGS solver's
    # block order (and so its iterates) depends on
    # the four passes as one scan: its body's kernels are compiled once, not four times
    poly = jnp.concatenate([quad, jnp.zeros((_CLIPMAX - 4, 3), dt)])
    n = jnp.asarray(4, jnp.int32)
    lims = jnp.stack([sx, sx, sy, sy])
    passes = (jnp.asarray([1.0, 1.0, 0.0, 0.0], dt), jnp.asarray([1.0, -1.0, 1.0, -1.0], dt),
              lims)

    def clip(carry, xs):
        onx, sign, lim = xs
        return _clip_half_plane(*carry, onx, sign, lim), None
    (poly, n), _ = inline.scan(clip, (poly, n), passes)
    cand = poly
    valid = (jnp.arange(_CLIPMAX) < n) & (cand[:, 2] <= margin)
    # computed once: fused into the duplicate test below, XLA on CPU would recompute
    # every vertex for each of its partners
    cand, valid = jax.lax.optimization_barrier((cand, valid))
    # merge near-duplicates (keep the first)
    dupe2 = _DUPEPS * (sx * sx + sy * sy)
    dxy = cand[:, None, :2] - cand[None, :, :2]
    close = dxy[..., 0] * dxy[..., 0] + dxy[..., 1] * dxy[..., 1] < dupe2
    earlier = jnp.tril(jnp.ones((_CLIPMAX, _CLIPMAX), bool), -1)
    dup = jnp.any(close & earlier & valid[None, :], axis=1)
    valid = valid & ~dup & ~separated & ~is_edge
    ea, eax, eay = _onehot(a, dt), _onehot(ax, dt), _onehot(ay, dt)
    posc = (cand[:, :1] * eax + cand[:, 1:2] * eay +
            (sgn * (sra + 0.5 * cand[:, 2]))[:, None] * ea)
    fpos = _rot(matref, posc) + posref
    dist = jnp.concatenate([e_dist[None], cand[:, 2]])
    pos = jnp.concatenate([e_pos[None], fpos])
    nrm = jnp.concatenate([e_nrm[None], jnp.broadcast_to(normal, (_CLIPMAX, 3))])
    return Pre(dist, pos, nrm, jnp.zeros_like(pos), jnp.concatenate([e_valid[None], valid]))


def _next3(i):
    """(i + 1) % 3 for a traced index in 0..2 by a select: an integer remainder is an
    'expensive' op to XLA, which then materialises it (a kernel) for every consumer
    instead of fusing it into each."""
    return sel(i >= 2, i - 2, i + 1)


def _prev3(i):
    """(i + 2) % 3 for a traced index in 0..2 (see :func:`_next3`)."""
    return sel(i >= 1, i - 1, i + 2)


def _divmod_small(k, d, nq):
    """(k // d, k % d) for a traced index k in 0..d * nq - 1 by compares (see
    :func:`_next3`): integer division and remainder are 'expensive' to XLA."""
    q = sum((k >= d * t).astype(k.dtype) for t in range(1, nq))
    return q, k - d * q


def _first_best(vals, items, better):
    """(best value, its item) of the scalars ``vals`` in order, ``better(new, old)``
    strict (ties keep the first, as MuJoCo's sequential scans); ``items`` are pytrees
    of one structure. By selects: an argmin/argmax and a gather of the item are
    kernels of their own on CPU."""
    best, item = vals[0], items[0]
    for v, it in zip(vals[1:], items[1:]):
        win = better(v, best)
        best = sel(win, v, best)
        item = jax.tree_util.tree_map(lambda a, b: sel(win, a, b), it, item)
    return best, item



def _normalize3(v):
    """mju_normalize3 of a list of three scalars ((1, 0, 0) below mjMINVAL), safe to
    differentiate."""
    sq = v[0] * v[0] + v[1] * v[1] + v[2] * v[2]
    ok = sq > MINVAL * MINVAL
    n = sel(ok, jnp.sqrt(sel(ok, sq, 1.0)), 0.0)
    okn = n >= MINVAL
    inv = 1 / sel(okn, n, 1.0)
    return [sel(okn, v[c] * inv, 1.0 if c == 0 else 0.0) for c in range(3)]


def _vec3(v):
    """A 3-vector of three scalars by selects (a stack is a concatenate: with several
    users, a kernel of its own on CPU)."""
    k = jnp.arange(3)
    return sel(k == 0, v[0], sel(k == 1, v[1], v[2]))


def _sdiv(a, b):
    """a / b with MuJoCo's IEEE semantics for b = 0 (+-inf, or nan for 0/0), safe to
    differentiate (the b = 0 branch is constant)."""
    ok = b != 0
    q = a / sel(ok, b, 1.0)
    inf = sel(a > 0, jnp.inf, sel(a < 0, -jnp.inf, jnp.nan))
    return sel(ok, q, inf)


_CB_EDGES = [(j, i) for j in range(3) for i in range(8) if not i & (1 << j)]
_CB_EDGE_AXIS = np.array([j for j, _ in _CB_EDGES])
_CB_EDGE_I = np.array([i for _, i in _CB_EDGES])
_CB_EDGE_CORNER = np.array([[(1 if i & 1 else -1) * (k != j), (1 if i & 2 else -1) * (1 != j),
                             (1 if i & 4 else -1) * (2 != j)] for j, i in _CB_EDGES
                            for k in (0,)], np.float64)


def capsule_box(g1, g2, margin):
    """Capsule-box (mjraw_CapsuleBox): the capsule segment point closest to the box
    (face test at both ends, then the 12 box edges), a sphere-box contact there, and a
    second sphere-box contact further along the segment chosen from the relative
    orientation of capsule and closest box feature; at most 2 contacts."""
    dt = g1.pos.dtype
    size = g2.size
    hl = g1.size[1]
    pos = _rot_t(g2.mat, g1.pos - g2.pos)
    axis = _rot_t(g2.mat, g1.mat[:, 2])
    ha = axis * hl
    pos, axis, ha = once(pos, axis, ha)     # many users: stored in one kernel, not one each
    axisdir = ((ha[0] > 0).astype(jnp.int32) + 2 * (ha[1] > 0).astype(jnp.int32) +
               4 * (ha[2] > 0).astype(jnp.int32))
    bestdist = margin + 2 * (g1.size[0] + hl + (size[0] + size[1] + size[2]))
    bsp = jnp.zeros((), dt)
    bbp = jnp.zeros((), dt)
    cltype = jnp.asarray(-4, jnp.int32)
    clface = jnp.asarray(-1, jnp.int32)
    clcorner = jnp.asarray(0, jnp.int32)
    cledge = jnp.asarray(0, jnp.int32)
    # ends against faces
    for i in (-1, 1):
        t = pos + i * ha
        out = (t < -size) | (t > size)
        clamped = clip(t, -size, size)
        nclamp = (out[0].astype(jnp.int32) + out[1].astype(jnp.int32) +
                  out[2].astype(jnp.int32))
        c2 = sel(out[2], 2, sel(out[1], 1, sel(out[0], 0, -1)))
        dist = dot(clamped - t, clamped - t)
        win = (nclamp <= 1) & (dist < bestdist)
        bestdist = sel(win, dist, bestdist)
        bsp = sel(win, float(i), bsp)
        cltype = sel(win, -2 + i, cltype)
        clface = sel(win, c2, clface)
    # segment against the 12 edges (vectorised; the first strict minimum wins, the face
    # test wins ties as in MuJoCo's sequential scan). Measured, not done: edge by edge
    # on component scalars, the winner by selects (no argmin, no gather): capsule_box
    # alone (1024 x 40 pairs) 30 -> 28 kernels, but one kernel of 941 operations, and
    # LLVM time 2.1x (a large kernel costs LLVM more than its share)
    # edges by axis j (4 each): per-edge values by repeat, not gathers
    J = _CB_EDGE_AXIS
    t3 = jnp.asarray(_CB_EDGE_CORNER, dt) * size                  # (12, 3)
    sj = jnp.repeat(size, 4)
    dif = t3 - pos
    ma = sj * sj
    mb = -sj * jnp.repeat(ha, 4)
    mc = hl * hl
    u = sj * jnp.repeat(pos, 4)         # -sj * dif[k, J[k]]: t3[k, J[k]] is 0
    v = dot(dif, ha)
    det = ma * mc - mb * mb
    okd = jnp.abs(det) >= MINVAL
    idet = 1 / sel(okd, det, 1.0)
    x1 = (mc * u - mb * v) * idet
    x2 = (ma * v - mb * u) * idet
    s1 = sel(x1 > 1, 2, sel(x1 < -1, 0, 1))
    x2 = sel(x1 > 1, (v - mb) / mc, sel(x1 < -1, (v + mb) / mc, x2))
    x1 = clip(x1, -1, 1)
    s2 = sel(x2 > 1, 2, sel(x2 < -1, 0, 1))
    reclamp = (x2 > 1) | (x2 < -1)
    x1n = sel(x2 > 1, (u - mb) / ma, (u + mb) / ma)
    s1 = sel(reclamp, sel(x1n > 1, 2, sel(x1n < -1, 0, s1)), s1)
    x1 = sel(reclamp, clip(x1n, -1, 1), x1)
    x2 = clip(x2, -1, 1)
    d = dif - ha * x2[:, None] + jnp.asarray(np.eye(3)[J], dt) * (sj * x1)[:, None]
    d2 = sel(okd, dot(d, d), jnp.inf)
    k = argmin(d2)
    # one gather for the winner's values
    d2k, x2k, x1k, c1k = jnp.stack([d2, x2, x1, (s1 * 3 + s2).astype(dt)], -1)[k]
    win = d2k < bestdist - MINVAL
    c1 = c1k.astype(jnp.int32)
    bestdist = sel(win, d2k, bestdist)
    bsp = sel(win, x2k, bsp)
    bbp = sel(win, x1k, bbp)
    # edge k's axis jk = k // 4 and its corner id: its index r = k % 4 among the edges
    # along jk with a zero bit inserted at bit jk (_CB_EDGE_I)
    jk, r = _divmod_small(k, 4, 3)
    ik = ((r >> jk) << (jk + 1)) | (r & ((1 << jk) - 1))
    clcorner = sel(win, ik + (1 << jk) * (c1 >= 6).astype(c1.dtype), clcorner)
    cledge = sel(win, jk, cledge)
    cltype = sel(win, c1, cltype)
    bsp, bbp, cltype, clface, clcorner, cledge = once(bsp, bbp, cltype, clface, clcorner,
                                                      cledge)

    absha = jnp.abs(ha)
    sdiv = _sdiv
    # 2 size / |ha| per box axis, once (picked below; one division kernel, not four)
    q2 = sdiv(2 * size, absha)

    # case A: a box corner is closest
    cA = axisdir ^ clcorner
    flip = (cA == 3) | (cA == 5) | (cA == 6)
    mulA = sel(flip, -1.0, 1.0)
    cA2 = sel(flip, 7 - cA, cA)
    deA = sel(flip, 1 + bsp, 1 - bsp)
    dpA = sel(flip, 1 - bsp, 1 + bsp)
    axA = sel(cA2 == 1, 0, sel(cA2 == 2, 1, 2))
    ax1A, ax2A = _next3(axA), _prev3(axA)
    along = pick3(axis, axA) * pick3(axis, axA) > 0.5
    spA_edge = jnp.minimum(deA, pick3(q2, axA)) * mulA
    spA_face = jnp.minimum(jnp.minimum(dpA, pick3(q2, ax1A)), pick3(q2, ax2A)) * -mulA
    spA = sel(along, spA_edge, spA_face)
    skipA = (cA == 0) | (cA == 7)

    # case B: the middle of a box edge is closest
    cB = (axisdir ^ clcorner) & (7 - (1 << cledge))
    skipB = ~((cB == 1) | (cB == 2) | (cB == 4))
    axB = cledge
    ax1B, ax2B = _next3(axB), _prev3(axB)
    ax1B = sel(jnp.abs(pick3(axis, ax1B)) > jnp.abs(pick3(axis, ax2B)), ax2B, ax1B)
    ax2B = 3 - axB - ax1B
    bit = (cB & (1 << ax2B)) != 0
    mulB = sel(bit, 1.0, -1.0)
    spB = sel(bit, 1 - bsp, 1 + bsp)
    spB = jnp.minimum(spB, pick3(q2, ax2B))
    e2 = sel(((axisdir & (1 << axB)) != 0) == bit, 1 - bbp, 1 + bbp)
    spB = jnp.minimum(spB, sdiv(pick3(size, axB) * e2, pick3(absha, axB))) * mulB

    # case C: a capsule end is closest to a box face
    mulC = sel(cltype == -3, 1.0, -1.0)
    t1 = pos - mulC * ha
    spC = jnp.asarray(2.0, dt)
    # the six face crossings in one division (scanned in MuJoCo's order below)
    e1s = sdiv(jnp.stack([size - t1, -size - t1]), ha) * mulC            # (2, 3)
    for i in range(3):
        for si, sgn in enumerate((1.0, -1.0)):
            e1 = e1s[si, i]
            use = (i != clface) & (e1 > 0) & (e1 < spC)
            spC = sel(use, e1, spC)
    spC = spC * mulC
    skipC = clface == -1

    mid = (cltype >= 3) & (cltype < 6)              # cltype // 3 == 1 (cltype in 0..8)
    caseA = (cltype >= 0) & ~mid
    caseB = mid
    second = sel(caseA, sel(skipA, -4.0, spA),
                 sel(caseB, sel(skipB, -4.0, spB),
                     sel(skipC, -4.0, spC)))
    second = sel(cltype == -4, -4.0, second)
    none = cltype == -4
    second = once(second)

    # both sphere-box contacts in one vmapped call
    segpos = jnp.stack([bsp, sel(second > -3, second + bsp, bsp)])
    c = _rot(g2.mat, pos + ha * segpos[:, None]) + g2.pos
    out = jax.vmap(lambda ci: sphere_box(Geom(ci, g1.mat, g1.size), g2, margin))(c)
    out = Pre(*(x[:, 0] for x in out))
    valid = out.valid & ~none & jnp.stack([True, second > -3])
    return out._replace(valid=valid)


#: collider -> maximum number of valid contacts (mj_maxContact)
MAXCON = {plane_sphere: 1, plane_capsule: 2, plane_cylinder: 4, plane_box: 4,
          sphere_sphere: 1, sphere_capsule: 1, sphere_cylinder: 1, sphere_box: 1,
          capsule_capsule: 2, box_box: 8, capsule_box: 2}
