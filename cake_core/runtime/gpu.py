"""Run a compiled kernel on an NVIDIA GPU through CuPy: correctness gate, then timing.

CuPy is imported lazily, so this module imports on a CPU machine; only calling
into it needs a GPU.

Correctness gate, per shape (docs/architecture.md §7; the steps in ``runtime.gate``): a shape outside the
program's domain (``ir.domain``, when the program is given) is refused before any launch; inputs
drawn on the device, seeded per (seed, shape) (never zeros); outputs poisoned (NaN for floats, a
sentinel for integers) before every run; the reference is the problem's fp64 oracle run on the
device (``runtime.references``: once per problem, version, shape, seed and GPU model, cached under
the Cake home when a cache is given), for all output rows or, with ``rows=n``, for n random rows;
outputs are compared on the device (a few scalars come back); one input element is perturbed and
only the rows it feeds are recomputed: they must follow the perturbed oracle (and change where it
did), the others must still match the reference; after timing, the last timed output is compared
again. Each ``ShapeRun`` says which check it got (``check``, ``rows_checked``, ``perturbed``,
``reference``).

Timing protocol (``runtime.timing``, the peers' too): CUDA events around each launch on one stream,
``warmup`` launches first, L2 flushed before every timed launch by reading twice the largest L2 of the
target data (:class:`L2Flush`), inputs rotated among up to 4 copies when they are small; median, p10 and
p90 over ``reps`` (≥ 20) launches; with ``cutoff_ms``, a kernel whose median over its first 3 timed launches is
above the cutoff is timed no further (``ShapeRun.runs`` says how many, the message says why). Outputs the problem
declares zeroed (atomics accumulate into them) are zeroed inside each timed region,
after the start event: the zeroing is charged to the kernel; a kernel that only stores
into them (``LoweredKernel.accumulates``) gets them poisoned and no zeroing launch. The timer name and
the L2 state are recorded in every ``ShapeRun``.

A second timer, ``timer="graph"``, times a kernel as a decode step runs it: back to back with others,
from a CUDA graph. One replay launches it ``GRAPH_LAUNCHES`` times in a row, each launch on its own
copy of the inputs (so each reads its inputs from HBM, cold in L2: every copy is read once per
replay, after the same 256 MiB flush), zeroing included; CUDA events around the replay; the time per
launch is the replay's over the launches. It leaves out the ~2 µs that an isolated launch costs
on the GPU (``bench/read_floor.py`` measures it) and that a kernel of 10 µs cannot hide, and keeps
the gap between launches. The peers are timed the same way (``cake_core.runtime.peers.time_peer``).

A fault poisons the CUDA context: after one, the remaining shapes are not run
(the caller's worker process should be restarted). Waiting is a blocking device
synchronize in a helper thread under the watchdog (``_Launcher.wait``): a fault
surfaces as ``runtime_fault`` with CUDA's message, a kernel that outlives
``timeout_s`` as ``timeout``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from cake_core.errors import CakeError
from cake_core.ir.domain import domain_violations
from cake_core.ir.expr import evaluate
from cake_core.ir.numeric import bf16_round
from cake_core.ir.program import Program
from cake_core.ir.types import DType
from cake_core.lower.compile import Compiled
from cake_core.lower.context import LoweredKernel
from cake_core.outcome import Outcome
from cake_core.problems.base import Problem, Shape, input_sampler, seed_words, shape_key
from cake_core.runtime.gate import CheckInfo, compare_to, info_for, perturbation_check, pick_rows
from cake_core.runtime.references import Reference, ReferenceCache, reference
from cake_core.runtime.refused import GPURefused
from cake_core.runtime.tma import encode_tensor_maps
from cake_core.runtime.timing import (L2_FLUSH_BYTES, L2_STATE, MIN_REPS, TIMERS, cupy_clock, input_copies, stats,
                                      time_regions)
from cake_core.targets import find_arch

INT_SENTINEL = -0x7FFFFFFF


@dataclass
class ShapeRun:
    """One shape's verdict. Timings are None when not timed or not correct."""

    shape: dict
    correct: bool
    max_error: float
    message: str
    median_ms: float | None = None
    p10_ms: float | None = None
    p90_ms: float | None = None
    runs: int = 0            # timed launches (or replays) behind the figures: fewer than asked when cut short
    timer: str = TIMERS["event"]
    l2: str = L2_STATE       # L2Flush: a read of twice the largest L2 before each timed launch
    outcome: str = Outcome.CHECKED.value   # checked | measured | wrong | runtime_fault | timeout
    refused: bool = False    # outside the program's domain: never launched (outcome wrong, the message names the bound)
    check: str = ""          # full | rows (see runtime.gate.CheckInfo); '' when not checked
    rows_checked: int = 0
    perturbed: str = ""      # the element the perturbation check changed and the rows it recomputed
    reference: str = ""      # cached | computed ... (runtime.references)

    def with_info(self, info: CheckInfo) -> "ShapeRun":
        self.check, self.rows_checked, self.perturbed, self.reference = (info.check, info.rows, info.perturbed,
                                                                         info.reference)
        return self


