//! `gdr devinfo`: what `ibv_devinfo` and `show_gids` print, through gdr's own API, plus the GID
//! gdr (and NCCL) would pick on each port.

use clap::Args;
use serde::Serialize;

use gdr::device::{pick_roce_gid, Context, DeviceList, GidType, LinkLayer, Selection};

/// Arguments of `gdr devinfo`.
#[derive(Debug, Args)]
pub struct DevinfoArgs {
    /// Devices to show: a name, `name:port`, or an NCCL-style list (`mlx5_0:1,^mlx5_1`, `=exact`).
    #[arg(short = 'd', long, default_value = "")]
    device: String,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Serialize)]
struct DeviceOut {
    name: String,
    guid: String,
    fw_ver: String,
    vendor_id: String,
    vendor_part_id: u32,
    max_qp: i32,
    max_qp_wr: i32,
    max_sge: i32,
    max_cqe: i32,
    max_mr_size: u64,
    atomics: bool,
    ports: Vec<PortOut>,
}

#[derive(Debug, Serialize)]
struct PortOut {
    port: u8,
    state: String,
    link_layer: String,
    active_mtu: u32,
    max_mtu: u32,
    rate_gbps: Option<f64>,
    lid: u16,
    gids: Vec<GidOut>,
    /// The GID index gdr and NCCL (`NCCL_IB_GID_INDEX=-1`) would use.
    chosen_gid_index: Option<u32>,
}

#[derive(Debug, Serialize)]
struct GidOut {
    index: u32,
    gid: String,
    kind: String,
    ipv4: Option<String>,
}

fn collect(sel: &Selection) -> gdr::Result<Vec<DeviceOut>> {
    let list = DeviceList::new()?;
    let mut out = Vec::new();
    for info in list.devices() {
        let ctx = list.open(&info.name)?;
        let attr = ctx.query_device()?;
        let mut ports = Vec::new();
        for port in 1..=attr.phys_port_cnt {
            if !sel.allows(&info.name, port) {
                continue;
            }
            ports.push(port_out(&ctx, port)?);
        }
        if ports.is_empty() {
            continue;
        }
        out.push(DeviceOut {
            name: info.name,
            guid: info.guid,
            fw_ver: attr.fw_ver,
            vendor_id: format!("{:#06x}", attr.vendor_id),
            vendor_part_id: attr.vendor_part_id,
            max_qp: attr.max_qp,
            max_qp_wr: attr.max_qp_wr,
            max_sge: attr.max_sge,
            max_cqe: attr.max_cqe,
            max_mr_size: attr.max_mr_size,
            atomics: attr.atomics,
            ports,
        });
    }
    Ok(out)
}

fn port_out(ctx: &Context, port: u8) -> gdr::Result<PortOut> {
    let p = ctx.query_port(port)?;
    let table = ctx.gid_table(port)?;
    let chosen = match p.link_layer {
        LinkLayer::InfiniBand => table.iter().find(|e| e.index == 0).map(|e| e.index),
        _ => pick_roce_gid(&table).map(|e| e.index),
    };
    Ok(PortOut {
        port,
        state: format!("{:?}", p.state),
        link_layer: format!("{:?}", p.link_layer),
        active_mtu: p.active_mtu.bytes(),
        max_mtu: p.max_mtu.bytes(),
        rate_gbps: p.rate_gbps,
        lid: p.lid,
        gids: table
            .iter()
            .map(|e| GidOut {
                index: e.index,
                gid: e.gid.to_string(),
                kind: match e.gid_type {
                    GidType::Ib => "IB".into(),
                    GidType::RoceV1 => "RoCE v1".into(),
                    GidType::RoceV2 => "RoCE v2".into(),
                    GidType::Unknown(v) => format!("type {v}"),
                },
                ipv4: e.gid.ipv4().map(|a| a.to_string()),
            })
            .collect(),
        chosen_gid_index: chosen,
    })
}

fn print_text(devs: &[DeviceOut]) {
    for d in devs {
        println!(
            "{}  guid {}  fw {}  vendor {} part {}",
            d.name, d.guid, d.fw_ver, d.vendor_id, d.vendor_part_id
        );
        println!(
            "  max_qp {}  max_qp_wr {}  max_sge {}  max_cqe {}  max_mr_size {}  atomics {}",
            d.max_qp,
            d.max_qp_wr,
            d.max_sge,
            d.max_cqe,
            d.max_mr_size,
            if d.atomics { "yes" } else { "no" }
        );
        for p in &d.ports {
            let rate = p
                .rate_gbps
                .map_or_else(|| "rate unknown".to_string(), |r| format!("{r} Gb/s"));
            println!(
                "  port {}: {}  {}  MTU {} (max {})  {}  lid {}",
                p.port, p.state, p.link_layer, p.active_mtu, p.max_mtu, rate, p.lid
            );
            for g in &p.gids {
                let mark = if Some(g.index) == p.chosen_gid_index {
                    "  <- gdr/NCCL default"
                } else {
                    ""
                };
                println!(
                    "    GID[{:>3}] {:<40} {:<8}{}",
                    g.index, g.gid, g.kind, mark
                );
            }
            if p.chosen_gid_index.is_none() {
                println!("    no usable GID: give the network device an IP address (RoCE v2 GIDs follow IP addresses)");
            }
        }
    }
}

/// Runs `gdr devinfo`; returns the exit code (0 ok, 1 no device matched, 2 error).
pub fn run(args: DevinfoArgs) -> u8 {
    let sel = match Selection::parse(&args.device) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("gdr devinfo: {e}");
            return 2;
        }
    };
    match collect(&sel) {
        Ok(devs) if devs.is_empty() => {
            let present = DeviceList::new().map(|l| l.names()).unwrap_or_default();
            eprintln!(
                "gdr devinfo: no RDMA device matches {:?} (present: {}); hint: load the NIC's driver (mlx5_ib, ...) or create a Soft-RoCE device (`rdma link add rxe0 type rxe netdev eth0`)",
                args.device,
                if present.is_empty() { "none".to_string() } else { present.join(", ") }
            );
            1
        }
        Ok(devs) => {
            if args.json {
                match serde_json::to_string_pretty(&devs) {
                    Ok(s) => println!("{s}"),
                    Err(e) => {
                        eprintln!("gdr devinfo: {e}");
                        return 2;
                    }
                }
            } else {
                print_text(&devs);
            }
            0
        }
        Err(e) => {
            eprintln!("gdr devinfo: {e}");
            2
        }
    }
}
