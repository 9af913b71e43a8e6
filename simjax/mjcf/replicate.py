"""The ``<replicate>`` meta-element, expanded on the parsed tree before compiling.

MuJoCo's reader parses a replicate's children into a temporary subtree, attaches it
``count`` times to the parent (mjs_attach with a name suffix) and deletes the original
(xml_native_reader.cc; mjCModel's attach and delete, user_model.cc / user_objects.cc).
simjax rewrites the tree the same way:

- **Tree elements**: replica i is a ``frame`` at the accumulated offset (position
  ``sum_k<i R(k euler) offset``, orientation ``i euler``, resolved with the compiler's
  angle and eulerseq) holding copies of the children whose names (bodies, joints,
  geoms, sites, cameras, lights, frames) and camera/light targets get the suffix
  ``sep`` + i (zero-padded to the digits of ``count``). Nested replicates expand
  first, so the innermost suffix comes first.
- **Elements outside the tree** (pairs, excludes, tendons, equalities, actuators,
  sensors): after each replica, every element then in a list is copied with the suffix
  on its name and its references, per MuJoCo's rules for each kind (a pair, exclude or
  sensor with two references falls back to the plain name on one side; a tendon's
  wraps fall back one by one, and it is copied when at least one wrap took the
  suffix; equalities and actuators take the suffix on every reference). A copy whose
  references do not all exist at that point (the tree elements read so far in
  document order, the replicas made so far) is not made. Copies append to their
  list; the list is the one at the start of the replica (so an element without
  references, a clock sensor say, is copied again at every replica, as MuJoCo does).
- **Deleting the template**: an element whose references all existed before the
  deletion and no longer do is removed; one that did not resolve before (it names an
  element later in the document) is kept, and fails later if it names the template.

Keyframes are left as written (MuJoCo neither replicates nor renames them). Plugin
instances and custom tuples in a model with replicates raise UnsupportedFeatureError.
"""
from __future__ import annotations

import copy

import numpy as np

from simjax.errors import UnsupportedFeatureError
from simjax.mjcf import orientation as ori

#: tree element tag -> name kind
_TREE_KIND = {"body": "body", "joint": "joint", "freejoint": "joint", "geom": "geom",
              "site": "site", "camera": "camera", "light": "light", "frame": "frame"}
#: list sections in MuJoCo's copy and removal order, with their element tags
_LISTS = (("pair", "contact", ("pair",)), ("exclude", "contact", ("exclude",)),
          ("tendon", "tendon", ("spatial", "fixed")),
          ("equality", "equality", ("connect", "weld", "joint", "tendon", "flex")),
          ("actuator", "actuator", None), ("sensor", "sensor", None))
#: actuator transmission attributes -> kind
_ACT_REFS = {"joint": "joint", "jointinparent": "joint", "tendon": "tendon", "site": "site",
             "body": "body", "cranksite": "site", "slidersite": "site", "refsite": "site"}
_FRAME_ATTRS = ("name", "childclass", "pos", "quat", "axisangle", "euler", "xyaxes",
                "zaxis", "scaling", "massscale")
_FRAME_KIND = {"body": "body", "xbody": "body", "geom": "geom", "site": "site",
               "camera": "camera"}


def expand(root, settings, model_dir="", assets=None):
    """Expand every ``replicate`` and ``attach`` of the parsed tree ``root`` in place, in
    document order (see the module docstring and :mod:`simjax.mjcf.attach`).
    ``settings``: the model's compiler settings; ``model_dir`` / ``assets``: where
    attached models' files are read. Raises UnsupportedFeatureError for plugin instances
    or custom tuples in a model with replicates."""
    worlds = [s for s in root.children if s.tag == "worldbody"]
    if not any(_has_meta(w, ("replicate", "attach")) for w in worlds):
        return root
    if any(_has_meta(w, ("replicate",)) for w in worlds):
        _check_supported(root)
    state = _State(root, settings, model_dir, assets)
    for w in worlds:
        state.walk(w)
    return root


