"""Tendons (mj_tendon, mju_wrap) and tendon passive forces against MuJoCo 4.0 (float64).

Ten random states per model, constraints disabled: lengths, dense Jacobians, velocities,
wrap paths (ten_wrapadr, ten_wrapnum, wrap_obj, wrap_xpos), and with tendon stiffness,
dead-band spring lengths, damping and armature switched on by editing the MjModel, the
passive forces, the inertia matrix and the smooth acceleration.

Tolerance 1e-6 (relative to max(1, |value|)). Everything agrees to ~1e-14 except inside
wraps (side site within the wrapping geom): MuJoCo 4.0's tangent point differs from the
exact root of the inside-wrap equation by up to ~3e-7 rad, simjax returns the exact root,
so wrap points on those geoms agree to ~4e-8 and ten_J to ~1e-8.
"""
import mujoco
import numpy as np
import pytest

from engine_helpers import (arm26_original_sidesites, dense_ten_j, forward_jit, load,
                            random_state, rel_err, set_state, to_data)
from simjax.engine import forward, make_data

TOL = 1e-6
MODELS = [
    "mjx_tendon_pulley_fixed_site_wrap/pulley_fixed_site_wrap.xml",
    "mjx_tendon_wrap_sidesite/wrap_sidesite.xml",
    "mujoco_arm26/arm26.xml",
    "mjx_actuator_arm21_muscle/arm21.xml",
    "mjx_actuator_tendon_force_clamp/tendon_force_clamp.xml",
    "mujoco_car/car.xml",
    pytest.param("mjx_sensor/sensor.xml", marks=pytest.mark.slow),
]
NSTATE = 10


def _compare(mjm, m, states, fields):
    fwd = forward_jit()
    mjd = mujoco.MjData(mjm)
    data0 = make_data(m)
    worst = {}
    for st in states:
        set_state(mjm, mjd, st)
        mujoco.mj_forward(mjm, mjd)
        d = fwd(m, to_data(data0, st))
        for name, (ours, theirs) in fields.items():
            err = rel_err(ours(d, mjd), theirs(mjd))
            worst[name] = max(worst.get(name, 0.0), err)
    return worst


def _npath(mjd):
    return int(mjd.ten_wrapnum.sum())


TENDON_FIELDS = {
    "ten_length": (lambda d, mjd: d.ten_length, lambda mjd: mjd.ten_length),
    "ten_velocity": (lambda d, mjd: d.ten_velocity, lambda mjd: mjd.ten_velocity),
    "ten_wrapadr": (lambda d, mjd: d.ten_wrapadr, lambda mjd: mjd.ten_wrapadr),
    "ten_wrapnum": (lambda d, mjd: d.ten_wrapnum, lambda mjd: mjd.ten_wrapnum),
    "wrap_obj": (lambda d, mjd: np.asarray(d.wrap_obj)[:_npath(mjd)],
                 lambda mjd: mjd.wrap_obj.ravel()[:_npath(mjd)]),
    "wrap_xpos": (lambda d, mjd: np.asarray(d.wrap_xpos)[:_npath(mjd)],
                  lambda mjd: mjd.wrap_xpos.reshape(-1, 3)[:_npath(mjd)]),
}


@pytest.mark.parametrize("rel", MODELS)
def test_tendon_kinematics(rel):
    mjm, m = load(rel)
    rng = np.random.default_rng(0)
    states = [random_state(mjm, rng) for _ in range(NSTATE)]
    fields = dict(TENDON_FIELDS)
    fields["ten_J"] = (lambda d, mjd: d.ten_J, lambda mjd: dense_ten_j(mjm, mjd))
    worst = _compare(mjm, m, states, fields)
    bad = {k: v for k, v in worst.items() if not v <= TOL}
    assert not bad, f"{rel}: {bad}"


