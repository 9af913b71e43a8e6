"""Actuator length ranges found by simulation at load time (mj_setLengthRange) against
the lengthranges MuJoCo's compiler computes for the same XML (float64).

The simulation is deterministic and both engines solve the same constraint problem
with the same early exits, so the ranges agree to round-off accumulated over 1000
steps (observed: 5e-13 with Euler, 2e-11 with implicitfast and a force cap); the
tolerance is 1e-9."""
import mujoco
import numpy as np
import pytest

import simjax
from simjax.engine import lengthrange

_XML = """<mujoco>
  <compiler angle="radian">{lr}</compiler>
  <option timestep="0.005" {opt}/>
  <worldbody>
    <body>
      <joint name="a" axis="0 1 0" range="-1 1.2" limited="true"/>
      <geom type="capsule" fromto="0 0 0 0.4 0 0" size="0.04"/>
      <body pos="0.4 0 0">
        <joint name="b" axis="0 1 0" range="-0.5 2" limited="true"/>
        <geom type="capsule" fromto="0 0 0 0.3 0 0" size="0.03"/>
        <body pos="0.3 0 0"><joint name="c" axis="0 0 1" {clim}/><geom size="0.05"/></body>
      </body>
    </body>
  </worldbody>
  <tendon>
    <fixed name="t" {tlim}><joint joint="a" coef="0.5"/><joint joint="b" coef="-0.3"/></fixed>
  </tendon>
  <actuator>
    <muscle name="m0" joint="a"/>
    <muscle name="m1" tendon="t" gear="2"/>
    <motor name="m2" joint="b"/>
    <muscle name="m3" joint="b" lengthrange="-0.2 0.3"/>
    {extra}
  </actuator>
</mujoco>"""
TOL = 1e-9


def _xml(lr="", opt="", clim='range="-0.3 0.3" limited="true"', tlim="", extra=""):
    return _XML.format(lr=lr, opt=opt, clim=clim, tlim=tlim, extra=extra)


def _compare(xml):
    mjm = mujoco.MjModel.from_xml_string(xml)
    model = simjax.load_model(xml)
    got = np.asarray(model.actuator_lengthrange)
    np.testing.assert_allclose(got, mjm.actuator_lengthrange, rtol=0, atol=TOL)
    return got


def test_muscles_simulated_others_kept():
    """Default options: the two muscles without a range are simulated (joint limits
    and a fixed tendon with gear 2), the motor keeps (0, 0), the given range stays."""
    got = _compare(_xml())
    assert got[2].tolist() == [0, 0] and got[3].tolist() == [-0.2, 0.3]
    assert got[0, 0] < -1 and got[0, 1] > 1.2          # pushed slightly past the limits


def test_uselimit_copies_joint_and_tendon_ranges():
    """mode=all, useexisting=false, uselimit: limited joints and tendons give their
    ranges without simulation (the given muscle range is replaced as well)."""
    got = _compare(_xml(lr='<lengthrange mode="all" useexisting="false" uselimit="true"/>',
                        tlim='limited="true" range="-0.4 0.5"'))
    assert got.tolist() == [[-1, 1.2], [-0.4, 0.5], [-0.5, 2], [-0.5, 2]]


def test_mode_none_keeps_zero_ranges():
    model = simjax.load_model(_xml(lr='<lengthrange mode="none"/>'))
    assert np.asarray(model.actuator_lengthrange)[:2].tolist() == [[0, 0], [0, 0]]


@pytest.mark.slow
def test_options_implicitfast_force_cap():
    """mode=all (the motor too), accel, maxforce, timeconst, timestep, inttotal,
    interval; implicitfast integration."""
    _compare(_xml(lr='<lengthrange mode="all" accel="5" maxforce="1" timeconst="0.5" '
                     'timestep="0.004" inttotal="6" interval="1"/>',
                  opt='integrator="implicitfast"'))


@pytest.mark.slow
def test_unlimited_joint_does_not_converge():
    """A muscle on an unlimited hinge keeps moving: the same error as MuJoCo."""
    xml = _xml(extra='<muscle name="m4" joint="c"/>', clim="")
    with pytest.raises(ValueError) as mj:
        mujoco.MjModel.from_xml_string(xml)
    with pytest.raises(simjax.MJCFError) as ours:
        simjax.load_model(xml)
    assert "Lengthrange computation did not converge in actuator 4" in str(ours.value)
    expected = str(mj.value).split("actuator 4:")[1].split()
    assert str(ours.value).split("actuator 4:")[1].split() == expected


def test_options_parsed():
    """<compiler><lengthrange> attributes reach LROpt with MuJoCo's defaults."""
    opt = lengthrange.LROpt()
    assert (opt.mode, opt.useexisting, opt.uselimit, opt.accel, opt.maxforce, opt.timeconst,
            opt.timestep, opt.inttotal, opt.interval, opt.tolrange) == (
        lengthrange.MODE_MUSCLE, True, False, 20, 0, 1, 0.01, 10, 2, 0.05)
    from simjax.mjcf.compile import _settings
    from simjax.mjcf.parse import parse
    root, _ = parse('<mujoco><compiler><lengthrange mode="muscleuser" uselimit="true" '
                    'tolrange="0.1"/></compiler></mujoco>')
    assert _settings(root).lengthrange == {"mode": "muscleuser", "uselimit": True,
                                           "tolrange": 0.1}