def _has_meta(el, tags):
    return any(c.tag in tags or _has_meta(c, tags) for c in el.children)


def _check_supported(root):
    for sec in root.children:
        for el in sec.children:
            if sec.tag == "custom" and el.tag == "tuple":
                raise UnsupportedFeatureError("custom tuples in a model with <replicate>",
                                              el.file, el.line, el.path)
            if sec.tag in ("actuator", "sensor", "extension") and el.tag in ("plugin",):
                raise UnsupportedFeatureError("plugins in a model with <replicate>",
                                              el.file, el.line, el.path)


def frame_element(like, pos, quat, children):
    """A ``frame`` element at ``pos`` / ``quat`` holding ``children`` (located where
    ``like`` is, for error messages)."""
    frame = copy.copy(like)
    frame.tag = "frame"
    frame.attrs = dict.fromkeys(_FRAME_ATTRS)
    frame.attrs.update(pos=pos, quat=quat, scale=np.ones(3))
    frame.given = frozenset(("pos", "quat"))
    frame.children = children
    return frame


def new_section(root, tag, first=False):
    """A new empty top-level ``tag`` section of ``root`` (at its end, or first)."""
    sec = copy.copy(root)
    sec.tag, sec.attrs, sec.given, sec.children = tag, {}, frozenset(), []
    sec.path = f"{root.path}/{tag}"
    root.children.insert(0 if first else len(root.children), sec)
    return sec


def list_items(root):
    """{kind: elements} of the lists outside the tree that replicate and attach copy
    (pairs, excludes, tendons, equalities, actuators, sensors), in document order."""
    out = {}
    for kind, section, tags in _LISTS:
        out[kind] = [e for s in root.children if s.tag == section for e in s.children
                     if tags is None or e.tag in tags]
    return out


def _suffix(sep, count, i):
    """``sep`` and i zero-padded to the digits of ``count`` (UpdateString: 10 replicas
    are numbered 00 to 09)."""
    digits = len(str(count))
    return f"{sep}{i:0{digits}d}"


