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

from engine_helpers import load, geom_poses
import simjax
from simjax.engine import io
from simjax.engine.collision import chunked, driver, hfield
from simjax.engine.data import WARN_CONTACTFULL

BARKOUR = "mjx_barkour_v0/assets/barkour_v0_mjx.xml"
TOUCH = "mujoco_plugin_touch_grid/touch_grid.xml"
NSTATE = 20


poses = geom_poses


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
    """(MjModel, Model, collision jitted with the Model traced, as forward_jit does)."""
    mjm, m = load(BARKOUR, constraints=True)
    g = jax.jit(driver.collision)
    return mjm, m, lambda d: g(m, d)


@pytest.mark.parametrize("rel", [pytest.param(BARKOUR, marks=pytest.mark.slow), TOUCH])
def test_hfield_model_fields(rel):
    """Height-field arrays compiled by simjax.load_model as MuJoCo's (the collider
    reads them statically), and the geoms' bounding radii."""
    import simjax
    from mujoco_oracle import corpus_path
    path = corpus_path(rel)
    mjm = mujoco.MjModel.from_xml_path(path)
    m = simjax.load_model(path)
    np.testing.assert_array_equal(np.asarray(m.hfield_size), mjm.hfield_size)
    np.testing.assert_array_equal(np.asarray(m.hfield_nrow), mjm.hfield_nrow)
    np.testing.assert_array_equal(np.asarray(m.hfield_ncol), mjm.hfield_ncol)
    np.testing.assert_array_equal(np.asarray(m.hfield_adr), mjm.hfield_adr)
    np.testing.assert_allclose(np.asarray(m.hfield_data), mjm.hfield_data, atol=1e-6)
    np.testing.assert_allclose(np.asarray(m.geom_rbound), mjm.geom_rbound, rtol=1e-6)
    assert isinstance(m.hfield_size, np.ndarray) and isinstance(m.geom_rbound, np.ndarray)


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
    """Each foot-terrain pair has a 2 x 2 cell window (8 prisms) of which a foot (radius
    1.4 cm, cells 14 x 17 cm) meets at most the 6 triangles around one grid vertex: 6
    contact slots per pair."""
    mjm, m, _ = barkour
    p = driver.plan(m)
    hf = [g for g in p.groups if getattr(g.fn, "hfield", False)]
    assert len(hf) == 1 and len(hf[0].cand) == 4
    assert hf[0].maxcon == 6
    assert hfield.window(m, 0, int(p.g2[hf[0].cand[0]])) == (2, 2)
    assert driver.contact_capacity(m) == 24


def test_barkour_bound(barkour):
    """With concrete zero margins a foot (exact sphere collider) has at most 6 valid
    contacts: the four pairs' 24 fit the 24 default slots, so the slots are filled
    without the overflow rule (first_k alone: its 32 entries ranked by compares, no
    top_k); with 12 slots the overflow rule's top_k stays. A sphere with a margin gets
    the bound of its grown disc (more than its capacity)."""
    mjm, m, _ = barkour
    fn = [g.fn for g in driver.plan(m).groups if getattr(g.fn, "hfield", False)][0]
    assert fn.bound == 6
    topk = lambda d: str(jax.make_jaxpr(lambda d: driver.collision(m, d))(d)).count("top_k")
    assert chunked._RANK_MAX >= 32
    assert topk(io.make_data(m)) == 0
    assert topk(io.make_data(m, ncon_max=12)) == 1
    xml = """<mujoco><asset><hfield name="h" nrow="6" ncol="6" size="0.35 0.35 0.1 0.05"
     elevation="%s"/></asset><worldbody><geom type="hfield" hfield="h"/>
     <body pos="0 0 0.2"><freejoint/><geom type="sphere" size="0.014" margin="0.1"/>
     </body></worldbody></mujoco>""" % " ".join(["0"] * 36)
    fn = hfield.collider_for(simjax.load_model(xml), 0, 1)
    assert fn.maxcon == 6 and fn.bound > 6


def test_disc_cover():
    """Triangles a disc meets, at most: 6 around a vertex for a small disc; a disc of
    the cell's half diagonal (unit cells) reaches past the cell's neighbours; the bound
    is at least the count at sampled centres computed directly."""
    assert hfield.disc_cover(1.0, 1.0, 0.0) == 6
    assert hfield.disc_cover(0.1441, 0.1674, 0.014) == 6
    assert hfield.disc_cover(1.0, 1.0, 0.5) >= 10
    rng = np.random.default_rng(0)
    for rho in (0.1, 0.3, 0.7, 1.2):
        bound = hfield.disc_cover(1.0, 1.3, rho)
        for _ in range(200):
            c = rng.uniform(0, 1, 2) * (1.0, 1.3)
            n = 0
            for i in range(-3, 4):
                for j in range(-3, 4):
                    for tri in ([(0, 1), (0, 0), (1, 1)], [(0, 0), (1, 1), (1, 0)]):
                        v = (np.array(tri, float) + (i, j)) * (1.0, 1.3)
                        n += _tri_dist(c, v) <= rho
            assert n <= bound


