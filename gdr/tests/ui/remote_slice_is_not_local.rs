// A peer's memory cannot be used as local memory of a request.
use gdr::mr::RemoteSlice;
use gdr::wr::SendRequest;

fn post(remote: RemoteSlice) {
    let _ = SendRequest::write(&[remote], remote);
}

fn main() {}
