"""Helpers for end-to-end constraint tests with simjax's own collision: states along
MuJoCo trajectories (bodies resting on / pushing against the floor and each other, so
contacts, limits and friction loss are active), contacts matched between MuJoCo and
simjax by geom pair and position, efc rows matched by (type, id)."""
from __future__ import annotations

import importlib

import jax
import mujoco
import numpy as np

from constraint_helpers import match_rows

fwd = importlib.import_module("simjax.engine.forward")


def _smooth_own(m, d):
    """Smooth stages with simjax's own collision (contacts, rows, reference, qacc_smooth)."""
    d = fwd.fwd_position(m, d)
    d = fwd.fwd_velocity(m, d)
    d = fwd.fwd_actuation(m, d)
    return fwd.fwd_acceleration(m, d)


#: one compiled smooth pipeline per model structure (shared by every solver)
smooth_own_jit = jax.jit(_smooth_own)


def trajectory_states(mjm, n, seed=0, warm=60, every=15, ctrl_scale=0.5, vscale=0.5):
    """``n`` MuJoCo states (qpos, qvel, ctrl, act, qacc_warmstart) sampled every
    ``every`` steps after ``warm`` steps of mj_step from qpos0 with random velocities
    and random controls (a fraction ``ctrl_scale`` of the control range)."""
    rng = np.random.default_rng(seed)
    d = mujoco.MjData(mjm)
    d.qvel[:] = vscale * rng.standard_normal(mjm.nv)
    lo, hi = np.full(mjm.nu, -1.0), np.full(mjm.nu, 1.0)
    lim = mjm.actuator_ctrllimited.astype(bool)
    lo[lim], hi[lim] = mjm.actuator_ctrlrange[lim, 0], mjm.actuator_ctrlrange[lim, 1]
    out = []
    k = 0
    while len(out) < n:
        mid, half = 0.5 * (lo + hi), 0.5 * (hi - lo)
        d.ctrl[:] = mid + ctrl_scale * half * rng.uniform(-1, 1, mjm.nu)
        mujoco.mj_step(mjm, d)
        k += 1
        if k >= warm and (k - warm) % every == 0:
            out.append(dict(qpos=d.qpos.copy(), qvel=d.qvel.copy(), ctrl=d.ctrl.copy(),
                            act=d.act.copy(), qacc_warmstart=d.qacc_warmstart.copy()))
    return out


def match_contacts(mjd, con, tol=1e-6):
    """Slot of our contact buffer for each MuJoCo contact (-1 if none): same geom pair,
    nearest position within ``tol``. ``con``: our Contact as numpy arrays."""
    slot = np.full(mjd.ncon, -1, np.int64)
    used = np.zeros(len(con.valid), bool)
    for k in range(mjd.ncon):
        g = mjd.contact.geom[k]
        cand = np.nonzero(con.valid & ~used & (con.geom[:, 0] == g[0]) &
                          (con.geom[:, 1] == g[1]))[0]
        if not len(cand):
            continue
        dist = np.linalg.norm(con.pos[cand] - mjd.contact.pos[k], axis=1)
        i = int(np.argmin(dist))
        if dist[i] < tol:
            slot[k] = cand[i]
            used[cand[i]] = True
    return slot


def compare(mjd, d, tol_pos=1e-6):
    """Errors of our solved Data ``d`` against MuJoCo's ``mjd`` (after mj_forward):
    dict with qacc and qfrc_constraint errors relative to max(1, max |value|), efc_force
    errors (rows matched by type and id) relative to max(1e-9, max |force|), and the
    contact / row matching. Raises AssertionError when contacts or rows do not match."""
    con = jax.tree_util.tree_map(np.asarray, d.contact)
    slot = match_contacts(mjd, con, tol_pos)
    assert int(d.ncon) == mjd.ncon, (int(d.ncon), mjd.ncon)
    assert (slot >= 0).all(), f"MuJoCo contacts without a match: {np.nonzero(slot < 0)[0]}"
    rows, extra = match_rows(mjd, d, slot)
    assert (rows >= 0).all(), f"MuJoCo efc rows without a match: {np.nonzero(rows < 0)[0]}"
    assert not extra.any(), f"extra active rows {np.nonzero(extra)[0]}"
    for f in ("ne", "nf", "nl", "nefc"):
        assert int(getattr(d, f)) == getattr(mjd, f), f
    sq = max(1.0, np.abs(mjd.qacc).max())
    sf = max(1.0, np.abs(mjd.qfrc_constraint).max())
    fmax = max(1e-9, np.abs(mjd.efc_force).max()) if mjd.nefc else 1.0
    out = dict(
        qacc=float(np.abs(np.asarray(d.qacc) - mjd.qacc).max() / sq),
        qfrc_constraint=float(np.abs(np.asarray(d.qfrc_constraint) -
                                     mjd.qfrc_constraint).max() / sf),
        efc_force=float(np.abs(np.asarray(d.efc_force)[rows] - mjd.efc_force).max() / fmax)
        if mjd.nefc else 0.0,
        ncon=mjd.ncon, nefc=mjd.nefc, ne=mjd.ne, nf=mjd.nf, nl=mjd.nl)
    off = ~np.asarray(d.efc_active)
    assert np.all(np.asarray(d.efc_force)[off] == 0)
    return out
