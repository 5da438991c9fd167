// Rule 4: a remote slice only comes from the peer's advertised region, bounds-checked.
use gdr::mr::RemoteSlice;

fn forge() -> RemoteSlice {
    RemoteSlice { addr: 0x1000, len: 1 << 40, rkey: 7 }
}

fn main() {}
