"""The XLA flag simjax sets on import: only for a jaxlib that knows it."""
import importlib.metadata

import pytest

import simjax


@pytest.mark.parametrize("jaxlib, expected", [
    ("0.4.38", True), ("0.10.2", True), ("0.11.2", False), ("0.12.0", False),
    ("1.0.0", False), ("garbage", False)])
def test_legacy_emitters_flag_by_jaxlib_version(monkeypatch, jaxlib, expected):
    monkeypatch.delenv("SIMJAX_KEEP_XLA_FLAGS", raising=False)
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=1")
    monkeypatch.setattr(importlib.metadata, "version", lambda name: jaxlib)
    assert simjax._legacy_emitters_flag() is expected


def test_legacy_emitters_flag_respects_the_user(monkeypatch):
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.10.2")
    monkeypatch.setenv("SIMJAX_KEEP_XLA_FLAGS", "1")
    assert simjax._legacy_emitters_flag() is False
    monkeypatch.delenv("SIMJAX_KEEP_XLA_FLAGS")
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_use_fusion_emitters=true")
    assert simjax._legacy_emitters_flag() is False
