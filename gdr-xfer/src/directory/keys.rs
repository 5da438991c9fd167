//! Keys and values of the etcd directory: the size bounds, the checks applied to what this process
//! puts, and the checks applied to what etcd sends back (which is untrusted: any client of the
//! same etcd can write under the prefix).

use crate::error::{Error, Hint, Result};

/// The longest key, prefix included, that the directory puts or accepts from etcd (1 KiB).
pub const MAX_KEY_LEN: usize = 1024;

/// The largest value the directory puts or accepts from etcd (1 MiB). etcd itself refuses
/// requests over `--max-request-bytes` (1.5 MiB by default).
pub const MAX_VALUE_LEN: usize = 1 << 20;

/// The most entries one [`list`](super::EtcdDirectory::list) returns before it fails.
pub const MAX_LIST_ENTRIES: usize = 100_000;

/// The full key for `key` under `prefix`, checked against [`MAX_KEY_LEN`].
pub(crate) fn full_key(prefix: &str, key: &str, op: &'static str) -> Result<String> {
    let len = prefix.len() + key.len();
    if len > MAX_KEY_LEN {
        return Err(Error::TooLarge {
            what: format!(
                "directory {op}: key {:?} under prefix {prefix:?}",
                shorten(key)
            ),
            len: len as u64,
            max: MAX_KEY_LEN as u64,
            hint: "use shorter names (the key bound keeps records of hostile peers small)".into(),
        });
    }
    Ok(format!("{prefix}{key}"))
}

/// Checks a value this process is about to put.
pub(crate) fn check_value(key: &str, value: &[u8]) -> Result<()> {
    if value.len() > MAX_VALUE_LEN {
        return Err(Error::TooLarge {
            what: format!("directory put: value for key {:?}", shorten(key)),
            len: value.len() as u64,
            max: MAX_VALUE_LEN as u64,
            hint: "publish a smaller record (split it over several keys, or send the bulk over the peer connection)".into(),
        });
    }
    Ok(())
}

/// A key and value received from etcd, checked: the key lies under `prefix`, is UTF-8 and within
/// [`MAX_KEY_LEN`]; the value (when there is one) is within [`MAX_VALUE_LEN`]. Returns the key
/// relative to `prefix`, or why it was refused.
pub(crate) fn accept(
    prefix: &str,
    key: &[u8],
    value: Option<&[u8]>,
) -> std::result::Result<String, String> {
    if key.len() > MAX_KEY_LEN {
        return Err(format!(
            "key of {} bytes is over the {MAX_KEY_LEN}-byte bound",
            key.len()
        ));
    }
    if let Some(v) = value {
        if v.len() > MAX_VALUE_LEN {
            return Err(format!(
                "value of {} bytes is over the {MAX_VALUE_LEN}-byte bound",
                v.len()
            ));
        }
    }
    let key = std::str::from_utf8(key).map_err(|e| format!("key is not UTF-8 ({e})"))?;
    match key.strip_prefix(prefix) {
        Some(rel) => Ok(rel.to_owned()),
        None => Err(format!(
            "key {key:?} does not lie under the prefix {prefix:?}"
        )),
    }
}

/// A key received from etcd as text for messages: lossy UTF-8, cut to 256 bytes' worth.
pub(crate) fn display_key(key: &[u8]) -> String {
    let cut = &key[..key.len().min(256)];
    let mut s = String::from_utf8_lossy(cut).into_owned();
    if key.len() > cut.len() {
        s.push_str("...");
    }
    s
}

/// `key` for messages, cut to at most 256 bytes at a character boundary.
pub(crate) fn shorten(key: &str) -> String {
    if key.len() <= 256 {
        return key.to_owned();
    }
    let mut end = 256;
    while !key.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &key[..end])
}

/// The end of the key range holding every key that starts with `prefix` (etcd's `range_end`):
/// `prefix` with its last byte below 0xff incremented and what follows dropped; `[0]` (every key)
/// when there is no such byte.
pub(crate) fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// Checks the prefix given to `connect`.
pub(crate) fn check_prefix(prefix: &str) -> Result<()> {
    if prefix.len() > MAX_KEY_LEN / 2 {
        return Err(Error::invalid(
            format!(
                "directory prefix {:?} is {} bytes, over half the {MAX_KEY_LEN}-byte key bound",
                shorten(prefix),
                prefix.len()
            ),
            Hint::new("use a short prefix such as \"/gdr-xfer/agents/\""),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_increments_the_last_byte_below_0xff() {
        assert_eq!(prefix_end(b"a/b"), b"a/c");
        assert_eq!(prefix_end(b"a\xff\xff"), b"b");
        assert_eq!(prefix_end(b"\xff\xff"), vec![0]);
        assert_eq!(prefix_end(b""), vec![0]);
    }

    #[test]
    fn full_key_bounds_prefix_plus_key() {
        let key = "k".repeat(MAX_KEY_LEN - 3);
        assert_eq!(full_key("/p/", &key, "put").unwrap().len(), MAX_KEY_LEN);
        let err = full_key("/p/", &format!("{key}x"), "put").unwrap_err();
        assert!(
            matches!(
                &err,
                Error::TooLarge {
                    len: 1025,
                    max: 1024,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn accept_refuses_hostile_entries_without_panicking() {
        assert_eq!(accept("/p/", b"/p/a", Some(b"v")), Ok("a".to_owned()));
        assert!(accept("/p/", b"/q/a", None).unwrap_err().contains("prefix"));
        assert!(accept("/p/", b"/p/\xff\xfe", None)
            .unwrap_err()
            .contains("UTF-8"));
        let long = vec![b'a'; MAX_KEY_LEN + 1];
        assert!(accept("", &long, None).unwrap_err().contains("1025 bytes"));
        let big = vec![0u8; MAX_VALUE_LEN + 1];
        assert!(accept("/p/", b"/p/a", Some(&big))
            .unwrap_err()
            .contains("1048577"));
        // A multi-byte character straddling the display cut is replaced, not sliced.
        let mut k = vec![b'a'; 255];
        k.extend_from_slice("é".as_bytes());
        assert!(display_key(&k).ends_with("..."));
        let s: String = "é".repeat(200);
        assert!(shorten(&s).ends_with("..."));
    }
}
