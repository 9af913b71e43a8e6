"""Height-field collisions (collision/hfield.py) against MuJoCo 4.0.0 (float64): the
barkour quadruped's sphere feet on its 240 x 280 terrain, the touch_grid ellipsoid on a
small height field, capsules and other geoms on a random height field; trajectories
through the full step; gradients.

Tolerances (measured, see each test):
- spheres and capsules whose centre / axis stays outside the prism (MuJoCo's GJK path):
  dist, pos and normal to 1e-9 (MuJoCo and simjax agree to ~1e-13);
- centre / axis inside a prism (deep, MuJoCo's EPA stops at ccd_tolerance): dist to
  1e-5, normal to 1e-3; positions are EPA witness points (not compared).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import pytest

from engine_helpers import load
from simjax.engine import io
from simjax.engine.collision import driver, hfield
from simjax.engine.data import WARN_CONTACTFULL

BARKOUR = "mjx_barkour_v0/assets/barkour_v0_mjx.xml"
TOUCH = "mujoco_plugin_touch_grid/touch_grid.xml"
NSTATE = 20


def poses(d, mjd):
    return d.replace(geom_xpos=jnp.asarray(mjd.geom_xpos),
                     geom_xmat=jnp.asarray(mjd.geom_xmat).reshape(-1, 3, 3))


def contacts(c):
    """{geom pair: [slot ids]} of the valid contacts of a (numpy) Contact."""
    out = {}
    for i in np.nonzero(c.valid)[0]:
        out.setdefault(tuple(int(x) for x in c.geom[i]), []).append(int(i))
    return out


def mj_contacts(mjd):
    out = {}
    for k in range(mjd.ncon):
        out.setdefault(tuple(int(x) for x in mjd.contact.geom[k]), []).append(mjd.contact[k])
    return out


def compare(c, mjd, radius, deep_tol=1e-5):
    """Match every MuJoCo contact to ours (same pair, same count, in order) and check
    dist / normal / pos; returns (shallow, deep) contact counts."""
    ours, theirs = contacts(c), mj_contacts(mjd)
    assert set(ours) == set(theirs)
    ns = nd = 0
    for key, mcs in theirs.items():
        assert len(ours[key]) == len(mcs), key
        for i, mc in zip(ours[key], mcs):
            r = radius(key)
            if mc.dist > -r + 1e-6:       # centre outside the prism: GJK path, exact
                assert abs(c.dist[i] - mc.dist) < 1e-9, (key, c.dist[i], mc.dist)
                np.testing.assert_allclose(c.pos[i], mc.pos, atol=1e-9)
                np.testing.assert_allclose(c.frame[i], mc.frame.reshape(3, 3), atol=1e-9)
                ns += 1
            else:                         # EPA: MuJoCo stops at its tolerance
                assert abs(c.dist[i] - mc.dist) < deep_tol, (key, c.dist[i], mc.dist)
                assert np.linalg.norm(c.frame[i][0] - mc.frame[:3]) < 1e-3
                nd += 1
            assert abs(c.includemargin[i] - mc.includemargin) < 1e-12
            np.testing.assert_allclose(c.friction[i], mc.friction, atol=1e-12)
            assert int(c.dim[i]) == mc.dim
    return ns, nd


# --------------------------------------------------------------------------- barkour
def terrain_z(mjm, x, y, h=0):
    """Height of height field h (geom 0, at the origin, unrotated) at (x, y): the plane
    of the cell triangle below the point."""
    nrow, ncol = mjm.hfield_nrow[h], mjm.hfield_ncol[h]
    sx, sy, sz, _ = mjm.hfield_size[h]
    data = mjm.hfield_data[mjm.hfield_adr[h]:mjm.hfield_adr[h] + nrow * ncol]
    dx, dy = 2 * sx / (ncol - 1), 2 * sy / (nrow - 1)
    fx, fy = (x + sx) / dx, (y + sy) / dy
    c, r = min(int(fx), ncol - 2), min(int(fy), nrow - 2)
    u, v = fx - c, fy - r
    z = lambda rr, cc: data[rr * ncol + cc] * sz
    if v >= u:     # triangle (c, r), (c, r+1), (c+1, r+1)
        return z(r, c) + v * (z(r + 1, c) - z(r, c)) + u * (z(r + 1, c + 1) - z(r + 1, c))
    return z(r, c) + u * (z(r, c + 1) - z(r, c)) + v * (z(r + 1, c + 1) - z(r, c + 1))


def barkour_states(mjm, n, seed=0):
    """Barkour at random terrain spots, yaw, small tilt and joint angles, lowered so its
    lowest foot sphere touches the terrain (penetration 0 .. 1.2 cm, found by ray)."""
    rng = np.random.default_rng(seed)
    mjd = mujoco.MjData(mjm)
    feet = [g for g in range(mjm.ngeom) if mjm.geom_type[g] == mujoco.mjtGeom.mjGEOM_SPHERE]
    r = mjm.geom_size[feet[0], 0]
    out = []
    for _ in range(n):
        q = mjm.qpos0.copy()
        q[0:2] = rng.uniform(-18, 18, 2)
        q[2] = 0.0
        yaw = rng.uniform(-np.pi, np.pi)
        quat = np.array([np.cos(yaw / 2), 0, 0, np.sin(yaw / 2)])
        tilt = np.r_[1.0, 0.15 * rng.standard_normal(3)]
        mujoco.mju_mulQuat(quat, quat, tilt / np.linalg.norm(tilt))
        q[3:7] = quat
        q[7:] += 0.3 * rng.standard_normal(mjm.nq - 7)
        mjd.qpos[:] = q
        mujoco.mj_kinematics(mjm, mjd)
        gaps = [mjd.geom_xpos[g][2] - terrain_z(mjm, *mjd.geom_xpos[g][:2]) - r
                for g in feet]
        q[2] = -min(gaps) - rng.uniform(0.0, 0.012)
        out.append(q)
    return out


@pytest.fixture(scope="module")
def barkour():
    mjm, m = load(BARKOUR, constraints=True)
    return mjm, m, jax.jit(lambda d: driver.collision(m, d))


def test_hfield_model_fields(barkour):
    """Compiled height-field arrays as MuJoCo's (the engine reads them statically)."""
    mjm, m, _ = barkour
    np.testing.assert_array_equal(np.asarray(m.hfield_size), mjm.hfield_size)
    np.testing.assert_array_equal(np.asarray(m.hfield_nrow), mjm.hfield_nrow)
    np.testing.assert_array_equal(np.asarray(m.hfield_ncol), mjm.hfield_ncol)
    np.testing.assert_array_equal(np.asarray(m.hfield_adr), mjm.hfield_adr)
    np.testing.assert_array_equal(np.asarray(m.hfield_data, np.float32), mjm.hfield_data)


