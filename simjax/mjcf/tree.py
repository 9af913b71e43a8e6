"""The kinematic tree: bodies, joints, geoms, sites and cameras (numpy only).

Walks ``<worldbody>`` in document order (bodies in depth-first pre-order, frames
flattened into their owning body), resolves every pose, size and inertia with the rules
of MuJoCo's ``mjCBody::Compile``, ``mjCJoint::Compile``, ``mjCGeom::Compile`` and
``mjCModel::CopyTree``, and fills the per-object arrays of the Model.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from simjax.errors import UnsupportedFeatureError
from simjax.mjcf import inertia as inr
from simjax.mjcf import mesh as mesh_mod
from simjax.mjcf import orientation as ori
from simjax.mjcf.fluid import fluid_coefs
from simjax.types import GeomType, JointType, SameFrame

GEOM_TYPES = {t.name.lower(): int(t) for t in GeomType}
JOINT_TYPES = {"free": 0, "ball": 1, "slide": 2, "hinge": 3}
JOINT_NQ = {0: 7, 1: 4, 2: 1, 3: 1}
JOINT_NV = {0: 6, 1: 3, 2: 1, 3: 1}
# number of size entries that must be positive, by geom type (mjGEOMINFO)
_GEOM_NSIZE = {0: 0, 1: 0, 2: 1, 3: 2, 4: 3, 5: 2, 6: 3, 7: 0, 8: 0}
_FRAME_EPS = 1e-6
_MINVAL = 1e-15  # mjMINVAL
_CAM_MODES = {"fixed": 0, "track": 1, "trackcom": 2, "targetbody": 3, "targetbodycom": 4}


@dataclasses.dataclass
class Body:
    el: Any
    id: int
    parent: int
    name: str
    pos: np.ndarray
    quat: np.ndarray
    mocap: bool
    gravcomp: float
    joints: list = dataclasses.field(default_factory=list)
    geoms: list = dataclasses.field(default_factory=list)
    sites: list = dataclasses.field(default_factory=list)
    cams: list = dataclasses.field(default_factory=list)
    inertial: Any = None
    weldid: int = 0
    # inertial results
    mass: float = 0.0
    ipos: np.ndarray = None
    iquat: np.ndarray = None
    inertia: np.ndarray = None
    el_pos_local: np.ndarray = None    # pose as written, before frames are composed
    el_quat_local: np.ndarray = None


#: geom types whose shape data is a mesh asset (SDF geoms use their mesh like MuJoCo)
_MESHLIKE = (GeomType.MESH, GeomType.SDF)


class TreeBuilder:
    """Collects bodies and their elements from the MJCF tree."""

    def __init__(self, settings, meshes, hfields, mesh_ids, hfield_ids):
        self.s = settings
        self.meshes = meshes          # list of MeshData
        self.hfields = hfields        # list of HFieldData
        self.mesh_ids = mesh_ids      # name -> id
        self.hfield_ids = hfield_ids
        self.bodies: list[Body] = []

    # ------------------------------------------------------------------ walking
    def build(self, worldbodies):
        world = Body(el=None, id=0, parent=0, name="world", pos=np.zeros(3),
                     quat=np.array([1.0, 0, 0, 0]), mocap=False, gravcomp=0.0)
        self.bodies.append(world)
        pending = []   # (element, parent id, frame pos, frame quat) of child bodies
        for wb in worldbodies:
            self._collect(wb, world, np.zeros(3), np.array([1.0, 0, 0, 0]), pending)
        self._walk_children(pending)
        for b in self.bodies:
            self._compile_body(b)
        _check_moving_mass(self.bodies)
        return self.bodies

    def _walk_children(self, pending):
        # depth-first pre-order: a body's children are numbered before its siblings'
        for el, parent, fpos, fquat in pending:
            body = self._new_body(el, parent, fpos, fquat)
            sub = []
            self._collect(el, body, np.zeros(3), np.array([1.0, 0, 0, 0]), sub)
            self._walk_children(sub)

    def _new_body(self, el, parent, fpos, fquat):
        a = el.attrs
        pos = np.asarray(a["pos"], dtype=np.float64)
        quat = self._orient(el)
        if quat is None:
            quat = np.array([1.0, 0, 0, 0])
        local = (pos, quat)
        pos, quat = ori.frame_compose(fpos, fquat, pos, quat)
        # a sleep policy matters only to sleeping, which the engine refuses (the sleep
        # flag); "init" would start the tree asleep
        if _get(a, "sleep", "auto") == "init":
            raise UnsupportedFeatureError("body sleep policy 'init'", el.file, el.line,
                                          el.path)
        b = Body(el=el, id=len(self.bodies), parent=parent.id, name=a.get("name") or "",
                 pos=pos, quat=quat, mocap=bool(_get(a, "mocap", False)),
                 gravcomp=float(_get(a, "gravcomp", 0.0)), el_pos_local=local[0],
                 el_quat_local=local[1])
        self.bodies.append(b)
        return b

    def _collect(self, el, body, fpos, fquat, pending):
        """Gather joints/geoms/sites/cameras of ``body`` from ``el``'s children."""
        for ch in el.children:
            t = ch.tag
            if t == "body":
                pending.append((ch, body, fpos, fquat))
            elif t == "frame":
                p = np.asarray(ch.attrs["pos"], dtype=np.float64)
                q = self._orient(ch)
                q = np.array([1.0, 0, 0, 0]) if q is None else q
                cp, cq = ori.frame_compose(fpos, fquat, p, q)
                self._collect(ch, body, cp, cq, pending)
            elif t in ("joint", "freejoint"):
                body.joints.append((ch, fpos, fquat))
            elif t == "geom":
                body.geoms.append((ch, fpos, fquat))
            elif t == "site":
                body.sites.append((ch, fpos, fquat))
            elif t == "camera":
                body.cams.append((ch, fpos, fquat))
            elif t == "inertial":
                body.inertial = ch
            elif t in ("light",):
                continue
            elif t in ("attach", "composite", "flexcomp"):     # (expanded before)
                raise UnsupportedFeatureError(f"<{t}>", ch.file, ch.line, ch.path)
            elif t == "plugin":
                continue    # passive-force plugin: resolved by simjax.mjcf.plugin

    def _orient(self, el):
        return ori.resolve(el.attrs, self.s.to_rad, self.s.eulerseq, el.error)

    # ------------------------------------------------------------------ bodies
    def _compile_body(self, b: Body):
        joints = [self._joint(el, fp, fq) for el, fp, fq in b.joints]
        b.joints = joints
        parent = self.bodies[b.parent]
        if b.id > 0:
            weld_root = bool(joints) or b.mocap
            b.weldid = b.id if weld_root else parent.weldid
        explicit = b.inertial is not None
        geoms = []
        for el, fp, fq in b.geoms:
            infer = (b.id > 0 and (not explicit or self.s.inertiafromgeom == "true"))
            geoms.append(self._geom(el, fp, fq, b, infer))
        b.geoms = geoms
        b.sites = [self._site(el, fp, fq) for el, fp, fq in b.sites]
        b.cams = [self._camera(el, fp, fq) for el, fp, fq in b.cams]
        self._body_inertia(b, explicit)
        self._align_free(b)
        if b.id > 0 and b.mocap and (joints or b.parent != 0):
            raise b.el.error(f"mocap body '{b.name}' is not a fixed child of world")
        if sum(JOINT_NV[j["type"]] for j in joints) > 6:
            raise b.el.error(f"more than 6 dofs in body '{b.name}'")
        hasball = False
        for j in joints:
            if j["type"] in (JointType.BALL, JointType.HINGE) and hasball:
                raise b.el.error(f"ball followed by rotation in body '{b.name}'")
            hasball |= j["type"] == JointType.BALL
        nfree = sum(j["type"] == JointType.FREE for j in joints)
        if nfree and (len(joints) > 1):
            raise b.el.error("free joint can only appear by itself")
        if nfree and b.parent != 0:
            raise b.el.error("free joint can only be used on top level")

    def _align_free(self, b: Body):
        """Free-joint alignment (mjCBody::Compile): a body whose only joint is free and
        that has no child bodies moves its frame onto its inertial frame when the
        joint's align is true (``auto``: the compiler's alignfree; a ``<joint
        type="free">`` is always auto); its geoms, sites and cameras are re-expressed in
        the new frame, in MuJoCo's arithmetic (mjuu_frameaccum, mjuu_frameinvert)."""
        j = b.joints
        if not (len(j) == 1 and j[0]["type"] == JointType.FREE
                and j[0].get("align", self.s.alignfree)):
            return
        if any(x.parent == b.id for x in self.bodies[b.id + 1:]):
            return
        b.pos, b.quat = mesh_mod.frameaccum(b.pos, b.quat, b.ipos, b.iquat)
        inv_quat = [b.iquat[0], -b.iquat[1], -b.iquat[2], -b.iquat[3]]
        inv_pos = -mesh_mod.mulvecmat(b.ipos, mesh_mod.quat2mat(inv_quat))
        for child in b.geoms + b.sites + b.cams:
            child["pos"], child["quat"] = mesh_mod.frameaccum(inv_pos, inv_quat,
                                                              child["pos"], child["quat"])
        b.ipos, b.iquat = np.zeros(3), np.array([1.0, 0, 0, 0])

    def _body_inertia(self, b: Body, explicit):
        s = self.s
        if b.id == 0:
            b.mass, b.ipos, b.iquat, b.inertia = 0.0, np.zeros(3), np.array([1.0, 0, 0, 0]), \
                np.zeros(3)
            return
        ipos = None
        if explicit:
            el = b.inertial
            a = el.attrs
            ipos = np.asarray(a["pos"], dtype=np.float64)
            b.mass = float(a["mass"])
            if a.get("fullinertia") is not None:
                if any(a.get(k) is not None for k in ori.ORIENT_ATTRS):
                    raise el.error("fullinertia and inertial orientation cannot both be "
                                   "specified")
                if a.get("diaginertia") is not None:
                    raise el.error("fullinertia and diagonal inertia cannot both be specified")
                try:
                    b.inertia, b.iquat = inr.full_inertia(a["fullinertia"])
                except ValueError as e:
                    raise el.error(f"error '{e}' in fullinertia") from None
            else:
                if a.get("diaginertia") is None:
                    raise el.error("inertial requires diaginertia or fullinertia")
                b.inertia = np.asarray(a["diaginertia"], dtype=np.float64)
                q = self._orient(el)
                b.iquat = np.array([1.0, 0, 0, 0]) if q is None else q
        if s.inertiafromgeom == "true" or (ipos is None and s.inertiafromgeom == "auto"):
            sel = [g for g in b.geoms if g["infer"] and g["mass_"] > inr.EPS]
            if sel:
                try:
                    b.mass, ipos, b.inertia, b.iquat = inr.combine(
                        [g["mass_"] for g in sel], [g["pos"] for g in sel],
                        [g["quat"] for g in sel], [g["inertia"] for g in sel])
                except ValueError as e:
                    raise b.el.error(str(e)) from None
        if ipos is None:
            # quirk of MuJoCo: a body with no inertial information copies its own frame
            ipos, b.iquat = b.el_pos_local, b.el_quat_local
            b.inertia = np.zeros(3) if b.inertia is None else b.inertia
        b.ipos = np.asarray(ipos, dtype=np.float64)
        b.iquat = ori.quat_normalize(b.iquat)
        b.mass = max(b.mass, s.boundmass)
        b.inertia = np.maximum(np.asarray(b.inertia, dtype=np.float64), s.boundinertia)
        if b.mass < 0 or np.any(b.inertia < 0):
            raise b.el.error("mass and inertia cannot be negative")
        i0, i1, i2 = b.inertia
        if i0 + i1 < i2 or i0 + i2 < i1 or i1 + i2 < i0:
            if s.balanceinertia:
                b.inertia = np.full(3, b.inertia.mean())
            else:
                raise b.el.error("inertia must satisfy A + B >= C; use 'balanceinertia' to fix")

    # ------------------------------------------------------------------ joints
    def _joint(self, el, fpos, fquat):
        a = el.attrs
        s = self.s
        if el.tag == "freejoint":
            align = a.get("align") or "auto"
            return dict(el=el, name=a.get("name") or "", type=JointType.FREE, pos=np.zeros(3),
                        align=align == "true" or (align == "auto" and s.alignfree),
                        axis=np.array([0.0, 0, 1]), limited=False, range=np.zeros(2),
                        ref=0.0, springref=0.0, stiffness=np.zeros(3), damping=np.zeros(3),
                        armature=0.0, frictionloss=0.0, margin=0.0,
                        solreflimit=s.default_solref, solimplimit=s.default_solimp,
                        solreffriction=s.default_solref, solimpfriction=s.default_solimp,
                        actfrclimited=False, actfrcrange=np.zeros(2), actgravcomp=False,
                        group=int(_get(a, "group", 0)), springdamper=np.zeros(2),
                        springyield=0.0, user=np.zeros(0))
        jtype = JOINT_TYPES[a["type"]]
        rng = np.array(a["range"], dtype=np.float64)
        limited = self._limited(el, a["limited"], rng, jtype != JointType.FREE, "joint", "")
        if limited:
            if rng[0] >= rng[1] and jtype != JointType.BALL:
                raise el.error("range[0] should be smaller than range[1] in joint")
            if rng[0] and jtype == JointType.BALL:
                raise el.error("range[0] should be 0 in ball joint")
            if jtype in (JointType.HINGE, JointType.BALL):
                rng = rng * s.to_rad
        afr = np.array(a["actuatorfrcrange"], dtype=np.float64)
        actfrclimited = False
        if jtype in (JointType.HINGE, JointType.SLIDE):
            actfrclimited = self._limited(el, a["actuatorfrclimited"], afr, True, "joint",
                                          "actuatorfrc")
            if actfrclimited and afr[0] >= afr[1]:
                raise el.error("actfrcrange[0] should be smaller than actfrcrange[1] in joint")
        axis = np.asarray(a["axis"], dtype=np.float64)
        pos = np.asarray(a["pos"], dtype=np.float64)
        if jtype in (JointType.FREE, JointType.BALL):
            axis = np.array([0.0, 0.0, 1.0])
        else:
            axis = ori.rotate(fquat, axis)
        n = np.linalg.norm(axis)
        if n < inr.EPS:
            raise el.error("axis too small in joint")
        axis = axis / n
        if jtype != JointType.FREE:
            pos = fpos + ori.rotate(fquat, pos)
        ref, springref = float(a["ref"]), float(a["springref"])
        if jtype == JointType.HINGE:
            ref *= s.to_rad
            springref *= s.to_rad
        sd = np.asarray(_get(a, "springdamper", [0, 0]), dtype=np.float64)
        if (sd[0] or sd[1]) and (sd[0] <= 0 or sd[1] <= 0):
            raise el.error("when defined, springdamper values must be positive in joint")
        # elasto-plastic spring (MuJoCo 4): the elastic range, an angle for hinge and
        # ball joints (in the model's angle units)
        yld = float(_get(a, "springyield", 0.0))
        if yld < 0:
            raise el.error("springyield cannot be negative in joint")
        if yld and jtype == JointType.FREE:
            raise el.error("springyield should not be defined in free joint")
        if jtype in (JointType.HINGE, JointType.BALL):
            yld *= s.to_rad
        return dict(el=el, name=a.get("name") or "", type=jtype, pos=pos, axis=axis,
                    limited=limited, range=rng, ref=ref, springref=springref,
                    stiffness=_poly3(a["stiffness"]), damping=_poly3(a["damping"]),
                    armature=float(a["armature"]), frictionloss=float(a["frictionloss"]),
                    margin=float(a["margin"]), solreflimit=np.asarray(a["solreflimit"]),
                    solimplimit=np.asarray(a["solimplimit"]),
                    solreffriction=np.asarray(a["solreffriction"]),
                    solimpfriction=np.asarray(a["solimpfriction"]),
                    actfrclimited=actfrclimited, actfrcrange=afr,
                    actgravcomp=bool(a["actuatorgravcomp"]), group=int(a["group"]),
                    springdamper=sd, springyield=yld, user=_arr(a.get("user")))

    def _limited(self, el, flag, rng, allowed, entity, attr):
        """Resolve a true/false/auto limit flag (checklimited + islimited)."""
        from simjax.mjcf.objects import resolve_limited
        return allowed and resolve_limited(el, flag, rng, self.s.autolimits, entity, attr)

    # ------------------------------------------------------------------ geoms
    def _geom(self, el, fpos, fquat, body, infer):
        a = el.attrs
        s = self.s
        gtype = GEOM_TYPES[a["type"]]
        if gtype == GeomType.SDF and a.get("mesh") is None:
            raise el.error("sdf geom must have valid meshid")
        size = np.array(a["size"], dtype=np.float64)
        pos = np.array(a["pos"], dtype=np.float64)
        quat = np.array([1.0, 0, 0, 0])
        shell = bool(_get(a, "shellinertia", False))
        meshname, hfname = a.get("mesh"), a.get("hfield")
        mesh = hfield = None
        dataid = -1
        if meshname is not None:
            if meshname not in self.mesh_ids:
                raise el.error(f"mesh '{meshname}' not found")
            dataid = self.mesh_ids[meshname]
            mesh = self.meshes[dataid]
        if hfname is not None:
            if hfname not in self.hfield_ids:
                raise el.error(f"hfield '{hfname}' not found")
            dataid = self.hfield_ids[hfname]
            hfield = self.hfields[dataid]
        if gtype in _MESHLIKE and mesh is None:
            raise el.error("mesh geom must have valid meshid")
        if (gtype == GeomType.HFIELD) != (hfield is not None):
            raise el.error("hfield geom must have valid hfieldid")
        if gtype == GeomType.PLANE and body.weldid != 0 and not self.bodies[body.weldid].mocap:
            raise el.error("plane only allowed in static bodies")
        surfacevel = np.asarray(_get(a, "surfacevel", np.zeros(6)), dtype=np.float64)
        if a.get("fromto") is not None:
            pos, quat, size = _fromto(el, gtype, a["fromto"], pos, size, "geom")
        else:
            q = self._orient(el)
            if q is not None:
                quat = q
        if mesh is not None:
            if a.get("fromto") is not None:
                raise el.error("fromto cannot be used with mesh geom")
            center = np.zeros(3)
            if gtype not in _MESHLIKE:
                size, center = _fit_geom(el, gtype, mesh, s.fitaabb, float(a["fitscale"]))
                dataid = -1
            elif shell:
                raise el.error("for mesh geoms, inertia should be specified in the mesh asset")
            meshpos = ori.rotate(mesh.quat, center) + mesh.pos
            pos, quat = ori.frame_compose(pos, quat, meshpos, mesh.quat)
            surfacevel = _mesh_surfacevel(surfacevel, meshpos, mesh.quat)
        _check_size(el, gtype, size)
        if gtype == GeomType.HFIELD:
            hs = hfield.size
            size = np.array([hs[0], hs[1], 0.25 * hs[2] + 0.5 * hs[3]])
        elif gtype in _MESHLIKE:
            lo, hi = _aamm(mesh)
            size = np.maximum(np.abs(lo), np.abs(hi))
        mass_, inertia = 0.0, np.zeros(3)
        if infer:
            mass_, inertia = self._geom_mass(el, a, gtype, size, shell,
                                             mesh if gtype in _MESHLIKE else None)
        fluid = np.zeros(12)
        if _get(a, "fluidshape", "none") == "ellipsoid":
            fluid = fluid_coefs(gtype, size, np.asarray(a["fluidcoef"], dtype=np.float64))
        pos, quat = ori.frame_compose(fpos, fquat, pos, quat)
        return dict(el=el, name=a.get("name") or "", type=gtype, size=size, pos=pos,
                    quat=ori.quat_normalize(quat), dataid=dataid,
                    contype=int(a["contype"]), conaffinity=int(a["conaffinity"]),
                    condim=int(a["condim"]), priority=int(a["priority"]),
                    friction=np.asarray(a["friction"]), solmix=float(a["solmix"]),
                    solref=np.asarray(a["solref"]), solimp=np.asarray(a["solimp"]),
                    margin=float(a["margin"]), gap=float(a["gap"]), group=int(a["group"]),
                    surfacevel=surfacevel,
                    adhesion=float(_get(a, "adhesion", 0.0)), fluid=fluid,
                    rgba=np.asarray(_get(a, "rgba", (0.5, 0.5, 0.5, 1.0)), dtype=np.float64),
                    material=a.get("material") or "",
                    user=_arr(a.get("user")), mass_=mass_, inertia=inertia,
                    infer=infer and s.group_in_range(int(a["group"])),
                    rbound=_rbound(gtype, size, mesh, hfield), aabb=_aabb(gtype, size, mesh,
                                                                          hfield))

    def _geom_mass(self, el, a, gtype, size, shell, mesh):
        if not self.s.group_in_range(int(a["group"])):
            return 0.0, np.zeros(3)
        vol = mesh.volume if mesh is not None else inr.geom_volume(gtype, size, shell)
        density = float(a["density"])
        mass = a.get("mass")
        if mass is not None:
            mass = float(mass)
            if mass == 0:
                return 0.0, np.zeros(3)
            if vol <= inr.EPS:
                return 0.0, np.zeros(3)
            density = mass / vol
        elif density == 0:
            return 0.0, np.zeros(3)
        else:
            mass = density * vol
        if mass < 0 or density < 0:
            raise el.error("mass, inertia or density are negative in geom")
        if mesh is not None:
            inertia = np.asarray(mesh_mod.geom_mesh_inertia(mesh, mass), dtype=np.float64)
        else:
            inertia = inr.geom_inertia(gtype, size, mass, shell)
        return mass, inertia

    # ------------------------------------------------------------------ sites / cameras
    def _site(self, el, fpos, fquat):
        a = el.attrs
        stype = GEOM_TYPES[a["type"]]
        size = np.array(a["size"], dtype=np.float64)
        pos = np.array(a["pos"], dtype=np.float64)
        quat = np.array([1.0, 0, 0, 0])
        if a.get("fromto") is not None:
            pos, quat, size = _fromto(el, stype, a["fromto"], pos, size, "site")
        else:
            q = self._orient(el)
            if q is not None:
                quat = q
        pos, quat = ori.frame_compose(fpos, fquat, pos, quat)
        return dict(el=el, name=a.get("name") or "", type=stype, size=size, pos=pos,
                    quat=ori.quat_normalize(quat), group=int(a["group"]),
                    user=_arr(a.get("user")))

    def _camera(self, el, fpos, fquat):
        a = el.attrs
        q = self._orient(el)
        quat = np.array([1.0, 0, 0, 0]) if q is None else q
        pos, quat = ori.frame_compose(fpos, fquat, np.asarray(a["pos"], dtype=np.float64),
                                      quat)
        fovy = float(_get(a, "fovy", 45.0))
        if fovy >= 180:
            raise el.error(f"fovy too large in camera '{a.get('name') or ''}'")
        return dict(el=el, name=a.get("name") or "", pos=pos, quat=ori.quat_normalize(quat),
                    mode=_CAM_MODES[_get(a, "mode", "fixed")], target=a.get("target"),
                    fovy=fovy,
                    resolution=np.asarray(_get(a, "resolution", [1, 1]), dtype=np.int32),
                    projection=1 if _get(a, "projection", "perspective") == "orthographic"
                    else 0, attrs=a)


