@kernel(target="sm_90a", grid=(min(cdiv(M, BM) * cdiv(N, BN), num_sms),), threads=384, consts={"BK": 64, "BM": 128, "BN": 256, "G": 16, "S": 4})
def gemm_bf16_persistent(a: gmem[bf16, (M, K)], b: gmem[bf16, (K, N)], c: gmem[f32, (M, N)]):
    a_s = smem(bf16, (BM, BK), stages=4, swizzle=128)
    b_s = smem(bf16, (BK, BN), stages=4, swizzle=128)
    full = mbarrier(S)
    empty = mbarrier(S, arrivals=2)
    with role("producer", warps=(0, 4), regs=40):
        for t in range(bid.x, cdiv(M, BM) * cdiv(N, BN), ncta.x):
            for kt in range(cdiv(K, BK)):
                wait(empty[((t - bid.x) // ncta.x * cdiv(K, BK) + kt) % S], phase=(((t - bid.x) // ncta.x * cdiv(K, BK) + kt) // S + 1) % 2)
                expect_tx(full[((t - bid.x) // ncta.x * cdiv(K, BK) + kt) % S], (BM * BK + BK * BN) * 2)
                tma_load(a_s[((t - bid.x) // ncta.x * cdiv(K, BK) + kt) % S], a[tile(t // (G * cdiv(N, BN)) * G + t % (G * cdiv(N, BN)) % min(cdiv(M, BM) - t // (G * cdiv(N, BN)) * G, G), BM), tile(kt, BK)], bar=full[((t - bid.x) // ncta.x * cdiv(K, BK) + kt) % S])
                tma_load(b_s[((t - bid.x) // ncta.x * cdiv(K, BK) + kt) % S], b[tile(kt, BK), tile(t % (G * cdiv(N, BN)) // min(cdiv(M, BM) - t // (G * cdiv(N, BN)) * G, G), BN)], bar=full[((t - bid.x) // ncta.x * cdiv(K, BK) + kt) % S])
    with role("consumer", warps=(4, 12), regs=232):
        for t in range(bid.x, cdiv(M, BM) * cdiv(N, BN), ncta.x):
            acc = rmem(f32, (BM, BN))
            for kt in range(cdiv(K, BK)):
                wait(full[((t - bid.x) // ncta.x * cdiv(K, BK) + kt) % S], phase=((t - bid.x) // ncta.x * cdiv(K, BK) + kt) // S % 2)
                wgmma(acc, a_s[((t - bid.x) // ncta.x * cdiv(K, BK) + kt) % S], b_s[((t - bid.x) // ncta.x * cdiv(K, BK) + kt) % S])
                wgmma_wait(1)
                if kt > 0:
                    arrive(empty[((t - bid.x) // ncta.x * cdiv(K, BK) + kt + S - 1) % S])
            wgmma_wait(0)
            arrive(empty[((t - bid.x) // ncta.x * cdiv(K, BK) + cdiv(K, BK) + S - 1) % S])
            store(c[tile(t // (G * cdiv(N, BN)) * G + t % (G * cdiv(N, BN)) % min(cdiv(M, BM) - t // (G * cdiv(N, BN)) * G, G), BM), tile(t % (G * cdiv(N, BN)) // min(cdiv(M, BM) - t // (G * cdiv(N, BN)) * G, G), BN)], acc)
