"""Tactile sensors (MuJoCo 4.0's mjSENS_TACTILE, velocity stage).

A tactile sensor pairs a geom with a mesh: the mesh vertices placed in the geom's frame
are the taxels. For every geom currently in contact with the sensor geom's weld body
(any slot of ``d.contact`` with one side on that body), each taxel evaluates the other
geom's signed distance; the sensor reports, per taxel, the largest penetration depth
(``-min(distance, 0)``) over those geoms in its first channel. MuJoCo's second and third
channels (sliding speeds along per-vertex tangent frames) need meshes with three
normals per vertex (its builtin tactile meshes); simjax's compiler refuses those, so
they are zero here exactly as MuJoCo leaves them for meshes with one normal per vertex.
Output layout: [depth (nvert), tangent1 (nvert), tangent2 (nvert)].

Distances use :func:`simjax.engine.collision.sdf.distance` (MuJoCo's geomDistance for
primitives, the plugin's distance for SDF geoms, in the plugin's mesh frame). Mesh
geoms are skipped, as MuJoCo skips meshes without an octree (none are built for the
models simjax compiles); height fields raise UnsupportedFeatureError.

Vectorised over taxels and over the candidate geoms of each type; one small block per
tactile sensor (a model has few).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from simjax.engine import math
from simjax.engine.collision import sdf
from simjax.errors import UnsupportedFeatureError
from simjax.types import GeomType

_PRIMITIVE = (GeomType.PLANE, GeomType.SPHERE, GeomType.CAPSULE, GeomType.ELLIPSOID,
              GeomType.CYLINDER, GeomType.BOX)


def _candidates(m):
    """Static (type -> geom ids) of the geoms with a distance function; SDF geoms one
    per entry (their plugin and parameters differ)."""
    gtype = np.asarray(m.geom_type).reshape(-1)
    if np.any(gtype == GeomType.HFIELD):
        raise UnsupportedFeatureError("tactile sensor in a model with height fields")
    groups = [(sdf.Shape(int(t)), np.nonzero(gtype == t)[0]) for t in _PRIMITIVE
              if np.any(gtype == t)]
    groups += [(sdf.shape_of(m, int(g)), np.array([g])) for g in
               np.nonzero(gtype == GeomType.SDF)[0]]
    return groups


def _active(m, d, weld):
    """(ngeom,) bool: geoms in a contact whose other side is on weld body ``weld``."""
    con = d.contact
    if con.dist.shape[0] == 0:
        return jnp.zeros(m.ngeom, bool)
    bw = jnp.asarray(np.asarray(m.body_weldid)[np.asarray(m.geom_bodyid)], jnp.int32)
    g = jnp.maximum(con.geom, 0)
    w1, w2 = bw[g[:, 0]], bw[g[:, 1]]
    hit = jnp.zeros(m.ngeom, jnp.int32)
    hit = hit.at[g[:, 1]].add((con.valid & (w1 == weld)).astype(jnp.int32))
    hit = hit.at[g[:, 0]].add((con.valid & (w2 == weld)).astype(jnp.int32))
    return hit > 0


def _depth(m, d, xpos, groups, active):
    """(ntaxel,) largest penetration over the active candidate geoms."""
    dtype = xpos.dtype
    size = jnp.asarray(m.geom_size, dtype).reshape(-1, 3)
    out = jnp.zeros(xpos.shape[0], dtype)
    for shape, gids in groups:
        rel = xpos[None, :, :] - d.geom_xpos[gids][:, None, :]
        lpos = jnp.einsum("gji,gtj->gti", d.geom_xmat[gids], rel)   # geom frames
        if shape.type == GeomType.SDF:
            g = int(gids[0])
            mesh = int(np.asarray(m.geom_dataid)[g])
            if mesh >= 0:       # plugin SDFs live in the original mesh frame
                mq = math.quat_to_mat(jnp.asarray(m.mesh_quat, dtype).reshape(-1, 4)[mesh])
                lpos = lpos @ mq.T + jnp.asarray(m.mesh_pos, dtype).reshape(-1, 3)[mesh]
            prm = sdf.plugin_params(m, g)
            dist = jax.vmap(lambda x: sdf.distance(shape, x, size[g], prm))(lpos[0])[None]
        else:
            dist = jax.vmap(jax.vmap(lambda x, s: sdf.distance(shape, x, s, ()),
                                     in_axes=(0, None)))(lpos, size[gids])
        depth = -math.minimum(dist, 0.0)
        depth = jnp.where(active[gids][:, None], depth, 0.0)
        out = math.maximum(out, math.amax(depth, 0))
    return out


def tactile(m, d, ids):
    """Flat values of tactile sensors ``ids`` (sum of 3 nvert per sensor)."""
    dtype = d.qpos.dtype
    groups = _candidates(m)
    vert = jnp.asarray(m.mesh_vert, dtype).reshape(-1, 3)
    parts = []
    for i in np.asarray(ids).reshape(-1):
        mesh, geom = int(np.asarray(m.sensor_objid)[i]), int(np.asarray(m.sensor_refid)[i])
        adr, n = int(np.asarray(m.mesh_vertadr)[mesh]), int(np.asarray(m.mesh_vertnum)[mesh])
        weld = int(np.asarray(m.body_weldid)[np.asarray(m.geom_bodyid)[geom]])
        xpos = vert[adr:adr + n] @ d.geom_xmat[geom].T + d.geom_xpos[geom]
        depth = _depth(m, d, xpos, groups, _active(m, d, weld)) if groups else \
            jnp.zeros(n, dtype)
        parts.append(jnp.concatenate([depth, jnp.zeros(2 * n, dtype)]))
    return jnp.concatenate(parts)
