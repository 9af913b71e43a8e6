"""Delay and history buffers of actuators and sensors (MuJoCo 4.0 ``Data.history``).

An actuator or sensor with ``nsample > 0`` owns a circular buffer in ``Data.history`` at
``actuator_historyadr`` / ``sensor_historyadr`` with MuJoCo's layout

    [user, cursor, times (nsample), values (nsample * dim)]

``cursor`` is the physical slot of the newest sample; logical sample ``j`` (0 = oldest)
sits in physical slot ``(cursor + 1 + j) % nsample``. ``user`` holds the time of the last
sensor tick for sensors with an ``interval`` (0 for actuators). Semantics follow
MuJoCo's mju_historyInsert / mju_historyRead (engine_util_misc.c), mj_readCtrl /
mj_readSensor (engine_support.c), the buffer initialisation of mj_resetData
(engine_io.c), the per-step insertion of mj_advance (engine_forward.c) and the
compute-or-read rule of the sensor stages (engine_sensor.c):

- actuators with ``actuator_delay > 0`` see ``ctrl`` read at ``time - delay`` (zero-order
  hold, linear or cubic Hermite interpolation: ``actuator_history[:, 1]``); every step
  inserts the current ``ctrl`` at the current time;
- sensors with ``sensor_delay > 0`` report the buffer read at ``time - delay``; every
  step computes them afresh and inserts the value;
- sensors with an interval ``[period, phase]`` compute a new value only when
  ``user + period <= time`` (then ``user += period`` at the step) and otherwise report
  the buffer read at ``time`` (minus the delay, if any);
- sensors with a buffer but neither delay nor interval report fresh values; the step
  copies them into the buffer.

With RK4 the insertions use the forwarded state at the start of the step, not the last
Runge-Kutta stage (MuJoCo 4.0's behaviour, measured on delayed velocimeters and
accelerometers). Delays and intervals are parameters (vmappable, may be traced): the
compute-or-read choice is a ``jnp.where``. Actuator delays without a buffer raise
UnsupportedFeatureError (MuJoCo's compiler refuses them); plugin sensors with buffers
raise too.

Everything is vectorised over the buffers of one static (nsample, dim, interp) group,
differentiable in the stored values and vmappable.
"""
from __future__ import annotations

import numpy as np
import jax.numpy as jnp

from simjax.engine import math
from simjax.errors import UnsupportedFeatureError

MINVAL = math.MINVAL


# --------------------------------------------------------------------------- groups
def _groups(adr, nsample, dim, interp, members):
    """Static groups: (members (k,), adr (k,), n, dim, interp) with equal n/dim/interp."""
    out = []
    keys = sorted({(int(nsample[i]), int(dim[i]), int(interp[i])) for i in members})
    for n, dm, ip in keys:
        sel = np.asarray([i for i in members if (nsample[i], dim[i], interp[i]) == (n, dm, ip)],
                         np.int64)
        out.append((sel, np.asarray(adr)[sel], n, dm, ip))
    return out


def actuator_groups(m):
    """Groups of actuators with history buffers."""
    if not m.nactuator or not m.nhistory:
        return []
    hist = np.asarray(m.actuator_history).reshape(m.nactuator, 2)
    members = np.nonzero(hist[:, 0] > 0)[0]
    ctrlnum = np.asarray(m.actuator_ctrlnum).reshape(-1)
    if np.any(ctrlnum[members] < 1):
        raise UnsupportedFeatureError("history buffer on an actuator without controls")
    # a buffer sample holds all of the actuator's controls
    return _groups(np.asarray(m.actuator_historyadr).reshape(-1), hist[:, 0], ctrlnum,
                   hist[:, 1], members.tolist())


def sensor_groups(m, members):
    """Groups of the sensors ``members`` (which must have history buffers)."""
    hist = np.asarray(m.sensor_history).reshape(m.nsensor, 2)
    return _groups(np.asarray(m.sensor_historyadr).reshape(-1), hist[:, 0],
                   np.asarray(m.sensor_dim).reshape(-1), hist[:, 1], list(members))


# --------------------------------------------------------------------------- buffers
def _index(adr, n, dim):
    """Static gather indices: user (k,), cursor (k,), times (k, n), values (k, n, dim)."""
    adr = np.asarray(adr)[:, None]
    times = adr + 2 + np.arange(n)[None, :]
    values = (adr + 2 + n + np.arange(n * dim)[None, :]).reshape(-1, n, dim)
    return adr[:, 0], adr[:, 0] + 1, times, values


