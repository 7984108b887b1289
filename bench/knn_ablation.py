"""Where knn_topk_split_pp3's time goes: the kernel with parts removed, timed without a correctness check.

Run on the GPU machine from the repository root (bundle unpacked as in bench/gpu.sh):

    PYTHONPATH=/tmp/site:$PWD python3 bench/knn_ablation.py

Each variant is the seed with lines dropped or constants changed (so most variants compute wrong
lists: only their time means anything); CUDA events, 2 warm-ups, median of 5, at the headline shape
Q=4096 N=1048576 D=128 k=10, random bf16 inputs drawn on the device. Prints one line per variant.
"""
from __future__ import annotations

from pathlib import Path

from cake_core.ir.text import parse_program
from cake_core.lower import compile_kernel, lower
from cake_core.problems import get_problem
from cake_core.runtime import gpu as G
from cake_core.problems import corpus_file

ROOT = Path(__file__).resolve().parents[1]
SHAPE = {"Q": 4096, "N": 1048576, "D": 128, "k": 10}


def drop(text: str, *needles: str) -> str:
    return "".join(line + "\n" for line in text.splitlines() if not any(n in line for n in needles))


def variants(base: str) -> dict[str, str]:
    return {
        "as_is": base,
        "regs56": base.replace("regs=40", "regs=56").replace("regs=232", "regs=224"),
        "no_sqnorm": drop(base, "sqnorm_rows("),
        "half_topk": drop(base, "topk_bias(top_v0, top_i0, acc1", "topk_bias(top_v1, top_i1, acc3"),
        "half_both": drop(base, "topk_bias(top_v0, top_i0, acc1", "topk_bias(top_v1, top_i1, acc3", "sqnorm_rows("),
        "S5": base.replace('"S": 4', '"S": 5').replace("stages=16", "stages=20").replace("stages=8)", "stages=10)"),
    }


def main() -> None:
    cp = G._cupy()
    knn = get_problem("knn_topk")

    def bf16(n: int):
        return (cp.random.standard_normal(n, dtype=cp.float32).view(cp.uint32) >> 16).astype(cp.uint16)

    dev = {"q": bf16(SHAPE["Q"] * SHAPE["D"]).reshape(SHAPE["Q"], SHAPE["D"]),
           "db": bf16(SHAPE["N"] * SHAPE["D"]).reshape(SHAPE["N"], SHAPE["D"])}
    base = corpus_file("knn_topk_split_pp3.cake").read_text()
    for name, text in variants(base).items():
        r = lower(parse_program(text, f"{name}.cake"), f"{name}.cake")
        if r.value is None:
            print(f"{name:10s} not lowered: {[d.message for d in r.diagnostics][:1]}")
            continue
        lk = r.value
        cr = compile_kernel(lk, arch="sm_90a", cache_dir=Path("/tmp/cake-knn-ablation"))
        if not cr.ok:
            print(f"{name:10s} not compiled: {[d.message for d in cr.diagnostics][:1]}")
            continue
        fn = cp.RawModule(path=str(cr.value.cubin_path)).get_function(lk.kernel_name)
        fn.max_dynamic_shared_size_bytes = lk.smem_bytes
        stream = cp.cuda.Stream()
        with stream:
            launcher = G._Launcher(cp, fn, lk, knn, SHAPE, stream, 60)
            args = launcher.args(dev)
            for _ in range(2):
                launcher.launch(args)
            launcher.wait("warm-up")
            ms = []
            for _ in range(5):
                a, b = cp.cuda.Event(), cp.cuda.Event()
                a.record(stream)
                launcher.launch(args)
                b.record(stream)
                b.synchronize()
                ms.append(cp.cuda.get_elapsed_time(a, b))
        print(f"{name:10s} median {sorted(ms)[2]:.3f} ms  registers {cr.value.resources.registers} "
              f"smem {lk.smem_bytes} B", flush=True)


if __name__ == "__main__":
    main()
