//! Two processes: the `kv_transfer` example as the target, the initiator in this test or in a
//! second process. A 10,000-block paged WRITE and READ with every byte verified on both sides,
//! and a transfer to a killed peer failing within its deadline.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gdr_test_support::xfer::agent;
use gdr_test_support::{device, example};
use gdr_xfer::{BlockTable, Error, Op, TransferOptions};

/// Starts the target and returns it with the address it listens on.
fn target(blocks: u32, block_len: u64) -> (Child, String) {
    let mut child = Command::new(example("kv_transfer"))
        .args(["--serve", "--listen", "127.0.0.1:0", "--device", &device()])
        .args([
            "--blocks",
            &blocks.to_string(),
            "--block-len",
            &block_len.to_string(),
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let addr = line
        .split_whitespace()
        .find(|w| w.starts_with("127.0.0.1:"))
        .unwrap_or_else(|| panic!("target said {line:?}"))
        .trim_end_matches(',')
        .to_string();
    // Keep printing what the target says.
    std::thread::spawn(move || {
        for l in out.lines().map_while(Result::ok) {
            println!("  | {l}");
        }
    });
    (child, addr)
}

#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn ten_thousand_blocks_written_and_read_back_between_two_processes() {
    let (mut t, addr) = target(10_000, 4096);
    let out = Command::new(example("kv_transfer"))
        .args([
            "--connect",
            &addr,
            "--device",
            &device(),
            "--blocks",
            "10000",
            "--block-len",
            "4096",
            "--rounds",
            "2",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    print!("{text}");
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "initiator failed");
    assert_eq!(text.matches("every byte verified").count(), 2, "{text}");
    assert_eq!(
        text.matches("the target confirmed every byte").count(),
        2,
        "{text}"
    );
    let status = t.wait().unwrap();
    assert!(status.success(), "the target found wrong data: {status}");
}

#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn a_transfer_to_a_killed_peer_fails_within_its_deadline() {
    let blocks = 10_000u32;
    let (mut t, addr) = target(blocks, 4096);
    let a = agent("killer");
    let src = a.alloc_host(blocks as usize * 4096, "src").unwrap();
    let peer = a.connect(&addr).unwrap();
    let pool = peer
        .wait_segment_named("kv-pool", Duration::from_secs(10))
        .unwrap();
    let idx: Vec<u32> = (0..blocks).collect();
    let table = BlockTable {
        local: &src,
        local_base: 0,
        remote: pool.id,
        remote_base: 0,
        block_len: 4096,
        local_blocks: &idx,
        remote_blocks: &idx,
    };
    // It works while the peer lives.
    peer.transfer_blocks(Op::Write, &table, &TransferOptions::new())
        .unwrap()
        .wait(Duration::from_secs(60))
        .unwrap();
    t.kill().unwrap();
    t.wait().unwrap();
    let deadline = Duration::from_secs(3);
    let start = Instant::now();
    // Submitted right after the kill: the engine may not know yet.
    let res = peer
        .transfer_blocks(Op::Write, &table, &TransferOptions::new().timeout(deadline))
        .and_then(|x| x.wait(Duration::from_secs(60)));
    let took = start.elapsed();
    println!("transfer to the killed peer: {res:?} after {took:?} (deadline {deadline:?})");
    let e = res.expect_err("a transfer to a dead peer cannot succeed");
    assert!(
        matches!(
            e,
            Error::PeerLost { .. } | Error::Timeout { .. } | Error::SliceFailed { .. }
        ),
        "{e}"
    );
    assert!(
        took <= deadline + Duration::from_millis(500),
        "took {took:?}"
    );
    // The agent notices: the peer is gone, and so is it from the agent's list.
    let start = Instant::now();
    while a.peer("kv-target").is_some() && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(a.peer("kv-target").is_none());
    assert!(!peer.is_connected());
    println!("peer lost: {:?}", peer.lost_reason());
}
