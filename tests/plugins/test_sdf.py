"""SDF plugins and SDF collisions against MuJoCo 4.0.0.

The shapes' static distances are validated through the meshes MuJoCo generates from
them (every mesh field of torus.xml / nutbolt.xml matches, test_compile.py); here the
JAX distances are checked against the numpy ones, gradients against differences, and
the contacts of sdf-sdf, primitive-sdf and mesh-sdf pairs against MuJoCo's contacts.
"""
import types

import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import pytest

import simjax
from simjax.engine import make_data
from simjax.engine.collision import driver, sdf
from simjax.engine.data import WARN_CONTACTFULL
from simjax.plugins import sdf as sdf_plugins
from mujoco_oracle import corpus_path

SHAPES = {"torus": '<config key="radius1" value=".3"/><config key="radius2" value=".1"/>',
          "bowl": "", "gear": '<config key="teeth" value="12"/>', "nut": "", "bolt": ""}


def _model(shape, config):
    xml = f"""<mujoco><extension><plugin plugin="mujoco.sdf.{shape}">
      <instance name="i">{config}</instance></plugin></extension>
      <asset><mesh name="m"><plugin instance="i"/></mesh></asset>
      <worldbody><body><freejoint/><geom type="sdf" mesh="m"><plugin instance="i"/></geom>
      </body></worldbody></mujoco>"""
    return xml


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_shape_distance_and_gradient(shape):
    xml = _model(shape, SHAPES[shape])
    m = simjax.load_model(xml)
    mjm = mujoco.MjModel.from_xml_string(xml)
    assert m.mesh_vertnum[0] == mjm.mesh_vertnum[0]
    np.testing.assert_allclose(np.asarray(m.mesh_vert), mjm.mesh_vert, atol=2e-6)
    inst, params = m.plugin_specs[0], m.plugin_params[0]
    plugin = sdf_plugins.BY_NAME[f"mujoco.sdf.{shape}"]
    half = plugin.sdf_aabb(inst)[3:]
    pts = np.random.default_rng(0).uniform(-1, 1, (64, 3)) * half
    ref = plugin.sdf_staticdistance(inst, pts)
    dist = jax.vmap(lambda p: plugin.sdf_distance(params, p))(jnp.asarray(pts))
    np.testing.assert_allclose(dist, ref, rtol=0, atol=1e-12)
    grad = jax.vmap(lambda p: plugin.sdf_gradient(params, p))(jnp.asarray(pts))
    eps = 1e-6
    for k in range(3):
        e = np.eye(3)[k] * eps
        fd = (plugin.sdf_staticdistance(inst, pts + e) -
              plugin.sdf_staticdistance(inst, pts - e)) / (2 * eps)
        smooth = np.abs(fd - np.asarray(grad[:, k])) < 1e-5
        assert smooth.mean() > 0.9          # kinks (min/max/floor) excepted
    assert np.all(np.isfinite(np.asarray(grad)))


def test_invalid_attribute():
    xml = _model("torus", '<config key="radius1" value="big"/>')
    with pytest.raises(simjax.MJCFError, match="invalid value 'big'"):
        simjax.load_model(xml)
    with pytest.raises(ValueError):
        mujoco.MjModel.from_xml_string(xml)


def _sdf_pairs(m):
    """Every SDF candidate pair of the collision plan (plane, primitive and SDF with SDF)."""
    p = driver.plan(m)
    ks = np.concatenate([g.cand for g in p.groups if g.fn is driver.sdf_pair])
    return p.g1[ks], p.g2[ks]


@pytest.mark.parametrize("rel,tol", [
    # torus: analytic gradients as MuJoCo: same arithmetic up to rounding (measured
    # 1e-14 on positions, 5e-14 on normals)
    ("mujoco_plugin_sdf_torus/torus.xml", 1e-12),
    # nut / bolt: MuJoCo differentiates with forward differences (step 1e-8), simjax
    # exactly, so descents end within ~1e-8 of each other (measured 2.4e-8 on
    # positions, 1.2e-8 on depths, 4.4e-8 on normals)
    ("mujoco_plugin_sdf_nutbolt/nutbolt.xml", 1e-7)])
