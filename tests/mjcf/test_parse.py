"""Tests for simjax.mjcf.parse: defaults, childclass, partial arrays, includes, actuator
shortcuts (checked against MuJoCo 4.0's own parser and compiler) and the model corpus."""
import glob
import os

import mujoco
import numpy as np
import pytest

from simjax.errors import UnsupportedFeatureError
from simjax.mjcf.parse import Element, parse

from mujoco_oracle import CORPUS  # ../shared/corpus, or SIMJAX_CORPUS


def P(xml, assets=None) -> Element:
    return parse(xml, assets)[0]


def find_all(el: Element, tag: str) -> list[Element]:
    out = [el] if el.tag == tag else []
    for c in el.children:
        out.extend(find_all(c, tag))
    return out


def one(el: Element, tag: str) -> Element:
    (found,) = find_all(el, tag)
    return found


# ---------------------------------------------------------------------------- defaults


def test_builtin_defaults_and_given():
    g = one(P('<mujoco><worldbody><geom size="1"/></worldbody></mujoco>'), "geom")
    assert g.attrs["type"] == "sphere"
    np.testing.assert_array_equal(g.attrs["size"], [1, 0, 0])
    np.testing.assert_array_equal(g.attrs["friction"], [1, 0.005, 0.0001])
    np.testing.assert_array_equal(g.attrs["solimp"], [0.9, 0.95, 0.001, 0.5, 2])
    assert g.attrs["mass"] is None and g.attrs["fromto"] is None and g.attrs["quat"] is None
    assert g.attrs["density"] == 1000.0 and isinstance(g.attrs["density"], float)
    assert g.attrs["contype"] == 1 and isinstance(g.attrs["contype"], int)
    assert g.attrs["name"] is None
    assert g.given == frozenset({"size"})
    assert g.file == "<string>" and g.line == 1
    assert g.path == "mujoco/worldbody[0]/geom[0]"


def test_default_inheritance_nested_classes():
    xml = """<mujoco>
      <default>
        <geom friction="0.5" rgba="1 0 0 1"/>
        <default class="a">
          <geom solref="0.05"/>
          <joint damping="2"/>
          <default class="b"><geom friction="0.7 0.01"/></default>
        </default>
      </default>
      <worldbody>
        <geom name="m" size="1"/>
        <geom name="ga" class="a" size="1"/>
        <geom name="gb" class="b" size="1" friction="0.9"/>
      </worldbody></mujoco>"""
    root = P(xml)
    geoms = {g.attrs["name"]: g for g in find_all(root, "geom")}
    np.testing.assert_allclose(geoms["m"].attrs["friction"], [0.5, 0.005, 0.0001])
    np.testing.assert_allclose(geoms["ga"].attrs["solref"], [0.05, 1])
    np.testing.assert_allclose(geoms["ga"].attrs["friction"], [0.5, 0.005, 0.0001])
    # partial arrays keep the class values for the missing trailing entries
    np.testing.assert_allclose(geoms["gb"].attrs["friction"], [0.9, 0.01, 0.0001])
    np.testing.assert_allclose(geoms["gb"].attrs["solref"], [0.05, 1])
    assert {"friction", "rgba", "solref", "size", "name", "class"} <= geoms["gb"].given
    assert "density" not in geoms["gb"].given
    # the <default> sections are consumed
    assert not find_all(root, "default")
    spec = mujoco.MjSpec.from_string(xml)
    for sg in spec.geoms:
        np.testing.assert_allclose(geoms[sg.name].attrs["friction"], sg.friction)
        np.testing.assert_allclose(geoms[sg.name].attrs["solref"], sg.solref)


def test_nested_class_inherits_parent_elements_regardless_of_order():
    xml = """<mujoco><default>
        <default class="a"><joint stiffness="3"/></default>
        <joint armature="0.1"/></default>
      <worldbody><body><joint class="a"/><geom size="1"/></body></worldbody></mujoco>"""
    j = one(P(xml), "joint")
    assert j.attrs["armature"] == 0.1
    np.testing.assert_allclose(j.attrs["stiffness"], [3, 0, 0])


