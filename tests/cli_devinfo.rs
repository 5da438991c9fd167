//! `gdr devinfo`: argument errors on any host; the live device in the Soft-RoCE VM.

use std::process::Command;

fn gdr(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_gdr"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_malformed_selection_is_a_usage_error() {
    let (code, _, err) = gdr(&["devinfo", "-d", "mlx5_0:x"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("port \"x\" of \"mlx5_0\" is not a number"),
        "{err}"
    );
    assert!(err.contains("hint: write NAME or NAME:PORT"), "{err}");
}

#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn live_device_ports_and_chosen_gid() {
    let dev = std::env::var("GDR_TEST_DEVICE").expect("GDR_TEST_DEVICE is not set");
    let (code, out, err) = gdr(&["devinfo", "-d", &format!("={dev}:1"), "--json"]);
    assert_eq!(code, Some(0), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v[0]["name"], dev.as_str());
    let port = &v[0]["ports"][0];
    assert_eq!(port["state"], "Active");
    assert_eq!(port["link_layer"], "Ethernet");
    if let Ok(i) = std::env::var("GDR_TEST_GID_INDEX") {
        assert_eq!(port["chosen_gid_index"], i.parse::<u64>().unwrap());
    }
    let chosen = port["chosen_gid_index"].as_u64().expect("a GID was chosen");
    let gid = port["gids"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["index"] == chosen)
        .unwrap();
    assert_eq!(gid["kind"], "RoCE v2");
    assert!(gid["ipv4"].is_string(), "{gid}");

    let (code, _, err) = gdr(&["devinfo", "-d", "^"]);
    assert_eq!(
        code,
        Some(0),
        "an empty exclusion list selects everything: {err}"
    );
    let (code, _, err) = gdr(&["devinfo", "-d", &format!("^{dev}")]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("no RDMA device matches") && err.contains(&dev),
        "{err}"
    );
}
