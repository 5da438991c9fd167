//! `gdr.inspect_memory(obj)`: what gdr sees of an object's memory before registering it, with
//! no agent and no RDMA device: how the memory is taken (buffer protocol or DLPack), where it
//! lives, and for CUDA memory gdr's pointer checks and the GPU's side of the path decision.

use gdr_xfer::gdr;
use gdr_xfer::gdr::gpu_mr::rules::{self, DmaBufFacts, GpuDmaBuf, Readiness};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors::to_py;
use crate::memory::{self, Kind};

/// What gdr would register for `obj`, without registering it: a dict with `protocol`
/// (`"buffer"`, `"dlpack"` or `"dlpack 1.0"`), `device` (as DLPack names it: `"cpu"`,
/// `"cuda:0"`, `"cuda_host"`, `"cuda_managed:0"`), `address` and `length`; for CUDA memory
/// also what gdr's pointer checks found (`pointer_kind`, `ordinal`, `allocation_base`,
/// `allocation_length`, `gpudirect_capable`), the GPU (`gpu`, `pci_bus_id`,
/// `gpudirect_rdma_supported`, `dma_buf_supported`), `dma_buf` (the host's and GPU's
/// readiness for dma-buf registration: `"ready"`, or what blocks it), `dma_buf_export` (the
/// range exported as a dma-buf file descriptor, as the first step of that registration does:
/// `"ok: ..."` or the error), `peer_memory` (the peer-memory module found, or `None`), and
/// `path` with `why`: the path an agent would take (`"gpudirect-dmabuf"` when the NIC also
/// imports dma-bufs, which only an agent's registration can probe; `"gpudirect-peermem"`; or
/// `"staged"`).
///
/// Raises what `Agent.register` would for the object itself (`NotABuffer`, `ReadOnlyBuffer`,
/// `NotContiguous`), and gdr's pointer-check errors for CUDA memory: `Unsupported` for managed
/// memory, `NotGpuMemory`, `InvalidArgument` for an address CUDA does not know.
#[pyfunction]
pub(crate) fn inspect_memory<'py>(
    py: Python<'py>,
    obj: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyDict>> {
    let taken = memory::take(obj)?;
    let d = PyDict::new(py);
    d.set_item("protocol", taken.protocol)?;
    d.set_item("device", &taken.device)?;
    d.set_item("address", taken.addr)?;
    d.set_item("length", taken.len)?;
    let result = match taken.kind {
        Kind::Host => Ok(()),
        Kind::Cuda => py
            .allow_threads(|| cuda_facts(taken.addr, taken.len))
            .map_err(|e| to_py(e.into()))
            .and_then(|facts| facts.fill(&d)),
    };
    // The export goes back now (the GIL is held here), whatever the checks said.
    taken.held.release(py);
    result.map(|()| d)
}

/// What gdr found about a CUDA range.
struct CudaFacts {
    range: gdr::gpu_mr::GpuRange,
    dma_buf: String,
    dma_buf_ready: bool,
    export: String,
    peer_memory: Option<String>,
}

fn cuda_facts(addr: u64, len: usize) -> gdr::Result<CudaFacts> {
    let range = gdr::gpu_mr::check_gpu_range(addr, len)?;
    let system = gdr::gpu_mr::system_facts();
    let facts = DmaBufFacts {
        system,
        driver_version: gdr::cuda::driver_version().ok(),
        driver_exports_dma_buf: None,
        gpus: vec![GpuDmaBuf {
            ordinal: Some(range.gpu.ordinal),
            bdf: range.gpu.pci_bus_id.clone(),
            dma_buf_supported: Some(range.gpu.dma_buf_supported),
        }],
        nic: None,
    };
    let readiness = rules::dma_buf_readiness(&facts);
    let dma_buf = match readiness.state() {
        Readiness::Ready => "ready".to_string(),
        Readiness::Blocked => readiness
            .blockers
            .iter()
            .map(|b| b.what())
            .collect::<Vec<_>>()
            .join("; "),
        Readiness::Unknown => format!("not known (unread: {:?})", readiness.unknown),
    };
    // SAFETY: the caller holds the object's export (and so the allocation) for this call.
    let export = match unsafe { gdr::gpu_mr::export_dma_buf_at(addr, len) } {
        Ok(x) => format!(
            "ok: a dma-buf of {} bytes from {:#x}, the range at offset {}",
            x.aligned_len, x.aligned_start, x.offset
        ),
        Err(e) => format!("failed: {e}"),
    };
    Ok(CudaFacts {
        dma_buf_ready: readiness.state() != Readiness::Blocked && export.starts_with("ok"),
        range,
        dma_buf,
        export,
        peer_memory: system.peer_memory().found,
    })
}

impl CudaFacts {
    fn fill(self, d: &Bound<'_, PyDict>) -> PyResult<()> {
        let p = &self.range.pointer;
        let g = &self.range.gpu;
        d.set_item("pointer_kind", p.kind.as_str())?;
        d.set_item("ordinal", g.ordinal)?;
        d.set_item("allocation_base", p.allocation_base)?;
        d.set_item("allocation_length", p.allocation_len)?;
        d.set_item("gpudirect_capable", p.gpu_direct_rdma_capable)?;
        d.set_item("gpu", &g.name)?;
        d.set_item("pci_bus_id", &g.pci_bus_id)?;
        d.set_item("gpudirect_rdma_supported", g.gpu_direct_rdma_supported)?;
        d.set_item("dma_buf_supported", g.dma_buf_supported)?;
        d.set_item("dma_buf", &self.dma_buf)?;
        d.set_item("dma_buf_export", &self.export)?;
        d.set_item("peer_memory", &self.peer_memory)?;
        let (path, why) = if !g.gpu_direct_rdma_supported {
            (
                "staged",
                format!("GPU {} reports no GPUDirect RDMA support", g.ordinal),
            )
        } else if self.dma_buf_ready {
            (
                "gpudirect-dmabuf",
                format!(
                    "GPU {} ({}) exports the range as a dma-buf and the host is ready for dma-buf \
                     registration; an agent registers through dma-buf when its NIC imports \
                     dma-bufs (probed at registration), else through peer memory if loaded, \
                     else it stages",
                    g.ordinal, g.pci_bus_id
                ),
            )
        } else if let Some(found) = &self.peer_memory {
            (
                "gpudirect-peermem",
                format!("dma-buf is blocked ({}); {found} is loaded", self.dma_buf),
            )
        } else {
            (
                "staged",
                format!(
                    "dma-buf is blocked ({}) and {}",
                    self.dma_buf,
                    rules::no_peer_memory_text()
                ),
            )
        };
        d.set_item("path", path)?;
        d.set_item("why", why)?;
        Ok(())
    }
}
