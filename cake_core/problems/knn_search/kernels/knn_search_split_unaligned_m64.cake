@kernel(target="sm_90a", grid=(cdiv(Q, BM), SPLIT, B), threads=256, consts={"BK": 64, "BM": 64, "BN": 128, "KMAX": 16, "L": 2, "S": 5, "SPLIT": 8})
def knn_search_split_unaligned_m64(q: gmem[bf16, (B, Q, D)], db: gmem[bf16, (B, M, D)], dists: gmem[f32, (B, Q, k)], idx: gmem[i32, (B, Q, k)]):
    cluster((1, SPLIT, 1))
    q_s = smem(bf16, (BM, BK), stages=5, swizzle=128)
    db_s = smem(bf16, (BN, BK), stages=5, swizzle=128)
    nrm_s = smem(f32, (BN,), stages=2)
    qn_s = smem(f32, (BM,))
    pub_v = smem(f32, (BM, KMAX))
    pub_i = smem(i32, (BM, KMAX))
    q_ready = mbarrier(1)
    full = mbarrier(S)
    empty = mbarrier(S, arrivals=2)
    ready = mbarrier(2)
    nrm_empty = mbarrier(2)
    with role("producer", warps=(0, 4), regs=40):
        for i in range(max(min(cdiv(cdiv(M, BN), SPLIT), cdiv(M, BN) - bid.y * cdiv(cdiv(M, BN), SPLIT)), 0) * cdiv(D, BK) + L):
            if i >= L:
                j = i - L
                wait(full[j % S], phase=j // S % 2)
                if j == 0:
                    sqnorm_rows(qn_s, q_s[j % S])
                if j > 0:
                    if j < cdiv(D, BK):
                        sqnorm_rows(qn_s, q_s[j % S], accumulate=True)
                if j == cdiv(D, BK) - 1:
                    arrive(q_ready[0])
                if j % cdiv(D, BK) == 0:
                    wait(nrm_empty[j // cdiv(D, BK) % 2], phase=(j // cdiv(D, BK) // 2 + 1) % 2)
                    sqnorm_rows(nrm_s[j // cdiv(D, BK) % 2], db_s[j % S])
                if j % cdiv(D, BK) > 0:
                    sqnorm_rows(nrm_s[j // cdiv(D, BK) % 2], db_s[j % S], accumulate=True)
                if j % cdiv(D, BK) == cdiv(D, BK) - 1:
                    arrive(ready[j // cdiv(D, BK) % 2])
                arrive(empty[j % S])
            if i < max(min(cdiv(cdiv(M, BN), SPLIT), cdiv(M, BN) - bid.y * cdiv(cdiv(M, BN), SPLIT)), 0) * cdiv(D, BK):
                wait(empty[i % S], phase=(i // S + 1) % 2)
                cp_async_bar(q_s[i % S], q[bid.z, tile(bid.x, BM), tile(i % cdiv(D, BK), BK)], bar=full[i % S])
                cp_async_bar(db_s[i % S], db[bid.z, tile(bid.y * cdiv(cdiv(M, BN), SPLIT) + i // cdiv(D, BK), BN), tile(i % cdiv(D, BK), BK)], bar=full[i % S])
                arrive(full[i % S])
    with role("consumer", warps=(4, 8), regs=240):
        acc = rmem(f32, (BM, BN))
        top_v = rmem(f32, (BM, KMAX), fill=inf)
        top_i = rmem(i32, (BM, KMAX), fill=-1.0)
        for mt in range(max(min(cdiv(cdiv(M, BN), SPLIT), cdiv(M, BN) - bid.y * cdiv(cdiv(M, BN), SPLIT)), 0)):
            i0 = mt * cdiv(D, BK)
            wait(full[i0 % S], phase=i0 // S % 2)
            fence_async()
            wgmma(acc, q_s[i0 % S], db_s[i0 % S], accumulate=False, b_major="k")
            for dk in range(1, cdiv(D, BK)):
                i = i0 + dk
                wait(full[i % S], phase=i // S % 2)
                fence_async()
                wgmma(acc, q_s[i % S], db_s[i % S], b_major="k")
                wgmma_wait(1)
                arrive(empty[(i - 1) % S])
            wgmma_wait(0)
            arrive(empty[(i0 + cdiv(D, BK) - 1) % S])
            wait(ready[mt % 2], phase=mt // 2 % 2)
            topk_bias(top_v, top_i, acc, nrm_s[mt % 2], base=(bid.y * cdiv(cdiv(M, BN), SPLIT) + mt) * BN, limit=M)
            arrive(nrm_empty[mt % 2])
        if max(min(cdiv(cdiv(M, BN), SPLIT), cdiv(M, BN) - bid.y * cdiv(cdiv(M, BN), SPLIT)), 0) > 0:
            wait(q_ready[0], phase=0)
            topk_shift(top_v, qn_s)
        topk_publish(pub_v, pub_i, top_v, top_i)
    cluster_sync()
    topk_cluster_merge(dists[bid.z, tile(bid.x, BM), tile(0, KMAX)], pub_v, pub_i)
    topk_cluster_merge(idx[bid.z, tile(bid.x, BM), tile(0, KMAX)], pub_v, pub_i)
    cluster_sync()
