"""forward() against mujoco.mj_forward at random states, constraints disabled (float64)."""
import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import pytest

from engine_helpers import load, random_state, rel_err, set_state, to_data
from simjax.engine import forward, make_data, pack_m

MODELS = [
    "mjx_pendula/pendula.xml",
    "mujoco_humanoid/humanoid.xml",
    "mjx_humanoid/humanoid.xml",
    "gym_ant/ant.xml",
    "gym_inverted_double_pendulum/inverted_double_pendulum.xml",
    "gym_swimmer/swimmer.xml",
    "gym_half_cheetah/half_cheetah.xml",
    "gym_hopper/hopper.xml",
    "gym_reacher/reacher.xml",
    "mjx_shadow_hand/scene_right.xml",
    "mujoco_car/car.xml",
    "features",
]

# field name in simjax Data -> how to read the MuJoCo value (shape-compatible)
FIELDS = {
    "xpos": lambda m, d: d.xpos,
    "xquat": lambda m, d: d.xquat,
    "xmat": lambda m, d: d.xmat.reshape(-1, 3, 3),
    "xipos": lambda m, d: d.xipos,
    "ximat": lambda m, d: d.ximat.reshape(-1, 3, 3),
    "xanchor": lambda m, d: d.xanchor,
    "xaxis": lambda m, d: d.xaxis,
    "geom_xpos": lambda m, d: d.geom_xpos,
    "geom_xmat": lambda m, d: d.geom_xmat.reshape(-1, 3, 3),
    "site_xpos": lambda m, d: d.site_xpos,
    "site_xmat": lambda m, d: d.site_xmat.reshape(-1, 3, 3),
    "cam_xpos": lambda m, d: d.cam_xpos,
    "cam_xmat": lambda m, d: d.cam_xmat.reshape(-1, 3, 3),
    "subtree_com": lambda m, d: d.subtree_com,
    "cinert": lambda m, d: d.cinert,
    "cdof": lambda m, d: d.cdof,
    "crb": lambda m, d: d.crb,
    "ten_length": lambda m, d: d.ten_length,
    "actuator_length": lambda m, d: d.actuator_length,
    "cvel": lambda m, d: d.cvel,
    "cdof_dot": lambda m, d: d.cdof_dot,
    "qfrc_bias": lambda m, d: d.qfrc_bias,
    "qfrc_spring": lambda m, d: d.qfrc_spring,
    "qfrc_damper": lambda m, d: d.qfrc_damper,
    "qfrc_gravcomp": lambda m, d: d.qfrc_gravcomp,
    "qfrc_fluid": lambda m, d: d.qfrc_fluid,
    "qfrc_passive": lambda m, d: d.qfrc_passive,
    "ten_velocity": lambda m, d: d.ten_velocity,
    "actuator_velocity": lambda m, d: d.actuator_velocity,
    "actuator_force": lambda m, d: d.actuator_force,
    "act_dot": lambda m, d: d.act_dot,
    "qfrc_actuator": lambda m, d: d.qfrc_actuator,
    "qfrc_smooth": lambda m, d: d.qfrc_smooth,
    "qacc_smooth": lambda m, d: d.qacc_smooth,
    "qacc": lambda m, d: d.qacc,
}

NSTATE = 10


def _mujoco_forward(mjm, states):
    mjd = mujoco.MjData(mjm)
    out = []
    for st in states:
        set_state(mjm, mjd, st)
        mujoco.mj_forward(mjm, mjd)
        full = np.zeros((mjm.nv, mjm.nv))
        mujoco.mj_fullM(mjm, mjd, full)
        rec = {k: np.array(f(mjm, mjd)) for k, f in FIELDS.items()}
        rec["qM"] = full
        rec["qLD"] = np.array(mjd.qLD)
        out.append(rec)
    return out


@pytest.mark.parametrize("rel", MODELS)
def test_forward_matches_mujoco(rel):
    mjm, m = load(rel)
    rng = np.random.default_rng(0)
    states = [random_state(mjm, rng) for _ in range(NSTATE)]
    ref = _mujoco_forward(mjm, states)
    base = make_data(m)
    stacked = jax.tree_util.tree_map(lambda *x: np.stack(x), *states)
    batch = jax.vmap(lambda st: to_data(base, st))(stacked)
    out = jax.jit(jax.vmap(forward, in_axes=(None, 0)))(m, batch)
    for i in range(NSTATE):
        d = jax.tree_util.tree_map(lambda x: np.asarray(x)[i], out)
        for k in FIELDS:
            err = rel_err(getattr(d, k), ref[i][k])
            assert err < 1e-8, f"{rel} state {i}: {k} differs by {err:.2e}"
        assert rel_err(d.qM, ref[i]["qM"]) < 1e-8, f"{rel}: qM"
        assert rel_err(pack_m(m, d.qLD), ref[i]["qLD"]) < 1e-8, f"{rel}: qLD"


