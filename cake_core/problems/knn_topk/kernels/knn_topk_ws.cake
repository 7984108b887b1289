@kernel(target="sm_90a", grid=(cdiv(Q, BM),), threads=384, consts={"BK": 64, "BM": 128, "BN": 128, "KMAX": 16, "L": 3, "S": 5})
def knn_topk_ws(q: gmem[bf16, (Q, D)], db: gmem[bf16, (N, D)], idx: gmem[i32, (Q, k)]):
    q_s = smem(bf16, (BM, BK), stages=2, swizzle=128)
    db_s = smem(bf16, (BN, BK), stages=10, swizzle=128)
    nrm_s = smem(f32, (BN,), stages=5)
    q_full = mbarrier(1)
    full = mbarrier(S)
    ready = mbarrier(S)
    empty = mbarrier(S, arrivals=2)
    with role("producer", warps=(0, 4), regs=40):
        expect_tx(q_full[0], BM * BK * 2 * 2)
        tma_load(q_s[0], q[tile(bid.x, BM), tile(0, BK)], bar=q_full[0])
        tma_load(q_s[1], q[tile(bid.x, BM), tile(1, BK)], bar=q_full[0])
        for t in range(cdiv(N, BN) + L):
            if t >= L:
                wait(full[(t - L) % S], phase=(t - L) // S % 2)
                sqnorm_rows(nrm_s[(t - L) % S], db_s[(t - L) % S * 2])
                sqnorm_rows(nrm_s[(t - L) % S], db_s[(t - L) % S * 2 + 1], accumulate=True)
                arrive(ready[(t - L) % S])
            if t < cdiv(N, BN):
                wait(empty[t % S], phase=(t // S + 1) % 2)
                expect_tx(full[t % S], BN * BK * 2 * 2)
                tma_load(db_s[t % S * 2], db[tile(t, BN), tile(0, BK)], bar=full[t % S])
                tma_load(db_s[t % S * 2 + 1], db[tile(t, BN), tile(1, BK)], bar=full[t % S])
    with role("consumer", warps=(4, 12), regs=232):
        acc = rmem(f32, (BM, BN))
        top_v = rmem(f32, (BM, KMAX), fill=inf)
        top_i = rmem(i32, (BM, KMAX), fill=-1.0)
        wait(q_full[0], phase=0)
        for t in range(cdiv(N, BN)):
            wait(full[t % S], phase=t // S % 2)
            wait(ready[t % S], phase=t // S % 2)
            wgmma(acc, q_s[0], db_s[t % S * 2], b_major="k", accumulate=False)
            wgmma(acc, q_s[1], db_s[t % S * 2 + 1], b_major="k")
            wgmma_wait(0)
            topk_bias(top_v, top_i, acc, nrm_s[t % S], base=t * BN, limit=N)
            arrive(empty[t % S])
        store(idx[tile(bid.x, BM), tile(0, KMAX)], top_i)