def test_childclass_body_frame_and_own_class():
    xml = """<mujoco><default>
        <default class="a"><geom size="0.1"/><joint type="slide"/></default>
        <default class="b"><geom size="0.2"/></default></default>
      <worldbody>
        <body childclass="a">
          <joint/>
          <geom name="g1"/>
          <geom name="g2" class="b"/>
          <body><geom name="g3"/></body>
          <frame childclass="b"><geom name="g4"/></frame>
          <frame><geom name="g5"/></frame>
        </body>
        <geom name="g6" size="0.3"/>
      </worldbody></mujoco>"""
    root = P(xml)
    size = {g.attrs["name"]: g.attrs["size"][0] for g in find_all(root, "geom")}
    assert size == {"g1": 0.1, "g2": 0.2, "g3": 0.1, "g4": 0.2, "g5": 0.1, "g6": 0.3}
    assert one(root, "joint").attrs["type"] == "slide"
    assert find_all(root, "frame")  # frames stay in the tree


def test_freejoint_and_out_of_tree_elements_ignore_childclass():
    xml = """<mujoco><default><default class="a">
        <joint damping="5"/><tendon stiffness="7"/><general gear="3"/></default></default>
      <worldbody><body childclass="a"><freejoint/><geom size="1"/></body>
      <body><joint name="j"/><geom size="1"/></body></worldbody>
      <tendon><fixed name="t"><joint joint="j" coef="1"/></fixed>
              <fixed name="t2" class="a"><joint joint="j" coef="1"/></fixed></tendon>
      <actuator><motor joint="j"/><motor joint="j" class="a"/></actuator></mujoco>"""
    root = P(xml)
    fj = one(root, "freejoint")
    assert set(fj.attrs) == {"name", "group", "align"} and fj.attrs["align"] == "auto"
    t1, t2 = find_all(root, "fixed")
    np.testing.assert_allclose(t1.attrs["stiffness"], 0)
    np.testing.assert_allclose(t2.attrs["stiffness"], [7, 0, 0])
    m1, m2 = find_all(root, "motor")
    assert m1.attrs["gear"][0] == 1 and m2.attrs["gear"][0] == 3


def test_joint_geom_values_match_mujoco_spec():
    xml = """<mujoco><default><joint stiffness="1 2" damping="0.5" range="-1 1"/>
        <geom condim="4" solimp="0.8 0.9"/></default>
      <worldbody><body><joint name="j" springref="0.3" solreflimit="0.03"
          actuatorfrcrange="-2 2" limited="true" frictionloss="0.1" margin="0.01"/>
        <geom name="g" type="box" size="0.1 0.2" fluidcoef="1 2" margin="0.1" gap="0.05"/>
      </body></worldbody></mujoco>"""
    root = P(xml)
    spec = mujoco.MjSpec.from_string(xml)
    j, sj = one(root, "joint"), spec.joints[0]
    for ours, theirs in [("stiffness", "stiffness"), ("damping", "damping"), ("range", "range"),
                         ("springref", "springref"), ("solreflimit", "solref_limit"),
                         ("actuatorfrcrange", "actfrcrange"), ("frictionloss", "frictionloss"),
                         ("margin", "margin"), ("axis", "axis")]:
        np.testing.assert_allclose(np.ravel(j.attrs[ours])[:np.size(getattr(sj, theirs))],
                                   getattr(sj, theirs), err_msg=ours)
    assert j.attrs["limited"] == "true"
    g, sg = one(root, "geom"), spec.geoms[0]
    for key in ("size", "solimp", "margin", "gap", "condim", "friction"):
        np.testing.assert_allclose(g.attrs[key], getattr(sg, key), err_msg=key)
    np.testing.assert_allclose(g.attrs["fluidcoef"], sg.fluid_coefs)


def test_value_types():
    xml = """<mujoco><option integrator="RK4"><flag gravity="disable"/></option>
      <compiler autolimits="false" inertiagrouprange="1 3"/>
      <worldbody><body name="b" user="1 2 3"><joint name="j" limited="false"/>
        <geom size="1"/></body></worldbody>
      <tendon><spatial springlength="0.4"><site site="s"/></spatial></tendon>
      <keyframe><key qpos="0.5"/></keyframe></mujoco>"""
    root = P(xml)
    assert one(root, "option").attrs["integrator"] == "rk4"
    assert one(root, "flag").attrs["gravity"] == "disable"
    comp = one(root, "compiler")
    assert comp.attrs["autolimits"] is False and comp.attrs["angle"] == "degree"
    assert comp.attrs["inertiagrouprange"].tolist() == [1, 3]
    np.testing.assert_array_equal(one(root, "body").attrs["user"], [1, 2, 3])
    assert one(root, "joint").attrs["limited"] == "false"
    # a single springlength is copied into both slots, as MuJoCo does
    np.testing.assert_array_equal(one(root, "spatial").attrs["springlength"], [0.4, 0.4])
    np.testing.assert_array_equal(one(root, "key").attrs["qpos"], [0.5])
    assert one(root, "key").attrs["qvel"] is None


