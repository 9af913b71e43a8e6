"""simjax: MuJoCo's physics rebuilt in pure JAX.

Public API: ``load_model``, the ``Model`` / ``Option`` / ``Statistic`` types, the
enums and the errors. The engine functions (``make_data``, ``forward``, ``step``, ...)
are re-exported here as they land.
"""
from simjax.errors import MJCFError, UnsupportedFeatureError
from simjax.types import (BiasType, ConeType, DataType, DisableBit, DynType, EnableBit,
                          EqType, GainType, GeomType, IntegratorType, JointType, Model,
                          ObjType, Option, SensorType, SolverType, Stage, Statistic,
                          TrnType, WrapType)

__all__ = [
    "load_model", "Model", "Option", "Statistic", "MJCFError", "UnsupportedFeatureError",
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
