"""Elements outside the body tree: tendons, actuators, sensors, equalities, contact
pairs/excludes, keyframes and custom data (numpy only).

Semantics follow MuJoCo's ``mjCTendon``, ``mjCActuator``, ``mjCSensor``,
``mjCEquality``, ``mjCPair``, ``mjCBodyPair`` and ``mjCKey`` compile steps.
"""
from __future__ import annotations

import numpy as np

from simjax.errors import UnsupportedFeatureError
from simjax.types import (BiasType, DataType, DynType, EqType, GainType, GeomType,
                          JointType, ObjType, SensorType, Stage, TrnType, WrapType)

DYN = {"none": DynType.NONE, "integrator": DynType.INTEGRATOR, "filter": DynType.FILTER,
       "filterexact": DynType.FILTEREXACT, "muscle": DynType.MUSCLE,
       "dcmotor": DynType.DCMOTOR, "pid": DynType.PID, "user": DynType.USER}
GAIN = {"fixed": GainType.FIXED, "affine": GainType.AFFINE, "muscle": GainType.MUSCLE,
        "dcmotor": GainType.DCMOTOR, "so3": GainType.SO3, "pid": GainType.PID,
        "user": GainType.USER}
BIAS = {"none": BiasType.NONE, "affine": BiasType.AFFINE, "muscle": BiasType.MUSCLE,
        "dcmotor": BiasType.DCMOTOR, "so3": BiasType.SO3, "user": BiasType.USER}
# actuator ``input`` signature (actuator_ctrlspec): so3 charts, servo input bits, none
_CHART = {"expmap": 1, "quat": 2}
_IN_POS, _IN_VEL, _IN_FF, _IN_VOLTAGE, _IN_NONE, _IN_PRESSURE = 1, 2, 4, 8, 16, 32
_IN_BITS = {"pos": _IN_POS, "vel": _IN_VEL, "ff": _IN_FF, "voltage": _IN_VOLTAGE}


def _get(attrs, key, default):
    """attrs[key], or ``default`` when unset (None)."""
    v = attrs.get(key)
    return default if v is None else v


def resolve_limited(el, flag, rng, autolimits, entity, attr=""):
    """Whether a true/false/auto limit is active (MuJoCo's checklimited + islimited)."""
    hasrange = not (rng[0] == 0 and rng[1] == 0)
    if flag == "auto" and not autolimits and hasrange:
        raise el.error(f"{entity} has `{attr}range` but not `{attr}limited`. set the "
                       f"autolimits=\"true\" compiler option, specify `{attr}limited` explicitly "
                       f"(\"true\" or \"false\"), or remove the `{attr}range` attribute.")
    return flag == "true" or (flag == "auto" and rng[0] < rng[1])


def _lookup(ids, objtype, name, el, what):
    if name is None or name == "":
        raise el.error(f"missing {what} name")
    i = ids[objtype].get(name, -1)
    if i < 0:
        raise el.error(f"unknown {what} '{name}'")
    return i


def _poly3(v):
    out = np.zeros(3)
    v = np.atleast_1d(np.asarray(v, dtype=np.float64))
    out[:len(v)] = v[:3]
    return out


# ----------------------------------------------------------------------------- tendons
def tendons(els, ids, s):
    """Tendon records and the flat wrap arrays."""
    recs, wtype, wobj, wprm = [], [], [], []
    for el in els:
        a = el.attrs
        adr = len(wtype)
        if el.tag == "fixed":
            for ch in el.children:
                j = _lookup(ids, "joint", ch.attrs.get("joint"), ch, "joint")
                wtype.append(WrapType.JOINT)
                wobj.append(j)
                wprm.append(float(ch.attrs.get("coef", 1.0)))
        else:
            for ch in el.children:
                if ch.tag == "site":
                    wtype.append(WrapType.SITE)
                    wobj.append(_lookup(ids, "site", ch.attrs.get("site"), ch, "site"))
                    wprm.append(0.0)
                elif ch.tag == "geom":
                    g = _lookup(ids, "geom", ch.attrs.get("geom"), ch, "geom")
                    gt = ids["geom_type"][g]
                    if gt not in (2, 5):
                        raise ch.error("wrapping geom must be sphere or cylinder")
                    wtype.append(WrapType.SPHERE if gt == 2 else WrapType.CYLINDER)
                    wobj.append(g)
                    side = ch.attrs.get("sidesite")
                    wprm.append(float(_lookup(ids, "site", side, ch, "sidesite"))
                                if side else -1.0)
                elif ch.tag == "pulley":
                    wtype.append(WrapType.PULLEY)
                    wobj.append(-1)
                    wprm.append(float(ch.attrs["divisor"]))
            _check_spatial(el, wtype[adr:])
        rng = np.asarray(a["range"], dtype=np.float64)
        limited = resolve_limited(el, a["limited"], rng, s.autolimits, "tendon")
        if limited and rng[0] >= rng[1]:
            raise el.error("invalid limits in tendon")
        afr = np.asarray(a["actuatorfrcrange"], dtype=np.float64)
        afl = resolve_limited(el, a["actuatorfrclimited"], afr, s.autolimits, "tendon", "actuatorfrc")
        if afl and afr[0] >= afr[1]:
            raise el.error("invalid actuatorfrcrange in tendon")
        sl = np.atleast_1d(np.asarray(_get(a, "springlength", [-1, -1]), dtype=np.float64))
        if sl.size == 1:
            sl = np.array([sl[0], sl[0]])
        stiff, damp = _poly3(a["stiffness"]), _poly3(a["damping"])
        yld = float(_get(a, "springyield", 0.0))
        if yld < 0:
            raise el.error("springyield cannot be negative in tendon")
        recs.append(dict(name=a.get("name") or "", adr=adr, num=len(wtype) - adr,
                         limited=limited, range=rng, actfrclimited=afl, actfrcrange=afr,
                         solref_lim=a["solreflimit"], solimp_lim=a["solimplimit"],
                         solref_fri=a["solreffriction"], solimp_fri=a["solimpfriction"],
                         margin=float(a["margin"]), stiffness=stiff, damping=damp,
                         armature=float(_get(a, "armature", 0.0)),
                         frictionloss=float(a["frictionloss"]), lengthspring=sl,
                         springyield=yld, group=int(_get(a, "group", 0)),
                         user=a.get("user"), el=el))
    return recs, np.array(wtype, np.int32), np.array(wobj, np.int32), np.array(wprm)