def test_element_orientation_replaces_class_orientation():
    xml = """<mujoco><default><geom euler="90 0 0"/></default>
      <worldbody><geom name="a" size="1" quat="0 1 0 0"/><geom name="b" size="1"/></worldbody>
      </mujoco>"""
    a, b = find_all(P(xml), "geom")
    assert a.attrs["euler"] is None and "euler" not in a.given
    np.testing.assert_array_equal(a.attrs["quat"], [0, 1, 0, 0])
    np.testing.assert_array_equal(b.attrs["euler"], [90, 0, 0]) and b.attrs["quat"] is None
    m = mujoco.MjModel.from_xml_string(xml)
    np.testing.assert_allclose(m.geom_quat[0], [0, 1, 0, 0])


def test_global_sections_repeat_in_order():
    root = P('<mujoco><option timestep="0.01"/><compiler angle="radian"/>'
             '<option timestep="0.02"/></mujoco>')
    assert [c.tag for c in root.children] == ["option", "compiler", "option"]
    assert [o.attrs["timestep"] for o in find_all(root, "option")] == [0.01, 0.02]


# ---------------------------------------------------------------------------- include

MAIN = """<mujoco>
  <include file="parts/defaults.xml"/>
  <worldbody>
    <include file="parts/body.xml"/>
  </worldbody>
</mujoco>"""
DEFAULTS = "<mujoco><default><geom size='0.25'/></default></mujoco>"
BODY = """<mujoco>
  <body name="b"><geom name="g"/>
    <include file="parts/inner.xml"/></body>
</mujoco>"""
INNER = "<mujoco><site name='s'/></mujoco>"


def check_included(root, body_file):
    body = one(root, "body")
    assert body.file.endswith("body.xml") and body.line == 2
    assert one(root, "geom").attrs["size"][0] == 0.25
    site = one(root, "site")
    assert site.file.endswith("inner.xml") and site.path == "mujoco/worldbody[0]/body[b]/site[s]"


def test_include_via_assets():
    assets = {"parts/defaults.xml": DEFAULTS.encode(), "parts/body.xml": BODY.encode(),
              "parts/inner.xml": INNER}
    check_included(P(MAIN, assets), "parts/body.xml")


def test_include_via_files(tmp_path):
    (tmp_path / "parts").mkdir()
    (tmp_path / "model.xml").write_text(MAIN)
    (tmp_path / "parts" / "defaults.xml").write_text(DEFAULTS)
    (tmp_path / "parts" / "body.xml").write_text(BODY)
    (tmp_path / "parts" / "inner.xml").write_text(INNER)
    root, model_dir = parse(str(tmp_path / "model.xml"))
    assert model_dir == str(tmp_path)
    check_included(root, str(tmp_path / "parts" / "body.xml"))
    assert root.file == str(tmp_path / "model.xml")


def test_main_file_from_assets():
    root, model_dir = parse("model.xml", {"model.xml": b"<mujoco model='x'/>"})
    assert root.attrs["model"] == "x" and model_dir == ""


# ---------------------------------------------------------------------------- actuators

ROBOT = """<mujoco>
  <default>{defaults}</default>
  <worldbody><body><joint name="j" range="-1 1"/><geom size="0.1"/>
    <body name="b2" pos="0 0 1"><joint name="j2" type="slide"/><geom size="0.1"/></body>
  </body></worldbody>
  <actuator>{actuator}</actuator>
</mujoco>"""

