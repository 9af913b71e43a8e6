"""Every corpus model with actuators, tendons or sensors against MuJoCo 4.0 (float64),
all of the actuation / tendon / sensor outputs at once: ten random states each,
constraints disabled; actuator_length, actuator_velocity, dense actuator_moment,
actuator_force, act_dot, ten_length, dense ten_J, qfrc_actuator and sensordata agree to
1e-6 (relative to max(1, |value|)). Measured: ~1e-14 or better everywhere except the
side-site model's inside wraps (~4e-9, see test_tendon.py).

The default suite already checks these fields model by model (test_actuation.py,
test_tendon.py, test_sensor.py); pendula's tendons are only covered here, so it runs by
default and the rest with the slow suite.
"""
import mujoco
import numpy as np
import pytest

from engine_helpers import forward_jit, load, random_state, rel_err, set_state, to_data
from simjax.engine import make_data

SLOW = pytest.mark.slow
MODELS = [
    "mjx_pendula/pendula.xml",
    pytest.param("mujoco_arm26/arm26.xml", marks=SLOW),
    pytest.param("mjx_actuator_arm21_muscle/arm21.xml", marks=SLOW),
    pytest.param("mjx_tendon_pulley_fixed_site_wrap/pulley_fixed_site_wrap.xml", marks=SLOW),
    pytest.param("mjx_tendon_wrap_sidesite/wrap_sidesite.xml", marks=SLOW),
    pytest.param("mjx_actuator_tendon_force_clamp/tendon_force_clamp.xml", marks=SLOW),
    pytest.param("mujoco_car/car.xml", marks=SLOW),
    pytest.param("mujoco_slider_crank/slider_crank.xml", marks=SLOW),
    pytest.param("warp_actuation_site/site.xml", marks=SLOW),
    pytest.param("mjx_sensor/sensor.xml", marks=SLOW),
    pytest.param("mjx_shadow_hand/scene_right.xml", marks=SLOW),
    pytest.param("menagerie_trossen_wx250s/scene.xml", marks=SLOW),
]


def _dense(mjm, data, rownnz, rowadr, colind, n):
    out = np.zeros((n, mjm.nv))
    if n:
        mujoco.mju_sparse2dense(out, data, rownnz, rowadr, colind)
    return out


def _reference(mjm, mjd):
    return {
        "actuator_length": mjd.actuator_length, "actuator_velocity": mjd.actuator_velocity,
        "actuator_force": mjd.actuator_force, "act_dot": mjd.act_dot,
        "qfrc_actuator": mjd.qfrc_actuator, "ten_length": mjd.ten_length,
        "sensordata": mjd.sensordata,
        "actuator_moment": _dense(mjm, mjd.actuator_moment, mjd.moment_rownnz,
                                  mjd.moment_rowadr, mjd.moment_colind, mjm.nout),
        "ten_J": _dense(mjm, mjd.ten_J, mjm.ten_J_rownnz, mjm.ten_J_rowadr,
                        mjm.ten_J_colind, mjm.ntendon),
    }


@pytest.mark.parametrize("rel", MODELS)
def test_actuation_tendon_sensor_outputs(rel):
    mjm, m = load(rel)
    mjd = mujoco.MjData(mjm)
    fwd = forward_jit()
    d0 = make_data(m)
    rng = np.random.default_rng(0)
    worst = {}
    for _ in range(10):
        st = random_state(mjm, rng)
        set_state(mjm, mjd, st)
        mujoco.mj_forward(mjm, mjd)
        d = fwd(m, to_data(d0, st))
        for name, ref in _reference(mjm, mjd).items():
            worst[name] = max(worst.get(name, 0.0), rel_err(getattr(d, name), ref))
    bad = {k: v for k, v in worst.items() if not v <= 1e-6}
    assert not bad, f"{rel}: {bad}"