def _check_spatial(el, types):
    if not types:
        raise el.error("tendon must have at least one object")
    # pulleys split the path into branches; each branch starts and ends with a site
    branches, cur = [], []
    for t in types:
        if t == WrapType.PULLEY:
            branches.append(cur)
            cur = []
        else:
            cur.append(t)
    branches.append(cur)
    for br in branches:
        if br and (br[0] != WrapType.SITE or br[-1] != WrapType.SITE):
            raise el.error("tendon branch must start and end with a site")
    for i, t in enumerate(types):
        if t in (WrapType.SPHERE, WrapType.CYLINDER):
            if i == 0 or i == len(types) - 1 or types[i - 1] != WrapType.SITE or \
                    types[i + 1] != WrapType.SITE:
                raise el.error("geom in tendon must be between two sites")


# ----------------------------------------------------------------------------- actuators
_TARGETS = (("joint", TrnType.JOINT, "joint"), ("jointinparent", TrnType.JOINTINPARENT, "joint"),
            ("tendon", TrnType.TENDON, "tendon"), ("site", TrnType.SITE, "site"),
            ("cranksite", TrnType.SLIDERCRANK, "site"), ("body", TrnType.BODY, "body"))


def actuators(els, ids, s, joints, tendon_recs):
    """Actuator records: types, prm arrays, transmission, limits and the control and
    output blocks (ctrlnum, outnum; several for so3, pid and dcmotor actuators)."""
    recs = []
    actadr = 0
    for i, el in enumerate(els):
        a = el.attrs
        dyn = DYN.get(a["dyntype"])
        gain = GAIN.get(a["gaintype"])
        bias = BIAS.get(a["biastype"])
        if dyn is None or gain is None or bias is None:
            raise UnsupportedFeatureError(
                f"actuator dyn/gain/bias type {a['dyntype']}/{a['gaintype']}/{a['biastype']}",
                el.file, el.line, el.path)
        history, delay = _history(el, a)
        given = [(k, t, o) for k, t, o in _TARGETS if a.get(k)]
        if not given:
            raise el.error("missing transmission target for actuator")
        if len(given) > 1:
            raise el.error("actuator can have only one transmission target")
        key, trn, otype = given[0]
        trnid = [_lookup(ids, otype, a[key], el, otype), -1]
        if trn == TrnType.SITE and a.get("refsite"):
            trnid[1] = _lookup(ids, "site", a["refsite"], el, "refsite")
        if trn == TrnType.SLIDERCRANK:
            if not a.get("slidersite"):
                raise el.error("slider-crank actuator requires slidersite")
            trnid[1] = _lookup(ids, "site", a["slidersite"], el, "slidersite")
            if float(a["cranklength"]) <= 0:
                raise el.error("crank length must be positive in actuator")
        gainprm = np.array(a["gainprm"], dtype=np.float64)
        biasprm = np.array(a["biasprm"], dtype=np.float64)
        dynprm = np.array(a["dynprm"], dtype=np.float64)
        ctrlrange = np.array(a["ctrlrange"], dtype=np.float64)
        actrange = np.array(a["actrange"], dtype=np.float64)
        forcerange = np.array(a["forcerange"], dtype=np.float64)
        actdim = int(_get(a, "actdim", -1))
        actlimited = a["actlimited"]
        io = _io_blocks(el, a, dyn, gain, bias, trn, joints, trnid, gainprm, biasprm, dynprm,
                        actdim, actrange, forcerange, s.autolimits)
        actdim, actlimited = io.pop("actdim", actdim), io.pop("actlimited", actlimited)
        _inherit_range(el, a, trn, trnid, dyn, gain, bias, gainprm, biasprm, ctrlrange,
                       actrange, joints, tendon_recs)
        fl = resolve_limited(el, a["forcelimited"], forcerange, s.autolimits, "actuator", "force")
        cl = resolve_limited(el, a["ctrllimited"], ctrlrange, s.autolimits, "actuator", "ctrl")
        al = resolve_limited(el, actlimited, actrange, s.autolimits, "actuator", "act")
        if fl and forcerange[0] >= forcerange[1]:
            raise el.error("invalid force range for actuator")
        if cl and ctrlrange[0] >= ctrlrange[1]:
            raise el.error("invalid control range for actuator")
        if al and actrange[0] >= actrange[1]:
            raise el.error("invalid actrange for actuator")
        if al and dyn == DynType.NONE:
            raise el.error("actrange specified but dyntype is 'none' in actuator")
        if el.tag != "plugin":      # plugin actuators skip the built-in actdim rules
            if actdim > 1 and dyn not in (DynType.USER, DynType.DCMOTOR, DynType.PID) and \
                    not io["so3"]:
                raise el.error("actdim > 1 is only allowed for dyntype 'user', 'dcmotor' and "
                               "'pid'")
            if actdim == 1 and dyn == DynType.NONE:
                raise el.error("invalid actdim 1 in stateless actuator")
            if actdim == 0 and dyn not in (DynType.NONE, DynType.DCMOTOR):
                raise el.error("invalid actdim 0 in stateful actuator")
        if actdim < 0 and dyn == DynType.DCMOTOR:
            # one state per present DC-motor slot (slew, integral, temperature, bristle,
            # current), as MuJoCo 4.0 counts them for a general actuator
            actdim = int(dynprm[7] > 0) + int(gainprm[5] > 0) + int(dynprm[2] > 0) + \
                int(dynprm[5] > 0) + int(dynprm[0] > 0)
        if actdim < 0:
            actdim = int(dyn != DynType.NONE)
        if dyn == DynType.DCMOTOR and not a["actearly"]:
            raise el.error("actearly cannot be false for DC motor actuator")
        if (history[0] > 0 or delay > 0) and io["ctrlnum"] == 0:
            raise el.error("history and delay require an input in actuator")
        _check_muscle(el, gain, bias, gainprm, biasprm)
        damping = _poly3(_get(a, "damping", 0.0))
        armature = float(_get(a, "armature", 0.0))
        if (np.any(damping) or armature) and trn not in (TrnType.JOINT, TrnType.JOINTINPARENT,
                                                          TrnType.TENDON):
            raise el.error("damping/armature requires joint or tendon transmission in actuator")
        ctrlspec = io["ctrlspec"]
        if not io["so3"] and gain not in (GainType.PID, GainType.DCMOTOR):
            if a.get("input") is not None:
                raise el.error("input is only available for so3, pid and dcmotor actuators")
            # MuJoCo 4 records the input signature of the servo shortcuts and the
            # cylinder's pressure input (mjINPUT_PRESSURE)
            ctrlspec = {"position": _IN_POS, "velocity": _IN_VEL, "intvelocity": _IN_VEL,
                        "cylinder": _IN_PRESSURE}.get(el.tag, 0)
        ctrl_lim, ctrl_rng = _ctrl_ranges(a, io, gain, cl, ctrlrange)
        recs.append(dict(name=a.get("name") or "", trntype=TrnType.SO3 if io["so3"] else trn,
                         trnid=trnid, dyntype=dyn, ctrlnum=io["ctrlnum"],
                         outnum=io["outnum"], ctrlranges=ctrl_rng, ctrllimiteds=ctrl_lim,
                         ctrlspec=ctrlspec, history=history, delay=delay,
                         gaintype=gain, biastype=bias, dynprm=dynprm, gainprm=gainprm,
                         biasprm=biasprm, actearly=bool(a["actearly"]), ctrllimited=cl,
                         forcelimited=fl, actlimited=al, ctrlrange=ctrlrange,
                         forcerange=forcerange, actrange=actrange,
                         lengthrange=np.array(a["lengthrange"], dtype=np.float64),
                         gear=np.array(a["gear"], dtype=np.float64),
                         cranklength=float(a["cranklength"]), actnum=actdim,
                         actadr=actadr if actdim else -1, group=int(_get(a, "group", 0)),
                         damping=damping, armature=armature, user=a.get("user"), el=el))
        actadr += actdim
    return recs