def test_contacts_match_mujoco(rel, tol):
    """All SDF pairs (with contacts or not) at 10 states of a 1000-step MuJoCo run: same
    number of contacts per pair, and the same positions, depths and normals."""
    path = corpus_path(rel)
    m = simjax.load_model(path)
    mjm = mujoco.MjModel.from_xml_path(path)
    mjd = mujoco.MjData(mjm)
    g1, g2 = _sdf_pairs(m)
    pairs = jax.jit(lambda xpos, xmat: sdf.collide_pairs(
        m, types.SimpleNamespace(geom_xpos=xpos, geom_xmat=xmat), g1, g2))
    total = 0
    for i in range(1000):
        mujoco.mj_step(mjm, mjd)
        if i % 100 != 99:
            continue
        mujoco.mj_forward(mjm, mjd)
        out = pairs(jnp.asarray(mjd.geom_xpos), jnp.asarray(mjd.geom_xmat.reshape(-1, 3, 3)))
        dist, pos, frame, valid = (np.asarray(x) for x in out)
        for k, (a, b) in enumerate(zip(g1, g2)):
            mine = [c for c in mjd.contact if (c.geom1, c.geom2) == (a, b)]
            assert valid[k].sum() == len(mine), (i, a, b)
            for c in mine:
                j = np.argmin(np.where(valid[k], np.linalg.norm(pos[k] - c.pos, axis=1),
                                       np.inf))
                np.testing.assert_allclose(pos[k, j], c.pos, rtol=0, atol=tol)
                np.testing.assert_allclose(dist[k, j], c.dist, rtol=0, atol=tol)
                np.testing.assert_allclose(frame[k, j, 0], c.frame[:3], rtol=0,
                                           atol=10 * tol)
                total += 1
    assert total >= 40


PRIMITIVES = """<mujoco><option sdf_initpoints="24" sdf_iterations="8"/>
  <extension><plugin plugin="mujoco.sdf.torus"><instance name="big">
    <config key="radius1" value=".6"/><config key="radius2" value=".2"/></instance>
    <instance name="small"><config key="radius1" value=".2"/>
      <config key="radius2" value=".08"/></instance></plugin></extension>
  <asset><mesh name="big"><plugin instance="big"/></mesh>
    <mesh name="small"><plugin instance="small"/></mesh></asset>
  <worldbody><geom type="plane" size="5 5 .1"/>
    <body pos="0 0 .2"><geom type="sdf" mesh="big"><plugin instance="big"/></geom></body>
    <body pos=".6 0 .55" euler="10 20 30"><freejoint/><geom type="box" size=".1 .07 .05"/>
    </body>
    <body pos="-.6 0 .55"><freejoint/><geom type="sphere" size=".08"/></body>
    <body pos="0 .6 .55" euler="80 10 0"><freejoint/><geom type="capsule" size=".05 .1"/>
    </body>
    <body pos="0 -.6 .55" euler="0 30 0"><freejoint/>
      <geom type="ellipsoid" size=".1 .06 .04"/></body>
    <body pos=".42 .42 .55" euler="20 0 40"><freejoint/>
      <geom type="cylinder" size=".07 .05"/></body>
    <body pos="2 0 .3" euler="30 0 0"><freejoint/><geom type="sdf" mesh="small">
      <plugin instance="small"/></geom></body>
  </worldbody></mujoco>"""


def _run_pairs(xml, g_filter, nstep, every):
    """(MuJoCo contacts, our (dist, pos, frame, valid)) of the SDF pairs selected by
    ``g_filter(g1, g2)`` at every ``every``-th state of an ``nstep`` MuJoCo run."""
    m = simjax.load_model(xml)
    mjm = mujoco.MjModel.from_xml_string(xml)
    mjd = mujoco.MjData(mjm)
    g1, g2 = _sdf_pairs(m)
    keep = np.array([g_filter(a, b) for a, b in zip(g1, g2)])
    g1, g2 = g1[keep], g2[keep]
    pairs = jax.jit(lambda xpos, xmat: sdf.collide_pairs(
        m, types.SimpleNamespace(geom_xpos=xpos, geom_xmat=xmat), g1, g2))
    for i in range(nstep):
        mujoco.mj_step(mjm, mjd)
        if i % every == every - 1:
            mujoco.mj_forward(mjm, mjd)
            out = pairs(jnp.asarray(mjd.geom_xpos),
                        jnp.asarray(mjd.geom_xmat.reshape(-1, 3, 3)))
            yield g1, g2, list(mjd.contact), [np.asarray(x) for x in out]


