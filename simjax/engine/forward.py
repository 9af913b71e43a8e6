"""Forward dynamics and time integration (MuJoCo's engine_forward).

``forward`` runs the pipeline stages in mj_forward's order (position, velocity,
actuation, acceleration, constraint); ``step`` checks the state, runs ``forward`` and
integrates with the model's integrator: semi-implicit Euler with implicit joint damping
(mj_Euler), RK4 (mj_RungeKutta), implicit and implicitfast (mj_implicit).

Constraint rows are made at the end of the position stage and referenced at the end of
the velocity stage (simjax.engine.constraint); ``fwd_constraint`` solves them
(simjax.engine.solver).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from simjax.engine import actuation
from simjax.engine import batch_minor
from simjax.engine import collision
from simjax.engine import constraint
from simjax.engine import derivative
from simjax.engine import eager
from simjax.engine import gc_pause
from simjax.engine import history
from simjax.engine import inline
from simjax.engine import io
from simjax.engine import level_ld
from simjax.engine import math
from simjax.engine import passive
from simjax.engine import plastic
from simjax.engine import precision
from simjax.engine import sensor
from simjax.engine import smooth
from simjax.engine import solver
from simjax.engine import support
from simjax.engine import tables
from simjax.engine import tendon
from simjax.engine import tree_level
from simjax.engine import tree_linalg
from simjax.engine.collision.pairs import CONTACTS_OFF
from simjax.engine.solver_rows import batched_like
from simjax.engine.data import (DATA_FIELD_NAMES, NWARNING, WARN_BADQACC, WARN_BADQPOS,
                                WARN_BADQVEL, Data)
from simjax.errors import UnsupportedFeatureError
from simjax.plugins import engine as plugins
from simjax.types import DisableBit, EnableBit, IntegratorType, SensorType

#: mjMAXVAL: |values| above this count as divergence (mju_isBad).
MAXVAL = 1e10


# --------------------------------------------------------------------------- stages
def fwd_position(m, d: Data) -> Data:
    """Position-dependent stage (mj_fwdPosition, without constraints)."""
    return _fwd_position(m, d)[0]


def check_options(m):
    """Refuse, at trace time, the options of MuJoCo 4 that change its dynamics and that
    simjax does not implement, rather than run without them: sleeping trees
    (mjENBL_SLEEP: frozen where their velocities stay below opt.sleep_tolerance), the
    discrete-time integrator (mjINT_DISCRETE), its IPC contacts (mjENBL_IPC) and
    speculative contacts (mjENBL_SPECULATIVE: contacts made ahead of impact, active at
    a positive distance; moot where contacts are off). Raises
    UnsupportedFeatureError naming the option."""
    flags = m.opt.enableflags
    if flags & EnableBit.SLEEP:
        raise UnsupportedFeatureError("sleeping islands (EnableBit.SLEEP)")
    if m.opt.integrator == IntegratorType.DISCRETE:
        raise UnsupportedFeatureError("the discrete integrator (IntegratorType.DISCRETE)")
    if flags & EnableBit.IPC:
        raise UnsupportedFeatureError("IPC contacts (EnableBit.IPC)")
    if flags & EnableBit.SPECULATIVE and not m.opt.disableflags & CONTACTS_OFF:
        raise UnsupportedFeatureError("speculative contacts (EnableBit.SPECULATIVE)")


def _fwd_position(m, d: Data, euler_diag=None):
    """:func:`fwd_position`; with ``euler_diag`` (nv,) also the factor of
    qM + diag(euler_diag) that mj_Euler will need, computed with qLD (one program for
    both factorisations: tree_level.factor_ld_pair level by level, or
    tree_linalg.factor_ld_pair by LAPACK, see _PAIR_LAPACK): (Data, that factor or None,
    both factors packed for tree_level.solve_ld_pair or None). Without it, qLD alone
    may come packed as well (level_ld.factor_ld_packed)."""
    check_options(m)
    d = smooth.kinematics(m, d)
    d = smooth.com_pos(m, d)
    d = smooth.camlight(m, d)
    d = smooth.tendon(m, d)
    qld_euler = packed = None
    if euler_diag is None and level_ld.use_level(m):
        # mj_factorM level by level, packed for the solve of mj_fwdAcceleration; qM
        # comes from the factorisation where crb_lower gives its factors
        d, lower = smooth.crb_lower(m, d, factors=_LOWER and level_ld._FACTORS)
        qm = None if isinstance(lower, tuple) else d.qM
        qld, packed, qm = level_ld.factor_ld_packed(m, qm, lower if _LOWER else None,
                                                    with_matrix=True)
        d = d.replace(qLD=qld, qM=qm)
    elif euler_diag is None:
        d = smooth.crb(m, d)
        d = smooth.factor_m(m, d)
    elif _lapack_pair(m, d):
        # qLD and mj_Euler's damped factor by one LAPACK call (see _PAIR_LAPACK)
        d = smooth.crb(m, d)
        qld, qld_euler = tree_linalg.factor_ld_pair(m, d.qM, euler_diag)
        d = d.replace(qLD=qld)
    else:
        # (qM's factors only for the level factorisation: LAPACK's reads qM)
        d, lower = smooth.crb_lower(m, d, factors=_LOWER and tree_level.level_plan_fits(m))
        qm = None if isinstance(lower, tuple) else d.qM
        qld, qld_euler, packed, qm = tree_level.factor_ld_pair_packed(
            m, qm, euler_diag, lower=lower if _LOWER else None, with_matrix=True)
        d = d.replace(qLD=qld, qM=qm)
    d = collision.collision(m, d)
    d = constraint.make_constraint(m, d)
    d = actuation.transmission(m, d)
    return d, qld_euler, packed


def fwd_velocity(m, d: Data) -> Data:
    """Velocity-dependent stage (mj_fwdVelocity): tendon and actuator velocities,
    com-based velocities, passive forces and qfrc_bias."""
    out = {}
    if m.ntendon:
        out["ten_velocity"] = d.ten_J @ d.qvel
    if m.nactuator:
        if m.opt.disableflags & DisableBit.ACTUATION:
            out["actuator_velocity"] = jnp.zeros(m.nout, d.qpos.dtype)
        else:
            out["actuator_velocity"] = d.actuator_moment @ d.qvel
    d = d.replace(**out)
    d = smooth.com_vel(m, d)
    d = passive.passive(m, d)
    if m.nplugin:
        d = plugins.compute_passive(m, d)
    bias = smooth.rne(m, d)
    if m.ntendon:
        bias = bias + tendon.tendon_bias(m, d)
    d = d.replace(qfrc_bias=bias)
    return constraint.reference_constraint(m, d)


def fwd_actuation(m, d: Data) -> Data:
    """Actuation stage (mj_fwdActuation): act_dot, actuator_force, qfrc_actuator."""
    return actuation.actuation(m, d)


def fwd_acceleration(m, d: Data) -> Data:
    """Smooth acceleration (mj_fwdAcceleration): qfrc_smooth and qacc_smooth = M^-1 f."""
    return _fwd_acceleration(m, d)[0]


def _fwd_acceleration(m, d: Data, pair=None):
    """:func:`fwd_acceleration`; with ``pair`` (packed factors, the Euler factor) also
    mj_Euler's acceleration for a step without constraint forces, solved together
    with qacc_smooth (tree_level.solve_ld_pair): (Data, that acceleration or None).
    ``pair`` may instead hold qLD's packed factor alone (level_ld.solve_ld_packed)."""
    qfrc = d.qfrc_passive - d.qfrc_bias + d.qfrc_applied + d.qfrc_actuator
    if m.nbody > 1 and m.nv:
        qfrc = qfrc + support.xfrc_accumulate(m, d)
    if pair is not None and len(pair) == 1:
        # qLD's packed factor alone (level_ld.factor_ld_packed)
        qacc = level_ld.solve_ld_packed(m, pair[0], d.qLD, qfrc)
        return d.replace(qfrc_smooth=qfrc, qacc_smooth=qacc), None
    if pair is not None:
        qacc, qacc_euler = tree_level.solve_ld_pair(m, pair[0], d.qLD, pair[1], qfrc)
        return d.replace(qfrc_smooth=qfrc, qacc_smooth=qacc), qacc_euler
    qacc = smooth.solve_m(m, d, qfrc) if m.nv else qfrc
    return d.replace(qfrc_smooth=qfrc, qacc_smooth=qacc), None


