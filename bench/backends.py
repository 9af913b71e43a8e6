"""The three simulators the benchmark compares, behind one small interface.

Every backend is built for one (model, batch size, rollout length) and offers:

- ``compile()``: seconds to trace and compile the batched rollout (0 for MuJoCo C);
- ``run()``: seconds for one batched rollout of ``nstep`` steps (state carried over
  between calls, so repeated calls measure steady state);
- ``compile_grad()`` / ``run_grad()``: the same for value-and-gradient of a loss on the
  final state of an ``nstep`` rollout with respect to the initial velocities
  (simjax and MJX; MuJoCo C has no reverse mode); every step is rematerialised
  (``jax.checkpoint``), so the backward pass keeps one state per step, not every
  intermediate of the step;
- ``memory()``: bytes the backend needs for the batch: for XLA the compiled program's
  arguments + outputs + temporaries (``Compiled.memory_analysis``); for MuJoCo C the
  MjData of each thread plus the state and control arrays; ``memory_grad()`` the same
  for the compiled gradient program.

All backends start every world from the same perturbed states (seeded), with the same
constant random controls, in float32 for the JAX backends (JAX's default).
"""
from __future__ import annotations

import os
import time

import numpy as np


def _states(mjm, batch, seed=0):
    """(batch, nq), (batch, nv), (batch, nu): perturbed qpos0, small qvel, controls."""
    import mujoco
    rng = np.random.default_rng(seed)
    qpos = np.tile(mjm.qpos0, (batch, 1))
    qvel = 0.05 * rng.standard_normal((batch, mjm.nv))
    for j in range(mjm.njnt):
        t, a = mjm.jnt_type[j], mjm.jnt_qposadr[j]
        if t in (mujoco.mjtJoint.mjJNT_HINGE, mujoco.mjtJoint.mjJNT_SLIDE):
            qpos[:, a] += 0.02 * rng.standard_normal(batch)
    lo, hi = mjm.actuator_ctrlrange[:, 0], mjm.actuator_ctrlrange[:, 1]
    lim = mjm.actuator_ctrllimited.astype(bool)
    u = rng.uniform(-1, 1, (batch, mjm.nu))
    ctrl = np.where(lim, lo + (u + 1) * 0.5 * (hi - lo), u)
    return qpos, qvel, ctrl


def _timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _block(tree):
    import jax
    return jax.tree_util.tree_map(lambda x: x.block_until_ready(), tree)


def _xla_bytes(compiled):
    try:
        mem = compiled.memory_analysis()
        return int(mem.argument_size_in_bytes + mem.output_size_in_bytes +
                   mem.temp_size_in_bytes)
    except Exception:        # memory analysis is optional in XLA backends
        return None


class MuJoCoC:
    """MuJoCo C through ``mujoco.rollout`` with one MjData per CPU thread."""

    name = "mujoco"

    def __init__(self, mjm, batch, nstep):
        import mujoco
        from mujoco import rollout
        self._rollout = rollout
        self.mjm, self.batch, self.nstep = mjm, batch, nstep
        self.nthread = os.cpu_count() or 1
        self.datas = [mujoco.MjData(mjm) for _ in range(self.nthread)]
        qpos, qvel, ctrl = _states(mjm, batch)
        spec = mujoco.mjtState.mjSTATE_FULLPHYSICS
        d = mujoco.MjData(mjm)
        state = np.empty((batch, mujoco.mj_stateSize(mjm, spec)))
        for i in range(batch):
            d.qpos[:], d.qvel[:] = qpos[i], qvel[i]
            mujoco.mj_getState(mjm, d, state[i], spec)
        self.state0 = state
        self.ctrl = np.repeat(ctrl[:, None, :], nstep, axis=1)
        self.out = np.empty((batch, nstep, state.shape[1]))

    def compile(self):
        return 0.0

    def run(self):
        # single-step sensordata is not needed: skip it by passing no sensor output
        return _timed(lambda: self._rollout.rollout(
            self.mjm, self.datas, self.state0, self.ctrl, state=self.out,
            persistent_pool=True))

    def memory(self):
        # each MjData holds a buffer and an arena sized by the model (nbuffer, narena)
        data_bytes = int(self.mjm.narena + self.mjm.nbuffer)
        return (self.nthread * data_bytes + self.state0.nbytes + self.ctrl.nbytes +
                self.out.nbytes)


