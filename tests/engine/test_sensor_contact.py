"""Contact- and constraint-dependent sensors with MuJoCo's contacts and constraint rows
injected: touch, contact (every matching rule and reduction), force/torque and
accelerations through rne_post_constraint (contacts, connect and weld equalities),
joint and tendon limit sensors. simjax's own collision and solver are not involved:
Data gets mujoco's d.contact and efc_* arrays, qacc and actuator forces; the sensor
stages must then reproduce mujoco's sensordata, cacc, cfrc_int and cfrc_ext (float64,
1e-9 relative to max(1, |value|))."""
import os
import types

import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import pytest

from engine_helpers import rel_err
from mujoco_oracle import model_from_mujoco
from sensor_helpers import SENSOR_MODELS, type_name
from simjax.engine import fwd_position, fwd_velocity, make_data, sensor
from simjax.engine.data import CONTACT_FIELD_NAMES, DATA_FIELD_NAMES, Contact

TOL = 1e-9


class Injected(types.SimpleNamespace):
    """Data with the solver's efc rows attached (a stand-in until Data carries them)."""

    def replace(self, **kw):
        return Injected(**{**vars(self), **kw})


jax.tree_util.register_pytree_node(
    Injected, lambda x: (tuple(vars(x).values()), tuple(vars(x))),
    lambda keys, vals: Injected(**dict(zip(keys, vals))))


@jax.jit
def _stages(m, d):
    return sensor.sensor_acc(m, sensor.sensor_vel(m, sensor.sensor_pos(m, d)))


NCON_MAX, NEFC_MAX = 16, 128      # fixed capacities: one compilation for all states


def _pad(x, n, fill=0):
    x = np.asarray(x)
    out = np.full((n,) + x.shape[1:], fill, x.dtype)
    out[:len(x)] = x
    return jnp.asarray(out)


def _contact(mjd, dtype=jnp.float64):
    n = mjd.ncon
    c = mjd.contact
    kw = dict(dist=c.dist, pos=c.pos, frame=c.frame.reshape(n, 3, 3),
              includemargin=c.includemargin, friction=c.friction, solref=c.solref,
              solreffriction=c.solreffriction, solimp=c.solimp, adhesion=c.adhesion, dim=c.dim,
              geom=c.geom, exclude=c.exclude, efc_address=c.efc_address,
              valid=np.ones(n, bool))
    fill = {"geom": -1, "efc_address": -1, "dim": 1}
    return Contact(**{k: _pad(kw[k], NCON_MAX, fill.get(k, 0)) for k in CONTACT_FIELD_NAMES})


def _states(mjm, rng, n):
    for k in range(n):
        mjd = mujoco.MjData(mjm)
        mjd.qpos[:] = mjm.qpos0 + 0.01 * k * rng.standard_normal(mjm.nq)
        mjd.qpos[mjm.jnt_qposadr[mjm.joint("hinge").id]] = 0.15 + 0.02 * k
        mjd.qpos[mjm.jnt_qposadr[mjm.joint("s1").id]] = 0.25
        mjd.qpos[mjm.jnt_qposadr[mjm.joint("s2").id]] = -0.1 * k
        for j in range(mjm.njnt):
            if mjm.jnt_type[j] == mujoco.mjtJoint.mjJNT_FREE:
                a = mjm.jnt_qposadr[j] + 3
                mjd.qpos[a:a + 4] /= np.linalg.norm(mjd.qpos[a:a + 4])
        mjd.qvel[:] = 0.3 * rng.standard_normal(mjm.nv)
        mjd.xfrc_applied[1:] = rng.standard_normal((mjm.nbody - 1, 6))
        mujoco.mj_forward(mjm, mjd)
        mujoco.mj_rnePostConstraint(mjm, mjd)
        yield mjd


def _inject(m, mjd):
    d = make_data(m).replace(qpos=jnp.asarray(mjd.qpos), qvel=jnp.asarray(mjd.qvel),
                             xfrc_applied=jnp.asarray(mjd.xfrc_applied))
    d = fwd_velocity(m, fwd_position(m, d))
    fields = {f: getattr(d, f) for f in DATA_FIELD_NAMES if not f.startswith("efc_")}
    for f in ("qacc", "actuator_force", "qfrc_actuator"):
        fields[f] = jnp.asarray(getattr(mjd, f))
    efc = {f: _pad(getattr(mjd, f), NEFC_MAX, -1 if f == "efc_type" else 0) for f in
           ("efc_force", "efc_type", "efc_id", "efc_pos", "efc_margin", "efc_vel")}
    efc["efc_active"] = _pad(np.ones(mjd.nefc, bool), NEFC_MAX, False)
    return Injected(**fields, **efc, nefc=jnp.asarray(mjd.nefc), contact=_contact(mjd),
                    ncon=jnp.asarray(mjd.ncon))


