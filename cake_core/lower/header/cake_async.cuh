// cake_async.cuh: the Hopper async vocabulary that Cake IR lowers onto (sm_90a): mbarriers, TMA,
// cp.async, fences, clusters, setmaxnreg, wgmma. Included from cake.cuh.
//
// Conventions as in cake.cuh: destination first, the memory space in every name, a short comment on
// every static_assert. Inline PTX only: no CUTLASS/CuTe, no <cuda.h>.
//
// Tensor maps: a TMA copy reads a CUtensorMap (128 bytes, 64-byte aligned) that the host encodes with
// cuTensorMapEncodeTiled and passes by value as a `const __grid_constant__ cake::tensor_map` kernel
// argument; the kernel uses its generic address (the parameter space), never a copy.
#pragma once

#include <stdint.h>

namespace cake {

struct alignas(64) tensor_map { unsigned long long opaque[16]; };
static_assert(sizeof(tensor_map) == 128, "a tensor map is the 128-byte CUtensorMap, passed by value");

// Pull a tensor map into the SM's descriptor cache ahead of its first copy (prefetch.tensormap; a hint,
// no ordering): the first cp.async.bulk.tensor otherwise waits for the 128-byte fetch.
__device__ __forceinline__ void prefetch_tensor_map(const tensor_map* map) {
    asm volatile("prefetch.tensormap [%0];" :: "l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ----------------------------------------------------------------- setmaxnreg (sm_90a)
// Takes effect only under a register cap at entry (__launch_bounds__(threads, 1)) with every
// warpgroup's role one branch of a single if/else (else ptxas ignores it: warning C7508).
template <int REGS> __device__ __forceinline__ void setmaxnreg_inc() {
    static_assert(REGS >= 24 && REGS <= 256 && REGS % 8 == 0, "setmaxnreg takes 24..256 in steps of 8");
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" :: "n"(REGS));
}
template <int REGS> __device__ __forceinline__ void setmaxnreg_dec() {
    static_assert(REGS >= 24 && REGS <= 256 && REGS % 8 == 0, "setmaxnreg takes 24..256 in steps of 8");
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" :: "n"(REGS));
}

// ----------------------------------------------------------------- mbarrier (smem, 8 B each)
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, int arrivals) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(smem_u32(bar)), "r"(arrivals) : "memory");
}
// make the inits visible to the async proxy (TMA) and the other threads (a __syncthreads follows)
__device__ __forceinline__ void fence_mbarrier_init() {
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
    asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];" :: "r"(smem_u32(bar)) : "memory");
}
// one arrival plus `bytes` transaction bytes that async copies must complete before the phase ends
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [%0], %1;"
                 :: "r"(smem_u32(bar)), "r"(bytes) : "memory");
}
// one arrival on the mbarrier at the same smem offset in cluster CTA `cta_rank` (itself included):
// mapa turns the local address into that CTA's shared::cluster address
__device__ __forceinline__ void mbarrier_arrive_cluster(uint64_t* bar, uint32_t cta_rank) {
    uint32_t remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(smem_u32(bar)), "r"(cta_rank));
    asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" :: "r"(remote) : "memory");
}
// returns once the phase of this parity has completed (try_wait.parity in a loop)
__device__ __forceinline__ void mbarrier_wait_parity(uint64_t* bar, int parity) {
    const uint32_t addr = smem_u32(bar);
    uint32_t done = 0;
    do {
        asm volatile("{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
                     "selp.u32 %0, 1, 0, p;\n\t}" : "=r"(done) : "r"(addr), "r"(parity & 1) : "memory");
    } while (!done);
}

// ----------------------------------------------------------------- fences, clusters
// order this thread's ordinary smem writes before later reads by the async proxy (TMA store, wgmma)
__device__ __forceinline__ void fence_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.aligned;\n\tbarrier.cluster.wait.aligned;" ::: "memory");
}