def _input_spec(text):
    """actuator_ctrlspec of an ``input`` attribute (0 when not given)."""
    if text is None:
        return 0
    words = str(text).split()
    if len(words) == 1 and words[0] in _CHART:
        return _CHART[words[0]]
    if words == ["none"]:
        return _IN_NONE
    return sum(_IN_BITS[w] for w in words)


def _io_blocks(el, a, dyn, gain, bias, trn, joints, trnid, gainprm, biasprm, dynprm,
               actdim, actrange, forcerange, autolimits):
    """Control and output blocks of the so3, pid and dcmotor families (mjCActuator::Compile):
    {ctrlnum, outnum, ctrlspec, so3} plus a resolved actdim / actlimited where the family
    decides them."""
    spec = _input_spec(a.get("input"))
    out = dict(ctrlnum=1, outnum=1, ctrlspec=0, so3=False)
    if gain == GainType.SO3 or bias == BiasType.SO3:
        if gain != GainType.SO3 or bias != BiasType.SO3:
            raise el.error("gaintype and biastype must both be 'so3' in actuator")
        if dyn not in (DynType.NONE, DynType.INTEGRATOR):
            raise el.error("so3 requires dyntype 'none' or 'integrator' in actuator")
        if gainprm[0] != -biasprm[1]:
            raise el.error("so3 requires gainprm[0] == -biasprm[1] in actuator")
        if trn == TrnType.SITE:
            if trnid[1] < 0:
                raise el.error("so3 site transmission requires refsite in actuator")
        elif trn == TrnType.JOINT:
            if joints[trnid[0]]["type"] != JointType.BALL:
                raise el.error("so3 joint transmission requires a ball joint in actuator")
        else:
            raise el.error("so3 requires site or ball joint transmission in actuator")
        if dyn == DynType.INTEGRATOR:
            if actdim > 0 and actdim != 3:
                raise el.error("so3 integrator requires actdim 3 in actuator")
            out["actdim"] = 3
            if a["actlimited"] == "true" and actrange[0] == 0 and actrange[1] == 0:
                out["actlimited"] = "false"
        spec = spec or _CHART["expmap"]
        if spec == _CHART["quat"]:
            if dyn != DynType.NONE:
                raise el.error("so3 quat input requires dyntype 'none' in actuator")
        elif spec != _CHART["expmap"]:
            raise el.error("so3 input must be expmap or quat in actuator")
        if resolve_limited(el, a["forcelimited"], forcerange, autolimits, "actuator",
                           "force") and forcerange[0] != 0:
            raise el.error("so3 forcerange bounds the force norm, lower bound must be 0 in "
                           "actuator")
        out.update(ctrlnum=4 if spec == _CHART["quat"] else 3, outnum=3, so3=True)
    if gain == GainType.PID:
        if bias != BiasType.AFFINE:
            raise el.error("pid requires biastype 'affine' in actuator")
        if dyn not in (DynType.NONE, DynType.PID):
            raise el.error("pid requires dyntype 'none' or 'pid' in actuator")
        if dyn == DynType.NONE and gainprm[0]:
            raise el.error("ki (gainprm[0]) requires dyntype 'pid' in actuator")
        if trn == TrnType.BODY:
            raise el.error("pid cannot use body transmission")
        if dyn == DynType.PID:
            if dynprm[0] < 0:
                raise el.error("imax (dynprm[0]) must be non-negative in actuator")
            if dynprm[1] < 0:
                raise el.error("slewmax (dynprm[1]) must be non-negative in actuator")
            nslot = int(dynprm[1] > 0) + int(gainprm[0] > 0)
            if actdim > 0 and actdim != nslot:
                raise el.error("pid controller states require matching actdim in actuator")
            out["actdim"] = nslot
        spec = spec or (_IN_POS | _IN_VEL)
        if spec & ~(_IN_POS | _IN_VEL | _IN_FF):
            raise el.error("pid inputs are a subset of [pos, vel, ff] in actuator")
        if dyn == DynType.PID and not spec & _IN_POS:
            raise el.error("pid controller states require the pos input in actuator")
        out["ctrlnum"] = bin(spec).count("1")
    if gain == GainType.DCMOTOR:
        spec = spec or _IN_VOLTAGE
        if spec != _IN_NONE and spec & ~(_IN_POS | _IN_VEL | _IN_FF | _IN_VOLTAGE):
            raise el.error("dcmotor inputs are 'none' or a subset of [pos, vel, ff, voltage] "
                           "in actuator")
        ctl = 0 if spec == _IN_NONE else spec & (_IN_POS | _IN_VEL | _IN_FF)
        if ctl and gainprm[1] <= 0:
            raise el.error("dcmotor controller inputs require a positive motor constant in "
                           "actuator")
        if not ctl and (gainprm[4] or gainprm[5] or gainprm[6]):
            raise el.error("dcmotor controller gains require a controller input [pos, vel, "
                           "ff] in actuator")
        if gainprm[5] > 0 and not spec & _IN_POS:
            raise el.error("dcmotor integral gain requires the pos input in actuator")
        out["ctrlnum"] = 0 if spec == _IN_NONE else bin(spec).count("1")
        if not ctl and dynprm[7] > 0:
            raise el.error("dcmotor slew rate limiting requires a controller input [pos, vel, "
                           "ff] in actuator")
    if dyn == DynType.PID and gain != GainType.PID:
        raise el.error("dyntype 'pid' requires gaintype 'pid' in actuator")
    out["ctrlspec"] = spec
    return out


