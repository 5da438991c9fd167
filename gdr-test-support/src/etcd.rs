//! A throwaway etcd server for tests: Debian's `etcd` binary (package `etcd-server`, installed by
//! `cargo xtask setup`) on loopback with free ports and a temporary data directory, killed and
//! removed on drop. Its output is kept in a log file for failure messages.
//!
//! ```text
//! let etcd = EtcdServer::start();
//! let dir = EtcdDirectory::connect(&[etcd.endpoint()], "/t/", ttl, timeout)?;
//! ```

use std::fs;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// How long a fresh etcd may take to answer `/health`.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// A running etcd; killed (SIGKILL) and its data directory removed on drop.
pub struct EtcdServer {
    child: Option<Child>,
    client_port: u16,
    dir: PathBuf,
    log: PathBuf,
}

static COUNTER: AtomicUsize = AtomicUsize::new(0);

impl EtcdServer {
    /// Starts etcd (the binary in `$GDR_TEST_ETCD`, else `etcd` on `PATH`) and waits until it
    /// answers. Panics, saying why, when it cannot: a missing binary names `cargo xtask setup`.
    pub fn start() -> EtcdServer {
        let mut last = String::new();
        // A free port found by binding port 0 can be taken by someone else before etcd binds it:
        // try again with new ports.
        for _ in 0..3 {
            match Self::try_start() {
                Ok(s) => return s,
                Err(e) => last = e,
            }
        }
        panic!("{last}");
    }

    fn try_start() -> Result<EtcdServer, String> {
        let client_port = free_port();
        let peer_port = free_port();
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let dir = std::env::temp_dir().join(format!(
            "gdr-xfer-etcd-{}-{n}-{}",
            std::process::id(),
            client_port
        ));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
        let log = dir.join("etcd.log");
        let log_file =
            fs::File::create(&log).map_err(|e| format!("create {}: {e}", log.display()))?;
        let log_err = log_file
            .try_clone()
            .map_err(|e| format!("dup {}: {e}", log.display()))?;
        let bin = std::env::var("GDR_TEST_ETCD").unwrap_or_else(|_| "etcd".into());
        let client = format!("http://127.0.0.1:{client_port}");
        let peer = format!("http://127.0.0.1:{peer_port}");
        let child = Command::new(&bin)
            .arg("--name=test")
            .arg(format!("--data-dir={}", dir.join("data").display()))
            .arg(format!("--listen-client-urls={client}"))
            .arg(format!("--advertise-client-urls={client}"))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster=test={peer}"))
            .arg("--initial-cluster-state=new")
            // No metrics or debug listeners beyond the two above.
            .arg("--enable-pprof=false")
            .stdin(Stdio::null())
            .stdout(Stdio::from(log_file))
            .stderr(Stdio::from(log_err))
            .spawn();
        let child = match child {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let _ = fs::remove_dir_all(&dir);
                panic!(
                    "the etcd binary {bin:?} was not found: run `cargo xtask setup` (installs Debian's etcd-server), or point GDR_TEST_ETCD at an etcd binary"
                );
            }
            Err(e) => return Err(format!("cannot start {bin:?}: {e}")),
        };
        let mut server = EtcdServer {
            child: Some(child),
            client_port,
            dir,
            log,
        };
        server.wait_healthy()?;
        Ok(server)
    }

    fn wait_healthy(&mut self) -> Result<(), String> {
        let t = Instant::now();
        while t.elapsed() < START_TIMEOUT {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    self.child = None;
                    return Err(format!(
                        "etcd exited with {status} while starting; its log:\n{}",
                        self.log()
                    ));
                }
            }
            if self.healthy() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(format!(
            "etcd did not answer /health at {} within {START_TIMEOUT:?}; its log:\n{}",
            self.endpoint(),
            self.log()
        ))
    }

    /// Whether etcd answers `GET /health` with `"health":"true"` right now.
    pub fn healthy(&self) -> bool {
        let addr = SocketAddr::from(([127, 0, 0, 1], self.client_port));
        let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_millis(500)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        let _ = s.set_write_timeout(Some(Duration::from_secs(2)));
        if s.write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            .is_err()
        {
            return false;
        }
        let mut answer = Vec::new();
        let _ = s.take(64 * 1024).read_to_end(&mut answer);
        String::from_utf8_lossy(&answer).contains("\"health\":\"true\"")
    }

    /// The client endpoint, `127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }

    /// The server's process id (for signals), while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// What etcd wrote so far (its last 16 KiB).
    pub fn log(&self) -> String {
        let text = fs::read(&self.log).unwrap_or_default();
        let tail = &text[text.len().saturating_sub(16 * 1024)..];
        String::from_utf8_lossy(tail).into_owned()
    }

    /// Stops etcd (SIGSTOP) and waits until every thread of it is stopped: its sockets stay
    /// open and nothing answers, as with a hung or partitioned server. Undone by [`thaw`](Self::thaw)
    /// (or drop).
    pub fn freeze(&self) {
        self.signal(libc::SIGSTOP);
        let pid = self.pid().expect("etcd runs");
        let t = Instant::now();
        while !all_threads_stopped(pid) {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "etcd (pid {pid}) did not stop after SIGSTOP"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Lets a frozen etcd run again (SIGCONT).
    pub fn thaw(&self) {
        self.signal(libc::SIGCONT);
    }

    fn signal(&self, sig: libc::c_int) {
        let pid = self.pid().expect("etcd runs");
        let pid = libc::pid_t::try_from(pid).expect("pid fits pid_t");
        // SAFETY: kill(2) takes plain integers and touches no memory of ours; the pid is our own
        // child's, not yet reaped (so not reused).
        let rc = unsafe { libc::kill(pid, sig) };
        assert_eq!(
            rc,
            0,
            "kill({pid}, {sig}): {}",
            std::io::Error::last_os_error()
        );
    }

    /// Kills etcd now (SIGKILL) and reaps it; the data directory stays until drop.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        self.kill();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// Whether every thread of `pid` is in state `T` (stopped) in /proc.
fn all_threads_stopped(pid: u32) -> bool {
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().all(|t| {
        let stat = fs::read_to_string(t.path().join("stat")).unwrap_or_default();
        // The state follows the command name, which is in parentheses and may hold anything.
        stat.rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('T') || rest.starts_with('t'))
    })
}

/// A TCP port on 127.0.0.1 that was free a moment ago.
fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    l.local_addr().expect("local_addr").port()
}
