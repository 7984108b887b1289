// cake_mma.cuh: mma(acc, a, b, atom="mma_sync") on the tensor cores (sm_80+, sm_90a included),
// with mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32 and ldmatrix.
// Included from cake.cuh.
//
// The mma_sync accumulator layout ("fragment layout"). An (M x N) f32 rmem tile that an
// mma_sync accumulates into is NOT distributed like other rmem tiles (element e in thread
// e % THREADS): it is held as mma.sync leaves it, so no shuffle is needed per mma.
//   - The CTA's WARPS = THREADS / 32 warps form a WM x WN grid, row-major: warp w sits at
//     (wm, wn) = (w / WN, w % WN) and owns the TM x TN = (M / WM) x (N / WN) block at
//     (wm * TM, wn * TN). The lowering picks WM, WN (cake_core/lower/cuda.py: _warp_grid).
//   - A block is MI x NI = (TM / 16) x (TN / 8) m16n8 atoms. Slot s = (mi * NI + ni) * 4 + j
//     (j in 0..3) of lane l holds the element at
//         row = wm * TM + mi * 16 + l / 4 + 8 * (j / 2)
//         col = wn * TN + ni * 8  + 2 * (l % 4) + (j % 2)
//     (the PTX ISA's m16n8 f32 C/D fragment: c0, c1 on row l/4, c2, c3 eight rows below).
//   - Every thread holds MI * NI * 4 = M * N / THREADS slots: the same count as the default
//     distribution, so rmem(fill=...) and slot-wise elementwise ops are layout-agnostic; ops
//     that address elements by position (load, store) use mma_layout::coord below.
#pragma once

#include <cstdint>
#include <type_traits>

namespace cake {

template <int M, int N, int THREADS, int WM, int WN>
struct mma_layout {
    static_assert(THREADS % 32 == 0, "mma_sync needs whole warps");
    static constexpr int WARPS = THREADS / 32;
    static_assert(WM * WN == WARPS, "the warp grid covers every warp of the CTA exactly once");
    static constexpr int TM = M / WM, TN = N / WN;
    static_assert(TM * WM == M && TN * WN == N, "the warp grid tiles the accumulator");
    static_assert(TM % 16 == 0, "each warp's rows are a multiple of the atom's 16");
    static_assert(TN % 8 == 0, "each warp's columns are a multiple of the atom's 8");
    static constexpr int MI = TM / 16, NI = TN / 8;
    static constexpr int SLOTS = MI * NI * 4;
    static_assert(SLOTS * THREADS == M * N, "fragments hold every element exactly once");

    // coord(s, r, c): the (row, col) of the accumulator element in this thread's slot s.
    __device__ static __forceinline__ void coord(int s, int& r, int& c) {
        const int w = threadIdx.x / 32, l = threadIdx.x % 32;
        const int j = s % 4, atom = s / 4, mi = atom / NI, ni = atom % NI;
        r = (w / WN) * TM + mi * 16 + l / 4 + 8 * (j / 2);
        c = (w % WN) * TN + ni * 8 + 2 * (l % 4) + (j % 2);
    }
};

__device__ __forceinline__ uint32_t mma_smem_addr(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ldmatrix: four (x4) or two (x2) 8x8 b16 matrices; lane l gives the row address of matrix l / 8.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t& r0, uint32_t& r1, uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r0), "=r"(r1) : "r"(addr));
}

// d (4 f32, an m16n8 C fragment) += a (m16k16, row) @ b (k16n8, col).
template <typename T>
__device__ __forceinline__ void mma_m16n8k16(float& d0, float& d1, float& d2, float& d3, const uint32_t (&a)[4],
                                             uint32_t b0, uint32_t b1) {
    static_assert(std::is_same<T, __nv_bfloat16>::value || std::is_same<T, __half>::value,
                  "mma_sync operands are bf16 or f16");
    if constexpr (std::is_same<T, __nv_bfloat16>::value) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                     "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                     : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3)
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    } else {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                     "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                     : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3)
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
}

