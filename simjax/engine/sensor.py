"""Sensors (MuJoCo's engine_sensor: mj_sensorPos, mj_sensorVel, mj_sensorAcc). The
post-constraint RNE pass the acceleration sensors need (mj_rnePostConstraint) and the
contact forces (mj_contactForce) are in :mod:`simjax.engine.rne_post`.

Each stage computes the sensors whose ``sensor_needstage`` is that stage and writes
them into ``d.sensordata`` at ``sensor_adr``; other entries are left as they are, as in
MuJoCo. Sensors are grouped by (static) type and each group is computed vectorised
over its sensors, then scattered into sensordata with one static gather. Values follow
MuJoCo's definitions (frames, units and signs of mjtSensor's documentation);
``sensor_cutoff`` clamps REAL (both sides) and POSITIVE (above) data as MuJoCo does;
``sensor_noise`` is not applied (MuJoCo does not apply it either).

Quantities that live in the constraint solver (contact forces ``efc_force``, limit
rows ``efc_type``/``efc_id``/``efc_pos``/``efc_margin``/``efc_vel``) are read from Data
when it has them. Without them these sensors are exactly zero when the model's
constraints of that kind are disabled (MuJoCo then has no rows either) and otherwise
raise UnsupportedFeatureError. Contacts are read from ``d.contact`` (slot order stands
for MuJoCo's contact order).

User sensors read zero at their stage: MuJoCo clears them and leaves them to the
mjcb_sensor callback, which simjax does not have (none is installed by default).

Tactile sensors: :mod:`sensor_tactile`. Not supported (UnsupportedFeatureError at trace
time): history buffers of plugin sensors, rays against height fields and SDFs, geom distance
sensors between geom types other than plane, sphere and capsule. Plugin sensors are
computed stage by stage by :mod:`simjax.plugins.engine` after the built-in ones.
"""
from __future__ import annotations

import dataclasses
import hashlib

import jax.numpy as jnp
import numpy as np

from simjax.engine import history
from simjax.engine import math
from simjax.engine import ray as ray_mod
from simjax.engine import smooth
from simjax.engine import support
from simjax.engine import tables
from simjax.engine.rne_post import (CNSTR_LIMIT_JOINT, CNSTR_LIMIT_TENDON, efc_row, has_rows,
                                    rne_post_constraint, transform_force)
from simjax.errors import UnsupportedFeatureError
from simjax.types import (DataType, DisableBit, EnableBit, GeomType, ObjType, SensorType,
                          Stage, TrnType)

S = SensorType

#: mjtConDataField sizes (found, force, torque, dist, pos, normal, tangent, linvel, angvel)
CONDATA_SIZE = (1, 3, 3, 1, 3, 3, 3, 3, 3)
#: mjtRayDataField sizes (dist, dir, origin, point, normal, depth)
RAYDATA_SIZE = (1, 3, 3, 3, 3, 1)

_PLUGIN_HOOK = None


def set_plugin_hook(fn):
    """Replace the sensor-plugin computation (default:
    ``simjax.plugins.engine.compute_sensors``): ``fn(m, d, stage) -> d`` writes the
    sensordata of the plugin sensors whose needstage is ``stage`` (POS also runs plugins
    with needstage NONE), cutoff included. ``None`` restores the default."""
    global _PLUGIN_HOOK
    _PLUGIN_HOOK = fn


# --------------------------------------------------------------------------- plan
@dataclasses.dataclass(frozen=True, eq=False)
class _Plan:
    """Static per-stage grouping of sensors: stage -> tuple of (type, sensor ids)."""

    groups: dict
    plugin: dict          # stage -> sensor ids of plugin sensors


_CACHE: dict = {}
_UNSUPPORTED: dict = {}


def _key(m):
    names = ("sensor_type", "sensor_needstage", "sensor_objtype", "sensor_objid",
             "sensor_reftype", "sensor_refid", "sensor_intprm", "sensor_dim",
             "sensor_adr", "sensor_datatype", "sensor_history", "sensor_plugin")
    return (m.nsensor, m.nsensordata) + tuple(
        hashlib.sha1(np.ascontiguousarray(np.asarray(getattr(m, n))).tobytes()).hexdigest()
        for n in names)


