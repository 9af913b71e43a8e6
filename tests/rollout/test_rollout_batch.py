"""rollout_batch: batched rollouts equal per-world rollouts; device sharding on CPU.

The sharded case runs in a subprocess because XLA's host device count is fixed when jax
initialises (``--xla_force_host_platform_device_count=4``).
"""
import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import simjax

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CARTPOLE = os.path.join(ROOT, "models", "cartpole.xml")


def _euler_cartpole():
    """models/cartpole.xml with the Euler integrator (RK4 quadruples compile time; the
    batching logic does not depend on the integrator)."""
    m = simjax.load_model(CARTPOLE)
    return m.replace(opt=m.opt.replace(integrator=simjax.IntegratorType.EULER))


def _inputs(m, nbatch, nstep, seed=0):
    rng = np.random.default_rng(seed)
    d0 = simjax.make_data(m)
    q = jnp.asarray(0.3 * rng.standard_normal((nbatch, m.nq)), d0.qpos.dtype)
    data = jax.vmap(lambda q: d0.replace(qpos=q))(q)
    ctrl = jnp.asarray(rng.uniform(-1, 1, (nbatch, nstep, m.nu)), d0.qpos.dtype)
    return data, ctrl


def test_batch_matches_single_world_rollouts():
    m = _euler_cartpole()
    data, ctrl = _inputs(m, 3, 15)
    traj, final = simjax.rollout_batch(m, data, ctrl, return_data=True)
    assert traj.qpos.shape == (3, 15, m.nq)
    single = jax.jit(simjax.rollout)
    for i in range(3):
        ref = single(m, jax.tree_util.tree_map(lambda x: np.asarray(x)[i], data), ctrl[i])
        np.testing.assert_allclose(traj.qpos[i], ref.qpos, rtol=0, atol=1e-12)
        np.testing.assert_allclose(traj.qvel[i], ref.qvel, rtol=0, atol=1e-12)
    np.testing.assert_allclose(final.qpos, traj.qpos[:, -1], rtol=0, atol=0)


def test_argument_errors():
    m = _euler_cartpole()
    data, ctrl = _inputs(m, 3, 4)
    with pytest.raises(ValueError, match="ctrl must be"):
        simjax.rollout_batch(m, data, ctrl[0])
    # controls for another number of actuators: named as the ctrl argument's shape
    with pytest.raises(ValueError, match=rf"ctrl must be \(B=3, nstep, nu={m.nu}\)"):
        simjax.rollout_batch(m, data, jnp.concatenate([ctrl, ctrl], -1))
    one = jax.tree_util.tree_map(lambda x: x[0], data)
    for bad in (ctrl[0, :, 0], jnp.concatenate([ctrl[0], ctrl[0]], -1)):
        with pytest.raises(ValueError, match=rf"rollout: ctrl must be \(nstep, "
                                             rf"nu={m.nu}\)"):
            simjax.rollout(m, one, bad)
    with pytest.raises(ValueError, match="needs ctrl or nstep"):
        simjax.rollout_batch(m, data)
    with pytest.raises(ValueError, match="not a multiple"):
        simjax.rollout_batch(m, data, ctrl, devices=jax.devices() * 2)
    with pytest.raises(ValueError, match="leading batch"):
        simjax.rollout_batch(m, simjax.make_data(m), nstep=4)


_SHARDED = textwrap.dedent("""
    import json, os, sys
    import jax
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp, numpy as np
    sys.path.insert(0, os.environ["TEST_DIR"])
    from test_rollout_batch import _euler_cartpole, _inputs
    import simjax
    m = _euler_cartpole()
    data, ctrl = _inputs(m, 8, 12)
    axes = jax.tree_util.tree_map(lambda _: None, m).replace(body_mass=0)
    scale = jnp.linspace(0.5, 2.0, 8)[:, None]
    mb = m.replace(body_mass=jnp.asarray(m.body_mass)[None] * scale)
    ref = simjax.rollout_batch(mb, data, ctrl, model_axes=axes)
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("worlds",))
    out = simjax.rollout_batch(mb, data, ctrl, model_axes=axes, devices=mesh)
    def shards(x):
        return sorted((s.device.id, s.data.shape[0]) for s in x.addressable_shards)
    print(json.dumps(dict(
        ndev=len(jax.devices()),
        err=float(jnp.max(jnp.abs(out.qpos - ref.qpos))),
        err_vel=float(jnp.max(jnp.abs(out.qvel - ref.qvel))),
        spread=float(jnp.max(jnp.abs(out.qpos[0, -1] - out.qpos[-1, -1]))),
        spec=str(out.qpos.sharding.spec),
        shards=shards(out.qpos), shards_vel=shards(out.qvel))))
""")


