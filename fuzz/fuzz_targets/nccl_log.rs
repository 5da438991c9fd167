//! The NCCL log reader (`gdr doctor nccl-log FILE`): any bytes, as the CLI reads them (lossy
//! UTF-8), then everything the command does with the log (analysis alone and against a host
//! report, JSON, table).
#![no_main]

use gdr_doctor::nccl_log::{analyze, parse};
use gdr_doctor::topology::Snapshot;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let Ok(log) = parse(&text, "fuzz input") else {
        return;
    };
    assert!(log.nccl_lines > 0 && log.nccl_lines <= log.lines);
    let host = gdr_doctor::diagnose(&Snapshot::new("empty host"));
    for report in [analyze(&log, None), analyze(&log, Some(&host))] {
        assert!(report.gdrdma_connections <= report.net_connections);
        assert_eq!(report.exit_code() == 0, report.gdrdma_verified);
        let json = report.to_json();
        serde_json::from_str::<serde_json::Value>(&json).expect("the report is JSON");
        let _ = report.to_table();
    }
});