def plan(m) -> _Plan:
    """Checked, cached grouping of the model's sensors by stage and type."""
    key = _key(m)
    p = _CACHE.get(key)
    if p is not None:
        return p
    stype = np.asarray(m.sensor_type).reshape(-1)
    stage = np.asarray(m.sensor_needstage).reshape(-1)
    hist = np.asarray(m.sensor_history).reshape(-1, 2) if m.nsensor else np.zeros((0, 2))
    bad = (hist[:, 0] > 0) & (stype == S.PLUGIN)
    if np.any(bad):
        raise UnsupportedFeatureError(
            f"history buffers (nsample/delay/interval) of plugin sensor "
            f"{int(np.nonzero(bad)[0][0])}")
    groups, plugin = {}, {}
    for st in (Stage.POS, Stage.VEL, Stage.ACC):
        ids_st = np.nonzero((stage == st) | ((stage == Stage.NONE) & (st == Stage.POS)))[0]
        # user sensors of stage none are never written (MuJoCo leaves them to the user)
        ids_st = ids_st[~((stype[ids_st] == S.USER) & (stage[ids_st] == Stage.NONE))]
        g = []
        for t in sorted(set(stype[ids_st].tolist())):
            ids = ids_st[stype[ids_st] == t]
            if t in _UNSUPPORTED:
                raise UnsupportedFeatureError(_UNSUPPORTED[t])
            if t == S.PLUGIN:
                plugin[st] = ids
                continue
            g.append((SensorType(t), ids))
        groups[st] = tuple(g)
    p = _CACHE[key] = _Plan(groups=groups, plugin=plugin)
    return p


# --------------------------------------------------------------------------- helpers
def _f(x, dtype):
    return jnp.asarray(x, dtype)


def _by_kind(kinds, fns):
    """Evaluate ``fns[kind](positions)`` per static kind and return rows in the
    original order (kinds: static (n,) array)."""
    kinds = np.asarray(kinds)
    parts, order = [], []
    for k in sorted(set(kinds.tolist())):
        pos = np.nonzero(kinds == k)[0]
        parts.append(fns(k, pos))
        order.append(pos)
    order = np.concatenate(order)
    inv = np.empty_like(order)
    inv[order] = np.arange(len(order))
    return math.take(jnp.concatenate(parts), inv)


def obj_body(m, objtype, objid):
    """Static body id of frame objects (XBODY, BODY, GEOM, SITE, CAMERA)."""
    objtype, objid = np.asarray(objtype), np.asarray(objid)
    out = objid.copy()
    for t, name in ((ObjType.GEOM, "geom_bodyid"), (ObjType.SITE, "site_bodyid"),
                    (ObjType.CAMERA, "cam_bodyid")):
        sel = objtype == t
        if sel.any():
            out[sel] = np.asarray(getattr(m, name))[objid[sel]]
    bad = ~np.isin(objtype, [ObjType.XBODY, ObjType.BODY, ObjType.GEOM, ObjType.SITE,
                             ObjType.CAMERA])
    if bad.any():
        raise UnsupportedFeatureError(f"sensor frame of object type {int(objtype[bad][0])}")
    return out


def _frame_arrays(d, t):
    return {ObjType.XBODY: (d.xpos, d.xmat), ObjType.BODY: (d.xipos, d.ximat),
            ObjType.GEOM: (d.geom_xpos, d.geom_xmat), ObjType.SITE: (d.site_xpos, d.site_xmat),
            ObjType.CAMERA: (d.cam_xpos, d.cam_xmat)}[t]


def obj_frame(m, d, objtype, objid):
    """World position (n, 3) and orientation (n, 3, 3) of frame objects
    (get_xpos_xmat of engine_sensor)."""
    objtype, objid = np.asarray(objtype), np.asarray(objid)
    obj_body(m, objtype, objid)                          # validates the types
    pos = _by_kind(objtype, lambda t, p: math.take(_frame_arrays(d, t)[0], objid[p]))
    mat = _by_kind(objtype, lambda t, p: math.take(_frame_arrays(d, t)[1], objid[p]))
    return pos, mat


def obj_quat(m, d, objtype, objid):
    """World orientation quaternions (n, 4) of frame objects (get_xquat)."""
    objtype, objid = np.asarray(objtype), np.asarray(objid)
    body = obj_body(m, objtype, objid)
    dtype = d.qpos.dtype
    local = {ObjType.BODY: "body_iquat", ObjType.GEOM: "geom_quat", ObjType.SITE: "site_quat",
             ObjType.CAMERA: "cam_quat"}

    def fn(t, p):
        q = math.take(d.xquat, body[p])
        if t == ObjType.XBODY:
            return q
        return math.quat_mul(q, math.take(_f(getattr(m, local[t]), dtype), objid[p]))
    return _by_kind(objtype, fn)


def _ref(objtype, objid, reftype, refid):
    """Reference frames with refid -1 replaced by the world body frame (identity pose,
    zero velocity): every formula below then reduces exactly to the global one."""
    refid = np.asarray(refid)
    none = refid < 0
    return (np.where(none, ObjType.XBODY, reftype), np.where(none, 0, refid))


def _static_body(m, bodies):
    return np.asarray(m.body_dofnum)[np.asarray(m.body_weldid)[bodies]] == 0


