//! The `gdr doctor` command line: exit codes, output forms, replay of snapshots and trees.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The doctor's recorded machines live with the library (`gdr/tests/fixtures/doctor/`), whose
/// golden tests own them; the CLI replays the same files.
fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("gdr/tests/fixtures/doctor")
}

fn gdr(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gdr"))
        .args(args)
        .env_remove("NCCL_IB_HCA")
        .env_remove("NCCL_IB_GID_INDEX")
        .env_remove("NCCL_NET_GDR_LEVEL")
        .env("NO_COLOR", "1")
        .output()
        .expect("run gdr")
}

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn snapshot(name: &str) -> String {
    fixtures()
        .join(format!("snapshots/{name}.json"))
        .display()
        .to_string()
}

#[test]
fn failing_host_exits_1_and_names_every_cause() {
    let o = gdr(&["doctor", "--snapshot", &snapshot("dgx-a100-failing")]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let t = text(&o);
    for want in [
        "not usable on any of 2 GPU-NIC pair(s)",
        "ACS redirects peer-to-peer traffic",
        "pci=disable_acs_redir=0000:02:00.0;0000:02:01.0",
        "SYS: GPU and NIC sit on different NUMA nodes",
        "no peer-memory module",
        "modprobe nvidia-peermem",
        "port runs at 40 Gb/s; a ConnectX-6 port does up to 200 Gb/s",
        "export NCCL_IB_GID_INDEX=3",
    ] {
        assert!(t.contains(want), "missing {want:?} in:\n{t}");
    }
    assert!(
        !t.contains('\x1b'),
        "no colour when stdout is not a terminal"
    );
}

#[test]
fn fixed_host_exits_0_and_json_says_usable() {
    let o = gdr(&[
        "doctor",
        "--json",
        "--snapshot",
        &snapshot("dgx-a100-fixed"),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["gpudirect_usable"], true);
    let best: Vec<&serde_json::Value> = v["pairs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["best"] == true)
        .collect();
    assert_eq!(best.len(), 2);
    for p in best {
        assert_eq!(p["verdict"]["kind"], "usable", "{p}");
        assert_eq!(p["path"], "PIX");
    }
}

#[test]
fn dump_of_a_tree_replays_to_the_same_report() {
    let root = fixtures().join("trees/nonroot-roce");
    let root = root.to_str().unwrap();
    let dump = gdr(&["doctor", "dump", "--root", root]);
    assert_eq!(dump.status.code(), Some(0));
    let file = std::env::temp_dir().join(format!("gdr-cli-dump-{}.json", std::process::id()));
    std::fs::write(&file, &dump.stdout).unwrap();
    let direct = gdr(&["doctor", "--json", "--root", root]);
    let replay = gdr(&["doctor", "--json", "--snapshot", file.to_str().unwrap()]);
    let _ = std::fs::remove_file(&file);
    assert_eq!(direct.status.code(), Some(0));
    assert_eq!(replay.status.code(), Some(0));
    assert_eq!(text(&direct), text(&replay));
    assert!(text(&direct).contains("\"roce_v2_gid_index\": 5"));
}

#[test]
fn bad_input_exits_2_with_a_message() {
    let file = std::env::temp_dir().join(format!("gdr-cli-bad-{}.json", std::process::id()));
    std::fs::write(&file, "{\"format\": 1, \"pci\": 3}").unwrap();
    let o = gdr(&["doctor", "--snapshot", file.to_str().unwrap()]);
    let _ = std::fs::remove_file(&file);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("gdr doctor: invalid argument: snapshot"),
        "{err}"
    );
    assert!(err.contains("hint:"), "{err}");

    let o = gdr(&["doctor", "--snapshot", "/nonexistent/host.json"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("/nonexistent/host.json"));

    let o = gdr(&["doctor", "--root", "/nonexistent/root"]);
    assert_eq!(o.status.code(), Some(2));

    let o = gdr(&["doctor", "--no-such-flag"]);
    assert_eq!(o.status.code(), Some(2));
    let o = gdr(&["doctor", "--root", "/", "--snapshot", "x.json"]);
    assert_eq!(o.status.code(), Some(2), "--root and --snapshot conflict");
}

#[test]
fn help_documents_exit_status() {
    let o = gdr(&["doctor", "--help"]);
    assert_eq!(o.status.code(), Some(0));
    let t = text(&o);
    for want in [
        "--json",
        "--root",
        "--snapshot",
        "dump",
        "Exit status:",
        "NO_COLOR",
    ] {
        assert!(t.contains(want), "missing {want:?} in:\n{t}");
    }
}

/// Runs inside the Soft-RoCE VM (`cargo xtask test`): the live machine has the device named by
/// GDR_TEST_DEVICE (rxe0) with an active port whose RoCE v2 IPv4 GID is index 1.
#[test]
#[ignore = "needs an RDMA device"]
fn live_machine_shows_the_test_device() {
    let dev = std::env::var("GDR_TEST_DEVICE").unwrap_or_else(|_| "rxe0".to_string());
    let o = gdr(&["doctor", "--json"]);
    let out = text(&o);
    assert!(
        matches!(o.status.code(), Some(0) | Some(1)),
        "gdr doctor failed: {:?}\n{}\n{}",
        o.status,
        out,
        String::from_utf8_lossy(&o.stderr)
    );
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let nic = v["nics"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["name"] == dev.as_str())
        .unwrap_or_else(|| panic!("{dev} not found by gdr doctor:\n{out}"));
    assert_eq!(nic["port"], 1, "{nic}");
    assert_eq!(nic["link_layer"], "Ethernet", "{nic}");
    assert_eq!(nic["roce_v2_gid_index"], 1, "{nic}");
    let state = v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["id"] == "port.state" && f["subject"] == format!("{dev} port 1"))
        .unwrap_or_else(|| panic!("no port.state finding for {dev}:\n{out}"));
    assert_eq!(state["severity"], "ok", "{state}");
}