@pytest.mark.slow                      # ~23 s
def test_primitive_sdf_contacts_match_mujoco():
    """Box, sphere, capsule, ellipsoid and cylinder resting on a torus (mjc_SDF with
    MuJoCo's primitive distance fields), at 10 states: same contact count per pair;
    depths to 1e-12. Contacts with depth < 1e-9 lie on the box's edges, where the box
    field's gradient jumps: there the descent ends within 1e-4 of MuJoCo's point and
    the normal is the rounding's choice (measured); all others match to 1e-9."""
    strict = 0
    for g1, g2, cons, (dist, pos, frame, valid) in _run_pairs(
            PRIMITIVES, lambda a, b: a != 0, 400, 40):
        for k, (a, b) in enumerate(zip(g1, g2)):
            mine = [c for c in cons if (c.geom1, c.geom2) == (a, b)]
            assert valid[k].sum() == len(mine), (a, b)
            for c in mine:
                j = np.argmin(np.where(valid[k], np.linalg.norm(pos[k] - c.pos, axis=1),
                                       np.inf))
                np.testing.assert_allclose(dist[k, j], c.dist, rtol=0, atol=1e-12)
                if abs(c.dist) < 1e-9:
                    np.testing.assert_allclose(pos[k, j], c.pos, rtol=0, atol=1e-4)
                    continue
                np.testing.assert_allclose(pos[k, j], c.pos, rtol=0, atol=1e-9)
                np.testing.assert_allclose(frame[k, j, 0], c.frame[:3], rtol=0, atol=1e-9)
                strict += 1
    assert strict >= 200


PLANE_SDF = """<mujoco><extension><plugin plugin="mujoco.sdf.torus"><instance name="t">
    <config key="radius1" value=".2"/><config key="radius2" value=".08"/></instance>
  </plugin></extension>
  <asset><mesh name="t"><plugin instance="t"/></mesh></asset>
  <worldbody><geom type="plane" size="5 5 .1"/>
    <body pos="0 0 .3" euler="{euler}"><freejoint/><geom type="sdf" mesh="t">
      <plugin instance="t"/></geom></body></worldbody></mujoco>"""


@pytest.fixture(scope="module")
def plane_sdf():
    """(xml, simjax model, jitted collision) of a torus SDF falling onto a plane; the
    model structure is the same for every tilt, so one compile serves all."""
    xml = PLANE_SDF.format(euler="30 10 0")
    m = simjax.load_model(xml)
    return m, jax.jit(driver.collision)


@pytest.mark.parametrize("euler", ["30 10 0", "0 0 0", "80 7 20"])
def test_plane_sdf_contacts_match_mujoco(plane_sdf, euler):
    """A plane against an SDF geom collides with the SDF geom's mesh, as MuJoCo 4.0
    (mjc_PlaneConvex on the mesh's convex hull: the deepest hull vertex and the other
    corners of the largest quadrilateral of the hull polygon there): same contacts as
    MuJoCo at every 25th state of a 200-step fall (tilted, flat, nearly on its rim);
    positions, depths and frames to 1e-12 (measured 6e-17). A torus resting exactly
    symmetric on its rim has two equally deep vertices, where MuJoCo's pick follows
    its hull graph walk, not reproduced here, so the rim case is tilted off symmetry."""
    _, collide = plane_sdf
    xml = PLANE_SDF.format(euler=euler)
    m = simjax.load_model(xml)
    mjm = mujoco.MjModel.from_xml_string(xml)
    mjd = mujoco.MjData(mjm)
    d0 = make_data(m)
    total = 0
    for i in range(200):
        mujoco.mj_step(mjm, mjd)
        if i % 25 != 24:
            continue
        mujoco.mj_forward(mjm, mjd)
        d = d0.replace(geom_xpos=jnp.asarray(mjd.geom_xpos),
                       geom_xmat=jnp.asarray(mjd.geom_xmat.reshape(-1, 3, 3)))
        c = jax.tree_util.tree_map(np.asarray, collide(m, d).contact)
        idx = np.nonzero(c.valid)[0]
        assert len(idx) == mjd.ncon, i
        for mc in mjd.contact[:mjd.ncon]:
            j = idx[np.argmin(np.linalg.norm(c.pos[idx] - mc.pos, axis=1))]
            np.testing.assert_allclose(c.pos[j], mc.pos, rtol=0, atol=1e-12)
            np.testing.assert_allclose(c.dist[j], mc.dist, rtol=0, atol=1e-12)
            np.testing.assert_allclose(c.frame[j].ravel(), mc.frame, rtol=0, atol=1e-12)
            total += 1
    assert total >= 4


