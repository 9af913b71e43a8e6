"""MJCF -> Model: global settings, assets, ids and the final arrays (numpy only).

``load_model`` parses the XML (``simjax.mjcf.parse``), compiles the body tree
(``tree``) and the other elements (``objects``), lays everything out in mjModel's
arrays (``layout``) and finally asks the engine for the quantities MuJoCo computes at
the reference pose (``simjax.engine.setconst``, the analogue of ``mj_setConst``).
"""
from __future__ import annotations

import dataclasses
import os

import numpy as np

from simjax.errors import MJCFError, UnsupportedFeatureError
from simjax.mjcf import layout
from simjax.mjcf import objects as obj
from simjax.mjcf.tree import TreeBuilder
from simjax.types import ConeType, EnableBit, IntegratorType, JacobianType, SolverType

_FLAG_DISABLE = ("constraint", "equality", "frictionloss", "limit", "contact", "spring",
                 "damper", "gravity", "clampctrl", "warmstart", "filterparent", "actuation",
                 "refsafe", "sensor", "midphase", "eulerdamp", "autoreset", "nativeccd",
                 "island", "multiccd")
_FLAG_ENABLE = ("override", "energy", "fwdinv", "invdiscrete", "sleep", "diagexact", "ipc",
                "speculative")


@dataclasses.dataclass
class Settings:
    """Resolved <compiler> settings (last value of each attribute wins)."""

    to_rad: float = np.pi / 180
    eulerseq: str = "xyz"
    autolimits: bool = True
    inertiafromgeom: str = "auto"
    inertiagrouprange: tuple = (0, 5)
    boundmass: float = 0.0
    boundinertia: float = 0.0
    balanceinertia: bool = False
    settotalmass: float = -1.0
    meshdir: str | None = None
    texturedir: str | None = None
    strippath: bool = False
    fitaabb: bool = False
    alignfree: bool = False
    discardvisual: bool = False
    fusestatic: bool = False
    default_solref: np.ndarray = dataclasses.field(
        default_factory=lambda: np.array([0.02, 1.0]))
    default_solimp: np.ndarray = dataclasses.field(
        default_factory=lambda: np.array([0.9, 0.95, 0.001, 0.5, 2.0]))
    #: <compiler><lengthrange> attributes given (last value of each wins)
    lengthrange: dict = dataclasses.field(default_factory=dict)

    def group_in_range(self, group: int) -> bool:
        return self.inertiagrouprange[0] <= group <= self.inertiagrouprange[1]


def _settings(root) -> Settings:
    s = Settings()
    for el in root.children:
        if el.tag != "compiler":
            continue
        a, g = el.attrs, el.given
        if "angle" in g:
            s.to_rad = 1.0 if a["angle"] == "radian" else np.pi / 180
        for key in ("eulerseq", "inertiafromgeom"):
            if key in g:
                setattr(s, key, a[key])
        for key in ("autolimits", "balanceinertia", "strippath", "fitaabb", "alignfree",
                    "discardvisual", "fusestatic"):
            if key in g:
                setattr(s, key, bool(a[key]))
        for key in ("boundmass", "boundinertia", "settotalmass"):
            if key in g:
                setattr(s, key, float(a[key]))
        if "inertiagrouprange" in g:
            s.inertiagrouprange = tuple(int(v) for v in a["inertiagrouprange"])
        if "assetdir" in g:
            s.meshdir = s.meshdir or a["assetdir"]
            s.texturedir = s.texturedir or a["assetdir"]
        if "meshdir" in g:
            s.meshdir = a["meshdir"]
        if "texturedir" in g:
            s.texturedir = a["texturedir"]
        for lr in el.children:
            if lr.tag == "lengthrange":
                s.lengthrange.update({k: lr.attrs[k] for k in lr.given})
        if "coordinate" in g and a["coordinate"] == "global":
            raise el.error("global coordinates no longer supported; use local")
        if len(s.eulerseq) != 3 or any(c not in "xyzXYZ" for c in s.eulerseq):
            raise el.error("euler sequence must have 3 characters from xyzXYZ")
    return s


_OPT_FLOAT = ("timestep", "impratio", "tolerance", "ls_tolerance", "noslip_tolerance",
              "ccd_tolerance", "sleep_tolerance", "density", "viscosity")
_OPT_VEC = ("gravity", "wind", "magnetic")
_OPT_INT = ("iterations", "ls_iterations", "noslip_iterations", "ccd_iterations",
            "sdf_iterations", "sdf_initpoints")
