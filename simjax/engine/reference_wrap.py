"""Spatial tendons wrapping spheres and cylinders, in float64 numpy, for load time.

The reference-pose constants (:mod:`simjax.engine.reference`) need tendon lengths and
Jacobians at one or two poses per model. The engine's tendon stage
(:func:`simjax.engine.tendon.wrap`) is written for traced, batched arrays; jitting it for
these one-off evaluations cost about 1.9 s of every load of a model with wrapping geoms
(trace 0.7 s, lowering 0.25 s, XLA compile 0.9 s without backend optimisation, on 2
cores), where this module takes milliseconds. It computes the same geometry, one
segment at a time in plain floats, with the same semantics: MuJoCo's mju_wrap, the side
site rules of MuJoCo 4.0 and the exact root of the inside wrap (see the engine's
docstrings for both). Tests hold the two to each other and to MuJoCo C.
"""
from __future__ import annotations

import math

import numpy as np

MINVAL = 1e-15


def _acos(x):
    return math.acos(min(max(x, -1.0), 1.0))


def _asin(x):
    return math.asin(min(max(x, -1.0), 1.0))


def _sqrt(x):
    return math.sqrt(x) if x > 0 else 0.0


def _normalize2(x, y):
    """2D mju_normalize: (1, 0) below MINVAL."""
    n = _sqrt(x * x + y * y)
    return (1.0, 0.0) if n < MINVAL else (x / n, y / n)


def normalize3(v, fallback=(1.0, 0.0, 0.0)):
    """``v`` (3,) over its norm; ``fallback`` below MINVAL (mju_normalize3)."""
    n = _sqrt(float(v @ v))
    return np.asarray(fallback, np.float64) if n < MINVAL else v / n


def _cross2(ax, ay, bx, by):
    return ax * by - ay * bx


def _intersect(p1, p2, p3, p4):
    """Whether 2D segments p1-p2 and p3-p4 intersect."""
    det = (p4[1] - p3[1]) * (p2[0] - p1[0]) - (p4[0] - p3[0]) * (p2[1] - p1[1])
    if abs(det) < MINVAL:
        return False
    a = ((p4[0] - p3[0]) * (p1[1] - p3[1]) - (p4[1] - p3[1]) * (p1[0] - p3[0])) / det
    b = ((p2[0] - p1[0]) * (p1[1] - p3[1]) - (p2[1] - p1[1]) * (p1[0] - p3[0])) / det
    return 0 <= a <= 1 and 0 <= b <= 1


def wrap_circle(end, side, radius):
    """Wrap of the 2D segment ``end`` = (x0, y0, x1, y1) around a circle of ``radius``
    at the origin; ``side`` the side direction (sx, sy) scaled by the radius, or None.
    Returns (arc length or -1 when the path does not wrap, tangent points (ax, ay, bx,
    by)). Semantics of the engine's ``tendon._wrap_circle``."""
    x0, y0, x1, y1 = end
    sq0, sq1, sqr = x0 * x0 + y0 * y0, x1 * x1 + y1 * y1, radius * radius
    dx, dy = x1 - x0, y1 - y0
    dd = dx * dx + dy * dy
    if sq0 < sqr or sq1 < sqr or radius < MINVAL or dd < MINVAL:
        return -1.0, (0.0, 0.0, 0.0, 0.0)
    a = min(max(-(dx * x0 + dy * y0) / dd, 0.0), 1.0)
    tx, ty = a * dx + x0, a * dy + y0
    miss = tx * tx + ty * ty > sqr
    r0, r1 = _sqrt(sq0 - sqr), _sqrt(sq1 - sqr)
    sols, goods = [], []
    for sgn in (1.0, -1.0):            # +1: the tangent point clockwise of end 0
        sol = ((x0 * sqr + sgn * radius * y0 * r0) / sq0,
               (y0 * sqr - sgn * radius * x0 * r0) / sq0,
               (x1 * sqr - sgn * radius * y1 * r1) / sq1,
               (y1 * sqr + sgn * radius * x1 * r1) / sq1)
        ex, ey = sol[0] - sol[2], sol[1] - sol[3]
        cut = _intersect((x0, y0), sol[:2], (x1, y1), sol[2:])
        sols.append(sol)
        goods.append(-10000.0 if cut else -(ex * ex + ey * ey))
    if side is None:
        ccw = not goods[0] > goods[1]       # a tie goes counter-clockwise, as MuJoCo
        fail = miss
    else:
        small_ccw = _cross2(x0, y0, x1, y1) > 0
        nx, ny = -side[0], -side[1]
        c0n, cn1 = _cross2(x0, y0, nx, ny), _cross2(nx, ny, x1, y1)
        in_small = (c0n >= 0 and cn1 >= 0) if small_ccw else (c0n <= 0 and cn1 <= 0)
        ccw = small_ccw != in_small
        fail = miss and not in_small
    if fail:
        return -1.0, (0.0, 0.0, 0.0, 0.0)
    pnt = sols[1] if ccw else sols[0]
    ax, ay = _normalize2(pnt[0], pnt[1])
    bx, by = _normalize2(pnt[2], pnt[3])
    angle = _acos(ax * bx + ay * by)
    turn = _cross2(*pnt)
    if (turn < 0) if ccw else (turn > 0):
        angle = 2 * math.pi - angle
    return radius * angle, pnt


