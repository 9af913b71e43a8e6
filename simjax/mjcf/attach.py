"""The ``<attach>`` meta-element with a ``<model>`` asset, expanded on the parsed tree.

MuJoCo's reader parses the asset's file into a child spec and attaches, at the attach
element's place, a body of it (``body``), a frame (``frame``) or everything in its
world body (neither), with ``prefix`` before every name (mjs_attach; mjCBody's and
mjCModel's ``operator+=``, user_objects.cc / user_model.cc). simjax rewrites the tree:

- the attached elements go into a frame at the attach element, their names and their
  camera/light targets prefixed, their references to the child's assets too;
- every asset of the child (meshes, height fields, textures, materials) is appended
  to the model's assets with its name and its references prefixed, its file read from
  the child's directory and the child's meshdir / texturedir; so are its custom numerics
  and texts;
- the child's pairs, excludes, tendons, equalities, actuators and sensors are copied
  with the prefix by the rules of :mod:`simjax.mjcf.replicate` (a copy is made when
  its references resolve in the model as it stands after the attachment), appended to
  the model's lists.

The child's <option>, <size> and <visual> meet the model's by the model's conflict
policy (:mod:`simjax.mjcf.conflict`); its <statistic> does not apply. The child's angle unit and euler sequence apply
to its own elements. Not supported (UnsupportedFeatureError): a child whose other
compiler settings differ from the model's (MuJoCo compiles the child's elements with the
child's settings), a child whose keyframes set
activations, custom tuples, skins or plugins.

Without ``model``, a body or frame of the model itself (read before the attach element)
is copied with the prefix, and the model's own list elements are copied where their
prefixed references resolve (MuJoCo's self-attachment); a model with keyframes is not
supported there.
"""
from __future__ import annotations

import copy
import dataclasses
import os

import numpy as np

from simjax.errors import UnsupportedFeatureError
from simjax.mjcf import replicate as rp
from simjax.mjcf.mesh import _default_name as default_mesh_name, resolve_asset_path

#: Settings fields that may differ between a model and an attached child (the angle
#: unit and euler sequence are applied to the child's elements when it is read)
_FREE_SETTINGS = {"meshdir", "texturedir", "strippath", "lengthrange", "to_rad", "eulerseq"}
#: asset references inside assets
_ASSET_ASSET_REFS = {"material": ("texture",), "mesh": ("material",),
                     "hfield": ("material",)}


def attach(st, el):
    """The frame replacing attach element ``el`` in the tree walk of ``st``
    (a :class:`simjax.mjcf.replicate._State`), with the model's assets and lists
    extended."""
    a = el.attrs
    prefix = a.get("prefix") or ""

    def ren(n):
        return prefix + n
    if not a.get("model"):
        return _self_attach(st, el, a, ren)
    child = _child(st, el, a["model"])
    source = _source(child, el, a)
    _store_keyframes(st, child, ren)
    kids = [rp.renamed(c, ren, ren) for c in source]
    rp.forget_bodies(source)              # the attached bodies forget their keyframes
    frame = _frame(el, kids)
    _add_assets(st, child, ren)
    for k, names in rp.tree_names(kids).items():
        st.names[k] |= names

    st._copy_lists(ren, child["lists"], post=lambda e: _asset_refs(e, ren))
    return frame


def _self_attach(st, el, a, ren):
    """Attachment of a body or frame of this model read so far (mjs_attach of an element
    of its own spec): a prefixed copy, the source kept, this model's list elements
    copied where their prefixed references resolve (no assets)."""
    kind = "body" if a.get("body") else "frame" if a.get("frame") else None
    if kind is None:
        raise el.error("either 'body' or 'frame' attribute must be specified for "
                       "self-attach")
    want = a[kind]
    if st._has(kind, ren(want)):
        raise el.error(f"cannot self-attach: element {ren(want)} already exists")
    found = _find_in_worlds(st.root, kind, want)
    if found is None or not st._has(kind, want):
        raise el.error(f"could not find {kind} '{want}' in the current model for "
                       "self-attachment")
    if any(s.tag == "keyframe" and s.children for s in st.root.children):
        raise UnsupportedFeatureError("self-attachment in a model with keyframes",
                                      el.file, el.line, el.path)
    kids = [rp.renamed(found, ren)]
    for k, names in rp.tree_names(kids).items():
        st.names[k] |= names
    st._copy_lists(ren)
    return _frame(el, kids)