def obj_velocity(m, d, objtype, objid, local):
    """6D velocity (n, 6, rot:lin) at frame objects (mj_objectVelocity), in the object
    frame if ``local`` else world axes."""
    body = obj_body(m, objtype, objid)
    pos, mat = obj_frame(m, d, objtype, objid)
    return support.object_velocity(m, d, body, pos, mat if local else None)


def obj_acceleration(m, d, objtype, objid, local):
    """6D acceleration (n, 6, rot:lin) at frame objects (mj_objectAcceleration) from
    ``d.cacc``, with the Coriolis correction of the moving frame."""
    body = obj_body(m, objtype, objid)
    pos, mat = obj_frame(m, d, objtype, objid)
    rot = mat if local else None
    root = np.asarray(m.body_rootid)[body]
    com = math.take(d.subtree_com, root)
    acc = math.transform_motion(math.take(d.cacc, body), pos, com, rot)
    vel = math.transform_motion(math.take(d.cvel, body), pos, com, rot)
    # MuJoCo 4.0 reports the acceleration of dof-less (static, mocap) bodies too: the
    # world's -gravity, seen by an accelerometer on the world as +g up
    if not _CONCAT_LIN:
        return acc.at[:, 3:].add(math.cross(vel[:, :3], vel[:, 3:]))
    lin = acc[:, 3:] + math.cross(vel[:, :3], vel[:, 3:])
    # a concatenation (``.at[:, 3:].add`` is a scatter: a loop of its own on XLA CPU,
    # after whose expansion the simplification passes run over the program again)
    return jnp.concatenate([acc[:, :3], lin], axis=1)


#: whether :func:`obj_acceleration` adds the Coriolis term by a concatenation (read at
#: trace time; False: ``.at[:, 3:].add``, a scatter, kept to compare)
_CONCAT_LIN = True


def inside_geom(pos, mat, size, gtype, point):
    """Whether points are strictly inside primitive geoms of static type ``gtype``
    (mju_insideGeom); returns a bool array."""
    vec = point - pos
    if gtype == GeomType.SPHERE:
        return math.dot(vec, vec) < size[..., 0] ** 2
    p = math.matTvec(mat, vec)
    x, y, z = p[..., 0], p[..., 1], p[..., 2]
    if gtype == GeomType.CAPSULE:
        zc = jnp.clip(z, -size[..., 1], size[..., 1])
        return x * x + y * y + (z - zc) ** 2 < size[..., 0] ** 2
    if gtype == GeomType.ELLIPSOID:
        return jnp.sum((p / size) ** 2, -1) < 1
    if gtype == GeomType.CYLINDER:
        return (jnp.abs(z) < size[..., 1]) & (x * x + y * y < size[..., 0] ** 2)
    if gtype == GeomType.BOX:
        return jnp.all(jnp.abs(p) < size, -1)
    if gtype == GeomType.PLANE:
        return z < 0
    return jnp.zeros(z.shape, bool)


# --------------------------------------------------------------------------- limits
def _limit(m, d, ids, tendon, field):
    """Joint/tendon limit sensor values: efc ``field`` of the limit row (0 if none)."""
    dtype = d.qpos.dtype
    limited = np.asarray(m.tendon_limited if tendon else m.jnt_limited).reshape(-1)[ids]
    off = m.opt.disableflags & (DisableBit.CONSTRAINT | DisableBit.LIMIT)
    if off or not limited.any():
        return jnp.zeros(len(ids), dtype)
    if not has_rows(d):
        raise UnsupportedFeatureError(
            f"{'tendon' if tendon else 'joint'} limit sensors with limit constraints "
            "(Data has no efc rows)")
    row, found = efc_row(d, CNSTR_LIMIT_TENDON if tendon else CNSTR_LIMIT_JOINT, ids)
    if field == "pos":
        val = d.efc_pos[row] - d.efc_margin[row]
    else:
        val = getattr(d, "efc_" + field)[row]
    return math.where(found, val, 0.0)


# --------------------------------------------------------------------------- pos stage
def _cols(m, ids):
    g = lambda n: np.asarray(getattr(m, n)).reshape(-1)[ids]
    return (g("sensor_objtype"), g("sensor_objid"), g("sensor_reftype"), g("sensor_refid"))


def _frame_sensor(m, d, t, ids):
    ot, oi, rt, ri = _cols(m, ids)
    rt, ri = _ref(ot, oi, rt, ri)
    if t == S.FRAMEQUAT:
        q = obj_quat(m, d, ot, oi)
        qr = obj_quat(m, d, rt, ri)
        return math.quat_mul(math.quat_neg(qr), q)
    pos, mat = obj_frame(m, d, ot, oi)
    rpos, rmat = obj_frame(m, d, rt, ri)
    if t == S.FRAMEPOS:
        return math.matTvec(rmat, pos - rpos)
    axis = mat[:, :, int(t) - int(S.FRAMEXAXIS)]
    return math.matTvec(rmat, axis)


