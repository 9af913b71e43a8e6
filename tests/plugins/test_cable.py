"""mujoco.elasticity.cable (removed from MuJoCo 4): tested against its documented
physics: torques are minus the gradient of the elastic energy (isotropic sections),
vanish in the reference shape, and act through qfrc_passive in the pipeline."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import simjax
from simjax.engine import forward, make_data, math, support

N = 5


def cable_xml(twist, bend, flat=False, curved=True):
    bodies, close = "", ""
    for i in range(N):
        q = ' quat="0.995 0 0.0998 0"' if (curved and i) else ""
        joint = '<freejoint/>' if i == 0 else '<joint type="ball"/>'
        bodies += (f'<body name="b{i}" pos="{0 if i == 0 else 0.1} 0 {1 if i == 0 else 0}"{q}>'
                   f'{joint}<geom type="capsule" fromto="0 0 0 .1 0 0" size=".01"/>'
                   f'<plugin instance="cable"/>')
        close += "</body>"
    return f"""<mujoco><option><flag gravity="disable"/></option>
      <extension><plugin plugin="mujoco.elasticity.cable"><instance name="cable">
        <config key="twist" value="{twist}"/><config key="bend" value="{bend}"/>
        <config key="flat" value="{'true' if flat else 'false'}"/>
      </instance></plugin></extension>
      <worldbody>{bodies}{close}</worldbody></mujoco>"""


@jax.jit
def plugin_force(m, qpos):
    """qfrc_passive of the plugin alone at ``qpos`` (kinematics and com, then the
    pipeline's passive-plugin hook)."""
    from simjax.engine import smooth
    from simjax.plugins import engine
    d = make_data(m).replace(qpos=qpos)
    d = smooth.com_pos(m, smooth.kinematics(m, d))
    return engine.compute_passive(m, d.replace(qfrc_passive=jnp.zeros(m.nv))).qfrc_passive


def _energy(m, qpos):
    p = m.plugin_params[0]
    b = np.arange(1, N + 1)
    adr = np.asarray(m.jnt_qposadr)[np.asarray(m.body_jntadr)[b]] + np.where(b == 1, 3, 0)
    q = math.quat_mul(jnp.asarray(m.body_quat)[b], qpos[adr[:, None] + np.arange(4)])
    w = math.quat_to_vel(q) - p["omega0"]
    e = 0.5 * jnp.sum(p["stiffness"] * w * w, axis=1) / jnp.where(p["length"] > 0,
                                                                  p["length"], 1.0)
    return jnp.sum(e[1:])


def test_compile():
    m = simjax.load_model(cable_xml(1e6, 2e6))
    assert m.nplugin == 1 and m.plugin_specs[0].bodies == tuple(range(1, N + 1))
    np.testing.assert_array_equal(m.body_plugin, [-1] + [0] * N)
    r = 0.01
    np.testing.assert_allclose(m.plugin_params[0]["stiffness"][2],
                               [np.pi * r ** 4 / 2 * 1e6, np.pi * r ** 4 / 4 * 2e6,
                                np.pi * r ** 4 / 4 * 2e6])
    np.testing.assert_allclose(m.plugin_params[0]["length"], [0, .1, .1, .1, .1])


def test_zero_force_in_reference_shape():
    m = simjax.load_model(cable_xml(1e6, 2e6))
    np.testing.assert_allclose(plugin_force(m, jnp.asarray(m.qpos0)), 0, atol=1e-12)
    flat = simjax.load_model(cable_xml(1e6, 2e6, flat=True))
    assert np.abs(np.asarray(plugin_force(flat, jnp.asarray(flat.qpos0)))).max() > 1e-3


@pytest.mark.slow
def test_forward_adds_plugin_to_qfrc_passive():
    m = simjax.load_model(cable_xml(1e6, 2e6, flat=True))
    d = jax.jit(forward)(m, make_data(m))
    np.testing.assert_allclose(d.qfrc_passive, plugin_force(m, jnp.asarray(m.qpos0)),
                               rtol=1e-12, atol=1e-12)


def test_isotropic_force_is_energy_gradient():
    """With G = E/2 a circular section is isotropic (J G = I E); with a straight
    reference (flat) the generalised force equals -dE/dq exactly (ball-joint dofs in
    local frames, free joint included)."""
    m = simjax.load_model(cable_xml(1e6, 2e6, flat=True))
    rng = np.random.default_rng(0)
    for _ in range(3):
        qpos = support.integrate_pos(m, jnp.asarray(m.qpos0),
                                     jnp.asarray(0.3 * rng.normal(size=m.nv)), 1.0)
        force = plugin_force(m, qpos)
        grad = jax.grad(lambda v: _energy(m, support.integrate_pos(m, qpos, v, 1.0)))(
            jnp.zeros(m.nv))
        np.testing.assert_allclose(force, -grad, rtol=1e-9, atol=1e-9)
        assert np.abs(np.asarray(grad)).max() > 1e-2


@pytest.mark.parametrize("twist", [3e5, 1e6])
def test_small_increments_from_curved_reference(twist):
    """Curved reference (0.2 rad per joint): the torque is K (w - w0) / L while the
    energy gradient is J_r(w)^-T K (w - w0) / L; they agree to O(|w| / 2) = 10%."""
    m = simjax.load_model(cable_xml(twist, 2e6))
    rng = np.random.default_rng(1)
    qpos = support.integrate_pos(m, jnp.asarray(m.qpos0),
                                 jnp.asarray(1e-3 * rng.normal(size=m.nv)), 1.0)
    grad = jax.grad(lambda v: _energy(m, support.integrate_pos(m, qpos, v, 1.0)))(
        jnp.zeros(m.nv))
    scale = np.abs(np.asarray(grad)).max()
    np.testing.assert_allclose(plugin_force(m, qpos), -grad, rtol=0, atol=0.15 * scale)


def test_invalid_config():
    with pytest.raises(simjax.MJCFError, match="Invalid parameter specification"):
        simjax.load_model(cable_xml("stiff", 2e6))
