//! The workspace-hack crate's build script: it does nothing.

// A build script is required for cargo to consider build dependencies.
fn main() {}