def _focal_from_sensor(m, cam):
    """(n, 4) focal lengths and principal point in pixels (fx, fy, cx, cy) of cameras
    with a sensor size, NaN for fovy cameras. MuJoCo computes them from its float32
    intrinsics in float32 arithmetic; so does this (exact agreement)."""
    cam = np.atleast_1d(cam)
    f32 = np.float32
    res = np.asarray(m.cam_resolution).reshape(-1, 2)[cam].astype(f32)
    intr = np.asarray(m.cam_intrinsic).reshape(-1, 4)[cam].astype(f32)
    ssize = np.asarray(m.cam_sensorsize).reshape(-1, 2)[cam].astype(f32)
    has = (ssize[:, 0] != 0) & (ssize[:, 1] != 0)
    safe = np.where(has[:, None], ssize, f32(1))
    out = np.stack([intr[:, 0] / safe[:, 0] * res[:, 0], intr[:, 1] / safe[:, 1] * res[:, 1],
                    intr[:, 2] / safe[:, 0] * res[:, 0], intr[:, 3] / safe[:, 1] * res[:, 1]],
                   -1).astype(np.float64)
    return np.where(has[:, None], out, np.nan)


def _camprojection(m, d, ids):
    _, site, _, cam = _cols(m, ids)
    dtype = d.qpos.dtype
    res = np.asarray(m.cam_resolution).reshape(-1, 2)[cam].astype(np.float64)
    fxy = _focal_from_sensor(m, cam)
    fovy = _f(m.cam_fovy, dtype).reshape(-1)[cam]
    has = ~np.isnan(fxy[:, 0])
    fpix = 0.5 / jnp.tan(fovy * np.pi / 360.0) * res[:, 1]
    fx = math.where(has, np.nan_to_num(fxy[:, 0]), fpix)
    fy = math.where(has, np.nan_to_num(fxy[:, 1]), fpix)
    p = math.matTvec(d.cam_xmat[cam], d.site_xpos[site] - d.cam_xpos[cam])
    z = p[:, 2]
    small = jnp.abs(z) < math.MINVAL
    z = math.where(small, math.where(z < 0, -math.MINVAL, math.MINVAL), z)
    return jnp.stack([-fx * p[:, 0] / z + 0.5 * res[:, 0], fy * p[:, 1] / z + 0.5 * res[:, 1]], -1)


def _raydata(spec, dist, origin, direction, normal, cam_pos=None, cam_z=None):
    """Rangefinder outputs per ray in mjtRayDataField order (fill_raydata)."""
    hit = dist >= 0
    out = []
    if spec & 1:
        out.append(dist[:, None])
    if spec & 2:
        out.append(math.where(hit[:, None], direction, 0.0))
    if spec & 4:
        out.append(jnp.broadcast_to(origin, direction.shape))
    point = math.where(hit[:, None], origin + dist[:, None] * direction, 0.0)
    if spec & 8:
        out.append(point)
    if spec & 16:
        out.append(math.where(hit[:, None], normal, 0.0))
    if spec & 32:
        depth = dist if cam_z is None else -math.dot(point - cam_pos, cam_z)
        out.append(math.where(hit, depth, -1.0)[:, None])
    return jnp.concatenate(out, -1).ravel()


def _cam_rays(m, d, cam):
    """Pixel ray origins and directions (npixel, 3) of a camera (mju_camPixelRay)."""
    dtype = d.qpos.dtype
    w, h = (int(v) for v in np.asarray(m.cam_resolution).reshape(-1, 2)[cam])
    proj = int(np.asarray(m.cam_projection).reshape(-1)[cam])
    fxy = _focal_from_sensor(m, cam)[0]
    fovy = _f(m.cam_fovy, dtype).reshape(-1)[cam]
    if proj == 0 and not np.isnan(fxy[0]):
        fx, fy, cx, cy = fxy
    elif proj == 0:
        fx = fy = 0.5 / jnp.tan(fovy * np.pi / 360.0) * h
        cx, cy = w / 2.0, h / 2.0
    else:
        fx, fy = w / 2.0, h / 2.0
        cx, cy = fx, fy
    row, col = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    px = col.ravel() + 0.5 - cx
    py = row.ravel() + 0.5 - cy
    pos, mat = d.cam_xpos[cam], d.cam_xmat[cam]
    if proj == 0:
        dcam = jnp.stack([px / fx, -py / fy, -jnp.ones(px.shape, dtype)], -1)
        vec, _ = math.normalize(dcam @ mat.T)
        return jnp.broadcast_to(pos, vec.shape), vec
    half = fovy / 2
    off = jnp.stack([px / fx * half, -py / fy * half, jnp.zeros(px.shape, dtype)], -1)
    origin = pos + off @ mat.T
    return origin, jnp.broadcast_to(-mat[:, 2], origin.shape)


