//! Compile-fail tests: what gdr-xfer's types reject. Each file under tests/ui must fail to
//! compile with the error recorded beside it. Regenerate the expected errors with
//! `TRYBUILD=overwrite cargo test -p gdr-xfer --test compile_fail`.

#[test]
fn ids_and_offsets_cannot_be_mixed_up() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*.rs");
}