def unpack(hist, adr, n, dim):
    """(user (k,), cursor (k,) int, times (k, n), values (k, n, dim)) of buffers at
    ``adr`` (physical order)."""
    iu, ic, it, iv = _index(adr, n, dim)
    return hist[iu], hist[ic].astype(jnp.int32), hist[it], hist[iv]


def pack(hist, adr, n, dim, user, cursor, times, values):
    iu, ic, it, iv = _index(adr, n, dim)
    hist = hist.at[iu].set(user.astype(hist.dtype))
    hist = hist.at[ic].set(cursor.astype(hist.dtype))
    hist = hist.at[it.ravel()].set(times.reshape(-1))
    return hist.at[iv.ravel()].set(values.reshape(-1))


def _phys(cursor, n):
    """(k, n) physical slot of each logical index."""
    return (cursor[:, None] + 1 + jnp.arange(n)[None, :]) % n


def _take(x, idx):
    return jnp.take_along_axis(x, idx.reshape(idx.shape + (1,) * (x.ndim - 2)), axis=1)


def read(cursor, times, values, t, interp):
    """Value (k, dim) of each buffer at times ``t`` (k,) (mju_historyRead).

    Before the oldest / after the newest sample: that sample (constant extrapolation);
    inside: exact samples, else zero-order hold (interp 0), linear (1) or cubic Hermite
    with Catmull-Rom slopes that vanish at the ends (2)."""
    k, n = times.shape
    phys = _phys(cursor, n)
    lt = _take(times, phys)                              # (k, n) logical times
    lv = _take(values, phys)                             # (k, n, dim)
    tt = t[:, None]
    i = jnp.clip(jnp.sum(lt < tt, axis=1), 1, n - 1)     # bracket (i-1, i)

    def at(j):
        j = jnp.clip(j, 0, n - 1)
        return (jnp.take_along_axis(lt, j[:, None], 1)[:, 0],
                jnp.take_along_axis(lv, j[:, None, None], 1)[:, 0])

    t_lo, v_lo = at(i - 1)
    t_hi, v_hi = at(i)
    if interp == 0:
        val = v_lo
    else:
        span = t_hi - t_lo
        alpha = ((t - t_lo) / jnp.where(span > 0, span, 1.0))[:, None]
        if interp == 1:
            val = v_lo + alpha * (v_hi - v_lo)
        else:
            t_pp, v_pp = at(i - 2)
            t_nn, v_nn = at(i + 1)
            s_lo = jnp.where((i > 1)[:, None], (v_hi - v_pp) /
                             jnp.where(i > 1, t_hi - t_pp, 1.0)[:, None], 0.0)
            s_hi = jnp.where((i < n - 1)[:, None], (v_nn - v_lo) /
                             jnp.where(i < n - 1, t_nn - t_lo, 1.0)[:, None], 0.0)
            a2, a3 = alpha * alpha, alpha * alpha * alpha
            val = ((2 * a3 - 3 * a2 + 1) * v_lo + (a3 - 2 * a2 + alpha) * span[:, None] * s_lo
                   + (-2 * a3 + 3 * a2) * v_hi + (a3 - a2) * span[:, None] * s_hi)
    exact = (jnp.abs(t - t_hi) < MINVAL)[:, None]
    val = jnp.where(exact, v_hi, val)
    val = jnp.where((t >= lt[:, -1] - MINVAL)[:, None], lv[:, -1], val)
    return jnp.where((t <= lt[:, 0] + MINVAL)[:, None], lv[:, 0], val)


def insert(cursor, times, values, t, new):
    """Buffers with the sample ``new`` (k, dim) at times ``t`` (k,) inserted
    (mju_historyInsert): an equal time overwrites that sample; a time older than the
    oldest replaces the oldest; a newer time advances the cursor onto the oldest slot;
    otherwise older samples shift down to make room. Returns (cursor, times, values)."""
    k, n = times.shape
    phys = _phys(cursor, n)
    lt = _take(times, phys)
    lv = _take(values, phys)
    tt = t[:, None]
    i = jnp.sum(lt < tt, axis=1)                                     # (k,) 0..n
    ii = jnp.clip(i, 0, n - 1)
    match = (i < n) & (jnp.abs(t - jnp.take_along_axis(lt, ii[:, None], 1)[:, 0]) < MINVAL)
    newer = (i == n) & ~match
    # logical target slot and the shift of [1, i-1] down by one (0 < i < n, no match)
    shift = (i > 0) & (i < n) & ~match
    target = jnp.where(match, i, jnp.where(shift, i - 1, 0))
    j = jnp.arange(n)[None, :]
    src = jnp.where(shift[:, None] & (j < (i - 1)[:, None]), j + 1, j)
    lt2 = jnp.take_along_axis(lt, src, 1)
    lv2 = _take(lv, src)
    put = j == target[:, None]
    lt2 = jnp.where(put, tt, lt2)
    lv2 = jnp.where(put[:, :, None], new[:, None, :], lv2)
    # back to physical slots with the unchanged cursor
    inv = jnp.argsort(phys, axis=1)
    times_a, values_a = jnp.take_along_axis(lt2, inv, 1), _take(lv2, inv)
    # newer sample: the cursor moves to the oldest slot, which receives it
    cur_b = (cursor + 1) % n
    slot = jnp.arange(n)[None, :] == cur_b[:, None]
    times_b = jnp.where(slot, tt, times)
    values_b = jnp.where(slot[:, :, None], new[:, None, :], values)
    cursor = jnp.where(newer, cur_b, cursor)
    times = jnp.where(newer[:, None], times_b, times_a)
    values = jnp.where(newer[:, None, None], values_b, values_a)
    return cursor, times, values


