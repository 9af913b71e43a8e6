"""The worker's row (no real backend): the wall-clock rate and the rate per second of
process CPU time of the same calls."""
import time

import pytest

worker = pytest.importorskip("bench.worker")


class _Busy:
    """A backend whose call spins on one thread for ``spin`` seconds."""

    def __init__(self, spin):
        self.spin = spin

    def compile(self):
        return 0.0

    def run(self):
        t0 = time.perf_counter()
        end = time.process_time() + self.spin
        while time.process_time() < end:
            pass
        return time.perf_counter() - t0

    def memory(self):
        return 0


def test_row_has_cpu_rate(monkeypatch):
    from bench import backends, models
    monkeypatch.setattr(models, "mj_model", lambda spec: None)
    monkeypatch.setattr(backends, "MuJoCoC", lambda mjm, batch, nstep: _Busy(0.01))
    row = worker.measure("mujoco", "barkour", 8, 2, budget=0.05)
    assert "error" not in row
    # one thread busy: the CPU rate is the wall rate or above (waits count in wall only)
    assert row["cpu_sps"] >= 0.9 * row["sps"]
    assert row["cpu_sps"] == pytest.approx(8 * 2 / 0.01, rel=0.2)
