"""Muscle curves of MuJoCo's actuation model (mju_muscleGain, mju_muscleBias,
mju_muscleDynamics), vectorised over actuators."""
from __future__ import annotations

import jax.numpy as jnp

from simjax.engine import math


def muscle_gain_length(length, lmin, lmax):
    """Normalised active force-length curve (mju_muscleGainLength)."""
    a = 0.5 * (lmin + 1)
    b = 0.5 * (1 + lmax)
    x1 = (length - lmin) / jnp.maximum(math.MINVAL, a - lmin)
    x2 = (1 - length) / jnp.maximum(math.MINVAL, 1 - a)
    x3 = (length - 1) / jnp.maximum(math.MINVAL, b - 1)
    x4 = (lmax - length) / jnp.maximum(math.MINVAL, lmax - b)
    val = jnp.where(length <= a, 0.5 * x1 * x1,
                    jnp.where(length <= 1, 1 - 0.5 * x2 * x2,
                              jnp.where(length <= b, 1 - 0.5 * x3 * x3, 0.5 * x4 * x4)))
    return jnp.where((lmin <= length) & (length <= lmax), val, 0.0)


def _muscle_scale(lengthrange, acc0, prm):
    """Peak force (force, or scale / acc0 when force < 0) and optimal length L0."""
    force = jnp.where(prm[:, 2] < 0, prm[:, 3] / jnp.maximum(math.MINVAL, acc0), prm[:, 2])
    l0 = (lengthrange[:, 1] - lengthrange[:, 0]) / jnp.maximum(math.MINVAL,
                                                               prm[:, 1] - prm[:, 0])
    return force, l0


def muscle_gain(length, velocity, lengthrange, acc0, prm):
    """Muscle active force per unit activation (mju_muscleGain), vectorised: (n,).

    prm: (n, >=9) gainprm rows (range[2], force, scale, lmin, lmax, vmax, fpmax, fvmax).
    """
    force, l0 = _muscle_scale(lengthrange, acc0, prm)
    L = prm[:, 0] + (length - lengthrange[:, 0]) / jnp.maximum(math.MINVAL, l0)
    V = velocity / jnp.maximum(math.MINVAL, l0 * prm[:, 6])
    fl = muscle_gain_length(L, prm[:, 4], prm[:, 5])
    fvmax = prm[:, 8]
    y = fvmax - 1
    fv = jnp.where(V <= -1, 0.0,
                   jnp.where(V <= 0, (V + 1) * (V + 1),
                             jnp.where(V <= y, fvmax - (y - V) * (y - V) /
                                       jnp.maximum(math.MINVAL, y), fvmax)))
    return -force * fl * fv


def muscle_bias(length, lengthrange, acc0, prm):
    """Muscle passive force (mju_muscleBias), vectorised: (n,)."""
    force, l0 = _muscle_scale(lengthrange, acc0, prm)
    L = prm[:, 0] + (length - lengthrange[:, 0]) / jnp.maximum(math.MINVAL, l0)
    b = 0.5 * (1 + prm[:, 5])
    x = (L - 1) / jnp.maximum(math.MINVAL, b - 1)
    xb = (L - b) / jnp.maximum(math.MINVAL, b - 1)
    fpmax = prm[:, 7]
    return jnp.where(L <= 1, 0.0, jnp.where(L <= b, -force * fpmax * 0.5 * x * x,
                                             -force * fpmax * (0.5 + xb)))


def muscle_dynamics(ctrl, act, prm):
    """Muscle activation derivative (mju_muscleDynamics; Millard et al. 2013 time
    constants, optional sigmoid smoothing of width prm[2]), vectorised: (n,)."""
    ctrlc = math.clip_as_jnp(ctrl, 0.0, 1.0)
    actc = math.clip_as_jnp(act, 0.0, 1.0)
    tau_act = prm[:, 0] * (0.5 + 1.5 * actc)
    tau_deact = prm[:, 1] / (0.5 + 1.5 * actc)
    width = prm[:, 2]
    dctrl = ctrlc - act
    hard = jnp.where(dctrl > 0, tau_act, tau_deact)
    x = dctrl / jnp.where(width < math.MINVAL, 1.0, width) + 0.5
    # mju_sigmoid: quintic smoothstep on [0, 1]
    xc = math.clip_as_jnp(x, 0.0, 1.0)
    sig = xc * xc * xc * (3 * xc * (2 * xc - 5) + 10)
    smooth = tau_deact + (tau_act - tau_deact) * sig
    tau = jnp.where(width < math.MINVAL, hard, smooth)
    return dctrl / math.maximum(math.MINVAL, tau)
