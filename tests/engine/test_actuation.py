"""Transmissions and actuator forces (mj_transmission, mj_fwdActuation) vs MuJoCo 4.0.

Ten random states (random qpos, qvel, ctrl, act) per model in float64, constraints
disabled: actuator lengths, velocities, dense moments, forces, act_dot, qfrc_actuator
and qfrc_passive agree with MuJoCo to 1e-6 relative to max(1, |value|) (measured: below
1e-13). Body (adhesion) transmissions are checked on MuJoCo's own contacts, copied into
``Data.contact``.
"""
import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import pytest

import simjax
from engine_helpers import forward_jit, load, random_state, rel_err, set_state, to_data
from simjax.engine import actuation, make_data, smooth, step
from simjax.engine.data import make_contact

TOL = 1e-6
NSTATE = 10
MODELS = [
    "mujoco_arm26/arm26.xml",                                   # muscles, spatial tendons
    "mjx_actuator_arm21_muscle/arm21.xml",
    "mjx_actuator_tendon_force_clamp/tendon_force_clamp.xml",   # tendon force limits
    "mujoco_car/car.xml",                                       # fixed-tendon transmission
    "mujoco_slider_crank/slider_crank.xml",                     # slider-crank
    "warp_actuation_site/site.xml",                             # site, with/without refsite
    "mjx_pendula/pendula.xml",                                  # jointinparent, ball, gravcomp
]
SLOW_MODELS = ["mjx_shadow_hand/scene_right.xml", "menagerie_trossen_wx250s/scene.xml"]


def _moment(mjm, mjd):
    out = np.zeros((mjm.nu, mjm.nv))
    if mjm.nu:
        mujoco.mju_sparse2dense(out, mjd.actuator_moment, mjd.moment_rownnz,
                                mjd.moment_rowadr, mjd.moment_colind)
    return out


FIELDS = {
    "actuator_length": lambda mjm, mjd: mjd.actuator_length,
    "actuator_velocity": lambda mjm, mjd: mjd.actuator_velocity,
    "actuator_moment": _moment,
    "actuator_force": lambda mjm, mjd: mjd.actuator_force,
    "act_dot": lambda mjm, mjd: mjd.act_dot,
    "qfrc_actuator": lambda mjm, mjd: mjd.qfrc_actuator,
    "qfrc_passive": lambda mjm, mjd: mjd.qfrc_passive,
    "qacc": lambda mjm, mjd: mjd.qacc,
}


def _check(rel, edit=None, seed=0, **scales):
    mjm, m = load(rel, edit=edit)
    rng = np.random.default_rng(seed)
    mjd = mujoco.MjData(mjm)
    fwd = forward_jit()
    data0 = make_data(m)
    worst = {}
    for _ in range(NSTATE):
        st = random_state(mjm, rng, **scales)
        set_state(mjm, mjd, st)
        mujoco.mj_forward(mjm, mjd)
        d = fwd(m, to_data(data0, st))
        for name, ref in FIELDS.items():
            worst[name] = max(worst.get(name, 0.0), rel_err(getattr(d, name), ref(mjm, mjd)))
    bad = {k: v for k, v in worst.items() if not v <= TOL}
    assert not bad, f"{rel}: {bad}"
    return mjm, m


@pytest.mark.parametrize("rel", MODELS)
def test_actuation_fields(rel):
    _check(rel)


@pytest.mark.slow
@pytest.mark.parametrize("rel", SLOW_MODELS)
def test_actuation_fields_large(rel):
    _check(rel)


def _muscle_variants(mjm):
    """Smoothed muscle time constants, actearly, activation limits, explicit peak
    force, and one muscle turned into a filter-driven affine actuator."""
    mjm.actuator_dynprm[:, 2] = 0.3
    mjm.actuator_actearly[::2] = 1
    mjm.actuator_actlimited[1] = 1
    mjm.actuator_actrange[1] = [0.1, 0.6]
    mjm.actuator_gainprm[0, 2] = 150.0
    mjm.actuator_dyntype[3] = mujoco.mjtDyn.mjDYN_FILTEREXACT
    mjm.actuator_gaintype[3] = mujoco.mjtGain.mjGAIN_AFFINE
    mjm.actuator_gainprm[3, :3] = [10.0, -2.0, 0.5]


def test_muscle_variants():
    mjm, _ = _check("mujoco_arm26/arm26.xml", edit=_muscle_variants, seed=3, uscale=2.0)
    assert mjm.actuator_actearly.any()


@pytest.mark.slow
def test_muscle_trajectory():
    """Forty Euler steps of the arm with muscles: activations (clamped muscle dynamics)
    and state follow MuJoCo's mj_step."""
    mjm, m = load("mujoco_arm26/arm26.xml")
    mjd = mujoco.MjData(mjm)
    rng = np.random.default_rng(7)
    st = random_state(mjm, rng, uscale=0.0)
    st["act"] = rng.uniform(0.0, 1.0, mjm.na)
    st["ctrl"] = rng.uniform(0.0, 1.0, mjm.nu)
    set_state(mjm, mjd, st)
    d = to_data(make_data(m), st)
    jstep = jax.jit(step)
    for _ in range(40):
        mujoco.mj_step(mjm, mjd)
        d = jstep(m, d)
    for name in ("qpos", "qvel", "act"):
        assert rel_err(getattr(d, name), getattr(mjd, name)) < 1e-8, name