def _tri_dist(p, v):
    """Distance of 2-d point p to the triangle v (3, 2) (0 inside)."""
    cr = lambda a, b: a[0] * b[1] - a[1] * b[0]
    s = [cr(v[(k + 1) % 3] - v[k], p - v[k]) for k in range(3)]
    if all(x >= 0 for x in s) or all(x <= 0 for x in s):
        return 0.0
    out = np.inf
    for k in range(3):
        a, b = v[k], v[(k + 1) % 3]
        t = np.clip(np.dot(p - a, b - a) / np.dot(b - a, b - a), 0, 1)
        out = min(out, np.linalg.norm(p - a - t * (b - a)))
    return out


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


@pytest.mark.slow
def test_touch_grid_contacts(touch):
    """Ellipsoid on the height field at 20 states: same pairs, same contact counts (up
    to mjMAXCONPAIR per pair), in MuJoCo's prism order. MuJoCo's EPA stops at
    ccd_tolerance 1e-6; simjax polishes the separation per prism feature. Distances to
    2e-6 (measured 9.5e-7), normals to 5e-3 (1.6e-3), positions to 1e-3 (2.5e-4): near
    the optimum the separation is flat in the normal, so EPA's normal and witness
    errors are about the square root of its depth error. Plane contacts exact."""
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


# --------------------------------------------------------------------------- geom types
_RNG_ELEV = np.random.default_rng(1).uniform(0, 1, 42)
_SCENE = """
<mujoco>
 <asset><hfield name="h" nrow="6" ncol="7" size="0.6 0.5 0.2 0.1"
         elevation="{elev}"/>
  <mesh name="tet" vertex="0 0 0.08  0.07 0 -0.03  -0.05 0.06 -0.03  -0.04 -0.07 -0.02
                           0.02 0.03 0.05"/></asset>
 <worldbody>
  <geom type="hfield" hfield="h" pos="0.1 -0.05 0.02" euler="0.1 0.2 0.3" margin="{m}"/>
  <body pos="0 0 0.3"><freejoint/><geom {geom} margin="{m}"/></body>
 </worldbody>
</mujoco>"""


def scene(geom, margin):
    from mujoco_oracle import model_from_mujoco
    mjm = mujoco.MjModel.from_xml_string(_SCENE.format(
        elev=" ".join(map(str, _RNG_ELEV)), geom=geom, m=margin))
    return mjm, model_from_mujoco(mjm)


