// cake_compute.cuh: device helpers of the compute ops (ewise math, reductions, running
// arg-min / top-k, atomics). Included from cake.cuh.
//
// The lowering emits the elementwise loops itself (each thread over the elements it
// owns: e = s * THREADS + threadIdx.x). Ops that combine elements held by different
// threads work on shared memory: rmem operands are first staged into smem scratch
// (stage_smem_rmem), the *_smem helpers below run one thread per line (row or
// column), and rmem results are read back (unstage_rmem_smem). A line of a tile is
// L elements apart by LS and its elements JS apart: element j of line l is at
// l * LS + j * JS.
#pragma once

namespace cake {

// ----------------------------------------------------------------- scalar math
// fn codes shared with the lowering: 0 sum/add, 1 max, 2 min.
template <int OP, typename A> __device__ __forceinline__ A combine(A a, A b) {
    if constexpr (OP == 0) return a + b;
    else if constexpr (OP == 1) return a > b ? a : b;
    else return a < b ? a : b;
}

template <int OP, typename A> __device__ __forceinline__ A identity();
template <> __device__ __forceinline__ float identity<0, float>() { return 0.0f; }
template <> __device__ __forceinline__ float identity<1, float>() { return __int_as_float(0xff800000); }
template <> __device__ __forceinline__ float identity<2, float>() { return __int_as_float(0x7f800000); }
template <> __device__ __forceinline__ int identity<0, int>() { return 0; }
template <> __device__ __forceinline__ int identity<1, int>() { return -2147483647 - 1; }
template <> __device__ __forceinline__ int identity<2, int>() { return 2147483647; }

// acc_t<T>: what a tile of T computes in (f32 for every float, int for i32).
template <typename T> struct acc_of { using type = float; };
template <> struct acc_of<int> { using type = int; };
template <typename T> using acc_t = typename acc_of<T>::type;

// f2i(x): float -> int as a C cast (toward zero), saturating instead of undefined.
__device__ __forceinline__ int f2i(float x) { return __float2int_rz(x); }

// The activations of unary (the interpreter's formulas, ops_compute._UNARY): expf, not __expf, so that
// they stay within a few ulp of the f32 reference. expf(-x) overflows to inf for x < -88, where
// 1 / (1 + inf) is the correct limit 0.
__device__ __forceinline__ float sigmoid_f32(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float silu_f32(float x) { return x * sigmoid_f32(x); }
// log(1 + e^x) = log1p(e^-|x|) + max(x, 0): the exponent is never positive, so nothing overflows.
__device__ __forceinline__ float softplus_f32(float x) { return log1pf(expf(-fabsf(x))) + fmaxf(x, 0.0f); }

// (value, index) lexicographic order of the running merges: ties go to the smaller index.
__device__ __forceinline__ bool lex_less(float v, int i, float w, int j) { return v < w || (v == w && i < j); }

// ----------------------------------------------------------------- staging rmem <-> smem
// trisolve_smem<N, M, UNIT, THREADS>(x, l): x (N x M, smem f32, row-major) := L^-1 x by forward substitution, for
// L (N x N, smem f32, row-major) lower-triangular (UNIT: its diagonal taken as 1 and not read; above it nothing is
// read). Thread t solves columns t, t + THREADS, ...: row i of a column is (x_i - sum_{j<i} L_ij y_j) / L_ii, summed
// in f32 in order of j. Every thread reads the same L_ij at a step: a broadcast within a warp. The caller
// synchronises before and after (lower_compute.lower_trisolve).
template <int N, int M, bool UNIT, int THREADS>
__device__ __forceinline__ void trisolve_smem(float* x, const float* l) {
    for (int c = threadIdx.x; c < M; c += THREADS) {
        for (int i = 0; i < N; ++i) {
            float acc = x[i * M + c];
            for (int j = 0; j < i; ++j) acc = fmaf(-l[i * N + j], x[j * M + c], acc);
            x[i * M + c] = UNIT ? acc : acc / l[i * N + i];
        }
    }
}

// stage_smem_rmem<NUMEL, THREADS>(dst, src): dst[s * THREADS + threadIdx.x] := src[s].
template <int NUMEL, int THREADS, int SLOTS, typename TD, typename TS>
__device__ __forceinline__ void stage_smem_rmem(TD* dst, const TS (&src)[SLOTS]) {
    static_assert(NUMEL == SLOTS * THREADS, "rmem tile elements must split evenly over the CTA's threads");
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) dst[s * THREADS + threadIdx.x] = src[s];
}

// unstage_rmem_smem<NUMEL, THREADS>(dst, src): dst[s] := src[s * THREADS + threadIdx.x].
template <int NUMEL, int THREADS, int SLOTS, typename TD, typename TS>
__device__ __forceinline__ void unstage_rmem_smem(TD (&dst)[SLOTS], const TS* src) {
    static_assert(NUMEL == SLOTS * THREADS, "rmem tile elements must split evenly over the CTA's threads");
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) dst[s] = src[s * THREADS + threadIdx.x];
}

