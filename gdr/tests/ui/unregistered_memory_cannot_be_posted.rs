// Rule 1: only registered memory (kept alive by the queue pair) goes into a work request.
use gdr::mr::RemoteSlice;
use gdr::wr::SendRequest;

fn post(remote: RemoteSlice) {
    let buf = vec![0u8; 4096];
    let _ = SendRequest::write(&[buf], remote);
}

fn main() {}
