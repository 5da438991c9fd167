//! The etcd directory against a real etcd (Debian's etcd-server, started by each test on loopback
//! through `gdr_test_support::etcd::EtcdServer`).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gdr_test_support::etcd::EtcdServer;
use gdr_xfer::directory::{
    EtcdConfig, EtcdDirectory, Watch, WatchEvent, MAX_KEY_LEN, MAX_VALUE_LEN,
};
use gdr_xfer::Error;

/// The lease TTL of the tests: etcd's minimum with its default election timeout.
const TTL: Duration = Duration::from_secs(2);
/// Slack for a loaded 2-core machine on top of every bound checked.
const MARGIN: Duration = Duration::from_secs(3);

fn config(etcd: &EtcdServer, prefix: &str) -> EtcdConfig {
    let mut c = EtcdConfig::new(&[etcd.endpoint()], prefix);
    c.ttl = TTL;
    c.timeout = Duration::from_secs(5);
    c
}

fn connect(etcd: &EtcdServer, prefix: &str) -> EtcdDirectory {
    EtcdDirectory::connect_with(config(etcd, prefix))
        .unwrap_or_else(|e| panic!("connect: {e}\netcd log:\n{}", etcd.log()))
}

/// A directory whose lease (60 s) cannot expire during a test.
fn long_lived(etcd: &EtcdServer) -> EtcdDirectory {
    let mut c = config(etcd, "/t/");
    c.ttl = Duration::from_secs(60);
    EtcdDirectory::connect_with(c).unwrap()
}

fn next(w: &Watch, within: Duration) -> WatchEvent {
    w.recv_timeout(within)
        .unwrap_or_else(|| panic!("no watch event within {within:?}"))
}

fn put_of(ev: &WatchEvent) -> (&str, &[u8]) {
    match ev {
        WatchEvent::Put { key, value, .. } => (key, value),
        other => panic!("expected Put, got {other:?}"),
    }
}

fn delete_of(ev: &WatchEvent) -> &str {
    match ev {
        WatchEvent::Delete { key, .. } => key,
        other => panic!("expected Delete, got {other:?}"),
    }
}

#[test]
fn put_get_list_delete_round_trip() {
    let etcd = EtcdServer::start();
    let d = connect(&etcd, "/t/");
    assert_eq!(d.get("a/metadata").unwrap(), None);
    d.put("a/metadata", b"one").unwrap();
    d.put("a/segments", b"two").unwrap();
    d.put("b/metadata", &[0, 255, 1]).unwrap();
    assert_eq!(d.get("a/metadata").unwrap().as_deref(), Some(&b"one"[..]));

    let all = d.list("").unwrap();
    assert!(all.revision > 0);
    let keys: Vec<&str> = all.entries.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, ["a/metadata", "a/segments", "b/metadata"]);
    assert_eq!(all.entries[2].1, [0, 255, 1]);
    assert!(all.refused.is_empty());
    assert_eq!(d.list("a/").unwrap().entries.len(), 2);
    assert_eq!(d.list("c/").unwrap().entries, []);

    d.put("a/metadata", b"changed").unwrap();
    assert_eq!(
        d.get("a/metadata").unwrap().as_deref(),
        Some(&b"changed"[..])
    );
    assert!(d.delete("a/metadata").unwrap());
    assert!(
        !d.delete("a/metadata").unwrap(),
        "a second delete finds nothing"
    );
    assert_eq!(d.get("a/metadata").unwrap(), None);
    assert_eq!(d.list("").unwrap().entries.len(), 2);
}

#[test]
fn list_pages_through_many_keys_at_one_revision() {
    let etcd = EtcdServer::start();
    let d = connect(&etcd, "/t/");
    for i in 0..100 {
        d.put(&format!("agent-{i:03}"), format!("{i}").as_bytes())
            .unwrap();
    }
    let l = d.list("").unwrap();
    assert_eq!(l.entries.len(), 100, "more than three pages of 32");
    for (i, (k, v)) in l.entries.iter().enumerate() {
        assert_eq!(k, &format!("agent-{i:03}"));
        assert_eq!(v, format!("{i}").as_bytes());
    }
}

#[test]
fn delete_leaves_keys_of_other_directories_alone() {
    let etcd = EtcdServer::start();
    let a = connect(&etcd, "/t/");
    let b = connect(&etcd, "/t/");
    b.put("b/metadata", b"b's").unwrap();
    assert!(!a.delete("b/metadata").unwrap());
    assert_eq!(a.get("b/metadata").unwrap().as_deref(), Some(&b"b's"[..]));
}

