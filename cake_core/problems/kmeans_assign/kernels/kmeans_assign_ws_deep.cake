@kernel(target="sm_90a", grid=(cdiv(N, BM), B), threads=384, consts={"BK": 64, "BM": 128, "BN": 128, "S": 4})
def kmeans_assign_ws_deep(x: gmem[bf16, (B, N, D)], c: gmem[bf16, (B, K, D)], c_sq: gmem[f32, (B, K)], out: gmem[i32, (B, N)]):
    x_s = smem(bf16, (BM, BK), stages=8, swizzle=128)
    c_s = smem(bf16, (BN, BK), stages=4, swizzle=128)
    csq_s = smem(f32, (BN,), stages=2)
    x_full = mbarrier(1)
    full = mbarrier(S)
    empty = mbarrier(S, arrivals=2)
    csq_full = mbarrier(2)
    csq_empty = mbarrier(2, arrivals=2)
    with role("producer", warps=(0, 4), regs=40):
        expect_tx(x_full[0], BM * BK * 2 * min(cdiv(D, BK), 8))
        for dk in range(min(cdiv(D, BK), 8)):
            tma_load(x_s[dk], x[bid.y, tile(bid.x, BM), tile(dk, BK)], bar=x_full[0])
        for kt in range(cdiv(K, BN)):
            wait(csq_empty[kt % 2], phase=(kt // 2 + 1) % 2)
            expect_tx(csq_full[kt % 2], BN * 4)
            tma_load(csq_s[kt % 2], c_sq[bid.y, tile(kt, BN)], bar=csq_full[kt % 2])
            for dk in range(min(cdiv(D, BK), 8)):
                i = kt * min(cdiv(D, BK), 8) + dk
                wait(empty[i % S], phase=(i // S + 1) % 2)
                expect_tx(full[i % S], BN * BK * 2)
                tma_load(c_s[i % S], c[bid.y, tile(kt, BN), tile(dk, BK)], bar=full[i % S])
    with role("consumer", warps=(4, 12), regs=232):
        acc = rmem(f32, (BM, BN))
        best = rmem(f32, (BM,), fill=inf)
        arg = rmem(i32, (BM,))
        wait(x_full[0], phase=0)
        for kt in range(cdiv(K, BN)):
            i0 = kt * min(cdiv(D, BK), 8)
            wait(full[i0 % S], phase=i0 // S % 2)
            wgmma(acc, x_s[0], c_s[i0 % S], b_major="k", accumulate=False)
            for dk in range(1, min(cdiv(D, BK), 8), 1):
                i = i0 + dk
                wait(full[i % S], phase=i // S % 2)
                wgmma(acc, x_s[dk], c_s[i % S], b_major="k")
                wgmma_wait(1)
                arrive(empty[(i - 1) % S])
            wgmma_wait(0)
            arrive(empty[(i0 + min(cdiv(D, BK), 8) - 1) % S])
            wait(csq_full[kt % 2], phase=kt // 2 % 2)
            argmin_bias(best, arg, acc, csq_s[kt % 2], base=kt * BN, limit=K)
            arrive(csq_empty[kt % 2])
        store(out[bid.y, tile(bid.x, BM)], arg)