@pytest.mark.parametrize("rel", MODELS)
def test_simple_dofs_and_reduced_sparsity(rel):
    """body_simple, dof_simplenum and the reduced M layout (M_rownnz / M_colind) as
    MuJoCo computes them: rows of simple dofs hold the diagonal alone."""
    from simjax.engine.tables import body_simple, dof_simplenum
    from simjax.engine.support import m_sparsity
    mjm, m = load(rel)
    np.testing.assert_array_equal(body_simple(m), mjm.body_simple)
    np.testing.assert_array_equal(dof_simplenum(m), mjm.dof_simplenum)
    rows, cols = m_sparsity(m)
    np.testing.assert_array_equal(np.bincount(rows, minlength=mjm.nv), mjm.M_rownnz)
    np.testing.assert_array_equal(cols, mjm.M_colind)


def test_simple_bodies_demoted_by_tendon_armature():
    """A tendon with armature couples the bodies of its sites: MuJoCo 4.0 makes them
    non-simple (their rows of M keep their off-diagonal entries)."""
    from simjax import load_model
    from simjax.engine.tables import body_simple, dof_simplenum
    xml = """<mujoco><worldbody>
      <body><joint type="slide" axis="1 0 0"/><geom size=".1" mass="1"/><site name="a"/>
        <joint type="slide" axis="0 1 0"/></body>
      <body pos="1 0 0"><joint type="slide" axis="0 1 0"/><geom size=".1" mass="1"/>
        <site name="b"/></body>
      <body pos="0 1 0"><joint type="slide" axis="0 0 1"/><geom size=".1" mass="1"/></body>
    </worldbody><tendon><spatial armature="2"><site site="a"/><site site="b"/></spatial>
    </tendon></mujoco>"""
    for text in (xml, xml.replace(' armature="2"', '')):
        mjm = mujoco.MjModel.from_xml_string(text)
        m = load_model(text)
        np.testing.assert_array_equal(body_simple(m), mjm.body_simple)
        np.testing.assert_array_equal(dof_simplenum(m), mjm.dof_simplenum)
    assert list(mjm.body_simple) == [1, 2, 2, 2]        # the unarmed copy: all simple


def test_pack_m_layouts():
    mjm, m = load("mujoco_humanoid/humanoid.xml")
    mjd = mujoco.MjData(mjm)
    mujoco.mj_forward(mjm, mjd)
    d = jax.jit(forward)(m, make_data(m))
    np.testing.assert_allclose(pack_m(m, d.qM), mjd.M, rtol=1e-10, atol=1e-12)
    legacy = np.asarray(pack_m(m, d.qM, layout="qM"))
    assert legacy.shape == (mjm.nM,)
    # legacy layout: the diagonal of dof i sits at dof_Madr[i]
    np.testing.assert_allclose(legacy[mjm.dof_Madr], np.diag(np.asarray(d.qM)))


@pytest.mark.parametrize("constraint", ["enable", "disable"])
def test_sleep_flag_refused(constraint):
    """MuJoCo 4's sleeping freezes trees at rest, with or without constraints: simjax,
    which does not sleep, refuses the flag rather than simulate the trees awake."""
    import simjax
    from simjax.errors import UnsupportedFeatureError
    m = simjax.load_model(
        f'<mujoco><option><flag sleep="enable" constraint="{constraint}"/></option>'
        '<worldbody><geom type="plane" size="1 1 .1"/><body pos="0 0 .1"><freejoint/>'
        '<geom size=".1"/></body></worldbody></mujoco>')
    with pytest.raises(UnsupportedFeatureError, match="sleeping"):
        jax.eval_shape(simjax.step, m, make_data(m))


_FREE_BOX = ('<mujoco><option {}>{}</option><worldbody><geom type="plane" size="1 1 .1"/>'
             '<body pos="0 0 .3"><freejoint/><geom type="box" size=".1 .1 .1"/></body>'
             '</worldbody></mujoco>')