def fwd_constraint(m, d: Data) -> Data:
    """Constraint solve (mj_fwdConstraint): qacc, efc_force, qfrc_constraint."""
    return solver.fwd_constraint(m, d)


def energy(m, d: Data, sensors=False, zero=True) -> Data:
    """Potential and kinetic energy into d.energy when EnableBit.ENERGY is set.

    Without it, as MuJoCo 4.0.0 (measured), where the sensor stages ran (``sensors``: a
    bool, or traced) the energy sensors' values: its E_POTENTIAL and E_KINETIC sensors
    both run at the position stage and write the energy they compute into d.energy,
    which mj_forwardSkip then zeroes unless a potential-energy sensor ran. So forward
    (``zero``) leaves [potential, kinetic or as it was] with an E_POTENTIAL sensor,
    else zeros; mj_inverse, which zeroes nothing (``zero`` False), leaves each entry
    an energy sensor computed, the others as they were."""
    dtype = d.qpos.dtype
    if m.opt.enableflags & EnableBit.ENERGY:
        return d.replace(energy=jnp.stack([support.energy_pos(m, d),
                                           support.energy_vel(m, d)]))
    old = d.energy.astype(dtype)
    base = jnp.zeros(2, dtype) if zero else old
    types = np.asarray(m.sensor_type).reshape(m.nsensor)
    ran = sensors is not False and not _sensors_off(m)
    pot_s, kin_s = (ran and bool(np.any(types == t))
                    for t in (SensorType.E_POTENTIAL, SensorType.E_KINETIC))
    if not (pot_s or kin_s) or (zero and not pot_s):
        return d.replace(energy=base)
    pot = support.energy_pos(m, d) if pot_s else old[0]
    kin = support.energy_vel(m, d) if kin_s else old[1]
    out = jnp.stack([pot, kin])
    if sensors is not True:
        out = math.where(sensors, out, base)
    return d.replace(energy=out)


@gc_pause.gc_paused
@precision.full_f32
@eager.compiled_when_eager(io.check_data)
def forward(m, d: Data) -> Data:
    """Forward dynamics (mj_forward): everything in Data from the state and inputs.

    Computes kinematics, inertia, forces, qacc and sensordata without integrating;
    time and state are unchanged. Raises ValueError where ``d`` does not fit ``m``
    (:func:`simjax.engine.io.check_data`).
    """
    io.check_data(m, d)
    if _INLINE_FORWARD:
        # jax.numpy's jits traced in line, as in step (see simjax.engine.inline)
        return inline.inlined(_forward)(m, d, sensors=True)
    return _forward(m, d, sensors=True)


