"""Model, Option, Statistic and the enums, with mjModel's names and layouts.

A :class:`Model` is a frozen pytree. Its *structure* (counts, ids, types, addresses,
option enums, iteration counts, names) is static: numpy arrays and Python values kept in
the pytree's auxiliary data and hashed by content, so ``jax.jit`` specialises on them.
Its *physical parameters* (every float array: masses, inertias, positions, gains, ...)
are leaves, so they can be differentiated and vmapped (``in_axes`` over e.g.
``body_mass``).
"""
from __future__ import annotations

import dataclasses
import enum
import hashlib
from typing import Any

import jax
import numpy as np

from simjax._fields import MODEL_FIELDS, SIZE_CONSTANTS


# --------------------------------------------------------------------------- enums
class JointType(enum.IntEnum):
    FREE = 0
    BALL = 1
    SLIDE = 2
    HINGE = 3


class GeomType(enum.IntEnum):
    PLANE = 0
    HFIELD = 1
    SPHERE = 2
    CAPSULE = 3
    ELLIPSOID = 4
    CYLINDER = 5
    BOX = 6
    MESH = 7
    SDF = 8


class ObjType(enum.IntEnum):
    UNKNOWN = 0
    BODY = 1
    XBODY = 2
    JOINT = 3
    DOF = 4
    GEOM = 5
    SITE = 6
    CAMERA = 7
    LIGHT = 8
    FLEX = 9
    MESH = 10
    SKIN = 11
    HFIELD = 12
    TEXTURE = 13
    MATERIAL = 14
    PAIR = 15
    EXCLUDE = 16
    EQUALITY = 17
    TENDON = 18
    ACTUATOR = 19
    SENSOR = 20
    NUMERIC = 21
    TEXT = 22
    TUPLE = 23
    KEY = 24
    PLUGIN = 25


class TrnType(enum.IntEnum):
    JOINT = 0
    JOINTINPARENT = 1
    SLIDERCRANK = 2
    TENDON = 3
    SITE = 4
    BODY = 5
    SO3 = 6
    UNDEFINED = 1000


class DynType(enum.IntEnum):
    NONE = 0
    INTEGRATOR = 1
    FILTER = 2
    FILTEREXACT = 3
    MUSCLE = 4
    DCMOTOR = 5
    PID = 6
    USER = 7


class GainType(enum.IntEnum):
    FIXED = 0
    AFFINE = 1
    MUSCLE = 2
    DCMOTOR = 3
    SO3 = 4
    PID = 5
    USER = 6


class BiasType(enum.IntEnum):
    NONE = 0
    AFFINE = 1
    MUSCLE = 2
    DCMOTOR = 3
    SO3 = 4
    USER = 5


class EqType(enum.IntEnum):
    CONNECT = 0
    WELD = 1
    JOINT = 2
    TENDON = 3
    FLEX = 4
    FLEXVERT = 5
    FLEXSTRAIN = 6
    DISTANCE = 7


class WrapType(enum.IntEnum):
    NONE = 0
    JOINT = 1
    PULLEY = 2
    SITE = 3
    SPHERE = 4
    CYLINDER = 5


class IntegratorType(enum.IntEnum):
    EULER = 0
    RK4 = 1
    IMPLICIT = 2
    IMPLICITFAST = 3
    #: MuJoCo 4's discrete-time integrator (mjINT_DISCRETE): parsed, refused by the
    #: engine (simjax.engine.forward.check_options)
    DISCRETE = 4


class ConeType(enum.IntEnum):
    PYRAMIDAL = 0
    ELLIPTIC = 1


class JacobianType(enum.IntEnum):
    DENSE = 0
    SPARSE = 1
    AUTO = 2


class SolverType(enum.IntEnum):
    PGS = 0
    CG = 1
    NEWTON = 2


