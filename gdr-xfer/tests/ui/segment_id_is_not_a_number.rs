// A segment id is a SegmentId, not a number: an offset, a length or a block index passed in
// its place does not compile (Desc::new's arguments are local offset, remote id, remote
// offset, length).
use gdr_xfer::{Desc, Segment};

fn describe(local: &Segment, remote_offset: u64) -> Desc<'_> {
    Desc::new(local, 0, remote_offset, 0, 4096)
}

fn main() {
    let _ = describe;
}
