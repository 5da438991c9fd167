// A prepared request borrows its queue pair: it cannot be kept after the queue pair is gone
// (its posts would ring a destroyed queue's doorbell).
use gdr::qp::{PreparedSend, QueuePair};
use gdr::wr::SendRequest;

fn prepare_and_leak(qp: QueuePair, req: &SendRequest<'_>) -> PreparedSend<'static> {
    qp.prepare(req).unwrap()
}

fn main() {}
