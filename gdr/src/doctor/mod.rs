//! `doctor` (see DESIGN.md): being written.
