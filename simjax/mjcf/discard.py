"""``<compiler discardvisual="true">``: purely visual elements left out of the Model.

MuJoCo's rules (mjCModel::IndexAssets with discard, mjCModel::TryCompile):

- a geom is visual when its contype and conaffinity are both 0 and no other element
  names it: contact pairs, spatial tendon wraps, sensors (object or reference of type
  geom, the geom distance and contact sensors' ``geom1`` / ``geom2``, the tactile
  sensor's geom) and custom tuples. Visual geoms are dropped after their bodies'
  masses and inertias were inferred with them (MuJoCo then writes those values as the
  body's explicit inertial, so the dynamics are unchanged);
- a mesh is dropped unless a kept geom names it (a fitted primitive too) or a sensor
  does (the tactile sensor's mesh, or an object of type mesh);
- every material and texture is dropped (geoms keep their rgba; material references
  are forgotten, not checked).

Element ids after the dropped ones shift down, as in MuJoCo.
"""
from __future__ import annotations

from simjax.mjcf.compile import _sections

_GEOM_ATTRS = ("geom1", "geom2")


def referenced(root):
    """(geom names, mesh names) that other elements reference by name."""
    geoms, meshes = set(), set()
    for el in _sections(root, "contact"):
        if el.tag == "pair":
            geoms.update(el.attrs.get(k) for k in _GEOM_ATTRS)
    for ten in _sections(root, "tendon"):
        for ch in ten.walk():
            if ch.tag == "geom":
                geoms.add(ch.attrs.get("geom"))
    for el in _sections(root, "sensor"):
        a = el.attrs
        for kind, name in (("objtype", "objname"), ("reftype", "refname")):
            if a.get(kind) == "geom":
                geoms.add(a.get(name))
            if a.get(kind) == "mesh":
                meshes.add(a.get(name))
        geoms.update(a.get(k) for k in _GEOM_ATTRS)
        if el.tag == "tactile":
            geoms.add(a.get("geom"))
            meshes.add(a.get("mesh"))
    for tup in _sections(root, "custom"):
        if tup.tag == "tuple":
            for ch in tup.children:
                if ch.attrs.get("objtype") == "geom":
                    geoms.add(ch.attrs.get("objname"))
    geoms.discard(None)
    meshes.discard(None)
    return geoms, meshes


def _visual(g, names):
    return g["contype"] == 0 and g["conaffinity"] == 0 and not (g["name"] and
                                                                 g["name"] in names)


def discard_visual(root, bodies, meshes, mesh_names, mesh_els):
    """Drop visual geoms from ``bodies`` (in place) and the meshes no longer used.

    Returns (meshes, mesh_names, mesh_els) of the kept meshes; the kept mesh geoms'
    ``dataid`` is renumbered to match."""
    geom_names, mesh_refs = referenced(root)
    for b in bodies:
        b.geoms = [g for g in b.geoms if not _visual(g, geom_names)]
    used = set(mesh_refs)
    for b in bodies:
        for g in b.geoms:
            used.add(g["el"].attrs.get("mesh"))
    keep = [i for i, n in enumerate(mesh_names) if n in used]
    new_id = {old: new for new, old in enumerate(keep)}
    for b in bodies:
        for g in b.geoms:
            if g["el"].attrs.get("mesh") is not None and g["dataid"] >= 0:
                g["dataid"] = new_id[g["dataid"]]
    return ([meshes[i] for i in keep], [mesh_names[i] for i in keep],
            [mesh_els[i] for i in keep])
