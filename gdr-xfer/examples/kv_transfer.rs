//! A KV-cache hand-over between two processes with gdr-xfer: the initiator writes a block
//! table (paged form) into the target's pool with a notification, the target checks every
//! byte the moment the notification arrives, and the initiator reads the blocks back and checks
//! them too.
//!
//! ```text
//! kv_transfer --serve [--listen 0.0.0.0:7100] [--device rxe0] [--blocks 10000] [--block-len 16384]
//! kv_transfer --connect HOST:7100 [--device rxe0] [--blocks 10000] [--block-len 16384] [--rounds 1]
//! ```
//!
//! With the feature `etcd`, peers find each other by name instead: `--etcd 127.0.0.1:2379` on
//! both sides (the target publishes itself as `kv-target`, with a lease of `--ttl-ms`), and the
//! initiator gives `--connect-name kv-target` instead of `--connect`. The target then listens
//! on an address peers can reach (`--listen 10.0.0.1:7100`, not `0.0.0.0`): that is what it
//! publishes.
//!
//! With the feature `metrics`, `--metrics 127.0.0.1:9100` serves the engine's metrics to
//! Prometheus at `http://127.0.0.1:9100/metrics` (`gdr_xfer::metrics` lists them).
//!
//! Block `i` of the initiator's pool goes to block `(i * 7919 + 13) % blocks` of the target's
//! (a permutation whenever 7919 does not divide `blocks`), so nothing merges and every block is
//! its own work request.

use std::time::{Duration, Instant};

use gdr_xfer::{Agent, AgentConfig, BlockTable, Op, TransferOptions};

