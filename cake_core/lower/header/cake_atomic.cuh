// cake_atomic.cuh: atomic adds of register fragments into gmem (split-K epilogues). Included from cake.cuh.
//
// The adds are reductions without a return value (red.global.add: relaxed, gpu scope), performed in
// L2. sm_90 adds vectors of f32 in one instruction (red.global.add.v2.f32 / .v4.f32, PTX ISA 8.1,
// global space only); a vector needs its natural alignment (8 / 16 bytes).
#pragma once

#include <stdint.h>

namespace cake {

__device__ __forceinline__ void red_gmem_f32(float* dst, float v) {
    asm volatile("red.global.add.f32 [%0], %1;" :: "l"(dst), "f"(v) : "memory");
}
// dst must be 8-byte aligned
__device__ __forceinline__ void red_gmem_f32x2(float* dst, float v0, float v1) {
    asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" :: "l"(dst), "f"(v0), "f"(v1) : "memory");
}
// dst must be 16-byte aligned
__device__ __forceinline__ void red_gmem_f32x4(float* dst, float v0, float v1, float v2, float v3) {
    asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" :: "l"(dst), "f"(v0), "f"(v1), "f"(v2), "f"(v3)
                 : "memory");
}

// atomic_add_gmem_wgmma_acc<N, GUARD>(dst, acc, ld_row, ld_col, rows_in, cols_in, tid): dst (a gmem f32
// window) += a wgmma f32 accumulator (64 rows per warpgroup, N columns, the m64nNk16 fragment layout
// of store_gmem_wgmma_acc: slots s, s + 1 of lane l hold row warp * 16 + l / 4 + 8 * ((s % 4) / 2),
// columns (s / 4) * 8 + (l % 4) * 2 + {0, 1}). tid is the thread's index in its role.
//   - rows contiguous and 16-byte aligned (ld_col == 1, ld_row % 4 == 0, dst 16-byte aligned): lanes
//     l and l ^ 1 swap half their pairs (two shuffles) so that the even lane holds 4 consecutive
//     columns of row r and the odd lane those of row r + 8: one red.v4 per 4 elements;
//   - rows contiguous and 8-byte aligned: one red.v2 per pair;
//   - otherwise, and at a ragged right edge, one red per element.
// The decision is uniform over the warp (it depends on dst and the strides only), so every lane
// takes part in the shuffles; the guard is applied after them.
template <int N, bool GUARD, int SLOTS>
__device__ __forceinline__ void atomic_add_gmem_wgmma_acc(float* dst, const float (&acc)[SLOTS], index_t ld_row,
                                                          index_t ld_col, int rows_in, int cols_in, int tid) {
    static_assert(SLOTS * 2 == N, "a wgmma accumulator holds N / 2 floats per thread");
    static_assert(SLOTS % 4 == 0, "slots come in groups of 4: two rows 8 apart, two neighbouring columns each");
    const int wg = tid / 128, warp = (tid % 128) / 32, lane = tid % 32;
    const int row0 = wg * 64 + warp * 16 + lane / 4;
    const uintptr_t addr = reinterpret_cast<uintptr_t>(dst);
    if (ld_col == 1 && ld_row % 4 == 0 && addr % 16 == 0) {
        const bool odd = lane & 1;
#pragma unroll
        for (int s = 0; s < SLOTS; s += 4) {
            // the even lane sends its row r + 8 pair and keeps row r; the odd lane the reverse
            const float g0 = __shfl_xor_sync(0xffffffffu, odd ? acc[s] : acc[s + 2], 1);
            const float g1 = __shfl_xor_sync(0xffffffffu, odd ? acc[s + 1] : acc[s + 3], 1);
            const int r = odd ? row0 + 8 : row0;
            const int c = (s / 4) * 8 + (lane % 4) * 2 - (odd ? 2 : 0);
            const float v0 = odd ? g0 : acc[s], v1 = odd ? g1 : acc[s + 1];
            const float v2 = odd ? acc[s + 2] : g0, v3 = odd ? acc[s + 3] : g1;
            if (GUARD && r >= rows_in) continue;
            float* const p = dst + r * ld_row + c;
            if (!GUARD || c + 3 < cols_in) {
                red_gmem_f32x4(p, v0, v1, v2, v3);
            } else {
                if (c < cols_in) red_gmem_f32(p, v0);
                if (c + 1 < cols_in) red_gmem_f32(p + 1, v1);
                if (c + 2 < cols_in) red_gmem_f32(p + 2, v2);
            }
        }
        return;
    }
    const bool pairs = ld_col == 1 && ld_row % 2 == 0 && addr % 8 == 0;
#pragma unroll
    for (int s = 0; s < SLOTS; s += 2) {
        const int r = row0 + ((s % 4) / 2) * 8;
        const int c = (s / 4) * 8 + (lane % 4) * 2;
        if (GUARD && r >= rows_in) continue;
        float* const p = dst + r * ld_row + c * ld_col;
        if (pairs && (!GUARD || c + 1 < cols_in)) {
            red_gmem_f32x2(p, acc[s], acc[s + 1]);
        } else {
            if (!GUARD || c < cols_in) red_gmem_f32(p, acc[s]);
            if (!GUARD || c + 1 < cols_in) red_gmem_f32(p + ld_col, acc[s + 1]);
        }
    }
}

}  // namespace cake