ACTUATORS = [
    ("", '<motor joint="j" gear="2" ctrlrange="-1 1"/>'),
    ("", '<position joint="j" kp="10"/>'),
    ("", '<position joint="j" kp="10" kv="2"/>'),
    ("", '<position joint="j" kp="10" dampratio="0.7"/>'),
    ("", '<position joint="j" kp="10" timeconst="0.05"/>'),
    ("", '<position joint="j" kp="10" timeconst="0"/>'),
    ("", '<position joint="j" inheritrange="0.9"/>'),
    ('<position kp="30" kv="3"/>', '<position joint="j"/>'),
    ('<position kp="30" kv="3"/>', '<position joint="j" kp="5"/>'),
    ('<position kp="30" kv="3"/>', '<velocity joint="j"/>'),
    ("", '<velocity joint="j" kv="4"/>'),
    ('<velocity kv="6"/>', '<velocity joint="j" ctrlrange="-2 2"/>'),
    ("", '<intvelocity joint="j" kp="8" actrange="-1 1"/>'),
    ("", '<intvelocity joint="j" kp="8" kv="1"/>'),
    ("", '<damper joint="j" kv="3" ctrlrange="0 1"/>'),
    ('<damper kv="2"/>', '<damper joint="j" ctrlrange="0 1"/>'),
    ("", '<cylinder joint="j2" timeconst="0.3" area="2" bias="1 2 3"/>'),
    ("", '<cylinder joint="j2" diameter="0.5"/>'),
    ("", '<muscle joint="j2" lengthrange="0.1 0.5" force="100" range="0.5 1.5" lmin="0.3" tausmooth="0.2"/>'),
    ("", '<muscle joint="j2" lengthrange="0.1 0.5" timeconst="0.02 0.05" scale="300"/>'),
    ('<muscle fvmax="1.4"/>', '<muscle joint="j2" lengthrange="0.1 0.5" vmax="2"/>'),
    ("", '<adhesion body="b2" gain="5" ctrlrange="0 1"/>'),
    ("", '<general joint="j" dyntype="integrator" gaintype="affine" biastype="affine" '
         'gainprm="2 3" biasprm="0 -1" dynprm="0.5" actlimited="true" actrange="-1 1"/>'),
    ('<general gainprm="4 5 6"/>', '<general joint="j" gainprm="7"/>'),
    ('<general dyntype="filter" dynprm="0.2"/><position kp="3"/>', '<motor joint="j"/>'),
    ('<general dyntype="filter" dynprm="0.2"/><position kp="3"/>', '<general joint="j"/>'),
    ("", '<motor joint="j" damping="0.1 0.2" armature="0.3" forcerange="-1 1"/>'),
    # MuJoCo 4.0: a shortcut only inherits parameters from a class whose last actuator
    # default was the same shortcut (or general), searching up the class chain
    ('<position kp="4"/><velocity kv="5"/>', '<position joint="j"/>'),
    ('<general gainprm="4 5 6 7" biasprm="7 8 9 10" dynprm="0.3 0.4 0.5"/>',
     '<position joint="j"/>'),
    ('<general gainprm="4 5 6 7" biasprm="7 8 9 10" dynprm="0.3 0.4 0.5"/>',
     '<cylinder joint="j"/>'),
    ('<general gainprm="4 5 6 7" biasprm="7 8 9 10" dynprm="0.3 0.4 0.5"/>',
     '<muscle joint="j" lengthrange="0.1 0.5"/>'),
    ('<general gaintype="affine" gainprm="1 2 -3" dyntype="filterexact" dynprm="0.2"/>',
     '<position joint="j"/>'),
    ('<general gaintype="affine" gainprm="1 2 -3"/>', '<damper joint="j"/>'),
    ('<general gainprm="4" dynprm="3" dyntype="filterexact"/>', '<intvelocity joint="j"/>'),
    ('<position kp="4" timeconst="0.5" gear="2"/><default class="x"><velocity kv="3" gear="5"/>'
     '</default>', '<position joint="j" class="x"/>'),
    ('<position kp="4"/><default class="x"><velocity kv="3"/><default class="y">'
     '<general gear="6"/></default></default>', '<position joint="j" class="y"/>'),
    ('<velocity kv="5"/><default class="x"><position kp="4"/><default class="y"><motor/>'
     '</default></default>', '<velocity joint="j" class="y"/>'),
    ('<position kp="4"/><default class="x"><velocity kv="2"/><position kv="1"/></default>',
     '<position joint="j" class="x"/>'),
    ('<position kp="4" timeconst="0"/>', '<position joint="j"/>'),
    ('<cylinder bias="1 2 3" area="3"/><default class="x"><motor/></default>',
     '<cylinder joint="j" class="x" timeconst="2"/>'),
    ('<muscle force="4" scale="3"/><default class="x"><motor/></default>',
     '<muscle joint="j" class="x" lengthrange="0.1 0.5"/>'),
    ('<adhesion gain="4" ctrlrange="0 2"/>', '<adhesion body="b2"/>'),
    ('<damper kv="4"/>', '<position joint="j"/>'),
]

