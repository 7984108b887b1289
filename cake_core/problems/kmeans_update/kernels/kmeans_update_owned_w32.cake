@kernel(target="sm_90a", grid=(cdiv(D, BD), B, max(1, SMS // (B * cdiv(D, BD)))), threads=1024, consts={"BD": 32, "BN": 384, "KMAX": 1024, "SMS": 132})
def kmeans_update_owned_w32(x: gmem[bf16, (B, N, D)], assign: gmem[i32, (B, N)], sums: gmem[f32, (B, K, D)], counts: gmem[i32, (B, K)]):
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
    cp_async(x0, x[bid.y, tile(bid.z * cdiv(N, BN * max(1, SMS // (B * cdiv(D, BD)))), BN), tile(bid.x, BD)])
    cp_async(a0, assign[bid.y, tile(bid.z * cdiv(N, BN * max(1, SMS // (B * cdiv(D, BD)))), BN)])
    cp_async(x1, x[bid.y, tile(bid.z * cdiv(N, BN * max(1, SMS // (B * cdiv(D, BD)))) + 1, BN), tile(bid.x, BD)])
    cp_async(a1, assign[bid.y, tile(bid.z * cdiv(N, BN * max(1, SMS // (B * cdiv(D, BD)))) + 1, BN)])
    if K <= KMAX:
        for it in range(cdiv(cdiv(N, BN * max(1, SMS // (B * cdiv(D, BD)))), 3)):
            cp_async_wait(2)
            sync()
            cp_async(x2, x[bid.y, tile(bid.z * cdiv(N, BN * max(1, SMS // (B * cdiv(D, BD)))) + 3 * it + 2, BN), tile(bid.x, BD)])
            cp_async(a2, assign[bid.y, tile(bid.z * cdiv(N, BN * max(1, SMS // (B * cdiv(D, BD)))) + 3 * it + 2, BN)])
            scatter_add(acc_s[:, :], a0, x0, base=(bid.z * cdiv(N, BN * max(1, SMS // (B * cdiv(D, BD)))) + 3 * it + 0) * BN, limit=min(N, (bid.z + 1) * cdiv(N, BN * max(1, SMS // (B * cdiv(D, BD)))) * BN), owner="warp")
            if bid.x == 0:
                scatter_add(cnt_s[:], a0, ones_s, base=(bid.z * cdiv(N, BN * max(1, SMS // (B * cdiv(D, BD)))) + 3 * it + 0) * BN, limit=min(N, (bid.z + 1) * cdiv(N, BN * max(1, SMS // (B * cdiv(D, BD)))) * BN))
            cp_async_wait(2)
            sync()
            cp_async(x0, x[bid.y, tile(bid.z * cdiv(N, BN * max(1, SMS // (B * cdiv(D, BD)))) + 3 * it + 3, BN), tile(bid.x, BD)])
            cp_async(a0, assign[bid.y, tile(bid.z * cdiv(N, BN * max(1, SMS // (B * cdiv(D, BD)))) + 3 * it + 3, BN)])
            scatter_add(acc_s[:, :], a1, x1, base=(bid.z * cdiv(N, BN * max(1, SMS // (B * cdiv(D, BD)))) + 3 * it + 1) * BN, limit=min(N, (bid.z + 1) * cdiv(N, BN * max(1, SMS // (B * cdiv(D, BD)))) * BN), owner="warp")
            if bid.x == 0:
                scatter_add(cnt_s[:], a1, ones_s, base=(bid.z * cdiv(N, BN * max(1, SMS // (B * cdiv(D, BD)))) + 3 * it + 1) * BN, limit=min(N, (bid.z + 1) * cdiv(N, BN * max(1, SMS // (B * cdiv(D, BD)))) * BN))
            cp_async_wait(2)
            sync()
            cp_async(x1, x[bid.y, tile(bid.z * cdiv(N, BN * max(1, SMS // (B * cdiv(D, BD)))) + 3 * it + 4, BN), tile(bid.x, BD)])
            cp_async(a1, assign[bid.y, tile(bid.z * cdiv(N, BN * max(1, SMS // (B * cdiv(D, BD)))) + 3 * it + 4, BN)])
            scatter_add(acc_s[:, :], a2, x2, base=(bid.z * cdiv(N, BN * max(1, SMS // (B * cdiv(D, BD)))) + 3 * it + 2) * BN, limit=min(N, (bid.z + 1) * cdiv(N, BN * max(1, SMS // (B * cdiv(D, BD)))) * BN), owner="warp")
            if bid.x == 0:
                scatter_add(cnt_s[:], a2, ones_s, base=(bid.z * cdiv(N, BN * max(1, SMS // (B * cdiv(D, BD)))) + 3 * it + 2) * BN, limit=min(N, (bid.z + 1) * cdiv(N, BN * max(1, SMS // (B * cdiv(D, BD)))) * BN))
        cp_async_wait(0)
        sync()
        if max(1, SMS // (B * cdiv(D, BD))) == 1:
            store(sums[bid.y, tile(0, KMAX), tile(bid.x, BD)], acc_s)
            if bid.x == 0:
                store(counts[bid.y, tile(0, KMAX)], cnt_s)
        if max(1, SMS // (B * cdiv(D, BD))) > 1:
            atomic_add(sums[bid.y, tile(0, KMAX), tile(bid.x, BD)], acc_s)
            if bid.x == 0:
                atomic_add(counts[bid.y, tile(0, KMAX)], cnt_s)
    if K > KMAX:
        for it in range(cdiv(cdiv(N, BN * max(1, SMS // (B * cdiv(D, BD)))), 3)):
            cp_async_wait(2)
            sync()
            cp_async(x2, x[bid.y, tile(bid.z * cdiv(N, BN * max(1, SMS // (B * cdiv(D, BD)))) + 3 * it + 2, BN), tile(bid.x, BD)])
            cp_async(a2, assign[bid.y, tile(bid.z * cdiv(N, BN * max(1, SMS // (B * cdiv(D, BD)))) + 3 * it + 2, BN)])
            scatter_add(sums[bid.y, :, tile(bid.x, BD)], a0, x0, base=(bid.z * cdiv(N, BN * max(1, SMS // (B * cdiv(D, BD)))) + 3 * it + 0) * BN, limit=min(N, (bid.z + 1) * cdiv(N, BN * max(1, SMS // (B * cdiv(D, BD)))) * BN))
            if bid.x == 0:
                scatter_add(counts[bid.y, :], a0, ones_s, base=(bid.z * cdiv(N, BN * max(1, SMS // (B * cdiv(D, BD)))) + 3 * it + 0) * BN, limit=min(N, (bid.z + 1) * cdiv(N, BN * max(1, SMS // (B * cdiv(D, BD)))) * BN))
            cp_async_wait(2)
            sync()
            cp_async(x0, x[bid.y, tile(bid.z * cdiv(N, BN * max(1, SMS // (B * cdiv(D, BD)))) + 3 * it + 3, BN), tile(bid.x, BD)])
            cp_async(a0, assign[bid.y, tile(bid.z * cdiv(N, BN * max(1, SMS // (B * cdiv(D, BD)))) + 3 * it + 3, BN)])
            scatter_add(sums[bid.y, :, tile(bid.x, BD)], a1, x1, base=(bid.z * cdiv(N, BN * max(1, SMS // (B * cdiv(D, BD)))) + 3 * it + 1) * BN, limit=min(N, (bid.z + 1) * cdiv(N, BN * max(1, SMS // (B * cdiv(D, BD)))) * BN))
            if bid.x == 0:
                scatter_add(counts[bid.y, :], a1, ones_s, base=(bid.z * cdiv(N, BN * max(1, SMS // (B * cdiv(D, BD)))) + 3 * it + 1) * BN, limit=min(N, (bid.z + 1) * cdiv(N, BN * max(1, SMS // (B * cdiv(D, BD)))) * BN))
            cp_async_wait(2)
            sync()
            cp_async(x1, x[bid.y, tile(bid.z * cdiv(N, BN * max(1, SMS // (B * cdiv(D, BD)))) + 3 * it + 4, BN), tile(bid.x, BD)])
            cp_async(a1, assign[bid.y, tile(bid.z * cdiv(N, BN * max(1, SMS // (B * cdiv(D, BD)))) + 3 * it + 4, BN)])
            scatter_add(sums[bid.y, :, tile(bid.x, BD)], a2, x2, base=(bid.z * cdiv(N, BN * max(1, SMS // (B * cdiv(D, BD)))) + 3 * it + 2) * BN, limit=min(N, (bid.z + 1) * cdiv(N, BN * max(1, SMS // (B * cdiv(D, BD)))) * BN))
            if bid.x == 0:
                scatter_add(counts[bid.y, :], a2, ones_s, base=(bid.z * cdiv(N, BN * max(1, SMS // (B * cdiv(D, BD)))) + 3 * it + 2) * BN, limit=min(N, (bid.z + 1) * cdiv(N, BN * max(1, SMS // (B * cdiv(D, BD)))) * BN))
        cp_async_wait(0)
