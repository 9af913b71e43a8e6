"""MJCF text -> a validated element tree with every attribute resolved.

:func:`parse` reads the model safely (no DTDs, no entities, no network), splices
``<include>`` files, checks every element and attribute against :mod:`simjax.mjcf.schema`
(MuJoCo 4.0's grammar), resolves default classes (``class`` / ``childclass``), expands
actuator shortcuts into general-actuator parameters, and returns :class:`Element` objects
whose ``attrs`` hold typed values for every attribute of the element. Compiler semantics
(angles, orientations, inertias, name lookups) are left to :mod:`simjax.mjcf.compile`.
"""
from __future__ import annotations

import dataclasses
import os
import re
from typing import Any

import numpy as np
from lxml import etree

from simjax import resources
from simjax.errors import MJCFError, UnsupportedFeatureError
from simjax.mjcf import schema
from simjax.mjcf.schema import ELEMENTS, Attr

__all__ = ["Element", "parse"]


@dataclasses.dataclass
class Element:
    """One MJCF element after parsing.

    ``attrs`` holds every attribute of the element's schema: the XML value, else the
    active default class value, else MuJoCo's built-in default (None when undefined).
    ``given`` names the attributes set by the element itself or by its default class.
    ``path`` locates it for error messages, e.g. ``mujoco/worldbody/body[torso]/geom[2]``
    (the name in brackets when named, else the 0-based index among same-tag siblings).
    """

    tag: str
    attrs: dict[str, Any]
    given: frozenset[str]
    children: list["Element"]
    file: str
    line: int
    path: str

    def error(self, msg: str) -> MJCFError:
        """An MJCFError located at this element."""
        return MJCFError(msg, self.file, self.line, self.path)

    def find(self, tag: str) -> list["Element"]:
        """Direct children with the given tag, in document order."""
        return [c for c in self.children if c.tag == tag]

    def walk(self):
        """This element and all its descendants, depth first in document order."""
        yield self
        for c in self.children:
            yield from c.walk()


# ----------------------------------------------------------------------------------------
# Raw XML with includes spliced


@dataclasses.dataclass
class _Raw:
    tag: str
    attrib: dict[str, str]
    children: list["_Raw"]
    file: str
    line: int


_PARSER_OPTS = dict(resolve_entities=False, no_network=True, load_dtd=False, huge_tree=False,
                    remove_comments=True, remove_pis=True, dtd_validation=False)
_DECL = re.compile(rb"<!\s*(DOCTYPE|ENTITY)", re.IGNORECASE)


def _load_xml(data: bytes, file: str):
    """Parse bytes into an lxml root, rejecting DTDs/entities (billion laughs, XXE)."""
    m = _DECL.search(data)
    if m:
        line = data.count(b"\n", 0, m.start()) + 1
        raise MJCFError(f"<!{m.group(1).decode().upper()}> declarations are not allowed in MJCF "
                        "(DTDs and entities are rejected for safety)", file, line)
    parser = etree.XMLParser(**_PARSER_OPTS)
    try:
        root = etree.fromstring(data, parser)
    except etree.XMLSyntaxError as err:
        line = err.lineno if err.lineno else None
        msg = err.msg if hasattr(err, "msg") and err.msg else str(err)
        raise MJCFError(f"malformed XML: {msg}", file, line) from None
    if root is None:
        raise MJCFError("empty XML document", file, 1)
    return root


class _Includer:
    """Builds the raw tree, splicing ``<include>`` files (paths relative to the main
    model's directory; each file at most once)."""

    def __init__(self, model_dir: str, assets):
        self.model_dir = model_dir
        self.assets = assets
        self.seen: set[str] = set()

    def build(self, el, file: str) -> _Raw:
        return _Raw(el.tag, dict(el.attrib), self.children(el, file), file, el.sourceline or 0)

    def children(self, el, file: str) -> list[_Raw]:
        out = []
        for child in el:
            if not isinstance(child.tag, str):
                continue  # comments, entities (already refused), processing instructions
            if child.tag == "include":
                out.extend(self.include(child, file))
            else:
                out.append(self.build(child, file))
        return out

    def include(self, el, file: str) -> list[_Raw]:
        line = el.sourceline
        extra = sorted(set(el.attrib) - {"file"})
        if extra:
            raise MJCFError(f"unknown attribute '{extra[0]}' in element 'include'", file, line,
                            "include")
        name = el.attrib.get("file")
        if not name:
            raise MJCFError("include: required attribute 'file' is missing", file, line,
                            "include")
        if len(el):
            raise MJCFError("include element cannot have children", file, line, "include")
        key = self._key(name)
        if key in self.seen:
            raise MJCFError(f"file '{name}' is included more than once", file, line, "include")
        self.seen.add(key)
        try:
            data = resources.read(name, self.assets, self.model_dir or None)
        except MJCFError as err:
            raise MJCFError(f"could not read included file '{name}': {err.message}", file,
                            line, "include") from None
        shown = key if resources.scheme_of(name) is None else name
        root = _load_xml(data, shown)
        return self.children(root, shown)

    def _key(self, name: str) -> str:
        if resources.scheme_of(name) is not None or os.path.isabs(name):
            return name
        return os.path.normpath(os.path.join(self.model_dir, name)) if self.model_dir else \
            os.path.normpath(name)