// ----------------------------------------------------------------- TMA (cp.async.bulk.tensor)
// Coordinates are element indices, innermost dimension first (c0); boxes past the tensor edge are
// zero-filled by the hardware and still count their full bytes on the barrier.
__device__ __forceinline__ void tma_load_1d(void* dst, const tensor_map* map, uint64_t* bar, int c0) {
    asm volatile("cp.async.bulk.tensor.1d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2}], [%3];"
                 :: "r"(smem_u32(dst)), "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(smem_u32(bar))
                 : "memory");
}
__device__ __forceinline__ void tma_load_1d_multicast(void* dst, const tensor_map* map, uint64_t* bar, uint16_t cta_mask, int c0) {
    asm volatile("cp.async.bulk.tensor.1d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
                 " [%0], [%1, {%2}], [%3], %4;"
                 :: "r"(smem_u32(dst)), "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(smem_u32(bar)), "h"(cta_mask)
                 : "memory");
}
__device__ __forceinline__ void tma_store_1d(const tensor_map* map, const void* src, int c0) {
    asm volatile("cp.async.bulk.tensor.1d.global.shared::cta.tile.bulk_group [%0, {%1}], [%2];"
                 :: "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(smem_u32(src)) : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
}
__device__ __forceinline__ void tma_load_2d(void* dst, const tensor_map* map, uint64_t* bar, int c0, int c1) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3}], [%4];"
                 :: "r"(smem_u32(dst)), "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(smem_u32(bar))
                 : "memory");
}
__device__ __forceinline__ void tma_load_2d_multicast(void* dst, const tensor_map* map, uint64_t* bar, uint16_t cta_mask, int c0, int c1) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
                 " [%0], [%1, {%2, %3}], [%4], %5;"
                 :: "r"(smem_u32(dst)), "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(smem_u32(bar)), "h"(cta_mask)
                 : "memory");
}
__device__ __forceinline__ void tma_store_2d(const tensor_map* map, const void* src, int c0, int c1) {
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group [%0, {%1, %2}], [%3];"
                 :: "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(smem_u32(src)) : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
}
__device__ __forceinline__ void tma_load_3d(void* dst, const tensor_map* map, uint64_t* bar, int c0, int c1, int c2) {
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3, %4}], [%5];"
                 :: "r"(smem_u32(dst)), "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(smem_u32(bar))
                 : "memory");
}
__device__ __forceinline__ void tma_load_3d_multicast(void* dst, const tensor_map* map, uint64_t* bar, uint16_t cta_mask, int c0, int c1, int c2) {
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
                 " [%0], [%1, {%2, %3, %4}], [%5], %6;"
                 :: "r"(smem_u32(dst)), "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(smem_u32(bar)), "h"(cta_mask)
                 : "memory");
}
__device__ __forceinline__ void tma_store_3d(const tensor_map* map, const void* src, int c0, int c1, int c2) {
    asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.tile.bulk_group [%0, {%1, %2, %3}], [%4];"
                 :: "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(smem_u32(src)) : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
}
__device__ __forceinline__ void tma_load_4d(void* dst, const tensor_map* map, uint64_t* bar, int c0, int c1, int c2, int c3) {
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3, %4, %5}], [%6];"
                 :: "r"(smem_u32(dst)), "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(smem_u32(bar))
                 : "memory");
}
__device__ __forceinline__ void tma_load_4d_multicast(void* dst, const tensor_map* map, uint64_t* bar, uint16_t cta_mask, int c0, int c1, int c2, int c3) {
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
                 " [%0], [%1, {%2, %3, %4, %5}], [%6], %7;"
                 :: "r"(smem_u32(dst)), "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(smem_u32(bar)), "h"(cta_mask)
                 : "memory");
}
__device__ __forceinline__ void tma_store_4d(const tensor_map* map, const void* src, int c0, int c1, int c2, int c3) {
    asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group [%0, {%1, %2, %3, %4}], [%5];"
                 :: "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(smem_u32(src)) : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
}
__device__ __forceinline__ void tma_load_5d(void* dst, const tensor_map* map, uint64_t* bar, int c0, int c1, int c2, int c3, int c4) {
    asm volatile("cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3, %4, %5, %6}], [%7];"
                 :: "r"(smem_u32(dst)), "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4), "r"(smem_u32(bar))
                 : "memory");
}
__device__ __forceinline__ void tma_load_5d_multicast(void* dst, const tensor_map* map, uint64_t* bar, uint16_t cta_mask, int c0, int c1, int c2, int c3, int c4) {
    asm volatile("cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
                 " [%0], [%1, {%2, %3, %4, %5, %6}], [%7], %8;"
                 :: "r"(smem_u32(dst)), "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4), "r"(smem_u32(bar)), "h"(cta_mask)
                 : "memory");
}
__device__ __forceinline__ void tma_store_5d(const tensor_map* map, const void* src, int c0, int c1, int c2, int c3, int c4) {
    asm volatile("cp.async.bulk.tensor.5d.global.shared::cta.tile.bulk_group [%0, {%1, %2, %3, %4, %5}], [%6];"
                 :: "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4), "r"(smem_u32(src)) : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
}

// ----------------------------------------------------------------- cp.async (per thread, 16 B)
// cp_async_smem_gmem<ROWS, COLS, NTHREADS>(dst, src, ld_row, ld_col, rows_in, cols_in, tid): the
// ROWS x COLS window into dst (row-major), zero past the edge. 16-byte chunks go through cp.async
// when the window rows are contiguous and 16-byte aligned; edge chunks and other layouts are copied
// synchronously. Visible after cp_async_wait<n>() and a barrier among the readers.
template <int ROWS, int COLS, int NTHREADS, typename T>
__device__ __forceinline__ void cp_async_smem_gmem(T* dst, const T* src, index_t ld_row, index_t ld_col,
                                                   int rows_in, int cols_in, int tid) {
    constexpr int CHUNK = 16 / (int)sizeof(T);
    static_assert(16 % sizeof(T) == 0, "cp.async moves 16-byte chunks of whole elements");
    const bool fast = COLS % CHUNK == 0 && ld_col == 1 && (reinterpret_cast<uintptr_t>(src) % 16) == 0
                      && (ld_row * (index_t)sizeof(T)) % 16 == 0;
    if (fast) {
        for (int e = tid; e < ROWS * (COLS / CHUNK); e += NTHREADS) {
            const int r = e / (COLS / CHUNK), c = (e % (COLS / CHUNK)) * CHUNK;
            const int valid = r < rows_in ? (cols_in - c < 0 ? 0 : (cols_in - c > CHUNK ? CHUNK : cols_in - c)) : 0;
            T* d = dst + r * COLS + c;
            if (valid == CHUNK || valid == 0) {   // src-size 0 zero-fills the chunk without reading
                const T* s = valid ? src + r * ld_row + c : src;
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
                             :: "r"(smem_u32(d)), "l"(s), "r"(valid ? 16 : 0) : "memory");
            } else {
                for (int i = 0; i < CHUNK; ++i) d[i] = i < valid ? src[r * ld_row + c + i] : zero<T>();
            }
        }
    } else {
        for (int e = tid; e < ROWS * COLS; e += NTHREADS) {
            const int r = e / COLS, c = e % COLS;
            dst[e] = (r < rows_in && c < cols_in) ? src[r * ld_row + c * ld_col] : zero<T>();
        }
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
}
// ----------------------------------------------------------------- cp.async completing on an mbarrier
// The TMA-free producer for rows that are not 16-byte aligned (a (.., D) bf16 tensor with D % 8 != 0):
// cp_async_bar_smem_gmem<ROWS, COLS, SWZ, NTHREADS, BAR>(dst, src, ld_row, ld_col, rows_in, cols_in, tid,
// bar) copies the ROWS x COLS window into dst, zero past the edge (cp.async's src-size 0 form), in
// chunks of 16, 8 or 4 bytes, the widest that the window's base and row stride allow (element by
// element when not even 4 bytes are), each chunk placed in the slot's layout: SWZ = the 128-byte
// swizzle of TMA / wgmma (rows of one 128-byte span, 16-byte chunk k of row r at chunk k ^ (r % 8); the
// tile starts 1024-byte aligned), else row-major. The thread's copies then complete on `bar` through
// cp.async.mbarrier.arrive (no .noinc: the pending count rises by one now and falls when they land, so
// the phase waits for them without counting an arrival), and the role's threads meet at named barrier
// BAR, so that the role's next arrive on `bar` follows every thread's increment (and the element-wise
// stores). The writes are generic-proxy: a wgmma reader fences (fence_async) after its wait.
template <int COLS, bool SWZ, typename T>
__device__ __forceinline__ uint32_t smem_offset_swizzled(int r, int c) {
    const uint32_t byte = (uint32_t)c * sizeof(T);
    if (!SWZ) return (uint32_t)(r * COLS) * sizeof(T) + byte;
    return (uint32_t)r * 128u + (((byte >> 4) ^ ((uint32_t)r & 7u)) << 4) + (byte & 15u);
}

template <int ROWS, int COLS, bool SWZ, int NTHREADS, int BYTES, typename T>
__device__ __forceinline__ void cp_async_chunks(uint32_t dst, const T* src, index_t ld_row, int rows_in,
                                                int cols_in, int tid) {
    constexpr int W = BYTES / (int)sizeof(T), CPR = COLS / W;     // elements per chunk, chunks per row
    static_assert(COLS % W == 0, "a row is a whole number of chunks");
#pragma unroll 1
    for (int e = tid; e < ROWS * CPR; e += NTHREADS) {
        const int r = e / CPR, c = (e % CPR) * W;
        const int valid = r < rows_in ? (cols_in - c < 0 ? 0 : (cols_in - c > W ? W : cols_in - c)) : 0;
        const uint32_t d = dst + smem_offset_swizzled<COLS, SWZ, T>(r, c);
        const T* s = valid ? src + r * ld_row + c : src;
        if (valid == W || valid == 0) {           // src-size 0 zero-fills the chunk without reading
            if (BYTES == 16)
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(d), "l"(s), "r"(valid ? 16 : 0)
                             : "memory");
            else
                asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;" :: "r"(d), "l"(s), "n"(BYTES),
                             "r"(valid ? BYTES : 0) : "memory");
        } else {                                  // a ragged right edge inside the chunk
            for (int i = 0; i < W; ++i) {
                const T v = i < valid ? s[i] : zero<T>();
                *reinterpret_cast<T*>(__cvta_shared_to_generic(d + i * sizeof(T))) = v;
            }
        }
    }
}

