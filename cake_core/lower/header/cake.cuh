// cake.cuh: the device header that Cake IR lowers onto (v1: plain loads and stores, fp32 FMA MMA).
//
// ThunderKittens-style conventions:
//   - destination first: load_smem_gmem(dst, src, ...), store_gmem_rmem(dst, src, ...);
//   - the memory space is in every name (gmem, smem, rmem);
//   - every static_assert carries a short comment saying what it protects.
//
// Distribution of an rmem tile over a CTA (the IR's semantics): element e of the
// row-major flattened tile lives in thread e % THREADS, slot e / THREADS, so every
// thread holds NUMEL / THREADS registers, indexed only by unrolled loop counters.
// Exception: accumulators of mma(atom="mma_sync") (and rmem tiles tied to them by
// slot-wise elementwise ops) use the mma.sync fragment layout: see cake_mma.cuh.
//
// A gmem window is described to the tile helpers as a 2-D (ROWS x COLS) box:
// a base pointer (the window's first element), a row and a column stride in
// elements, and how many rows and columns lie inside the tensor (guarded variants
// only: elements past them read as zero / are not written).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

// ----------------------------------------------------------------- index arithmetic
__device__ __forceinline__ int cake_cdiv(int a, int b) { return (a + b - 1) / b; }
__device__ __forceinline__ int cake_min(int a, int b) { return a < b ? a : b; }
__device__ __forceinline__ int cake_max(int a, int b) { return a > b ? a : b; }

namespace cake {

typedef long long index_t;  // gmem offsets: tensors may exceed 2^31 elements

// tile_order(tm, tn, t, tiles_m, tiles_n, group): the coordinates of linear tile t (0 <= t < tiles_m * tiles_n,
// group >= 1) in grouped order: runs of `group` tile rows (fewer in the last run) walked column by column, so the
// CTAs of a persistent grid at work at one time share the a and b tiles of a few rows and columns in L2.
__device__ __forceinline__ void tile_order(int& tm, int& tn, int t, int tiles_m, int tiles_n, int group) {
    const int width = group * tiles_n;                    // tiles per run of `group` tile rows
    const int first = t / width * group;                  // the run's first tile row
    const int rows = cake_min(tiles_m - first, group);    // the last run may hold fewer rows
    tm = first + t % width % rows;
    tn = t % width / rows;
}

// read_index(p, inside, hi): the integer at p (0 when the element lies outside its tensor), clamped into [0, hi]:
// `scalar`'s data-dependent bound. Every thread reads the same element: one broadcast load. A plain load (not
// the read-only path), so a value the CTA stored before a __syncthreads() is seen.
template <typename T> __device__ __forceinline__ int read_index(const T* p, bool inside, int hi) {
    const long long v = inside ? static_cast<long long>(*p) : 0;
    return static_cast<int>(v < 0 ? 0 : (v > hi ? hi : v));
}

// fetch_add_index(dst, v, scratch, inside, hi): `fetch_add`'s old value. Thread 0 of the CTA adds v to *dst with an
// atomic that returns what *dst held (nothing is added where the element lies outside its tensor: it reads 0) and
// hands it to every thread through scratch, one int of shared memory; each returns it clamped into [0, hi]. The
// first barrier lets every thread finish reading an earlier user's scratch, the second publishes the value. Every
// thread of the CTA calls it, as many times (it holds two __syncthreads()).
__device__ __forceinline__ int fetch_add_index(int* dst, int v, int* scratch, bool inside, int hi) {
    __syncthreads();
    if (threadIdx.x == 0) *scratch = inside ? atomicAdd(dst, v) : 0;
    __syncthreads();
    const int old = *scratch;
    return old < 0 ? 0 : (old > hi ? hi : old);
}
// fetch_add_gmem: a counter in global memory, shared by the CTAs (the adds of different CTAs land in any order)
__device__ __forceinline__ int fetch_add_gmem(int* dst, int v, int* scratch, bool inside, int hi) {
    return fetch_add_index(dst, v, scratch, inside, hi);
}
// fetch_add_smem: a counter in the CTA's shared memory (a running offset across a loop's trips)
__device__ __forceinline__ int fetch_add_smem(int* dst, int v, int* scratch, bool inside, int hi) {
    return fetch_add_index(dst, v, scratch, inside, hi);
}

// ----------------------------------------------------------------- conversions
template <typename T> __device__ __forceinline__ float to_f32(T x) { return static_cast<float>(x); }
template <> __device__ __forceinline__ float to_f32<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }
template <> __device__ __forceinline__ float to_f32<__half>(__half x) { return __half2float(x); }