def test_contact_capacity_and_overflow():
    """SDF pairs get sdf_initpoints slots each; more contacts than slots are dropped and
    flagged in Data.warning[WARN_CONTACTFULL]."""
    xml = """<mujoco><option sdf_initpoints="12" sdf_iterations="6"/>
      <extension><plugin plugin="mujoco.sdf.torus"><instance name="t">
        <config key="radius1" value=".3"/><config key="radius2" value=".1"/>
      </instance></plugin></extension>
      <asset><mesh name="t"><plugin instance="t"/></mesh></asset>
      <worldbody><geom type="sdf" mesh="t"><plugin instance="t"/></geom>
        <body pos="0 0 .17"><freejoint/><geom type="sdf" mesh="t">
          <plugin instance="t"/></geom></body></worldbody></mujoco>"""
    m = simjax.load_model(xml)
    assert driver.contact_capacity(m) == 12          # one pair: 12 starting points
    mjm = mujoco.MjModel.from_xml_string(xml)
    mjd = mujoco.MjData(mjm)
    mujoco.mj_forward(mjm, mjd)
    assert mjd.ncon > 4
    col = jax.jit(lambda d: driver.collision(m, d))

    def at_mujoco_poses(d):
        return d.replace(geom_xpos=jnp.asarray(mjd.geom_xpos),
                         geom_xmat=jnp.asarray(mjd.geom_xmat.reshape(-1, 3, 3)))
    full = col(at_mujoco_poses(make_data(m)))
    assert int(full.ncon) == mjd.ncon and int(full.warning[WARN_CONTACTFULL]) == 0
    np.testing.assert_allclose(np.sort(np.asarray(full.contact.dist)[:mjd.ncon]),
                               np.sort(mjd.contact.dist), rtol=0, atol=1e-12)
    small = col(at_mujoco_poses(make_data(m, ncon_max=4)))
    assert int(small.ncon) == 4 and int(small.warning[WARN_CONTACTFULL]) == 1
    kept = np.asarray(small.contact.dist)
    assert all(np.min(np.abs(mjd.contact.dist - x)) < 1e-12 for x in kept)
    # the torus scene: 3 tori, a rod, a stand and the floor: 9 SDF pairs, and 3
    # floor-torus pairs (plane vs the torus mesh: at most 4 contacts each)
    assert driver.contact_capacity(simjax.load_model(
        corpus_path("mujoco_plugin_sdf_torus/torus.xml"))) == 40 * 9 + 4 * 3


@pytest.mark.slow
@pytest.mark.parametrize("rel,tol10,tol100", [
    # same contacts up to rounding: measured |dqpos| 6e-15 at step 10, 5e-14 at step
    # 100; |dqvel| 6e-13 throughout
    ("mujoco_plugin_sdf_torus/torus.xml", (1e-12, 1e-10), (1e-11, 1e-10)),
    # contacts within ~1e-8 (forward-difference gradients in MuJoCo), amplified by the
    # threaded contact: measured |dqpos|, |dqvel| 4.5e-10, 6.8e-8 at step 10;
    # 4.9e-8, 2.5e-5 at step 50; 1.8e-4, 1.4e-2 at step 100 (ncon 5 vs 6 there)
    ("mujoco_plugin_sdf_nutbolt/nutbolt.xml", (1e-8, 1e-6), (1e-2, 1e-1))])
