"""Ray casting against height fields (simjax.engine.ray.ray_hfield) against mujoco.mj_ray,
float64.

The height field is our own: random elevations on a 7 x 9 grid (tilted) and a 12 x 5 grid,
beside a second, smaller field on a free body. Distances agree to ~5e-14 (seen), so the
tolerance is 1e-11 in units of |vec| (about 1); normals and geom ids agree exactly up to
the same round-off, grid-vertex ties included.
"""
import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import pytest

import simjax
from mujoco_oracle import model_from_mujoco
from sensor_helpers import assert_sensors_match, oracle
from simjax.engine import make_data, ray, smooth

TOL = 1e-11
SIZE = (1.2, 0.8, 0.5, 0.2)
POS = np.array([0.1, -0.1, 0.0])


def _xml(nrow, ncol, tilt, seed=0):
    elev = np.random.default_rng(seed).uniform(0, 1, (nrow, ncol))
    e = " ".join(f"{v:.4f}" for v in elev.ravel())
    quat = 'quat="0.98 0.1 -0.1 0.1"' if tilt else ""
    return f"""<mujoco>
  <asset>
    <hfield name="h" nrow="{nrow}" ncol="{ncol}" size="{' '.join(map(str, SIZE))}"
            elevation="{e}"/>
    <hfield name="h2" nrow="4" ncol="4" size="0.3 0.3 0.2 0.1"
            elevation="0 1 0 1 1 0 1 0 0 0 0 0 1 1 1 1"/>
  </asset>
  <worldbody>
    <geom name="hf" type="hfield" hfield="h" pos="{' '.join(map(str, POS))}" {quat}/>
    <body name="b" pos="2 0 0.5"><freejoint/><geom name="hf2" type="hfield" hfield="h2"/>
    </body>
    <body name="probe" pos="0.3 0.2 1.5"><freejoint/><geom size="0.05"/>
      <site name="s0" zaxis="0 0 -1"/><site name="s1" zaxis="1 0.2 -1"/>
      <site name="s2" zaxis="1 0 0"/>
    </body>
  </worldbody>
  <sensor>
    <rangefinder site="s0"/><rangefinder site="s1"/><rangefinder site="s2"/>
  </sensor>
</mujoco>"""


def _models(nrow, ncol, tilt):
    xml = _xml(nrow, ncol, tilt)
    mjm = mujoco.MjModel.from_xml_string(xml)
    mjd = mujoco.MjData(mjm)
    mujoco.mj_forward(mjm, mjd)
    return mjm, mjd, (model_from_mujoco(mjm), simjax.load_model(xml))


def _mj_rays(mjm, mjd, pnt, vec):
    dist, gid, nrm = np.zeros(len(pnt)), np.zeros(len(pnt), int), np.zeros((len(pnt), 3))
    for k in range(len(pnt)):
        g = np.array([-1], np.int32)
        dist[k] = mujoco.mj_ray(mjm, mjd, pnt[k], vec[k], None, 1, -1, g, nrm[k])
        gid[k] = g[0]
    return dist, gid, nrm


def _compare(m, mjm, mjd, pnt, vec):
    d = jax.jit(smooth.kinematics)(m, make_data(m))
    fn = jax.jit(lambda p, v: ray.ray(m, d, p, v, np.full(len(pnt), -1)))
    dist, gid, nrm = map(np.asarray, fn(jnp.asarray(pnt), jnp.asarray(vec)))
    ref_dist, ref_gid, ref_nrm = _mj_rays(mjm, mjd, pnt, vec)
    np.testing.assert_array_equal(gid, ref_gid)
    np.testing.assert_allclose(dist, ref_dist, rtol=0, atol=TOL)
    np.testing.assert_allclose(nrm, ref_nrm, rtol=0, atol=TOL)
    return ref_gid, ref_nrm


@pytest.mark.parametrize("nrow,ncol,tilt", [(7, 9, True), (12, 5, False)])
def test_random_rays(nrow, ncol, tilt):
    """1500 random rays (vertical, horizontal, grazing and general; from above, below
    and beside the fields) with both Model builds: the surface, the base box and the
    side walls are all hit."""
    mjm, mjd, models = _models(nrow, ncol, tilt)
    rng = np.random.default_rng(1)
    n = 1500
    pnt = rng.uniform(-1.8, 1.8, (n, 3)) * [1, 1, 0.6] + [0.5, 0, 0.3]
    vec = rng.uniform(-1.4, 1.4, (n, 3)) * [1.3, 1, 0.3] + [0.5, 0, 0.2] - pnt
    vec[:150, :2] = 0
    vec[150:300, 2] = 0
    vec[300:450, 2] *= 1e-3
    for m in models:
        gid, nrm = _compare(m, mjm, mjd, pnt, vec)
    assert np.sum(gid == 0) > 500 and np.sum(gid == 1) > 15 and np.sum(gid == -1) > 300
    # local normals of field 0: surface (up), base box bottom (down), side walls
    if not tilt:
        nz = nrm[gid == 0, 2]
        assert np.any(nz > 0.1) and np.any(nz == -1) and np.any(np.abs(nz) < 1e-12)


