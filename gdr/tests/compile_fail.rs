//! Compile-fail tests: the soundness rules the type system enforces (the crate docs, "Soundness").
//! Each file under tests/ui must fail to compile with the error recorded beside it.
//! Regenerate the expected errors with `TRYBUILD=overwrite cargo test -p gdr --test compile_fail`.

#[test]
fn soundness_rules_are_enforced_by_types() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*.rs");
}
