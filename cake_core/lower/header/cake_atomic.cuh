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

// ----------------------------------------------------------------- scatter_add of rows into gmem, 16 bytes at a time
// red_v4_rows_ok(dst, ld_row, ld_col): rows of the f32 window at dst are contiguous and every 4-column
// group of a row starting at a multiple of 4 is 16-byte aligned, so red.v4 may add it.
__device__ __forceinline__ bool red_v4_rows_ok(const float* dst, index_t ld_row, index_t ld_col) {
    return ld_col == 1 && ld_row % 4 == 0 && reinterpret_cast<uintptr_t>(dst) % 16 == 0;
}

// red_gmem_f32x4_edge<GUARD>(p, c, cols_in, v0..v3): p[0..3] += v with one red.v4, or one red per
// element where the group crosses the window's right edge (column c + k >= cols_in).
template <bool GUARD>
__device__ __forceinline__ void red_gmem_f32x4_edge(float* p, int c, int cols_in, float v0, float v1, float v2,
                                                    float v3) {
    if (!GUARD || c + 3 < cols_in) {
        red_gmem_f32x4(p, v0, v1, v2, v3);
        return;
    }
    if (c < cols_in) red_gmem_f32(p, v0);
    if (c + 1 < cols_in) red_gmem_f32(p + 1, v1);
    if (c + 2 < cols_in) red_gmem_f32(p + 2, v2);
}

// pick4_f32(k, a0, a1, a2, a3): a_k for a run-time k in [0, 4), by selects: an array indexed with k would
// go to local memory
__device__ __forceinline__ float pick4_f32(int k, float a0, float a1, float a2, float a3) {
    const float lo = (k & 1) ? a1 : a0, hi = (k & 1) ? a3 : a2;
    return (k & 2) ? hi : lo;
}

// scatter_add_gmem_f32x4<R, C, THREADS, GUARD>(dst, ld_i, rows, cols_in, idx, src, valid): for each row
// r < valid of the rmem tile src (R x C), dst[idx[r] * ld_i + c] += src[r * C + c], 4 columns per red.v4;
// dst must pass red_v4_rows_ok. With GUARD, rows whose index lies outside [0, rows) are skipped and columns
// from cols_in on are not written. Element e = s * THREADS + t sits in slot s of thread t; with
// THREADS % C == 0 thread t holds column t % C of one row per slot, and the 4 lanes of a quad 4 consecutive
// columns of that row. Four slots go at a time through a 4 x 4 transpose inside the quad (3 xor-shuffles):
// lane j ends with the quad's 4 columns of slot s0 + j, so a quad issues one red.v4 per row instead of 4
// reds. Every lane of the warp takes part in the shuffles: the call must be uniform over the CTA.
template <int R, int C, int THREADS, bool GUARD, typename TI, typename TS, int SLOTS>
__device__ __forceinline__ void scatter_add_gmem_f32x4(float* dst, index_t ld_i, int rows, int cols_in, const TI* idx,
                                                       const TS (&src)[SLOTS], int valid) {
    static_assert(C % 4 == 0, "rows go in groups of 4 columns");
    static_assert(THREADS % 32 == 0 && THREADS % C == 0, "a thread stays on one column, a quad on one row");
    static_assert(R * C == SLOTS * THREADS, "every thread holds every slot");
    const int t = (int)threadIdx.x, j = t & 3, c = (t % C) & ~3;
#pragma unroll
    for (int s0 = 0; s0 < SLOTS; s0 += 4) {
        float m[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) m[k] = s0 + k < SLOTS ? to_f32(src[s0 + k < SLOTS ? s0 + k : 0]) : 0.f;
        // g_k: column c + (j ^ k) of slot s0 + j, sent by lane j ^ k (its slot s0 + j)
        const float g0 = pick4_f32(j, m[0], m[1], m[2], m[3]);
        const float g1 = __shfl_xor_sync(0xffffffffu, pick4_f32(j ^ 1, m[0], m[1], m[2], m[3]), 1);
        const float g2 = __shfl_xor_sync(0xffffffffu, pick4_f32(j ^ 2, m[0], m[1], m[2], m[3]), 2);
        const float g3 = __shfl_xor_sync(0xffffffffu, pick4_f32(j ^ 3, m[0], m[1], m[2], m[3]), 3);
        const int s = s0 + j;
        if (s >= SLOTS) continue;
        const int r = (s * THREADS + (t & ~3)) / C;
        if (r >= valid) continue;
        const int i = idx[r];
        if (GUARD && (unsigned)i >= (unsigned)rows) continue;
        red_gmem_f32x4_edge<GUARD>(dst + (index_t)i * ld_i + c, c, cols_in, pick4_f32(j, g0, g1, g2, g3),
                                   pick4_f32(j ^ 1, g0, g1, g2, g3), pick4_f32(j ^ 2, g0, g1, g2, g3),
                                   pick4_f32(j ^ 3, g0, g1, g2, g3));
    }
}

}  // namespace cake