// ----------------------------------------------------------------- axis ops (one thread per line)
// reduce_smem<L, N, LS, JS, OP, THREADS>(dst, src): dst[l] := src[l, 0] (+) ... (+) src[l, N-1].
template <int L, int N, int LS, int JS, int OP, int THREADS, typename TD, typename TS>
__device__ __forceinline__ void reduce_smem(TD* dst, const TS* src) {
    static_assert(L > 0 && N > 0, "a reduction has at least one line of one element");
    using A = acc_t<TS>;
    for (int l = threadIdx.x; l < L; l += THREADS) {
        A acc = convert<A>(src[l * LS]);
        for (int j = 1; j < N; ++j) acc = combine<OP, A>(acc, convert<A>(src[l * LS + j * JS]));
        dst[l] = convert<TD>(acc);
    }
}

// scan_smem<L, N, LS, JS, OP, EXCLUSIVE, THREADS>(dst, src): running (+) along each line;
// dst may be src (each element is read before it is written).
template <int L, int N, int LS, int JS, int OP, bool EXCLUSIVE, int THREADS, typename TD, typename TS>
__device__ __forceinline__ void scan_smem(TD* dst, const TS* src) {
    static_assert(L > 0 && N > 0, "a scan has at least one line of one element");
    using A = acc_t<TS>;
    for (int l = threadIdx.x; l < L; l += THREADS) {
        A acc = identity<OP, A>();
        for (int j = 0; j < N; ++j) {
            const int at = l * LS + j * JS;
            const A x = convert<A>(src[at]);
            const A next = j == 0 ? x : combine<OP, A>(acc, x);
            dst[at] = convert<TD>(EXCLUSIVE ? acc : next);
            acc = next;
        }
    }
}

// argreduce_smem<L, N, LS, JS, MAX, THREADS>(val, idx, src): the min (max) of each line and
// its first position.
template <int L, int N, int LS, int JS, bool MAX, int THREADS, typename TV, typename TS>
__device__ __forceinline__ void argreduce_smem(TV* val, int* idx, const TS* src) {
    static_assert(L > 0 && N > 0, "a reduction has at least one line of one element");
    using A = acc_t<TS>;
    for (int l = threadIdx.x; l < L; l += THREADS) {
        A best = convert<A>(src[l * LS]);
        int at = 0;
        for (int j = 1; j < N; ++j) {
            const A x = convert<A>(src[l * LS + j * JS]);
            if (MAX ? x > best : x < best) { best = x; at = j; }
        }
        val[l] = convert<TV>(best);
        idx[l] = at;
    }
}

// argmin_update_smem<R, C, THREADS>(best, arg, scores, base, limit): for each row r, the
// candidates j < min(C, limit - base) replace (best[r], arg[r]) when strictly smaller.
template <int R, int C, int THREADS, typename TS>
__device__ __forceinline__ void argmin_update_smem(float* best, int* arg, const TS* scores, int base, int limit) {
    static_assert(R > 0 && C > 0, "scores has at least one row and one column");
    const int n = limit - base < C ? limit - base : C;
    for (int r = threadIdx.x; r < R; r += THREADS) {
        float b = best[r];
        int a = arg[r];
        for (int j = 0; j < n; ++j) {
            const float x = to_f32(scores[r * C + j]);
            if (x < b) { b = x; a = base + j; }
        }
        best[r] = b;
        arg[r] = a;
    }
}

