// cake_cluster.cuh: split-K over the CTAs of a thread-block cluster, reduced through distributed shared
// memory (acc_publish / acc_cluster_reduce). Included from cake.cuh, after cake_async.cuh (mapa,
// cluster_ctarank).
//
// Each CTA writes its wgmma accumulator (its K slice's partial sum) into an f32 (R, C) smem tile; after a
// cluster barrier every CTA sums its share of the tile's 16-byte chunks over all the cluster's tiles
// (ld.shared::cluster.v4) and stores them with plain stores: each output element is written exactly once,
// so the output needs no zeroing launch and no global atomics.
//
// Layout of the partial tile: row-major, 16-byte chunk q of row r stored at chunk q ^ (r % 8) when a row
// holds a multiple of 8 chunks (C % 32 == 0). A warp's float2 writes of the fragment (8 rows, 4 column
// pairs per 8-column block) then hit each bank twice (2 wavefronts, the minimum for 256 bytes) instead
// of 8 times (rows 512 bytes apart share banks), and the reduction's 16-byte reads of consecutive chunks
// of a row stay on distinct banks.
#pragma once

#include <stdint.h>

namespace cake {

// the float offset of element (r, c) in a published (R, C) partial tile
template <int C>
__device__ __forceinline__ int acc_tile_offset(int r, int c) {
    constexpr int Q = C / 4;                                  // 16-byte chunks per row
    const int q = c / 4;
    return r * C + 4 * ((Q % 8 == 0) ? (q ^ (r & 7)) : q) + c % 4;
}

// store_smem_wgmma_acc_cluster<N>(part, acc, tid): a wgmma f32 accumulator (64 rows per warpgroup, N
// columns; slots s, s + 1 of lane l hold row warp * 16 + l / 4 + 8 * ((s % 4) / 2), columns
// (s / 4) * 8 + (l % 4) * 2 + {0, 1}) into the partial tile part (R, N), one float2 per pair.
template <int N, int SLOTS>
__device__ __forceinline__ void store_smem_wgmma_acc_cluster(float* part, const float (&acc)[SLOTS], int tid) {
    static_assert(SLOTS * 2 == N, "a wgmma accumulator holds N / 2 floats per thread");
    static_assert(N % 4 == 0, "rows of whole 16-byte chunks");
    const int wg = tid / 128, warp = (tid % 128) / 32, lane = tid % 32;
    const int row0 = wg * 64 + warp * 16 + lane / 4;
#pragma unroll
    for (int s = 0; s < SLOTS; s += 2) {
        const int r = row0 + ((s % 4) / 2) * 8;
        const int c = (s / 4) * 8 + (lane % 4) * 2;          // even: the pair stays inside its chunk
        *reinterpret_cast<float2*>(part + acc_tile_offset<N>(r, c)) = make_float2(acc[s], acc[s + 1]);
    }
}

__device__ __forceinline__ float4 ld_shared_cluster_f32x4(uint32_t addr) {
    float4 v;
    asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "r"(addr) : "memory");
    return v;
}

// cluster_reduce_gmem_f32<R, C, NC>(dst, ld_row, ld_col, rows_in, cols_in, part, tid, threads): the
// in-bounds part of the (R, C) window at dst (rows < rows_in, columns < cols_in) as T row-major chunks of 4
// columns; CTA rank k of the NC-CTA cluster takes chunks [k * ceil(T / NC), (k + 1) * ceil(T / NC)), sums
// each over the partial tiles of ranks 0..NC-1 in order (f32) and stores it: one 16-byte store when rows
// are contiguous and 16-byte aligned and the chunk lies inside, element stores otherwise. Between cluster
// barriers: after the publishing, before any CTA exits.
template <int R, int C, int NC>
__device__ __forceinline__ void cluster_reduce_gmem_f32(float* dst, index_t ld_row, index_t ld_col, int rows_in,
                                                        int cols_in, const float* part, int tid, int threads) {
    static_assert(NC >= 1 && NC <= 16, "a cluster holds 1 to 16 CTAs");
    static_assert(C % 4 == 0, "rows of whole 16-byte chunks");
    const int rows = rows_in < R ? rows_in : R, cols = cols_in < C ? cols_in : C;
    if (rows <= 0 || cols <= 0) return;
    const int per_row = (cols + 3) / 4, total = rows * per_row;
    const int share = (total + NC - 1) / NC;
    const int lo = (int)cluster_ctarank() * share, hi = lo + share < total ? lo + share : total;
    uint32_t base[NC];
#pragma unroll
    for (int k = 0; k < NC; ++k) base[k] = mapa_shared_cluster(part, (uint32_t)k);
    const bool vec = ld_col == 1 && ld_row % 4 == 0 && reinterpret_cast<uintptr_t>(dst) % 16 == 0;
#pragma unroll 1
    for (int i = lo + tid; i < hi; i += threads) {
        const int r = i / per_row, c = (i % per_row) * 4;
        const uint32_t off = 4u * (uint32_t)acc_tile_offset<C>(r, c);
        float4 v[NC];
#pragma unroll
        for (int k = 0; k < NC; ++k) v[k] = ld_shared_cluster_f32x4(base[k] + off);   // all in flight first
        float4 s = v[0];
#pragma unroll
        for (int k = 1; k < NC; ++k) { s.x += v[k].x; s.y += v[k].y; s.z += v[k].z; s.w += v[k].w; }
        float* const p = dst + r * ld_row + c * ld_col;
        if (vec && c + 3 < cols) {
            *reinterpret_cast<float4*>(p) = s;
        } else {
            p[0] = s.x;
            if (c + 1 < cols) p[ld_col] = s.y;
            if (c + 2 < cols) p[2 * ld_col] = s.z;
            if (c + 3 < cols) p[3 * ld_col] = s.w;
        }
    }
}

}  // namespace cake