# ----------------------------------------------------------------------------------------
# Attribute values


def _num(tok: str, kind: str):
    if kind == "int":
        try:
            return int(tok)
        except ValueError:
            if tok.lower().startswith(("0x", "-0x", "+0x")):
                return int(tok, 16)
            raise
    try:
        val = float(tok)
    except ValueError:
        val = float.fromhex(tok)  # strtod accepts hex floats; raises ValueError otherwise
    if np.isinf(val) and "inf" not in tok.lower():
        raise OverflowError(tok)
    return val


def parse_value(attr: Attr, text: str, current, err):
    """Typed value of ``text`` for ``attr``; partial arrays fill from ``current``.
    ``err(msg)`` builds the exception to raise."""
    name = attr.name
    if attr.kind == "str":
        return text
    if attr.kind == "bool":
        if text not in ("true", "false"):
            raise err(f"invalid keyword '{text}' for attribute '{name}' (expected true or false)")
        return text == "true"
    if attr.kind in ("tfa", "kw"):
        allowed = schema.ENUMS[attr.enum]
        if text not in allowed:
            raise err(f"invalid keyword '{text}' for attribute '{name}' "
                      f"(expected one of: {', '.join(allowed)})")
        return text.lower()
    if attr.kind == "flags":
        allowed = schema.ENUMS[attr.enum]
        for tok in text.split():
            if tok not in allowed:
                raise err(f"invalid keyword '{tok}' in attribute '{name}' "
                          f"(expected any of: {', '.join(allowed)})")
        return " ".join(text.split())
    return _parse_numbers(attr, text, current, err)


def _parse_numbers(attr: Attr, text: str, current, err):
    name = attr.name
    try:
        vals = [_num(tok, attr.kind) for tok in text.split()]
    except OverflowError:
        raise err(f"number is too large in attribute '{name}'") from None
    except ValueError:
        what = "an integer" if attr.kind == "int" else "a number"
        raise err(f"bad format in attribute '{name}': '{text}' is not {what}"
                  + (" list" if attr.array else "")) from None
    n = len(vals)
    if attr.hi != -1 and n > attr.hi:
        raise err(f"attribute '{name}' has too much data: got {n} values, "
                  f"expected at most {attr.hi}")
    dtype = np.float64 if attr.kind == "real" else np.int64
    if attr.hi == -1:
        return np.array(vals, dtype=dtype)
    if not attr.array:
        if n == 0:
            raise err(f"attribute '{name}' does not have enough data: got 0 values, expected 1")
        return vals[0]
    partial = attr.lo < attr.hi
    if n < attr.lo and not (partial and n == 0):
        raise err(f"attribute '{name}' does not have enough data: got {n} values, "
                  f"expected {attr.lo if attr.lo == attr.hi else f'{attr.lo} to {attr.hi}'}")
    if not partial:
        return np.array(vals, dtype=dtype)
    out = np.zeros(attr.hi, dtype) if current is None else np.array(current, dtype=dtype)
    if n == 1 and attr.copy_single:
        out[:] = vals[0]
    else:
        out[:n] = vals
    return out


def _copy(v):
    return v.copy() if isinstance(v, np.ndarray) else v


# ----------------------------------------------------------------------------------------
# Default classes


class _Class:
    """A default class: for each slot (joint, geom, actuator, ...) the attribute values and
    the set of names the class (or an ancestor class) set; plus the kind of its actuator
    (see the actuator-shortcut notes below)."""

    def __init__(self, name: str, parent: "_Class | None"):
        self.name = name
        self.parent = parent
        if parent is None:
            self.slots = {slot: ({k: _copy(a.default) for k, a in ELEMENTS[el].attrs.items()},
                                 set())
                          for slot, el in schema.SLOT_ELEMENT.items()}
            self.kind = "general"
        else:
            self.slots = {slot: ({k: _copy(v) for k, v in vals.items()}, set(given))
                          for slot, (vals, given) in parent.slots.items()}
            self.kind = parent.kind

    def seed(self, tag: str) -> dict:
        """Seeds for shortcut ``tag``: from the nearest class (this one, then ancestors)
        whose actuator kind is ``tag`` or 'general'."""
        cls = self
        while cls is not None:
            if cls.kind in (tag, "general"):
                return _seed(tag, cls.kind == tag, cls.slots["actuator"][0])
            cls = cls.parent
        return _seed(tag, False, _BUILTIN_ACTUATOR)


_BUILTIN_ACTUATOR = {k: _copy(a.default) for k, a in ELEMENTS["general"].attrs.items()}

