"""examples/rl_vector_env.py in short mode: the vector env and ES learning balance."""
import numpy as np

from mujoco_oracle import corpus_path

import rl_vector_env


def test_short_run():
    """One short training run (about 40 s), checked three ways. One test, not three
    sharing a module fixture: pytest-xdist gives each of its workers that gets one of
    such tests its own run of the fixture."""
    path = corpus_path("gym_inverted_pendulum/inverted_pendulum.xml")
    result = rl_vector_env.main(short=True, model_path=path)
    _random_policy_baseline(result)
    _es_learns_balance(result)
    _autoreset_on_termination_and_nan(result)


def _random_policy_baseline(result):
    # A random policy drops the pole within a few 0.04 s steps (Gymnasium: ~5-10).
    assert 1.0 < result["random_return"] < 20.0
    assert result["random_episodes"] > 100
    assert result["env_steps_per_s"] > 0


def _es_learns_balance(result):
    # Stated margin: after 25 ES iterations (the short mode's) the current policy
    # balances at least half of the 100-step episode on average, and 5x longer than the
    # random policy (seed 0: the whole episode from the 16th iteration on).
    assert result["final_return"] >= 50.0, result["es_curve"]
    assert result["final_return"] >= 5 * result["random_return"], result
    assert np.isfinite(result["theta"]).all()


def _autoreset_on_termination_and_nan(result):
    # The vector env of the run above (64 worlds, its step already compiled), with a
    # 3-step episode limit: max_episode_steps is an argument of the compiled step.
    venv = result["venv"]
    venv.max_episode_steps = 3
    obs, _ = venv.reset(seed=1)
    n = venv.num_envs
    assert obs.shape == (n, 4) and np.all(np.abs(obs) <= 0.01 + 1e-12)
    # World 1 gets a NaN velocity (diverges), world 2 a large pole angle (terminates).
    d, t, ret, key = venv._state
    venv._state = (d.replace(qvel=d.qvel.at[1, 1].set(np.nan),
                             qpos=d.qpos.at[2, 1].set(0.5)), t, ret, key)
    obs, rew, term, trunc, info = venv.step(np.zeros((n, 1)))
    np.testing.assert_array_equal(term[:4], [False, True, True, False])
    np.testing.assert_array_equal(rew[:4], [1, 0, 0, 1])
    assert not term[4:].any() and not trunc.any()
    assert np.all(np.abs(obs[1:3]) <= 0.01 + 1e-12)       # reset in the same step
    assert abs(info["final_obs"][2, 1]) > 0.2
    for _ in range(2):
        obs, rew, term, trunc, info = venv.step(np.zeros((n, 1)))
    # Worlds 0 and 3 reach max_episode_steps = 3: truncated, not terminated.
    np.testing.assert_array_equal(trunc[:4], [True, False, False, True])
    np.testing.assert_array_equal(info["episode_length"][[0, 3]], [3, 3])
    np.testing.assert_array_equal(info["episode_return"][[0, 3]], [3, 3])
    assert np.all(trunc[4:] == ~term[4:])            # the untouched worlds end together