# ---------------------------------------------------------------------- helpers
def _check_moving_mass(bodies):
    """A body with joints needs mass and principal inertias >= mjMINVAL, its own or
    those of a descendant welded to it through joint-free bodies (MuJoCo's
    CheckBodyMassInertia); otherwise its mass matrix would be singular."""
    children = [[] for _ in bodies]
    for b in bodies[1:]:
        children[b.parent].append(b)

    def ok(b):
        if b.mass >= _MINVAL and np.all(np.asarray(b.inertia) >= _MINVAL):
            return True
        return any(ok(c) for c in children[b.id] if not c.joints)

    for b in bodies[1:]:
        if b.joints and not ok(b):
            raise b.el.error("mass and inertia of moving bodies must be larger than mjMINVAL")


def _arr(v):
    return np.zeros(0) if v is None else np.atleast_1d(np.asarray(v, dtype=np.float64))


def _get(attrs, key, default):
    """attrs[key], or ``default`` when unset (None)."""
    v = attrs.get(key)
    return default if v is None else v


def _poly3(v):
    out = np.zeros(3)
    v = np.atleast_1d(np.asarray(v, dtype=np.float64))
    out[:len(v)] = v[:3]
    return out


def _mesh_surfacevel(sv, meshpos, meshquat):
    """A surface velocity re-expressed in the geom frame that absorbed the mesh frame
    (mjCGeom::Compile): the angular part's origin moves to the mesh position, and both
    parts turn by the inverse mesh orientation."""
    if not np.any(sv):
        return sv
    inv = ori.quat_conj(meshquat)
    lin = sv[:3] + np.cross(sv[3:], meshpos)
    return np.concatenate([ori.rotate(inv, lin), ori.rotate(inv, sv[3:])])


