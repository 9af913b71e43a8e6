"""Helpers shared by the profiling scripts (profile_smooth, profile_collision,
profile_contact, profile_solver): program size, optimised-HLO statistics, compile and
CPU time of a jitted function, and its kernels' run time by source function."""
from __future__ import annotations

import re
import time


def count_eqns(jaxpr):
    """Equations of a jaxpr including those of every sub-jaxpr (scan, cond, pjit...)."""
    from jax.extend import core
    n = 0
    for eqn in jaxpr.eqns:
        n += 1
        for p in eqn.params.values():
            subs = p if isinstance(p, (tuple, list)) else (p,)
            for s in subs:
                if isinstance(s, core.ClosedJaxpr):
                    n += count_eqns(s.jaxpr)
                elif isinstance(s, core.Jaxpr):
                    n += count_eqns(s)
    return n


def cpu_time(fn, *args, repeat=3):
    """Best process CPU seconds of ``fn(*args)`` over ``repeat`` calls, after one warm-up
    call (CPU time, not wall time, so that runs on a shared machine stay comparable)."""
    import jax
    jax.block_until_ready(fn(*args))
    best = float("inf")
    for _ in range(repeat):
        t0 = time.process_time()
        jax.block_until_ready(fn(*args))
        best = min(best, time.process_time() - t0)
    return best