template <typename D, typename S> struct convert_impl {
    __device__ __forceinline__ static D run(S x) { return static_cast<D>(x); }
};
template <typename S> struct convert_impl<__nv_bfloat16, S> {
    __device__ __forceinline__ static __nv_bfloat16 run(S x) { return __float2bfloat16_rn(to_f32(x)); }
};
template <typename S> struct convert_impl<__half, S> {
    __device__ __forceinline__ static __half run(S x) { return __float2half_rn(to_f32(x)); }
};
template <> struct convert_impl<__nv_bfloat16, __nv_bfloat16> {
    __device__ __forceinline__ static __nv_bfloat16 run(__nv_bfloat16 x) { return x; }
};
template <> struct convert_impl<__half, __half> {
    __device__ __forceinline__ static __half run(__half x) { return x; }
};
template <typename S> struct convert_impl<float, S> {
    __device__ __forceinline__ static float run(S x) { return to_f32(x); }
};
// convert<D>(x): x as a D, rounding to nearest for 16-bit floats.
template <typename D, typename S> __device__ __forceinline__ D convert(S x) { return convert_impl<D, S>::run(x); }

template <typename T> __device__ __forceinline__ T zero() { return convert<T>(0.0f); }

// ----------------------------------------------------------------- rmem
// fill_rmem(dst, v): every slot of this thread's share of the tile := v.
template <int SLOTS, typename T, typename V>
__device__ __forceinline__ void fill_rmem(T (&dst)[SLOTS], V v) {
    static_assert(SLOTS > 0, "an rmem tile needs at least one element per thread");
    const T x = convert<T>(v);
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) dst[s] = x;
}

// ----------------------------------------------------------------- swizzled smem
// swizzle128_elem<ROWS, COLS, T>(r, c): the element index of (r, c) in a swizzle-128 smem tile as TMA and wgmma
// lay it out: columns in blocks of one 128-byte span side by side (ROWS x SPAN elements each), and in each
// block the 16-byte chunk k of row r at chunk k ^ (r % 8) (the tile starts 1024-byte aligned).
template <int ROWS, int COLS, typename T>
__device__ __forceinline__ int swizzle128_elem(int r, int c) {
    constexpr int SPAN = 128 / (int)sizeof(T), CHUNK = 16 / (int)sizeof(T);
    static_assert(COLS % SPAN == 0, "a swizzle-128 tile's rows are whole 128-byte spans");
    const int blk = c / SPAN, cc = c % SPAN;
    return blk * ROWS * SPAN + r * SPAN + (((cc / CHUNK) ^ (r & 7)) * CHUNK) + cc % CHUNK;
}

// ----------------------------------------------------------------- gmem -> smem
// load_smem_gmem<ROWS, COLS, THREADS, GUARD>(dst, src, ld_row, ld_col, rows_in, cols_in):
// dst[r * COLS + c] := src[r * ld_row + c * ld_col]; consecutive threads take
// consecutive columns, so rows of a row-major tensor are read coalesced.
template <int ROWS, int COLS, int THREADS, bool GUARD, typename TD, typename TS>
__device__ __forceinline__ void load_smem_gmem(TD* dst, const TS* src, index_t ld_row, index_t ld_col,
                                               int rows_in, int cols_in) {
    static_assert(ROWS > 0 && COLS > 0, "a tile has at least one element");
    constexpr int NUMEL = ROWS * COLS;
#pragma unroll 4
    for (int e = threadIdx.x; e < NUMEL; e += THREADS) {
        const int r = e / COLS, c = e % COLS;
        if (!GUARD || (r < rows_in && c < cols_in)) {
            dst[e] = convert<TD>(src[r * ld_row + c * ld_col]);
        } else {
            dst[e] = zero<TD>();
        }
    }
}

// gather_smem_gmem<ROWS, COLS, THREADS>(dst, src, ld_row, ld_col, src_rows, cols_in, idx, base, limit):
// row r of dst := row idx[base + r] of the window (src + i * ld_row + c * ld_col); zeros where base + r >= limit,
// where the index lies outside [0, src_rows) (padding rows) and past cols_in columns. Consecutive threads take
// consecutive columns of a row, so each gathered row is read coalesced.
template <int ROWS, int COLS, int THREADS, typename TD, typename TS, typename TI>
__device__ __forceinline__ void gather_smem_gmem(TD* dst, const TS* src, index_t ld_row, index_t ld_col,
                                                 int src_rows, int cols_in, const TI* idx, int base, int limit) {
    static_assert(ROWS > 0 && COLS > 0, "a tile has at least one element");
    constexpr int NUMEL = ROWS * COLS;
#pragma unroll 4
    for (int e = threadIdx.x; e < NUMEL; e += THREADS) {
        const int r = e / COLS, c = e % COLS;
        const int p = base + r;
        const long long i = p < limit ? static_cast<long long>(idx[p]) : -1;
        dst[e] = (i >= 0 && i < src_rows && c < cols_in) ? convert<TD>(src[i * ld_row + c * ld_col]) : zero<TD>();
    }
}

