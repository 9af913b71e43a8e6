"""Contact sensors' velocity fields (``data="linvel angvel"``) against MuJoCo 4.0.0,
float64, through simjax.forward with simjax's own compiler and collision: the relative
velocity (geom2's body minus geom1's, at the contact point) in the contact frame, its
third component negated when the sensor's sides match the contact's geoms reversed.

The scene moves every body (random velocities, no gravity) so that both sides of a
contact contribute: a free box with an off-centre geom (its centre of mass away from
its frame) on a plane, a hinged sphere on it touching a free ball. Tolerance 1e-9
relative to max(1, |value|): velocities are kinematic (no solver involved); measured
2.8e-12 absolute over all the sensors' values (forces of the maxforce sensor
included)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import pytest

import simjax
from engine_helpers import rel_err
from mujoco_oracle import model_from_mujoco
from simjax.errors import MJCFError
from simjax.types import Stage

SCENE = """<mujoco><option gravity="0 0 0"/>
<worldbody>
  <geom name="floor" type="plane" size="5 5 .1"/>
  <body name="a" pos="0 0 .099" euler="10 20 30"><freejoint/>
    <geom name="ga" type="box" size=".1 .1 .1" pos=".01 .02 0"/>
    <site name="zone" type="box" size=".3 .3 .05" pos="0 0 -.1"/>
    <body name="a2" pos="0 0 .25"><joint type="hinge" axis="1 0 0"/>
      <geom name="ga2" type="sphere" size=".06"/></body></body>
  <body name="b" pos=".05 .01 .44"><freejoint/>
    <geom name="gb" type="sphere" size=".1"/></body>
</worldbody>
<sensor>
  <contact geom1="ga" geom2="floor" data="found linvel angvel" num="4"/>
  <contact geom1="floor" geom2="ga" data="linvel angvel"/>
  <contact body1="a2" body2="b" data="pos linvel"/>
  <contact body1="b" body2="a2" data="angvel"/>
  <contact subtree1="a" data="found dist linvel angvel" reduce="mindist" num="2"/>
  <contact subtree1="a" data="force linvel" reduce="maxforce" num="3"/>
  <contact site="zone" data="found linvel angvel" num="2"/>
  <contact data="linvel angvel" num="3"/>
</sensor></mujoco>"""


@pytest.fixture(scope="module")
def jforward():
    return jax.jit(simjax.forward)


def test_contact_velocity_fields(jforward):
    mjm = mujoco.MjModel.from_xml_string(SCENE)
    m = simjax.load_model(SCENE)
    # stage: velocity, but acceleration with a force field
    assert list(np.asarray(m.sensor_needstage)) == [Stage.VEL] * 5 + [Stage.ACC] + \
        [Stage.VEL] * 2
    assert list(np.asarray(m.sensor_needstage)) == list(mjm.sensor_needstage)
    rng = np.random.default_rng(0)
    for model in (m, model_from_mujoco(mjm)):
        for _ in range(3):
            mjd = mujoco.MjData(mjm)
            mjd.qvel[:] = rng.normal(size=mjm.nv)
            mujoco.mj_forward(mjm, mjd)
            assert mjd.ncon == 3
            d = simjax.make_data(model).replace(qvel=jnp.asarray(mjd.qvel))
            d = jforward(model, d)
            assert int(d.ncon) == 3
            sd = np.asarray(d.sensordata)
            for i in range(mjm.nsensor):
                a, n = mjm.sensor_adr[i], mjm.sensor_dim[i]
                assert rel_err(sd[a:a + n], mjd.sensordata[a:a + n]) < 1e-9, \
                    (i, sd[a:a + n], mjd.sensordata[a:a + n])
            # the velocity fields are not all zero (both sides of a contact move)
            assert np.abs(mjd.sensordata).max() > 0.1


def test_netforce_with_velocity_refused():
    xml = SCENE.replace('data="force linvel" reduce="maxforce"',
                        'data="found linvel" reduce="netforce"')
    with pytest.raises(ValueError, match="netforce reduction is incompatible"):
        mujoco.MjModel.from_xml_string(xml)
    with pytest.raises(MJCFError, match="netforce reduction is incompatible"):
        simjax.load_model(xml)