// topk_merge_smem<R, C, K, THREADS>(vals, idx, scores, base, limit): insert each candidate
// (scores[r, j], base + j), j < min(C, limit - base), into row r's sorted list of K.
template <int R, int C, int K, int THREADS, typename TS>
__device__ __forceinline__ void topk_merge_smem(float* vals, int* idx, const TS* scores, int base, int limit) {
    static_assert(R > 0 && C > 0 && K > 0, "scores and the running list are not empty");
    const int n = limit - base < C ? limit - base : C;
    for (int r = threadIdx.x; r < R; r += THREADS) {
        float* v = vals + r * K;
        int* ix = idx + r * K;
        for (int j = 0; j < n; ++j) {
            const float x = to_f32(scores[r * C + j]);
            const int g = base + j;
            if (!lex_less(x, g, v[K - 1], ix[K - 1])) continue;
            int p = K - 1;
            while (p > 0 && lex_less(x, g, v[p - 1], ix[p - 1])) {
                v[p] = v[p - 1];
                ix[p] = ix[p - 1];
                --p;
            }
            v[p] = x;
            ix[p] = g;
        }
    }
}

// ----------------------------------------------------------------- stream compaction (smem -> smem)
// compact_smem_smem<N, R, THREADS>(dst, flags, scratch, base, limit, hi): `compact`. dst[r] := base + j for the
// r-th element j of flags (N of them, row-major) that is nonzero and has base + j < limit, in increasing j (a
// stable order, the same on every run); dst[r] := -1 for r from that count to R. Returns the count clamped into
// [0, hi], the same in every thread. Rounds of THREADS flags, flag j = round * THREADS + threadIdx.x: a warp's
// ballot ranks a set flag among its warp's, the warps' counts in scratch (an int per warp) rank the warps, and every
// thread adds the round's total to the running count. Every thread of the CTA calls it (CTA barriers inside).
template <int N, int R, int THREADS, typename TF>
__device__ __forceinline__ int compact_smem_smem(int* dst, const TF* flags, int* scratch, int base, int limit,
                                                 int hi) {
    static_assert(THREADS % 32 == 0, "whole warps ballot their flags");
    static_assert(THREADS / 32 <= 32, "a CTA has at most 32 warps: their counts fill the op's 128 B of scratch");
    static_assert(R >= N, "every flag may be set: dst holds a position for each");
    constexpr int WARPS = THREADS / 32;
    const int warp = (int)(threadIdx.x / 32), lane = (int)(threadIdx.x % 32);
    int total = 0;
    __syncthreads();           // an earlier user of the scratch has finished with it
#pragma unroll 1
    for (int j0 = 0; j0 < N; j0 += THREADS) {
        const int j = j0 + (int)threadIdx.x;
        const bool set = j < N && base + j < limit && to_f32(flags[j < N ? j : 0]) != 0.f;
        const unsigned m = __ballot_sync(0xffffffffu, set);
        if (lane == 0) scratch[warp] = __popc(m);
        __syncthreads();
        int before = total;
#pragma unroll
        for (int w = 0; w < WARPS; ++w) {
            const int c = scratch[w];
            before += w < warp ? c : 0;
            total += c;
        }
        if (set) dst[before + __popc(m & ((1u << lane) - 1u))] = base + j;
        __syncthreads();       // every warp's count is read before the next round writes it
    }
    for (int r = total + (int)threadIdx.x; r < R; r += THREADS) dst[r] = -1;
    return total < 0 ? 0 : (total > hi ? hi : total);
}

// ----------------------------------------------------------------- atomics to gmem
// atomic_add_gmem(dst, v): *dst += v with a hardware atomic, v converted to dst's type.
template <typename V> __device__ __forceinline__ void atomic_add_gmem(float* dst, V v) { atomicAdd(dst, to_f32(v)); }
__device__ __forceinline__ void atomic_add_gmem(int* dst, int v) { atomicAdd(dst, v); }

