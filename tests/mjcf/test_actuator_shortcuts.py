"""pid, orientation and dcmotor actuator elements (and general actuators of the so3, pid
and dcmotor families) compiled by simjax against MuJoCo 4.0.0: every comparable Model
field (actuator_* included: control/output blocks, per-input ranges, prm arrays, the
dampratio resolution, acc0) matches exactly or to 1e-6 relative, across default-class
inheritance cases; invalid combinations fail in both compilers."""
import mujoco
import pytest

import simjax
from conformance.compare import compare

BASE = """<mujoco><default>{d}</default><worldbody>
  <body><joint name="j" type="hinge" range="-1 2"/><geom size=".1"/><site name="s"/>
    <body pos="0 0 1"><joint name="b" type="ball"/><geom type="box" size=".1 .2 .3"/>
      <site name="s2" euler="10 20 30"/></body></body>
  </worldbody><actuator>{a}</actuator></mujoco>"""

PID_C = '<pid kp="3" kv="2" ki="1" imax="4" slewmax="2"/>'
DC_C = ('<dcmotor motorconst=".2" resistance="3" inductance="0 0.01" cogging="1 2 3" '
        'input="pos vel" controller="1 2 3 4 5 6" thermal="1 2 0 0.1 20 25" '
        'lugre="1 2 3 4 5" saturation="0 0 7"/>')
GEN = '<general gainprm="5 3 3" biasprm="1 -6 -2 4" dynprm="2 3 4"/>'
CASES = [
    # own parameters, inputs and ranges
    ("", '<pid joint="j" kp="10" kv="1" ki="2" imax="3" slewmax="4"/>'),
    ("", '<pid joint="j" kp="10" dampratio="1" input="pos vel ff" velrange="-1 1" '
         'ffrange="-2 2" posrange="-3 3"/>'),
    ("", '<pid joint="j" kp="2" inheritrange="0.5" input="vel"/>'),
    ("", '<orientation joint="b" kp="5" dampratio="1"/>'),
    ("", '<orientation site="s2" refsite="s" kp="5" dampratio="1" input="quat" '
         'forcerange="0 3"/>'),
    ("", '<dcmotor joint="j" motorconst="0.1" resistance="2" inductance="0.01" '
         'controller="1 2 0.1 5 3 12" thermal="1 2 0 0.004 25 20" lugre="100 1 0.1 0.2 0.1" '
         'input="pos vel" saturation="3 0 100" cogging="0.1 6 0"/>'),
    ("", '<dcmotor joint="j" nominal="24 2 300" damping="0.001" resistance="1"/>'),
    ("", '<dcmotor joint="j" nominal="24 2 300" damping="0.001"/>'),
    ("", '<dcmotor joint="j" motorconst="0.5" saturation="0 3" resistance="1" input="none"/>'),
    ("", '<general joint="j" dyntype="dcmotor" gaintype="dcmotor" biastype="dcmotor" '
         'gainprm="1 1 0 0 1 1" dynprm="0.1 0 1 2 0 1 0 2" input="pos" actearly="true"/>'),
    ("", '<general joint="b" gaintype="so3" biastype="so3" gainprm="2" biasprm="0 -2 -1" '
         'dyntype="integrator" actlimited="true"/>'),
    ("", '<motor joint="j" nsample="3" delay="0.001"/><pid joint="j" kp="2"/>'
         '<orientation joint="b"/><motor joint="j" nsample="2"/>'),
    # default classes
    (GEN, '<pid joint="j"/>'),
    (GEN, '<orientation joint="b"/>'),
    (PID_C, '<pid joint="j" kp="7"/>'),
    (PID_C, '<position joint="j"/>'),
    (PID_C, '<general joint="j"/>'),
    ('<position kp="3" kv="2"/>', '<pid joint="j"/>'),
    ('<general gaintype="pid" biastype="affine" gainprm="0 7 7" biasprm="3 -8 -1 5"/>',
     '<pid joint="j"/>'),
    ('<general input="pos ff"/>', '<pid joint="j"/>'),
    ('<default class="c"><pid kp="3" kv="2" ki="1" imax="4" input="pos vel ff" '
     'posrange="-1 1" velrange="-2 2"/><default class="d"><general gainprm="9 5" '
     'biasprm="1 -8 -1 4" dynprm="4 0 3" ffrange="-3 3"/></default></default>',
     '<pid class="d" joint="j"/>'),
    ('<default class="c">' + PID_C + '<default class="d"><position kp="9"/></default>'
     '</default>', '<pid class="d" joint="j"/>'),
    ('<orientation kp="4" kv="2" input="quat"/>', '<orientation joint="b"/>'),
    ('<general gaintype="so3" biastype="so3" gainprm="3" biasprm="3 -3 -1" input="quat"/>',
     '<orientation joint="b"/>'),
    (DC_C, '<dcmotor joint="j" resistance="2"/>'),
    (DC_C, '<general joint="j"/>'),
    ('<dcmotor motorconst=".2" resistance="3" saturation="2" inductance="0 .01"/>',
     '<pid joint="j" kp="1"/><position joint="j"/><motor joint="j"/>'),
    ('<general actearly="true" actdim="1" dyntype="filter"/>',
     '<intvelocity joint="j" kp="1"/><pid joint="j"/>'),
    # every other shortcut: MuJoCo 4 records the servo shortcuts' inputs and the
    # cylinder's pressure input in actuator_ctrlspec
    ("", '<motor joint="j"/><position joint="j" kv="1"/><velocity joint="j"/>'
         '<intvelocity joint="j" actrange="-1 1"/><damper joint="j" ctrlrange="0 1"/>'
         '<cylinder joint="j"/><adhesion body="world" ctrlrange="0 1"/>'
         '<general joint="j" dyntype="integrator" biastype="affine"/>'),
    # errors in both compilers
    ("", '<pid joint="j" input="none"/>'),
    ("", '<pid joint="j" kv="1" dampratio="1"/>'),
    ("", '<orientation joint="j"/>'),
    ("", '<orientation site="s2"/>'),
    ("", '<dcmotor joint="j" motorconst="1" resistance="1" controller="1"/>'),
    ("", '<dcmotor joint="j" motorconst="1" resistance="1" thermal="2 0 4"/>'),
    ('<general gaintype="dcmotor" gainprm="3 .2 7 7" dynprm="2 3 9"/>',
     '<dcmotor joint="j"/>'),
]


@pytest.mark.parametrize("defaults,actuators", CASES)
def test_compiled_like_mujoco(defaults, actuators):
    xml = BASE.format(d=defaults, a=actuators)
    try:
        mjm = mujoco.MjModel.from_xml_string(xml)
    except ValueError:
        with pytest.raises(simjax.MJCFError):
            simjax.load_model(xml)
        return
    m = simjax.load_model(xml)
    _, bad, n = compare(m, mjm)
    assert n > 100 and not bad, bad
    assert (m.nu, m.nout, m.na) == (mjm.nu, mjm.nout, mjm.na)