#: forward traced in line (:func:`simjax.engine.inline.inlined`), as step is, read at
#: trace time (False: jax.numpy's jits traced as calls, kept to compare). Trace of
#: jit(vmap(forward)) at batch 256, fresh processes alternated, process CPU: shadow
#: hand 1.59-1.63 -> 1.27-1.48 s (3 pairs), humanoid and ant within noise; the pusher
#: (batch 64) 1.83-2.40 -> 1.76-2.16 s; outputs bit-identical (humanoid, shadow hand,
#: pusher, barkour; float32 and float64)
_INLINE_FORWARD = True


def _forward(m, d: Data, sensors) -> Data:
    """mj_forwardSkip without skipped stages; ``sensors=False`` skips the sensors.

    ``sensors`` may also be a traced boolean scalar (the first RK4 stage of a scan):
    the sensor stages then run under ``lax.cond`` (one branch executed at run time)."""
    return _forward_parts(m, d, sensors)[0]


def _forward_parts(m, d: Data, sensors, euler_diag=None):
    """:func:`_forward`, and with ``euler_diag`` what mj_Euler needs (see
    :func:`_fwd_position`): (Data, its factor or None, its acceleration or None). The
    acceleration comes where the step has no constraint rows (qfrc_constraint is zero,
    so mj_Euler solves for qfrc_smooth as mj_fwdAcceleration does) and the factors
    are packed: both solves then run together."""
    def run(fn, d):
        if sensors is False:
            return d
        if sensors is True or _sensors_off(m):
            return fn(m, d)
        return jax.lax.cond(sensors, lambda x: fn(m, x), lambda x: x, d)

    d, qld_euler, packed = _fwd_position(m, d, euler_diag)
    pair = None
    if packed is not None and qld_euler is None:
        pair = (packed,)
    elif packed is not None and not d.efc_J.shape[-2] and _SOLVE_PAIR:
        pair = (packed, qld_euler)
    d = run(sensor.sensor_pos, d)
    d = fwd_velocity(m, d)
    d = run(sensor.sensor_vel, d)
    d = energy(m, d, sensors)
    d = fwd_actuation(m, d)
    d, qacc_euler = _fwd_acceleration(m, d, pair)
    d = fwd_constraint(m, d)
    return run(sensor.sensor_acc, d), qld_euler, qacc_euler


def _sensors_off(m):
    """Whether the sensor stages leave Data unchanged (no sensors, or disabled)."""
    return bool(m.opt.disableflags & DisableBit.SENSOR) or not m.nsensor


# --------------------------------------------------------------------------- integration
def _history(m, d: Data):
    """The history buffers after this step's insertions (see :func:`history.advance`)."""
    return history.advance(m, d, lambda ids: sensor.compute(m, d, ids))


def _advance(m, d: Data, act_dot, qacc, qvel=None, hist=None, start=None) -> Data:
    """Advance history buffers, activations, velocities, positions and time by one step
    (mj_advance), then the plastic state (:func:`simjax.engine.plastic.update`).

    Positions integrate with ``qvel`` if given (RK4), else with the new velocity
    (semi-implicit Euler). ``hist``: the advanced history buffers, if already computed.
    ``start``: (ten_length, ten_J) of the step's forward where ``d`` holds another
    stage's (RK4), else None (``d``'s).
    """
    h = jnp.asarray(m.opt.timestep, d.qpos.dtype)
    out = {}
    if m.nhistory:
        out["history"] = _history(m, d) if hist is None else hist
    if m.na and not (m.opt.disableflags & DisableBit.ACTUATION):
        tab = actuation.tables(m)
        off = actuation._disabled_mask(m)[tab.act_owner]
        ad = math.where(off, 0.0, act_dot) if off.any() else act_dot
        out["act"] = actuation.advance_activation(m, d, ad)
    new_qvel = d.qvel + h * qacc
    out["qvel"] = new_qvel
    out["qpos"] = support.integrate_pos(m, d.qpos, new_qvel if qvel is None else qvel, h)
    if m.nplastic:
        length, ten_j = (d.ten_length, d.ten_J) if start is None else start
        out["plastic"] = plastic.update(m, d.plastic, d.qpos, out["qpos"], length, ten_j)
    out["time"] = d.time + h
    out["qacc_warmstart"] = d.qacc
    d = d.replace(**out)
    if m.nplugin:
        d = plugins.advance(m, d)
    return d


def _euler_damped(m):
    """Whether mj_Euler integrates damping implicitly: True/False when decidable at trace
    time, else None (damping parameters are traced)."""
    if m.opt.disableflags & (DisableBit.EULERDAMP | DisableBit.DAMPER) or not m.nv:
        return False
    if np.any(np.asarray(m.jnt_actuatorid)[np.asarray(m.dof_jntid)] != -1):
        return True
    damping, poly = tables.concrete(m.dof_damping), tables.concrete(m.dof_dampingpoly)
    if damping is None or poly is None:
        return None
    return bool(np.any(damping > 0) or np.any(poly != 0))


def _euler_diag(m, d: Data):
    """h diag(dB/dv) (nv,): what mj_Euler adds to qM for implicit dof damping."""
    dtype = d.qpos.dtype
    damping, poly = passive.dof_damping(m, dtype)
    return (jnp.asarray(m.opt.timestep, dtype) *
            passive.poly_force_deriv(damping, poly, d.qvel, True))