// ----------------------------------------------------------------- atomics to smem (privatised accumulators)
// atomic_add_smem_batch<G>(dst, at, v): dst[at[g]] += v[g] for every g with at[g] >= 0, with
// shared-memory atomics. An f32 atomicAdd on shared memory is a CAS loop on sm_90 (one compare-and-
// swap per try): written out, the G reads and the G compare-and-swaps are each issued back to back
// (no dependency between them), and only a lost race retries with atomicAdd. i32 adds are native.
template <int G> __device__ __forceinline__ void atomic_add_smem_batch(float* dst, const int (&at)[G],
                                                                      const float (&v)[G]) {
    int seen[G], want[G];
#pragma unroll
    for (int g = 0; g < G; ++g) want[g] = at[g] >= 0 ? __float_as_int(((volatile float*)dst)[at[g]]) : 0;
#pragma unroll
    for (int g = 0; g < G; ++g)
        if (at[g] >= 0) seen[g] = atomicCAS(reinterpret_cast<int*>(dst) + at[g], want[g],
                                            __float_as_int(__int_as_float(want[g]) + v[g]));
#pragma unroll
    for (int g = 0; g < G; ++g)
        if (at[g] >= 0 && seen[g] != want[g]) atomicAdd(dst + at[g], v[g]);
}
template <int G> __device__ __forceinline__ void atomic_add_smem_batch(int* dst, const int (&at)[G], const int (&v)[G]) {
#pragma unroll
    for (int g = 0; g < G; ++g)
        if (at[g] >= 0) atomicAdd(dst + at[g], v[g]);
}

// The element a thread scatters: e of an smem src (a pointer), its own slot s of an rmem src (an array).
template <typename T> struct is_ptr { static constexpr bool value = false; };
template <typename T> struct is_ptr<T*> { static constexpr bool value = true; };
template <typename Src> __device__ __forceinline__ auto scatter_elem(const Src& src, int s, unsigned e) {
    if constexpr (is_ptr<Src>::value) return src[e];
    else return src[s];
}

// scatter_add_smem<R, C, THREADS, GUARD>(dst, rows, idx, src, valid): for each src row r < valid
// (src is R x C, C = 1 for a 1-D scatter), dst[idx[r] * C + c] += src[r * C + c] with shared-memory
// atomics; with GUARD, rows whose index lies outside [0, rows) are skipped. Thread t takes elements
// e = s * THREADS + t (an rmem src's own slots), so with THREADS % C == 0 a thread stays on one column
// and a warp's lanes on consecutive columns of one row: conflict-free for C = 32. Slots go in batches
// of up to 4, their index and value reads issued together, then their atomics.
template <int R, int C, int THREADS, bool GUARD, typename TD, typename TI, typename Src>
__device__ __forceinline__ void scatter_add_smem(TD* dst, int rows, const TI* idx, const Src& src, int valid) {
    static_assert(R > 0 && C > 0, "a scatter has at least one row of one element");
    constexpr int NUMEL = R * C, SLOTS = (NUMEL + THREADS - 1) / THREADS, G = SLOTS < 4 ? SLOTS : 4;
#pragma unroll
    for (int s0 = 0; s0 < SLOTS; s0 += G) {
        int at[G];
        TD v[G];
#pragma unroll
        for (int g = 0; g < G; ++g) {
            const int s = s0 + g;
            const unsigned e = (unsigned)(s * THREADS) + threadIdx.x;
            const int r = (int)(e / C), c = (int)(e % C);
            at[g] = -1;
            v[g] = TD(0);
            if (s < SLOTS && (NUMEL % THREADS == 0 || e < (unsigned)NUMEL) && r < valid) {
                const int i = idx[r];
                if (!GUARD || (unsigned)i < (unsigned)rows) {
                    at[g] = i * C + c;
                    v[g] = convert<TD>(scatter_elem(src, s < SLOTS ? s : 0, e));
                }
            }
        }
        atomic_add_smem_batch(dst, at, v);
    }
}