def _rangefinder(m, d, ids):
    """Rangefinders: all rays of all sensors (site rays, camera pixels) are cast in one
    batched mj_ray, then each sensor formats its data fields."""
    ot, oi, _, _ = _cols(m, ids)
    spec = np.asarray(m.sensor_intprm).reshape(-1, 3)[ids, 0]
    origins, vecs, excl, cams, counts = [], [], [], [], []
    for i in range(len(ids)):
        if ot[i] == ObjType.SITE:
            s = int(oi[i])
            origins.append(d.site_xpos[s][None])
            vecs.append(d.site_xmat[s][None, :, 2])
            excl.append([np.asarray(m.site_bodyid)[s]])
            cams.append(None)
        elif ot[i] == ObjType.CAMERA:
            cam = int(oi[i])
            o, v = _cam_rays(m, d, cam)
            origins.append(o)
            vecs.append(v)
            excl.append(np.full(o.shape[0], np.asarray(m.cam_bodyid)[cam]))
            cams.append(cam)
        else:
            raise UnsupportedFeatureError(f"rangefinder on object type {int(ot[i])}")
        counts.append(origins[-1].shape[0])
    origin, vec = jnp.concatenate(origins), jnp.concatenate(vecs)
    dist, _, normal = ray_mod.ray(m, d, origin, vec, np.concatenate(excl))
    out, k = [], 0
    for i, n in enumerate(counts):
        sl = slice(k, k + n)
        cam = cams[i]
        extra = () if cam is None else (d.cam_xpos[cam], d.cam_xmat[cam][:, 2])
        out.append(_raydata(int(spec[i]), dist[sl], origin[sl], vec[sl], normal[sl], *extra))
        k += n
    return jnp.concatenate(out)


def _insidesite(m, d, ids):
    ot, oi, _, site = _cols(m, ids)
    dtype = d.qpos.dtype
    pos, _ = obj_frame(m, d, ot, oi)
    body = (ot == ObjType.BODY) & (oi > 0)
    if body.any():
        # massless bodies carrying mass below them use their subtree com
        mass = _f(m.body_mass, dtype)[oi]
        smass = smooth.subtree_mass(m, dtype)[oi]
        use = jnp.asarray(body) & (mass < math.MINVAL) & (smass >= math.MINVAL)
        pos = math.where(use[:, None], d.subtree_com[oi], pos)
    stype = np.asarray(m.site_type)[site]
    size = _f(m.site_size, dtype)[site]

    def fn(t, p):
        return inside_geom(d.site_xpos[site[p]], d.site_xmat[site[p]], size[p], t, pos[p])
    return _by_kind(stype, fn).astype(dtype)


def _user(m, ids, dtype):
    """User sensors: zeros (MuJoCo zeroes them at their stage before mjcb_sensor)."""
    n = int(np.asarray(m.sensor_dim).reshape(-1)[ids].sum())
    return jnp.zeros(n, dtype)


def _pos_values(m, d, t, ids):
    if t == S.USER:
        return _user(m, ids, d.qpos.dtype)
    dtype = d.qpos.dtype
    ot, oi, _, _ = _cols(m, ids)
    if t == S.MAGNETOMETER:
        return math.matTvec(d.site_xmat[oi], _f(m.opt.magnetic, dtype).reshape(3))
    if t == S.CAMPROJECTION:
        return _camprojection(m, d, ids)
    if t == S.RANGEFINDER:
        return _rangefinder(m, d, ids)
    if t == S.JOINTPOS:
        return math.take(d.qpos, np.asarray(m.jnt_qposadr)[oi])
    if t == S.TENDONPOS:
        return d.ten_length[oi]
    if t == S.ACTUATORPOS:
        return d.actuator_length[_out_index(m, ids)]
    if t == S.BALLQUAT:
        adr = np.asarray(m.jnt_qposadr)[oi]
        return math.quat_normalize(d.qpos[adr[:, None] + np.arange(4)])
    if t == S.JOINTLIMITPOS:
        return _limit(m, d, oi, False, "pos")
    if t == S.TENDONLIMITPOS:
        return _limit(m, d, oi, True, "pos")
    if t in (S.FRAMEPOS, S.FRAMEQUAT, S.FRAMEXAXIS, S.FRAMEYAXIS, S.FRAMEZAXIS):
        return _frame_sensor(m, d, t, ids)
    if t == S.SUBTREECOM:
        return d.subtree_com[oi]
    if t == S.INSIDESITE:
        return _insidesite(m, d, ids)
    if t == S.E_POTENTIAL:
        return jnp.broadcast_to(support.energy_pos(m, d), (len(ids),))
    if t == S.E_KINETIC:
        if m.opt.enableflags & EnableBit.ENERGY:
            # MuJoCo evaluates this lazily: with energy enabled its flag is still set from
            # the previous forward (cleared only by the velocity stage), so the sensor
            # reports the kinetic energy already in Data, i.e. of the previous call
            return jnp.broadcast_to(d.energy[1].astype(dtype), (len(ids),))
        return jnp.broadcast_to(support.energy_vel(m, d), (len(ids),))
    if t == S.CLOCK:
        return jnp.broadcast_to(d.time.astype(dtype), (len(ids),))
    if t == S.CONTACT:
        # MuJoCo 4.0 computes contact sensors that need no forces at the position stage
        from simjax.engine import sensor_contact
        return sensor_contact.contact_sensor(m, d, ids)
    raise UnsupportedFeatureError(f"sensor type {t.name.lower()} at the position stage")