def euler(m, d: Data, qld=None) -> Data:
    """Semi-implicit Euler step with implicit dof damping (mj_Euler).

    With dof damping B: (M + h diag(dB/dv)) qacc = qfrc_smooth + qfrc_constraint.
    ``qld``: the factor of that matrix if already computed (:func:`step` makes it with
    qLD), else it is factorised here.
    """
    def damped(d):
        q = qld if qld is not None else tree_linalg.factor_ld(
            m, d.qM, add_diag=_euler_diag(m, d))
        return tree_linalg.solve_ld(m, q, d.qfrc_smooth + d.qfrc_constraint)

    flag = _euler_damped(m)
    if flag is None:
        any_damp = (jnp.any(jnp.asarray(m.dof_damping) > 0) |
                    jnp.any(jnp.asarray(m.dof_dampingpoly) != 0))
        qacc = jax.lax.cond(any_damp, damped, lambda d: d.qacc, d)
    else:
        qacc = damped(d) if flag else d.qacc
    return _advance(m, d, d.act_dot, qacc)


_RK4_A = ((0.5,), (0.0, 0.5), (0.0, 0.0, 1.0))
_RK4_B = (1.0 / 6.0, 1.0 / 3.0, 1.0 / 3.0, 1.0 / 6.0)


def _rot_dofs(m):
    """(k, 3) dof indices of the rotational velocities of ball and free joints."""
    jtype = np.asarray(m.jnt_type)
    dadr = np.asarray(m.jnt_dofadr)
    rows = [dadr[j] + (3 if t == 0 else 0) + np.arange(3)
            for j, t in enumerate(jtype) if t in (0, 1)]
    return np.asarray(rows, np.int64).reshape(-1, 3)


def _dexpinv(theta, w):
    """Inverse differential of the exponential map on SO(3), for body-frame rates.

    The rotation-vector rate theta' whose exponential moves with body angular velocity
    w: w + theta x w / 2 + c(|theta|) theta x (theta x w), c(x) = (1 - x/2 cot(x/2))/x^2.
    """
    x = math.norm(theta)
    small = x < 1e-4
    xs = math.where(small, 1.0, x)
    c = math.where(small, 1.0 / 12.0 + x * x / 720.0,
                   (1.0 - 0.5 * xs / jnp.tan(0.5 * xs)) / (xs * xs))
    tw = math.cross(theta, w)
    return w + 0.5 * tw + c[..., None] * math.cross(theta, tw)


def rk4(m, d: Data) -> Data:
    """Classic 4th-order Runge-Kutta step (mj_RungeKutta, N=4); ``d`` must be forwarded.

    Orientations of ball and free joints use the Runge-Kutta-Munthe-Kaas correction
    (MuJoCo 4.0): stage angular velocities are mapped through dexp^-1 of the stage's
    rotation vector before being combined, making orientations 4th-order accurate.
    The three stage evaluations run in one ``lax.scan`` (the classic tableau only
    couples each stage to the previous one), so forward is compiled once for them.
    Stages skip sensors and energy; the returned Data carries the derived quantities of
    the last stage (qacc_warmstart and act_dot included), as MuJoCo's does, except qacc:
    as in MuJoCo 4.0.0, the B-weighted stage acceleration the step integrated,
    (qvel_next - qvel) / timestep.
    """
    return _rk4(m, d, evaluate_first=False)[0]


#: whether RK4 with autoreset picks a held world's qacc in the scan's last stage (read
#: at trace time; False: a select after the scan, a kernel of its own: the ant's
#: rollout one fused kernel more)
_FOLD_HELD_QACC = True