def _ctrl_ranges(a, io, gain, limited, ctrlrange):
    """Per-control (limited, range): ctrlrange broadcast over the block; a pid's vel and
    ff inputs take velrange and ffrange (limited when lo < hi)."""
    n = io["ctrlnum"]
    lim, rng = [limited] * n, [ctrlrange.copy() for _ in range(n)]
    if gain == GainType.PID:
        j = 1 if io["ctrlspec"] & _IN_POS else 0
        for bit, key in ((_IN_VEL, "velrange"), (_IN_FF, "ffrange")):
            if io["ctrlspec"] & bit:
                r = np.array(_get(a, key, [0.0, 0.0]), dtype=np.float64)
                lim[j], rng[j] = bool(r[0] < r[1]), r
                j += 1
    return lim, rng


def _inherit_range(el, a, trn, trnid, dyn, gain, bias, gainprm, biasprm, ctrlrange,
                   actrange, joints, tendon_recs):
    x = float(_get(a, "inheritrange", 0.0) or 0.0)
    servo = (gain == GainType.FIXED and gainprm[0] == -biasprm[1]) or gain == GainType.PID
    if not (servo and bias == BiasType.AFFINE and x > 0):
        return
    if dyn in (DynType.NONE, DynType.FILTEREXACT, DynType.PID):
        target = ctrlrange
    elif dyn == DynType.INTEGRATOR:
        target = actrange
    else:
        raise el.error("inheritrange only available for position and intvelocity actuators")
    if trn == TrnType.JOINT:
        j = joints[trnid[0]]
        if j["type"] not in (JointType.HINGE, JointType.SLIDE):
            raise el.error("inheritrange can only be used with hinge and slide joints")
        rng = j["range"]
    elif trn == TrnType.TENDON:
        rng = tendon_recs[trnid[0]]["range"]
    else:
        raise el.error("inheritrange can only be used with joint and tendon transmission")
    if rng[0] == rng[1]:
        raise el.error("inheritrange used but target has no range defined")
    mean, rad = 0.5 * (rng[1] + rng[0]), 0.5 * (rng[1] - rng[0]) * x
    target[:] = [mean - rad, mean + rad]


def _check_muscle(el, gain, bias, gainprm, biasprm):
    for is_m, prm in ((gain == GainType.MUSCLE, gainprm), (bias == BiasType.MUSCLE, biasprm)):
        if not is_m:
            continue
        if prm[0] >= prm[1]:
            raise el.error("range[0]<range[1] required in muscle")
        if prm[4] >= 1 or prm[5] <= 1:
            raise el.error("lmin<1<lmax required in muscle")
        if prm[3] <= 0 or prm[6] <= 0 or prm[7] <= 0 or prm[8] <= 0:
            raise el.error("positive scale, vmax, fpmax, fvmax required in muscle")


# ----------------------------------------------------------------------------- sensors
# tag -> (type, dim, attribute naming the object, object type)
_ACC, _VEL, _POS = Stage.ACC, Stage.VEL, Stage.POS
_NONE_STAGE = Stage.NONE
_SITE_SENSORS = {"touch": (SensorType.TOUCH, 1), "accelerometer": (SensorType.ACCELEROMETER, 3),
                 "velocimeter": (SensorType.VELOCIMETER, 3), "gyro": (SensorType.GYRO, 3),
                 "force": (SensorType.FORCE, 3), "torque": (SensorType.TORQUE, 3),
                 "magnetometer": (SensorType.MAGNETOMETER, 3)}
_JOINT_SENSORS = {"jointpos": SensorType.JOINTPOS, "jointvel": SensorType.JOINTVEL,
                  "jointactuatorfrc": SensorType.JOINTACTFRC,
                  "ballquat": SensorType.BALLQUAT, "ballangvel": SensorType.BALLANGVEL,
                  "jointlimitpos": SensorType.JOINTLIMITPOS,
                  "jointlimitvel": SensorType.JOINTLIMITVEL,
                  "jointlimitfrc": SensorType.JOINTLIMITFRC}
