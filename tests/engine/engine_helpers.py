"""Shared helpers for engine tests: loading oracle models and random states."""
from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import mujoco
import numpy as np

from mujoco_oracle import corpus_path, model_from_mujoco

FEATURES = os.path.join(os.path.dirname(__file__), "features.xml")


def load(rel, integrator=None, constraints=False, edit=None):
    """(mujoco.MjModel, simjax Model) for a corpus model (or features.xml).

    Constraints are disabled unless asked for: these tests cover smooth dynamics.
    """
    path = FEATURES if rel == "features" else corpus_path(rel)
    mjm = mujoco.MjModel.from_xml_path(path)
    if not constraints:
        mjm.opt.disableflags |= mujoco.mjtDisableBit.mjDSBL_CONSTRAINT
    if integrator is not None:
        mjm.opt.integrator = integrator
    if edit is not None:
        edit(mjm)
    return mjm, model_from_mujoco(mjm)


def normalize_quaternions(mjm, qpos):
    """``qpos`` (nq,) with the quaternions of free and ball joints made unit (in place)."""
    for j in range(mjm.njnt):
        adr = mjm.jnt_qposadr[j]
        if mjm.jnt_type[j] == mujoco.mjtJoint.mjJNT_FREE:
            qpos[adr + 3:adr + 7] /= np.linalg.norm(qpos[adr + 3:adr + 7])
        elif mjm.jnt_type[j] == mujoco.mjtJoint.mjJNT_BALL:
            qpos[adr:adr + 4] /= np.linalg.norm(qpos[adr:adr + 4])
    return qpos


def random_state(mjm, rng, qscale=0.3, vscale=1.0, uscale=1.0):
    """Random qpos (normalised quaternions), qvel, ctrl, act, mocap pose."""
    qpos = normalize_quaternions(mjm, mjm.qpos0 + qscale * rng.standard_normal(mjm.nq))
    qvel = vscale * rng.standard_normal(mjm.nv)
    ctrl = uscale * rng.standard_normal(mjm.nu)
    act = 0.3 * rng.standard_normal(mjm.na)
    mpos = rng.standard_normal((mjm.nmocap, 3))
    mquat = rng.standard_normal((mjm.nmocap, 4))
    mquat /= np.linalg.norm(mquat, axis=1, keepdims=True) if mjm.nmocap else 1
    return dict(qpos=qpos, qvel=qvel, ctrl=ctrl, act=act, mocap_pos=mpos, mocap_quat=mquat)


def set_state(mjm, mjd, state):
    """Write a random_state dict into mujoco.MjData."""
    for k, v in state.items():
        getattr(mjd, k)[:] = v


def to_data(data, state):
    """Replace the fields of a simjax Data with a random_state dict."""
    return data.replace(**{k: jnp.asarray(v) for k, v in state.items()})


def rel_err(a, b):
    """Max error relative to max(1, |b|) (absolute for small values)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64).reshape(np.shape(a))
    if a.size == 0:
        return 0.0
    return float(np.max(np.abs(a - b) / np.maximum(1.0, np.abs(b))))


_FORWARD_JIT = []


def forward_jit():
    """One jitted simjax forward shared by all tests, so a model structure compiles once
    per session whichever test file uses it."""
    if not _FORWARD_JIT:
        import jax
        from simjax.engine import forward
        _FORWARD_JIT.append(jax.jit(forward))
    return _FORWARD_JIT[0]


def geom_poses(d, mjd):
    """``d`` with MuJoCo's geom poses (geom_xpos (ngeom, 3), geom_xmat (ngeom, 3, 3)), so
    a collision test runs simjax's collision stage alone on MuJoCo's kinematics."""
    import jax.numpy as jnp
    return d.replace(geom_xpos=jnp.array(mjd.geom_xpos),
                     geom_xmat=jnp.array(mjd.geom_xmat).reshape(-1, 3, 3))


def dense_ten_j(mjm, mjd):
    """MuJoCo's ten_J (sparse rows) as a dense (ntendon, nv) array."""
    out = np.zeros((mjm.ntendon, mjm.nv))
    if mjm.ntendon:
        mujoco.mju_sparse2dense(out, mjd.ten_J, mjm.ten_J_rownnz, mjm.ten_J_rowadr,
                                mjm.ten_J_colind)
    return out


def arm26_original_sidesites(mjm):
    """arm26 as MuJoCo ships it (a ``load`` edit): side sites x0, x1 directly below the
    joints (the corpus file moves them 45 degrees for MuJoCo 4.0's side-site rule so
    that its lengthrange computation converges)."""
    for name, pos in (("x0", (0.0, -0.15, 0.0)), ("x1", (0.5, -0.15, 0.0))):
        mjm.site_pos[mujoco.mj_name2id(mjm, mujoco.mjtObj.mjOBJ_SITE, name)] = pos


def jaxpr_loops(jaxpr, under_cond=False):
    """The loops (scan, while) of a jaxpr, nested ones included, in order: a list of
    (primitive name, whether inside a ``cond``)."""
    from jax.extend.core import jaxprs_in_params
    found = []
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name in ("scan", "while"):
            found.append((name, under_cond))
        for sub in jaxprs_in_params(eqn.params):
            found += jaxpr_loops(sub, under_cond or name == "cond")
    return found


def f32(tree):
    """``tree`` (Model, Data, ...) with its float leaves (arrays or Python floats) cast
    to float32."""
    return jax.tree_util.tree_map(
        lambda x: x.astype(jnp.float32) if jnp.issubdtype(jnp.result_type(x), jnp.floating)
        else x, tree)


def touching_poses(mjm, n, seed, depths=(1e-4, 1e-3, 5e-3, 2e-2)):
    """Poses (qpos) of a scene of two free bodies, each one geom, just overlapping:
    random orientations; the second body moved along a random direction from the first
    to where MuJoCo's collision first reports a contact (bisection on the offset, to
    about 5e-10), then back into the first by one of ``depths``."""
    rng = np.random.default_rng(seed)
    mjd = mujoco.MjData(mjm)

    def quat():
        q = rng.standard_normal(4)
        return q / np.linalg.norm(q)

    for _ in range(n):
        q1, u, q2 = quat(), rng.standard_normal(3), quat()
        u /= np.linalg.norm(u)
        lo, hi = 0.0, 0.5
        for _ in range(30):
            mid = 0.5 * (lo + hi)
            mjd.qpos[:] = np.r_[0, 0, 0, q1, mid * u, q2]
            mujoco.mj_forward(mjm, mjd)
            lo, hi = (mid, hi) if mjd.ncon else (lo, mid)
        yield np.r_[0, 0, 0, q1, (lo - rng.choice(depths)) * u, q2]


def assert_contacts_match(c, mjd, pos_tol, dist_tol, normal_tol=np.inf):
    """simjax's contacts ``c`` (numpy Contact) have MuJoCo's count (``mjd.ncon``), and
    each MuJoCo contact's nearest simjax contact its position, distance and normal
    within the tolerances."""
    idx = np.nonzero(c.valid)[0]
    assert len(idx) == mjd.ncon
    for mc in mjd.contact[:mjd.ncon]:
        i = idx[np.argmin([np.linalg.norm(c.pos[j] - mc.pos) for j in idx])]
        assert np.linalg.norm(c.pos[i] - mc.pos) < pos_tol
        assert abs(c.dist[i] - mc.dist) < dist_tol
        assert np.abs(c.frame[i][0] - mc.frame[:3]).max() < normal_tol
