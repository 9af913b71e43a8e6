"""Passive forces: springs, dampers, gravity compensation, fluid (mj_passive).

Sets qfrc_spring, qfrc_damper, qfrc_gravcomp, qfrc_fluid, qfrc_adhesion (adhesive
contacts' pull) and their sum qfrc_passive
(gravity compensation of joints with ``jnt_actgravcomp`` goes to qfrc_actuator instead,
in :mod:`simjax.engine.actuation`). Follows MuJoCo 4.0 semantics, including polynomial
stiffness (``jnt_stiffnesspoly``, ``tendon_stiffnesspoly``) and damping
(``dof_dampingpoly``, ``tendon_dampingpoly``) and damping inherited from actuators.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax.numpy as jnp
import numpy as np

from simjax.engine import math
from simjax.engine import plastic
from simjax.engine import smooth
from simjax.engine import support
from simjax.engine import tables
from simjax.engine.constraint_rows import normal_jacobian
from simjax.engine.rne_post import contacts_possible
from simjax.types import DisableBit, GeomType, JointType


def _f(x, dtype):
    return jnp.asarray(x, dtype)


def poly_force(linear, poly, x, odd):
    """Polynomial force coefficient (mju_polyForce): force = -x * poly_force(...).

    linear + poly[0]*y + poly[1]*y^2 with y = |x| if ``odd`` else x. poly: (..., 2).
    """
    y = jnp.abs(x) if odd else x
    return linear + poly[..., 0] * y + poly[..., 1] * y * y


def poly_force_deriv(linear, poly, x, odd):
    """d(x * poly_force)/dx (mjd_xPolyForce)."""
    y = jnp.abs(x) if odd else x
    return linear + 2 * poly[..., 0] * y + 3 * poly[..., 1] * y * y


def poly_potential(linear, poly, x, odd):
    """Integral of t * poly_force(t) from 0 to x (mju_polyPotential)."""
    y = jnp.abs(x) if odd else x
    return 0.5 * linear * y * y + poly[..., 0] / 3 * y ** 3 + poly[..., 1] / 4 * y ** 4


# --------------------------------------------------------------------------- springs
def _joint_spring_dofs(m, qpos, dtype, qspring):
    """Joint spring forces (nv,), or None without joints (mj_springdamper, springs),
    about the references ``qspring`` (nq,) (:func:`simjax.engine.plastic.
    spring_refs`)."""
    jtype = np.asarray(m.jnt_type)
    qadr = np.asarray(m.jnt_qposadr)
    dadr = np.asarray(m.jnt_dofadr)
    k = _f(m.jnt_stiffness, dtype)
    poly = _f(m.jnt_stiffnesspoly, dtype).reshape(m.njnt, 2)
    parts = []   # (dof indices, forces)
    # joints whose stiffness is known (not traced) to be zero have no spring: skip
    # them statically (a free joint's quaternion difference is costly)
    live = np.ones(m.njnt, bool)
    ks, kp = tables.concrete(m.jnt_stiffness), tables.concrete(m.jnt_stiffnesspoly)
    if ks is not None and kp is not None:
        live = (ks != 0) | np.any(kp.reshape(m.njnt, 2) != 0, axis=1)
    jtype = np.where(live, jtype, -1)

    scalar = np.nonzero((jtype == JointType.HINGE) | (jtype == JointType.SLIDE))[0]
    if len(scalar):
        x = math.take(qpos, qadr[scalar]) - qspring[qadr[scalar]]
        parts.append((dadr[scalar], -x * poly_force(k[scalar], poly[scalar], x, False)))

    free = np.nonzero(jtype == JointType.FREE)[0]
    if len(free):
        idx = qadr[free][:, None] + np.arange(3)
        dif = math.take(qpos, idx) - qspring[idx]
        r = math.norm(dif)
        kr = poly_force(k[free], poly[free], r, False)
        parts.append(((dadr[free][:, None] + np.arange(3)).ravel(),
                      (-kr[:, None] * dif).ravel()))

    rot = np.nonzero((jtype == JointType.FREE) | (jtype == JointType.BALL))[0]
    if len(rot):
        off = np.where(jtype[rot] == JointType.FREE, 3, 0)
        idx = (qadr[rot] + off)[:, None] + np.arange(4)
        dif = math.sub_quat(math.quat_normalize(math.take(qpos, idx)), qspring[idx])
        r = math.norm(dif)
        kr = poly_force(k[rot], poly[rot], r, False)
        parts.append((((dadr[rot] + off)[:, None] + np.arange(3)).ravel(),
                      (-kr[:, None] * dif).ravel()))

    if not parts:
        return jnp.zeros(m.nv, dtype)
    idx = np.concatenate([p[0] for p in parts])
    val = jnp.concatenate([p[1] for p in parts])
    # each dof appears at most once: a permutation gather instead of a scatter
    src = np.full(m.nv, len(idx))
    src[idx] = np.arange(len(idx))
    return math.take(jnp.concatenate([val, jnp.zeros(1, dtype)]), src)


def _damping(m, dtype, kind, damping, poly, n):
    """Linear (n,) and polynomial (n, 2) damping of the joints' dofs or tendons
    (``kind``), with the damping of the actuators acting on them alone added (their
    share, times gear squared)."""
    damping = _f(damping, dtype)
    poly = _f(poly, dtype).reshape(n, 2)
    if m.nactuator:
        share = smooth._actuator_share(m, kind)
        if share.any():
            s = jnp.asarray(share, dtype)
            g2 = smooth._gear2(m, dtype)
            damping = damping + s @ (_f(m.actuator_damping, dtype) * g2)
            poly = poly + s @ (_f(m.actuator_dampingpoly, dtype).reshape(-1, 2) * g2[:, None])
    return damping, poly


def dof_damping(m, dtype):
    """Linear and polynomial damping per dof incl. actuator damping (nv,), (nv, 2)."""
    return _damping(m, dtype, "joint", m.dof_damping, m.dof_dampingpoly, m.nv)


def tendon_damping(m, dtype):
    """Linear and polynomial tendon damping incl. actuator damping (ntendon,), (ntendon, 2)."""
    return _damping(m, dtype, "tendon", m.tendon_damping, m.tendon_dampingpoly, m.ntendon)


def _tendon_spring_damper(m, d, rng, damper_on):
    """Tendon spring (dead band ``rng`` (ntendon, 2), None: springs off) and damper
    forces along the tendon."""
    dtype = d.qpos.dtype
    zero = jnp.zeros(m.ntendon, dtype)
    frc_s, frc_d = zero, zero
    if rng is not None:
        length = d.ten_length
        x = math.where(length > rng[:, 1], length - rng[:, 1],
                       math.where(length < rng[:, 0], length - rng[:, 0], 0.0))
        spoly = _f(m.tendon_stiffnesspoly, dtype).reshape(m.ntendon, 2)
        frc_s = -x * poly_force(_f(m.tendon_stiffness, dtype), spoly, x, False)
    if damper_on:
        damping, dpoly = tendon_damping(m, dtype)
        v = d.ten_velocity
        frc_d = -v * poly_force(damping, dpoly, v, True)
    return _tendon_to_dofs(frc_s, d.ten_J), _tendon_to_dofs(frc_d, d.ten_J)


def _tendon_to_dofs(frc, ten_j):
    """frc @ ten_J; for a few tendons as elementwise products, which XLA fuses with
    their consumers (a batched vector-matrix dot is a separate, slow kernel on CPU)."""
    if frc.shape[0] > 8:
        return frc @ ten_j
    out = frc[0] * ten_j[0]
    for t in range(1, frc.shape[0]):
        out = out + frc[t] * ten_j[t]
    return out


# --------------------------------------------------------------------------- gravcomp
def gravcomp(m, d):
    """Gravity compensation forces (nv,) (mj_gravcomp); zero if none or gravity off."""
    dtype = d.qpos.dtype
    if not m.ngravcomp or (m.opt.disableflags & DisableBit.GRAVITY):
        return jnp.zeros(m.nv, dtype)
    g = smooth.gravity(m, dtype)
    scale = _f(m.body_mass, dtype) * _f(m.body_gravcomp, dtype)
    force = -scale[:, None] * g
    force = force.at[0].set(0.0)
    bodies = np.arange(m.nbody)
    return support.apply_ft(m, d, force, None, d.xipos, bodies)


# --------------------------------------------------------------------------- fluid
def _inertia_box_force(mass, inertia, density, viscosity, lvel):
    """Local force/torque (n, 6) of the inertia-box fluid model (rot:lin).

    mass (n,), inertia (n, 3) principal moments, lvel (n, 6) local velocity relative
    to the wind; the body is replaced by the box with the same inertia.
    """
    i0, i1, i2 = inertia[:, 0], inertia[:, 1], inertia[:, 2]
    msafe = math.where(mass < math.MINVAL, 1.0, mass)

    def side(a, b, c):
        return math.safe_sqrt(jnp.maximum(math.MINVAL, b + c - a) / msafe * 6.0)

    box = jnp.stack([side(i0, i1, i2), side(i1, i0, i2), side(i2, i0, i1)], -1)
    diam = jnp.sum(box, -1) / 3.0
    w, v = lvel[:, :3], lvel[:, 3:]
    visc_on = viscosity > 0
    torque = math.where(visc_on, -jnp.pi * diam[:, None] ** 3 * viscosity * w, 0.0)
    force = math.where(visc_on, -3.0 * jnp.pi * diam[:, None] * viscosity * v, 0.0)
    b0, b1, b2 = box[:, 0], box[:, 1], box[:, 2]
    area = jnp.stack([b1 * b2, b0 * b2, b0 * b1], -1)
    force = force - math.where(density > 0, 0.5 * density * area * jnp.abs(v) * v, 0.0)
    arm = jnp.stack([b0 * (b1 ** 4 + b2 ** 4), b1 * (b0 ** 4 + b2 ** 4),
                     b2 * (b0 ** 4 + b1 ** 4)], -1)
    torque = torque - math.where(density > 0, density * arm * jnp.abs(w) * w / 64.0, 0.0)
    return jnp.concatenate([torque, force], -1)


def geom_semiaxes(size, gtype):
    """Ellipsoid semi-axes approximating a geom (mju_geomSemiAxes); gtype static."""
    s0, s1, s2 = size[:, 0], size[:, 1], size[:, 2]
    sphere = gtype == GeomType.SPHERE
    capsule = gtype == GeomType.CAPSULE
    cyl = gtype == GeomType.CYLINDER
    a1 = math.where(sphere | capsule | cyl, s0, s1)
    a2 = math.where(sphere, s0, math.where(capsule, s1 + s0, math.where(cyl, s1, s2)))
    return jnp.stack([s0, a1, a2], -1)


def ellipsoid_force(lvel, density, viscosity, size, coef):
    """Local force/torque (n, 6) of the ellipsoid fluid model (mj_addedMassForces +
    mj_viscousForces), before scaling by the interaction coefficient.

    lvel: (n, 6) local rot:lin velocity (wind removed); size: (n, 3) semi-axes;
    coef: (n, 12) geom_fluid rows.
    """
    w, v = lvel[:, :3], lvel[:, 3:]
    blunt, slender, angdrag = coef[:, 1:2], coef[:, 2:3], coef[:, 3:4]
    kutta, magnus = coef[:, 4:5], coef[:, 5:6]
    vmass, vinert = coef[:, 6:9], coef[:, 9:12]
    # added mass
    lin_mom = density * vmass * v
    ang_mom = density * vinert * w
    torque = math.cross(lin_mom, v) + math.cross(ang_mom, w)
    force = math.cross(lin_mom, w)
    # viscous / lift
    s0, s1, s2 = size[:, 0:1], size[:, 1:2], size[:, 2:3]
    volume = 4.0 / 3.0 * jnp.pi * s0 * s1 * s2
    d_max = jnp.max(size, -1, keepdims=True)
    d_min = jnp.min(size, -1, keepdims=True)
    d_mid = s0 + s1 + s2 - d_max - d_min
    a_max = jnp.pi * d_max * d_mid
    magnus_force = math.cross(w, v) * magnus * density * volume
    sq = jnp.concatenate([(s1 * s2) ** 2, (s2 * s0) ** 2, (s0 * s1) ** 2], -1)
    proj_denom = jnp.sum(sq * sq * v * v, -1, keepdims=True)
    proj_num = jnp.sum(sq * v * v, -1, keepdims=True)
    speed = math.norm(v)[:, None]
    # MuJoCo 4.0.0 (measured): below mjMINVAL of speed no projected area and no lift,
    # above it the ratios unclamped (3.x clamped both denominators at mjMINVAL, which
    # cut the lift of thin ellipsoids such as playing cards at low speed)
    moving = (speed >= math.MINVAL) & (proj_num > 0) & (proj_denom > 0)
    a_proj = math.where(moving, jnp.pi * math.safe_sqrt(
        proj_denom / math.where(moving, proj_num, 1.0)), 0.0)
    cos_alpha = math.where(moving, proj_num / math.where(moving, speed * proj_denom, 1.0),
                           0.0)
    circ = math.cross(sq * v, v) * kutta * density * cos_alpha * a_proj
    kutta_force = math.cross(circ, v)
    eq_d = 2.0 / 3.0 * (s0 + s1 + s2)
    lin_visc_f = 3.0 * jnp.pi * eq_d
    lin_visc_t = jnp.pi * eq_d ** 3
    i_max = 8.0 / 15.0 * jnp.pi * d_mid * d_max ** 4
    ii = jnp.concatenate([_max_moment(size, 0), _max_moment(size, 1), _max_moment(size, 2)], -1)
    mom_visc = w * (angdrag * ii + slender * (i_max - ii))
    drag_lin = viscosity * lin_visc_f + density * speed * (
        a_proj * blunt + slender * (a_max - a_proj))
    drag_ang = viscosity * lin_visc_t + density * math.norm(mom_visc)[:, None]
    torque = torque - drag_ang * w
    force = force + magnus_force + kutta_force - drag_lin * v
    return jnp.concatenate([torque, force], -1)


def _max_moment(size, k):
    d0 = size[:, k:k + 1]
    d1 = size[:, (k + 1) % 3:(k + 1) % 3 + 1]
    d2 = size[:, (k + 2) % 3:(k + 2) % 3 + 1]
    return 8.0 / 15.0 * jnp.pi * d0 * jnp.maximum(d1, d2) ** 4


def fluid_plan(m):
    """Which elements use which fluid model.

    Returns (box_bodies, ell_geoms, box_weight, ell_weight): index arrays of bodies
    evaluated with the inertia-box model and of geoms evaluated with the ellipsoid
    model, and per-element weights. A body uses the ellipsoid model when any of its
    geoms has geom_fluid[0] > 0 (MJCF ``fluidshape``), the box model otherwise; each
    ellipsoid geom's force is scaled by geom_fluid[0]. When geom_fluid is concrete the
    choice is made statically (weights None); when traced, both models are evaluated
    everywhere and the weights select them.
    """
    gb = np.asarray(m.geom_bodyid)
    gf = tables.concrete(m.geom_fluid)
    if gf is not None:
        coef = gf.reshape(m.ngeom, 12)[:, 0]
        use_ell = np.zeros(m.nbody, bool)
        use_ell[gb[coef > 0]] = True
        return np.nonzero(~use_ell)[0], np.nonzero(use_ell[gb])[0], None, None
    coef = jnp.asarray(m.geom_fluid).reshape(m.ngeom, 12)[:, 0]
    onehot = np.zeros((m.nbody, m.ngeom))
    onehot[gb, np.arange(m.ngeom)] = 1.0
    use_ell = (jnp.asarray(onehot, coef.dtype) @ (coef > 0).astype(coef.dtype)) > 0
    return (np.arange(m.nbody), np.arange(m.ngeom), math.where(use_ell, 0.0, 1.0),
            math.where(coef > 0, 1.0, 0.0))


class FluidGroup(NamedTuple):
    """Elements sharing one fluid model: forces act at ``point`` on ``bodies``.

    rot (n, 3, 3) local frames; lvel (n, 6) local rot:lin velocity relative to the wind;
    lfrc (n, 6) weighted local force; weight (n,); ``force_fn(lvel_row, *params_rows)``
    the unweighted local force of one element, with per-element ``params``.
    """

    bodies: np.ndarray
    point: Any
    rot: Any
    lvel: Any
    lfrc: Any
    weight: Any
    force_fn: Callable
    params: tuple
    is_box: bool


def fluid_local(m, d):
    """Local fluid forces of every element using a fluid model: a list of FluidGroup.

    Used by :func:`fluid` and by the implicit integrators' derivatives.
    """
    dtype = d.qpos.dtype
    box_bodies, ell_geoms, box_w, ell_w = fluid_plan(m)
    wind = _f(m.opt.wind, dtype).reshape(3)
    density = _f(m.opt.density, dtype)
    viscosity = _f(m.opt.viscosity, dtype)
    mass = _f(m.body_mass, dtype)
    groups = []
    if len(box_bodies):
        b = box_bodies
        lvel = support.object_velocity(m, d, b, d.xipos[b], d.ximat[b])
        lvel = lvel.at[:, 3:].add(-math.matTvec(d.ximat[b], wind))
        weight = math.where(mass[b] < math.MINVAL, 0.0, 1.0)
        if box_w is not None:
            weight = weight * box_w

        def box_fn(lv, ms, it):
            return _inertia_box_force(ms[None], it[None], density, viscosity, lv[None])[0]

        params = (mass[b], _f(m.body_inertia, dtype)[b])
        frc = _inertia_box_force(*params, density, viscosity, lvel) * weight[:, None]
        groups.append(FluidGroup(b, d.xipos[b], d.ximat[b], lvel, frc, weight, box_fn,
                                 params, True))
    if len(ell_geoms):
        g = ell_geoms
        b = np.asarray(m.geom_bodyid)[g]
        lvel = support.object_velocity(m, d, b, d.geom_xpos[g], d.geom_xmat[g])
        lvel = lvel.at[:, 3:].add(-math.matTvec(d.geom_xmat[g], wind))
        coef = _f(m.geom_fluid, dtype).reshape(m.ngeom, 12)[g]
        size = geom_semiaxes(_f(m.geom_size, dtype)[g], np.asarray(m.geom_type)[g])
        weight = math.where(mass[b] < math.MINVAL, 0.0, coef[:, 0])
        if ell_w is not None:
            weight = weight * ell_w

        def ell_fn(lv, sz, cf):
            return ellipsoid_force(lv[None], density, viscosity, sz[None], cf[None])[0]

        frc = ellipsoid_force(lvel, density, viscosity, size, coef) * weight[:, None]
        groups.append(FluidGroup(b, d.geom_xpos[g], d.geom_xmat[g], lvel, frc, weight,
                                 ell_fn, (size, coef), False))
    return groups


def fluid(m, d):
    """Fluid forces (nv,) (mj_fluid): inertia-box or ellipsoid model per body.

    Skipped statically when density and viscosity are concretely zero; when they are
    traced, a ``lax.cond`` on them skips the work at run time (not where they are
    differentiated: :func:`tables.run_if_nonzero`).
    """
    dtype = d.qpos.dtype
    dens, visc = tables.concrete(m.opt.density), tables.concrete(m.opt.viscosity)
    if dens is not None and visc is not None and not (dens != 0 or visc != 0):
        return jnp.zeros(m.nv, dtype)

    def compute(d):
        total = jnp.zeros(m.nv, dtype)
        for grp in fluid_local(m, d):
            torque = math.matvec(grp.rot, grp.lfrc[:, :3])
            force = math.matvec(grp.rot, grp.lfrc[:, 3:])
            total = total + support.apply_ft(m, d, force, torque, grp.point, grp.bodies)
        return total

    return tables.run_if_nonzero(m.opt, ("density", "viscosity"), compute,
                                 lambda d: jnp.zeros(m.nv, dtype), d)


def adhesion(m, d):
    """qfrc_adhesion (nv,): the adhesive contacts' constant pull, -adhesion along each
    contact normal, J_n' (-adhesion) summed over the valid contacts (mj_adhesion; N and
    N m in generalised coordinates). Zero without adhesion or contacts (static); with
    traced adhesion parameters, skipped at run time where they are zero
    (:func:`tables.run_if_nonzero`)."""
    zero = jnp.zeros(m.nv, d.qpos.dtype)
    con = getattr(d, "contact", None)
    if (con is None or con.dist.shape[0] == 0 or not tables.has_adhesion(m)
            or not contacts_possible(m)):
        return zero
    return tables.run_if_nonzero(
        m, tables.ADHESION, lambda: -(con.adhesion * con.valid) @ normal_jacobian(m, d),
        lambda: zero)


# --------------------------------------------------------------------------- mj_passive
def passive(m, d):
    """All passive forces (mj_passive): qfrc_spring, qfrc_damper, qfrc_gravcomp,
    qfrc_fluid, qfrc_adhesion and their sum qfrc_passive (nv,), generalised
    coordinates. Requires the position stage and collision (contacts, for adhesion)."""
    dtype = d.qpos.dtype
    zero = jnp.zeros(m.nv, dtype)
    spring_on = not (m.opt.disableflags & DisableBit.SPRING)
    damper_on = not (m.opt.disableflags & DisableBit.DAMPER)
    if not m.nv or not (spring_on or damper_on):
        return d.replace(qfrc_spring=zero, qfrc_damper=zero, qfrc_gravcomp=zero,
                         qfrc_fluid=zero, qfrc_adhesion=zero, qfrc_passive=zero)
    # the springs' references (the plastic ones where they yield), made once for both
    qspring, lengthspring = plastic.spring_refs(m, d, dtype) if spring_on else (None, None)
    spring = (_joint_spring_dofs(m, d.qpos, dtype, qspring)
              if spring_on and m.njnt else zero)
    damper = zero
    if damper_on:
        damping, poly = dof_damping(m, dtype)
        damper = -d.qvel * poly_force(damping, poly, d.qvel, True)
    if m.ntendon:
        ts, td = _tendon_spring_damper(m, d, lengthspring, damper_on)
        spring, damper = spring + ts, damper + td
    qfrc_gc = gravcomp(m, d)
    qfrc_fl = fluid(m, d)
    passive_gc = qfrc_gc
    actgc = np.asarray(m.jnt_actgravcomp)[np.asarray(m.dof_jntid)]
    if actgc.any():
        passive_gc = math.where(actgc, 0.0, qfrc_gc)
    qfrc_ad = adhesion(m, d)
    total = spring + damper + qfrc_fl
    if tables.has_adhesion(m):
        total = total + qfrc_ad
    total = total + passive_gc
    return d.replace(qfrc_spring=spring, qfrc_damper=damper, qfrc_gravcomp=qfrc_gc,
                     qfrc_fluid=qfrc_fl, qfrc_adhesion=qfrc_ad, qfrc_passive=total)
