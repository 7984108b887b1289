"""A per-shape kernel dispatcher exported by ``cake export``: ``covered``, ``route_of`` and ``run``.

This file is the template of every exported package's ``__init__.py``: ``cake export`` copies it and pins
the digest of the package's ``manifest.json`` in :data:`MANIFEST_SHA256`. It imports the standard library
and the package's ``cuda_driver`` only (no Cake, no numpy); tensors are torch tensors or CuPy arrays.

- ``covered(**shape)``, ``route_of(**shape)``: whether a shape (every dimension by name) has a route, and
  which kernel serves it, with its measured median and the peer's where one was measured.
- Routing: a measured shape goes to the kernel measured fastest there (an ``exact`` route). A shape with no
  exact route (never measured, or a held-out row) is served only when the package was exported with
  ``--unmeasured`` (it then has ``domain`` routes): by the kernel that won the nearest measured shape among the
  kernels whose domain holds it (the distance of two shapes: the sum over the dims of |log2 a - log2 b|; ties
  to the smaller shape key), and ``route_of`` names that shape (``nearest_shape``) and its median there
  (``nearest_ms``). No such kernel: the shape is refused. A package exported with ``--cede-to-peer`` leaves
  the measured shapes where the peer was faster (the manifest's ``ceded``) to the caller: they are refused, and so
  is an unmeasured shape whose nearest measured shape is one of them.
- ``run(stream=None, fallback=None, **tensors)``: infers the shape from the tensors' shapes (the manifest's
  parameter shapes), checks dtypes and contiguity, picks the route, launches the kernel on ``stream`` (a torch
  or CuPy stream, or a raw handle; default: stream 0). A dimension no tensor has as an extent (a flag that
  decides only what the inputs hold) is passed by name beside the tensors, an int. A shape no route covers
  raises :class:`ShapeNotCovered` before any CUDA call, unless ``fallback`` is given: it is called with the same
  arguments.

Refusals are one line each: :class:`ManifestTampered` (on import), :class:`WrongGPU` (the first run on a
device whose name is not the manifest's GPU model), :class:`ShapeNotCovered`, :class:`BadArgument`.
Expressions of the manifest (grids, shapes, domains) are read by a small evaluator over ``ast``: names, ints,
``+ - * // %``, ``cdiv``, ``min``, ``max`` (and one comparison in a domain's conditions); never ``eval``.
"""
from __future__ import annotations

import ast
import ctypes
import hashlib
import json
import math
import re
from pathlib import Path

MANIFEST_SHA256: str | None = None   # pinned by `cake export` in the package it writes

_DTYPES = {   # manifest dtype -> the dtype names torch and CuPy give (CuPy holds bf16 as its raw uint16 bits)
    "bf16": ("torch.bfloat16", "bfloat16", "uint16"), "f16": ("torch.float16", "float16"),
    "f32": ("torch.float32", "float32"), "i32": ("torch.int32", "int32"), "i64": ("torch.int64", "int64"),
    "bool": ("torch.bool", "bool"), "e4m3": ("torch.float8_e4m3fn", "uint8"), "e5m2": ("torch.float8_e5m2", "uint8"),
}


class ExportedError(Exception):
    """Every refusal of an exported package."""


class ManifestTampered(ExportedError):
    """manifest.json (or a cubin) is not what `cake export` wrote."""


class ShapeNotCovered(ExportedError):
    """No route serves the shape."""


class WrongGPU(ExportedError):
    """The device is not the GPU model the kernels were measured on."""


class BadArgument(ExportedError):
    """A tensor is missing, extra, of the wrong dtype or shape, not contiguous or not on a GPU."""


class BadExpression(ExportedError):
    """A manifest expression outside the evaluator's grammar."""


# ---------------------------------------------------------------- the expression evaluator

_BINOPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
           ast.FloorDiv: lambda a, b: a // b, ast.Mod: lambda a, b: a % b}
_CMPOPS = {ast.Lt: lambda a, b: a < b, ast.LtE: lambda a, b: a <= b, ast.Gt: lambda a, b: a > b,
           ast.GtE: lambda a, b: a >= b, ast.Eq: lambda a, b: a == b, ast.NotEq: lambda a, b: a != b}
