"""Batching (vmap over worlds and over Model leaves), float32, program size, flags."""
import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import pytest

from engine_helpers import f32, load, random_state, rel_err, set_state, to_data
from simjax.engine import forward, make_data, step
from simjax.errors import UnsupportedFeatureError

HUMANOID = "mujoco_humanoid/humanoid.xml"


def _batch(m, mjm, n, seed=0, **scales):
    rng = np.random.default_rng(seed)
    states = [random_state(mjm, rng, **scales) for _ in range(n)]
    stacked = jax.tree_util.tree_map(lambda *x: np.stack(x), *states)
    return jax.vmap(lambda st: to_data(make_data(m), st))(stacked)


# One jitted, vmapped step shared by the tests below: each dtype compiles once.
_vstep = jax.jit(jax.vmap(step, in_axes=(None, 0)))


@pytest.fixture(scope="module")
def humanoid_batch():
    """Humanoid worlds (float64) and their vmapped step."""
    mjm, m = load(HUMANOID)
    batch = _batch(m, mjm, 8, qscale=0.1, vscale=0.3)
    return m, batch, _vstep(m, batch)


def test_vmap_worlds_matches_single(humanoid_batch):
    m, batch, out = humanoid_batch
    single = jax.jit(step)
    for i in (0, 5):
        ref = single(m, jax.tree_util.tree_map(lambda x: np.asarray(x)[i], batch))
        np.testing.assert_allclose(out.qpos[i], ref.qpos, atol=1e-12)
        np.testing.assert_allclose(out.qvel[i], ref.qvel, atol=1e-10)


def test_vmap_over_model_parameters():
    mjm, m = load("gym_inverted_double_pendulum/inverted_double_pendulum.xml")
    masses = jnp.stack([jnp.asarray(m.body_mass) * s for s in (0.5, 1.0, 2.0)])
    axes = jax.tree_util.tree_map(lambda _: None, m).replace(body_mass=0)
    data = to_data(make_data(m), random_state(mjm, np.random.default_rng(1)))
    out = jax.jit(jax.vmap(step, in_axes=(axes, None)))(m.replace(body_mass=masses), data)
    for i in range(3):
        mjm.body_mass[:] = np.asarray(masses[i])
        mjd = mujoco.MjData(mjm)
        set_state(mjm, mjd, random_state(mjm, np.random.default_rng(1)))
        mujoco.mj_step(mjm, mjd)
        np.testing.assert_allclose(out.qvel[i], mjd.qvel, rtol=1e-9, atol=1e-10)


def test_float32_batch(humanoid_batch):
    m64, batch, out64 = humanoid_batch
    out32 = _vstep(f32(m64), f32(batch))
    assert out32.qpos.dtype == jnp.float32
    np.testing.assert_allclose(out32.qpos, out64.qpos, atol=1e-4)
    assert not np.any(np.asarray(out32.warning))


def _star_xml(nbranch):
    """A free base with nbranch two-link hinge legs: many bodies, constant depth."""
    legs = "".join(
        f'<body pos="{0.1 * np.cos(i):.3f} {0.1 * np.sin(i):.3f} 0"><joint type="hinge" '
        f'axis="0 1 0"/><geom size="0.02" fromto="0 0 0 0.2 0 0" type="capsule"/>'
        f'<body pos="0.2 0 0"><joint type="hinge" axis="0 1 0"/><geom size="0.02" '
        f'fromto="0 0 0 0.2 0 0" type="capsule"/></body></body>' for i in range(nbranch))
    return (f'<mujoco><worldbody><body><freejoint/><geom size="0.1"/>{legs}</body>'
            '</worldbody></mujoco>')


# rne takes one of two forms by body count (smooth._RNE_COMPONENT_MAJOR_NBODY, 16):
# each pair of leg counts stays on one side of it (8 and 12 bodies; 18 and 50).
# math.const_dot takes one of two forms by the length of its contraction
# (math._CONST_DOT_MIN, 10 columns); at 0 every tree product takes the in-place form
@pytest.mark.parametrize("nbranch", [(3, 5), (8, 24)])
def test_program_size_independent_of_body_count(nbranch, monkeypatch):
    from mujoco_oracle import model_from_mujoco
    from simjax.engine import math as smath
    monkeypatch.setattr(smath, "_CONST_DOT_MIN", 0)
    sizes = []
    for n in nbranch:
        mjm = mujoco.MjModel.from_xml_string(_star_xml(n))
        mjm.opt.disableflags |= mujoco.mjtDisableBit.mjDSBL_CONSTRAINT
        m = model_from_mujoco(mjm)
        jaxpr = jax.make_jaxpr(step)(m, make_data(m))
        sizes.append(len(jaxpr.jaxpr.eqns))
    assert sizes[0] == sizes[1], sizes


# each flag compiles forward of the features model (~20-40 s): two in the default suite
@pytest.mark.parametrize("flag", ["mjDSBL_GRAVITY", "mjDSBL_ACTUATION"] + [
    pytest.param(f, marks=pytest.mark.slow)
    for f in ("mjDSBL_SPRING", "mjDSBL_DAMPER", "mjDSBL_CLAMPCTRL")])
def test_disable_flags(flag):
    def edit(mm):
        mm.opt.disableflags |= getattr(mujoco.mjtDisableBit, flag)
    mjm, m = load("features", edit=edit)
    state = random_state(mjm, np.random.default_rng(2), uscale=3.0)
    mjd = mujoco.MjData(mjm)
    set_state(mjm, mjd, state)
    mujoco.mj_forward(mjm, mjd)
    d = jax.jit(forward)(m, to_data(make_data(m), state))
    for k in ("qfrc_passive", "qfrc_bias", "qfrc_actuator", "qacc"):
        assert rel_err(getattr(d, k), getattr(mjd, k)) < 1e-8, k


def test_autoreset_on_divergence():
    mjm, m = load("gym_inverted_double_pendulum/inverted_double_pendulum.xml")
    d = make_data(m).replace(qvel=jnp.full(mjm.nv, jnp.nan))
    out = jax.jit(step)(m, d)
    mjd = mujoco.MjData(mjm)
    mjd.qvel[:] = np.nan
    mujoco.mj_step(mjm, mjd)
    np.testing.assert_allclose(out.qpos, mjd.qpos)
    np.testing.assert_array_equal(np.asarray(out.warning), [w.number for w in mjd.warning])


def _set(field, value):
    def edit(mjm):
        getattr(mjm, field)[0] = value
    return edit


@pytest.mark.parametrize("rel,edit,what", [
    ("mjx_actuator_arm21_muscle/arm21.xml", _set("actuator_dyntype", 5), "dcmotor"),
    ("mujoco_slider_crank/slider_crank.xml", _set("actuator_trntype", 6), "so3"),
])
def test_unsupported_features_raise(rel, edit, what):
    _, m = load(rel, edit=edit)
    with pytest.raises(UnsupportedFeatureError, match=what):
        jax.jit(forward)(m, make_data(m))
