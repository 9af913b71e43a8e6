"""Elasto-plastic springs (MuJoCo 4's springyield, simjax.engine.plastic) against
MuJoCo 4.0.0 in float64: the compiled fields, the plastic state after reset and
keyframes, trajectories with every integrator, and the compiler's errors. The model
written here holds every kind: a hinge, a ball and a slide joint, a fixed and a
spatial tendon with yields (the spatial one across the ball joint), and a spring
without one."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import pytest

import simjax
from simjax.errors import MJCFError
from simjax.types import EnableBit

XML = """<mujoco>
  <option timestep="0.005"/>
  <worldbody>
    <site name="s0" pos="0 0 .5"/>
    <body>
      <joint name="h1" type="hinge" axis="0 1 0" stiffness="10" springyield="6"
             springref="10" damping=".05"/>
      <geom type="capsule" fromto="0 0 0 1 0 0" size=".05"/>
      <site name="s1" pos="1 0 0"/>
      <body pos="1 0 0">
        <joint name="h2" type="hinge" axis="0 1 0" stiffness="3" damping=".05"/>
        <geom type="capsule" fromto="0 0 0 1 0 0" size=".05"/>
        <site name="s2" pos="1 0 0"/>
        <body pos="1 0 0">
          <joint name="b" type="ball" stiffness="3" springyield="10" damping=".02"/>
          <geom type="box" size=".3 .1 .05" pos=".3 0 0"/>
          <site name="s3" pos=".6 0 .1"/>
        </body>
      </body>
    </body>
    <body pos="0 2 0">
      <joint name="s" type="slide" axis="1 0 0" stiffness="30" springyield="0.05"
             springref="-.1"/>
      <geom type="box" size=".1 .1 .1"/>
    </body>
  </worldbody>
  <tendon>
    <fixed name="u" stiffness="7" springyield="0.02"><joint joint="h2" coef="1"/></fixed>
    <spatial name="t" stiffness="50" springyield="0.05" springlength="2.1 2.3"
             damping=".1">
      <site site="s0"/><site site="s1"/><site site="s2"/><site site="s3"/>
    </spatial>
  </tendon>
  <actuator><motor joint="h1"/><motor joint="h2"/><motor joint="s"/></actuator>
  <keyframe>
    <key qpos="0.3 0.5 1 0 0 0 0.05"/>
    <key qpos="0.3 0.5 1 0 0 0 0.05" plastic="0.25 1 0 0 0 .1 .2 .3"/>
  </keyframe>
</mujoco>"""


def test_compiled_fields():
    """Yields (hinge and ball in degrees, converted), plastic addresses (joints, then
    tendons; a ball takes 4), the keyframes' plastic states (unset entries: the initial
    references, qpos_spring and the tendons' spring lengths) as MuJoCo's."""
    mjm = mujoco.MjModel.from_xml_string(XML)
    m = simjax.load_model(XML)
    assert m.nplastic == mjm.nplastic == 10
    for name in ("jnt_springyield", "jnt_plasticadr", "tendon_springyield",
                 "tendon_plasticadr", "key_plastic"):
        np.testing.assert_allclose(np.asarray(getattr(m, name)).ravel(),
                                   np.asarray(getattr(mjm, name)).ravel(), rtol=0,
                                   atol=1e-15, err_msg=name)


def test_reset_and_keyframes():
    mjm = mujoco.MjModel.from_xml_string(XML)
    mjd = mujoco.MjData(mjm)
    m = simjax.load_model(XML)
    np.testing.assert_allclose(np.asarray(simjax.make_data(m).plastic), mjd.plastic,
                               atol=1e-15)
    for key in (0, 1):
        mujoco.mj_resetDataKeyframe(mjm, mjd, key)
        d = simjax.reset(m, key=key)
        np.testing.assert_allclose(np.asarray(d.plastic), mjd.plastic, atol=1e-15)
        np.testing.assert_allclose(np.asarray(d.qpos), mjd.qpos, atol=1e-15)


@pytest.mark.parametrize("integrator", [
    "Euler", pytest.param("RK4", marks=pytest.mark.slow),
    pytest.param("implicitfast", marks=pytest.mark.slow),
    pytest.param("implicit", marks=pytest.mark.slow)])
def test_trajectory(integrator):
    """300 steps driven by sinusoidal motors, some spring yielding at every step: qpos,
    qvel, the plastic state and the potential energy (springs about the plastic
    references) as MuJoCo's (measured within 1e-12; qvel 1e-13)."""
    mjm = mujoco.MjModel.from_xml_string(XML)
    mjm.opt.integrator = getattr(mujoco.mjtIntegrator, "mjINT_" + integrator.upper())
    mjm.opt.enableflags |= int(EnableBit.ENERGY)
    mjd = mujoco.MjData(mjm)
    m = simjax.load_model(XML)
    m = m.replace(opt=m.opt.replace(integrator=int(mjm.opt.integrator),
                                    enableflags=int(mjm.opt.enableflags)))
    d = simjax.make_data(m)
    step = jax.jit(simjax.step)
    yielded = 0
    for i in range(300):
        u = 4 * np.sin(i / 25 + np.arange(3))
        mjd.ctrl[:] = u
        before = mjd.plastic.copy()
        mujoco.mj_step(mjm, mjd)
        d = step(m, d.replace(ctrl=jnp.asarray(u)))
        yielded += np.any(mjd.plastic != before)
        for name in ("qpos", "plastic", "energy"):
            np.testing.assert_allclose(np.asarray(getattr(d, name)), getattr(mjd, name),
                                       rtol=0, atol=1e-9, err_msg=f"{name} step {i}")
        np.testing.assert_allclose(np.asarray(d.qvel), mjd.qvel, rtol=0, atol=1e-8)
    assert yielded > 250
    # every spring has yielded: its reference moved from the initial one
    moved = np.abs(mjd.plastic - mujoco.MjData(mjm).plastic)
    adr = list(mjm.jnt_plasticadr[mjm.jnt_plasticadr >= 0]) + list(mjm.tendon_plasticadr)
    assert all(moved[a] > 1e-3 or moved[a + 1] > 1e-3 for a in adr)


