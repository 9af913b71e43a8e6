"""Helpers for constraint / solver tests: MuJoCo contacts copied into a simjax Contact
buffer, and matching of efc rows between MuJoCo and simjax."""
from __future__ import annotations

import importlib

import jax
import jax.numpy as jnp
import mujoco
import numpy as np

from engine_helpers import load, random_state, set_state, to_data
from simjax.engine import constraint, io, solver
from simjax.engine.data import make_contact

fwd = importlib.import_module("simjax.engine.forward")

CONTACT_COPY = ("dist", "pos", "frame", "includemargin", "friction", "solref",
                "solreffriction", "solimp", "geom", "exclude")


def inject_contacts(m, d, mjd):
    """Data ``d`` with MuJoCo's contacts (after mj_forward) in its contact buffer, slots
    grouped by dim. Returns (slot of each MuJoCo contact, new Data)."""
    nc = mjd.ncon
    dims = np.array([mjd.contact.dim[i] for i in range(nc)], np.int32)
    order = np.argsort(dims, kind="stable")            # slot s holds MuJoCo contact order[s]
    con = make_contact(nc, dims[order], d.qpos.dtype)
    kw = {}
    for name in CONTACT_COPY:
        val = np.asarray(getattr(mjd.contact, name))[order]
        ref = getattr(con, name)
        kw[name] = jnp.asarray(val.reshape(ref.shape), ref.dtype)
    con = con.replace(valid=jnp.ones(nc, bool), **kw)
    slot = np.empty(nc, np.int64)
    slot[order] = np.arange(nc)
    efc = constraint.make_efc(m, con.slot_dim, d.qpos.dtype)
    return slot, d.replace(contact=con, ncon=jnp.int32(nc), **efc)


def tight(solver_type, cone=None, contacts=True, extra=None):
    """A model edit: solver, tight tolerance, many iterations."""
    def edit(mjm):
        mjm.opt.solver = solver_type
        mjm.opt.tolerance = 1e-15
        mjm.opt.iterations = 1000
        mjm.opt.ls_iterations = 100
        if cone is not None:
            mjm.opt.cone = cone
        if not contacts:
            mjm.opt.disableflags |= mujoco.mjtDisableBit.mjDSBL_CONTACT
        if extra is not None:
            extra(mjm)
    return edit


def _smooth(m, d):
    # keep the injected contacts: fwd_position runs our own collision, whose contacts
    # (and their count, bounded by the injected buffer's capacity) may differ from
    # MuJoCo's on mesh pairs; the constraint rows are rebuilt from the injected ones
    con, ncon = d.contact, d.ncon
    d = fwd.fwd_position(m, d)
    d = constraint.make_constraint(m, d.replace(contact=con, ncon=ncon))
    d = fwd.fwd_velocity(m, d)
    d = fwd.fwd_actuation(m, d)
    return fwd.fwd_acceleration(m, d)


#: one compiled smooth pipeline / solver per model structure (shared across tests)
smooth_jit = jax.jit(_smooth)
solve_jit = jax.jit(solver.fwd_constraint)


def canonical(m):
    """``m`` with solver options reset: the smooth stages do not depend on them, so one
    compilation of the smooth pipeline serves every solver."""
    return m.replace(opt=m.opt.replace(solver=2, iterations=1, ls_iterations=1,
                                       noslip_iterations=0))


def oracle_case(rel, edit, seed=0, z=None, qscale=0.3, vscale=1.0):
    """(mjm, m, mjd, slot, d_smooth) at a random state, with MuJoCo's contacts injected."""
    mjm, m = load(rel, constraints=True, edit=edit)
    mjd = mujoco.MjData(mjm)
    st = random_state(mjm, np.random.default_rng(seed), qscale=qscale, vscale=vscale)
    if z is not None:
        st["qpos"][2] = z
    set_state(mjm, mjd, st)
    mujoco.mj_forward(mjm, mjd)
    d = to_data(io.make_data(m), st)
    slot = np.zeros(0, np.int64)
    if mjd.ncon:
        slot, d = inject_contacts(m, d, mjd)
    return mjm, m, mjd, slot, smooth_jit(canonical(m), d)


def match_rows(mjd, d, slot):
    """Index of our row for each MuJoCo efc row (matched by type and id, in order)."""
    act = np.asarray(d.efc_active)
    typ = np.asarray(d.efc_type)
    ids = np.asarray(d.efc_id)
    used = np.zeros(len(act), bool)
    out = np.full(mjd.nefc, -1)
    for i in range(mjd.nefc):
        t, k = int(mjd.efc_type[i]), int(mjd.efc_id[i])
        if t >= constraint.CONTACT_FRICTIONLESS:
            k = slot[k]
        cand = np.nonzero(act & (typ == t) & (ids == k) & ~used)[0]
        if len(cand):
            out[i] = cand[0]
            used[cand[0]] = True
    return out, act & ~used



def check_solution(mjd, slot, out, tol):
    """Every active MuJoCo efc row has its simjax row and nothing extra; efc_force
    (relative to the largest force) and qacc (relative to max(1, |qacc|)) within
    ``tol``. Returns the force error."""
    rows, extra = match_rows(mjd, out, slot)
    assert (rows >= 0).all() and not extra.any()
    fmax = np.abs(mjd.efc_force).max()
    err = np.abs(np.asarray(out.efc_force)[rows] - mjd.efc_force).max() / fmax
    assert err < tol, err
    sq = max(1.0, np.abs(mjd.qacc).max())
    assert np.abs(np.asarray(out.qacc) - mjd.qacc).max() / sq < tol
    return err

def pendula_friction(mjm):
    """Model edit: friction loss on every tendon and dof (rows of both kinds)."""
    mjm.tendon_frictionloss[:] = 0.3
    mjm.dof_frictionloss[:] = 0.05


def pendula_some_friction(mjm):
    """Model edit: friction loss on every other dof and on the first tendon only (the
    rows of the others are not in the layout)."""
    mjm.tendon_frictionloss[:1] = 0.3
    mjm.dof_frictionloss[::2] = 0.05


def condim(n):
    """Model edit: contact dimension ``n`` on every geom, with rolling friction."""
    def edit(mjm):
        mjm.geom_condim[:] = n
        mjm.geom_friction[:] = [0.9, 0.02, 0.01]
    return edit
