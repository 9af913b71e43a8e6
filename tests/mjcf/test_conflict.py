"""Global attributes of attached models (``<compiler conflict>``) against MuJoCo 4.0.0:
the merged options, flags and sizes (every comparable Model field equal), the errors
of the ``error`` policy and of unmergeable fields under ``merge`` (MuJoCo's messages),
and the ``warning`` policy keeping the model's values."""
from __future__ import annotations

import os
import sys

import mujoco
import pytest

import simjax

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "conformance"))
from compare import compare  # noqa: E402

PARENT = """<mujoco model="base">
  <compiler conflict="{mode}"/>
  <option timestep="0.005" iterations="50" ccd_iterations="20" {parent_extra}>
    <flag energy="enable"/></option>
  <size nuser_geom="1"/>
  <asset><model name="arm" file="arm.xml"/></asset>
  <worldbody><geom size=".5" user="7"/>
    <body name="b" pos="0 0 1"><joint/><geom size=".1"/>
      <attach model="arm" body="link" prefix="a/"/></body>
  </worldbody>
</mujoco>"""

CHILD = """<mujoco model="arm_model">
  <option timestep="0.002" iterations="80" ls_iterations="30" {child_extra}>
    <flag damper="disable" contact="disable"/></option>
  <size nuser_geom="2"/>
  <worldbody><body name="link" pos="0 0 .2"><joint/><geom size=".05" user="1"/></body>
  </worldbody>
</mujoco>"""


def _write(tmp_path, mode, parent_extra="", child_extra=""):
    (tmp_path / "arm.xml").write_text(CHILD.format(child_extra=child_extra))
    path = tmp_path / "base.xml"
    path.write_text(PARENT.format(mode=mode, parent_extra=parent_extra))
    return str(path)


def test_merge(tmp_path):
    """timestep the minimum, iterations the maximum, ls_iterations adopted,
    ccd_iterations kept (the child leaves it), the child's flags added, nuser_geom the
    maximum; wind adopted (only the child sets it)."""
    path = _write(tmp_path, "merge", child_extra='wind="1 0 0"')
    mjm = mujoco.MjModel.from_xml_path(path)
    with pytest.warns(UserWarning, match="policy is 'merge'"):
        m = simjax.load_model(path)
    _, bad, _ = compare(m, mjm)
    assert not bad, bad
    assert (mjm.opt.timestep, mjm.opt.iterations, mjm.opt.ls_iterations,
            mjm.opt.ccd_iterations, mjm.nuser_geom) == (0.002, 80, 30, 20, 2)
    assert m.opt.disableflags == mjm.opt.disableflags != 0


@pytest.mark.parametrize("mode,extra,message", [
    ("error", {}, "timestep: parent has 0.005, child has 0.002\n"
                  "iterations: parent has 50, child has 80"),
    ("merge", {"parent_extra": 'gravity="0 0 -10"', "child_extra": 'gravity="0 0 0"'},
     "gravity: parent has 0 0 -10, child has 0 0 0"),
    ("merge", {"parent_extra": 'integrator="RK4"', "child_extra": 'integrator="implicit"'},
     "integrator: parent has 1, child has 2"),
])
def test_errors(tmp_path, mode, extra, message):
    path = _write(tmp_path, mode, **extra)
    subject = f"Attach conflict when attaching 'arm' to 'base', policy is '{mode}'"
    with pytest.raises(ValueError) as ref:
        mujoco.MjModel.from_xml_path(path)
    assert subject + "\n" + message in str(ref.value)
    with pytest.raises(simjax.MJCFError) as ours:
        simjax.load_model(path)
    assert subject + "\n" + message in str(ours.value)


def test_warning_keeps_the_model(tmp_path):
    path = _write(tmp_path, "warning", child_extra='wind="1 0 0"')
    mjm = mujoco.MjModel.from_xml_path(path)
    with pytest.warns(UserWarning, match="timestep: parent has 0.005, child has 0.002, "
                                         "keeping parent value"):
        m = simjax.load_model(path)
    _, bad, _ = compare(m, mjm)
    assert not bad, bad
    assert (mjm.opt.timestep, mjm.opt.iterations, mjm.opt.disableflags) == (0.005, 50, 0)
