"""simjax: MuJoCo's physics rebuilt in pure JAX.

Public API: ``load_model``; the engine functions ``make_data``, ``reset``,
``forward``, ``step``, ``inverse``, ``rollout``, ``rollout_batch`` and the queries
(Jacobians, mass matrix, energies);
the ``Model`` / ``Option`` / ``Statistic`` / ``Data`` types, the enums and the errors.
"""
import os as _os


def _legacy_emitters_flag():
    """Whether XLA_FLAGS should get --xla_cpu_use_fusion_emitters=false.

    XLA:CPU compiles each fusion through MLIR "fusion emitters" by default; for simjax's
    many small fusions that doubles compile time (humanoid step: 17.6 s -> 7.9 s of CPU
    time without them, with the same run time). jaxlib 0.11 dropped the flag (and the
    older emitters) and aborts the process on an unknown XLA flag, so it is set only for
    jaxlib <= 0.10, only if the user has not chosen, and only before JAX's CPU backend
    starts; SIMJAX_KEEP_XLA_FLAGS=1 leaves XLA_FLAGS alone.
    """
    if (_os.environ.get("SIMJAX_KEEP_XLA_FLAGS")
            or "xla_cpu_use_fusion_emitters" in _os.environ.get("XLA_FLAGS", "")):
        return False
    try:
        from importlib.metadata import version
        major, minor = (int(p) for p in version("jaxlib").split(".")[:2])
    except Exception:           # unknown jaxlib: an unknown flag would abort, so leave it
        return False
    return (major, minor) <= (0, 10)


if _legacy_emitters_flag():
    _os.environ["XLA_FLAGS"] = (_os.environ.get("XLA_FLAGS", "") +
                                " --xla_cpu_use_fusion_emitters=false").strip()

from simjax.engine import (Data, apply_ft, differentiate_pos, energy_pos, energy_vel,
                           forward, full_m, integrate_pos, jac, jac_body, jac_body_com,
                           jac_geom, jac_site, jac_subtree_com, make_data, mul_m, reset,
                           reset_keyframe, solve_m, step)
from simjax.engine.inverse import inverse
from simjax import plugins, resources  # noqa: F401,E402  (simjax.plugins.register, ...)
from simjax.errors import MJCFError, UnsupportedFeatureError
from simjax.rollout import Trajectory, rollout, rollout_batch
from simjax.types import (BiasType, ConeType, DataType, DisableBit, DynType, EnableBit,
                          EqType, GainType, GeomType, IntegratorType, JointType, Model,
                          ObjType, Option, SensorType, SolverType, Stage, Statistic,
                          TrnType, WrapType)

__all__ = [
    "load_model", "make_data", "reset", "reset_keyframe", "forward", "step", "inverse",
    "rollout", "rollout_batch", "Trajectory", "Data", "jac", "jac_body", "jac_body_com",
    "jac_geom", "jac_site",
    "jac_subtree_com", "full_m", "mul_m", "solve_m", "apply_ft", "integrate_pos",
    "differentiate_pos", "energy_pos", "energy_vel", "Model", "Option", "Statistic", "MJCFError", "UnsupportedFeatureError",
    "BiasType", "ConeType", "DataType", "DisableBit", "DynType", "EnableBit", "EqType",
    "GainType", "GeomType", "IntegratorType", "JointType", "ObjType", "SensorType",
    "SolverType", "Stage", "TrnType", "WrapType",
]


def load_model(source, assets=None):
    """Compile an MJCF model (path or XML string) into a :class:`Model` (mj_loadXML).

    ``assets``: optional ``{name: bytes}`` used for files the model references.
    Raises MJCFError (file, line, element) for invalid input and
    UnsupportedFeatureError naming any MuJoCo feature simjax does not implement.
    """
    from simjax.mjcf.compile import load_model as _load
    return _load(source, assets)
