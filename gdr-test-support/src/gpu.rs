//! What the GPU tier's tests and benchmarks share: the GPU they need, a fast test pattern, and
//! lines reported where the GPU machine's results come back from.

/// Panics, saying what needs it, unless a CUDA GPU is visible: on the GPU machine a missing GPU
/// is a failure, not a skip.
pub fn require_gpu(what: &str) {
    let n = gdr::cuda::device_count().unwrap_or_else(|e| panic!("{what} needs a CUDA GPU: {e}"));
    assert!(n > 0, "{what} needs a CUDA GPU: none visible");
}

/// `len` bytes in which every 4 KiB block differs (its index is written into it), so an offset
/// error of any multiple of a block shows; built with memcpy (fast in debug builds, unlike
/// [`crate::pattern`]'s byte by byte loop, which matters at GiB sizes).
pub fn block_pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut block = [0u8; 4096];
    for (i, b) in block.iter_mut().enumerate() {
        *b = ((i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8 ^ seed as u8;
    }
    let mut v = vec![0u8; len];
    for (k, c) in v.chunks_mut(4096).enumerate() {
        let n = c.len();
        c.copy_from_slice(&block[..n]);
        let tag = (k as u64 ^ seed.rotate_left(32)).to_le_bytes();
        let t = n.min(8);
        c[..t].copy_from_slice(&tag[..t]);
    }
    v
}

/// Prints `line`, and appends it to `$OUT/<file>` when `$OUT` is set (the GPU machine's result
/// folder), so the numbers come back even when a harness captures stdout.
pub fn report(file: &str, line: &str) {
    println!("{line}");
    if let Some(dir) = std::env::var_os("OUT") {
        use std::io::Write;
        let path = std::path::Path::new(&dir).join(file);
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = writeln!(f, "{line}");
        }
    }
}
