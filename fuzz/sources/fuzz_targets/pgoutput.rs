//! Arbitrary bytes into the pgoutput decoder (one logical replication
//! message). It must return an error, never panic, hang or size a buffer
//! from a count the message cannot hold.
//!
//! Run: `cargo +nightly fuzz run --fuzz-dir fuzz/sources pgoutput -- -max_total_time=60`

#![no_main]

use libfuzzer_sys::fuzz_target;
use tributary_connectors::fuzzing::pgoutput;

fuzz_target!(|data: &[u8]| {
    pgoutput(data);
});