def _cupy():
    import cupy  # noqa: PLC0415 - lazily: the module must import on CPU-only machines
    return cupy


def device_kind() -> str:
    """The device kind references are drawn, computed and cached for here (``cuda:NVIDIA H200``)."""
    return f"cuda:{gpu_model() or 'unknown'}"


def gpu_model() -> str | None:
    """The name of GPU 0 (e.g. ``NVIDIA H200``), or None without CuPy or a GPU."""
    try:
        cp = _cupy()
        if cp.cuda.runtime.getDeviceCount() < 1:
            return None
        name = cp.cuda.runtime.getDeviceProperties(0)["name"]
        return name.decode() if isinstance(name, bytes) else str(name)
    except Exception:  # noqa: BLE001 - no driver, no device, no cupy: all mean "no GPU here"
        return None


# ---------------------------------------------------------------- host <-> device

def _num_sms(cp) -> int:
    """The current GPU's SM count: the launch symbol ``num_sms`` of a persistent kernel's grid."""
    return int(cp.cuda.Device().attributes["MultiProcessorCount"])


def _to_device(cp, x, dtype: DType):
    """``x`` (numpy or already on the device) as the kernel's argument of ``dtype``."""
    if dtype is DType.BF16:   # inputs are float32 already rounded to bf16: keep the top 16 bits
        x32 = cp.ascontiguousarray(bf16_round(cp.asarray(x, dtype=cp.float32)))
        return (x32.view(cp.uint32) >> cp.uint32(16)).astype(cp.uint16)
    np_dtype = {DType.F16: np.float16, DType.F32: np.float32, DType.I32: np.int32, DType.I64: np.int64,
                DType.BOOL: np.bool_}.get(dtype)
    if np_dtype is None:
        raise GPURefused(f"the GPU runtime cannot upload {dtype.value} tensors yet")
    return cp.ascontiguousarray(cp.asarray(x, dtype=np_dtype))


def _alloc(cp, shape: tuple[int, ...], dtype: DType):
    return cp.empty(shape, dtype={DType.BF16: np.uint16, DType.F16: np.float16, DType.F32: np.float32,
                                  DType.I32: np.int32, DType.I64: np.int64}[dtype])


def _poison(buf, dtype: DType) -> None:
    if dtype is DType.BF16:
        buf.fill(0x7FC0)                # bf16 quiet NaN
    elif dtype.is_float:
        buf.fill(np.nan)
    else:
        buf.fill(INT_SENTINEL)


def _to_host(buf, dtype: DType) -> np.ndarray:
    h = buf.get()
    if dtype is DType.BF16:
        return (h.astype(np.uint32) << 16).view(np.float32)
    return h


def _on_device(cp, buf, dtype: DType):
    """A device copy of output ``buf`` as values (bf16 bits widened to float32): what the gate compares."""
    if dtype is DType.BF16:
        return (buf.astype(cp.uint32) << cp.uint32(16)).view(cp.float32)
    return buf.copy()


class _Fault(Exception):
    def __init__(self, outcome: Outcome, message: str):
        super().__init__(message)
        self.outcome, self.message = outcome, message


