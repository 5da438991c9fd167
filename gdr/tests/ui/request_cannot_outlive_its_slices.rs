// A request borrows its scatter/gather list: it cannot outlive it.
use gdr::mr::{LocalSlice, RemoteSlice};
use gdr::wr::SendRequest;

fn build(local: LocalSlice, remote: RemoteSlice) -> SendRequest<'static> {
    let list = [local];
    SendRequest::write(&list, remote)
}

fn main() {}