template <int ROWS, int COLS, bool SWZ, int NTHREADS, int BAR, typename T>
__device__ __forceinline__ void cp_async_bar_smem_gmem(T* dst, const T* src, index_t ld_row, index_t ld_col,
                                                       int rows_in, int cols_in, int tid, uint64_t* bar) {
    static_assert(!SWZ || COLS * sizeof(T) == 128, "a swizzled slot has rows of one 128-byte span");
    static_assert(NTHREADS % 32 == 0, "whole warps");
    const uint32_t d = smem_u32(dst);
    const uintptr_t a = reinterpret_cast<uintptr_t>(src) | (uintptr_t)(ROWS > 1 ? ld_row * (index_t)sizeof(T) : 0);
    constexpr int ROW_BYTES = COLS * (int)sizeof(T);
    if (ld_col == 1 && ROW_BYTES % 16 == 0 && a % 16 == 0)
        cp_async_chunks<ROWS, COLS, SWZ, NTHREADS, 16>(d, src, ld_row, rows_in, cols_in, tid);
    else if (ld_col == 1 && ROW_BYTES % 8 == 0 && a % 8 == 0 && sizeof(T) <= 8)
        cp_async_chunks<ROWS, COLS, SWZ, NTHREADS, (sizeof(T) <= 8 ? 8 : 16)>(d, src, ld_row, rows_in, cols_in, tid);
    else if (ld_col == 1 && ROW_BYTES % 4 == 0 && a % 4 == 0 && sizeof(T) <= 4)
        cp_async_chunks<ROWS, COLS, SWZ, NTHREADS, (sizeof(T) <= 4 ? 4 : 16)>(d, src, ld_row, rows_in, cols_in, tid);
    else {
#pragma unroll 1
        for (int e = tid; e < ROWS * COLS; e += NTHREADS) {
            const int r = e / COLS, c = e % COLS;
            const T v = (r < rows_in && c < cols_in) ? src[r * ld_row + c * ld_col] : zero<T>();
            *reinterpret_cast<T*>(__cvta_shared_to_generic(d + smem_offset_swizzled<COLS, SWZ, T>(r, c))) = v;
        }
    }
    asm volatile("cp.async.mbarrier.arrive.shared::cta.b64 [%0];" :: "r"(smem_u32(bar)) : "memory");
    asm volatile("bar.sync %0, %1;" :: "n"(BAR), "n"(NTHREADS) : "memory");
}

