"""The ``simjax`` command: ``info`` (and more subcommands as they land)."""
from __future__ import annotations

import argparse
import sys

_COUNTS = ("nq", "nv", "nu", "na", "nbody", "njnt", "ngeom", "nsite", "nmesh", "nhfield",
           "ntendon", "neq", "npair", "nexclude", "nsensor", "nsensordata", "nkey", "nmocap",
           "nplugin")


def _info(args) -> int:
    import time

    import numpy as np

    import simjax
    from simjax.types import ConeType, IntegratorType, JacobianType, SolverType
    t0 = time.perf_counter()
    model = simjax.load_model(args.model)
    dt = time.perf_counter() - t0
    print(f"model: {args.model}  (compiled in {dt:.3f} s)")
    for name in _COUNTS:
        print(f"  {name:12s} {getattr(model, name)}")
    o = model.opt
    print("options:")
    print(f"  timestep     {float(np.asarray(o.timestep)):g}")
    print(f"  integrator   {IntegratorType(o.integrator).name}")
    print(f"  solver       {SolverType(o.solver).name}  iterations {o.iterations}  "
          f"ls_iterations {o.ls_iterations}")
    print(f"  cone         {ConeType(o.cone).name}  jacobian {JacobianType(o.jacobian).name}")
    print(f"  gravity      {np.asarray(o.gravity)}")
    print(f"  density      {float(np.asarray(o.density)):g}  viscosity "
          f"{float(np.asarray(o.viscosity)):g}")
    print(f"  disableflags {o.disableflags:#x}  enableflags {o.enableflags:#x}")
    total = float(np.asarray(model.body_mass).sum())
    print(f"total mass: {total:g} kg   meaninertia: {float(np.asarray(model.stat.meaninertia)):g}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="simjax", description="MuJoCo physics in JAX")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("info", help="print a model's sizes and options")
    p.add_argument("model", help="MJCF file")
    p.set_defaults(func=_info)
    args = parser.parse_args(argv)
    from simjax.errors import MJCFError
    try:
        return args.func(args)
    except MJCFError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
