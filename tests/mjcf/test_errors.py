"""Malformed MJCF inputs: each must raise MJCFError whose message locates the problem
(file, line and/or element path) and names the offending element or attribute."""
import pytest

from simjax.errors import MJCFError, UnsupportedFeatureError
from simjax.mjcf.parse import parse

BODY = """<mujoco>
  <worldbody>
    <body name="b">
      {}
    </body>
  </worldbody>
</mujoco>"""

ACT = """<mujoco>
  <worldbody><body name="b"><joint name="j" range="-1 1"/><geom size="1"/>
    <site name="s"/></body></worldbody>
  <actuator>
    {}
  </actuator>
</mujoco>"""

# (id, xml, substrings the message must contain, expected line or None)
CASES = [
    ("unknown-element", BODY.format("<bar/>"), ["unknown element 'bar'", "'body'"], 4),
    ("unknown-attribute", BODY.format('<geom size="1" foo="2"/>'),
     ["unknown attribute 'foo'", "geom"], 4),
    ("too-many-values", BODY.format('<geom size="1 2 3 4"/>'), ["'size'", "too much data"], 4),
    ("not-enough-values", BODY.format('<geom size="1" pos="1 2"/>'),
     ["'pos'", "not have enough data"], 4),
    ("rgba-three-values", BODY.format('<geom size="1" rgba="1 1 1"/>'),
     ["'rgba'", "not have enough"], 4),
    ("non-numeric", BODY.format('<geom size="1 x 3"/>'), ["'size'", "bad format"], 4),
    ("commas", BODY.format('<geom size="1" pos="1,2,3"/>'), ["'pos'", "bad format"], 4),
    ("int-with-fraction", BODY.format('<geom size="1" contype="1.5"/>'),
     ["'contype'", "integer"], 4),
    ("overflow", BODY.format('<geom size="1e400"/>'), ["'size'", "too large"], 4),
    ("bad-keyword", BODY.format('<geom type="Sphere" size="1"/>'),
     ["invalid keyword 'Sphere'", "'type'"], 4),
    ("bad-bool", BODY.format('<geom size="1" shellinertia="1"/>'),
     ["invalid keyword '1'", "'shellinertia'"], 4),
    ("bad-limited", BODY.format('<joint limited="yes"/>'), ["'yes'", "'limited'"], 4),
    ("bad-flag-token", """<mujoco><worldbody><site name="s"/></worldbody>
  <sensor><rangefinder site="s" data="dist foo"/></sensor></mujoco>""",
     ["'foo'", "'data'"], 2),
    ("undefined-class", BODY.format('<geom class="nope" size="1"/>'),
     ["unknown default class", "'nope'"], 4),
    ("undefined-childclass", """<mujoco><worldbody>
  <body childclass="ghost"/></worldbody></mujoco>""", ["'ghost'", "childclass"], 2),
    ("undefined-actuator-class", ACT.format('<motor joint="j" class="x"/>'), ["'x'"], 5),
    ("duplicate-class", """<mujoco><default>
  <default class="a"/>
  <default class="a"/></default></mujoco>""", ["repeated default class name 'a'"], 3),
    ("nested-class-without-name", "<mujoco><default>\n<default/></default></mujoco>",
     ["class"], 2),
    ("renamed-main", '<mujoco><default class="top"/></mujoco>', ["'main'", "renamed"], 1),
    ("repeated-default-element", """<mujoco><default>
  <geom size="1"/>
  <geom size="2"/></default></mujoco>""", ["'geom'", "at most once"], 3),
    ("name-in-default", '<mujoco><default>\n<geom name="g"/></default></mujoco>',
     ["unknown attribute 'name'", "default"], 2),
    ("nodefault-attr-in-default", '<mujoco><default>\n<position joint="j"/></default></mujoco>',
     ["unknown attribute 'joint'"], 2),
    ("unknown-default-child", '<mujoco><default>\n<body/></default></mujoco>',
     ["unknown element 'body'", "'default'"], 2),
    ("repeated-unique-child", """<mujoco><option>
  <flag gravity="disable"/>
  <flag contact="disable"/></option></mujoco>""", ["'flag'", "at most once"], 3),
    ("missing-required", BODY.format('<inertial pos="0 0 0"/>'),
     ["required attribute 'mass'"], 4),
    ("missing-required-sensor", "<mujoco><sensor>\n<jointpos/></sensor></mujoco>",
     ["required attribute 'joint'"], 2),
    ("worldbody-attribute", '<mujoco>\n<worldbody pos="0 0 1"/></mujoco>',
     ["unknown attribute 'pos'", "worldbody"], 2),
    ("freejoint-class", BODY.format('<freejoint class="main"/>'),
     ["unknown attribute 'class'", "freejoint"], 4),
    ("root-not-mujoco", "<robot/>", ["root element must be 'mujoco'"], 1),
    ("malformed-xml", "<mujoco>\n  <worldbody>\n    <body>\n  </worldbody>\n</mujoco>",
     ["malformed XML"], 4),
    ("not-xml", "<mujoco", ["malformed XML"], 1),
    ("undefined-entity", "<mujoco model='&x;'/>", ["malformed XML"], 1),
    ("kv-and-dampratio", ACT.format('<position joint="j" kv="1" dampratio="1"/>'),
     ["kv and dampratio cannot both be defined"], 5),
    ("negative-kv", ACT.format('<position joint="j" kv="-1"/>'), ["kv cannot be negative"], 5),
    ("negative-timeconst", ACT.format('<position joint="j" timeconst="-1"/>'),
     ["timeconst cannot be negative"], 5),
    ("inheritrange-with-ctrlrange",
     ACT.format('<position joint="j" inheritrange="1" ctrlrange="-1 1"/>'),
     ["ctrlrange and inheritrange"], 5),
    ("damper-negative-range", ACT.format('<damper joint="j" kv="1" ctrlrange="-1 1"/>'),
     ["damper control range cannot be negative"], 5),
    ("adhesion-negative-gain", ACT.format('<adhesion body="b" gain="-1"/>'),
     ["adhesion gain cannot be negative"], 5),
    ("muscle-negative-tausmooth", ACT.format('<muscle joint="j" tausmooth="-1"/>'),
     ["tausmooth cannot be negative"], 5),
    ("cranklength-with-joint", ACT.format('<motor joint="j" cranklength="1"/>'),
     ["slidercrank"], 5),
    ("refsite-with-joint", ACT.format('<motor joint="j" refsite="s"/>'),
     ["refsite can only be used with site transmission"], 5),
    ("shortcut-bad-attr", ACT.format('<motor joint="j" kp="1"/>'),
     ["unknown attribute 'kp'", "motor"], 5),
    ("two-orientations", BODY.format('<geom size="1" quat="1 0 0 0" euler="0 0 1"/>'),
     ["multiple orientation specifiers", "quat", "euler"], 4),
    ("two-orientations-in-default", '<mujoco><default>\n<site zaxis="0 0 1" euler="0 0 1"/>'
     "</default></mujoco>", ["multiple orientation specifiers"], 2),
    ("fullinertia-with-quat",
     BODY.format('<inertial pos="0 0 0" mass="1" fullinertia="1 1 1 0 0 0" quat="1 0 0 0"/>'),
     ["at most one of", "fullinertia"], 4),
    ("fovy-and-sensorsize", BODY.format('<camera fovy="40" sensorsize="1 1"/>'),
     ["at most one of", "fovy", "sensorsize"], 4),
    ("connect-site-and-body", """<mujoco><equality>
  <connect site1="a" site2="b" body1="c" anchor="0 0 0"/></equality></mujoco>""",
     ["at most one of", "site1+site2"], 2),
    ("connect-missing-target", '<mujoco><equality>\n<connect site1="a"/></equality></mujoco>',
     ["site1", "site2"], 2),
    ("reftype-without-refname", """<mujoco><sensor>
  <framepos objtype="body" objname="world" reftype="body"/></sensor></mujoco>""",
     ["reftype", "refname", "together"], 2),
    ("distance-needs-target", '<mujoco><sensor>\n<distance geom1="a"/></sensor></mujoco>',
     ["one of geom2 / body2 is required"], 2),
    ("default-shortcut-error", '<mujoco><default>\n<position kv="1" dampratio="1"/>'
     "</default></mujoco>", ["kv and dampratio"], 2),
]


