//! Fuzzing entry points of the two change-stream decoders, shared by the
//! cargo-fuzz targets (`fuzz/sources/fuzz_targets/pgoutput.rs` and
//! `fuzz/sources/fuzz_targets/binlog_rows.rs`, nightly) and the always-on test
//! `connectors/tests/decoder_inputs.rs`, which feeds them random and mutated
//! valid inputs on stable. Both decoders read bytes a server sent: they must
//! return an error, never panic, and never size an allocation from a length
//! field beyond what the input can hold.

/// Decodes `data` as one pgoutput message; whether it decoded.
#[cfg(feature = "source-postgres")]
pub fn pgoutput(data: &[u8]) -> bool {
    crate::sources::postgres::stream::parse_pgoutput(bytes::Bytes::copy_from_slice(data)).is_ok()
}

/// Valid pgoutput messages (Relation, Insert, Update with old row and TOAST
/// placeholder, Delete, Truncate) for mutation.
#[cfg(feature = "source-postgres")]
pub fn pgoutput_seeds() -> Vec<Vec<u8>> {
    fn tuple(values: &[Option<&str>]) -> Vec<u8> {
        let mut m = (values.len() as i16).to_be_bytes().to_vec();
        for v in values {
            match v {
                None => m.push(b'n'),
                Some("\u{0}u") => m.push(b'u'),
                Some(t) => {
                    m.push(b't');
                    m.extend((t.len() as i32).to_be_bytes());
                    m.extend(t.as_bytes());
                }
            }
        }
        m
    }
    let mut relation = vec![b'R'];
    relation.extend(16384u32.to_be_bytes());
    relation.extend(b"public\0items\0f");
    relation.extend(2i16.to_be_bytes());
    for (flags, name, oid) in [(1u8, "id", 23u32), (0, "note", 25)] {
        relation.push(flags);
        relation.extend(name.as_bytes());
        relation.push(0);
        relation.extend(oid.to_be_bytes());
        relation.extend((-1i32).to_be_bytes());
    }
    let mut insert = vec![b'I'];
    insert.extend(16384u32.to_be_bytes());
    insert.push(b'N');
    insert.extend(tuple(&[Some("1"), Some("hello")]));
    let mut update = vec![b'U'];
    update.extend(16384u32.to_be_bytes());
    update.push(b'O');
    update.extend(tuple(&[Some("1"), Some("big")]));
    update.push(b'N');
    update.extend(tuple(&[Some("1"), Some("\u{0}u")]));
    let mut delete = vec![b'D'];
    delete.extend(16384u32.to_be_bytes());
    delete.push(b'K');
    delete.extend(tuple(&[Some("1"), None]));
    let mut truncate = vec![b'T'];
    truncate.extend(2u32.to_be_bytes());
    truncate.push(0);
    truncate.extend(1u32.to_be_bytes());
    truncate.extend(2u32.to_be_bytes());
    vec![relation, insert, update, delete, truncate]
}

/// The most events one input is read for: keeps a fuzz iteration short.
#[cfg(feature = "source-mysql")]
const MAX_BINLOG_EVENTS: usize = 64;

/// One codec per kind of MySQL column the source decodes.
#[cfg(feature = "source-mysql")]
fn binlog_codecs() -> Vec<crate::sources::mysql::types::ColumnCodec> {
    use crate::sources::mysql::types::{map_type, ColumnCodec};
    use tributary_schemas::{Column, TableId};
    let table = TableId::new("fuzz", "t");
    [
        "tinyint",
        "smallint unsigned",
        "mediumint",
        "int",
        "bigint unsigned",
        "year",
        "bit(3)",
        "float",
        "double",
        "decimal(10,2)",
        "decimal(65,30)",
        "varchar(20)",
        "text",
        "binary(4)",
        "varbinary(9)",
        "blob",
        "enum('a','b')",
        "set('a','b')",
        "date",
        "time(3)",
        "datetime(6)",
        "timestamp",
        "json",
    ]
    .iter()
    .flat_map(|source_type| {
        let data_type = map_type(&table, "c", source_type).ok()?;
        Some([true, false].map(|nullable| {
            ColumnCodec::new(&Column {
                name: "c".into(),
                data_type: data_type.clone(),
                nullable,
                source_type: (*source_type).to_string(),
                default: None,
                aliases: Vec::new(),
                column_id: None,
            })
        }))
    })
    .flatten()
    .collect()
}