def wrap_inside(end, radius, niter=60):
    """Wrap from inside a circle (side site within the geom): (0 or -1, (px, py, px,
    py)). The exact root by safeguarded Newton steps, as the engine's
    ``tendon._wrap_inside``."""
    x0, y0, x1, y1 = end
    len0, len1 = _sqrt(x0 * x0 + y0 * y0), _sqrt(x1 * x1 + y1 * y1)
    dx, dy = x1 - x0, y1 - y0
    dd = dx * dx + dy * dy
    if len0 <= radius or len1 <= radius or radius < MINVAL or len0 < MINVAL or \
            len1 < MINVAL:
        return -1.0, (0.0,) * 4
    if dd > MINVAL:
        a = -(dx * x0 + dy * y0) / dd
        if 0 < a < 1 and _sqrt((x0 + a * dx) ** 2 + (y0 + a * dy) ** 2) <= radius:
            return -1.0, (0.0,) * 4
    A, B = radius / len0, radius / len1
    cosg = (len0 * len0 + len1 * len1 - dd) / (2 * len0 * len1)
    if cosg < -1 + MINVAL:
        return -1.0, (0.0,) * 4
    g = _acos(cosg)

    def fun(z):
        return _asin(A * z) + _asin(B * z) - 2 * _asin(z) + g

    def dfun(z):
        def inv(c):
            return 1.0 / max(MINVAL, _sqrt(1 - z * z * c * c))
        return A * inv(A) + B * inv(B) - 2 * inv(1.0)

    hi = 1 - 1e-7
    if cosg > 1 - MINVAL or fun(hi) > 0:
        mx, my = _normalize2(0.5 * (x0 + x1), 0.5 * (y0 + y1))
        return 0.0, (mx * radius, my * radius) * 2
    z, lo = hi, 0.0
    for _ in range(niter):
        f = fun(z)
        if f == 0:
            continue
        lo, hi = (z, hi) if f > 0 else (lo, z)
        df = dfun(z)
        step = z - f / (df if df < -MINVAL else -1.0)
        z = step if (df < -MINVAL and lo < step < hi) else 0.5 * (lo + hi)
    use_a = x0 * y1 - y0 * x1 > 0
    vx, vy = _normalize2(x0, y0) if use_a else _normalize2(x1, y1)
    ang = _asin(z) - _asin((A if use_a else B) * z)
    px = radius * (math.cos(ang) * vx - math.sin(ang) * vy)
    py = radius * (math.sin(ang) * vx + math.cos(ang) * vy)
    return 0.0, (px, py, px, py)


def wrap(x0, x1, gpos, gmat, radius, cylinder, side=None):
    """Wrap of the straight path x0-x1 (world, (3,)) around a sphere or cylinder with
    frame (gpos (3,), gmat (3, 3)) and ``radius`` (mju_wrap); ``side`` the world side-site
    position or None. Returns (length, w0, w1): the length over the geom (-1 when the
    path does not wrap) and the world tangent points (3,)."""
    p0, p1 = gmat.T @ (x0 - gpos), gmat.T @ (x1 - gpos)
    none = -1.0, x0, x0
    if _sqrt(float(p0 @ p0)) < MINVAL or _sqrt(float(p1 @ p1)) < MINVAL:
        return none
    if cylinder:
        ax0, ax1 = np.array([1.0, 0.0, 0.0]), np.array([0.0, 1.0, 0.0])
    else:                       # the plane through the centre and both points
        ax0 = normalize3(p0)
        normal = np.cross(p0, p1)
        if _sqrt(float(normal @ normal)) < MINVAL:
            aa = np.abs(ax0)
            i1 = aa[1] > aa[0] and aa[1] > aa[2]
            i2 = aa[2] > aa[0] and aa[2] > aa[1]
            alt = np.array([1.0 if i1 or i2 else 0.0, 0.0 if i1 else 1.0,
                            0.0 if i2 else 1.0])
            normal = np.cross(ax0, alt)
        ax1 = normalize3(np.cross(normalize3(normal), ax0))
    end = (float(p0 @ ax0), float(p0 @ ax1), float(p1 @ ax0), float(p1 @ ax1))
    if side is not None:
        s = gmat.T @ (side - gpos)
        if _sqrt(float(s @ s)) < radius:
            wlen, pnt = wrap_inside(end, radius)
        else:
            sx, sy = _normalize2(float(s @ ax0), float(s @ ax1))
            wlen, pnt = wrap_circle(end, (sx * radius, sy * radius), radius)
    else:
        wlen, pnt = wrap_circle(end, None, radius)
    if wlen < 0:
        return none
    r0 = ax0 * pnt[0] + ax1 * pnt[1]
    r1 = ax0 * pnt[2] + ax1 * pnt[3]
    if cylinder:                # heights along the unrolled path; the rise adds length
        l0 = _sqrt((p0[0] - r0[0]) ** 2 + (p0[1] - r0[1]) ** 2)
        l1 = _sqrt((p1[0] - r1[0]) ** 2 + (p1[1] - r1[1]) ** 2)
        tot = l0 + wlen + l1
        tot = 1.0 if tot == 0 else tot
        r0[2] = p0[2] + (p1[2] - p0[2]) * l0 / tot
        r1[2] = p0[2] + (p1[2] - p0[2]) * (l0 + wlen) / tot
        wlen = _sqrt(wlen * wlen + (r1[2] - r0[2]) ** 2)
    return wlen, gpos + gmat @ r0, gpos + gmat @ r1
