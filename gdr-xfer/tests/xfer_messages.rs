//! Messages without a transfer (`Peer::send_notification`, NIXL's genNotif): a decode agent
//! asks a prefill agent for 2,000 blocks in one 16 KiB message; sizes are the receiver's; a
//! receiver that does not take its messages holds the sender back without losing any.

use std::time::{Duration, Instant};

use gdr_test_support::xfer::{agent_with, connected};
use gdr_xfer::{AgentConfig, Error, TransferOptions};

const WAIT: Duration = Duration::from_secs(60);

#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn a_request_for_two_thousand_blocks_fits_one_message_sized_by_the_receiver() {
    let (decode, prefill, to_prefill, _to_decode) = connected(
        agent_with(AgentConfig::new("m-decode").notify_max(16 << 10)),
        agent_with(AgentConfig::new("m-prefill").notify_max(16 << 10)),
    );
    // 2,000 block numbers of 8 bytes: 16,000 bytes, four times the old notification limit.
    let blocks: Vec<u8> = (0..2000u64)
        .flat_map(|b| (b * 7919).to_le_bytes())
        .collect();
    let t = to_prefill
        .send_notification(blocks.clone(), &TransferOptions::new())
        .unwrap();
    let stats = t.wait(WAIT).unwrap();
    assert_eq!(stats.bytes, 0, "a message moves no data");
    let n = prefill
        .wait_notification(WAIT)
        .unwrap()
        .expect("the request");
    assert_eq!(n.peer, "m-decode");
    assert_eq!(n.data, blocks);
    // Bad messages are refused before anything is sent, each with its reason.
    let too_long = vec![0u8; (16 << 10) + 1];
    for (what, r) in [
        (
            "longer than the receiver takes",
            to_prefill.send_notification(too_long, &TransferOptions::new()),
        ),
        (
            "empty",
            to_prefill.send_notification(Vec::new(), &TransferOptions::new()),
        ),
        (
            "with a notification of its own",
            to_prefill.send_notification(b"x".to_vec(), &TransferOptions::new().notify("y")),
        ),
    ] {
        match r {
            Err(Error::TooLarge { len, max, .. }) if what.starts_with("longer") => {
                assert_eq!((len, max), ((16 << 10) + 1, 16 << 10), "{what}")
            }
            Err(Error::InvalidArgument { .. }) if !what.starts_with("longer") => {}
            other => panic!("a message {what}: {other:?}"),
        }
    }
    assert!(prefill
        .wait_notification(Duration::from_millis(200))
        .unwrap()
        .is_none());
    drop(decode);
}

#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn a_receiver_that_does_not_take_its_messages_holds_the_sender_back_and_loses_none() {
    // The receiver keeps 4 for the application and has 4 receive slots: past 8, the sender's
    // NIC retries (receiver not ready) until the application takes some.
    let (sender, receiver, to_receiver, _) = connected(
        agent_with(AgentConfig::new("m-fast")),
        agent_with(
            AgentConfig::new("m-slow")
                .notify_queue(4)
                .notify_slots(4)
                .notify_max(1024),
        ),
    );
    let sent: Vec<_> = (0..40u32)
        .map(|i| {
            to_receiver
                .send_notification(format!("msg {i}"), &TransferOptions::new().timeout(WAIT))
                .unwrap()
        })
        .collect();
    // Nothing is taken for a while: at most the queue plus the slots are held.
    let end = Instant::now() + Duration::from_millis(500);
    while Instant::now() < end {
        assert!(receiver.pending_notifications() <= 8);
        std::thread::sleep(Duration::from_millis(20));
    }
    println!(
        "held by the receiver while nobody took them: {}",
        receiver.pending_notifications()
    );
    let mut got = Vec::new();
    while got.len() < 40 {
        let n = receiver
            .wait_notification(WAIT)
            .unwrap()
            .expect("every message arrives once taken");
        got.push(String::from_utf8(n.data).unwrap());
    }
    for t in sent {
        t.wait(WAIT).unwrap();
    }
    got.sort_by_key(|s| s[4..].parse::<u32>().unwrap());
    let want: Vec<String> = (0..40).map(|i| format!("msg {i}")).collect();
    assert_eq!(got, want, "none lost, none twice");
    drop(sender);
}
