@kernel(target="sm_90a", grid=(cdiv(N, BN), B), threads=128, consts={"BD": 32, "BN": 128})
def kmeans_update(x: gmem[bf16, (B, N, D)], assign: gmem[i32, (B, N)], sums: gmem[f32, (B, K, D)], counts: gmem[i32, (B, K)]):
    a_r = rmem(i32, (BN,))
    ones = rmem(i32, (BN,), fill=1.0)
    x_r = rmem(bf16, (BN, BD))
    load(a_r, assign[bid.y, tile(bid.x, BN)])
    scatter_add(counts[bid.y, :], a_r, ones, base=bid.x * BN, limit=N)
    for dt in range(cdiv(D, BD)):
        load(x_r, x[bid.y, tile(bid.x, BN), tile(dt, BD)])
        scatter_add(sums[bid.y, :, tile(dt, BD)], a_r, x_r, base=bid.x * BN, limit=N)