_TENDON_SENSORS = {"tendonpos": SensorType.TENDONPOS, "tendonvel": SensorType.TENDONVEL,
                   "tendonactuatorfrc": SensorType.TENDONACTFRC,
                   "tendonlimitpos": SensorType.TENDONLIMITPOS,
                   "tendonlimitvel": SensorType.TENDONLIMITVEL,
                   "tendonlimitfrc": SensorType.TENDONLIMITFRC}
_ACT_SENSORS = {"actuatorpos": SensorType.ACTUATORPOS, "actuatorvel": SensorType.ACTUATORVEL,
                "actuatorfrc": SensorType.ACTUATORFRC}
_FRAME_SENSORS = {"framepos": (SensorType.FRAMEPOS, 3), "framequat": (SensorType.FRAMEQUAT, 4),
                  "framexaxis": (SensorType.FRAMEXAXIS, 3),
                  "frameyaxis": (SensorType.FRAMEYAXIS, 3),
                  "framezaxis": (SensorType.FRAMEZAXIS, 3),
                  "framelinvel": (SensorType.FRAMELINVEL, 3),
                  "frameangvel": (SensorType.FRAMEANGVEL, 3),
                  "framelinacc": (SensorType.FRAMELINACC, 3),
                  "frameangacc": (SensorType.FRAMEANGACC, 3)}
_SUBTREE_SENSORS = {"subtreecom": SensorType.SUBTREECOM,
                    "subtreelinvel": SensorType.SUBTREELINVEL,
                    "subtreeangmom": SensorType.SUBTREEANGMOM}
_STAGE_ACC = {SensorType.TOUCH, SensorType.ACCELEROMETER, SensorType.FORCE, SensorType.TORQUE,
              SensorType.ACTUATORFRC, SensorType.JOINTACTFRC, SensorType.TENDONACTFRC,
              SensorType.JOINTLIMITFRC, SensorType.TENDONLIMITFRC, SensorType.FRAMELINACC,
              SensorType.FRAMEANGACC, SensorType.CONTACT}
_STAGE_VEL = {SensorType.VELOCIMETER, SensorType.GYRO, SensorType.JOINTVEL,
              SensorType.TENDONVEL, SensorType.ACTUATORVEL, SensorType.BALLANGVEL,
              SensorType.JOINTLIMITVEL, SensorType.TENDONLIMITVEL, SensorType.FRAMELINVEL,
              SensorType.FRAMEANGVEL, SensorType.SUBTREELINVEL, SensorType.SUBTREEANGMOM,
              SensorType.TACTILE}
# (e_kinetic is a position-stage sensor in MuJoCo 4.0: 0.5 qvel' M qvel needs only M)
_DT_POSITIVE = {SensorType.TOUCH, SensorType.INSIDESITE}
_DT_AXIS = {SensorType.FRAMEXAXIS, SensorType.FRAMEYAXIS, SensorType.FRAMEZAXIS,
            SensorType.GEOMNORMAL}
_DT_QUAT = {SensorType.BALLQUAT, SensorType.FRAMEQUAT}
_OBJ = {"body": ObjType.BODY, "xbody": ObjType.XBODY, "geom": ObjType.GEOM,
        "site": ObjType.SITE, "camera": ObjType.CAMERA}
_OBJ_IDS = {ObjType.BODY: "body", ObjType.XBODY: "body", ObjType.GEOM: "geom",
            ObjType.SITE: "site", ObjType.CAMERA: "camera"}


def sensors(els, ids, joints, tendon_recs):
    """Sensor records with type, object/reference, dim, datatype and stage."""
    recs = []
    adr = 0
    for el in els:
        r = _sensor(el, ids, joints, tendon_recs)
        a = el.attrs
        history, delay = _history(el, a)
        interval = _interval(el, a)
        cutoff, noise = float(_get(a, "cutoff", 0.0)), float(_get(a, "noise", 0.0))
        if noise < 0:
            raise el.error("negative noise in sensor")
        if cutoff < 0:
            raise el.error("negative cutoff in sensor")
        t = r["type"]
        dtype = DataType.POSITIVE if t in _DT_POSITIVE else DataType.AXIS if t in _DT_AXIS \
            else DataType.QUATERNION if t in _DT_QUAT else DataType.REAL
        if cutoff > 0 and (dtype == DataType.QUATERNION or
                           (dtype == DataType.AXIS and t != SensorType.GEOMNORMAL)):
            raise el.error("cutoff applied to axis or quaternion datatype in sensor")
        stage = _ACC if t in _STAGE_ACC else _VEL if t in _STAGE_VEL else _POS
        if t == SensorType.CONTACT:
            stage = r.pop("needstage_contact")
        if t == SensorType.USER:
            stage, dtype = r.pop("needstage_user"), r.pop("datatype_user")
        r.update(name=a.get("name") or "", datatype=dtype, needstage=stage, cutoff=cutoff,
                 noise=noise, adr=adr, user=a.get("user"), history=history, delay=delay,
                 interval=interval)
        adr += r["dim"]
        recs.append(r)
    return recs


_INTERP = {"zoh": 0, "linear": 1, "cubic": 2}


def _history(el, a):
    """([nsample, interp], delay) of an actuator or sensor's history buffer (MuJoCo 4
    ``nsample`` / ``interp`` / ``delay``); a delay needs a buffer to read from."""
    nsample = int(_get(a, "nsample", 0) or 0)
    interp = _INTERP[a.get("interp") or "zoh"]
    delay = float(_get(a, "delay", 0.0) or 0.0)
    if delay > 0 and nsample <= 0:
        raise el.error("setting delay > 0 without a history buffer")
    return [nsample, interp if nsample > 0 else 0], delay


def _interval(el, a):
    """[period, phase] of a sensor's ``interval`` (phase 0 when omitted)."""
    raw = _get(a, "interval", None)
    iv = [] if raw is None else [float(x) for x in np.atleast_1d(raw)]
    period, phase = (iv + [0.0, 0.0])[:2]
    if period < 0:
        raise el.error("negative interval in sensor")
    if phase > 0:
        raise el.error("positive phase in sensor")
    if period > 0 and phase <= -period:
        raise el.error("phase must be greater than -period in sensor")
    return [period, phase]