def test_barkour_contacts(barkour):
    """Sphere feet on the terrain at 20 states: same contacting pairs and contact counts
    as MuJoCo, geometry exact on the GJK path."""
    mjm, m, f = barkour
    mjd = mujoco.MjData(mjm)
    d0 = io.make_data(m)
    ns = nd = 0
    for q in barkour_states(mjm, NSTATE):
        mjd.qpos[:] = q
        mujoco.mj_forward(mjm, mjd)
        d = f(poses(d0, mjd))
        assert int(d.warning[WARN_CONTACTFULL]) == 0
        c = jax.tree_util.tree_map(np.asarray, d.contact)
        a, b = compare(c, mjd, lambda key: mjm.geom_size[key[1], 0])
        ns, nd = ns + a, nd + b
    print('barkour shallow/deep contacts', ns, nd)
    assert ns >= NSTATE


def test_barkour_capacity(barkour):
    """Each foot-terrain pair has a 2 x 2 cell window (8 prisms, 8 contact slots)."""
    mjm, m, _ = barkour
    p = driver.plan(m)
    hf = [g for g in p.groups if getattr(g.fn, "hfield", False)]
    assert len(hf) == 1 and len(hf[0].cand) == 4
    assert hf[0].maxcon == 8
    assert hfield.window(m, 0, int(p.g2[hf[0].cand[0]])) == (2, 2)


# --------------------------------------------------------------------------- touch_grid
def touch_states(mjm, n, seed=0):
    """The touch_grid ellipsoid (slide x y z, hinges rx ry) over the height field at
    random spots and tilts, its lowest point 0.2 .. 1 x the elevation range into it."""
    rng = np.random.default_rng(seed)
    mjd = mujoco.MjData(mjm)
    g = [i for i in range(mjm.ngeom) if mjm.geom_type[i] == mujoco.mjtGeom.mjGEOM_ELLIPSOID][0]
    top = mjm.hfield_size[0, 2]
    out = []
    for _ in range(n):
        q = np.zeros(mjm.nq)
        q[0:2] = rng.uniform(-0.25, 0.25, 2)
        q[3:5] = rng.uniform(-0.3, 0.3, 2)
        mjd.qpos[:] = q
        mujoco.mj_kinematics(mjm, mjd)
        mat = mjd.geom_xmat[g].reshape(3, 3)
        low = mjd.geom_xpos[g][2] - np.linalg.norm(mat[2] * mjm.geom_size[g])
        q[2] = -low + top * rng.uniform(0.2, 1.0)
        out.append(q)
    return out


