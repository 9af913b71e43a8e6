"""examples/system_id.py in short mode: masses and damping recovered from a trajectory."""
import numpy as np

import system_id


def test_identifies_masses_and_damping():
    r = system_id.main(short=True)
    # Start 40-200% off; stated margin: every parameter within 0.1% of the truth after
    # 12 Levenberg-Marquardt iterations (noise-free recording, float64).
    assert np.all(r["initial_rel_err"] > 0.39)
    assert np.all(r["rel_err"] < 1e-3), dict(zip(r["names"], r["rel_err"]))
    assert r["losses"][-1] < 1e-8 * r["losses"][0]
