//! The fuzz targets' decode functions (pgoutput messages and binlog rows
//! events) over thousands of random and mutated valid inputs on stable Rust,
//! so every `cargo test` exercises what `cargo fuzz` does on nightly. Each
//! input must decode or fail without a panic, and no single allocation may
//! exceed what the input can justify: a length field must never size a
//! buffer by itself (a pgoutput TRUNCATE once asked for 16 GiB from a forged
//! count, which Linux's overcommit hides from a test that only looks for a crash).

use proptest::prelude::*;
use tributary_connectors::fuzzing::{binlog_rows, binlog_seed, pgoutput, pgoutput_seeds};

/// Bytes this thread has allocated so far (jemalloc's counter; the
/// process's global allocator comes from tributary-operations).
fn allocated() -> u64 {
    tikv_jemalloc_ctl::thread::allocatedp::read().map_or(0, |p| p.get())
}

/// What decoding one input may allocate in all: a fixed allowance for the
/// decoders' own tables, plus a multiple of its length (each binlog value
/// is decoded by every codec, and text or JSON grows by a small factor).
fn allowed(input: &[u8]) -> u64 {
    (1 << 20) + 256 * input.len() as u64
}

/// Runs `decode` on `input` and fails when it allocated more than
/// [`allowed`].
fn bounded<T>(input: &[u8], decode: impl FnOnce(&[u8]) -> T) {
    quiet_upstream_panics();
    let before = allocated();
    let _ = decode(input);
    let used = allocated().saturating_sub(before);
    assert!(used <= allowed(input), "{used} bytes allocated for an input of {} bytes: {input:02x?}", input.len());
}

/// mysql_common's own panics are caught and turned into errors
/// (`decode_rows`); printing each with a backtrace would allocate a hundred
/// megabytes of debug information and bury the test's output.
fn quiet_upstream_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !info.location().is_some_and(|l| l.file().contains("mysql_common")) {
                default(info);
            }
        }));
    });
}

/// Applies `edits` (replace a byte, cut, insert) to `data`.
fn mutate(mut data: Vec<u8>, edits: &[(prop::sample::Index, u8, u8)]) -> Vec<u8> {
    for (at, byte, kind) in edits {
        if data.is_empty() {
            data.push(*byte);
            continue;
        }
        let i = at.index(data.len());
        match kind {
            0 => data[i] = *byte,
            1 => data.truncate(i),
            2 => data.insert(i, *byte),
            // A length field set to its largest value.
            _ => {
                let end = (i + 4).min(data.len());
                data[i..end].fill(0xff);
            }
        }
    }
    data
}

fn edits() -> impl Strategy<Value = Vec<(prop::sample::Index, u8, u8)>> {
    prop::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..4), 1..6)
}

/// Counts forged in every pgoutput message that has one.
#[test]
fn pgoutput_forged_counts_do_not_allocate_from_the_wire() {
    for m in [
        &b"T\xff\xff\xff\xff\0\0\0\0\x01"[..],
        b"I\0\0\0\x01N\x7f\xffn",
        b"R\0\0\0\x01s\0t\0d\x7f\xff",
    ] {
        bounded(m, pgoutput);
        assert!(!pgoutput(m), "a message shorter than its count is an error");
    }
}

/// Found by the `binlog_rows` fuzz target: a table map giving a DECIMAL
/// column scale 14 over precision 10 made mysql_common size a buffer from
/// `10 - 14`, which wraps in a release build (an allocation of 8 EB: the
/// process aborts) and panics in a debug one. `decode_rows` refuses the
/// table map with an error naming the column instead.
#[test]
fn a_decimal_with_scale_above_precision_is_an_error_naming_the_column() {
    use mysql_common::binlog::consts::BinlogVersion;
    use mysql_common::binlog::events::EventData;
    use mysql_common::binlog::EventStreamReader;
    use tributary_connectors::sources::mysql::stream::decode_rows;

    let mut data = binlog_seed();
    // The DECIMAL's scale in the table map's metadata (after the VARCHAR's
    // two bytes and the DECIMAL's precision).
    let at = data.windows(4).position(|w| w == [255, 0, 10, 2]).expect("the seed's metadata") + 3;
    data[at] = 14;
    let mut reader = EventStreamReader::new(BinlogVersion::Version4);
    let mut input = &data[..];
    reader.read(&mut input).expect("table map").expect("an event");
    let event = reader.read(&mut input).expect("rows").expect("an event");
    let Ok(Some(EventData::RowsEvent(rows))) = event.read_data() else {
        panic!("a rows event")
    };
    let tme = reader.get_tme(rows.table_id()).expect("the table map");
    let err = decode_rows(&rows, tme).expect_err("an error");
    assert!(err.contains("column 3 DECIMAL(10,14)"), "{err}");
}

/// Found by the `binlog_rows` fuzz target: a PREVIOUS_GTIDS event (which
/// the reader has no use for) claiming 2^51 server ids made mysql_common
/// ask for 18 PB, and the failed allocation aborted the process. Events the
/// reader does not use are no longer parsed.
#[test]
fn unused_events_are_not_parsed() {
    let mut data = binlog_seed();
    data[4] = 35; // PREVIOUS_GTIDS_EVENT instead of TABLE_MAP
    let at = data.windows(4).position(|w| w == [255, 0, 10, 2]).expect("the seed's metadata");
    data[at - 4..at + 4].copy_from_slice(&[0, 0, 0, 0, 0, 0, 0x40, 0]);
    bounded(&data, binlog_rows);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn pgoutput_random_bytes(tag in prop::sample::select(&b"RYOIUDTBCMx"[..]), rest in prop::collection::vec(any::<u8>(), 0..200)) {
        let mut data = vec![tag];
        data.extend(rest);
        bounded(&data, pgoutput);
    }

    #[test]
    fn pgoutput_mutated_messages(which in 0usize..5, edits in edits()) {
        let seed = pgoutput_seeds().swap_remove(which);
        bounded(&mutate(seed, &edits), pgoutput);
    }

    #[test]
    fn binlog_random_bytes(data in prop::collection::vec(any::<u8>(), 0..300)) {
        bounded(&data, binlog_rows);
    }

    #[test]
    fn binlog_mutated_events(edits in edits()) {
        bounded(&mutate(binlog_seed(), &edits), binlog_rows);
    }
}
