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
        ref = single(m, jax.tree_util.tree_map(lambda x: x[i], data), ctrl[i])
        np.testing.assert_allclose(traj.qpos[i], ref.qpos, rtol=0, atol=1e-12)
        np.testing.assert_allclose(traj.qvel[i], ref.qvel, rtol=0, atol=1e-12)
    np.testing.assert_allclose(final.qpos, traj.qpos[:, -1], rtol=0, atol=0)


def test_argument_errors():
    m = _euler_cartpole()
    data, ctrl = _inputs(m, 3, 4)
    with pytest.raises(ValueError, match="ctrl must be"):
        simjax.rollout_batch(m, data, ctrl[0])
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
