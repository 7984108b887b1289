@kernel(target="sm_90a", grid=(cdiv(M, BM) * cdiv(N, BN),), threads=384, consts={"BK": 64, "BM": 128, "BN": 256, "G": 16, "S": 4})
def gemm_bf16_ws_n256(a: gmem[bf16, (M, K)], b: gmem[bf16, (K, N)], c: gmem[f32, (M, N)]):
    a_s = smem(bf16, (BM, BK), stages=4, swizzle=128)
    b_s = smem(bf16, (BK, BN), stages=4, swizzle=128)
    full = mbarrier(S)
    empty = mbarrier(S, arrivals=2)
    with role("producer", warps=(0, 4), regs=40):
        for kt in range(cdiv(K, BK)):
            wait(empty[kt % S], phase=(kt // S + 1) % 2)
            expect_tx(full[kt % S], (BM * BK + BK * BN) * 2)
            tma_load(a_s[kt % S], a[tile(bid.x // (G * cdiv(N, BN)) * G + bid.x % (G * cdiv(N, BN)) % min(cdiv(M, BM) - bid.x // (G * cdiv(N, BN)) * G, G), BM), tile(kt, BK)], bar=full[kt % S])
            tma_load(b_s[kt % S], b[tile(kt, BK), tile(bid.x % (G * cdiv(N, BN)) // min(cdiv(M, BM) - bid.x // (G * cdiv(N, BN)) * G, G), BN)], bar=full[kt % S])
    with role("consumer", warps=(4, 12), regs=232):
        acc = rmem(f32, (BM, BN))
        for kt in range(cdiv(K, BK)):
            wait(full[kt % S], phase=kt // S % 2)
            wgmma(acc, a_s[kt % S], b_s[kt % S])
            wgmma_wait(1)
            if kt > 0:
                arrive(empty[(kt + S - 1) % S])
        wgmma_wait(0)
        store(c[tile(bid.x // (G * cdiv(N, BN)) * G + bid.x % (G * cdiv(N, BN)) % min(cdiv(M, BM) - bid.x // (G * cdiv(N, BN)) * G, G), BM), tile(bid.x % (G * cdiv(N, BN)) // min(cdiv(M, BM) - bid.x // (G * cdiv(N, BN)) * G, G), BN)], acc)