// ----------------------------------------------------------------- gmem -> rmem
// load_rmem_gmem<ROWS, COLS, THREADS, GUARD>(dst, src, ...): slot s of this thread
// := element s * THREADS + threadIdx.x of the window.
template <int ROWS, int COLS, int THREADS, bool GUARD, int SLOTS, typename TD, typename TS>
__device__ __forceinline__ void load_rmem_gmem(TD (&dst)[SLOTS], const TS* src, index_t ld_row, index_t ld_col,
                                               int rows_in, int cols_in) {
    static_assert(ROWS * COLS == SLOTS * THREADS, "rmem tile elements must split evenly over the CTA's threads");
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) {
        const int e = s * THREADS + threadIdx.x;
        const int r = e / COLS, c = e % COLS;
        dst[s] = (!GUARD || (r < rows_in && c < cols_in)) ? convert<TD>(src[r * ld_row + c * ld_col]) : zero<TD>();
    }
}

// ----------------------------------------------------------------- rmem -> gmem
// store_gmem_rmem<ROWS, COLS, THREADS, GUARD>(dst, src, ...): the window's element
// s * THREADS + threadIdx.x := slot s, converted to the gmem dtype.
template <int ROWS, int COLS, int THREADS, bool GUARD, int SLOTS, typename TD, typename TS>
__device__ __forceinline__ void store_gmem_rmem(TD* dst, const TS (&src)[SLOTS], index_t ld_row, index_t ld_col,
                                                int rows_in, int cols_in) {
    static_assert(ROWS * COLS == SLOTS * THREADS, "rmem tile elements must split evenly over the CTA's threads");
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) {
        const int e = s * THREADS + threadIdx.x;
        const int r = e / COLS, c = e % COLS;
        if (!GUARD || (r < rows_in && c < cols_in)) dst[r * ld_row + c * ld_col] = convert<TD>(src[s]);
    }
}

// ----------------------------------------------------------------- smem -> gmem
template <int ROWS, int COLS, int THREADS, bool GUARD, typename TD, typename TS>
__device__ __forceinline__ void store_gmem_smem(TD* dst, const TS* src, index_t ld_row, index_t ld_col,
                                                int rows_in, int cols_in) {
    static_assert(ROWS > 0 && COLS > 0, "a tile has at least one element");
    constexpr int NUMEL = ROWS * COLS;
#pragma unroll 4
    for (int e = threadIdx.x; e < NUMEL; e += THREADS) {
        const int r = e / COLS, c = e % COLS;
        if (!GUARD || (r < rows_in && c < cols_in)) dst[r * ld_row + c * ld_col] = convert<TD>(src[e]);
    }
}

// ----------------------------------------------------------------- mma, atom "fma"
// mma_fma_rmem_smem<M, N, K, THREADS>(acc, a, b): acc (M x N, rmem f32) += a (M x K,
// smem, row-major) @ b (K x N, smem, row-major) with one fp32 FMA per product, each
// thread over the acc elements it owns.
template <int M, int N, int K, int THREADS, int SLOTS, typename TA, typename TB>
__device__ __forceinline__ void mma_fma_rmem_smem(float (&acc)[SLOTS], const TA* a, const TB* b) {
    static_assert(M * N == SLOTS * THREADS, "acc elements must split evenly over the CTA's threads");
    static_assert(K > 0, "the reduction dimension is not empty");
    if constexpr (THREADS % N == 0) {
        // every slot of a thread lies in one column: read b once per k, a is a warp broadcast
        constexpr int RSTEP = THREADS / N;
        const int col = threadIdx.x % N, row0 = threadIdx.x / N;
#pragma unroll 4
        for (int k = 0; k < K; ++k) {
            const float bk = to_f32(b[k * N + col]);
#pragma unroll
            for (int s = 0; s < SLOTS; ++s) acc[s] = fmaf(to_f32(a[(row0 + s * RSTEP) * K + k]), bk, acc[s]);
        }
    } else {
#pragma unroll 4
        for (int k = 0; k < K; ++k) {
#pragma unroll
            for (int s = 0; s < SLOTS; ++s) {
                const int e = s * THREADS + threadIdx.x;
                const int r = e / N, c = e % N;
                acc[s] = fmaf(to_f32(a[r * K + k]), to_f32(b[k * N + c]), acc[s]);
            }
        }
    }
}

}  // namespace cake

#include "cake_compute.cuh"  // compute ops: ewise math, reductions, running arg-min / top-k, atomics

#include "cake_async.cuh"  // Hopper async vocabulary: mbarriers, TMA, cp.async, wgmma, setmaxnreg

#include "cake_topk_smem.cuh"  // topk_bias lists in shared memory (KMAX up to 128): the quad inserts together

#include "cake_mma.cuh"  // mma atom "mma_sync": tensor-core m16n8k16 with ldmatrix; its fragment-layout accumulators

#include "cake_atomic.cuh"  // atomic adds of register fragments (split-K epilogues): red.global.add.v2/v4.f32

#include "cake_cluster.cuh"  // split-K over a cluster: partial tiles reduced through distributed shared memory
