"""The simjax command: info, rollout (+ .npz), plot."""
import os
import subprocess
import sys

import mujoco
import numpy as np
import pytest

from simjax.cli import _initial_batch, main

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CARTPOLE = os.path.join(ROOT, "models", "cartpole.xml")

# A cart-pole with the default (semi-implicit) Euler integrator and no constraints:
# the rollout compiles in a few seconds, unlike models/cartpole.xml (RK4 and a limit).
CART = """
<mujoco model="cart">
  <option timestep="0.01"><flag contact="disable"/></option>
  <worldbody>
    <body name="cart">
      <joint name="slider" type="slide" axis="1 0 0" damping="0.1"/>
      <geom type="box" size="0.2 0.1 0.05" mass="1"/>
      <body name="pole">
        <joint name="hinge" type="hinge" axis="0 1 0"/>
        <geom type="capsule" fromto="0 0 0 0 0 0.6" size="0.03" mass="0.5"/>
      </body>
    </body>
  </worldbody>
  <actuator><motor joint="slider" gear="10" ctrlrange="-1 1"/></actuator>
  <sensor><jointpos joint="hinge"/></sensor>
</mujoco>
"""


def test_info(capsys):
    assert main(["info", CARTPOLE]) == 0
    out = capsys.readouterr().out
    assert "nq" in out and "integrator" in out and "RK4" in out


def test_rollout_writes_trajectory_and_plot(tmp_path, capsys):
    xml = tmp_path / "cart.xml"
    xml.write_text(CART)
    out = tmp_path / "traj.npz"
    # 30 steps in two chunks of 15: one compiled program, called twice
    import jax
    cache_dir = jax.config.jax_compilation_cache_dir
    assert main(["rollout", str(xml), "--batch", "3", "--steps", "30", "--chunk", "15",
                 "--ctrl", "random", "--out", str(out), "--no-compile-cache"]) == 0
    assert jax.config.jax_compilation_cache_dir == cache_dir    # left as it was
    z = np.load(out)
    assert z["qpos"].shape == (30, 3, 2) and z["qvel"].shape == (30, 3, 2)
    assert z["ctrl"].shape == (30, 3, 1) and z["sensordata"].shape == (30, 3, 1)
    dt = float(z["timestep"])
    np.testing.assert_allclose(z["time"][:, 0], dt * np.arange(1, 31), rtol=1e-12)
    # sensors are evaluated before the integration (as in mj_step): one record behind
    np.testing.assert_array_equal(z["sensordata"][1:, :, 0], z["qpos"][:-1, :, 1])
    # worlds start from different perturbations, controls differ, and they move
    assert np.ptp(z["qpos"][0, :, 1]) > 0 and np.ptp(z["ctrl"][0, :, 0]) > 0
    assert np.all(np.abs(z["ctrl"]) <= 1)
    assert np.all(np.abs(z["qpos"][-1] - z["qpos"][0]) > 0)
    # every world against MuJoCo C from the same start with the recorded controls,
    # across the chunk boundary (float64: agreement to rounding)
    import simjax
    d0 = _initial_batch(simjax.load_model(str(xml)), 3, seed=0, noise=0.01)
    mjm = mujoco.MjModel.from_xml_string(CART)
    mjd = mujoco.MjData(mjm)
    for w in range(3):
        mujoco.mj_resetData(mjm, mjd)
        mjd.qpos[:], mjd.qvel[:] = np.asarray(d0.qpos[w]), np.asarray(d0.qvel[w])
        for k in range(30):
            mjd.ctrl[:] = z["ctrl"][k, w]
            mujoco.mj_step(mjm, mjd)
            np.testing.assert_allclose(z["qpos"][k, w], mjd.qpos, rtol=0, atol=1e-10)
            np.testing.assert_allclose(z["qvel"][k, w], mjd.qvel, rtol=0, atol=1e-9)
            np.testing.assert_allclose(z["sensordata"][k, w], mjd.sensordata, rtol=0,
                                       atol=1e-10)
    # the batch as three chunks stepped at once from threads: the same trajectories
    out3 = tmp_path / "traj3.npz"
    assert main(["rollout", str(xml), "--batch", "3", "--steps", "30", "--chunk", "15",
                 "--ctrl", "random", "--out", str(out3), "--no-compile-cache",
                 "--threads", "3"]) == 0
    z3 = np.load(out3)
    for k in ("qpos", "qvel", "ctrl", "sensordata", "time"):
        np.testing.assert_allclose(z3[k], z[k], rtol=0, atol=1e-12)
    with pytest.raises(SystemExit, match="must be positive and divide the batch size 3"):
        main(["rollout", str(xml), "--batch", "3", "--steps", "2", "--threads", "2",
              "--no-compile-cache"])
    png = tmp_path / "traj.png"
    assert main(["plot", str(out), "--out", str(png)]) == 0
    assert png.stat().st_size > 1000
    assert "steps/s" in capsys.readouterr().out


def _run_cli(args, env):
    r = subprocess.run([sys.executable, "-m", "simjax.cli"] + args, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    return r


def test_rollout_compile_cache(tmp_path):
    """The rollout's compiled program goes to the cache directory on the first run and
    is read back on the second (a fresh process each), with the same trajectory."""
    xml = tmp_path / "cart.xml"
    xml.write_text(CART)
    cache = tmp_path / "cache"
    # cache every program, however quick its compile (JAX's default minimum is 1 s)
    env = dict(os.environ, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
    args = ["rollout", str(xml), "--batch", "2", "--steps", "10", "--chunk", "10",
            "--compile-cache", str(cache)]
    _run_cli(args + ["--out", str(tmp_path / "a.npz")], env)
    first = sorted(os.listdir(cache))
    assert any(f.startswith("jit_advance") for f in first), first
    mtimes = {f: os.stat(cache / f).st_mtime_ns for f in first}
    _run_cli(args + ["--out", str(tmp_path / "b.npz")], env)
    # nothing recompiled: no new entry, and the rollout's entry was not rewritten
    assert sorted(os.listdir(cache)) == first
    adv = [f for f in first if f.startswith("jit_advance")][0]
    assert os.stat(cache / adv).st_mtime_ns == mtimes[adv]
    a, b = np.load(tmp_path / "a.npz"), np.load(tmp_path / "b.npz")
    np.testing.assert_array_equal(a["qpos"], b["qpos"])
