"""Custom data against MuJoCo 4.0.0: tuples (objects found by name, a tuple naming an
earlier one, parameters) and numerics; tuple objects of kinds simjax keeps no names for
raise UnsupportedFeatureError."""
from __future__ import annotations

import mujoco
import numpy as np
import pytest

import simjax
from simjax.errors import MJCFError, UnsupportedFeatureError

XML = """<mujoco><worldbody>
  <body name="b"><joint name="j"/><geom name="g" size=".1"/><site name="s"/></body>
</worldbody>
<actuator><motor name="m" joint="j"/></actuator>
<sensor><jointpos name="p" joint="j"/></sensor>
<custom><numeric name="n" data="1 2 3"/>
  <tuple name="first"><element objtype="body" objname="b" prm=".5"/>
    <element objtype="geom" objname="g"/><element objtype="site" objname="s" prm="2"/>
  </tuple>
  <tuple name="second"><element objtype="actuator" objname="m"/>
    <element objtype="sensor" objname="p" prm="-1"/>
    <element objtype="tuple" objname="first"/>
    <element objtype="numeric" objname="n"/><element objtype="xbody" objname="b"/></tuple>
</custom></mujoco>"""
FIELDS = ("tuple_adr", "tuple_size", "tuple_objtype", "tuple_objid", "tuple_objprm",
          "numeric_adr", "numeric_size", "numeric_data")


def test_tuples():
    mjm = mujoco.MjModel.from_xml_string(XML)
    m = simjax.load_model(XML)
    assert m.ntuple == mjm.ntuple == 2 and m.ntupledata == mjm.ntupledata == 8
    for f in FIELDS:
        np.testing.assert_array_equal(np.asarray(getattr(m, f)), getattr(mjm, f), f)
    assert m.names["tuple"] == ["first", "second"]


def test_tuple_errors():
    for bad, msg in ((XML.replace('objname="g"/>', 'objname="nope"/>'), "nope"),
                     (XML.replace("</custom>", '<tuple name="e"/></custom>'), "is empty")):
        with pytest.raises(ValueError):
            mujoco.MjModel.from_xml_string(bad)
        with pytest.raises(MJCFError, match=msg):
            simjax.load_model(bad)
    light = XML.replace('<site name="s"/>', '<site name="s"/><light name="l"/>').replace(
        '<element objtype="geom" objname="g"/>', '<element objtype="light" objname="l"/>')
    mujoco.MjModel.from_xml_string(light)
    with pytest.raises(UnsupportedFeatureError, match="light"):
        simjax.load_model(light)