_DEFAULT_SLOT = {"mesh": "mesh", "material": "material", "texture": "texture", "joint": "joint",
                 "geom": "geom", "site": "site", "camera": "camera", "light": "light",
                 "pair": "pair", "equality": "equality", "tendon": "tendon",
                 **{t: "actuator" for t in schema.ACTUATOR_TAGS}}
# shortcuts whose ``input`` signature is part of what they inherit (not a plain attribute)
_INPUT_SHORTCUTS = ("orientation", "pid", "dcmotor")


class _Parser:
    def __init__(self):
        self.classes: dict[str, _Class] = {}

    # --- defaults ------------------------------------------------------------------------

    def read_defaults(self, root: _Raw):
        """Build every class from the top-level <default> sections (each is 'main')."""
        main = self.classes.setdefault("main", _Class("main", None))
        for raw in root.children:
            if raw.tag == "default":
                self._default(raw, main, "mujoco/default", top=True)

    def _default(self, raw: _Raw, parent: _Class, path: str, top: bool = False):
        spec = ELEMENTS["default"]
        self._check_attrs(raw, spec, path)
        name = raw.attrib.get("class")
        if top:
            if name not in (None, "main"):
                raise self._err(raw, path, f"top-level default class 'main' cannot be renamed "
                                           f"(got '{name}')")
            cls = parent
        else:
            if not name:
                raise self._err(raw, f"{path}/default",
                                "nested default class needs a non-empty 'class' name")
            path = f"{path}/default[{name}]"
            if name in self.classes:
                raise self._err(raw, path, f"repeated default class name '{name}'")
            cls = self.classes[name] = _Class(name, parent)
        self._check_children(raw, spec, path)
        # MuJoCo reads a class's own elements before its nested classes, so a nested class
        # inherits them regardless of document order.
        for child in raw.children:
            if child.tag != "default":
                self._default_element(child, cls, f"{path}/{child.tag}")
        for child in raw.children:
            if child.tag == "default":
                self._default(child, cls, path)

    def _default_element(self, raw: _Raw, cls: _Class, path: str):
        tag = raw.tag
        internal = ELEMENTS["default"].children[tag][0]
        allowed = schema.default_slot_attrs(internal)
        err = self._errf(raw, path)
        for key in raw.attrib:
            if key not in allowed:
                raise err(f"unknown attribute '{key}' in default element '{tag}'")
        vals, given = cls.slots[_DEFAULT_SLOT[tag]]
        if _DEFAULT_SLOT[tag] != "actuator":
            self._apply_xml(raw, allowed, vals, given, err, internal)
            return
        general = ELEMENTS["general"].attrs
        self._apply_xml(raw, {k: a for k, a in allowed.items() if k in general}, vals, given,
                        err, "general")
        own = self._parse_own(raw, tag, allowed, general, err)
        expand_shortcut(tag, vals, given, own, cls.seed(tag), err)
        cls.kind = tag

    # --- elements ------------------------------------------------------------------------

    def convert(self, raw: _Raw, internal: str, path: str, childclass: str) -> Element:
        spec = ELEMENTS[internal]
        if internal != "replicate":       # MuJoCo 4.0 ignores unknown replicate attributes
            self._check_attrs(raw, spec, path)
        err = self._errf(raw, path)
        slot = schema.CLASS_SLOT.get(internal)
        if slot is not None:
            attrs, given = self._from_class(raw, internal, spec, slot, childclass, err)
        else:
            attrs = {k: _copy(a.default) for k, a in spec.attrs.items()}
            given = set()
            self._apply_xml(raw, spec.attrs, attrs, given, err, internal)
        for key, a in spec.attrs.items():
            if a.required and key not in raw.attrib:
                raise err(f"required attribute '{key}' is missing")
        if internal in ("body", "frame", "replicate") and raw.attrib.get("childclass"):
            childclass = self._class_name(raw.attrib["childclass"], err, "childclass")
        children = self._convert_children(raw, spec, path, childclass)
        return Element(raw.tag, attrs, frozenset(given), children, raw.file, raw.line, path)

    def _from_class(self, raw, internal, spec, slot, childclass, err):
        own = raw.attrib.get("class")
        if own is not None:
            cname = self._class_name(own, err, "class")
        elif internal in schema.TREE_CLASSED:
            cname = childclass
        else:
            cname = "main"
        cls = self.classes[cname]
        cvals, cgiven = cls.slots[slot]
        if slot == "actuator":
            return self._actuator(raw, internal, spec, cls, err)
        attrs = {k: _copy(cvals[k]) if k in cvals else _copy(a.default)
                 for k, a in spec.attrs.items()}
        given = {k for k in cgiven if k in spec.attrs}
        self._apply_xml(raw, spec.attrs, attrs, given, err, internal)
        return attrs, given

    def _actuator(self, raw, internal, spec, cls, err):
        general = ELEMENTS["general"].attrs
        cvals, cgiven = cls.slots["actuator"]
        attrs = {k: _copy(cvals[k]) for k in general}
        given = set(cgiven)
        self._apply_xml(raw, {k: a for k, a in spec.attrs.items() if k in general}, attrs,
                        given, err, internal)
        own = self._parse_own(raw, internal, spec.attrs, general, err)
        given.update(own)
        _check_transmission(raw.attrib, err)
        if internal == "actuator_plugin":
            for key in ("plugin", "instance"):
                attrs[key] = raw.attrib.get(key)
        else:
            expand_shortcut(internal, attrs, given, own, cls.seed(internal), err)
        for key in spec.attrs:
            if key not in attrs:
                attrs[key] = own.get(key)   # shortcut parameters: XML value or None
        return attrs, given

    @staticmethod
    def _parse_own(raw, tag, allowed, general, err):
        """Shortcut-specific attributes (kp, kv, timeconst, ...) parsed without defaults;
        the unset tail of a partially given array is NaN (MuJoCo keeps the inherited
        values there). ``input`` counts as own for the shortcuts that inherit it."""
        own = {}
        for key, text in raw.attrib.items():
            extra = key == "input" and tag in _INPUT_SHORTCUTS
            if key in allowed and (key not in general or extra) and key != "class":
                a = allowed[key]
                cur = np.full(a.hi, np.nan) if a.array and 0 < a.lo < a.hi else None
                own[key] = parse_value(a, text, cur, err)
        return own

    def _convert_children(self, raw, spec, path, childclass):
        out, counts = [], {}
        for child in raw.children:
            entry = spec.children.get(child.tag)
            if entry is None:
                raise MJCFError(f"unknown element '{child.tag}' in '{raw.tag}'", child.file,
                                child.line, f"{path}/{child.tag}")
            internal, card = entry
            counts[child.tag] = counts.get(child.tag, 0) + 1
            if card == "?" and counts[child.tag] > 1:
                raise MJCFError(f"element '{child.tag}' may appear at most once in "
                                f"'{raw.tag}'", child.file, child.line, f"{path}/{child.tag}")
            if internal == "default":
                continue  # consumed by read_defaults
            name = child.attrib.get("name")
            index = sum(1 for c in out if c.tag == child.tag)
            cpath = f"{path}/{child.tag}[{name if name else index}]"
            self._check_unsupported(child, internal, cpath)
            out.append(self.convert(child, internal, cpath, childclass))
        return out

    @staticmethod
    def _check_unsupported(raw, internal, path):
        feature = {"composite": "composite (removed in MuJoCo 4.0)", "flexcomp": "flexcomp",
                   "flex": "deformable flex", "equality_flex": "flex equality constraint",
                   "flexstrain": "flexstrain equality constraint"}.get(internal)
        if feature:
            raise UnsupportedFeatureError(feature, raw.file, raw.line, path)

    # --- helpers -------------------------------------------------------------------------

    def _class_name(self, name, err, what):
        if name not in self.classes:
            raise err(f"unknown default class name '{name}' in attribute '{what}'")
        return name

    @staticmethod
    def _apply_xml(raw, allowed, vals, given, err, internal):
        for key, text in raw.attrib.items():
            attr = allowed.get(key)
            if attr is None:
                continue
            if (internal, key) in schema.COPY_SINGLE:
                attr = dataclasses.replace(attr, copy_single=True)
            vals[key] = parse_value(attr, text, vals.get(key), err)
            given.add(key)
        _check_rules(internal, raw.attrib, err)
        _check_values(internal, raw.attrib, vals, err)
        _resolve_orientation(raw.attrib, vals, given, err)

    @staticmethod
    def _check_attrs(raw, spec, path):
        for key in raw.attrib:
            if key not in spec.attrs:
                raise MJCFError(f"unknown attribute '{key}' in element '{raw.tag}'", raw.file,
                                raw.line, path)

    @staticmethod
    def _check_children(raw, spec, path):
        counts = {}
        for child in raw.children:
            entry = spec.children.get(child.tag)
            if entry is None:
                raise MJCFError(f"unknown element '{child.tag}' in '{raw.tag}'", child.file,
                                child.line, f"{path}/{child.tag}")
            counts[child.tag] = counts.get(child.tag, 0) + 1
            if entry[1] == "?" and counts[child.tag] > 1:
                raise MJCFError(f"element '{child.tag}' may appear at most once in "
                                f"'{raw.tag}'", child.file, child.line, f"{path}/{child.tag}")

    def _errf(self, raw, path):
        def err(msg):
            return MJCFError(msg, raw.file, raw.line, path)
        err.path = path
        return err

    def _err(self, raw, path, msg):
        return MJCFError(msg, raw.file, raw.line, path)