@pytest.mark.slow          # a fresh 4-device process compiling the rollout (~60 s)
def test_sharded_over_four_cpu_devices():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4",
               JAX_PLATFORMS="cpu", TEST_DIR=os.path.dirname(os.path.abspath(__file__)),
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    res = subprocess.run([sys.executable, "-c", _SHARDED], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    r = json.loads(res.stdout.strip().splitlines()[-1])
    assert r["ndev"] == 4
    # Same program per world on each device: results equal the unsharded batch.
    assert r["err"] < 1e-12 and r["err_vel"] < 1e-12, r
    # Batched body masses change the outcome (the Model axis really is per world).
    assert r["spread"] > 1e-3, r
    # 8 worlds over 4 devices: 2 per device, batch axis partitioned.
    assert r["spec"] == "P('worlds',)", r
    assert r["shards"] == [[0, 2], [1, 2], [2, 2], [3, 2]] == r["shards_vel"], r


def test_mesh_argument():
    from simjax.rollout import _mesh
    devs = jax.devices()
    mesh = _mesh(devs)
    assert mesh.axis_names == ("batch",) and mesh.devices.size == len(devs)
    assert _mesh(mesh) is mesh
    with pytest.raises(ValueError, match="1-D mesh"):
        _mesh(jax.sharding.Mesh(np.array(devs).reshape(1, -1), ("a", "b")))


# ------------------------------------------------------- chunks stepped at once (CPU)
from simjax.rollout import (MIN_CHUNK, auto_threads, concat_batch,  # noqa: E402
                            concurrent, split_batch)


def test_threads_match_one_program():
    """The batch cut into chunks stepped at once from threads gives the values of one
    program over the whole batch (each world's arithmetic is its own), with batched
    Model leaves cut with it, the final Data joined as the trajectory is."""
    m = _euler_cartpole()
    data, ctrl = _inputs(m, 8, 10)
    axes = jax.tree_util.tree_map(lambda _: None, m).replace(body_mass=0)
    scale = jnp.linspace(0.5, 2, 8)[:, None]
    mb = m.replace(body_mass=jnp.asarray(m.body_mass)[None] * scale)
    ref, ref_final = simjax.rollout_batch(mb, data, ctrl, model_axes=axes,
                                          return_data=True, threads=1)
    for n in (2, 4):
        traj, final = simjax.rollout_batch(mb, data, ctrl, model_axes=axes,
                                           return_data=True, threads=n)
        for a, b in zip(jax.tree_util.tree_leaves((traj, final)),
                        jax.tree_util.tree_leaves((ref, ref_final))):
            assert a.shape == b.shape
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-12)
    # the worlds differ (the masses differ): a wrong chunk order would show
    assert float(jnp.max(jnp.abs(ref.qpos[0, -1] - ref.qpos[-1, -1]))) > 1e-3
    with pytest.raises(ValueError, match="divide the batch size 8"):
        simjax.rollout_batch(m, data, ctrl, threads=3)
    with pytest.raises(ValueError, match="divide the batch size 8"):
        simjax.rollout_batch(m, data, ctrl, threads=0)
    wrong = m.replace(body_mass=jnp.asarray(m.body_mass)[None] * jnp.ones((16, 1)))
    with pytest.raises(ValueError, match="leading batch size 8"):
        simjax.rollout_batch(wrong, data, ctrl, model_axes=axes, threads=2)


def test_concurrent_and_chunks():
    f = jax.jit(lambda x, y: (x * 2.0, y + 1))
    x = jnp.arange(12.0).reshape(6, 2)
    y = jnp.arange(6)
    parts = split_batch((x, y), 3)
    assert [p[0].shape for p in parts] == [(2, 2)] * 3
    # jax arrays stay jax arrays of their dtype (cut on the host), NumPy ones NumPy views
    for p, k in zip(parts, range(3)):
        assert all(isinstance(v, jax.Array) for v in p)
        assert (p[0].dtype, p[1].dtype) == (x.dtype, y.dtype)
        np.testing.assert_array_equal(p[1], np.arange(2 * k, 2 * k + 2))
    # committed to a device where the batch was, as jax's own slices are
    assert not any(v.committed for p in parts for v in p)
    on0 = jax.device_put(x, jax.devices()[0])
    assert all(p.committed for p in split_batch(on0, 3))
    host = np.arange(6.0)
    assert split_batch(host, 2)[1].base is host
    # the same cut inside a trace (jax's own slices)
    traced = jax.jit(lambda x: split_batch(x, 3)[2])(x)
    np.testing.assert_array_equal(traced, x[4:])
    out = concurrent(f, parts)          # the first call with this signature: compiled first
    out2 = concurrent(f, parts)         # then all at once
    # not a jit: the first chunk alone on the first call, then the rest
    calls = []

    def g(x, y):
        calls.append(x.shape)
        return f(x, y)
    out3 = concurrent(g, parts)
    assert len(calls) == 3
    np.testing.assert_array_equal(concat_batch(out3)[0], x * 2.0)
    for o in (out, out2):
        joined = concat_batch(o)
        np.testing.assert_array_equal(joined[0], x * 2.0)
        np.testing.assert_array_equal(joined[1], y + 1)
    assert concurrent(f, []) == []
    with pytest.raises(ValueError, match="do not split into 4"):
        split_batch((x, y), 4)
    with pytest.raises(ValueError, match="do not split"):
        split_batch((x, jnp.arange(5)), 1)