template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory");
}

// ----------------------------------------------------------------- wgmma (sm_90a)
// Shared-memory matrix descriptor: start address, leading and stride byte offsets (>> 4), swizzle
// mode in bits 62-63 (1 = 128B, 2 = 64B, 3 = 32B).
__device__ __forceinline__ uint64_t wgmma_desc(const void* smem, uint32_t lbo_bytes, uint32_t sbo_bytes,
                                               uint32_t swizzle_mode) {
    const uint64_t addr = smem_u32(smem);
    return ((addr & 0x3FFFF) >> 4) | ((uint64_t)((lbo_bytes & 0x3FFFF) >> 4) << 16)
           | ((uint64_t)((sbo_bytes & 0x3FFFF) >> 4) << 32) | ((uint64_t)swizzle_mode << 62);
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N> __device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" :: "n"(N) : "memory");
}

// A register A of wgmma (a 16-bit fragment of the role, m64nNk16 layout): the 4 registers of k-step k
// are slots 8k .. 8k + 7 in pairs, (row r, columns 2q, 2q + 1), (r + 8, ...), (r, 2q + 8, 2q + 9), (r + 8, ...):
// the m64k16 A fragment, so an accumulator cast to bf16 slot by slot feeds the next wgmma without moving.
__device__ __forceinline__ uint32_t pack2_rmem(__nv_bfloat16 lo, __nv_bfloat16 hi) {
    return (uint32_t)__bfloat16_as_ushort(lo) | ((uint32_t)__bfloat16_as_ushort(hi) << 16);
}
__device__ __forceinline__ uint32_t pack2_rmem(__half lo, __half hi) {
    return (uint32_t)__half_as_ushort(lo) | ((uint32_t)__half_as_ushort(hi) << 16);
}

// reduce_rows_wgmma_frag<FN>(dst, src): dst[h] := the sum (FN 0), max (1) or min (2) of row h of this
// thread's quad, h = 0, 1 (rows wg * 64 + warp * 16 + lane / 4 + 8 * h of an m64nN fragment, N / 2 slots
// per thread, row h in the slots s with (s % 4) / 2 == h): this thread's N / 4 values of the row, then the
// quad's 4 partials (two xor shuffles); every lane of the quad ends with the row's value. In f32 (i32 for
// an integer fragment).
template <int FN, int SLOTS, typename TD, typename TS>
__device__ __forceinline__ void reduce_rows_wgmma_frag(TD (&dst)[2], const TS (&src)[SLOTS]) {
    static_assert(SLOTS % 4 == 0, "an m64nN fragment holds N / 2 slots per thread, N a multiple of 8");
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        using A = acc_t<TS>;
        A v = combine<FN>(convert<A>(src[2 * h]), convert<A>(src[2 * h + 1]));
#pragma unroll
        for (int s = 2 * h + 4; s < SLOTS; s += 4)
            v = combine<FN>(combine<FN>(v, convert<A>(src[s])), convert<A>(src[s + 1]));
#pragma unroll
        for (int m = 1; m < 4; m *= 2) v = combine<FN>(v, __shfl_xor_sync(0xffffffffu, v, m));
        dst[h] = convert<TD>(v);
    }
}

// store_gmem_wgmma_acc<N, GUARD>(dst, acc, ld_row, ld_col, rows_in, cols_in, tid): a wgmma f32
// accumulator (64 rows per warpgroup, N columns; thread tid of the role holds N / 2 floats in the
// m64nNk16 fragment layout) to a gmem window, converting to the gmem dtype. Each thread's two
// neighbouring columns (acc[2i], acc[2i + 1]) go out as one 2-element vector store when the window's
// rows are contiguous and every pair lands aligned (ld_col == 1, even ld_row, dst aligned to two
// elements); otherwise, and at a ragged right edge, element by element.
template <typename T> struct alignas(2 * sizeof(T)) elem_pair { T x, y; };

template <int N, bool GUARD, int SLOTS, typename TD, typename TS>
__device__ __forceinline__ void store_gmem_wgmma_acc(TD* dst, const TS (&acc)[SLOTS], index_t ld_row,
                                                     index_t ld_col, int rows_in, int cols_in, int tid) {
    static_assert(SLOTS * 2 == N, "a wgmma accumulator (any fragment of its layout) holds N / 2 values a thread");
    // opaque to the optimiser: inside a persistent tile loop it would hoist the N / 2 per-thread store
    // offsets out of the loop, and those registers on top of the accumulator spill (seen: 856 B)
    asm volatile("" : "+r"(tid));
    const int wg = tid / 128, warp = (tid % 128) / 32, lane = tid % 32;
    const int row0 = wg * 64 + warp * 16 + lane / 4;
    const bool pairs = ld_col == 1 && ld_row % 2 == 0 && reinterpret_cast<uintptr_t>(dst) % (2 * sizeof(TD)) == 0;
#pragma unroll
    for (int s = 0; s < SLOTS; s += 2) {
        const int r = row0 + ((s % 4) / 2) * 8;
        const int c = (s / 4) * 8 + (lane % 4) * 2;
        if (GUARD && r >= rows_in) continue;
        TD* const p = dst + r * ld_row + c * ld_col;
        if (pairs && (!GUARD || c + 1 < cols_in)) {
            elem_pair<TD> v;
            v.x = convert<TD>(acc[s]);
            v.y = convert<TD>(acc[s + 1]);
            *reinterpret_cast<elem_pair<TD>*>(p) = v;
        } else {
            if (!GUARD || c < cols_in) p[0] = convert<TD>(acc[s]);
            if (!GUARD || c + 1 < cols_in) p[ld_col] = convert<TD>(acc[s + 1]);
        }
    }
}

