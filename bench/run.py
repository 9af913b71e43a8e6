"""The benchmark: simjax, MJX and MuJoCo C measured in the same run.

Usage::

    python -m bench [--models humanoid-smooth,pendulum-smooth] [--batch 1,64,1024,4096]
                    [--backends simjax,mjx,mujoco] [--grad] [--timeout 300]
                    [--budget 3] [--chunk N] [--out bench/results] [--name STEM] [--resume]
                    [--quick]

For every (model, batch size, backend) a fresh process (``bench.worker``) measures the
JIT compile time of the batched rollout (and with ``--compile-step`` of one batched
step alone), the steady-state
steps/s (worlds x steps / second), the memory of the compiled program (XLA) or of the
MjData buffers (C), the process's peak memory and, with ``--grad``, the steps/s of
value-and-gradient through a ``--grad-nstep``-step rollout (batch sizes up to
``--grad-max-batch``).

Each phase of a measurement (forward; gradient) has ``--timeout`` seconds, compile
included; a phase that runs past it is stopped and recorded as a timeout, and the run
moves on. The rollout compiled for timing is a few steps long (``CHUNK``, by batch
size; ``--chunk`` sets it for every size) and called as often as fits in ``--budget`` seconds, so slow backends take
few calls and fast ones many. Results are rewritten after every measurement to
``<out>/<device>-<date>.json`` and ``.md`` (a table with the ratios simjax/C and
simjax/MJX), and a plot ``.png`` of steps/s against batch size per backend is drawn
at the end; ``--resume`` skips the measurements already in that JSON file. Every row
records the date and the git commit it was measured at; ``--name`` gives the results
file a fixed stem instead of ``<device>-<date>``, so that a long grid can be measured
in parts on different days (``--resume --name full``) and the table says which part
was measured when. A backend whose forward phase timed out at some batch size is not
run at the larger ones of the same model (recorded as skipped); likewise for the
gradient.

``--quick`` is a short preset (four models with contacts at batch 1024, short
budgets, results in ``bench/results/quick``); explicit options override it.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import queue
import subprocess
import sys
import tempfile
import threading
import time

from tqdm import tqdm

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

#: steps per compiled rollout call, by batch size: one call should take well over the
#: dispatch overhead (tens of microseconds) yet stay short for slow backends, since
#: the number of calls is what adapts to the time budget
CHUNK = {1: 20, 16: 10, 64: 10, 256: 5, 1024: 4, 4096: 2}

FULL = dict(models="pendulum-smooth,humanoid-smooth,humanoid,ant,barkour,shadow_hand,"
                   "contact_stress",
            batch="1,64,1024,4096", backends="simjax,mjx,mujoco", grad_nstep=10,
            grad_max_batch=1024, timeout=300, budget=3.0, out=os.path.join(HERE, "results"))
QUICK = dict(FULL, models="humanoid,ant,barkour,shadow_hand", batch="1024", timeout=90,
             budget=1.0, out=os.path.join(HERE, "results", "quick"))


def chunk_for(batch):
    return CHUNK.get(batch, max(1, 5000 // batch))


def device_name():
    """'cpu-<n>cores' or the accelerator's kind, for file names and the report."""
    import jax
    dev = jax.devices()[0]
    if dev.platform == "cpu":
        return f"cpu-{os.cpu_count()}cores"
    return dev.device_kind.replace(" ", "_").lower()