struct Args {
    serve: bool,
    listen: String,
    connect: Option<String>,
    device: String,
    blocks: u32,
    block_len: u64,
    rounds: u32,
    etcd: Option<String>,
    connect_name: Option<String>,
    ttl_ms: u64,
    metrics: Option<std::net::SocketAddr>,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        serve: false,
        listen: "0.0.0.0:7100".into(),
        connect: None,
        device: String::new(),
        blocks: 10_000,
        block_len: 16 * 1024,
        rounds: 1,
        etcd: None,
        connect_name: None,
        ttl_ms: 10_000,
        metrics: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--serve" => a.serve = true,
            "--listen" => a.listen = value()?,
            "--connect" => a.connect = Some(value()?),
            "--device" | "-d" => a.device = value()?,
            "--blocks" => a.blocks = value()?.parse().map_err(|e| format!("--blocks: {e}"))?,
            "--block-len" => {
                a.block_len = value()?.parse().map_err(|e| format!("--block-len: {e}"))?
            }
            "--rounds" => a.rounds = value()?.parse().map_err(|e| format!("--rounds: {e}"))?,
            "--etcd" => a.etcd = Some(value()?),
            "--connect-name" => a.connect_name = Some(value()?),
            "--ttl-ms" => a.ttl_ms = value()?.parse().map_err(|e| format!("--ttl-ms: {e}"))?,
            "--metrics" => {
                a.metrics = Some(value()?.parse().map_err(|e| format!("--metrics: {e}"))?)
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if a.blocks == 0 || a.blocks.is_multiple_of(7919) {
        return Err("--blocks must be positive and not a multiple of 7919".into());
    }
    if a.serve == (a.connect.is_some() || a.connect_name.is_some()) {
        return Err("give --serve, --connect HOST:PORT or --connect-name NAME".into());
    }
    if a.connect_name.is_some() && a.etcd.is_none() {
        return Err("--connect-name needs --etcd ENDPOINT".into());
    }
    Ok(a)
}

/// Where initiator block `i` goes.
fn target_block(i: u32, blocks: u32) -> u32 {
    ((u64::from(i) * 7919 + 13) % u64::from(blocks)) as u32
}

/// The bytes of initiator block `i` in round `round`: every 8-byte word differs by block,
/// position and round.
fn block_bytes(i: u32, round: u32, len: usize) -> Vec<u8> {
    let seed = (u64::from(i) << 32 | u64::from(round)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let mut v = Vec::with_capacity(len);
    for w in 0..len.div_ceil(8) as u64 {
        v.extend_from_slice(&(seed ^ w.wrapping_mul(0xff51_afd7_ed55_8ccd)).to_le_bytes());
    }
    v.truncate(len);
    v
}

fn serve(a: &Args) -> gdr_xfer::Result<()> {
    let agent = Agent::new(AgentConfig::new("kv-target").device(a.device.clone()))?;
    let len = u64::from(a.blocks) * a.block_len;
    let pool = agent.alloc_host(len as usize, "kv-pool")?;
    // Rounds verified so far, for the initiator to read (one-sided) before its next round.
    let status = agent.alloc_host(8, "kv-status")?;
    let addr = agent.listen(&a.listen)?;
    let _directory = publish(&agent, a, addr)?;
    println!(
        "target: listening on {addr}, pool of {} blocks of {} bytes",
        a.blocks, a.block_len
    );
    loop {
        let Some(n) = agent.wait_notification(Duration::from_secs(3600))? else {
            continue;
        };
        let text = String::from_utf8_lossy(&n.data).into_owned();
        if text == "done" {
            println!("target: done");
            return Ok(());
        }
        let Some(round) = text
            .strip_prefix("written round ")
            .and_then(|r| r.parse::<u32>().ok())
        else {
            println!("target: unknown notification {text:?}");
            continue;
        };
        // Check every block now: the notification promises the data is there.
        let t = Instant::now();
        let data = pool.to_vec(0, len as usize)?;
        let bl = a.block_len as usize;
        let bad = (0..a.blocks).find(|&i| {
            let at = target_block(i, a.blocks) as usize * bl;
            data[at..at + bl] != block_bytes(i, round, bl)[..]
        });
        match bad {
            None => {
                println!(
                    "target: round {round}: notification from {} after all {} blocks ({} bytes) landed, every byte verified in {:?}",
                    n.peer, a.blocks, len, t.elapsed()
                );
                status.write(0, &u64::from(round + 1).to_le_bytes())?;
            }
            Some(i) => {
                println!(
                    "target: round {round}: block {i} is wrong when the notification arrived: FAIL"
                );
                std::process::exit(1);
            }
        }
    }
}

/// Publishes the target in etcd when `--etcd` is given; the directory must live as long as
/// the agent should stay findable.
#[cfg(feature = "etcd")]
fn publish(
    agent: &Agent,
    a: &Args,
    addr: std::net::SocketAddr,
) -> gdr_xfer::Result<Option<std::sync::Arc<gdr_xfer::directory::EtcdDirectory>>> {
    let Some(ep) = &a.etcd else { return Ok(None) };
    let dir = std::sync::Arc::new(gdr_xfer::directory::EtcdDirectory::connect(
        std::slice::from_ref(ep),
        gdr_xfer::directory::DEFAULT_PREFIX,
        Duration::from_millis(a.ttl_ms),
        Duration::from_secs(5),
    )?);
    agent.publish(dir.clone(), addr)?;
    println!("target: published as {} in etcd at {ep}", agent.name());
    Ok(Some(dir))
}

#[cfg(not(feature = "etcd"))]
fn publish(_: &Agent, a: &Args, _: std::net::SocketAddr) -> gdr_xfer::Result<Option<()>> {
    match &a.etcd {
        Some(_) => Err(gdr_xfer::Error::invalid(
            "--etcd needs the feature etcd",
            "build with --features etcd",
        )),
        None => Ok(None),
    }
}

/// Connects by address, or by name through etcd.
fn connect(agent: &Agent, a: &Args) -> gdr_xfer::Result<gdr_xfer::Peer> {
    if let Some(addr) = &a.connect {
        return agent.connect(addr);
    }
    #[cfg(feature = "etcd")]
    if let (Some(ep), Some(name)) = (&a.etcd, &a.connect_name) {
        let dir = std::sync::Arc::new(gdr_xfer::directory::EtcdDirectory::connect(
            std::slice::from_ref(ep),
            gdr_xfer::directory::DEFAULT_PREFIX,
            Duration::from_millis(a.ttl_ms),
            Duration::from_secs(5),
        )?);
        return agent.connect_named(&dir, name, Duration::from_secs(10));
    }
    Err(gdr_xfer::Error::invalid(
        "--connect-name needs the feature etcd",
        "build with --features etcd",
    ))
}

fn initiate(a: &Args) -> gdr_xfer::Result<()> {
    let agent = Agent::new(AgentConfig::new("kv-initiator").device(a.device.clone()))?;
    let len = u64::from(a.blocks) * a.block_len;
    let src = agent.alloc_host(len as usize, "src")?;
    let back = agent.alloc_host(len as usize, "back")?;
    let peer = connect(&agent, a)?;
    let pool = peer.wait_segment_named("kv-pool", Duration::from_secs(10))?;
    let status = peer.wait_segment_named("kv-status", Duration::from_secs(10))?;
    let verdict = agent.alloc_host(8, "verdict")?;
    let local: Vec<u32> = (0..a.blocks).collect();
    let remote: Vec<u32> = local.iter().map(|&i| target_block(i, a.blocks)).collect();
    let bl = a.block_len as usize;
    for round in 0..a.rounds {
        for i in 0..a.blocks {
            src.write(u64::from(i) * a.block_len, &block_bytes(i, round, bl))?;
        }
        let table = BlockTable::new(&src, &local, pool.id, &remote, a.block_len);
        let opts = TransferOptions::new()
            .timeout(Duration::from_secs(120))
            .notify(format!("written round {round}"));
        let w = peer
            .transfer_blocks(Op::Write, &table, &opts)?
            .wait(Duration::from_secs(120))?;
        // Read the same blocks back into `back`, at the initiator's positions.
        let r = peer
            .transfer_blocks(
                Op::Read,
                &table.clone().with_local(&back),
                &TransferOptions::new().timeout(Duration::from_secs(120)),
            )?
            .wait(Duration::from_secs(120))?;
        let ok = back.to_vec(0, len as usize)? == src.to_vec(0, len as usize)?;
        println!(
            "initiator: round {round}: WRITE {} blocks ({} bytes, {} slices) in {:?} ({:.2} Gb/s), posting took {:?}; READ back in {:?}: {}",
            w.descriptors,
            w.bytes,
            w.slices,
            w.time_to_complete,
            w.bytes as f64 * 8.0 / w.time_to_complete.as_secs_f64() / 1e9,
            w.time_to_post,
            r.time_to_complete,
            if ok { "every byte verified" } else { "MISMATCH" }
        );
        if !ok {
            std::process::exit(1);
        }
        // Wait until the target checked this round (it writes the count into kv-status), so
        // the next round does not overwrite blocks it is still reading.
        let start = Instant::now();
        loop {
            peer.read(
                &[gdr_xfer::Desc::new(&verdict, 0, status.id, 0, 8)],
                &TransferOptions::new(),
            )?
            .wait(Duration::from_secs(30))?;
            let mut word = [0u8; 8];
            verdict.read(0, &mut word)?;
            if u64::from_le_bytes(word) > u64::from(round) {
                break;
            }
            if start.elapsed() > Duration::from_secs(120) {
                eprintln!("kv_transfer: the target did not confirm round {round}");
                std::process::exit(1);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        println!("initiator: round {round}: the target confirmed every byte");
    }
    peer.write(
        &[gdr_xfer::Desc::new(&src, 0, pool.id, 0, 1)],
        &TransferOptions::new().notify("done"),
    )?
    .wait(Duration::from_secs(30))?;
    Ok(())
}

/// With `--metrics ADDR` (feature `metrics`), serves the engine's metrics to Prometheus at
/// `http://ADDR/metrics`.
#[cfg(feature = "metrics")]
fn serve_metrics(a: &Args) -> Result<(), String> {
    let Some(addr) = a.metrics else { return Ok(()) };
    metrics_exporter_prometheus::PrometheusBuilder::new()
        .with_http_listener(addr)
        .install()
        .map_err(|e| format!("--metrics {addr}: {e}"))?;
    println!("metrics: http://{addr}/metrics");
    Ok(())
}

#[cfg(not(feature = "metrics"))]
fn serve_metrics(a: &Args) -> Result<(), String> {
    match a.metrics {
        Some(_) => Err("--metrics needs the feature metrics".into()),
        None => Ok(()),
    }
}

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("kv_transfer: {e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = serve_metrics(&args) {
        eprintln!("kv_transfer: {e}");
        std::process::exit(2);
    }
    let r = if args.serve {
        serve(&args)
    } else {
        initiate(&args)
    };
    if let Err(e) = r {
        eprintln!("kv_transfer: {e}");
        std::process::exit(1);
    }
}