def _sensor(el, ids, joints, tendon_recs):
    a, tag = el.attrs, el.tag
    base = dict(reftype=ObjType.UNKNOWN, refid=-1, intprm=[0, 0, 0])
    if tag in _SITE_SENSORS:
        t, dim = _SITE_SENSORS[tag]
        return dict(base, type=t, dim=dim, objtype=ObjType.SITE,
                    objid=_lookup(ids, "site", a.get("site"), el, "site"))
    if tag in _JOINT_SENSORS:
        t = _JOINT_SENSORS[tag]
        j = _lookup(ids, "joint", a.get("joint"), el, "joint")
        jt = joints[j]["type"]
        if t in (SensorType.BALLQUAT, SensorType.BALLANGVEL):
            if jt != JointType.BALL:
                raise el.error("joint must be ball in sensor")
        elif t in (SensorType.JOINTLIMITPOS, SensorType.JOINTLIMITVEL,
                   SensorType.JOINTLIMITFRC):
            if not joints[j]["limited"]:
                raise el.error("joint must be limited in sensor")
        elif jt not in (JointType.HINGE, JointType.SLIDE):
            raise el.error("joint must be slide or hinge in sensor")
        dim = 4 if t == SensorType.BALLQUAT else 3 if t == SensorType.BALLANGVEL else 1
        return dict(base, type=t, dim=dim, objtype=ObjType.JOINT, objid=j)
    if tag in _TENDON_SENSORS:
        t = _TENDON_SENSORS[tag]
        k = _lookup(ids, "tendon", a.get("tendon"), el, "tendon")
        if t in (SensorType.TENDONLIMITPOS, SensorType.TENDONLIMITVEL,
                 SensorType.TENDONLIMITFRC) and not tendon_recs[k]["limited"]:
            raise el.error("tendon must be limited in sensor")
        return dict(base, type=t, dim=1, objtype=ObjType.TENDON, objid=k)
    if tag in _ACT_SENSORS:
        k = _lookup(ids, "actuator", a.get("actuator"), el, "actuator")
        # one value per force output (three for so3 actuators)
        return dict(base, type=_ACT_SENSORS[tag], dim=int(ids["actuator_outnum"][k]),
                    objtype=ObjType.ACTUATOR, objid=k)
    if tag in _FRAME_SENSORS:
        t, dim = _FRAME_SENSORS[tag]
        r = dict(base, type=t, dim=dim, **_frame_obj(el, ids, a.get("objtype"),
                                                      a.get("objname"), "obj"))
        if a.get("reftype") or a.get("refname"):
            ref = _frame_obj(el, ids, a.get("reftype"), a.get("refname"), "ref")
            r.update(reftype=ref["objtype"], refid=ref["objid"])
        return r
    if tag in _SUBTREE_SENSORS:
        return dict(base, type=_SUBTREE_SENSORS[tag], dim=3, objtype=ObjType.BODY,
                    objid=_lookup(ids, "body", a.get("body"), el, "body"))
    if tag == "camprojection":
        cam = _lookup(ids, "camera", a.get("camera"), el, "camera")
        return dict(base, type=SensorType.CAMPROJECTION, dim=2, objtype=ObjType.SITE,
                    objid=_lookup(ids, "site", a.get("site"), el, "site"),
                    reftype=ObjType.CAMERA, refid=cam)
    if tag == "rangefinder":
        return _rangefinder(el, a, ids, base)
    if tag == "contact":
        return _contact_sensor(el, a, ids, base)
    if tag == "insidesite":
        r = dict(base, type=SensorType.INSIDESITE, dim=1, **_frame_obj(
            el, ids, a.get("objtype"), a.get("objname"), "obj"))
        r.update(reftype=ObjType.SITE, refid=_lookup(ids, "site", a.get("site"), el, "site"))
        return r
    if tag in ("distance", "normal", "fromto"):
        t, dim = {"distance": (SensorType.GEOMDIST, 1), "normal": (SensorType.GEOMNORMAL, 3),
                  "fromto": (SensorType.GEOMFROMTO, 6)}[tag]
        sides = []
        for k in ("1", "2"):
            g, b = a.get("geom" + k), a.get("body" + k)
            if (g is None) == (b is None):
                raise el.error(f"exactly one of (geom{k}, body{k}) must be specified")
            sides.append((ObjType.GEOM, _lookup(ids, "geom", g, el, "geom" + k)) if g else
                         (ObjType.BODY, _lookup(ids, "body", b, el, "body" + k)))
        if sides[0] == sides[1]:
            raise el.error("1st body/geom must be different from 2nd body/geom")
        if any(o == ObjType.GEOM and ids["geom_type"][i] == GeomType.HFIELD
               for o, i in sides):
            # as MuJoCo's compiler: height fields need not be convex
            raise el.error("height fields are not supported in geom distance sensors")
        return dict(base, type=t, dim=dim, objtype=sides[0][0], objid=sides[0][1],
                    reftype=sides[1][0], refid=sides[1][1])
    if tag == "tactile":
        # taxels at the mesh's vertices in the geom frame: [depth, tangent1, tangent2]
        mesh = _lookup(ids, "mesh", a.get("mesh"), el, "mesh")
        return dict(base, type=SensorType.TACTILE, dim=3 * int(ids["mesh_vertnum"][mesh]),
                    objtype=ObjType.MESH, objid=mesh, reftype=ObjType.GEOM,
                    refid=_lookup(ids, "geom", a.get("geom"), el, "geom"))
    if tag == "clock":
        return dict(base, type=SensorType.CLOCK, dim=1, objtype=ObjType.UNKNOWN, objid=-1)
    if tag == "plugin":
        from simjax.mjcf.plugin import sensor_record
        return sensor_record(el, ids)
    if tag == "user":
        return _user_sensor(el, a, ids, base)
    if tag in ("e_potential", "e_kinetic"):
        t = SensorType.E_POTENTIAL if tag == "e_potential" else SensorType.E_KINETIC
        return dict(base, type=t, dim=1, objtype=ObjType.UNKNOWN, objid=-1)
    raise UnsupportedFeatureError(f"<{tag}> sensor", el.file, el.line, el.path)


