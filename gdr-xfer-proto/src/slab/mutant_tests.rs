//! Unit tests of the slab written against the mutants cargo-mutants found alive (`cargo xtask
//! mutants`).

use super::*;

#[test]
fn a_stale_key_cannot_change_the_transfer_that_took_its_slot() {
    let mut s = Slab::new();
    let a = s.insert(1);
    assert_eq!(s.remove(a), Some(1));
    let b = s.insert(2);
    assert_eq!(a.index, b.index);
    assert_eq!(
        s.get_mut(a),
        None,
        "a finished transfer's key names nothing"
    );
    *s.get_mut(b).expect("the current key") += 40;
    assert_eq!(s.get(b), Some(&42));
}
