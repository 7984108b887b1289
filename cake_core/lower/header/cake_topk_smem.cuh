// cake_topk_smem.cuh: topk_bias with its lists in shared memory (KMAX up to 128), after the register lists of
// cake_async.cuh (fragment_row0 and the bias reads are theirs). Included from cake.cuh.
#pragma once

namespace cake {

// ----------------------------------------------------------------- topk_bias over smem lists (KMAX up to 128)
// One sorted list of KMAX (value, index) pairs per fragment row, a row of a (rows, KMAX) smem tile (its pairs
// placed by list_slot, below), instead of 4 per-thread register lists a row (which cannot hold more than 32
// without spilling). A row belongs to one 4-lane quad, and its 4 lanes insert together: each lane holds its own
// smallest candidate not yet taken, the quad takes the smallest of the 4 (2 shuffles) while it beats the list's
// last pair, counts the pairs before it (a quarter of the list a lane, 2 shuffles) and shifts the larger ones up
// one, top down, 16 pairs a step (4 a lane: all read, then all written, between __syncwarp's of the quad's
// lanes). A warp whose 16 rows have no candidate (the common case once the lists have filled) skips all of it
// after one vote.
//
// list_slot<KMAX>(row, p): where pair p of a row's list lives in the row. The 8 quads of a warp own 8 consecutive
// rows and a quad's 4 lanes read 4 consecutive pairs, so with rows KMAX floats apart (KMAX a multiple of 32) all
// 8 quads would read the same 4 banks: an 8-way conflict on every read of the threshold, the rank count and the
// shift. Bits 2-4 of p XORed with the row's low 3 bits put each row's 4 pairs on 4 banks of its own (a bijection
// of each 32-pair block). Only this header reads the lists by position (topk_bias.smem_private: fill and
// topk_shift treat every pair alike; copy_smem_topk publishes them in order).
template <int KMAX>
__host__ __device__ __forceinline__ int list_slot(int row, int p) {
    return KMAX % 32 == 0 ? p ^ ((row & 7) << 2) : p;
}

// topk_next<N, GUARD>(acc, w, h, q, beta, base, limit, lo_v, lo_j, bv, bj): this lane's smallest (score, index) of
// row h after (lo_v, lo_j), columns base + b * 8 + q + e; (inf, INT_MAX) when none is left.
template <int N, bool GUARD, int SLOTS>
__device__ __forceinline__ void topk_next(const float (&acc)[SLOTS], const float2 (&w)[N / 8], int h, int q, float beta,
                                          int base, int limit, float lo_v, int lo_j, float& bv, int& bj) {
    bv = __int_as_float(0x7f800000);
    bj = 0x7fffffff;
#pragma unroll
    for (int b = 0; b < N / 8; ++b) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const int j = base + b * 8 + q + e;
            const float x = fmaf(-beta, acc[b * 4 + h * 2 + e], e ? w[b].y : w[b].x);
            const bool after = x > lo_v || (x == lo_v && j > lo_j);
            if (after && (x < bv || (x == bv && j < bj)) && (!GUARD || j < limit)) { bv = x; bj = j; }
        }
    }
}

