"""Cylinder contact patches (MuJoCo 4.0's multicontact with a cylinder cap as a 16-gon)
against MuJoCo 4.0.0 (float64) on small scenes written here: a free cylinder resting on
a box, on a flat mesh slab or on a wider cylinder's cap, with its cap down (tilts under
4 degrees: up to 4 rim points), lying on its side (2 points at the ends of the contact
line) and tilted onto its rim (1 point), at heights around touching; and a free
capsule lying on a mesh slab or a cylinder's cap (2 points) or tilted (1 point)."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import pytest

from engine_helpers import assert_contacts_match, f32, geom_poses
from mujoco_oracle import model_from_mujoco
from simjax.engine import io
from simjax.engine.collision import driver

_SCENE = """<mujoco><asset>
  <mesh name="slab" vertex="-1 -1 -.1  1 -1 -.1  -1 1 -.1  1 1 -.1
                            -1 -1 .1  1 -1 .1  -1 1 .1  1 1 .1"/></asset>
<worldbody>
  <geom {ground} margin="{margin}"/>
  <body pos="0 0 1"><freejoint/><geom type="{free}" size="{size}"/></body>
</worldbody></mujoco>"""
GROUNDS = {"box": 'type="box" size="1 1 .1"', "mesh": 'type="mesh" mesh="slab"',
           "cylinder": 'type="cylinder" size=".5 .1"'}
#: EPA-derived contacts (single rim points, side-line ends): MuJoCo stops EPA at
#: ccd_tolerance 1e-6, which leaves the rim point's azimuth uncertain (measured up to
#: 5.3e-4 in position, 4e-8 in depth, 1.5e-6 in the normal)
EPA_TOL = (1e-3, 1e-6, 1e-5)

_collide = jax.jit(driver.collision)


def _quat(axis, ang):
    axis = np.asarray(axis, float) / np.linalg.norm(axis)
    return np.r_[np.cos(ang / 2), np.sin(ang / 2) * axis]


def _qmul(a, b):
    w1, x1, y1, z1 = a
    w2, x2, y2, z2 = b
    return np.array([w1 * w2 - x1 * x2 - y1 * y2 - z1 * z2,
                     w1 * x2 + x1 * w2 + y1 * z2 - z1 * y2,
                     w1 * y2 - x1 * z2 + y1 * w2 + z1 * x2,
                     w1 * z2 + x1 * y2 - y1 * x2 + z1 * w2])


def _states(mjm, n, seed, mode):
    """Free-cylinder poses: random spin and heading; tilt of the axis from vertical
    under 4 degrees (flat), within 1e-3, 0.3 or 4 degrees of horizontal (side), or
    11-75 degrees (rim); lowest point within [-0.01, 0.004] of the ground's top (0.1)."""
    rng = np.random.default_rng(seed)
    mjd = mujoco.MjData(mjm)
    r, h = mjm.geom_size[1, :2]
    for _ in range(n):
        if mode == "flat":
            ang = rng.uniform(0, np.radians(4))
        elif mode == "side":
            ang = np.pi / 2 + rng.uniform(-1, 1) * np.radians(rng.choice([1e-3, 0.3, 4]))
        else:
            ang = rng.uniform(0.2, 1.3)
        q = mjm.qpos0.copy()
        q[3:7] = _qmul(_quat([0, 0, 1], rng.uniform(0, 2 * np.pi)),
                       _qmul(_quat([1, 0, 0], ang), _quat([0, 0, 1], rng.uniform(0, 7))))
        q[2] = 0
        mjd.qpos[:] = q
        mujoco.mj_kinematics(mjm, mjd)
        az = mjd.geom_xmat[1].reshape(3, 3)[2, 2]
        if mjm.geom_type[1] == mujoco.mjtGeom.mjGEOM_CAPSULE:
            low = -h * abs(az) - r
        else:
            low = -h * abs(az) - r * np.sqrt(max(0.0, 1 - az * az))
        q[2] = 0.1 - low + rng.uniform(-0.01, 0.004)
        yield q