def _rk4(m, d: Data, evaluate_first: bool, autoreset: bool = True):
    """RK4 as a ``lax.scan`` over its stage evaluations; returns (Data, bad qacc flag).

    ``evaluate_first``: ``d`` is not forwarded; the scan runs all four evaluations, the
    first one being mj_step's forward (with sensors, under ``lax.cond``; its qacc is
    checked for mjWARN_BADQACC, counted in ``warning`` unless ``autoreset``; with
    ``autoreset`` a world whose qacc is bad has its later stages evaluated at its
    initial state, see :func:`step`), so forward is traced and compiled once per step
    instead of twice. Otherwise ``d`` is forwarded and the scan runs the three remaining
    stages (flag: False).
    """
    dtype = d.qpos.dtype
    h = jnp.asarray(m.opt.timestep, dtype)
    rot = _rot_dofs(m)
    t0, qpos0, qvel0, act0 = d.time, d.qpos, d.qvel, d.act
    hist = (_history(m, d) if m.nhistory else None) if not evaluate_first else (
        d.history if m.nhistory else None)
    # the first stage's sensors (what step returns: the later stages skip the sensors)
    # and, for the plastic tendons' update, its tendon lengths and Jacobian. The energy
    # is the last stage's: mj_forwardSkip recomputes it where it skips the sensors
    # (MuJoCo 4.0.0, measured: the first stage's was off by up to 4.4 J on a swinging
    # double pendulum)
    plastic_tendons = plastic.has_tendons(m)

    def kept(d):
        return (d.sensordata,) + ((d.ten_length, d.ten_J) if plastic_tendons else ())
    keep = kept(d)
    b0 = _RK4_B[0]
    held = evaluate_first and autoreset
    # the held worlds' qacc chosen in the last stage's kernel of the acceleration sum
    # rather than in a kernel of its own after the scan: the integration below then
    # advances a held world with its bad qacc, but step keeps none of the fields it
    # advances (ADVANCED_FIELDS) for such a world (a plugin's advance is not checked)
    fold = held and _FOLD_HELD_QACC and not m.nplugin

    def stage(carry, coef):
        d, vel, acc, actdot, sv, sa, sact, keep, hist, bada = carry
        a, b, first, last = coef[0], coef[1], coef[2] > 0, coef[3] > 0
        dqvel, dqacc, dact = a * vel, a * acc, a * actdot

        def pick(x0, x):
            return math.where(first, x0, x) if evaluate_first else x
        # with autoreset, a world whose first evaluation had a bad qacc is evaluated at
        # its initial state again, so that the derived fields of the last stage, which
        # step returns, belong to the state step returns for it (the one it came with)
        stay = (first | bada) if evaluate_first and autoreset else first

        def hold(x0, x):
            return math.where(stay, x0, x) if evaluate_first else x
        di = d.replace(qpos=hold(qpos0, support.integrate_pos(m, qpos0, dqvel, h)),
                       qvel=hold(qvel0, qvel0 + h * dqacc), act=hold(act0, act0 + h * dact),
                       time=hold(t0, t0 + a * h))
        d = _forward(m, di, sensors=first if evaluate_first else False)
        if evaluate_first:
            # mj_step's checks and buffers after its forward, before integrating
            bad = first & _is_bad(d.qacc)
            bada = bada | bad
            if not autoreset:
                d = d.replace(warning=_count_warning(d.warning, WARN_BADQACC, bad))
            keep = jax.tree_util.tree_map(lambda x, k: math.where(first, x, k),
                                          kept(d), keep)
            if m.nhistory:
                dd = d
                hist = jax.lax.cond(first, lambda: _history(m, dd), lambda: hist)
        vel = d.qvel
        if len(rot):
            corrected = _dexpinv(h * dqvel[rot], vel[rot])
            src = np.arange(m.nv)
            src[rot.ravel()] = m.nv + np.arange(rot.size)
            vel = pick(vel, jnp.concatenate([vel, corrected.ravel()])[src])
        sa = pick(b * d.qacc, sa + b * d.qacc)
        if fold:
            # a world held for a bad qacc ends with that qacc (see below)
            sa = math.where(last & bada, d.qacc, sa)
        carry = (d, vel, d.qacc, d.act_dot, pick(b * vel, sv + b * vel), sa,
                 pick(b * d.act_dot, sact + b * d.act_dot), keep, hist, bada)
        return carry, None

    rows = [[a[-1], b, 0.0, 0.0] for a, b in zip(_RK4_A, _RK4_B[1:])]
    if evaluate_first:
        rows = [[0.0, b0, 1.0, 0.0]] + rows
        init = (d, qvel0, qvel0, d.act_dot, qvel0, qvel0, d.act_dot)
    else:
        init = (d, qvel0, d.qacc, d.act_dot, b0 * qvel0, b0 * d.qacc, b0 * d.act_dot)
    rows[-1][3] = 1.0
    # the flag batched from the start under vmap (batched_like): found batched in the
    # stage (a bad qacc is per world), it made vmap batch the scan's body, all of
    # forward, a second time (ant: about a fifth of the step's trace); the reference
    # is stop_gradient'ed (a custom_vmap has no reverse-mode rule)
    bada0 = batched_like(jnp.zeros((), bool), jax.lax.stop_gradient((qpos0, qvel0)))
    init = init + (keep, hist, bada0)
    (d, _, _, _, dqvel, dqacc, dact, keep, hist, bada), _ = inline.scan(
        stage, init, jnp.asarray(rows, dtype), consts_inside=True)
    d = d.replace(time=t0, qpos=qpos0, qvel=qvel0, act=act0, sensordata=keep[0])
    out = _advance(m, d, dact, dqacc, dqvel, hist, start=keep[1:] or None)
    # MuJoCo 4.0.0 leaves the acceleration it integrated (the B-weighted sum of the
    # stages) in qacc, while qacc_warmstart and act_dot are the last stage's; a world
    # held for a bad qacc keeps that qacc exactly
    qacc = math.where(bada, out.qacc, dqacc) if held and not fold else dqacc
    return out.replace(qacc=qacc), bada


