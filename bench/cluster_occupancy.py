"""How many thread-block clusters of each size one GPU runs at once: ``cudaOccupancyMaxActiveClusters``.

A cluster's CTAs must sit in one GPC, and a GPC's SM count need not be a multiple of the cluster size, so
clusters of 4 at one CTA per SM may fill fewer SMs than the GPU has. The cost model's wave count of a clustered
kernel reads this table from the GPU's data file (``cluster_slots`` in ``cake_core/targets/gpus/*.json``).

    python bench/cluster_occupancy.py --out cluster-occupancy.json     # on the GPU machine (nvcc, a GPU)

Compiles a probe with nvcc, asks the runtime for cluster sizes 1 to 16 at 1, 2 and 4 CTAs per SM (dynamic shared
memory sized to allow that many), prints a table and writes JSON. Sizes above 8 need the non-portable attribute,
which the probe sets.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from cuda_probe import ProbeFailed, run_probe

PROBE = r"""
#include <cstdio>
#include <cuda_runtime.h>
__global__ void probe(int *out) { extern __shared__ int s[]; if (out) out[0] = s[0]; }
int main() {
    cudaDeviceProp p;
    cudaError_t pe = cudaGetDeviceProperties(&p, 0);
    if (pe != cudaSuccess) { fprintf(stderr, "no usable GPU: %s\n", cudaGetErrorString(pe)); return 1; }
    printf("{\"device\": \"%s\", \"sms\": %d, \"smem_per_sm\": %zu, \"rows\": [", p.name, p.multiProcessorCount,
           p.sharedMemPerMultiprocessor);
    cudaFuncSetAttribute(probe, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    int per_sm[3] = {1, 2, 4};
    bool first = true;
    for (int k = 0; k < 3; ++k) {
        size_t smem = p.sharedMemPerMultiprocessor / per_sm[k] - 2048;
        if (smem > p.sharedMemPerBlockOptin) smem = p.sharedMemPerBlockOptin;
        cudaFuncSetAttribute(probe, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        for (int c = 1; c <= 16; ++c) {
            cudaLaunchConfig_t cfg = {};
            cfg.gridDim = dim3(c * 64, 1, 1); cfg.blockDim = dim3(384, 1, 1); cfg.dynamicSmemBytes = smem;
            cudaLaunchAttribute a[1]; a[0].id = cudaLaunchAttributeClusterDimension;
            a[0].val.clusterDim.x = c; a[0].val.clusterDim.y = 1; a[0].val.clusterDim.z = 1;
            cfg.attrs = a; cfg.numAttrs = 1;
            int n = -1;
            cudaError_t e = cudaOccupancyMaxActiveClusters(&n, probe, &cfg);
            printf("%s{\"ctas_per_sm\": %d, \"cluster\": %d, \"clusters\": %d, \"error\": \"%s\"}", first ? "" : ", ",
                   per_sm[k], c, e == cudaSuccess ? n : -1, e == cudaSuccess ? "" : cudaGetErrorString(e));
            first = false; cudaGetLastError();
        }
    }
    printf("]}\n");
    return 0;
}
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, help="write the table as JSON here")
    ap.add_argument("--arch", default="sm_90a", help="nvcc's -arch for the probe (default sm_90a)")
    args = ap.parse_args(argv)
    try:
        data = run_probe("cluster_occupancy", PROBE, arch=args.arch)
    except ProbeFailed as e:
        print(e, file=sys.stderr)
        return 1
    print(f"{data['device']}: {data['sms']} SMs")
    print("cluster size | " + " | ".join(f"{k} CTA/SM: clusters (CTAs)" for k in (1, 2, 4)))
    by = {(row["ctas_per_sm"], row["cluster"]): row for row in data["rows"]}
    for c in range(1, 17):
        cells = []
        for k in (1, 2, 4):
            row = by[(k, c)]
            cells.append(f"{row['clusters']} ({row['clusters'] * c})" if row["clusters"] >= 0 else row["error"])
        print(f"{c:>12} | " + " | ".join(cells))
    if args.out:
        args.out.write_text(json.dumps(data, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