// ----------------------------------------------------------------- fragment epilogues (argmin_bias)
// Row state of a wgmma accumulator (64 rows per warpgroup, N columns): thread tid of the role owns
// rows wg * 64 + warp * 16 + lane / 4 + 8 * h, h = 0, 1 (slot s of the m64nNk16 fragment is row half
// h = (s % 4) / 2, column (s / 4) * 8 + (lane % 4) * 2 + s % 2), and keeps a private running
// (best[h], arg[h]) over the columns it holds. The 4 lanes of a quad share a row; store merges them.

// argmin_bias_rmem_wgmma_acc<N>(best, arg, acc, bias, beta, base, limit, tid): for each owned row,
// score = bias[c] - beta * acc[c] over the thread's columns with base + c < limit; the smallest
// (the first on ties: columns are scanned in increasing order) replaces (best, arg) when strictly
// smaller. A tile wholly inside the limit takes the unguarded path (no per-column test).
template <int N, bool GUARD, int SLOTS>
__device__ __forceinline__ void argmin_bias_tile(float (&best)[2], int (&arg)[2], const float (&acc)[SLOTS],
                                                 const float* bias, float beta, int base, int limit, int lane) {
    float tv[2] = {__int_as_float(0x7f800000), __int_as_float(0x7f800000)};
    int tj[2] = {0, 0};
    const int q = (lane % 4) * 2;
#pragma unroll
    for (int b = 0; b < N / 8; ++b) {
        const float2 w = *reinterpret_cast<const float2*>(bias + b * 8 + q);   // this thread's 2 columns
#pragma unroll
        for (int s = b * 4; s < b * 4 + 4; ++s) {
            const int h = (s % 4) / 2, j = b * 8 + s % 2;                       // j: column less the lane's q
            float v = fmaf(-beta, acc[s], s % 2 ? w.y : w.x);
            if (GUARD && base + j + q >= limit) v = __int_as_float(0x7f800000);
            if (v < tv[h]) { tv[h] = v; tj[h] = j; }
        }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h)
        if (tv[h] < best[h]) { best[h] = tv[h]; arg[h] = base + q + tj[h]; }
}

template <int N, int SLOTS>
__device__ __forceinline__ void argmin_bias_rmem_wgmma_acc(float (&best)[2], int (&arg)[2], const float (&acc)[SLOTS],
                                                           const float* bias, float beta, int base, int limit,
                                                           int tid) {
    static_assert(SLOTS * 2 == N && N % 8 == 0, "a wgmma accumulator holds N / 2 floats per thread, N % 8 == 0");
    if (base + N <= limit) argmin_bias_tile<N, false>(best, arg, acc, bias, beta, base, limit, tid % 32);
    else argmin_bias_tile<N, true>(best, arg, acc, bias, beta, base, limit, tid % 32);
}

// fragment_row0(tid): the first of the 2 rows (row0, row0 + 8) that thread tid of a role holds in a wgmma
// fragment: 64 rows per warpgroup, 16 per warp, 8 per 4-lane quad.
__device__ __forceinline__ int fragment_row0(int tid) {
    return (tid / 128) * 64 + ((tid % 128) / 32) * 16 + (tid % 32) / 4;
}

// store_gmem_rowvec(dst, v, ld, n_in, tid): a role's row vector (rows wg * 64 + warp * 16 + lane / 4 + 8 * h,
// every lane of the quad holding the same value) to dst[r * ld] for r < n_in, from lane % 4 == 0.
template <typename TD, typename TS>
__device__ __forceinline__ void store_gmem_rowvec(TD* dst, const TS (&v)[2], index_t ld, int n_in, int tid) {
    const int lane = tid % 32, row0 = fragment_row0(tid);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int r = row0 + 8 * h;
        if (lane % 4 == 0 && r < n_in) dst[r * ld] = convert<TD>(v[h]);
    }
}

// store_gmem_rowstate<WHICH>(dst, best, arg, ld, n_in, tid): merge the quad's partials of each owned
// row (smaller value wins, the smaller index on ties) and write row r's arg (WHICH = 1) or best
// (WHICH = 0) to dst[r * ld] for r < n_in, from lane % 4 == 0. Called by whole warps.
template <int WHICH, typename TD>
__device__ __forceinline__ void store_gmem_rowstate(TD* dst, const float (&best)[2], const int (&arg)[2], index_t ld,
                                                    int n_in, int tid) {
    const int lane = tid % 32, row0 = fragment_row0(tid);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float v = best[h];
        int i = arg[h];
#pragma unroll
        for (int m = 1; m <= 2; m *= 2) {
            const float ov = __shfl_xor_sync(0xffffffffu, v, m);
            const int oi = __shfl_xor_sync(0xffffffffu, i, m);
            if (ov < v || (ov == v && oi < i)) { v = ov; i = oi; }
        }
        const int r = row0 + 8 * h;
        if (lane % 4 == 0 && r < n_in) dst[r * ld] = WHICH ? convert<TD>(i) : convert<TD>(v);
    }
}

// ----------------------------------------------------------------- fragment epilogues (topk_bias)
// Like argmin_bias's row state, but each thread keeps, for each of its 2 fragment rows, a list of
// KMAX (value, index) pairs ascending by value (then index: columns arrive in increasing order and
// an equal value does not pass the one kept), in registers: every index below is a constant after
// unrolling, so nothing goes to local memory. A candidate enters only when below the list's last
// value (the row's current worst), which is rare once the list has warmed up.