def implicit(m, d: Data) -> Data:
    """Implicit-in-velocity step (mj_implicit) for integrators implicit / implicitfast.

    implicit: (M - h qDeriv) qacc = f with the full velocity derivative incl. RNE.
    implicitfast: the symmetric part (lower triangle within M's sparsity) of qDeriv
    without RNE, plus an exact 6x6 solve with gyroscopic terms for standalone free
    bodies, as MuJoCo does.
    """
    dtype = d.qpos.dtype
    h = jnp.asarray(m.opt.timestep, dtype)
    qfrc = d.qfrc_smooth + d.qfrc_constraint
    if not m.nv:
        return _advance(m, d, d.act_dot, qfrc)
    mask = tables.get(m).m_mask          # D is restricted to M's sparsity (tree-local)
    if m.opt.integrator == IntegratorType.IMPLICIT:
        qderiv = derivative.smooth_vel(m, d, flg_bias=True)
        low, up, dd = tree_linalg.factor_permuted(m, d.qM - h * qderiv, symmetric=False)
        qacc = tree_linalg.solve_permuted(m, low, up, dd, qfrc)
        return _advance(m, d, d.act_dot, qacc)

    qderiv = derivative.smooth_vel(m, d, flg_bias=False)
    low = qderiv * jnp.asarray(mask, dtype)
    sym = low + low.T - jnp.diag(jnp.diag(low))
    qh = d.qM - h * sym
    free = derivative.free_bodies(m)
    if len(free):
        # keep the factorisation well defined: free blocks are solved separately below
        dadr = np.asarray(m.jnt_dofadr)[np.asarray(m.body_jntadr)[free]]
        blk = np.zeros(m.nv, bool)
        for a in dadr:
            blk[a:a + 6] = True
        both = blk[:, None] & blk[None, :]
        qh = math.where(both, d.qM, qh)
    low, up, dd = tree_linalg.factor_permuted(m, qh)
    qacc = tree_linalg.solve_permuted(m, low, up, dd, qfrc)
    if len(free):
        idx = dadr[:, None] + np.arange(6)                              # (k, 6)
        bias = derivative.free_bias_blocks(m, d, free)                  # (k, 6, 6)
        amat = (d.qM[idx[:, :, None], idx[:, None, :]] -
                h * qderiv[idx[:, :, None], idx[:, None, :]] + h * bias)
        xb = tree_linalg.solve_dense_small(amat, qfrc[idx])
        src = np.arange(m.nv)
        src[idx.ravel()] = m.nv + np.arange(idx.size)
        qacc = jnp.concatenate([qacc, xb.ravel()])[src]
    return _advance(m, d, d.act_dot, qacc)


# --------------------------------------------------------------------------- step
#: reductions of the state checks run over rows padded to a multiple of this: XLA CPU
#: emits a row reduction whose length is not one as a much larger kernel (a remainder
#: loop; the humanoid's 27 qacc entries: 1033 lines of optimised LLVM IR against 80)
_ROW = 4


def _is_bad(x):
    """mju_isBad over an array: any NaN or |x| > mjMAXVAL."""
    if x.size == 0:
        return jnp.zeros((), bool)
    bad = (jnp.isnan(x) | (jnp.abs(x) > MAXVAL)).reshape(-1)
    return jnp.any(jnp.pad(bad, (0, -bad.size % _ROW)))


def _integrate(m, d: Data) -> Data:
    integrator = m.opt.integrator
    if integrator == IntegratorType.EULER:
        return euler(m, d)
    if integrator == IntegratorType.RK4:
        return rk4(m, d)
    if integrator in (IntegratorType.IMPLICIT, IntegratorType.IMPLICITFAST):
        return implicit(m, d)
    raise UnsupportedFeatureError(f"integrator {int(integrator)}")


#: Fields a reset sets (mj_resetData) that the next forward does not recompute: the
#: state and inputs (DATA_FIELDS' first group, up to sensordata), the warning counters,
#: and the quantities forward computes only when a sensor needs them (or inverse does).
#: Every other Data field is written by forward before it is read, so a reset before
#: forward need not touch it.
RESET_FIELDS = (DATA_FIELD_NAMES[:DATA_FIELD_NAMES.index("sensordata") + 1] +
                ("warning", "subtree_linvel", "subtree_angmom", "qfrc_inverse", "cacc",
                 "cfrc_int", "cfrc_ext"))

#: Fields the integrators advance (mj_advance): a world whose qacc is bad keeps their
#: values from before the step.
ADVANCED_FIELDS = ("time", "qpos", "qvel", "act", "qacc_warmstart", "plugin_state",
                   "history", "plastic")


#: Rank of each state check, in mj_step's order of precedence (a bad qacc is seen
#: first: see :func:`step`), and the warning each counts.
_CHECKS = ((3, WARN_BADQACC), (2, WARN_BADQPOS), (1, WARN_BADQVEL))
#: (NWARNING,) the rank of the check each warning counter belongs to (0: none)
_SLOT_RANK = np.zeros(NWARNING, np.int32)
for _rank, _slot in _CHECKS:
    _SLOT_RANK[_slot] = _rank


def _count_warning(warning, slot, flag):
    """``warning`` with ``flag`` (a bool scalar) added to counter ``slot``: an
    elementwise add of a constant one-hot (``.at[slot].add`` is a scatter, which XLA
    compiles with a bounds check of its own)."""
    onehot = np.arange(warning.shape[-1]) == slot
    return warning + onehot.astype(warning.dtype) * flag.astype(warning.dtype)


def _first_bad(d: Data, with_qacc: bool):
    """The rank (``_CHECKS``) of the first failing state check, 0 if none: a bad qacc
    (mj_checkAcc, only ``with_qacc``), else a bad qpos (mj_checkPos), else a bad qvel
    (mj_checkVel). One reduction: every entry is given the rank of its check if it is
    bad (mju_isBad), and the largest wins. The arrays' ranks meet in an elementwise
    maximum of zero-padded copies (to a multiple of ``_ROW``), not a concatenation,
    which XLA would split into a reduction per array (each a large kernel to
    compile)."""
    def rank(x, r):     # lax, not jnp: the same operations, traced faster
        bad = lax.bitwise_or(lax.ne(x, x), lax.gt(lax.abs(x), lax.full_like(x, MAXVAL)))
        return lax.mul(lax.convert_element_type(bad, np.int32),
                       lax.full_like(x, r, np.int32))
    arrays = ((d.qacc, 3),) if with_qacc else ()
    parts = [rank(x, r) for x, r in arrays + ((d.qpos, 2), (d.qvel, 1)) if x.size]
    if not parts:
        return jnp.zeros((), jnp.int32)
    n = max(p.shape[0] for p in parts)
    n += -n % _ROW
    ranks = [jnp.pad(p, (0, n - p.shape[0])) if p.shape[0] < n else p for p in parts]
    first = ranks[0]
    for r in ranks[1:]:
        first = jnp.maximum(first, r)
    return jnp.max(first)