// scatter_add_smem_owned<R, C, THREADS, GUARD>(dst, rows, idx, src, valid): the same sum as
// scatter_add_smem without atomics. Warp w owns the dst rows k with k % WARPS == w: it ballots the
// source rows r < valid whose index it owns (32 at a time) and adds each of them into its dst row, lane
// l on columns l, l + 32, ...; no other warp writes that row, so a plain load and store suffice (f32
// atomics on shared memory are CAS loops on sm_90). Owned rows go in pairs so that two read-add-write
// chains overlap; a pair with one dst row is summed in registers first. src is a shared-memory tile.
template <int R, int C, int THREADS, bool GUARD, typename TD, typename TI, typename TS>
__device__ __forceinline__ void scatter_add_smem_owned(TD* dst, int rows, const TI* idx, const TS* src, int valid) {
    static_assert(THREADS % 32 == 0, "rows are owned by whole warps");
    static_assert(R > 0 && C > 0, "a scatter has at least one row of one element");
    constexpr int WARPS = THREADS / 32, CS = (C + 31) / 32;
    const int warp = (int)(threadIdx.x / 32), lane = (int)(threadIdx.x % 32);
#pragma unroll 1
    for (int r0 = 0; r0 < R; r0 += 32) {
        const int r = r0 + lane;
        const int i = r < R && r < valid ? (int)idx[r] : -1;
        const bool mine = i >= 0 && i % WARPS == warp && (!GUARD || i < rows);
        unsigned m = __ballot_sync(0xffffffffu, mine);
#pragma unroll 1
        while (m) {
            const int j0 = __ffs(m) - 1;
            m &= m - 1;
            const int j1 = m ? __ffs(m) - 1 : j0;
            m &= m - 1;
            const int k0 = __shfl_sync(0xffffffffu, i, j0), k1 = __shfl_sync(0xffffffffu, i, j1);
            const bool two = j1 != j0;
#pragma unroll
            for (int cs = 0; cs < CS; ++cs) {
                const int c = cs * 32 + lane;
                if (C % 32 != 0 && c >= C) break;
                TD v0 = convert<TD>(src[(r0 + j0) * C + c]);
                const TD v1 = two ? convert<TD>(src[(r0 + j1) * C + c]) : TD(0);
                if (!two || k1 == k0) {
                    dst[k0 * C + c] += v0 + v1;
                } else {
                    const TD d0 = dst[k0 * C + c], d1 = dst[k1 * C + c];
                    dst[k0 * C + c] = d0 + v0;
                    dst[k1 * C + c] = d1 + v1;
                }
            }
        }
    }
}


// gather_vec<C, BYTES>(): elements per lane per load for gather_add rows of C elements of BYTES each: the
// widest of 8, 4, 2 (at most 16 bytes) that tiles C in whole warps, else 1.
template <int C, int BYTES>
__host__ __device__ constexpr int gather_vec() {
    return (C % 256 == 0 && 8 * BYTES <= 16) ? 8 : (C % 128 == 0 && 4 * BYTES <= 16) ? 4
         : (C % 64 == 0 && 2 * BYTES <= 16) ? 2 : 1;
}

template <typename T, int V>
struct alignas(sizeof(T) * V) vec_t {
    T x[V];
};

// A gather_add queue entry: the source row in the high 16 bits, the target row in the low 16.
__device__ __forceinline__ int gather_entry(int r, int k) { return (int)(((unsigned)r << 16) | (unsigned)k); }
__device__ __forceinline__ int gather_entry_row(int e) { return (int)((unsigned)e >> 16); }
__device__ __forceinline__ int gather_entry_target(int e) { return e & 0xffff; }

// gather_add_run<C>(dst, cnt, src, ld_row, ld_col, cols_in, run, rows, lane): adds the warp's `rows` queue
// entries at `run` (gather_entry) in queue order, so each target row's f32 sum is that of a
// sequential loop. Any row layout: lane l holds columns l, l + 32, ... (NW of them), zero past cols_in; P
// rows' loads go out together, then the P rows are added.
template <int C, typename TS>
__device__ __forceinline__ void gather_add_run(float* dst, int* cnt, const TS* src, index_t ld_row, index_t ld_col,
                                               int cols_in, const int* run, int rows, int lane) {
    constexpr int NW = (C + 31) / 32, P = 8 / NW >= 2 ? 8 / NW : 2;
#pragma unroll 1
    for (int b = 0; b < rows; b += P) {
        TS w[P][NW];
#pragma unroll
        for (int j = 0; j < P; ++j) {
            const TS* row = src + (index_t)gather_entry_row(run[min(b + j, rows - 1)]) * ld_row;
#pragma unroll
            for (int cs = 0; cs < NW; ++cs) {
                const int c = cs * 32 + lane;
                w[j][cs] = c < C && c < cols_in ? row[(index_t)c * ld_col] : convert<TS>(0.f);
            }
        }
#pragma unroll
        for (int j = 0; j < P; ++j)
            if (b + j < rows) {
                const int k = gather_entry_target(run[b + j]);
#pragma unroll
                for (int cs = 0; cs < NW; ++cs) {
                    const int c = cs * 32 + lane;
                    if (c < C && c < cols_in) dst[k * C + c] += to_f32(w[j][cs]);
                }
                if (lane == 0) cnt[k] += 1;
            }
    }
}

template <int N>
struct alignas(4 * N) words_t {
    unsigned w[N];
};