#[test]
fn watch_sees_puts_and_deletes_of_another_directory_in_order() {
    let etcd = EtcdServer::start();
    let watcher = connect(&etcd, "/t/");
    let other = connect(&etcd, "/t/");
    let w = watcher.watch("", None).unwrap();
    for i in 0..20 {
        other
            .put(&format!("k{i}"), format!("v{i}").as_bytes())
            .unwrap();
        if i % 3 == 0 {
            assert!(other.delete(&format!("k{i}")).unwrap());
        }
    }
    let mut last_rev = 0;
    for i in 0..20 {
        let ev = next(&w, Duration::from_secs(5));
        assert_eq!(
            put_of(&ev),
            (format!("k{i}").as_str(), format!("v{i}").as_bytes())
        );
        let WatchEvent::Put { revision, .. } = ev else {
            unreachable!()
        };
        assert!(revision > last_rev, "revisions increase");
        last_rev = revision;
        if i % 3 == 0 {
            assert_eq!(
                delete_of(&next(&w, Duration::from_secs(5))),
                format!("k{i}")
            );
        }
    }
    assert_eq!(w.try_recv(), None, "nothing more");
    // A watch of a narrower prefix sees only its keys.
    let narrow = watcher.watch("x/", None).unwrap();
    other.put("y/1", b"").unwrap();
    other.put("x/1", b"x").unwrap();
    assert_eq!(put_of(&next(&narrow, Duration::from_secs(5))).0, "x/1");
}

#[test]
fn list_then_watch_loses_nothing_put_in_between() {
    let etcd = EtcdServer::start();
    let watcher = connect(&etcd, "/t/");
    let other = connect(&etcd, "/t/");
    other.put("before", b"0").unwrap();
    let listing = watcher.list("").unwrap();
    assert_eq!(listing.entries.len(), 1);
    // Changes after the listing and before the watch exists.
    other.put("between-1", b"1").unwrap();
    assert!(other.delete("before").unwrap());
    other.put("between-2", b"2").unwrap();
    let w = watcher.watch("", Some(listing.revision)).unwrap();
    other.put("after", b"3").unwrap();
    assert_eq!(put_of(&next(&w, Duration::from_secs(5))).0, "between-1");
    assert_eq!(delete_of(&next(&w, Duration::from_secs(5))), "before");
    assert_eq!(put_of(&next(&w, Duration::from_secs(5))).0, "between-2");
    assert_eq!(put_of(&next(&w, Duration::from_secs(5))).0, "after");
    assert_eq!(
        w.recv_timeout(Duration::from_millis(200)),
        None,
        "nothing twice"
    );
}

#[test]
fn revoke_makes_watchers_see_a_delete_for_every_key() {
    let etcd = EtcdServer::start();
    let watcher = connect(&etcd, "/t/");
    // A long TTL: Deletes within a few seconds can only come from the revoke.
    let leaving = long_lived(&etcd);
    for k in ["l/metadata", "l/seg/0", "l/seg/1"] {
        leaving.put(k, b"x").unwrap();
    }
    let listing = watcher.list("l/").unwrap();
    assert_eq!(listing.entries.len(), 3);
    let w = watcher.watch("l/", Some(listing.revision)).unwrap();
    let t = Instant::now();
    leaving.revoke().unwrap();
    let mut gone: Vec<String> = (0..3)
        .map(|_| delete_of(&next(&w, Duration::from_secs(5))).to_owned())
        .collect();
    gone.sort();
    assert_eq!(gone, ["l/metadata", "l/seg/0", "l/seg/1"]);
    assert!(
        t.elapsed() < TTL,
        "revoke acts at once, not at expiry: {:?}",
        t.elapsed()
    );
    assert!(watcher.list("l/").unwrap().entries.is_empty());
}

#[test]
fn dropping_a_directory_revokes_its_lease() {
    let etcd = EtcdServer::start();
    let watcher = connect(&etcd, "/t/");
    let d = long_lived(&etcd);
    d.put("d/metadata", b"x").unwrap();
    let w = watcher.watch("d/", None).unwrap();
    drop(d);
    assert_eq!(delete_of(&next(&w, MARGIN)), "d/metadata");
}

const CHILD_ENV: &str = "GDR_XFER_ETCD_TEST_CHILD_ENDPOINT";

