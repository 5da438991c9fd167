//! CPU access to host memory the NIC and other threads may access at the same time.
//!
//! Every access is atomic, and every location is always accessed with the same size, chosen by
//! its address alone: a byte whose aligned 8-byte word lies wholly inside the span is accessed
//! through that word, as one `AtomicU64`; a byte of a word that straddles an end of the span
//! (only when the span itself does not start or end 8-aligned) through its own `AtomicU8`. So
//! racing accesses never mix atomic with non-atomic accesses, nor atomics of different sizes on
//! the same bytes: what the Rust memory model requires for racing accesses to be defined.
//!
//! A copy that covers only part of a word updates it with a compare-and-swap loop (load, merge,
//! swap), so the other bytes of the word are never written back stale, and copies of whole words
//! are plain (relaxed) loads and stores: as fast as a word-wise `memcpy`.

use std::ops::Range;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

use super::range::check_span;
use crate::error::{Error, Hint, Result};

/// The size (and alignment) of a word.
const WORD: usize = 8;

/// `len` bytes at `ptr`, shared by the CPU (any number of threads) and the NIC; see the module
/// documentation for the access rules.
pub(crate) struct AtomicBytes {
    ptr: NonNull<u8>,
    len: usize,
    /// Offset of the first whole aligned word (`0..8`, at most `len`).
    head: usize,
    /// Offset one past the last whole aligned word (`head..=len`, `head + 8k`).
    body_end: usize,
}

// SAFETY: the bytes are only ever accessed through atomics (see the module docs), which any
// thread may perform; the pointer is not tied to a thread.
unsafe impl Send for AtomicBytes {}
// SAFETY: as above: concurrent `&self` accesses are atomic and never of mixed sizes.
unsafe impl Sync for AtomicBytes {}

/// How `[offset, end)` splits into accesses: lone bytes before the whole words, a partial
/// leading word, whole words, a partial trailing word, lone bytes after.
#[derive(Debug, PartialEq, Eq)]
struct Split {
    pre: Range<usize>,
    first: Option<(usize, Range<usize>)>,
    words: Range<usize>,
    last: Option<(usize, Range<usize>)>,
    post: Range<usize>,
}

impl AtomicBytes {
    /// A view of `len` bytes at `ptr`.
    ///
    /// # Safety
    ///
    /// For the life of the value, `ptr` must be valid for reads and writes of `len` initialised
    /// bytes, and every access to them from Rust must go through this value (or through views
    /// whose own contracts exclude all concurrent access).
    pub(crate) unsafe fn new(ptr: NonNull<u8>, len: usize) -> AtomicBytes {
        let misalign = ptr.as_ptr().addr() % WORD;
        let head = ((WORD - misalign) % WORD).min(len);
        let body_end = head + (len - head) / WORD * WORD;
        AtomicBytes {
            ptr,
            len,
            head,
            body_end,
        }
    }

    /// Start of the bytes.
    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Splits `[offset, end)` (with `offset <= end <= len`) into accesses. Guarantees, relied on
    /// by the `unsafe` blocks of the copies: the pieces cover the range exactly once, in order;
    /// every offset in `pre` and `post` is a lone byte (`< head` or in `body_end..len`); every
    /// word offset in `first`, `last` and `words.step_by(8)` is a whole word (`head + 8k`, with
    /// `+ 8 <= body_end`); `offset <= words.start <= words.end <= end`.
    fn split(&self, offset: usize, end: usize) -> Split {
        let (head, body_end) = (self.head, self.body_end);
        let pre = offset.min(head)..end.min(head);
        let post = offset.max(body_end)..end.max(body_end);
        let mut b0 = offset.clamp(head, body_end);
        let mut b1 = end.clamp(head, body_end);
        let mut first = None;
        let mut last = None;
        if b0 >= b1 {
            // No whole or partial word: an empty word range at `offset`, so that offsets
            // relative to `offset` stay in range.
            (b0, b1) = (offset, offset);
        } else {
            let w0 = head + (b0 - head) / WORD * WORD;
            if b0 != w0 {
                let e = (w0 + WORD).min(b1);
                first = Some((w0, b0..e));
                b0 = e;
            }
            let w1 = head + (b1 - head) / WORD * WORD;
            if b1 != w1 && w1 >= b0 {
                last = Some((w1, w1..b1));
                b1 = w1;
            }
        }
        Split {
            pre,
            first,
            words: b0..b1,
            last,
            post,
        }
    }