def _child(st, el, name):
    """The parsed (and expanded) child model named ``name``: root, directory, settings,
    lists, assets."""
    from simjax.mjcf import conflict
    if name in st.children_models:
        child = st.children_models[name]
        conflict.resolve(st.root, child["root"], name, el)
        return child
    from simjax.mjcf.compile import _settings
    from simjax.mjcf.parse import parse
    specs = [m for sec in st.root.children if sec.tag == "asset" for m in sec.children
             if m.tag == "model"]
    # a model asset is known by its name, else by its file's <mujoco model=...>
    found = None
    for spec in specs:
        if (spec.attrs.get("name") or "") == name:
            found = (spec, parse(_path(st, spec), st.assets))
    for spec in specs if found is None else ():
        if not spec.attrs.get("name"):
            parsed = parse(_path(st, spec), st.assets)
            if (parsed[0].attrs.get("model") or "") == name:
                found = (spec, parsed)
    if found is None:
        raise el.error(f"could not find model '{name}'")
    spec, (root, child_dir) = found
    settings = _settings(root)
    _check_child(root, settings, st.settings, spec)
    rp.expand(root, settings, child_dir, st.assets)
    if (settings.to_rad, settings.eulerseq) != (st.settings.to_rad, st.settings.eulerseq):
        for w in root.children:
            if w.tag == "worldbody":
                _convert_angles(w, settings, st.settings)
    child = dict(root=root, dir=child_dir, settings=settings, lists=rp.list_items(root),
                 layout=_child_layout(root))
    st.children_models[name] = child
    conflict.resolve(st.root, root, name, el)
    return child


# ---------------------------------------------------------------------- keyframes
# MuJoCo keeps a child's keyframe values on the child's elements (mjCModel::SaveState at
# every attachment, under the prefixed key name), copies them with the elements, clears
# them on the source elements that were attached (ForgetKeyframes), and makes each
# attachment's keys from whatever elements of the final model hold values under their
# names (mjCModel::ResolveKeyframes / RestoreState): qpos0, zero velocities and
# controls, the mocap bodies' poses elsewhere. simjax does the same with a ``keystore``
# on the parsed elements and the model's pending keys (``root.pending_keys``).

_JOINT_SIZE = {"free": (7, 6), "ball": (4, 3), "hinge": (1, 1), "slide": (1, 1)}


def _child_layout(root):
    """The child's joints (element, qpos address, nq, dof address, nv), actuators and
    mocap bodies in its compiled order (bodies depth first, elements in document order
    within a body)."""
    joints, mocap = [], []
    adr = [0, 0]

    def body_items(el):
        for c in el.children:
            if c.tag in ("joint", "freejoint"):
                kind = "free" if c.tag == "freejoint" else (c.attrs.get("type") or "hinge")
                nq, nv = _JOINT_SIZE[kind]
                joints.append((c, adr[0], nq, adr[1], nv))
                adr[0] += nq
                adr[1] += nv
            elif c.tag == "frame":
                body_items(c)

    def bodies_of(el):
        for c in el.children:
            if c.tag == "body":
                yield c
            elif c.tag == "frame":
                yield from bodies_of(c)

    def walk(el):
        for b in bodies_of(el):
            if b.attrs.get("mocap"):
                mocap.append(b)
            body_items(b)
            walk(b)
    for w in root.children:
        if w.tag == "worldbody":
            walk(w)
    acts = [e for s in root.children if s.tag == "actuator" for e in s.children]
    return joints, acts, mocap