_FUNCS = {"cdiv": lambda a, b: -(-a // b), "min": min, "max": max}
_PARSED: dict[tuple[str, bool], ast.expr] = {}


class UnknownName(BadExpression):
    """A name the environment does not give."""


def _node(text: str, compare: bool) -> ast.expr:
    key = (text, compare)
    if key not in _PARSED:
        if not isinstance(text, str) or len(text) > 2000:
            raise BadExpression(f"manifest expression {text!r:.60}: not a short text")
        try:
            tree = ast.parse(text, mode="eval").body
        except SyntaxError:
            raise BadExpression(f"manifest expression {text!r}: not an expression") from None
        _check(tree, text, compare, top=True)
        _PARSED[key] = tree
    return _PARSED[key]


def _check(n: ast.AST, text: str, compare: bool, top: bool = False) -> None:
    ok = (isinstance(n, ast.Constant) and type(n.value) is int) or isinstance(n, ast.Name) or \
        (isinstance(n, ast.BinOp) and type(n.op) in _BINOPS) or \
        (isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.USub)) or \
        (isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in _FUNCS and not n.keywords
         and len(n.args) == 2) or \
        (compare and top and isinstance(n, ast.Compare) and len(n.ops) == 1 and type(n.ops[0]) in _CMPOPS)
    if not ok:
        raise BadExpression(f"manifest expression {text!r}: {type(n).__name__} is not allowed (names, ints, "
                            "+ - * // %, cdiv, min, max only)")
    for child in ([n.operand] if isinstance(n, ast.UnaryOp) else [n.left, n.right] if isinstance(n, ast.BinOp)
                  else n.args if isinstance(n, ast.Call) else [n.left, *n.comparators] if isinstance(n, ast.Compare)
                  else []):
        _check(child, text, compare)


def _value(n: ast.expr, env: dict[str, int]) -> int:
    if isinstance(n, ast.Constant):
        return n.value
    if isinstance(n, ast.Name):
        if n.id not in env:
            raise UnknownName(n.id)
        return env[n.id]
    if isinstance(n, ast.BinOp):
        a, b = _value(n.left, env), _value(n.right, env)
        if b == 0 and isinstance(n.op, (ast.FloorDiv, ast.Mod)):
            raise BadExpression("division by zero in a manifest expression")
        return _BINOPS[type(n.op)](a, b)
    if isinstance(n, ast.UnaryOp):
        return -_value(n.operand, env)
    if isinstance(n, ast.Call):
        a, b = (_value(x, env) for x in n.args)
        if n.func.id == "cdiv" and b == 0:
            raise BadExpression("division by zero in a manifest expression")
        return _FUNCS[n.func.id](a, b)
    return _CMPOPS[type(n.ops[0])](_value(n.left, env), _value(n.comparators[0], env))


def evaluate(text: str, env: dict[str, int], compare: bool = False) -> int:
    """The value of manifest expression ``text`` over ``env`` (a comparison, when ``compare``, gives a bool)."""
    return _value(_node(text, compare), env)


# ---------------------------------------------------------------- domains

def domain_refusal(domain: dict, shape: dict[str, int], consts: dict[str, int]) -> str:
    """Why ``shape`` is outside a kernel's domain (the manifest's plain-data form of ``cake_core.ir.domain``),
    or '' when it is inside."""
    env = {**shape, **consts}

    def applies(when: list[str]) -> bool:
        return all(evaluate(c, env, compare=True) for c in when)

    for ext in domain.get("extents", ()):
        ends = [a["end"] for a in ext["accesses"] if applies(a["when"])]
        if not ends or any(e is None for e in ends):
            continue
        v = evaluate(ext["dim"], env)
        if v > max(ends):
            return f"{ext['dim']} = {v} > {max(ends)}, the most `{ext['param']}` is read or written along it"
    for b in domain.get("multiples", ()):
        if applies(b["when"]):
            v = evaluate(b["expr"], env)
            if v % b["value"]:
                return f"{b['expr']} = {v} is not a multiple of {b['value']} ({b['rule']})"
    for g in domain.get("grid", ()):
        v = evaluate(g["extent"], env)
        if v > g["max"]:
            return f"its grid's {g['axis']} dimension {g['extent']} = {v} > {g['max']}, the most CUDA launches along it"
    return ""


def shape_point(shape: dict[str, int], dims: list[str]) -> tuple[float, ...]:
    """A shape as a point: log2 of each dimension, in ``dims``' order."""
    return tuple(math.log2(shape[x]) for x in dims)


def distance(p: tuple[float, ...], q: tuple[float, ...]) -> float:
    """The distance of two shapes' points: the sum of |log2 a - log2 b| (to 1e-9, so that equal sums tie)."""
    return round(sum(abs(a - b) for a, b in zip(p, q)), 9)


def parse_key(key: str) -> dict[str, int]:
    """A shape key (``B=1,N=128``) as a shape."""
    return {x: int(v) for x, v in (kv.split("=") for kv in key.split(","))}


def model_matches(device_name: str, model: str) -> bool:
    """Whether a device name (``NVIDIA H200``) names ``model`` (``H200``) as a whole word, or is it."""
    cleaned = re.sub(r"[^A-Za-z0-9.\-]+", "-", device_name.strip()).strip("-")
    return cleaned == model or re.search(rf"(^|[^A-Z0-9]){re.escape(model.upper())}($|[^A-Z0-9])",
                                         device_name.upper()) is not None


# ---------------------------------------------------------------- tensors

def _torch_ptr(t) -> int:
    if not t.is_cuda or not t.is_contiguous():
        raise BadArgument(f"a tensor of shape {tuple(t.shape)} is {'not contiguous' if t.is_cuda else 'not on a GPU'}")
    return t.data_ptr()


def _cupy_ptr(t) -> int:
    if not t.flags.c_contiguous:
        raise BadArgument(f"an array of shape {tuple(t.shape)} is not C-contiguous")
    return t.data.ptr


def _device_of(t) -> int:
    return t.get_device() if hasattr(t, "get_device") else int(t.device.id)


def stream_handle(stream) -> int:
    """A raw CUstream from a torch stream, a CuPy stream, an int or None (stream 0)."""
    if stream is None:
        return 0
    if isinstance(stream, int):
        return stream
    for attr in ("cuda_stream", "ptr"):
        if hasattr(stream, attr):
            return int(getattr(stream, attr))
    raise BadArgument(f"stream {stream!r}: pass a torch or CuPy stream, a raw handle or None")


# ---------------------------------------------------------------- the dispatcher

class _Launch:
    """One route's kernel at one shape: the grid, and the ctypes argument buffers reused by every call."""

    def __init__(self, d: "Dispatcher", kernel: dict, shape: dict[str, int], order: list[int], sizes: list[int]):
        self.d, self.kernel, self.shape, self.order = d, kernel, shape, order
        self.ordinal: int | None = None     # the device the function, grid and tensor maps were prepared on
        self.threads, self.smem_bytes = kernel["threads"], kernel["smem_bytes"]
        self.ptrs = [ctypes.c_uint64() for _ in order]
        self.dims = [ctypes.c_int32(shape[x]) for x in kernel["dims"]]
        self.tmaps = [ctypes.create_string_buffer(0) for _ in kernel["tensor_maps"]]
        self.tmap_at: list[int] = []
        self.encoded_for: tuple = ()
        self.zeroed = [(kernel["params"].index(z), sizes[order[kernel["params"].index(z)]]) for z in kernel["zeroed"]]

    def prepare(self, ordinal: int) -> None:
        d, k = self.d, self.kernel
        drv = self.drv = d.driver(ordinal)
        self.fn = d.function(ordinal, k)
        env = {**k["consts"], **self.shape}
        if k["persistent"]:
            env["num_sms"] = drv.sm_count(ordinal)
        grid = [evaluate(g, env) for g in k["grid"]]
        self.grid = tuple(grid + [1] * (3 - len(grid)))
        addresses = [ctypes.addressof(v) for v in self.ptrs + self.dims]
        from .cuda_driver import aligned_tmap
        self.tmap_at, self.encoded_for = [], ()
        for i in range(len(self.tmaps)):
            self.tmaps[i], at = aligned_tmap()
            self.tmap_at.append(at)
        self.params = (ctypes.c_void_p * (len(addresses) + len(self.tmap_at)))(*addresses, *self.tmap_at)
        self.ordinal = ordinal

    def encode(self, ptrs: list[int]) -> None:
        k, env = self.kernel, {**self.kernel["consts"], **self.shape}
        for spec, at in zip(k["tensor_maps"], self.tmap_at):
            i = k["params"].index(spec["gmem"])
            dims = [evaluate(e, env) for e in reversed(k["param_shapes"][i])]
            strides, step = [], spec["elem_bytes"]
            for extent in dims[:-1]:
                step *= extent
                strides.append(step)
            self.d.driver(None).encode_tmap(ptrs[i], spec, dims, strides, list(reversed(spec["box"])), at)
        self.encoded_for = tuple(ptrs)

    def __call__(self, ptrs: list[int], stream: int, ordinal: int) -> None:
        if ordinal != self.ordinal:          # the first call, or tensors on another device: its own function
            self.prepare(ordinal)
        drv = self.drv
        drv.use_device(ordinal)
        for slot, i in zip(self.ptrs, self.order):
            slot.value = ptrs[i]
        if self.tmap_at:
            mine = [ptrs[i] for i in self.order]
            if tuple(mine) != self.encoded_for:     # a new buffer: its tensor map is encoded again
                self.encode(mine)
        for p, nbytes in self.zeroed:
            drv.memset_zero(self.ptrs[p].value, nbytes, stream)
        drv.launch(self.fn, self.grid, self.threads, self.smem_bytes, stream, self.params)


class Dispatcher:
    """The routes of one manifest; its launches, prepared once per (kernel, shape) and kept."""

    def __init__(self, manifest: dict, folder: Path):
        self.m, self.folder = manifest, folder
        self.dims: list[str] = manifest["dims"]
        self.tensors: list[dict] = manifest["tensors"]
        self.names = [t["name"] for t in self.tensors]
        # dimensions no tensor has as an extent: run() cannot infer them, the caller passes them by name
        self.scalars = [x for x in self.dims if all(x not in t["shape"] for t in self.tensors)]
        self.kernels = {k["id"]: k for k in manifest["kernels"]}
        self.exact = manifest["exact"]
        # measured shapes where the peer was faster, left to the caller's fallback (`cake export --cede-to-peer`)
        self.ceded: dict = manifest.get("ceded", {})
        # every measured shape (key, the kernel that won it, its point; None: ceded), for the nearest-shape decision
        self.measured = sorted([(key, manifest["routes"][i]["kernel"], shape_point(parse_key(key), self.dims))
                                for key, i in self.exact.items()] +
                               [(key, None, shape_point(parse_key(key), self.dims)) for key in self.ceded])
        self._plans: dict = {}
        self._last_stream: tuple = (None, 0)   # the last stream object run() was given, and its raw handle
        self._functions: dict = {}
        self._checked: set[int] = set()
        self._driver = None

    @classmethod
    def load(cls, folder: Path, pinned: str) -> "Dispatcher":
        path = folder / "manifest.json"
        data = path.read_bytes()
        got = hashlib.sha256(data).hexdigest()
        if got != pinned:
            raise ManifestTampered(f"{path}: sha256 {got} is not the {pinned} pinned in {folder / '__init__.py'}; "
                                   "export the package again instead of editing it")
        return cls(json.loads(data), folder)

    # -- routes (no CUDA)
    def shape_of(self, shape: dict) -> dict[str, int]:
        extra = sorted(set(shape) - set(self.dims))
        missing = [x for x in self.dims if x not in shape]
        if extra or missing:
            raise BadArgument(f"a shape gives {', '.join(self.dims)}" + (f"; missing {', '.join(missing)}" if missing
                              else "") + (f"; unknown {', '.join(extra)}" if extra else ""))
        if not all(type(shape[x]) is int and shape[x] >= 1 for x in self.dims):
            raise BadArgument(f"shape {shape}: every dimension is an int >= 1")
        return {x: shape[x] for x in self.dims}

    def route(self, shape: dict[str, int]) -> tuple[dict, str] | None:
        """(the route serving ``shape``, the measured shape key that chose it); None when none does.

        A measured shape: its exact route and its own key. Another: among the domain routes (``--unmeasured``)
        whose kernel's domain holds it, the one whose kernel won the nearest measured shape (:func:`distance`,
        then the smaller key), and that shape's key."""
        key = ",".join(f"{x}={shape[x]}" for x in self.dims)
        hit = self.exact.get(key)
        if hit is not None:
            return self.m["routes"][hit], key
        if key in self.ceded or min(shape.values()) < 1:   # the peer's; an empty extent: no point to measure from
            return None
        holds = {}
        for r in self.m["routes"]:
            k = self.kernels[r["kernel"]]
            if r["kind"] == "domain" and not domain_refusal(k["domain"], shape, k["consts"]):
                holds.setdefault(r["kernel"], r)
        here = shape_point(shape, self.dims)
        near = min(((distance(here, p), mkey, kid) for mkey, kid, p in self.measured if kid is None or kid in holds),
                   default=None)
        return None if near is None or near[2] is None else (holds[near[2]], near[1])   # nearest ceded: the peer's

    def measurement(self, key: str) -> dict:
        """What the exact route of measured shape ``key`` holds of it: median, kind, run, peer, held_out."""
        return self.m["routes"][self.exact[key]]["shapes"][key]

    def covered(self, **shape) -> bool:
        return self.route(self.shape_of(shape)) is not None

    def route_of(self, **shape) -> dict | None:
        hit = self.route(self.shape_of(shape))
        if hit is None:
            return None
        r, source = hit
        k, at = self.kernels[r["kernel"]], self.measurement(source)
        exact = r["kind"] == "exact"
        return {"kernel": k["id"], "kernel_name": k["kernel_name"], "route": "exact" if exact else "nearest",
                "median_ms": at["median_ms"] if exact else None,
                "peer_ms": (at.get("peer") or {}).get("median_ms") if exact else None,
                "held_out": at.get("held_out", False), "nearest_shape": None if exact else source,
                "nearest_ms": None if exact else at["median_ms"]}

    def refusal(self, shape: dict[str, int]) -> str:
        key = ",".join(f"{x}={v}" for x, v in shape.items())
        c = self.ceded.get(key)
        if c is not None:
            return (f"shape {key} was left to the peer: {c['peer']} measured {c['peer_ms']:.4g} ms there against "
                    f"this package's {c['ours_ms']:.4g} ms on {self.m['gpu_model']} (exported with --cede-to-peer): "
                    "pass fallback= (the peer) to serve it")
        where = ("; it lies in no kernel's domain" if any(r["kind"] == "domain" for r in self.m["routes"])
                 else ", exported without --unmeasured")
        return (f"shape {key} is covered by no route of this {self.m['problem']} package ({len(self.exact)} measured "
                f"shapes on {self.m['gpu_model']}{where}): pass fallback= to serve it otherwise")

    # -- run
    def infer(self, ts: list, given: dict[str, int]) -> dict[str, int]:
        shape: dict[str, int] = dict(given)      # the dimensions passed by name (self.scalars)
        for t, spec in zip(ts, self.tensors):
            got = tuple(int(x) for x in t.shape)
            if len(got) != len(spec["shape"]):
                raise BadArgument(f"`{spec['name']}` has shape {got}; it is ({', '.join(spec['shape'])})")
            for e, v in zip(spec["shape"], got):
                if e in self.dims and shape.setdefault(e, v) != v:
                    raise BadArgument(f"`{spec['name']}` gives {e} = {v}, an earlier tensor {e} = {shape[e]}")
        missing = [x for x in self.dims if x not in shape]
        if missing:
            raise BadArgument(f"the tensors' shapes do not give {', '.join(missing)}")
        shape = {x: shape[x] for x in self.dims}
        for t, spec in zip(ts, self.tensors):
            want = tuple(evaluate(e, {**self.m["consts"], **shape}) for e in spec["shape"])
            if tuple(int(x) for x in t.shape) != want:
                raise BadArgument(f"`{spec['name']}` has shape {tuple(t.shape)}; at {shape} it must be {want}")
        return shape

    def plan(self, ts: list, given: dict[str, int]) -> tuple:
        for t, spec in zip(ts, self.tensors):
            if str(t.dtype) not in _DTYPES[spec["dtype"]]:
                raise BadArgument(f"`{spec['name']}` is {t.dtype}; this package takes {spec['dtype']} "
                                  f"({' or '.join(_DTYPES[spec['dtype']])})")
        shape = self.infer(ts, given)
        hit = self.route(shape)
        if hit is None:
            return None, self.refusal(shape), None
        k = self.kernels[hit[0]["kernel"]]
        why = domain_refusal(k["domain"], shape, k["consts"])
        if why:
            return None, f"shape {shape} is outside kernel {k['id']}'s domain: {why}", None
        order = [self.names.index(p) for p in k["params"]]
        env = {**k["consts"], **shape}
        for p, i in zip(k["param_shapes"], order):
            if tuple(evaluate(e, env) for e in p) != tuple(int(x) for x in ts[i].shape):
                raise BadArgument(f"`{self.names[i]}` has shape {tuple(ts[i].shape)}; kernel {k['id']} takes "
                                  f"({', '.join(p)}) at {shape}")
        sizes = [_nbytes(t) for t in ts]
        ptr_of = [_torch_ptr if hasattr(t, "data_ptr") else _cupy_ptr for t in ts]
        return _Launch(self, k, shape, order, sizes), "", ptr_of

    def run(self, stream=None, fallback=None, **args):
        try:
            ts = [args[n] for n in self.names]
            given = {x: args[x] for x in self.scalars}
        except KeyError:
            raise BadArgument(self.takes("missing", [n for n in self.names + self.scalars if n not in args])) from None
        if len(args) != len(ts) + len(given):
            raise BadArgument(self.takes("unknown", [n for n in args if n not in self.names + self.scalars]))
        sig = (tuple((t.shape, t.dtype) for t in ts), tuple(given.values()))
        plan = self._plans.get(sig)
        if plan is None:
            if not all(type(v) is int and v >= 1 for v in given.values()):
                raise BadArgument(f"run(): {', '.join(f'{x}={v!r}' for x, v in given.items())}: each an int >= 1")
            plan = self._plans[sig] = self.plan(ts, given)
        launch, refused, ptr_of = plan
        if launch is None:
            if fallback is None:
                raise ShapeNotCovered(refused)
            return fallback(**args)
        ptrs = [f(t) for f, t in zip(ptr_of, ts)]
        last = self._last_stream            # one tuple: read whole, also when threads share the dispatcher
        if last[0] is not stream:
            last = self._last_stream = (stream, stream_handle(stream))
        launch(ptrs, last[1], _device_of(ts[0]))
        return None

    def takes(self, what: str, names: list[str]) -> str:
        """What run() takes, and the arguments it misses or does not know (``what``: missing, unknown)."""
        return (f"run() takes {', '.join(self.names + [f'{x} (an int)' for x in self.scalars])}; {what} "
                f"{', '.join(names)}")

    # -- CUDA
    def driver(self, ordinal: int | None):
        if self._driver is None:
            from .cuda_driver import Driver
            self._driver = Driver()
        if ordinal is not None and ordinal not in self._checked:
            name = self._driver.device_name(ordinal)
            if not model_matches(name, self.m["gpu_model"]):
                raise WrongGPU(f"device {ordinal} is {name}; this package's kernels were measured on "
                               f"{self.m['gpu_model']}: export them for this GPU from a run measured on it")
            self._checked.add(ordinal)
        return self._driver

    def function(self, ordinal: int, k: dict) -> int:
        key = (ordinal, k["id"])
        if key not in self._functions:
            path = self.folder / k["cubin"]
            cubin = path.read_bytes()
            got = hashlib.sha256(cubin).hexdigest()
            if got != k["cubin_sha256"]:
                raise ManifestTampered(f"{path}: sha256 {got} is not the {k['cubin_sha256']} the manifest names")
            drv = self.driver(ordinal)
            drv.use_device(ordinal)
            self._functions[key] = drv.function(cubin, k["kernel_name"], k["smem_bytes"], k["smem_static_limit"])
        return self._functions[key]


def _nbytes(t) -> int:
    return int(t.nbytes) if hasattr(t, "nbytes") else int(t.numel() * t.element_size())


_dispatcher = Dispatcher.load(Path(__file__).resolve().parent, MANIFEST_SHA256) if MANIFEST_SHA256 else None


def _the() -> Dispatcher:
    if _dispatcher is None:
        raise ExportedError("this is the template of exported packages; `cake export` writes a package from it")
    return _dispatcher


def covered(**shape) -> bool:
    """Whether a route serves ``shape`` (every dimension of the problem by name)."""
    return _the().covered(**shape)


def route_of(**shape) -> dict | None:
    """The route serving ``shape``; None when none does. ``route``: exact (a run measured the shape: ``median_ms``,
    ``peer_ms`` are its figures there) or nearest (``nearest_shape`` is the measured shape it was chosen from,
    ``nearest_ms`` its median there); ``held_out``: the measurement deciding it is of a held-out row."""
    return _the().route_of(**shape)


def run(stream=None, fallback=None, **args):
    """Launch the kernel routed for the tensors' shape (and the dimensions passed by name) on ``stream`` (see the
    module doc)."""
    return _the().run(stream=stream, fallback=fallback, **args)
