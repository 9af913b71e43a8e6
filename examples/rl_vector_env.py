"""A Gymnasium-style vector environment on simjax, and evolution strategies that learn it.

The task is Gymnasium's InvertedPendulum-v5 on its own MJCF file (from the model corpus,
``gym_inverted_pendulum/inverted_pendulum.xml``): a cart on a rail carrying a hinged
pole, one motor on the cart.

- observation: ``concat(qpos, qvel)`` = (cart position, pole angle, cart velocity,
  pole angular velocity), shape (4,);
- action: motor control in [-3, 3] (clipped), held for ``frame_skip = 2`` physics steps
  of 0.02 s (0.04 s per environment step);
- reward: 1 for every step that does not terminate (v5's ``int(not terminated)``);
- termination: any non-finite observation or |pole angle| > 0.2 rad; in addition a world
  the engine flags as diverged (a new bad-qpos/qvel/qacc count in ``Data.warning``; the
  engine resets it, at once for a bad qpos or qvel, at its next step for a bad qacc)
  terminates; truncation after ``max_episode_steps``;
- reset: qpos and qvel uniform in +-0.01 around the model's reference state.

Finished worlds are reset in the same ``step`` call (Gymnasium's "same-step" autoreset
mode): the returned observation is the first of the new episode and the last observation
of the finished one is in ``info["final_obs"]``. Everything runs as one jitted, vmapped
function over all worlds.

Constraints: the joint limits (slider +-1 m, hinge +-90 deg) are enforced as in MuJoCo
(soft constraints, the model's Newton solver).

Training: OpenAI-style evolution strategies (Salimans et al. 2017) with antithetic
sampling and centred-rank fitness shaping over a linear policy ``a = W obs + b``; one
jitted function evaluates the whole population (plus a batch of episodes of the current
policy) as batched episodes of fixed length and returns the updated parameters.

Run ``python examples/rl_vector_env.py [--short]``.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import simjax  # noqa: E402
from simjax.engine.data import WARN_BADQACC, WARN_BADQPOS, WARN_BADQVEL  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS_MODEL = os.path.normpath(os.path.join(
    ROOT, "..", "shared", "corpus", "gym_inverted_pendulum", "inverted_pendulum.xml"))
_DIVERGED = np.array([WARN_BADQPOS, WARN_BADQVEL, WARN_BADQACC])


class InvertedPendulum:
    """The pure functions of the task (no state of their own): reset, observe, step.

    ``model_path``: the MJCF file (default: the corpus copy of Gymnasium's model).
    """

    obs_size = 4
    action_size = 1
    action_low, action_high = -3.0, 3.0

    def __init__(self, model_path=CORPUS_MODEL, frame_skip=2, reset_noise=0.01,
                 angle_limit=0.2):
        if not os.path.exists(model_path):
            raise FileNotFoundError(f"model not found: {model_path}")
        self.model = simjax.load_model(model_path)
        self.frame_skip = frame_skip
        self.reset_noise = reset_noise
        self.angle_limit = angle_limit
        self.dt = frame_skip * float(self.model.opt.timestep)

    def reset(self, key):
        """A fresh world: qpos0 and zero velocity, each perturbed uniformly by +-noise."""
        m = self.model
        d = simjax.make_data(m)
        kq, kv = jax.random.split(key)
        lo, hi = -self.reset_noise, self.reset_noise
        qpos = d.qpos + jax.random.uniform(kq, (m.nq,), d.qpos.dtype, lo, hi)
        qvel = d.qvel + jax.random.uniform(kv, (m.nv,), d.qvel.dtype, lo, hi)
        return d.replace(qpos=qpos, qvel=qvel)

    @staticmethod
    def observe(d):
        return jnp.concatenate([d.qpos, d.qvel])

    def step(self, d, action):
        """Advance one environment step: (new data, obs, reward, terminated)."""
        u = jnp.clip(action, self.action_low, self.action_high).astype(d.ctrl.dtype)
        ctrl = jnp.broadcast_to(u, (self.frame_skip, self.model.nu))
        warn0 = d.warning[_DIVERGED].sum()
        _, d = simjax.rollout(self.model, d, ctrl, checkpoint=False, return_data=True)
        obs = self.observe(d)
        diverged = d.warning[_DIVERGED].sum() > warn0
        terminated = (~jnp.all(jnp.isfinite(obs)) | (jnp.abs(obs[1]) > self.angle_limit)
                      | diverged)
        reward = (~terminated).astype(obs.dtype)
        return d, obs, reward, terminated


class VectorEnv:
    """Gymnasium-style vector environment: ``num_envs`` worlds stepped in one jit call.

    ``reset(seed=None) -> (obs, info)``; ``step(actions) -> (obs, reward, terminated,
    truncated, info)`` with numpy arrays of leading size ``num_envs``; actions have shape
    (num_envs, 1). Same-step autoreset: see the module docstring. ``info`` holds
    ``final_obs`` (num_envs, 4), ``episode_return`` and ``episode_length`` (valid where
    the episode ended this step).
    """

    def __init__(self, num_envs, env=None, max_episode_steps=1000):
        self.env = env if env is not None else InvertedPendulum()
        self.num_envs = num_envs
        self.max_episode_steps = max_episode_steps
        self.single_observation_shape = (self.env.obs_size,)
        self.single_action_shape = (self.env.action_size,)
        # max_episode_steps is an argument of the compiled step, not a constant in it:
        # changing it later (e.g. for a test) reuses the compiled program
        self._step = jax.jit(jax.vmap(self._step_one, in_axes=(0, 0, None)))
        self._reset = jax.jit(jax.vmap(self._reset_one))
        self._state = None

    def _reset_one(self, key):
        key, sub = jax.random.split(key)
        d = self.env.reset(sub)
        zero = jnp.zeros((), d.qpos.dtype)
        return (d, jnp.zeros((), jnp.int32), zero, key), self.env.observe(d)

    def _step_one(self, state, action, max_episode_steps):
        d, t, ret, key = state
        d, obs, reward, terminated = self.env.step(d, action)
        t, ret = t + 1, ret + reward
        truncated = (t >= max_episode_steps) & ~terminated
        done = terminated | truncated
        (d0, t0, ret0, key), obs0 = self._reset_one(key)
        pick = lambda a, b: jax.tree_util.tree_map(lambda x, y: jnp.where(done, x, y), a, b)
        new_state = (pick(d0, d), jnp.where(done, t0, t), jnp.where(done, ret0, ret), key)
        info = dict(final_obs=obs, episode_return=ret, episode_length=t)
        return new_state, (jnp.where(done, obs0, obs), reward, terminated, truncated, info)

    def reset(self, seed=None):
        seed = 0 if seed is None else seed
        keys = jax.random.split(jax.random.PRNGKey(seed), self.num_envs)
        self._state, obs = self._reset(keys)
        return np.asarray(obs), {}

    def step(self, actions):
        if self._state is None:
            raise RuntimeError("call reset() before step()")
        actions = jnp.asarray(actions).reshape(self.num_envs, self.env.action_size)
        self._state, out = self._step(self._state, actions,
                                      np.int32(self.max_episode_steps))
        obs, reward, terminated, truncated, info = jax.device_get(out)
        return obs, reward, terminated, truncated, info


def random_policy_baseline(venv, nstep, seed=0):
    """Uniform random actions: mean return of finished episodes and env steps/s."""
    rng = np.random.default_rng(seed)
    venv.reset(seed=seed)
    act = lambda: rng.uniform(venv.env.action_low, venv.env.action_high,
                              (venv.num_envs, 1))
    venv.step(act())                                    # compile
    venv.reset(seed=seed)
    returns = []
    t0 = time.perf_counter()
    for _ in range(nstep):
        _, _, term, trunc, info = venv.step(act())
        done = term | trunc
        returns.extend(info["episode_return"][done].tolist())
    elapsed = time.perf_counter() - t0
    return float(np.mean(returns)), len(returns), venv.num_envs * nstep / elapsed


# --------------------------------------------------------------------------- ES
def make_es(env, npairs, neval, horizon, sigma, lr):
    """A jitted ES iteration ``(theta, adam_state, key) -> (theta, adam_state, stats)``.

    theta: (5,) = linear policy weights (4,) and bias. Episodes run ``horizon`` steps
    without reset (a terminated world stops collecting reward), so a return is the
    number of steps balanced, at most ``horizon``.
    """
    nparam = env.obs_size + 1

    def policy(theta, obs):
        return (obs @ theta[:-1] + theta[-1])[None]

    def episode_return(theta, key):
        d = env.reset(key)

        def body(carry, _):
            d, alive, ret = carry
            d, obs, reward, terminated = env.step(d, policy(theta, env.observe(d)))
            alive = alive & ~terminated
            return (d, alive, ret + jnp.where(alive, reward, 0.0)), None

        init = (d, jnp.ones((), bool), jnp.zeros((), d.qpos.dtype))
        (_, _, ret), _ = jax.lax.scan(body, init, None, length=horizon)
        return ret

    def iteration(theta, adam, key):
        keps, kenv = jax.random.split(key)
        eps = jax.random.normal(keps, (npairs, nparam), theta.dtype)
        pop = jnp.concatenate([theta + sigma * eps, theta - sigma * eps,
                               jnp.broadcast_to(theta, (neval, nparam))])
        keys = jax.random.split(kenv, 2 * npairs + neval)
        # Antithetic pairs share their reset noise (common random numbers).
        keys = keys.at[npairs:2 * npairs].set(keys[:npairs])
        ret = jax.vmap(episode_return)(pop, keys)
        r_eval = ret[2 * npairs:]
        ranks = jnp.argsort(jnp.argsort(ret[:2 * npairs])).astype(theta.dtype)
        shaped = ranks / (2 * npairs - 1) - 0.5               # centred ranks in [-.5, .5]
        grad = (shaped[:npairs] - shaped[npairs:]) @ eps / (2 * npairs * sigma)
        theta, adam = adam_update(theta, -grad, adam, lr)     # ascend the return
        return theta, adam, dict(mean_eval=r_eval.mean(), mean_pop=ret[:2 * npairs].mean())

    return jax.jit(iteration)


def adam_update(x, g, state, lr, b1=0.9, b2=0.999, eps=1e-8):
    """One Adam step (Kingma & Ba 2015) on ``x`` with gradient ``g``; state = (m, v, t)."""
    m, v, t = state
    t = t + 1
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    mhat, vhat = m / (1 - b1 ** t), v / (1 - b2 ** t)
    return x - lr * mhat / (jnp.sqrt(vhat) + eps), (m, v, t)


def main(short=False, model_path=CORPUS_MODEL, seed=0):
    """Throughput of the random policy, then ES training. Returns the measured results
    and the vector environment (``venv``, compiled for its batch size)."""
    env = InvertedPendulum(model_path)
    nenv, nstep_random = (64, 50) if short else (1024, 200)
    horizon, iters = (100, 25) if short else (1000, 60)
    npairs, neval = (24, 16) if short else (32, 16)

    venv = VectorEnv(nenv, env, max_episode_steps=horizon)
    t0 = time.perf_counter()
    random_return, nepisodes, sps = random_policy_baseline(venv, nstep_random, seed)
    print(f"random policy: mean return {random_return:.2f} over {nepisodes} episodes; "
          f"{sps:,.0f} env steps/s ({sps * env.frame_skip:,.0f} physics steps/s) with "
          f"{nenv} worlds on {jax.devices()[0].platform} "
          f"(incl. compile: {time.perf_counter() - t0:.1f} s)")

    es = make_es(env, npairs, neval, horizon, sigma=0.3, lr=0.3)
    dtype = simjax.make_data(env.model).qpos.dtype
    theta = jnp.zeros(env.obs_size + 1, dtype)
    adam = (jnp.zeros_like(theta), jnp.zeros_like(theta), jnp.zeros((), dtype))
    key = jax.random.PRNGKey(seed)
    curve = []
    t0 = time.perf_counter()
    for it in range(iters):
        key, sub = jax.random.split(key)
        theta, adam, stats = es(theta, adam, sub)
        curve.append(float(stats["mean_eval"]))
        print(f"ES iter {it:3d}: return of current policy {curve[-1]:7.1f} "
              f"(population mean {float(stats['mean_pop']):7.1f}) "
              f"[{time.perf_counter() - t0:.1f} s]")
    episodes = iters * (2 * npairs + neval)
    print(f"ES: {episodes} episodes of up to {horizon} steps in "
          f"{time.perf_counter() - t0:.1f} s (incl. compile); final return "
          f"{curve[-1]:.1f} / {horizon} vs random {random_return:.1f}")
    return dict(random_return=random_return, random_episodes=nepisodes,
                env_steps_per_s=sps, horizon=horizon, es_curve=curve,
                initial_return=curve[0], final_return=curve[-1],
                theta=np.asarray(theta).tolist(), venv=venv)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--short", action="store_true", help="small, fast settings")
    p.add_argument("--model", default=CORPUS_MODEL, help="MJCF file of the task")
    a = p.parse_args()
    main(short=a.short, model_path=a.model)