class _State:
    """Names defined so far (document order) and the element lists being replicated."""

    def __init__(self, root, settings, model_dir, assets):
        self.root, self.settings = root, settings
        self.to_rad, self.eulerseq = settings.to_rad, settings.eulerseq
        self.model_dir, self.assets = model_dir, assets
        self.children_models = {}         # attached model name -> parsed child
        self.names = {k: set() for k in ("body", "joint", "geom", "site", "camera",
                                         "light", "frame", "tendon", "actuator", "mesh")}
        self.names["body"].add("world")
        self.lists = {}
        for kind, section, _ in _LISTS:
            secs = [s for s in root.children if s.tag == section]
            self.lists[kind] = (secs, list_items(root)[kind])
        for el in self.lists["tendon"][1]:
            self._add_name("tendon", el)
        for el in self.lists["actuator"][1]:
            self._add_name("actuator", el)
        for sec in root.children:
            if sec.tag == "asset":
                for el in sec.children:
                    if el.tag == "mesh" and el.attrs.get("name"):
                        self.names["mesh"].add(el.attrs["name"])

    def _add_name(self, kind, el):
        name = el.attrs.get("name")
        if name:
            self.names[kind].add(name)

    # ------------------------------------------------------------------ the tree
    def walk(self, el):
        """Visit ``el``'s children in document order, recording names and expanding
        replicates in place."""
        out = []
        for ch in el.children:
            if ch.tag == "replicate":
                out.extend(self._replicate(ch))
                continue
            if ch.tag == "attach":
                from simjax.mjcf import attach
                out.append(attach.attach(self, ch))
                continue
            if ch.tag in _TREE_KIND:
                self._add_name(_TREE_KIND[ch.tag], ch)
            if ch.tag in ("body", "frame"):
                self.walk(ch)
            out.append(ch)
        el.children[:] = out

    def _replicate(self, rep):
        a = rep.attrs
        count = int(a["count"])           # MuJoCo 4.0 accepts 0 or less: no replicas
        self.walk(rep)                    # nested replicates first, template names noted
        template = tree_names(rep.children)
        offset = np.asarray(a.get("offset") if a.get("offset") is not None else np.zeros(3),
                            np.float64)
        euler = np.asarray(a.get("euler") if a.get("euler") is not None else np.zeros(3),
                           np.float64)
        pos = np.zeros(3)
        frames = []
        for i in range(count):
            # the orientation from i times the angles (as MuJoCo, for precision); the
            # position accumulated through the previous replicas' orientations
            quat = ori.euler_quat(i * euler, self.eulerseq, self.to_rad)
            suffix = _suffix(a.get("sep") or "", count, i)
            kids = [renamed(c, lambda n, s=suffix: n + s) for c in rep.children]
            frame = frame_element(rep, pos.copy(), quat, kids)
            for k, names in tree_names(kids).items():
                self.names[k] |= names
            # the template's bodies forget attached keyframes once copied: only the first
            # replica keeps them (mjCBody::operator+=, ForgetKeyframes)
            forget_bodies(rep.children)
            self._copy_lists(lambda n, s=suffix: n + s)
            frames.append(frame)
            pos = pos + ori.rotate(quat, offset)
        for k, names in template.items():
            self.names[k] -= names
        self._remove(template)
        return frames

    # ------------------------------------------------------------------ the lists
    def _copy_lists(self, ren, source=None, post=None):
        """Append the copies (names renamed by ``ren``, then passed to ``post``) of the
        elements of every list (those of ``source``, another model's lists, else this
        model's) whose renamed references resolve (mjCModel::CopyList)."""
        for kind, _, _ in _LISTS:
            secs, items = self.lists[kind]
            for el in list(source[kind] if source is not None else items):
                new = _COPY[kind](self, el, ren)
                if new is None:
                    continue
                if post is not None:
                    post(new)
                if hasattr(el, "keystore"):   # the copied source forgets its keyframes
                    el.keystore = {}
                items.append(new)
                self._section(kind).children.append(new)
                if kind in ("tendon", "actuator"):
                    self._add_name(kind, new)

    def _remove(self, template):
        before = {k: v | template.get(k, set()) for k, v in self.names.items()}
        for kind, _, _ in _LISTS:
            secs, items = self.lists[kind]
            keep = []
            for el in items:
                if _RESOLVES[kind](before, el) and not _RESOLVES[kind](self.names, el):
                    for s in secs:        # by identity (Elements compare by value)
                        s.children[:] = [c for c in s.children if c is not el]
                    if kind in ("tendon", "actuator") and el.attrs.get("name"):
                        self.names[kind].discard(el.attrs["name"])
                    continue
                keep.append(el)
            items[:] = keep

    def _section(self, kind):
        """The last section holding list ``kind`` (a new one at the end of the model if
        there is none)."""
        secs, _ = self.lists[kind]
        if not secs:
            secs.append(new_section(self.root, next(s for k, s, _ in _LISTS if k == kind)))
        return secs[-1]

    def _has(self, kind, name):
        return name in self.names[kind]


# ---------------------------------------------------------------------- tree renaming
def tree_names(children):
    out = {}
    for el in children:
        if el.tag in _TREE_KIND and el.attrs.get("name"):
            out.setdefault(_TREE_KIND[el.tag], set()).add(el.attrs["name"])
        for k, v in tree_names(el.children).items():
            out.setdefault(k, set()).update(v)
    return out


def forget_bodies(children):
    """ForgetKeyframes of the bodies among ``children`` (through frames) and of their
    subtrees: their attached keyframe values are cleared."""
    for c in children:
        if c.tag == "body":
            _forget(c)
        elif c.tag == "frame":
            forget_bodies(c.children)


def _forget(el):
    if hasattr(el, "keystore"):
        el.keystore = {}
    for c in el.children:
        _forget(c)


