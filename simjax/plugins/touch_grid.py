"""``mujoco.sensor.touch_grid``: a tactile grid on a site (MuJoCo's
plugin/sensor/touch_grid.cc; semantics in its README).

Contacts of the site's (welded) body are binned by the direction of the contact point
seen from the site, in spherical coordinates (azimuth ``atan2(x, -z)``, elevation
``atan2(y, sqrt(x^2 + z^2))`` in the site frame) on a ``size[0] x size[1]`` grid
spanning ``fov`` degrees, optionally foveated (bin edges ``g e^5 + (1 - g) e`` with
``g = gamma``). Each of ``nchannel`` (1..6) channels sums one component of the contact
force/torque in the site frame: normal (site z), tangential (site x, site y), then the
torques in the same order; forces are those the site's body receives. Output:
(nchannel, size[1], size[0]) flattened, channel-major. Stage: acceleration.

Contact forces come from the constraint solution (``Data.efc_force`` at each contact's
``efc_address``, decoded as mj_contactForce does for pyramidal and elliptic cones).
"""
from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from simjax.errors import UnsupportedFeatureError
from simjax.plugins.protocol import Capability, Plugin
from simjax.types import ConeType, ObjType, Stage


def _strtod(text):
    """C strtod on the longest numeric prefix (0 when there is none)."""
    import re
    m = re.match(r"\s*[+-]?(\d+\.?\d*([eE][+-]?\d+)?|\.\d+([eE][+-]?\d+)?|inf|nan)", text,
                 re.IGNORECASE)
    return float(m.group(0)) if m else 0.0


def _check_number(text):
    t = "".join(text.split())
    if not t:
        return True
    try:
        float(t)
        return True
    except ValueError:
        return False


def _read_vector(text):
    """Values of a ' '-separated list as MuJoCo's reader splits it (std::getline)."""
    items = text.split(" ")
    if text == "" or text.endswith(" "):
        items = items[:-1]
    return [_strtod(s) for s in items]


def _config(inst):
    """(nchannel, size (2,), fov (2,) degrees, gamma) with TouchGrid::Create's checks."""
    cfg = inst.config
    if not (_check_number(cfg.get("gamma", "")) and _check_number(cfg.get("nchannel", ""))):
        raise ValueError("Invalid or missing parameters in touch_grid sensor plugin")
    nchannel = int(_strtod(cfg.get("nchannel", ""))) or 1
    if not 1 <= nchannel <= 6:
        raise ValueError("nchannel must be between 1 and 6")
    size = [int(v) for v in _read_vector(cfg.get("size", ""))]
    if len(size) != 2:
        raise ValueError("Both horizontal and vertical resolutions must be specified")
    if size[0] <= 0 or size[1] <= 0:
        raise ValueError("Horizontal and vertical resolutions must be positive")
    fov = _read_vector(cfg.get("fov", ""))
    if len(fov) != 2:
        raise ValueError("Both horizontal and vertical fields of view must be specified")
    if not 0 < fov[0] <= 180:
        raise ValueError("`fov[0]` must be a float between (0, 180] degrees")
    if not 0 < fov[1] <= 90:
        raise ValueError("`fov[1]` must be a float between (0, 90] degrees")
    gamma = _strtod(cfg.get("gamma", ""))
    if not 0 <= gamma <= 1:
        raise ValueError("`gamma` must be a nonnegative float between [0, 1]")
    return nchannel, size, fov, gamma


def _nsensordata(inst, sensor_id):
    nchannel, size, _, _ = _config(inst)
    return nchannel * size[0] * size[1]


def _validate(inst, model):
    _config(inst)
    objtype = np.asarray(model.sensor_objtype)
    for s in inst.sensors:
        if objtype[s] != ObjType.SITE:
            raise ValueError("Touch Grid sensor must be attached to a site")


def _edges(n, fov, gamma):
    """Bin edges (n + 1,) in radians: linspace(-1, 1), foveated, scaled by fov."""
    e = np.empty(n + 1)
    inc = 2.0 / n
    x = -1.0
    for i in range(n + 1):        # accumulated like MuJoCo's LinSpace
        e[i] = x
        x += inc
    if gamma:
        g = min(1.0, max(0.0, gamma))
        e = g * e ** 5 + (1 - g) * e
    return e * (fov * math.pi / 180)


def _init(inst, model):
    _, size, fov, gamma = _config(inst)
    return {"x_edges": _edges(size[0], fov[0], gamma),
            "y_edges": _edges(size[1], fov[1], gamma)}