# ----------------------------------------------------------------------------------------
# Actuator shortcuts (MuJoCo 4.0 semantics, established by experiment against mujoco 4.0.0).
#
# A default class holds one general actuator plus the "kind" of the last actuator element
# written into it ('general' until a shortcut is). A shortcut (in a class or in <actuator>)
# rewrites the whole dyn/gain/bias prm arrays. Its omitted parameters are seeded from the
# nearest class, walking from the active class up through its ancestors, whose kind is
# this shortcut (all its parameters carry over) or 'general' (some are read back from the
# general prm arrays, see _seed). Other attributes (gear, ranges, ...) always come from the
# active class.

_NPRM = 10
_MUSCLE_DEFAULTS = (0.75, 1.05, -1.0, 200.0, 0.5, 1.6, 1.5, 1.3, 1.2)


def _prm(first=(), fill=0.0):
    out = np.zeros(_NPRM)
    out[:len(first)] = first
    return out


def _seed(tag: str, same: bool, src: dict) -> dict:
    """Parameters of shortcut ``tag`` implied by the source actuator ``src``."""
    g, b, d = src["gainprm"], src["biasprm"], src["dynprm"]
    if tag in ("position", "intvelocity"):
        if same or src["gaintype"] == "fixed":
            tc = d[0] if src["dyntype"] == "filterexact" else None
            return {"kp": g[0], "b2": b[2], "timeconst": tc}
        return {"kp": 1.0, "b2": 0.0, "timeconst": None}
    if tag == "velocity":
        return {"kv": g[0] if same or src["gaintype"] == "fixed" else 1.0}
    if tag == "damper":
        return {"kv": -g[2] if same or src["gaintype"] == "affine" else 0.0}
    if tag == "cylinder":
        return {"timeconst": d[0], "area": g[0], "bias": b[:3].copy()}
    if tag == "adhesion":
        return {"gain": g[0]}
    if tag == "muscle":
        if same:
            return {"gain": g[:9].copy(), "dyn": d[:3].copy()}
        return {"gain": np.array(_MUSCLE_DEFAULTS), "dyn": np.array([0.01, 0.04, 0.0])}
    if tag in _INPUT_SHORTCUTS:
        # read back only from an actuator of the same gain family; else built-in values
        family = {"pid": "pid", "orientation": "so3", "dcmotor": "dcmotor"}[tag]
        match = same or src["gaintype"] == family
        if tag == "pid":
            z = match and src["dyntype"] == "pid"   # controller states only from a pid
            return {"kp": -b[1] if match else 1.0, "b2": b[2] if match else 0.0,
                    "ki": g[0] if z else 0.0, "imax": d[0] if z else 0.0,
                    "slewmax": d[1] if z else 0.0, "input": src["input"] if match else None}
        if tag == "orientation":
            return {"kp": g[0] if match else 1.0, "b2": b[2] if match else 0.0,
                    "input": src["input"] if match else None}
        k = (lambda v: v) if match else (lambda v: 0.0)
        return {"motorconst": [k(g[1]), 0.0], "resistance": k(g[0]), "nominal": [0.0] * 3,
                "saturation": [0.0, 0.0, k(d[1])],
                "controller": [k(g[4]), k(g[5]), k(g[6]), k(d[7]), k(d[8]), k(g[7])],
                "inductance": [0.0, k(d[0])], "cogging": [k(b[0]), k(b[1]), k(b[2])],
                "thermal": [k(d[2]), k(d[3]), 0.0, k(g[2]), k(g[3]), k(d[4])],
                "lugre": [k(d[5]), k(d[6]), k(b[3]), k(b[4]), k(b[5])],
                "input": src["input"] if match else None}
    return {}


