"""Geom distance sensors: geomdist, geomnormal, geomfromto (mj_geomDistance,
engine_support.c; the sensor in engine_sensor.c).

For each sensor every geom of the object (a geom or all geoms of a body) is paired
with every geom of the reference, each pair's signed distance is computed with the
sensor cutoff as the largest distance of interest, and the smallest distance wins
(initial value: the cutoff, with a zero segment). The segment runs from the surface of
the first geom to the surface of the second.

Per pair, as MuJoCo 4.0 does:

- pairs MuJoCo collides with mjc_Convex or mjc_BoxBox (ellipsoids, cylinders, meshes,
  box-box, and spheres/capsules against those): GJK distance with the witness points
  as the segment (:mod:`simjax.engine.collision.gjk`, native CCD); penetrating pairs
  (MuJoCo's EPA) take their depth and segment from the single contact of simjax's
  convex collider (the same penetration, found by separating axes);
- the other pairs (plane-*, sphere-sphere/capsule/cylinder/box, capsule-capsule/box):
  the pair's collision function with the cutoff as margin, its deepest contact.

Raises UnsupportedFeatureError for height-field and SDF geoms, and for convex pairs
when native CCD is disabled (MuJoCo then uses libccd).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from simjax.engine import math
from simjax.engine.collision import convex, gjk
from simjax.engine.collision.narrow import _pose_args
from simjax.engine.collision.pairs import COLLIDERS
from simjax.errors import UnsupportedFeatureError
from simjax.types import DisableBit, GeomType, ObjType, SensorType

G = GeomType
#: type pairs (t1 <= t2) MuJoCo collides with mjc_Convex or mjc_BoxBox
#: (mjCOLLISIONFUNC): mj_geomDistance measures them by GJK
_CCD = frozenset((a, b) for a in (G.SPHERE, G.CAPSULE, G.ELLIPSOID, G.CYLINDER, G.BOX,
                                  G.MESH)
                 for b in (G.ELLIPSOID, G.CYLINDER, G.BOX, G.MESH) if a <= b
                 and (a, b) not in ((G.SPHERE, G.CYLINDER), (G.SPHERE, G.BOX),
                                    (G.CAPSULE, G.BOX)))


def _collide(m, d, fn, a, b, margin):
    """The collider ``fn``'s candidate contacts (Pre: pair axis, then slot) of the geom
    pairs a, b ((n,) static ids, a's type first) with margins ``margin`` (n,)."""
    ftype = d.qpos.dtype
    geo1, geo2, dm = _pose_args(m, fn, a, b, margin, (d.geom_xpos[a], d.geom_xmat[a]),
                                (d.geom_xpos[b], d.geom_xmat[b]), ftype)
    group = getattr(fn, "group", None)
    if group:
        return group(geo1, geo2, dm, jnp.ones(len(a), bool))
    return jax.vmap(fn)(geo1, geo2, dm)


def _deepest(pre, limit, flip):
    """(dist, fromto) of one pair's smallest collider distance below ``limit`` (else
    ``limit`` and zeros), the segment from geom a to b, reversed when ``flip``."""
    dist = jnp.where(pre.valid, pre.dist, jnp.inf)
    k = jnp.argmin(dist)
    dd, pos, nrm = pre.dist[k], pre.pos[k], pre.normal[k]
    sign = -1.0 if flip else 1.0
    ft = jnp.concatenate([pos - 0.5 * sign * dd * nrm, pos + 0.5 * sign * dd * nrm])
    take = dist[k] < limit
    return jnp.where(take, dd, limit), jnp.where(take, ft, 0.0)


def _geo(m, d, g):
    """GJK geom tuples of geoms ``g`` ((n,) static ids, one mesh among them at most)."""
    dtype = d.qpos.dtype
    vert = None
    if int(m.geom_type[g[0]]) == G.MESH:
        mid = int(m.geom_dataid[g[0]])
        adr, num = int(m.mesh_vertadr[mid]), int(m.mesh_vertnum[mid])
        vert = jnp.asarray(np.asarray(m.mesh_vert)[adr:adr + num], dtype)
    return d.geom_xpos[g], d.geom_xmat[g], jnp.asarray(m.geom_size, dtype)[g], vert


def _ccd(m, d, g1, g2, cutoff):
    """mj_geomDistanceCCD of pairs of one kind: GJK in the sensor's geom order (vmapped
    over the pairs); penetration from the convex collider."""
    t1, t2 = int(m.geom_type[g1[0]]), int(m.geom_type[g2[0]])
    opt = m.opt
    p1, m1, s1, v1 = _geo(m, d, g1)
    p2, m2, s2, v2 = _geo(m, d, g2)

    def one(p1, m1, s1, p2, m2, s2, c):
        return gjk.distance(t1, (p1, m1, s1, v1), t2, (p2, m2, s2, v2), c,
                            opt.ccd_tolerance, int(opt.ccd_iterations))
    dist, x1, x2, status = jax.vmap(one)(p1, m1, s1, p2, m2, s2, cutoff)
    flip = t1 > t2
    a, b = (g2, g1) if flip else (g1, g2)
    # the single-contact form (MuJoCo's mjc_Convex without multi-contact: EPA's witness
    # points, as mj_geomDistance's): the same depth as the patch's deepest contact,
    # without the patch code to compile
    fn = convex.CONVEX[(min(t1, t2), max(t1, t2))]
    fn = convex.SINGLE.get(fn, fn)
    pre = _collide(m, d, fn, a, b, jnp.zeros_like(cutoff))
    pen, pen_ft = jax.vmap(lambda p, c: _deepest(p, c, flip))(pre, cutoff)
    sep = status == 0
    out = jnp.where(sep, jnp.minimum(dist, cutoff), jnp.where(status == 2, pen, cutoff))
    ft = jnp.where((sep & (dist < cutoff))[:, None], jnp.concatenate([x1, x2], -1),
                   jnp.where((status == 2)[:, None], pen_ft, 0.0))
    return out, ft


def _kind(m, g1, g2):
    """Static kind of a geom pair: (type1, type2, mesh of 1, mesh of 2) in sensor
    order; pairs of one kind are computed together."""
    t1, t2 = int(m.geom_type[g1]), int(m.geom_type[g2])
    mesh = lambda g, t: int(m.geom_dataid[g]) if t == G.MESH else -1
    return t1, t2, mesh(g1, t1), mesh(g2, t2)


def _pairs(m, d, kind, g1, g2, cutoff):
    """(dist (n,), fromto (n, 6)) of geom pairs of one kind ((n,) static ids, sensor
    order): mj_geomDistance."""
    t1, t2 = kind[:2]
    key = (min(t1, t2), max(t1, t2))
    name = f"{G(key[0]).name.lower()} and {G(key[1]).name.lower()}"
    if G.HFIELD in key or G.SDF in key:
        raise UnsupportedFeatureError(f"geom distance sensor between {name}")
    if key in _CCD:
        if int(m.opt.disableflags) & int(DisableBit.NATIVECCD):
            raise UnsupportedFeatureError(
                f"geom distance sensor between {name} with native CCD disabled")
        return _ccd(m, d, g1, g2, cutoff)
    if key not in COLLIDERS:            # MuJoCo: no collision function, the cutoff
        return cutoff, jnp.zeros((len(g1), 6), cutoff.dtype)
    flip = t1 > t2
    a, b = (g2, g1) if flip else (g1, g2)
    pre = _collide(m, d, COLLIDERS[key], a, b, cutoff)
    return jax.vmap(lambda p, c: _deepest(p, c, flip))(pre, cutoff)


def _geoms(m, objtype, objid):
    if objtype == ObjType.BODY:
        adr, num = int(m.body_geomadr[objid]), int(m.body_geomnum[objid])
        return list(range(adr, adr + num))
    return [int(objid)]


def _values(m, d, ids):
    """(dist (n,), fromto (n, 6)) of the sensors ``ids``: every geom pair of every
    sensor, computed per pair kind, then each sensor's smallest in MuJoCo's pair order
    (the first of equal distances)."""
    dtype = d.qpos.dtype
    col = lambda n, i: int(np.asarray(getattr(m, n)).reshape(-1)[i])
    cut = jnp.asarray(m.sensor_cutoff, dtype).reshape(-1)       # traced
    entries = []                         # (sensor, g1, g2)
    for k, i in enumerate(ids):
        for g1 in _geoms(m, col("sensor_objtype", i), col("sensor_objid", i)):
            for g2 in _geoms(m, col("sensor_reftype", i), col("sensor_refid", i)):
                entries.append((k, g1, g2))
    kinds = {}
    for e, (k, g1, g2) in enumerate(entries):
        kinds.setdefault(_kind(m, g1, g2), []).append(e)
    order, dists, fts = [], [], []
    for kind, es in kinds.items():
        g1 = np.array([entries[e][1] for e in es])
        g2 = np.array([entries[e][2] for e in es])
        c = cut[np.array([int(ids[entries[e][0]]) for e in es])]
        dd, ft = _pairs(m, d, kind, g1, g2, c)
        order += es
        dists.append(dd)
        fts.append(ft)
    # entry e's row in the concatenation; a last row of +inf pads the sensors' lists
    row = np.empty(len(entries), int)
    row[np.array(order)] = np.arange(len(entries))
    dist = jnp.concatenate(dists + [jnp.full(1, jnp.inf, dtype)])
    fromto = jnp.concatenate(fts + [jnp.zeros((1, 6), dtype)])
    lists = [[] for _ in ids]
    for e, (k, _, _) in enumerate(entries):
        lists[k].append(row[e])
    width = max(len(x) for x in lists)
    table = np.full((len(ids), width), len(entries))
    for k, x in enumerate(lists):
        table[k, :len(x)] = x
    # each sensor's first smallest (MuJoCo keeps a pair's value when strictly smaller)
    cand = dist[table]
    best = jnp.argmin(cand, axis=1)
    pick = jnp.take_along_axis(jnp.asarray(table), best[:, None], axis=1)[:, 0]
    cutoffs = cut[np.asarray(ids, int)]
    take = dist[pick] < cutoffs
    return (jnp.where(take, dist[pick], cutoffs),
            jnp.where(take[:, None], fromto[pick], 0.0))


#: the sensor types measured here
TYPES = (SensorType.GEOMDIST, SensorType.GEOMNORMAL, SensorType.GEOMFROMTO)


def _format(t, dist, fromto):
    if t == SensorType.GEOMDIST:
        return dist
    if t == SensorType.GEOMNORMAL:
        v = fromto[:, 3:] - fromto[:, :3]
        n, _ = math.normalize(v)
        return jnp.where(jnp.any(v != 0, axis=1, keepdims=True), n, 0.0).reshape(-1)
    return fromto.reshape(-1)


def geom_distance_groups(m, d, groups):
    """{type: values} of the geom distance sensors in ``groups`` ((type, ids) pairs):
    GEOMDIST (1,), GEOMNORMAL (3,) unit or zero, GEOMFROMTO (6,) per sensor, world
    frame, length units, concatenated. Their geom pairs are measured together: one
    collider and one GJK instance per pair kind for all three sensor types (one per
    type and kind before). With the single-contact collider for penetration
    (:func:`_ccd`), the forward of tests/engine/sensor_models/geomdist.xml (float32,
    fresh processes, 2 each) compiled in 26-29 s against 48-56 s."""
    ids = np.concatenate([np.asarray(i) for _, i in groups])
    dist, fromto = _values(m, d, ids)
    out, k = {}, 0
    for t, i in groups:
        n = len(i)
        out[t] = _format(t, dist[k:k + n], fromto[k:k + n])
        k += n
    return out
