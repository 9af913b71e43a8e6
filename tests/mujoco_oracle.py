"""Test-only helpers around the MuJoCo C oracle (the ``mujoco`` package).

``model_from_mujoco`` builds a simjax Model straight from a compiled ``mujoco.MjModel``
(copying every field simjax shares with mjModel). Engine tests use it to check the
pipeline independently of simjax's own compiler; compiler tests compare against it.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

from simjax import types

#: the corpus folder: ../shared/corpus beside the repository, or the folder named by the
#: SIMJAX_CORPUS environment variable (a copy taken to another machine), as for bench/
CORPUS = os.environ.get("SIMJAX_CORPUS") or os.path.normpath(
    os.path.join(os.path.dirname(__file__), "..", "..", "shared", "corpus"))


def corpus_path(rel: str) -> str:
    """Absolute path of a corpus model; skips the test when the corpus is absent."""
    path = os.path.join(CORPUS, rel)
    if not os.path.exists(path):
        pytest.skip(f"corpus model {rel} not found (expected ../shared/corpus beside the repo)")
    return path


def model_from_mujoco(mjm):
    """simjax Model with every shared field copied from ``mjm`` (mujoco.MjModel)."""
    import jax.numpy as jnp
    import mujoco

    kw = {}
    for n in types.MODEL_COUNTS:
        if hasattr(mjm, n):
            kw[n] = int(getattr(mjm, n))
    for name, kind, *_ in types.MODEL_FIELDS:
        if not hasattr(mjm, name):
            continue
        arr = np.array(getattr(mjm, name))
        shape = types.field_shape(name, kw)
        arr = arr.reshape(shape)
        if kind == "i":
            arr = arr.astype(np.int32)
        elif kind == "b":
            arr = arr.astype(bool)
        else:
            arr = arr.astype(np.float64)
        kw[name] = arr if types.is_static_field(name) else jnp.asarray(arr)
    opt = {}
    for f in ("timestep", "impratio", "tolerance", "ls_tolerance", "noslip_tolerance",
              "ccd_tolerance", "sleep_tolerance", "density", "viscosity", "o_margin"):
        opt[f] = jnp.asarray(float(getattr(mjm.opt, f)))
    for f in ("gravity", "wind", "magnetic", "o_solref", "o_solimp", "o_friction"):
        opt[f] = jnp.asarray(np.array(getattr(mjm.opt, f), dtype=np.float64))
    for f in ("integrator", "cone", "jacobian", "solver", "iterations", "ls_iterations",
              "noslip_iterations", "ccd_iterations", "sdf_iterations", "sdf_initpoints",
              "disableflags", "enableflags", "disableactuator"):
        opt[f] = int(getattr(mjm.opt, f))
    kw.update(types.frictionloss_structure(mjm.dof_frictionloss, mjm.tendon_frictionloss))
    kw.update(types.mesh_frames(mjm.mesh_vertnum, mjm.mesh_normaladr, mjm.mesh_normalnum,
                                mjm.mesh_normal))
    kw["opt"] = types.Option(**opt)
    kw["stat"] = types.Statistic(
        meaninertia=jnp.asarray(mjm.stat.meaninertia), meanmass=jnp.asarray(mjm.stat.meanmass),
        meansize=jnp.asarray(mjm.stat.meansize), extent=jnp.asarray(mjm.stat.extent),
        center=jnp.asarray(np.array(mjm.stat.center)))
    names = {}
    for objtype, count in (("body", "nbody"), ("joint", "njnt"), ("geom", "ngeom"),
                           ("site", "nsite"), ("camera", "ncam"), ("mesh", "nmesh"),
                           ("hfield", "nhfield"), ("tendon", "ntendon"),
                           ("actuator", "nu"), ("sensor", "nsensor"), ("equality", "neq"),
                           ("pair", "npair"), ("exclude", "nexclude"), ("key", "nkey"),
                           ("numeric", "nnumeric"), ("tuple", "ntuple"),
                           ("plugin", "nplugin")):
        enum = getattr(mujoco.mjtObj, "mjOBJ_" + objtype.upper())
        names[objtype] = [mujoco.mj_id2name(mjm, enum, i) or ""
                          for i in range(getattr(mjm, count))]
    kw["names"] = names
    return types.Model(**kw)