def test_grid_vertex_and_edge_rays():
    """Rays through grid vertices and cell edges, where several triangles tie: the hit
    triangle (its normal) is MuJoCo's first in row, column, triangle order."""
    nrow, ncol = 12, 5
    mjm, mjd, models = _models(nrow, ncol, False)
    dx, dy = 2 * SIZE[0] / (ncol - 1), 2 * SIZE[1] / (nrow - 1)
    cs, rs = np.meshgrid(np.arange(ncol) * dx - SIZE[0] + POS[0],
                         np.arange(nrow) * dy - SIZE[1] + POS[1])
    pts = np.stack([cs.ravel(), rs.ravel(), np.ones(cs.size)], -1)
    pnt = np.concatenate([pts, pts + [dx / 2, 0, 0], pts + [0, dy / 2, 0]])
    vec = np.tile([0, 0, -1.0], (len(pnt), 1))
    vec[len(pnt) // 2:] += [0.3, 0.2, 0]
    for m in models:
        gid, _ = _compare(m, mjm, mjd, pnt, vec)
    assert np.sum(gid == 0) > 100


def test_rangefinders_over_terrain():
    """Rangefinder sensors on a free body over the terrain at random states."""
    mjm, _, _ = _models(7, 9, True)
    mjm, m = oracle(mjm)
    worst = assert_sensors_match(mjm, m, tol=TOL)
    assert set(worst) == {"rangefinder"}


def test_gradient_of_distance():
    """jax.grad of a surface hit's distance with respect to the ray origin matches
    central differences (the hit triangle does not change within the step)."""
    mjm, _, (m, _) = _models(7, 9, True)
    d = jax.jit(smooth.kinematics)(m, make_data(m))
    vec = jnp.asarray([[0.2, -0.1, -1.0]])

    @jax.jit
    def dist(p):
        x, gid, _ = ray.ray(m, d, p[None], vec, np.array([-1]))
        return x[0], gid[0]

    p0 = jnp.asarray([0.35, 0.15, 1.0])
    x0, gid = dist(p0)
    assert int(gid) == 0 and float(x0) > 0
    g = np.asarray(jax.jit(jax.grad(lambda p: dist(p)[0]))(p0))
    h = 1e-6
    fd = [(float(dist(p0 + h * e)[0]) - float(dist(p0 - h * e)[0])) / (2 * h)
          for e in np.eye(3)]
    np.testing.assert_allclose(g, fd, rtol=1e-6, atol=1e-8)
    assert np.abs(g).max() > 0.1


# --------------------------------------------------------------------------- SDF geoms
SDF_SHAPES = {"torus": '<config key="radius1" value=".3"/><config key="radius2" value=".1"/>',
              "bowl": "", "gear": '<config key="teeth" value="12"/>', "nut": "", "bolt": ""}


def _sdf_xml():
    ext = "".join(f'<plugin plugin="mujoco.sdf.{s}"><instance name="{s}">{c}</instance>'
                  "</plugin>" for s, c in SDF_SHAPES.items())
    ast = "".join(f'<mesh name="{s}"><plugin instance="{s}"/></mesh>' for s in SDF_SHAPES)
    bodies = "".join(f'<body pos="{1.2 * k} 0 0" euler="{20 * k} {10 * k} 0"><geom type="sdf" '
                     f'mesh="{s}"><plugin instance="{s}"/></geom></body>'
                     for k, s in enumerate(SDF_SHAPES))
    return (f"<mujoco><extension>{ext}</extension><asset>{ast}</asset>"
            f"<worldbody>{bodies}</worldbody></mujoco>")


def test_sdf_rays():
    """Rays at the five SDF plugin shapes, some with non-unit directions (MuJoCo returns
    the marched length over |vec|). Distances agree to ~3e-15 (seen); normals of the
    torus to ~4e-15, of the bowl, gear, nut and bolt to 2.5e-7, whose MuJoCo gradients
    are finite differences (simjax's are exact): tolerance 1e-6 there."""
    xml = _sdf_xml()
    mjm = mujoco.MjModel.from_xml_string(xml)
    mjd = mujoco.MjData(mjm)
    mujoco.mj_forward(mjm, mjd)
    m = simjax.load_model(xml)
    rng = np.random.default_rng(1)
    n = 400
    tgt = mjd.geom_xpos[rng.integers(0, mjm.ngeom, n)] + rng.normal(0, 0.15, (n, 3))
    pnt = tgt + rng.normal(0, 1, (n, 3))
    vec = (tgt - pnt) / np.linalg.norm(tgt - pnt, axis=1, keepdims=True)
    vec[:120] *= rng.uniform(0.5, 2, (120, 1))
    d = jax.jit(smooth.kinematics)(m, make_data(m))
    fn = jax.jit(lambda p, v: ray.ray(m, d, p, v, np.full(n, -1)))
    dist, gid, nrm = map(np.asarray, fn(jnp.asarray(pnt), jnp.asarray(vec)))
    ref_dist, ref_gid, ref_nrm = _mj_rays(mjm, mjd, pnt, vec)
    np.testing.assert_array_equal(gid, ref_gid)
    np.testing.assert_allclose(dist, ref_dist, rtol=0, atol=TOL)
    torus = ref_gid == 0
    np.testing.assert_allclose(nrm[torus], ref_nrm[torus], rtol=0, atol=TOL)
    np.testing.assert_allclose(nrm, ref_nrm, rtol=0, atol=1e-6)
    assert set(np.unique(ref_gid)) == {-1, 0, 1, 2, 3, 4}

    # the distance's derivative (implicit, at the hit) against central differences
    k = int(np.nonzero(torus & (np.arange(n) >= 120))[0][0])

    @jax.jit
    def one(p):
        return ray.ray(m, d, p[None], jnp.asarray(vec[k:k + 1]), np.array([-1]))[0][0]

    p0 = jnp.asarray(pnt[k])
    g = np.asarray(jax.jit(jax.grad(one))(p0))
    h = 1e-6
    fd = [(float(one(p0 + h * e)) - float(one(p0 - h * e))) / (2 * h) for e in np.eye(3)]
    np.testing.assert_allclose(g, fd, rtol=1e-5, atol=1e-7)


# --------------------------------------------------------------------------- filters
FILTER_XML = """<mujoco><worldbody>
  <geom type="plane" size="3 3 .1" group="1"/>
  <geom type="box" size=".2 .2 .2" pos="0 0 .2" group="2"/>
  <geom type="sphere" size=".2" pos="1 0 .2" group="7" rgba="1 0 0 1"/>
  <body name="b" pos="0 1 .5"><freejoint/>
    <geom type="capsule" size=".1 .2" group="0"/>
    <geom type="ellipsoid" size=".1 .2 .3" pos=".4 0 0" group="3"/>
    <geom type="cylinder" size=".2 .1" pos="-.4 0 0" group="-1"/>
  </body>
</worldbody></mujoco>"""


@pytest.mark.parametrize("geomgroup,flg_static", [
    (None, True), (None, False), ((1, 0, 1, 0, 0, 1), True), ((0, 1, 0, 1, 1, 0), False)])
def test_geomgroup_and_static_filters(geomgroup, flg_static):
    """mj_ray's geomgroup and flg_static filters (groups clipped to 0..5) and body
    exclusion, against rays aimed at every geom."""
    mjm = mujoco.MjModel.from_xml_string(FILTER_XML)
    mjd = mujoco.MjData(mjm)
    mujoco.mj_forward(mjm, mjd)
    m = model_from_mujoco(mjm)
    d = jax.jit(smooth.kinematics)(m, make_data(m))
    rng = np.random.default_rng(2)
    n = 300
    tgt = mjd.geom_xpos[rng.integers(1, mjm.ngeom, n)] + rng.normal(0, 0.1, (n, 3))
    pnt = tgt + rng.normal(0, 1.5, (n, 3)) + [0, 0, 1.0]
    vec = tgt - pnt
    excl = rng.choice([-1, 0, 1], n)
    fn = jax.jit(lambda p, v: ray.ray(m, d, p, v, excl, geomgroup, flg_static))
    dist, gid, nrm = map(np.asarray, fn(jnp.asarray(pnt), jnp.asarray(vec)))
    group = None if geomgroup is None else np.asarray(geomgroup, np.uint8)
    seen = set()
    for k in range(n):
        g = np.array([-1], np.int32)
        nr = np.zeros(3)
        ref = mujoco.mj_ray(mjm, mjd, pnt[k], vec[k], group, int(flg_static), int(excl[k]),
                            g, nr)
        assert gid[k] == g[0]
        np.testing.assert_allclose(dist[k], ref, rtol=0, atol=TOL)
        np.testing.assert_allclose(nrm[k], nr, rtol=0, atol=TOL)
        seen.add(int(g[0]))
    assert len(seen - {-1}) >= 1