/// Reads `data` as a stream of binlog events (no file header, checksums
/// off, as after a FORMAT_DESCRIPTION without them), decodes the rows of
/// every rows event through its table map as the stream does, and each
/// value with every codec. Returns how many values decoded.
#[cfg(feature = "source-mysql")]
pub fn binlog_rows(data: &[u8]) -> usize {
    use mysql_common::binlog::consts::BinlogVersion;
    use mysql_common::binlog::events::EventData;
    use mysql_common::binlog::EventStreamReader;
    use std::sync::OnceLock;
    use tributary_schemas::TableId;

    static CODECS: OnceLock<Vec<crate::sources::mysql::types::ColumnCodec>> = OnceLock::new();
    let codecs = CODECS.get_or_init(binlog_codecs);
    let table = TableId::new("fuzz", "t");
    let mut reader = EventStreamReader::new(BinlogVersion::Version4);
    let mut input = data;
    let mut decoded = 0;
    for _ in 0..MAX_BINLOG_EVENTS {
        // mysql_common 0.37's `Event::read` allocates the header's event
        // size and unwraps the read of that many bytes: a header claiming
        // more than the input holds panics there (events/mod.rs:128). In
        // the stream mysql_async hands it whole packets from the server;
        // here events are framed as the server frames them, and that known
        // upstream panic is not rediscovered on every run.
        let size = input
            .get(9..13)
            .map_or(0, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize);
        if size < 19 || size > input.len() {
            break;
        }
        let event = match reader.read(&mut input) {
            Ok(Some(e)) => e,
            _ => break,
        };
        if !crate::sources::mysql::stream::parsed_event(event.header().event_type_raw()) {
            continue;
        }
        let Ok(Some(EventData::RowsEvent(rows))) = event.read_data() else {
            continue;
        };
        let Some(tme) = reader.get_tme(rows.table_id()) else {
            continue;
        };
        let Ok(images) = crate::sources::mysql::stream::decode_rows(&rows, tme) else {
            continue;
        };
        for (before, after) in images {
            for mut row in before.into_iter().chain(after) {
                for i in 0..row.len() {
                    let collation = row.columns_ref().get(i).map_or(0, |c| c.character_set());
                    let raw = row.take(i);
                    for codec in codecs {
                        if codec.from_binlog(raw.clone(), collation, &table, "c").is_ok() {
                            decoded += 1;
                        }
                    }
                }
            }
        }
    }
    decoded
}

/// A binlog event: v4 header (timestamp, type, server id, size, next
/// position, flags) and `body`, without a checksum.
#[cfg(feature = "source-mysql")]
fn binlog_event(type_code: u8, body: &[u8]) -> Vec<u8> {
    let mut e = 0u32.to_le_bytes().to_vec();
    e.push(type_code);
    e.extend(1u32.to_le_bytes());
    e.extend(((19 + body.len()) as u32).to_le_bytes());
    e.extend(0u32.to_le_bytes());
    e.extend(0u16.to_le_bytes());
    e.extend(body);
    e
}

/// A valid TABLE_MAP and WRITE_ROWS (v2) pair for a table of INT, VARCHAR,
/// DECIMAL(10,2), DATE, BLOB and DOUBLE with one row, for mutation.
#[cfg(feature = "source-mysql")]
pub fn binlog_seed() -> Vec<u8> {
    const TABLE_MAP: u8 = 19;
    const WRITE_ROWS_V2: u8 = 30;
    // Column types: LONG, VARCHAR, NEWDECIMAL, DATE, BLOB, DOUBLE.
    let types = [3u8, 15, 246, 10, 252, 5];
    // Metadata: VARCHAR max length 255 (2 bytes), DECIMAL precision and
    // scale, BLOB length bytes, DOUBLE size.
    let meta = [255u8, 0, 10, 2, 2, 8];
    let mut tm = vec![42, 0, 0, 0, 0, 0, 1, 0];
    tm.extend([4]);
    tm.extend(b"fuzz\0");
    tm.extend([1]);
    tm.extend(b"t\0");
    tm.push(types.len() as u8);
    tm.extend(types);
    tm.push(meta.len() as u8);
    tm.extend(meta);
    tm.push(0b0011_1110); // every column but the first nullable
    let mut rows = vec![42, 0, 0, 0, 0, 0, 1, 0];
    rows.extend(2u16.to_le_bytes()); // no extra data
    rows.push(types.len() as u8);
    rows.push(0b0011_1111); // every column present
    rows.push(0); // no NULLs
    rows.extend(7i32.to_le_bytes());
    rows.push(5);
    rows.extend(b"hello");
    rows.extend([0x80, 0, 0, 1, 50]); // 1.50
    rows.extend([0x2f, 0xd0, 0x0f]); // 2024-01-15
    rows.extend(3u16.to_le_bytes());
    rows.extend(b"abc");
    rows.extend(2.5f64.to_le_bytes());
    let mut out = binlog_event(TABLE_MAP, &tm);
    out.extend(binlog_event(WRITE_ROWS_V2, &rows));
    out
}

#[cfg(test)]
mod tests {
    #[cfg(feature = "source-postgres")]
    #[test]
    fn pgoutput_seeds_decode() {
        for seed in super::pgoutput_seeds() {
            assert!(super::pgoutput(&seed), "{seed:?}");
        }
    }

    /// The seed must decode, or mutating it tests nothing past the header.
    #[cfg(feature = "source-mysql")]
    #[test]
    fn binlog_seed_decodes() {
        assert!(super::binlog_rows(&super::binlog_seed()) >= 6);
    }
}