// word_elem<TS>(w, h): element h of a 32-bit word that holds 4 / sizeof(TS) elements of TS, as f32.
template <typename TS> __device__ __forceinline__ float word_elem(unsigned w, int h);
template <> __device__ __forceinline__ float word_elem<float>(unsigned w, int) { return __uint_as_float(w); }
template <> __device__ __forceinline__ float word_elem<__nv_bfloat16>(unsigned w, int h) {
    return __uint_as_float(h ? (w & 0xffff0000u) : (w << 16));
}
template <> __device__ __forceinline__ float word_elem<__half>(unsigned w, int h) {
    return __half2float(__ushort_as_half((unsigned short)(h ? w >> 16 : w & 0xffffu)));
}

// gather_add_run_rows<C, V>(dst, cnt, src, ld_row, run, rows, lane): gather_add_run for whole rows that are
// contiguous and aligned to V elements. Each lane loads its V columns of a row as raw words, P rows at a
// time (16 registers of them per lane: 8 rows of 128 bf16 columns), with no branch between the loads (past
// the run's end a lane reloads its last row, unused), and the next P rows' loads go out before the current
// P are added: two batches in flight. On the H200 (a gathering segmented sum, B=32 N=65536 K=1024 D=128) raw
// words with no branch between the loads took the kernel from 0.78 to 0.38 ms, and 2 x 8 rows in flight
// instead of 2 x 4 to 0.33 ms.
template <int C, int V, typename TS>
__device__ __forceinline__ void gather_add_run_rows(float* dst, int* cnt, const TS* src, index_t ld_row,
                                                    const int* run, int rows, int lane) {
    static_assert(V * sizeof(TS) % 4 == 0 && C % (32 * V) == 0, "whole words, whole warps of columns");
    constexpr int WORDS = V * (int)sizeof(TS) / 4, EPW = 4 / (int)sizeof(TS), NW = C / (32 * V);
    constexpr int P = 16 / (NW * WORDS) >= 2 ? 16 / (NW * WORDS) : 2;
    using W = words_t<WORDS>;
    W wa[P][NW], wb[P][NW];
    const auto fetch = [&](W (&w)[P][NW], int b) {
#pragma unroll
        for (int j = 0; j < P; ++j) {
            const TS* row = src + (index_t)gather_entry_row(run[min(b + j, rows - 1)]) * ld_row;
#pragma unroll
            for (int cs = 0; cs < NW; ++cs) w[j][cs] = *reinterpret_cast<const W*>(row + (cs * 32 + lane) * V);
        }
    };
    const auto add = [&](const W (&w)[P][NW], int b) {
#pragma unroll
        for (int j = 0; j < P; ++j)
            if (b + j < rows) {
                const int k = gather_entry_target(run[b + j]);
#pragma unroll
                for (int cs = 0; cs < NW; ++cs) {
                    vec_t<float, V>* p = reinterpret_cast<vec_t<float, V>*>(dst + k * C + (cs * 32 + lane) * V);
                    vec_t<float, V> d = *p;
#pragma unroll
                    for (int e = 0; e < V; ++e) d.x[e] += word_elem<TS>(w[j][cs].w[e / EPW], e % EPW);
                    *p = d;
                }
                if (lane == 0) cnt[k] += 1;
            }
    };
    if (rows > 0) fetch(wa, 0);
#pragma unroll 1
    for (int b = 0; b < rows; b += 2 * P) {
        if (b + P < rows) fetch(wb, b + P);
        add(wa, b);
        if (b + 2 * P < rows) fetch(wa, b + 2 * P);
        if (b + P < rows) add(wb, b + P);
    }
}