def cpu_model():
    """The processor's model name (Linux: /proc/cpuinfo's "model name", e.g. "AMD EPYC
    ..." or "Intel(R) Xeon(R) ..."), else ``platform.processor()`` or the machine type.
    Runs on different processors of one kind of machine are not comparable: the same
    commit's ant rollout ran 0.37x MuJoCo C on a 2-core AMD EPYC and 0.21-0.31x on a
    2-core Intel Xeon (Ice Lake), its compile 3.3 s against 4.0-5.5 s."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return " ".join(line.split(":", 1)[1].split())
    except OSError:
        pass
    return platform.processor() or platform.machine()


def git_commit():
    """Short hash of the checked-out commit, with '+' when the tree has changes;
    BENCH_COMMIT overrides it (a copy of the tree without its git folder)."""
    if os.environ.get("BENCH_COMMIT"):
        return os.environ["BENCH_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                             capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    if out.returncode != 0:
        return "unknown"
    return out.stdout.strip() + ("+" if dirty.stdout.strip() else "")


def skipped(rows, model, batch, backend, key="error"):
    """Why (model, batch, backend) is not worth running: its ``key`` phase ('error' for
    the forward, 'grad_error' for the gradient) timed out at a smaller batch size of the
    same model and backend (a larger batch only takes longer). None to run it."""
    for r in rows:
        if (r["model"] == model and r["backend"] == backend and r["batch"] < batch
                and str(r.get(key, "")).startswith("timeout")):
            return f"skipped: timed out at batch {r['batch']}"
    return None


def _reader(stream, q):
    for line in stream:
        q.put(line.rstrip("\n"))
    q.put(None)


def run_one(backend, model, batch, chunk, grad_nstep, timeout, budget, on_phase=None,
            compile_step=False, simjax_threads=None):
    """Run one worker; each phase it announces gets ``timeout`` seconds. Returns the
    last row it reported, with ``error`` (forward) or ``grad_error`` set on a timeout,
    a crash or a kill."""
    cmd = [sys.executable, "-m", "bench.worker", backend, model, str(batch), str(chunk),
           "--budget", str(budget)]
    if grad_nstep:
        cmd += ["--grad-nstep", str(grad_nstep)]
    if compile_step:
        cmd += ["--compile-step"]
    if simjax_threads is not None and backend == "simjax":
        cmd += ["--simjax-threads", str(simjax_threads)]
    row = dict(model=model, backend=backend, batch=batch)
    phase, t_phase = "start", time.perf_counter()
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=err,
                                text=True, bufsize=1)
        q = queue.Queue()
        threading.Thread(target=_reader, args=(proc.stdout, q), daemon=True).start()
        timed_out = False
        while True:
            left = timeout - (time.perf_counter() - t_phase)
            try:
                line = q.get(timeout=max(left, 0.01))
            except queue.Empty:
                timed_out = True
                proc.kill()
                break
            if line is None:
                break
            if line.startswith("PHASE "):
                phase, t_phase = line[6:], time.perf_counter()
                if on_phase:
                    on_phase(phase)
            elif line.startswith("RESULT "):
                row = json.loads(line[7:])
        rc = proc.wait()
        err.seek(0)
        tail = [ln for ln in err.read().strip().splitlines() if ln.strip()][-1:]
    key = "grad_error" if phase == "grad" else "error"
    if timed_out:
        row[key] = f"timeout {timeout}s ({phase})"
    elif rc != 0 and key not in row:
        why = f"killed by signal {-rc}" if rc < 0 else f"exit status {rc}"
        if rc == -9:
            why += " (out of memory?)"
        row[key] = f"{why} ({phase})" + (f": {tail[0][:200]}" if tail else "")
    elif "sps" not in row and "error" not in row and phase != "grad":
        row["error"] = tail[0][:300] if tail else "no output"
    return row


def _fmt(x, unit=""):
    if x is None:
        return "-"
    if unit == "s":
        return f"{x:.2f}"
    if unit == "MB":
        return f"{x / 2**20:.0f}"
    if x >= 1e6:
        return f"{x / 1e6:.2f}M"
    if x >= 1e3:
        return f"{x / 1e3:.1f}K"
    return f"{x:.0f}"


def _cell(r, key, err_key, unit=""):
    """A table cell: the value, or 'timeout' / 'error' / '-' (not measured)."""
    if r.get(key) is not None:
        return _fmt(r[key], unit)
    err = r.get(err_key)
    if err:
        for word in ("timeout", "skipped"):
            if err.startswith(word):
                return word
        return "error"
    return "-"


def _compile(r):
    """Compile seconds: of one step where measured, else of the timed rollout (whose
    loop body is one step)."""
    key = "compile_step_s" if r.get("compile_step_s") is not None else "compile_s"
    return _cell(r, key, "error", "s")


def markdown(rows, meta):
    """Results table: one line per (model, batch) with every backend and the ratios."""
    by = {}
    for r in rows:
        by.setdefault((r["model"], r["batch"]), {})[r["backend"]] = r
    lines = [f"Device: {meta['device']} ({meta['cpu']}), jax {meta['jax']}, "
             f"mujoco {meta['mujoco']}, float32, {meta['date']}.",
             f"Command: `{meta['command']}`", "",
             "| model | batch | simjax steps/s | MJX steps/s | MuJoCo C steps/s | "
             "simjax/MJX | simjax/C | compile simjax / MJX (s) | "
             "grad steps/s simjax / MJX | memory simjax / MJX / C (MB) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    runs = {}
    for r in rows:
        if r.get("date"):
            runs.setdefault((r["date"], r.get("commit", "unknown")), set()).add(r["model"])
    if len(runs) > 1:
        lines[1:1] = ["Measured in parts: " + "; ".join(
            f"{d} at {c} ({', '.join(sorted(ms))})" for (d, c), ms in sorted(runs.items()))
            + "."]
    for (model, batch), b in sorted(by.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        s, x, c = b.get("simjax", {}), b.get("mjx", {}), b.get("mujoco", {})

        def ratio(a, b):
            if a.get("sps") and b.get("sps"):
                return f"{a['sps'] / b['sps']:.2f}"
            return "-"
        lines.append(
            f"| {model} | {batch} | {_cell(s, 'sps', 'error')} | {_cell(x, 'sps', 'error')} | "
            f"{_cell(c, 'sps', 'error')} | {ratio(s, x)} | {ratio(s, c)} | "
            f"{_compile(s)} / {_compile(x)} | "
            f"{_cell(s, 'grad_sps', 'grad_error')} / {_cell(x, 'grad_sps', 'grad_error')} | "
            f"{_fmt(s.get('memory_bytes'), 'MB')} / {_fmt(x.get('memory_bytes'), 'MB')} / "
            f"{_fmt(c.get('memory_bytes'), 'MB')} |")
    threads = sorted({r["threads"] for r in rows if r.get("threads")})
    if threads:
        lines += ["", "simjax stepped each batch as " + " or ".join(map(str, threads)) +
                  " chunk(s) at once, from threads, as `simjax.rollout_batch` does on CPU "
                  "(compile: one chunk's program; memory: one chunk's program times the "
                  "chunks)."]
    errors = [(r, k) for r in rows for k in ("error", "grad_error") if r.get(k)]
    if errors:
        lines += ["", "Errors and timeouts (each phase, compile included, has the "
                  "timeout of the run):"]
        lines += [f"- {r['backend']} {r['model']} batch {r['batch']}"
                  f"{' gradient' if k == 'grad_error' else ''}: {r[k]}" for r, k in errors]
    return "\n".join(lines) + "\n"


def plot(rows, path):
    """steps/s against batch size, one panel per model, one line per backend."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    models = sorted({r["model"] for r in rows})
    fig, axes = plt.subplots(1, len(models), figsize=(4.5 * len(models), 3.6), squeeze=False)
    for ax, model in zip(axes[0], models):
        for backend in ("simjax", "mjx", "mujoco"):
            pts = sorted((r["batch"], r["sps"]) for r in rows
                         if r["model"] == model and r["backend"] == backend and r.get("sps"))
            if pts:
                ax.plot(*zip(*pts), marker="o", label=backend)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(model)
        ax.set_xlabel("batch size")
        ax.set_ylabel("steps / s")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _write(stem, rows, meta):
    with open(stem + ".json", "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)
    table = markdown(rows, meta)
    with open(stem + ".md", "w") as f:
        f.write(table)
    return table


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help=f"preset: models {QUICK['models']}, batch {QUICK['batch']}, "
                         f"timeout {QUICK['timeout']} s, budget {QUICK['budget']} s")
    ap.add_argument("--models", help=f"keys of bench/models.py (default {FULL['models']})")
    ap.add_argument("--batch", help=f"batch sizes (default {FULL['batch']})")
    ap.add_argument("--backends", help=f"default {FULL['backends']}")
    ap.add_argument("--grad", action="store_true", help="also measure forward+backward")
    ap.add_argument("--grad-nstep", type=int,
                    help=f"rollout steps of the gradient (default {FULL['grad_nstep']})")
    ap.add_argument("--grad-max-batch", type=int,
                    help=f"largest batch with a gradient (default {FULL['grad_max_batch']})")
    ap.add_argument("--timeout", type=int,
                    help=f"seconds per phase, compile included (default {FULL['timeout']})")
    ap.add_argument("--budget", type=float,
                    help=f"seconds of timed calls per phase (default {FULL['budget']})")
    ap.add_argument("--compile-step", action="store_true",
                    help="also time the compile of one batched step (a second compile; "
                         "the table shows the rollout's compile otherwise)")
    ap.add_argument("--chunk", type=int,
                    help="steps per compiled rollout call (default: 4 at batch 1024, "
                         "see CHUNK); 1 compiles and times a single step per call")
    ap.add_argument("--simjax-threads", type=int,
                    help="chunks of the batch simjax steps at once from threads (default: "
                         "as simjax.rollout_batch, the usable cores on CPU; 1: one "
                         "program over the whole batch)")
    ap.add_argument("--out", help="results folder (default bench/results, "
                                  "bench/results/quick with --quick)")
    ap.add_argument("--name", help="results file stem (default <device>-<date>)")
    ap.add_argument("--resume", action="store_true",
                    help="keep the rows of the results file and skip those runs")
    args = ap.parse_args(argv)
    preset = QUICK if args.quick else FULL
    for k, v in preset.items():
        if getattr(args, k) is None:
            setattr(args, k, v)

    import jax
    import mujoco
    models = args.models.split(",")
    batches = [int(b) for b in args.batch.split(",")]
    backends = args.backends.split(",")
    today = datetime.date.today().isoformat()
    meta = dict(device=device_name(), cpu=cpu_model(),
                jax=jax.__version__, mujoco=mujoco.__version__, date=today,
                command="python -m bench " + " ".join(argv if argv is not None
                                                      else sys.argv[1:]))
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, args.name or f"{meta['device']}-{today}")
    commit = git_commit()
    rows = []
    if args.resume and os.path.exists(stem + ".json"):
        with open(stem + ".json") as f:
            prev = json.load(f)
        rows = prev["rows"]
        # the table names every command that measured a part of it
        if prev["meta"].get("command") and prev["meta"]["command"] != meta["command"]:
            meta["command"] = prev["meta"]["command"] + "`; `" + meta["command"]
    done = {(r["model"], r["batch"], r["backend"]) for r in rows}
    jobs = [(m, b, k) for m in models for b in batches for k in backends
            if (m, b, k) not in done]
    t_start = time.perf_counter()
    with tqdm(jobs, desc="bench", unit="run", dynamic_ncols=True) as bar:
        for model, batch, backend in bar:
            grad = args.grad_nstep if args.grad and batch <= args.grad_max_batch else 0
            grad_skip = skipped(rows, model, batch, backend, "grad_error") if grad else None
            if grad_skip:
                grad = 0
            label = f"{model} b{batch} {backend}"
            bar.set_postfix_str(label)
            t0 = time.perf_counter()
            why = skipped(rows, model, batch, backend)
            if why:
                row = dict(model=model, backend=backend, batch=batch, error=why)
            else:
                row = run_one(backend, model, batch, args.chunk or chunk_for(batch), grad, args.timeout,
                              args.budget, on_phase=lambda p, label=label:
                              bar.set_postfix_str(f"{label} {p}"),
                              compile_step=args.compile_step,
                              simjax_threads=args.simjax_threads)
            if grad_skip:
                row["grad_error"] = grad_skip
            row.update(wall_s=round(time.perf_counter() - t0, 1), date=today, commit=commit)
            rows.append(row)
            bar.write(json.dumps(row))
            _write(stem, rows, meta)
    meta["wall_s"] = round(time.perf_counter() - t_start, 1)
    table = _write(stem, rows, meta)
    try:
        plot(rows, stem + ".png")
    except Exception as e:          # no matplotlib: the table and JSON are the results
        print(f"no plot: {type(e).__name__}: {e}")
    print(table)
    print(f"wrote {stem}.json, .md, .png ({meta['wall_s']:.0f} s)")
    return 0
