"""DC-motor actuators (MuJoCo 4.0's dcmotor dynamics, gain and bias): the states
[slew, integral, temperature, LuGre bristle, current] present as the parameters ask
(mj_dcmotorSlots), the on-board torque-space controller and its terminal voltage, the
electrical force, cogging and LuGre friction, the exact state updates of
mj_nextActivation and the velocity derivative of mjd_actuator_vel.

Parameters (mjModel): gainprm [R, K, alpha, T0, kp, ki, kd, Vmax], dynprm [te, dimax,
R_T, C, Ta, sigma0, sigma1, slewmax, Imax], biasprm [cogging A, poles, phase, F_C, F_S,
v_S]. Tables come from :mod:`actuation`.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from simjax.engine import actuation as _act
from simjax.engine import math

_SLEW, _INTEGRAL, _TEMP, _BRISTLE, _CURRENT = range(5)


def _dc_slots(tab, dynprm, gainprm):
    """(nact, 5) presence and (nact, 5) act addresses of the DC-motor states in their
    order [slew, integral, temperature, bristle, current] (mj_dcmotorSlots); parameters
    may be traced."""
    flags = jnp.stack([dynprm[:, 7] > 0, gainprm[:, 5] > 0, dynprm[:, 2] > 0,
                       dynprm[:, 5] > 0, dynprm[:, 0] > 0], -1)
    flags = flags & jnp.asarray(tab.dyntype == _act._DYN_DCMOTOR)[:, None]
    idx = jnp.cumsum(flags.astype(jnp.int32), -1) - 1
    adr = jnp.asarray(np.maximum(tab.actadr, 0))[:, None] + idx
    return flags, adr


def _dc_state(act, flags, adr, j):
    """(nact,) value of DC-motor state j (0 where absent)."""
    return jnp.where(flags[:, j], act[jnp.clip(adr[:, j], 0, act.shape[0] - 1)], 0.0)


def _lugre_stribeck(v, f_c, f_s, v_s):
    """g(v) = F_C + (F_S - F_C) exp(-(v / v_S)^2) (mj_lugreStribeck)."""
    r = v / jnp.maximum(math.MINVAL, v_s)
    return f_c + (f_s - f_c) * jnp.exp(-r * r)


def _dc_voltage(tab, ctrl, length, velocity, x_i, gainprm):
    """Terminal voltage (nact,): the on-board torque-space PID mapped through
    V = R/K tau + K w and clamped at Vmax, plus the raw voltage input (dcmotorVoltage)."""
    pos, vel, ff, volt = _act._servo_inputs(tab, ctrl)
    r, k = gainprm[:, 0], gainprm[:, 1]
    torque = (gainprm[:, 4] * (pos - length) + gainprm[:, 6] * (vel - velocity) +
              gainprm[:, 5] * x_i + ff)
    v = r / jnp.where(k == 0, 1.0, k) * torque + k * velocity
    vmax = gainprm[:, 7]
    v = jnp.where(vmax > 0, math.clip_as_jnp(v, -vmax, vmax), v)
    controlled = (tab.ctrlspec & (_act._IN_POS | _act._IN_VEL | _act._IN_FF)) != 0
    return jnp.where(controlled, v, 0.0) + volt


def _dc_resistance(dynprm, gainprm, flags, temp):
    """Winding resistance at the temperature state (R (1 + alpha (T + Ta - T0)))."""
    r = gainprm[:, 0]
    return jnp.where(flags[:, _TEMP],
                     r * (1 + gainprm[:, 2] * (temp + dynprm[:, 4] - gainprm[:, 3])), r)


def dynamics(m, d, tab, ctrl, length, velocity, dynprm, gainprm, biasprm,
                      act_dot):
    """DC-motor state rates (mjDYN_DCMOTOR): slew-limited first input, integral of the
    position error with anti-windup, winding temperature (R i^2 - T / R_T) / C, LuGre
    bristle deflection v - sigma0 |v| / g(v) z, and armature current
    (V / R - K / R w - i) / te limited to +-(di/dt)max. Returns (ctrl with the
    slew-limited first inputs, act_dot)."""
    dc = tab.dyntype == _act._DYN_DCMOTOR
    if not dc.any() or not m.na:
        return ctrl, act_dot
    dtype = d.qpos.dtype
    h = jnp.asarray(m.opt.timestep, dtype)
    flags, adr = _dc_slots(tab, dynprm, gainprm)
    act = d.act
    st = [_dc_state(act, flags, adr, j) for j in range(5)]
    rates = [None] * 5
    # slew limiting of the first input
    has_in = jnp.asarray(dc & (tab.ctrlnum > 0))
    cidx = np.clip(tab.ctrladr, 0, max(m.nu - 1, 0))
    u = ctrl[cidx] if m.nu else jnp.zeros(m.nactuator, dtype)
    step = dynprm[:, 7] * h
    u_eff = math.clip_as_jnp(u, st[_SLEW] - step, st[_SLEW] + step)
    rates[_SLEW] = (u_eff - st[_SLEW]) / h
    use = flags[:, _SLEW] & has_in
    if m.nu:
        sel = np.nonzero(dc & (tab.ctrlnum > 0))[0]
        ctrl = ctrl.at[cidx[sel]].set(jnp.where(use, u_eff, u)[sel])
        u = jnp.where(use, u_eff, u)
    # integral of the position error, frozen beyond +-Imax
    x_i = jnp.where(flags[:, _INTEGRAL], st[_INTEGRAL], 0.0)
    err = u - length
    imax = dynprm[:, 8]
    err = jnp.where(imax > 0, jnp.where(x_i >= imax, math.minimum(err, 0.0),
                                        jnp.where(x_i <= -imax, math.maximum(err, 0.0), err)),
                    err)
    rates[_INTEGRAL] = err
    volt = _dc_voltage(tab, ctrl, length, velocity, x_i, gainprm)
    # temperature (R adjusted, and kept adjusted for the current equation)
    k = gainprm[:, 1]
    r = _dc_resistance(dynprm, gainprm, flags, st[_TEMP])
    te = dynprm[:, 0]
    current = jnp.where(te > 0, st[_CURRENT], (volt - k * velocity) / r)
    rt = jnp.where(flags[:, _TEMP], dynprm[:, 2], 1.0)
    # (no thermal state: capacity 1, not 0; the rate is unused, but x / 0 made the
    # reverse-mode derivatives NaN: the zero cotangent of a masked value divided by 0)
    cap = jnp.where(flags[:, _TEMP], dynprm[:, 3], 1.0)
    rates[_TEMP] = (r * current * current - st[_TEMP] / rt) / cap
    # LuGre bristle
    g = _lugre_stribeck(velocity, biasprm[:, 3], biasprm[:, 4], biasprm[:, 5])
    a = -dynprm[:, 5] * jnp.abs(velocity) / math.maximum(math.MINVAL, g)
    rates[_BRISTLE] = a * st[_BRISTLE] + velocity
    # armature current
    i_dot = (volt / r - k / r * velocity - st[_CURRENT]) / jnp.where(te > 0, te, 1.0)
    dimax = dynprm[:, 1]
    rates[_CURRENT] = jnp.where(dimax > 0, math.clip_as_jnp(i_dot, -dimax, dimax), i_dot)
    own, kk = tab.act_owner, jnp.asarray(tab.act_k)
    is_dc = jnp.asarray(dc[own])
    out = jnp.where(is_dc, 0.0, act_dot)
    for j in range(5):
        hit = is_dc & flags[own, j] & (adr[own, j] - jnp.asarray(tab.actadr[own]) == kk)
        out = jnp.where(hit, rates[j][own], out)
    return ctrl, out


def force(m, d, tab, ctrl, act_dot, length, velocity, dynprm, gainprm):
    """Electrical DC-motor force (nact,) before force clamping: K i with a current state
    (its next value under actearly), else K/R (V - K w) (mjGAIN_DCMOTOR and
    mjBIAS_DCMOTOR)."""
    dtype = d.qpos.dtype
    flags, adr = _dc_slots(tab, dynprm, gainprm)
    temp = _dc_state(d.act, flags, adr, _TEMP) if m.na else jnp.zeros(m.nactuator, dtype)
    k = gainprm[:, 1]
    r = _dc_resistance(dynprm, gainprm, flags, temp)
    te = dynprm[:, 0]
    x_i = _dc_state(d.act, flags, adr, _INTEGRAL) if m.na else jnp.zeros(m.nactuator, dtype)
    volt = _dc_voltage(tab, ctrl, length, velocity, x_i, gainprm)
    raw = ctrl[np.clip(tab.ctrladr, 0, max(m.nu - 1, 0))] if m.nu else jnp.zeros_like(k)
    inp = jnp.where(jnp.asarray(tab.ctrlnum > 0),
                    jnp.where(jnp.asarray(tab.ctrlspec == _act._IN_VOLTAGE), raw, volt), 0.0)
    gain_free = k / math.maximum(math.MINVAL, r)
    stateless = gain_free * inp - gain_free * k * velocity
    if not m.na:
        return stateless
    cur = _dc_state(d.act, flags, adr, _CURRENT)
    nxt = _act.next_activation(m, d.act, act_dot, d.actuator_velocity)
    cur_next = _dc_state(nxt, flags, adr, _CURRENT)
    cur = jnp.where(jnp.asarray(tab.actearly), cur_next, cur)
    return jnp.where(te > 0, k * cur, stateless)


def mechanical(m, d, tab, act_dot, length, velocity, dynprm, gainprm, biasprm):
    """DC-motor forces added after clamping (nact,): cogging A sin(Np l + phi) and LuGre
    friction -(sigma0 z + sigma1 z_dot)."""
    dc = jnp.asarray(tab.biastype == _act._BIAS_DCMOTOR) & ~jnp.asarray(_act._disabled_mask(m))
    out = biasprm[:, 0] * jnp.sin(biasprm[:, 1] * length + biasprm[:, 2])
    if m.na:
        flags, adr = _dc_slots(tab, dynprm, gainprm)
        z = _dc_state(d.act, flags, adr, _BRISTLE)
        z_dot = _dc_state(act_dot, flags, adr, _BRISTLE)
        out = out - jnp.where(flags[:, _BRISTLE], dynprm[:, 5] * z + dynprm[:, 6] * z_dot, 0.0)
    return jnp.where(dc, out, 0.0)


def next_activation(m, tab, act, act_dot, new, velocity, dtype):
    """mj_nextActivation for DC-motor states: exact current filter, exact zero-order-hold
    bristle update, integral clamped at +-Imax, Euler otherwise (``new``)."""
    nact = m.nactuator
    dynprm = jnp.asarray(m.actuator_dynprm, dtype).reshape(nact, -1)
    gainprm = jnp.asarray(m.actuator_gainprm, dtype).reshape(nact, -1)
    biasprm = jnp.asarray(m.actuator_biasprm, dtype).reshape(nact, -1)
    flags, adr = _dc_slots(tab, dynprm, gainprm)
    own, kk = tab.act_owner, jnp.asarray(tab.act_k)
    is_dc = jnp.asarray(tab.dyntype[own] == _act._DYN_DCMOTOR)
    h = jnp.asarray(m.opt.timestep, dtype)

    def role(j):
        return is_dc & flags[own, j] & (adr[own, j] - jnp.asarray(tab.actadr[own]) == kk)
    te = jnp.maximum(math.MINVAL, dynprm[own, 0])
    new = jnp.where(role(_CURRENT), act + act_dot * te * (1 - jnp.exp(-h / te)), new)
    imax = dynprm[own, 8]
    new = jnp.where(role(_INTEGRAL) & (imax > 0), math.clip_as_jnp(new, -imax, imax), new)
    if True:
        v = velocity[tab.outadr[own]]
        g = _lugre_stribeck(v, biasprm[own, 3], biasprm[own, 4], biasprm[own, 5])
        a = -dynprm[own, 5] * jnp.abs(v) / math.maximum(math.MINVAL, g)
        e = jnp.exp(a * h)
        integ = jnp.where(jnp.abs(a) > math.MINVAL, (e - 1) / jnp.where(a == 0, 1.0, a), h)
        new = jnp.where(role(_BRISTLE), e * act + integ * v, new)
    return new




def vel_derivative(m, d):
    """(nact,) d force / d velocity of DC motors as MuJoCo 4.0's mjd_actuator_vel takes
    it: back-EMF -K^2/R (R at the winding temperature) without a current state; the
    controller's dV/dw = K - kd R0 / K (R0 the nominal resistance, as the controller
    uses it) unless its voltage sits at Vmax, through the
    exactly integrated current (K (dV/dw - K)(1 - exp(-h/te)) / R, dropped while di/dt is
    at its limit) or directly (K dV/dw / R); LuGre's -sigma1. Saturation rules were
    established against the 4.0 library."""
    tab = _act.tables(m)
    dtype = d.qpos.dtype
    nact = m.nactuator
    dynprm = jnp.asarray(m.actuator_dynprm, dtype).reshape(nact, -1)
    gainprm = jnp.asarray(m.actuator_gainprm, dtype).reshape(nact, -1)
    biasprm = jnp.asarray(m.actuator_biasprm, dtype).reshape(nact, -1)
    length = d.actuator_length[tab.outadr]
    velocity = d.actuator_velocity[tab.outadr]
    ctrl, _ = _act._controls(m, d)
    if m.na:
        ctrl, _ = dynamics(m, d, tab, ctrl, length, velocity, dynprm, gainprm,
                                    biasprm, jnp.zeros(m.na, dtype))
        flags, adr = _dc_slots(tab, dynprm, gainprm)
        temp = _dc_state(d.act, flags, adr, _TEMP)
        x_i = _dc_state(d.act, flags, adr, _INTEGRAL)
        cur_dot = _dc_state(d.act_dot, flags, adr, _CURRENT)
    else:
        flags = jnp.zeros((nact, 5), bool)
        temp = x_i = cur_dot = jnp.zeros(nact, dtype)
    r = math.maximum(math.MINVAL, _dc_resistance(dynprm, gainprm, flags, temp))
    k = gainprm[:, 1]
    te = dynprm[:, 0]
    h = jnp.asarray(m.opt.timestep, dtype)
    ctrl_in = jnp.asarray((tab.ctrlspec & (_act._IN_POS | _act._IN_VEL | _act._IN_FF)) != 0)
    pos, vel, ff, _ = _act._servo_inputs(tab, ctrl)
    torque = (gainprm[:, 4] * (pos - length) + gainprm[:, 6] * (vel - velocity) +
              gainprm[:, 5] * x_i + ff)
    volt = gainprm[:, 0] / jnp.where(k == 0, 1.0, k) * torque + k * velocity
    vmax = gainprm[:, 7]
    vsat = (vmax > 0) & (jnp.abs(volt) >= vmax)
    dvdw = jnp.where(ctrl_in & ~vsat,
                     -gainprm[:, 6] * gainprm[:, 0] / jnp.where(k == 0, 1.0, k) + k, 0.0)
    s = 1 - jnp.exp(-h / jnp.where(te > 0, te, 1.0))
    dimax = dynprm[:, 1]
    isat = (dimax > 0) & (jnp.abs(cur_dot) >= dimax)
    out = jnp.where(te > 0, jnp.where(isat, 0.0, k * (dvdw - k) * s / r), k * dvdw / r)
    out = jnp.where(dynprm[:, 6] > 0, out - dynprm[:, 6], out)
    out = out + jnp.where(te <= 0, -k * k / r, 0.0)
    return jnp.where(jnp.asarray(tab.gaintype == _act._GAIN_DCMOTOR), out, 0.0)