class DisableBit(enum.IntFlag):
    CONSTRAINT = 1 << 0
    EQUALITY = 1 << 1
    FRICTIONLOSS = 1 << 2
    LIMIT = 1 << 3
    CONTACT = 1 << 4
    SPRING = 1 << 5
    DAMPER = 1 << 6
    GRAVITY = 1 << 7
    CLAMPCTRL = 1 << 8
    WARMSTART = 1 << 9
    FILTERPARENT = 1 << 10
    ACTUATION = 1 << 11
    REFSAFE = 1 << 12
    SENSOR = 1 << 13
    MIDPHASE = 1 << 14
    EULERDAMP = 1 << 15
    AUTORESET = 1 << 16
    NATIVECCD = 1 << 17
    ISLAND = 1 << 18
    MULTICCD = 1 << 19


class EnableBit(enum.IntFlag):
    OVERRIDE = 1 << 0
    ENERGY = 1 << 1
    FWDINV = 1 << 2
    INVDISCRETE = 1 << 3
    SLEEP = 1 << 4
    DIAGEXACT = 1 << 5
    IPC = 1 << 6
    SPECULATIVE = 1 << 7


class SameFrame(enum.IntEnum):
    NONE = 0
    BODY = 1
    INERTIA = 2
    BODYROT = 3
    INERTIAROT = 4


class Stage(enum.IntEnum):
    NONE = 0
    POS = 1
    VEL = 2
    ACC = 3


class DataType(enum.IntEnum):
    REAL = 0
    POSITIVE = 1
    AXIS = 2
    QUATERNION = 3


class CamLight(enum.IntEnum):
    FIXED = 0
    TRACK = 1
    TRACKCOM = 2
    TARGETBODY = 3
    TARGETBODYCOM = 4


class SensorType(enum.IntEnum):
    TOUCH = 0
    ACCELEROMETER = 1
    VELOCIMETER = 2
    GYRO = 3
    FORCE = 4
    TORQUE = 5
    MAGNETOMETER = 6
    RANGEFINDER = 7
    CAMPROJECTION = 8
    JOINTPOS = 9
    JOINTVEL = 10
    TENDONPOS = 11
    TENDONVEL = 12
    ACTUATORPOS = 13
    ACTUATORVEL = 14
    ACTUATORFRC = 15
    JOINTACTFRC = 16
    TENDONACTFRC = 17
    BALLQUAT = 18
    BALLANGVEL = 19
    JOINTLIMITPOS = 20
    JOINTLIMITVEL = 21
    JOINTLIMITFRC = 22
    TENDONLIMITPOS = 23
    TENDONLIMITVEL = 24
    TENDONLIMITFRC = 25
    FRAMEPOS = 26
    FRAMEQUAT = 27
    FRAMEXAXIS = 28
    FRAMEYAXIS = 29
    FRAMEZAXIS = 30
    FRAMELINVEL = 31
    FRAMEANGVEL = 32
    FRAMELINACC = 33
    FRAMEANGACC = 34
    SUBTREECOM = 35
    SUBTREELINVEL = 36
    SUBTREEANGMOM = 37
    INSIDESITE = 38
    GEOMDIST = 39
    GEOMNORMAL = 40
    GEOMFROMTO = 41
    CONTACT = 42
    E_POTENTIAL = 43
    E_KINETIC = 44
    CLOCK = 45
    TACTILE = 46
    PLUGIN = 47
    USER = 48


# --------------------------------------------------------------------------- counts
#: Scalar sizes of a Model (mjModel's names). All are static Python ints.
MODEL_COUNTS = (
    "nq", "nv", "nu", "na", "nbody", "njnt", "ngeom", "nsite", "ncam", "nlight",
    "nmesh", "nmat", "nmeshvert", "nmeshface", "nhfield", "nhfielddata", "ntendon", "nwrap",
    "nsensor", "nsensordata", "nkey", "nmocap", "neq", "npair", "nexclude", "nplugin",
    "npluginstate", "nnumeric", "nnumericdata", "ntuple", "ntupledata", "ntree",
    "nactuator", "nout", "nhistory", "nplastic", "ngravcomp", "nuserdata",
    "nuser_body", "nuser_jnt", "nuser_geom", "nuser_site", "nuser_cam",
    "nuser_tendon", "nuser_actuator", "nuser_sensor", "nbvh", "nbvhstatic", "nmeshframe",
)