def _cap_vertices(mjm, mjd):
    """World vertices of every cylinder cap's 16-gon (MuJoCo's cap approximation), and
    their projections onto every cap plane along its normal."""
    out, planes = [], []
    ang = np.arange(16) * np.pi / 8
    for g in range(mjm.ngeom):
        if mjm.geom_type[g] != mujoco.mjtGeom.mjGEOM_CYLINDER:
            continue
        r, h = mjm.geom_size[g, :2]
        R = mjd.geom_xmat[g].reshape(3, 3)
        for s in (-1, 1):
            loc = np.stack([r * np.cos(ang), r * np.sin(ang), np.full(16, s * h)], 1)
            out.append(loc @ R.T + mjd.geom_xpos[g])
            planes.append((R[:, 2], mjd.geom_xpos[g] + s * h * R[:, 2]))
    if not out:
        return np.zeros((0, 3))
    v = np.concatenate(out)
    return np.concatenate([v] + [v - np.outer((v - p) @ nz, nz) for nz, p in planes])


def _check(ground, margin, size, modes, n=12, seed=0, free="cylinder"):
    """Compare every state; returns counts of (patch states, patch states where
    MuJoCo's polygonQuad took another of several equal-area quadrilaterals)."""
    xml = _SCENE.format(ground=GROUNDS[ground], margin=margin, size=size, free=free)
    mjm = mujoco.MjModel.from_xml_string(xml)
    mjd = mujoco.MjData(mjm)
    m = model_from_mujoco(mjm)
    d0 = io.make_data(m)
    npatch = ntie = 0
    for mode in modes:
        for q in _states(mjm, n, seed, mode):
            mjd.qpos[:] = q
            mujoco.mj_forward(mjm, mjd)
            d = geom_poses(d0, mjd)
            c = jax.tree_util.tree_map(np.asarray, _collide(m, d).contact)
            idx = np.nonzero(c.valid)[0]
            assert len(idx) == mjd.ncon, (mode, q)
            # face-face patches are closed-form; lines and single points come from EPA
            exact = (mjd.ncon > 2 or (mjd.ncon == 1 and mode == "flat")
                     or free == "capsule")
            caps = _cap_vertices(mjm, mjd)
            tie = False
            for mc in mjd.contact[:mjd.ncon]:
                i = idx[np.argmin([np.linalg.norm(c.pos[j] - mc.pos) for j in idx])]
                err = (np.linalg.norm(c.pos[i] - mc.pos), abs(c.dist[i] - mc.dist),
                       np.abs(c.frame[i].ravel()[:3] - mc.frame[:3]).max())
                if exact and max(err) < 1e-11:
                    continue
                if exact:
                    # another quadrilateral of equal area: MuJoCo's point is still a cap
                    # 16-gon vertex or its projection, at the depth that point has
                    x1 = mc.pos - 0.5 * mc.dist * mc.frame[:3]
                    x2 = mc.pos + 0.5 * mc.dist * mc.frame[:3]
                    near = min(np.linalg.norm(caps - x1, axis=1).min(),
                               np.linalg.norm(caps - x2, axis=1).min())
                    assert mjd.ncon == 4 and near < 1e-12, (mode, q, err)
                    assert np.abs(c.frame[i].ravel()[:3] - mc.frame[:3]).max() < 1e-12
                    tie = True
                    continue
                assert all(e < t for e, t in zip(err, EPA_TOL)), (mode, q, err)
            npatch += mjd.ncon > 1
            ntie += tie
    return npatch, ntie


def test_cylinder_on_box():
    """Cap down: 4 rim points (21 of 24 patch states identical to 1e-11; the others
    differ in MuJoCo's pick among equal-area quadrilaterals of the regular 16-gon, which
    its rounding decides); lying: 2 line ends; tilted: 1 rim point."""
    npatch, ntie = _check("box", 0.0, ".2 .1", ("flat", "side", "tilt"))
    assert npatch >= 15
    assert ntie <= npatch // 3


