"""MJCF plugin declarations, instances and config: compile results and every compile
error, each checked against MuJoCo 4.0.0 raising at the same place."""
import mujoco
import numpy as np
import pytest

import simjax
from simjax import MJCFError

BASE = """<mujoco>
  {ext}
  <worldbody>
    <body>
      <joint name="j" type="slide"/>
      <geom size=".1"/>
      <site name="s"/>
    </body>
  </worldbody>
  {rest}
</mujoco>"""


def xml(ext="", rest=""):
    return BASE.format(ext=ext, rest=rest)


def both_raise(text, match, line):
    """simjax raises MJCFError at ``line`` with ``match``; MuJoCo raises too."""
    with pytest.raises(MJCFError, match=match) as info:
        simjax.load_model(text)
    assert info.value.line == line
    assert info.value.file is not None and info.value.element
    with pytest.raises(ValueError):
        mujoco.MjModel.from_xml_string(text)
    return info.value


PID_DECL = '<extension><plugin plugin="mujoco.pid"/></extension>'


def test_plugin_declared_but_not_registered():
    e = both_raise(xml('<extension><plugin plugin="no.such.plugin"/></extension>'),
                   "plugin no.such.plugin not found", 2)
    assert e.element.endswith("plugin[0]")


def test_element_references_undeclared_plugin():
    both_raise(xml(rest='<actuator><plugin joint="j" plugin="mujoco.pid"/></actuator>'),
               "unrecognized plugin 'mujoco.pid'", 10)


def test_element_references_unknown_instance():
    both_raise(xml(PID_DECL, '<actuator><plugin joint="j" instance="nope"/></actuator>'),
               "unrecognized name 'nope' for plugin instance", 10)


def test_neither_plugin_nor_instance():
    both_raise(xml(PID_DECL, '<actuator><plugin joint="j"/></actuator>'),
               "neither 'plugin' nor 'instance'", 10)


def test_unknown_config_key_explicit_instance():
    text = xml('<extension><plugin plugin="mujoco.pid"><instance name="p">'
               '<config key="kq" value="1"/></instance></plugin></extension>',
               '<actuator><plugin joint="j" instance="p"/></actuator>')
    e = both_raise(text, r"unrecognized attribute 'plugin:kq' for plugin mujoco.pid", 2)
    assert "instance[p]" in e.element


def test_unknown_config_key_implicit_instance():
    both_raise(xml(PID_DECL, '<actuator>\n<plugin joint="j" plugin="mujoco.pid">'
                   '<config key="kq" value="1"/></plugin></actuator>'),
               "unrecognized attribute 'plugin:kq'", 11)


def test_duplicate_config_key():
    both_raise(xml(PID_DECL, '<actuator><plugin joint="j" plugin="mujoco.pid">\n'
                   '<config key="kp" value="1"/><config key="kp" value="2"/></plugin>'
                   '</actuator>'), "duplicate config key: kp", 11)


def test_invalid_value_negative_imax():
    both_raise(xml(PID_DECL, '<actuator>\n<plugin joint="j" plugin="mujoco.pid" actdim="1">'
                   '<config key="ki" value="1"/><config key="imax" value="-1"/></plugin>'
                   '</actuator>'), "negative imax", 11)


def test_invalid_value_wrong_actdim():
    both_raise(xml(PID_DECL, '<actuator>\n<plugin joint="j" plugin="mujoco.pid">'
                   '<config key="ki" value="1"/></plugin></actuator>'),
               'actuator 0 has actdim 0, expected 1', 11)


def test_plugin_without_capability():
    both_raise(xml(PID_DECL, '<sensor><plugin plugin="mujoco.pid"/></sensor>'),
               "plugin 'mujoco.pid' does not support sensors", 10)


def test_instance_without_actuator():
    both_raise(xml('<extension><plugin plugin="mujoco.pid"><instance name="p"/></plugin>'
                   '</extension>'), "actuator not found for plugin instance 0", 2)


