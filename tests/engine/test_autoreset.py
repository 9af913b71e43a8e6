"""step's autoreset of diverged worlds (mj_checkPos / mj_checkVel / mj_checkAcc) against
MuJoCo C in float64.

A bad qacc is reset over two simjax steps (see simjax.engine.forward.step): the first
returns the world not integrated, with its own forward (what MuJoCo's mjData holds when
mj_checkAcc looks at qacc); the second resets it and equals MuJoCo's mj_step, derived
fields included.
"""
import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import pytest

from mujoco_oracle import model_from_mujoco
from simjax.engine import make_data, step
from simjax.engine.data import WARN_BADQACC, WARN_BADQPOS
from simjax.engine.forward import RESET_FIELDS

# contacts (a capsule on the floor), a joint limit, a motor, and sensors of every stage
# (the accelerometer and touch need cacc / cfrc, computed only when a sensor asks)
XML = """
<mujoco>
  <option timestep="0.005"/>
  <worldbody>
    <geom type="plane" size="2 2 0.1"/>
    <body name="arm" pos="0 0 1">
      <joint name="j0" type="hinge" axis="0 1 0" damping="0.1"/>
      <geom type="capsule" fromto="0 0 0 0.4 0 0" size="0.05"/>
      <body pos="0.4 0 0">
        <joint name="j1" type="hinge" axis="0 1 0" range="-1 1" limited="true"/>
        <geom type="capsule" fromto="0 0 0 0.3 0 0" size="0.04"/>
        <site name="tip" pos="0.3 0 0"/>
      </body>
    </body>
    <body name="ball" pos="0.3 0.5 0.048">
      <freejoint/>
      <geom type="capsule" size="0.05 0.1" euler="0 90 0"/>
      <site name="ballsite" size="0.02"/>
    </body>
  </worldbody>
  <actuator>
    <motor joint="j0" gear="2"/>
  </actuator>
  <sensor>
    <jointpos joint="j1"/>
    <framelinvel objtype="site" objname="tip"/>
    <accelerometer site="tip"/>
    <touch site="ballsite"/>
  </sensor>
</mujoco>
"""


def _models(integrator):
    mjm = mujoco.MjModel.from_xml_string(XML)
    mjm.opt.integrator = getattr(mujoco.mjtIntegrator, "mjINT_" + integrator)
    return mjm, model_from_mujoco(mjm)


def _state(mjm):
    rng = np.random.default_rng(7)
    qpos = mjm.qpos0.copy()
    qpos[:2] = 0.3 * rng.standard_normal(2)
    qvel = 0.5 * rng.standard_normal(mjm.nv)
    return dict(qpos=qpos, qvel=qvel, ctrl=np.array([0.4]),
                qfrc_applied=np.where(np.arange(mjm.nv) == 1, 1e13, 0.0))


def _mj(mjm, state):
    mjd = mujoco.MjData(mjm)
    for k, v in state.items():
        getattr(mjd, k)[:] = v
    return mjd


def _full_m(mjm, mjd):
    out = np.zeros((mjm.nv, mjm.nv))
    mujoco.mj_fullM(mjm, mjd, out)
    return out


def _assert_matches(d, mjm, mjd, names):
    """``d`` (simjax) equals ``mjd`` (MuJoCo) on ``names``, to float64 rounding."""
    for k in names:
        want = _full_m(mjm, mjd) if k == "qM" else np.asarray(getattr(mjd, k))
        got = np.asarray(getattr(d, k))
        np.testing.assert_allclose(got, want.reshape(got.shape), rtol=1e-9, atol=1e-9,
                                   err_msg=k)


# fields compared with MuJoCo: state, kinematics, inertia, forces, sensors
STATE = ("time", "qpos", "qvel", "act", "ctrl", "qfrc_applied", "qacc_warmstart")
DERIVED = ("xpos", "xquat", "xmat", "geom_xpos", "site_xpos", "cinert", "cdof", "qM",
           "cvel", "qfrc_bias", "qfrc_passive", "actuator_force", "qfrc_actuator",
           "qfrc_smooth", "qacc_smooth", "qfrc_constraint", "cacc", "cfrc_ext",
           "sensordata")