def scene_states(mjm, n, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        q = mjm.qpos0.copy()
        q[:2] = rng.uniform(-0.7, 0.7, 2)
        q[2] = rng.uniform(-0.05, 0.3)
        quat = rng.standard_normal(4)
        q[3:7] = quat / np.linalg.norm(quat)
        out.append(q)
    return out


def run_scene(geom, margin, n):
    mjm, m = scene(geom, margin)
    f = jax.jit(lambda d: driver.collision(m, d))
    d0 = io.make_data(m)
    mjd = mujoco.MjData(mjm)
    for q in scene_states(mjm, n):
        mjd.qpos[:] = q
        mujoco.mj_forward(mjm, mjd)
        d = f(poses(d0, mjd))
        assert int(d.warning[WARN_CONTACTFULL]) == 0
        yield jax.tree_util.tree_map(np.asarray, d.contact), mjd


@pytest.mark.slow
@pytest.mark.parametrize("geom,radius", [('type="sphere" size="0.07"', 0.07),
                                         ('type="capsule" size="0.05 0.1"', 0.05)])
@pytest.mark.parametrize("margin", [0.0, 0.01])
def test_sphere_capsule_random_field(geom, radius, margin):
    """Sphere and capsule on a tilted random 6 x 7 height field (margin 0 and 1 cm):
    every contact as MuJoCo's (selection by sub-grid, margin, order), exact off the
    EPA path."""
    ns = 0
    for c, mjd in run_scene(geom, margin, 60):
        ns += compare(c, mjd, lambda key: radius)[0]
    assert ns >= 30


@pytest.mark.slow
@pytest.mark.parametrize("margin", [0.0, 0.01])
def test_ellipsoid_random_field(margin):
    """Ellipsoid on the random height field: same contacts; distances to MuJoCo's EPA
    accuracy (measured: median 2e-7, 99% within 7e-6, max 9e-4 on a deep overlap)."""
    errs = []
    for c, mjd in run_scene('type="ellipsoid" size="0.05 0.08 0.1"', margin, 100):
        ours, theirs = contacts(c), mj_contacts(mjd)
        assert set(ours) == set(theirs)
        for key, mcs in theirs.items():
            assert len(ours[key]) == len(mcs)
            errs += [abs(c.dist[i] - mc.dist) for i, mc in zip(ours[key], mcs)]
    errs = np.asarray(errs)
    print("ellipsoid dist errors: median, 99%, max", np.quantile(errs, [0.5, 0.99, 1]))
    assert len(errs) > 100 and np.median(errs) < 1e-6
    assert np.quantile(errs, 0.99) < 2e-5 and errs.max() < 1e-2


@pytest.mark.parametrize("geom", [
    'type="box" size="0.05 0.08 0.06"',
    pytest.param('type="cylinder" size="0.05 0.08"', marks=pytest.mark.slow),
    pytest.param('type="mesh" mesh="tet"', marks=pytest.mark.slow)])
def test_box_cylinder_mesh_random_field(geom):
    """Boxes, cylinders and meshes (margin 1 cm): same contacting pairs and counts as
    MuJoCo in every state; distances within 1e-5 of MuJoCo's (measured at most 7.6e-7,
    9.4e-7, 7.7e-7 for box, mesh, cylinder: GJK's and EPA's tolerance). Apart within
    the margin, a box's or mesh's distance is exact where the closest points are a
    vertex and an edge or vertex (the separating axes alone bound it from below: up to
    2.7e-3 and 6.8e-5 off). Penetrating contacts' positions within 1e-3 (measured at
    most 1.5e-4, 9.4e-5, 5.1e-4, 90% within 3.9e-5, 3.4e-5, 1.1e-4: MuJoCo's EPA witness
    where the contact point is not unique). Where an edge of the geom crosses a prism
    edge the contact is at their crossing, as EPA's witnesses: simjax took an end of the
    geom's edge, up to 0.15 away (90% of penetrating contacts within 0.09-0.1). With
    margin 0 MuJoCo 4.0.0 reports, for box / prism overlaps, contacts that are not the
    minimum-translation penetration (e.g. a box corner 2.8 cm into flat ground at dist
    -1.7 cm along a tilted normal); simjax returns the exact separating-axis
    penetration, so margin 0 is not compared. Cylinders refine with steps on the ridges
    of the cylinder and the prism; with plain steps (and an edge's end as the witness)
    the count differed in 2 of 100 states, a distance by 1.4e-2 and a position by
    0.16."""
    errs, perr = [], []
    for c, mjd in run_scene(geom, 0.01, 100):
        ours, theirs = contacts(c), mj_contacts(mjd)
        assert set(ours) == set(theirs)
        for key, mcs in theirs.items():
            assert len(ours[key]) == len(mcs)
            errs += [abs(c.dist[i] - mc.dist) for i, mc in zip(ours[key], mcs)]
            perr += [np.linalg.norm(c.pos[i] - mc.pos)
                     for i, mc in zip(ours[key], mcs) if mc.dist < 0]
    errs, perr = np.asarray(errs), np.asarray(perr)
    print(geom, "dist errors: median, 90%, max", np.quantile(errs, [0.5, 0.9, 1]),
          "position errors (penetrating)", np.quantile(perr, [0.5, 0.9, 1]))
    assert len(errs) > 100 and np.median(errs) < 1e-6 and errs.max() < 1e-5
    assert len(perr) > 100 and np.quantile(perr, 0.9) < 1e-3 and perr.max() < 1e-3


# --------------------------------------------------------------------------- gradients
def _quat_mat(q):
    w, x, y, z = q / jnp.linalg.norm(q)
    return jnp.array([[1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
                      [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
                      [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)]])


@pytest.mark.parametrize("geom", ['type="sphere" size="0.07"', pytest.param(
    'type="capsule" size="0.05 0.1"', marks=pytest.mark.slow)])
def test_grad_contact_distance(geom):
    """d(sum of valid contact distances)/d(qpos) through the height-field collider:
    finite, and equal to central differences."""
    mjm, m = scene(geom, 0.0)
    d0 = io.make_data(m)
    mjd = mujoco.MjData(mjm)
    mujoco.mj_kinematics(mjm, mjd)
    hp, hm = jnp.asarray(mjd.geom_xpos[0]), jnp.asarray(mjd.geom_xmat[0]).reshape(3, 3)
    q0 = np.array([0.13, 0.02, 0.13, 0.95, 0.2, -0.1, 0.2])
    q0[3:] /= np.linalg.norm(q0[3:])

    def total(q):
        xpos = jnp.stack([hp, q[:3]])
        xmat = jnp.stack([hm, _quat_mat(q[3:7])])
        c = driver.collision(m, d0.replace(geom_xpos=xpos, geom_xmat=xmat)).contact
        return jnp.sum(jnp.where(c.valid, c.dist, 0.0)), jnp.sum(c.valid)

    f = jax.jit(jax.value_and_grad(total, has_aux=True))     # one compile
    (_, n0), g = f(jnp.asarray(q0))
    g = np.asarray(g)
    assert int(n0) >= 1
    assert np.all(np.isfinite(g))
    eps = 1e-6
    for k in range(7):
        dq = np.zeros(7)
        dq[k] = eps
        ((fp, np_), _), ((fm, nm), _) = f(jnp.asarray(q0 + dq)), f(jnp.asarray(q0 - dq))
        assert int(np_) == int(nm) == int(n0)
        assert abs((float(fp) - float(fm)) / (2 * eps) - g[k]) < 1e-5


@pytest.mark.slow
def test_barkour_traced_model(barkour):
    """With the Model traced (jit argument), margins are not known at trace time: the
    window grows by one cell, the capacity and its split stay, contacts are the same as
    with the Model closed over (margins concrete)."""
    mjm, m, g = barkour
    d0 = io.make_data(m)
    f = jax.jit(lambda d: driver.collision(m, d))
    mjd = mujoco.MjData(mjm)
    for q in barkour_states(mjm, 3, seed=7):
        mjd.qpos[:] = q
        mujoco.mj_forward(mjm, mjd)
        a = jax.tree_util.tree_map(np.asarray, f(poses(d0, mjd)).contact)
        b = jax.tree_util.tree_map(np.asarray, g(poses(d0, mjd)).contact)
        np.testing.assert_array_equal(a.valid, b.valid)
        np.testing.assert_array_equal(a.dim, b.dim)
        np.testing.assert_allclose(a.dist, b.dist, atol=1e-12)
        np.testing.assert_allclose(a.pos, b.pos, atol=1e-12)


@pytest.mark.slow
def test_contact_limit_and_order():
    """A 15 cm sphere pressed into a fine 24 x 24 random height field touches more than
    50 prisms: MuJoCo keeps the first mjMAXCONPAIR = 50 in row / column / triangle
    order, and so does simjax (all shallow: exact)."""
    from mujoco_oracle import model_from_mujoco
    elev = np.random.default_rng(2).uniform(0, 1, 24 * 24)
    mjm = mujoco.MjModel.from_xml_string(f"""
    <mujoco><asset><hfield name="h" nrow="24" ncol="24" size="0.3 0.3 0.03 0.05"
            elevation="{' '.join(map(str, elev))}"/></asset>
     <worldbody><geom type="hfield" hfield="h"/>
      <body><freejoint/><geom type="sphere" size="0.15"/></body></worldbody></mujoco>""")
    m = model_from_mujoco(mjm)
    fn = [g.fn for g in driver.plan(m).groups if getattr(g.fn, "hfield", False)][0]
    assert fn.maxcon == hfield.MAXCONPAIR
    f = jax.jit(lambda d: driver.collision(m, d))
    d0 = io.make_data(m)
    mjd = mujoco.MjData(mjm)
    full = 0
    for x, y, z in [(0.0, 0.0, 0.12), (0.1, -0.05, 0.125), (-0.2, 0.15, 0.17)]:
        mjd.qpos[:3] = [x, y, z]
        mujoco.mj_forward(mjm, mjd)
        c = jax.tree_util.tree_map(np.asarray, f(poses(d0, mjd)).contact)
        compare(c, mjd, lambda key: 0.15)
        full += mjd.ncon == hfield.MAXCONPAIR
    assert full >= 1


def test_capacity_per_radius():
    """Two spheres with one window size (2 x 2 cells) but different bounding radii keep
    their own disc-cover capacities (6 and 7), whichever collider was made first."""
    xml = """<mujoco><asset><hfield name="h" nrow="6" ncol="6" size="0.35 0.35 0.1 0.05"
     elevation="%s"/></asset><worldbody><geom type="hfield" hfield="h"/>
     <body pos="0 0 0.2"><freejoint/><geom type="sphere" size="0.014"/></body>
     <body pos="0.1 0 0.2"><freejoint/><geom type="sphere" size="0.05"/></body>
    </worldbody></mujoco>""" % " ".join(["0"] * 36)
    m = simjax.load_model(xml)
    assert hfield.window(m, 0, 1, margin=False) == hfield.window(m, 0, 2, margin=False)
    assert hfield.collider_for(m, 0, 1).maxcon == 6
    assert hfield.collider_for(m, 0, 2).maxcon == 7