def test_trajectory_matches_mujoco(rel, tol10, tol100):
    """100 steps of the full pipeline (SDF collision, constraints, Newton) from the
    model's initial state against mj_step."""
    path = corpus_path(rel)
    m = simjax.load_model(path)
    mjm = mujoco.MjModel.from_xml_path(path)
    mjd = mujoco.MjData(mjm)

    def body(d, _):
        d = simjax.step(m, d)
        return d, (d.qpos, d.qvel, d.ncon, d.warning[WARN_CONTACTFULL])
    run = jax.jit(lambda d: jax.lax.scan(body, d, None, length=100)[1])
    qpos, qvel, ncon, full = (np.asarray(x) for x in run(make_data(m)))
    assert not full.any()
    err = []
    for i in range(100):
        mujoco.mj_step(mjm, mjd)
        err.append((np.abs(qpos[i] - mjd.qpos).max(), np.abs(qvel[i] - mjd.qvel).max()))
        if i < 50:
            assert ncon[i] == mjd.ncon, i
    assert max(ncon) > 0
    assert err[9][0] < tol10[0] and err[9][1] < tol10[1], err[9]
    assert err[99][0] < tol100[0] and err[99][1] < tol100[1], err[99]


def _depth_fn():
    m = simjax.load_model(corpus_path("mujoco_plugin_sdf_torus/torus.xml"))
    s = sdf.shape_of(m, 1)
    aabb = jnp.asarray(m.geom_aabb).reshape(-1, 6)[1]
    size = jnp.asarray(m.geom_size).reshape(-1, 3)[1]

    def depth(z, radius2):
        """Summed depth and count of contacts between two coaxial tori at height z."""
        params = {"attr": jnp.stack([jnp.asarray(0.35), radius2])}
        dist, _, _, valid = sdf.collide_pair(
            s, s, jnp.zeros(3), jnp.eye(3), jnp.array([0.0, 0.0, z]), jnp.eye(3), aabb, aabb,
            size, size, params, params, 40, 10)
        return jnp.sum(jnp.where(valid, dist, 0.0)), jnp.sum(valid)
    return depth


def test_collision_vmap():
    depth = _depth_fn()
    zs = jnp.linspace(0.25, 0.32, 8)
    _, n = jax.jit(jax.vmap(depth, in_axes=(0, None)))(zs, jnp.asarray(0.15))
    assert np.all(np.asarray(n)[:4] > 0) and n[-1] == 0


@pytest.mark.slow
def test_collision_grad():
    """d(summed depth)/d(z) through the unrolled descent: close to central differences
    (the descent is truncated, so its derivative is not the converged one: 2%)."""
    depth = _depth_fn()
    g = jax.jit(jax.grad(lambda z: depth(z, jnp.asarray(0.15))[0]))(0.27)
    eps = 1e-6
    fd = (depth(0.27 + eps, 0.15)[0] - depth(0.27 - eps, 0.15)[0]) / (2 * eps)
    assert np.isfinite(g) and g > 0
    np.testing.assert_allclose(g, fd, rtol=2e-2)
    gr = jax.jit(jax.grad(lambda r: depth(0.27, r)[0]))(jnp.asarray(0.15))
    assert np.isfinite(gr) and gr < 0        # thicker tori overlap more


_TORUS = """<extension><plugin plugin="mujoco.sdf.torus"><instance name="t">
    <config key="radius1" value=".3"/><config key="radius2" value=".1"/></instance>
  </plugin></extension>"""


def test_hfield_sdf_has_no_contacts_as_mujoco():
    """MuJoCo 4.0 has no height-field vs SDF collider (mjc_HFieldSDF warns and returns
    no contacts): simjax warns at trace time and makes no contacts either."""
    xml = f"""<mujoco>{_TORUS}<asset><mesh name="t"><plugin instance="t"/></mesh>
      <hfield name="h" nrow="3" ncol="3" size="1 1 .1 .1"
              elevation="0 0 0 0 0 0 0 0 0"/></asset>
      <worldbody><geom type="hfield" hfield="h"/>
        <body pos="0 0 .19"><freejoint/><geom type="sdf" mesh="t">
          <plugin instance="t"/></geom></body></worldbody></mujoco>"""
    mjm = mujoco.MjModel.from_xml_string(xml)
    mjd = mujoco.MjData(mjm)
    mujoco.mj_forward(mjm, mjd)
    assert mjd.ncon == 0
    m = simjax.load_model(xml)
    with pytest.warns(UserWarning, match="height-field vs SDF"):
        d = driver.collision(m, make_data(m))
    assert int(d.ncon) == 0