#: Float arrays that are structure, not parameters: kept static (numpy).
STATIC_FLOAT_FIELDS = frozenset({"mesh_vert", "mesh_frame", "hfield_data", "hfield_size", "geom_rbound",
                                 "cam_intrinsic",
                                 "cam_sensorsize", "cam_mat0", "cam_pos0",
                                 "cam_poscom0", "numeric_data", "tuple_objprm",
                                 "geom_rgba", "mat_rgba"})

FIELD_SPEC = {name: (kind, rows, cols) for name, kind, rows, cols, _ in MODEL_FIELDS}


def field_shape(name: str, counts: dict[str, int]) -> tuple[int, ...]:
    """Shape of Model array ``name`` given the model's counts (mjModel layout)."""
    _, rows, cols = FIELD_SPEC[name]

    def size(tok):
        if isinstance(tok, int):
            return tok
        if tok in SIZE_CONSTANTS:
            return SIZE_CONSTANTS[tok]
        if "*" in tok:
            a, b = tok.split("*")
            return counts[a] * int(b)
        return counts[tok]

    n, c = size(rows), size(cols)
    return (n,) if cols == 1 else (n, c)


def is_static_field(name: str) -> bool:
    kind = FIELD_SPEC[name][0]
    return kind != "f" or name in STATIC_FLOAT_FIELDS


# --------------------------------------------------------------------------- hashing
def _content_key(value: Any):
    """A hashable, content-based key for static pytree metadata."""
    if isinstance(value, np.ndarray):
        value.flags.writeable = False
        return ("nd", value.dtype.str, value.shape, hashlib.sha1(
            np.ascontiguousarray(value).tobytes()).hexdigest())
    if isinstance(value, dict):
        return ("d", tuple(sorted((k, _content_key(v)) for k, v in value.items())))
    if isinstance(value, (list, tuple)):
        return ("t", tuple(_content_key(v) for v in value))
    return value


class _Static:
    """Static half of a flattened pytree: compares and hashes by content."""

    __slots__ = ("names", "values", "_key")

    def __init__(self, names, values):
        self.names = names
        self.values = values
        self._key = (names, tuple(_content_key(v) for v in values))

    def __hash__(self):
        return hash(self._key)

    def __eq__(self, other):
        return isinstance(other, _Static) and self._key == other._key


def _register(cls, static_names, leaf_names):
    """Register ``cls`` (a frozen dataclass) as a pytree with content-hashed statics."""
    static_names = tuple(static_names)
    leaf_names = tuple(leaf_names)

    def static(obj):
        # Hashing the static arrays by content costs milliseconds on large models (height
        # fields, mesh tables, BVHs), and jit flattens its arguments on every call. The
        # key is kept on the object and reused while its static attributes are the very
        # same objects; the arrays are made read-only when hashed, so an in-place edit
        # raises instead of leaving a stale key (replace the array to change it).
        values = tuple(getattr(obj, n) for n in static_names)
        cached = obj.__dict__.get("_static_aux")
        if cached is not None and all(a is b for a, b in zip(cached.values, values)):
            return cached
        aux = _Static(static_names, values)
        object.__setattr__(obj, "_static_aux", aux)
        return aux

    def flatten_with_keys(obj):
        leaves = tuple((jax.tree_util.GetAttrKey(n), getattr(obj, n)) for n in leaf_names)
        return leaves, static(obj)

    def flatten(obj):
        return tuple(getattr(obj, n) for n in leaf_names), static(obj)

    def unflatten(aux, leaves):
        obj = object.__new__(cls)
        for n, v in zip(aux.names, aux.values):
            object.__setattr__(obj, n, v)
        for n, v in zip(leaf_names, leaves):
            object.__setattr__(obj, n, v)
        object.__setattr__(obj, "_static_aux", aux)
        return obj

    jax.tree_util.register_pytree_with_keys(cls, flatten_with_keys, unflatten, flatten)
    return cls


class _Base:
    def replace(self, **changes):
        """A copy with some fields replaced (like ``dataclasses.replace``)."""
        return dataclasses.replace(self, **changes)


# --------------------------------------------------------------------------- Option
_OPTION_STATIC = ("integrator", "cone", "jacobian", "solver", "iterations",
                  "ls_iterations", "noslip_iterations", "ccd_iterations",
                  "sdf_iterations", "sdf_initpoints", "disableflags", "enableflags",
                  "disableactuator")