def test_arm26_original_sidesites():
    """With side sites below the joints the opposite-side rule of MuJoCo 4.0 decides
    most paths (wrapping where the straight segment misses the geom, and the long way
    round): 40 states over the full joint circle."""
    mjm, m = load("mujoco_arm26/arm26.xml", edit=arm26_original_sidesites)
    rng = np.random.default_rng(5)
    states = [random_state(mjm, rng, qscale=2.0) for _ in range(40)]
    fields = dict(TENDON_FIELDS)
    fields["ten_J"] = (lambda d, mjd: d.ten_J, lambda mjd: dense_ten_j(mjm, mjd))
    worst = _compare(mjm, m, states, fields)
    bad = {k: v for k, v in worst.items() if not v <= TOL}
    assert not bad, bad


def _geom_wrapping(mjm):
    """(ntendon,) bool: tendon wraps a sphere or cylinder."""
    out = np.zeros(mjm.ntendon, bool)
    for t in range(mjm.ntendon):
        types = mjm.wrap_type[mjm.tendon_adr[t]:mjm.tendon_adr[t] + mjm.tendon_num[t]]
        out[t] = np.any((types == mujoco.mjtWrap.mjWRAP_SPHERE) |
                        (types == mujoco.mjtWrap.mjWRAP_CYLINDER))
    return out


def _tendon_passive(mjm):
    """Stiffness with a dead band around the current spring lengths, damping, and
    armature on the tendons that do not wrap geoms (MuJoCo has no Jdot for those)."""
    n = mjm.ntendon
    mjm.tendon_stiffness[:] = np.linspace(5.0, 50.0, n)
    mjm.tendon_damping[:] = np.linspace(0.5, 3.0, n)
    mjm.tendon_armature[:] = np.where(_geom_wrapping(mjm), 0.0, np.linspace(0.01, 0.2, n))
    mid = mjm.tendon_length0.copy()
    mjm.tendon_lengthspring[:, 0] = mid - 0.01
    mjm.tendon_lengthspring[:, 1] = mid + 0.01


@pytest.mark.parametrize("rel", ["mjx_tendon_wrap_sidesite/wrap_sidesite.xml",
                                 "mjx_tendon_pulley_fixed_site_wrap/pulley_fixed_site_wrap.xml",
                                 "mjx_actuator_tendon_force_clamp/tendon_force_clamp.xml"])
def test_tendon_passive_and_armature(rel):
    mjm, m = load(rel, edit=_tendon_passive)
    rng = np.random.default_rng(1)
    states = [random_state(mjm, rng) for _ in range(NSTATE)]

    def full_m(mjd):
        out = np.zeros((mjm.nv, mjm.nv))
        mujoco.mj_fullM(mjm, mjd, out)
        return out

    fields = {
        "qfrc_spring": (lambda d, mjd: d.qfrc_spring, lambda mjd: mjd.qfrc_spring),
        "qfrc_damper": (lambda d, mjd: d.qfrc_damper, lambda mjd: mjd.qfrc_damper),
        "qfrc_passive": (lambda d, mjd: d.qfrc_passive, lambda mjd: mjd.qfrc_passive),
        "qM": (lambda d, mjd: d.qM, full_m),
        "qfrc_bias": (lambda d, mjd: d.qfrc_bias, lambda mjd: mjd.qfrc_bias),
        "qacc": (lambda d, mjd: d.qacc, lambda mjd: mjd.qacc),
    }
    worst = _compare(mjm, m, states, fields)
    bad = {k: v for k, v in worst.items() if not v <= TOL}
    assert not bad, f"{rel}: {bad}"
    assert np.any(mjm.tendon_stiffness)     # the edit took effect


def test_wrap_paths_cover_all_cases():
    """The sidesite model exercises sphere and cylinder wraps, inside wraps (side site
    in the geom) and unwrapped segments; the pulley model pulley markers (-2)."""
    seen = set()
    for rel in MODELS[:2]:  # pulley and sidesite models
        mjm, m = load(rel)
        rng = np.random.default_rng(0)
        mjd = mujoco.MjData(mjm)
        for _ in range(NSTATE):
            set_state(mjm, mjd, random_state(mjm, rng))
            mujoco.mj_forward(mjm, mjd)
            obj = mjd.wrap_obj.ravel()[:_npath(mjd)]
            seen |= {("pulley" if o == -2 else "site" if o == -1 else
                      f"geomtype{int(mjm.geom_type[o])}") for o in obj}
    assert {"pulley", "site", "geomtype2", "geomtype5"} <= seen