def _write(act, given, dyn, gain, bias, dynprm, gainprm, biasprm):
    act.update(dyntype=dyn, gaintype=gain, biastype=bias, dynprm=dynprm, gainprm=gainprm,
               biasprm=biasprm)
    given.update(("dyntype", "gaintype", "biastype", "dynprm", "gainprm", "biasprm"))


def _servo(tag, act, given, own, seed, err):
    """position / intvelocity: gain kp, bias [0, -kp, -kv | +dampratio]."""
    b2 = _damping_b2(own, seed["b2"], err)
    kp = own.get("kp", seed["kp"])
    timeconst = own.get("timeconst", seed["timeconst"])
    if timeconst is not None and timeconst < 0:
        raise err("timeconst cannot be negative")
    dyn = "filterexact" if timeconst else "none"
    dynprm = _prm([1.0 if timeconst is None else timeconst])
    if tag == "intvelocity":
        dyn = "integrator"
    _write(act, given, dyn, "fixed", "affine", dynprm, _prm([kp]), _prm([0.0, -kp, b2]))
    if act["inheritrange"] > 0:
        if act["ctrlrange"][0] or act["ctrlrange"][1]:
            raise err("ctrlrange and inheritrange cannot both be defined")
        if tag == "intvelocity" and (act["actrange"][0] or act["actrange"][1]):
            raise err("actrange and inheritrange cannot both be defined")


def _muscle(act, given, own, seed, err):
    gain, dyn = seed["gain"], seed["dyn"]
    tausmooth = own.get("tausmooth", dyn[2])
    if tausmooth < 0:
        raise err("muscle tausmooth cannot be negative")
    dyn[2] = tausmooth
    # as in MuJoCo, negative values stand for "not given" and keep the seeded value
    for key, dst, idx in (("timeconst", dyn, (0, 1)), ("range", gain, (0, 1))):
        if key in own:
            for i, j in enumerate(idx):
                if own[key][i] >= 0:
                    dst[j] = own[key][i]
    for i, key in enumerate(("force", "scale", "lmin", "lmax", "vmax", "fpmax", "fvmax")):
        if own.get(key, -1) >= 0:
            gain[2 + i] = own[key]
    _write(act, given, "muscle", "muscle", "muscle", _prm(dyn), _prm(gain), _prm(gain))