    /// The lone byte at `at`.
    ///
    /// # Safety
    ///
    /// `at` must be a lone-byte offset: `at < head`, or `body_end <= at < len`.
    unsafe fn byte(&self, at: usize) -> &AtomicU8 {
        debug_assert!(at < self.head || (at >= self.body_end && at < self.len));
        // SAFETY: `at < len` (caller), so the byte is valid for reads and writes while `self`
        // lives (contract of `new`); it lies outside every whole word, so it is only ever
        // accessed as an `AtomicU8`, and `AtomicU8` has alignment 1.
        unsafe { AtomicU8::from_ptr(self.ptr.as_ptr().add(at)) }
    }

    /// The whole aligned word at offset `at`.
    ///
    /// # Safety
    ///
    /// `at` must be a whole-word offset: `head + 8k` with `at + 8 <= body_end`.
    unsafe fn word(&self, at: usize) -> &AtomicU64 {
        debug_assert!(
            at >= self.head && at + WORD <= self.body_end && (at - self.head).is_multiple_of(WORD)
        );
        // SAFETY: `[at, at + 8)` is a whole word inside the span (caller: `head + 8k`, before
        // `body_end`), so it is 8-aligned and valid for reads and writes while `self` lives
        // (contract of `new`), and these bytes are only ever accessed as this `AtomicU64`.
        unsafe { AtomicU64::from_ptr(self.ptr.as_ptr().add(at).cast::<u64>()) }
    }

    /// Replaces the bytes `r` (offsets inside the word at `w`) with `src`, keeping the others.
    ///
    /// # Safety
    ///
    /// As [`word`](Self::word): `w` must be a whole-word offset.
    unsafe fn merge(&self, w: usize, r: Range<usize>, src: impl Fn(&mut [u8])) {
        // SAFETY: `w` is a whole-word offset (caller).
        let word = unsafe { self.word(w) };
        let mut cur = word.load(Ordering::Relaxed);
        loop {
            let mut b = cur.to_ne_bytes();
            src(&mut b[r.start - w..r.end - w]);
            match word.compare_exchange_weak(
                cur,
                u64::from_ne_bytes(b),
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return,
                Err(now) => cur = now,
            }
        }
    }

    /// Copies `out.len()` bytes starting at `offset` into `out`.
    pub(crate) fn read(&self, what: &'static str, offset: usize, out: &mut [u8]) -> Result<()> {
        check_span(what, offset, out.len(), self.len)?;
        let s = self.split(offset, offset + out.len());
        let at = |r: &Range<usize>| r.start - offset..r.end - offset;
        // SAFETY: every offset given to `byte`, `word` and `merge` below comes from `split`,
        // whose `pre`/`post` are lone-byte offsets and whose `first`/`last`/`words` are
        // whole-word offsets (its documented guarantee, checked exhaustively by the
        // `splits_cover_the_range_exactly_once` test).
        unsafe {
            for i in s.pre.clone() {
                out[i - offset] = self.byte(i).load(Ordering::Relaxed);
            }
            if let Some((w, r)) = &s.first {
                let b = self.word(*w).load(Ordering::Relaxed).to_ne_bytes();
                out[at(r)].copy_from_slice(&b[r.start - w..r.end - w]);
            }
            for (chunk, w) in out[at(&s.words)]
                .chunks_exact_mut(WORD)
                .zip(s.words.clone().step_by(WORD))
            {
                chunk.copy_from_slice(&self.word(w).load(Ordering::Relaxed).to_ne_bytes());
            }
            if let Some((w, r)) = &s.last {
                let b = self.word(*w).load(Ordering::Relaxed).to_ne_bytes();
                out[at(r)].copy_from_slice(&b[r.start - w..r.end - w]);
            }
            for i in s.post.clone() {
                out[i - offset] = self.byte(i).load(Ordering::Relaxed);
            }
        }
        Ok(())
    }

