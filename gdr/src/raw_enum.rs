//! Enums made from raw C values (`ibv_wc_status`, `ibv_qp_state`, port states, MTUs, ...): each
//! is tied to its `gdr_sys::ibv` constants in exactly one list, and the conversions both ways are
//! generated from it.

/// Ties an enum to the C constants its variants stand for, in one list: generates
/// `from_constant` (raw value to variant, `None` for values the list lacks), `constant` (variant
/// to raw value, `None` for variants outside the list, such as `Unknown(v)`) and, for tests,
/// `CONSTANTS` (every pair).
macro_rules! constants {
    ($ty:ident : $raw:ty { $($variant:ident = $konst:path),+ $(,)? }) => {
        impl $ty {
            /// Every (C constant, variant) pair, for the round-trip tests.
            #[cfg(test)]
            pub(crate) const CONSTANTS: &'static [($raw, $ty)] = &[$(($konst, $ty::$variant)),+];

            /// The variant a C constant stands for.
            #[allow(unreachable_patterns)]
            fn from_constant(v: $raw) -> Option<$ty> {
                match v {
                    $($konst => Some($ty::$variant),)+
                    _ => None,
                }
            }

            /// The C constant a variant stands for.
            #[allow(dead_code, unreachable_patterns)]
            fn constant(self) -> Option<$raw> {
                match self {
                    $($ty::$variant => Some($konst),)+
                    _ => None,
                }
            }
        }
    };
}
pub(crate) use constants;
