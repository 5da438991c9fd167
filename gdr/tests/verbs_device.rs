//! Device selection on a real RDMA device: `Context::open` with NCCL_IB_HCA-style lists, the
//! remembered port, and typed errors for bad ports.
//!
//! Run in the Soft-RoCE VM by `cargo xtask test` (rxe0); on real hardware:
//! `GDR_TEST_DEVICE=mlx5_0 cargo test -p gdr --test verbs_device -- --ignored --test-threads=1`.
//! A missing device is a failure, not a skip.

use gdr::device::{Context, DeviceList, Selection};
use gdr::Error;

use gdr_test_support::device;

#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn the_readme_selection_list_opens_the_first_matching_device_and_port() {
    let dev = device();
    let ctx = Context::open(&format!("{dev}:1,^mlx5_2")).unwrap();
    assert_eq!((ctx.name(), ctx.port()), (dev.as_str(), 1));
    let (ctx2, port) =
        Context::open_selected(&Selection::parse(&format!("{dev}:1,^mlx5_2")).unwrap()).unwrap();
    assert_eq!((ctx2.name(), port, ctx2.port()), (dev.as_str(), 1, 1));
    ctx.query_port(ctx.port()).unwrap();
}

#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn exclusion_exact_and_plain_names() {
    let dev = device();
    let first = DeviceList::new().unwrap().names()[0].clone();
    let ctx = Context::open("^nothing").unwrap();
    assert_eq!(
        (ctx.name(), ctx.port()),
        (first.as_str(), 1),
        "the host's first device"
    );
    let ctx = Context::open(&format!("={dev}")).unwrap();
    assert_eq!((ctx.name(), ctx.port()), (dev.as_str(), 1));
    let ctx = Context::open(&dev).unwrap();
    assert_eq!(ctx.port(), 1, "no port given: 1");
    assert_eq!(DeviceList::new().unwrap().open(&dev).unwrap().port(), 1);
    let ctx = Context::open(&format!("{dev}:1")).unwrap();
    assert_eq!(ctx.port(), 1);
    // Excluding the test device picks another one or none, never it.
    match Context::open(&format!("^={dev}")) {
        Ok(other) => assert_ne!(other.name(), dev),
        Err(e) => assert!(matches!(e, Error::DeviceNotFound { .. }), "{e}"),
    }
    // A prefix of the name matches it (as in NCCL); the exact form does not.
    let prefix = &dev[..dev.len() - 1];
    assert!(Context::open(prefix).is_ok());
    match Context::open(&format!("={prefix}")) {
        Err(Error::DeviceNotFound {
            wanted, available, ..
        }) => {
            assert_eq!(wanted, format!("={prefix}"));
            assert!(available.contains(&dev), "{available:?}");
        }
        Ok(c) => assert_ne!(c.name(), dev, "an exact name matched a prefix"),
        Err(e) => panic!("{e}"),
    }
}

#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn bad_ports_are_typed_errors_naming_the_value() {
    let dev = device();
    let ports = Context::open(&dev)
        .unwrap()
        .query_device()
        .unwrap()
        .phys_port_cnt;
    let missing = u16::from(ports) + 1;
    let e = Context::open(&format!("{dev}:{missing}")).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
    assert!(
        e.to_string().contains(&format!("{dev} has {ports} port")),
        "{e}"
    );
    assert!(
        e.to_string()
            .contains(&format!("port {missing} does not exist")),
        "{e}"
    );
    for (spec, value) in [
        (format!("{dev}:0"), "\"0\""),
        (format!("{dev}:x"), "\"x\""),
        (format!("{dev}:256"), "\"256\""),
        (format!("{dev}:1,^mlx5_2:"), "\"\""),
    ] {
        let e = Context::open(&spec).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { .. }), "{spec}: {e}");
        assert!(e.to_string().contains(value), "{spec}: {e}");
        assert!(e.hint().is_some(), "{spec}: {e}");
    }
    // A bad port of one item does not hide a later item that matches.
    let ctx = Context::open(&format!("{dev}:{missing},{dev}")).unwrap();
    assert_eq!((ctx.name(), ctx.port()), (dev.as_str(), 1));
}
