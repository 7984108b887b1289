@kernel(target="sm_90a", grid=(cdiv(N, BN), SPLIT, cdiv(M, BM)), threads=160, consts={"BK": 64, "BM": 64, "BN": 64, "S": 8, "SPLIT": 2})
def tinygemm_cluster2_rows(a: gmem[bf16, (M, K)], b: gmem[bf16, (K, N)], c: gmem[f32, (M, N)]):
    cluster((1, SPLIT, 1))
    a_s = smem(bf16, (BM, BK), stages=8, swizzle=128)
    b_s = smem(bf16, (BK, BN), stages=8, swizzle=128)
    part_s = smem(f32, (BM, BN))
    full = mbarrier(S)
    empty = mbarrier(S)
    with role("consumer", warps=(0, 4)):
        acc = rmem(f32, (BM, BN))
        for i in range(max(min(cdiv(cdiv(K, BK), SPLIT), cdiv(K, BK) - bid.y * cdiv(cdiv(K, BK), SPLIT)), 0)):
            wait(full[i % S], phase=i // S % 2)
            wgmma(acc, a_s[i % S], b_s[i % S])
            wgmma_wait(1)
            if i > 0:
                arrive(empty[(i + S - 1) % S])
        wgmma_wait(0)
        acc_publish(part_s, acc)
    with role("producer", warps=(4, 5)):
        for i in range(max(min(cdiv(cdiv(K, BK), SPLIT), cdiv(K, BK) - bid.y * cdiv(cdiv(K, BK), SPLIT)), 0)):
            wait(empty[i % S], phase=(i // S + 1) % 2)
            if M <= 8:
                expect_tx(full[i % S], (8 * BK + BK * BN) * 2)
                tma_load(a_s[i % S], a[tile(bid.z, BM), tile(bid.y * cdiv(cdiv(K, BK), SPLIT) + i, BK)], bar=full[i % S], rows=8)
                tma_load(b_s[i % S], b[tile(bid.y * cdiv(cdiv(K, BK), SPLIT) + i, BK), tile(bid.x, BN)], bar=full[i % S])
            if 8 < M:
                if M <= 16:
                    expect_tx(full[i % S], (16 * BK + BK * BN) * 2)
                    tma_load(a_s[i % S], a[tile(bid.z, BM), tile(bid.y * cdiv(cdiv(K, BK), SPLIT) + i, BK)], bar=full[i % S], rows=16)
                    tma_load(b_s[i % S], b[tile(bid.y * cdiv(cdiv(K, BK), SPLIT) + i, BK), tile(bid.x, BN)], bar=full[i % S])
            if 16 < M:
                expect_tx(full[i % S], (BM * BK + BK * BN) * 2)
                tma_load(a_s[i % S], a[tile(bid.z, BM), tile(bid.y * cdiv(cdiv(K, BK), SPLIT) + i, BK)], bar=full[i % S])
                tma_load(b_s[i % S], b[tile(bid.y * cdiv(cdiv(K, BK), SPLIT) + i, BK), tile(bid.x, BN)], bar=full[i % S])
    cluster_sync()
    acc_cluster_reduce(c[tile(bid.z, BM), tile(bid.x, BN)], part_s)
    cluster_sync()