@pytest.fixture(scope="module")
def touch():
    mjm, m = load(TOUCH, constraints=True)
    return mjm, m, jax.jit(lambda d: driver.collision(m, d))


def test_touch_grid_contacts(touch):
    """Ellipsoid on the height field at 20 states: same pairs, same contact counts (up
    to mjMAXCONPAIR per pair), in MuJoCo's prism order; dist to 1e-5 (MuJoCo's EPA
    stops at ccd_tolerance 1e-6; simjax polishes the separation per prism feature) to
    2e-6 (measured 9.5e-7), normals to 5e-3 (1.6e-3) and positions to 1e-3 (2.5e-4) (near the optimum the separation is flat in
    the normal, so EPA's normal and witness errors are the square root of its depth
    error). Plane contacts exact."""
    mjm, m, f = touch
    mjd = mujoco.MjData(mjm)
    d0 = io.make_data(m)
    hf = 0
    errs = []
    for q in touch_states(mjm, NSTATE):
        mjd.qpos[:] = q
        mujoco.mj_forward(mjm, mjd)
        d = f(poses(d0, mjd))
        assert int(d.warning[WARN_CONTACTFULL]) == 0
        c = jax.tree_util.tree_map(np.asarray, d.contact)
        ours, theirs = contacts(c), mj_contacts(mjd)
        assert set(ours) == set(theirs)
        for key, mcs in theirs.items():
            assert len(ours[key]) == len(mcs), key
            hfield_pair = mjm.geom_type[key[0]] == mujoco.mjtGeom.mjGEOM_HFIELD
            for i, mc in zip(ours[key], mcs):
                if hfield_pair:
                    errs.append((abs(c.dist[i] - mc.dist), np.linalg.norm(c.pos[i] - mc.pos),
                                 np.linalg.norm(c.frame[i][0] - mc.frame[:3])))
                    hf += 1
                else:
                    assert abs(c.dist[i] - mc.dist) < 1e-9
                    np.testing.assert_allclose(c.pos[i], mc.pos, atol=1e-9)
                assert abs(c.includemargin[i] - mc.includemargin) < 1e-12
                assert int(c.dim[i]) == mc.dim
    e = np.asarray(errs)
    print("touch_grid hfield contacts", hf, "max dist/pos/normal err", e.max(0),
          "median", np.median(e, 0))
    assert hf >= NSTATE
    assert e[:, 0].max() < 2e-6
    assert e[:, 1].max() < 1e-3 and e[:, 2].max() < 5e-3


# --------------------------------------------------------------------------- trajectories
def _trajectory(rel, q0, nstep=10):
    """(simjax, MuJoCo) qpos/qvel after each of nstep steps from q0 at rest."""
    from simjax import engine
    mjm, m = load(rel, constraints=True)
    mjd = mujoco.MjData(mjm)
    mjd.qpos[:] = q0
    d = io.make_data(m).replace(qpos=jnp.asarray(q0))
    step = jax.jit(lambda d: engine.step(m, d))
    ours, theirs = [], []
    for _ in range(nstep):
        d = step(d)
        mujoco.mj_step(mjm, mjd)
        print("ncon", mjd.ncon, "|qvel|", np.abs(mjd.qvel).max())
        ours.append(np.concatenate([np.asarray(d.qpos), np.asarray(d.qvel)]))
        theirs.append(np.concatenate([mjd.qpos, mjd.qvel]))
        assert int(d.ncon) == mjd.ncon
    return np.asarray(ours), np.asarray(theirs)


@pytest.mark.slow
@pytest.mark.parametrize("rel", [BARKOUR, TOUCH])
def test_trajectory_10_steps(rel):
    """10 steps from a state resting on the height field: same contact count every
    step, qpos and qvel as MuJoCo's at step 10."""
    mjm, _ = load(rel, constraints=True)
    states = barkour_states if rel == BARKOUR else touch_states
    mjd = mujoco.MjData(mjm)
    for q0 in states(mjm, 10, seed=3):        # a start with height-field contacts
        mjd.qpos[:] = q0
        mujoco.mj_forward(mjm, mjd)
        if np.sum(mjd.contact.geom[:mjd.ncon, 0] == _HFIELD[rel]) >= 2:
            break
    ours, theirs = _trajectory(rel, q0)
    err = np.abs(ours - theirs).max(1)
    print(rel, "hfield contacts at start", mjd.ncon, "max |qpos, qvel| error per step", err)
    assert err[-1] < 1e-4


#: height-field geom id per model
_HFIELD = {BARKOUR: 0, TOUCH: 1}
