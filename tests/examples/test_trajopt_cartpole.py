"""examples/trajopt_cartpole.py in short mode: gradient descent through rollout."""
import os

import numpy as np
import pytest

import trajopt_cartpole


def test_swing_up_cost_drops(tmp_path):
    png = str(tmp_path / "trajopt.png")
    r = trajopt_cartpole.main(short=True, png=png)
    # Stated margin: 120 Adam steps lower the swing-up cost at least 3x (short mode:
    # Euler, no constraints; 3.9x measured in float64).
    assert r["final_cost"] < r["initial_cost"] / 3, r["costs"][::10]
    assert np.all(np.isfinite(r["costs"]))
    assert r["max_abs_ctrl"] <= 1.0                    # tanh keeps ctrl in ctrlrange
    assert r["max_abs_cart"] < 2.0                     # inside the (disabled) slider range
    if r["plot"] is not None:
        assert os.path.getsize(png) > 10_000



@pytest.mark.slow   # a fresh float32 process compiling the short program (~15-60 s)
def test_swing_up_cost_drops_in_float32():
    """The same problem in float32, simjax's default precision, in its own process (the
    suite runs in float64): the cost drops too; float32 and float64 start from the same
    controls (3.9x measured)."""
    import json
    import subprocess
    import sys
    code = ("import json, trajopt_cartpole as t; r = t.main(short=True, png=''); "
            "print(json.dumps([r['initial_cost'], r['final_cost']]))")
    env = dict(os.environ, JAX_ENABLE_X64="0")
    here = os.path.dirname(trajopt_cartpole.__file__)
    out = subprocess.run([sys.executable, "-c", code], cwd=here, env=env, check=True,
                         capture_output=True, text=True).stdout
    first, last = json.loads(out.strip().splitlines()[-1])
    assert last < first / 3, (first, last)
