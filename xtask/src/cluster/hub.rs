//! One rail's L2 segment: a learning Ethernet switch on 127.0.0.1 that every host's rail NIC joins
//! with `-netdev socket,connect=127.0.0.1:PORT`.
//!
//! QEMU's socket netdev (stream mode) sends each frame as a 4-byte big-endian length followed by
//! the Ethernet frame. The switch reads frames from every connection, learns which connection
//! each source MAC lives behind, and forwards a frame to the connection of its destination MAC
//! when that is known, else (broadcast, multicast, unknown) to every other connection. A
//! connection that closes (its QEMU was killed) is dropped together with the MACs it had taught.
//! Each connection has its own writer thread behind a bounded queue: a frame for a connection
//! whose queue is full is dropped (as a switch would), so one slow guest never stalls the rest.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};

/// The largest frame accepted (QEMU's own limit for the socket netdev is 69632 bytes).
const MAX_FRAME: usize = 69_632;
/// Frames queued per connection before new ones for it are dropped.
const QUEUE: usize = 1024;

type Frame = Arc<Vec<u8>>;

struct Conn {
    stream: TcpStream,
    tx: SyncSender<Frame>,
}

#[derive(Default)]
struct Switch {
    conns: HashMap<u64, Conn>,
    macs: HashMap<[u8; 6], u64>,
    next_id: u64,
}

impl Switch {
    /// Where a frame from connection `from` goes: the connections to send it to.
    fn route(&mut self, from: u64, frame: &[u8]) -> Vec<(u64, SyncSender<Frame>)> {
        if frame.len() < 14 {
            return Vec::new();
        }
        let dst: [u8; 6] = frame[0..6].try_into().expect("6 bytes");
        let src: [u8; 6] = frame[6..12].try_into().expect("6 bytes");
        if src[0] & 1 == 0 {
            self.macs.insert(src, from);
        }
        let known = if dst[0] & 1 == 0 {
            self.macs.get(&dst).copied()
        } else {
            None
        };
        match known {
            Some(to) if to == from => Vec::new(),
            Some(to) => self
                .conns
                .get(&to)
                .map(|c| vec![(to, c.tx.clone())])
                .unwrap_or_default(),
            None => self
                .conns
                .iter()
                .filter(|(&id, _)| id != from)
                .map(|(&id, c)| (id, c.tx.clone()))
                .collect(),
        }
    }

    fn remove(&mut self, id: u64) {
        if let Some(c) = self.conns.remove(&id) {
            let _ = c.stream.shutdown(Shutdown::Both);
        }
        self.macs.retain(|_, v| *v != id);
    }
}

/// A running switch; stopped (every connection closed, its threads ended) when dropped.
pub struct Hub {
    port: u16,
    stop: Arc<AtomicBool>,
    switch: Arc<Mutex<Switch>>,
    accept: Option<JoinHandle<()>>,
}

impl Hub {
    /// Starts a switch listening on a free port of 127.0.0.1.
    pub fn start() -> io::Result<Hub> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        let stop = Arc::new(AtomicBool::new(false));
        let switch = Arc::new(Mutex::new(Switch::default()));
        let (s, st) = (Arc::clone(&switch), Arc::clone(&stop));
        let accept = thread::spawn(move || {
            for stream in listener.incoming() {
                if st.load(Ordering::SeqCst) {
                    break;
                }
                if let Ok(stream) = stream {
                    let _ = add(&s, stream);
                }
            }
        });
        Ok(Hub {
            port,
            stop,
            switch,
            accept: Some(accept),
        })
    }

    /// The port QEMU connects to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// How many connections are joined now.
    #[cfg(test)]
    fn joined(&self) -> usize {
        self.switch.lock().expect("switch lock").conns.len()
    }
}

impl Drop for Hub {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(a) = self.accept.take() {
            let _ = a.join();
        }
        let mut sw = self.switch.lock().expect("switch lock");
        let ids: Vec<u64> = sw.conns.keys().copied().collect();
        for id in ids {
            sw.remove(id);
        }
    }
}