def test_cylinder_on_cylinder():
    npatch, ntie = _check("cylinder", 0.0, ".2 .1", ("flat", "side", "tilt"))
    assert npatch >= 8
    assert ntie <= npatch // 3


@pytest.mark.slow
@pytest.mark.parametrize("ground,margin,size", [("mesh", 0.0, ".2 .1"),
                                                ("box", 0.01, ".2 .1"),
                                                ("box", 0.0, ".05 .3"),
                                                ("cylinder", 0.0, ".05 .3")])
def test_cylinder_patches_more(ground, margin, size):
    npatch, ntie = _check(ground, margin, size, ("flat", "side", "tilt"), n=20, seed=1)
    assert npatch >= 10
    assert ntie <= npatch // 2


@pytest.mark.parametrize("ground,margin", [("mesh", 0.0), ("cylinder", 0.0),
                                           ("mesh", 0.05), ("cylinder", 0.01)])
def test_capsule_lying_on_face(ground, margin):
    """A capsule's surface line clipped by the face it lies on (2 points, closed form:
    identical to 1e-11, measured 1.5e-12, as its single contacts when tilted). With a
    margin, MuJoCo 4.0.0 takes the line on the capsule inflated by half the margin
    and the partner points on the face raised by half the margin (its ccd inflates
    both shapes by margin / 2), which moves the points along a tilted capsule by
    margin/2 x sin(tilt) and the depths by margin/2 x sin^2(tilt): without that rule
    position errors reached 1.7e-3 and depth errors 1.2e-4 at margin 0.05."""
    npatch, ntie = _check(ground, margin, ".05 .2", ("side", "tilt"), free="capsule")
    assert npatch >= 5 and ntie == 0


_CAP_SCENE = """<mujoco><worldbody><geom type="cylinder" size=".5 .1" margin=".01"/>
  <body pos="0 0 1"><freejoint/><geom type="cylinder" size=".2 .1"/></body>
</worldbody></mujoco>"""


@functools.lru_cache(maxsize=None)
def _cap_models():
    """(mjm, m, a Data of m) of _CAP_SCENE, built once for every pose."""
    mjm = mujoco.MjModel.from_xml_string(_CAP_SCENE)
    m = model_from_mujoco(mjm)
    return mjm, m, io.make_data(m)


def _lying_on_cap(rng, n, cz, gap):
    """The cylinder of _CAP_SCENE lying on the other's cap ``gap`` above it, its axis at
    cosine ``cz`` with the vertical, random spin, heading and place: ``n`` poses as
    (MuJoCo's data after mj_forward, simjax's Data with MuJoCo's geom poses) and the
    model (mjm, m)."""
    mjm, m, d0 = _cap_models()
    out = []
    for _ in range(n):
        mjd = mujoco.MjData(mjm)
        q = _qmul(_quat([0, 0, 1], rng.uniform(0, 2 * np.pi)),
                  _qmul(_quat([1, 0, 0], np.pi / 2 + np.arcsin(cz)),
                        _quat([0, 0, 1], rng.uniform(0, 2 * np.pi))))
        mjd.qpos[:] = np.r_[rng.uniform(-.1, .1, 2), 0.3 + gap, q]
        mujoco.mj_forward(mjm, mjd)
        out.append((mjd, geom_poses(d0, mjd)))
    return (mjm, m), out


