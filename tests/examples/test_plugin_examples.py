"""The example plugins: a neural-network actuator (one instance, N motors) and a DC
motor + thermometer sharing one stateful instance; jit, vmap over 1024 worlds, grad."""
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import simjax
from simjax.engine import forward, make_data, step

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
from examples import dc_motor, nn_actuator  # noqa: E402


@pytest.fixture(scope="module")
def nn():
    nn_actuator.register()
    return simjax.load_model(nn_actuator.robot_xml(n=3, hidden=8))


@pytest.fixture(scope="module")
def motor():
    dc_motor.register()
    return simjax.load_model(dc_motor.XML)


def test_nn_one_instance_backs_all_motors(nn):
    assert nn.nplugin == 1 and nn.plugin_specs[0].actuators == (0, 1, 2)
    np.testing.assert_array_equal(nn.actuator_plugin, [0, 0, 0])


def test_nn_batched_forward_matches_mlp(nn):
    """1024 worlds in one vmapped, jitted forward; torques are the MLP of each world's
    features, and the generalized forces follow from them."""
    rng = np.random.default_rng(0)
    d0 = make_data(nn)
    qpos = jnp.asarray(rng.normal(size=(1024, nn.nq)))
    ctrl = jnp.asarray(rng.normal(size=(1024, nn.nu)))
    run = jax.jit(jax.vmap(lambda q, u: forward(nn, d0.replace(qpos=q, ctrl=u))))
    out = run(qpos, ctrl)
    feats = jnp.stack([ctrl, out.actuator_length, out.actuator_velocity], axis=-1)
    ref = jax.vmap(lambda f: nn_actuator.mlp(nn.plugin_params[0], f))(feats)
    np.testing.assert_allclose(out.actuator_force, ref, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(out.qfrc_actuator, out.actuator_force, rtol=1e-12)
    assert np.all(np.isfinite(np.asarray(out.qacc)))


def test_nn_grad_through_weights(nn):
    d0 = make_data(nn).replace(ctrl=jnp.array([0.3, -0.2, 0.5]),
                               qpos=jnp.array([0.1, 0.2, -0.3]))

    def loss(params):
        m = nn.replace(plugin_params=(params,))
        return jnp.sum(forward(m, d0).qacc ** 2)
    p = nn.plugin_params[0]
    g = jax.jit(jax.grad(loss))(p)
    eps = 1e-6
    e = jnp.zeros_like(p["w2"]).at[2, 0].set(eps)
    f = jax.jit(loss)
    fd = (f(dict(p, w2=p["w2"] + e)) - f(dict(p, w2=p["w2"] - e))) / (2 * eps)
    np.testing.assert_allclose(g["w2"][2, 0], fd, rtol=1e-6)


@pytest.mark.slow
def test_nn_batched_grad_through_steps(nn):
    """jax.grad through 3 steps of 1024 worlds at once (vmap of grad), with respect to
    the shared MLP weights and each world's initial state; one world's gradients
    against central differences."""
    rng = np.random.default_rng(1)
    d0 = make_data(nn).replace(ctrl=jnp.array([0.3, -0.2, 0.5]))
    qvel = jnp.asarray(rng.normal(size=(1024, nn.nv)))

    def loss(params, v):
        m = nn.replace(plugin_params=(params,))
        d, _ = jax.lax.scan(lambda d, _: (step(m, d), None), d0.replace(qvel=v), None,
                            length=3)
        return jnp.sum(d.qpos ** 2) + jnp.sum(d.qvel ** 2)
    p = nn.plugin_params[0]
    gp, gv = jax.jit(jax.vmap(jax.grad(loss, argnums=(0, 1)), in_axes=(None, 0)))(p, qvel)
    assert gp["w2"].shape == (1024,) + p["w2"].shape and gv.shape == qvel.shape
    assert np.all(np.isfinite(np.asarray(gp["w1"]))) and np.all(np.isfinite(np.asarray(gv)))
    f = jax.jit(loss)
    eps, k = 1e-6, 7
    e = jnp.zeros_like(p["w1"]).at[1, 3].set(eps)
    fd = (f(dict(p, w1=p["w1"] + e), qvel[k]) - f(dict(p, w1=p["w1"] - e), qvel[k])) / (2 * eps)
    np.testing.assert_allclose(gp["w1"][k, 1, 3], fd, rtol=1e-6)
    ev = jnp.zeros(nn.nv).at[2].set(eps)
    fd = (f(p, qvel[k] + ev) - f(p, qvel[k] - ev)) / (2 * eps)
    np.testing.assert_allclose(gv[k, 2], fd, rtol=1e-6)
    assert abs(float(gp["w1"][k, 1, 3])) > 1e-6


def test_motor_state_sensor_and_batch(motor):
    """Temperature lives in plugin_state: reset to ambient, heated by the current,
    read by the thermometer, batched over 1024 worlds with different voltages."""
    d0 = make_data(motor)
    assert motor.npluginstate == 1 and float(d0.plugin_state[0]) == 20.0
    volts = jnp.linspace(0.0, 24.0, 1024)

    def run(v):
        d = d0.replace(ctrl=jnp.array([v]))
        d, _ = jax.lax.scan(lambda d, _: (step(motor, d), None), d, None, length=20)
        return d.plugin_state[0], d.sensordata[0], d.qvel[0]
    temp, sensed, vel = jax.jit(jax.vmap(run))(volts)
    assert float(temp[0]) == pytest.approx(20.0)
    assert np.all(np.diff(np.asarray(temp)) > 0)        # more voltage, more heat
    assert np.all(np.asarray(sensed) <= np.asarray(temp))  # read before the last advance
    assert np.all(np.asarray(sensed)[1:] < np.asarray(temp)[1:])
    assert np.all(np.diff(np.asarray(vel)) > 0)


def test_motor_grad_through_forward_and_advance(motor):
    """grad of the next temperature (forward, then the plugin's advance) with respect
    to a parameter and to the state itself."""
    from simjax.plugins import engine as plugin_engine
    d0 = make_data(motor).replace(ctrl=jnp.array([12.0]), qvel=jnp.array([30.0]))

    def next_temp(resistance, temp0):
        m = motor.replace(plugin_params=(dict(motor.plugin_params[0],
                                              resistance=resistance),))
        d = forward(m, d0.replace(plugin_state=jnp.array([temp0])))
        return plugin_engine.advance(m, d).plugin_state[0]
    g = jax.jit(jax.grad(next_temp, argnums=(0, 1)))(1.5, 40.0)
    f = jax.jit(next_temp)
    eps = 1e-6
    fd_r = (f(1.5 + eps, 40.0) - f(1.5 - eps, 40.0)) / (2 * eps)
    fd_t = (f(1.5, 40.0 + eps) - f(1.5, 40.0 - eps)) / (2 * eps)
    np.testing.assert_allclose(g[0], fd_r, rtol=1e-6)
    np.testing.assert_allclose(g[1], fd_t, rtol=1e-6)


@pytest.mark.slow
def test_motor_grad_through_params_and_state(motor):
    d0 = make_data(motor).replace(ctrl=jnp.array([12.0]))

    def final_temp(resistance, temp0):
        m = motor.replace(plugin_params=(dict(motor.plugin_params[0],
                                              resistance=resistance),))
        d = d0.replace(plugin_state=jnp.array([temp0]))
        d, _ = jax.lax.scan(lambda d, _: (step(m, d), None), d, None, length=5)
        return d.plugin_state[0]
    g = jax.jit(jax.grad(final_temp, argnums=(0, 1)))(1.5, 20.0)
    f = jax.jit(final_temp)
    eps = 1e-6
    fd_r = (f(1.5 + eps, 20.0) - f(1.5 - eps, 20.0)) / (2 * eps)
    fd_t = (f(1.5, 20.0 + eps) - f(1.5, 20.0 - eps)) / (2 * eps)
    np.testing.assert_allclose(g[0], fd_r, rtol=1e-5)
    np.testing.assert_allclose(g[1], fd_t, rtol=1e-5)
    assert float(g[0]) < 0      # higher resistance: less current, less heating
