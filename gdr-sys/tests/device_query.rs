//! Device test: open the RDMA device named by `GDR_TEST_DEVICE` with raw gdr-sys calls, query the
//! device and port 1, read the GID table, and find the RoCE v2 entry holding an IPv4-mapped
//! address at `GDR_TEST_GID_INDEX`.
//!
//! `cargo xtask test` runs it inside the Soft-RoCE VM (rxe0, GID index 1). On real hardware:
//! `GDR_TEST_DEVICE=mlx5_0 GDR_TEST_GID_INDEX=3 cargo test -p gdr-sys --test device_query -- --ignored`.
//! It fails, never skips, when the device is missing.

use std::ffi::CStr;
use std::io;
use std::mem::{size_of, zeroed};
use std::net::Ipv6Addr;
use std::ptr::NonNull;

use gdr_sys::ibv::{self, gid_type, ibv_context, ibv_device, ibv_gid_entry};
use libc::c_int;

/// `IBV_LINK_LAYER_ETHERNET` from `verbs.h` (an anonymous enum that rdma-sys does not bind).
const IBV_LINK_LAYER_ETHERNET: u8 = 2;

/// The device list from `ibv_get_device_list`, freed on drop.
struct DeviceList {
    list: NonNull<*mut ibv_device>,
    len: usize,
}

impl DeviceList {
    fn get() -> Self {
        let mut num: c_int = 0;
        // SAFETY: `num` is a valid out-pointer; the returned array (or NULL) is owned by us until
        // ibv_free_device_list, which Drop calls exactly once.
        let list = unsafe { ibv::ibv_get_device_list(&mut num) };
        let list = NonNull::new(list).unwrap_or_else(|| {
            panic!(
                "ibv_get_device_list failed: {} (is libibverbs able to see any RDMA device?)",
                io::Error::last_os_error()
            )
        });
        DeviceList {
            list,
            len: usize::try_from(num).expect("negative device count"),
        }
    }

    fn devices(&self) -> &[*mut ibv_device] {
        // SAFETY: ibv_get_device_list returned an array of `num` valid device pointers (plus a NULL
        // terminator) that lives until ibv_free_device_list in Drop, which outlives this borrow.
        unsafe { std::slice::from_raw_parts(self.list.as_ptr(), self.len) }
    }

    fn name(dev: *mut ibv_device) -> String {
        // SAFETY: `dev` comes from the live device list; ibv_get_device_name returns a
        // NUL-terminated string inside the device structure, copied out here before the list goes.
        unsafe { CStr::from_ptr(ibv::ibv_get_device_name(dev)) }
            .to_string_lossy()
            .into_owned()
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: the list came from ibv_get_device_list and is freed only here. Contexts opened
        // from it stay valid after the list is freed (libibverbs reference-counts the devices).
        unsafe { ibv::ibv_free_device_list(self.list.as_ptr()) }
    }
}

/// An open device context, closed on drop.
struct Context(NonNull<ibv_context>);

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: the context came from ibv_open_device, nothing else holds it, closed only here.
        let rc = unsafe { ibv::ibv_close_device(self.0.as_ptr()) };
        assert_eq!(rc, 0, "ibv_close_device failed");
    }
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn is_ipv4_mapped(raw: &[u8; 16]) -> bool {
    raw[..10].iter().all(|b| *b == 0) && raw[10..12] == [0xff, 0xff]
}