def contact_force(m, d, efc_force):
    """(ncon_max, 6) force:torque of every contact slot in its contact frame
    (mj_contactForce): pyramidal cones decoded, the normal force net of adhesion, zeros
    for empty slots."""
    con = d.contact
    n = con.dist.shape[0]
    dtype = d.qpos.dtype
    if n == 0:
        return jnp.zeros((0, 6), dtype)
    nefc = efc_force.shape[0]
    dim = con.dim
    adr = con.efc_address
    rows = adr[:, None] + jnp.arange(10)[None, :]
    vals = efc_force[jnp.clip(rows, 0, max(nefc - 1, 0))] if nefc else jnp.zeros((n, 10), dtype)
    if m.opt.cone == ConeType.PYRAMIDAL:
        npyr = 2 * (dim - 1)
        used = jnp.arange(10)[None, :] < npyr[:, None]
        normal = jnp.where(dim == 1, vals[:, 0], jnp.sum(jnp.where(used, vals, 0.0), axis=1))
        tang = (vals[:, 0:10:2] - vals[:, 1:10:2]) * con.friction
        tang = jnp.where(jnp.arange(5)[None, :] < (dim - 1)[:, None], tang, 0.0)
        f = jnp.concatenate([normal[:, None], tang], axis=1)
    else:
        f = jnp.where(jnp.arange(6)[None, :] < dim[:, None], vals[:, :6], 0.0)
    # the net interface force: the solver's normal force minus the adhesive pull
    f = f - jnp.where(jnp.arange(6) == 0, con.adhesion[:, None], 0.0)
    ok = con.valid & (adr >= 0)
    return jnp.where(ok[:, None], f, 0.0)


def grid(m, d, inst, params, force6):
    """Sensor values (nchannel * size[1] * size[0],) from per-slot contact forces
    ``force6`` (ncon_max, 6) in contact frames."""
    nchannel, size, _, _ = _config(inst)
    frame = size[0] * size[1]
    dtype = d.qpos.dtype
    sensor = inst.sensors[0]
    site = int(np.asarray(m.sensor_objid)[sensor])
    weldid = np.asarray(m.body_weldid)
    parent = int(weldid[np.asarray(m.site_bodyid)[site]])
    parent_weld = int(weldid[parent])
    con = d.contact
    if con.dist.shape[0] == 0:
        return jnp.zeros(nchannel * frame, dtype)
    geom_body = jnp.asarray(np.asarray(m.geom_bodyid))
    g = jnp.clip(con.geom, 0, m.ngeom - 1)
    b1, b2 = geom_body[g[:, 0]], geom_body[g[:, 1]]
    wj = jnp.asarray(weldid)
    mine = con.valid & ((wj[b1] == parent_weld) | (wj[b2] == parent_weld))
    rot = d.site_xmat[site]
    world_f = jnp.einsum("nij,ni->nj", con.frame, force6[:, :3])
    world_t = jnp.einsum("nij,ni->nj", con.frame, force6[:, 3:])
    loc = jnp.concatenate([world_f @ rot, world_t @ rot], axis=1)        # site frame
    flip = parent < jnp.maximum(b1, b2)
    loc = jnp.where(flip[:, None], -loc, loc)
    loc = loc[:, [2, 0, 1, 5, 3, 4]]                                     # z, x, y order
    p = (con.pos - d.site_xpos[site]) @ rot
    x, y, z = p[:, 0], p[:, 1], p[:, 2]
    azim = jnp.arctan2(x, -z)
    elev = jnp.arctan2(y, jnp.sqrt(x * x + z * z))
    xe = jnp.asarray(params["x_edges"], dtype)
    ye = jnp.asarray(params["y_edges"], dtype)
    xi = jnp.searchsorted(xe, azim, side="left")
    yi = jnp.searchsorted(ye, elev, side="left")
    inside = mine & (xi > 0) & (xi < size[0] + 1) & (yi > 0) & (yi < size[1] + 1)
    cell = jnp.where(inside, (yi - 1) * size[0] + (xi - 1), 0)
    out = jnp.zeros((nchannel, frame), dtype)
    w = jnp.where(inside[:, None], loc[:, :nchannel], 0.0)
    out = out.at[:, cell].add(w.T)
    return out.ravel()


def _compute(m, d, inst, params, state, capability):
    efc_force = getattr(d, "efc_force", None)
    if efc_force is None:
        raise UnsupportedFeatureError(
            "mujoco.sensor.touch_grid: contact forces (Data.efc_force from the constraint "
            "solver) are not available")
    out = grid(m, d, inst, params, contact_force(m, d, efc_force))
    # as MuJoCo, the grid goes to the instance's first sensor; others read zeros
    rest = sum(inst.sensor_dim[1:])
    return jnp.concatenate([out, jnp.zeros(rest, out.dtype)]) if rest else out


TOUCH_GRID = Plugin(
    name="mujoco.sensor.touch_grid", capabilities=Capability.SENSOR,
    attributes=("nchannel", "size", "fov", "gamma"), needstage=Stage.ACC,
    nstate=lambda inst: 0, nsensordata=_nsensordata, validate=_validate, init=_init,
    compute=_compute)

PLUGINS = [TOUCH_GRID]
