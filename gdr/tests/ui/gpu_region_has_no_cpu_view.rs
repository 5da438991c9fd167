// Rule 6: GPU memory is never read by the CPU: a GPU region offers no byte access at all.
use gdr::gpu_mr::GpuMemoryRegion;

fn peek(mr: &GpuMemoryRegion) -> Vec<u8> {
    mr.to_vec()
}

fn main() {}
