//! The `gdr doctor` command line: exit codes, output forms, replay of snapshots and trees.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// The doctor's recorded machines live with the library (`gdr-doctor/tests/fixtures/doctor/`),
/// whose golden tests own them; the CLI replays the same files.
fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("gdr-doctor/tests/fixtures/doctor")
}

/// `gdr` with none of the NCCL variables the doctor reads, plus `env`.
fn command(args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_gdr"));
    c.args(args).env("NO_COLOR", "1");
    for v in gdr_doctor::NCCL_VARS {
        c.env_remove(v);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    c
}

fn gdr(args: &[&str]) -> Output {
    command(args, &[]).output().expect("run gdr")
}

fn gdr_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    command(args, env).output().expect("run gdr")
}

fn nccl_log(name: &str) -> String {
    fixtures()
        .join(format!("../nccl-logs/{name}.log"))
        .display()
        .to_string()
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
    assert!(err.contains("gdr doctor: invalid snapshot"), "{err}");
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
        "nccl-log",
        "--env",
        "Exit status:",
        "NO_COLOR",
        "NCCL_P2P_LEVEL",
    ] {
        assert!(t.contains(want), "missing {want:?} in:\n{t}");
    }
}

/// The five variables of the troubleshooting story (issue 16) on the failing DGX: a finding for
/// each, and the NCCL_P2P_LEVEL one says what to set instead.
#[test]
fn the_five_story_variables_each_get_a_finding() {
    let o = gdr(&[
        "doctor",
        "--json",
        "--snapshot",
        &snapshot("dgx-a100-failing"),
        "--env",
        "NCCL_IB_DISABLE=0",
        "--env",
        "NCCL_IB_HCA=mlx5_0:1",
        "--env",
        "NCCL_IB_GID_INDEX=3",
        "--env",
        "NCCL_P2P_LEVEL=5",
        "--env",
        "NCCL_DEBUG=INFO",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let find = |id: &str| -> serde_json::Value {
        v["findings"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["id"] == id)
            .unwrap_or_else(|| panic!("no {id} finding in {v}"))
            .clone()
    };
    let f = find("nccl.ib_disable");
    assert_eq!(f["severity"], "ok");
    assert!(f["message"]
        .as_str()
        .unwrap()
        .contains("0 is NCCL's default"));
    let f = find("nccl.ib_hca");
    assert_eq!(f["severity"], "ok");
    assert_eq!(f["message"], "NCCL_IB_HCA selects mlx5_0 port 1");
    let f = find("nccl.ib_gid_index");
    assert_eq!(f["severity"], "ok");
    assert!(f["message"]
        .as_str()
        .unwrap()
        .contains("index 3 is RoCE v2 IPv4 192.168.10.1"));
    assert!(f["evidence"]
        .to_string()
        .contains("NCCL >= 2.21 selects the GID itself"));
    let f = find("nccl.p2p_level");
    assert_eq!(f["severity"], "warn");
    let msg = f["message"].as_str().unwrap();
    assert!(msg.contains("does not enable GPUDirect RDMA"), "{msg}");
    assert!(
        msg.contains("GPU-to-GPU peer access inside one node"),
        "{msg}"
    );
    assert!(
        msg.contains("legacy integer, which NCCL reads as SYS"),
        "{msg}"
    );
    let fix = f["fix"].as_str().unwrap();
    assert!(fix.contains("set NCCL_NET_GDR_LEVEL instead"), "{fix}");
    assert!(
        fix.contains("NCCL_NET_GDR_LEVEL=PXB (the default)"),
        "{fix}"
    );
    let f = find("nccl.debug");
    assert_eq!(f["severity"], "ok");
    assert!(f["message"]
        .as_str()
        .unwrap()
        .contains("gdr doctor nccl-log"));
    // The table shows the same findings.
    let o = gdr(&[
        "doctor",
        "--snapshot",
        &snapshot("dgx-a100-failing"),
        "--env",
        "NCCL_P2P_LEVEL=5",
    ]);
    assert!(text(&o).contains("WARN    nccl.p2p_level"), "{}", text(&o));
}

/// Collected machines read every NCCL variable from the environment, not only the four the
/// collector has always recorded.
#[test]
fn the_environment_reaches_the_diagnosis_of_a_collected_tree() {
    let root = fixtures().join("trees/nonroot-roce");
    let o = gdr_env(
        &["doctor", "--json", "--root", root.to_str().unwrap()],
        &[
            ("NCCL_P2P_LEVEL", "SYS"),
            ("NCCL_IB_DISABLE", "1"),
            ("NCCL_NET_GDR_LEVEL", "pxb"),
        ],
    );
    let out = text(&o);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let ids: Vec<&str> = v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["id"].as_str().unwrap())
        .collect();
    for want in ["nccl.p2p_level", "nccl.ib_disable", "nccl.net_gdr_level"] {
        assert!(ids.contains(&want), "{want} missing: {ids:?}");
    }
    assert!(
        out.contains("NCCL_IB_DISABLE=1 turns the IB/RoCE transport off"),
        "{out}"
    );
    // NCCL compares level names case-sensitively: `pxb` is ignored.
    assert!(
        out.contains("NCCL_NET_GDR_LEVEL=pxb is not a level NCCL knows"),
        "{out}"
    );
    // `dump` records them too, so a capture replays with them.
    let dump = gdr_env(
        &["doctor", "dump", "--root", root.to_str().unwrap()],
        &[("NCCL_P2P_LEVEL", "SYS")],
    );
    assert!(
        text(&dump).contains("\"NCCL_P2P_LEVEL\": \"SYS\""),
        "{}",
        text(&dump)
    );
}

#[test]
fn env_flag_takes_only_nccl_variables() {
    let o = gdr(&[
        "doctor",
        "--snapshot",
        &snapshot("healthy-pix"),
        "--env",
        "PATH=/x",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("not an NCCL variable the doctor reads"));
    let o = gdr(&[
        "doctor",
        "--snapshot",
        &snapshot("healthy-pix"),
        "--env",
        "NCCL_IB_HCA",
    ]);
    assert_eq!(o.status.code(), Some(2));
}

/// `gdr doctor nccl-log` on every fixture: exit status and verdict lines.
#[test]
fn nccl_log_verdicts_of_every_fixture() {
    let cases: &[(&str, i32, &[&str])] = &[
        (
            "gdrdma-on",
            0,
            &[
                "GPUDirect RDMA: used on all 12 network connection(s)",
                "rank 0 (10-90-43-152:120890 GPU 0)",
                "  NCCL version  2.7.6+cuda11.1",
                "  verdict       GPUDirect RDMA on every network connection",
            ],
        ),
        (
            "multi-rank",
            0,
            &[
                "3 process(es) on 2 host(s)",
                "GPUDirect RDMA: used on all 9 network connection(s)",
                "rank 3 (H20-GPU-06:4015540 GPU 1)",
                "  connections   8 network (8 GDRDMA: send 4/4, receive 4/4), 1 intra-node",
            ],
        ),
        (
            "gdr-off-distance",
            1,
            &[
                "GPUDirect RDMA: not used: NCCL disabled it",
                "  verdict       no GPUDirect RDMA: network data is staged through host memory",
                "with NCCL 2.21.5 that is the path type PHB against the limit PXB",
            ],
        ),
        (
            "gdr-off-no-peermem",
            1,
            &[
                "GPUDirect RDMA: not used on any of 7 network connection(s)",
                "(no module)`: no peer-memory module (nvidia-peermem or nv_peer_mem) was loaded",
                "  fix           `modprobe nvidia-peermem`",
            ],
        ),
        (
            "gdr-off-hca",
            1,
            &[
                "rank 0 (hostname1:25668 GPU 0, 16 ranks)",
                "  devices       [0]mlx5_0:1/RoCE [1]mlx5_1:1/RoCE [RO]; OOB primaryip:10.10.10.10<0>",
                "NCCL found neither a peer-memory module",
            ],
        ),
        (
            "socket-fallback",
            1,
            &[
                "GPUDirect RDMA: not used: NCCL uses TCP sockets",
                "  network       Socket (NCCL's internal TCP transport)",
                "  verdict       no RDMA at all: NCCL uses TCP sockets",
                "`NET/IB : No device found.`",
            ],
        ),
    ];
    for (name, code, wants) in cases {
        let o = gdr(&["doctor", "nccl-log", &nccl_log(name)]);
        let t = text(&o);
        assert_eq!(o.status.code(), Some(*code), "{name}:\n{t}");
        for w in *wants {
            assert!(t.contains(w), "{name}: missing {w:?} in:\n{t}");
        }
        // The JSON says the same.
        let o = gdr(&["doctor", "nccl-log", "--json", &nccl_log(name)]);
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(v["gdrdma_verified"], *code == 0, "{name}");
    }
}

#[test]
fn nccl_log_reads_stdin_and_cross_checks_a_snapshot() {
    let log = std::fs::read(nccl_log("gdr-off-no-peermem")).unwrap();
    let mut child = command(
        &[
            "doctor",
            "nccl-log",
            "-",
            "--snapshot",
            &snapshot("dgx-a100-failing"),
        ],
        &[],
    )
    .stdin(Stdio::piped())
    .stdout(Stdio::piped())
    .spawn()
    .unwrap();
    child.stdin.take().unwrap().write_all(&log).unwrap();
    let o = child.wait_with_output().unwrap();
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    assert!(t.starts_with("gdr doctor nccl-log: stdin"), "{t}");
    assert!(
        t.contains("checked against the host view: fixture dgx-a100-failing"),
        "{t}"
    );
    assert!(
        t.contains("  host          FAIL peermem.module (host)"),
        "{t}"
    );
}

#[test]
fn nccl_log_without_nccl_lines_exits_2() {
    let file = std::env::temp_dir().join(format!("gdr-cli-nolog-{}.log", std::process::id()));
    std::fs::write(&file, "Traceback (most recent call last):\n  oops\n").unwrap();
    let o = gdr(&["doctor", "nccl-log", file.to_str().unwrap()]);
    let _ = std::fs::remove_file(&file);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("2 line(s), none printed by NCCL"), "{err}");
    assert!(
        err.contains("hint: run the job with NCCL_DEBUG=INFO"),
        "{err}"
    );
    let o = gdr(&["doctor", "nccl-log", "/nonexistent/nccl.log"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("reading NCCL log /nonexistent/nccl.log"));
    // Bytes that are not UTF-8 do not stop the reader.
    let file = std::env::temp_dir().join(format!("gdr-cli-bin-{}.log", std::process::id()));
    std::fs::write(
        &file,
        b"\xff\xfe h:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0/GDRDMA\n",
    )
    .unwrap();
    let o = gdr(&["doctor", "nccl-log", file.to_str().unwrap()]);
    let _ = std::fs::remove_file(&file);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
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
