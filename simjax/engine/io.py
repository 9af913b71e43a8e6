"""Creating and resetting Data (mj_makeData, mj_resetData, mj_resetDataKeyframe)."""
from __future__ import annotations

import weakref

import jax
import jax.numpy as jnp
import numpy as np

from simjax import types
from simjax.engine import constraint
from simjax.engine.data import DATA_FIELD_NAMES, DATA_FIELDS, Data, field_shape, put
from simjax.engine.support import checked_id


def _float_dtype(model, dtype=None):
    if dtype is not None:
        return jnp.dtype(dtype)
    q = getattr(model, "qpos0", None)
    if q is not None and hasattr(q, "dtype") and jnp.issubdtype(q.dtype, jnp.floating):
        return jnp.dtype(q.dtype)
    return jnp.zeros(()).dtype


def _mocap_bodies(model):
    """Body ids of mocap bodies, ordered by mocap id."""
    mocapid = np.asarray(model.body_mocapid)
    bodies = np.nonzero(mocapid >= 0)[0]
    return bodies[np.argsort(mocapid[bodies])]


#: the state and input fields :func:`check_data` checks (those a user sets or carries
#: from step to step; the others a step computes)
CHECKED_FIELDS = DATA_FIELD_NAMES[:DATA_FIELD_NAMES.index("sensordata") + 1]
#: (name, symbolic shape) of the checked fields
_CHECKED_SHAPES = tuple((name, shape) for name, shape, _ in DATA_FIELDS
                        if name in CHECKED_FIELDS)


def check_data(model, data) -> None:
    """Check that the state and input arrays of ``data`` (:data:`CHECKED_FIELDS`) have
    the shapes ``model`` gives one world (trace time: shapes only, no values).

    The model's parameter arrays are checked too (:func:`check_model`). Raises
    TypeError for MuJoCo's mjModel or mjData, ValueError naming the field: a batch of
    worlds handed to a function that takes one (a leading axis more; map it with
    ``jax.vmap`` or use ``simjax.rollout_batch``), or a Data made for another model.
    MuJoCo does not check this; a mismatched jax array otherwise fails deep in the
    pipeline on a broadcast."""
    check_model(model)
    _not_mujoco(data, "Data", "simjax.make_data(model)")
    for name, shape in _CHECKED_SHAPES:
        _check_shape("Data", name, getattr(data, name), field_shape(model, shape),
                     "worlds", "map the function over the batch with jax.vmap, or use "
                     "simjax.rollout_batch", "the Data was made for another model; make "
                     "it with simjax.make_data(model)")


def check_model(model) -> None:
    """Check that the parameter arrays of ``model`` (its float jax leaves, the arrays a
    user changes with ``replace``) have the shapes its counts give them in mjModel's
    layout (:data:`simjax.types.FIELD_SPEC`; trace time, shapes only).

    Raises TypeError for MuJoCo's mjModel, ValueError naming the field: a batch of
    models handed to a function that takes one (a leading axis more: map it with
    ``jax.vmap`` over the model's batched leaves, or pass ``model_axes`` to
    ``simjax.rollout_batch``), or an array of another size.

    A model object that passed is not checked again (a Model is frozen: ``replace``
    makes a new one): the check took 0.19 ms a call on the humanoid, a fifth of its
    eager ``step``."""
    _not_mujoco(model, "Model", "simjax.load_model(path or XML string)")
    seen = _CHECKED_MODELS.get(id(model))
    if seen is not None and seen() is model:
        return
    counts = {c: int(getattr(model, c, 0) or 0) for c in types.MODEL_COUNTS}
    for name in types.FIELD_SPEC:
        value = None if types.is_static_field(name) else getattr(model, name, None)
        if value is not None:
            _check_shape("Model", name, value, types.field_shape(name, counts), "models",
                         "map over it with jax.vmap, or pass model_axes to "
                         "simjax.rollout_batch", "mjModel's layout for the model's sizes")
    try:
        # the entry leaves with the model (the callback runs before its id is reused)
        _CHECKED_MODELS[id(model)] = weakref.ref(
            model, lambda _, i=id(model): _CHECKED_MODELS.pop(i, None))
    except TypeError:               # an object without weak references: checked each time
        pass


#: {id(model): weak reference} of the model objects :func:`check_model` passed
_CHECKED_MODELS = {}


def _check_shape(owner, name, value, want, unit, batched, other):
    """ValueError where ``value`` (field ``name`` of ``owner``) is not of shape ``want``:
    with ``batched`` where it has one leading axis more (a batch of ``unit``), else with
    ``other``."""
    have = tuple(np.shape(value))
    if have == want:
        return
    if len(have) == len(want) + 1 and have[1:] == want:
        raise ValueError(f"{owner}.{name} has shape {have}: a batch of {have[0]} {unit}, "
                         f"where one is taken; {batched}")
    raise ValueError(f"{owner}.{name} has shape {have} where the model gives {want}: "
                     f"{other}")


def _not_mujoco(obj, kind, make):
    """TypeError where ``obj`` is one of MuJoCo's own structs (mjModel, mjData), which
    simjax does not read: it compiles the MJCF itself."""
    if type(obj).__module__.split(".")[0] == "mujoco":
        raise TypeError(f"got MuJoCo's {type(obj).__name__} where simjax's {kind} is "
                        f"taken: simjax builds its own, with {make}")


