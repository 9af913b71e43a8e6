"""examples/domain_randomization.py in short mode."""
import numpy as np

import domain_randomization


def test_short_run():
    """One short run (about 8 s), checked three ways: one test, so that pytest-xdist's
    workers do not each run it (as they would a module fixture shared by several)."""
    result = domain_randomization.main(short=True)
    _parameters_randomised(result)
    _worlds_differ_as_expected(result)
    _batched_matches_single_model_rollouts(result)


def _parameters_randomised(result):
    scale = result["mass_scale"][:, 1:]
    assert scale.min() >= 0.5 - 1e-12 and scale.max() <= 2.0 + 1e-12
    assert np.std(scale[:, 0]) > 0.1 and np.std(result["damping"][:, 0]) > 0.05


def _worlds_differ_as_expected(result):
    # Same start and controls: outcomes differ only through the physics parameters.
    assert np.std(result["x_final"]) > 0.01 and np.std(result["angle_final"]) > 0.1
    # Early cart displacement follows 1 / (m_cart + m_pole / 4) (pushed rod-on-cart).
    assert result["corr_inv_mass_push"] > 0.95, result["corr_inv_mass_push"]


def _batched_matches_single_model_rollouts(result):
    # One vmapped program over Model leaves equals per-world programs (float64).
    assert result["single_model_max_err"] < 1e-12