_USER_STAGE = {"none": _NONE_STAGE, "pos": _POS, "vel": _VEL, "acc": _ACC}
_USER_DATATYPE = {"real": DataType.REAL, "positive": DataType.POSITIVE,
                  "axis": DataType.AXIS, "quaternion": DataType.QUATERNION}


def _user_sensor(el, a, ids, base):
    """<user> sensor: any object (by mjtObj name), declared dim, datatype and stage;
    its values come from MuJoCo's mjcb_sensor callback (zero in simjax)."""
    dim = int(_get(a, "dim", -1))
    if dim < 0:
        raise el.error("sensor dim must be positive in sensor")
    r = dict(base, type=SensorType.USER, dim=dim, objtype=ObjType.UNKNOWN, objid=-1,
             needstage_user=_USER_STAGE[a.get("needstage") or "acc"],
             datatype_user=_USER_DATATYPE[a.get("datatype") or "real"])
    if a.get("objtype") is not None:
        name = a.get("objtype")
        try:
            ot = ObjType[name.upper()]
        except KeyError:
            raise el.error(f"unknown object type '{name}' in sensor") from None
        kind = "body" if ot == ObjType.XBODY else name
        r.update(objtype=ot, objid=_lookup(ids, kind, a.get("objname"), el, "objname"))
    return r


_RAYDATA = ("dist", "dir", "origin", "point", "normal", "depth")
_RAYDATA_SIZE = (1, 3, 3, 3, 3, 1)


def _data_fields(el, words, names, sizes, what, order_msg):
    """(bit set, total size) of a sensor's ``data`` words, which must be among
    ``names`` and in their order."""
    spec, last = 0, -1
    for w in words.split():
        if w not in names:
            raise el.error(f"unknown {what} data type '{w}'")
        k = names.index(w)
        if k <= last:
            raise el.error(order_msg)
        spec, last = spec | (1 << k), k
    return spec, sum(n for k, n in enumerate(sizes) if spec & (1 << k))


def _rangefinder(el, a, ids, base):
    """Rangefinder on a site (one ray) or a camera (one ray per pixel); ``data`` selects
    fields in mjtRayDataField order (sensor_intprm[0] is their bit set)."""
    spec, size = _data_fields(el, str(a.get("data") or "dist"), _RAYDATA, _RAYDATA_SIZE,
                              "rangefinder", "rangefinder data types must be given in "
                              "order dist, dir, origin, point, normal, depth")
    if (a.get("site") is None) == (a.get("camera") is None):
        raise el.error("exactly one of (site, camera) must be specified in rangefinder")
    if a.get("site") is not None:
        return dict(base, type=SensorType.RANGEFINDER, dim=size, objtype=ObjType.SITE,
                    objid=_lookup(ids, "site", a.get("site"), el, "site"),
                    intprm=[spec, 0, 0])
    cam = _lookup(ids, "camera", a.get("camera"), el, "camera")
    w, h = (int(v) for v in ids["cam_resolution"][cam])
    return dict(base, type=SensorType.RANGEFINDER, dim=size * w * h, objtype=ObjType.CAMERA,
                objid=cam, intprm=[spec, 0, 0])


#: contact sensor data fields (mjtConDataField order) and their sizes
_CONDATA = ("found", "force", "torque", "dist", "pos", "normal", "tangent", "linvel",
            "angvel")
_CONDATA_SIZE = (1, 3, 3, 1, 3, 3, 3, 3, 3)
_REDUCE = {"none": 0, "mindist": 1, "maxforce": 2, "netforce": 3}


def _contact_sensor(el, a, ids, base):
    """Contact sensor (mjSENS_CONTACT): side 1 in objtype/objid and side 2 in
    reftype/refid (geom, body, subtree as xbody, or site for side 1; unknown/-1 when
    not given: any), sensor_intprm = [data field bit set (mjtConDataField), reduce,
    num], dim num times the fields' size. Stage: acceleration for forces or the net
    force reduction, velocity for contact velocities, position otherwise."""
    spec, size = _data_fields(el, str(a.get("data") or "found"), _CONDATA, _CONDATA_SIZE,
                              "contact", "data attributes must be in order: " +
                              ", ".join(_CONDATA))
    num = int(_get(a, "num", 1))
    if num <= 0:
        raise el.error("'num' must be positive in sensor")
    reduce = _REDUCE[a.get("reduce") or "none"]
    if reduce == _REDUCE["netforce"] and spec & ((1 << 7) | (1 << 8)):
        raise el.error("netforce reduction is incompatible with linvel or angvel")
    sides = []
    for keys in (("geom1", "body1", "subtree1", "site"), ("geom2", "body2", "subtree2")):
        given = [k for k in keys if a.get(k) is not None]
        if len(given) > 1:
            raise el.error("at most one of " + ", ".join(f"'{k}'" for k in keys) +
                           " can be specified")
        if not given:
            sides.append((ObjType.UNKNOWN, -1))
            continue
        k = given[0]
        kind = "body" if k.startswith(("body", "subtree")) else k.rstrip("12")
        typ = {"geom": ObjType.GEOM, "body": ObjType.BODY, "site": ObjType.SITE}[kind]
        if k.startswith("subtree"):
            typ = ObjType.XBODY
        sides.append((typ, _lookup(ids, kind, a.get(k), el, k)))
    force = spec & ((1 << 1) | (1 << 2)) or reduce == _REDUCE["netforce"]
    stage = _ACC if force else _VEL if spec & ((1 << 7) | (1 << 8)) else _POS
    return dict(base, type=SensorType.CONTACT, dim=num * size, objtype=sides[0][0],
                objid=sides[0][1], reftype=sides[1][0], refid=sides[1][1],
                intprm=[spec, reduce, num], needstage_contact=stage)