def _model(full):
    """contacts.xml; without ``full`` only 4 of its 12 contact sensors (faster to
    compile) and no touch sensors but one."""
    spec = mujoco.MjSpec.from_file(os.path.join(SENSOR_MODELS, "contacts.xml"))
    if not full:
        keep = {0, 21, 26, 27, 28}
        for i, sen in reversed(list(enumerate(spec.sensors))):
            if sen.type in (mujoco.mjtSensor.mjSENS_CONTACT, mujoco.mjtSensor.mjSENS_TOUCH) \
                    and i not in keep:
                spec.delete(sen)
    return spec.compile()


def _check_sensors(mjm, mjd, d, tol, skip=()):
    """Assert every sensor (but ``skip``) matches MuJoCo to ``tol``; return the names of
    the types seen with non-zero values."""
    sd, seen = np.asarray(d.sensordata), set()
    for i in range(mjm.nsensor):
        if i in skip:
            continue
        a, n = mjm.sensor_adr[i], mjm.sensor_dim[i]
        err = rel_err(sd[a:a + n], mjd.sensordata[a:a + n])
        assert err < tol, (i, type_name(mjm.sensor_type[i]), sd[a:a + n],
                           mjd.sensordata[a:a + n])
        if np.any(mjd.sensordata[a:a + n] != 0):
            seen.add(type_name(mjm.sensor_type[i]))
    return seen


@pytest.mark.parametrize("cone,full", [
    # ~100 s each on 2 cores (the whole forward pass of the contact scene compiles)
    pytest.param("pyramidal", False, marks=pytest.mark.slow),
    pytest.param("pyramidal", True, marks=pytest.mark.slow),
    pytest.param("elliptic", True, marks=pytest.mark.slow)])
def test_contact_sensors_with_injected_contacts(cone, full):
    mjm = _model(full)
    if cone == "elliptic":
        mjm.opt.cone = mujoco.mjtCone.mjCONE_ELLIPTIC
    m = model_from_mujoco(mjm)
    rng = np.random.default_rng(3)
    seen = set()
    for mjd in _states(mjm, rng, 3):
        assert mjd.ncon >= 6 and mjd.ne and mjd.nl
        d = _inject(m, mjd)
        d = _stages(m, d)
        for f in ("cacc", "cfrc_int", "cfrc_ext"):
            assert rel_err(getattr(d, f), getattr(mjd, f)) < TOL, f
        seen |= _check_sensors(mjm, mjd, d, TOL)
    # every sensor type of the model was exercised with non-zero values
    assert seen >= {"touch", "contact", "force", "torque", "jointlimitpos", "jointlimitvel",
                    "jointlimitfrc", "tendonlimitpos", "accelerometer",
                    "framelinacc"}


# --------------------------------------------------------------------------- end to end
E2E_TOL = 1e-6


@pytest.fixture(scope="module")
def jforward():
    from simjax.engine import forward
    return jax.jit(forward)


@pytest.mark.slow                      # ~80 s each: compiles the whole forward pass
@pytest.mark.parametrize("full", [False, True])
def test_contact_sensors_end_to_end(full, jforward):
    """simjax's own collision, constraint rows and solver (simjax.forward) against
    mj_forward: touch, contact (matching and reduction modes), force/torque,
    accelerometer and limit sensors agree to 1e-6 relative to max(1, |value|) (the
    solver tolerance; measured: qacc ~1e-14); contact sensors without matching criteria
    and reduction report the first contacts of all pairs, in MuJoCo's contact order."""
    mjm = _model(full)
    m = model_from_mujoco(mjm)
    rng = np.random.default_rng(3)
    seen = set()
    for mjd in _states(mjm, rng, 3):
        d = make_data(m).replace(qpos=jnp.asarray(mjd.qpos), qvel=jnp.asarray(mjd.qvel),
                                 xfrc_applied=jnp.asarray(mjd.xfrc_applied))
        d = jforward(m, d)
        assert int(d.ncon) == mjd.ncon and mjd.ncon >= 6
        assert rel_err(d.qacc, mjd.qacc) < E2E_TOL
        pairs = sorted(map(tuple, np.asarray(d.contact.geom)[np.asarray(d.contact.valid)]))
        assert pairs == sorted(map(tuple, mjd.contact.geom))
        seen |= _check_sensors(mjm, mjd, d, E2E_TOL)
    assert seen >= {"touch", "contact", "force", "torque", "jointlimitfrc", "accelerometer"}
