"""Geom distance sensors: geomdist, geomnormal, geomfromto (mj_geomDistance).

For each sensor every geom of the object (a geom or all geoms of a body) is paired
with every geom of the reference, each pair's signed distance is computed with the
sensor cutoff as the largest distance of interest, and the smallest distance wins
(initial value: the cutoff, with a zero segment). The segment runs from the surface of
the first geom to the surface of the second.

Implemented pairs: plane-sphere, plane-capsule, sphere-sphere, sphere-capsule (closed
forms, as MuJoCo's primitive collision functions); other pairs raise
UnsupportedFeatureError.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from simjax.engine import math
from simjax.errors import UnsupportedFeatureError
from simjax.types import GeomType, ObjType, SensorType

G = GeomType


def _sphere_sphere(p1, r1, p2, r2, mat1, mat2):
    dif = p2 - p1
    cd = math.norm(dif)
    n, _ = math.normalize(dif)
    alt, _ = math.normalize(math.cross(mat1[:, 2], mat2[:, 2]))
    n = jnp.where(cd < math.MINVAL, alt, n)
    dist = cd - r1 - r2
    pos = p1 + n * (r1 + dist / 2)
    return dist, pos, n


def _plane_sphere(ppos, pmat, c, r):
    n = pmat[:, 2]
    dist = math.dot(n, c - ppos) - r
    pos = c - n * (r + dist / 2)
    return dist, pos, n


def _segment_point(a, axis, half, p):
    t = math.clip_as_jnp(math.dot(p - a, axis), -half, half)
    return a + t * axis


def _pair(m, d, g1, g2):
    """(dist, pos, normal) candidates of geoms g1 <= g2 by type (static ids)."""
    t1, t2 = int(m.geom_type[g1]), int(m.geom_type[g2])
    dtype = d.qpos.dtype
    size = jnp.asarray(m.geom_size, dtype)
    p1, p2 = d.geom_xpos[g1], d.geom_xpos[g2]
    m1, m2 = d.geom_xmat[g1], d.geom_xmat[g2]
    s1, s2 = size[g1], size[g2]
    if (t1, t2) == (G.SPHERE, G.SPHERE):
        return [_sphere_sphere(p1[None], s1[0], p2[None], s2[0], m1[None], m2[None])]
    if (t1, t2) == (G.SPHERE, G.CAPSULE):
        q = _segment_point(p2, m2[:, 2], s2[1], p1)
        return [_sphere_sphere(p1[None], s1[0], q[None], s2[0], m1[None], m2[None])]
    if (t1, t2) == (G.PLANE, G.SPHERE):
        return [_plane_sphere(p1[None], m1[None], p2[None], s2[0])]
    if (t1, t2) == (G.PLANE, G.CAPSULE):
        seg = s2[1] * m2[:, 2]
        return [_plane_sphere(p1[None], m1[None], (p2 + seg)[None], s2[0]),
                _plane_sphere(p1[None], m1[None], (p2 - seg)[None], s2[0])]
    raise UnsupportedFeatureError(
        f"geom distance sensor between {G(t1).name.lower()} and {G(t2).name.lower()}")


def _geoms(m, objtype, objid):
    if objtype == ObjType.BODY:
        adr, num = int(m.body_geomadr[objid]), int(m.body_geomnum[objid])
        return list(range(adr, adr + num))
    return [int(objid)]


def _one(m, d, i):
    dtype = d.qpos.dtype
    col = lambda n: int(np.asarray(getattr(m, n)).reshape(-1)[i])
    cutoff = jnp.asarray(m.sensor_cutoff, dtype).reshape(-1)[i]
    dist = cutoff
    fromto = jnp.zeros(6, dtype)
    for g1 in _geoms(m, col("sensor_objtype"), col("sensor_objid")):
        for g2 in _geoms(m, col("sensor_reftype"), col("sensor_refid")):
            flip = int(m.geom_type[g1]) > int(m.geom_type[g2])
            a, b = (g2, g1) if flip else (g1, g2)
            best = cutoff
            best_ft = jnp.zeros(6, dtype)
            for dd, pos, nrm in _pair(m, d, a, b):
                dd, pos, nrm = dd[0], pos[0], nrm[0]
                sign = -1.0 if flip else 1.0
                ft = jnp.concatenate([pos - 0.5 * sign * dd * nrm, pos + 0.5 * sign * dd * nrm])
                # a collision function reports the contact only within the margin
                take = (dd <= cutoff) & (dd < best)
                best = jnp.where(take, dd, best)
                best_ft = jnp.where(take, ft, best_ft)
            take = best < dist
            dist = jnp.where(take, best, dist)
            fromto = jnp.where(take, best_ft, fromto)
    return dist, fromto


def geom_distance_sensor(m, d, t, ids):
    """Values of geom distance sensors of type ``t`` (flat)."""
    out = []
    for i in ids:
        dist, fromto = _one(m, d, int(i))
        if t == SensorType.GEOMDIST:
            out.append(dist[None])
        elif t == SensorType.GEOMNORMAL:
            v = fromto[3:] - fromto[:3]
            n, _ = math.normalize(v)
            out.append(jnp.where(jnp.any(v != 0), n, 0.0))
        else:
            out.append(fromto)
    return jnp.concatenate(out)