template <int N, int KMAX, bool GUARD, int SLOTS>
__device__ __forceinline__ void topk_bias_smem_tile(float* lv, int* li, const float (&acc)[SLOTS], const float* bias,
                                                    float beta, int base, int limit, int tid) {
    const int lane = tid % 32, l4 = lane % 4, q = l4 * 2, row0 = fragment_row0(tid);
    const unsigned quad = 0xfu << (lane & ~3);
    const float inf = __int_as_float(0x7f800000);
    float2 w[N / 8];
#pragma unroll
    for (int b = 0; b < N / 8; ++b) w[b] = *reinterpret_cast<const float2*>(bias + b * 8 + q);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float* v = lv + (row0 + 8 * h) * KMAX;
        int* ix = li + (row0 + 8 * h) * KMAX;
        const int last = list_slot<KMAX>(row0, KMAX - 1);                 // rows row0 and row0 + 8: one swizzle
        const float m = topk_row_min<N, GUARD>(acc, w, h, q, beta, base, limit);
        if (!__any_sync(0xffffffffu, m <= v[last])) continue;
        float bv;
        int bj;
        topk_next<N, GUARD>(acc, w, h, q, beta, base, limit, -inf, -1, bv, bj);
#pragma unroll 1
        for (;;) {                                                      // the same trips on the quad's 4 lanes
            float cv = bv;
            int cj = bj;
#pragma unroll
            for (int s = 1; s <= 2; s *= 2) {
                const float ov = __shfl_xor_sync(quad, cv, s);
                const int oj = __shfl_xor_sync(quad, cj, s);
                if (ov < cv || (ov == cv && oj < cj)) { cv = ov; cj = oj; }
            }
            const float wv = v[last];
            const int wi = ix[last];
            if (!(cv < wv || (cv == wv && cj < wi))) break;
            int pos = 0;                                                // the pairs before (cv, cj)
#pragma unroll
            for (int p = l4; p < KMAX; p += 4) {
                const int s = list_slot<KMAX>(row0, p);
                pos += (v[s] < cv || (v[s] == cv && ix[s] < cj)) ? 1 : 0;
            }
            pos += __shfl_xor_sync(quad, pos, 1);
            pos += __shfl_xor_sync(quad, pos, 2);
#pragma unroll 1
            for (int top = KMAX - 1; top > pos; top -= 16) {            // [pos, KMAX - 1) up one, top down
                float tv[4];
                int ti[4];
#pragma unroll
                for (int u = 0; u < 4; ++u) {
                    const int p = top - (u * 4 + l4);
                    if (p > pos) {
                        const int s = list_slot<KMAX>(row0, p - 1);
                        tv[u] = v[s];
                        ti[u] = ix[s];
                    }
                }
                __syncwarp(quad);
#pragma unroll
                for (int u = 0; u < 4; ++u) {
                    const int p = top - (u * 4 + l4);
                    if (p > pos) {
                        const int s = list_slot<KMAX>(row0, p);
                        v[s] = tv[u];
                        ix[s] = ti[u];
                    }
                }
                __syncwarp(quad);
            }
            if (l4 == 0) {
                const int s = list_slot<KMAX>(row0, pos);
                v[s] = cv;
                ix[s] = cj;
            }
            __syncwarp(quad);
            if (bv == cv && bj == cj) topk_next<N, GUARD>(acc, w, h, q, beta, base, limit, cv, cj, bv, bj);
        }
    }
}

// topk_bias_smem_wgmma_acc<N, KMAX>(lv, li, acc, bias, beta, base, limit, tid): merge the scores
// bias[c] - beta * acc[c] (columns base + c < limit) into the rows' smem lists; ends at the warpgroup barrier
// (as the register lists' op), so the arrive that releases the bias slot follows every thread's reads.
template <int N, int KMAX, int SLOTS>
__device__ __forceinline__ void topk_bias_smem_wgmma_acc(float* lv, int* li, const float (&acc)[SLOTS],
                                                         const float* bias, float beta, int base, int limit, int tid) {
    static_assert(SLOTS * 2 == N && N % 8 == 0, "a wgmma accumulator holds N / 2 floats per thread, N % 8 == 0");
    if (base + N <= limit) topk_bias_smem_tile<N, KMAX, false>(lv, li, acc, bias, beta, base, limit, tid);
    else topk_bias_smem_tile<N, KMAX, true>(lv, li, acc, bias, beta, base, limit, tid);
    asm volatile("bar.sync %0, 128;" :: "r"(1 + (int)(threadIdx.x / 128)) : "memory");
}

// topk_shift_smem<KMAX>(lv, rows, tid): add rows[r] to every value of the smem lists of the thread's 2 fragment
// rows, the quad's lanes a quarter each (the order is unchanged; inf stays inf).
template <int KMAX>
__device__ __forceinline__ void topk_shift_smem(float* lv, const float* rows, int tid) {
    const int row0 = fragment_row0(tid), lane = tid % 32;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int r = row0 + 8 * h;
        const float s = rows[r];
        for (int p = lane % 4; p < KMAX; p += 4) lv[r * KMAX + p] += s;
    }
    __syncwarp();
}

// copy_smem_topk<KMAX>(pv, pi, lv, li, tid): the smem lists of the thread's 2 fragment rows into the published
// (rows, KMAX) tiles, the quad's lanes a quarter each (topk_publish); a cluster barrier orders them before the
// peers' reads.
template <int KMAX>
__device__ __forceinline__ void copy_smem_topk(float* pv, int* pi, const float* lv, const int* li, int tid) {
    const int row0 = fragment_row0(tid), lane = tid % 32;
    __syncwarp();
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int r = row0 + 8 * h;
        for (int p = lane % 4; p < KMAX; p += 4) {
            const int s = r * KMAX + list_slot<KMAX>(r, p);
            pv[r * KMAX + p] = lv[s];
            pi[r * KMAX + p] = li[s];
        }
    }
}

}  // namespace cake