_OPTION_LEAVES = ("timestep", "impratio", "tolerance", "ls_tolerance",
                  "noslip_tolerance", "ccd_tolerance", "sleep_tolerance", "gravity",
                  "wind", "magnetic", "density", "viscosity", "o_margin", "o_solref",
                  "o_solimp", "o_friction")


@dataclasses.dataclass(frozen=True, eq=False)
class Option(_Base):
    """Physics options (mjOption). Units: SI; gravity/wind/magnetic in world frame."""

    timestep: Any = 0.002
    impratio: Any = 1.0
    tolerance: Any = 1e-8
    ls_tolerance: Any = 0.01
    noslip_tolerance: Any = 1e-6
    ccd_tolerance: Any = 1e-6
    sleep_tolerance: Any = 1e-3
    gravity: Any = (0.0, 0.0, -9.81)
    wind: Any = (0.0, 0.0, 0.0)
    magnetic: Any = (0.0, -0.5, 0.0)
    density: Any = 0.0
    viscosity: Any = 0.0
    o_margin: Any = 0.0
    o_solref: Any = (0.02, 1.0)
    o_solimp: Any = (0.9, 0.95, 0.001, 0.5, 2.0)
    o_friction: Any = (1.0, 1.0, 0.005, 0.0001, 0.0001)
    integrator: int = IntegratorType.EULER
    cone: int = ConeType.PYRAMIDAL
    jacobian: int = JacobianType.AUTO
    solver: int = SolverType.NEWTON
    iterations: int = 100
    ls_iterations: int = 50
    noslip_iterations: int = 0
    ccd_iterations: int = 35
    sdf_iterations: int = 10
    sdf_initpoints: int = 40
    disableflags: int = 0
    enableflags: int = 0
    disableactuator: int = 0


_register(Option, _OPTION_STATIC, _OPTION_LEAVES)

_STAT_LEAVES = ("meaninertia", "meanmass", "meansize", "extent", "center")


@dataclasses.dataclass(frozen=True, eq=False)
class Statistic(_Base):
    """Model statistics at qpos0 (mjStatistic)."""

    meaninertia: Any = 1.0
    meanmass: Any = 1.0
    meansize: Any = 0.2
    extent: Any = 2.0
    center: Any = (0.0, 0.0, 0.0)


_register(Statistic, (), _STAT_LEAVES)


# --------------------------------------------------------------------------- Model
_MODEL_ARRAY_NAMES = tuple(f[0] for f in MODEL_FIELDS)
_MODEL_EXTRA_STATIC = ("names", "plugin_specs", "sensor_specs", "signature",
                       "dof_hasfrictionloss", "tendon_hasfrictionloss")


def _model_fields():
    fields = [(n, int, dataclasses.field(default=0)) for n in MODEL_COUNTS]
    fields += [(n, Any, dataclasses.field(default=None)) for n in _MODEL_ARRAY_NAMES]
    fields += [("opt", Option, dataclasses.field(default_factory=Option)),
               ("stat", Statistic, dataclasses.field(default_factory=Statistic)),
               ("names", dict, dataclasses.field(default_factory=dict)),
               ("plugin_specs", tuple, dataclasses.field(default=())),
               ("sensor_specs", tuple, dataclasses.field(default=())),
               ("signature", int, dataclasses.field(default=0)),
               # which dofs / tendons get a friction-loss constraint row (structure read
               # from the parameters when the model is built; None: all of them)
               ("dof_hasfrictionloss", Any, dataclasses.field(default=None)),
               ("tendon_hasfrictionloss", Any, dataclasses.field(default=None)),
               # per-instance plugin parameters (pytrees from Plugin.init): leaves
               ("plugin_params", tuple, dataclasses.field(default=()))]
    return fields


