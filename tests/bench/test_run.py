"""The benchmark's bookkeeping (no measurement): skipping after timeouts and the table
of a grid measured in parts."""
import pytest

run = pytest.importorskip("bench.run")


def _row(model, batch, backend, **kw):
    return dict(model=model, batch=batch, backend=backend, **kw)


def test_skipped_after_timeout_at_smaller_batch():
    rows = [_row("humanoid", 64, "mjx", error="timeout 300s (compile)"),
            _row("humanoid", 64, "simjax", sps=1e4, grad_error="timeout 300s (grad)")]
    assert run.skipped(rows, "humanoid", 1024, "mjx") == "skipped: timed out at batch 64"
    # not at the same or a smaller batch, nor for another backend or model
    assert run.skipped(rows, "humanoid", 64, "mjx") is None
    assert run.skipped(rows, "humanoid", 1, "mjx") is None
    assert run.skipped(rows, "humanoid", 1024, "simjax") is None
    assert run.skipped(rows, "ant", 1024, "mjx") is None
    # the gradient is skipped on its own timeout only
    assert run.skipped(rows, "humanoid", 1024, "simjax", "grad_error") == \
        "skipped: timed out at batch 64"
    assert run.skipped(rows, "humanoid", 1024, "mjx", "grad_error") is None


def test_markdown_grid_in_parts():
    meta = dict(device="cpu-2cores", cpu="x86_64", jax="0", mujoco="4.0.0",
                date="2026-11-22", command="python -m bench --name full --resume")
    rows = [_row("ant", 64, "simjax", sps=2000.0, date="2026-11-21", commit="abc"),
            _row("ant", 64, "mujoco", sps=1000.0, date="2026-11-21", commit="abc"),
            _row("humanoid", 64, "simjax", sps=500.0, date="2026-11-22", commit="def"),
            _row("humanoid", 1024, "mjx", error="skipped: timed out at batch 64",
                 date="2026-11-22", commit="def")]
    table = run.markdown(rows, meta)
    assert "Measured in parts: 2026-11-21 at abc (ant); 2026-11-22 at def (humanoid)." \
        in table
    line = next(ln for ln in table.splitlines() if ln.startswith("| ant | 64 |"))
    cells = [c.strip() for c in line.split("|")]
    assert cells[3] == "2.0K" and cells[5] == "1.0K" and cells[7] == "2.00"
    line = next(ln for ln in table.splitlines() if ln.startswith("| humanoid | 1024 |"))
    assert line.split("|")[4].strip() == "skipped"
    # one part only: no such line
    assert "Measured in parts" not in run.markdown(rows[:2], meta)


@pytest.mark.parametrize("argv, chunk", [([], 4), (["--chunk", "1"], 1)])
def test_chunk_option_sets_rollout_length(monkeypatch, tmp_path, argv, chunk):
    seen = []

    def fake_run_one(backend, model, batch, chunk, *args, **kw):
        seen.append(chunk)
        return dict(model=model, batch=batch, backend=backend, sps=1.0)

    monkeypatch.setattr(run, "run_one", fake_run_one)
    monkeypatch.setattr(run, "plot", lambda rows, path: None)
    run.main(["--quick", "--models", "ant", "--backends", "simjax",
              "--out", str(tmp_path), "--name", "t"] + argv)
    assert seen == [chunk]


@pytest.mark.parametrize("argv, threads", [([], None), (["--simjax-threads", "1"], 1)])
def test_simjax_threads_option_and_note(monkeypatch, tmp_path, argv, threads):
    seen = []

    def fake_run_one(backend, model, batch, chunk, *args, simjax_threads=None, **kw):
        seen.append(simjax_threads)
        return dict(model=model, batch=batch, backend=backend, sps=1.0, threads=2)

    monkeypatch.setattr(run, "run_one", fake_run_one)
    monkeypatch.setattr(run, "plot", lambda rows, path: None)
    run.main(["--quick", "--models", "ant", "--backends", "simjax",
              "--out", str(tmp_path), "--name", "t"] + argv)
    assert seen == [threads]
    table = (tmp_path / "t.md").read_text()
    assert "simjax stepped each batch as 2 chunk(s) at once" in table
    meta = dict(device="d", cpu="c", jax="0", mujoco="4", date="x", command="c")
    one = [_row("ant", 64, "simjax", sps=1.0)]
    assert "chunk(s) at once" not in run.markdown(one, meta)


def test_cpu_model_names_the_processor(tmp_path, monkeypatch):
    """The report names the processor (/proc/cpuinfo's model name on Linux): runs on
    two kinds of processor are not comparable."""
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: GenuineIntel\n"
                    "model name\t: Intel(R) Xeon(R)  Processor @ 2.80GHz\n")
    real_open = open

    def fake_open(path, *a, **kw):
        return real_open(info if path == "/proc/cpuinfo" else path, *a, **kw)
    monkeypatch.setattr("builtins.open", fake_open)
    assert run.cpu_model() == "Intel(R) Xeon(R) Processor @ 2.80GHz"
    info.write_text("processor\t: 0\n")
    assert run.cpu_model() == (run.platform.processor() or run.platform.machine())