def _limit_ctrl(act, given, what, err):
    act["ctrllimited"] = "true"
    given.add("ctrllimited")
    if act["ctrlrange"][0] < 0 or act["ctrlrange"][1] < 0:
        raise err(f"{what} control range cannot be negative")


def expand_shortcut(tag: str, act: dict, given: set, own: dict, seed: dict, err) -> None:
    """Rewrite the general actuator ``act`` (in place) as shortcut ``tag`` with its own XML
    parameters ``own`` and seeds from :func:`_seed`; ``given`` collects touched names."""
    one = _prm([1.0])
    if tag not in ("general", "dcmotor"):
        # general-only settings a class may hold do not carry into shortcuts (MuJoCo 4.0)
        act.update(actearly=False, actdim=-1)
        given.difference_update(("actearly", "actdim"))
    if tag == "motor":
        _write(act, given, "none", "fixed", "none", one, one.copy(), _prm())
    elif tag in ("position", "intvelocity"):
        _servo(tag, act, given, own, seed, err)
    elif tag == "velocity":
        kv = own.get("kv", seed["kv"])
        _write(act, given, "none", "fixed", "affine", one, _prm([kv]), _prm([0, 0, -kv]))
    elif tag == "damper":
        kv = own.get("kv", seed["kv"])
        if kv < 0:
            raise err("damping coefficient cannot be negative")
        _write(act, given, "none", "affine", "none", one, _prm([0, 0, -kv]), _prm())
        _limit_ctrl(act, given, "damper", err)
    elif tag == "cylinder":
        area = own.get("area", seed["area"])
        if own.get("diameter", -1) >= 0:
            area = np.pi / 4 * own["diameter"] ** 2
        _write(act, given, "filter", "fixed", "affine",
               _prm([own.get("timeconst", seed["timeconst"])]), _prm([area]),
               _prm(own.get("bias", seed["bias"])))
    elif tag == "muscle":
        _muscle(act, given, own, seed, err)
    elif tag == "adhesion":
        gain = own.get("gain", seed["gain"])
        if gain < 0:
            raise err("adhesion gain cannot be negative")
        _write(act, given, "none", "fixed", "none", one, _prm([gain]), _prm())
        _limit_ctrl(act, given, "adhesion", err)
    elif tag == "orientation":
        _orientation(act, given, own, seed, err)
    elif tag == "pid":
        _pid(act, given, own, seed, err)
    elif tag == "dcmotor":
        _dcmotor(act, given, own, seed, err)
    elif tag != "general":
        raise err(f"unsupported actuator type '{tag}'")


def _damping_b2(own, b2, err):
    """biasprm[2] from kv (stored negated) or dampratio (stored positive, resolved by the
    compiler against the reflected inertia)."""
    kv, dampratio = own.get("kv"), own.get("dampratio")
    if kv is not None and dampratio is not None:
        raise err("kv and dampratio cannot both be defined")
    if kv is not None:
        if kv < 0:
            raise err("kv cannot be negative")
        b2 = -kv
    if dampratio is not None:
        if dampratio < 0:
            raise err("dampratio cannot be negative")
        b2 = dampratio
    return b2


def _set_input(act, given, own, seed):
    act["input"] = own.get("input", seed["input"])
    given.add("input")


def _orientation(act, given, own, seed, err):
    """Geodesic SO(3) servo: gain so3 [kp], bias so3 [0, -kp, -kv | +dampratio]."""
    b2 = _damping_b2(own, seed["b2"], err)
    kp = own.get("kp", seed["kp"])
    _write(act, given, "none", "so3", "so3", _prm([1.0]), _prm([kp]), _prm([0.0, -kp, b2]))
    _set_input(act, given, own, seed)


def _pid(act, given, own, seed, err):
    """PID servo: kp in -biasprm[1], kv/dampratio in biasprm[2], ki in gainprm[0], imax
    and slewmax in dynprm[0:2]; dyntype pid when ki or slewmax (controller states)."""
    b2 = _damping_b2(own, seed["b2"], err)
    kp = own.get("kp", seed["kp"])
    ki = own.get("ki", seed["ki"])
    imax = own.get("imax", seed["imax"])
    slew = own.get("slewmax", seed["slewmax"])
    if slew < 0:
        raise err("slewmax cannot be negative")
    if "posrange" in own:           # posrange is the position input's ctrlrange
        act["ctrlrange"] = np.array(own["posrange"], dtype=np.float64)
        given.add("ctrlrange")
    dyn = "pid" if (ki or slew) else "none"
    _write(act, given, dyn, "pid", "affine", _prm([imax if ki else 0.0, slew]), _prm([ki]),
           _prm([0.0, -kp, b2]))
    _set_input(act, given, own, seed)
    if act["inheritrange"] > 0 and (act["ctrlrange"][0] or act["ctrlrange"][1]):
        raise err("posrange and inheritrange cannot both be defined")


