"""simjax: MuJoCo's physics rebuilt in pure JAX.

Public API: ``load_model``; the engine functions ``make_data``, ``reset``,
``forward``, ``step``, ``inverse``, ``rollout``, ``rollout_batch`` and the queries
(Jacobians, mass matrix, energies);
the ``Model`` / ``Option`` / ``Statistic`` / ``Data`` types, the enums and the errors.
"""
import os as _os


def _jaxlib_version():
    """(major, minor, patch) of the installed jaxlib, or None when it cannot be read."""
    import re
    try:
        from importlib.metadata import version
        found = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", version("jaxlib"))
    except Exception:
        return None
    return None if found is None else tuple(int(g or 0) for g in found.groups())


def _flag_wanted(name, oldest=(0, 0, 0)):
    """Whether simjax may add XLA flag ``name``: only for jaxlib ``oldest`` <= version
    < 0.11 (later jaxlibs dropped or renamed these flags, earlier ones may lack them,
    and XLA aborts the process on an unknown flag), only if the user has not set it,
    and not with SIMJAX_KEEP_XLA_FLAGS=1."""
    if _os.environ.get("SIMJAX_KEEP_XLA_FLAGS") or name in _os.environ.get("XLA_FLAGS", ""):
        return False
    ver = _jaxlib_version()
    return ver is not None and oldest <= ver < (0, 11, 0)


def _legacy_emitters_flag():
    """Whether XLA_FLAGS should get --xla_cpu_use_fusion_emitters=false.

    XLA:CPU compiles each fusion through MLIR "fusion emitters" by default; for simjax's
    many small fusions that doubles compile time (humanoid step: 17.6 s -> 7.9 s of CPU
    time without them, with the same run time). jaxlib 0.11 dropped the flag (and the
    older emitters) and aborts the process on an unknown XLA flag, so it is set only for
    jaxlib <= 0.10, only if the user has not chosen, and only before JAX's CPU backend
    starts; SIMJAX_KEEP_XLA_FLAGS=1 leaves XLA_FLAGS alone.
    """
    return _flag_wanted("xla_cpu_use_fusion_emitters")


def _ynn_reduce_flag():
    """Whether XLA_FLAGS should get --xla_cpu_experimental_ynn_fusion_type=-reduce.

    jaxlib 0.10's XLA:CPU hands reductions to the YNNPACK library by default. simjax's
    reductions are short (3 to a few dozen terms) over large batches, where YNNPACK's
    kernels are slower than XLA's own loops: barkour's collision stage (batch 1024)
    ran 44-46 -> 29-34 us per world without them, and whole contact steps 15-30% faster
    (README, "Using it"). Same conditions as :func:`_legacy_emitters_flag`, and only
    for jaxlib 0.10.2 and later 0.10 releases: 0.10.2 knows the flag (checked), earlier
    releases may not.
    """
    return _flag_wanted("xla_cpu_experimental_ynn_fusion_type", oldest=(0, 10, 2))


def _unroll_flag():
    """Whether XLA_FLAGS should get --xla_backend_extra_options=-unroll-full-max-count=8.

    LLVM fully unrolls an inner loop of up to a few dozen iterations and then vectorises
    the batch loop around it, one scalar load and insert per world and column: a kernel
    over (batch, 15) elements is ~800 lines of optimised IR where its loop would be ~140,
    and LLVM's time per kernel grows with it. Capped at 8 iterations (measured, bench
    rollouts, float32, batch 1024: XLA compile process CPU, fresh-process pairs, 4 pairs:
    shadow hand 0.914 [0.887, 0.942], ant 0.927 [0.837, 0.943], humanoid 0.953 (3 pairs),
    barkour 1.002 [0.871, 1.057]; run per world-step, both programs in one process, 8-10
    rounds: hand 0.995 [0.926, 1.077], ant 0.987 [0.904, 1.293], barkour 0.975, humanoid
    0.999; a cap of 4 compiled faster (ant 0.82) but ran 4-6% slower, 16 gained nothing).
    Results move by rounding only (another contraction of multiply-adds). Same conditions
    as :func:`_legacy_emitters_flag`; a user's own xla_backend_extra_options win. The
    option reaches every LLVM backend of the process, GPU code generation included, where
    it is not measured: so it is set only where JAX can run on the CPU alone
    (:func:`_cpu_only`).
    """
    return _flag_wanted("xla_backend_extra_options") and _cpu_only()


def _cpu_only():
    """Whether JAX can use no backend but the CPU: JAX_PLATFORMS names only ``cpu``, or
    no PJRT plugin is installed (JAX finds GPU and TPU plugins in the ``jax_plugins``
    namespace package, and the CUDA ones also as ``jax_cuda*_plugin`` modules)."""
    platforms = [p.strip() for p in _os.environ.get("JAX_PLATFORMS", "").split(",") if p.strip()]
    if platforms:
        return all(p == "cpu" for p in platforms)
    from importlib.util import find_spec
    return all(find_spec(name) is None for name in (
        "jax_plugins", "jax_cuda12_plugin", "jax_cuda13_plugin"))


_FLAGS = []
if _legacy_emitters_flag():
    _FLAGS.append("--xla_cpu_use_fusion_emitters=false")
if _ynn_reduce_flag():
    _FLAGS.append("--xla_cpu_experimental_ynn_fusion_type=-reduce")
if _unroll_flag():
    _FLAGS.append("--xla_backend_extra_options=-unroll-full-max-count=8")
if _FLAGS:
    _os.environ["XLA_FLAGS"] = " ".join([_os.environ.get("XLA_FLAGS", "")] + _FLAGS).strip()

# XLA:CPU's temporaries freed and reused without page faults (simjax._malloc)
from simjax import _malloc  # noqa: E402
_malloc.at_import()

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
