"""Inverse dynamics (MuJoCo's engine_inverse: mj_inverse).

Given the state (qpos, qvel) and an acceleration ``qacc``, :func:`inverse` computes the
generalised force that produces it:

    qfrc_inverse = M qacc + qfrc_bias - qfrc_passive - qfrc_constraint

(qfrc_bias includes the tendon-armature bias when the velocity stage computes it), so
that for a forward-simulated Data ``qfrc_inverse = qfrc_applied + qfrc_actuator +
J' xfrc_applied``. Position, velocity and acceleration sensors are computed as in
mj_inverse (the acceleration sensors see the given qacc; actuator forces are not
recomputed). With ``EnableBit.INVDISCRETE`` qacc is first converted from the discrete
integrator's acceleration to the continuous one (mj_discreteAcc).

Constraint forces (mj_invConstraint) come from the constraint module's
``inv_constraint(m, d)`` when it exists; with constraints disabled, or a model that can
have no constraint rows, qfrc_constraint is zero; otherwise UnsupportedFeatureError.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from simjax.engine import derivative
from simjax.engine import eager
from simjax.engine import gc_pause
from simjax.engine import io
from simjax.engine import passive
from simjax.engine import precision
from simjax.engine import sensor
from simjax.engine import smooth
from simjax.engine import tables
from simjax.engine.data import Data
from simjax.engine.forward import _euler_damped, check_options, energy, fwd_position, fwd_velocity
from simjax.errors import UnsupportedFeatureError
from simjax.types import DisableBit, EnableBit, IntegratorType


def inv_position(m, d: Data) -> Data:
    """Position-dependent stage of inverse dynamics (mj_invPosition): the same
    computations as the forward position stage."""
    return fwd_position(m, d)


def inv_velocity(m, d: Data) -> Data:
    """Velocity-dependent stage (mj_invVelocity = mj_fwdVelocity)."""
    return fwd_velocity(m, d)


def discrete_acc(m, d: Data):
    """Continuous-time qacc (nv,) equivalent to the discrete-time ``d.qacc`` of the
    model's integrator (mj_discreteAcc): solve M a = H qacc with H the integrator's
    velocity-implicit matrix (Euler: M + h diag(dB/dv), implicit: M - h qDeriv,
    implicitfast: its symmetrised form with exact blocks for standalone free bodies).
    RK4 raises UnsupportedFeatureError (MuJoCo errors too)."""
    dtype = d.qpos.dtype
    h = jnp.asarray(m.opt.timestep, dtype)
    qacc = d.qacc
    integ = m.opt.integrator
    if integ == IntegratorType.RK4:
        raise UnsupportedFeatureError("discrete inverse dynamics with the RK4 integrator")
    if integ == IntegratorType.EULER:
        flag = _euler_damped(m)
        if flag is False:
            return qacc
        damping, poly = passive.dof_damping(m, dtype)
        diag = passive.poly_force_deriv(damping, poly, d.qvel, True)
        qfrc = d.qM @ qacc + h * diag * qacc
    elif integ == IntegratorType.IMPLICIT:
        # MuJoCo keeps qDeriv in the sparsity of dofs related by ancestry (mjModel.D_*):
        # couplings between trees (e.g. tendon damping) are dropped
        mask = tables.get(m).m_mask
        qderiv = derivative.smooth_vel(m, d, flg_bias=True) * jnp.asarray(
            (mask + mask.T) > 0, dtype)
        qfrc = (d.qM - h * qderiv) @ qacc
    else:
        qderiv = derivative.smooth_vel(m, d, flg_bias=False)
        low = qderiv * jnp.asarray(tables.get(m).m_mask, dtype)
        sym = low + low.T - jnp.diag(jnp.diag(low))
        qfrc = (d.qM - h * sym) @ qacc
        free = derivative.free_bodies(m)
        if len(free):
            dadr = np.asarray(m.jnt_dofadr)[np.asarray(m.body_jntadr)[free]]
            idx = dadr[:, None] + np.arange(6)
            bias = derivative.free_bias_blocks(m, d, free)
            amat = (d.qM[idx[:, :, None], idx[:, None, :]] -
                    h * qderiv[idx[:, :, None], idx[:, None, :]] + h * bias)
            blk = jnp.einsum("kij,kj->ki", amat, qacc[idx])
            src = np.arange(m.nv)
            src[idx.ravel()] = m.nv + np.arange(idx.size)
            qfrc = jnp.concatenate([qfrc, blk.ravel()])[src]
    return smooth.solve_m(m, d, qfrc)


def _constraint_free(m) -> bool:
    """Whether the model can have no constraint rows at all (statically)."""
    if m.neq or m.npair:
        return False
    if m.njnt and np.any(np.asarray(m.jnt_limited)):
        return False
    if m.ntendon and np.any(np.asarray(m.tendon_limited)):
        return False
    from simjax.engine import constraint
    if any(mask.any() for mask in constraint.friction_masks(m)):
        return False
    if m.ngeom and not (m.opt.disableflags & DisableBit.CONTACT):
        ct = np.asarray(m.geom_contype)
        ca = np.asarray(m.geom_conaffinity)
        body = np.asarray(m.geom_bodyid)
        hit = ((ct[:, None] & ca[None, :]) | (ca[:, None] & ct[None, :])) != 0
        hit &= body[:, None] != body[None, :]
        if hit.any():
            return False
    return True


def _constraint_stage(m):
    """The constraint module's inv_constraint, or None when the model has no constraint
    rows; raises UnsupportedFeatureError when rows are possible but no module provides
    the inverse constraint stage (decided statically, before any computation)."""
    if m.opt.disableflags & DisableBit.CONSTRAINT or _constraint_free(m):
        return None
    try:
        from simjax.engine import constraint
    except ImportError:
        constraint = None
    fn = getattr(constraint, "inv_constraint", None)
    if fn is None:
        raise UnsupportedFeatureError("inverse dynamics with constraints (mj_invConstraint)")
    return fn


def inv_constraint(m, d: Data) -> Data:
    """Constraint forces for the given qacc (mj_invConstraint): qfrc_constraint (nv,)."""
    fn = _constraint_stage(m)
    if fn is None:
        return d.replace(qfrc_constraint=jnp.zeros(m.nv, d.qpos.dtype))
    return fn(m, d)


@gc_pause.gc_paused
@precision.full_f32
@eager.compiled_when_eager(io.check_data)
def inverse(m, d: Data) -> Data:
    """Inverse dynamics (mj_inverse): qfrc_inverse (nv,) from qpos, qvel and qacc.

    Runs the position and velocity stages (with their sensors and, if enabled, the
    energies), the inverse constraint stage and the acceleration sensors; qacc is
    returned unchanged. Units: generalised forces (N or N m per dof). Raises ValueError
    where ``d`` does not fit ``m`` (:func:`simjax.engine.io.check_data`).
    """
    io.check_data(m, d)
    check_options(m)
    discrete = bool(m.opt.enableflags & EnableBit.INVDISCRETE) and m.nv > 0
    if discrete and m.opt.integrator == IntegratorType.RK4:
        raise UnsupportedFeatureError("discrete inverse dynamics with the RK4 integrator")
    _constraint_stage(m)
    sensor.plan(m)                      # unsupported sensors raise before any work
    d = inv_position(m, d)
    d = sensor.sensor_pos(m, d)
    d = inv_velocity(m, d)
    d = sensor.sensor_vel(m, d)
    d = energy(m, d, sensors=True, zero=False)
    qacc = d.qacc
    if discrete:
        d = d.replace(qacc=discrete_acc(m, d))
    d = inv_constraint(m, d)
    d = sensor.sensor_acc(m, d)
    qfrc = d.qfrc_bias + d.qM @ d.qacc - d.qfrc_passive - d.qfrc_constraint
    return d.replace(qfrc_inverse=qfrc, qacc=qacc)