def _merged(own, seed, key):
    """Seed values overwritten by the given leading entries of a partial array."""
    out = np.array(seed[key], dtype=np.float64)
    if key in own:
        v = np.asarray(own[key], dtype=np.float64)[:len(out)]
        out[:len(v)] = np.where(np.isnan(v), out[:len(v)], v)
    return out


def _dcmotor(act, given, own, seed, err):
    """DC motor (mjs_setToDCMotor semantics): motor constant K, resistance R, optional
    electrical, controller, thermal and LuGre states; saturation sets forcerange."""
    mc = _merged(own, seed, "motorconst")
    R = own.get("resistance", seed["resistance"])
    vn, tau0, omega0 = _merged(own, seed, "nominal")
    sat = _merged(own, seed, "saturation")
    ind = _merged(own, seed, "inductance")
    cog = _merged(own, seed, "cogging")
    ctl = _merged(own, seed, "controller")
    th = _merged(own, seed, "thermal")
    lu = _merged(own, seed, "lugre")
    kt, ke = mc
    if vn > 0 and ke <= 0 and omega0 > 0:
        # back-EMF constant from the no-load speed omega0 = vn Ke / (Ke^2 + R B)
        B = float(np.atleast_1d(act["damping"])[0]) if act.get("damping") is not None else 0.0
        if B > 0 and R > 0:
            disc = vn * vn - 4 * R * B * omega0 * omega0
            ke = (vn + np.sqrt(disc)) / (2 * omega0) if disc > 0 else vn / omega0
        elif B > 0 and tau0 > 0:
            exact = vn / omega0 - vn * B / tau0
            ke = exact if exact > 0 else vn / omega0
        else:
            ke = vn / omega0
    K = np.sqrt(kt * ke) if (kt > 0 and ke > 0) else kt if kt > 0 else ke
    if R == 0 and vn > 0 and tau0 > 0 and K > 0:
        R = K * vn / tau0
    if K <= 0:
        raise err("DC motor: motor constant K must be positive")
    if R <= 0:
        raise err("DC motor: resistance R must be positive")
    gain, dyn, bias = _prm([R, K]), _prm(), _prm(cog)
    gain[4:7] = ctl[:3]
    dyn[7:9] = ctl[3:5]
    if ctl[5] > 0:
        gain[7] = ctl[5]
    if sat[0] > 0 or sat[1] > 0:
        tmax = sat[0] if sat[0] != 0 or sat[1] <= 0 else K * sat[1]
        act["forcerange"] = np.array([-tmax, tmax])
        act["forcelimited"] = "true"
        given.update(("forcerange", "forcelimited"))
    if sat[2] > 0:
        dyn[1] = sat[2]
    if ind[0] < 0:
        raise err("DC motor: inductance must be non-negative")
    if ind[1] < 0:
        raise err("DC motor: electrical time constant must be non-negative")
    te = ind[0] / R if ind[0] > 0 else ind[1]
    dyn[0] = te
    actdim = int(te > 0) + int(ctl[3] > 0) + int(ctl[1] > 0)
    if th[0] > 0 or th[1] > 0 or th[2] > 0:
        rt, c, tth = th[:3]
        if tth > 0 and rt > 0 and c == 0:
            c = tth / rt
        elif tth > 0 and c > 0 and rt == 0:
            rt = tth / c
        if rt <= 0:
            raise err("DC motor: thermal resistance must be positive")
        if c <= 0:
            raise err("DC motor: thermal capacitance must be positive")
        dyn[2:5] = rt, c, th[5]
        gain[2:4] = th[3:5]
        actdim += 1
    if lu[0] > 0:
        dyn[5:7] = lu[:2]
        bias[3:6] = lu[2:5]
        actdim += 1
    _write(act, given, "dcmotor", "dcmotor", "dcmotor", dyn, gain, bias)
    _set_input(act, given, own, seed)
    act.update(actdim=actdim, actlimited="false", actearly=True)
    given.update(("actdim", "actlimited", "actearly"))



def _check_rules(internal: str, attrib: dict, err) -> None:
    """MuJoCo's presence rules (schema.RULES) over the attributes written on the element."""
    for kind, bundles in schema.RULES.get(internal, ()):
        shown = " / ".join("+".join(b) for b in bundles)
        if kind == "exclusive":
            if sum(any(a in attrib for a in b) for b in bundles) > 1:
                raise err(f"at most one of {shown} may be given")
        elif kind == "oneof":
            if not any(all(a in attrib for a in b) for b in bundles):
                raise err(f"one of {shown} is required")
        elif kind == "requires":
            if bundles[0][0] in attrib and bundles[1][0] not in attrib:
                raise err(f"attribute '{bundles[0][0]}' requires '{bundles[1][0]}'")
        elif kind == "together":
            if 0 < sum(b[0] in attrib for b in bundles) < len(bundles):
                raise err(f"attributes {shown} must be given together")


