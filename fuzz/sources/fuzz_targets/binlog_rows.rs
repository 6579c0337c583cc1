//! Arbitrary bytes into the MySQL binlog row decoder: read as binlog
//! events (table maps and rows events), each row decoded through its table
//! map and each value by every column codec of the source. It must return
//! an error, never panic (mysql_common's own panics inside `decode_rows`
//! are caught there and count as errors), hang or allocate without bound.
//!
//! Run: `cargo +nightly fuzz run --fuzz-dir fuzz/sources binlog_rows -- -max_total_time=60`

#![no_main]

use libfuzzer_sys::fuzz_target;
use tributary_connectors::fuzzing::binlog_rows;

fuzz_target!(
    init: {
        // mysql_common's panics on malformed rows are caught by
        // `decode_rows` and become errors, as in the runner; libfuzzer-sys's
        // hook would abort on them before the catch. Every other panic
        // still aborts (and is reported).
        let abort = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !info.location().is_some_and(|l| l.file().contains("mysql_common")) {
                abort(info);
            }
        }));
    },
    |data: &[u8]| {
        binlog_rows(data);
    }
);