def _icosphere(radius, subdiv):
    """(vertex, face) strings of an icosphere mesh."""
    t = (1 + 5 ** .5) / 2
    v = [[-1, t, 0], [1, t, 0], [-1, -t, 0], [1, -t, 0], [0, -1, t], [0, 1, t], [0, -1, -t],
         [0, 1, -t], [t, 0, -1], [t, 0, 1], [-t, 0, -1], [-t, 0, 1]]
    f = [[0, 11, 5], [0, 5, 1], [0, 1, 7], [0, 7, 10], [0, 10, 11], [1, 5, 9], [5, 11, 4],
         [11, 10, 2], [10, 7, 6], [7, 1, 8], [3, 9, 4], [3, 4, 2], [3, 2, 6], [3, 6, 8],
         [3, 8, 9], [4, 9, 5], [2, 4, 11], [6, 2, 10], [8, 6, 7], [9, 8, 1]]
    v = [np.array(x, float) / np.linalg.norm(x) for x in v]
    for _ in range(subdiv):
        mid, nf = {}, []

        def half(a, b):
            key = (min(a, b), max(a, b))
            if key not in mid:
                c = v[a] + v[b]
                v.append(c / np.linalg.norm(c))
                mid[key] = len(v) - 1
            return mid[key]
        for a, b, c in f:
            ab, bc, ca = half(a, b), half(b, c), half(c, a)
            nf += [[a, ab, ca], [b, bc, ab], [c, ca, bc], [ab, bc, ca]]
        f = nf
    return (" ".join(f"{x:.6f}" for x in (np.array(v) * radius).ravel()),
            " ".join(str(i) for i in np.ravel(f)))


_CUBE = ("-.1 -.1 -.1 .1 -.1 -.1 -.1 .1 -.1 .1 .1 -.1 -.1 -.1 .1 .1 -.1 .1 -.1 .1 .1 "
         ".1 .1 .1")


def _mesh_sdf_xml(option, shape, config, mesh):
    return f"""<mujoco>{option}<extension><plugin plugin="mujoco.sdf.{shape}">
      <instance name="s">{config}</instance></plugin></extension>
      <asset><mesh name="s"><plugin instance="s"/></mesh><mesh name="m" {mesh}/></asset>
      <worldbody><body euler="5 -3 10"><geom type="sdf" mesh="s"><plugin instance="s"/>
        </geom></body>
        <body pos=".3 0 .19"><freejoint/><geom type="mesh" mesh="m"/></body>
      </worldbody></mujoco>"""


_TORUS_CFG = '<config key="radius1" value=".3"/><config key="radius2" value=".1"/>'
_BOWL_CFG = ('<config key="height" value=".2"/><config key="radius" value=".5"/>'
             '<config key="thickness" value=".02"/>')
_ICO = _icosphere(.08, 2)

MESH_SDF_CASES = {
    # cube on a torus, MuJoCo's default 40 starts x 10 steps: 50 candidates from the
    # first two faces visited, repeats dropped
    "cube_torus": (_mesh_sdf_xml("", "torus", _TORUS_CFG, f'vertex="{_CUBE}"'),
                   [.3, 0, .17], 1e-12),
    # 320-face sphere on a torus, 5 starts: deep hierarchy, many faces culled
    "sphere_torus": (_mesh_sdf_xml('<option sdf_initpoints="5" sdf_iterations="6"/>',
                                   "torus", _TORUS_CFG,
                                   f'vertex="{_ICO[0]}" face="{_ICO[1]}"'),
                     [.3, 0, .17], 1e-12),
    # cube in a bowl: MuJoCo's bowl gradient is a forward difference (step 1e-8)
    "cube_bowl": (_mesh_sdf_xml('<option sdf_initpoints="8" sdf_iterations="8"/>', "bowl",
                                _BOWL_CFG, f'vertex="{_CUBE}"'), [.1, 0, -.36], 1e-7)}


@pytest.fixture(scope="module")
def cube_torus():
    """(xml, simjax model) of the cube-on-torus mesh-SDF scene, loaded once."""
    xml = MESH_SDF_CASES["cube_torus"][0]
    return xml, simjax.load_model(xml)


@pytest.mark.parametrize("case", ["cube_torus",
                                  pytest.param("sphere_torus", marks=pytest.mark.slow),
                                  pytest.param("cube_bowl", marks=pytest.mark.slow)])
