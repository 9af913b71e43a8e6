"""Static index tables derived from a Model's structure, computed once per structure.

The pipeline never loops over bodies, joints or dofs at run time. Instead, the kinematic
tree is turned (here, in numpy, at trace time) into:

- ``desc`` (nbody, nbody): ``desc[b, c] = 1`` if body c is in the subtree of body b.
  Subtree sums (subtree mass/com, composite inertia, RNE backward pass, applying forces)
  become one dense matmul.
- ``anc_dof`` (nbody, nv): ``anc_dof[b, k] = 1`` if dof k moves body b. Forward
  recursions that are linear in the dofs (body velocities, bias accelerations) become one
  matmul.
- ``m_mask`` (nv, nv): ``m_mask[i, j] = 1`` if dof j is dof i or one of its ancestors
  (the sparsity of MuJoCo's mass matrix, lower triangle).
- pointer-doubling tables for the one genuinely non-linear recursion, the composition of
  body frames, so kinematics needs ceil(log2(depth)) vectorised steps.

Tables are cached by the content of the static arrays they depend on, so they are built
once per model structure no matter how many times ``step`` is traced.
"""
from __future__ import annotations

import dataclasses
import hashlib

import jax
import jax.numpy as jnp
import numpy as np

from simjax.types import JointType, WrapType

_CACHE: dict = {}


def concrete(x):
    """NumPy value of ``x`` where it is concrete (a model constant, as usual), else None:
    traced model parameters (``step`` with the Model as a jit argument, vmap over Model
    fields) give None."""
    try:
        return np.asarray(x)
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
        return None


def _nonzero(m, names):
    """Whether any of the model fields ``names`` may be non-zero: traced ones may."""
    for name in names:
        arr = getattr(m, name, None)
        if arr is None:
            continue
        a = concrete(arr)
        if a is None or np.any(a != 0):
            return True
    return False


#: the model fields of contact adhesion
ADHESION = ("geom_adhesion", "pair_adhesion")


def has_adhesion(m):
    """Whether contacts may be adhesive (MuJoCo's ``flg_adhesion``: a non-zero
    ``geom_adhesion`` or ``pair_adhesion``; a traced field counts as non-zero). Static:
    a model without adhesion traces none of it."""
    return _nonzero(m, ADHESION)


def has_surfacevel(m):
    """Whether a geom may have a surface velocity (MuJoCo's ``flg_surfacevel``; a
    traced ``geom_surfacevel`` counts as non-zero). Static."""
    return _nonzero(m, ("geom_surfacevel",))


def run_if_nonzero(m, names, fn, zero, *args):
    """``fn(*args)``, a term that is exactly ``zero`` where the model fields ``names``
    are all zero: called as is where they are concrete (the callers check statically
    that some may be non-zero), else under a ``lax.cond`` on any being non-zero (a
    branch at run time where the model is not batched) that takes ``fn`` where they
    are differentiated (:func:`on_or_differentiated`). ``zero``: a function of
    ``args`` giving the skipped branch's value."""
    fields = [getattr(m, n) for n in names if getattr(m, n, None) is not None]
    if all(concrete(x) is not None for x in fields):
        return fn(*args)
    on = jnp.zeros((), bool)
    for x in fields:
        on = on | jnp.any(jnp.asarray(x) != 0)
    return jax.lax.cond(on_or_differentiated(on, *fields), fn, zero, *args)


@jax.custom_jvp
def _differentiated(x):
    """False; True where ``x`` carries a tangent (the JVP rule's primal output), as it
    does inside ``jax.grad``, ``jax.jvp`` and ``jax.jacfwd`` with respect to ``x``."""
    return jnp.zeros((), bool)


@_differentiated.defjvp
def _differentiated_jvp(primals, tangents):
    return jnp.ones((), bool), np.zeros((), jax.dtypes.float0)


def on_or_differentiated(on, *params):
    """``on`` or, where one of the traced model ``params`` is being differentiated,
    True: the predicate of a ``lax.cond`` that skips a term at run time where the
    parameters make it exactly zero (zero density and viscosity for the fluid forces,
    zero surface velocities or adhesion). Such a term is linear in its parameters, but
    the skipped branch has no derivative: without this, ``jax.jacfwd`` of the
    ellipsoid model's fluid force with respect to ``opt.density`` at zero gave zero
    instead of the force at density 1. (The inertia-box model's terms are MuJoCo's
    ``density > 0`` and ``viscosity > 0`` branches, whose derivative at zero is zero
    either way.) Out of differentiation the skip stands."""
    for x in params:
        on = on | _differentiated(x)
    return on


