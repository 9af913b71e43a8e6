"""SDF plugins and SDF collisions against MuJoCo 4.0.0.

The shapes' static distances are validated through the meshes MuJoCo generates from
them (every mesh field of torus.xml / nutbolt.xml matches, test_compile.py); here the
JAX distances are checked against the numpy ones, gradients against differences, and
the contacts of sdf-sdf and primitive-sdf pairs against MuJoCo's contacts.
"""
import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import pytest

import simjax
from simjax.engine.collision import sdf
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


def _contacts(rel, steps, every):
    """(simjax model, [(MuJoCo data snapshot contacts, geom poses)]) along a MuJoCo run."""
    path = corpus_path(rel)
    m = simjax.load_model(path)
    mjm = mujoco.MjModel.from_xml_path(path)
    mjd = mujoco.MjData(mjm)
    out = []
    for i in range(steps):
        mujoco.mj_step(mjm, mjd)
        if i % every == every - 1:
            mujoco.mj_forward(mjm, mjd)
            cons = [(int(c.geom1), int(c.geom2), c.pos.copy(), float(c.dist),
                     c.frame.reshape(3, 3).copy()) for c in mjd.contact
                    if mjm.geom_type[c.geom2] == mujoco.mjtGeom.mjGEOM_SDF
                    and mjm.geom_type[c.geom1] != mujoco.mjtGeom.mjGEOM_PLANE]
            out.append((cons, mjd.geom_xpos.copy(), mjd.geom_xmat.reshape(-1, 3, 3).copy()))
    return m, out


@pytest.mark.parametrize("rel,steps,every,tol", [
    # torus: analytic gradients as MuJoCo: same arithmetic up to rounding
    ("mujoco_plugin_sdf_torus/torus.xml", 1000, 500, 1e-12),
    # nut / bolt: MuJoCo differentiates with forward differences (step 1e-8), simjax
    # exactly, so descents end within ~1e-8 of each other
    ("mujoco_plugin_sdf_nutbolt/nutbolt.xml", 300, 100, 1e-7)])
def test_contacts_match_mujoco(rel, steps, every, tol):
    m, snaps = _contacts(rel, steps, every)
    pair = jax.jit(sdf.collide_pair, static_argnums=(0, 1, 12, 13))   # one per shape kind
    aabb = np.asarray(m.geom_aabb).reshape(-1, 6)
    size = np.asarray(m.geom_size).reshape(-1, 3)
    total = 0
    for cons, xpos, xmat in snaps:
        for g1, g2 in sorted({(c[0], c[1]) for c in cons}):
            prm = [m.plugin_params[i] if i >= 0 else () for i in m.geom_plugin[[g1, g2]]]
            out = pair(sdf.shape_of(m, g1), sdf.shape_of(m, g2), xpos[g1], xmat[g1],
                       xpos[g2], xmat[g2], aabb[g1], aabb[g2], size[g1], size[g2], prm[0],
                       prm[1], int(m.opt.sdf_initpoints), int(m.opt.sdf_iterations))
            dist, pos, frame, valid = (np.asarray(x) for x in out)
            mine = [c for c in cons if (c[0], c[1]) == (g1, g2)]
            assert valid.sum() == len(mine), (g1, g2)
            for _, _, cpos, cdist, cframe in mine:
                k = np.argmin(np.where(valid, np.linalg.norm(pos - cpos, axis=1), np.inf))
                np.testing.assert_allclose(pos[k], cpos, rtol=0, atol=tol)
                np.testing.assert_allclose(dist[k], cdist, rtol=0, atol=tol)
                np.testing.assert_allclose(frame[k][0], cframe[0], rtol=0, atol=10 * tol)
                total += 1
    assert total >= 20


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
