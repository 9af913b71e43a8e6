"""simjax against MuJoCo C on every corpus model: batched steps/s and compile time.

Usage: python bench/corpus_survey.py [--batch 1024] [--steps 10] [--timeout 300]
                                     [--models gym_ant/ant.xml,...] [--threads N]

Each model runs in a fresh child process: ``jit(vmap(fori_loop(step)))`` over ``--batch``
worlds for ``--steps`` steps (as ``simjax.rollout_batch`` on CPU: one chunk of the batch
per usable core, the chunks at once from threads; ``--threads 1``: one program over the
batch, as the runs before 2026-12-05's last), in float32, from qpos0 with velocities
of N(0, 0.1), no control; the median of 5 timed calls. MuJoCo C: ``mujoco.rollout`` on 2 threads from the
same states, median of 3. A row per model: simjax and C steps/s, their ratio and
simjax's compile time (wall); a child that fails or passes ``--timeout`` prints its
last error line. The states are the models' own start, not settled ones: contact-rich
models may still be falling. For finding the models (and features) where simjax is far
from MuJoCo, not for the headline numbers (those are ``python -m bench``'s).
"""
from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
CORPUS = os.environ.get("SIMJAX_CORPUS", os.path.join(ROOT, "..", "shared", "corpus"))

_CHILD = """
import sys, time
import numpy as np
sys.path.insert(0, {root!r})
import jax, jax.numpy as jnp, mujoco, simjax
from mujoco import rollout
path, B, T = {path!r}, {batch}, {steps}
mjm = mujoco.MjModel.from_xml_path(path)
m = simjax.load_model(path)
d0 = simjax.make_data(m)
rng = np.random.default_rng(0)
qs = np.tile(mjm.qpos0, (B, 1))
vs = 0.1 * rng.standard_normal((B, mjm.nv))
d = jax.vmap(lambda q, v: d0.replace(qpos=q, qvel=v))(jnp.asarray(qs, jnp.float32),
                                                      jnp.asarray(vs, jnp.float32))
roll = jax.jit(jax.vmap(lambda d: jax.lax.fori_loop(0, T, lambda i, d: simjax.step(m, d),
                                                     d)))
from simjax.rollout import chunk_count, concurrent, split_batch
chunks = [(c,) for c in split_batch(d, chunk_count(B, d, {threads}))]
t0 = time.perf_counter()
run = roll.lower(chunks[0][0]).compile()
compile_s = time.perf_counter() - t0
concurrent(run, chunks)
ts = []
for _ in range(5):
    t = time.perf_counter()
    concurrent(run, chunks)
    ts.append(time.perf_counter() - t)
ours = B * T / np.median(ts)
mjd = mujoco.MjData(mjm)
spec = mujoco.mjtState.mjSTATE_FULLPHYSICS
state = np.zeros((B, mujoco.mj_stateSize(mjm, spec)))
for i in range(B):
    mjd.qpos[:], mjd.qvel[:] = qs[i], vs[i]
    mujoco.mj_getState(mjm, mjd, state[i], spec)
ctrl = np.zeros((B, T, mjm.nu))
datas = [mujoco.MjData(mjm) for _ in range(2)]
with rollout.Rollout(nthread=2) as r:
    r.rollout([mjm] * B, datas, state, ctrl)
    tc = []
    for _ in range(3):
        t = time.perf_counter()
        r.rollout([mjm] * B, datas, state, ctrl)
        tc.append(time.perf_counter() - t)
theirs = B * T / np.median(tc)
print(f"ROW {{ours:.0f}} {{theirs:.0f}} {{compile_s:.2f}}", flush=True)
"""


def _models():
    with open(os.path.join(CORPUS, "manifest.csv")) as f:
        return [row["path"] for row in csv.DictReader(f)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--timeout", type=int, default=300)
    ap.add_argument("--models", default="")
    ap.add_argument("--threads", type=int, default=None,
                    help="chunks of the batch at once (default: as simjax.rollout_batch)")
    args = ap.parse_args()
    models = args.models.split(",") if args.models else _models()
    sys.path.insert(0, ROOT)
    from bench.run import cpu_model
    print(f"processor: {cpu_model()}, {os.cpu_count()} cores")
    print(f"{'model':60s} {'simjax':>9s} {'C':>9s} {'simjax/C':>8s} {'compile':>8s}")
    for rel in models:
        code = _CHILD.format(root=ROOT, path=os.path.join(CORPUS, rel), batch=args.batch,
                             steps=args.steps, threads=args.threads)
        try:
            out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                                 text=True, timeout=args.timeout)
            rows = [ln for ln in out.stdout.splitlines() if ln.startswith("ROW ")]
            if not rows:
                err = (out.stderr.strip().splitlines() or ["no output"])[-1]
                print(f"{rel:60s} failed: {err[:120]}", flush=True)
                continue
            ours, theirs, comp = (float(x) for x in rows[-1].split()[1:])
            print(f"{rel:60s} {ours / 1e3:8.1f}K {theirs / 1e3:8.1f}K {ours / theirs:8.2f} "
                  f"{comp:7.1f}s", flush=True)
        except subprocess.TimeoutExpired:
            print(f"{rel:60s} timeout ({args.timeout} s)", flush=True)


if __name__ == "__main__":
    main()
