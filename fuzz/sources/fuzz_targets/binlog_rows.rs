//! Arbitrary bytes into the MySQL binlog row decoder: read as binlog
//! events (table maps and rows events), each row decoded through its table
//! map and each value by every column codec of the source. It must return
//! an error, never panic, hang or allocate without bound.
//!
//! Run: `cargo +nightly fuzz run --fuzz-dir fuzz/sources binlog_rows -- -max_total_time=60`

#![no_main]

use libfuzzer_sys::fuzz_target;
use tributary_connectors::fuzzing::binlog_rows;

fuzz_target!(|data: &[u8]| {
    binlog_rows(data);
});