#[test]
fn killed_process_keys_disappear_within_ttl() {
    if let Ok(endpoint) = std::env::var(CHILD_ENV) {
        // The child: publish, then wait to be killed (bounded, so a lost parent cannot leave it).
        let mut c = EtcdConfig::new(&[endpoint], "/t/");
        c.ttl = TTL;
        let d = EtcdDirectory::connect_with(c).expect("child connect");
        for k in ["child/metadata", "child/seg/0", "child/seg/1"] {
            d.put(k, b"child").expect("child put");
        }
        std::thread::sleep(Duration::from_secs(60));
        std::process::exit(3);
    }
    let etcd = EtcdServer::start();
    let watcher = connect(&etcd, "/t/");
    let (listing, w) = watcher.list_and_watch("").unwrap();
    assert!(listing.entries.is_empty());
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "killed_process_keys_disappear_within_ttl",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, etcd.endpoint())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn the test binary as the child");
    let mut published = Vec::new();
    for _ in 0..3 {
        match w.recv_timeout(Duration::from_secs(30)) {
            Some(WatchEvent::Put { key, .. }) => published.push(key),
            other => {
                let _ = child.kill();
                panic!(
                    "expected the child's Put, got {other:?}; child: {:?}",
                    child.try_wait()
                );
            }
        }
    }
    published.sort();
    assert_eq!(published, ["child/metadata", "child/seg/0", "child/seg/1"]);
    // Give the child at least one keepalive, so expiry is measured from a renewed lease.
    std::thread::sleep(TTL);
    child.kill().unwrap(); // SIGKILL: no revoke, the keepalives just stop
    let killed = Instant::now();
    child.wait().unwrap();
    let mut gone = Vec::new();
    while gone.len() < 3 {
        match w.recv_timeout(TTL + MARGIN) {
            Some(WatchEvent::Delete { key, .. }) => gone.push(key),
            other => panic!(
                "expected a Delete within {:?}, got {other:?} after {:?}",
                TTL + MARGIN,
                killed.elapsed()
            ),
        }
    }
    let after = killed.elapsed();
    gone.sort();
    assert_eq!(gone, published);
    assert!(after <= TTL + MARGIN, "keys went {after:?} after the kill");
    assert!(watcher.list("child/").unwrap().entries.is_empty());
    eprintln!("the killed child's keys were deleted {after:?} after SIGKILL (TTL {TTL:?})");
}

#[test]
fn etcd_killed_ends_the_watch_with_lost_and_calls_fail_in_time() {
    let mut etcd = EtcdServer::start();
    let mut c = config(&etcd, "/t/");
    c.timeout = Duration::from_secs(1);
    let d = EtcdDirectory::connect_with(c).unwrap();
    d.put("me", b"x").unwrap();
    let w = d.watch("", None).unwrap();
    etcd.kill();
    let t = Instant::now();
    let bound = Duration::from_secs(5) + MARGIN;
    match w.recv_timeout(bound) {
        Some(WatchEvent::Lost { reason }) => eprintln!("lost after {:?}: {reason}", t.elapsed()),
        other => panic!("expected Lost within {bound:?}, got {other:?}"),
    }
    // Lost stays.
    assert!(matches!(w.try_recv(), Some(WatchEvent::Lost { .. })));
    let t = Instant::now();
    let err = d.put("me", b"y").unwrap_err();
    assert!(
        t.elapsed() < Duration::from_secs(1) + MARGIN,
        "put took {:?}",
        t.elapsed()
    );
    assert!(matches!(err, Error::Directory { op: "put", .. }), "{err}");
    // The keepalive gives up within the TTL, and says so.
    let t = Instant::now();
    while d.lease_lost().is_none() && t.elapsed() < TTL + MARGIN {
        std::thread::sleep(Duration::from_millis(100));
    }
    let reason = d.lease_lost().expect("lease not reported lost");
    assert!(reason.contains("not renewed"), "{reason}");
    let err = d.put("me", b"z").unwrap_err();
    assert!(err.to_string().contains("lease is lost"), "{err}");
    // Dropping the directory with etcd gone returns within the timeout.
    let t = Instant::now();
    drop(d);
    assert!(
        t.elapsed() < Duration::from_secs(1) + MARGIN,
        "drop took {:?}",
        t.elapsed()
    );
}

