//! The NCCL-style device selection parser (`NCCL_IB_HCA` syntax, gdr::device::Selection).
#![no_main]

use gdr::device::Selection;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let Ok(sel) = Selection::parse(&text) else {
        return;
    };
    // Parsing is deterministic and the matcher takes any device name and port.
    assert_eq!(Selection::parse(&text).expect("parses twice"), sel);
    // Devices as (name, number of ports): fixed names, and names taken from the input itself
    // (they exercise the prefix and exact rules).
    let mut devices: Vec<(&str, u8)> = vec![
        ("mlx5_0", 1),
        ("mlx5_1", 2),
        ("mlx5_10", 255),
        ("rxe0", 0),
        ("", 1),
        ("\u{0}", 3),
        ("é", 1),
    ];
    for word in text.split([',', ':', '^', '=']) {
        devices.push((word.trim(), 2));
    }
    for &(name, _) in &devices {
        for port in [0u8, 1, 2, 255] {
            let _ = sel.allows(name, port);
        }
    }
    if let Some((name, port)) = sel.first_match(&devices) {
        let ports = devices
            .iter()
            .find(|(n, _)| *n == name)
            .map(|&(_, p)| p)
            .expect("first_match chose a device of the list");
        assert!(
            (1..=ports).contains(&port),
            "first_match chose {name}:{port}, which has ports 1..={ports}"
        );
        assert!(
            sel.allows(&name, port),
            "first_match chose {name}:{port}, which the selection does not allow"
        );
    }
    let _ = format!("{sel:?}");
});