# JAX (0.10) converts a numpy array used inside a traced function through a cache keyed
# weakly by the array object, not by the precision mode: an int64 / float64 array first
# seen under jax_enable_x64 keeps its 64-bit type after the flag is turned off, and the
# next trace fails (int64 + int32 in an index, f64 operands in f32 ops). simjax reuses
# its static numpy arrays (Model structure, the cached tables here and in the other
# stages) across traces, so a process that switches precision would hit that stale
# entry. The pipeline's entry stages call :func:`precision_guard`, which clears JAX's
# caches once whenever the flag has changed since the last trace.
_X64_SEEN: list = []


def precision_guard():
    """Clear JAX's caches if ``jax_enable_x64`` changed since the previous call (a no-op
    otherwise; cheap, trace-time only)."""
    import jax
    x64 = bool(jax.config.jax_enable_x64)
    if _X64_SEEN and _X64_SEEN[-1] != x64:
        jax.clear_caches()
    _X64_SEEN[:] = [x64]


@dataclasses.dataclass(frozen=True, eq=False)
class Tables:
    """Static tables for one model structure (all numpy)."""

    depth: np.ndarray            # (nbody,) depth of each body, world = 0
    jump_steps: tuple            # pointer-doubling ancestors: tuple of (nbody,) arrays
    is_free_body: np.ndarray     # (nbody,) body's pose comes straight from a free joint
    desc: np.ndarray             # (nbody, nbody) subtree membership, float
    desc_noworld: np.ndarray     # desc without the world row (MuJoCo skips world sums)
    anc_dof: np.ndarray          # (nbody, nv) dof k moves body b, float
    m_mask: np.ndarray           # (nv, nv) lower-triangular ancestor mask, float
    pred: np.ndarray             # (nv, nv) dofs whose velocity precedes dof j (cdof_dot)
    free_trans_dof: np.ndarray   # (nv,) bool: translational dof of a free joint
    # kinematics: per-joint-slot tables (bodies apply their joints in order)
    slot_jnt: np.ndarray         # (nslot, nbody) joint id in slot, -1 if none
    jnt_slot: np.ndarray         # (njnt,) slot index of each joint
    # cdof axis sources: index into concat([xaxis (njnt), xmat columns (nbody*3), eye(3)])
    dof_axis_src: np.ndarray     # (nv,) int
    dof_is_rot: np.ndarray       # (nv,) bool: rotational dof (hinge, ball, free rot)
    dof_is_slide: np.ndarray     # (nv,) bool: slide dof (offset not applied)
    # kinematic "frame tree": node 0 is the world, then per body one node for its
    # offset from the parent (or its free-joint pose) followed by one node per
    # hinge/ball/slide joint, each node's transform being relative to the node before
    node_kind: np.ndarray        # (nnode,) 0 world, 1 body offset, 2 free body, 3 hinge,
                                 # 4 ball, 5 slide
    node_src: np.ndarray         # (nnode,) body id (kinds 0-2) or joint id (3-5)
    node_jumps: tuple            # pointer-doubling ancestors over nodes
    body_node: np.ndarray        # (nbody,) last node of each body (its frame)
    jnt_pred: np.ndarray         # (njnt,) node whose frame a joint's axis/anchor use


def _key(model):
    parts = [model.nbody, model.njnt, model.nv, model.nq]
    for name in ("body_parentid", "body_jntnum", "body_jntadr", "body_dofnum",
                 "body_dofadr", "jnt_type", "jnt_bodyid", "jnt_dofadr", "dof_bodyid",
                 "dof_jntid", "dof_parentid"):
        arr = np.ascontiguousarray(getattr(model, name))
        parts.append(hashlib.sha1(arr.tobytes()).hexdigest())
    return tuple(parts)


def get(model) -> Tables:
    """Tables for ``model`` (cached by structure)."""
    precision_guard()
    key = _key(model)
    tab = _CACHE.get(key)
    if tab is None:
        tab = _build(model)
        _CACHE[key] = tab
    return tab


