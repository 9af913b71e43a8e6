"""The XLA flags simjax sets on import: only for a jaxlib that knows them."""
import importlib.metadata

import pytest

import simjax


#: (flag function, {jaxlib version: whether the flag is added}, the user's own setting)
FLAGS = {
    "legacy_emitters": (
        "_legacy_emitters_flag",
        {"0.4.38": True, "0.10.2": True, "0.11.2": False, "0.12.0": False, "1.0.0": False,
         "garbage": False},
        "--xla_cpu_use_fusion_emitters=true"),
    "ynn_reduce": (
        "_ynn_reduce_flag",
        {"0.4.38": False, "0.10.1": False, "0.10.2": True, "0.10.3rc1": True,
         "0.11.0": False, "garbage": False},
        "--xla_cpu_experimental_ynn_fusion_type=+dot"),
    "unroll": (
        "_unroll_flag",
        {"0.4.38": True, "0.10.2": True, "0.11.0": False, "garbage": False},
        "--xla_backend_extra_options=-unroll-threshold=100"),
}


@pytest.mark.parametrize("flag, jaxlib", [(f, v) for f, (_, table, _) in FLAGS.items()
                                          for v in table])
def test_flag_by_jaxlib_version(monkeypatch, flag, jaxlib):
    fn, table, _ = FLAGS[flag]
    monkeypatch.delenv("SIMJAX_KEEP_XLA_FLAGS", raising=False)
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=1")
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    monkeypatch.setattr(importlib.metadata, "version", lambda name: jaxlib)
    assert getattr(simjax, fn)() is table[jaxlib]


@pytest.mark.parametrize("flag", list(FLAGS))
def test_flag_respects_the_user(monkeypatch, flag):
    fn, _, own = FLAGS[flag]
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.10.2")
    monkeypatch.delenv("SIMJAX_KEEP_XLA_FLAGS", raising=False)
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=1")
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    assert getattr(simjax, fn)() is True
    monkeypatch.setenv("SIMJAX_KEEP_XLA_FLAGS", "1")
    assert getattr(simjax, fn)() is False
    monkeypatch.delenv("SIMJAX_KEEP_XLA_FLAGS")
    monkeypatch.setenv("XLA_FLAGS", own)
    assert getattr(simjax, fn)() is False


def test_unroll_flag_cpu_only(monkeypatch):
    """The LLVM unroll cap (measured on CPU code only) is left out wherever JAX may
    use another backend: JAX_PLATFORMS naming one, or a PJRT plugin installed."""
    import importlib.util
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.10.2")
    monkeypatch.delenv("SIMJAX_KEEP_XLA_FLAGS", raising=False)
    monkeypatch.setenv("XLA_FLAGS", "")
    for platforms, wanted in (("cpu", True), ("cuda", False), ("cuda,cpu", False),
                              (" cpu , cpu", True)):
        monkeypatch.setenv("JAX_PLATFORMS", platforms)
        assert simjax._unroll_flag() is wanted, platforms
    monkeypatch.delenv("JAX_PLATFORMS")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name: object() if name == "jax_plugins" else real(name))
    assert simjax._unroll_flag() is False
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name: None if name.startswith("jax_") else real(name))
    assert simjax._unroll_flag() is True


def test_flags_set_on_import():
    """With jaxlib 0.10.2 (the test environment's) the flags are added at import (the
    unroll cap where JAX can use the CPU alone), and XLA:CPU then compiles a short
    batched reduction as its own kernel, not YNNPACK's."""
    import os

    import jax
    import jax.numpy as jnp
    ver = simjax._jaxlib_version() or (0,)
    if not (0, 10, 2) <= ver < (0, 11, 0) or os.environ.get("SIMJAX_KEEP_XLA_FLAGS"):
        pytest.skip("the flags are added for jaxlib 0.10.2+ without SIMJAX_KEEP_XLA_FLAGS")
    flags = os.environ.get("XLA_FLAGS", "")
    assert "--xla_cpu_use_fusion_emitters=false" in flags
    assert "--xla_cpu_experimental_ynn_fusion_type=-reduce" in flags
    unroll = "--xla_backend_extra_options=-unroll-full-max-count=8" in flags
    assert unroll is simjax._cpu_only()
    hlo = jax.jit(lambda x: jnp.sum(x * x, -1)).lower(
        jnp.ones((1024, 14), jnp.float32)).compile().as_text()
    assert "reduce" in hlo and "ynn_fusion" not in hlo
