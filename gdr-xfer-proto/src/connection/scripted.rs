//! The scripted driver of the core's unit tests (`tests.rs`, `mutant_tests.rs`): a mock [`Io`]
//! that records every post, message, receive slot and queue pair, answers as each test tells it
//! to, and takes the core's actions into its records after every call; and `T`, a connection
//! with it and a clock of milliseconds.

use std::time::{Duration, Instant};

use super::Connection;
use crate::config::Config;
use crate::control::Control;
use crate::fault::TextError;
use crate::io::{
    Action, Event, Header, Io, LaneRef, Op, Pieces, PostResult, Receipt, SendCompletion, Status,
};
use crate::transfer::{Failure, Outcome};

#[derive(Default)]
pub(super) struct Batch(pub(super) Vec<(u64, u64, u64, u32, u64)>);

impl Pieces for Batch {
    fn clear(&mut self) {
        self.0.clear();
    }
    fn push(&mut self, lo: u64, ra: u64, len: u64, rkey: u32, wr_id: u64) -> bool {
        self.0.push((lo, ra, len, rkey, wr_id));
        true
    }
    fn len(&self) -> usize {
        self.0.len()
    }
}

/// A post the driver carried out.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Post {
    pub(super) lane: LaneRef,
    pub(super) op: Op,
    pub(super) local: u8,
    pub(super) wr_ids: Vec<u64>,
    pub(super) rkeys: Vec<u32>,
    /// (local offset, remote address, len, rkey, wr_id) per request.
    pub(super) pieces: Vec<(u64, u64, u64, u32, u64)>,
}

impl Post {
    pub(super) fn last_wr(&self) -> u64 {
        *self.wr_ids.last().expect("a post has requests")
    }
}

#[derive(Default)]
pub(super) struct Mock {
    pub(super) batch: Batch,
    pub(super) posts: Vec<Post>,
    /// (lane, wr_id, slot, header, data) per message.
    pub(super) messages: Vec<(LaneRef, u64, u16, Header, Vec<u8>)>,
    pub(super) armed: Vec<(LaneRef, u16)>,
    pub(super) created: Vec<LaneRef>,
    pub(super) destroyed: Vec<LaneRef>,
    pub(super) control: Vec<Control<Vec<u32>>>,
    pub(super) finished: Vec<(u32, Outcome)>,
    pub(super) delivered: Vec<(Vec<u8>, Receipt)>,
    pub(super) events: Vec<Event>,
    /// Results for the next posts (default: posted).
    pub(super) script: Vec<PostResult<TextError>>,
    /// Local segments the driver refuses (another protection domain).
    pub(super) foreign: Vec<u8>,
    /// The driver's bound across connections: places left to keep a notification without its
    /// slot (`None`: unbounded).
    pub(super) buffer_places: Option<usize>,
    /// The driver defers new receive slots.
    pub(super) defer_slots: bool,
    /// The driver cannot create queue pairs.
    pub(super) create_fails: bool,
    /// The driver cannot connect queue pairs.
    pub(super) connect_fails: bool,
}

impl Io for Mock {
    type Local = u8;
    type Handle = u32;
    type Endpoints = Vec<u32>;
    type Pieces = Batch;
    type Error = TextError;

    fn pieces(&mut self) -> &mut Batch {
        &mut self.batch
    }
    fn post_rdma(&mut self, lane: LaneRef, op: Op, local: &u8) -> PostResult<TextError> {
        if self.foreign.contains(local) {
            return PostResult::Rejected(TextError(format!("segment {local} is another agent's")));
        }
        if !self.script.is_empty() {
            let r = self.script.remove(0);
            if r != PostResult::Posted {
                return r;
            }
        }
        self.posts.push(Post {
            lane,
            op,
            local: *local,
            wr_ids: self.batch.0.iter().map(|p| p.4).collect(),
            rkeys: self.batch.0.iter().map(|p| p.3).collect(),
            pieces: self.batch.0.clone(),
        });
        PostResult::Posted
    }
    fn post_message(
        &mut self,
        lane: LaneRef,
        wr_id: u64,
        slot: u16,
        h: Header,
        data: &[u8],
    ) -> PostResult<TextError> {
        self.messages.push((lane, wr_id, slot, h, data.to_vec()));
        PostResult::Posted
    }
    fn arm_recv(&mut self, lane: LaneRef, slot: u16) -> Result<(), TextError> {
        self.armed.push((lane, slot));
        Ok(())
    }
    fn buffer_notification(&mut self) -> bool {
        match &mut self.buffer_places {
            None => true,
            Some(0) => false,
            Some(n) => {
                *n -= 1;
                true
            }
        }
    }
    fn may_arm_recv(&mut self) -> bool {
        !self.defer_slots
    }
    fn create_lanes(&mut self, _rail: usize, lanes: &[LaneRef]) -> Result<Vec<u32>, TextError> {
        if self.create_fails {
            return Err("no queue pair".into());
        }
        self.created.extend_from_slice(lanes);
        Ok(lanes.iter().map(|l| 100 + l.gen as u32).collect())
    }
    fn connect_lanes(
        &mut self,
        _rail: usize,
        _lanes: &[LaneRef],
        _remote: &Vec<u32>,
    ) -> Result<(), TextError> {
        if self.connect_fails {
            return Err("cannot connect".into());
        }
        Ok(())
    }
    fn endpoint_count(&self, e: &Vec<u32>) -> usize {
        e.len()
    }
}