class _JaxBackend:
    """Shared plumbing of the two JAX backends: batched rollouts and their gradient."""

    def _setup(self, step, model, data0, nstep):
        import jax
        import jax.numpy as jnp

        def roll(d):
            return jax.lax.fori_loop(0, nstep, lambda i, d: step(model, d), d)

        def roll_remat(d):
            one = jax.checkpoint(lambda d: step(model, d))
            return jax.lax.fori_loop(0, nstep, lambda i, d: one(d), d)

        def loss(qvel, d):
            d = roll_remat(d.replace(qvel=qvel))
            return jnp.sum(d.qpos ** 2) + jnp.sum(d.qvel ** 2)

        grad_one = jax.value_and_grad(loss)
        self._roll = jax.jit(jax.vmap(roll))
        self._grad = jax.jit(jax.vmap(grad_one))
        self.data = data0
        self._compiled = self._compiled_grad = None

    def compile(self):
        t0 = time.perf_counter()
        self._compiled = self._roll.lower(self.data).compile()
        return time.perf_counter() - t0

    def compile_step(self, step, model, data=None):
        """Seconds to compile one batched step (the figure users wait for), over
        ``data`` (default: the whole batch)."""
        import jax
        t0 = time.perf_counter()
        jax.jit(jax.vmap(lambda d: step(model, d))).lower(
            self.data if data is None else data).compile()
        return time.perf_counter() - t0

    def run(self):
        def go():
            self.data = _block(self._compiled(self.data))
        return _timed(go)

    def compile_grad(self):
        t0 = time.perf_counter()
        self._compiled_grad = self._grad.lower(self.data.qvel, self.data).compile()
        return time.perf_counter() - t0

    def run_grad(self):
        return _timed(lambda: _block(self._compiled_grad(self.data.qvel, self.data)))

    def memory(self):
        return _xla_bytes(self._compiled) if self._compiled is not None else None

    def memory_grad(self):
        return _xla_bytes(self._compiled_grad) if self._compiled_grad is not None else None


class SimJax(_JaxBackend):
    """simjax: our compiler, ``simjax.step`` under jit + vmap.

    ``threads``: the batch is cut into that many chunks, stepped at once from threads
    (``simjax.rollout``'s ``concurrent``, as ``simjax.rollout_batch`` does on CPU); the
    state stays cut between calls, as a training loop would keep it. None: the count
    ``rollout_batch`` would take (``auto_threads``: the usable cores on CPU, 1 on a
    GPU). The compile is that of one chunk's program, the memory that of one chunk's
    program times the chunks (they run at once); the same for the gradient.
    """

    name = "simjax"

    def __init__(self, mjm, batch, nstep, path, disableflags, threads=1):
        import jax
        import jax.numpy as jnp

        import simjax
        model = simjax.load_model(path)
        if disableflags:
            model = model.replace(opt=model.opt.replace(
                disableflags=model.opt.disableflags | disableflags))
        qpos, qvel, ctrl = _states(mjm, batch)
        d0 = simjax.make_data(model)
        data = jax.vmap(lambda q, v, u: d0.replace(qpos=q, qvel=v, ctrl=u))(
            jnp.asarray(qpos, d0.qpos.dtype), jnp.asarray(qvel, d0.qpos.dtype),
            jnp.asarray(ctrl, d0.qpos.dtype))
        self.model = model
        self._setup(simjax.step, model, data, nstep)
        from simjax.rollout import chunk_count
        self.threads = chunk_count(batch, data, threads)
        self.data = data            # cut into the chunks (one for threads=1)

    @property
    def data(self):
        """The batch's state, joined from the chunks that each call steps at once."""
        from simjax.rollout import concat_batch
        return concat_batch(self.chunks)

    @data.setter
    def data(self, value):
        from simjax.rollout import split_batch
        self.chunks = split_batch(value, getattr(self, "threads", 1))

    def compile(self):
        t0 = time.perf_counter()
        self._compiled = self._roll.lower(self.chunks[0]).compile()
        return time.perf_counter() - t0

    def run(self):
        from simjax.rollout import concurrent

        def go():
            self.chunks = concurrent(self._compiled, [(c,) for c in self.chunks])
        return _timed(go)

    def memory(self):
        one = super().memory()
        return None if one is None else one * self.threads

    def compile_grad(self):
        t0 = time.perf_counter()
        c = self.chunks[0]
        self._compiled_grad = self._grad.lower(c.qvel, c).compile()
        return time.perf_counter() - t0

    def run_grad(self):
        from simjax.rollout import concurrent
        return _timed(lambda: concurrent(self._compiled_grad,
                                         [(c.qvel, c) for c in self.chunks]))

    def memory_grad(self):
        one = super().memory_grad()
        return None if one is None else one * self.threads

    def compile_step(self):
        import simjax
        # the program stepping one chunk, as the rollout's
        return super().compile_step(simjax.step, self.model, self.chunks[0])


class MJX(_JaxBackend):
    """MuJoCo XLA (mujoco-mjx), ``mjx.step`` under jit + vmap."""

    name = "mjx"

    def __init__(self, mjm, batch, nstep):
        import jax
        import jax.numpy as jnp
        from mujoco import mjx
        model = mjx.put_model(mjm)
        qpos, qvel, ctrl = _states(mjm, batch)
        d0 = mjx.make_data(model)
        data = jax.vmap(lambda q, v, u: d0.replace(qpos=q, qvel=v, ctrl=u))(
            jnp.asarray(qpos, jnp.float32), jnp.asarray(qvel, jnp.float32),
            jnp.asarray(ctrl, jnp.float32))
        self.model = model
        self._setup(mjx.step, model, data, nstep)

    def compile_step(self):
        from mujoco import mjx
        return super().compile_step(mjx.step, self.model)