class _Launcher:
    """One kernel, its arguments for one shape, and a launch with a watchdog."""

    def __init__(self, cp, fn, lowered: LoweredKernel, problem: Problem, shape: Shape, stream, timeout_s: float):
        self.cp, self.fn, self.lowered, self.problem, self.shape = cp, fn, lowered, problem, shape
        self.stream, self.timeout_s = stream, timeout_s
        self.grid = lowered.grid_for(shape, num_sms=_num_sms(cp) if lowered.persistent else None)
        self.shapes = {a.name: tuple(int(evaluate(d, {**dict(lowered.consts), **shape})) for d in a.shape)
                       for a in lowered.params}
        self.dtypes = {a.name: a.dtype for a in lowered.params}
        unknown = [a.name for a in lowered.params if a.name not in problem.params]
        if unknown:
            raise GPURefused(f"kernel parameter `{unknown[0]}` is neither an input ({', '.join(problem.inputs)}) "
                             f"nor an output ({', '.join(problem.outputs)}) of problem {problem.name}")
        self.outputs = {n: _alloc(cp, self.shapes[n], self.dtypes[n]) for n in problem.outputs}
        # in/out states: the kernel updates its own buffer (in ``outputs``); each input set carries the drawn
        # value, copied in before every checked launch
        self.states = tuple(n for n in problem.states if n in self.shapes)
        # a kernel that only stores into a zeroed output (each element once) runs without the zeroing launch
        self.zeroed = problem.zeroed_for(lowered.accumulates)

    def upload(self, inputs: dict[str, np.ndarray]) -> dict[str, Any]:
        dev = {}
        for name in self.problem.inputs:
            if name not in self.shapes:
                continue   # an input this kernel does not read
            if tuple(inputs[name].shape) != self.shapes[name]:
                raise GPURefused(f"input `{name}` has shape {inputs[name].shape}, the kernel expects "
                                 f"{self.shapes[name]}")
            dev[name] = _to_device(self.cp, inputs[name], self.dtypes[name])
        return dev

    def args(self, dev_in: dict[str, Any]) -> tuple:
        bufs = [dev_in[a.name] if a.name in dev_in and a.name not in self.states else self.outputs[a.name]
                for a in self.lowered.params]
        args = tuple(bufs) + tuple(np.int32(self.shape[d]) for d in self.lowered.dims)
        if self.lowered.tensor_maps:   # TMA: one 128-byte CUtensorMap by value per map (TMARefused: no launch)
            args += tuple(encode_tensor_maps(self.lowered, {a.name: b for a, b in zip(self.lowered.params, bufs)},
                                             self.shape))
        return args

    def launch(self, args: tuple) -> None:
        try:
            # RawKernel launches on the current stream: check_and_time runs inside `with stream:`
            self.fn(self.grid, (self.lowered.threads, 1, 1), args, shared_mem=self.lowered.smem_bytes)
        except Exception as e:  # noqa: BLE001 - a launch refused (resources, bad config) is the kernel's fault
            raise _Fault(Outcome.RUNTIME_FAULT, f"launch failed: {e}") from None

    def wait(self, what: str) -> None:
        """Wait for everything launched so far, under the watchdog.

        A blocking ``cudaDeviceSynchronize`` in a helper thread, joined with ``timeout_s``: it
        returns the sticky error of a faulted kernel (illegal address, trap) at once, whereas
        polling ``cudaEventQuery`` does not (seen on the H200, driver 580.159.04, 2026-11-29: after
        an MMU fault, Xid 31, the event query kept answering "not ready" and the fault looked like
        a hang). A kernel still running after ``timeout_s`` is reported as ``timeout``; the helper
        thread stays blocked (a daemon), and the process must be replaced, as after any fault.
        """
        import threading
        box: dict[str, Any] = {}

        def sync() -> None:
            try:
                self.cp.cuda.runtime.deviceSynchronize()
            except Exception as e:  # noqa: BLE001 - CUDA errors surface here (illegal address, trap...)
                box["error"] = e

        t = threading.Thread(target=sync, name="cake-gpu-wait", daemon=True)
        t.start()
        t.join(self.timeout_s)
        if t.is_alive():
            raise _Fault(Outcome.TIMEOUT, f"{what}: the kernel did not finish within {self.timeout_s:g} s")
        if "error" in box:
            e = box["error"]
            raise _Fault(Outcome.RUNTIME_FAULT, f"{what}: {type(e).__name__}: {e}")

    def reset_outputs(self, dev_in: dict[str, Any]) -> None:
        """Poison every output (so unwritten elements fail the gate), except those the problem
        declares zeroed and the kernel accumulates into (atomics across CTAs add into them), and the
        states, which start from their drawn value in ``dev_in``."""
        for n, buf in self.outputs.items():
            if n in self.states:
                buf[...] = dev_in[n]
            elif n in self.zeroed:
                buf.fill(0)
            else:
                _poison(buf, self.dtypes[n])

    def zero_accumulators(self) -> None:
        """Zero the outputs the kernel accumulates into (on the current stream), so that each
        launch, timed ones included, starts from zero as the oracle assumes."""
        for n in self.zeroed:
            self.outputs[n].fill(0)

    def run_checked(self, dev_in: dict[str, Any], what: str) -> dict[str, Any]:
        """Poison, launch, wait: a device copy of the outputs."""
        self.reset_outputs(dev_in)
        self.launch(self.args(dev_in))
        self.wait(what)
        return self.got_device()

    def got(self) -> dict[str, np.ndarray]:
        """The outputs on the host (for callers that inspect them; the gate compares on the device)."""
        return {n: _to_host(buf, self.dtypes[n]) for n, buf in self.outputs.items()}

    def got_device(self) -> dict[str, Any]:
        """A device copy of the outputs, as values."""
        return {n: _on_device(self.cp, buf, self.dtypes[n]) for n, buf in self.outputs.items()}