def make_data(model, dtype=None, ncon_max=None) -> Data:
    """A Data at the model's reference state (mj_makeData followed by mj_resetData).

    qpos = qpos0, zero velocities, activations and controls, mocap bodies at their model
    pose, equality constraints at ``eq_active0``. Derived quantities are zero until
    :func:`simjax.engine.forward.forward` runs. ``dtype`` defaults to the model's float
    dtype (float64 under ``jax_enable_x64``). ``ncon_max``: contact capacity (slots of
    ``Data.contact``); default :func:`simjax.engine.collision.contact_capacity`.
    Raises TypeError for MuJoCo's mjModel (simjax compiles its own, ``load_model``).
    """
    _not_mujoco(model, "Model", "simjax.load_model(path or XML string)")
    ftype = _float_dtype(model, dtype)
    kw = {name: put(x) for name, x in
          reset_fields(model, DATA_FIELD_NAMES, ftype).items()}
    from simjax.engine.collision import make_contacts
    kw["contact"] = make_contacts(model, ncon_max, ftype)
    kw["ncon"] = put(np.zeros((), np.int32))
    kw.update(constraint.make_efc(model, kw["contact"].slot_dim, ftype))
    return Data(**kw)


def reset_fields(model, names, dtype=None) -> dict:
    """The values :func:`make_data` gives the DATA_FIELDS entries ``names`` (mj_resetData),
    only those: a reset inside a traced step builds no other field. Zero fields are
    NumPy arrays (constants: no traced operation); the others are computed from the
    model's arrays (traced if those are)."""
    ftype = _float_dtype(model, dtype)
    kinds = {name: (shape, kind) for name, shape, kind in DATA_FIELDS}
    out = {}
    for name in names:
        shape, kind = kinds[name]
        dt = {"f": ftype, "i": np.int32, "b": np.bool_}[kind]
        out[name] = np.zeros(field_shape(model, shape), dt)
    if "qpos" in out:
        out["qpos"] = jnp.asarray(model.qpos0, ftype).reshape(model.nq)
    if "ctrl" in out and getattr(model, "nactuator", 0):
        from simjax.engine.actuation import initial_ctrl
        out["ctrl"] = initial_ctrl(model, ftype)
    if model.nmocap and ("mocap_pos" in out or "mocap_quat" in out):
        bodies = _mocap_bodies(model)
        out["mocap_pos"] = jnp.asarray(model.body_pos, ftype)[bodies]
        out["mocap_quat"] = jnp.asarray(model.body_quat, ftype)[bodies]
    if "eq_active" in out and model.neq:
        out["eq_active"] = jnp.asarray(model.eq_active0, jnp.bool_)
    if "plugin_state" in out and getattr(model, "npluginstate", 0):
        from simjax.plugins.engine import init_state
        out["plugin_state"] = init_state(model, ftype)
    if "history" in out and getattr(model, "nhistory", 0):
        from simjax.engine import history
        out["history"] = history.init(model, ftype)
    if "plastic" in out and getattr(model, "nplastic", 0):
        from simjax.engine import plastic
        out["plastic"] = plastic.init(model, ftype)
    return {name: out[name] for name in names}


def reset_keyframe(model, data: Data, key_id) -> Data:
    """Reset to keyframe ``key_id`` (mj_resetDataKeyframe).

    ``key_id``: keyframe index (Python or traced int, so batches of worlds may reset to
    different keyframes under vmap) or keyframe name. Everything is reset as by
    :func:`make_data`, then time, qpos, qvel, act, ctrl and mocap poses are loaded from
    the keyframe (and the plastic state, ``key_plastic``). ``data`` only supplies the
    float dtype.
    """
    if isinstance(key_id, str):
        idx = model.name2id("key", key_id)
        if idx < 0:
            raise KeyError(f"no keyframe named '{key_id}'")
        key_id = idx
    key_id = checked_id(key_id, model.nkey, "keyframe")
    new = make_data(model, dtype=data.qpos.dtype, ncon_max=data.contact.dist.shape[0])
    ftype = new.qpos.dtype

    # a concrete id into a concrete model's keyframes: rows cut in NumPy (indexed by
    # jax outside a trace, each field's shape compiled a program of its own: the
    # humanoid's first reset 0.31 s)
    concrete = (not isinstance(key_id, jax.core.Tracer) and np.ndim(key_id) == 0
                and np.asarray(key_id).dtype.kind in "iu")

    def row(arr, *n):
        if concrete and not isinstance(arr, jax.core.Tracer):
            return put(np.asarray(arr).reshape((model.nkey,) + n)[int(key_id)]
                       .astype(ftype))
        return jnp.asarray(arr, ftype).reshape((model.nkey,) + n)[key_id]

    kw = dict(time=row(model.key_time),
              qpos=row(model.key_qpos, model.nq), qvel=row(model.key_qvel, model.nv),
              act=row(model.key_act, model.na), ctrl=row(model.key_ctrl, model.nu))
    if getattr(model, "nplastic", 0):
        kw["plastic"] = row(model.key_plastic, model.nplastic)
    if model.nmocap:
        kw["mocap_pos"] = row(model.key_mpos, 3 * model.nmocap).reshape(model.nmocap, 3)
        kw["mocap_quat"] = row(model.key_mquat, 4 * model.nmocap).reshape(model.nmocap, 4)
    return new.replace(**kw)


def reset(model, key=None, dtype=None) -> Data:
    """Fresh Data at qpos0 (mj_resetData), or at keyframe ``key`` (index or name)."""
    data = make_data(model, dtype)
    if key is None:
        return data
    return reset_keyframe(model, data, key)