_ENUMS = {"integrator": {"euler": IntegratorType.EULER, "rk4": IntegratorType.RK4,
                         "implicit": IntegratorType.IMPLICIT,
                         "implicitfast": IntegratorType.IMPLICITFAST,
                         "discrete": IntegratorType.DISCRETE},
          "cone": {"pyramidal": ConeType.PYRAMIDAL, "elliptic": ConeType.ELLIPTIC},
          "jacobian": {"dense": JacobianType.DENSE, "sparse": JacobianType.SPARSE,
                       "auto": JacobianType.AUTO},
          "solver": {"pgs": SolverType.PGS, "cg": SolverType.CG, "newton": SolverType.NEWTON}}


def _options(root) -> dict:
    """Option values as plain numbers (mjOption), last attribute wins."""
    opt = dict(timestep=0.002, impratio=1.0, tolerance=1e-8, ls_tolerance=0.01,
               noslip_tolerance=1e-6, ccd_tolerance=1e-6, sleep_tolerance=1e-3,
               gravity=np.array([0, 0, -9.81]), wind=np.zeros(3),
               magnetic=np.array([0, -0.5, 0]), density=0.0, viscosity=0.0, o_margin=0.0,
               o_solref=np.array([0.02, 1.0]), o_solimp=np.array([0.9, 0.95, 0.001, 0.5, 2]),
               o_friction=np.array([1, 1, 0.005, 0.0001, 0.0001]),
               integrator=0, cone=0, jacobian=2, solver=2, iterations=100, ls_iterations=50,
               noslip_iterations=0, ccd_iterations=35, sdf_iterations=10, sdf_initpoints=40,
               disableflags=0, enableflags=0, disableactuator=0)
    last = None                 # the last <option> element (where errors are reported)
    for el in root.children:
        if el.tag != "option":
            continue
        last = el
        a, g = el.attrs, el.given
        for k in _OPT_FLOAT + ("o_margin",):
            if k in g:
                opt[k] = float(a[k])
        for k in _OPT_VEC + ("o_solref", "o_solimp", "o_friction"):
            if k in g:
                opt[k] = np.asarray(a[k], dtype=np.float64)
        for k in _OPT_INT:
            if k in g:
                opt[k] = int(a[k])
        for k, table in _ENUMS.items():
            if k in g:
                opt[k] = int(table[a[k]])
        if "actuatorgroupdisable" in g:
            bits = 0
            for grp in np.atleast_1d(a["actuatorgroupdisable"]).astype(int):
                if not 0 <= grp <= 30:
                    raise el.error("actuatorgroupdisable values must be in 0..30")
                bits |= 1 << int(grp)
            opt["disableactuator"] = bits
        for fl in el.children:
            if fl.tag != "flag":
                continue
            for i, name in enumerate(_FLAG_DISABLE):
                if name in fl.given:
                    if fl.attrs[name] == "disable":
                        opt["disableflags"] |= 1 << i
                    else:
                        opt["disableflags"] &= ~(1 << i)
            for i, name in enumerate(_FLAG_ENABLE):
                if name in fl.given:
                    if fl.attrs[name] == "enable":
                        opt["enableflags"] |= 1 << i
                    else:
                        opt["enableflags"] &= ~(1 << i)
    if opt["timestep"] <= 0:
        raise MJCFError("timestep must be positive")
    if (opt["enableflags"] & EnableBit.IPC
            and opt["integrator"] != IntegratorType.DISCRETE):
        # MuJoCo 4.0's compiler refuses it too (mj_checkDiscrete)
        raise last.error("flag ipc requires integrator='discrete'")
    return opt


def _sections(root, tag):
    """All children of every ``tag`` section, in document order."""
    out = []
    for sec in root.children:
        if sec.tag == tag:
            out.extend(sec.children)
    return out


def _check_unsupported(root):
    for sec in root.children:
        if sec.tag in ("deformable",) and sec.children:
            raise UnsupportedFeatureError("<deformable> (flex/skin)", sec.file, sec.line, sec.path)


