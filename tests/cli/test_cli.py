"""The simjax command: info, rollout (+ .npz), plot."""
import os

import numpy as np

from simjax.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CARTPOLE = os.path.join(ROOT, "models", "cartpole.xml")


def test_info(capsys):
    assert main(["info", CARTPOLE]) == 0
    out = capsys.readouterr().out
    assert "nq" in out and "integrator" in out


def test_rollout_writes_trajectory_and_plot(tmp_path, capsys):
    out = tmp_path / "traj.npz"
    assert main(["rollout", CARTPOLE, "--batch", "3", "--steps", "30", "--chunk", "20",
                 "--ctrl", "random", "--out", str(out)]) == 0
    z = np.load(out)
    assert z["qpos"].shape == (30, 3, 2) and z["qvel"].shape == (30, 3, 2)
    assert z["ctrl"].shape == (30, 3, 1)
    dt = float(z["timestep"])
    np.testing.assert_allclose(z["time"][:, 0], dt * np.arange(1, 31), rtol=1e-5)
    # worlds start from different perturbations and move
    assert np.ptp(z["qpos"][0, :, 1]) > 0
    assert np.all(np.abs(z["qpos"][-1] - z["qpos"][0]) > 0)
    # chunks continue one another: position increments follow the velocities (RK4:
    # the trapezoid rule holds to O(dt^2))
    q, v = z["qpos"][:, 0, 1], z["qvel"][:, 0, 1]
    np.testing.assert_allclose(q[1:] - q[:-1], dt * (v[1:] + v[:-1]) / 2,
                               atol=0.05 * dt * np.abs(v).max())
    png = tmp_path / "traj.png"
    assert main(["plot", str(out), "--out", str(png)]) == 0
    assert png.stat().st_size > 1000
    assert "steps/s" in capsys.readouterr().out
