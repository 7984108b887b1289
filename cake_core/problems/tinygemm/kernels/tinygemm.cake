@kernel(target="sm_90a", grid=(cdiv(N, BN), cdiv(M, BM)), threads=128, consts={"BK": 32, "BM": 16, "BN": 64})
def tinygemm(a: gmem[bf16, (M, K)], b: gmem[bf16, (K, N)], c: gmem[f32, (M, N)]):
    a_s = smem(bf16, (BM, BK))
    b_s = smem(bf16, (BK, BN))
    acc = rmem(f32, (BM, BN))
    for kt in range(cdiv(K, BK)):
        load(a_s, a[tile(bid.y, BM), tile(kt, BK)])
        load(b_s, b[tile(kt, BK), tile(bid.x, BN)])
        sync()
        mma(acc, a_s, b_s)
        sync()
    store(c[tile(bid.y, BM), tile(bid.x, BN)], acc)
