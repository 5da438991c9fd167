//! The layer-aware block table (`Peer::transfer_pools`): 32 layers x {K, V} x 2,000 blocks in
//! one call, every byte checked, against the same move as 64 separate block tables.

use std::time::Duration;

use gdr_test_support::pattern;
use gdr_test_support::xfer::{agent, connected};
use gdr_xfer::{BlockTable, Op, PoolTable, TransferOptions, TransferStats};

const WAIT: Duration = Duration::from_secs(120);
const POOLS: u64 = 64;
const BLOCKS: u32 = 2000;
/// Blocks each pool can hold (indices below it).
const POOL_BLOCKS: u32 = 2048;
const BLOCK: u64 = 128;

#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn thirty_two_layers_of_k_and_v_move_in_one_call_every_byte_where_asked() {
    let (prefill, decode, to_decode, _) = connected(agent("pool-prefill"), agent("pool-decode"));
    let pool_bytes = u64::from(POOL_BLOCKS) * BLOCK;
    let len = (POOLS * pool_bytes) as usize;
    let kv = prefill.alloc_host(len, "kv").unwrap();
    kv.write(0, &pattern(len, 11)).unwrap();
    let remote_kv = decode.alloc_host(len, "kv-pool").unwrap();
    let pool_id = to_decode.wait_segment_named("kv-pool", WAIT).unwrap().id;
    // The request's blocks: local 0..2000 to scattered remote blocks (a permutation).
    let local: Vec<u32> = (0..BLOCKS).collect();
    let remote: Vec<u32> = (0..BLOCKS).map(|b| (b * 997 + 5) % POOL_BLOCKS).collect();
    let mut table = PoolTable::new(BLOCK, &local, &remote);
    for p in 0..POOLS {
        table = table.pool(&kv, p * pool_bytes, pool_id, p * pool_bytes);
    }
    let pooled = to_decode
        .transfer_pools(Op::Write, &table, &TransferOptions::new().timeout(WAIT))
        .unwrap()
        .wait(WAIT)
        .unwrap();
    // Every block of every pool landed exactly where asked, and nothing else was written.
    let src = kv.to_vec(0, len).unwrap();
    let dst = remote_kv.to_vec(0, len).unwrap();
    let mut written = vec![false; len];
    for p in 0..POOLS as usize {
        let base = p * pool_bytes as usize;
        for (&l, &r) in local.iter().zip(&remote) {
            let (l, r) = (
                base + l as usize * BLOCK as usize,
                base + r as usize * BLOCK as usize,
            );
            assert_eq!(
                dst[r..r + BLOCK as usize],
                src[l..l + BLOCK as usize],
                "pool {p}, block {l} -> {r}"
            );
            written[r..r + BLOCK as usize].fill(true);
        }
    }
    assert!(
        dst.iter().zip(&written).all(|(&b, &w)| w || b == 0),
        "bytes outside the asked blocks were written"
    );
    // The same move as 64 block tables, one per pool, as a caller without the pooled form
    // would write it.
    let start = std::time::Instant::now();
    let mut tables = TransferStats::default();
    for p in 0..POOLS {
        let t = BlockTable {
            local: &kv,
            local_base: p * pool_bytes,
            remote: pool_id,
            remote_base: p * pool_bytes,
            block_len: BLOCK,
            local_blocks: &local,
            remote_blocks: &remote,
        };
        let s = to_decode
            .transfer_blocks(Op::Write, &t, &TransferOptions::new().timeout(WAIT))
            .unwrap()
            .wait(WAIT)
            .unwrap();
        tables.descriptors += s.descriptors;
        tables.runs += s.runs;
        tables.slices += s.slices;
        tables.plan_time += s.plan_time;
        tables.submit_time += s.submit_time;
    }
    let tables_wall = start.elapsed();
    println!(
        "pooled: 1 call, {} descriptors, {} runs, {} requests, plan {:?}, submit {:?}, complete {:?}",
        pooled.descriptors,
        pooled.runs,
        pooled.slices,
        pooled.plan_time,
        pooled.submit_time,
        pooled.time_to_complete
    );
    println!(
        "64 block tables: 64 calls, {} descriptors, {} runs, {} requests, plan {:?}, submit {:?} (summed), {tables_wall:?} for all 64 one after another",
        tables.descriptors, tables.runs, tables.slices, tables.plan_time, tables.submit_time
    );
    assert_eq!(pooled.descriptors, POOLS * u64::from(BLOCKS));
    assert_eq!(pooled.descriptors, tables.descriptors);
    assert_eq!(pooled.runs, tables.runs, "the same merging");
    // Read back through the pooled form into zeroed memory: the same bytes.
    let back = prefill.alloc_host(len, "back").unwrap();
    let mut rtable = PoolTable::new(BLOCK, &local, &remote);
    for p in 0..POOLS {
        rtable = rtable.pool(&back, p * pool_bytes, pool_id, p * pool_bytes);
    }
    to_decode
        .transfer_pools(Op::Read, &rtable, &TransferOptions::new().timeout(WAIT))
        .unwrap()
        .wait(WAIT)
        .unwrap();
    let got = back.to_vec(0, len).unwrap();
    for p in 0..POOLS as usize {
        let base = p * pool_bytes as usize;
        for &l in &local {
            let at = base + l as usize * BLOCK as usize;
            assert_eq!(got[at..at + BLOCK as usize], src[at..at + BLOCK as usize]);
        }
    }
}