#: name namespaces of elements outside the body tree: section -> {tag or "*": namespace}
_SECTION_NAMES = {"asset": {"texture": "texture", "material": "material", "mesh": "mesh",
                            "hfield": "hfield", "skin": "skin"},
                  "tendon": {"*": "tendon"}, "actuator": {"*": "actuator"},
                  "sensor": {"*": "sensor"}, "equality": {"*": "equality"},
                  "contact": {"pair": "pair", "exclude": "exclude"}, "keyframe": {"key": "key"},
                  "custom": {"numeric": "numeric", "text": "text", "tuple": "tuple"}}
_TREE_NAMES = {"body": "body", "joint": "joint", "freejoint": "joint", "geom": "geom",
               "site": "site", "camera": "camera", "light": "light"}


def _check_names(root):
    """Names are unique within each object type, as in MuJoCo: the second element with a
    name already taken is an error located at that element."""
    seen = {}

    def claim(el, space):
        name = el.attrs.get("name") if "name" in el.given else None
        if not name:
            return
        taken = seen.setdefault(space, set())
        if name in taken:
            raise el.error(f"repeated name '{name}' in {space}")
        taken.add(name)

    def walk_tree(el):
        for ch in el.children:
            if ch.tag in _TREE_NAMES:
                claim(ch, _TREE_NAMES[ch.tag])
            walk_tree(ch)

    for sec in root.children:
        if sec.tag == "worldbody":
            walk_tree(sec)
        table = _SECTION_NAMES.get(sec.tag)
        if table is None:
            continue
        for el in sec.children:
            space = table.get(el.tag, table.get("*"))
            if space is not None:
                claim(el, space)


def _load_assets(root, model_dir, settings, assets, collide_meshes, plugins):
    """Meshes and height fields, in document order; returns lists and name->id maps.
    Meshes backed by an SDF plugin are meshed from its distance field."""
    from simjax.mjcf import hfield as hf
    from simjax.mjcf import mesh as ms
    meshes, hfields, mesh_ids, hfield_ids = [], [], {}, {}
    mesh_names, hfield_names, mesh_els = [], [], []
    for el in _sections(root, "asset"):
        if el.tag == "texture":
            _read_texture_files(el, model_dir, settings, assets)
            continue
        if el.tag not in ("mesh", "hfield"):
            continue
        a = dict(el.attrs)
        name = a.get("name") or (os.path.splitext(os.path.basename(a["file"]))[0]
                                 if a.get("file") else "")
        a["name"] = name
        try:
            if el.tag == "mesh":
                if name in mesh_ids:
                    raise el.error(f"repeated name '{name}' in mesh")
                mesh_ids[name] = len(meshes)
                mesh_names.append(name)
                mesh_els.append(el)
                if plugins.plugin_child(el) is not None:
                    from simjax.mjcf import sdf_mesh
                    meshes.append(sdf_mesh.load_sdf_mesh(el, a, plugins, len(meshes),
                                                         name in collide_meshes))
                    continue
                meshes.append(ms.load_mesh(a, model_dir, settings.meshdir, settings.strippath,
                                           assets, needs_hull=name in collide_meshes))
            else:
                if name in hfield_ids:
                    raise el.error(f"repeated name '{name}' in hfield")
                hfield_ids[name] = len(hfields)
                hfield_names.append(name)
                hfields.append(hf.load_hfield(a, model_dir, settings.meshdir,
                                              settings.strippath, assets))
        except MJCFError as e:
            if e.line is None:
                raise el.error(e.message) from None
            raise
    return meshes, hfields, mesh_ids, hfield_ids, mesh_names, hfield_names, mesh_els


_TEXTURE_FILES = ("file", "fileright", "fileleft", "fileup", "filedown", "filefront",
                  "fileback")


def _read_texture_files(el, model_dir, settings, assets):
    """Texture files are read through the resource providers (texturedir rules) so a
    missing or unreadable file is an error, as in MuJoCo; their pixels are not part of
    the Model (simjax does not render)."""
    from simjax.mjcf.mesh import read_asset
    for key in _TEXTURE_FILES:
        name = el.attrs.get(key)
        if not name:
            continue
        try:
            read_asset(name, model_dir, settings.texturedir, settings.strippath, assets)
        except MJCFError as e:
            raise el.error(e.message) from None


def _collision_meshes(root):
    """Names of meshes used by colliding mesh geoms or pairs (they need a convex hull)."""
    names = set()

    def walk(el):
        for ch in el.children:
            if ch.tag == "geom" and ch.attrs.get("mesh") and (
                    ch.attrs.get("contype") or ch.attrs.get("conaffinity")):
                names.add(ch.attrs["mesh"])
            walk(ch)
    for wb in root.children:
        if wb.tag == "worldbody":
            walk(wb)
    return names