def _fromto(el, gtype, ft, pos, size, what):
    ft = np.asarray(ft, dtype=np.float64)
    if gtype not in (GeomType.CAPSULE, GeomType.CYLINDER, GeomType.ELLIPSOID, GeomType.BOX):
        raise el.error(f"fromto requires capsule, cylinder, box or ellipsoid in {what}")
    if np.any(pos != 0):
        raise el.error(f"both pos and fromto defined in {what}")
    vec = ft[:3] - ft[3:]
    half = np.linalg.norm(vec) / 2
    if half < inr.EPS:
        raise el.error(f"fromto points too close in {what}")
    size = size.copy()
    if gtype in (GeomType.ELLIPSOID, GeomType.BOX):
        size[2] = half
        size[1] = size[0]
    else:
        size[1] = half
    return (ft[:3] + ft[3:]) / 2, ori.zaxis_quat(vec), size


def _check_size(el, gtype, size):
    if gtype == GeomType.PLANE:
        if size[2] <= 0:
            raise el.error("plane size(3) must be positive")
        return
    for i in range(_GEOM_NSIZE[gtype]):
        if size[i] <= 0:
            raise el.error(f"size {i} must be positive in geom")


def _aamm(mesh):
    aamm = np.asarray(mesh.aamm, dtype=np.float64)
    return aamm[:3], aamm[3:]


