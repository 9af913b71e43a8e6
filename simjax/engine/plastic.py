"""Elasto-plastic springs (MuJoCo 4's ``springyield`` on joints and tendons).

A joint (hinge, slide, ball) or tendon with a positive spring yield keeps its spring
reference in ``Data.plastic`` (nplastic,) instead of the model's constant one, and
that reference follows the motion once the spring is stretched beyond the yield
(ideal elasto-plasticity: the elastic stretch is clamped to the yield at the end of
every step, the excess becomes permanent). Layout (``jnt_plasticadr``,
``tendon_plasticadr``): a hinge or slide joint's reference position (1 number), a
ball joint's reference quaternion (4), a tendon's spring length range (2, the dead
band's low and high ends).

The rules below reproduce MuJoCo 4.0.0, measured in float64 against it
(``tests/engine/test_plastic.py``, identical to rounding):

- the spring forces (and the potential energy) read the plastic references: a hinge
  or slide spring ``-k (q - p)``, a ball ``-k subQuat(q, p)``, a tendon its dead band
  ``[p_lo, p_hi]``; forward does not change them;
- at the end of ``mj_step``, after the integrator (Euler, RK4, implicit):
  - hinge, slide: e = q' - p; where |e| > yield, p = q' - yield sign(e);
  - ball: e = subQuat(q', p), n = |e|; where n > yield, p = quatIntegrate(p, e,
    (n - yield) / n) (p turned towards q' until the angle left is the yield);
  - tendon: its length after the step to first order, L' = L + ten_J dq with L and
    ten_J those of the step's forward and dq = differentiatePos(q, q'); where L' > hi
    + yield both ends move up by the excess L' - (hi + yield), where L' < lo - yield
    down by (lo - yield) - L';
- mj_resetData sets the initial references (qpos_spring, tendon_lengthspring), a
  keyframe its ``key_plastic`` (defaults: the same).
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from simjax.engine import math
from simjax.engine import support
from simjax.types import JointType


def _joints(m):
    """(scalar joints, ball joints) with a plastic state (static ids)."""
    adr = np.asarray(m.jnt_plasticadr).reshape(m.njnt)
    jtype = np.asarray(m.jnt_type).reshape(m.njnt)
    has = adr >= 0
    scalar = np.nonzero(has & ((jtype == JointType.HINGE) | (jtype == JointType.SLIDE)))[0]
    ball = np.nonzero(has & (jtype == JointType.BALL))[0]
    return scalar, ball


def _tendons(m):
    return np.nonzero(np.asarray(m.tendon_plasticadr).reshape(m.ntendon) >= 0)[0]


def has_tendons(m):
    """Whether a tendon of ``m`` has a plastic state (static)."""
    return bool(m.nplastic) and len(_tendons(m)) > 0


def init(m, dtype):
    """The initial plastic state (nplastic,): the joints' spring references
    (qpos_spring) and the tendons' spring length ranges (tendon_lengthspring)."""
    if not m.nplastic:
        return np.zeros(0, dtype)
    qspring = jnp.asarray(m.qpos_spring, dtype).reshape(m.nq)
    rng = jnp.asarray(m.tendon_lengthspring, dtype).reshape(m.ntendon, 2)
    return math.take(jnp.concatenate([qspring, rng.reshape(-1)]), sources(m))


def sources(m):
    """(nplastic,) positions in [qpos_spring, tendon_lengthspring.ravel()] of each
    plastic entry (static)."""
    src = np.zeros(m.nplastic, np.int64)
    qadr = np.asarray(m.jnt_qposadr)
    jadr = np.asarray(m.jnt_plasticadr).reshape(m.njnt)
    scalar, ball = _joints(m)
    src[jadr[scalar]] = qadr[scalar]
    for j in ball:
        src[jadr[j]:jadr[j] + 4] = qadr[j] + np.arange(4)
    tadr = np.asarray(m.tendon_plasticadr).reshape(m.ntendon)
    for t in _tendons(m):
        src[tadr[t]:tadr[t] + 2] = m.nq + 2 * t + np.arange(2)
    return src


def spring_refs(m, d, dtype):
    """(qpos_spring (nq,), tendon_lengthspring (ntendon, 2)): the model's spring
    references with those of the elasto-plastic joints and tendons taken from
    ``d.plastic``."""
    qspring = jnp.asarray(m.qpos_spring, dtype).reshape(m.nq)
    rng = jnp.asarray(m.tendon_lengthspring, dtype).reshape(m.ntendon, 2)
    if not m.nplastic:
        return qspring, rng
    src = sources(m)
    # each model entry replaced by at most one plastic entry: a gather, not a scatter
    pick = np.arange(m.nq + 2 * m.ntendon) + m.nplastic
    pick[src] = np.arange(m.nplastic)
    both = math.take(jnp.concatenate([d.plastic.astype(dtype), qspring, rng.reshape(-1)]),
                     pick)
    return both[:m.nq], both[m.nq:].reshape(m.ntendon, 2)


def update(m, plastic, qpos0, qpos1, ten_length, ten_J):
    """The plastic state (nplastic,) after a step from ``qpos0`` to ``qpos1`` (see the
    module docstring); ``ten_length`` (ntendon,) and ``ten_J`` (ntendon, nv): those of
    the step's forward, at ``qpos0``."""
    dtype = plastic.dtype
    out = plastic
    qadr = np.asarray(m.jnt_qposadr)
    jadr = np.asarray(m.jnt_plasticadr).reshape(m.njnt)
    jy = jnp.asarray(m.jnt_springyield, dtype).reshape(m.njnt)
    scalar, ball = _joints(m)
    parts = []                      # (plastic indices, new values)
    if len(scalar):
        p = math.take(plastic, jadr[scalar])
        e = math.take(qpos1, qadr[scalar]) - p
        y = jy[scalar]
        parts.append((jadr[scalar], math.where(jnp.abs(e) > y,
                                               p + e - y * jnp.sign(e), p)))
    if len(ball):
        pi = jadr[ball][:, None] + np.arange(4)
        p = math.take(plastic, pi)
        e = math.sub_quat(math.take(qpos1, qadr[ball][:, None] + np.arange(4)), p)
        n = math.norm(e)
        y = jy[ball]
        over = n > y
        frac = math.where(over, (n - y) / math.where(over, n, 1.0), 0.0)
        turned = math.quat_integrate(p, e, frac)
        parts.append((pi.ravel(), math.where(over[:, None], turned, p).ravel()))
    tendon = _tendons(m)
    if len(tendon):
        tadr = np.asarray(m.tendon_plasticadr).reshape(m.ntendon)[tendon]
        dq = support.differentiate_pos(m, qpos0, qpos1, 1.0)
        length = math.take(ten_length, tendon) + math.take(ten_J, tendon) @ dq
        ti = tadr[:, None] + np.arange(2)
        p = math.take(plastic, ti)
        y = jnp.asarray(m.tendon_springyield, dtype).reshape(m.ntendon)[tendon]
        shift = math.where(length > p[:, 1] + y, length - p[:, 1] - y,
                           math.where(length < p[:, 0] - y, length - p[:, 0] + y, 0.0))
        parts.append((ti.ravel(), (p + shift[:, None]).ravel()))
    if not parts:
        return out
    idx = np.concatenate([i for i, _ in parts])
    vals = jnp.concatenate([v for _, v in parts])
    src = np.arange(len(idx), len(idx) + m.nplastic)
    src[idx] = np.arange(len(idx))
    return math.take(jnp.concatenate([vals, plastic]), src)