#[test]
fn frozen_etcd_ends_the_watch_with_lost_and_calls_time_out() {
    let etcd = EtcdServer::start();
    let mut c = config(&etcd, "/t/");
    c.timeout = Duration::from_secs(1);
    c.watch_timeout = Duration::from_secs(2);
    let d = EtcdDirectory::connect_with(c).unwrap();
    let w = d.watch("", None).unwrap();
    // SIGSTOP: the connection stays open, nothing answers (a hung or partitioned etcd).
    etcd.freeze();
    let t = Instant::now();
    let err = d.get("anything").unwrap_err();
    let took = t.elapsed();
    match &err {
        Error::Directory {
            op: "get", hint, ..
        } => {
            assert!(
                hint.text().unwrap_or("").contains("is etcd running"),
                "{err}"
            )
        }
        _ => panic!("{err}"),
    }
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_secs(1) + MARGIN,
        "get took {took:?}"
    );
    let bound = Duration::from_secs(2) + MARGIN;
    match w.recv_timeout(bound) {
        Some(WatchEvent::Lost { reason }) => {
            assert!(reason.contains("did not answer"), "{reason}");
            eprintln!("lost after {:?}: {reason}", t.elapsed());
        }
        other => panic!("expected Lost within {bound:?}, got {other:?}"),
    }
    etcd.thaw();
}

#[test]
fn idle_watch_stays_open_through_progress_reports() {
    let etcd = EtcdServer::start();
    let mut c = config(&etcd, "/t/");
    c.watch_timeout = Duration::from_secs(1);
    let d = EtcdDirectory::connect_with(c).unwrap();
    let other = connect(&etcd, "/t/");
    let w = d.watch("", None).unwrap();
    // Three and a half watch timeouts (and more than one TTL) without a change.
    assert_eq!(w.recv_timeout(Duration::from_millis(3500)), None);
    other.put("late", b"1").unwrap();
    assert_eq!(put_of(&next(&w, Duration::from_secs(5))).0, "late");
    assert_eq!(d.lease_lost(), None);
    d.put("mine", b"still").unwrap();
}

#[test]
fn oversized_keys_and_values_are_refused_with_a_typed_error() {
    let etcd = EtcdServer::start();
    let d = connect(&etcd, "/t/");
    let long = "k".repeat(MAX_KEY_LEN);
    for err in [
        d.put(&long, b"x").unwrap_err(),
        d.get(&long).unwrap_err(),
        d.delete(&long).unwrap_err(),
        d.list(&long).unwrap_err(),
        d.watch(&long, None).unwrap_err(),
    ] {
        assert!(
            matches!(
                &err,
                Error::TooLarge {
                    len: 1027,
                    max: 1024,
                    ..
                }
            ),
            "{err}"
        );
    }
    let big = vec![7u8; MAX_VALUE_LEN + 1];
    let err = d.put("big", &big).unwrap_err();
    assert!(
        matches!(
            &err,
            Error::TooLarge {
                len: 1048577,
                max: 1048576,
                ..
            }
        ),
        "{err}"
    );
    // At the bounds, accepted and returned whole.
    let key = "k".repeat(MAX_KEY_LEN - 3);
    let max = vec![9u8; MAX_VALUE_LEN];
    d.put(&key, &max).unwrap();
    assert_eq!(d.get(&key).unwrap().as_deref(), Some(&max[..]));
    assert_eq!(d.get("big").unwrap(), None, "nothing was put");
}

#[test]
fn hostile_records_from_another_client_are_refused_not_used() {
    let etcd = EtcdServer::start();
    let d = connect(&etcd, "/t/");
    let listing = d.list("").unwrap();
    let w = d.watch("", Some(listing.revision)).unwrap();
    d.put("good", b"ok").unwrap();
    // Another client writes what gdr-xfer must not accept: a non-UTF-8 key and a value over the
    // bound (etcd itself takes up to 1.5 MiB).
    let (rt, mut raw) = raw_client(&etcd);
    rt.block_on(raw.put(b"/t/bad-\xff".to_vec(), b"v".to_vec(), None))
        .unwrap();
    rt.block_on(raw.put("/t/huge", vec![1u8; MAX_VALUE_LEN + 1], None))
        .unwrap();
    d.put("good2", b"ok").unwrap();

    let l = d.list("").unwrap();
    let keys: Vec<&str> = l.entries.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, ["good", "good2"]);
    assert_eq!(l.refused.len(), 2, "{:?}", l.refused);
    assert!(l.refused[0].1.contains("UTF-8"), "{:?}", l.refused);
    assert!(l.refused[1].1.contains("1048577"), "{:?}", l.refused);
    let err = d.get("huge").unwrap_err();
    assert!(
        matches!(&err, Error::Directory { op: "get", detail, .. } if detail.contains("1048577")),
        "{err}"
    );

    assert_eq!(put_of(&next(&w, Duration::from_secs(5))).0, "good");
    for want in ["UTF-8", "1048577"] {
        match next(&w, Duration::from_secs(5)) {
            WatchEvent::Refused { reason, .. } => assert!(reason.contains(want), "{reason}"),
            other => panic!("expected Refused, got {other:?}"),
        }
    }
    assert_eq!(put_of(&next(&w, Duration::from_secs(5))).0, "good2");
}

