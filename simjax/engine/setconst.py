"""Constants MuJoCo computes from a compiled model (mj_setConst), and stat defaults.

``set_const(model)`` is the last step of :func:`simjax.load_model`. It fills what
depends only on the arrays (``body_subtreemass``, ``jnt_actuatorid``,
``tendon_actuatorid``, tendon tree ids: MuJoCo's ``setFixed``) and, through the
engine's own kinematics and mass matrix evaluated in float64 at ``qpos0``, the
reference-pose quantities of MuJoCo's ``set0`` / ``setStat`` / ``setSpring``:
``dof_M0``, ``body_invweight0``, ``dof_invweight0``, ``tendon_invweight0``,
``tendon_length0``, ``actuator_length0``, ``actuator_acc0``, the connect/weld anchors in
``eq_data``, the dampratio -> kv resolution of position-like actuators, ``cam_*0``,
``dof_length``, ``stat`` (meaninertia, meanmass, meansize, extent, center) and
``tendon_lengthspring``; then joint ``springdamper`` (MuJoCo's ``AutoSpringDamper``)
and the actuator length ranges found by simulation (``length_range``, MuJoCo's
``mj_setLengthRange``).
"""
from __future__ import annotations

import numpy as np

from simjax.types import TrnType, WrapType, leaf


def _wrap_tree(m, body_treeid, j):
    t, obj = int(m.wrap_type[j]), int(m.wrap_objid[j])
    if t == WrapType.JOINT:
        b = m.jnt_bodyid[obj]
    elif t == WrapType.SITE:
        b = m.site_bodyid[obj]
    elif t in (WrapType.SPHERE, WrapType.CYLINDER):
        b = m.geom_bodyid[obj]
    else:
        return -1
    return int(body_treeid[b])


def fixed_fields(m) -> dict:
    """setFixed: subtree masses, actuator back-references, tendon tree ids (numpy)."""
    mass = np.asarray(m.body_mass, dtype=np.float64)
    sub = mass.copy()
    for i in range(m.nbody - 1, 0, -1):
        sub[m.body_parentid[i]] += sub[i]
    jact = np.full(m.njnt, -1, np.int32)
    tact = np.full(m.ntendon, -1, np.int32)
    damping = np.asarray(m.actuator_damping)
    dpoly = np.asarray(m.actuator_dampingpoly)
    arm = np.asarray(m.actuator_armature)
    for i in range(m.nactuator):
        if damping[i] == 0 and not np.any(dpoly[i]) and arm[i] == 0:
            continue
        tgt = m.actuator_trnid[i, 0]
        if m.actuator_trntype[i] in (TrnType.JOINT, TrnType.JOINTINPARENT):
            jact[tgt] = i if jact[tgt] == -1 else -2
        elif m.actuator_trntype[i] == TrnType.TENDON:
            tact[tgt] = i if tact[tgt] == -1 else -2
    treenum = np.zeros(m.ntendon, np.int32)
    treeid = np.full((m.ntendon, 2), -1, np.int32)
    for i in range(m.ntendon):
        seen = []
        for j in range(m.tendon_adr[i], m.tendon_adr[i] + m.tendon_num[i]):
            t = _wrap_tree(m, m.body_treeid, j)
            if t != -1 and t not in seen:
                if len(seen) < 2:
                    treeid[i, len(seen)] = t
                seen.append(t)
        treenum[i] = len(seen)
    return dict(body_subtreemass=sub, jnt_actuatorid=jact, tendon_actuatorid=tact,
                tendon_treenum=treenum, tendon_treeid=treeid)


def set_const(model):
    """Return ``model`` with every mj_setConst quantity filled in (see module doc)."""
    changes = {}
    for k, v in fixed_fields(model).items():
        changes[k] = v if v.dtype != np.float64 else leaf(v)
    model = model.replace(**changes)
    try:
        from simjax.engine import reference
    except ImportError:
        return _default_stat(model)
    return reference.set0(model)


def auto_spring_damper(model, springdamper):
    """Joint stiffness and damping from ``springdamper`` (njnt, 2) = (timeconst,
    dampratio) where both are positive (mjCModel::AutoSpringDamper): with the joint's
    mean inverse weight w at qpos0, inertia = ndof / w, stiffness = inertia /
    (timeconst dampratio)^2, damping = 2 inertia / timeconst."""
    sd = np.asarray(springdamper, np.float64).reshape(-1, 2)
    on = (sd[:, 0] > 0) & (sd[:, 1] > 0)
    if not on.any():
        return model
    ndof = {0: 6, 1: 3, 2: 1, 3: 1}
    invw = np.asarray(model.dof_invweight0, np.float64)
    stiff = np.array(model.jnt_stiffness, np.float64)
    damp = np.array(model.dof_damping, np.float64)
    for j in np.nonzero(on)[0]:
        adr, n = int(model.jnt_dofadr[j]), ndof[int(model.jnt_type[j])]
        inertia = n / max(1e-15, float(invw[adr:adr + n].sum()))
        tc, dr = sd[j]
        stiff[j] = inertia / max(1e-15, tc * tc * dr * dr)
        damp[adr:adr + n] = 2 * inertia / max(1e-15, tc)
    return model.replace(jnt_stiffness=leaf(stiff), dof_damping=leaf(damp))


def length_range(model, given):
    """Muscle (or, by ``mode``, other) actuator length ranges found by simulation
    (mjCModel::LengthRange, :mod:`simjax.engine.lengthrange`); ``given``: the
    ``<compiler><lengthrange>`` attributes set in the model, by name."""
    from simjax.engine import lengthrange as lrm
    opt = dict(given)
    if "mode" in opt:
        opt["mode"] = lrm.MODES[opt["mode"]] if isinstance(opt["mode"], str) else opt["mode"]
    for k in ("useexisting", "uselimit"):
        if k in opt:
            opt[k] = bool(opt[k])
    for k in ("accel", "maxforce", "timeconst", "timestep", "inttotal", "interval",
              "tolrange"):
        if k in opt:
            opt[k] = float(opt[k])
    return lrm.set_length_range(model, lrm.LROpt(**opt))


def _default_stat(model):
    st = model.stat
    defaults = dict(meaninertia=1.0, meanmass=1.0, meansize=0.2, extent=2.0,
                    center=np.zeros(3))
    new = {k: (leaf(defaults[k]) if np.any(np.isnan(np.asarray(getattr(st, k))))
               else getattr(st, k)) for k in defaults}
    return model.replace(stat=st.replace(**new))