# the implicit integrators share Euler's reset path; they run in the slow suite
@pytest.mark.parametrize("integrator", ["EULER"] + [
    pytest.param(i, marks=pytest.mark.slow) for i in ("RK4", "IMPLICIT", "IMPLICITFAST")])
def test_bad_qacc_resets_as_mujoco(integrator):
    mjm, m = _models(integrator)
    state = _state(mjm)
    run = jax.jit(step)
    d = make_data(m).replace(**{k: jnp.asarray(v) for k, v in state.items()})

    # the step that finds the bad qacc: the world as mj_forward leaves it, not integrated
    ref = _mj(mjm, state)
    mujoco.mj_forward(mjm, ref)
    assert np.abs(ref.qacc).max() > 1e10
    flagged = run(m, d)
    _assert_matches(flagged, mjm, ref, STATE + DERIVED)
    assert np.abs(np.asarray(flagged.qacc)).max() > 1e10
    want_warn = np.zeros(mujoco.mjtWarning.mjNWARNING.value, np.int32)
    want_warn[WARN_BADQACC] = 1
    np.testing.assert_array_equal(flagged.warning, want_warn)

    # the next step resets and equals MuJoCo's mj_step that found the bad qacc (which
    # reset, forwarded and integrated): every field consistent with the reset state
    mjd = _mj(mjm, state)
    mujoco.mj_step(mjm, mjd)
    assert [w.number for w in mjd.warning] == list(want_warn)
    reset = run(m, flagged)
    _assert_matches(reset, mjm, mjd, STATE + DERIVED + ("qacc",))
    np.testing.assert_array_equal(reset.warning, want_warn)
    assert int(reset.ncon) == mjd.ncon and int(reset.nefc) == mjd.nefc
    assert mjd.ncon > 0 and np.abs(mjd.sensordata).max() > 0
    for leaf in jax.tree_util.tree_leaves(reset):
        assert np.all(np.isfinite(np.asarray(leaf)))

    # the reset reads nothing of the diverged world but RESET_FIELDS: NaN in every other
    # float field (and garbage in the integer ones) changes no bit of its result.
    # (contact.dim and contact.adhesion are constants of make_data the engine never
    # writes: the slot's static dimension, and adhesion, which it does not support.)
    def poison(path, x):
        name = jax.tree_util.keystr(path)
        if name.split(".")[1] in RESET_FIELDS or name in (".contact.dim",
                                                          ".contact.adhesion"):
            return x
        return jnp.full_like(x, jnp.nan if x.dtype.kind == "f" else 7)
    poisoned = run(m, jax.tree_util.tree_map_with_path(poison, flagged))
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(reset),
                            jax.tree_util.tree_leaves(poisoned)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b),
                                      err_msg=jax.tree_util.keystr(path))

    # and it goes on as MuJoCo, one step behind
    mujoco.mj_step(mjm, mjd)
    _assert_matches(run(m, reset), mjm, mjd, STATE + DERIVED + ("qacc",))


def test_bad_qpos_resets_as_mujoco():
    mjm, m = _models("EULER")
    state = _state(mjm)
    state["qfrc_applied"] = np.zeros(mjm.nv)
    state["qpos"][1] = np.nan
    d = make_data(m).replace(**{k: jnp.asarray(v) for k, v in state.items()})
    # a previous inverse dynamics and rne_post results are cleared as by mj_resetData
    d = d.replace(qfrc_inverse=jnp.ones(m.nv), subtree_linvel=jnp.ones((m.nbody, 3)))
    out = jax.jit(step)(m, d)
    mjd = _mj(mjm, state)
    mujoco.mj_step(mjm, mjd)
    assert mjd.warning[WARN_BADQPOS].number == 1
    _assert_matches(out, mjm, mjd, STATE + DERIVED + ("qacc", "qfrc_inverse",
                                                      "subtree_linvel"))
    np.testing.assert_array_equal(out.warning, [w.number for w in mjd.warning])