def _store_keyframes(st, child, ren):
    """SaveState of every child key under its prefixed name, and the pending key."""
    keys = [k for s in child["root"].children if s.tag == "keyframe" for k in s.children]
    if not keys:
        return
    joints, acts, mocap = child["layout"]
    nq = sum(j[2] for j in joints)
    nv = sum(j[4] for j in joints)
    for k in keys:
        a = k.attrs
        name = ren(a.get("name") or "")
        vec = {f: (None if a.get(f) is None else np.atleast_1d(np.asarray(a[f], float)))
               for f in ("qpos", "qvel", "act", "ctrl", "mpos", "mquat")}
        if vec["act"] is not None and vec["act"].size:
            raise UnsupportedFeatureError("<attach> of a model whose keyframes set act",
                                          k.file, k.line, k.path)
        for f, n in (("qpos", nq), ("qvel", nv), ("ctrl", len(acts)),
                     ("mpos", 3 * len(mocap)), ("mquat", 4 * len(mocap))):
            if vec[f] is not None and vec[f].size and vec[f].size != n:
                raise k.error(f"Keyframe '{a.get('name') or ''}' has invalid {f} size, "
                              f"got {vec[f].size}, should be {n}")
        given = {f: vec[f] is not None and vec[f].size > 0 for f in vec}
        for j, qa, jnq, da, jnv in joints:
            store = _store(j)
            entry = store.setdefault(name, {})
            if given["qpos"]:
                entry["qpos"] = vec["qpos"][qa:qa + jnq]
            if given["qvel"]:
                entry["qvel"] = vec["qvel"][da:da + jnv]
        for i, act in enumerate(acts):
            if given["ctrl"]:
                _store(act).setdefault(name, {})["ctrl"] = vec["ctrl"][i]
        for i, b in enumerate(mocap):
            entry = _store(b).setdefault(name, {})
            if given["mpos"]:
                entry["mpos"] = vec["mpos"][3 * i:3 * i + 3]
            if given["mquat"]:
                entry["mquat"] = vec["mquat"][4 * i:4 * i + 4]
        pending = getattr(st.root, "pending_keys", None)
        if pending is None:
            pending = st.root.pending_keys = []
        pending.append(dict(name=name, time=float(a.get("time") or 0.0), given=given))


def _store(el):
    if not hasattr(el, "keystore"):
        el.keystore = {}
    return el.keystore


def _convert_angles(el, child, parent):
    """The child's angles in the model's units (MuJoCo compiles the child's elements
    with the child's compiler): orientations become quaternions, hinge and ball joint
    ranges and hinge references are rescaled."""
    from simjax.mjcf import orientation as ori
    scale = child.to_rad / parent.to_rad
    for c in el.children:
        a = c.attrs
        if any(a.get(k) is not None for k in ori.ORIENT_ATTRS) and c.tag != "joint":
            q = ori.resolve(a, child.to_rad, child.eulerseq, c.error)
            a = c.attrs = dict(a)
            for k in ori.ORIENT_ATTRS:
                a[k] = None
            a["quat"] = q
            c.given = c.given | {"quat"}
        if c.tag == "joint" and (a.get("type") or "hinge") in ("hinge", "ball"):
            a = c.attrs = dict(a)
            if a.get("range") is not None:
                a["range"] = np.asarray(a["range"], float) * scale
            if (a.get("type") or "hinge") == "hinge":
                for k in ("ref", "springref"):
                    if a.get(k) is not None:
                        a[k] = float(a[k]) * scale
        _convert_angles(c, child, parent)


def _path(st, spec):
    file = spec.attrs.get("file")
    return file if os.path.isabs(file) or not st.model_dir else \
        os.path.join(st.model_dir, file)


def _check_child(root, settings, parent, spec):
    """UnsupportedFeatureError for what simjax does not attach (module docstring)."""
    def refuse(what):
        raise UnsupportedFeatureError(f"<attach> of model '{spec.attrs.get('name')}' "
                                      f"with {what}", spec.file, spec.line, spec.path)
    for f in dataclasses.fields(settings):
        if f.name in _FREE_SETTINGS:
            continue
        mine, theirs = getattr(settings, f.name), getattr(parent, f.name)
        same = (mine == theirs).all() if hasattr(mine, "all") else mine == theirs
        if not same:
            attr = {"to_rad": "angle", "default_solref": "solref",
                    "default_solimp": "solimp"}.get(f.name, f.name)
            refuse(f"compiler setting '{attr}' different from the model's")
    for sec in root.children:
        if sec.tag == "extension" and sec.children:
            refuse("plugins")
        if sec.tag == "custom" and any(c.tag == "tuple" for c in sec.children):
            refuse("custom tuples")
        if sec.tag == "asset" and any(c.tag in ("skin", "model") for c in sec.children):
            refuse("skins or model assets")
        if sec.tag in ("actuator", "sensor") and any(c.tag == "plugin"
                                                     for c in sec.children):
            refuse("plugins")


