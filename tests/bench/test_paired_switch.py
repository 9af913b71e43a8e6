"""bench.paired_switch: a switch's values compiled apart, timed alternately, the
module attribute restored."""
import types

import pytest

from bench import paired_switch


def test_switch_resolves_and_rejects_unknown_attribute():
    from simjax.engine import solver_worlds
    assert paired_switch._switch("simjax.engine.solver_worlds._PER_WORLD_WORK") == (
        solver_worlds, "_PER_WORLD_WORK")
    with pytest.raises(SystemExit, match="no attribute _NOPE"):
        paired_switch._switch("simjax.engine.solver_worlds._NOPE")


def test_measure_builds_one_program_per_value_and_alternates(monkeypatch):
    from bench import backends, models
    module = types.SimpleNamespace(FLAG="saved")
    log = []

    class Fake:
        def __init__(self, mjm, batch, nstep, path, disableflags, threads):
            self.value = module.FLAG          # read when the program is built
            assert threads is None            # as the bench: chunks per core on CPU

        def compile(self):
            return 0.0

        def run(self):
            log.append(self.value)
            return 0.5 if self.value == "a" else 0.25

    monkeypatch.setattr(backends, "SimJax", Fake)
    monkeypatch.setattr(models, "mj_model", lambda spec: None)
    times = paired_switch.measure("ant", module, "FLAG", ["a", "b"], 8, 2, 3)
    assert module.FLAG == "saved"
    # two warm-up calls each, then rounds a b / b a / a b
    assert log == ["a", "a", "b", "b", "a", "b", "b", "a", "a", "b"]
    assert times == {"a": [0.5] * 3, "b": [0.25] * 3}


def test_measure_takes_a_model_path(monkeypatch):
    """A key that is not a bench model is a model file's path, with its own options."""
    from bench import backends, models
    seen = []

    class Fake:
        def __init__(self, mjm, batch, nstep, path, disableflags, threads):
            seen.append((mjm, path, disableflags))

        def compile(self):
            return 0.0

        def run(self):
            return 0.1

    monkeypatch.setattr(backends, "SimJax", Fake)
    monkeypatch.setattr(models, "mj_model", lambda spec: spec.path)
    module = types.SimpleNamespace(FLAG=0)
    paired_switch.measure("/some/model.xml", module, "FLAG", [1], 4, 1, 1)
    assert seen == [("/some/model.xml", "/some/model.xml", 0)]