def test_inside_wrap_traced_only_where_a_side_site_may_be_inside():
    """tendon.wrap's inside wrap (a root-finding loop): not traced when no segment has a
    side site (has_side a NumPy array of False), and otherwise inside a lax.cond."""
    import jax
    from engine_helpers import jaxpr_loops
    from simjax.engine import tendon
    n = 3
    args = [np.ones((n, 3)), -np.ones((n, 3)), np.zeros((n, 3)),
            np.tile(np.eye(3), (n, 1, 1)), np.full(n, 0.5), np.zeros(n, bool), np.zeros((n, 3))]

    def loops(jaxpr):
        # for each loop, whether it sits inside a cond
        return [inside for _, inside in jaxpr_loops(jaxpr)]
    static = jax.make_jaxpr(lambda *a: tendon.wrap(*a, np.zeros(n, bool)))(*args)
    traced = jax.make_jaxpr(lambda *a, h: tendon.wrap(*a, h))(*args, h=np.ones(n, bool))
    assert loops(static.jaxpr) == []
    assert loops(traced.jaxpr) == [True]


def test_inside_wrap_gradient_is_implicit():
    """Derivatives in qpos through the inside wraps (the first tendon of the sidesite
    model wraps from inside both its geoms; its root-finding loop is left out of the
    derivative, which is the implicit one), float64, at random states: of the path
    points (the wrap points move with the root) against central differences (h 1e-6;
    measured 4e-10), and of the length against MuJoCo's ten_J too (measured 2.7e-9:
    the wrap point makes the length stationary, so the geometric Jacobian is the
    derivative; MuJoCo's root is within ~3e-7 rad of the exact one)."""
    import jax
    import jax.numpy as jnp
    from simjax.engine import smooth
    mjm, m = load("mjx_tendon_wrap_sidesite/wrap_sidesite.xml")
    mjd = mujoco.MjData(mjm)
    d0 = make_data(m)

    def path(q):
        d = d0.replace(qpos=q)
        d = smooth.tendon(m, smooth.com_pos(m, smooth.kinematics(m, d)))
        return d.ten_length[0], d.wrap_xpos

    # reverse mode fails on a loop that carries a derivative
    grads = jax.jit(jax.jacrev(path))
    f = jax.jit(path)
    rng = np.random.default_rng(3)
    wraps = 0
    for _ in range(8):
        q = mjm.qpos0 + 0.5 * rng.standard_normal(mjm.nq)
        mjd.qpos[:] = q
        mujoco.mj_forward(mjm, mjd)
        n = mjd.ten_wrapnum[0]
        obj = mjd.wrap_obj.ravel()[:n]
        wraps += int(np.sum(obj >= 0))
        gl, gx = (np.asarray(v) for v in grads(jnp.asarray(q)))
        fd = [[(a - b) / 2e-6 for a, b in zip(f(jnp.asarray(q + e)), f(jnp.asarray(q - e)))]
              for e in 1e-6 * np.eye(mjm.nq)]
        fl = np.array([v[0] for v in fd])
        fx = np.stack([v[1] for v in fd], -1)
        assert np.abs(gl - fl).max() < 1e-8
        assert np.abs(gx[:n] - fx[:n]).max() < 1e-8, np.abs(gx[:n] - fx[:n]).max()
        assert np.abs(gl - dense_ten_j(mjm, mjd)[0]).max() < 1e-8
    assert wraps >= 8


@pytest.mark.slow                      # an eager forward of the model (~20 s)
def test_armature_on_geom_wrapping_tendon_is_unsupported():
    """MuJoCo raises a fatal error for it (mj_tendonDot); simjax names it."""
    import simjax
    mjm, m = load("mjx_tendon_wrap_sidesite/wrap_sidesite.xml")
    m = m.replace(tendon_armature=np.full(mjm.ntendon, 0.1))
    with pytest.raises(simjax.UnsupportedFeatureError, match="armature on tendons"):
        forward(m, make_data(m))