def _model_doc():
    lines = ["Compiled model (mjModel): structure static, parameters as jax leaves.",
             "",
             "Field names, shapes and meanings follow mjModel. ``names`` maps an object",
             "type name ('body', 'joint', 'geom', ...) to the list of names by id.",
             "", "Arrays:"]
    for name, kind, rows, cols, meaning in MODEL_FIELDS:
        lines.append(f"    {name} ({rows} x {cols}, {kind}): {meaning}")
    lines += ["", "Structure read from parameters when the model is built (static; as MJX):",
              "    dof_hasfrictionloss (nv, bool): dof_frictionloss != 0, the dofs that get",
              "        a friction-loss constraint row (None: every dof)",
              "    tendon_hasfrictionloss (ntendon, bool): tendon_frictionloss > 0 (None:",
              "        every tendon)",
              "A Model whose friction losses change from zero to non-zero needs these",
              "updated (:func:`frictionloss_structure`) and a new Data (make_data): the",
              "constraint rows, and so Data's efc capacity, follow them."]
    return "\n".join(lines)


Model = dataclasses.make_dataclass(
    "Model", _model_fields(), bases=(_Base,), frozen=True, eq=False,
    namespace={"__doc__": _model_doc(), "__module__": __name__})


def _model_id(self, objtype: str, name: str) -> int:
    """Id of the object of type ``objtype`` named ``name`` (mj_name2id); -1 if absent."""
    try:
        return self.names[objtype].index(name)
    except (KeyError, ValueError):
        return -1


def _model_name(self, objtype: str, objid: int) -> str:
    """Name of object ``objid`` of type ``objtype`` (mj_id2name); '' if unnamed."""
    return self.names[objtype][objid]


Model.name2id = _model_id
Model.id2name = _model_name

_MODEL_STATIC = tuple(MODEL_COUNTS) + tuple(
    n for n in _MODEL_ARRAY_NAMES if is_static_field(n)) + _MODEL_EXTRA_STATIC
_MODEL_LEAVES = tuple(n for n in _MODEL_ARRAY_NAMES if not is_static_field(n)) + (
    "opt", "stat", "plugin_params")
_register(Model, _MODEL_STATIC, _MODEL_LEAVES)


def frictionloss_structure(dof_frictionloss, tendon_frictionloss) -> dict:
    """The Model's friction-loss structure for these parameter values (numpy): the
    ``dof_hasfrictionloss`` (nv,) and ``tendon_hasfrictionloss`` (ntendon,) masks of the
    dofs and tendons that get a friction-loss constraint row. MuJoCo
    (mj_instantiateFriction) adds a row for a non-zero dof friction loss and a positive
    tendon one; rows for zero losses would never be active, but would cost every step
    (barkour's compile CPU 0.87x without them, paired in one process). Use as ``m.replace(**frictionloss_structure(a, b))``
    after changing which losses are zero, then make a new Data."""
    return dict(dof_hasfrictionloss=np.asarray(dof_frictionloss).reshape(-1) != 0,
                tendon_hasfrictionloss=np.asarray(tendon_frictionloss).reshape(-1) > 0)


def mesh_frames(mesh_vertnum, mesh_normaladr, mesh_normalnum, mesh_normal) -> dict:
    """``nmeshframe``, ``mesh_frameadr`` and ``mesh_frame`` from mjModel's mesh normals:
    the meshes with three normals per vertex (tactile sensors' tangent frames) keep
    theirs, (nvert, 9) each."""
    vertnum, adr = np.asarray(mesh_vertnum), np.asarray(mesh_normaladr)
    num, normal = np.asarray(mesh_normalnum), np.asarray(mesh_normal, np.float64)
    frameadr, rows, n = np.full(len(vertnum), -1, np.int32), [], 0
    for i in np.nonzero(num == 3 * vertnum)[0]:
        frameadr[i] = n
        rows.append(normal.reshape(-1, 3)[adr[i]:adr[i] + num[i]].reshape(-1, 9))
        n += int(vertnum[i])
    frame = np.concatenate(rows) if rows else np.zeros((0, 9))
    return dict(nmeshframe=n, mesh_frameadr=frameadr, mesh_frame=frame)


def model_counts(model) -> dict[str, int]:
    return {n: getattr(model, n) for n in MODEL_COUNTS}


def leaf(value):
    """A Model leaf (jax array) from a numpy array or Python number: same dtype and weak
    type as ``jnp.asarray``, but a plain host-to-device copy, whereas ``jnp.asarray``
    compiles one conversion program per shape (dozens at load time)."""
    if isinstance(value, np.ndarray):
        value = value.copy()
    return jax.device_put(value)