def test_non_numeric_value_is_an_error():
    """Deliberate difference: MuJoCo's pid reads 'abc' with strtod as 0 and loads;
    simjax refuses a value it cannot read instead of silently using 0."""
    text = xml(PID_DECL, '<actuator>\n<plugin joint="j" plugin="mujoco.pid">'
               '<config key="kp" value="abc"/></plugin></actuator>')
    mujoco.MjModel.from_xml_string(text)
    with pytest.raises(MJCFError, match="'abc' is not a number") as info:
        simjax.load_model(text)
    assert info.value.line == 11


def test_config_on_element_referencing_instance():
    """Deliberate difference: MuJoCo 4.0 ignores these <config> children silently."""
    text = xml('<extension><plugin plugin="mujoco.pid"><instance name="p">'
               '<config key="kp" value="1"/></instance></plugin></extension>',
               '<actuator>\n<plugin joint="j" instance="p"><config key="kd" value="1"/>'
               '</plugin></actuator>')
    mujoco.MjModel.from_xml_string(text)
    with pytest.raises(MJCFError, match="cannot be used in an element that references") \
            as info:
        simjax.load_model(text)
    assert info.value.line == 11


def test_instance_requires_name():
    both_raise(xml('<extension><plugin plugin="mujoco.pid"><instance/></plugin>'
                   '</extension>'), "name", 2)


def test_shared_explicit_instance_and_implicit_instances():
    text = """<mujoco>
      <extension>
        <plugin plugin="mujoco.pid">
          <instance name="shared"><config key="kp" value="2"/><config key="ki" value="1"/>
          </instance>
        </plugin>
      </extension>
      <worldbody>
        <body><joint name="a" type="slide"/><geom size=".1"/></body>
        <body><joint name="b" type="slide"/><geom size=".1"/></body>
        <body><joint name="c" type="hinge"/><geom size=".1"/></body>
      </worldbody>
      <actuator>
        <plugin joint="a" instance="shared" actdim="1"/>
        <plugin joint="c" plugin="mujoco.pid"><config key="kp" value="3"/></plugin>
        <plugin joint="b" instance="shared" actdim="2" dyntype="filter"/>
      </actuator>
    </mujoco>"""
    m = simjax.load_model(text)
    mjm = mujoco.MjModel.from_xml_string(text)
    for f in ("nplugin", "npluginstate", "na"):
        assert getattr(m, f) == getattr(mjm, f), f
    for f in ("plugin", "plugin_stateadr", "plugin_statenum", "actuator_plugin",
              "actuator_actadr", "actuator_actnum"):
        np.testing.assert_array_equal(np.asarray(getattr(m, f)), getattr(mjm, f), err_msg=f)
    assert m.plugin_specs[0].actuators == (0, 2)
    assert m.plugin_specs[0].name == "shared" and m.plugin_specs[1].name == ""
    assert float(m.plugin_params[1]["kp"]) == 3.0


@pytest.mark.parametrize("rel", ["mujoco_plugin_pid/pid.xml",
                                 "mujoco_plugin_touch_grid/touch_grid.xml",
                                 "mujoco_plugin_sdf_torus/torus.xml",
                                 "mujoco_plugin_sdf_nutbolt/nutbolt.xml"])
def test_corpus_plugin_fields(rel):
    from mujoco_oracle import corpus_path
    path = corpus_path(rel)
    m = simjax.load_model(path)
    mjm = mujoco.MjModel.from_xml_path(path)
    for f in ("nplugin", "npluginstate", "na", "nsensordata"):
        assert getattr(m, f) == getattr(mjm, f), f
    for f in ("plugin", "plugin_stateadr", "plugin_statenum", "actuator_plugin",
              "sensor_plugin", "geom_plugin", "body_plugin", "sensor_dim", "sensor_adr",
              "sensor_needstage", "sensor_type", "actuator_actnum", "actuator_actadr"):
        np.testing.assert_array_equal(np.asarray(getattr(m, f)).ravel(),
                                      np.asarray(getattr(mjm, f)).ravel(), err_msg=f)