_SERVO_INPUTS = ("pos", "vel", "ff", "voltage")
_MEMORY = re.compile(r"^\s*\d+\s*[KMGTPE]?\s*$")


def _check_values(internal: str, attrib: dict, vals: dict, err) -> None:
    """Value checks MuJoCo's reader makes beyond the types (only where MuJoCo rejects at
    XML time; physical validity is the compiler's job)."""
    if internal == "compiler" and vals.get("coordinate") == "global" and "coordinate" in attrib:
        raise err("compiler coordinate='global' is no longer supported by MuJoCo")
    if internal == "size" and "memory" in attrib and not _MEMORY.match(attrib["memory"]):
        raise err(f"attribute 'memory' must be an unsigned integer with an optional "
                  f"K/M/G/T/P/E suffix, got '{attrib['memory']}'")
    if internal == "mesh":
        if "maxhullvert" in attrib and vals["maxhullvert"] != -1 and vals["maxhullvert"] < 4:
            raise err("mesh maxhullvert must be -1 or larger than 3")
        if "builtin" in attrib and "params" not in attrib:
            raise err("mesh attribute 'builtin' requires 'params'")
    if internal == "texture" and "gridlayout" in attrib:
        rows, cols = vals["gridsize"]
        if len(attrib["gridlayout"]) != rows * cols:
            raise err("texture gridlayout length must equal the product of gridsize")
    if internal == "numeric" and vals["size"] <= 0 and "data" not in attrib:
        raise err("custom numeric needs a positive 'size' or 'data'")
    if "input" in attrib and internal in ("general", "pid", "dcmotor"):
        _check_input(attrib["input"], err)


def _check_input(text: str, err) -> None:
    """Actuator ``input``: an so3 chart (expmap, quat), 'none', or servo input tokens in
    the canonical order pos, vel, ff, voltage."""
    tokens = text.split()
    if len(tokens) == 1 and tokens[0] in ("expmap", "quat", "none"):
        return
    if not tokens or any(t not in _SERVO_INPUTS for t in tokens):
        raise err(f"invalid keyword in attribute 'input': '{text}' (expected expmap, quat, "
                  f"none, or a subset of: {', '.join(_SERVO_INPUTS)})")
    order = [_SERVO_INPUTS.index(t) for t in tokens]
    if order != sorted(set(order)):
        raise err("actuator inputs must be listed in the order pos, vel, ff, voltage")


def _resolve_orientation(attrib: dict, vals: dict, given: set, err) -> None:
    """At most one orientation specifier per element; the element's own one replaces any
    specifier inherited from its default class (as MuJoCo does)."""
    if "xyaxes" not in vals:
        return
    own = [k for k in schema.ORIENTATION if k in attrib]
    if len(own) > 1:
        raise err(f"multiple orientation specifiers are not allowed ({', '.join(own)})")
    if own:
        for key in schema.ORIENTATION:
            if key != own[0]:
                vals[key] = None
                given.discard(key)


def _check_transmission(attrib, err):
    """MuJoCo's reader checks: slider-crank-only and site-only companion attributes."""
    targets = [k for k in ("joint", "jointinparent", "tendon", "cranksite", "site", "body")
               if k in attrib]
    trn = targets[-1] if targets else None
    if ("cranklength" in attrib or "slidersite" in attrib) and trn not in (None, "cranksite"):
        raise err("cranklength and slidersite can only be used in slidercrank transmission")
    if "refsite" in attrib and trn not in (None, "site"):
        raise err("refsite can only be used with site transmission")


# ----------------------------------------------------------------------------------------


def _read_main(source: str, assets):
    if source.lstrip().startswith("<"):
        return source.encode("utf-8"), "<string>", ""
    data = resources.read(source, assets, None)
    return data, source, resources.getdir(source)


def parse(source: str, assets: dict | None = None) -> tuple[Element, str]:
    """Parse an MJCF model.

    ``source``: a file path (or resource name) or an XML string (starts with '<' after
    whitespace). ``assets``: optional in-memory files (name -> bytes) consulted before the
    file system, for the model itself, includes and (later) meshes. Returns the root
    'mujoco' :class:`Element` and the model directory ('' for strings). Raises
    :class:`MJCFError` (file, line, element path) on any invalid input, and
    :class:`UnsupportedFeatureError` for features simjax does not implement.
    """
    data, file, model_dir = _read_main(source, assets)
    root_xml = _load_xml(data, file)
    includer = _Includer(model_dir, assets)
    root = includer.build(root_xml, file)
    if root.tag != "mujoco":
        raise MJCFError(f"root element must be 'mujoco', found '{root.tag}'", file, root.line,
                        root.tag)
    parser = _Parser()
    parser.read_defaults(root)
    return parser.convert(root, "mujoco", "mujoco", "main"), model_dir