#[test]
fn no_etcd_fails_within_the_timeout_with_a_hint() {
    // A port nobody listens on (bound, then released).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let endpoint = format!("127.0.0.1:{port}");
    let t = Instant::now();
    let err = EtcdDirectory::connect(
        std::slice::from_ref(&endpoint),
        "/t/",
        TTL,
        Duration::from_secs(1),
    )
    .unwrap_err();
    let took = t.elapsed();
    assert!(
        took < Duration::from_secs(1) + MARGIN,
        "connect took {took:?}"
    );
    eprintln!("connect failed after {took:?}: {err}");
    match &err {
        Error::Directory { op, hint, .. } => {
            assert_eq!(*op, "connect");
            let hint = hint.text().unwrap_or("");
            assert!(
                hint.contains(&format!("is etcd running at [\"{endpoint}\"]")),
                "{hint}"
            );
            assert!(hint.contains("etcd --listen-client-urls"), "{hint}");
        }
        _ => panic!("{err}"),
    }
    // Bad arguments are refused before anything is tried.
    assert!(matches!(
        EtcdDirectory::connect(&[], "/t/", TTL, Duration::from_secs(1)),
        Err(Error::InvalidArgument { .. })
    ));
    assert!(matches!(
        EtcdDirectory::connect(&[endpoint], "/t/", Duration::ZERO, Duration::from_secs(1)),
        Err(Error::InvalidArgument { .. })
    ));
}

#[test]
fn a_lease_revoked_behind_our_back_ends_watches_and_puts() {
    let etcd = EtcdServer::start();
    let d = connect(&etcd, "/t/");
    d.put("me/metadata", b"x").unwrap();
    let w = d.watch("", None).unwrap();
    // An operator (or a hostile client) revokes the directory's lease: `etcdctl lease revoke`.
    revoke_behind_its_back(&etcd, d.lease_id());
    assert_eq!(delete_of(&next(&w, Duration::from_secs(5))), "me/metadata");
    // The next keepalive (within TTL / 3) learns it, and every watch of the directory ends.
    match w.recv_timeout(TTL + MARGIN) {
        Some(WatchEvent::Lost { reason }) => assert!(reason.contains("lease"), "{reason}"),
        other => panic!("expected Lost, got {other:?}"),
    }
    assert!(d.lease_lost().is_some());
    let err = d.put("me/metadata", b"again").unwrap_err();
    assert!(
        matches!(&err, Error::Directory { op: "put", detail, .. } if detail.contains("lease is lost")),
        "{err}"
    );
    // A watch made after the loss ends at once; reads still work.
    let late = d.watch("", None).unwrap();
    assert!(matches!(late.try_recv(), Some(WatchEvent::Lost { .. })));
    assert_eq!(d.get("me/metadata").unwrap(), None);
    // The revoke at drop finds the lease gone and says nothing is wrong.
    drop(d);
}

#[test]
fn directories_and_watches_can_be_shared_between_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<EtcdDirectory>();
    send_sync::<Watch>();
    let etcd = EtcdServer::start();
    let d = std::sync::Arc::new(connect(&etcd, "/t/"));
    let w = d.watch("", None).unwrap();
    let writers: Vec<_> = (0..4)
        .map(|t| {
            let d = d.clone();
            std::thread::spawn(move || {
                for i in 0..10 {
                    d.put(&format!("t{t}/{i}"), b"x").unwrap();
                }
            })
        })
        .collect();
    for h in writers {
        h.join().unwrap();
    }
    let mut seen = 0;
    while let Some(ev) = w.recv_timeout(Duration::from_secs(5)) {
        put_of(&ev);
        seen += 1;
        if seen == 40 {
            break;
        }
    }
    assert_eq!(seen, 40);
    assert_eq!(d.list("").unwrap().entries.len(), 40);
}

#[test]
fn bad_endpoints_fail_with_an_error_not_a_panic() {
    for ep in [
        "not a uri",
        "http://",
        "127.0.0.1:99999",
        "[::1",
        "https://127.0.0.1:1",
    ] {
        let t = Instant::now();
        match EtcdDirectory::connect(&[ep.to_string()], "/t/", TTL, Duration::from_secs(1)) {
            Err(Error::Directory { op: "connect", .. }) => {}
            other => panic!("{ep:?}: expected a connect error, got {other:?}"),
        }
        assert!(
            t.elapsed() < Duration::from_secs(1) + MARGIN,
            "{ep:?}: {:?}",
            t.elapsed()
        );
    }
}