def _fit_geom(el, gtype, mesh, fitaabb, fitscale):
    names = {GeomType.SPHERE: "sphere", GeomType.CAPSULE: "capsule",
             GeomType.CYLINDER: "cylinder", GeomType.ELLIPSOID: "ellipsoid",
             GeomType.BOX: "box"}
    if gtype not in names:
        raise el.error("invalid geom type in fitting mesh")
    size, center = mesh_mod.fit_geom_size(mesh, names[gtype], fitaabb, fitscale)
    return np.asarray(size, dtype=np.float64), np.asarray(center, dtype=np.float64)


def _rbound(gtype, size, mesh, hfield):
    if gtype == GeomType.HFIELD:
        h = hfield.size
        return float(np.sqrt(h[0] ** 2 + h[1] ** 2 + max(h[2] ** 2, h[3] ** 2)))
    if gtype == GeomType.SPHERE:
        return size[0]
    if gtype == GeomType.CAPSULE:
        return size[0] + size[1]
    if gtype == GeomType.CYLINDER:
        return float(np.hypot(size[0], size[1]))
    if gtype == GeomType.ELLIPSOID:
        return float(size.max())
    if gtype == GeomType.BOX:
        return float(np.linalg.norm(size))
    if gtype in _MESHLIKE:
        lo, hi = _aamm(mesh)
        return float(np.linalg.norm(np.maximum(np.abs(lo), np.abs(hi))))
    return 0.0