def test_cylinder_apart_on_cap():
    """A cylinder lying on a wider cylinder's cap, apart within the margin (1-6 mm,
    margin 0.01): MuJoCo 4.0.0 (GJK) gives the side line's 2 contacts only while the
    two rims' difference in distance times the distance is below about 5e-13
    (``SEP_TOL``; 2h = 0.2 here), else one rim point, where the penetrating rule
    (``CAP_TOL``) kept the line up to tilts of 7e-6. Tilts whose product lies in the
    band where GJK's choice turns are left out. Counts equal; the rim point to 1e-9
    (measured 1.4e-10), the line's ends to 1e-5 (GJK's witnesses along the line:
    measured 6.1e-6), depths and normals to 1e-9."""
    rng = np.random.default_rng(3)
    counts = {1: 0, 2: 0}
    for cz in (0.0, 1e-10, 1e-8, 1e-7, 1e-6, 5e-6):       # cosine of normal and axis
        for gap in (0.001, 0.003, 0.006):
            if 1.5e-13 < cz * 0.2 * gap < 1.5e-12:
                continue
            (_, m), [(mjd, d)] = _lying_on_cap(rng, 1, cz, gap)
            con = jax.tree_util.tree_map(np.asarray, _collide(m, d).contact)
            assert_contacts_match(con, mjd, 1e-9 if mjd.ncon == 1 else 1e-5, 1e-9, 1e-9)
            counts[mjd.ncon] += 1
    assert counts[1] >= 8 and counts[2] >= 6, counts


def test_cylinder_apart_on_cap_float32():
    """The same cylinder lying flat, 5 mm apart (MuJoCo: the line's 2 contacts at every
    pose), in float32: c's rounding (the direction's, up to about 1.5e-5) stays below
    ``SEP_EPS`` epsilons, so every pose keeps the line (measured on these poses: 8 of
    20 with 8 epsilons, 16 with 32, 1 by ``SEP_TOL`` alone)."""
    (_, m), poses = _lying_on_cap(np.random.default_rng(0), 20, 0.0, 0.005)
    assert all(mjd.ncon == 2 for mjd, _ in poses)
    batch = f32(jax.tree_util.tree_map(lambda *x: jnp.stack(x), *[d for _, d in poses]))
    c = jax.jit(jax.vmap(lambda d: driver.collision(f32(m), d)))(batch).contact
    np.testing.assert_array_equal(np.asarray(c.valid).sum(1), 2)


@pytest.mark.slow
@pytest.mark.parametrize("free,size", [("cylinder", ".2 .1"), ("capsule", ".05 .2")])
def test_patch_gradients(free, size):
    """d(sum of depths and positions of the valid contacts)/d(geom positions) against
    central differences, a tilted cylinder (4 points) or capsule (2 points) on a box and
    on a wider cylinder (measured 1.5e-9)."""
    xml = f"""<mujoco><worldbody><geom type="box" size="1 1 .1"/>
      <geom type="cylinder" size=".5 .1" pos="3 0 0"/>
      <body pos="0 0 .199" euler="1 2 0"><freejoint/><geom type="{free}" size="{size}"/></body>
      <body pos="3 0 .199" euler="1 2 0"><freejoint/><geom type="{free}" size="{size}"/></body>
    </worldbody></mujoco>"""
    mjm = mujoco.MjModel.from_xml_string(xml)
    mjd = mujoco.MjData(mjm)
    mujoco.mj_forward(mjm, mjd)
    m = model_from_mujoco(mjm)
    d = geom_poses(io.make_data(m), mjd)

    @jax.jit
    def f(xpos):
        c = driver.collision(m, d.replace(geom_xpos=xpos)).contact
        return (jnp.sum(jnp.where(c.valid, c.dist, 0.0))
                + jnp.sum(jnp.where(c.valid[:, None], c.pos, 0.0)))

    x = np.asarray(d.geom_xpos)
    g = np.asarray(jax.jit(jax.grad(f))(jnp.asarray(x)))
    fd = np.zeros_like(x)
    for i in range(x.shape[0]):
        for j in range(3):
            e = np.zeros_like(x)
            e[i, j] = 1e-6
            fd[i, j] = (f(jnp.asarray(x + e)) - f(jnp.asarray(x - e))) / 2e-6
    assert np.isfinite(g).all()
    assert np.abs(g - fd).max() < 1e-6