#[test]
fn a_watch_from_a_compacted_revision_is_refused_or_lost_never_silent() {
    let etcd = EtcdServer::start();
    let d = connect(&etcd, "/t/");
    d.put("a", b"1").unwrap();
    let old = d.list("").unwrap();
    d.put("b", b"2").unwrap();
    d.put("c", b"3").unwrap();
    let now = d.list("").unwrap().revision;
    let (rt, mut raw) = raw_client(&etcd);
    rt.block_on(raw.compact(now, None)).unwrap();
    match d.watch("", Some(old.revision)) {
        Err(e @ Error::Directory { op: "watch", .. }) => eprintln!("refused: {e}"),
        Err(e) => panic!("unexpected error {e}"),
        Ok(w) => match w.recv_timeout(Duration::from_secs(5)) {
            Some(WatchEvent::Lost { reason }) => {
                assert!(reason.contains("compacted"), "{reason}");
                eprintln!("lost: {reason}");
            }
            other => panic!("expected Lost (compacted), got {other:?}"),
        },
    }
    // Listing again and watching after the new listing works.
    let again = d.list("").unwrap();
    let w = d.watch("", Some(again.revision)).unwrap();
    d.put("d", b"4").unwrap();
    assert_eq!(put_of(&next(&w, Duration::from_secs(5))).0, "d");
}

#[test]
fn usable_from_inside_another_tokio_runtime() {
    let etcd = EtcdServer::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // Blocking calls inside someone's async code are bad for their runtime, but must not panic
    // (as a nested block_on would) or deadlock; nor may dropping the directory there.
    rt.block_on(async {
        let d = connect(&etcd, "/t/");
        let w = d.watch("", None).unwrap();
        d.put("x", b"1").unwrap();
        assert_eq!(put_of(&next(&w, Duration::from_secs(5))).0, "x");
        drop(w);
        drop(d);
    });
}

/// Another etcd client (as `etcdctl` or a hostile process), and the runtime it runs on.
fn raw_client(etcd: &EtcdServer) -> (tokio::runtime::Runtime, etcd_client::Client) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let endpoint = etcd.endpoint();
    let raw = rt
        .block_on(etcd_client::Client::connect([endpoint], None))
        .unwrap();
    (rt, raw)
}

/// Revokes `lease` from another client, as an operator (`etcdctl lease revoke`) or etcd itself
/// (the lease expired while this process was cut off) would.
fn revoke_behind_its_back(etcd: &EtcdServer, lease: i64) {
    let (rt, mut raw) = raw_client(etcd);
    rt.block_on(raw.lease_revoke(lease)).unwrap();
}

/// The holder's lease of a refused name, checked to be `holder`'s.
fn taken_by(err: &Error, call: &str, name: &str, holder: &EtcdDirectory) {
    match err {
        Error::NameTaken {
            call: c,
            name: n,
            holder_lease,
            hint,
            ..
        } => {
            assert_eq!(*c, call, "{err}");
            assert_eq!(n, name, "{err}");
            assert_eq!(*holder_lease, holder.lease_id(), "{err}");
            assert!(hint.text().is_some(), "{err}");
        }
        other => panic!("expected NameTaken, got {other}"),
    }
}

#[test]
fn put_never_replaces_a_key_of_another_lease() {
    let etcd = EtcdServer::start();
    let a = connect(&etcd, "/t/");
    let b = connect(&etcd, "/t/");
    a.put("svc/endpoint", b"a's").unwrap();
    a.put("svc/endpoint", b"a's again").unwrap();
    let err = b.put("svc/endpoint", b"b's").unwrap_err();
    taken_by(&err, "EtcdDirectory::put", "svc/endpoint", &a);
    let text = err.to_string();
    assert!(
        text.contains("EtcdDirectory::put: the name \"svc/endpoint\" is taken")
            && text.contains(&format!("{:#x}", a.lease_id())),
        "{text}"
    );
    assert!(!b.delete("svc/endpoint").unwrap());
    drop(b);
    assert_eq!(
        a.get("svc/endpoint").unwrap().as_deref(),
        Some(&b"a's again"[..])
    );
    // Once a's key is gone, the key is anyone's; a's own delete does not touch the new one.
    assert!(a.delete("svc/endpoint").unwrap());
    let c = connect(&etcd, "/t/");
    c.put("svc/endpoint", b"c's").unwrap();
    assert!(!a.delete("svc/endpoint").unwrap());
    assert_eq!(a.get("svc/endpoint").unwrap().as_deref(), Some(&b"c's"[..]));
    // A key put with no lease (another client) is nobody's to replace either.
    let (rt, mut raw) = raw_client(&etcd);
    rt.block_on(raw.put("/t/bare", "v", None)).unwrap();
    match c.put("bare", b"x").unwrap_err() {
        Error::NameTaken {
            holder_lease: 0,
            key,
            ..
        } => assert_eq!(key, "/t/bare"),
        other => panic!("{other}"),
    }
}