def _aabb(gtype, size, mesh, hfield):
    if gtype == GeomType.HFIELD:
        h = hfield.size
        lo, hi = np.array([-h[0], -h[1], -h[3]]), np.array([h[0], h[1], h[2]])
    elif gtype == GeomType.SPHERE:
        hi = np.full(3, size[0])
        lo = -hi
    elif gtype == GeomType.CAPSULE:
        hi = np.array([size[0], size[0], size[0] + size[1]])
        lo = -hi
    elif gtype == GeomType.CYLINDER:
        hi = np.array([size[0], size[0], size[1]])
        lo = -hi
    elif gtype in _MESHLIKE:
        lo, hi = _aamm(mesh)
    elif gtype == GeomType.PLANE:
        big = 1e10  # mjMAXVAL
        lo, hi = np.array([-big, -big, -big]), np.array([big, big, 0.0])
    else:
        hi = np.asarray(size, dtype=np.float64)
        lo = -hi
    return np.concatenate([(lo + hi) / 2, (hi - lo) / 2])


def same_frame(pos, quat, ipos=None, iquat=None):
    """mjtSameframe code of a child frame relative to its body (and inertial) frame."""
    null_pos = np.all(np.abs(pos) < _FRAME_EPS)
    null_quat = _same_quat(quat, np.array([1.0, 0, 0, 0]))
    if null_pos and null_quat:
        return SameFrame.BODY
    if null_quat:
        return SameFrame.BODYROT
    if ipos is None:
        return SameFrame.NONE
    if np.all(np.abs(pos - ipos) < _FRAME_EPS) and _same_quat(quat, iquat):
        return SameFrame.INERTIA
    if _same_quat(quat, iquat):
        return SameFrame.INERTIAROT
    return SameFrame.NONE


def _same_quat(q1, q2):
    return bool(np.all(np.abs(q1 - q2) < _FRAME_EPS) or np.all(np.abs(q1 + q2) < _FRAME_EPS))