_NOT_KERNELS = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast",
                "after-all", "partition-id", "replica-id"}
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*.*?\s([a-z][a-z0-9\-]*)\(")
_CALLEE = re.compile(r"(calls|to_apply)=%?([\w.\-]+)")


def traced_events(run, arg, nrun):
    """Complete events ("X": name, ts, dur, tid; microseconds) of ``nrun`` calls of the
    compiled function ``run(arg)``, from jax's profiler trace (perfetto format)."""
    import glob
    import gzip
    import json
    import tempfile

    import jax
    with tempfile.TemporaryDirectory() as tmp:
        with jax.profiler.trace(tmp, create_perfetto_trace=True):
            for _ in range(nrun):
                jax.block_until_ready(run(arg))
        path = glob.glob(f"{tmp}/**/perfetto_trace.json.gz", recursive=True)[0]
        events = json.load(gzip.open(path))
    events = events["traceEvents"] if isinstance(events, dict) else events
    return [e for e in events if e.get("ph") == "X"]


def _kernel_lines(text):
    """HLO text's computations as {name: [(opcode, line), ...]} and the set of names
    that are inside an op (fusion bodies, reducers), not run op by op."""
    comps, inner, cur = {}, set(), None
    for line in text.splitlines():
        if line and not line[0].isspace():
            if line.endswith("{"):
                cur = line.split()[1 if line.startswith("ENTRY") else 0].lstrip("%")
                comps[cur] = []
            continue
        mt = _INSTR.match(line)
        if not mt or cur is None:
            continue
        comps[cur].append((mt.group(2), line))
        for kind, callee in _CALLEE.findall(line):
            if kind == "calls" or mt.group(2) != "call":   # fusion bodies and reducers
                inner.add(callee)
    return comps, inner


def compile_note(fn, arg):
    """`` N eqns  compile S s CPU``: jaxpr size and compile process-CPU time of
    ``jax.jit(fn)`` at ``arg`` (a profile line's suffix)."""
    import jax
    neq = count_eqns(jax.make_jaxpr(fn)(arg).jaxpr)
    t0 = time.process_time()
    jax.jit(fn).lower(arg).compile()
    return f"  {neq:6d} eqns  compile {time.process_time() - t0:6.2f} s CPU"


def hlo_stats(text):
    """Statistics of an optimised HLO module (``compiled.as_text()``).

    ``ops``: instructions in all computations (fused ones and reducers included);
    ``kernels``: instructions of the computations the backend runs op by op (entry, while
    bodies and conditions, conditional branches, called computations) that do work: a
    fusion counts one; parameters, constants, tuples and bitcasts do not; reducers and
    fused computations are inside their op. ``fusions``: fusion instructions among them;
    ``whiles``: while loops; ``top``: the most frequent kernel opcodes."""
    comps, _ = _kernel_lines(text)
    ops = sum(len(v) for v in comps.values())
    kernels = fusions = whiles = 0
    top = {}
    for op, _, _ in kernel_ops(text):
        kernels += 1
        fusions += op == "fusion"
        whiles += op == "while"
        top[op] = top.get(op, 0) + 1
    top = dict(sorted(top.items(), key=lambda kv: -kv[1])[:6])
    return dict(ops=ops, kernels=kernels, fusions=fusions, whiles=whiles, top=top)


def compile_stats(fn, *args):
    """Jaxpr equations, trace+lower and compile process-CPU seconds and optimised-HLO
    statistics (:func:`hlo_stats`) of ``jax.jit(fn)`` at ``args``; also the compiled
    executable (``exe``)."""
    import jax
    c0 = time.process_time()
    jaxpr = jax.make_jaxpr(fn)(*args)
    c1 = time.process_time()
    lowered = jax.jit(fn).lower(*args)
    c2 = time.process_time()
    exe = lowered.compile()
    c3 = time.process_time()
    st = hlo_stats(exe.as_text())
    st.update(eqns=count_eqns(jaxpr.jaxpr), trace_s=c1 - c0, lower_s=c2 - c1,
              compile_s=c3 - c2, exe=exe)
    return st


def _stack_frames(text):
    """HLO text's StackFrames table as a function of a frame id giving
    [(file, function, line), ...], outermost first (parent ids in the text are 1-based,
    0 = none)."""
    sec, files, funcs, locs, frames = None, {}, {}, {}, {}
    for line in text.splitlines():
        if line in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
            sec = line
            continue
        if line.startswith(("%", "ENTRY", "HloModule")):
            sec = None
        if not line.strip() or sec is None:
            continue
        head, rest = line.split(" ", 1)
        if sec == "FileNames":
            files[int(head)] = rest.strip('"')
        elif sec == "FunctionNames":
            funcs[int(head)] = rest.strip('"')
        elif sec == "FileLocations":
            f = int(re.search(r"file_name_id=(\d+)", rest).group(1))
            fn = int(re.search(r"function_name_id=(\d+)", rest).group(1))
            ln = re.search(r"\bline=(\d+)", rest)
            locs[int(head)] = (files[f], funcs[fn], int(ln.group(1)) if ln else 0)
        else:
            fl = int(re.search(r"file_location_id=(\d+)", rest).group(1))
            pa = int(re.search(r"parent_frame_id=(\d+)", rest).group(1))
            frames[int(head)] = (fl, pa - 1)

    def chain(fid):
        out, seen = [], set()
        while fid in frames and fid not in seen:
            seen.add(fid)
            fl, fid = frames[fid]
            out.append(locs[fl])
        return out[::-1]
    return chain


def kernel_ops(text):
    """The kernels of optimised HLO ``text`` (those :func:`hlo_stats` counts) as
    (opcode, instruction line, source frames): frames [(file, function, line), ...]
    outermost first, [] where the instruction names no stack frame."""
    chain = _stack_frames(text)
    comps, inner = _kernel_lines(text)
    for name, ops in comps.items():
        if name in inner:
            continue
        for op, line in ops:
            if op in _NOT_KERNELS:
                continue
            sf = re.search(r"stack_frame_id=(\d+)", line)
            yield op, line, chain(int(sf.group(1))) if sf else []


def _package_frames(chain, package):
    """The frames of ``chain`` (:func:`kernel_ops`) in ``package`` as (module,
    function), outermost first; modules as ``collision/gjk`` (``engine/`` and ``.py``
    left out)."""
    return [(f.split(package + "/")[-1][:-3].replace("engine/", ""), fn)
            for f, fn, _ in chain if package + "/" in f]


def no_source_key(op):
    """The attribution key of a kernel whose instruction names no stack frame, by opcode.

    What they are (bench rollouts, batch 1024, float32; ant 173 of 515 kernels, shadow
    hand 223 of 785): ``copy`` (ant 152, hand 157) are the copies XLA's copy insertion
    adds: of the rollout's parameters into its loop (one per Data leaf) and of loop
    state that a loop body reads after writing; XLA CPU runs a plain copy as a copy
    thunk (a memcpy, or a transposing copy), with no generated code, so that they cost
    no LLVM time (per-kernel LLVM modules: 0 ms each). ``dot`` (ant 11, hand 16) are
    simjax's batched matrix-vector products (J v, M v in the solver), which XLA CPU's
    gemv rewriting re-creates without metadata: 60-150 ms of LLVM each in a loaded
    per-kernel profile, the costly part of this class. ``broadcast`` (hand 27, ant 0)
    are constants written where a loop, a conditional or the rollout needs a buffer
    (constant Data fields such as the hand's efc_type or actuator_moment, zero loop
    states, splat arrays passed into a collider group's branch), moved out of their
    source by CSE or loop-invariant code motion, and ``iota`` (hand 2) the 0, 1, ...
    constants passed into a loop or branch; ``reduce-window`` (hand 4) are the first
    halves XLA's tree reduction rewriting makes of sums over more than 32 entries; the
    rest are loop counters and the comparator of the contact TopK custom call
    (``compare``, ``xor``, ``select``: counted, but run by the TopK, not compiled as
    kernels). Tried against them (float64 outputs bit-identical each): the products
    with the warm start's two columns as one gemv over the matrix broadcast to both
    (3 dots fewer in each bench rollout, a broadcast and a transposing fusion more):
    ant's run 1.039x [1.010, 1.230] process CPU (10 rounds), compile 1.017x [0.860,
    1.150] (8 pairs); the collider branches' uniform constants built in the branch
    (``inline._consts_inside``) and the iotas made where used: hand 785 -> 779
    kernels, humanoid and barkour 1 fewer, compile 1.019x [0.917, 1.241] (hand, 6
    pairs), humanoid run 1.036x [0.966, 1.090] (8 rounds)."""
    return f"(no source frame: {op})"


def hlo_attribution(text, package="simjax",
                    skip_modules=("forward", "gc_pause", "precision", "inline")):
    """Kernels of an optimised HLO module attributed to source functions.

    Every kernel (as counted by :func:`hlo_stats`) is charged to the first function of
    ``package`` on its stack (outermost first) whose module is not in ``skip_modules``
    (so a step's kernels go to its pipeline stages, not to the wrappers around
    ``step`` that pause the garbage collector, set the matmul precision or trace it
    in line), and also to (that stage, the
    innermost module of ``package`` on the stack). Returns (by_stage, by_stage_leaf),
    Counters of kernels. Kernels without a frame are counted by opcode
    (:func:`no_source_key`)."""
    import collections
    stage, leaf = collections.Counter(), collections.Counter()
    for op, _, chain in kernel_ops(text):
        frames = _package_frames(chain, package)
        st = next((f"{mod}.{fn}" for mod, fn in frames
                   if not any(mod.endswith(s) or s.endswith(mod) for s in skip_modules)),
                  None)
        if st is None:
            st = f"{frames[-1][0]}.{frames[-1][1]}" if frames else no_source_key(op)
        stage[st] += 1
        if frames:
            leaf[(st, frames[-1][0])] += 1
    return stage, leaf


def runtime_attribution(compiled, args, nrun=5, depth=1, package="simjax"):
    """Run time of a compiled function's kernels attributed to source functions.

    ``compiled`` (a ``jax.stages.Compiled``) is called ``nrun`` times on ``args`` (a
    tuple) under jax's profiler; every kernel event of the trace (a fusion, a LAPACK
    call, a copy; loops, conditionals and calls are left out, their kernels are events
    of their own) is charged to the ``depth`` innermost functions of ``package`` on its
    instruction's stack in the optimised HLO, joined by " < ", or ``(none)`` where the
    instruction names none. Returns (microseconds, events), Counters per call of the
    compiled function. The profiler adds a fixed cost to every kernel event, so rank
    by these figures, and time changes by CPU time (:func:`cpu_time`): a function
    whose kernels run many times (a loop of row updates) is overstated."""
    import collections
    where = {}
    for op, line, chain in kernel_ops(compiled.as_text()):
        if op not in ("while", "conditional", "call"):
            where[_INSTR.match(line).group(1)] = " < ".join(
                f"{mod}.{fn}" for mod, fn in _package_frames(chain, package)[::-1][:depth]
            ) or "(none)"
    spent, count = collections.Counter(), collections.Counter()
    for e in traced_events(lambda a: compiled(*a), args, nrun):
        # ("end: <kernel>" events, the completion of some kernels, are not counted)
        if e["name"] in where:
            spent[where[e["name"]]] += e["dur"] / nrun
            count[where[e["name"]]] += 1 / nrun
    return spent, count