def _frame_obj(el, ids, objtype, objname, what):
    if objtype not in _OBJ:
        raise el.error(f"{what}type must be (x)body, geom, site or camera in sensor")
    ot = _OBJ[objtype]
    return dict(objtype=ot, objid=_lookup(ids, _OBJ_IDS[ot], objname, el, f"{what}name"))


# ----------------------------------------------------------------------------- equality
def equalities(els, ids):
    recs = []
    for el in els:
        a = el.attrs
        data = np.zeros(12)
        data[1] = 1.0
        data[10] = 1.0
        tag = el.tag
        if tag in ("connect", "weld"):
            etype = EqType.CONNECT if tag == "connect" else EqType.WELD
            if a.get("site1") or a.get("site2"):
                if not (a.get("site1") and a.get("site2")):
                    raise el.error("either both body1 and body2 or site1 and site2 must be "
                                   "defined")
                objtype = ObjType.SITE
                o1 = _lookup(ids, "site", a["site1"], el, "site1")
                o2 = _lookup(ids, "site", a["site2"], el, "site2")
                data[:] = 0
                if etype == EqType.WELD:
                    # MuJoCo 4 keeps the default's 1 at [1] for a site weld
                    data[1] = 1.0
                    data[10] = float(_get(a, "torquescale", 1.0))
            else:
                objtype = ObjType.BODY
                o1 = _lookup(ids, "body", a.get("body1"), el, "body1")
                o2 = ids["body"].get(a.get("body2"), -1) if a.get("body2") else 0
                if o2 < 0:
                    raise el.error(f"unknown body2 '{a.get('body2')}'")
                data[:] = 0
                data[10] = 1.0   # MuJoCo 4 keeps the default torquescale entry for connect
                data[0:3] = _get(a, "anchor", np.zeros(3))
                if etype == EqType.WELD:
                    rp = np.asarray(_get(a, "relpose", [0, 1, 0, 0, 0, 0, 0]), dtype=float)
                    data[3:6] = rp[:3]
                    data[6:10] = rp[3:7]
                    # MuJoCo 4's last entry: 1 where the relative pose is the one at
                    # qpos0 (no relpose quaternion given), 0 for a given relpose
                    data[11] = float(not np.any(rp[3:7] != 0))
                    data[10] = float(_get(a, "torquescale", 1.0))
        elif tag in ("joint", "tendon"):
            etype = EqType.JOINT if tag == "joint" else EqType.TENDON
            objtype = ObjType.UNKNOWN  # MuJoCo 4 leaves it unset for joint/tendon
            o1 = _lookup(ids, tag, a.get(f"{tag}1"), el, f"{tag}1")
            o2 = _lookup(ids, tag, a[f"{tag}2"], el, f"{tag}2") if a.get(f"{tag}2") else -1
            data[:5] = _get(a, "polycoef", [0, 1, 0, 0, 0])
        else:
            raise UnsupportedFeatureError(f"<{tag}> equality", el.file, el.line, el.path)
        recs.append(dict(name=a.get("name") or "", type=etype, obj1=o1, obj2=o2,
                         objtype=objtype, active=bool(_get(a, "active", True)),
                         solref=a["solref"], solimp=a["solimp"], data=data))
    return recs


# ----------------------------------------------------------------------------- tuples
#: tuple element objtype keyword -> (ObjType, name table of Model.names)
_TUPLE_OBJ = {"body": (ObjType.BODY, "body"), "xbody": (ObjType.XBODY, "body"),
              "joint": (ObjType.JOINT, "joint"), "geom": (ObjType.GEOM, "geom"),
              "site": (ObjType.SITE, "site"), "camera": (ObjType.CAMERA, "camera"),
              "mesh": (ObjType.MESH, "mesh"), "hfield": (ObjType.HFIELD, "hfield"),
              "pair": (ObjType.PAIR, "pair"), "exclude": (ObjType.EXCLUDE, "exclude"),
              "equality": (ObjType.EQUALITY, "equality"),
              "tendon": (ObjType.TENDON, "tendon"),
              "actuator": (ObjType.ACTUATOR, "actuator"),
              "sensor": (ObjType.SENSOR, "sensor"), "numeric": (ObjType.NUMERIC, "numeric"),
              "key": (ObjType.KEY, "key")}


def tuples(els, names):
    """Custom tuples (mjCTuple): (fields, sizes, tuple names) with tuple_adr/size/objtype/
    objid/objprm; objects are found by name in ``names`` (Model.names), a tuple's own
    kind among earlier ones. UnsupportedFeatureError for object types whose names simjax
    does not keep (lights, materials, textures, texts, skins, flexes, plugins)."""
    own = [el.attrs.get("name") or "" for el in els]
    size, otype, oid, prm = [], [], [], []
    for el in els:
        kids = [c for c in el.children if c.tag == "element"]
        if not kids:
            raise el.error(f"tuple '{el.attrs.get('name') or ''}' (id = {len(size)}) is "
                           "empty")
        size.append(len(kids))
        for c in kids:
            kw, name = c.attrs.get("objtype"), c.attrs.get("objname")
            if kw == "tuple":
                table, t = own, ObjType.TUPLE
            elif kw in _TUPLE_OBJ:
                t, key = _TUPLE_OBJ[kw]
                table = names.get(key, [])
            else:
                raise UnsupportedFeatureError(f"tuple element of object type '{kw}'",
                                              c.file, c.line, c.path)
            if name not in table:
                raise c.error(f"unrecognized object '{name}' in tuple {len(size) - 1}")
            otype.append(int(t))
            oid.append(table.index(name))
            prm.append(float(c.attrs.get("prm") or 0.0))
    adr = np.cumsum([0] + size)[:-1].astype(np.int32)
    fields = dict(tuple_adr=adr, tuple_size=np.asarray(size, np.int32),
                  tuple_objtype=np.asarray(otype, np.int32),
                  tuple_objid=np.asarray(oid, np.int32),
                  tuple_objprm=np.asarray(prm, np.float64))
    return fields, len(size), len(otype), own
