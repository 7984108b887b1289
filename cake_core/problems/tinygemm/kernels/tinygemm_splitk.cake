@kernel(target="sm_90a", grid=(cdiv(N, BN), cdiv(cdiv(K, BK), cdiv(cdiv(K, BK), max(1, min(cdiv(K, BK), CTAS // (cdiv(N, BN) * cdiv(M, BM)))))), cdiv(M, BM)), threads=160, consts={"BK": 64, "BM": 64, "BN": 128, "CTAS": 132, "S": 8})
def tinygemm_splitk(a: gmem[bf16, (M, K)], b: gmem[bf16, (K, N)], c: gmem[f32, (M, N)]):
    a_s = smem(bf16, (BM, BK), stages=8, swizzle=128)
    b_s = smem(bf16, (BK, BN), stages=8, swizzle=128)
    full = mbarrier(S)
    empty = mbarrier(S)
    with role("consumer", warps=(0, 4)):
        acc = rmem(f32, (BM, BN))
        for i in range(min(cdiv(cdiv(K, BK), max(1, min(cdiv(K, BK), CTAS // (cdiv(N, BN) * cdiv(M, BM))))), cdiv(K, BK) - bid.y * cdiv(cdiv(K, BK), max(1, min(cdiv(K, BK), CTAS // (cdiv(N, BN) * cdiv(M, BM))))))):
            wait(full[i % S], phase=i // S % 2)
            wgmma(acc, a_s[i % S], b_s[i % S])
            wgmma_wait(1)
            if i > 0:
                arrive(empty[(i + S - 1) % S])
        wgmma_wait(0)
        atomic_add(c[tile(bid.z, BM), tile(bid.x, BN)], acc)
    with role("producer", warps=(4, 5)):
        for i in range(min(cdiv(cdiv(K, BK), max(1, min(cdiv(K, BK), CTAS // (cdiv(N, BN) * cdiv(M, BM))))), cdiv(K, BK) - bid.y * cdiv(cdiv(K, BK), max(1, min(cdiv(K, BK), CTAS // (cdiv(N, BN) * cdiv(M, BM))))))):
            wait(empty[i % S], phase=(i // S + 1) % 2)
            expect_tx(full[i % S], (BM * BK + BK * BN) * 2)
            tma_load(a_s[i % S], a[tile(bid.z, BM), tile(bid.y * cdiv(cdiv(K, BK), max(1, min(cdiv(K, BK), CTAS // (cdiv(N, BN) * cdiv(M, BM))))) + i, BK)], bar=full[i % S])
            tma_load(b_s[i % S], b[tile(bid.y * cdiv(cdiv(K, BK), max(1, min(cdiv(K, BK), CTAS // (cdiv(N, BN) * cdiv(M, BM))))) + i, BK), tile(bid.x, BN)], bar=full[i % S])
