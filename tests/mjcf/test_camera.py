"""Camera intrinsics against MuJoCo 4.0.0 (mjCCamera::Compile): with a sensor size,
pixel focal lengths and principal points convert through the pixel density and fovy
follows from the sensor height and the vertical focal length; focal or principal
values without a sensor size, a sensor size without a resolution and fovy of 180
degrees or more are errors."""
from __future__ import annotations

import mujoco
import numpy as np
import pytest

import simjax

XML = """<mujoco><worldbody>
  <camera pos="0 0 1" focalpixel="1600 1500" principalpixel="10 20" resolution="1920 1200"
          sensorsize="0.0096 0.006"/>
  <camera pos="0 2 1" focal="8e-3 7e-3" principal="1e-3 2e-3" resolution="640 480"
          sensorsize="0.004 0.003"/>
  <camera fovy="30"/>
</worldbody></mujoco>"""


def test_intrinsics_and_fovy():
    mjm = mujoco.MjModel.from_xml_string(XML)
    m = simjax.load_model(XML)
    np.testing.assert_allclose(np.asarray(m.cam_fovy), mjm.cam_fovy, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(m.cam_intrinsic), mjm.cam_intrinsic, rtol=1e-6,
                               atol=1e-9)
    assert abs(mjm.cam_fovy[0] - 45) > 1          # fovy from the sensor, not the default


@pytest.mark.parametrize("cam,message", [
    ('<camera focal="1 1" resolution="10 10"/>', "focal/principal require sensorsize"),
    ('<camera sensorsize="1 1" resolution="0 10"/>', "sensorsize requires positive"),
    ('<camera fovy="180"/>', "fovy too large"),
])
def test_camera_errors(cam, message):
    xml = f"<mujoco><worldbody>{cam}</worldbody></mujoco>"
    with pytest.raises(ValueError, match=message):
        mujoco.MjModel.from_xml_string(xml)
    with pytest.raises(simjax.MJCFError, match=message):
        simjax.load_model(xml)