@pytest.mark.parametrize("option,flag,feature", [
    ('integrator="discrete"', '', "discrete integrator"),
    ('integrator="discrete"', '<flag ipc="enable"/>', "discrete integrator"),
    ('', '<flag speculative="enable"/>', "speculative contacts")])
def test_mujoco4_options_refused(option, flag, feature):
    """MuJoCo 4's discrete integrator (its trajectories differ from every other
    integrator's: measured on the corpus' humanoid, ant and shadow hand), its IPC
    contacts and speculative contacts (active at a positive distance: MuJoCo 4.0.0
    stops a sphere falling at 20 m/s one step before it reaches the floor) are not
    implemented: the model loads, and forward, step and inverse refuse it by name."""
    import simjax
    from simjax.errors import UnsupportedFeatureError
    m = simjax.load_model(_FREE_BOX.format(option, flag))
    for fn in (simjax.forward, simjax.step, simjax.inverse):
        with pytest.raises(UnsupportedFeatureError, match=feature):
            jax.eval_shape(fn, m, make_data(m))


def test_mujoco4_options_set_at_run_time():
    """The same options set on a loaded model (``Model.replace``) are refused as
    well; speculative contacts are moot, and allowed, where contacts are off."""
    import simjax
    from simjax.errors import UnsupportedFeatureError
    from simjax.types import DisableBit, EnableBit, IntegratorType
    m = simjax.load_model(_FREE_BOX.format("", ""))
    d = make_data(m)
    for opt, feature in ((dict(integrator=int(IntegratorType.DISCRETE)), "discrete"),
                         (dict(enableflags=int(EnableBit.IPC)), "IPC"),
                         (dict(enableflags=int(EnableBit.SPECULATIVE)), "speculative")):
        with pytest.raises(UnsupportedFeatureError, match=feature):
            jax.eval_shape(simjax.step, m.replace(opt=m.opt.replace(**opt)), d)
    off = m.replace(opt=m.opt.replace(enableflags=int(EnableBit.SPECULATIVE),
                                      disableflags=int(DisableBit.CONTACT)))
    out = jax.jit(simjax.step)(off, make_data(off))
    assert int(out.ncon) == 0 and float(out.time) == m.opt.timestep


@pytest.mark.parametrize("sensors", ["<e_potential/><e_kinetic/>", "<e_potential/>",
                                     "<e_kinetic/>", '<jointpos joint="j"/>'])
def test_energy_field_without_the_flag(sensors):
    """Without EnableBit.ENERGY, Data.energy holds what MuJoCo 4.0.0's energy sensors
    leave there (they write it at the position stage, and mj_forwardSkip zeroes it
    unless a potential-energy sensor ran; mj_inverse zeroes nothing): after step
    (Euler, RK4, implicitfast), forward and inverse (Euler's model: neither reads the
    integrator), to rounding. It was always zero."""
    import simjax
    xml = ('<mujoco><option integrator="{}"/><worldbody><body pos="0 0 1"><joint name="j" '
           'type="hinge" axis="0 1 0" stiffness="3"/><geom type="capsule" fromto="0 0 0 1 '
           '0 0" size=".05"/></body></worldbody><sensor>{}</sensor></mujoco>')
    # called eagerly: each entry point compiles one program with the model's values as
    # constants (smaller than under jax.jit with the model an argument)
    jstep, jforward, jinverse = simjax.step, simjax.forward, simjax.inverse
    for integrator in ("Euler", "RK4", "implicitfast"):
        text = xml.format(integrator, sensors)
        mjm = mujoco.MjModel.from_xml_string(text)
        mjd = mujoco.MjData(mjm)
        mjd.qvel[0] = 1
        m = simjax.load_model(text)
        d = make_data(m).replace(qvel=jnp.asarray([1.0]))
        for _ in range(3):
            mujoco.mj_step(mjm, mjd)
            d = jstep(m, d)
            np.testing.assert_allclose(np.asarray(d.energy), mjd.energy, atol=1e-12)
        if integrator != "Euler":
            continue            # forward and inverse do not read the integrator
        mujoco.mj_forward(mjm, mjd)
        d = jforward(m, d)
        np.testing.assert_allclose(np.asarray(d.energy), mjd.energy, atol=1e-12)
        mjd.energy[:] = [7, 8]
        mujoco.mj_inverse(mjm, mjd)
        d = jinverse(m, d.replace(energy=jnp.asarray([7.0, 8.0])))
        np.testing.assert_allclose(np.asarray(d.energy), mjd.energy, atol=1e-12)
