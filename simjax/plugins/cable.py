"""``mujoco.elasticity.cable``: bending and twisting elasticity of a chain of bodies
(MuJoCo's plugin/elasticity/cable.cc, removed from MuJoCo 4; semantics of its README).

The instance backs consecutive bodies b_0..b_{n-1} of a chain (each body's parent is
the previous one), each with a ball joint (or a free joint for the first) and a
capsule, cylinder or box as first geom. For each body b > 0 the relative orientation
to its parent is q_b = body_quat_b * joint_quat_b and its curvature the rotation vector
w_b = log(q_b) (mju_quat2Vel); the reference curvature w0_b is that at qpos0 (zero
with ``flat="true"``). The elastic torque between b-1 and b, in b's frame before the
joint rotation, is

    tau_b = -diag(J G, I_y E, I_z E) (w_b - w0_b) / L_b

(G = ``twist``, E = ``bend`` moduli; J, I_y, I_z the section's torsion constant and
second moments; L_b the distance between the two bodies at qpos0). Body b receives
tau_b rotated back by q_b^-1 and body b-1 receives -tau_{b+1}, both as torques at the
body origins, added to qfrc_passive. For isotropic sections (K = k I) and a straight
reference (w0 = 0) this is exactly minus the gradient of the energy
E = sum_b (w_b - w0_b)' K (w_b - w0_b) / (2 L_b); otherwise it differs from that
gradient by the SO(3) Jacobian of the log map, O(|w| / 2) relative (as in MuJoCo).

Parameters (Model.plugin_params): ``stiffness`` (n, 3) (J G, I_y E, I_z E) and
``length`` (n,), ``omega0`` (n, 3); all differentiable.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from simjax.engine import math
from simjax.engine import support
from simjax.plugins.protocol import Capability, Plugin
from simjax.types import GeomType, Stage


def _number(inst, key):
    raw = inst.config.get(key, "")
    text = "".join(raw.split())
    if not text:
        return 0.0
    try:
        return float(text)
    except ValueError:
        raise ValueError("Invalid parameter specification in cable plugin") from None


def _bodies(inst, model):
    b = np.asarray(inst.bodies)
    if len(b) == 0:
        raise ValueError("the cable instance backs no body")
    if np.any(np.diff(b) != 1) or np.any(b == 0):
        raise ValueError("cable bodies must be consecutive and not the world")
    parent = np.asarray(model.body_parentid)
    if np.any(parent[b[1:]] != b[:-1]):
        raise ValueError("each cable body must be the child of the previous one")
    return b


def _quat_adr(model, b):
    """qpos address of the joint quaternion of each body (last 3 dofs)."""
    jnt = np.asarray(model.body_jntadr)[b]
    if np.any(jnt < 0) or np.any(np.asarray(model.body_dofnum)[b] < 3):
        raise ValueError("cable bodies need a ball or free joint")
    jtype = np.asarray(model.jnt_type)[jnt]
    return np.asarray(model.jnt_qposadr)[jnt] + np.where(jtype == 0, 3, 0)


def _init(inst, model):
    from simjax.engine.math import sub_quat
    b = _bodies(inst, model)
    twist, bend = _number(inst, "twist"), _number(inst, "bend")
    flat = inst.config.get("flat", "") == "true"
    body_quat = np.asarray(model.body_quat).reshape(-1, 4)
    qpos0 = np.asarray(model.qpos0)
    adr = _quat_adr(model, b)
    omega0 = np.zeros((len(b), 3))
    if not flat and len(b) > 1:
        omega0[1:] = np.asarray(sub_quat(jnp.asarray(body_quat[b[1:]]),
                                         jnp.asarray(qpos0[adr[1:, None] + np.arange(4)])))
    gtype = np.asarray(model.geom_type)
    size = np.asarray(model.geom_size).reshape(-1, 3)
    stiff = np.zeros((len(b), 3))
    for k, body in enumerate(b):
        g = int(np.asarray(model.body_geomadr)[body])
        if g < 0:
            continue
        if gtype[g] in (GeomType.CYLINDER, GeomType.CAPSULE):
            r = size[g, 0]
            j, iy = np.pi * r ** 4 / 2, np.pi * r ** 4 / 4
            iz = iy
        elif gtype[g] == GeomType.BOX:
            h, w = size[g, 1], size[g, 2]
            a, c = max(h, w), min(h, w)
            j = a * c ** 3 * (16 / 3 - 3.36 * c / a * (1 - c ** 4 / a ** 4 / 12))
            iy = (2 * w) ** 3 * 2 * h / 12
            iz = (2 * h) ** 3 * 2 * w / 12
        else:
            j = iy = iz = 0.0
        stiff[k] = (j * twist, iy * bend, iz * bend)
    length = np.zeros(len(b))
    # the parent is the previous body, so their distance at qpos0 is |body_pos|
    length[1:] = np.linalg.norm(np.asarray(model.body_pos).reshape(-1, 3)[b[1:]], axis=1)
    if np.any(length[1:] <= 0):
        raise ValueError("cable bodies must not coincide")
    return {"stiffness": stiff, "length": length, "omega0": omega0}


def _compute(m, d, inst, params, state, capability):
    b = np.asarray(inst.bodies)
    n = len(b)
    dtype = d.qpos.dtype
    adr = _quat_adr(m, b)
    q = math.quat_mul(jnp.asarray(m.body_quat, dtype).reshape(-1, 4)[b],
                      d.qpos[adr[:, None] + np.arange(4)])               # (n, 4)
    k = jnp.asarray(params["stiffness"], dtype)
    length = jnp.asarray(params["length"], dtype)
    safe = jnp.where(length > 0, length, 1.0)
    tmp = -k * (math.quat_to_vel(q) - params["omega0"]) / safe[:, None]     # (n, 3)
    has_prev = np.arange(n) > 0
    tmp = jnp.where(has_prev[:, None], tmp, 0.0)
    pulled = math.rot_vec_quat(tmp, math.quat_neg(q))
    lfrc = jnp.where(has_prev[:, None], pulled, 0.0)
    if n > 1:
        lfrc = lfrc.at[:-1].add(-tmp[1:])
    active = jnp.any(k != 0, axis=1)                 # bodies without stiffness skip
    lfrc = jnp.where(active[:, None], lfrc, 0.0)
    torque = math.rot_vec_quat(lfrc, d.xquat[b])
    return support.apply_ft(m, d, None, torque, d.xpos[b], b)


CABLE = Plugin(name="mujoco.elasticity.cable", capabilities=Capability.PASSIVE,
               attributes=("twist", "bend", "flat", "vmax"), needstage=Stage.NONE,
               nstate=lambda inst: 0, validate=lambda inst, model: _init(inst, model),
               init=_init, compute=_compute)

PLUGINS = [CABLE]