_FLUSH_SRC = r"""
extern "C" __global__ void cake_l2_flush(const int4* __restrict__ p, unsigned long long n, int* sink) {
    int acc = 0;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        const int4 v = __ldcg(p + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x7eadbeef) *sink = acc;   // the buffer is zeros: never taken, but keeps every load
}
"""


class L2Flush:
    """Leaves the L2 cold and clean before a timed launch: one kernel reads a zero buffer of
    ``L2_FLUSH_BYTES`` (twice the largest L2 of the target data) through L2. A write flush (memset) would
    leave dirty lines that the timed kernel's own reads then have to write back to HBM; a read flush charges
    that writeback of earlier outputs to the flush, as in a steady state where L2 holds data other kernels
    read. The peers (``cake_core.runtime.peers.time_peer``) are flushed the same way."""

    def __init__(self, cp, nbytes: int = L2_FLUSH_BYTES):
        self.buf = cp.zeros(nbytes // 16 * 4, dtype=np.int32)
        self.sink = cp.zeros(1, dtype=np.int32)
        self.fn = cp.RawKernel(_FLUSH_SRC, "cake_l2_flush")
        self.n = np.uint64(self.buf.size // 4)

    def __call__(self, stream) -> None:
        self.fn((1056,), (256,), (self.buf, self.n, self.sink), stream=stream)


def _timed_launches(cp, L: _Launcher, arg_sets: list[tuple], reps: int, stream, flush,
                    cutoff_ms: float | None = None) -> list[float]:
    """``reps`` launches, each after an L2 flush, each timed by its own pair of CUDA events (ms); fewer when
    the first few are above ``cutoff_ms`` (``runtime.timing.time_regions``).

    The zeroing of the outputs the problem declares zeroed is inside the timed region: it is part of
    what an accumulating (split-K) kernel costs against one that stores each element once, and it
    keeps atomics from adding up across launches."""
    def body(r: int) -> None:
        L.zero_accumulators()
        L.launch(arg_sets[r % len(arg_sets)])

    return time_regions(cupy_clock(cp), reps, stream, flush, body, lambda: L.wait("timed runs"),
                        cutoff_ms=cutoff_ms)


def capture_graph(stream, enqueue: Callable[[], None]):
    """The CUDA graph of what ``enqueue`` launches on ``stream`` (CuPy stream capture)."""
    stream.begin_capture()
    try:
        enqueue()
    finally:
        graph = stream.end_capture()
    return graph


def _graph_timed(cp, L: _Launcher, arg_sets: list[tuple], reps: int, warmup: int, stream, flush) -> list[float]:
    """``reps`` replays of one CUDA graph of ``len(arg_sets)`` back-to-back launches (each on its own
    input copy, after the zeroing of the outputs it accumulates into), each replay after an L2 flush and
    between its own pair of CUDA events; ms per launch."""
    def enqueue() -> None:
        for args in arg_sets:
            L.zero_accumulators()
            L.launch(args)

    graph = capture_graph(stream, enqueue)
    for _ in range(warmup):
        graph.launch(stream)
    L.wait("graph warm-up")
    ms = time_regions(cupy_clock(cp), reps, stream, flush, lambda r: graph.launch(stream),
                      lambda: L.wait("timed graph replays"))
    return [m / len(arg_sets) for m in ms]


def device_reference(cp, problem: Problem, shape: Shape, seed: int, device: str, refs: ReferenceCache | None,
                     rows: int | None) -> tuple[dict[str, Any], Reference]:
    """The shape's inputs, drawn on the device, and their reference (computed there, or from the cache): the
    gate's draw for (seed, shape), which the peers are measured on too (``pipeline.execute.GpuSession.peer``).
    ``rows``: that many random output rows (``gate.pick_rows`` under ``seed``) instead of all of them."""
    inputs = problem.make_inputs(shape, input_sampler(seed, shape, cp))
    sel = None if rows is None else pick_rows(problem, shape, rows, seed)
    try:
        return inputs, reference(problem, inputs, shape, seed, device=device, cache=refs, rows=sel)
    except cp.cuda.memory.OutOfMemoryError as e:
        raise GPURefused(f"the fp64 reference of {problem.name} at {shape_key(shape)} does not fit in GPU memory "
                         f"({e}); check it on a subset of rows (rows=256)") from None


def _check_shape(cp, fn, lowered: LoweredKernel, problem: Problem, shape: Shape, *, seed: int, time: bool,
                 reps: int, warmup: int, timeout_s: float, stream, flush, timer: str = "event",
                 refs: ReferenceCache | None = None, device: str = "cuda", rows: int | None = None,
                 cutoff_ms: float | None = None) -> ShapeRun:
    L = _Launcher(cp, fn, lowered, problem, shape, stream, timeout_s)
    inputs, ref = device_reference(cp, problem, shape, seed, device, refs, rows)
    dev_in = L.upload(inputs)

    got = L.run_checked(dev_in, "correctness run")
    ok, err, msg = compare_to(problem, got, ref)
    if not ok:
        return ShapeRun(dict(shape), False, err, f"wrong: {msg}",
                        outcome=Outcome.WRONG.value).with_info(info_for(problem, shape, ref))

    # perturbation: the output must follow a changed input (no result cached from setup)
    bf16 = L.dtypes.get(problem.perturbed) is DType.BF16
    p_ok, p_err, p_msg, what = perturbation_check(
        problem, shape, inputs, got, ref, lambda p_inputs: L.run_checked(L.upload(p_inputs), "perturbation run"),
        seed_words(seed, shape), bf16)
    info = info_for(problem, shape, ref, what)
    del got
    if not p_ok:
        return ShapeRun(dict(shape), False, p_err, f"wrong after perturbing one input element: {p_msg}",
                        outcome=Outcome.WRONG.value).with_info(info)
    if not time:
        return ShapeRun(dict(shape), True, max(err, p_err), "correct (not timed)",
                        outcome=Outcome.CHECKED.value).with_info(info)

    # timing: cold L2, rotating input copies (the graph timer: one copy per launch of a replay)
    n_copies = input_copies(sum(int(b.nbytes) for b in dev_in.values()), timer)
    copies = [dev_in] + [{k: v.copy() for k, v in dev_in.items()} for _ in range(n_copies - 1)]
    arg_sets = [L.args(c) for c in copies]
    for r in range(warmup):
        L.launch(arg_sets[r % len(arg_sets)])
    L.wait("warm-up")
    L.reset_outputs(dev_in)
    reps = max(reps, MIN_REPS)
    if timer == "graph":
        ms = _graph_timed(cp, L, arg_sets, reps, warmup, stream, flush)
        how = f"{len(copies)} back-to-back launches per graph replay, each on its own input copy"
    else:
        ms = _timed_launches(cp, L, arg_sets, reps, stream, flush, cutoff_ms)
        how = f"{len(copies)} input copies rotated"
        if len(ms) < reps:
            how += (f"; timing cut short after {len(ms)} of {reps} runs: their median {stats(ms)[0]:.4g} ms is above "
                    f"the cutoff {cutoff_ms:.4g} ms")

    # a state was updated by every timed launch: the re-check runs once more from its drawn value
    after = L.run_checked(dev_in, "re-check") if L.states else L.got_device()
    ok2, err2, msg2 = compare_to(problem, after, ref)
    if not ok2:
        return ShapeRun(dict(shape), False, err2, f"wrong after timing (re-check): {msg2}",
                        outcome=Outcome.WRONG.value).with_info(info)
    med, p10, p90 = stats(ms)
    return ShapeRun(dict(shape), True, max(err, p_err, err2), f"correct; {how}",
                    med, p10, p90, len(ms), timer=TIMERS[timer], outcome=Outcome.MEASURED.value).with_info(info)


def check_and_time(compiled: Compiled, lowered: LoweredKernel, problem: Problem, shapes: list[Shape], *,
                   seed: int, time: bool = True, reps: int = 20, warmup: int = 3,
                   timeout_s: float = 30.0, timer: str = "event", program: Program | None = None,
                   refs: ReferenceCache | None = None, rows: int | None = None,
                   cutoff_ms: float | None = None) -> list[ShapeRun]:
    """Correctness gate (and timing, with ``time=True``) of one kernel on every shape.

    Parameters
    ----------
    compiled, lowered: the cubin and the lowering that made it (launch geometry, argument order).
    problem: inputs, oracle and tolerance.
    shapes: assignments of the problem's dimensions.
    seed: seeds the input generator of every shape.
    timeout_s: watchdog per wait; a kernel still running after it is reported as ``timeout``.
    timer: ``"event"`` (each launch alone between CUDA events) or ``"graph"`` (launches back to back
        from a CUDA graph; see the module doc).
    program: the IR the kernel was lowered from; with it, a shape outside its domain (``ir.domain``) is
        refused before any launch (``ShapeRun.refused``, the message names the bound).
    refs: the reference cache (``ReferenceCache(home / "refs")``); None computes each reference anew.
    rows: check this many random output rows of each shape instead of all of them (very large shapes).
    cutoff_ms: stop timing a shape after ``runtime.timing.CUTOFF_MIN_REPS`` launches when their median is above
        it (the event timer only; ``ShapeRun.runs`` then says how many were timed). None: every rep.

    Returns one :class:`ShapeRun` per shape, in order. After a fault or a timeout
    the CUDA context is unusable; the remaining shapes are reported as not run.
    Raises :class:`GPURefused` when the kernel cannot run here at all.
    """
    if timer not in TIMERS:
        raise GPURefused(f"unknown timer {timer!r}: use one of {', '.join(TIMERS)}")
    if cutoff_ms is not None and timer != "event":
        raise GPURefused(f"a timing cutoff applies to the event timer, not {timer!r}: pass cutoff_ms=None")
    tgt = find_arch(compiled.arch)
    if tgt is None or not tgt.runs_here:
        raise GPURefused(f"{compiled.arch} kernels are compile-only here (cake_core/targets/archs/{compiled.arch}.json "
                         "says runs_here=false); time it on a machine of that architecture")
    cp = _cupy()
    try:
        major = int(cp.cuda.Device(0).compute_capability) // 10
    except Exception as e:  # noqa: BLE001
        raise GPURefused(f"no usable CUDA GPU: {e}") from None
    want_cc = tgt.compute_capability[0]
    if major != want_cc:
        raise GPURefused(f"the GPU has compute capability {major}.x; a {compiled.arch} cubin needs {want_cc}.x")
    mod = cp.RawModule(path=str(compiled.cubin_path))
    fn = mod.get_function(compiled.kernel_name)
    if lowered.smem_bytes > tgt.smem_static_limit_bytes:
        fn.max_dynamic_shared_size_bytes = lowered.smem_bytes
    stream = cp.cuda.Stream(non_blocking=True)
    flush = L2Flush(cp) if time else None
    device = device_kind()
    out: list[ShapeRun] = []
    dead: str | None = None
    with stream:
        for shape in shapes:
            shape = {d: int(shape[d]) for d in problem.dims} if set(problem.dims) <= set(shape) else shape
            refused = domain_violations(program, shape) if program is not None else []
            if refused:
                out.append(ShapeRun(dict(shape), False, float("inf"),
                                    "refused: " + "; ".join(d.message for d in refused),
                                    outcome=Outcome.WRONG.value, refused=True))
                continue
            if dead:
                out.append(ShapeRun(dict(shape), False, float("inf"), f"not run: {dead}",
                                    outcome=Outcome.RUNTIME_FAULT.value))
                continue
            try:
                out.append(_check_shape(cp, fn, lowered, problem, shape, seed=seed, time=time, reps=reps,
                                        warmup=warmup, timeout_s=timeout_s, stream=stream, flush=flush,
                                        timer=timer, refs=refs, device=device, rows=rows, cutoff_ms=cutoff_ms))
            except _Fault as f:
                out.append(ShapeRun(dict(shape), False, float("inf"), f.message, outcome=f.outcome.value))
                dead = f"an earlier shape ended in {f.outcome.value}; the CUDA context is unusable"
    return out