def _source(child, el, a):
    """Children of the attached frame: the named body or frame, or the world's
    contents."""
    worlds = [s for s in child["root"].children if s.tag == "worldbody"]
    kind = "body" if a.get("body") else "frame" if a.get("frame") else None
    if kind is None:
        return [c for w in worlds for c in w.children]
    want = a[kind]
    found = _find_in_worlds(child["root"], kind, want)
    if found is not None:
        return [found]                    # the body or frame itself, with its transform
    raise el.error(f"could not find {kind} '{want}' in model asset '{a['model']}'")


def _find_in_worlds(root, tag, name):
    """The first ``tag`` element named ``name`` under the world bodies of ``root``."""
    for w in root.children:
        if w.tag == "worldbody":
            hit = _find(w, tag, name)
            if hit is not None:
                return hit
    return None


def _find(el, tag, name):
    for c in el.children:
        if c.tag == tag and c.attrs.get("name") == name:
            return c
        hit = _find(c, tag, name)
        if hit is not None:
            return hit
    return None


def _frame(el, kids):
    """The identity frame that replaces the attach element."""
    return rp.frame_element(el, np.zeros(3), np.array([1.0, 0, 0, 0]), kids)


def _section(st, tag):
    """The model's last ``tag`` section (a new one at the start if there is none)."""
    secs = [s for s in st.root.children if s.tag == tag]
    return secs[-1] if secs else rp.new_section(st.root, tag, first=True)


def _add_assets(st, child, ren):
    """Append the child's assets and custom numerics and texts, prefixed, with the
    assets' files resolved where the child reads them (mjCModel::operator+=)."""
    settings = child["settings"]
    for csec in child["root"].children:
        if csec.tag == "custom":
            sec = _section(st, "custom")
            for c in csec.children:
                new = copy.copy(c)
                new.attrs = dict(c.attrs)
                if new.attrs.get("name"):
                    new.attrs["name"] = ren(new.attrs["name"])
                sec.children.append(new)
        if csec.tag != "asset":
            continue
        sec = _section(st, "asset")
        for a in csec.children:
            new = copy.copy(a)
            new.attrs = dict(a.attrs)
            if not new.attrs.get("name") and new.attrs.get("file") and \
                    a.tag in ("mesh", "hfield", "texture"):
                # the child names its file assets before they are prefixed
                new.attrs["name"] = default_mesh_name(new.attrs["file"])
                new.given = new.given | {"name"}
            if new.attrs.get("name"):
                new.attrs["name"] = ren(new.attrs["name"])
            for key in _ASSET_ASSET_REFS.get(a.tag, ()):
                if new.attrs.get(key):
                    new.attrs[key] = ren(new.attrs[key])
            _resolve_files(new, a.tag, child["dir"], settings)
            if a.tag == "mesh" and new.attrs.get("name"):
                st.names["mesh"].add(new.attrs["name"])
            sec.children.append(new)


def _resolve_files(el, tag, child_dir, settings):
    """Point the asset's file attributes at the child's directory (and its meshdir or
    texturedir), as MuJoCo reads the child's assets."""
    adir = settings.meshdir if tag in ("mesh", "hfield") else settings.texturedir
    keys = ("file", "fileback", "filedown", "filefront", "fileleft", "fileright", "fileup")
    for key in keys:
        f = el.attrs.get(key)
        if not f:
            continue
        name = resolve_asset_path(f, adir, settings.strippath)
        if not os.path.isabs(name) and child_dir:
            name = os.path.normpath(os.path.join(child_dir, name))
        el.attrs[key] = name


def _asset_refs(el, ren):
    """A copied list element's references to the child's assets, prefixed (a tactile
    sensor's mesh is a resolved reference, renamed with the others)."""
    if el.tag == "spatial" and el.attrs.get("material"):
        el.attrs["material"] = ren(el.attrs["material"])
