"""The ``simjax`` command.

- ``simjax info MODEL``: sizes and options of a compiled model;
- ``simjax rollout MODEL --batch N --steps T [--out traj.npz]``: step N perturbed copies
  of the model T steps (jit + vmap, progress bar; on CPU the batch is cut into one
  chunk per usable core, stepped at once from threads); the .npz holds qpos, qvel, ctrl,
  sensordata and time with shape (T, N, ...). Compiled programs are kept in JAX's
  persistent compilation cache (``--compile-cache DIR``, default
  ``$XDG_CACHE_HOME/simjax/xla`` or ``~/.cache/simjax/xla``; ``--no-compile-cache``
  turns it off), so a second run of the same model and batch skips XLA's compile
  (the trace and lowering remain);
- ``simjax plot traj.npz [--out plot.png]``: joint trajectories and energy of world 0;
- ``simjax bench ...``: the benchmark (``python -m bench``, from a source checkout).
"""
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


def _initial_batch(model, batch, seed, noise):
    """Data for ``batch`` worlds: qpos0 with hinge/slide joints perturbed by ``noise``
    (rad or m) and velocities of the same scale, reproducible from ``seed``."""
    import jax
    import numpy as np

    import simjax
    from simjax.engine.data import put
    rng = np.random.default_rng(seed)
    d0 = simjax.make_data(model)
    qpos = np.tile(np.asarray(model.qpos0, np.float64), (batch, 1))
    jtype = np.asarray(model.jnt_type)
    for j in np.nonzero((jtype == 2) | (jtype == 3))[0]:       # slide, hinge
        qpos[:, model.jnt_qposadr[j]] += noise * rng.standard_normal(batch)
    qvel = noise * rng.standard_normal((batch, model.nv))
    dt = d0.qpos.dtype
    # every leaf repeated in NumPy and put on the device: the batch jax.vmap of
    # d0.replace gives, whose broadcasts, op by op, compiled a program per leaf shape
    # (the ant at 1024 worlds: 0.88-1.05 s)
    batched = jax.tree_util.tree_map(
        lambda x: put(np.broadcast_to(np.asarray(x), (batch,) + np.shape(x))), d0)
    return batched.replace(qpos=put(qpos.astype(dt)), qvel=put(qvel.astype(dt)))


def _default_cache_dir() -> str:
    import os
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "simjax", "xla")


def _use_compile_cache(path) -> None:
    """Point JAX's persistent compilation cache at ``path`` (None: leave it off).

    Must run before this process compiles anything: JAX decides once, at its first
    compile, whether the cache is used. JAX's own minimum applies: only programs that
    took at least ``jax_persistent_cache_min_compile_time_secs`` (default 1 s) to
    compile are stored, which keeps the many tiny op-by-op programs out."""
    if path is None:
        return
    import jax
    jax.config.update("jax_compilation_cache_dir", path)


def _rollout(args) -> int:
    import time

    import jax
    import jax.numpy as jnp
    import numpy as np
    from tqdm import tqdm

    _use_compile_cache(None if args.no_compile_cache else args.compile_cache)
    import simjax
    from simjax.rollout import chunk_count, concat_batch, concurrent, split_batch
    model = simjax.load_model(args.model)
    data = _initial_batch(model, args.batch, args.seed, args.noise)
    try:
        datas = split_batch(data, chunk_count(args.batch, data, args.threads))
    except ValueError as e:
        raise SystemExit(f"--threads: {e}")
    chunk = max(1, min(args.chunk, args.steps))
    rng = np.random.default_rng(args.seed + 1)

    @jax.jit
    def advance(data, ctrl):               # ctrl: (batch, chunk, nu)
        if not args.out:
            # nothing is recorded: keep no per-step fields, only the final state
            def one(d, u):
                def body(d, ut):
                    return simjax.step(model, d.replace(ctrl=ut.astype(d.ctrl.dtype))), None
                return jax.lax.scan(body, d, u)[0]
            return jax.vmap(one)(data, ctrl), None
        traj, final = jax.vmap(lambda d, u: simjax.rollout(
            model, d, u, checkpoint=False, return_data=True))(data, ctrl)
        return final, traj

    lo = np.asarray(model.actuator_ctrlrange).reshape(model.nu, 2)
    limited = np.asarray(model.actuator_ctrllimited).astype(bool)
    rec = {k: [] for k in ("qpos", "qvel", "ctrl", "sensordata", "time")}
    t0 = time.perf_counter()
    done = 0
    with tqdm(total=args.steps * args.batch, unit="step", unit_scale=True,
              desc="rollout") as bar:
        while done < args.steps:
            n = min(chunk, args.steps - done)
            if args.ctrl == "random":
                u = rng.uniform(-1, 1, (args.batch, n, model.nu))
                u = np.where(limited, lo[:, 0] + (u + 1) / 2 * (lo[:, 1] - lo[:, 0]), u)
            else:
                u = np.zeros((args.batch, n, model.nu))
            uj = jnp.asarray(u, datas[0].qpos.dtype)
            # the batch's chunks stepped at once, one thread each (CPU: both cores busy)
            out = concurrent(advance, list(zip(datas, split_batch(uj, len(datas)))))
            datas = [o[0] for o in out]
            traj = concat_batch([o[1] for o in out]) if args.out else None
            if args.out:
                for k in ("qpos", "qvel", "sensordata", "time"):
                    rec[k].append(np.swapaxes(np.asarray(getattr(traj, k)), 0, 1))
                rec["ctrl"].append(np.swapaxes(u, 0, 1))
            done += n
            bar.update(n * args.batch)
    wall = time.perf_counter() - t0
    data = concat_batch(datas)
    bad = int(np.sum(np.asarray(data.warning).sum(axis=-1) > 0))
    print(f"{args.batch} worlds x {args.steps} steps in {wall:.2f} s (incl. compile): "
          f"{args.batch * args.steps / wall:,.0f} steps/s; worlds with warnings: {bad}")
    if args.out:
        np.savez_compressed(args.out, **{k: np.concatenate(v) for k, v in rec.items()},
                            timestep=float(np.asarray(model.opt.timestep)))
        print(f"wrote {args.out}")
    return 0