# --------------------------------------------------------------------------- reset
def init(m, dtype):
    """The reset ``Data.history`` (nhistory,) (mj_resetData): actuator buffers hold zeros
    at times -n*dt..-dt; sensor buffers likewise, or, with an interval, at the period
    grid before the phase rounded up to the timestep, with the last tick time in the
    user slot."""
    nh = int(m.nhistory or 0)
    if not nh:
        return jnp.zeros(0, dtype)
    dt = jnp.asarray(m.opt.timestep, dtype)
    hist = jnp.zeros(nh, dtype)
    for sel, adr, n, dim, _ in actuator_groups(m):
        k = len(sel)
        times = jnp.broadcast_to(-(n - jnp.arange(n, dtype=dtype)) * dt, (k, n))
        hist = pack(hist, adr, n, dim, jnp.zeros(k, dtype), jnp.full(k, n - 1),
                    times, jnp.zeros((k, n, dim), dtype))
    if m.nsensor:
        hist_s = np.asarray(m.sensor_history).reshape(m.nsensor, 2)
        members = np.nonzero(hist_s[:, 0] > 0)[0]
        interval = jnp.asarray(m.sensor_interval, dtype).reshape(m.nsensor, 2)
        for sel, adr, n, dim, _ in sensor_groups(m, members):
            k = len(sel)
            period, phase = interval[sel, 0], interval[sel, 1]
            t0 = jnp.where(phase == 0, -period, phase)
            user = jnp.where(period > 0, t0, -dt)
            j = jnp.arange(n, dtype=dtype)[None, :]
            grid = jnp.ceil((t0[:, None] - (n - 1 - j) * period[:, None]) / dt) * dt
            plain = jnp.broadcast_to(-(n - j) * dt, (k, n))
            times = jnp.where((period > 0)[:, None], grid, plain)
            hist = pack(hist, adr, n, dim, user, jnp.full(k, n - 1), times,
                        jnp.zeros((k, n, dim), dtype))
    return hist


# --------------------------------------------------------------------------- actuators
def delayed_ctrl(m, d, ctrl):
    """``ctrl`` (nu,) with the inputs of actuators with a non-zero ``actuator_delay``
    read from their buffers at ``time - delay`` (mj_readCtrl, the model's
    interpolation). Delays are parameters (may be traced): every actuator with a buffer
    is read and the delay selects."""
    groups = actuator_groups(m)
    if not groups:
        return ctrl
    dtype = d.history.dtype
    delay = jnp.asarray(m.actuator_delay, dtype).reshape(-1)
    ctrladr = np.asarray(m.actuator_ctrladr).reshape(-1)
    for sel, adr, n, dim, ip in groups:
        _, cur, times, values = unpack(d.history, adr, n, dim)
        t = d.time.astype(dtype) - delay[sel]
        val = read(cur, times, values, t, ip).astype(ctrl.dtype)        # (k, dim)
        idx = ctrladr[sel][:, None] + np.arange(dim)[None, :]
        ctrl = ctrl.at[idx].set(jnp.where((delay[sel] != 0)[:, None], val, ctrl[idx]))
    return ctrl


# --------------------------------------------------------------------------- sensors
def sensor_due(m, d, ids):
    """(k,) bool: whether interval sensors ``ids`` compute a new value at ``d.time``
    (``user + period <= time``); True for sensors without an interval."""
    dtype = d.history.dtype
    period = jnp.asarray(m.sensor_interval, dtype).reshape(-1, 2)[ids, 0]
    user = d.history[np.asarray(m.sensor_historyadr).reshape(-1)[ids]]
    return (period <= 0) | (user + period <= d.time.astype(dtype))