_LIMITED = {"false": mujoco.mjtLimited.mjLIMITED_FALSE, "true": mujoco.mjtLimited.mjLIMITED_TRUE,
            "auto": mujoco.mjtLimited.mjLIMITED_AUTO}


def _enum(prefix, enum, value):
    return int(getattr(enum, f"mj{prefix}_{value.upper()}"))


@pytest.mark.parametrize("defaults,actuator", ACTUATORS)
def test_actuator_shortcuts_match_mujoco_spec(defaults, actuator):
    xml = ROBOT.format(defaults=defaults, actuator=actuator)
    act = find_all(P(xml), "actuator")[0].children[0]
    ref = mujoco.MjSpec.from_string(xml).actuators[0]
    for key in ("gainprm", "biasprm", "dynprm", "gear", "ctrlrange", "forcerange", "actrange",
                "damping"):
        np.testing.assert_allclose(act.attrs[key], getattr(ref, key), err_msg=key, atol=1e-15)
    assert act.attrs["inheritrange"] == ref.inheritrange
    assert act.attrs["armature"] == ref.armature
    assert _enum("DYN", mujoco.mjtDyn, act.attrs["dyntype"]) == int(ref.dyntype)
    assert _enum("GAIN", mujoco.mjtGain, act.attrs["gaintype"]) == int(ref.gaintype)
    assert _enum("BIAS", mujoco.mjtBias, act.attrs["biastype"]) == int(ref.biastype)
    for key in ("ctrllimited", "forcelimited", "actlimited"):
        assert int(_LIMITED[act.attrs[key]]) == int(getattr(ref, key)), key


@pytest.mark.parametrize("defaults,actuator", ACTUATORS)
def test_actuator_shortcuts_match_mujoco_compiled(defaults, actuator):
    """Compiled MuJoCo prm arrays equal the parsed ones. A positive position-type
    biasprm[2] is a damping ratio that the compiler resolves, so it is not compared."""
    xml = ROBOT.format(defaults=defaults, actuator=actuator)
    act = find_all(P(xml), "actuator")[0].children[0]
    try:
        m = mujoco.MjModel.from_xml_string(xml)
    except ValueError as err:
        pytest.skip(f"MuJoCo does not compile this model: {err}")
    bias = act.attrs["biasprm"].copy()
    if act.attrs["biastype"] == "affine" and bias[2] > 0:
        bias[2] = m.actuator_biasprm[0, 2]
    np.testing.assert_allclose(act.attrs["gainprm"], m.actuator_gainprm[0])
    np.testing.assert_allclose(bias, m.actuator_biasprm[0])
    np.testing.assert_allclose(act.attrs["dynprm"], m.actuator_dynprm[0])
    np.testing.assert_allclose(act.attrs["gear"], m.actuator_gear[0])
    assert _enum("DYN", mujoco.mjtDyn, act.attrs["dyntype"]) == m.actuator_dyntype[0]
    assert _enum("GAIN", mujoco.mjtGain, act.attrs["gaintype"]) == m.actuator_gaintype[0]
    assert _enum("BIAS", mujoco.mjtBias, act.attrs["biastype"]) == m.actuator_biastype[0]


def test_actuator_output_has_general_attrs():
    root = P(ROBOT.format(defaults="", actuator='<position name="p" joint="j" kp="2"/>'))
    act = one(root, "position")
    for key in ("dyntype", "gaintype", "biastype", "dynprm", "gainprm", "biasprm",
                "ctrllimited", "forcelimited", "actlimited", "ctrlrange", "forcerange",
                "actrange", "lengthrange", "gear", "cranklength", "actdim", "actearly",
                "group", "damping", "armature", "user", "nsample", "interp", "delay", "joint",
                "jointinparent", "tendon", "site", "refsite", "cranksite", "slidersite",
                "body", "inheritrange", "kp", "kv", "dampratio", "timeconst"):
        assert key in act.attrs, key
    assert act.attrs["joint"] == "j" and act.attrs["kp"] == 2.0 and act.attrs["kv"] is None
    assert len(act.attrs["gainprm"]) == 10 and len(act.attrs["gear"]) == 6
    assert {"gainprm", "biasprm", "biastype", "joint", "kp"} <= act.given