// ----------------------------------------------------------------- mma, atom "mma_sync"
// mma_sync_rmem_smem<M, N, K, THREADS, WM, WN>(acc, a, b): acc (M x N, rmem f32, fragment
// layout above) += a (M x K, smem, row-major) @ b (K x N, smem, row-major). Each warp loads
// its A rows with ldmatrix.x4 and its B columns with ldmatrix(.x4|.x2).trans, 16 of K at a
// time, and issues MI * NI mma.sync per 16 of K. Like the fma atom it reads smem only: a
// sync() must order it after the stores that filled a and b.
template <int M, int N, int K, int THREADS, int WM, int WN, int SLOTS, typename T>
__device__ __forceinline__ void mma_sync_rmem_smem(float (&acc)[SLOTS], const T* a, const T* b) {
    using L = mma_layout<M, N, THREADS, WM, WN>;
    static_assert(SLOTS == L::SLOTS, "the accumulator holds M * N / THREADS slots per thread");
    static_assert(K % 16 == 0, "K is a multiple of the atom's 16");
    static_assert(K % 8 == 0 && N % 8 == 0, "ldmatrix rows are 16-byte aligned");
    const int w = threadIdx.x / 32, l = threadIdx.x % 32;
    const int r0 = (w / WN) * L::TM, c0 = (w % WN) * L::TN;
    // lane l addresses row (l % 16) and column block 8 * (l / 16) of a 16x16 piece: for A the
    // four matrices come back as a0..a3; for B (.trans) as {b0, b1} of n-atom 0, then of n-atom 1.
    const int lr = l % 16, lc = 8 * (l / 16);
#pragma unroll
    for (int k = 0; k < K; k += 16) {
        uint32_t fa[L::MI][4];
        uint32_t fb[L::NI][2];
#pragma unroll
        for (int mi = 0; mi < L::MI; ++mi)
            ldmatrix_x4(fa[mi], mma_smem_addr(a + (r0 + mi * 16 + lr) * K + k + lc));
#pragma unroll
        for (int ni = 0; ni + 1 < L::NI; ni += 2) {
            uint32_t r[4];
            ldmatrix_x4_trans(r, mma_smem_addr(b + (k + lr) * N + c0 + ni * 8 + lc));
            fb[ni][0] = r[0]; fb[ni][1] = r[1]; fb[ni + 1][0] = r[2]; fb[ni + 1][1] = r[3];
        }
        if constexpr (L::NI % 2 == 1) {
            ldmatrix_x2_trans(fb[L::NI - 1][0], fb[L::NI - 1][1],
                              mma_smem_addr(b + (k + lr) * N + c0 + (L::NI - 1) * 8));
        }
#pragma unroll
        for (int mi = 0; mi < L::MI; ++mi) {
#pragma unroll
            for (int ni = 0; ni < L::NI; ++ni) {
                float* d = &acc[(mi * L::NI + ni) * 4];
                mma_m16n8k16<T>(d[0], d[1], d[2], d[3], fa[mi], fb[ni][0], fb[ni][1]);
            }
        }
    }
}

// ----------------------------------------------------------------- mma, atom "mma_sync" on f32 operands (3xTF32)
// A tf32 product keeps 10 mantissa bits; the split x = big + small, big = tf32(x), small = tf32(x - big), keeps
// 21, and big·big + big·small + small·big (the small·small term is below fp32's rounding) is an fp32 product to
// about 1e-6 relative: three m16n8k8 tf32 mma.sync per atom, the small terms first.
__device__ __forceinline__ uint32_t to_tf32(float x) {
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r;
}
__device__ __forceinline__ void split_tf32(float x, uint32_t& big, uint32_t& small) {
    big = to_tf32(x);
    small = to_tf32(x - __uint_as_float(big));
}
__device__ __forceinline__ void mma_m16n8k8_tf32(float& d0, float& d1, float& d2, float& d3, const uint32_t (&a)[4],
                                                 uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// mma_sync_tf32x3_rmem_smem<M, N, K, THREADS, WM, WN>(acc, a, b): acc (M x N, rmem f32, the fragment layout
// above: the m16n8k8 accumulator is the m16n8k16 one) += a (M x K, smem f32, row-major) @ b (K x N, smem f32,
// row-major), 8 of K at a time. Lane l (group g = l / 4, t = l % 4) reads A at rows g and g + 8, columns t and
// t + 4 of each 16 x 8 piece, and B at rows t and t + 4, column g of each 8 x 8 piece, with plain smem loads.
template <int M, int N, int K, int THREADS, int WM, int WN, int SLOTS>
__device__ __forceinline__ void mma_sync_tf32x3_rmem_smem(float (&acc)[SLOTS], const float* a, const float* b) {
    using L = mma_layout<M, N, THREADS, WM, WN>;
    static_assert(SLOTS == L::SLOTS, "the accumulator holds M * N / THREADS slots per thread");
    static_assert(K % 8 == 0, "K is a multiple of the tf32 atom's 8");
    const int w = threadIdx.x / 32, l = threadIdx.x % 32;
    const int r0 = (w / WN) * L::TM, c0 = (w % WN) * L::TN;
    const int g = l / 4, t = l % 4;
#pragma unroll 2
    for (int k = 0; k < K; k += 8) {
        uint32_t ab[L::MI][4], as[L::MI][4];
#pragma unroll
        for (int mi = 0; mi < L::MI; ++mi) {
            const float* ar = a + (r0 + mi * 16 + g) * K + k + t;
            split_tf32(ar[0], ab[mi][0], as[mi][0]);
            split_tf32(ar[8 * K], ab[mi][1], as[mi][1]);
            split_tf32(ar[4], ab[mi][2], as[mi][2]);
            split_tf32(ar[8 * K + 4], ab[mi][3], as[mi][3]);
        }
        uint32_t bb[L::NI][2], bs[L::NI][2];
#pragma unroll
        for (int ni = 0; ni < L::NI; ++ni) {
            const float* bc = b + (k + t) * N + c0 + ni * 8 + g;
            split_tf32(bc[0], bb[ni][0], bs[ni][0]);
            split_tf32(bc[4 * N], bb[ni][1], bs[ni][1]);
        }
#pragma unroll
        for (int mi = 0; mi < L::MI; ++mi) {
#pragma unroll
            for (int ni = 0; ni < L::NI; ++ni) {
                float* d = &acc[(mi * L::NI + ni) * 4];
                mma_m16n8k8_tf32(d[0], d[1], d[2], d[3], as[mi], bb[ni][0], bb[ni][1]);
                mma_m16n8k8_tf32(d[0], d[1], d[2], d[3], ab[mi], bs[ni][0], bs[ni][1]);
                mma_m16n8k8_tf32(d[0], d[1], d[2], d[3], ab[mi], bb[ni][0], bb[ni][1]);
            }
        }
    }
}

// ----------------------------------------------------------------- fragment-layout rmem <-> gmem
// These also serve rmem tiles that share an accumulator's layout through slot-wise elementwise
// ops (e.g. cast(acc_bf16, acc)): TR is the rmem tile's element type.
// The gmem window is ROWS x COLS (as for load_rmem_gmem / store_gmem_rmem); the tile is M x N
// with the same elements in the same row-major order (ROWS * COLS == M * N).

// mma_window_coord<COLS, ...>(s, r, c): the window position of slot s of this thread; a window of
// another shape than the tile holds the same elements in the same row-major order.
template <int COLS, int M, int N, int THREADS, int WM, int WN>
__device__ __forceinline__ void mma_window_coord(int s, int& r, int& c) {
    mma_layout<M, N, THREADS, WM, WN>::coord(s, r, c);
    if constexpr (COLS != N) {
        const int e = r * N + c;
        r = e / COLS;
        c = e % COLS;
    }
}

// store_gmem_mma_acc<...>(dst, src, ...): the window's element at the tile's (r, c) := slot s; with ADD, += slot s by
// a hardware atomic instead (the split-K epilogue of a CTA-collective mma_sync kernel: CTAs add into the zeroed output).
template <int ROWS, int COLS, int M, int N, int THREADS, int WM, int WN, bool GUARD, bool ADD = false, int SLOTS,
          typename TD, typename TR>
__device__ __forceinline__ void store_gmem_mma_acc(TD* dst, const TR (&src)[SLOTS], index_t ld_row,
                                                   index_t ld_col, int rows_in, int cols_in) {
    static_assert(SLOTS == mma_layout<M, N, THREADS, WM, WN>::SLOTS,
                  "the accumulator holds M * N / THREADS slots per thread");
    static_assert(ROWS * COLS == M * N, "the window holds the tile's elements");
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) {
        int r, c;
        mma_window_coord<COLS, M, N, THREADS, WM, WN>(s, r, c);
        if (GUARD && !(r < rows_in && c < cols_in)) continue;
        if constexpr (ADD) {
            atomic_add_gmem(dst + r * ld_row + c * ld_col, src[s]);
        } else {
            dst[r * ld_row + c * ld_col] = convert<TD>(src[s]);
        }
    }
}

