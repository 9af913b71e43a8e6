"""The benchmark: simjax, MJX and MuJoCo C measured in the same run.

Usage::

    python -m bench [--models humanoid-smooth,pendulum-smooth] [--batch 1,64,1024,4096]
                    [--backends simjax,mjx,mujoco] [--grad] [--out bench/results]

For every (model, batch size, backend) a fresh process (``bench.worker``) measures the
JIT compile time of one batched step and of the batched rollout, the steady-state
steps/s (worlds x steps / second), the memory of the compiled program (XLA) or of the
MjData buffers (C), the process's peak memory and, with ``--grad``, the steps/s of
value-and-gradient through a ``--grad-nstep``-step rollout. Results go to
``<out>/<device>-<date>.json`` and ``.md`` (a table with the ratios simjax/C and
simjax/MJX) and a plot ``.png`` of steps/s against batch size per backend.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys

from tqdm import tqdm

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

#: rollout length per batch size: long enough that one call takes well over the
#: dispatch overhead, short enough to keep the run practical on a small CPU
NSTEP = {1: 1000, 16: 500, 64: 200, 256: 100, 1024: 50, 4096: 20, 8192: 10, 16384: 10}


def device_name():
    """'cpu-<n>cores' or the accelerator's kind, for file names and the report."""
    import jax
    dev = jax.devices()[0]
    if dev.platform == "cpu":
        return f"cpu-{os.cpu_count()}cores"
    return dev.device_kind.replace(" ", "_").lower()


def run_one(backend, model, batch, nstep, grad_nstep, timeout):
    cmd = [sys.executable, "-m", "bench.worker", backend, model, str(batch), str(nstep)]
    if grad_nstep:
        cmd += ["--grad-nstep", str(grad_nstep)]
    try:
        out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return dict(model=model, backend=backend, batch=batch, error=f"timeout {timeout}s")
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    tail = (out.stderr or "").strip().splitlines()[-1:] or ["no output"]
    return dict(model=model, backend=backend, batch=batch, error=tail[0][:300])


def _fmt(x, unit=""):
    if x is None:
        return "-"
    if unit == "s":
        return f"{x:.2f}"
    if unit == "MB":
        return f"{x / 2**20:.0f}"
    if x >= 1e6:
        return f"{x / 1e6:.2f}M"
    if x >= 1e3:
        return f"{x / 1e3:.1f}K"
    return f"{x:.0f}"


def markdown(rows, meta):
    """Results table: one line per (model, batch) with every backend and the ratios."""
    by = {}
    for r in rows:
        by.setdefault((r["model"], r["batch"]), {})[r["backend"]] = r
    lines = [f"Device: {meta['device']} ({meta['cpu']}), jax {meta['jax']}, "
             f"mujoco {meta['mujoco']}, float32, {meta['date']}.",
             f"Command: `{meta['command']}`", "",
             "| model | batch | simjax steps/s | MJX steps/s | MuJoCo C steps/s | "
             "simjax/MJX | simjax/C | compile step simjax / MJX (s) | "
             "grad steps/s simjax / MJX | memory simjax / MJX / C (MB) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for (model, batch), b in sorted(by.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        s, x, c = b.get("simjax", {}), b.get("mjx", {}), b.get("mujoco", {})

        def sps(r):
            return _fmt(r.get("sps")) if "error" not in r else "error"

        def ratio(a, b):
            if a.get("sps") and b.get("sps"):
                return f"{a['sps'] / b['sps']:.2f}"
            return "-"
        lines.append(
            f"| {model} | {batch} | {sps(s)} | {sps(x)} | {sps(c)} | {ratio(s, x)} | "
            f"{ratio(s, c)} | {_fmt(s.get('compile_step_s'), 's')} / "
            f"{_fmt(x.get('compile_step_s'), 's')} | {_fmt(s.get('grad_sps'))} / "
            f"{_fmt(x.get('grad_sps'))} | {_fmt(s.get('memory_bytes'), 'MB')} / "
            f"{_fmt(x.get('memory_bytes'), 'MB')} / {_fmt(c.get('memory_bytes'), 'MB')} |")
    errors = [r for r in rows if "error" in r]
    if errors:
        lines += ["", "Errors:"]
        lines += [f"- {r['backend']} {r['model']} batch {r['batch']}: {r['error']}"
                  for r in errors]
    return "\n".join(lines) + "\n"


def plot(rows, path):
    """steps/s against batch size, one panel per model, one line per backend."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    models = sorted({r["model"] for r in rows})
    fig, axes = plt.subplots(1, len(models), figsize=(4.5 * len(models), 3.6), squeeze=False)
    for ax, model in zip(axes[0], models):
        for backend in ("simjax", "mjx", "mujoco"):
            pts = sorted((r["batch"], r["sps"]) for r in rows
                         if r["model"] == model and r["backend"] == backend and r.get("sps"))
            if pts:
                ax.plot(*zip(*pts), marker="o", label=backend)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(model)
        ax.set_xlabel("batch size")
        ax.set_ylabel("steps / s")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="pendulum-smooth,humanoid-smooth")
    ap.add_argument("--batch", default="1,64,1024,4096")
    ap.add_argument("--backends", default="simjax,mjx,mujoco")
    ap.add_argument("--grad", action="store_true", help="also measure forward+backward")
    ap.add_argument("--grad-nstep", type=int, default=100)
    ap.add_argument("--grad-max-batch", type=int, default=1024)
    ap.add_argument("--timeout", type=int, default=900, help="seconds per measurement")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    args = ap.parse_args(argv)

    import jax
    import mujoco
    models = args.models.split(",")
    batches = [int(b) for b in args.batch.split(",")]
    backends = args.backends.split(",")
    jobs = [(m, b, k) for m in models for b in batches for k in backends]
    rows = []
    for model, batch, backend in tqdm(jobs, desc="bench", unit="run"):
        nstep = NSTEP.get(batch, max(10, 50000 // batch))
        grad = args.grad_nstep if args.grad and batch <= args.grad_max_batch else 0
        row = run_one(backend, model, batch, nstep, grad, args.timeout)
        rows.append(row)
        tqdm.write(json.dumps(row))
    today = datetime.date.today().isoformat()
    meta = dict(device=device_name(), cpu=platform.processor() or platform.machine(),
                jax=jax.__version__, mujoco=mujoco.__version__, date=today,
                command="python -m bench " + " ".join(argv if argv is not None
                                                      else sys.argv[1:]))
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, f"{meta['device']}-{today}")
    with open(stem + ".json", "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)
    table = markdown(rows, meta)
    with open(stem + ".md", "w") as f:
        f.write(table)
    plot(rows, stem + ".png")
    print(table)
    print(f"wrote {stem}.json, .md, .png")
    return 0