@pytest.mark.parametrize("what", ["dyn_dcmotor", "gain_dcmotor", "bias_dcmotor", "gain_so3",
                                  "trn_so3", "history"])
def test_unsupported_actuators_are_named(what):
    def edit(mjm):
        if what == "dyn_dcmotor":
            mjm.actuator_dyntype[0] = mujoco.mjtDyn.mjDYN_DCMOTOR
        elif what == "gain_dcmotor":
            mjm.actuator_gaintype[0] = mujoco.mjtGain.mjGAIN_DCMOTOR
        elif what == "bias_dcmotor":
            mjm.actuator_biastype[0] = mujoco.mjtBias.mjBIAS_DCMOTOR
        elif what == "gain_so3":
            mjm.actuator_gaintype[0] = mujoco.mjtGain.mjGAIN_SO3
        elif what == "trn_so3":
            mjm.actuator_trntype[0] = mujoco.mjtTrn.mjTRN_SO3
        else:
            mjm.actuator_delay[0] = 0.01          # a delay needs a buffer
    _, m = load("mjx_actuator_arm21_muscle/arm21.xml", edit=edit)
    expect = {"dyn_dcmotor": "dcmotor", "gain_dcmotor": "dcmotor", "bias_dcmotor": "dcmotor",
              "gain_so3": "so3",
              "trn_so3": "so3", "history": "delay"}[what]
    with pytest.raises(simjax.UnsupportedFeatureError, match=expect):
        if what == "history":        # delays are parameters: checked on a concrete model
            actuation.tables(m)
        else:
            forward_jit()(m, make_data(m))


ADHESION = """
<mujoco>
  <option cone="{cone}"/>
  <worldbody>
    <geom name="floor" type="plane" size="5 5 .1"/>
    <body name="box" pos="0 0 0.098">
      <freejoint/>
      <geom type="box" size=".1 .1 .1" margin="0.01"/>
      <body name="arm" pos="0.2 0 0">
        <joint type="hinge" axis="0 1 0"/>
        <geom type="capsule" fromto="0 0 0 0.2 0 0" size="0.03"/>
      </body>
    </body>
    <body name="ball" pos="0.05 0.02 0.285">
      <freejoint/>
      <geom type="sphere" size=".09" condim="{condim}"/>
    </body>
  </worldbody>
  <actuator>
    <adhesion body="box" ctrlrange="0 1" gain="5"/>
    <adhesion body="ball" ctrlrange="0 1" gain="3"/>
    <adhesion body="arm" ctrlrange="0 1" gain="2"/>
  </actuator>
</mujoco>
"""


@pytest.mark.parametrize("cone,condim", [("pyramidal", 3), ("elliptic", 4),
                                         ("pyramidal", 1)])
def test_body_transmission_on_mujoco_contacts(cone, condim):
    from mujoco_oracle import model_from_mujoco
    mjm = mujoco.MjModel.from_xml_string(ADHESION.format(cone=cone, condim=condim))
    mjd = mujoco.MjData(mjm)
    mjd.ctrl[:] = [0.7, 0.4, 0.9]
    mujoco.mj_forward(mjm, mjd)
    assert mjd.ncon >= 2
    m = model_from_mujoco(mjm)
    n = mjd.ncon + 2                      # spare invalid slots must be ignored
    con = make_contact(n, np.r_[mjd.contact.dim, [3, 3]], jnp.float64)
    pad = lambda a, fill=0: np.concatenate([a, np.full((2,) + a.shape[1:], fill, a.dtype)])  # noqa: E731
    con = con.replace(pos=jnp.asarray(pad(mjd.contact.pos)),
                      frame=jnp.asarray(pad(mjd.contact.frame.reshape(-1, 3, 3))),
                      geom=jnp.asarray(pad(mjd.contact.geom, -1), jnp.int32),
                      exclude=jnp.asarray(pad(mjd.contact.exclude), jnp.int32),
                      valid=jnp.asarray(np.arange(n) < mjd.ncon))
    d = make_data(m).replace(qpos=jnp.asarray(mjd.qpos))

    @jax.jit        # (op by op, each operation compiled on its own took longer)
    def run(d, con):
        d = smooth.com_pos(m, smooth.kinematics(m, d))
        return actuation.transmission(m, d.replace(contact=con,
                                                   ncon=jnp.asarray(mjd.ncon)))
    d = run(d, con)
    ref = _moment(mjm, mjd)
    assert np.abs(ref).max() > 0.1
    assert rel_err(d.actuator_moment, ref) < 1e-12
    assert rel_err(d.actuator_length, mjd.actuator_length) == 0.0