    /// Copies `data` into the bytes starting at `offset`.
    pub(crate) fn write(&self, what: &'static str, offset: usize, data: &[u8]) -> Result<()> {
        check_span(what, offset, data.len(), self.len)?;
        let s = self.split(offset, offset + data.len());
        let at = |r: &Range<usize>| r.start - offset..r.end - offset;
        // SAFETY: every offset given to `byte`, `word` and `merge` below comes from `split`,
        // whose `pre`/`post` are lone-byte offsets and whose `first`/`last`/`words` are
        // whole-word offsets (its documented guarantee, checked exhaustively by the
        // `splits_cover_the_range_exactly_once` test).
        unsafe {
            for i in s.pre.clone() {
                self.byte(i).store(data[i - offset], Ordering::Relaxed);
            }
            if let Some((w, r)) = &s.first {
                self.merge(*w, r.clone(), |b| b.copy_from_slice(&data[at(r)]));
            }
            for (chunk, w) in data[at(&s.words)]
                .chunks_exact(WORD)
                .zip(s.words.clone().step_by(WORD))
            {
                let v =
                    u64::from_ne_bytes(chunk.try_into().expect("chunks_exact(8) yields 8 bytes"));
                self.word(w).store(v, Ordering::Relaxed);
            }
            if let Some((w, r)) = &s.last {
                self.merge(*w, r.clone(), |b| b.copy_from_slice(&data[at(r)]));
            }
            for i in s.post.clone() {
                self.byte(i).store(data[i - offset], Ordering::Relaxed);
            }
        }
        Ok(())
    }

    /// Sets `len` bytes starting at `offset` to `byte`.
    pub(crate) fn fill(
        &self,
        what: &'static str,
        offset: usize,
        len: usize,
        byte: u8,
    ) -> Result<()> {
        check_span(what, offset, len, self.len)?;
        let s = self.split(offset, offset + len);
        // SAFETY: every offset given to `byte`, `word` and `merge` below comes from `split`,
        // whose `pre`/`post` are lone-byte offsets and whose `first`/`last`/`words` are
        // whole-word offsets (its documented guarantee, checked exhaustively by the
        // `splits_cover_the_range_exactly_once` test).
        unsafe {
            for i in s.pre.clone().chain(s.post.clone()) {
                self.byte(i).store(byte, Ordering::Relaxed);
            }
            for (w, r) in s.first.iter().chain(s.last.iter()) {
                self.merge(*w, r.clone(), |b| b.fill(byte));
            }
            let v = u64::from_ne_bytes([byte; WORD]);
            for w in s.words.step_by(WORD) {
                self.word(w).store(v, Ordering::Relaxed);
            }
        }
        Ok(())
    }