#[test]
fn a_claimed_name_is_refused_to_every_other_claim_and_its_records_are_untouched() {
    let etcd = EtcdServer::start();
    let a = connect(&etcd, "/t/");
    let watcher = connect(&etcd, "/t/");
    let claim = a.claim("svc/", "svc/endpoint", b"a's address").unwrap();
    assert_eq!((claim.scope(), claim.key()), ("svc/", "svc/endpoint"));
    assert!(claim.revision() > 0);
    // Values at the bound go through the guarded put (etcd's request bound is 1.5 MiB).
    let big = vec![5u8; MAX_VALUE_LEN];
    a.put_claimed(&claim, "svc/segments/1", &big).unwrap();
    a.put_claimed(&claim, "svc/segments/1", b"seg 1").unwrap();
    let before = a.list("svc/").unwrap();
    let (_, w) = watcher.list_and_watch("svc/").unwrap();

    // Another directory, and another caller of the same directory: refused, naming a's lease.
    let b = connect(&etcd, "/t/");
    let err = b.claim("svc/", "svc/endpoint", b"b's address").unwrap_err();
    taken_by(&err, "EtcdDirectory::claim", "svc/", &a);
    assert!(
        err.to_string().contains("choose another agent name"),
        "{err}"
    );
    let err = a.claim("svc/", "svc/endpoint", b"again").unwrap_err();
    taken_by(&err, "EtcdDirectory::claim", "svc/", &a);
    assert!(err.to_string().contains("same directory"), "{err}");
    // b can neither replace nor delete a's records, nor use a's claim.
    taken_by(
        &b.put("svc/endpoint", b"b's").unwrap_err(),
        "EtcdDirectory::put",
        "svc/endpoint",
        &a,
    );
    assert!(!b.delete("svc/endpoint").unwrap());
    assert!(!b.delete("svc/segments/1").unwrap());
    assert!(matches!(
        b.put_claimed(&claim, "svc/segments/2", b"x"),
        Err(Error::InvalidArgument { .. })
    ));
    assert!(matches!(
        b.release(&claim),
        Err(Error::InvalidArgument { .. })
    ));
    assert!(matches!(
        a.put_claimed(&claim, "other/x", b"x"),
        Err(Error::InvalidArgument { .. })
    ));
    assert!(matches!(
        a.claim("svc/", "other/endpoint", b"x"),
        Err(Error::InvalidArgument { .. })
    ));
    assert!(matches!(
        a.claim("", "svc/endpoint", b"x"),
        Err(Error::InvalidArgument { .. })
    ));
    // The refused directory goes (its lease is revoked): a's records stay, and a watcher of
    // them saw nothing at all.
    drop(b);
    assert_eq!(a.list("svc/").unwrap().entries, before.entries);
    assert!(
        w.recv_timeout(Duration::from_secs(1)).is_none(),
        "a's records did not change"
    );
}

#[test]
fn a_name_is_free_again_once_its_holder_released_it_or_its_lease_ended() {
    let etcd = EtcdServer::start();
    let a = connect(&etcd, "/t/");
    let b = connect(&etcd, "/t/");
    let claim = a.claim("svc/", "svc/endpoint", b"a").unwrap();
    a.put_claimed(&claim, "svc/segments/1", b"seg").unwrap();
    // Released with a record left under the name: still held.
    assert!(a.release(&claim).unwrap());
    assert!(!a.release(&claim).unwrap(), "released once");
    taken_by(
        &b.claim("svc/", "svc/endpoint", b"b").unwrap_err(),
        "EtcdDirectory::claim",
        "svc/",
        &a,
    );
    // A released claim writes nothing more.
    let err = a.put_claimed(&claim, "svc/segments/2", b"x").unwrap_err();
    assert!(
        matches!(&err, Error::Directory { op: "put", detail, .. } if detail.contains("claim")),
        "{err}"
    );
    // Every record gone: free.
    assert!(a.delete("svc/segments/1").unwrap());
    let claim_b = b.claim("svc/", "svc/endpoint", b"b").unwrap();
    assert!(claim_b.revision() > claim.revision());
    // Lease ended (revoked behind the holder's back, as when it expires): free again.
    b.put_claimed(&claim_b, "svc/segments/1", b"b's seg")
        .unwrap();
    revoke_behind_its_back(&etcd, b.lease_id());
    assert!(a.list("svc/").unwrap().entries.is_empty());
    let c = connect(&etcd, "/t/");
    c.claim("svc/", "svc/endpoint", b"c").unwrap();
}

