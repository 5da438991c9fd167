//! Opens an RDMA device through raw gdr-sys calls and prints its attributes, every port's
//! attributes and the GID table.
//!
//! ```text
//! cargo run -p gdr-sys --example query_device [DEVICE]
//! ```
//!
//! DEVICE defaults to `GDR_TEST_DEVICE`, then to the first device. `cargo xtask demo` runs it in the
//! Soft-RoCE VM against rxe0.

use std::error::Error;
use std::ffi::CStr;
use std::io;
use std::mem::{size_of, zeroed};
use std::net::Ipv6Addr;

use gdr_sys::ibv::{self, gid_type, ibv_gid_entry};
use libc::c_int;

fn main() -> Result<(), Box<dyn Error>> {
    let wanted = std::env::args().nth(1).or_else(|| {
        std::env::var("GDR_TEST_DEVICE")
            .ok()
            .filter(|s| !s.is_empty())
    });

    let mut num: c_int = 0;
    // SAFETY: `num` is a valid out-pointer; the list is freed below with ibv_free_device_list.
    let list = unsafe { ibv::ibv_get_device_list(&mut num) };
    if list.is_null() {
        return Err(format!("ibv_get_device_list: {}", io::Error::last_os_error()).into());
    }
    // SAFETY: the list holds `num` valid device pointers until it is freed, after this use.
    let devices = unsafe { std::slice::from_raw_parts(list, num as usize) };
    let name_of = |d: *mut ibv::ibv_device| {
        // SAFETY: `d` is in the live list; the name is a NUL-terminated string inside it, copied.
        unsafe { CStr::from_ptr(ibv::ibv_get_device_name(d)) }
            .to_string_lossy()
            .into_owned()
    };
    let names: Vec<String> = devices.iter().map(|d| name_of(*d)).collect();
    println!("devices: {}", names.join(" "));
    let found = match &wanted {
        Some(w) => devices
            .iter()
            .zip(&names)
            .find(|(_, n)| *n == w)
            .map(|(d, n)| (*d, n.clone())),
        None => devices.first().map(|d| (*d, name_of(*d))),
    };
    let Some((dev, name)) = found else {
        // SAFETY: freeing the list from ibv_get_device_list once; `devices` is not used after.
        unsafe { ibv::ibv_free_device_list(list) };
        return Err(format!("no RDMA device {}", wanted.as_deref().unwrap_or("at all")).into());
    };
    // SAFETY: `dev` is in the live list.
    let ctx = unsafe { ibv::ibv_open_device(dev) };
    // SAFETY: the list is freed once; an open context stays valid without it.
    unsafe { ibv::ibv_free_device_list(list) };
    if ctx.is_null() {
        return Err(format!("ibv_open_device({name}): {}", io::Error::last_os_error()).into());
    }
    let result = print_device(ctx, &name);
    // SAFETY: `ctx` came from ibv_open_device and is closed once, after its last use.
    unsafe { ibv::ibv_close_device(ctx) };
    result
}

fn print_device(ctx: *mut ibv::ibv_context, name: &str) -> Result<(), Box<dyn Error>> {
    // SAFETY: ibv_device_attr is plain old data: all-zero is valid.
    let mut a: ibv::ibv_device_attr = unsafe { zeroed() };
    // SAFETY: `ctx` is open, `a` is writable.
    let rc = unsafe { ibv::ibv_query_device(ctx, &mut a) };
    if rc != 0 {
        return Err(format!("ibv_query_device: {}", io::Error::from_raw_os_error(rc)).into());
    }
    // SAFETY: fw_ver is a NUL-terminated char array filled by the provider.
    let fw = unsafe { CStr::from_ptr(a.fw_ver.as_ptr()) }.to_string_lossy();
    let guid = u64::from_be(a.node_guid);
    println!("device {name}");
    println!("  fw_ver            {fw}");
    println!(
        "  node_guid         {:04x}:{:04x}:{:04x}:{:04x}",
        guid >> 48,
        (guid >> 32) & 0xffff,
        (guid >> 16) & 0xffff,
        guid & 0xffff
    );
    println!(
        "  vendor_id         {:#x} part {}",
        a.vendor_id, a.vendor_part_id
    );
    println!("  phys_port_cnt     {}", a.phys_port_cnt);
    println!("  max_mr_size       {:#x}", a.max_mr_size);
    println!(
        "  max_qp            {}  max_qp_wr {}",
        a.max_qp, a.max_qp_wr
    );
    println!("  max_cq            {}  max_cqe {}", a.max_cq, a.max_cqe);
    println!("  max_mr            {}  max_pd {}", a.max_mr, a.max_pd);
    println!(
        "  max_sge           {}  max_qp_rd_atom {}",
        a.max_sge, a.max_qp_rd_atom
    );

    let mut total = 0usize;
    for port in 1..=a.phys_port_cnt {
        // SAFETY: ibv_port_attr is plain old data: all-zero is valid.
        let mut p: ibv::ibv_port_attr = unsafe { zeroed() };
        // SAFETY: `ctx` is open, `port` exists, `p` is writable (real size passed to the provider).
        let rc = unsafe { ibv::___ibv_query_port(ctx, port, &mut p) };
        if rc != 0 {
            return Err(format!(
                "ibv_query_port({port}): {}",
                io::Error::from_raw_os_error(rc)
            )
            .into());
        }
        // SAFETY: ibv_port_state_str returns a static NUL-terminated string for any value.
        let state = unsafe { CStr::from_ptr(ibv::ibv_port_state_str(p.state)) }.to_string_lossy();
        let link = match p.link_layer {
            1 => "InfiniBand",
            2 => "Ethernet",
            _ => "unspecified",
        };
        println!("port {port}");
        println!("  state             {state}");
        println!("  link_layer        {link}");
        println!(
            "  max_mtu           {}  active_mtu {}",
            mtu(p.max_mtu),
            mtu(p.active_mtu)
        );
        println!("  gid_tbl_len       {}", p.gid_tbl_len);
        println!("  lid               {}  sm_lid {}", p.lid, p.sm_lid);
        total += p.gid_tbl_len.max(0) as usize;
    }

    // SAFETY: ibv_gid_entry is plain old data: all-zero is valid.
    let mut table: Vec<ibv_gid_entry> = (0..total).map(|_| unsafe { zeroed() }).collect();
    // SAFETY: `table` has room for `total` entries of the size passed.
    let n = unsafe {
        ibv::_ibv_query_gid_table(
            ctx,
            table.as_mut_ptr(),
            total,
            0,
            size_of::<ibv_gid_entry>(),
        )
    };
    if n < 0 {
        return Err(format!(
            "ibv_query_gid_table: {}",
            io::Error::from_raw_os_error(-n as i32)
        )
        .into());
    }
    table.truncate(n as usize);
    println!("GID table ({n} valid entries)");
    for e in &table {
        // SAFETY: every bit pattern is a valid [u8; 16]: the byte view of the GID union.
        let raw = unsafe { e.gid.raw };
        let kind = match e.gid_type {
            gid_type::IBV_GID_TYPE_ROCE_V2 => "RoCE v2",
            gid_type::IBV_GID_TYPE_ROCE_V1 => "RoCE v1",
            _ => "IB",
        };
        println!(
            "  port {} index {:<3} {:<8} ifindex {:<3} {}",
            e.port_num,
            e.gid_index,
            kind,
            e.ndev_ifindex,
            Ipv6Addr::from(raw)
        );
    }
    Ok(())
}

fn mtu(m: ibv::ibv_mtu::Type) -> u32 {
    if (1..=5).contains(&m) {
        128 << m
    } else {
        0
    }
}