@pytest.mark.slow
def test_gradient_through_yield():
    """jax.grad through 20 steps with yielding springs matches central differences."""
    m = simjax.load_model(XML)
    d0 = simjax.make_data(m).replace(ctrl=jnp.asarray([3.0, -2.0, 1.0]))

    def loss(u):
        d = jax.lax.fori_loop(0, 20, lambda i, d: simjax.step(m, d),
                              d0.replace(ctrl=u))
        return jnp.sum(d.plastic ** 2) + jnp.sum(d.qpos ** 2)

    u = jnp.asarray([3.0, -2.0, 1.0])
    g = np.asarray(jax.grad(loss)(u))
    f = jax.jit(loss)
    eps = 1e-6
    fd = [(f(u.at[i].add(eps)) - f(u.at[i].add(-eps))) / (2 * eps) for i in range(3)]
    np.testing.assert_allclose(g, np.asarray(fd), rtol=1e-5, atol=1e-8)
    assert np.abs(g[:2]).min() > 1e-3           # the hinge motors
    end = jax.lax.fori_loop(0, 20, lambda i, d: simjax.step(m, d), d0)
    assert np.abs(np.asarray(end.plastic - d0.plastic)).max() > 1e-3   # it yielded


@pytest.mark.parametrize("xml,message", [
    ('<joint type="hinge" springyield="-1"/>', "springyield cannot be negative in joint"),
    ('<freejoint/><joint type="free" springyield="1"/>', None),
    ('<joint type="free" springyield="1"/>', "springyield should not be defined in free"),
])
def test_joint_errors(xml, message):
    """MuJoCo 4.0.0's compile errors (its wording)."""
    text = f'<mujoco><worldbody><body>{xml}<geom size=".1"/></body></worldbody></mujoco>'
    if message is None:          # two free joints in a body: another error, any
        with pytest.raises(MJCFError):
            simjax.load_model(text)
        return
    with pytest.raises(MJCFError, match=message):
        simjax.load_model(text)
    with pytest.raises(ValueError, match=message):
        mujoco.MjModel.from_xml_string(text)


def test_tendon_and_key_errors():
    neg = XML.replace('springyield="0.02"', 'springyield="-0.02"')
    with pytest.raises(MJCFError, match="springyield cannot be negative in tendon"):
        simjax.load_model(neg)
    long = XML.replace('plastic="0.25 1 0 0 0 .1 .2 .3"', 'plastic="' + "0 " * 11 + '"')
    with pytest.raises(MJCFError, match="invalid plastic size, expected length 10"):
        simjax.load_model(long)