#: asset references of tree elements (renamed when another model is attached)
_ASSET_REFS = {"geom": ("mesh", "material", "hfield"), "site": ("material",),
               "light": ("texture",)}


def renamed(el, ren, asset_ren=None):
    """Deep copy of a tree element with its name and a camera's or light's target body
    renamed by ``ren`` (and its asset references by ``asset_ren`` when given), throughout
    its subtree."""
    new = copy.copy(el)
    new.attrs = dict(el.attrs)
    if el.tag in _TREE_KIND:
        if new.attrs.get("name"):
            new.attrs["name"] = ren(new.attrs["name"])
        if el.tag in ("camera", "light") and new.attrs.get("target"):
            new.attrs["target"] = ren(new.attrs["target"])
        for key in _ASSET_REFS.get(el.tag, ()) if asset_ren else ():
            if new.attrs.get(key):
                new.attrs[key] = asset_ren(new.attrs[key])
    if hasattr(el, "keystore"):          # an attached model's keyframe values
        new.keystore = {k: dict(v) for k, v in el.keystore.items()}
    new.children = [renamed(c, ren, asset_ren) for c in el.children]
    return new


# ---------------------------------------------------------------------- list copies
def _with(el, ren, **refs):
    """Copy of a list element with its name renamed by ``ren`` and ``refs`` set."""
    new = copy.copy(el)
    new.attrs = dict(el.attrs)
    if new.attrs.get("name"):
        new.attrs["name"] = ren(new.attrs["name"])
    new.attrs.update(refs)
    new.children = [copy.copy(c) for c in el.children]
    if hasattr(el, "keystore"):
        new.keystore = {k: dict(v) for k, v in el.keystore.items()}
    return new


def _two_sided(st, el, ren, side1, side2):
    """Copy of an element with two references ((attribute, kind) each): both take the
    suffix, or one keeps its plain name when only the other exists suffixed (MuJoCo's
    fallback for pairs, excludes and sensors); None when they do not resolve."""
    (a1, k1), (a2, k2) = side1, side2
    n1, n2 = el.attrs.get(a1), el.attrs.get(a2)
    if n1 is None or n2 is None:
        return None
    s1, s2 = ren(n1), ren(n2)
    ok1, ok2 = st._has(k1, s1), st._has(k2, s2)
    if not ok1 and ok2:
        s1, ok1 = n1, st._has(k1, n1)
    if ok1 and not ok2:
        s2, ok2 = n2, st._has(k2, n2)
    return _with(el, ren, **{a1: s1, a2: s2}) if ok1 and ok2 else None


def _copy_pair(st, el, ren):
    return _two_sided(st, el, ren, ("geom1", "geom"), ("geom2", "geom"))


def _copy_exclude(st, el, ren):
    return _two_sided(st, el, ren, ("body1", "body"), ("body2", "body"))


_WRAP_KIND = {"joint": "joint", "site": "site", "geom": "geom"}


def _copy_tendon(st, el, ren):
    new = _with(el, ren)
    nfail = nwrap = 0
    for w in new.children:
        if w.tag not in _WRAP_KIND:
            continue                      # pulleys
        nwrap += 1
        w.attrs = dict(w.attrs)
        name, side = w.attrs.get(w.tag), w.attrs.get("sidesite")
        if st._has(_WRAP_KIND[w.tag], ren(name)) and (
                not side or st._has("site", ren(side))):
            w.attrs[w.tag] = ren(name)
            if side:
                w.attrs["sidesite"] = ren(side)
            continue
        if not st._has(_WRAP_KIND[w.tag], name) or (side and not st._has("site", side)):
            return None
        nfail += 1
    return None if nfail == nwrap else new


