//! The one place where C return conventions become `Result`s, and where failed teardown calls are
//! reported.
//!
//! libibverbs returns 0 or a positive errno (some providers a negative one); librdmacm and a few
//! verbs return -1 and set `errno`; constructors return NULL and set `errno`. Every call site goes
//! through [`check`] or [`non_null`], so an error always names the call, its arguments, the errno
//! (as the [`Error::Verbs`] source) and a hint chosen from the errno.

use std::fmt;
use std::ptr::NonNull;

use crate::error::{errno_text, Error, Hint, Result};

/// The positive errno a return code stands for: `-1` means "look at `errno`", any other negative
/// value is a negated errno, a positive value is the errno itself.
pub(crate) fn errno_of(rc: libc::c_int) -> i32 {
    if rc == -1 {
        match std::io::Error::last_os_error().raw_os_error() {
            Some(e) if e != 0 => e,
            _ => libc::EPERM,
        }
    } else {
        rc.saturating_abs()
    }
}

/// `Ok(())` for a zero return code, otherwise an [`Error::Verbs`] naming `call` with `args()` and
/// the hint `hint(errno)`. `args` and `hint` only run on failure.
pub(crate) fn check(
    call: &'static str,
    rc: libc::c_int,
    args: impl FnOnce() -> String,
    hint: impl FnOnce(i32) -> Hint,
) -> Result<()> {
    if rc == 0 {
        return Ok(());
    }
    let errno = errno_of(rc);
    Err(Error::verbs(call, args(), errno, hint(errno)))
}

/// The pointer a constructor returned, or an [`Error::Verbs`] with the thread's `errno` when it is
/// NULL. Call it right after the constructor, before anything else can change `errno`.
pub(crate) fn non_null<T>(
    call: &'static str,
    ptr: *mut T,
    args: impl FnOnce() -> String,
    hint: impl FnOnce(i32) -> Hint,
) -> Result<NonNull<T>> {
    match NonNull::new(ptr) {
        Some(p) => Ok(p),
        None => {
            let errno = std::io::Error::last_os_error()
                .raw_os_error()
                .filter(|&e| e != 0)
                .unwrap_or(libc::ENOMEM);
            Err(Error::verbs(call, args(), errno, hint(errno)))
        }
    }
}

/// No hint: for calls whose error text says enough.
pub(crate) fn no_hint(_errno: i32) -> Hint {
    Hint::NONE
}

/// Reports the outcome of a destroy/free call made from `Drop` (where nothing can be returned):
/// returns whether it succeeded, and logs an error naming `call`, `what` and the errno otherwise.
/// Callers that get `false` must keep alive whatever the device may still use (leak it).
pub(crate) fn teardown(call: &'static str, what: impl fmt::Display, rc: libc::c_int) -> bool {
    if rc == 0 {
        return true;
    }
    log::error!(
        "{call}({what}) failed: {} (errno {}); its resources are kept (leaked) rather than freed",
        errno_text(errno_of(rc)),
        errno_of(rc)
    );
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn return_conventions_become_errnos() {
        assert_eq!(errno_of(libc::EINVAL), libc::EINVAL);
        assert_eq!(errno_of(-libc::ENOMEM), libc::ENOMEM);
        assert_eq!(
            errno_of(i32::MIN),
            i32::MAX,
            "no overflow on hostile values"
        );
        let e = check(
            "ibv_modify_qp",
            -libc::EINVAL,
            || "qpn=0x11".into(),
            no_hint,
        )
        .unwrap_err();
        assert_eq!(e.errno(), Some(libc::EINVAL));
        assert!(
            std::error::Error::source(&e).is_some(),
            "the errno is the source"
        );
        assert!(check("x", 0, || unreachable!(), |_| unreachable!()).is_ok());
        let p = non_null(
            "ibv_alloc_pd",
            std::ptr::null_mut::<u8>(),
            String::new,
            no_hint,
        );
        assert!(matches!(
            p,
            Err(Error::Verbs {
                call: "ibv_alloc_pd",
                ..
            })
        ));
        assert!(teardown("ibv_dealloc_pd", "rxe0", 0));
        assert!(!teardown("ibv_dealloc_pd", "rxe0", libc::EBUSY));
    }
}