// gather_add_bucketed<R, C, E, THREADS>(dst, cnt, idx, queue, first, src, ld_row, ld_col, rows_in, cols_in,
// valid): for each source row r < min(R, valid, rows_in) with k = idx[r] - first in [0, E), dst[k * C + c] +=
// src[r * ld_row + c * ld_col] for c < min(C, cols_in), and cnt[k] += 1. Warp w owns the target rows with
// k % WARPS == w and adds its rows in row order (no atomics; the same f32 sums on every run). The rows reach
// their owners through a stable counting sort in `queue` (R + 2 * WARPS * WARPS ints): each warp scans one
// contiguous segment of the indices and counts its rows per owner (counts[w][o]); the counts become start
// positions (pos[w][o], owner by owner, segment by segment); each warp writes its rows (gather_entry) at
// them; each owner adds its run of the queue: gather_add_run_rows (V columns per load) where the rows are
// whole, contiguous and aligned (a run-time test, uniform over the CTA), else gather_add_run. Every index is
// read twice, by one warp, and every row once, by its owner. Three __syncthreads(): every thread of the CTA
// calls it, none inside a role.
template <int R, int C, int E, int THREADS, typename TI, typename TS>
__device__ __forceinline__ void gather_add_bucketed(float* dst, int* cnt, const TI* idx, int* queue, int first,
                                                    const TS* src, index_t ld_row, index_t ld_col, int rows_in,
                                                    int cols_in, int valid) {
    static_assert(THREADS % 32 == 0 && THREADS <= 1024, "rows are owned by whole warps");
    static_assert(R <= 65536 && E <= 65536, "a queue entry packs the row and the target row in 16 bits each");
    constexpr int WARPS = THREADS / 32, SEG = (R + WARPS - 1) / WARPS, V = gather_vec<C, (int)sizeof(TS)>();
    int* counts = queue + R;            // counts[w * WARPS + o]: rows of segment w owned by warp o
    int* pos = counts + WARPS * WARPS;  // pos[w * WARPS + o]: where segment w's next row for owner o goes
    const int warp = (int)(threadIdx.x / 32), lane = (int)(threadIdx.x % 32);
    const int n = min(min(R, valid), rows_in), lo = warp * SEG, hi = min(lo + SEG, n);
    const bool vec = V > 1 && ld_col == 1 && ld_row % V == 0 && reinterpret_cast<unsigned long long>(src) % (V * sizeof(TS)) == 0;
    // the owner of index r of this warp's segment (-1: not this CTA's), the lanes of the same owner
    const auto owner = [&](int r, int& k, unsigned& peers) {
        k = r < hi ? (int)idx[r] - first : -1;
        const int o = (unsigned)k < (unsigned)E ? k % WARPS : -1;
        peers = __match_any_sync(0xffffffffu, o);
        return o;
    };
    if (lane < WARPS) counts[warp * WARPS + lane] = 0;
    __syncwarp();
#pragma unroll 1
    for (int r0 = lo; r0 < hi; r0 += 32) {
        int k;
        unsigned peers;
        const int o = owner(r0 + lane, k, peers);
        if (o >= 0 && __ffs(peers) - 1 == lane) counts[warp * WARPS + o] += __popc(peers);
        __syncwarp();
    }
    __syncthreads();
    // lane l: the rows owner l gets from all segments; their exclusive scan over owners is each run's start
    int total = 0;
    if (lane < WARPS)
        for (int w = 0; w < WARPS; ++w) total += counts[w * WARPS + lane];
    int start = total;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
        const int t = __shfl_up_sync(0xffffffffu, start, d);
        if (lane >= d) start += t;
    }
    const int run0 = __shfl_sync(0xffffffffu, start - total, warp), rows = __shfl_sync(0xffffffffu, total, warp);
    // this owner's column, segment by segment (lane w: segment w)
    const int c = lane < WARPS ? counts[lane * WARPS + warp] : 0;
    int before = c;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
        const int t = __shfl_up_sync(0xffffffffu, before, d);
        if (lane >= d) before += t;
    }
    if (lane < WARPS) pos[lane * WARPS + warp] = run0 + before - c;
    __syncthreads();
#pragma unroll 1
    for (int r0 = lo; r0 < hi; r0 += 32) {
        const int r = r0 + lane;
        int k;
        unsigned peers;
        const int o = owner(r, k, peers);
        const int leader = __ffs(peers) - 1;
        int at = o >= 0 && leader == lane ? pos[warp * WARPS + o] : 0;
        at = __shfl_sync(0xffffffffu, at, leader);
        if (o >= 0) queue[at + __popc(peers & ((1u << lane) - 1u))] = gather_entry(r, k);
        if (o >= 0 && leader == lane) pos[warp * WARPS + o] = at + __popc(peers);
        __syncwarp();
    }
    __syncthreads();
    if constexpr (V > 1 && (V * sizeof(TS)) % 4 == 0) {
        if (vec && cols_in >= C) {
            gather_add_run_rows<C, V>(dst, cnt, src, ld_row, queue + run0, rows, lane);
            return;
        }
    }
    gather_add_run<C>(dst, cnt, src, ld_row, ld_col, cols_in, queue + run0, rows, lane);
}

}  // namespace cake