def test_mesh_sdf_contacts_match_mujoco(case, request):
    """Mesh vs SDF (mjc_MeshSDF) at 8 random poses of the mesh around a resting
    contact: the same contacts as MuJoCo 4.0.0, in the same order (the first 50
    Frank-Wolfe candidates in hierarchy order decide which), positions, depths and
    frames to ``tol`` (measured: torus 1.1e-13 (cube) and 1.4e-15 (sphere); bowl
    2.2e-8, from MuJoCo's forward-difference gradient)."""
    xml, center, tol = MESH_SDF_CASES[case]
    m = request.getfixturevalue("cube_torus")[1] if case == "cube_torus" else \
        simjax.load_model(xml)
    mjm = mujoco.MjModel.from_xml_string(xml)
    mjd = mujoco.MjData(mjm)
    g1, g2 = np.array([1]), np.array([0])
    pairs = jax.jit(lambda xpos, xmat: sdf.collide_pairs(
        m, types.SimpleNamespace(geom_xpos=xpos, geom_xmat=xmat), g1, g2))
    rng = np.random.default_rng(0)
    total = 0
    for _ in range(8):
        quat = rng.normal(size=4)
        mjd.qpos[:] = np.concatenate([np.asarray(center) + rng.normal(0, .04, 3),
                                      quat / np.linalg.norm(quat)])
        mujoco.mj_forward(mjm, mjd)
        out = pairs(jnp.asarray(mjd.geom_xpos), jnp.asarray(mjd.geom_xmat.reshape(-1, 3, 3)))
        dist, pos, frame, valid = (np.asarray(x)[0] for x in out)
        mine = [c for c in mjd.contact[:mjd.ncon] if (c.geom1, c.geom2) == (1, 0)]
        idx = np.nonzero(valid)[0]
        assert len(idx) == len(mine)
        for i, c in zip(idx, mine):
            np.testing.assert_allclose(pos[i], c.pos, rtol=0, atol=tol)
            np.testing.assert_allclose(dist[i], c.dist, rtol=0, atol=tol)
            np.testing.assert_allclose(frame[i].ravel(), c.frame, rtol=0, atol=10 * tol)
        total += len(mine)
    assert total >= 12


def test_mesh_sdf_through_driver(cube_torus):
    """The driver sizes mesh-SDF pairs at min(50, nface * sdf_initpoints) slots and
    reports MuJoCo's contacts in MuJoCo's order (measured: positions 2e-16, frames
    3e-15)."""
    xml, m = cube_torus
    assert driver.plan(m).groups[0].maxcon == 50
    mjm = mujoco.MjModel.from_xml_string(xml)
    mjd = mujoco.MjData(mjm)
    collide = jax.jit(lambda xpos, xmat: driver.collision(
        m, make_data(m).replace(geom_xpos=xpos, geom_xmat=xmat)))
    rng = np.random.default_rng(1)
    for _ in range(3):
        quat = rng.normal(size=4)
        mjd.qpos[:] = np.concatenate([[.3, 0, .17] + rng.normal(0, .04, 3),
                                      quat / np.linalg.norm(quat)])
        mujoco.mj_forward(mjm, mjd)
        d = collide(jnp.asarray(mjd.geom_xpos), jnp.asarray(mjd.geom_xmat.reshape(-1, 3, 3)))
        c = jax.tree_util.tree_map(np.asarray, d.contact)
        assert int(d.ncon) == mjd.ncon > 0
        for k in range(mjd.ncon):
            assert tuple(c.geom[k]) == tuple(mjd.contact[k].geom)
            np.testing.assert_allclose(c.pos[k], mjd.contact[k].pos, rtol=0, atol=1e-12)
            np.testing.assert_allclose(c.frame[k].ravel(), mjd.contact[k].frame, rtol=0,
                                       atol=1e-12)


