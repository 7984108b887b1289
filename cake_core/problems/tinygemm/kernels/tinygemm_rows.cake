@kernel(target="sm_90a", grid=(cdiv(N, BN), cdiv(M, BM)), threads=160, consts={"BK": 64, "BM": 64, "BN": 64, "S": 8})
def tinygemm_rows(a: gmem[bf16, (M, K)], b: gmem[bf16, (K, N)], c: gmem[f32, (M, N)]):
    a_s = smem(bf16, (BM, BK), stages=8, swizzle=128)
    b_s = smem(bf16, (BK, BN), stages=8, swizzle=128)
    full = mbarrier(S)
    empty = mbarrier(S)
    with role("consumer", warps=(0, 4)):
        acc = rmem(f32, (BM, BN))
        for i in range(cdiv(K, BK)):
            wait(full[i % S], phase=i // S % 2)
            wgmma(acc, a_s[i % S], b_s[i % S])
            wgmma_wait(1)
            if i > 0:
                arrive(empty[(i + S - 1) % S])
        wgmma_wait(0)
        store(c[tile(bid.y, BM), tile(bid.x, BN)], acc)
    with role("producer", warps=(4, 5)):
        for i in range(cdiv(K, BK)):
            wait(empty[i % S], phase=(i // S + 1) % 2)
            if M <= 8:
                expect_tx(full[i % S], (8 * BK + BK * BN) * 2)
                tma_load(a_s[i % S], a[tile(bid.y, BM), tile(i, BK)], bar=full[i % S], rows=8)
                tma_load(b_s[i % S], b[tile(i, BK), tile(bid.x, BN)], bar=full[i % S])
            if 8 < M:
                if M <= 16:
                    expect_tx(full[i % S], (16 * BK + BK * BN) * 2)
                    tma_load(a_s[i % S], a[tile(bid.y, BM), tile(i, BK)], bar=full[i % S], rows=16)
                    tma_load(b_s[i % S], b[tile(i, BK), tile(bid.x, BN)], bar=full[i % S])
            if 16 < M:
                expect_tx(full[i % S], (BM * BK + BK * BN) * 2)
                tma_load(a_s[i % S], a[tile(bid.y, BM), tile(i, BK)], bar=full[i % S])
                tma_load(b_s[i % S], b[tile(i, BK), tile(bid.x, BN)], bar=full[i % S])
