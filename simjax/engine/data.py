"""Data: the simulation state and everything the pipeline computes from it (mjData).

``Data`` is a frozen dataclass registered as a pytree whose fields are all ``jax.Array``
leaves with fixed shapes, named and laid out as in mjData, with two deliberate layout
differences that make vectorised code simpler:

- rotation matrices are (n, 3, 3), not (n, 9): ``xmat``, ``ximat``, ``geom_xmat``,
  ``site_xmat``, ``cam_xmat``;
- the inertia matrix is stored dense: ``qM`` is the full symmetric (nv, nv) matrix and
  ``qLD`` its L'DL factorisation in MuJoCo's convention (strictly lower part: unit
  lower-triangular L, diagonal: D; ``qM = L' diag(D) L``). MuJoCo stores ``M`` and
  ``qLD`` sparse; :func:`simjax.engine.support.pack_m` converts to the packed layout.
  ``ten_J`` and ``actuator_moment`` are dense (ntendon, nv) and (nout, nv) as well.

There is no batch axis inside Data: batch with ``jax.vmap``.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

#: mjtWarning indices (MuJoCo 4.0): per-warning counters live in ``Data.warning``.
WARN_INERTIA, WARN_CONTACTFULL, WARN_CNSTRFULL = 0, 1, 2
WARN_BADQPOS, WARN_BADQVEL, WARN_BADQACC, WARN_BADCTRL = 3, 4, 5, 6
NWARNING = 7

#: whether :func:`count_warning` adds a one-hot (read at trace time; False: a
#: ``.at[slot].add`` scatter, kept to compare)
ONEHOT_WARNING = True


def count_warning(warning, slot, flag):
    """``warning`` with ``flag`` (a bool or int scalar) added to counter ``slot``: an
    elementwise add of a constant one-hot, which fuses into its neighbours.

    ``.at[slot].add`` is a scatter: XLA CPU expands every scatter into a loop of its
    own, then runs its simplification fixpoint over the whole program again. With no
    scatter left in the bench's ant rollout (these counters, collision's and
    actuation's, and the factor's failure mark in solver_dense): XLA's simplification
    rounds 13 -> 8 (the fixpoint after the expansion 6 rounds -> 1), 545 -> 542
    kernels, XLA compile CPU 0.91x [0.85, 1.06] (6 paired fresh processes, load
    9-12), run time 1.000x [0.86, 1.23] (12 rounds, load 16). Outputs after 4 steps
    and a forward (batch 32): float32 bit-identical, float64 within rounding (1e-14
    relative; the kernels fuse differently); the batch-1024 rollout in float32 within
    rounding (qacc_smooth 1.9e-6 of 156)."""
    flag = flag.astype(warning.dtype)
    if not ONEHOT_WARNING:
        return warning.at[slot].add(flag)
    onehot = np.arange(warning.shape[-1]) == slot
    return warning + onehot.astype(warning.dtype) * flag


# (name, shape as tuple of count names / ints, kind: "f" float, "i" int32, "b" bool)
DATA_FIELDS = (
    # ----- state and inputs
    ("time", (), "f"),
    ("qpos", ("nq",), "f"),
    ("qvel", ("nv",), "f"),
    ("act", ("na",), "f"),
    ("qacc_warmstart", ("nv",), "f"),
    ("plugin_state", ("npluginstate",), "f"),
    ("history", ("nhistory",), "f"),
    ("plastic", ("nplastic",), "f"),
    ("ctrl", ("nu",), "f"),
    ("qfrc_applied", ("nv",), "f"),
    ("xfrc_applied", ("nbody", 6), "f"),
    ("eq_active", ("neq",), "b"),
    ("mocap_pos", ("nmocap", 3), "f"),
    ("mocap_quat", ("nmocap", 4), "f"),
    ("qacc", ("nv",), "f"),
    ("act_dot", ("na",), "f"),
    ("userdata", ("nuserdata",), "f"),
    ("sensordata", ("nsensordata",), "f"),
    # ----- position dependent: kinematics, com_pos, camlight, tendon, transmission, crb
    ("xpos", ("nbody", 3), "f"),
    ("xquat", ("nbody", 4), "f"),
    ("xmat", ("nbody", 3, 3), "f"),
    ("xipos", ("nbody", 3), "f"),
    ("ximat", ("nbody", 3, 3), "f"),
    ("xanchor", ("njnt", 3), "f"),
    ("xaxis", ("njnt", 3), "f"),
    ("geom_xpos", ("ngeom", 3), "f"),
    ("geom_xmat", ("ngeom", 3, 3), "f"),
    ("site_xpos", ("nsite", 3), "f"),
    ("site_xmat", ("nsite", 3, 3), "f"),
    ("cam_xpos", ("ncam", 3), "f"),
    ("cam_xmat", ("ncam", 3, 3), "f"),
    ("subtree_com", ("nbody", 3), "f"),
    ("cdof", ("nv", 6), "f"),
    ("cinert", ("nbody", 10), "f"),
    ("ten_length", ("ntendon",), "f"),
    ("ten_J", ("ntendon", "nv"), "f"),
    ("ten_wrapadr", ("ntendon",), "i"),
    ("ten_wrapnum", ("ntendon",), "i"),
    ("wrap_obj", ("2*nwrap",), "i"),
    ("wrap_xpos", ("2*nwrap", 3), "f"),
    ("actuator_length", ("nout",), "f"),
    ("actuator_moment", ("nout", "nv"), "f"),
    ("crb", ("nbody", 10), "f"),
    ("qM", ("nv", "nv"), "f"),
    ("qLD", ("nv", "nv"), "f"),
    # ----- velocity dependent
    ("ten_velocity", ("ntendon",), "f"),
    ("actuator_velocity", ("nout",), "f"),
    ("cvel", ("nbody", 6), "f"),
    ("cdof_dot", ("nv", 6), "f"),
    ("qfrc_bias", ("nv",), "f"),
    ("qfrc_spring", ("nv",), "f"),
    ("qfrc_damper", ("nv",), "f"),
    ("qfrc_gravcomp", ("nv",), "f"),
    ("qfrc_fluid", ("nv",), "f"),
    ("qfrc_adhesion", ("nv",), "f"),
    ("qfrc_passive", ("nv",), "f"),
    ("subtree_linvel", ("nbody", 3), "f"),
    ("subtree_angmom", ("nbody", 3), "f"),
    # ----- actuation / acceleration dependent
    ("actuator_force", ("nout",), "f"),
    ("qfrc_actuator", ("nv",), "f"),
    ("qfrc_smooth", ("nv",), "f"),
    ("qacc_smooth", ("nv",), "f"),
    ("qfrc_constraint", ("nv",), "f"),
    ("qfrc_inverse", ("nv",), "f"),
    ("cacc", ("nbody", 6), "f"),
    ("cfrc_int", ("nbody", 6), "f"),
    ("cfrc_ext", ("nbody", 6), "f"),
    # ----- diagnostics
    ("energy", (2,), "f"),
    ("warning", (NWARNING,), "i"),
)

DATA_FIELD_NAMES = tuple(f[0] for f in DATA_FIELDS)


# --------------------------------------------------------------------------- contacts
#: Fields of :class:`Contact` (mjContact names). Every field has a leading axis of the
#: contact capacity ``ncon_max`` decided when Data is made; a slot holds a contact when
#: ``valid`` is true. Slots are grouped by contact dimension ``dim`` (static per slot,
#: so the constraint rows of every slot have static shapes); within a group the valid
#: slots come first.
CONTACT_FIELDS = (
    ("dist", (), "f"),               # distance between nearest points; < 0: penetration
    ("pos", (3,), "f"),              # contact point, midway between the surfaces (global)
    ("frame", (3, 3), "f"),          # rows: normal (geom[0] -> geom[1]), tangent1, tangent2
    ("includemargin", (), "f"),      # margin (MuJoCo 4.0): dist >= includemargin is in the gap
    ("friction", (5,), "f"),         # tangent1, tangent2, spin, roll1, roll2
    ("solref", (2,), "f"),           # solver reference, normal direction
    ("solreffriction", (2,), "f"),   # solver reference, friction directions
    ("solimp", (5,), "f"),           # solver impedance
    ("adhesion", (), "f"),           # adhesive force, subtracted from the normal force
    ("dim", (), "i"),                # contact space dimension: 1, 3, 4 or 6
    ("geom", (2,), "i"),             # geom ids (geom1, geom2 in MuJoCo's order)
    ("exclude", (), "i"),            # 0 include, 1 in gap: dist >= includemargin (mjContact)
    ("efc_address", (), "i"),        # first efc row of this contact; -1: none
    ("valid", (), "b"),              # slot holds a contact (simjax: fixed capacity)
)
CONTACT_FIELD_NAMES = tuple(f[0] for f in CONTACT_FIELDS)

Contact = dataclasses.make_dataclass(
    "Contact", [(n, Any) for n in CONTACT_FIELD_NAMES] +
    [("slot_dim", tuple, dataclasses.field(default=()))], frozen=True, eq=False,
    namespace={"__doc__": "Contacts found by collision detection (mjContact), one slot "
                          "per row of a fixed capacity; see CONTACT_FIELDS.",
               "__module__": __name__,
               "replace": lambda self, **kw: dataclasses.replace(self, **kw),
               "geom1": property(lambda self: self.geom[..., 0]),
               "geom2": property(lambda self: self.geom[..., 1])})

# slot_dim: the static contact dimension of every slot (a tuple, pytree metadata), so
# constraint rows have shapes known at trace time
jax.tree_util.register_dataclass(Contact, data_fields=list(CONTACT_FIELD_NAMES),
                                 meta_fields=["slot_dim"])


def put(x):
    """``jnp.asarray(x)`` (dtype canonicalised as jax does) for a NumPy array or scalar
    ``x``, put on the default device (a constant inside a trace) without compiling:
    outside a trace ``jnp.asarray`` and ``jnp.zeros`` compile and run a program per
    shape and dtype (jax 0.10.2; the humanoid's first make_data in a process compiled
    47 of them, about 1 s). Anything else (jax arrays, tracers) goes to jnp.asarray."""
    import jax.numpy as jnp
    if isinstance(x, (np.ndarray, np.generic)):
        return jax.device_put(x)
    return jnp.asarray(x)


def make_contact(ncon_max, dims, ftype):
    """An empty Contact buffer with ``ncon_max`` slots; ``dims`` (ncon_max,) the static
    contact dimension of each slot."""
    kw = {}
    for name, shape, kind in CONTACT_FIELDS:
        dt = {"f": ftype, "i": np.int32, "b": np.bool_}[kind]
        kw[name] = put(np.zeros((ncon_max,) + shape, dt))
    kw["dim"] = put(np.asarray(dims, np.int32).reshape(ncon_max))
    kw["geom"] = put(np.full((ncon_max, 2), -1, np.int32))
    kw["efc_address"] = put(np.full((ncon_max,), -1, np.int32))
    return Contact(**kw, slot_dim=tuple(int(x) for x in np.asarray(dims).reshape(ncon_max)))


def field_shape(model, shape) -> tuple[int, ...]:
    """Concrete shape of a DATA_FIELDS entry for ``model``."""
    out = []
    for s in shape:
        if isinstance(s, int):
            out.append(s)
        elif "*" in s:          # "k*count": a multiple of a model count
            k, name = s.split("*")
            out.append(int(k) * int(getattr(model, name, 0) or 0))
        else:
            out.append(int(getattr(model, s, 0) or 0))
    return tuple(out)

#: Constraint rows (mjData efc_* names), one entry per row of a capacity ``nefc_max``
#: fixed when Data is made (simjax.engine.constraint.nefc_capacity): (name, trailing
#: shape, kind). efc_active marks the rows in use (simjax: fixed capacity).
EFC_FIELDS = (
    ("efc_type", (), "i"), ("efc_id", (), "i"), ("efc_active", (), "b"),
    ("efc_J", ("nv",), "f"), ("efc_pos", (), "f"), ("efc_margin", (), "f"),
    ("efc_frictionloss", (), "f"), ("efc_diagA", (), "f"), ("efc_KBIP", (4,), "f"),
    ("efc_D", (), "f"), ("efc_R", (), "f"), ("efc_vel", (), "f"), ("efc_aref", (), "f"),
    ("efc_b", (), "f"), ("efc_state", (), "i"), ("efc_force", (), "f"),
)
#: Scalar int32 counts of active rows (mjData ne, nf, nl, nefc) and solver statistics
#: per constraint island (solver_niter; improvement and scaled gradient norm of the
#: last iteration), shape (NISLAND,) as mjData's solver_niter (EFC_SHAPES).
EFC_SCALARS = (("ne", "i"), ("nf", "i"), ("nl", "i"), ("nefc", "i"),
               ("solver_niter", "i"), ("solver_improvement", "f"), ("solver_gradient", "f"))
#: mjNISLAND: islands with solver statistics
NISLAND = 20
EFC_SHAPES = {"solver_niter": (NISLAND,), "solver_improvement": (NISLAND,),
              "solver_gradient": (NISLAND,)}

#: Data fields that are not in DATA_FIELDS: the contact buffer and its count of valid
#: slots, constraint rows and counts.
EXTRA_FIELD_NAMES = (("contact", "ncon") + tuple(f[0] for f in EFC_FIELDS) +
                     tuple(f[0] for f in EFC_SCALARS))


def _data_doc():
    lines = [__doc__.strip().splitlines()[0], "", "Fields (mjData names; shapes):"]
    for name, shape, kind in DATA_FIELDS:
        dims = " x ".join(str(s) for s in shape) or "scalar"
        lines.append(f"    {name}: ({dims}), {dict(f='float', i='int32', b='bool')[kind]}")
    lines.append("    contact: Contact buffer (ncon_max slots), see CONTACT_FIELDS")
    lines.append("    ncon: (), int32: number of valid contacts")
    for name, shape, kind in EFC_FIELDS:
        dims = " x ".join(["nefc_max"] + [str(s) for s in shape])
        lines.append(f"    {name}: ({dims}), {dict(f='float', i='int32', b='bool')[kind]}")
    for name, kind in EFC_SCALARS:
        dims = " x ".join(str(s) for s in EFC_SHAPES.get(name, ()))
        lines.append(f"    {name}: ({dims}), {dict(f='float', i='int32')[kind]}")
    return "\n".join(lines)


Data = dataclasses.make_dataclass(
    "Data", [(n, Any) for n in DATA_FIELD_NAMES + EXTRA_FIELD_NAMES], frozen=True, eq=False,
    namespace={"__doc__": _data_doc(), "__module__": __name__,
               "replace": lambda self, **kw: dataclasses.replace(self, **kw)})

jax.tree_util.register_dataclass(Data, data_fields=list(DATA_FIELD_NAMES + EXTRA_FIELD_NAMES),
                                 meta_fields=[])