def _out_index(m, ids):
    """Flat actuator-output indices of actuator sensors (one per output)."""
    oi = np.asarray(m.sensor_objid).reshape(-1)[ids]
    dim = np.asarray(m.sensor_dim).reshape(-1)[ids]
    adr = np.asarray(m.actuator_outadr).reshape(-1)[oi]
    return np.concatenate([a + np.arange(n) for a, n in zip(adr, dim)])


# --------------------------------------------------------------------------- vel stage
def _frame_vel(m, d, t, ids):
    ot, oi, rt, ri = _cols(m, ids)
    rt, ri = _ref(ot, oi, rt, ri)
    vel = obj_velocity(m, d, ot, oi, False)
    pos, _ = obj_frame(m, d, ot, oi)
    rpos, rmat = obj_frame(m, d, rt, ri)
    rvel = obj_velocity(m, d, rt, ri, False)
    rel = vel - rvel
    lin = rel[:, 3:] + math.cross(pos - rpos, rvel[:, :3])
    if t == S.FRAMELINVEL:
        return math.matTvec(rmat, lin)
    return math.matTvec(rmat, rel[:, :3])


def _vel_values(m, d, t, ids):
    if t == S.USER:
        return _user(m, ids, d.qpos.dtype)
    ot, oi, _, _ = _cols(m, ids)
    if t in (S.VELOCIMETER, S.GYRO):
        vel = obj_velocity(m, d, ot, oi, True)
        return vel[:, 3:] if t == S.VELOCIMETER else vel[:, :3]
    if t == S.JOINTVEL:
        return math.take(d.qvel, np.asarray(m.jnt_dofadr)[oi])
    if t == S.TENDONVEL:
        return d.ten_velocity[oi]
    if t == S.ACTUATORVEL:
        return d.actuator_velocity[_out_index(m, ids)]
    if t == S.BALLANGVEL:
        return d.qvel[np.asarray(m.jnt_dofadr)[oi][:, None] + np.arange(3)]
    if t == S.JOINTLIMITVEL:
        return _limit(m, d, oi, False, "vel")
    if t == S.TENDONLIMITVEL:
        return _limit(m, d, oi, True, "vel")
    if t in (S.FRAMELINVEL, S.FRAMEANGVEL):
        return _frame_vel(m, d, t, ids)
    if t == S.SUBTREELINVEL:
        return d.subtree_linvel[oi]
    if t == S.SUBTREEANGMOM:
        return d.subtree_angmom[oi]
    if t == S.TACTILE:
        from simjax.engine import sensor_tactile
        return sensor_tactile.tactile(m, d, ids)
    if t == S.CONTACT:
        from simjax.engine import sensor_contact
        return sensor_contact.contact_sensor(m, d, ids)
    raise UnsupportedFeatureError(f"sensor type {t.name.lower()} at the velocity stage")


# --------------------------------------------------------------------------- acc stage
def _site_force(m, d, oi):
    body = np.asarray(m.site_bodyid)[oi]
    root = np.asarray(m.body_rootid)[body]
    return transform_force(d.cfrc_int[body], d.site_xpos[oi], d.subtree_com[root],
                           d.site_xmat[oi])