def _build(model) -> Tables:
    nbody, njnt, nv = model.nbody, model.njnt, model.nv
    parent = np.asarray(model.body_parentid, dtype=np.int64)
    jnt_type = np.asarray(model.jnt_type)
    body_jntnum = np.asarray(model.body_jntnum)
    body_jntadr = np.asarray(model.body_jntadr)

    # bodies whose frame is set directly by a free joint: treated as roots when composing
    is_free = np.zeros(nbody, bool)
    for b in range(1, nbody):
        if body_jntnum[b] == 1 and jnt_type[body_jntadr[b]] == JointType.FREE:
            is_free[b] = True

    depth = np.zeros(nbody, np.int64)
    for b in range(1, nbody):
        depth[b] = depth[parent[b]] + 1

    # pointer doubling: after step s each body holds the composition of 2^s frames
    frame_parent = parent.copy()
    frame_parent[is_free] = 0
    frame_parent[0] = 0
    frame_depth = np.zeros(nbody, np.int64)
    for b in range(1, nbody):
        frame_depth[b] = frame_depth[frame_parent[b]] + 1
    steps = []
    jump = frame_parent.copy()
    span = 1
    while span < int(frame_depth.max(initial=0)):
        steps.append(jump.copy())
        jump = jump[jump]
        span *= 2

    desc = np.zeros((nbody, nbody))
    for c in range(nbody):
        b = c
        while True:
            desc[b, c] = 1.0
            if b == 0:
                break
            b = parent[b]
    desc_noworld = desc.copy()
    desc_noworld[0] = 0.0
    desc_noworld[0, 0] = 1.0

    dof_bodyid = np.asarray(model.dof_bodyid)
    anc_dof = desc[dof_bodyid].T.copy() if nv else np.zeros((nbody, 0))

    dof_parentid = np.asarray(model.dof_parentid)
    m_mask = np.zeros((nv, nv))
    for i in range(nv):
        j = i
        while j >= 0:
            m_mask[i, j] = 1.0
            j = dof_parentid[j]

    # cdof_dot uses the body velocity accumulated before the dof's joint; for the
    # rotational dofs of a free joint the translational dofs count as "before"
    dof_jntid = np.asarray(model.dof_jntid)
    jnt_dofadr = np.asarray(model.jnt_dofadr)
    pred = np.zeros((nv, nv))
    free_trans = np.zeros(nv, bool)
    for j in range(nv):
        b, jid = dof_bodyid[j], dof_jntid[j]
        pb = parent[b]
        pred[j] = anc_dof[pb] if nbody else 0.0
        for k in range(nv):
            if dof_bodyid[k] == b and dof_jntid[k] < jid:
                pred[j, k] = 1.0
        if jnt_type[jid] == JointType.FREE:
            off = j - jnt_dofadr[jid]
            if off < 3:
                free_trans[j] = True
            else:
                pred[j, jnt_dofadr[jid]:jnt_dofadr[jid] + 3] = 1.0

    nslot = int(body_jntnum.max(initial=0))
    slot_jnt = -np.ones((nslot, nbody), np.int64)
    jnt_slot = np.zeros(njnt, np.int64)
    for b in range(nbody):
        for k in range(body_jntnum[b]):
            slot_jnt[k, b] = body_jntadr[b] + k
            jnt_slot[body_jntadr[b] + k] = k

    axis_src = np.zeros(nv, np.int64)
    is_rot = np.zeros(nv, bool)
    is_slide = np.zeros(nv, bool)
    for j in range(nv):
        jid = dof_jntid[j]
        t = jnt_type[jid]
        off = j - jnt_dofadr[jid]
        if t == JointType.HINGE:
            axis_src[j], is_rot[j] = jid, True
        elif t == JointType.SLIDE:
            axis_src[j], is_slide[j] = jid, True
        elif t == JointType.BALL:
            axis_src[j], is_rot[j] = njnt + 3 * dof_bodyid[j] + off, True
        else:  # free: 3 world translations, then 3 body-frame rotations
            if off < 3:
                axis_src[j], is_slide[j] = njnt + 3 * nbody + off, True
            else:
                axis_src[j], is_rot[j] = njnt + 3 * dof_bodyid[j] + off - 3, True

    node_kind, node_src, node_jumps, body_node, jnt_pred = _frame_tree(model, is_free)
    return Tables(node_kind=node_kind, node_src=node_src, node_jumps=node_jumps,
                  body_node=body_node, jnt_pred=jnt_pred,
                  depth=depth, jump_steps=tuple(steps), is_free_body=is_free, desc=desc,
                  desc_noworld=desc_noworld, anc_dof=anc_dof, m_mask=m_mask, pred=pred,
                  free_trans_dof=free_trans, slot_jnt=slot_jnt, jnt_slot=jnt_slot,
                  dof_axis_src=axis_src, dof_is_rot=is_rot, dof_is_slide=is_slide)


