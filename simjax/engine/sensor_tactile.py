"""Tactile sensors (MuJoCo 4.0's mjSENS_TACTILE, velocity stage).

A tactile sensor pairs a geom with a mesh: the mesh vertices placed in the geom's frame
are the taxels. For every geom currently in contact with the sensor geom's weld body
(any slot of ``d.contact`` with one side on that body), each taxel evaluates the other
geom's signed distance; the sensor reports, per taxel, the largest penetration depth
(``-min(distance, 0)``) over those geoms in its first channel. The second and third
channels sum, over the geoms the taxel penetrates, the absolute sliding speed along the
taxel's two tangents: the linear velocity of the taxel on the sensor's weld body minus
that of the other geom's centre on its body, dotted with the tangents of the mesh's
per-vertex frames (``Model.mesh_frame``: meshes with three normals per vertex, such as
the builtin wedge and plate) rotated by the sensor geom's frame, as MuJoCo 4.0.0 does.
Meshes with one normal per vertex leave them zero, as in MuJoCo.
Output layout: [depth (nvert), tangent1 (nvert), tangent2 (nvert)].

Distances use :func:`simjax.engine.collision.sdf.distance` (MuJoCo's geomDistance for
primitives, the plugin's distance for SDF geoms, in the plugin's mesh frame). Mesh
geoms are skipped, as MuJoCo skips meshes without an octree (none are built for the
models simjax compiles); a sensor whose body can collide with a height field raises
UnsupportedFeatureError (MuJoCo stops with an error when they touch).

Vectorised over taxels and over the candidate geoms of each type; one small block per
tactile sensor (a model has few).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from simjax.engine import math
from simjax.engine.collision import pairs, sdf
from simjax.errors import UnsupportedFeatureError
from simjax.types import GeomType

_PRIMITIVE = (GeomType.PLANE, GeomType.SPHERE, GeomType.CAPSULE, GeomType.ELLIPSOID,
              GeomType.CYLINDER, GeomType.BOX)


def _candidates(m):
    """Static (type -> geom ids) of the geoms with a distance function; SDF geoms one
    per entry (their plugin and parameters differ)."""
    gtype = np.asarray(m.geom_type).reshape(-1)
    groups = [(sdf.Shape(int(t)), np.nonzero(gtype == t)[0]) for t in _PRIMITIVE
              if np.any(gtype == t)]
    groups += [(sdf.shape_of(m, int(g)), np.array([g])) for g in
               np.nonzero(gtype == GeomType.SDF)[0]]
    return groups


def _check_hfields(m, weld):
    """MuJoCo has no height-field distance (geomDistance stops with an error when a
    height field touches a tactile sensor's body): refuse a sensor whose weld body can
    collide with one. Height fields elsewhere in the model never count."""
    if not np.any(np.asarray(m.geom_type) == GeomType.HFIELD):
        return
    g1, g2, _ = pairs.candidate_pairs(m)
    gtype = np.asarray(m.geom_type)
    gweld = np.asarray(m.body_weldid)[np.asarray(m.geom_bodyid)]
    for a, b in ((g1, g2), (g2, g1)):
        if np.any((gtype[a] == GeomType.HFIELD) & (gweld[b] == weld)):
            raise UnsupportedFeatureError("tactile sensor on a body that can touch a "
                                          "height field")


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


def _distances(m, d, xpos, groups):
    """Per candidate group: (geom ids (g,), signed distances (g, ntaxel)) of the taxels
    at world positions xpos (ntaxel, 3), each in the geom's own frame."""
    dtype = xpos.dtype
    size = jnp.asarray(m.geom_size, dtype).reshape(-1, 3)
    out = []
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
        out.append((gids, dist))
    return out


def _linvel(m, d, body, pos):
    """Linear velocity of points ``pos`` (..., 3) moving with ``body`` (mju_transformSpatial
    of its cvel about its subtree's centre of mass; no static-body special case)."""
    com = d.subtree_com[np.asarray(m.body_rootid)[body]]
    cvel = d.cvel[body]
    return cvel[..., 3:] - math.cross(pos - com, cvel[..., :3])


def _tangents(m, mesh, xmat):
    """The sensor mesh's taxel tangents (2, nvert, 3) in the world: its stored frames
    (processed mesh frame, as its vertices) rotated by the sensor geom's xmat; None for
    a mesh without tangent frames."""
    adr = int(np.asarray(m.mesh_frameadr)[mesh])
    if adr < 0:
        return None
    n = int(np.asarray(m.mesh_vertnum)[mesh])
    frame = jnp.asarray(np.asarray(m.mesh_frame)[adr:adr + n], xmat.dtype)
    return jnp.stack([frame[:, 3:6], frame[:, 6:9]]) @ xmat.T


def _channels(m, d, xpos, weld, tangents, groups, active):
    """(3, ntaxel): the largest penetration over the active candidate geoms, and the
    sums over the penetrating ones of |relative sliding velocity . tangent|."""
    n = xpos.shape[0]
    depth = jnp.zeros(n, xpos.dtype)
    slide = jnp.zeros((2, n), xpos.dtype)
    vsensor = _linvel(m, d, weld, xpos) if tangents is not None else None
    for gids, dist in _distances(m, d, xpos, groups):
        inside = (dist < 0) & active[gids][:, None]                    # (g, ntaxel)
        depth = math.maximum(depth, math.amax(jnp.where(inside, -dist, 0.0), 0))
        if tangents is None:
            continue
        body = np.asarray(m.geom_bodyid)[gids]
        vrel = vsensor[None] - _linvel(m, d, body, d.geom_xpos[gids])[:, None]
        speed = jnp.abs(jnp.einsum("gti,kti->kgt", vrel, tangents))   # (2, g, ntaxel)
        slide = slide + jnp.sum(jnp.where(inside[None], speed, 0.0), 1)
    return jnp.concatenate([depth, slide.reshape(-1)])


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
        _check_hfields(m, weld)
        xpos = vert[adr:adr + n] @ d.geom_xmat[geom].T + d.geom_xpos[geom]
        if groups:
            tangents = _tangents(m, mesh, d.geom_xmat[geom])
            parts.append(_channels(m, d, xpos, weld, tangents, groups, _active(m, d, weld)))
        else:
            parts.append(jnp.zeros(3 * n, dtype))
    return jnp.concatenate(parts)