def _acc_values(m, d, t, ids):
    if t == S.USER:
        return _user(m, ids, d.qpos.dtype)
    ot, oi, _, _ = _cols(m, ids)
    dtype = d.qpos.dtype
    if t == S.TOUCH:
        from simjax.engine import sensor_contact
        return sensor_contact.touch(m, d, ids)
    if t == S.CONTACT:
        from simjax.engine import sensor_contact
        return sensor_contact.contact_sensor(m, d, ids)
    if t == S.ACCELEROMETER:
        return obj_acceleration(m, d, ot, oi, True)[:, 3:]
    if t in (S.FORCE, S.TORQUE):
        w = _site_force(m, d, oi)
        return w[:, 3:] if t == S.FORCE else w[:, :3]
    if t == S.ACTUATORFRC:
        return d.actuator_force[_out_index(m, ids)]
    if t == S.JOINTACTFRC:
        return d.qfrc_actuator[np.asarray(m.jnt_dofadr)[oi]]
    if t == S.TENDONACTFRC:
        sel = np.zeros((len(ids), m.nout))
        if m.nactuator:
            trn = np.asarray(m.actuator_trntype).reshape(-1)
            tid = np.asarray(m.actuator_trnid).reshape(-1, 2)[:, 0]
            outadr = np.asarray(m.actuator_outadr).reshape(-1)
            for r, ten in enumerate(oi):
                for a in np.nonzero((trn == TrnType.TENDON) & (tid == ten))[0]:
                    sel[r, outadr[a]] += 1.0
            return jnp.asarray(sel, dtype) @ d.actuator_force
        return jnp.zeros(len(ids), dtype)
    if t == S.JOINTLIMITFRC:
        return _limit(m, d, oi, False, "force")
    if t == S.TENDONLIMITFRC:
        return _limit(m, d, oi, True, "force")
    if t in (S.FRAMELINACC, S.FRAMEANGACC):
        acc = obj_acceleration(m, d, ot, oi, False)
        return acc[:, 3:] if t == S.FRAMELINACC else acc[:, :3]
    raise UnsupportedFeatureError(f"sensor type {t.name.lower()} at the acceleration stage")


_NEEDS_RNEPOST = (S.ACCELEROMETER, S.FORCE, S.TORQUE, S.FRAMELINACC, S.FRAMEANGACC)
_NEEDS_SUBTREEVEL = (S.SUBTREELINVEL, S.SUBTREEANGMOM)


# --------------------------------------------------------------------------- assembly
#: sensor_cutoff applied with bounds made in NumPy where the cutoffs are model constants
#: (as usual; none at all where every cutoff is zero, MuJoCo's default), else in the
#: program (False: always in the program, kept to compare). XLA does not fold the
#: program's version: barkour's bench rollout (27 sensors, no cutoff) compiled 665
#: kernels against 675 (and 690 with the former jnp.repeat).
_CUT_STATIC = True


def _cutoff_static(cut, real, positive, vals):
    """apply_cutoff with ``cut`` (per value, NumPy): min(max(v, lo), hi), the bounds
    -cut / cut where a cutoff applies (jnp.clip's and jnp.minimum's operations), else
    -inf / inf, which leave every value (NaN too) as it is."""
    cut = cut.astype(vals.dtype)
    on = cut > 0
    lo = np.where(on & real, -cut, -np.inf).astype(vals.dtype)
    hi = np.where(on & (real | positive), cut, np.inf).astype(vals.dtype)
    if np.all(lo == -np.inf) and np.all(hi == np.inf):
        return vals
    return math.minimum(math.maximum(vals, lo), hi)


def _cutoff(m, ids, vals, dtype):
    """Apply sensor_cutoff to the flat values of sensors ``ids`` (apply_cutoff)."""
    stype = np.asarray(m.sensor_type).reshape(-1)[ids]
    dim = np.asarray(m.sensor_dim).reshape(-1)[ids]
    dtp = np.asarray(m.sensor_datatype).reshape(-1)[ids]
    skip = np.isin(stype, [S.CONTACT, S.GEOMFROMTO])
    real = np.repeat((dtp == DataType.REAL) & ~skip, dim)
    positive = np.repeat((dtp == DataType.POSITIVE) & ~skip, dim)
    if not (real.any() or positive.any()):
        return vals
    cutoff = tables.concrete(m.sensor_cutoff) if _CUT_STATIC else None
    if cutoff is not None:
        return _cutoff_static(cutoff.reshape(-1)[np.repeat(ids, dim)], real, positive, vals)
    # traced cutoffs: gathered at static indices (jnp.repeat with per-sensor counts
    # traces to a scatter-add and a cumulative sum: on barkour 15 kernels more)
    cut = _f(m.sensor_cutoff, dtype).reshape(-1)[np.repeat(ids, dim)]
    on = cut > 0
    clipped = math.where(real, math.clip_as_jnp(vals, -cut, cut),
                         math.where(positive, math.minimum(cut, vals), vals))
    return math.where(on, clipped, vals)


def _write(m, d, ids, vals):
    """sensordata with the flat values of sensors ``ids`` written at their addresses."""
    adr = np.asarray(m.sensor_adr).reshape(-1)[ids]
    dim = np.asarray(m.sensor_dim).reshape(-1)[ids]
    idx = np.concatenate([a + np.arange(n) for a, n in zip(adr, dim)])
    n = m.nsensordata
    src = np.arange(len(idx), len(idx) + n)
    src[idx] = np.arange(len(idx))
    return math.take(jnp.concatenate([vals.astype(d.sensordata.dtype), d.sensordata]), src)


def _geom_distances(m, d, groups):
    """{type: values} of the stage's geom distance sensors, the three types' geom pairs
    measured together (sensor_geom.geom_distance_groups); {} without them."""
    from simjax.engine import sensor_geom
    geom = [(t, ids) for t, ids in groups if t in sensor_geom.TYPES]
    return sensor_geom.geom_distance_groups(m, d, geom) if geom else {}


