"""Ray casting against geoms (MuJoCo's engine_ray: mj_ray, mju_rayGeom, mj_rayMesh).

Every function is vectorised: positions (..., 3), rotation matrices (..., 3, 3), sizes
(..., 3), ray points and directions (..., 3) broadcast against each other, and the
result is the distance along the ray (in units of |vec|) to the nearest intersection
with x >= 0, or -1 when there is none, together with the unit surface normal at the
hit (world frame; zero without a hit). Directions need not be unit vectors.

:func:`ray` intersects rays with every geom a rangefinder can see (mj_ray with
``geomgroup=NULL``, ``flg_static=1``): all geom types are evaluated vectorised per type
and the nearest hit wins (ties: the lowest geom id, as MuJoCo's geom loop). Meshes are
intersected face by face (MuJoCo walks a bounding-volume hierarchy; a face whose
triangle the ray hits lies inside every box on the way to it, so both give the same
nearest face). Height fields are intersected cell by cell along the ray
(:func:`ray_hfield`), SDF geoms by MuJoCo's sphere tracing (:func:`ray_sdf`).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from simjax.engine import inline, math
from simjax.engine.collision import sdf
from simjax.errors import UnsupportedFeatureError
from simjax.types import GeomType

MINVAL = math.MINVAL


def _map(pos, mat, pnt, vec):
    """Ray point and direction in the local frame of (pos, mat) (ray_map)."""
    return math.matTvec(mat, pnt - pos), math.matTvec(mat, vec)


def _quad(a, b, c):
    """Roots of a x^2 + 2 b x + c = 0 (ray_quad): (smallest x >= 0 or -1, x0, x1);
    x0 = x1 = -1 when there is no real root."""
    det = b * b - a * c
    ok = (det >= 0) & (a >= MINVAL)
    sq = jnp.sqrt(jnp.where(ok, det, 0.0))
    a_s = jnp.where(ok, a, 1.0)
    x0 = jnp.where(ok, (-b - sq) / a_s, -1.0)
    x1 = jnp.where(ok, (-b + sq) / a_s, -1.0)
    x = jnp.where(x0 >= 0, x0, jnp.where(x1 >= 0, x1, -1.0))
    return jnp.where(ok, x, -1.0), x0, x1


def _normalize(v):
    n, _ = math.normalize(v)
    return n


def _finish(x, normal):
    hit = x >= 0
    return jnp.where(hit, x, -1.0), jnp.where(hit[..., None], normal, 0.0)


def sphere_dist(pos, dist_sqr, pnt, vec):
    """Distance to the sphere |p - pos|^2 = dist_sqr (ray_sphere without normal)."""
    dif = pnt - pos
    return _quad(math.dot(vec, vec), math.dot(vec, dif), math.dot(dif, dif) - dist_sqr)[0]


def ray_sphere(pos, mat, size, pnt, vec):
    x = sphere_dist(pos, size[..., 0] ** 2, pnt, vec)
    normal = _normalize(pnt + x[..., None] * vec - pos)
    return _finish(x, normal)


def ray_plane(pos, mat, size, pnt, vec):
    lp, lv = _map(pos, mat, pnt, vec)
    front = lv[..., 2] <= -MINVAL
    x = -lp[..., 2] / jnp.where(front, lv[..., 2], -1.0)
    p0 = lp[..., 0] + x * lv[..., 0]
    p1 = lp[..., 1] + x * lv[..., 1]
    inside = (((size[..., 0] <= 0) | (jnp.abs(p0) <= size[..., 0])) &
              ((size[..., 1] <= 0) | (jnp.abs(p1) <= size[..., 1])))
    ok = front & (x >= 0) & inside
    return _finish(jnp.where(ok, x, -1.0), mat[..., :, 2])


def _better(x, sol, ok):
    """Whether candidate ``sol`` (valid where ok) replaces the current best ``x``."""
    return ok & ((x < 0) | (sol < x))


def _side_wall(lp, lv, r, h, x):
    """Nearer hit of the local-frame ray with the side wall of a z-aligned cylinder of
    radius r and half-height h (capsule and cylinder share it): (distance, is-better)."""
    a = lv[..., 0] ** 2 + lv[..., 1] ** 2
    b = lv[..., 0] * lp[..., 0] + lv[..., 1] * lp[..., 1]
    c = lp[..., 0] ** 2 + lp[..., 1] ** 2 - r * r
    sol = _quad(a, b, c)[0]
    return sol, _better(x, sol, (sol >= 0) & (jnp.abs(lp[..., 2] + sol * lv[..., 2]) <= h))


def ray_capsule(pos, mat, size, pnt, vec):
    r, h = size[..., 0], size[..., 1]
    bound = sphere_dist(pos, (r + h) ** 2, pnt, vec) >= 0
    lp, lv = _map(pos, mat, pnt, vec)
    x = -jnp.ones_like(r)
    kind = jnp.zeros_like(r)
    sol, upd = _side_wall(lp, lv, r, h, x)
    x = jnp.where(upd, sol, x)
    aa = math.dot(lv, lv)
    for side in (1.0, -1.0):                      # top cap, then bottom cap
        ld = lp - jnp.stack([jnp.zeros_like(h), jnp.zeros_like(h), side * h], -1)
        _, x0, x1 = _quad(aa, math.dot(lv, ld), math.dot(ld, ld) - r * r)
        for xi in (x0, x1):
            z = lp[..., 2] + xi * lv[..., 2]
            half = z >= h if side > 0 else z <= -h
            upd = _better(x, xi, (xi >= 0) & half)
            x = jnp.where(upd, xi, x)
            kind = jnp.where(upd, side, kind)
    loc = lp + x[..., None] * lv
    nz = jnp.where(kind == 0, 0.0, loc[..., 2] - h * kind)
    normal = math.matvec(mat, _normalize(jnp.stack([loc[..., 0], loc[..., 1], nz], -1)))
    return _finish(jnp.where(bound, x, -1.0), normal)


def ray_ellipsoid(pos, mat, size, pnt, vec):
    lp, lv = _map(pos, mat, pnt, vec)
    s = 1.0 / (size * size)
    x = _quad(math.dot(s * lv, lv), math.dot(s * lv, lp), math.dot(s * lp, lp) - 1.0)[0]
    loc = lp + x[..., None] * lv
    normal = math.matvec(mat, _normalize(s * loc))
    return _finish(x, normal)


def ray_cylinder(pos, mat, size, pnt, vec):
    r, h = size[..., 0], size[..., 1]
    bound = sphere_dist(pos, r * r + h * h, pnt, vec) >= 0
    lp, lv = _map(pos, mat, pnt, vec)
    x = -jnp.ones_like(r)
    kind = jnp.zeros_like(r)
    axial = jnp.abs(lv[..., 2]) > MINVAL
    lvz = jnp.where(axial, lv[..., 2], 1.0)
    for side in (-1.0, 1.0):
        sol = (side * h - lp[..., 2]) / lvz
        p0 = lp[..., 0] + sol * lv[..., 0]
        p1 = lp[..., 1] + sol * lv[..., 1]
        upd = _better(x, sol, axial & (sol >= 0) & (p0 * p0 + p1 * p1 <= r * r))
        x = jnp.where(upd, sol, x)
        kind = jnp.where(upd, side, kind)
    sol, upd = _side_wall(lp, lv, r, h, x)
    x = jnp.where(upd, sol, x)
    kind = jnp.where(upd, 0.0, kind)
    loc = lp + x[..., None] * lv
    zero = jnp.zeros_like(x)
    kind = kind + zero
    round_n = _normalize(jnp.stack([loc[..., 0], loc[..., 1], zero], -1))
    flat_n = jnp.stack([zero, zero, kind], -1)
    normal = math.matvec(mat, jnp.where((kind == 0)[..., None], round_n, flat_n))
    return _finish(jnp.where(bound, x, -1.0), normal)


_FACES = ((1, 2), (0, 2), (0, 1))


def _box_local(pos, mat, size, pnt, vec):
    """ray_box in the box frame: (x, all, local normal). ``all`` (..., 6) holds each
    face's hit distance (faces -x, +x, -y, +y, -z, +z) or -1, as ray_box's ``all``."""
    bound = sphere_dist(pos, math.dot(size, size), pnt, vec) >= 0
    lp, lv = _map(pos, mat, pnt, vec)
    x = -jnp.ones_like(size[..., 0])
    nloc = jnp.zeros_like(lp)
    faces = []
    for i in range(3):
        ok_axis = jnp.abs(lv[..., i]) > MINVAL
        lvi = jnp.where(ok_axis, lv[..., i], 1.0)
        j, k = _FACES[i]
        for side in (-1.0, 1.0):
            sol = (side * size[..., i] - lp[..., i]) / lvi
            p0 = lp[..., j] + sol * lv[..., j]
            p1 = lp[..., k] + sol * lv[..., k]
            ok = (ok_axis & (sol >= 0) & (jnp.abs(p0) <= size[..., j]) &
                  (jnp.abs(p1) <= size[..., k]))
            upd = _better(x, sol, ok)
            x = jnp.where(upd, sol, x)
            n = jnp.zeros(3, lp.dtype).at[i].set(side)
            nloc = jnp.where(upd[..., None], n, nloc)
            faces.append(jnp.where(ok & bound, sol, -1.0))
    return jnp.where(bound, x, -1.0), jnp.stack(faces, -1), nloc


def ray_box(pos, mat, size, pnt, vec):
    x, _, nloc = _box_local(pos, mat, size, pnt, vec)
    return _finish(x, math.matvec(mat, nloc))


#: mju_rayGeom dispatch for primitive geom types
PRIMITIVE = {GeomType.PLANE: ray_plane, GeomType.SPHERE: ray_sphere,
             GeomType.CAPSULE: ray_capsule, GeomType.ELLIPSOID: ray_ellipsoid,
             GeomType.CYLINDER: ray_cylinder, GeomType.BOX: ray_box}


def ray_geom(pos, mat, size, pnt, vec, geomtype):
    """Ray against a primitive geom of static type ``geomtype`` (mju_rayGeom)."""
    fn = PRIMITIVE.get(int(geomtype))
    if fn is None:
        raise UnsupportedFeatureError(f"ray intersection with geom type {int(geomtype)}")
    return fn(pos, mat, size, pnt, vec)


def _normal_basis(lv):
    """Two unit vectors spanning the plane normal to lv (mju_rayTree's b0, b1)."""
    ab = jnp.abs(lv)
    i0 = (ab[..., 0] >= ab[..., 1]) & (ab[..., 0] >= ab[..., 2])
    i1 = ~i0 & (ab[..., 1] >= ab[..., 2])
    b0 = jnp.stack([jnp.where(i0, 0.0, 1.0), jnp.where(i1, 0.0, 1.0),
                    jnp.where(i0 | i1, 1.0, 0.0)], -1)
    b1 = b0 - (math.dot(lv, b0) / math.dot(lv, lv))[..., None] * lv
    b1 = _normalize(b1)
    b0 = _normalize(math.cross(b1, lv))
    return b0, b1


def ray_triangle(v, lp, lv, b0, b1):
    """Ray (local lp, lv) against triangles v (..., 3, 3) (ray_triangle): (x, normal)."""
    dif = v - lp[..., None, :]
    p0 = math.dot(dif, b0[..., None, :])                 # (..., 3) planar coordinates
    p1 = math.dot(dif, b1[..., None, :])
    same = ((jnp.all(p0 > 0, -1) | jnp.all(p0 < 0, -1)) |
            (jnp.all(p1 > 0, -1) | jnp.all(p1 < 0, -1)))
    a0, a1 = p0[..., 0] - p0[..., 2], p0[..., 1] - p0[..., 2]
    a2, a3 = p1[..., 0] - p1[..., 2], p1[..., 1] - p1[..., 2]
    rb0, rb1 = -p0[..., 2], -p1[..., 2]
    det = a0 * a3 - a1 * a2
    okdet = jnp.abs(det) >= MINVAL
    det_s = jnp.where(okdet, det, 1.0)
    t0 = (a3 * rb0 - a1 * rb1) / det_s
    t1 = (-a2 * rb0 + a0 * rb1) / det_s
    inside = (t0 >= 0) & (t1 >= 0) & (t0 + t1 <= 1)
    e0 = v[..., 0, :] - v[..., 2, :]
    e1 = v[..., 1, :] - v[..., 2, :]
    e2 = lp - v[..., 2, :]
    nrm = math.cross(e0, e1)
    denom = math.dot(lv, nrm)
    okden = jnp.abs(denom) >= MINVAL
    x = -math.dot(e2, nrm) / jnp.where(okden, denom, 1.0)
    ok = ~same & okdet & inside & okden
    return jnp.where(ok, x, -1.0), _normalize(nrm)


def ray_mesh(m, geoms, pos, mat, size, pnt, vec):
    """Rays (n, 3) against mesh geoms ``geoms`` (static, k): (x, normal), each (n, k...).

    pos, mat, size: the geoms' poses and sizes (k, ...). Returns x (n, k) and normal
    (n, k, 3): the nearest face hit per geom (mj_rayMesh), after MuJoCo's bounding-box
    pre-test with the geom size.
    """
    geoms = np.asarray(geoms)
    mesh = np.asarray(m.geom_dataid)[geoms]
    fadr = np.asarray(m.mesh_faceadr)[mesh]
    fnum = np.asarray(m.mesh_facenum)[mesh]
    vadr = np.asarray(m.mesh_vertadr)[mesh]
    fmax = int(fnum.max())
    face = np.asarray(m.mesh_face).reshape(-1, 3)
    vert = np.asarray(m.mesh_vert, np.float64).reshape(-1, 3)
    # (k, fmax, 3, 3) triangles, padded with degenerate ones (never hit)
    tri = np.zeros((len(geoms), fmax, 3, 3))
    valid = np.zeros((len(geoms), fmax), bool)
    for g in range(len(geoms)):
        f = face[fadr[g]:fadr[g] + fnum[g]] + vadr[g]
        tri[g, :fnum[g]] = vert[f]
        valid[g, :fnum[g]] = True
    dtype = pnt.dtype
    bound = ray_box(pos[None], mat[None], size[None], pnt[:, None], vec[:, None])[0] >= 0
    lp, lv = _map(pos[None], mat[None], pnt[:, None], vec[:, None])   # (n, k, 3)
    b0, b1 = _normal_basis(lv)
    x, nrm = ray_triangle(jnp.asarray(tri, dtype)[None], lp[:, :, None], lv[:, :, None],
                          b0[:, :, None], b1[:, :, None])              # (n, k, fmax)
    x = jnp.where(jnp.asarray(valid)[None] & (x >= 0), x, jnp.inf)
    best = jnp.argmin(x, -1)                                           # first minimum
    xb = jnp.take_along_axis(x, best[..., None], -1)[..., 0]
    nb = jnp.take_along_axis(nrm, best[..., None, None], -2)[..., 0, :]
    hit = bound & jnp.isfinite(xb)
    normal = math.matvec(mat[None], nb)
    return jnp.where(hit, xb, -1.0), jnp.where(hit[..., None], normal, 0.0)


def _hfield_tables(m, hid):
    """Static data of height field ``hid``: (nrow, ncol, size (4,), elevations (nrow,
    ncol) as stored, per-cell corner heights (ncells, 4) scaled by size[2])."""
    nrow, ncol = int(np.asarray(m.hfield_nrow)[hid]), int(np.asarray(m.hfield_ncol)[hid])
    adr = int(np.asarray(m.hfield_adr)[hid])
    data = np.asarray(m.hfield_data, np.float64)[adr:adr + nrow * ncol].reshape(nrow, ncol)
    size = np.asarray(m.hfield_size, np.float64).reshape(-1, 4)[hid]
    z = data * size[2]
    # cell (r, c): corners (r, c), (r, c+1), (r+1, c+1), (r+1, c)
    cells = np.stack([z[:-1, :-1], z[:-1, 1:], z[1:, 1:], z[1:, :-1]], -1)
    return nrow, ncol, size, data, cells.reshape(-1, 4)


def _hfield_cells(nrow, ncol, dx, dy, size, lp, lv):
    """Candidate cells (r, c), each (..., K, 4), for a ray in the height field's frame.

    The ray's horizontal projection is cut into strips one cell wide across its dominant
    grid axis (K = max(nrow, ncol) - 1 strips); within a strip the other grid coordinate
    changes by at most one cell, so four cells per strip (one of padding on each side)
    hold every triangle the ray can cross. MuJoCo tests every cell of the ray's bounding
    rectangle instead; a hit lies in both sets, so the nearest hit is the same.
    """
    gx, gy = lv[..., 0] / dx, lv[..., 1] / dy
    x0, y0 = (lp[..., 0] + size[0]) / dx, (lp[..., 1] + size[1]) / dy
    xdom = jnp.abs(gx) >= jnp.abs(gy)
    ga, gb = jnp.where(xdom, gx, gy), jnp.where(xdom, gy, gx)
    u0, v0 = jnp.where(xdom, x0, y0), jnp.where(xdom, y0, x0)
    slope = jnp.where(ga != 0, gb / jnp.where(ga != 0, ga, 1.0), 0.0)
    k = max(nrow, ncol) - 1
    strip = jnp.arange(k, dtype=lp.dtype)
    va = v0[..., None] + (strip - u0[..., None]) * slope[..., None]
    lo = jnp.floor(jnp.minimum(va, va + slope[..., None])) - 1
    lo = jnp.clip(lo, -4, k + 4).astype(jnp.int32)              # (..., K)
    other = lo[..., None] + jnp.arange(4, dtype=jnp.int32)      # (..., K, 4)
    along = jnp.broadcast_to(jnp.arange(k, dtype=jnp.int32)[:, None], other.shape)
    xd = xdom[..., None, None]
    r = jnp.clip(jnp.where(xd, other, along), 0, nrow - 2)
    c = jnp.clip(jnp.where(xd, along, other), 0, ncol - 2)
    return r, c


def _hfield_triangles(tables, lp, lv):
    """Nearest triangle hit of local rays with a height field's surface: (x, local
    normal); ties go to the first triangle in MuJoCo's loop order (row, column, the
    two triangles of a cell)."""
    nrow, ncol, size, _, cells = tables
    dx, dy = (2.0 * size[0]) / (ncol - 1), (2.0 * size[1]) / (nrow - 1)
    r, c = _hfield_cells(nrow, ncol, dx, dy, size, lp, lv)
    h = jnp.asarray(cells, lp.dtype)[r * (ncol - 1) + c]           # (..., K, 4, 4)
    x0, x1 = dx * c - size[0], dx * (c + 1) - size[0]
    y0, y1 = dy * r - size[1], dy * (r + 1) - size[1]
    p00 = jnp.stack([x0, y0, h[..., 0]], -1)
    p01 = jnp.stack([x1, y0, h[..., 1]], -1)
    p11 = jnp.stack([x1, y1, h[..., 2]], -1)
    p10 = jnp.stack([x0, y1, h[..., 3]], -1)
    tri = jnp.stack([jnp.stack([p00, p01, p11], -2), jnp.stack([p00, p11, p10], -2)], -3)
    b0, b1 = _normal_basis(lv)
    ex = (slice(None),) * (lp.ndim - 1) + (None,) * 3
    xt, nt = ray_triangle(tri, lp[ex], lv[ex], b0[ex], b1[ex])      # (..., K, 4, 2)
    key = (r * ncol + c)[..., None] * 2 + jnp.arange(2, dtype=jnp.int32)
    lead = xt.shape[:-3]
    xt = jnp.where(xt >= 0, xt, jnp.inf).reshape(lead + (-1,))
    key = key.reshape(lead + (-1,))
    xmin = jnp.min(xt, -1)
    best = jnp.argmin(jnp.where(xt == xmin[..., None], key, jnp.iinfo(jnp.int32).max), -1)
    nbest = jnp.take_along_axis(nt.reshape(lead + (-1, 3)), best[..., None, None], -2)
    return xmin, nbest[..., 0, :]


def _hfield_sides(tables, lp, lv, faces, x, nloc):
    """The top box's four side faces where the ray passes below the field's boundary
    profile (mj_rayHfield's last loop): updated (x, local normal)."""
    nrow, ncol, size, data, _ = tables
    dx, dy = (2.0 * size[0]) / (ncol - 1), (2.0 * size[1]) / (nrow - 1)
    for i in range(4):
        a = faces[..., i]
        z = (lp[..., 2] + a * lv[..., 2]) / size[2]
        if i < 2:
            y = (lp[..., 1] + a * lv[..., 1] + size[1]) / dy
            y0 = jnp.clip(jnp.floor(y), 0, nrow - 2)
            edge = data[:, ncol - 1 if i == 1 else 0]
        else:
            y = (lp[..., 0] + a * lv[..., 0] + size[0]) / dx
            y0 = jnp.clip(jnp.floor(y), 0, ncol - 2)
            edge = data[nrow - 1 if i == 3 else 0, :]
        edge = jnp.asarray(edge, lp.dtype)
        j = y0.astype(jnp.int32)
        below = z < edge[j] * (y0 + 1 - y) + edge[j + 1] * (y - y0)
        upd = (a >= 0) & ((a < x) | (x < 0)) & below
        x = jnp.where(upd, a, x)
        n = jnp.zeros(3, lp.dtype).at[i // 2].set(1.0 if i % 2 else -1.0)
        nloc = jnp.where(upd[..., None], n, nloc)
    return x, nloc


def ray_hfield(tables, pos, mat, pnt, vec):
    """Ray against one height-field geom (mj_rayHfield): (x, world normal).

    tables: :func:`_hfield_tables` of its height field; pos (3,), mat (3, 3): the geom's
    pose; pnt, vec (..., 3) world rays. The field is the solid between its base box
    (size[3] below the geom frame) and the triangulated surface, walled by its four
    boundary profiles. Differentiable in the poses and rays through the face hit.
    """
    size = tables[2]
    dtype = pnt.dtype
    ez = mat[..., :, 2]
    base_size = jnp.asarray([size[0], size[1], size[3] * 0.5], dtype)
    top_size = jnp.asarray([size[0], size[1], size[2] * 0.5], dtype)
    x, _, nloc = _box_local(pos - ez * size[3] * 0.5, mat, base_size, pnt, vec)
    top, faces, _ = _box_local(pos + ez * size[2] * 0.5, mat, top_size, pnt, vec)
    lp, lv = _map(pos, mat, pnt, vec)
    xt, nt = _hfield_triangles(tables, lp, lv)
    upd = (top >= 0) & jnp.isfinite(xt) & ((x < 0) | (xt < x))
    x = jnp.where(upd, xt, x)
    nloc = jnp.where(upd[..., None], nt, nloc)
    faces = jnp.where((top >= 0)[..., None], faces, -1.0)
    x, nloc = _hfield_sides(tables, lp, lv, faces, x, nloc)
    return _finish(x, math.matvec(mat, nloc))


#: mj_raySdf's marching: at most 40 steps; a hit within 1e-7 of the surface; a miss
#: once a step exceeds 1e6
_SDF_STEPS, _SDF_HIT, _SDF_FAR = 40, 1e-7, 1e6


def _sdf_march(shape, params, size, lp, lvn):
    """Sphere tracing of one local ray (lp, unit lvn) (3,) against an SDF: (distance
    marched, hit). Not differentiated (its inputs are stopped)."""
    def body(_, carry):
        tot, state = carry
        dist = jnp.abs(sdf.distance(shape, lp + lvn * tot, size, params))
        run = state == 0
        tot = jnp.where(run, tot + dist, tot)
        state = jnp.where(run & (dist < _SDF_HIT), 1, jnp.where(run & (dist > _SDF_FAR), 2,
                                                                 state))
        return tot, state

    tot, state = inline.fori_loop(0, _SDF_STEPS, body,
                                  (jnp.zeros((), lp.dtype), jnp.zeros((), jnp.int32)))
    return tot, state == 1


def ray_sdf(shape, params, pos, mat, size, pnt, vec):
    """Ray against one SDF geom (mj_raySdf): (x, world normal), pnt and vec (n, 3).

    MuJoCo marches the unit direction (sphere tracing from the ray's origin, stepping
    by the absolute distance) and returns the length marched over |vec|. A ray whose
    bounding-box test (the geom's size) fails, or that does not reach the surface
    within 40 steps, misses. The derivative of x is
    the implicit one of the hit (the surface distance at the hit point held at zero),
    not that of the marching steps.
    """
    bound = ray_box(pos, mat, size, pnt, vec)[0] >= 0
    lp, lv = _map(pos, mat, pnt, vec)
    lvn, scale = math.normalize(lv)
    sg = jax.lax.stop_gradient
    tot, hit = jax.vmap(lambda a, b: _sdf_march(shape, params, sg(size), a, b))(
        sg(lp), sg(lvn))
    dist = jax.vmap(lambda x: sdf.distance(shape, x, size, params))
    grad = jax.vmap(lambda x: sdf.gradient(shape, x, size, params))
    at = lp + lvn * tot[:, None]
    f = dist(at)
    g = grad(sg(at))
    slope = math.dot(g, sg(lvn))
    slope = jnp.where(jnp.abs(slope) > MINVAL, slope, 1.0)
    x = (tot - (f - sg(f)) / slope) / scale
    return _finish(jnp.where(bound & hit, x, -1.0), math.matvec(mat, _normalize(g)))


def visible_geoms(m):
    """(ngeom,) bool: geoms mj_ray may hit (not made invisible by rgba / material)."""
    if m.ngeom == 0:
        return np.zeros(0, bool)
    rgba, matid = getattr(m, "geom_rgba", None), getattr(m, "geom_matid", None)
    if rgba is None or matid is None:
        raise UnsupportedFeatureError("ray casting without geom_rgba / geom_matid in Model")
    matid = np.asarray(matid).reshape(-1)
    alpha = np.asarray(rgba, np.float64).reshape(-1, 4)[:, 3]
    vis = alpha != 0
    if np.any(matid >= 0):
        mat_alpha = np.asarray(m.mat_rgba, np.float64).reshape(-1, 4)[:, 3]
        vis = np.where(matid >= 0, mat_alpha[np.maximum(matid, 0)] != 0, vis)
    return vis


def ray(m, d, pnt, vec, bodyexclude, geomgroup=None, flg_static=True):
    """Nearest intersection of rays with the model's geoms (mj_ray).

    pnt, vec: (n, 3) world ray origins and directions; bodyexclude: (n,) static body ids
    whose geoms each ray ignores (-1: none); geomgroup: None (every group) or six
    static flags, the geom groups the rays see (groups beyond 5 count as 5, below 0 as
    0); flg_static: whether geoms of static bodies (welded to the world) are seen.
    Geoms made invisible by rgba or material alpha are never seen. Returns (dist (n,),
    geomid (n,), normal (n, 3)); dist -1, geomid -1 and a zero normal where nothing is
    hit. Rangefinders use geomgroup=None, flg_static=True.
    """
    n = pnt.shape[0]
    dtype = pnt.dtype
    gtype = np.asarray(m.geom_type)
    vis = visible_geoms(m)
    if not flg_static:
        vis = vis & (np.asarray(m.body_weldid)[np.asarray(m.geom_bodyid)] != 0)
    if geomgroup is not None:
        group = np.clip(np.asarray(m.geom_group).reshape(-1), 0, 5)
        vis = vis & (np.asarray(geomgroup).reshape(-1)[group] != 0)
    gbody = np.asarray(m.geom_bodyid)
    bodyexclude = np.asarray(bodyexclude).reshape(n)
    size = jnp.asarray(m.geom_size, dtype)
    xs, ids, normals = [], [], []
    for t in sorted(set(gtype[vis].tolist())):
        geoms = np.nonzero(vis & (gtype == t))[0]
        pos, mat, sz = d.geom_xpos[geoms], d.geom_xmat[geoms], size[geoms]
        if t == GeomType.SDF:
            hits = [ray_sdf(sdf.shape_of(m, g), sdf.plugin_params(m, g), pos[j], mat[j],
                            sz[j], pnt, vec) for j, g in enumerate(geoms)]
            x = jnp.stack([h[0] for h in hits], 1)
            nrm = jnp.stack([h[1] for h in hits], 1)
        elif t == GeomType.MESH:
            x, nrm = ray_mesh(m, geoms, pos, mat, sz, pnt, vec)
        elif t == GeomType.HFIELD:
            dataid = np.asarray(m.geom_dataid)[geoms]
            hits = [ray_hfield(_hfield_tables(m, h), pos[j], mat[j], pnt, vec)
                    for j, h in enumerate(dataid)]
            x = jnp.stack([h[0] for h in hits], 1)
            nrm = jnp.stack([h[1] for h in hits], 1)
        else:
            x, nrm = PRIMITIVE[t](pos[None], mat[None], sz[None], pnt[:, None], vec[:, None])
        excl = gbody[geoms][None, :] == bodyexclude[:, None]
        xs.append(jnp.where(jnp.asarray(excl), -1.0, x))
        ids.append(geoms)
        normals.append(nrm)
    if not xs:
        return (-jnp.ones(n, dtype), -jnp.ones(n, jnp.int32), jnp.zeros((n, 3), dtype))
    order = np.argsort(np.concatenate(ids), kind="stable")     # geom-id order for ties
    x = jnp.concatenate(xs, 1)[:, order]
    gid = np.concatenate(ids)[order]
    nrm = jnp.concatenate(normals, 1)[:, order]
    xx = jnp.where(x >= 0, x, jnp.inf)
    best = jnp.argmin(xx, -1)
    xb = jnp.take_along_axis(xx, best[:, None], -1)[:, 0]
    hit = jnp.isfinite(xb)
    nb = jnp.take_along_axis(nrm, best[:, None, None], 1)[:, 0]
    return (jnp.where(hit, xb, -1.0), jnp.where(hit, jnp.asarray(gid, jnp.int32)[best], -1),
            jnp.where(hit[:, None], nb, 0.0))
