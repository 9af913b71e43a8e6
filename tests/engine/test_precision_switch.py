"""Switching one process from float64 to float32 (and back) between steps.

JAX caches the conversion of a numpy array used in a trace by the array object, not by
the precision mode, and simjax reuses its static numpy arrays (Model structure, cached
index tables) across traces; without ``tables.precision_guard`` the first float32 trace
after a float64 one failed with "lax.add requires arguments to have the same dtypes, got
int64, int32". The check runs in a fresh interpreter because it flips the process-wide
``jax_enable_x64`` flag.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import jax
    import numpy as np
    import simjax

    XML = '''
    <mujoco>
      <option solver="{solver}" noslip_iterations="{noslip}"/>
      <worldbody>
        {floor}
        <body pos=".5 0 .3">
          <joint type="hinge" axis="0 1 0" range="-20 20" frictionloss=".1"/>
          <geom type="capsule" fromto="0 0 0 .2 0 0" size=".03"/>
        </body>
      </worldbody>
    </mujoco>'''

    def run():
        m = simjax.load_model(XML)
        d = simjax.make_data(m)
        d = d.replace(qvel=d.qvel.at[-1].set(3.0))
        step = jax.jit(simjax.step)
        for _ in range(5):
            d = step(m, d)
        return np.asarray(d.qpos), d.qpos.dtype, int(d.ncon)

    out = []
    for x64 in {modes}:
        jax.config.update("jax_enable_x64", x64)
        q, dtype, ncon = run()
        assert dtype == (np.float64 if x64 else np.float32), dtype
        assert (ncon > 0) == bool({contacts}) and np.all(np.isfinite(q))
        out.append(q)
    err = np.abs(out[1] - out[0]).max()
    assert err < 1e-4, err
    for a, b in zip(out, out[2:]):
        assert np.array_equal(a, b)
    print("ok", err)
""")


FLOOR = ('<geom type="plane" size="2 2 .1"/>'
         '<body pos="0 0 .09"><freejoint/><geom type="box" size=".1 .1 .1"/></body>')


def _run(**kw):
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""),
               JAX_PLATFORMS="cpu")
    res = subprocess.run([sys.executable, "-c", SCRIPT.format(**kw)],
                         cwd=root, env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.startswith("ok")


@pytest.mark.slow                      # a fresh process and two step compilations
def test_float64_then_float32_in_one_process():
    """One hinge with a limit and friction loss, no contacts (the stale index arrays
    were in kinematics, the first stage); one small compilation per precision."""
    _run(solver="Newton", noslip=0, floor="", contacts=0, modes=(True, False))


@pytest.mark.slow                      # four step compilations with contacts
def test_precision_switch_contacts_pgs_noslip():
    _run(solver="PGS", noslip=3, floor=FLOOR, contacts=1, modes=(True, False, True, False))
