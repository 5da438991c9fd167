//! Unit tests of the NCCL log reader.

use super::analyze::path_name;
use super::parse::{channel, distance, prefix, version_after};
use super::*;

#[test]
fn prefixes_of_launchers_and_nccl() {
    assert_eq!(
        prefix("[1,0]<stdout>:gpu6:1407:1595 [0] "),
        ("gpu6".into(), "1407".into(), Some(0))
    );
    assert_eq!(
        prefix("<cluster_name>:924:1152 [5] "),
        ("<cluster_name>".into(), "924".into(), Some(5))
    );
    assert_eq!(
        prefix(":22901:22901 [0] "),
        ("".into(), "22901".into(), Some(0))
    );
    assert_eq!(
        prefix("host:1:2 [3] misc/ibvwrap.cc:284 "),
        ("host".into(), "1".into(), Some(3))
    );
    assert_eq!(prefix("[0] "), ("".into(), "".into(), Some(0)));
    assert_eq!(prefix(""), ("".into(), "".into(), None));
}

#[test]
fn channel_lines_of_every_format() {
    let c = channel("Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0/GDRDMA")
        .unwrap()
        .unwrap();
    assert_eq!((c.channel, c.conn, c.from, c.to), (0, Some(0), 0, 1));
    assert!(c.gdrdma && c.direction == Direction::Send && c.net == "IB");
    let c = channel("Channel 01 : 2[c7000] -> 0[87000] [receive] via NET/IB/5/GDRDMA/Shared")
        .unwrap()
        .unwrap();
    assert_eq!((c.from, c.to, c.dev, c.conn), (2, 0, 5, None));
    assert!(c.gdrdma && c.direction == Direction::Receive);
    let c = channel("Channel 02/0 : 1[1] -> 3[1] [send] via NET/IB/2(5)/GDRDMA")
        .unwrap()
        .unwrap();
    assert_eq!((c.dev, c.proxy), (2, Some(5)));
    let c = channel("Ring 00 : 51[3d000] -> 56[1a000] [receive] via NET/IB/2")
        .unwrap()
        .unwrap();
    assert!(!c.gdrdma);
    let c = channel("Channel 03/0 : 15[7] -> 6[6] [send] via NET/Socket/3")
        .unwrap()
        .unwrap();
    assert_eq!(c.net, "Socket");
    assert_eq!(
        channel("Channel 00/0 : 3[1] -> 2[0] via P2P/CUMEM"),
        Ok(None)
    );
    assert_eq!(channel("Channel 00/02 :    0   1"), Err(()));
    assert_eq!(
        channel("Channel 00/0 : x -> y [send] via NET/IB/0"),
        Err(())
    );
    assert_eq!(
        channel("Channel 00/0 : 0[0] -> 1[0] [send] via NET/"),
        Err(())
    );
}

#[test]
fn distances_and_versions() {
    let d = distance("GPU Direct RDMA Disabled for GPU 42000 / HCA 0 (distance 6 > 4)").unwrap();
    assert_eq!((d.distance, d.limit, d.enabled), (6, 4, false));
    let d = distance("GPU Direct RDMA Enabled for GPU 1c000 / HCA 3 (distance 3 <= 4), read 0")
        .unwrap();
    assert!(d.enabled);
    assert_eq!(path_name(Some("2.21.5+cuda12.4"), 6), Some("PHB"));
    assert_eq!(path_name(Some("2.21.5+cuda12.4"), 4), Some("PXB"));
    assert_eq!(path_name(Some("2.7.6+cuda11.1"), 4), Some("PHB"));
    assert_eq!(path_name(Some("2.28.3"), 6), Some("P2C"));
    assert_eq!(path_name(Some("2.4.7"), 4), None);
    assert_eq!(path_name(None, 4), None);
    assert_eq!(path_name(Some("2.21.5"), 99), None);
    assert_eq!(
        version_after("NCCL version 2.4.7+cuda9.2").as_deref(),
        Some("2.4.7+cuda9.2")
    );
    assert_eq!(
        version_after("environments: NCCL version: 2.21.5, TORCH").as_deref(),
        Some("2.21.5")
    );
    assert_eq!(version_after("NCCL version x"), None);
}

#[test]
fn no_nccl_line_is_an_error_naming_the_fix() {
    let e = parse("hello\nworld\n", "t.log").unwrap_err();
    assert!(matches!(e, Error::NotAnNcclLog { lines: 2, .. }), "{e}");
    let s = e.to_string();
    assert!(s.contains("t.log") && s.contains("2 line(s)"), "{s}");
    assert!(e.hint().unwrap().contains("NCCL_DEBUG=INFO"));
    assert!(parse("", "empty").is_err());
}

#[test]
fn hostile_lines_do_not_panic_and_stay_bounded() {
    let mut text = String::new();
    // One process with more distinct connections and devices than kept.
    for i in 0..(MAX_CHANNELS + 10) {
        text.push_str(&format!(
            "one:1:1 [0] NCCL INFO Channel {i}/0 : 0[0] -> 1[0] [send] via NET/IB/0\n"
        ));
    }
    let devs: String = (0..MAX_ITEMS + 10)
        .map(|i| format!(" [{i}]d{i}:1/IB"))
        .collect();
    text.push_str(&format!(
        "one:1:1 [0] NCCL INFO NET/IB : Using{devs} ; OOB x\n"
    ));
    // More processes than kept, each repeating one connection.
    for i in 0..5000 {
        for _ in 0..2 {
            text.push_str(&format!(
                "h{i}:{i}:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0\n"
            ));
        }
    }
    text.push_str("é:é:é [é] NCCL INFO NET/IB : Using [é]é:é/é [0]ü:9999999999/RoCE ; OOB é\n");
    text.push_str(
        "x NCCL INFO GPU Direct RDMA Disabled for GPU ü / HCA ü (distance 99999999999 > 4)\n",
    );
    text.push_str("NCCL WARN\nNCCL INFO\nNCCL INFO Channel  via \nNCCL INFO Ring 1 : 1[ -> ] [send] via NET/a/1(/\n");
    text.push_str(&"x".repeat(MAX_LINE + 1));
    let log = parse(&text, "hostile").unwrap();
    assert_eq!(log.processes.len(), MAX_PROCESSES);
    assert!(log.processes_left_out > 0);
    let one = &log.processes[0];
    assert_eq!(one.host, "one");
    assert_eq!(one.channels.len(), MAX_CHANNELS);
    assert_eq!(one.ib_devices.len(), MAX_ITEMS);
    assert!(log.processes[1..].iter().all(|p| p.channels.len() == 1));
    let r = analyze(&log, None);
    assert!(!r.gdrdma_verified);
    let _ = r.to_table();
    serde_json::from_str::<serde_json::Value>(&r.to_json()).unwrap();
}