def _stage(m, d, stage, values_fn):
    if m.opt.disableflags & DisableBit.SENSOR or not m.nsensor:
        return d
    p = plan(m)
    dtype = d.qpos.dtype
    ids_all, vals_all = [], []
    ready = _geom_distances(m, d, p.groups[stage])
    for t, ids in p.groups[stage]:
        vals = ready[t] if t in ready else values_fn(m, d, t, ids)
        vals = vals.reshape(-1).astype(dtype)
        ids_all.append(ids)
        vals_all.append(_cutoff(m, ids, vals, dtype))
    if ids_all:
        ids_cat, vals_cat = np.concatenate(ids_all), jnp.concatenate(vals_all)
        # delayed and not-due interval sensors report their history buffers
        vals_cat = history.sensor_read(m, d, ids_cat, vals_cat)
        d = d.replace(sensordata=_write(m, d, ids_cat, vals_cat))
    plug = p.plugin.get(stage)
    if plug is not None and len(plug):
        # plugin sensors of this stage run after the built-in ones, as in MuJoCo; the
        # plugin engine applies their cutoff
        if _PLUGIN_HOOK is not None:
            d = _PLUGIN_HOOK(m, d, stage)
        else:
            from simjax.plugins import engine as plugin_engine
            d = plugin_engine.compute_sensors(m, d, stage)
    return d


def _stage_types(m, stage):
    if m.opt.disableflags & DisableBit.SENSOR or not m.nsensor:
        return set()
    p = plan(m)
    out = {t for t, _ in p.groups[stage]}
    if p.plugin.get(stage) is not None:
        out.add(S.PLUGIN)
    return out


def sensor_pos(m, d):
    """Position-dependent sensors (mj_sensorPos): needs the position stage."""
    return _stage(m, d, Stage.POS, _pos_values)


def sensor_vel(m, d):
    """Velocity-dependent sensors (mj_sensorVel): needs the velocity stage. Computes
    subtree_linvel / subtree_angmom (mj_subtreeVel) when a sensor needs them."""
    types = _stage_types(m, Stage.VEL)
    if types & {*_NEEDS_SUBTREEVEL, S.PLUGIN}:
        d = smooth.subtree_vel(m, d)
    return _stage(m, d, Stage.VEL, _vel_values)


def sensor_acc(m, d):
    """Acceleration/force-dependent sensors (mj_sensorAcc): needs qacc and the
    constraint forces. Runs :func:`rne_post_constraint` (cacc, cfrc_int, cfrc_ext) when
    a sensor needs it."""
    types = _stage_types(m, Stage.ACC)
    if types & {*_NEEDS_RNEPOST, S.PLUGIN}:
        d = rne_post_constraint(m, d)
    return _stage(m, d, Stage.ACC, _acc_values)


def compute(m, d, ids):
    """Freshly computed flat values (cutoff applied) of the sensors ``ids`` (static,
    built-in types), in that order, ignoring their history buffers (mj_computeSensor).
    Subtree velocities and the post-constraint RNE are recomputed when these sensors
    need them, from the kinematics, velocities and accelerations in ``d``."""
    ids = np.asarray(ids)
    stype = np.asarray(m.sensor_type).reshape(-1)
    stage = np.asarray(m.sensor_needstage).reshape(-1)
    dtype = d.qpos.dtype
    parts, order = [], []
    for st, fn in ((Stage.POS, _pos_values), (Stage.VEL, _vel_values),
                   (Stage.ACC, _acc_values)):
        sel = ids[(stage[ids] == st) | ((stage[ids] == Stage.NONE) & (st == Stage.POS))]
        types = set(stype[sel].tolist())
        if st == Stage.VEL and types & set(_NEEDS_SUBTREEVEL):
            d = smooth.subtree_vel(m, d)
        if st == Stage.ACC and types & set(_NEEDS_RNEPOST):
            d = rne_post_constraint(m, d)
        groups = [(SensorType(t), sel[stype[sel] == t]) for t in sorted(types)]
        ready = _geom_distances(m, d, groups)
        for t, tids in groups:
            vals = ready[t] if t in ready else fn(m, d, t, tids)
            vals = vals.reshape(-1).astype(dtype)
            parts.append(_cutoff(m, tids, vals, dtype))
            order.append(tids)
    if not parts:
        return jnp.zeros(0, dtype)
    order = np.concatenate(order)
    dims = np.asarray(m.sensor_dim).reshape(-1)
    flat = jnp.concatenate(parts)
    start = dict(zip(order.tolist(), np.concatenate([[0], np.cumsum(dims[order])[:-1]])))
    idx = np.concatenate([start[int(s)] + np.arange(dims[s]) for s in ids])
    return flat[idx]