    /// The whole aligned word at `offset`, for loads by a poller.
    pub(crate) fn word_at(&self, what: &'static str, offset: usize) -> Result<&AtomicU64> {
        check_span(what, offset, WORD, self.len)?;
        // In bounds, so `offset + 8 <= len`: a whole word iff aligned, i.e. `head + 8k`.
        if offset < self.head || !(offset - self.head).is_multiple_of(WORD) {
            return Err(Error::invalid(
                format!(
                    "{what}: offset {offset} is not 8-byte aligned (the region starts at {:#x}; \
                     aligned offsets are {} + 8k)",
                    self.ptr.as_ptr().addr(),
                    self.head
                ),
                Hint::new("poll an aligned word: the peer writes it whole, so it is never torn"),
            ));
        }
        // SAFETY: `offset` is `head + 8k` (checked above) and `offset + 8 <= len`, hence
        // `offset + 8 <= body_end`: a whole word.
        Ok(unsafe { self.word(offset) })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;

    use super::*;

    const N: usize = 40;

    /// A 48-byte, 8-aligned backing store (for Miri too), viewed from `shift` for `len` bytes.
    struct Store {
        mem: Vec<u64>,
    }

    impl Store {
        fn new() -> Store {
            Store { mem: vec![0; 6] }
        }
        /// SAFETY-relevant: the view borrows `self` mutably, so nothing else touches the store.
        fn view(&mut self, shift: usize, len: usize) -> AtomicBytes {
            assert!(shift + len <= 48);
            let base = self.mem.as_mut_ptr().cast::<u8>();
            // SAFETY: `[shift, shift + len)` lies inside the 48 initialised bytes of `mem`,
            // whose pointer came from exclusive access; the view is used only while `self` is
            // not otherwise touched (tests drop it before reading `mem`).
            unsafe { AtomicBytes::new(NonNull::new(base.add(shift)).unwrap(), len) }
        }
    }

    fn pattern(n: usize, seed: u8) -> Vec<u8> {
        (0..n)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    /// Every alignment of the span, every offset and length: reads, writes and fills agree
    /// with a plain byte-array model.
    #[test]
    fn copies_match_a_byte_model_at_every_alignment() {
        let step = if cfg!(miri) { 3 } else { 1 };
        for shift in 0..WORD {
            let mut store = Store::new();
            // The view lives in this block only: the store is read directly after it.
            let model = {
                let v = store.view(shift, N);
                let mut model = vec![0u8; N];
                let mut seed = 1u8;
                for offset in (0..=N).step_by(step) {
                    for len in (0..=N - offset).step_by(step) {
                        seed = seed.wrapping_add(1);
                        let data = pattern(len, seed);
                        v.write("t", offset, &data).unwrap();
                        model[offset..offset + len].copy_from_slice(&data);
                        let mut got = vec![0xAA; len];
                        v.read("t", offset, &mut got).unwrap();
                        assert_eq!(got, data, "shift={shift} offset={offset} len={len}");
                        if len % 3 == 0 {
                            v.fill("t", offset, len, seed).unwrap();
                            model[offset..offset + len].fill(seed);
                        }
                        let mut all = vec![0; N];
                        v.read("t", 0, &mut all).unwrap();
                        assert_eq!(all, model, "shift={shift} offset={offset} len={len}");
                    }
                }
                model
            };
            // Nothing outside the span was touched.
            let raw: Vec<u8> = store.mem.iter().flat_map(|w| w.to_ne_bytes()).collect();
            assert!(raw[..shift].iter().all(|&b| b == 0), "shift={shift}");
            assert!(raw[shift + N..].iter().all(|&b| b == 0), "shift={shift}");
            assert_eq!(raw[shift..shift + N], model[..]);
        }
    }

    #[test]
    fn splits_cover_the_range_exactly_once() {
        // Pure arithmetic: under Miri a sample is enough.
        let step = if cfg!(miri) { 5 } else { 1 };
        for shift in 0..WORD {
            let mut store = Store::new();
            let v = store.view(shift, N);
            for offset in (0..=N).step_by(step) {
                for end in (offset..=N).step_by(step) {
                    let s = v.split(offset, end);
                    let mut covered = Vec::new();
                    covered.extend(s.pre.clone());
                    if let Some((w, r)) = &s.first {
                        assert!(r.start > *w && r.end <= w + WORD, "{s:?}");
                        covered.extend(r.clone());
                    }
                    if !s.words.is_empty() {
                        assert_eq!((s.words.start - v.head) % WORD, 0, "{s:?}");
                    }
                    assert!(offset <= s.words.start && s.words.end <= end, "{s:?}");
                    assert_eq!(s.words.len() % WORD, 0, "{s:?}");
                    covered.extend(s.words.clone());
                    if let Some((w, r)) = &s.last {
                        assert!(r.start == *w && r.end < w + WORD, "{s:?}");
                        covered.extend(r.clone());
                    }
                    covered.extend(s.post.clone());
                    assert_eq!(covered, (offset..end).collect::<Vec<_>>(), "{shift} {s:?}");
                    // Words are whole words of the span; lone bytes are outside them.
                    for w in s.words.clone().step_by(WORD) {
                        assert!((shift + w) % WORD == 0 && w + WORD <= v.body_end);
                    }
                    for i in s.pre.clone().chain(s.post.clone()) {
                        assert!(i < v.head || i >= v.body_end);
                    }
                }
            }
        }
    }

    #[test]
    fn out_of_range_and_overflowing_requests_are_errors() {
        let mut store = Store::new();
        let v = store.view(3, N);
        let mut buf = [0u8; 8];
        assert!(matches!(
            v.read("t", N - 7, &mut buf),
            Err(Error::OutOfBounds { limit: 40, .. })
        ));
        assert!(v.read("t", usize::MAX - 3, &mut buf).is_err());
        assert!(v.write("t", usize::MAX, &buf).is_err());
        assert!(v.fill("t", 1, usize::MAX, 0).is_err());
        assert!(v.fill("t", usize::MAX, usize::MAX, 0).is_err());
        assert!(v.word_at("t", usize::MAX - 3).is_err());
        assert!(v.word_at("t", usize::MAX).is_err());
        // shift 3: whole words start at offsets 5, 13, 21, 29; 37 + 8 > 40.
        assert_eq!((v.head, v.body_end), (5, 37));
        assert!(v.word_at("t", 5).is_ok() && v.word_at("t", 29).is_ok());
        let e = v.word_at("t", 8).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
        assert!(e.to_string().contains("aligned offsets are 5 + 8k"), "{e}");
        assert!(v.word_at("t", 0).is_err());
        assert!(matches!(v.word_at("t", 33), Err(Error::OutOfBounds { .. })));
        assert!(v.read("t", N, &mut []).is_ok());
    }

    #[test]
    fn tiny_spans_have_no_words() {
        for shift in 0..WORD {
            for len in 0..WORD {
                let mut store = Store::new();
                let v = store.view(shift, len);
                assert!(v.body_end - v.head <= len);
                let data = pattern(len, 9);
                v.write("t", 0, &data).unwrap();
                let mut got = vec![0; len];
                v.read("t", 0, &mut got).unwrap();
                assert_eq!(got, data);
            }
        }
    }

    /// Threads writing whole, uniform words while others read: no read ever sees a word mixing
    /// two writes, including words a partial (compare-and-swap) write covers.
    #[test]
    fn concurrent_copies_never_tear_a_word() {
        let rounds = if cfg!(miri) { 20 } else { 20_000 };
        let mut store = Store::new();
        let v = store.view(0, 48);
        let done = AtomicBool::new(false);
        let torn = std::sync::atomic::AtomicUsize::new(0);
        let reads = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|s| {
            let writers: Vec<_> = (0..2u8)
                .map(|t| {
                    let v = &v;
                    s.spawn(move || {
                        for i in 0..rounds {
                            let b = (i as u8).wrapping_mul(2).wrapping_add(t);
                            // Whole words 0..40, then bytes 41..47 of the last word (a partial
                            // write, merged by compare-and-swap), leaving bytes 40 and 47 alone.
                            v.write("t", 0, &[b; 40]).unwrap();
                            v.fill("t", 41, 6, b).unwrap();
                        }
                    })
                })
                .collect();
            for _ in 0..2 {
                let (v, done, torn, reads) = (&v, &done, &torn, &reads);
                s.spawn(move || {
                    let mut buf = [0u8; 48];
                    while !done.load(Ordering::Relaxed) {
                        v.read("t", 0, &mut buf).unwrap();
                        reads.fetch_add(1, Ordering::Relaxed);
                        for w in buf[..40].chunks_exact(8) {
                            if w.iter().any(|&x| x != w[0]) {
                                torn.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        let last = &buf[40..];
                        if last[0] != 0 || last[7] != 0 || last[1..7].iter().any(|&x| x != last[1])
                        {
                            torn.fetch_add(1, Ordering::Relaxed);
                        }
                        let w = v.word_at("t", 16).unwrap().load(Ordering::Acquire);
                        if w.to_ne_bytes().iter().any(|&x| x != w as u8) {
                            torn.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            }
            for w in writers {
                w.join().unwrap();
            }
            done.store(true, Ordering::Relaxed);
        });
        assert!(reads.into_inner() > 0, "the readers ran");
        assert_eq!(torn.into_inner(), 0);
    }
}
