//! Where agents publish what peers need to find them, and learn when one leaves.
