@kernel(target="sm_90a", grid=(cdiv(K, KC), B, max(1, SMS // (B * cdiv(K, KC)))), threads=512, ctas_per_sm=1, consts={"BD": 128, "BN": 4096, "KC": 256, "SMS": 132})
def kmeans_update_gather(x: gmem[bf16, (B, N, D)], assign: gmem[i32, (B, N)], sums: gmem[f32, (B, K, D)], counts: gmem[i32, (B, K)]):
    acc_s = smem(f32, (KC, BD))
    cnt_s = smem(i32, (KC,))
    a0 = smem(i32, (BN,))
    a1 = smem(i32, (BN,))
    q_s = smem(i32, (BN + 512,))
    splits = max(1, SMS // (B * cdiv(K, KC)))
    chunk = cdiv(cdiv(N, BN), splits)
    t0 = bid.z * chunk
    n_end = min(N, (t0 + chunk) * BN)
    for dt in range(cdiv(D, BD)):
        fill(acc_s, value=0.0)
        fill(cnt_s, value=0.0)
        cp_async(a0, assign[bid.y, tile(t0, BN)])
        for it in range(cdiv(chunk, 2)):
            c = t0 + 2 * it
            cp_async_wait(0)
            sync()
            cp_async(a1, assign[bid.y, tile(c + 1, BN)])
            gather_add(acc_s[:, :], cnt_s[:], a0, q_s, x[bid.y, tile(c, BN), tile(dt, BD)], base=c * BN, limit=n_end, first=bid.x * KC)
            cp_async_wait(0)
            sync()
            cp_async(a0, assign[bid.y, tile(c + 2, BN)])
            gather_add(acc_s[:, :], cnt_s[:], a1, q_s, x[bid.y, tile(c + 1, BN), tile(dt, BD)], base=(c + 1) * BN, limit=n_end, first=bid.x * KC)
        cp_async_wait(0)
        sync()
        if splits == 1:
            store(sums[bid.y, tile(bid.x, KC), tile(dt, BD)], acc_s)
            if dt == 0:
                store(counts[bid.y, tile(bid.x, KC)], cnt_s)
        if splits > 1:
            atomic_add(sums[bid.y, tile(bid.x, KC), tile(dt, BD)], acc_s)
            if dt == 0:
                atomic_add(counts[bid.y, tile(bid.x, KC)], cnt_s)
        sync()