def _eq_refs(el):
    """(attribute, kind) of an equality's references."""
    t = el.tag
    if t in ("connect", "weld"):
        if el.attrs.get("site1") is not None:
            return (("site1", "site"), ("site2", "site"))
        return (("body1", "body"), ("body2", "body"))
    if t == "joint":
        return (("joint1", "joint"), ("joint2", "joint"))
    if t == "tendon":
        return (("tendon1", "tendon"), ("tendon2", "tendon"))
    return ()


def _copy_all_refs(refs_of):
    def copy_el(st, el, ren):
        refs = {}
        for attr, kind in refs_of(el):
            n = el.attrs.get(attr)
            if not n:
                continue
            if not st._has(kind, ren(n)):
                return None
            refs[attr] = ren(n)
        return _with(el, ren, **refs)
    return copy_el


def _act_refs(el):
    return tuple((k, v) for k, v in _ACT_REFS.items() if el.attrs.get(k))


def _sensor_refs(el):
    """((attr, kind) of the sensed object or None, (attr, kind) of the reference or
    None), as MuJoCo's reader fills the sensor's objname and refname."""
    a, t = el.attrs, el.tag
    if t in ("framepos", "framequat", "framexaxis", "frameyaxis", "framezaxis",
             "framelinvel", "frameangvel", "framelinacc", "frameangacc", "user"):
        obj = ("objname", _FRAME_KIND.get(a.get("objtype"), "body")) \
            if a.get("objname") else None
        ref = ("refname", _FRAME_KIND.get(a.get("reftype"), "body")) \
            if a.get("refname") else None
        return obj, ref
    if t == "insidesite":
        return ("objname", _FRAME_KIND.get(a.get("objtype"), "body")), ("site", "site")
    if t == "tactile":
        return ("mesh", "mesh"), ("geom", "geom")
    if t == "camprojection":
        return ("site", "site"), ("camera", "camera")
    sides = {"geom1": "geom", "body1": "body", "subtree1": "body", "site": "site",
             "joint": "joint", "tendon": "tendon", "actuator": "actuator", "body": "body",
             "camera": "camera"}
    obj = next(((k, v) for k, v in sides.items() if a.get(k)), None)
    ref = next(((k, v) for k, v in {"geom2": "geom", "body2": "body",
                                    "subtree2": "body"}.items() if a.get(k)), None)
    return obj, ref


def _copy_sensor(st, el, ren):
    obj, ref = _sensor_refs(el)
    if obj and ref:
        return _two_sided(st, el, ren, obj, ref)
    refs = {}
    for r in (obj, ref):
        if r is None:
            continue
        n = ren(el.attrs[r[0]])
        if not st._has(r[1], n):
            return None
        refs[r[0]] = n
    return _with(el, ren, **refs)


_COPY = {"pair": _copy_pair, "exclude": _copy_exclude, "tendon": _copy_tendon,
         "equality": _copy_all_refs(_eq_refs), "actuator": _copy_all_refs(_act_refs),
         "sensor": _copy_sensor}


# ---------------------------------------------------------------------- resolution
def _all_exist(names, refs, el):
    return all(not el.attrs.get(attr) or el.attrs[attr] in names[kind]
               for attr, kind in refs)


def _resolves_tendon(names, el):
    return all(w.attrs.get(w.tag) in names[_WRAP_KIND[w.tag]] and (
        not w.attrs.get("sidesite") or w.attrs["sidesite"] in names["site"])
        for w in el.children if w.tag in _WRAP_KIND)


def _resolves_sensor(names, el):
    return _all_exist(names, [r for r in _sensor_refs(el) if r], el)


_RESOLVES = {
    "pair": lambda names, el: _all_exist(names, (("geom1", "geom"), ("geom2", "geom")), el),
    "exclude": lambda names, el: _all_exist(names, (("body1", "body"), ("body2", "body")),
                                            el),
    "tendon": _resolves_tendon,
    "equality": lambda names, el: _all_exist(names, _eq_refs(el), el),
    "actuator": lambda names, el: _all_exist(names, _act_refs(el), el),
    "sensor": _resolves_sensor,
}
