"""Rollouts: many steps under one ``lax.scan`` (the JAX analogue of mujoco.rollout).

``rollout`` advances one world; batch worlds with ``jax.vmap`` (over ``data`` and/or
``ctrl``, and over Model leaves for domain randomisation). Gradients flow through the
whole trajectory; with ``checkpoint`` (default) each step is rematerialised in the
backward pass, so reverse-mode memory holds one Data per step instead of every
intermediate of every step.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from simjax.engine.forward import step as _step


class Trajectory(NamedTuple):
    """States after each step, stacked on a leading time axis (length nstep)."""

    qpos: Any        # (nstep, nq)
    qvel: Any        # (nstep, nv)
    act: Any         # (nstep, na)
    time: Any        # (nstep,)
    sensordata: Any  # (nstep, nsensordata)


def rollout(model, data, ctrl=None, nstep=None, checkpoint=True, return_data=False):
    """Step ``data`` ``nstep`` times, applying ``ctrl[t]`` before step t (mj_step each).

    model: Model; data: Data (one world); ctrl: (nstep, nu) controls, or None to keep
    ``data.ctrl`` (then ``nstep`` is required). Returns a :class:`Trajectory` of the
    states after every step, or ``(trajectory, final_data)`` if ``return_data``.
    ``checkpoint`` rematerialises steps in reverse-mode autodiff to save memory.
    """
    if ctrl is None:
        if nstep is None:
            raise ValueError("rollout needs ctrl or nstep")
        ctrl = jnp.broadcast_to(data.ctrl, (nstep,) + data.ctrl.shape)
    elif nstep is not None and nstep != ctrl.shape[0]:
        raise ValueError(f"ctrl has {ctrl.shape[0]} steps, nstep is {nstep}")

    def body(d, u):
        d = _step(model, d.replace(ctrl=u.astype(d.ctrl.dtype)))
        return d, Trajectory(d.qpos, d.qvel, d.act, d.time, d.sensordata)

    if checkpoint:
        body = jax.checkpoint(body)
    final, traj = jax.lax.scan(body, data, ctrl)
    return (traj, final) if return_data else traj