impl Mock {
    /// The result transfer `handle` reported, if it did.
    pub(super) fn outcome(&self, handle: u32) -> Option<&Result<(), Failure>> {
        self.full_outcome(handle).map(|o| &o.result)
    }

    /// The outcome (result and stats) transfer `handle` reported, if it did.
    pub(super) fn full_outcome(&self, handle: u32) -> Option<&Outcome> {
        self.finished
            .iter()
            .find(|(h, _)| *h == handle)
            .map(|(_, o)| o)
    }
}

/// A connection with the scripted driver and a clock of milliseconds from `t0`.
pub(super) struct T {
    pub(super) c: Connection<Mock>,
    pub(super) io: Mock,
    pub(super) t0: Instant,
    /// Submit with `submit_inline_up_to(.., this)` instead of `submit`.
    pub(super) inline_max: Option<u64>,
}

/// The tests' connection settings: `rails` x `lanes`, small queues and slices.
pub(super) fn cfg(rails: usize, lanes: usize) -> Config {
    let mut c = Config::new(rails, lanes);
    c.send_depth = 8;
    c.slice_size = 100;
    c.stripe_min = 0;
    c.send_slots = 2;
    c.recv_slots = 2;
    c.recv_buffered = 0;
    c.notify_max = 16;
    c.quiesce = Duration::from_millis(100);
    c
}

pub(super) fn lane(lane: usize, gen: u64) -> LaneRef {
    LaneRef { lane, gen }
}

impl T {
    pub(super) fn new(cfg: Config) -> T {
        let t0 = Instant::now();
        T {
            c: Connection::new(cfg, t0),
            io: Mock::default(),
            t0,
            inline_max: None,
        }
    }

    pub(super) fn at(&self, ms: u64) -> Instant {
        self.t0 + Duration::from_millis(ms)
    }

    /// Takes what the core left to carry out, in order, into the mock's records, checking
    /// that [`Connection::has_actions`] (the driver's way to skip an empty queue) agrees with
    /// what [`Connection::poll_action`] gives, each time.
    pub(super) fn drain(&mut self) {
        loop {
            let waiting = self.c.has_actions();
            let Some(a) = self.c.poll_action() else {
                assert!(!waiting, "has_actions said an action waits, and none came");
                break;
            };
            assert!(waiting, "an action came, and has_actions said none waited");
            match a {
                Action::DestroyLanes(l) => self.io.destroyed.extend(l),
                Action::SendControl(m) => self.io.control.push(m),
                Action::Finished(h, o) => self.io.finished.push((h, o)),
                Action::Deliver(d, r) => self.io.delivered.push((d, r)),
                Action::Event(e) => self.io.events.push(e),
            }
        }
    }

    pub(super) fn complete(&mut self, ms: u64, lane: LaneRef, wr_id: u64, status: Status) {
        let now = self.at(ms);
        let c = SendCompletion {
            lane,
            wr_id,
            status,
            raw_status: 0,
            vendor_err: 0,
            qp_num: 7,
        };
        self.c.handle_send_completion(now, &mut self.io, c);
        self.drain();
    }

    /// Completes every post and message so far, in order, successfully.
    pub(super) fn complete_all(&mut self, ms: u64) {
        while !self.io.posts.is_empty() || !self.io.messages.is_empty() {
            for p in std::mem::take(&mut self.io.posts) {
                self.complete(ms, p.lane, p.last_wr(), Status::Success);
            }
            for (lane, wr, ..) in std::mem::take(&mut self.io.messages) {
                self.complete(ms, lane, wr, Status::Success);
            }
        }
    }

    pub(super) fn tick(&mut self, ms: u64) {
        let now = self.at(ms);
        self.c.handle_timeout(now, &mut self.io);
        self.drain();
    }

    /// The peer answers our last renewal offer (its side of the old queue pairs is gone): its
    /// new endpoints, one per lane.
    pub(super) fn peer_renews(&mut self, ms: u64) {
        let (rail, epoch) = match self.io.control.last() {
            Some(Control::Renew { rail, epoch, .. }) => (*rail, *epoch),
            other => panic!("no renewal offered: {other:?}"),
        };
        let now = self.at(ms);
        let endpoints = vec![9; self.c.config().lanes_per_rail];
        self.c.handle_control(
            now,
            &mut self.io,
            Control::Renewed {
                rail,
                epoch,
                endpoints,
            },
        );
        self.drain();
    }
}