#[test]
#[ignore = "needs an RDMA device (run in the VM: cargo xtask test)"]
fn device_query() {
    let wanted = env("GDR_TEST_DEVICE").expect(
        "GDR_TEST_DEVICE is not set: name the RDMA device to test (cargo xtask test sets rxe0 in \
         the Soft-RoCE VM; on hardware e.g. GDR_TEST_DEVICE=mlx5_0)",
    );
    let gid_index: Option<u32> = env("GDR_TEST_GID_INDEX").map(|v| {
        v.parse()
            .unwrap_or_else(|_| panic!("GDR_TEST_GID_INDEX={v:?} is not a number"))
    });

    let list = DeviceList::get();
    let names: Vec<String> = list
        .devices()
        .iter()
        .map(|d| DeviceList::name(*d))
        .collect();
    let dev = list
        .devices()
        .iter()
        .zip(&names)
        .find(|(_, n)| **n == wanted)
        .map(|(d, _)| *d)
        .unwrap_or_else(|| {
            panic!("RDMA device {wanted:?} (GDR_TEST_DEVICE) not found; devices present: {names:?}")
        });

    // SAFETY: `dev` is a device pointer from the live list.
    let ctx = unsafe { ibv::ibv_open_device(dev) };
    let ctx = Context(NonNull::new(ctx).unwrap_or_else(|| {
        panic!(
            "ibv_open_device({wanted}) failed: {}",
            io::Error::last_os_error()
        )
    }));
    drop(list);
    let c = ctx.0.as_ptr();

    // SAFETY: ibv_device_attr is plain old data (integers and a char array): all-zero is valid.
    let mut dattr: ibv::ibv_device_attr = unsafe { zeroed() };
    // SAFETY: `c` is an open context and `dattr` a writable ibv_device_attr.
    let rc = unsafe { ibv::ibv_query_device(c, &mut dattr) };
    assert_eq!(
        rc,
        0,
        "ibv_query_device: {}",
        io::Error::from_raw_os_error(rc)
    );
    assert!(dattr.phys_port_cnt >= 1, "{wanted} has no ports");
    assert!(
        dattr.max_qp > 0 && dattr.max_cqe > 0 && dattr.max_mr_size > 0,
        "implausible device attributes"
    );

    // SAFETY: ibv_port_attr is plain old data: all-zero is valid.
    let mut pattr: ibv::ibv_port_attr = unsafe { zeroed() };
    // SAFETY: `c` is an open context, port 1 exists (phys_port_cnt >= 1), `pattr` is writable and
    // ___ibv_query_port passes its real size to the provider (the plain symbol is the compat one).
    let rc = unsafe { ibv::___ibv_query_port(c, 1, &mut pattr) };
    assert_eq!(
        rc,
        0,
        "ibv_query_port(1): {}",
        io::Error::from_raw_os_error(rc)
    );
    assert_eq!(
        pattr.state,
        ibv::ibv_port_state::IBV_PORT_ACTIVE,
        "port 1 of {wanted} is not ACTIVE"
    );
    assert_eq!(
        pattr.link_layer, IBV_LINK_LAYER_ETHERNET,
        "port 1 of {wanted} is not Ethernet (RoCE)"
    );
    let tbl_len = u32::try_from(pattr.gid_tbl_len).expect("negative gid_tbl_len");
    assert!(tbl_len > 0, "empty GID table");

    // The whole table, every port.
    let cap = tbl_len as usize * usize::from(dattr.phys_port_cnt);
    // SAFETY: ibv_gid_entry is plain old data (a byte union and integers): all-zero is valid.
    let mut table: Vec<ibv_gid_entry> = (0..cap).map(|_| unsafe { zeroed() }).collect();
    // SAFETY: `table` has room for `cap` entries of the size we pass; the call writes at most
    // `cap` of them and returns how many.
    let n = unsafe {
        ibv::_ibv_query_gid_table(c, table.as_mut_ptr(), cap, 0, size_of::<ibv_gid_entry>())
    };
    assert!(
        n >= 0,
        "ibv_query_gid_table: {}",
        io::Error::from_raw_os_error(-n as i32)
    );
    table.truncate(n as usize);
    let describe = |e: &ibv_gid_entry| {
        // SAFETY: every bit pattern is a valid [u8; 16]; `raw` is the union's byte view.
        let raw = unsafe { e.gid.raw };
        format!(
            "port {} index {} type {} ifindex {} {}",
            e.port_num,
            e.gid_index,
            e.gid_type,
            e.ndev_ifindex,
            Ipv6Addr::from(raw)
        )
    };
    for e in &table {
        println!("gid {}", describe(e));
    }
    let roce_v2_ipv4 = |e: &ibv_gid_entry| {
        // SAFETY: as above, reading the byte view of the GID union.
        let raw = unsafe { e.gid.raw };
        e.port_num == 1 && e.gid_type == gid_type::IBV_GID_TYPE_ROCE_V2 && is_ipv4_mapped(&raw)
    };
    let found: Vec<&ibv_gid_entry> = table.iter().filter(|e| roce_v2_ipv4(e)).collect();
    assert!(
        !found.is_empty(),
        "no RoCE v2 GID with an IPv4-mapped address on port 1 of {wanted} (is an IPv4 address \
         configured on its netdev?)"
    );

    let index = gid_index.unwrap_or(found[0].gid_index);
    // One entry on its own, with the same answer as the table.
    // SAFETY: ibv_gid_entry is plain old data: all-zero is valid.
    let mut entry: ibv_gid_entry = unsafe { zeroed() };
    // SAFETY: `c` is open, port 1 exists, `index` < gid_tbl_len is checked by the provider (it
    // returns an error otherwise), `entry` is writable and its size is passed.
    let rc =
        unsafe { ibv::_ibv_query_gid_ex(c, 1, index, &mut entry, 0, size_of::<ibv_gid_entry>()) };
    assert_eq!(
        rc,
        0,
        "ibv_query_gid_ex(port 1, index {index}): {}",
        io::Error::from_raw_os_error(rc)
    );
    println!("GDR_TEST_GID_INDEX {index}: {}", describe(&entry));
    assert!(
        roce_v2_ipv4(&entry),
        "GID index {index} (GDR_TEST_GID_INDEX) of {wanted} is not RoCE v2 with an IPv4-mapped \
         address: {}; candidates: {:?}",
        describe(&entry),
        found.iter().map(|e| e.gid_index).collect::<Vec<_>>()
    );
    assert!(
        found.iter().any(|e| e.gid_index == index),
        "ibv_query_gid_table and ibv_query_gid_ex disagree about index {index}"
    );
    if let Some(addr) = env("GDR_TEST_ADDR") {
        // SAFETY: reading the byte view of the GID union.
        let raw = unsafe { entry.gid.raw };
        assert_eq!(
            Ipv6Addr::from(raw).to_ipv4_mapped().map(|a| a.to_string()),
            Some(addr.clone()),
            "GID index {index} does not hold GDR_TEST_ADDR={addr}"
        );
    }
    drop(ctx);
}
