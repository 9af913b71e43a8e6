"""Actuator length ranges found by simulation (MuJoCo's mj_setLengthRange).

A muscle needs ``actuator_lengthrange``: the lengths its transmission can reach. When
the model does not give it, MuJoCo's compiler finds it by simulating: from qpos0, with
contacts, gravity, springs, dampers, friction loss and actuation disabled, a force
along the actuator's moment (scaled so that the unconstrained acceleration has norm
``accel``, capped at ``maxforce``) pushes the actuator towards its shortest (side 0)
and then its longest (side 1) length, while the velocity decays with time constant
``timeconst`` so that the motion settles against the joint and tendon limits. The
range is the minimum (side 0) and the maximum (side 1) of the length over the last
``interval`` seconds of ``inttotal`` simulated seconds; the simulation must not
diverge, and the length must have settled to within ``tolrange`` of the range on
both sides.

simjax runs the same simulation with its own engine (position, velocity, constraint
solve, Euler or implicit integration; RK4 integrates with Euler as in ``mj_step2``) in
float64, all (actuator, side) pairs at once: one jitted ``lax.scan`` over time under
``vmap``. Options come from ``<compiler><lengthrange>`` (:class:`LROpt`).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from simjax.errors import MJCFError
from simjax.types import BiasType, DisableBit, GainType, IntegratorType, TrnType, leaf

MINVAL = 1e-15

#: mjtLRMode
MODE_NONE, MODE_MUSCLE, MODE_MUSCLEUSER, MODE_ALL = 0, 1, 2, 3
MODES = {"none": MODE_NONE, "muscle": MODE_MUSCLE, "muscleuser": MODE_MUSCLEUSER,
         "all": MODE_ALL}

#: What mjCModel::LengthRange disables for the simulation (all other flags are cleared).
_DISABLE = (DisableBit.FRICTIONLOSS | DisableBit.CONTACT | DisableBit.SPRING |
            DisableBit.DAMPER | DisableBit.GRAVITY | DisableBit.ACTUATION)


@dataclasses.dataclass(frozen=True)
class LROpt:
    """mjLROpt: ``<compiler><lengthrange>`` attributes (MuJoCo's defaults)."""

    mode: int = MODE_MUSCLE
    useexisting: bool = True
    uselimit: bool = False
    accel: float = 20.0
    maxforce: float = 0.0
    timeconst: float = 1.0
    timestep: float = 0.01
    inttotal: float = 10.0
    interval: float = 2.0
    tolrange: float = 0.05


def _selected(m, i, opt):
    """Whether actuator ``i`` is in scope of ``opt.mode``."""
    gt, bt = int(m.actuator_gaintype[i]), int(m.actuator_biastype[i])
    muscle = gt == GainType.MUSCLE or bt == BiasType.MUSCLE
    user = gt == GainType.USER or bt == BiasType.USER
    return not (opt.mode == MODE_NONE or (opt.mode == MODE_MUSCLE and not muscle) or
                (opt.mode == MODE_MUSCLEUSER and not muscle and not user))


def _times(h, inttotal):
    """Simulation time after each step, accumulated in float64 as mj_step does."""
    out, t = [], 0.0
    while t < inttotal:
        t += h
        out.append(t)
    return np.asarray(out)


def _simulate(m, index, sign, nstep, opt, decay):
    """Actuator lengths (nstep,) before each step, and whether the state ever turned
    bad (mju_isBad of qpos, qvel or qacc: MuJoCo would reset, which it reports as
    an unstable simulation). ``decay``: the factor on qvel before each step."""
    import jax
    import jax.numpy as jnp
    import importlib
    from simjax.engine import io, smooth
    from simjax.engine.solver_worlds import batched_like
    fw = importlib.import_module("simjax.engine.forward")
    d0 = io.make_data(m, dtype=jnp.float64)
    implicit = m.opt.integrator in (IntegratorType.IMPLICIT, IntegratorType.IMPLICITFAST)

    def one(d, _):
        bad = fw._is_bad(d.qpos) | fw._is_bad(d.qvel)
        d = d.replace(qvel=d.qvel * decay)
        d = fw.fwd_velocity(m, fw.fwd_position(m, d))
        moment = d.actuator_moment[index]
        nrm = jnp.linalg.norm(smooth.solve_m(m, d, moment))
        frc = moment * (sign * opt.accel / jnp.maximum(MINVAL, nrm))
        if opt.maxforce > 0:
            fn = jnp.linalg.norm(frc)
            frc = jnp.where(fn > opt.maxforce, frc * (opt.maxforce / jnp.maximum(MINVAL, fn)),
                            frc)
        d = d.replace(qfrc_applied=frc)
        d = fw.fwd_constraint(m, fw.fwd_acceleration(m, fw.fwd_actuation(m, d)))
        bad = bad | fw._is_bad(d.qacc)
        length = d.actuator_length[index]
        d = fw.implicit(m, d) if implicit else fw.euler(m, d)
        return d, (length, bad)

    # every leaf of the carry batched from the start (the caller's vmap is over the
    # (actuator, side) pairs): a carried value found batched after the first step makes
    # the scan batch its traced body again, once per round (arm26's simulation traced
    # in 3.1-3.2 s, now 2.0-2.2; its load 11.1-11.4 -> 10.1-10.8 s, 2 runs each).
    # Measured, not done: the vmap inside the scan's body (one trace under vmap):
    # trace 1.9-2.0 s, but compile and run 0.2-0.9 s longer, load 11.1-11.4 s
    d0 = batched_like(d0, sign)
    _, (length, bad) = jax.lax.scan(one, d0, None, length=nstep)
    return length, jnp.any(bad)


def _run(m, outs, signs, nstep, opt, h):
    import jax
    from simjax.engine.reference import run_once
    decay = float(np.exp(-h / max(0.01, opt.timeconst)))
    fn = jax.jit(jax.vmap(lambda m, i, s: _simulate(m, i, s, nstep, opt, decay),
                          in_axes=(None, 0, 0)))
    with jax.enable_x64(True):
        length, bad = run_once(("lengthrange", nstep, opt, decay), fn, m,
                               leaf(np.asarray(outs, np.int32)),
                               leaf(np.asarray(signs, np.float64)))
    return np.asarray(length, np.float64), np.asarray(bad)


def set_length_range(model, opt: LROpt | None = None):
    """Return ``model`` with ``actuator_lengthrange`` filled as MuJoCo's compiler does.

    Actuators out of ``opt.mode``'s scope, and those with a valid given range when
    ``useexisting``, keep theirs; with ``uselimit`` a limited joint or tendon
    transmission copies the joint's or tendon's range; the others are simulated (module
    doc). Raises :class:`simjax.MJCFError` as MuJoCo does when the simulation diverges
    ("Unstable lengthrange simulation"), the range is empty ("Invalid lengthrange") or
    it did not settle ("Lengthrange computation did not converge").
    """
    opt = opt or LROpt()
    m = model
    if not m.nactuator or opt.mode == MODE_NONE:
        return model
    lr = np.array(m.actuator_lengthrange, np.float64).reshape(-1, 2)
    outadr = np.asarray(m.actuator_outadr).reshape(-1)
    sim = []
    for i in range(m.nactuator):
        out = int(outadr[i])
        if not _selected(m, i, opt) or (opt.useexisting and lr[out, 0] < lr[out, 1]):
            continue
        tid, trn = int(m.actuator_trnid[i, 0]), int(m.actuator_trntype[i])
        if opt.uselimit:
            if trn in (TrnType.JOINT, TrnType.JOINTINPARENT) and m.jnt_limited[tid]:
                lr[out] = np.asarray(m.jnt_range)[tid]
                continue
            if trn == TrnType.TENDON and m.tendon_limited[tid]:
                lr[out] = np.asarray(m.tendon_range)[tid]
                continue
        sim.append(i)
    if sim:
        lr = _simulated(m, sim, outadr, lr, opt)
    return model.replace(actuator_lengthrange=leaf(lr))


def _simulated(m, sim, outadr, lr, opt):
    o = m.opt
    h = float(opt.timestep) if opt.timestep > 0 else float(o.timestep)
    # the compiler simulates before user <statistic> values replace the computed ones:
    # the solver's tolerance scale uses the computed mean inertia, trace(M(qpos0)) / nv
    meaninertia = float(np.mean(np.asarray(m.dof_M0))) if m.nv else 1.0
    msim = m.replace(opt=o.replace(disableflags=int(_DISABLE), timestep=h),
                     stat=m.stat.replace(meaninertia=meaninertia))
    times = _times(h, opt.inttotal)
    window = times > opt.inttotal - opt.interval
    outs = np.repeat(outadr[sim], 2)
    signs = np.tile([-1.0, 1.0], len(sim))
    length, bad = _run(msim, outs, signs, len(times), opt, h)
    for k, i in enumerate(sim):
        if bad[2 * k] or bad[2 * k + 1]:
            raise MJCFError(f"Unstable lengthrange simulation in actuator {i}")
        lo, hi = length[2 * k][window], length[2 * k + 1][window]
        if not window.any():
            lo = hi = np.zeros(1)
        out = int(outadr[i])
        lr[out] = [lo.min(), hi.max()]
        dif = lr[out, 1] - lr[out, 0]
        if dif <= 0:
            raise MJCFError(f"Invalid lengthrange ({lr[out, 0]:g}, {lr[out, 1]:g}) in "
                            f"actuator {i}")
        for ls in (lo, hi):
            if ls.max() - ls.min() > opt.tolrange * dif:
                raise MJCFError(
                    f"Lengthrange computation did not converge in actuator {i}:\n"
                    f"  eval ({ls.min():g}, {ls.max():g})\n"
                    f"  range ({lr[out, 0]:g}, {lr[out, 1]:g})")
    return lr