def _plot(args) -> int:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    z = np.load(args.traj)
    t = z["time"][:, args.world]
    fig, axes = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    qpos = z["qpos"][:, args.world]
    qvel = z["qvel"][:, args.world]
    for i in range(min(qpos.shape[1], args.max_joints)):
        axes[0].plot(t, qpos[:, i], lw=1, label=f"qpos[{i}]")
    axes[0].set_ylabel("qpos")
    axes[0].legend(fontsize=6, ncol=4)
    axes[1].plot(t, 0.5 * np.sum(qvel ** 2, axis=1), lw=1)
    axes[1].set_ylabel("0.5 |qvel|^2")
    axes[1].set_xlabel("time (s)")
    fig.suptitle(f"{args.traj}: world {args.world}")
    fig.tight_layout()
    out = args.out or args.traj.rsplit(".", 1)[0] + ".png"
    fig.savefig(out, dpi=120)
    print(f"wrote {out}")
    return 0


def _bench(args) -> int:
    import os
    import subprocess
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if not os.path.isdir(os.path.join(root, "bench")):
        print("error: simjax bench runs from a source checkout (bench/ not found)",
              file=sys.stderr)
        return 1
    return subprocess.call([sys.executable, "-m", "bench"] + args.rest, cwd=root)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="simjax", description="MuJoCo physics in JAX")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("info", help="print a model's sizes and options")
    p.add_argument("model", help="MJCF file")
    p.set_defaults(func=_info)
    p = sub.add_parser("rollout", help="step a batch of worlds (jit + vmap)")
    p.add_argument("model", help="MJCF file")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--chunk", type=int, default=100, help="steps per compiled call")
    p.add_argument("--ctrl", choices=("zero", "random"), default="zero")
    p.add_argument("--noise", type=float, default=0.01, help="initial perturbation")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None,
                   help="chunks of the batch stepped at once, one thread each (default: "
                        "on CPU the usable cores, where they divide the batch)")
    p.add_argument("--out", help=".npz file for qpos, qvel, ctrl, sensordata, time")
    p.add_argument("--compile-cache", default=_default_cache_dir(), metavar="DIR",
                   help="JAX persistent compilation cache (default: %(default)s)")
    p.add_argument("--no-compile-cache", action="store_true",
                   help="compile without the persistent cache")
    p.set_defaults(func=_rollout)
    p = sub.add_parser("plot", help="plot a rollout .npz to PNG")
    p.add_argument("traj")
    p.add_argument("--out")
    p.add_argument("--world", type=int, default=0)
    p.add_argument("--max-joints", type=int, default=12)
    p.set_defaults(func=_plot)
    p = sub.add_parser("bench", help="benchmark against MuJoCo C and MJX (python -m bench)")
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=_bench)
    args = parser.parse_args(argv)
    from simjax.errors import MJCFError
    try:
        return args.func(args)
    except MJCFError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