CROSS_BRANCH = """<mujoco><option><flag contact="disable"/></option><worldbody>
  <body><joint name="a" axis="0 1 0"/><geom size=".1" mass="1"/>
    <body pos=".3 0 0"><joint name="c" axis="0 1 0"/><geom size=".1" mass=".5"/></body></body>
  <body pos="1 0 0"><joint name="b" axis="0 1 0"/><geom size=".1" mass="1"/></body>
</worldbody><tendon><fixed armature="2"><joint joint="a" coef="1"/><joint joint="c" coef="-.5"/>
  <joint joint="b" coef="1"/></fixed></tendon></mujoco>"""


def test_tendon_armature_across_branches():
    """A tendon over dofs of two trees adds armature J'J only within M's tree sparsity,
    as MuJoCo (its sparse M has no room for the cross terms): qM, M x and qacc."""
    import jax.numpy as jnp
    import simjax
    from simjax.engine import support
    mjm = mujoco.MjModel.from_xml_string(CROSS_BRANCH)
    mjd = mujoco.MjData(mjm)
    mjd.qpos[:] = [0.3, -0.4, 0.2]
    mjd.qfrc_applied[:] = [1.0, -0.5, 0.25]
    mujoco.mj_forward(mjm, mjd)
    full = np.zeros((3, 3))
    mujoco.mj_fullM(mjm, mjd, full)
    assert full[0, 2] == 0 and full[0, 1] != 0      # the case: a cross term dropped
    m = simjax.load_model(CROSS_BRANCH)
    d = make_data(m).replace(qpos=jnp.array(mjd.qpos), qfrc_applied=jnp.array(mjd.qfrc_applied))
    d = forward_jit()(m, d)
    np.testing.assert_allclose(np.asarray(d.qM), full, rtol=0, atol=1e-12)
    np.testing.assert_allclose(np.asarray(d.qacc), mjd.qacc, rtol=1e-12, atol=1e-12)
    x = np.array([0.7, -1.1, 0.4])
    ref = np.zeros(3)
    mujoco.mj_mulM(mjm, mjd, ref, x)
    np.testing.assert_allclose(np.asarray(support.mul_m(m, d, jnp.array(x))), ref,
                               rtol=1e-12, atol=1e-12)


_THROUGH_CENTRE = """<mujoco><worldbody>
  <site name="a" pos="0 0 1"/><geom name="s" size=".1" pos="0 0 .5"/>
  <body pos="0 0 .1"><freejoint/><geom size=".05"/><site name="b" pos="0 0 .05"/></body>
  <site name="c" pos="1 0 1"/>
  <geom name="k" type="cylinder" size=".1 .2" pos="1 0 .5" euler="90 0 0"/>
  <body pos="1 0 .1"><freejoint/><geom size=".05"/><site name="d" pos="0 0 .05"/></body>
</worldbody>
<tendon><spatial range="0 .8"><site site="a"/><geom geom="s"/><site site="b"/></spatial>
  <spatial range="0 .8"><site site="c"/><geom geom="k"/><site site="d"/></spatial>
</tendon></mujoco>"""


def test_wrap_through_centre():
    """A straight path through a wrapping sphere's or cylinder's centre: both tangent
    paths are equally short, and MuJoCo takes the second (counter-clockwise) one; the
    wrap points, lengths, Jacobians and the reference length follow it."""
    mjm = mujoco.MjModel.from_xml_string(_THROUGH_CENTRE)
    import simjax
    m = simjax.load_model(_THROUGH_CENTRE)
    mjd = mujoco.MjData(mjm)
    mujoco.mj_forward(mjm, mjd)
    d = forward_jit()(m, make_data(m))
    n = _npath(mjd)
    assert rel_err(np.asarray(d.wrap_xpos)[:n], mjd.wrap_xpos.reshape(-1, 3)[:n]) < 1e-12
    assert rel_err(d.ten_length, mjd.ten_length) < 1e-12
    assert rel_err(np.asarray(d.ten_J), dense_ten_j(mjm, mjd)) < 1e-12
    assert rel_err(d.qacc, mjd.qacc) < 1e-9
    assert rel_err(m.tendon_length0, mjm.tendon_length0) < 1e-12