def _select_fields(pred, a, b, names):
    """``b`` with the fields ``names`` replaced by ``where(pred, a, b)``, ``pred`` a
    scalar; ``a``: a Data or a dict of arrays by name.

    lax.select on an explicit broadcast traces to two operations per field, where
    jnp.where adds a nested jit with its own promotions and broadcasts per field.
    Each field is a kernel of its own (the humanoid's step: 17, of which 8 compile a
    fusion identical to another's): XLA CPU (legacy emitters) writes one output per
    elementwise kernel. The fields laid end to end and selected once compiled a
    concatenation more and a slice per field (10 fields of the humanoid's shapes,
    jitted alone: 25 -> 26 kernels); an optimisation barrier after the selects left
    the humanoid's program at 613 kernels.
    """
    out, preds = {}, {}
    for name in names:
        x = a[name] if isinstance(a, dict) else getattr(a, name)
        y = getattr(b, name)
        if y.size:
            # one broadcast of pred per shape (XLA merged the repeated ones anyway)
            if y.shape not in preds:
                preds[y.shape] = jnp.broadcast_to(pred, y.shape)
            out[name] = jax.lax.select(preds[y.shape],
                                       jnp.broadcast_to(x.astype(y.dtype), y.shape), y)
    return b.replace(**out)


@gc_pause.gc_paused
@precision.full_f32
@eager.compiled_when_eager(io.check_data)
def step(m, d: Data) -> Data:
    """Advance the simulation by one timestep (mj_step).

    As MuJoCo: bad qpos or qvel (NaN or beyond 1e10) count mjWARN_BADQPOS/BADQVEL in
    ``d.warning`` and, unless ``DisableBit.AUTORESET`` is set, reset the world first
    (mj_resetData: the state of :func:`simjax.make_data`, the warning counters cleared
    but the one raised); :func:`forward` runs; a bad qacc counts mjWARN_BADQACC. Then
    the state is integrated with ``m.opt.integrator``.

    A bad qacc with autoreset (mj_checkAcc): MuJoCo resets the world, runs mj_forward
    again and integrates, within the same mj_step. simjax does not evaluate forward a
    second time; it splits this over two steps instead:

    - the step that finds the bad qacc returns the world not integrated: time, qpos,
      qvel, act, qacc_warmstart, history, plugin_state and plastic as they came in,
      every other field as this step's forward computed them from that state (all
      consistent with it: exactly what MuJoCo's mjData holds when mj_checkAcc looks at
      qacc), qacc the bad value, and mjWARN_BADQACC counted;
    - the next step sees the bad qacc it was given and resets the world before its
      forward (as a bad qpos or qvel does), with the warning counters cleared but
      mjWARN_BADQACC = 1, then forwards and integrates. Its result equals the result of
      MuJoCo's mj_step that found the bad qacc, every field included.

    So after a bad qacc a world lags MuJoCo by one step, and no field of a reset world
    holds values computed from the diverged state. (A Data handed to step with a bad
    qacc is reset likewise: MuJoCo would compute the same qacc again and reset.)
    Resets are per world under vmap and use selects, never ``lax.cond``; they select
    only the fields forward does not recompute (RESET_FIELDS), and an un-integrated
    world only ADVANCED_FIELDS, so no pass over the derived arrays is needed.

    Under ``vmap``, smooth RK4 steps of small models (see :func:`_use_batch_minor`)
    are evaluated with the worlds on the minor axis of every array
    (:mod:`simjax.engine.batch_minor`): same results up to float rounding.

    Raises ValueError where ``d`` does not fit ``m`` (:func:`simjax.engine.io.
    check_data`; its constraint rows: :func:`simjax.engine.constraint_layout.
    data_layout`).
    """
    io.check_data(m, d)
    if _use_batch_minor(m):
        return batch_minor.batch_minor(functools.partial(_step, m))(d)
    # jax.numpy's jits traced in line (see simjax.engine.inline)
    return inline.inlined(_step)(m, d)


#: the largest nv and nbody whose smooth RK4 steps run batch-minor under vmap (0:
#: none): measured up to the ant (nv 14); the shadow hand (nv 30) did not pay
_BATCH_MINOR_MAX = 28


def _use_batch_minor(m) -> bool:
    """Whether :func:`step` runs batch-minor when batched.

    Every batched call changes the layout of Data on the way in and out (under a
    ``fori_loop`` or ``scan`` over steps XLA keeps the loop state batch-minor and does
    it once per call). At batch 1024 in float32, rollouts of 4 steps per call (the
    benchmark's) against the usual layout: the RK4 pendulum 0.76x to 0.83x and the ant
    0.87x of the time (single steps 0.94x); Euler steps, one forward per layout change,
    do not pay (humanoid 1.02x, barkour 1.04x; single steps 1.1x; the humanoid only
    from about 10 steps per call, 0.84x), nor does the shadow hand (nv 30; 1.06x at 10
    steps).
    So: RK4, constraints disabled (the smooth step; collision and the constraint solver
    were not measured in this layout), at most ``_BATCH_MINOR_MAX`` dofs and bodies,
    and a model of concrete arrays (the batch-minor program holds the model as
    constants; a model batched by an outer vmap could not be, and one passed through
    ``jit`` as an argument is traced, so its steps keep the usual layout).
    """
    if not (m.opt.disableflags & DisableBit.CONSTRAINT):
        return False
    if m.opt.integrator != IntegratorType.RK4:
        return False
    if not 0 < m.nv <= _BATCH_MINOR_MAX or m.nbody > _BATCH_MINOR_MAX:
        return False
    return not any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(m))