def test_mesh_sdf_grad(cube_torus):
    """Depths differentiate with respect to the mesh's position (finite, and pushing
    the cube down into the torus deepens the contacts)."""
    xml, m = cube_torus
    d0 = make_data(m)
    mjm = mujoco.MjModel.from_xml_string(xml)
    mjd = mujoco.MjData(mjm)
    mujoco.mj_forward(mjm, mjd)
    xmat = jnp.asarray(mjd.geom_xmat.reshape(-1, 3, 3))

    def depth(z):
        xpos = jnp.asarray(mjd.geom_xpos).at[1, 2].set(z)
        dist, _, _, valid = sdf.collide(m, d0.replace(geom_xpos=xpos, geom_xmat=xmat), 1, 0)
        return jnp.sum(jnp.where(valid, dist, 0.0))
    g = jax.jit(jax.grad(depth))(jnp.asarray(mjd.geom_xpos[1, 2]))
    assert np.isfinite(g) and g > 0


@pytest.mark.slow
def test_mesh_sdf_trajectory_matches_mujoco():
    """A cube dropped onto a torus, 400 steps: qpos as MuJoCo's to 1e-12 (measured
    3.5e-14)."""
    xml = MESH_SDF_CASES["cube_torus"][0]
    m = simjax.load_model(xml)
    mjm = mujoco.MjModel.from_xml_string(xml)
    mjd = mujoco.MjData(mjm)
    roll = jax.jit(lambda s: jax.lax.scan(lambda s, _: (simjax.step(m, s), s.qpos), s,
                                          None, length=400))
    qs = np.asarray(roll(make_data(m))[1])
    for i in range(400):
        np.testing.assert_allclose(qs[i], mjd.qpos, rtol=0, atol=1e-12)
        mujoco.mj_step(mjm, mjd)


@pytest.mark.parametrize("kinds", [
    "cylinder", pytest.param("all", marks=pytest.mark.slow)])   # ~9 s, ~28 s
def test_primitive_sdf_depth_gradient(kinds):
    """Reverse-mode derivatives of the primitive-SDF contacts' depths (the PRIMITIVES
    scene after 200 MuJoCo steps, resting on the torus) in the primitives' positions
    (the cylinder's pair; slow: every primitive's): finite everywhere (the cylinder's
    field had sqrt at 0 inside its gradient: NaN derivatives here, and on three of the
    torus scene's six cylinder pairs, which had no contact), and equal to central
    differences (h 1e-6) to 1e-6 where the contact set does not change."""
    m = simjax.load_model(PRIMITIVES)
    mjm = mujoco.MjModel.from_xml_string(PRIMITIVES)
    mjd = mujoco.MjData(mjm)
    for _ in range(200):
        mujoco.mj_step(mjm, mjd)
    mujoco.mj_forward(mjm, mjd)
    g1, g2 = _sdf_pairs(m)
    keep = np.asarray(g1) != 0                        # the primitives, not the plane
    if kinds == "cylinder":
        keep &= mjm.geom_type[np.asarray(g1)] == mujoco.mjtGeom.mjGEOM_CYLINDER
    g1, g2 = g1[keep], g2[keep]
    xmat = jnp.asarray(mjd.geom_xmat.reshape(-1, 3, 3))

    def depth(xpos):
        dist, _, _, valid = sdf.collide_pairs(
            m, types.SimpleNamespace(geom_xpos=xpos, geom_xmat=xmat), g1, g2)
        return jnp.sum(jnp.where(valid, dist, 0.0)), valid

    f = jax.jit(depth)
    grad = jax.jit(jax.grad(lambda x: depth(x)[0]))
    x0 = jnp.asarray(mjd.geom_xpos)
    g = np.asarray(grad(x0))
    assert np.all(np.isfinite(g))
    assert int(np.asarray(f(x0)[1]).sum()) >= (1 if kinds == "cylinder" else 5)
    h, checked = 1e-6, 0
    for geom in np.unique(g1):
        if int(mjm.geom_type[geom]) == mujoco.mjtGeom.mjGEOM_CYLINDER:
            assert np.any(g[geom] != 0)               # the cylinder rests on the torus
        for k in range(3):
            up, dn = f(x0.at[geom, k].add(h)), f(x0.at[geom, k].add(-h))
            if not (np.array_equal(up[1], dn[1]) and np.array_equal(up[1], f(x0)[1])):
                continue
            fd = (float(up[0]) - float(dn[0])) / (2 * h)
            np.testing.assert_allclose(g[geom, k], fd, rtol=0, atol=1e-6)
            checked += 1
    assert checked >= (2 if kinds == "cylinder" else 12)
