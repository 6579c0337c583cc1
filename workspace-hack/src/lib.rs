//! The workspace-hack crate (cargo-hakari): no code, only dependencies with
//! the features every build of the workspace turns on (docs/CONNECTORS.md).

// This is a stub lib.rs.
