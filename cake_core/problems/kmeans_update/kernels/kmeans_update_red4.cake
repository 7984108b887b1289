@kernel(target="sm_90a", grid=(cdiv(N, BN * TPC), B), threads=256, consts={"BD": 128, "BN": 16, "TPC": 32})
def kmeans_update_red4(x: gmem[bf16, (B, N, D)], assign: gmem[i32, (B, N)], sums: gmem[f32, (B, K, D)], counts: gmem[i32, (B, K)]):
    x0 = rmem(bf16, (BN, BD))
    x1 = rmem(bf16, (BN, BD))
    a0 = smem(i32, (BN,))
    a1 = smem(i32, (BN,))
    ones_s = smem(i32, (BN,))
    fill(ones_s, value=1.0)
    t0 = bid.x * TPC
    for dt in range(cdiv(D, BD)):
        cp_async(a0, assign[bid.y, tile(t0, BN)])
        load(x0, x[bid.y, tile(t0, BN), tile(dt, BD)])
        for it in range(TPC // 2):
            c = t0 + 2 * it
            cp_async_wait(0)
            sync()
            cp_async(a1, assign[bid.y, tile(c + 1, BN)])
            load(x1, x[bid.y, tile(c + 1, BN), tile(dt, BD)])
            scatter_add(sums[bid.y, :, tile(dt, BD)], a0, x0, base=c * BN, limit=N, vector=4)
            if dt == 0:
                scatter_add(counts[bid.y, :], a0, ones_s, base=c * BN, limit=N)
            cp_async_wait(0)
            sync()
            if it + 1 < TPC // 2:
                cp_async(a0, assign[bid.y, tile(c + 2, BN)])
                load(x0, x[bid.y, tile(c + 2, BN), tile(dt, BD)])
            scatter_add(sums[bid.y, :, tile(dt, BD)], a1, x1, base=(c + 1) * BN, limit=N, vector=4)
            if dt == 0:
                scatter_add(counts[bid.y, :], a1, ones_s, base=(c + 1) * BN, limit=N)
        sync()