def test_unsupported_features():
    with pytest.raises(UnsupportedFeatureError, match="flexcomp"):
        P('<mujoco><worldbody><flexcomp name="f"/></worldbody></mujoco>')
    with pytest.raises(UnsupportedFeatureError, match="flex"):
        P('<mujoco><deformable><flex name="f" body="a" element="0"/></deformable></mujoco>')


def test_kept_elements():
    xml = """<mujoco><extension><plugin plugin="mujoco.pid"><instance name="i">
        <config key="kp" value="1"/></instance></plugin></extension>
      <asset><material name="m" rgba="1 0 0 1"/><texture name="t" builtin="flat"
        width="8" height="8"/></asset>
      <worldbody><light pos="0 0 1"/><replicate count="2" offset="1 0 0">
        <geom size="1"/></replicate></worldbody>
      <contact><exclude body1="world" body2="world"/></contact>
      <sensor><framepos objtype="body" objname="world"/><clock/></sensor>
      <custom><numeric name="n" data="1 2"/><text name="t" data="x"/></custom></mujoco>"""
    root = P(xml)
    assert one(root, "config").attrs == {"key": "kp", "value": "1"}
    assert one(root, "replicate").attrs["count"] == 2
    assert one(root, "framepos").attrs["reftype"] is None
    np.testing.assert_array_equal(one(root, "numeric").attrs["data"], [1, 2])


# ---------------------------------------------------------------------------- corpus


def corpus_models():
    if not os.path.isdir(CORPUS):
        return []
    return sorted(glob.glob(os.path.join(CORPUS, "*", "*.xml")))


@pytest.mark.skipif(not os.path.isdir(CORPUS), reason=f"model corpus not found at {CORPUS}")
@pytest.mark.parametrize("path", corpus_models(), ids=lambda p: os.path.relpath(p, CORPUS))
def test_corpus_parses(path):
    root, model_dir = parse(path)
    assert root.tag == "mujoco"
    assert model_dir == os.path.dirname(path)


# ---------------------------------------------------------------------------- schema

def _documented_schema():
    """{element path: [attributes]} from the XMLschema.rst shipped with the mujoco wheel."""
    import re
    path = os.path.join(os.path.dirname(mujoco.__file__), "doc", "XMLschema.rst")
    if not os.path.exists(path):
        return None
    stack, out = [], {}
    for line in open(path, encoding="utf-8"):
        m = re.match(r"^( *)\.\. dropdown:: :ref:`([^<`]*)<", line)
        if m:
            indent = len(m.group(1))
            while stack and stack[-1][0] >= indent:
                stack.pop()
            stack.append((indent, m.group(2).replace("(world)", "")))
            out.setdefault("/".join(s[1] for s in stack), [])
            continue
        m = re.match(r"^( *):ref:`([^<`]*)<", line)
        if m and stack:
            while stack and stack[-1][0] >= len(m.group(1)) - 8:
                stack.pop()
            out["/".join(s[1] for s in stack)].append(m.group(2))
    return out


def test_schema_attributes_match_mujoco_documentation():
    """Every element path documented for MuJoCo 4.0 exists in our schema with exactly the
    documented attribute names (default children: the reduced default rows)."""
    from simjax.mjcf import schema
    doc = _documented_schema()
    if doc is None:
        pytest.skip("mujoco wheel ships no doc/XMLschema.rst")
    assert len(doc) > 150
    for path, names in doc.items():
        parts = path.split("/")
        internal = "mujoco"
        for tag in parts[1:]:
            if internal == "mujoco" and tag == "body":
                internal = "body"
                continue
            assert tag in schema.ELEMENTS[internal].children, path
            internal = schema.ELEMENTS[internal].children[tag][0]
        if len(parts) == 3 and parts[1] == "default":
            ours = set(schema.default_slot_attrs(internal))
        else:
            ours = set(schema.ELEMENTS[internal].attrs)
        assert ours == set(names), (path, ours ^ set(names))


def test_camera_focal_defaults_to_znear():
    """Without focal length or sensor size, cam_intrinsic's focal length is the near
    clipping plane visual/map znear, as MuJoCo compiles it (float32 there)."""
    import simjax
    for vis in ("", '<visual><map znear="0.02"/></visual>'):
        xml = f'<mujoco>{vis}<worldbody><camera pos="0 -3 0"/></worldbody></mujoco>'
        got = np.asarray(simjax.load_model(xml).cam_intrinsic)
        np.testing.assert_allclose(got, mujoco.MjModel.from_xml_string(xml).cam_intrinsic,
                                   rtol=1e-6, atol=1e-7)
