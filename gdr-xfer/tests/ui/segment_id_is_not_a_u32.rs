// Nor is a bare u32 taken for one: ids come from the peer's segments (SegmentInfo::id) or,
// deliberately, from SegmentId::new.
use gdr_xfer::{BlockTable, Segment};

fn table<'a>(local: &'a Segment, blocks: &'a [u32]) -> BlockTable<'a> {
    BlockTable::new(local, blocks, blocks[0], blocks, 65536)
}

fn main() {
    let _ = table;
}