def test_capsule_across_cylinder_side():
    """A horizontal capsule pressed against an upright cylinder's side (a crank pin on
    its rod: the slider crank's pair): the normal lies across both axes, so the sign of
    its axial part is rounding (|c| ~ 1e-15); contact within EPA's tolerance of
    MuJoCo's, at heights along the cylinder's side and on its rims. (The case where two
    kernels took that sign differently, fixed in ``_rim_point``, showed only in the
    slider crank's whole collision program: the slow ``test_contacts_wide_states``.)"""
    xml = """<mujoco><worldbody>
      <geom type="cylinder" size=".006 .025" pos="0 .2 .025"/>
      <body><freejoint/><geom type="capsule" size=".01 .075"/></body>
    </worldbody></mujoco>"""
    mjm = mujoco.MjModel.from_xml_string(xml)
    mjd = mujoco.MjData(mjm)
    m = model_from_mujoco(mjm)
    d0 = io.make_data(m)
    rng = np.random.default_rng(3)
    checked = 0
    for k in range(12):
        yaw = rng.uniform(0, 2 * np.pi)
        across = np.array([np.cos(yaw), np.sin(yaw), 0.0])     # capsule axis
        out = np.array([-np.sin(yaw), np.cos(yaw), 0.0])       # from cylinder to capsule
        z = (0.0, 0.05, 0.025, rng.uniform(0, 0.05))[k % 4]
        centre = (np.array([0, 0.2, z]) + out * rng.uniform(0.010, 0.0155)
                  + across * rng.uniform(-0.05, 0.05))
        # the capsule's local z along `across`: a quarter turn about y, then the yaw
        mjd.qpos[:3] = centre
        # and a tilt of ~1e-15 rad, as the crank's chain of rotations leaves it
        tilt = _quat(out, rng.choice([-1, 1]) * rng.uniform(1e-16, 1e-14))
        lying = _qmul(_quat([0, 0, 1], yaw), _quat([0, 1, 0], np.pi / 2))
        mjd.qpos[3:] = _qmul(tilt, lying)
        mujoco.mj_forward(mjm, mjd)
        assert np.abs(mjd.geom_xmat[1].reshape(3, 3)[:, 2] - across).max() < 1e-12
        c = jax.tree_util.tree_map(np.asarray, _collide(m, geom_poses(d0, mjd)).contact)
        idx = np.nonzero(c.valid)[0]
        assert len(idx) == mjd.ncon == 1, (k, mjd.ncon)
        mc, i = mjd.contact[0], idx[0]
        err = (np.linalg.norm(c.pos[i] - mc.pos), abs(c.dist[i] - mc.dist),
               np.abs(c.frame[i].ravel()[:3] - mc.frame[:3]).max())
        assert all(e < t for e, t in zip(err, EPA_TOL)), (k, err)
        checked += 1
    assert checked == 12


_RIDGES = {
    "wedge": ('<asset><mesh name="wedge" vertex="-.2 -.3 -.1  .2 -.3 -.1  0 -.3 0  -.2 .3 '
              '-.1  .2 .3 -.1  0 .3 0"/></asset>', '<geom type="mesh" mesh="wedge"/>'),
    "box edge": ("", '<geom type="box" size=".2 .3 .2" euler="0 45 0" '
                     'pos="0 0 -.2828427"/>')}