#[test]
fn a_former_holder_never_deletes_or_replaces_the_records_of_a_later_one() {
    let etcd = EtcdServer::start();
    // Another lease took the name after ours ended.
    let a = connect(&etcd, "/t/");
    let claim = a.claim("svc/", "svc/endpoint", b"a").unwrap();
    a.put_claimed(&claim, "svc/segments/1", b"a's seg").unwrap();
    revoke_behind_its_back(&etcd, a.lease_id());
    let b = connect(&etcd, "/t/");
    let claim_b = b.claim("svc/", "svc/endpoint", b"b").unwrap();
    b.put_claimed(&claim_b, "svc/segments/1", b"b's seg")
        .unwrap();
    let held = b.list("svc/").unwrap().entries;
    assert!(!a.delete_claimed(&claim, "svc/segments/1").unwrap());
    assert!(!a.delete("svc/segments/1").unwrap());
    assert!(!a.release(&claim).unwrap());
    // Before a's keepalive notices the loss, etcd refuses; after, the directory does.
    assert!(a.put_claimed(&claim, "svc/segments/2", b"x").is_err());
    assert!(a.put("svc/endpoint", b"x").is_err());
    assert_eq!(b.list("svc/").unwrap().entries, held);
    // Publishing again with a new directory: the name is b's now.
    let a2 = connect(&etcd, "/t/");
    taken_by(
        &a2.claim("svc/", "svc/endpoint", b"a2").unwrap_err(),
        "EtcdDirectory::claim",
        "svc/",
        &b,
    );

    // The same lease: a claim released and made again through one directory (two agents of
    // one name in turn, sharing it). The old claim's deletes do not touch the new claim's
    // records, although both are this lease's.
    let d = connect(&etcd, "/t/");
    let first = d.claim("x/", "x/endpoint", b"first").unwrap();
    d.put_claimed(&first, "x/segments/1", b"first's").unwrap();
    assert!(d.delete_claimed(&first, "x/segments/1").unwrap());
    assert!(d.release(&first).unwrap());
    let second = d.claim("x/", "x/endpoint", b"second").unwrap();
    d.put_claimed(&second, "x/segments/1", b"second's").unwrap();
    assert!(!d.delete_claimed(&first, "x/segments/1").unwrap());
    assert!(!d.release(&first).unwrap());
    assert!(d.put_claimed(&first, "x/segments/2", b"stale").is_err());
    let keys: Vec<_> = d.list("x/").unwrap().entries;
    assert_eq!(
        keys,
        [
            ("x/endpoint".to_string(), b"second".to_vec()),
            ("x/segments/1".to_string(), b"second's".to_vec())
        ]
    );
}

#[test]
fn of_directories_claiming_one_name_at_once_exactly_one_wins() {
    let etcd = EtcdServer::start();
    let dirs: Vec<_> = (0..6)
        .map(|_| std::sync::Arc::new(connect(&etcd, "/t/")))
        .collect();
    for round in 0..5 {
        let scope = format!("race-{round}/");
        let key = format!("race-{round}/endpoint");
        let barrier = std::sync::Arc::new(std::sync::Barrier::new(dirs.len()));
        let results: Vec<_> = dirs
            .iter()
            .map(|d| {
                let (d, barrier, scope, key) =
                    (d.clone(), barrier.clone(), scope.clone(), key.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    let r = d.claim(&scope, &key, &d.lease_id().to_le_bytes());
                    // A plain put of the same key at once by everyone: still only the winner's.
                    let p = d.put(&key, &d.lease_id().to_le_bytes());
                    (d.lease_id(), r, p)
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect();
        let winners: Vec<i64> = results
            .iter()
            .filter(|(_, r, _)| r.is_ok())
            .map(|(l, _, _)| *l)
            .collect();
        assert_eq!(winners.len(), 1, "round {round}: {results:?}");
        let winner = winners[0];
        for (lease, r, p) in &results {
            if *lease == winner {
                p.as_ref().unwrap();
                continue;
            }
            for e in [r.as_ref().unwrap_err(), p.as_ref().unwrap_err()] {
                assert!(
                    matches!(e, Error::NameTaken { holder_lease, .. } if *holder_lease == winner),
                    "{e}"
                );
            }
        }
        let value = dirs[0].get(&key).unwrap().unwrap();
        assert_eq!(value, winner.to_le_bytes());
    }
}