def sensor_read(m, d, ids, fresh):
    """Flat sensor values of sensors ``ids`` (static, in order) with the delayed and
    not-due interval sensors replaced by their buffer reads (compute_or_read_sensor).
    ``fresh``: the flat computed values of the same sensors."""
    if not m.nhistory or not len(ids):
        return fresh
    ids = np.asarray(ids)
    has = np.asarray(m.sensor_history).reshape(-1, 2)[:, 0] > 0
    use = ids[has[ids]]
    if not len(use):
        return fresh
    dtype = fresh.dtype
    dims = np.asarray(m.sensor_dim).reshape(-1)
    start = np.concatenate([[0], np.cumsum(dims[ids])[:-1]])
    pos_of = {int(s): int(p) for s, p in zip(ids, start)}
    delay = jnp.asarray(m.sensor_delay, dtype).reshape(-1)
    for sel, adr, n, dim, ip in sensor_groups(m, use.tolist()):
        _, cur, times, values = unpack(d.history, adr, n, dim)
        t = d.time.astype(dtype) - delay[sel]
        val = read(cur, times, values, t, ip).astype(dtype)              # (k, dim)
        # delayed sensors always read; interval sensors read unless due
        readit = (delay[sel] > 0) | ~sensor_due(m, d, sel)
        flat = np.asarray([pos_of[int(s)] for s in sel])[:, None] + np.arange(dim)
        fresh = fresh.at[flat.ravel()].set(
            jnp.where(readit[:, None], val, fresh[flat]).reshape(-1))
    return fresh


def advance(m, d, compute):
    """``Data.history`` after one step's insertions (the history part of mj_advance),
    at the current (not yet advanced) time: every actuator buffer gets ``ctrl``; every
    sensor buffer gets its fresh value (delayed sensors, computed by
    ``compute(ids) -> flat values``) or its sensordata (others), interval sensors only
    when due, their tick time then advancing by one period."""
    hist = d.history
    dtype = hist.dtype
    time = d.time.astype(dtype)
    for sel, adr, n, dim, _ in actuator_groups(m):
        user, cur, times, values = unpack(hist, adr, n, dim)
        idx = np.asarray(m.actuator_ctrladr).reshape(-1)[sel][:, None] + np.arange(dim)
        new = d.ctrl[idx].astype(dtype)                                  # (k, dim)
        cur, times, values = insert(cur, times, values,
                                    jnp.broadcast_to(time, (len(sel),)), new)
        hist = pack(hist, adr, n, dim, user, cur, times, values)
    if not m.nsensor:
        return hist
    hist_s = np.asarray(m.sensor_history).reshape(m.nsensor, 2)
    members = np.nonzero(hist_s[:, 0] > 0)[0]
    if not len(members):
        return hist
    # delayed sensors insert fresh values, the others their sensordata; delays are
    # parameters, so every buffered sensor is recomputed and the delay selects
    dims = np.asarray(m.sensor_dim).reshape(-1)
    adr_s = np.asarray(m.sensor_adr).reshape(-1)
    start = np.concatenate([[0], np.cumsum(dims[members])[:-1]])
    pos_fresh = {int(s): int(p) for s, p in zip(members, start)}
    fresh = compute(members).astype(dtype)
    delay = jnp.asarray(m.sensor_delay, dtype).reshape(-1)
    period_all = jnp.asarray(m.sensor_interval, dtype).reshape(-1, 2)[:, 0]
    for sel, adr, n, dim, _ in sensor_groups(m, members.tolist()):
        k = len(sel)
        due = sensor_due(m, d, sel)
        user, cur, times, values = unpack(hist, adr, n, dim)
        off = np.arange(dim)
        computed = fresh[np.asarray([pos_fresh[int(s)] for s in sel])[:, None] + off]
        stored = d.sensordata.astype(dtype)[adr_s[sel][:, None] + off]
        new = jnp.where((delay[sel] > 0)[:, None], computed, stored)
        cur2, times2, values2 = insert(cur, times, values, jnp.broadcast_to(time, (k,)), new)
        period = period_all[sel]
        user = jnp.where(due & (period > 0), user + period, user)
        cur = jnp.where(due, cur2, cur)
        times = jnp.where(due[:, None], times2, times)
        values = jnp.where(due[:, None, None], values2, values)
        hist = pack(hist, adr, n, dim, user, cur, times, values)
    return hist
