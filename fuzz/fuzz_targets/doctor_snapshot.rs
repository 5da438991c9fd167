//! The doctor's snapshot reader (`gdr doctor --snapshot FILE`): JSON from another machine,
//! then everything the doctor does with it (diagnosis, JSON report, table).
#![no_main]

use gdr_doctor::topology::Snapshot;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(snap) = Snapshot::from_json(text, "fuzz input") else {
        return;
    };
    let report = gdr_doctor::diagnose(&snap);
    let json = report.to_json();
    serde_json::from_str::<serde_json::Value>(&json).expect("the report is JSON");
    let _ = report.to_table(false);
    let _ = report.to_table(true);
    let _ = report.exit_code();
    // A snapshot reads back as itself (`gdr doctor dump` then `--snapshot`).
    let again = Snapshot::from_json(&snap.to_json(), "own dump").expect("own dump reads back");
    assert_eq!(again, snap, "snapshot JSON round trip");
});
