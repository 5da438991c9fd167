//! `gpu_mr` (see DESIGN.md); filled in by its issue.