// topk_insert<KMAX>(v, ix, x, j): x < v[KMAX - 1]; shift the larger entries up one and place (x, j).
template <int KMAX>
__device__ __forceinline__ void topk_insert(float (&v)[KMAX], int (&ix)[KMAX], float x, int j) {
#pragma unroll
    for (int p = KMAX - 1; p > 0; --p) {
        const bool up = x < v[p - 1], here = x < v[p];
        v[p] = up ? v[p - 1] : (here ? x : v[p]);
        ix[p] = up ? ix[p - 1] : (here ? j : ix[p]);
    }
    if (x < v[0]) { v[0] = x; ix[0] = j; }
}

// topk_row_min<N, GUARD>(acc, w, h, q, beta, base, limit): the smallest score bias - beta * acc of this thread's
// columns of fragment row h (columns base + b * 8 + q + e past limit left out when GUARD), branch-free.
template <int N, bool GUARD, int SLOTS>
__device__ __forceinline__ float topk_row_min(const float (&acc)[SLOTS], const float2 (&w)[N / 8], int h, int q,
                                              float beta, int base, int limit) {
    float m = __int_as_float(0x7f800000);
#pragma unroll
    for (int b = 0; b < N / 8; ++b) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const float v = fmaf(-beta, acc[b * 4 + h * 2 + e], e ? w[b].y : w[b].x);
            m = (!GUARD || base + b * 8 + q + e < limit) ? fminf(m, v) : m;
        }
    }
    return m;
}

// topk_bias_tile: per owned row h, a branch-free pass takes the minimum score of the row's N / 4
// columns (an FMA and a min each); only when it beats the list's last entry (rare once the list has
// filled) does a loop take the row's candidates in (value, index) order and insert them one by one,
// so the code holds one insertion per row instead of one per column (an inlined insertion per column
// does not fit the instruction cache). The bar is the row's, not only the list's: each of the quad's 4
// lists holds its ceil(KMAX / 4) best at or below the largest of their ceil(KMAX / 4)-th entries, so at
// least KMAX of the row's scores are at or below it and a score that does not beat it is not among the
// row's KMAX best. Against the list's own last entry alone (about the row's 4 * KMAX-th score), some
// row of a warpgroup takes the insertion loop on most tiles and the warpgroup's barrier holds the
// others: a split, ping-ponged top-k epilogue kernel went from 8.30 to 6.74 ms at its headline shape with the
// row's bar.
template <int N, int KMAX, bool GUARD, int SLOTS>
__device__ __forceinline__ void topk_bias_tile(float (&tv)[2][KMAX], int (&ti)[2][KMAX], const float (&acc)[SLOTS],
                                               const float* bias, float beta, int base, int limit, int lane) {
    const int q = (lane % 4) * 2;
    const float inf = __int_as_float(0x7f800000);
    float2 w[N / 8];                                                     // this thread's 2 columns per 8
#pragma unroll
    for (int b = 0; b < N / 8; ++b) w[b] = *reinterpret_cast<const float2*>(bias + b * 8 + q);
    float bar[2];                                                        // the row's bar, per owned row
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float u = tv[h][(KMAX + 3) / 4 - 1];
        u = fmaxf(u, __shfl_xor_sync(0xffffffffu, u, 1));
        u = fmaxf(u, __shfl_xor_sync(0xffffffffu, u, 2));
        bar[h] = u;
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const float m = topk_row_min<N, GUARD>(acc, w, h, q, beta, base, limit);
        if (__builtin_expect(!(m < fminf(bar[h], tv[h][KMAX - 1])), 1)) continue;
        float lo_v = -inf;
        int lo_j = -1;                                                  // the last candidate taken
        for (;;) {
            float bv = inf;
            int bj = 0x7fffffff;
#pragma unroll
            for (int b = 0; b < N / 8; ++b) {
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int j = base + b * 8 + q + e;                 // ascending: ties keep the lower index
                    const float v = fmaf(-beta, acc[b * 4 + h * 2 + e], e ? w[b].y : w[b].x);
                    const bool after = v > lo_v || (v == lo_v && j > lo_j);
                    if (after && v < bv && (!GUARD || j < limit)) { bv = v; bj = j; }
                }
            }
            if (!(bv < fminf(bar[h], tv[h][KMAX - 1]))) break;
            topk_insert(tv[h], ti[h], bv, bj);
            lo_v = bv;
            lo_j = bj;
        }
    }
}

// topk_bias_rmem_wgmma_acc<N>(tv, ti, acc, bias, beta, base, limit, tid): merge the scores
// bias[c] - beta * acc[c] (columns base + c < limit) into the thread's lists. Reads of bias end at a
// warpgroup barrier (named barrier 1 + warpgroup of the CTA), so the arrive that releases the slot
// follows every thread's reads.
template <int N, int KMAX, int SLOTS>
__device__ __forceinline__ void topk_bias_rmem_wgmma_acc(float (&tv)[2][KMAX], int (&ti)[2][KMAX],
                                                         const float (&acc)[SLOTS], const float* bias, float beta,
                                                         int base, int limit, int tid) {
    static_assert(SLOTS * 2 == N && N % 8 == 0, "a wgmma accumulator holds N / 2 floats per thread, N % 8 == 0");
    if (base + N <= limit) topk_bias_tile<N, KMAX, false>(tv, ti, acc, bias, beta, base, limit, tid % 32);
    else topk_bias_tile<N, KMAX, true>(tv, ti, acc, bias, beta, base, limit, tid % 32);
    asm volatile("bar.sync %0, 128;" :: "r"(1 + (int)(threadIdx.x / 128)) : "memory");
}