// load_mma_acc_gmem<...>(dst, src, ...): slot s := the window's element at the tile's (r, c).
template <int ROWS, int COLS, int M, int N, int THREADS, int WM, int WN, bool GUARD, int SLOTS, typename TR,
          typename TS>
__device__ __forceinline__ void load_mma_acc_gmem(TR (&dst)[SLOTS], const TS* src, index_t ld_row,
                                                  index_t ld_col, int rows_in, int cols_in) {
    static_assert(SLOTS == mma_layout<M, N, THREADS, WM, WN>::SLOTS,
                  "the accumulator holds M * N / THREADS slots per thread");
    static_assert(ROWS * COLS == M * N, "the window holds the tile's elements");
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) {
        int r, c;
        mma_window_coord<COLS, M, N, THREADS, WM, WN>(s, r, c);
        dst[s] = (!GUARD || (r < rows_in && c < cols_in)) ? convert<TR>(src[r * ld_row + c * ld_col]) : zero<TR>();
    }
}

// scatter_add_gmem_mma_acc<...>(dst, src, idx, ...): row idx[r] of the window, column c += slot s (tile element
// (r, c)), for the tile's rows r < valid whose index lies in [0, extent) and inside the window (rows_in, cols_in).
template <int M, int N, int THREADS, int WM, int WN, bool GUARD, int SLOTS, typename TD, typename TR, typename TI>
__device__ __forceinline__ void scatter_add_gmem_mma_acc(TD* dst, const TR (&src)[SLOTS], const TI* idx,
                                                         index_t ld_i, index_t ld_c, int rows_in, int cols_in,
                                                         index_t extent, int valid) {
    static_assert(SLOTS == mma_layout<M, N, THREADS, WM, WN>::SLOTS,
                  "the accumulator holds M * N / THREADS slots per thread");
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) {
        int r, c;
        mma_layout<M, N, THREADS, WM, WN>::coord(s, r, c);
        if (r >= valid) continue;
        const index_t i = idx[r];
        if (!GUARD || (i >= 0 && i < extent && i < rows_in && c < cols_in))
            atomic_add_gmem(dst + i * ld_i + c * ld_c, src[s]);
    }
}

}  // namespace cake