/// Joins a new connection: a reader thread (frames in, routed) and a writer thread (frames out).
fn add(switch: &Arc<Mutex<Switch>>, stream: TcpStream) -> io::Result<()> {
    stream.set_nodelay(true)?;
    let mut reader = stream.try_clone()?;
    let mut writer = stream.try_clone()?;
    let (tx, rx) = sync_channel::<Frame>(QUEUE);
    let id = {
        let mut sw = switch.lock().expect("switch lock");
        let id = sw.next_id;
        sw.next_id += 1;
        sw.conns.insert(id, Conn { stream, tx });
        id
    };
    thread::spawn(move || {
        // Ends when every sender is gone (the connection was removed) or a write fails.
        for f in rx {
            if writer.write_all(&f).is_err() {
                break;
            }
        }
        let _ = writer.shutdown(Shutdown::Both);
    });
    let sw = Arc::clone(switch);
    thread::spawn(move || {
        let mut len = [0u8; 4];
        loop {
            if reader.read_exact(&mut len).is_err() {
                break;
            }
            let n = u32::from_be_bytes(len) as usize;
            if n > MAX_FRAME {
                break;
            }
            let mut buf = vec![0u8; 4 + n];
            buf[..4].copy_from_slice(&len);
            if reader.read_exact(&mut buf[4..]).is_err() {
                break;
            }
            let to = sw.lock().expect("switch lock").route(id, &buf[4..]);
            let frame: Frame = Arc::new(buf);
            let mut gone = Vec::new();
            for (to_id, tx) in to {
                match tx.try_send(Arc::clone(&frame)) {
                    Ok(()) | Err(TrySendError::Full(_)) => {}
                    Err(TrySendError::Disconnected(_)) => gone.push(to_id),
                }
            }
            if !gone.is_empty() {
                let mut s = sw.lock().expect("switch lock");
                for g in gone {
                    s.remove(g);
                }
            }
        }
        sw.lock().expect("switch lock").remove(id);
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    fn frame(dst: [u8; 6], src: [u8; 6], body: &[u8]) -> Vec<u8> {
        let mut f = Vec::new();
        let len = (12 + 2 + body.len()) as u32;
        f.extend_from_slice(&len.to_be_bytes());
        f.extend_from_slice(&dst);
        f.extend_from_slice(&src);
        f.extend_from_slice(&[0x08, 0x00]);
        f.extend_from_slice(body);
        f
    }

    fn recv(s: &mut TcpStream) -> io::Result<Vec<u8>> {
        let mut len = [0u8; 4];
        s.read_exact(&mut len)?;
        let mut b = vec![0u8; u32::from_be_bytes(len) as usize];
        s.read_exact(&mut b)?;
        Ok(b)
    }

    fn join(hub: &Hub, n: usize) -> Vec<TcpStream> {
        let v: Vec<TcpStream> = (0..n)
            .map(|_| {
                let s = TcpStream::connect(("127.0.0.1", hub.port())).expect("connect");
                s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                s
            })
            .collect();
        wait_joined(hub, n);
        v
    }

    fn wait_joined(hub: &Hub, n: usize) {
        let t = Instant::now();
        while hub.joined() != n {
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "{} joined, want {n}",
                hub.joined()
            );
            thread::sleep(Duration::from_millis(5));
        }
    }

    const A: [u8; 6] = [0x52, 0x54, 0, 0x78, 0, 1];
    const B: [u8; 6] = [0x52, 0x54, 0, 0x78, 0, 2];
    const C: [u8; 6] = [0x52, 0x54, 0, 0x78, 0, 3];
    const BCAST: [u8; 6] = [0xff; 6];

    #[test]
    fn broadcast_floods_and_unicast_goes_to_the_learned_port_only() {
        let hub = Hub::start().unwrap();
        let mut s = join(&hub, 3);
        // Each host announces itself (as ARP would): everyone else sees it.
        for (i, mac) in [A, B, C].iter().enumerate() {
            s[i].write_all(&frame(BCAST, *mac, b"hello")).unwrap();
            for (j, other) in s.iter_mut().enumerate() {
                if j != i {
                    let f = recv(other).unwrap();
                    assert_eq!(&f[6..12], mac);
                }
            }
        }
        // A -> C: only C gets it; B gets the next broadcast and nothing before it.
        s[0].write_all(&frame(C, A, b"to c")).unwrap();
        assert_eq!(&recv(&mut s[2]).unwrap()[14..], b"to c");
        s[0].write_all(&frame(BCAST, A, b"marker")).unwrap();
        assert_eq!(&recv(&mut s[1]).unwrap()[14..], b"marker");
        assert_eq!(&recv(&mut s[2]).unwrap()[14..], b"marker");
    }

    #[test]
    fn a_closed_connection_is_dropped_and_the_rest_keep_working() {
        let hub = Hub::start().unwrap();
        let mut s = join(&hub, 3);
        s[1].write_all(&frame(BCAST, B, b"b")).unwrap();
        recv(&mut s[0]).unwrap();
        recv(&mut s[2]).unwrap();
        drop(s.remove(1));
        wait_joined(&hub, 2);
        // B's MAC was forgotten: a frame for it floods to the one other connection left.
        s[0].write_all(&frame(B, A, b"for b")).unwrap();
        assert_eq!(&recv(&mut s[1]).unwrap()[14..], b"for b");
    }

    #[test]
    fn an_oversized_length_closes_only_that_connection() {
        let hub = Hub::start().unwrap();
        let mut s = join(&hub, 2);
        s[0].write_all(&u32::MAX.to_be_bytes()).unwrap();
        wait_joined(&hub, 1);
        let mut b = [0u8; 1];
        // The bad connection is closed by the switch.
        assert!(matches!(s[0].read(&mut b), Ok(0)));
        drop(hub);
        assert!(
            matches!(s[1].read(&mut b), Ok(0)),
            "dropping the hub closes the rest"
        );
    }
}