#: whether step's reset leaves qacc as it came (read at trace time; False: reset to 0,
#: the ant's rollout one fused kernel more; with both switches on: run 0.996x (0.95-1.05,
#: 16 rounds), outputs bit-identical)
_SKIP_QACC = True


def _step(m, d: Data) -> Data:
    """:func:`step` in the layout it is traced in."""
    autoreset = not (m.opt.disableflags & DisableBit.AUTORESET)
    first = _first_bad(d, autoreset)
    if autoreset:
        base = io.reset_fields(m, RESET_FIELDS, d.qpos.dtype)
        # the warning counters cleared but the one of the failed check
        base["warning"] = (_SLOT_RANK == first).astype(base["warning"].dtype)
        # qacc is not reset: forward computes it before anything reads it, so a reset
        # value is never seen (RK4's scan would carry it in: a kernel of its own)
        names = (tuple(n for n in RESET_FIELDS if n != "qacc") if _SKIP_QACC
                 else RESET_FIELDS)
        d = _select_fields(first > 0, base, d, names)
    else:
        warning = _count_warning(d.warning, WARN_BADQPOS, first == 2)
        d = d.replace(warning=_count_warning(warning, WARN_BADQVEL, first == 1))
    if m.opt.integrator == IntegratorType.RK4:
        # forward runs as the first stage of the RK4 scan (traced once, not twice)
        new, bada = _rk4(m, d, evaluate_first=True, autoreset=autoreset)
    else:
        new, bada = _forward_integrate(m, d, autoreset)
    if not autoreset:
        return new
    new = _select_fields(bada, d, new, ADVANCED_FIELDS)
    return new.replace(warning=_count_warning(new.warning, WARN_BADQACC, bada))


def _forward_integrate(m, d: Data, autoreset: bool):
    """forward, the bad-qacc check and the integrator (not RK4): (Data, bad flag)."""
    if (m.opt.integrator == IntegratorType.EULER and _euler_damped(m) is True
            and _PAIR_FACTOR and (_PAIR_WITH_ROWS or not d.efc_J.shape[-2]
                                  or _lapack_pair(m, d))):
        # mj_Euler's damped matrix is known before forward runs (qM and qvel): both
        # factorisations run together where qLD is made (and, the step having no
        # constraint rows, both solves; see _PAIR_WITH_ROWS)
        d, qld, qacc = _forward_parts(m, d, True, _euler_diag(m, d))
    else:
        d, qld, qacc = forward(m, d), None, None
    bada = _is_bad(d.qacc)
    if not autoreset:
        d = d.replace(warning=_count_warning(d.warning, WARN_BADQACC, bada))
    if qacc is not None:
        # mj_Euler's solve, done with mj_fwdAcceleration's (see _forward_parts)
        return _advance(m, d, d.act_dot, qacc), bada
    return (euler(m, d, qld) if qld is not None else _integrate(m, d)), bada


#: whether step factorises mj_Euler's damped matrix together with qM (read at trace
#: time; False: after forward, as :func:`euler` alone does)
_PAIR_FACTOR = True
#: with _PAIR_FACTOR: whether the pair is factorised together also where the step has
#: constraint rows (read at trace time). There the solves run apart (mj_Euler's after
#: the constraint solve) and the level-by-level pair factorisation (tree_level, about
#: 28 kernels) is not worth its compile: qM and the damped matrix are factorised by
#: LAPACK as without damping (together, by _PAIR_LAPACK). The bench humanoid's
#: rollout, False against True: 613 -> 614 kernels (12 of the pair's fusions fewer),
#: XLA compile CPU 0.893 [0.850, 0.971], 0.922 [0.755, 1.179] and 0.962 [0.910, 1.076]
#: (8, 12 and 10 rounds; one process, alternated, load 7-9), run 1.005 [0.667, 1.237]
#: (16 rounds); qLD's rounding is LAPACK's, as for models without damping. Without
#: rows (humanoid-smooth) both solves run on the packed pair (_SOLVE_PAIR): kept
_PAIR_WITH_ROWS = False
#: whether that pair factorisation reads qM's lower triangle from smooth.crb_lower
#: (read at trace time; False: from qM)
_LOWER = True
#: whether, without constraint rows, mj_Euler's solve runs with mj_fwdAcceleration's
#: on the packed pair of factors (tree_level.solve_ld_pair; read at trace time)
_SOLVE_PAIR = True
#: whether, where the step has constraint rows and _PAIR_WITH_ROWS is off, qLD and
#: mj_Euler's damped factor are made by one LAPACK call on the pair (read at trace
#: time; tree_linalg.factor_ld_pair) instead of one call each (the damped one in
#: :func:`euler`): one chunked loop fewer. See _lapack_pair for where it applies
_PAIR_LAPACK = True


def _lapack_pair(m, d: Data) -> bool:
    """Whether :func:`_fwd_position` factorises the pair with LAPACK (_PAIR_LAPACK):
    the step has constraint rows, the level-by-level pair is off for such steps and
    LAPACK factorises this model's qM."""
    return bool(_PAIR_LAPACK and d.efc_J.shape[-2] and not _PAIR_WITH_ROWS
                and tree_linalg.lapack_ok(m))