@pytest.mark.parametrize("ground", sorted(_RIDGES))
def test_cap_on_ridge(ground):
    """A cylinder standing cap down on a ridge along y at z = 0 (a wedge mesh's, a box's
    edge), tilted 0 to 20 degrees, 60 poses around touching: same contact count as
    MuJoCo 4.0.0 at every pose (37 with 2 contacts, 7 with 1); the 2 contacts are the
    ridge clipped by the cap (geom2's edge in geom1's face), to 1e-12 (measured 7e-17,
    normal 1.3e-14); single contacts (the rim on the ridge: EPA, whose normal is loose
    there) to 1e-4 in position, 1e-6 in depth, 1e-2 in the normal (measured 5.8e-6,
    5.8e-7, 2.0e-3). simjax tried only the cylinder's side edge against the ground's
    faces and gave 1 contact at the 37 poses."""
    asset, geom = _RIDGES[ground]
    mjm = mujoco.MjModel.from_xml_string(
        f'<mujoco>{asset}<worldbody>{geom}<body pos="0 0 .1"><freejoint/>'
        '<geom type="cylinder" size=".05 .03"/></body></worldbody></mujoco>')
    mjd = mujoco.MjData(mjm)
    m = model_from_mujoco(mjm)
    d0 = io.make_data(m)
    rng = np.random.default_rng(5)
    npatch = 0
    for _ in range(60):
        axis = np.r_[rng.standard_normal(2), 0]
        ang = np.radians(rng.choice([0, 0.5, 3, 8, 20]) * rng.uniform(0.5, 1))
        q = np.r_[rng.uniform(-0.02, 0.02, 2), 0, _quat(axis, ang)]
        q[2] = 0.03 * np.cos(ang) + 0.05 * np.sin(ang) + rng.uniform(-0.008, 0.001)
        mjd.qpos[:] = q
        mujoco.mj_forward(mjm, mjd)
        c = jax.tree_util.tree_map(np.asarray, _collide(m, geom_poses(d0, mjd)).contact)
        tol = (1e-12, 1e-12, 1e-12) if mjd.ncon > 1 else (1e-4, 1e-6, 1e-2)
        assert_contacts_match(c, mjd, *tol)
        npatch += mjd.ncon > 1
    assert npatch >= 30


def test_side_segment_across_axis_ignores_rounding():
    """A direction across the cylinder's axis whose axial part is rounding (+-1e-33 or
    +-1e-15, c * c far below CAP_TOL) gives one side segment, from the +z rim to the -z
    rim, whatever that part's sign. Each fusion of XLA's program may round the sign its
    own way; the segment's start and end once took opposite signs there and the side
    segment ran off the cylinder (the slider crank's capsule-cylinder contact 0.05 m off
    MuJoCo's, under the tests' XLA O0)."""
    from simjax.engine.collision import convex_cylinder as CC
    from simjax.engine.collision.primitive import Geom
    q = _quat([1, 2, 3], 0.7)
    mat = jnp.asarray(mujoco_mat(q))
    g = Geom(jnp.asarray([0.1, -0.2, 0.3]), mat, jnp.asarray([0.006, 0.025, 0.0]))
    across = np.cross(np.asarray(mat[:, 2]), [1.0, 0.0, 0.0])
    across /= np.linalg.norm(across)
    sides = []
    for eps in (1e-33, -1e-33, 1e-15, -1e-15):
        u = jnp.asarray(across) + eps * mat[:, 2]
        s = jax.jit(CC._cyl_side)(g, u)
        assert bool(s["line"]) and not bool(s["point"])
        sides.append((np.asarray(s["start"]), np.asarray(s["eend"][0])))
    for start, end in sides:
        np.testing.assert_allclose(start, sides[0][0], atol=1e-15)
        np.testing.assert_allclose(end, sides[0][1], atol=1e-15)
        local = (np.stack([start, end]) - np.asarray(g.pos)) @ np.asarray(mat)
        np.testing.assert_allclose(local[:, 2], [0.025, -0.025], atol=1e-15)
        np.testing.assert_allclose(np.hypot(local[:, 0], local[:, 1]), 0.006, atol=1e-15)


def mujoco_mat(q):
    m = np.zeros(9)
    mujoco.mju_quat2Mat(m, np.asarray(q, float))
    return m.reshape(3, 3)