// topk_shift_rows<KMAX>(tv, rows, tid): add rows[r] to every value of the thread's lists of its 2 fragment rows
// r (fragment_row0): the order of each list is unchanged (inf stays inf).
template <int KMAX>
__device__ __forceinline__ void topk_shift_rows(float (&tv)[2][KMAX], const float* rows, int tid) {
    const int row0 = fragment_row0(tid);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const float s = rows[row0 + 8 * h];
#pragma unroll
        for (int p = 0; p < KMAX; ++p) tv[h][p] += s;
    }
}

// topk_merge_quad<KMAX>(tv, ti, n_cols, tid, sink): for each owned row, merge the quad's 4 sorted lists
// (n_cols rounds: the quad's smallest head by (value, index), 2 shuffles; its owner pops it) and hand
// column c of row r to sink(r, c, value, index) on lane % 4 == 0. The lists are copied: both tiles may be
// stored. Called by whole warps.
template <int KMAX, typename SINK>
__device__ __forceinline__ void topk_merge_quad(const float (&tv)[2][KMAX], const int (&ti)[2][KMAX], int n_cols,
                                                int tid, SINK&& sink) {
    const int lane = tid % 32, row0 = fragment_row0(tid);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float v[KMAX];
        int ix[KMAX];
#pragma unroll
        for (int p = 0; p < KMAX; ++p) { v[p] = tv[h][p]; ix[p] = ti[h][p]; }
        const int r = row0 + 8 * h;
#pragma unroll
        for (int c = 0; c < KMAX; ++c) {
            if (c >= n_cols) break;                                  // uniform: n_cols is the same in the warp
            float bv = v[0];
            int bi = ix[0];
#pragma unroll
            for (int m = 1; m <= 2; m *= 2) {
                const float ov = __shfl_xor_sync(0xffffffffu, bv, m);
                const int oi = __shfl_xor_sync(0xffffffffu, bi, m);
                if (ov < bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
            }
            const bool pop = ix[0] == bi && !(v[0] != bv);          // this lane held the quad's smallest
#pragma unroll
            for (int p = 0; p + 1 < KMAX; ++p) { v[p] = pop ? v[p + 1] : v[p]; ix[p] = pop ? ix[p + 1] : ix[p]; }
            if (pop) { v[KMAX - 1] = __int_as_float(0x7f800000); ix[KMAX - 1] = -1; }
            if (lane % 4 == 0) sink(r, c, bv, bi);
        }
    }
}

// store_gmem_topk<WHICH>(dst, tv, ti, ld_row, ld_col, n_rows, n_cols, tid): the quad-merged lists' first
// n_cols indices (WHICH = 1) or values (WHICH = 0) of each owned row r < n_rows to dst[r * ld_row + c * ld_col].
template <int WHICH, int KMAX, typename TD>
__device__ __forceinline__ void store_gmem_topk(TD* dst, const float (&tv)[2][KMAX], const int (&ti)[2][KMAX],
                                                index_t ld_row, index_t ld_col, int n_rows, int n_cols, int tid) {
    topk_merge_quad<KMAX>(tv, ti, n_cols, tid, [&](int r, int c, float bv, int bi) {
        if (r < n_rows) dst[r * ld_row + c * ld_col] = WHICH ? convert<TD>(bi) : convert<TD>(bv);
    });
}

// store_smem_topk<KMAX>(pv, pi, tv, ti, tid): every column of the quad-merged lists of each owned row r
// into the row-major (rows, KMAX) smem tiles pv (values) and pi (indices): a CTA's lists, published to
// its cluster (topk_publish); a cluster barrier orders them before the peers' reads.
template <int KMAX>
__device__ __forceinline__ void store_smem_topk(float* pv, int* pi, const float (&tv)[2][KMAX],
                                                const int (&ti)[2][KMAX], int tid) {
    topk_merge_quad<KMAX>(tv, ti, KMAX, tid, [&](int r, int c, float bv, int bi) {
        pv[r * KMAX + c] = bv;
        pi[r * KMAX + c] = bi;
    });
}

// ----------------------------------------------------------------- distributed smem (cluster peers)
__device__ __forceinline__ uint32_t cluster_ctarank() {
    uint32_t r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}
// the shared::cluster address of the same smem offset in cluster CTA `cta_rank` (itself included)
__device__ __forceinline__ uint32_t mapa_shared_cluster(uint32_t local, uint32_t cta_rank) {
    uint32_t remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(cta_rank));
    return remote;
}
__device__ __forceinline__ uint32_t mapa_shared_cluster(const void* p, uint32_t cta_rank) {
    return mapa_shared_cluster(smem_u32(p), cta_rank);
}
__device__ __forceinline__ float ld_shared_cluster_f32(uint32_t addr) {
    float v;
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(addr) : "memory");
    return v;
}
__device__ __forceinline__ int ld_shared_cluster_s32(uint32_t addr) {
    int v;
    asm volatile("ld.shared::cluster.s32 %0, [%1];" : "=r"(v) : "r"(addr) : "memory");
    return v;
}

