"""Helpers for sensor tests: oracle models, per-type comparison of sensordata."""
from __future__ import annotations

import os

import jax
import mujoco
import numpy as np

from engine_helpers import random_state, rel_err, set_state, to_data
from mujoco_oracle import model_from_mujoco
from simjax.engine import forward, make_data

SENSOR_MODELS = os.path.join(os.path.dirname(__file__), "sensor_models")
TOL = 1e-6


def oracle(mjm, constraints=False):
    """(mujoco.MjModel, simjax Model) with constraints disabled unless asked for."""
    if not constraints:
        mjm.opt.disableflags |= mujoco.mjtDisableBit.mjDSBL_CONSTRAINT
    return mjm, model_from_mujoco(mjm)


def type_name(t):
    return mujoco.mjtSensor(int(t)).name[len("mjSENS_"):].lower()


def sensor_errors(mjm, m, nstate=10, seed=0, time=1.25):
    """Largest error (rel_err) per sensor type over ``nstate`` random states, comparing
    simjax.forward's sensordata with mujoco.mj_forward's."""
    mjd = mujoco.MjData(mjm)
    fwd = jax.jit(forward)
    rng = np.random.default_rng(seed)
    d0 = make_data(m)
    worst = {}
    # MuJoCo's lazy energy flags are set by a first forward (as in any simulation loop)
    mujoco.mj_forward(mjm, mjd)
    for _ in range(nstate):
        state = random_state(mjm, rng)
        set_state(mjm, mjd, state)
        mjd.time = time
        # sensors that MuJoCo evaluates lazily may read energies already in Data
        state["energy"] = mjd.energy.copy()
        mujoco.mj_forward(mjm, mjd)
        d = fwd(m, to_data(d0, state).replace(time=np.float64(time)))
        sd = np.asarray(d.sensordata)
        for i in range(mjm.nsensor):
            a, n = mjm.sensor_adr[i], mjm.sensor_dim[i]
            name = type_name(mjm.sensor_type[i])
            worst[name] = max(worst.get(name, 0.0), rel_err(sd[a:a + n], mjd.sensordata[a:a + n]))
    return worst


def assert_sensors_match(mjm, m, nstate=10, tol=TOL):
    worst = sensor_errors(mjm, m, nstate)
    bad = {k: v for k, v in worst.items() if not v <= tol}
    assert not bad, f"sensor types off MuJoCo: {bad}"
    return worst
