@kernel(target="sm_90a", grid=(cdiv(T, BM), E, cdiv(N, BN)), threads=128, consts={"BK": 32, "BM": 16, "BN": 64})
def grouped_gemm(x: gmem[bf16, (T, K)], w: gmem[bf16, (E, K, N)], perm: gmem[i32, (T * topk,)], offsets: gmem[i32, (E + 1,)], y: gmem[f32, (T * topk, N)]):
    a_s = smem(bf16, (BM, BK))
    b_s = smem(bf16, (BK, BN))
    rows = smem(i32, (BM,))
    acc = rmem(f32, (BM, BN))
    scalar(start, offsets[bid.y], max=T * topk)
    scalar(end, offsets[bid.y + 1], max=T * topk)
    if bid.x * BM < end - start:
        fill(acc)
        for kt in range(cdiv(K, BK)):
            gather(a_s, x[:, tile(kt, BK)], perm, base=start + bid.x * BM, limit=end)
            load(b_s, w[bid.y, tile(kt, BK), tile(bid.z, BN)])
            sync()
            mma(acc, a_s, b_s)
            sync()
        iota(rows, base=start + bid.x * BM)
        sync()
        scatter_add(y[:, tile(bid.z, BN)], rows, acc, base=start + bid.x * BM, limit=end)