// topk_cluster_merge_gmem<R, KMAX, NC, WHICH>(dst, ld_row, ld_col, n_rows, n_cols, pv, pi, tid, threads):
// CTA rank c of the NC-CTA cluster takes rows [c * ceil(R / NC), ...) of the published (R, KMAX) lists
// pv / pi, one thread per row: an NC-way merge by (value, index) of the lists at the same smem offset in
// every CTA of the cluster (ld.shared::cluster; each list's head kept in registers, every array index a
// constant after unrolling), writing the first n_cols indices (WHICH = 1) or values of rows r < n_rows
// to dst[r * ld_row + c * ld_col]. Between cluster barriers: after the publishing, before any CTA exits.
template <int R, int KMAX, int NC, int WHICH, typename TD>
__device__ __forceinline__ void topk_cluster_merge_gmem(TD* dst, index_t ld_row, index_t ld_col, int n_rows,
                                                        int n_cols, const float* pv, const int* pi, int tid,
                                                        int threads) {
    static_assert(NC >= 1 && NC <= 16, "a cluster holds 1 to 16 CTAs");
    constexpr int SHARE = (R + NC - 1) / NC;                         // rows per CTA of the cluster
    const int lo = (int)cluster_ctarank() * SHARE, hi = lo + SHARE < R ? lo + SHARE : R;
#pragma unroll 1
    for (int r = lo + tid; r < hi; r += threads) {
        // each element's cluster address comes from its own mapa. Offsetting the row's mapa result instead
        // (av + 4 * pos) read the element after the intended one from the index list after a list's first
        // pop, on the H200 (CUDA 13.0, 2026-11-29; the PTX was right, the values list read right)
        const uint32_t lv = smem_u32(pv + r * KMAX), li = smem_u32(pi + r * KMAX);
        float hv[NC];
        int hx[NC], pos[NC];
#pragma unroll
        for (int c = 0; c < NC; ++c) {
            hv[c] = ld_shared_cluster_f32(mapa_shared_cluster(lv, (uint32_t)c));
            hx[c] = ld_shared_cluster_s32(mapa_shared_cluster(li, (uint32_t)c));
            pos[c] = 0;
        }
#pragma unroll 1
        for (int p = 0; p < n_cols && p < KMAX; ++p) {
            float bv = hv[0];
            int bi = hx[0], bc = 0;
#pragma unroll
            for (int c = 1; c < NC; ++c)
                if (hv[c] < bv || (hv[c] == bv && hx[c] < bi)) { bv = hv[c]; bi = hx[c]; bc = c; }
            if (r < n_rows) dst[r * ld_row + p * ld_col] = WHICH ? convert<TD>(bi) : convert<TD>(bv);
#pragma unroll
            for (int c = 0; c < NC; ++c) {
                if (c != bc) continue;
                ++pos[c];
                hv[c] = pos[c] < KMAX ? ld_shared_cluster_f32(mapa_shared_cluster(lv + 4u * pos[c], (uint32_t)c))
                                      : __int_as_float(0x7f800000);
                hx[c] = pos[c] < KMAX ? ld_shared_cluster_s32(mapa_shared_cluster(li + 4u * pos[c], (uint32_t)c))
                                      : 0x7fffffff;
            }
        }
    }
}

// ----------------------------------------------------------------- row norms of an smem tile
// unpack2_f32(lo, hi, w, tag): the two 16-bit values packed in w (low half first) as floats.
__device__ __forceinline__ void unpack2_f32(float& lo, float& hi, uint32_t w, const __nv_bfloat16*) {
    lo = __uint_as_float(w << 16);
    hi = __uint_as_float(w & 0xffff0000u);
}
__device__ __forceinline__ void unpack2_f32(float& lo, float& hi, uint32_t w, const __half*) {
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&w));
    lo = f.x;
    hi = f.y;
}

// sqnorm_rows_smem<R, C, THREADS, ACC>(dst, src, tid): dst[r] (+)= sum_c src[r, c]^2 (f32), P = 2
// neighbouring threads per row where the role has 2R threads (a 64-row tile on a 128-thread role: 8.3 ms
// instead of 9.8 for a split, ping-ponged top-k epilogue kernel at its headline shape, where one thread per
// row left half the role idle), else 1; each sums its half of the row's chunks, combined by a shuffle.
// 16-byte chunks: a swizzled row keeps its chunks inside its own span, so the sum ignores the swizzle
// (and the XOR pattern spreads a warp's reads evenly over the banks). Ends with a barrier of the role's threads
// (named barrier BAR), so the role's next arrive publishes dst.
template <int R, int C, int THREADS, bool ACC, int BAR, typename TS>
__device__ __forceinline__ void sqnorm_rows_smem(float* dst, const TS* src, int tid) {
    static_assert(sizeof(TS) == 2 && C % 8 == 0, "16-bit rows of whole 16-byte chunks");
    static_assert(THREADS % 32 == 0, "whole warps");
    constexpr int CH = C / 8;
    constexpr int P = (THREADS >= 2 * R && CH % 2 == 0) ? 2 : 1;
    constexpr int ROWS_PER_PASS = THREADS / P;
#pragma unroll 1
    for (int r0 = 0; r0 < R; r0 += ROWS_PER_PASS) {      // every thread takes every pass: the shuffles
        const int r = r0 + tid / P, part = tid % P;
        float s0 = 0.f, s1 = 0.f;
        if (r < R) {
            const int4* row = reinterpret_cast<const int4*>(src + r * C);
#pragma unroll
            for (int j = 0; j < CH / P; ++j) {
                const int4 u = row[part * (CH / P) + j];
                const uint32_t w[4] = {(uint32_t)u.x, (uint32_t)u.y, (uint32_t)u.z, (uint32_t)u.w};
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    float lo, hi;
                    unpack2_f32(lo, hi, w[e], (const TS*)nullptr);
                    s0 = fmaf(lo, lo, s0);
                    s1 = fmaf(hi, hi, s1);
                }
            }
        }
        float t = s0 + s1;
#pragma unroll
        for (int m = 1; m < P; m *= 2) t += __shfl_xor_sync(0xffffffffu, t, m);
        if (r < R && part == 0) dst[r] = (ACC ? dst[r] : 0.f) + t;
    }
    asm volatile("bar.sync %0, %1;" :: "r"(BAR), "r"(THREADS) : "memory");
}

}  // namespace cake
