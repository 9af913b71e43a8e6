"""Contact-based sensors: touch and contact (MuJoCo's engine_sensor). Touch runs at the
acceleration stage; a contact sensor at the position, velocity or acceleration stage,
as its data fields need (forces: acceleration; linvel / angvel: velocity).

Both read the contact buffer ``d.contact`` (one slot per possible contact; a slot's
position in the buffer stands for MuJoCo's contact index) and the contact forces of
:func:`simjax.engine.rne_post.contact_force`. Every computation is vectorised over the
contact slots. Contacts involving flexes do not exist in simjax.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from simjax.engine import math
from simjax.engine import ray as ray_mod
from simjax.engine import rne_post
from simjax.engine import sensor as sen
from simjax.engine import tables
from simjax.types import ObjType

# contact sensor reductions (sensor_intprm[1])
REDUCE_NONE, REDUCE_MINDIST, REDUCE_MAXFORCE, REDUCE_NETFORCE = 0, 1, 2, 3


def touch(m, d, ids):
    """Touch sensors (k,): sum of positive normal contact forces on the site's body
    whose force ray, pointing into the body, passes through the site volume."""
    dtype = d.qpos.dtype
    if not rne_post.contacts_possible(m) or d.contact.dist.shape[0] == 0:
        return jnp.zeros(len(ids), dtype)
    site = np.asarray(m.sensor_objid).reshape(-1)[ids]
    body = np.asarray(m.site_bodyid)[site]
    con = d.contact
    frc = rne_post.contact_force(m, d)[:, 0]                         # (n,)
    b1, b2 = rne_post.contact_bodies(m, con)
    ok = con.valid & (con.efc_address >= 0) & (frc > 0)
    ray, _ = math.normalize(con.frame[:, 0] * frc[:, None])
    stype = np.asarray(m.site_type)[site]
    size = jnp.asarray(m.site_size, dtype)[site]

    def per_type(t, p):
        bb = jnp.asarray(body[p])[:, None]                                  # (kp, 1)
        involved = ok[None] & ((bb == b1[None]) | (bb == b2[None]))
        vec = jnp.where((bb == b2[None])[..., None], -ray[None], ray[None])
        s = site[p]
        x, _ = ray_mod.ray_geom(d.site_xpos[s][:, None], d.site_xmat[s][:, None],
                                size[p][:, None], con.pos[None], vec, t)
        return jnp.sum(jnp.where(involved & (x >= 0), frc[None], 0.0), -1)
    return sen._by_kind(stype, per_type)


def _check_match(m, body, geom, objtype, objid):
    """checkMatch of engine_sensor for one sensor object over all contact sides."""
    if objtype in (ObjType.UNKNOWN, ObjType.SITE):
        return jnp.ones(body.shape, bool)
    if objtype == ObjType.GEOM:
        return geom == objid
    if objtype == ObjType.BODY:
        return body == objid
    if objtype == ObjType.XBODY:           # body in the subtree of objid
        return jnp.asarray(tables.get(m).desc[objid] > 0)[body]
    return jnp.zeros(body.shape, bool)


def _match(m, d, t1, i1, t2, i2):
    """(matched (n,), flip (n,)) of every contact slot for one contact sensor
    (matchContact)."""
    con = d.contact
    n = con.dist.shape[0]
    if t1 == ObjType.UNKNOWN and t2 == ObjType.UNKNOWN:
        return con.valid, jnp.zeros(n, bool)
    ok = con.valid
    if t1 == ObjType.SITE:
        dtype = d.qpos.dtype
        size = jnp.asarray(m.site_size, dtype)[i1]
        ok = ok & sen.inside_geom(d.site_xpos[i1], d.site_xmat[i1], size,
                                  int(np.asarray(m.site_type)[i1]), con.pos)
    b1, b2 = rne_post.contact_bodies(m, con)
    g1, g2 = con.geom[:, 0], con.geom[:, 1]
    m11 = _check_match(m, b1, g1, t1, i1)
    m12 = _check_match(m, b2, g2, t1, i1)
    m21 = _check_match(m, b1, g1, t2, i2)
    m22 = _check_match(m, b2, g2, t2, i2)
    ok = ok & (m11 | m12) & (m21 | m22)
    if t1 != ObjType.UNKNOWN and t2 != ObjType.UNKNOWN:
        regular, reverse = m11 & m22, m12 & m21
        flip = reverse & ~regular
        ok = ok & (regular | reverse)
    elif t1 != ObjType.UNKNOWN:
        flip = ~m11
    else:
        flip = ~m22
    return ok, flip


def _velocity(m, d, idx):
    """Relative velocity of the contacts ``idx`` in their contact frames: geom2's body
    minus geom1's at the contact point, linear (k, 3) and angular (k, 3), from cvel
    (as MuJoCo 4.0's contact sensor linvel / angvel fields)."""
    con = d.contact
    b1, b2 = rne_post.contact_bodies(m, con)
    pos, frame = con.pos[idx], con.frame[idx]
    root = jnp.asarray(np.asarray(m.body_rootid), jnp.int32)

    def vel(b):
        b = b[idx]
        return math.transform_motion(d.cvel[b], pos, d.subtree_com[root[b]])
    rel = vel(b2) - vel(b1)
    return math.matvec(frame, rel[:, 3:]), math.matvec(frame, rel[:, :3])


def _slot_data(spec, found, frc, con, idx, flip, vel=None):
    """Per-slot outputs in mjtConDataField order for the contacts ``idx`` (``vel``: the
    linear and angular velocities of :func:`_velocity` when the fields ask for them)."""
    out = []
    sgn = jnp.where(flip, -1.0, 1.0)[:, None]
    zsgn = jnp.concatenate([jnp.ones_like(sgn), jnp.ones_like(sgn), sgn], -1)
    if spec & 1:
        out.append(jnp.broadcast_to(found, idx.shape)[:, None].astype(frc.dtype))
    if spec & 2:
        out.append(frc[idx, :3] * zsgn)
    if spec & 4:
        out.append(frc[idx, 3:] * zsgn)
    if spec & 8:
        out.append(con.dist[idx][:, None])
    if spec & 16:
        out.append(con.pos[idx])
    if spec & 32:
        out.append(con.frame[idx, 0] * sgn)
    if spec & 64:
        out.append(con.frame[idx, 1] * sgn)
    # velocities flip as forces do: the frame turned about its first tangent
    if spec & 128:
        out.append(vel[0] * zsgn)
    if spec & 256:
        out.append(vel[1] * zsgn)
    return jnp.concatenate(out, -1)


def _one_contact_sensor(m, d, i):
    dtype = d.qpos.dtype
    spec, reduce = (int(v) for v in np.asarray(m.sensor_intprm).reshape(-1, 3)[i, :2])
    size = sum(s for b, s in enumerate(sen.CONDATA_SIZE) if spec & (1 << b))
    dim = int(np.asarray(m.sensor_dim).reshape(-1)[i])
    num = dim // size
    con = d.contact
    n = con.dist.shape[0]
    if n == 0 or not rne_post.contacts_possible(m):
        return jnp.zeros(dim, dtype)
    ot, oi, rt, ri = (int(np.asarray(getattr(m, f)).reshape(-1)[i]) for f in
                      ("sensor_objtype", "sensor_objid", "sensor_reftype", "sensor_refid"))
    ok, flip = _match(m, d, ot, oi, rt, ri)
    nmatch = jnp.sum(ok)
    need_force = bool(spec & 6) or reduce in (REDUCE_MAXFORCE, REDUCE_NETFORCE)
    frc = rne_post.contact_force(m, d) if need_force else jnp.zeros((n, 6), dtype)
    if reduce == REDUCE_NETFORCE:
        wrench = jnp.where((ok & ~flip)[:, None], frc, jnp.where(ok[:, None], -frc, 0.0))
        weight = math.norm(wrench[:, :3])
        point = jnp.sum(weight[:, None] * con.pos, 0) / math.maximum(jnp.sum(weight), math.MINVAL)
        fw = math.matTvec(con.frame, wrench[:, :3])
        tw = math.matTvec(con.frame, wrench[:, 3:])
        force = jnp.sum(fw, 0)
        torque = jnp.sum(tw + math.cross(con.pos - point, fw), 0)
        out = []
        if spec & 1:
            out.append(nmatch.astype(dtype)[None])
        if spec & 2:
            out.append(force)
        if spec & 4:
            out.append(torque)
        if spec & 8:
            out.append(jnp.zeros(1, dtype))
        if spec & 16:
            out.append(point)
        if spec & 32:
            out.append(jnp.array([1.0, 0, 0], dtype))
        if spec & 64:
            out.append(jnp.array([0.0, 1, 0], dtype))
        first = jnp.concatenate(out)
        return jnp.concatenate([first, jnp.zeros(dim - size, dtype)])
    if reduce == REDUCE_MINDIST:
        crit = con.dist
    elif reduce == REDUCE_MAXFORCE:
        crit = -jnp.sum(frc[:, :3] ** 2, -1)
    else:
        crit = jnp.zeros(n, dtype)
    crit = jnp.where(ok, crit, jnp.inf)
    # stable sort in MuJoCo's contact order: ties go to the lower contact index
    from simjax.engine.collision import contact_order
    mj = contact_order(m, d)
    order = mj[jnp.argsort(crit[mj], stable=True)[:num]]
    if order.shape[0] < num:
        order = jnp.concatenate([order, jnp.zeros(num - order.shape[0], order.dtype)])
    used = jnp.arange(num) < jnp.minimum(nmatch, num)
    vel = _velocity(m, d, order) if spec & (128 | 256) else None
    vals = _slot_data(spec, nmatch, frc, con, order, flip[order], vel)
    return jnp.where(used[:, None], vals, 0.0).ravel()


def contact_sensor(m, d, ids):
    """Contact sensors: matching contacts, reduced and written slot by slot."""
    return jnp.concatenate([_one_contact_sensor(m, d, int(i)) for i in ids])