def test_auto_threads():
    x = jnp.zeros((1024, 3))
    n = auto_threads(1024, [x])
    assert 1 <= n <= (os.cpu_count() or 1) and 1024 % n == 0
    # chunks of at least MIN_CHUNK worlds; a batch that no count divides stays whole
    assert auto_threads(MIN_CHUNK, [x]) == 1
    assert auto_threads(1021, [x]) == 1            # a prime
    # inside a trace (a caller's jit or grad) the batch is never cut
    seen = []
    jax.make_jaxpr(lambda v: seen.append(auto_threads(1024, [v])) or v)(x)
    assert seen == [1]
    # NumPy arrays are not placed on a device: one program
    assert auto_threads(1024, [np.zeros((1024, 3))]) == 1


def test_bench_backend_keeps_chunks():
    """The bench's simjax backend steps its batch as chunks at once and keeps them cut
    between calls; each world steps (and differentiates) as the chunk program steps it
    in any batch. The reference is that program on a batch that straddles the chunks
    (worlds 8-23 of 32): one program compiled, not a second one for the whole batch."""
    backends = pytest.importorskip("bench.backends")
    import mujoco
    mjm = mujoco.MjModel.from_xml_path(CARTPOLE)
    two = backends.SimJax(mjm, 32, 2, CARTPOLE, 0, threads=2)
    assert two.threads == 2 and [c.qpos.shape[0] for c in two.chunks] == [16, 16]

    def middle(d):
        return jax.tree_util.tree_map(lambda x: x[8:24], d)
    ref = middle(two.data)
    two.compile()
    two.run()
    two.run()
    for _ in range(2):
        ref = two._compiled(ref)
    joined = concat_batch(two.chunks)
    np.testing.assert_allclose(joined.qpos[8:24], ref.qpos, rtol=0, atol=1e-12)
    np.testing.assert_allclose(joined.qvel[8:24], ref.qvel, rtol=0, atol=1e-12)
    # the worlds differ, so a swap of the chunks would show
    assert float(jnp.max(jnp.abs(joined.qpos[0] - joined.qpos[-1]))) > 1e-4
    # the gradient over the chunks: each world's own, whatever batch it is in
    two.compile_grad()
    parts = [two._compiled_grad(c.qvel, c) for c in two.chunks]
    mid = middle(joined)
    loss, grad = two._compiled_grad(mid.qvel, mid)
    np.testing.assert_allclose(jnp.concatenate([p[0] for p in parts])[8:24], loss,
                               rtol=1e-12)
    np.testing.assert_allclose(jnp.concatenate([p[1] for p in parts])[8:24], grad,
                               rtol=0, atol=1e-12)
    assert two.run_grad() > 0 and two.memory_grad() is not None


def test_concurrent_keeps_the_callers_settings(monkeypatch):
    """A setting entered as a context manager holds in the caller's thread alone; the
    worker threads run under it too (here float64, which a worker without it would
    truncate to float32), not falling back to calls in the caller."""
    import sys
    mod = sys.modules["simjax.rollout"]
    ran = []

    def record(*args):
        r = call_as(*args)
        ran.append(r is not mod._MISMATCH)
        return r
    call_as = mod._call_as
    monkeypatch.setattr(mod, "_call_as", record)
    if jax.config.jax_enable_x64:
        ctx, want = jax.enable_x64(False), jnp.float32
    else:
        ctx, want = jax.enable_x64(True), jnp.float64
    with ctx:
        f = jax.jit(lambda x: x * 3)
        x = jnp.arange(8, dtype=want) / 7
        parts = split_batch(x, 4)
        for _ in range(2):
            out = concurrent(f, [(p,) for p in parts])
            assert [o.dtype for o in out] == [want] * 4
            np.testing.assert_array_equal(concat_batch(out), x * 3)
    # 4 chunks in workers on each call (the jit compiled in the caller first), every
    # one under the caller's settings
    assert ran == [True] * 8
