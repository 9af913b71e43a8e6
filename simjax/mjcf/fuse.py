"""``<compiler fusestatic="true">``: static bodies merged into their parents
(mjCModel::FuseStatic).

A body without joints that is not a mocap body, and that no other element names (a
named body referenced by a camera or light target, an exclude, an equality, an
actuator, a sensor or a tuple stays, and so does one with a site a force or torque
sensor reads), is removed: its mass and inertia are added to
its parent's (not the world's; mjCBody::AccumulateInertia), its geoms, sites and
cameras move to the end of the parent's lists and its child bodies take its place in
the parent's, all re-expressed in the parent's frame (mjuu_frameaccum). Bodies are
visited in order and a fused body's place is visited again, so chains of static bodies
collapse. Ids of everything after a fused element shift, as in MuJoCo. A body with
``fuse="false"`` (MuJoCo 4) stays.
"""
from __future__ import annotations

import numpy as np

from simjax.mjcf import inertia as inr
from simjax.mjcf.compile import _sections
from simjax.mjcf import mesh as mesh_mod

_MINVAL = 1e-15
#: attributes of non-tree elements (and of cameras and lights) that name a body
_BODY_ATTRS = ("body", "body1", "body2", "subtree1", "subtree2", "target")
_BODY_TYPES = ("body", "xbody")


def referenced_bodies(root):
    """Body names other elements reference."""
    names = set()
    for sec in root.children:
        for el in sec.walk():
            a = el.attrs
            if sec.tag != "worldbody" or el.tag in ("camera", "light"):
                names.update(a.get(k) for k in _BODY_ATTRS)
            for kind, name in (("objtype", "objname"), ("reftype", "refname")):
                if a.get(kind) in _BODY_TYPES:
                    names.add(a.get(name))
    names.discard(None)
    return names


def _force_sites(root):
    """Names of the sites of force and torque sensors."""
    return {el.attrs.get("site") for el in _sections(root, "sensor")
            if el.tag in ("force", "torque")}


def _accumulate(par, body):
    """Adds ``body``'s mass and inertia to ``par``'s (mjCBody::AccumulateInertia)."""
    ipos, iquat = mesh_mod.frameaccum(body.pos, body.quat, body.ipos, body.iquat)
    par.mass, par.ipos, par.inertia, par.iquat = inr.combine(
        [par.mass, body.mass], [par.ipos, ipos], [par.iquat, iquat],
        [par.inertia, body.inertia])
    par.ipos, par.inertia = np.asarray(par.ipos), np.asarray(par.inertia)
    par.iquat = np.asarray(par.iquat)


def fuse_static(root, bodies):
    """Fuses the static bodies of ``bodies`` (TreeBuilder output) and returns the new
    list, ids and parents renumbered."""
    refs = referenced_bodies(root)
    force_sites = _force_sites(root)
    bodies = list(bodies)
    i = 1
    while i < len(bodies):
        body = bodies[i]
        # a named body keeps its place when something references it, or a force or
        # torque sensor reads one of its sites (MuJoCo tries the references without
        # the body's name and skips it on any error); unnamed bodies are not checked
        named_ref = body.name and (body.name in refs or any(
            x["name"] and x["name"] in force_sites for x in body.sites))
        # MuJoCo 4's body attribute fuse="false" keeps a body out of the fusing
        kept = body.el is not None and body.el.attrs.get("fuse") == "false"
        if named_ref or kept or body.joints or body.mocap:
            i += 1
            continue
        par = bodies[body.parent]
        if body.parent != 0 and body.mass >= _MINVAL:
            _accumulate(par, body)
        for child in bodies:
            if child.parent == body.id and child is not body:
                child.pos, child.quat = mesh_mod.frameaccum(body.pos, body.quat,
                                                            child.pos, child.quat)
                child.parent = par.id
        for kind in ("geoms", "sites", "cams"):
            for x in getattr(body, kind):
                x["pos"], x["quat"] = mesh_mod.frameaccum(body.pos, body.quat, x["pos"],
                                                          x["quat"])
            getattr(par, kind).extend(getattr(body, kind))
        del bodies[i]
        _renumber(bodies)
    return bodies


def _renumber(bodies):
    old = {b.id: k for k, b in enumerate(bodies)}
    for k, b in enumerate(bodies):
        b.id = k
        b.parent = old[b.parent] if k else 0
        weld_root = bool(b.joints) or b.mocap
        b.weldid = k if (k and weld_root) else (bodies[b.parent].weldid if k else 0)
