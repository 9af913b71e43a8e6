"""Smooth dynamics: kinematics, com-based quantities, inertia, bias forces.

Implements MuJoCo's engine_core_smooth stages for rigid bodies: mj_kinematics,
mj_comPos, mj_camlight, mj_tendon (in :mod:`simjax.engine.tendon`), mj_crb / mj_makeM, mj_factorM,
mj_solveM, mj_comVel, mj_rne and mj_subtreeVel.

No Python loop runs over bodies or dofs: tree recursions are dense products with the
static tables of :mod:`simjax.engine.tables` (subtree sums, dof-to-body incidence), and
the composition of body frames uses pointer doubling (ceil(log2(depth)) vectorised
steps). All spatial vectors use MuJoCo's rotation:translation order and are expressed
in the world frame about the subtree centre of mass of the body's kinematic tree.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from simjax.engine import inline, math
from simjax.engine import tables
from simjax.engine import tree_linalg
from simjax.engine.io import _mocap_bodies
from simjax.types import CamLight, DisableBit, JointType


def _f(x, dtype):
    return jnp.asarray(x, dtype)


# --------------------------------------------------------------------------- kinematics
def _node_transforms(m, d):
    """Local transforms (nnode, 7) (pos, then quat) of every frame-tree node.

    Body-offset nodes carry body_pos/body_quat (mocap bodies: Data's mocap pose);
    free bodies their qpos pose (absolute); hinge and ball nodes rotate about the joint
    anchor; slide nodes translate along the axis. Each is relative to the node before.
    """
    tab = tables.get(m)
    dtype = d.qpos.dtype
    kind, src = tab.node_kind, tab.node_src
    pieces = []          # (node indices, pos components, quat components)

    def pose_rows(pos, quat, rows):
        return math.unstack(pos[rows]), math.unstack(quat[rows])

    body_nodes = np.nonzero(kind == 1)[0]
    if len(body_nodes):
        pos = _const(m.body_pos, dtype)
        quat = _const(m.body_quat, dtype)
        if m.nmocap:
            bodies = _mocap_bodies(m)
            srcb = np.arange(m.nbody)
            srcb[bodies] = m.nbody + np.arange(len(bodies))
            pos = jnp.concatenate([pos, d.mocap_pos.astype(dtype)])[srcb]
            quat = jnp.concatenate([quat, math.quat_normalize(d.mocap_quat.astype(dtype))])[srcb]
        pieces.append((body_nodes,) + pose_rows(pos, quat, src[body_nodes]))

    free_nodes = np.nonzero(kind == 2)[0]
    if len(free_nodes):
        qadr = np.asarray(m.jnt_qposadr)[np.asarray(m.body_jntadr)[src[free_nodes]]]
        qf = math.take(d.qpos, qadr[:, None] + np.arange(7))
        pieces.append((free_nodes, math.unstack(qf[:, :3]),
                       math.c_quat_normalize(math.unstack(qf[:, 3:]))))

    jnodes = np.nonzero(kind >= 3)[0]
    if len(jnodes):
        j = src[jnodes]
        jk = kind[jnodes]
        qadr = np.asarray(m.jnt_qposadr)[j]
        axis = _const(m.jnt_axis, dtype)[j]
        jpos = math.unstack(_const(m.jnt_pos, dtype)[j])
        dq = math.take(d.qpos, qadr) - _const(m.qpos0, dtype)[qadr]
        qloc = math.axis_angle_to_quat(axis, dq)                      # hinge
        if np.any(jk == 4):                                           # ball
            bidx = np.minimum(qadr[:, None] + np.arange(4), m.nq - 1)
            qball = math.stack(math.c_quat_normalize(math.unstack(d.qpos[bidx])))
            qloc = math.where((jk == 4)[:, None], qball, qloc)
        slide = jk == 5
        if slide.any():
            qloc = math.where(slide[:, None], jnp.array([1.0, 0, 0, 0], dtype), qloc)
        qloc = math.unstack(qloc)
        r = math.c_rot(qloc, jpos)
        pos = tuple(p - q for p, q in zip(jpos, r))                   # rotate about anchor
        if slide.any():
            ax = math.unstack(axis)
            pos = math.c_where(slide, tuple(a * dq for a in ax), pos)
        pieces.append((jnodes, pos, qloc))

    # assemble all nodes (the world node is the identity) as one (nnode, 7) array: one
    # concatenation and one gather, so that XLA computes every piece in one kernel
    nnode = len(kind)
    order = np.concatenate([p[0] for p in pieces])
    srcn = np.full(nnode, len(order))
    srcn[order] = np.arange(len(order))
    world = jnp.asarray([[0, 0, 0, 1.0, 0, 0, 0]], dtype)
    rows = [jnp.stack(tuple(p[1]) + tuple(p[2]), -1) for p in pieces]
    return math.take(jnp.concatenate(rows + [world]), srcn)


def _sameframe_codes(arr):
    """mjtSameFrame codes of a *_sameframe array, or None if they are unknown.

    A boolean layout cannot tell BODY (copy the body frame) from BODYROT (copy only the
    rotation), so booleans are ignored and the frame is computed in full (equal up to
    the compiler's sameframe tolerance).
    """
    arr = np.asarray(arr)
    if arr.dtype == bool or arr.size == 0:
        return None
    return arr.astype(np.int64)


def _stack_mat(c):
    """(..., 3, 3) matrix from 9 row-major component arrays."""
    return jnp.stack([jnp.stack(c[3 * i:3 * i + 3], -1) for i in range(3)], -2)


def _local_rot(lquat, dtype):
    """Rotation matrices (n, 3, 3) of the local quaternions of frames: computed once in
    NumPy when the model's quaternions are concrete (as usual), else traced."""
    q = tables.concrete(lquat)
    if q is None:
        return math.quat_to_mat(math.quat_normalize(jnp.asarray(lquat, dtype)))
    q = q.astype(np.float64)
    q = q / np.maximum(np.linalg.norm(q, axis=-1, keepdims=True), math.MINVAL)
    w, x, y, z = q[:, 0], q[:, 1], q[:, 2], q[:, 3]
    mat = np.stack([w * w + x * x - y * y - z * z, 2 * (x * y - w * z), 2 * (x * z + w * y),
                    2 * (x * y + w * z), w * w - x * x + y * y - z * z, 2 * (y * z - w * x),
                    2 * (x * z - w * y), 2 * (y * z + w * x), w * w - x * x - y * y + z * z],
                   -1)
    # a NumPy constant: slicing it in the caller traces nothing
    return mat.reshape(-1, 3, 3).astype(dtype)


def _const(x, dtype):
    """``x`` as a NumPy array of ``dtype`` when it is concrete (a model constant, as
    usual: slices of it trace nothing), else as a traced array."""
    c = tables.concrete(x)
    return jnp.asarray(x, dtype) if c is None else c.astype(dtype)


def _rows(x, idx):
    """``x[idx]`` for static ``idx``; ``x`` itself when ``idx`` takes every row in order
    (XLA CPU keeps such an identity gather: a kernel of its own, about 1 us per world
    for the humanoid's body matrices at batch 1024)."""
    idx = np.asarray(idx)
    if idx.shape == x.shape[:1] and np.array_equal(idx, np.arange(len(idx))):
        return x
    return math.take_rows(x, idx)


def _local_to_global(d, bodyid, lpos, lquat, sameframe=None, xipos=None, ximat=None):
    """World pose of frames given relative to bodies (mj_local2Global).

    ``sameframe`` (mjtSameFrame codes, static) lets frames coinciding with the body
    (1 BODY, 3 BODYROT) or inertial (2 INERTIA, 4 INERTIAROT) frame copy it, as MuJoCo
    does. The world rotation is the body's matrix times the local one (a constant of
    the model), written as three broadcast products and adds: one fused kernel, where
    composing quaternions and converting them to matrices cost XLA CPU several kernels
    (slices and concatenations per component) and about 0.5 s of compile per call.
    """
    dtype = d.xpos.dtype
    bpos, bmat = _rows(d.xpos, bodyid), _rows(d.xmat, bodyid)
    lpos = _const(lpos, dtype)
    lmat = _local_rot(lquat, dtype)
    # bmat's columns split once, the sums without a leading zero (the same operations
    # compiled: 7 equations fewer a call)
    col = jnp.split(bmat, 3, axis=2)
    gp = [col[k][:, :, 0] * lpos[:, k:k + 1] for k in range(3)]
    gpos = bpos + (gp[0] + gp[1] + gp[2])
    gm = [col[k] * lmat[:, k:k + 1, :] for k in range(3)]
    gmat = gm[0] + gm[1] + gm[2]
    codes = _sameframe_codes(sameframe) if sameframe is not None else None
    if codes is not None:
        copies = [((1,), (1, 3), bpos, bmat)]
        if xipos is not None:
            copies.append(((2,), (2, 4), math.take(xipos, bodyid), math.take(ximat, bodyid)))
        for pos_codes, mat_codes, src_pos, src_mat in copies:
            on = np.isin(codes, pos_codes)
            if on.any():
                gpos = math.where(on[:, None], src_pos, gpos)
            on = np.isin(codes, mat_codes)
            if on.any():
                gmat = math.where(on[:, None, None], src_mat, gmat)
    return gpos, gmat


def _compose_step(frames, jump):
    """One pointer-doubling step: every node's transform composed after its jump
    ancestor's; frames (nnode, 7) pos, quat."""
    # components by slicing the last axis (a transpose first costs XLA CPU kernels)
    node, anc = math.unstack(frames), math.unstack(frames[jump])
    pos, quat = node[:3], node[3:]
    pj, qj = anc[:3], anc[3:]
    return jnp.stack(math.c_add(pj, math.c_rot(qj, pos)) + math.c_qmul(qj, quat), -1), None


#: trees needing more pointer-doubling steps than this compose frames in a scan over
#: the jump tables. Unrolled, XLA computes the steps in several kernels each: for the
#: humanoid (4 steps, batch 1024) the step compiles 0.75 s CPU slower unrolled, its run
#: time differs by less than the noise of paired runs (scan 28.2-30.4, unrolled
#: 28.6-28.9 us per world-step); for 2 steps (pendulum) the scan saves no compile time
_SCAN_JUMPS = 2


def _compose(frames, jumps):
    """Frames (nnode, 7) composed up the tree by the pointer-doubling ``jumps``."""
    if len(jumps) > _SCAN_JUMPS:
        return inline.scan(_compose_step, frames, jnp.asarray(np.stack(jumps)))[0]
    for jump in jumps:
        frames = _compose_step(frames, jump)[0]
    return frames


def kinematics(m, d):
    """Global poses of bodies, joints, geoms and sites (mj_kinematics).

    Sets xpos, xquat, xmat (body frames), xipos, ximat (inertial frames), xanchor,
    xaxis (joint anchors and axes), geom_xpos/xmat and site_xpos/xmat; world frame.
    """
    tab = tables.get(m)
    dtype = d.qpos.dtype
    # compose frames up the tree by pointer doubling: after each step a node's
    # transform spans twice as many ancestors
    frames = _compose(_node_transforms(m, d), tab.node_jumps)     # (nnode, 7)
    body = math.take(frames, tab.body_node)
    qn = math.c_quat_normalize(math.unstack(body[:, 3:]))
    xquat = math.stack(qn)
    xpos = body[:, :3]
    # the nine entries of mju_quat2Mat, stacked: as a sum of ten products with constant
    # 3x3 matrices (every entry computing all ten) the kernel ran 3-7x slower on XLA CPU
    out = dict(xpos=xpos, xquat=xquat, xmat=_stack_mat(math.c_quat_to_mat(qn)))
    if m.njnt:
        # joint axis and anchor in the frame of the node before the joint; a free
        # joint's anchor is the body position and its axis is left unrotated
        # on component arrays (njnt,): vectors along a last axis of 3 or 4 cost XLA
        # CPU slices, reductions and concatenations per element
        before = math.unstack(math.take(frames, tab.jnt_pred))
        qn = math.c_quat_normalize(before[3:])
        xaxis = math.stack(math.c_rot(qn, math.unstack(_const(m.jnt_axis, dtype))))
        xanchor = math.stack(math.c_add(before[:3], math.c_rot(
            qn, math.unstack(_const(m.jnt_pos, dtype)))))
        free = np.asarray(m.jnt_type) == JointType.FREE
        if free.any():
            jb = np.asarray(m.jnt_bodyid)
            xaxis = math.where(free[:, None], _f(m.jnt_axis, dtype), xaxis)
            xanchor = math.where(free[:, None], math.take(xpos, jb), xanchor)
        out["xaxis"], out["xanchor"] = xaxis, xanchor
    d = d.replace(**out)
    allb = np.arange(m.nbody)
    xipos, ximat = _local_to_global(d, allb, m.body_ipos, m.body_iquat, m.body_sameframe)
    out = dict(xipos=xipos, ximat=ximat)
    if m.ngeom:
        out["geom_xpos"], out["geom_xmat"] = _local_to_global(
            d, np.asarray(m.geom_bodyid), m.geom_pos, m.geom_quat, m.geom_sameframe, xipos,
            ximat)
    if m.nsite:
        out["site_xpos"], out["site_xmat"] = _local_to_global(
            d, np.asarray(m.site_bodyid), m.site_pos, m.site_quat, m.site_sameframe, xipos,
            ximat)
    return d.replace(**out)


# --------------------------------------------------------------------------- com_pos
def subtree_mass(m, dtype=None):
    """Mass of each body's subtree (nbody,), from body_mass (mjModel.body_subtreemass).

    Computed from ``body_mass`` rather than read from the model so that randomising or
    differentiating masses keeps subtree quantities consistent.
    """
    mass = jnp.asarray(m.body_mass) if dtype is None else _f(m.body_mass, dtype)
    return jnp.asarray(tables.get(m).desc, mass.dtype) @ mass


def com_pos(m, d):
    """Subtree centres of mass, com-based inertias and motion dofs (mj_comPos).

    subtree_com (nbody, 3) world; cinert (nbody, 10) about the body's tree com, world
    axes; cdof (nv, 6) motion axis of each dof (rot:lin) about the tree com.
    """
    tab = tables.get(m)
    dtype = d.qpos.dtype
    mass = _f(m.body_mass, dtype)
    smass = subtree_mass(m, dtype)
    moment = math.const_dot(tab.desc, mass[:, None] * d.xipos)
    small = smass < math.MINVAL
    subtree_com = math.where(small[:, None], d.xipos,
                             moment / math.where(small, 1.0, smass)[:, None])
    root = np.asarray(m.body_rootid)
    cinert = math.inert_com(_f(m.body_inertia, dtype), d.ximat,
                            d.xipos - math.take(subtree_com, root), mass)
    out = dict(subtree_com=subtree_com, cinert=cinert)
    if m.nv:
        cand = [jnp.swapaxes(d.xmat, -1, -2).reshape(m.nbody * 3, 3), jnp.eye(3, dtype=dtype)]
        if m.njnt:
            cand.insert(0, d.xaxis)
        axis = math.take(jnp.concatenate(cand), tab.dof_axis_src)
        dof_body = np.asarray(m.dof_bodyid)
        offset = (math.take(subtree_com, root[dof_body]) -
                  math.take(d.xanchor, np.asarray(m.dof_jntid)))
        rot = jnp.concatenate([axis, math.cross(axis, offset)], -1)
        lin = jnp.concatenate([jnp.zeros_like(axis), axis], -1)
        out["cdof"] = math.where(tab.dof_is_rot[:, None], rot, lin)
    return d.replace(**out)


def camlight(m, d):
    """Camera poses (mj_camlight; lights are not modelled): cam_xpos, cam_xmat."""
    if not m.ncam:
        return d
    dtype = d.qpos.dtype
    body = np.asarray(m.cam_bodyid)
    pos, mat = _local_to_global(d, body, m.cam_pos, m.cam_quat)
    mode = np.asarray(m.cam_mode)
    target = np.asarray(m.cam_targetbodyid)
    track = (mode == CamLight.TRACK) | (mode == CamLight.TRACKCOM)
    if np.any(track):
        mat0 = _f(np.asarray(m.cam_mat0).reshape(-1, 3, 3), dtype)
        mat = math.where(track[:, None, None], mat0, mat)
        tpos = math.where((mode == CamLight.TRACK)[:, None],
                          math.take(d.xpos, body) + _f(m.cam_pos0, dtype),
                          math.take(d.subtree_com, body) + _f(m.cam_poscom0, dtype))
        pos = math.where(track[:, None], tpos, pos)
    aim = ((mode == CamLight.TARGETBODY) | (mode == CamLight.TARGETBODYCOM)) & (target >= 0)
    if np.any(aim):
        tb = np.maximum(target, 0)
        look = math.where((mode == CamLight.TARGETBODY)[:, None], d.xpos[tb], d.subtree_com[tb])
        z, _ = math.normalize(pos - look)
        x, _ = math.normalize(math.cross(jnp.array([0.0, 0, 1], dtype), z))
        y, _ = math.normalize(math.cross(z, x))
        amat = jnp.stack([x, y, z], axis=-1)
        mat = math.where(aim[:, None, None], amat, mat)
    return d.replace(cam_xpos=pos, cam_xmat=mat)


# --------------------------------------------------------------------------- tendons
def tendon(m, d):
    """Tendon lengths, Jacobians and wrap paths (mj_tendon): see
    :func:`simjax.engine.tendon.tendon`."""
    from simjax.engine import tendon as tendon_mod
    return tendon_mod.tendon(m, d)


# --------------------------------------------------------------------------- inertia
def _actuator_share(m, kind):
    """Static (n, nactuator) matrix: which actuators pass damping/armature to a joint
    (kind='joint', rows per dof) or tendon (kind='tendon'), per mj_actuatorArmature."""
    from simjax.types import TrnType
    na = m.nactuator
    if kind == "joint":
        ids = np.asarray(m.jnt_actuatorid)[np.asarray(m.dof_jntid)] if m.nv else np.zeros(0, int)
        targets = np.asarray(m.dof_jntid)
        ok_trn = (TrnType.JOINT, TrnType.JOINTINPARENT)
    else:
        ids = np.asarray(m.tendon_actuatorid)
        targets = np.arange(m.ntendon)
        ok_trn = (TrnType.TENDON,)
    share = np.zeros((len(ids), na))
    if na == 0:
        return share
    trntype = np.asarray(m.actuator_trntype)
    trnid = np.asarray(m.actuator_trnid).reshape(-1, 2)[:, 0]
    for r, (aid, tgt) in enumerate(zip(ids, targets)):
        if aid >= 0:
            share[r, aid] = 1.0
        elif aid < -1:
            share[r] = (trnid == tgt) & np.isin(trntype, ok_trn)
    return share


def _all_zero(x):
    """True if ``x`` is concrete (not traced) and all zero."""
    try:
        return not np.any(np.asarray(x))
    except Exception:        # a tracer: the value is not known at trace time
        return False


def _gear2(m, dtype, xp=jnp):
    """Squared first gear of every actuator (nu,), in ``xp`` (jax.numpy, or NumPy)."""
    gear = xp.asarray(m.actuator_gear, dtype).reshape(-1, 6)[
        np.asarray(m.actuator_outadr), 0]
    return gear * gear


def dof_armature(m, dtype):
    """Armature per dof (nv,) including what actuators contribute (mj_actuatorArmature)."""
    arm = _f(m.dof_armature, dtype)
    if m.nactuator:
        share = _actuator_share(m, "joint")
        if share.any():
            arm = arm + jnp.asarray(share, dtype) @ (_f(m.actuator_armature, dtype) *
                                                     _gear2(m, dtype))
    return arm


def crb(m, d):
    """Composite rigid-body inertias and the dense joint-space inertia (mj_makeM).

    crb (nbody, 10); qM (nv, nv) full symmetric, armature included (joint, actuator and
    tendon armature as MuJoCo adds them: tendon terms only within the tree sparsity).
    """
    return crb_lower(m, d)[0]


def crb_lower(m, d, factors=False):
    """:func:`crb`, and an (nv, nv) matrix equal to qM on and below the diagonal (zero
    above it), or None where qM has tendon terms (Data, that matrix).

    A factorisation that reads only qM's lower triangle (tree_level.factor_ld_pair)
    can take it in place of qM: XLA fuses qM's expression into its reader, and qM's
    lower entries read the product's transpose as well (its strictly upper, masked
    entries), a second strided read per entry that the lower matrix does without.

    With ``factors`` (and ``_LOWER_FACTORS``), where qM has no tendon terms, the lower
    triangle comes as its factors (f, cdof, armature; see tree_linalg.from_factors)
    and qM is not computed: the Data's qM is left as it was, for the caller to set
    from the factorisation (tree_level.factor_ld_pair_packed and
    level_ld.factor_ld_packed with ``a`` None return it)."""
    tab = tables.get(m)
    dtype = d.qpos.dtype
    crb_ = math.const_dot(tab.desc_noworld, d.cinert)
    if not m.nv:
        return d.replace(crb=crb_), None
    f = math.stack(math.c_inert_mul(math.unstack(math.take(crb_, np.asarray(m.dof_bodyid))),
                                    math.unstack(d.cdof)))
    armv = dof_armature(m, dtype)
    tendon = None
    if m.ntendon:
        tendon = _f(m.tendon_armature, dtype)
        share = _actuator_share(m, "tendon")
        if share.any():
            tendon = tendon + jnp.asarray(share, dtype) @ (_f(m.actuator_armature, dtype) *
                                                           _gear2(m, dtype))
        elif _all_zero(m.tendon_armature):
            # MuJoCo skips tendons without armature
            tendon = None
    if factors and _LOWER_FACTORS and tendon is None:
        return d.replace(crb=crb_), (f, d.cdof, armv)
    qm, lower = tree_linalg.from_factors(m, f, d.cdof, armv)
    if tendon is not None:
        # MuJoCo adds the tendon terms only where M's tree sparsity has room (dof pairs
        # on one ancestor chain); a tendon coupling two branches gets no cross term
        tree = tab.m_mask + tab.m_mask.T - np.eye(m.nv)
        qm = qm + jnp.einsum("ti,t,tj->ij", d.ten_J, tendon, d.ten_J) * jnp.asarray(
            tree, dtype)
        return d.replace(crb=crb_, qM=qm), None
    return d.replace(crb=crb_, qM=qm), lower


#: whether :func:`crb_lower` gives qM's lower triangle as its factors where its caller
#: takes them (read at trace time; False: the dense lower matrix and qM): the pair
#: factorisation (tree_level) does, level_ld's does not (level_ld._FACTORS). Bench
#: rollout (float32, batch 1024, process CPU, one process, alternated rounds, load
#: 7-10): humanoid-smooth ran 0.852 [0.605, 1.077] (12 rounds); fresh-process compile
#: pairs against the dense path (4 each): humanoid wall 1.009 [0.848, 1.059], trace
#: 1.023 [0.637, 1.317], lowering 0.957 [0.903, 1.084], XLA 1.002 [0.898, 1.120]; the
#: batched program traced 5082 equations (5078 without, 5092 with jnp's gathers).
#: Outputs move by rounding (float64 2e-13 relative)
_LOWER_FACTORS = True


def factor_m(m, d):
    """Factorise the inertia matrix (mj_factorM): qLD = L' D L (tree-sparse, dense)."""
    if not m.nv:
        return d
    return d.replace(qLD=tree_linalg.factor_ld(m, d.qM))


def solve_m(m, d, x):
    """Solve qM y = x with the factor in ``d`` (mj_solveM); x: (nv,) or (nv, k)."""
    return tree_linalg.solve_ld(m, d.qLD, x)


# --------------------------------------------------------------------------- velocity
def com_vel(m, d):
    """Body spatial velocities and dof axis derivatives (mj_comVel).

    cvel (nbody, 6) rot:lin about the tree com; cdof_dot (nv, 6).
    """
    if not m.nv:
        return d
    tab = tables.get(m)
    v = d.cdof * d.qvel[:, None]
    cvel = math.const_dot(tab.anc_dof, v)
    before = math.const_dot(tab.pred, v)
    cdof_dot = math.motion_cross(before, d.cdof)
    cdof_dot = math.where(tab.free_trans_dof[:, None], 0.0, cdof_dot)
    return d.replace(cvel=cvel, cdof_dot=cdof_dot)


def gravity(m, dtype):
    """World gravity (3,), zero when the gravity disable flag is set."""
    if m.opt.disableflags & DisableBit.GRAVITY:
        return jnp.zeros(3, dtype)
    return _f(m.opt.gravity, dtype).reshape(3)


def _body_forces(d, cacc):
    """rne's body forces cinert * cacc + cvel x* (cinert * cvel), as 6 component arrays
    (nbody,) (rotation first; com frame), from ``cacc``'s 6 components.

    Component arrays, not vectors along a last axis of 3 or 6: those cost XLA CPU
    slices and concatenations per element.
    """
    inert, vel = math.unstack(d.cinert), math.unstack(d.cvel)
    mom = math.c_inert_mul(inert, vel)
    w, u = vel[:3], vel[3:]
    bias = (math.c_add(math.c_cross(w, mom[:3]), math.c_cross(u, mom[3:])) +
            math.c_cross(w, mom[3:]))
    return math.c_add(math.c_inert_mul(inert, cacc), bias)


def rne(m, d, flg_acc=False):
    """Recursive Newton-Euler: qfrc_bias = C(qpos, qvel) (mj_rne), plus M qacc if flg_acc.

    Returns (nv,) generalised forces; gravity enters as a world acceleration of -g.
    Models of ``_RNE_COMPONENT_MAJOR_NBODY`` bodies or more take
    :func:`_rne_component_major` (same values, another summation order).
    """
    if not m.nv:
        return jnp.zeros(0, d.qpos.dtype)
    if m.nbody >= _RNE_COMPONENT_MAJOR_NBODY:
        return _rne_component_major(m, d, flg_acc)
    tab = tables.get(m)
    dtype = d.qpos.dtype
    g = gravity(m, dtype)
    acc_dof = d.cdof_dot * d.qvel[:, None]
    if flg_acc:
        acc_dof = acc_dof + d.cdof * d.qacc[:, None]
    cacc = math.const_dot(tab.anc_dof, acc_dof) + jnp.concatenate([jnp.zeros(3, dtype), -g])
    cfrc = math.stack(_body_forces(d, math.unstack(cacc)))
    cfrc = math.const_dot(tab.desc_noworld, cfrc)
    # the dot over 6 as explicit adds: a reduction over a short last axis is a
    # separate kernel on CPU
    f = math.unstack(math.take(cfrc, np.asarray(m.dof_bodyid)))
    cdof = math.unstack(d.cdof)
    out = cdof[0] * f[0]
    for k in range(1, 6):
        out = out + cdof[k] * f[k]
    return out


#: smallest nbody for which rne keeps body quantities component-major (see
#: _rne_component_major; read at trace time). Measured (bench rollouts, float32, batch
#: 1024, 4 steps, process CPU per world-step, component-major / body-major medians of
#: paired rounds in one process, machine load 6-8): shadow hand (nbody 27) 0.973 [0.827,
#: 1.121], 0.974 [0.910, 1.075], 0.972 [0.855, 1.061] (16-20 rounds each); humanoid (17)
#: 0.977 [0.714, 1.160]; ant (14) 1.001 [0.951, 1.051]; barkour (14) 1.002 [0.733,
#: 1.030]; rne alone (hand) 1.41 -> 1.06 us per world. Without contacts, idle machine,
#: 10-12 rounds: half cheetah (8) 0.92 [0.65, 1.04]; but hopper (5) 1.20 [1.05, 1.30],
#: reacher (5) 1.41 [1.22, 1.57] and the inverted pendulum (3) 1.69 [1.42, 2.31] slower.
#: Compile CPU (5 rounds, caches cleared), body-major / component-major: ant 0.973
#: [0.959, 1.005], humanoid 0.984 [0.934, 1.070]; so 16: ant and barkour, no faster at
#: run time, keep the form that compiles faster
_RNE_COMPONENT_MAJOR_NBODY = 16


def _tree_t(x, mat):
    """``(mat @ x.T).T`` for a static (n, k) ``mat`` and ``x`` (c, k): (c, n)."""
    return x @ jnp.asarray(mat.T, x.dtype)


def _rne_component_major(m, d, flg_acc=False):
    """:func:`rne` with body quantities kept component-major, (6, nbody) per world.

    Batched, a tree product of such an operand is one (batch * 6, nbody) x
    (nbody, nbody) matrix product, its operand stacked in place. rne's body-major
    (nbody, 6) form is transposed to (nbody, batch * 6) around each product instead:
    a copy kernel into which XLA CPU fuses the whole body force computation (com
    inertia included), its inputs read with a stride of one world (hand, whole step:
    the costliest kernel of the smooth stages).

    The stack of the 6 body forces is itself such a kernel (one loop per component,
    each computing the com inertia and momentum terms it needs). Measured on the bench
    rollout (batch 1024, float32) and not kept: the body forces as one elementwise
    expression of component-major arrays read through gathers along the component
    axis (and cacc by a product contracting acc (nv, 6) as it is): shadow hand
    optimised LLVM IR 3.3% fewer lines, rne's kernels about a quarter less LLVM time,
    but run time 1.030 [0.956, 1.115] and 1.037 [0.916, 1.072] (12 paired rounds each;
    humanoid 1.008); an optimization barrier on cinert and cvel or on the forces: no
    fewer LLVM ms; one tree product per component: costlier (six body-force kernels).
    """
    tab = tables.get(m)
    dtype = d.qpos.dtype
    g = math.unstack(gravity(m, dtype))
    cdof = math.unstack(d.cdof)
    acc = tuple(c * d.qvel for c in math.unstack(d.cdof_dot))
    if flg_acc:
        acc = tuple(a + c * d.qacc for a, c in zip(acc, cdof))
    cacc = math.unstack(_tree_t(jnp.stack(acc), tab.anc_dof), 0)
    cacc = cacc[:3] + tuple(c - gk for c, gk in zip(cacc[3:], g))
    cfrc = jnp.stack(_body_forces(d, cacc))
    # subtree sums of the body forces at each dof's body, dotted with the dof axis
    f = _tree_t(cfrc, tab.desc_noworld)[:, np.asarray(m.dof_bodyid)]
    out = cdof[0] * f[0]
    for k in range(1, 6):
        out = out + cdof[k] * f[k]
    return out


def subtree_vel(m, d):
    """Subtree linear velocity and angular momentum about the subtree com (mj_subtreeVel).

    subtree_linvel (nbody, 3), subtree_angmom (nbody, 3), world frame.
    """
    tab = tables.get(m)
    dtype = d.qpos.dtype
    mass = _f(m.body_mass, dtype)
    desc = jnp.asarray(tab.desc, dtype)
    root = np.asarray(m.body_rootid)
    weld_dofnum = np.asarray(m.body_dofnum)[np.asarray(m.body_weldid)]
    vel = math.transform_motion(d.cvel, d.xipos, d.subtree_com[root])
    vel = math.where((weld_dofnum == 0)[:, None], 0.0, vel)   # static / mocap bodies
    ang, lin = vel[:, :3], vel[:, 3:]
    smass = subtree_mass(m, dtype)
    linvel = (desc @ (mass[:, None] * lin)) / math.maximum(math.MINVAL, smass)[:, None]
    inertia = _f(m.body_inertia, dtype)
    iw = math.matvec(d.ximat, inertia * math.matTvec(d.ximat, ang))
    # angular momentum about the subtree com: sum of spins plus orbital terms
    own = iw + mass[:, None] * math.cross(d.xipos, lin)
    angmom = desc @ own - smass[:, None] * math.cross(d.subtree_com, linvel)
    return d.replace(subtree_linvel=linvel, subtree_angmom=angmom)
