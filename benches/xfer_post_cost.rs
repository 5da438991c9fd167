//! The engine's own work per block when it prepares and posts a paged batch (gdr-xfer), for
//! `valgrind --tool=callgrind` to count (instructions are deterministic where times are noise),
//! and the wall time of posting on this machine.
//!
//! Two agents of this process on `GDR_TEST_DEVICE`; a block table of `BLOCKS` blocks of
//! `BLOCK_LEN` bytes (`XFER_BLOCKS`, `XFER_BLOCK_LEN`; default 100,000 x 16 KiB; the
//! Llama-70B TP8 shape is 18,880), written into a pool of 4,096 blocks (indices wrap, scattered
//! so that nothing merges: every block is its own work request). With `XFER_POOLS=N`, the
//! layer-aware form instead (`Peer::transfer_pools`): `BLOCKS / N` block indices in each of N
//! pools, each a 1/N-th of the pool on each side. The measured part is
//! [`measured`]: submission (checking, merging, posting what fits) and the wait, during which
//! the progress thread posts the rest; callgrind collects it and the progress thread's
//! completion handling and posting (`--toggle-collect`; the command is in the README's
//! gdr-xfer section), and the provider's `ibv_post_send` is subtracted by object.
//!
//! `cargo bench --bench xfer_post_cost` in the VM prints one line per run:
//! `blocks=N block_len=B submit_us=.. post_us=.. complete_us=.. slices=.. runs=..`.

use std::time::Duration;

use gdr_xfer::{
    Agent, AgentConfig, BlockTable, Op, Peer, PoolTable, TransferOptions, TransferStats,
};

const POOL_BLOCKS: u32 = 4096;

#[inline(never)]
fn measured_pools(peer: &Peer, table: &PoolTable<'_>) -> TransferStats {
    let opts = TransferOptions::new().timeout(Duration::from_secs(600));
    peer.transfer_pools(Op::Write, table, &opts)
        .expect("submit")
        .wait(Duration::from_secs(600))
        .expect("transfer")
}

#[inline(never)]
fn measured(peer: &Peer, table: &BlockTable<'_>) -> TransferStats {
    let opts = TransferOptions::new().timeout(Duration::from_secs(600));
    peer.transfer_blocks(Op::Write, table, &opts)
        .expect("submit")
        .wait(Duration::from_secs(600))
        .expect("transfer")
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        // `cargo bench -- --list` / test harness discovery: nothing to list.
        return;
    }
    let device = std::env::var("GDR_TEST_DEVICE").expect(
        "GDR_TEST_DEVICE is not set: this benchmark needs an RDMA device (run it in the VM)",
    );
    let blocks = env_u64("XFER_BLOCKS", 100_000) as u32;
    let block_len = env_u64("XFER_BLOCK_LEN", 16 * 1024);
    let pools = env_u64("XFER_POOLS", 1).max(1);
    let cfg = |name: &str| {
        AgentConfig::new(name)
            .device(device.clone())
            .slice_size(block_len.max(4096))
    };
    let target = Agent::new(cfg("cost-target")).expect("target agent");
    let agent = Agent::new(cfg("cost-initiator")).expect("initiator agent");
    let pool_len = (u64::from(POOL_BLOCKS) * block_len) as usize;
    let _pool = target.alloc_host(pool_len, "pool").expect("target pool");
    let local = agent.alloc_host(pool_len, "local").expect("local pool");
    let addr = target.listen("127.0.0.1:0").expect("listen");
    let peer = agent.connect(&addr.to_string()).expect("connect");
    let pool = peer
        .wait_segment_named("pool", Duration::from_secs(10))
        .expect("pool");
    // Built before the measurement: the caller's block table, as a KV cache manager holds it.
    let local_blocks: Vec<u32> = (0..blocks).map(|i| i % POOL_BLOCKS).collect();
    let remote_blocks: Vec<u32> = (0..blocks)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 7) % POOL_BLOCKS)
        .collect();
    let table = BlockTable {
        local: &local,
        local_base: 0,
        remote: pool.id,
        remote_base: 0,
        block_len,
        local_blocks: &local_blocks,
        remote_blocks: &remote_blocks,
    };
    if pools > 1 {
        // The layer-aware form: the same `blocks / pools` block indices in each of `pools`
        // pools (layers x {K, V}), each pool a 1/pools-th of the segment on each side.
        let per_pool = blocks / pools as u32;
        let pool_bytes = pool_len as u64 / pools;
        let fit = (pool_bytes / block_len) as u32;
        let lb: Vec<u32> = local_blocks[..per_pool as usize]
            .iter()
            .map(|b| b % fit)
            .collect();
        let rb: Vec<u32> = remote_blocks[..per_pool as usize]
            .iter()
            .map(|b| b % fit)
            .collect();
        let mut t = PoolTable::new(block_len, &lb, &rb);
        for p in 0..pools {
            t = t.pool(&local, p * pool_bytes, pool.id, p * pool_bytes);
        }
        measured_pools(
            &peer,
            &PoolTable::new(block_len, &lb[..8], &rb[..8]).pool(&local, 0, pool.id, 0),
        );
        let s = measured_pools(&peer, &t);
        report(blocks, block_len, &s);
        return;
    }
    // Warm-up: the same path once with a small table.
    let small = BlockTable {
        local_blocks: &local_blocks[..64.min(local_blocks.len())],
        remote_blocks: &remote_blocks[..64.min(remote_blocks.len())],
        ..table.clone()
    };
    measured(&peer, &small);
    let s = measured(&peer, &table);
    report(blocks, block_len, &s);
}

fn report(blocks: u32, block_len: u64, s: &TransferStats) {
    println!(
        "blocks={blocks} block_len={block_len} plan_us={:.0} submit_us={:.0} post_us={:.0} complete_us={:.0} slices={} runs={} plan_ns_per_block={:.1}",
        s.plan_time.as_secs_f64() * 1e6,
        s.submit_time.as_secs_f64() * 1e6,
        s.time_to_post.as_secs_f64() * 1e6,
        s.time_to_complete.as_secs_f64() * 1e6,
        s.slices,
        s.runs,
        s.plan_time.as_secs_f64() * 1e9 / f64::from(blocks.max(1)),
    );
}
