@kernel(target="sm_90a", grid=(min(cdiv(cdiv(M, BM), 2) * cdiv(N, BN), num_sms // 2) * 2,), threads=384, consts={"BK": 64, "BM": 128, "BN": 256, "G": 8, "S": 4})
def gemm_bf16_persistent_mc(a: gmem[bf16, (M, K)], b: gmem[bf16, (K, N)], c: gmem[f32, (M, N)]):
    cluster((2, 1, 1))
    a_s = smem(bf16, (BM, BK), stages=4, swizzle=128)
    b_s = smem(bf16, (BK, BN), stages=4, swizzle=128)
    full = mbarrier(S)
    empty = mbarrier(S, arrivals=4)
    cluster_sync()
    with role("producer", warps=(0, 4), regs=40):
        for t in range(bid.x // 2, cdiv(cdiv(M, BM), 2) * cdiv(N, BN), ncta.x // 2):
            for kt in range(cdiv(K, BK)):
                wait(empty[((t - bid.x // 2) // (ncta.x // 2) * cdiv(K, BK) + kt) % S], phase=(((t - bid.x // 2) // (ncta.x // 2) * cdiv(K, BK) + kt) // S + 1) % 2)
                expect_tx(full[((t - bid.x // 2) // (ncta.x // 2) * cdiv(K, BK) + kt) % S], (BM * BK + BK * BN) * 2)
                tma_load(a_s[((t - bid.x // 2) // (ncta.x // 2) * cdiv(K, BK) + kt) % S], a[tile((t // (G * cdiv(N, BN)) * G + t % (G * cdiv(N, BN)) % min(cdiv(cdiv(M, BM), 2) - t // (G * cdiv(N, BN)) * G, G)) * 2 + bid.x % 2, BM), tile(kt, BK)], bar=full[((t - bid.x // 2) // (ncta.x // 2) * cdiv(K, BK) + kt) % S])
                if bid.x % 2 == 0:
                    tma_load(b_s[((t - bid.x // 2) // (ncta.x // 2) * cdiv(K, BK) + kt) % S], b[tile(kt, BK), tile(t % (G * cdiv(N, BN)) // min(cdiv(cdiv(M, BM), 2) - t // (G * cdiv(N, BN)) * G, G), BN)], bar=full[((t - bid.x // 2) // (ncta.x // 2) * cdiv(K, BK) + kt) % S], multicast=3)
    with role("consumer", warps=(4, 12), regs=232):
        for t in range(bid.x // 2, cdiv(cdiv(M, BM), 2) * cdiv(N, BN), ncta.x // 2):
            acc = rmem(f32, (BM, BN))
            for kt in range(cdiv(K, BK)):
                wait(full[((t - bid.x // 2) // (ncta.x // 2) * cdiv(K, BK) + kt) % S], phase=((t - bid.x // 2) // (ncta.x // 2) * cdiv(K, BK) + kt) // S % 2)
                wgmma(acc, a_s[((t - bid.x // 2) // (ncta.x // 2) * cdiv(K, BK) + kt) % S], b_s[((t - bid.x // 2) // (ncta.x // 2) * cdiv(K, BK) + kt) % S])
                wgmma_wait(1)
                if kt > 0:
                    arrive(empty[((t - bid.x // 2) // (ncta.x // 2) * cdiv(K, BK) + kt + S - 1) % S], multicast=3)
            wgmma_wait(0)
            arrive(empty[((t - bid.x // 2) // (ncta.x // 2) * cdiv(K, BK) + cdiv(K, BK) + S - 1) % S], multicast=3)
            store(c[tile((t // (G * cdiv(N, BN)) * G + t % (G * cdiv(N, BN)) % min(cdiv(cdiv(M, BM), 2) - t // (G * cdiv(N, BN)) * G, G)) * 2 + bid.x % 2, BM), tile(t % (G * cdiv(N, BN)) // min(cdiv(cdiv(M, BM), 2) - t // (G * cdiv(N, BN)) * G, G), BN)], acc)
    cluster_sync()
