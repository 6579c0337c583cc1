//! Arbitrary bytes into the change-event decoder, for a few fixed writer
//! schemas (ours, and Debezium's PostgreSQL and MySQL envelopes). The first
//! byte picks the schema. The decoder must return an error, never panic,
//! hang or allocate without bound.
//!
//! Run: `cd fuzz && cargo +nightly fuzz run decode_value -- -max_total_time=60`

#![no_main]

use libfuzzer_sys::fuzz_target;
use tributary_schemas::fuzzing::decode_arbitrary;

fuzz_target!(|data: &[u8]| {
    decode_arbitrary(data);
});