def _frame_tree(model, is_free):
    """Nodes of the kinematic frame tree and their pointer-doubling tables."""
    nbody, njnt = model.nbody, model.njnt
    parent = np.asarray(model.body_parentid)
    jtype = np.asarray(model.jnt_type)
    jntadr, jntnum = np.asarray(model.body_jntadr), np.asarray(model.body_jntnum)
    kind, src, node_parent = [0], [0], [0]
    body_node = np.zeros(nbody, np.int64)
    jnt_pred = np.zeros(njnt, np.int64)
    for b in range(1, nbody):
        if is_free[b]:
            kind.append(2)
            src.append(b)
            node_parent.append(0)
            body_node[b] = len(kind) - 1
            jnt_pred[jntadr[b]] = 0
            continue
        kind.append(1)
        src.append(b)
        node_parent.append(body_node[parent[b]])
        last = len(kind) - 1
        for j in range(jntadr[b], jntadr[b] + jntnum[b]):
            jnt_pred[j] = last
            kind.append({JointType.HINGE: 3, JointType.BALL: 4, JointType.SLIDE: 5}[int(jtype[j])])
            src.append(j)
            node_parent.append(last)
            last = len(kind) - 1
        body_node[b] = last
    node_parent = np.asarray(node_parent, np.int64)
    nnode = len(kind)
    depth = np.zeros(nnode, np.int64)
    for n in range(1, nnode):
        depth[n] = depth[node_parent[n]] + 1
    jumps, jump, span = [], node_parent.copy(), 1
    while span < int(depth.max(initial=0)):
        jumps.append(jump.copy())
        jump = jump[jump]
        span *= 2
    return (np.asarray(kind, np.int64), np.asarray(src, np.int64), tuple(jumps), body_node,
            jnt_pred)


# --------------------------------------------------------------------------- simple dofs
def body_simple(m):
    """MuJoCo's body_simple: 1 diagonal M, 2 diagonal M with sliders only, else 0."""
    simple = np.zeros(m.nbody, np.int32)
    for b in range(m.nbody):
        p = m.body_parentid[b]
        simple[b] = int(m.body_sameframe[b] == 1 and (
            m.body_rootid[b] == b or (m.body_parentid[p] == 0 and m.body_dofnum[p] == 0)))
        if p > 0:
            simple[p] = 0
        rot = False
        for j in range(m.body_jntadr[b], m.body_jntadr[b] + m.body_jntnum[b]) \
                if m.body_jntnum[b] else []:
            axis = np.asarray(m.jnt_axis)[j]
            aligned = np.sum(np.abs(axis) > 1e-14) == 1
            t = m.jnt_type[j]
            if rot or np.any(np.abs(np.asarray(m.jnt_pos)[j]) >= 1e-6) or (
                    t in (JointType.HINGE, JointType.SLIDE) and not aligned):
                simple[b] = 0
            rot |= t in (JointType.BALL, JointType.HINGE)
    for b in range(m.nbody):
        if simple[b] and m.body_dofnum[b]:
            slides = all(m.jnt_type[j] == JointType.SLIDE for j in
                         range(m.body_jntadr[b], m.body_jntadr[b] + m.body_jntnum[b]))
            simple[b] = 2 if slides else 1
    # a tendon with armature couples the bodies its sites and wrap geoms sit on (its
    # armature J'J enters M), so MuJoCo 4.0 demotes them
    wt, wo = np.asarray(m.wrap_type), np.asarray(m.wrap_objid)
    for t in range(m.ntendon):
        if np.asarray(m.tendon_armature)[t] == 0:
            continue
        for w in range(m.tendon_adr[t], m.tendon_adr[t] + m.tendon_num[t]):
            if wt[w] == WrapType.SITE:
                simple[m.site_bodyid[wo[w]]] = 0
            elif wt[w] in (WrapType.SPHERE, WrapType.CYLINDER):
                simple[m.geom_bodyid[wo[w]]] = 0
    return simple


def dof_simplenum(m):
    """MuJoCo's dof_simplenum (nv,): how many consecutive dofs from this one on belong
    to simple bodies (:func:`body_simple`); 0 for a dof of a non-simple body."""
    simple = body_simple(m)
    out = np.zeros(m.nv, np.int32)
    count = 0
    for i in range(m.nv - 1, -1, -1):
        count = count + 1 if simple[m.dof_bodyid[i]] else 0
        out[i] = count
    return out
