@kernel(target="sm_90a", grid=(cdiv(Q, BM), SPLIT, B), threads=256, consts={"BK": 64, "BM": 64, "BN": 128, "KMAX": 16, "L": 6, "S": 8, "SPLIT": 8})
def knn_split_m64_ring8(q: gmem[bf16, (B, Q, D)], db: gmem[bf16, (B, M, D)], dists: gmem[f32, (B, Q, k)], idx: gmem[i32, (B, Q, k)]):
    cluster((1, SPLIT, 1))
    q_s = smem(bf16, (BM, BK), stages=8, swizzle=128)
    db_s = smem(bf16, (BN, BK), stages=8, swizzle=128)
    nrm_s = smem(f32, (BN,), stages=2)
    qn_s = smem(f32, (BM,))
    pub_v = smem(f32, (BM, KMAX))
    pub_i = smem(i32, (BM, KMAX))
    q_full = mbarrier(1)
    q_ready = mbarrier(1)
    full = mbarrier(S)
    empty = mbarrier(S, arrivals=2)
    ready = mbarrier(2)
    nrm_empty = mbarrier(2, arrivals=1)
    with role("producer", warps=(0, 4), regs=40):
        expect_tx(q_full[0], BM * BK * 2 * min(cdiv(D, BK), 8))
        for dk in range(min(cdiv(D, BK), 8)):
            tma_load(q_s[dk], q[bid.z, tile(bid.x, BM), tile(dk, BK)], bar=q_full[0])
        wait(q_full[0], phase=0)
        sqnorm_rows(qn_s, q_s[0])
        for dk in range(1, min(cdiv(D, BK), 8), 1):
            sqnorm_rows(qn_s, q_s[dk], accumulate=True)
        arrive(q_ready[0])
        for i in range(max(min(cdiv(cdiv(M, BN), SPLIT), cdiv(M, BN) - bid.y * cdiv(cdiv(M, BN), SPLIT)), 0) * min(cdiv(D, BK), 8) + L):
            if i >= L:
                j = i - L
                wait(full[j % S], phase=j // S % 2)
                if j % min(cdiv(D, BK), 8) == 0:
                    wait(nrm_empty[j // min(cdiv(D, BK), 8) % 2], phase=(j // min(cdiv(D, BK), 8) // 2 + 1) % 2)
                    sqnorm_rows(nrm_s[j // min(cdiv(D, BK), 8) % 2], db_s[j % S])
                if j % min(cdiv(D, BK), 8) > 0:
                    sqnorm_rows(nrm_s[j // min(cdiv(D, BK), 8) % 2], db_s[j % S], accumulate=True)
                if j % min(cdiv(D, BK), 8) == min(cdiv(D, BK), 8) - 1:
                    arrive(ready[j // min(cdiv(D, BK), 8) % 2])
                arrive(empty[j % S])
            if i < max(min(cdiv(cdiv(M, BN), SPLIT), cdiv(M, BN) - bid.y * cdiv(cdiv(M, BN), SPLIT)), 0) * min(cdiv(D, BK), 8):
                wait(empty[i % S], phase=(i // S + 1) % 2)
                expect_tx(full[i % S], BN * BK * 2)
                tma_load(db_s[i % S], db[bid.z, tile(bid.y * cdiv(cdiv(M, BN), SPLIT) + i // min(cdiv(D, BK), 8), BN), tile(i % min(cdiv(D, BK), 8), BK)], bar=full[i % S])
    with role("consumer", warps=(4, 8), regs=240):
        acc = rmem(f32, (BM, BN))
        top_v = rmem(f32, (BM, KMAX), fill=inf)
        top_i = rmem(i32, (BM, KMAX), fill=-1.0)
        wait(q_full[0], phase=0)
        for mt in range(max(min(cdiv(cdiv(M, BN), SPLIT), cdiv(M, BN) - bid.y * cdiv(cdiv(M, BN), SPLIT)), 0)):
            i0 = mt * min(cdiv(D, BK), 8)
            wait(full[i0 % S], phase=i0 // S % 2)
            wgmma(acc, q_s[0], db_s[i0 % S], b_major="k", accumulate=False)
            for dk in range(1, min(cdiv(D, BK), 8), 1):
                i = i0 + dk
                wait(full[i % S], phase=i // S % 2)
                wgmma(acc, q_s[dk], db_s[i % S], b_major="k")
                wgmma_wait(1)
                arrive(empty[(i - 1) % S])
            wgmma_wait(0)
            arrive(empty[(i0 + min(cdiv(D, BK), 8) - 1) % S])
            wait(ready[mt % 2], phase=mt // 2 % 2)
            topk_bias(top_v, top_i, acc, nrm_s[mt % 2], base=(bid.y * cdiv(cdiv(M, BN), SPLIT) + mt) * BN, limit=M)
            arrive(nrm_empty[mt % 2])
        wait(q_ready[0], phase=0)
        topk_shift(top_v, qn_s)
        topk_publish(pub_v, pub_i, top_v, top_i)
    cluster_sync()
    topk_cluster_merge(dists[bid.z, tile(bid.x, BM), tile(0, KMAX)], pub_v, pub_i)
    topk_cluster_merge(idx[bid.z, tile(bid.x, BM), tile(0, KMAX)], pub_v, pub_i)
    cluster_sync()