def compile_root(root, model_dir, assets=None, extras=None):
    """Compile a parsed MJCF tree into a Model without the reference-pose constants.
    ``extras`` (a dict), when given, receives ``jnt_springdamper`` (njnt, 2): the
    joints' (timeconst, dampratio), resolved after the reference-pose constants, and
    ``lengthrange``: the ``<compiler><lengthrange>`` options given."""
    from simjax.mjcf import plugin as plg
    from simjax.mjcf import replicate
    settings = _settings(root)
    replicate.expand(root, settings, model_dir, assets)
    _check_unsupported(root)
    _check_names(root)
    opt = _options(root)
    plugins = plg.PluginTable(root)
    meshes, hfields, mesh_ids, hfield_ids, mesh_names, hfield_names, mesh_els = _load_assets(
        root, model_dir, settings, assets, _collision_meshes(root), plugins)
    tb = TreeBuilder(settings, meshes, hfields, mesh_ids, hfield_ids)
    bodies = tb.build([s for s in root.children if s.tag == "worldbody"])
    if settings.fusestatic:
        from simjax.mjcf import fuse
        bodies = fuse.fuse_static(root, bodies)
    if settings.discardvisual:
        from simjax.mjcf import discard
        meshes, mesh_names, mesh_els = discard.discard_visual(
            root, bodies, meshes, mesh_names, mesh_els)
    ids = layout.name_ids(bodies, mesh_names, hfield_names)
    joints = [j for b in bodies for j in b.joints]
    if extras is not None:
        extras["lengthrange"] = dict(settings.lengthrange)
        extras["jnt_springdamper"] = np.array([j["springdamper"] for j in joints],
                                              np.float64).reshape(-1, 2)
    tendon_recs, wtype, wobj, wprm = obj.tendons(_sections(root, "tendon"), ids, settings)
    ids["tendon"] = _index(tendon_recs, "tendon")
    act_recs = obj.actuators(_sections(root, "actuator"), ids, settings, joints, tendon_recs)
    ids["actuator"] = _index(act_recs, "actuator")
    ids["actuator_outnum"] = [r["outnum"] for r in act_recs]
    ids["mesh_vertnum"] = [len(mh.vert) for mh in meshes]
    ids["mesh_el"] = mesh_els
    ids["cam_resolution"] = [c["resolution"] for b in bodies for c in b.cams]
    sensor_recs = obj.sensors(_sections(root, "sensor"), ids, joints, tendon_recs)
    eq_recs = obj.equalities(_sections(root, "equality"), ids)
    geom_els = [g["el"] for b in bodies for g in b.geoms]
    fields = plg.compile_plugins(plugins, bodies, geom_els, mesh_els, act_recs, sensor_recs)
    model = layout.assemble(root, settings, opt, bodies, meshes, hfields, mesh_names,
                            hfield_names, ids, tendon_recs, (wtype, wobj, wprm), act_recs,
                            sensor_recs, eq_recs)
    if plugins.instances:
        model = plg.finish_model(plugins, model.replace(**fields))
    tuple_els = [el for sec in root.children if sec.tag == "custom" for el in sec.children
                 if el.tag == "tuple"]
    if tuple_els:
        tfields, ntuple, ntupledata, tnames = obj.tuples(tuple_els, model.names)
        model = model.replace(ntuple=ntuple, ntupledata=ntupledata,
                              names={**model.names, "tuple": tnames}, **tfields)
    return model


def _index(recs, what):
    """Name -> index of records (dicts with "name" and the element "el" when known);
    a repeated name is an error located at its second element."""
    out = {}
    for i, r in enumerate(recs):
        n = r["name"]
        if n:
            if n in out:
                msg = f"repeated name '{n}' in {what}"
                raise r["el"].error(msg) if r.get("el") is not None else MJCFError(msg)
            out[n] = i
    return out


def load_model(source, assets=None):
    """Parse and compile an MJCF model (see :func:`simjax.load_model`)."""
    from simjax.mjcf.parse import parse
    root, model_dir = parse(source, assets)
    extras = {}
    model = compile_root(root, model_dir, assets, extras)
    from simjax.engine.setconst import auto_spring_damper, length_range, set_const
    model = auto_spring_damper(set_const(model), extras["jnt_springdamper"])
    return length_range(model, extras["lengthrange"])
