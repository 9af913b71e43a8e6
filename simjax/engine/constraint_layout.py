"""Static row layout of the constraint stage (make_constraint, constraint.py): which
blocks of efc rows a model and its contact slots get, in MuJoCo's order (equality,
friction loss, limits, contacts: mj_makeConstraint's instantiation order,
engine_core_constraint.c), each block's capacity fixed at trace time, and the efc_type /
efc_id of every row; also the zero-initialised efc fields of Data (make_efc). See
constraint.py's module docstring for the capacities of each kind. Layouts are cached by
the model's static structure and the contact slot dimensions.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from simjax.engine.data import EFC_FIELDS, EFC_SCALARS, EFC_SHAPES, put
from simjax.errors import UnsupportedFeatureError
from simjax.types import ConeType, DisableBit, EqType, JointType

# mjtConstraint
EQUALITY, FRICTION_DOF, FRICTION_TENDON, LIMIT_JOINT, LIMIT_TENDON = 0, 1, 2, 3, 4
CONTACT_FRICTIONLESS, CONTACT_PYRAMIDAL, CONTACT_ELLIPTIC = 5, 6, 7

# layout block kinds of contact rows (frictionless, pyramidal, elliptic); a prefix test
# would also catch "connect"
CONTACT_KINDS = ("con1", "conpyr", "conell")


@dataclasses.dataclass(frozen=True)
class Block:
    """A static block of rows: ``n`` elements of ``k`` rows each from row ``start``."""
    # connect, weld, jointeq, tendoneq, frictiondof, frictionten, limitjnt, limitball,
    # limitten, con1, conpyr, conell
    kind: str
    start: int
    n: int
    k: int
    ids: np.ndarray    # (n,) element ids (contacts: slot indices)
    dim: int = 0       # contact dimension (contact blocks)


@dataclasses.dataclass(frozen=True)
class Layout:
    nefc: int
    blocks: tuple
    efc_type: np.ndarray
    efc_id: np.ndarray
    ne: int
    nf: int
    nl: int


def _disabled(m, bit):
    return bool(m.opt.disableflags & bit)


def slot_dims(d):
    """Static contact dimension of every slot of ``d.contact`` (numpy, (ncon_max,))."""
    dims = getattr(d.contact, "slot_dim", None)
    n = d.contact.dist.shape[0]
    if dims is not None and len(dims) == n:
        return np.asarray(dims, np.int32)
    try:
        return np.asarray(d.contact.dim, np.int32).reshape(n)
    except Exception:  # traced without static slot dims
        raise UnsupportedFeatureError(
            "contact buffer without static slot dimensions (build it with make_contact)")


def layout(m, contact_dims) -> Layout:
    """Static row layout for model ``m`` and contact slot dimensions ``contact_dims``."""
    return _layout(m, tuple(int(x) for x in np.asarray(contact_dims).ravel()))


def friction_masks(m):
    """(nv,) and (ntendon,) bool masks (numpy) of the dofs and tendons with a friction-loss
    row: the Model's static ``dof_hasfrictionloss`` / ``tendon_hasfrictionloss`` (every
    one where the Model has none)."""
    dof, ten = m.dof_hasfrictionloss, m.tendon_hasfrictionloss
    dof = np.ones(m.nv, bool) if dof is None else np.asarray(dof, bool).reshape(-1)
    ten = np.ones(m.ntendon, bool) if ten is None else np.asarray(ten, bool).reshape(-1)
    return dof, ten


def _layout_key(m):
    dof_fl, ten_fl = friction_masks(m)
    return (m.nv, m.neq, m.njnt, m.ntendon, int(m.opt.disableflags), int(m.opt.cone),
            np.asarray(m.eq_type).tobytes(), np.asarray(m.eq_objtype).tobytes(),
            np.asarray(m.eq_obj2id).tobytes(), np.asarray(m.jnt_limited).tobytes(),
            np.asarray(m.jnt_type).tobytes(), np.asarray(m.tendon_limited).tobytes(),
            dof_fl.tobytes(), ten_fl.tobytes())


_LAYOUTS = {}


def _layout(m, dims):
    key = (_layout_key(m), dims)
    if key in _LAYOUTS:
        return _LAYOUTS[key]
    blocks, types, ids = [], [], []
    row = 0

    def add(kind, elems, k, ctype, dim=0):
        nonlocal row
        elems = np.asarray(elems, np.int64)
        if not len(elems):
            return
        blocks.append(Block(kind, row, len(elems), k, elems, dim))
        types.append(np.full(len(elems) * k, ctype, np.int32))
        ids.append(np.repeat(elems, k).astype(np.int32))
        row += len(elems) * k

    off = _disabled(m, DisableBit.CONSTRAINT)
    eq_type = np.asarray(m.eq_type).reshape(-1)
    if m.neq and not off and not _disabled(m, DisableBit.EQUALITY):
        bad = [t for t in eq_type if t not in (EqType.CONNECT, EqType.WELD, EqType.JOINT,
                                               EqType.TENDON)]
        if bad:
            raise UnsupportedFeatureError(f"equality constraint type {EqType(bad[0]).name}")
        add("connect", np.nonzero(eq_type == EqType.CONNECT)[0], 3, EQUALITY)
        add("weld", np.nonzero(eq_type == EqType.WELD)[0], 6, EQUALITY)
        add("jointeq", np.nonzero(eq_type == EqType.JOINT)[0], 1, EQUALITY)
        add("tendoneq", np.nonzero(eq_type == EqType.TENDON)[0], 1, EQUALITY)
    ne = row
    if not off and not _disabled(m, DisableBit.FRICTIONLOSS):
        # rows only where the model has a friction loss (a zero loss never activates
        # its row: MuJoCo adds none)
        dof_fl, ten_fl = friction_masks(m)
        add("frictiondof", np.nonzero(dof_fl)[0], 1, FRICTION_DOF)
        add("frictionten", np.nonzero(ten_fl)[0], 1, FRICTION_TENDON)
    nf = row - ne
    if not off and not _disabled(m, DisableBit.LIMIT):
        lim = np.asarray(m.jnt_limited, bool).reshape(-1)
        jt = np.asarray(m.jnt_type).reshape(-1)
        add("limitjnt", np.nonzero(lim & ((jt == JointType.HINGE) | (jt == JointType.SLIDE)))[0],
            2, LIMIT_JOINT)
        add("limitball", np.nonzero(lim & (jt == JointType.BALL))[0], 1, LIMIT_JOINT)
        if m.ntendon:
            add("limitten", np.nonzero(np.asarray(m.tendon_limited, bool).reshape(-1))[0],
                2, LIMIT_TENDON)
    nl = row - ne - nf
    dims = np.asarray(dims, np.int32)
    if len(dims) and not off and not _disabled(m, DisableBit.CONTACT) and m.nv:
        elliptic = m.opt.cone == ConeType.ELLIPTIC
        for dim in (1, 3, 4, 6):
            slots = np.nonzero(dims == dim)[0]
            if dim == 1:
                add("con1", slots, 1, CONTACT_FRICTIONLESS, 1)
            elif elliptic:
                add("conell", slots, dim, CONTACT_ELLIPTIC, dim)
            else:
                add("conpyr", slots, 2 * (dim - 1), CONTACT_PYRAMIDAL, dim)
        other = set(np.unique(dims).tolist()) - {1, 3, 4, 6}
        if other:
            raise UnsupportedFeatureError(f"contact dimension {sorted(other)[0]}")
    cat = (lambda xs: np.concatenate(xs) if xs else np.zeros(0, np.int32))
    out = Layout(row, tuple(blocks), cat(types), cat(ids), ne, nf, nl)
    _LAYOUTS[key] = out
    return out


def data_layout(m, d) -> Layout:
    """:func:`layout` of ``m`` for the contact slots of ``d``, checked against the rows
    ``d`` holds (trace time).

    MuJoCo sizes its constraint rows on every step; simjax's are a capacity fixed when
    Data is made, from the model's structure and the options that decide which rows
    exist: ``opt.disableflags`` (constraint, equality, frictionloss, limit, contact) and
    ``opt.cone``. Raises ValueError where ``d`` holds another number of rows: it was
    made for another model, or before one of those options changed; ``make_data`` with
    the model as it is now makes a Data that fits."""
    lay = layout(m, slot_dims(d))
    have = d.efc_J.shape[0]
    if have != lay.nefc:
        raise ValueError(
            f"Data holds {have} constraint rows but the model's options give {lay.nefc}: "
            "the Data was made for another model, or before opt.disableflags or "
            "opt.cone changed; make it again with simjax.make_data(model)")
    return lay


def nefc_capacity(m, contact_dims) -> int:
    """Number of efc rows (capacity) for ``m`` and the contact slot dimensions."""
    return layout(m, contact_dims).nefc


def make_efc(m, contact_dims, ftype):
    """Zero-initialised efc fields for Data (used by make_data)."""
    lay = layout(m, contact_dims)
    n = lay.nefc
    out = {}
    for name, shape, kind in EFC_FIELDS:
        shp = (n,) + tuple(m.nv if s == "nv" else s for s in shape)
        dt = {"f": ftype, "i": np.int32, "b": np.bool_}[kind]
        out[name] = put(np.zeros(shp, dt))
    out["efc_type"] = put(np.asarray(lay.efc_type, np.int32))
    out["efc_id"] = put(np.asarray(lay.efc_id, np.int32))
    for name, kind in EFC_SCALARS:
        dt = {"f": ftype, "i": np.int32}[kind]
        out[name] = put(np.zeros(EFC_SHAPES.get(name, ()), dt))
    return out
