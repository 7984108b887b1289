@kernel(target="sm_90a", grid=(cdiv(D, BD), B, max(1, SMS // (B * cdiv(D, BD)))), threads=512, consts={"BD": 32, "BN": 384, "KMAX": 1024, "SMS": 132})
def kmeans_update_smem(x: gmem[bf16, (B, N, D)], assign: gmem[i32, (B, N)], sums: gmem[f32, (B, K, D)], counts: gmem[i32, (B, K)]):
    acc_s = smem(f32, (KMAX, BD))
    cnt_s = smem(i32, (KMAX,))
    ones_s = smem(i32, (BN,))
    x0 = smem(bf16, (BN, BD))
    x1 = smem(bf16, (BN, BD))
    x2 = smem(bf16, (BN, BD))
    a0 = smem(i32, (BN,))
    a1 = smem(i32, (BN,))
    a2 = smem(i32, (BN,))
    fill(acc_s, value=0.0)
    fill(cnt_s, value=0.0)
    fill(ones_s, value=1.0)
    splits = max(1, SMS // (B * cdiv(D, BD)))
    chunk = cdiv(N, BN * splits)
    t0 = bid.z * chunk
    n_end = min(N, (bid.z + 1) * chunk * BN)
    cp_async(x0, x[bid.y, tile(t0, BN), tile(bid.x, BD)])
    cp_async(a0, assign[bid.y, tile(t0, BN)])
    cp_async(x1, x[bid.y, tile(t0 + 1, BN), tile(bid.x, BD)])
    cp_async(a1, assign[bid.y, tile(t0 + 1, BN)])
    for it in range(cdiv(chunk, 3)):
        c = t0 + 3 * it
        cp_async_wait(2)
        sync()
        cp_async(x2, x[bid.y, tile(c + 2, BN), tile(bid.x, BD)])
        cp_async(a2, assign[bid.y, tile(c + 2, BN)])
        if K <= KMAX:
            scatter_add(acc_s[:, :], a0, x0, base=(c + 0) * BN, limit=n_end)
            if bid.x == 0:
                scatter_add(cnt_s[:], a0, ones_s, base=(c + 0) * BN, limit=n_end)
        if K > KMAX:
            scatter_add(sums[bid.y, :, tile(bid.x, BD)], a0, x0, base=(c + 0) * BN, limit=n_end)
            if bid.x == 0:
                scatter_add(counts[bid.y, :], a0, ones_s, base=(c + 0) * BN, limit=n_end)
        cp_async_wait(2)
        sync()
        cp_async(x0, x[bid.y, tile(c + 3, BN), tile(bid.x, BD)])
        cp_async(a0, assign[bid.y, tile(c + 3, BN)])
        if K <= KMAX:
            scatter_add(acc_s[:, :], a1, x1, base=(c + 1) * BN, limit=n_end)
            if bid.x == 0:
                scatter_add(cnt_s[:], a1, ones_s, base=(c + 1) * BN, limit=n_end)
        if K > KMAX:
            scatter_add(sums[bid.y, :, tile(bid.x, BD)], a1, x1, base=(c + 1) * BN, limit=n_end)
            if bid.x == 0:
                scatter_add(counts[bid.y, :], a1, ones_s, base=(c + 1) * BN, limit=n_end)
        cp_async_wait(2)
        sync()
        cp_async(x1, x[bid.y, tile(c + 4, BN), tile(bid.x, BD)])
        cp_async(a1, assign[bid.y, tile(c + 4, BN)])
        if K <= KMAX:
            scatter_add(acc_s[:, :], a2, x2, base=(c + 2) * BN, limit=n_end)
            if bid.x == 0:
                scatter_add(cnt_s[:], a2, ones_s, base=(c + 2) * BN, limit=n_end)
        if K > KMAX:
            scatter_add(sums[bid.y, :, tile(bid.x, BD)], a2, x2, base=(c + 2) * BN, limit=n_end)
            if bid.x == 0:
                scatter_add(counts[bid.y, :], a2, ones_s, base=(c + 2) * BN, limit=n_end)
    cp_async_wait(0)
    sync()
    if K <= KMAX:
        if splits == 1:
            store(sums[bid.y, tile(0, KMAX), tile(bid.x, BD)], acc_s)
            if bid.x == 0:
                store(counts[bid.y, tile(0, KMAX)], cnt_s)
        if splits > 1:
            atomic_add(sums[bid.y, tile(0, KMAX), tile(bid.x, BD)], acc_s)
            if bid.x == 0:
                atomic_add(counts[bid.y, tile(0, KMAX)], cnt_s)