@pytest.mark.parametrize("xml,needles,line", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_malformed(xml, needles, line):
    with pytest.raises(MJCFError) as info:
        parse(xml)
    err = info.value
    text = str(err)
    for needle in needles:
        assert needle in text, (needle, text)
    assert err.file == "<string>"
    if line is not None:
        assert err.line == line, text
        assert f"line {line}" in text


BOMB = """<?xml version="1.0"?>
<!DOCTYPE lolz [
 <!ENTITY lol "lol">
 <!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
 <!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">
 <!ENTITY lol4 "&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;">
 <!ENTITY lol5 "&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;">
 <!ENTITY lol6 "&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;">
 <!ENTITY lol7 "&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;">
 <!ENTITY lol8 "&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;">
 <!ENTITY lol9 "&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;">
]>
<mujoco model="&lol9;"/>"""

XXE = """<?xml version="1.0"?>
<!DOCTYPE mujoco [<!ENTITY x SYSTEM "file:///etc/passwd">]>
<mujoco model="&x;"/>"""


def test_entity_bomb_rejected():
    with pytest.raises(MJCFError, match="DOCTYPE.*not allowed") as info:
        parse(BOMB)
    assert info.value.line == 2


def test_external_entity_rejected():
    with pytest.raises(MJCFError, match="not allowed") as info:
        parse(XXE)
    assert "root:" not in str(info.value)


def test_entity_in_included_file_rejected():
    with pytest.raises(MJCFError, match="not allowed") as info:
        parse('<mujoco><include file="inc.xml"/></mujoco>', {"inc.xml": XXE.encode()})
    assert info.value.file == "inc.xml"


def test_include_missing_file():
    with pytest.raises(MJCFError, match="could not read included file 'nothere.xml'") as info:
        parse("<mujoco>\n<include file='nothere.xml'/></mujoco>")
    assert info.value.line == 2


def test_include_twice():
    assets = {"a.xml": b"<mujoco><size nkey='1'/></mujoco>"}
    with pytest.raises(MJCFError, match="'a.xml' is included more than once") as info:
        parse("<mujoco>\n<include file='a.xml'/>\n<include file='a.xml'/></mujoco>", assets)
    assert info.value.line == 3


def test_include_recursive_self():
    assets = {"a.xml": b"<mujoco><include file='a.xml'/></mujoco>"}
    with pytest.raises(MJCFError, match="more than once"):
        parse("<mujoco><include file='a.xml'/></mujoco>", assets)


def test_include_without_file_or_with_extra_attribute():
    with pytest.raises(MJCFError, match="'file'"):
        parse("<mujoco><include/></mujoco>")
    with pytest.raises(MJCFError, match="unknown attribute 'name'"):
        parse("<mujoco><include file='a.xml' name='x'/></mujoco>", {"a.xml": b"<mujoco/>"})


def test_error_in_included_file_names_that_file(tmp_path):
    (tmp_path / "main.xml").write_text('<mujoco>\n<worldbody>\n<include file="sub/b.xml"/>'
                                       "</worldbody></mujoco>")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.xml").write_text('<mujoco>\n\n<geom size="1" bogus="1"/></mujoco>')
    with pytest.raises(MJCFError, match="unknown attribute 'bogus'") as info:
        parse(str(tmp_path / "main.xml"))
    assert info.value.file.endswith("b.xml") and info.value.line == 3
    assert info.value.element == "mujoco/worldbody[0]/geom[0]"


def test_malformed_included_file():
    with pytest.raises(MJCFError, match="malformed XML") as info:
        parse("<mujoco><include file='bad.xml'/></mujoco>", {"bad.xml": b"<mujoco>\n<a></b>"})
    assert info.value.file == "bad.xml" and info.value.line == 2


def test_missing_main_file(tmp_path):
    with pytest.raises(MJCFError, match="could not read"):
        parse(str(tmp_path / "missing.xml"))


@pytest.mark.parametrize("xml,feature", [
    (BODY.format('<composite type="cable"/>'), "composite"),
    (BODY.format('<flexcomp name="f"/>'), "flexcomp"),
    ("<mujoco><deformable><flex name='f' body='b' element='0'/></deformable></mujoco>", "flex"),
    ("<mujoco><equality><flex flex='f'/></equality></mujoco>", "flex"),
])
def test_unsupported_feature_is_named(xml, feature):
    with pytest.raises(UnsupportedFeatureError) as info:
        parse(xml)
    assert feature in info.value.feature
    assert info.value.line is not None


def test_ipc_needs_the_discrete_integrator():
    """MuJoCo 4.0.0 refuses the ipc flag without integrator="discrete" ("flag ipc
    requires integrator='discrete'"); simjax's loader says so at the option element."""
    import simjax
    xml = ('<mujoco>\n<option {}><flag ipc="enable"/></option><worldbody><body>'
           '<freejoint/><geom size=".1"/></body></worldbody></mujoco>')
    with pytest.raises(MJCFError, match="flag ipc requires integrator='discrete'") as info:
        simjax.load_model(xml.format(""))
    assert info.value.line == 2 and "option" in info.value.element
    assert simjax.load_model(xml.format('integrator="discrete"')).opt.integrator == 4


def test_body_sleep_policies():
    """never / allowed compile (they matter only to sleeping, which the engine refuses);
    init, a tree that starts asleep, is named."""
    import simjax
    xml = ('<mujoco><worldbody><body sleep="{}"><freejoint/><geom size=".1"/></body>'
           '</worldbody></mujoco>')
    for policy in ("auto", "never", "allowed"):
        assert simjax.load_model(xml.format(policy)).nbody == 2
    with pytest.raises(UnsupportedFeatureError) as info:
        simjax.load_model(xml.format("init"))
    assert "sleep policy 'init'" in info.value.feature


# Errors found while compiling (references, names, values): load_model must locate them
# as well. Messages follow MuJoCo's wording where it has one.
MODEL = """<mujoco>
  <worldbody>
    <body name="b">
      <joint name="j" range="-1 1"/><geom name="g" size="0.1"/>
      {}
    </body>
    <body name="c"><geom size="0.1"/></body>
  </worldbody>
  {}
</mujoco>"""

# (id, xml, substrings of the message, line, tag of the element path's last step)
COMPILE_CASES = [
    ("undefined-joint-in-actuator", MODEL.format("", '<actuator>\n<motor joint="nope"/></actuator>'),
     ["unknown joint 'nope'"], 10, "motor"),
    ("undefined-joint-in-tendon",
     MODEL.format("", '<tendon><fixed>\n<joint joint="zz" coef="1"/></fixed></tendon>'),
     ["unknown joint 'zz'"], 10, "joint"),
    ("undefined-site-in-tendon",
     MODEL.format("", '<tendon><spatial>\n<site site="a"/><site site="b"/></spatial></tendon>'),
     ["unknown site 'a'"], 10, "site"),
    ("undefined-site-in-sensor",
     MODEL.format("", '<sensor>\n<accelerometer site="nos"/></sensor>'),
     ["unknown site 'nos'"], 10, "accelerometer"),
    ("undefined-body-in-equality", MODEL.format("", '<equality>\n<weld body1="zz"/></equality>'),
     ["'zz'"], 10, "weld"),
    ("undefined-body-in-exclude",
     MODEL.format("", '<contact>\n<exclude body1="b" body2="qq"/></contact>'),
     ["body 'qq' not found"], 10, "exclude"),
    ("undefined-geom-in-pair",
     MODEL.format("", '<contact>\n<pair geom1="g" geom2="zz"/></contact>'),
     ["geom 'zz' not found"], 10, "pair"),
    ("undefined-mesh", MODEL.format('<geom type="mesh" mesh="m"/>', ""),
     ["mesh 'm' not found"], 5, "geom"),
    ("undefined-hfield", MODEL.format('<geom type="hfield" hfield="h"/>', ""),
     ["hfield 'h' not found"], 5, "geom"),
    ("missing-mesh-file", MODEL.format("", '<asset>\n<mesh file="nothere.stl"/></asset>'),
     ["could not read", "nothere.stl"], 10, "mesh"),
    ("joint-range-reversed",
     MODEL.format('<body><joint range="1 -1" limited="true"/><geom size="1"/></body>', ""),
     ["range[0] should be smaller than range[1]"], 5, "joint"),
    ("zero-box-size", MODEL.format('<geom type="box" size="0 1 1"/>', ""),
     ["size 0 must be positive"], 5, "geom"),
    ("massless-moving-body", MODEL.format("<body><joint/></body>", ""),
     ["mass and inertia of moving bodies"], 5, "body"),
    ("keyframe-qpos-size", MODEL.format("", '<keyframe>\n<key qpos="1 2 3"/></keyframe>'),
     ["invalid qpos size"], 10, "key"),
    ("ctrlrange-reversed",
     MODEL.format("", '<actuator>\n<motor joint="j" ctrllimited="true" ctrlrange="1 -1"/>'
                      "</actuator>"), ["invalid control range"], 10, "motor"),
    ("freejoint-not-top", MODEL.format('<body><freejoint/><geom size="1"/></body>', ""),
     ["free joint can only be used on top level"], 5, "body"),
    ("repeated-body", MODEL.format('<body name="c"/>', ""), ["repeated name 'c' in body"], 7,
     "body"),
    ("repeated-geom", MODEL.format('<geom name="g" size="1"/>', ""),
     ["repeated name 'g' in geom"], 5, "geom"),
    ("repeated-joint-freejoint", MODEL.format("", "").replace(
        '<body name="c">', '<body name="c"><freejoint name="j"/>'),
     ["repeated name 'j' in joint"], 7, "freejoint"),
    ("repeated-site", MODEL.format('<site name="s"/>\n<site name="s"/>', ""),
     ["repeated name 's' in site"], 6, "site"),
    ("repeated-camera", MODEL.format('<camera name="q"/>\n<camera name="q"/>', ""),
     ["repeated name 'q' in camera"], 6, "camera"),
    ("repeated-light", MODEL.format('<light name="l"/>\n<light name="l"/>', ""),
     ["repeated name 'l' in light"], 6, "light"),
    ("repeated-tendon", MODEL.format("", '<tendon><fixed name="t"><joint joint="j" coef="1"/>'
                                         '</fixed>\n<fixed name="t"><joint joint="j" coef="1"/>'
                                         "</fixed></tendon>"),
     ["repeated name 't' in tendon"], 10, "fixed"),
    ("repeated-actuator", MODEL.format("", '<actuator><motor name="a" joint="j"/>\n'
                                           '<position name="a" joint="j"/></actuator>'),
     ["repeated name 'a' in actuator"], 10, "position"),
    ("repeated-sensor", MODEL.format("", '<sensor><jointpos name="a" joint="j"/>\n'
                                         '<jointvel name="a" joint="j"/></sensor>'),
     ["repeated name 'a' in sensor"], 10, "jointvel"),
    ("repeated-equality", MODEL.format("", '<equality><weld name="e" body1="b"/>\n'
                                           '<connect name="e" body1="b" anchor="0 0 0"/>'
                                           "</equality>"),
     ["repeated name 'e' in equality"], 10, "connect"),
    ("repeated-key", MODEL.format("", '<keyframe><key name="k"/>\n<key name="k"/></keyframe>'),
     ["repeated name 'k' in key"], 10, "key"),
    ("repeated-material", MODEL.format("", '<asset><material name="m"/>\n'
                                           '<material name="m"/></asset>'),
     ["repeated name 'm' in material"], 10, "material"),
    ("repeated-pair", MODEL.format("", '<contact><pair name="p" geom1="g" geom2="g"/>\n'
                                       '<pair name="p" geom1="g" geom2="g"/></contact>'),
     ["repeated name 'p' in pair"], 10, "pair"),
    ("repeated-numeric", MODEL.format("", '<custom><numeric name="n" data="1"/>\n'
                                          '<numeric name="n" data="1"/></custom>'),
     ["repeated name 'n' in numeric"], 10, "numeric"),
]


@pytest.mark.parametrize("xml,needles,line,tag", [c[1:] for c in COMPILE_CASES],
                         ids=[c[0] for c in COMPILE_CASES])
def test_compile_error_located(xml, needles, line, tag):
    import mujoco

    import simjax
    with pytest.raises(ValueError):          # MuJoCo rejects the same input
        mujoco.MjModel.from_xml_string(xml)
    with pytest.raises(MJCFError) as info:
        simjax.load_model(xml)
    err = info.value
    text = str(err)
    for needle in needles:
        assert needle in text, (needle, text)
    assert err.file == "<string>" and err.line == line, text
    assert f"line {line}" in text
    assert err.element.split("/")[-1].split("[")[0] == tag, err.element
