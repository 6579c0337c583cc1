//! Golden files of the event format: the encoded key and value of each
//! operation of a fixed table, and the schemas. A change of the wire format
//! shows up here as a byte difference. After a deliberate change, refresh
//! them with `UPDATE_GOLDEN=1 cargo test -p tributary-schemas --test golden`
//! and review the diff.

mod fixtures;

use std::path::PathBuf;

use tributary_schemas::decoder::Decoded;
use tributary_schemas::{EnvelopeOptions, EventDecoder, EventEncoder, Registry};

fn golden_dir() -> PathBuf {
    fixtures::manifest_dir().join("tests/golden")
}

fn check(name: &str, actual: &[u8]) {
    let path = golden_dir().join(name);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::create_dir_all(golden_dir()).expect("create golden dir");
        std::fs::write(&path, actual).expect("write golden file");
        return;
    }
    let expected =
        std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e} (run with UPDATE_GOLDEN=1 to create)", path.display()));
    assert!(
        expected == actual,
        "{name} differs from its golden file ({} vs {} bytes); if the change is deliberate, rerun with UPDATE_GOLDEN=1",
        expected.len(),
        actual.len()
    );
}

fn check_json(name: &str, actual: &str) {
    let pretty = |s: &str| {
        let v: serde_json::Value = serde_json::from_str(s).expect("schema is JSON");
        serde_json::to_string_pretty(&v).expect("serializes") + "\n"
    };
    let path = golden_dir().join(name);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, pretty(actual)).expect("write golden schema");
        return;
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (run with UPDATE_GOLDEN=1 to create)", path.display()));
    // Compared as JSON values: key order may differ between serde_json
    // feature sets, the meaning may not.
    let a: serde_json::Value = serde_json::from_str(actual).expect("json");
    let e: serde_json::Value = serde_json::from_str(&expected).expect("json");
    assert_eq!(a, e, "{name} differs from its golden file; rerun with UPDATE_GOLDEN=1 if deliberate");
}

#[tokio::test]
async fn encoded_events_match_golden_files() {
    let registry = Registry::in_memory();
    let mut encoder = EventEncoder::new(registry.clone(), EnvelopeOptions::default());
    let table = fixtures::table();
    encoder.prepare(&table, fixtures::TOPIC).await.expect("prepare");
    let (schemas, _, _) = encoder.prepared(fixtures::TOPIC).expect("prepared");
    check_json("key.avsc", schemas.key.as_deref().expect("key schema"));
    check_json("value.avsc", &schemas.value);
    let value_schema = apache_avro::Schema::parse_str(&schemas.value).expect("value schema parses");
    let key_schema = apache_avro::Schema::parse_str(schemas.key.as_deref().expect("key")).expect("key parses");

    let mut decoder = EventDecoder::new(registry);
    for (op, event) in fixtures::events() {
        let rec = encoder.encode(&event, fixtures::TOPIC).expect("encode");
        let value = rec.value.as_deref().expect("value");
        check(&format!("{op}.value.bin"), value);
        match &rec.key {
            Some(key) => {
                check(&format!("{op}.key.bin"), key);
                let (_, left) = fixtures::apache_read(&key_schema, &key[5..]);
                assert_eq!(left, 0);
            }
            None => assert_eq!(op, "t", "only truncates have no key"),
        }
        // apache-avro reads every byte we wrote.
        let (_, left) = fixtures::apache_read(&value_schema, &value[5..]);
        assert_eq!(left, 0, "{op}: apache-avro left bytes unread");

        let decoded = decoder
            .decode(fixtures::TOPIC, rec.key.as_deref(), rec.value.as_deref())
            .await
            .expect("decode");
        assert_eq!(decoded, Decoded::Change(event.clone()), "{op} round trip");

        let tomb = encoder.tombstone(&event, fixtures::TOPIC).expect("tombstone");
        assert_eq!(tomb.is_some(), op == "d");
        if let Some(t) = tomb {
            assert_eq!(t.value, None);
            assert_eq!(t.key, rec.key);
        }
    }
}

#[tokio::test]
async fn tombstones_can_be_turned_off() {
    let options = EnvelopeOptions { tombstones: false, ..EnvelopeOptions::default() };
    let mut encoder = EventEncoder::new(Registry::in_memory(), options);
    encoder.prepare(&fixtures::table(), fixtures::TOPIC).await.expect("prepare");
    let (_, delete) = fixtures::events().into_iter().find(|(op, _)| *op == "d").expect("delete");
    assert_eq!(encoder.tombstone(&delete, fixtures::TOPIC).expect("ok"), None);
}

/// The records between the runners besides change events, as written: each
/// control record's headers and each offsets-topic record's key and value,
/// one per line, in `records.txt`. A change of their bytes (which sinks and
/// restarted runners of other versions read) shows up here.
#[test]
fn control_and_offsets_records_match_their_golden_file() {
    use tributary_schemas::records::{ControlRecord, CopyProgress, Held, HeldTable, OffsetsRecord};
    use tributary_schemas::{Position, TableId};

    let table = TableId::new("public", "order items$2");
    let mut out = String::new();
    for record in [
        ControlRecord::TableDropped { table: table.clone() },
        ControlRecord::TableCopied {
            table: table.clone(),
            at: Position { commit: 42, index: 7 },
        },
        ControlRecord::TableReset { table: table.clone(), reset: 1_733_500_000_123 },
        ControlRecord::Sequence {
            table: table.clone(),
            state: tributary_schemas::SequenceState {
                schema: "public".into(),
                name: "order items$2_id_seq".into(),
                data_type: "bigint".into(),
                increment: 1,
                min: 1,
                max: i64::MAX,
                cycle: false,
                last_value: 42,
                is_called: true,
            },
        },
        ControlRecord::Objects {
            table: table.clone(),
            objects: tributary_schemas::TableObjects {
                indexes: vec![tributary_schemas::IndexObject {
                    name: "items_lower_idx".into(),
                    unique: true,
                    definition: "USING btree (lower(name)) WHERE (qty > 0)".into(),
                }],
                constraints: vec![tributary_schemas::ConstraintObject {
                    name: "items_order_fk".into(),
                    kind: tributary_schemas::ConstraintKind::ForeignKey,
                    definition: "FOREIGN KEY (order_id)".into(),
                    references: Some(tributary_schemas::ForeignKeyTarget {
                        table: TableId::new("public", "orders"),
                        columns: vec!["id".into()],
                        options: "ON DELETE CASCADE".into(),
                    }),
                }],
                defaults: vec![tributary_schemas::ColumnDefault {
                    column: "qty".into(),
                    expression: "1".into(),
                    sequence: None,
                    identity_always: None,
                }],
            },
        },
        ControlRecord::Verify {
            table: table.clone(),
            range: tributary_schemas::records::VerifyRange {
                id: 1_733_500_000_123,
                at: Position { commit: 42, index: 0 },
                connector: "postgresql".into(),
                schema_id: 7,
                key_schema_id: Some(8),
                partition: None,
                columns: None,
                summary: None,
                after: Some(vec![Some("10".into()), None]),
                until: Some(vec![Some("12".into()), Some("b".into())]),
                last: false,
                rows: vec![
                    ("[\"11\",\"a\"]".into(), "00ff00ff00ff00ff".into(), "01a2ff".into()),
                    ("[\"12\",\"b\"]".into(), "1234567890abcdef".into(), "00a2ff".into()),
                ],
            },
        },
    ] {
        out.push_str("control");
        for (k, v) in record.headers() {
            out.push_str(&format!(" {k}={v}"));
        }
        out.push('\n');
    }
    let held = |copy, reset| Held {
        reason: "a schema change the topic cannot carry".into(),
        copy,
        reset,
    };
    for record in [
        OffsetsRecord::Checkpoint(Some(r#"{"epoch":"7","lsn":"0/16B3748"}"#.into())),
        OffsetsRecord::HeldTables(vec![
            HeldTable {
                schema: "public".into(),
                table: "a".into(),
                held: held(CopyProgress::Paused, None),
            },
            HeldTable {
                schema: "public".into(),
                table: "b".into(),
                held: held(CopyProgress::Asked, Some(5)),
            },
            HeldTable {
                schema: "public".into(),
                table: "c".into(),
                held: held(CopyProgress::From { commit: 9, index: 2, swept: false }, None),
            },
        ]),
        OffsetsRecord::ResetAll(Some(1_733_500_000_123)),
        OffsetsRecord::ResetAll(None),
        OffsetsRecord::Side {
            key: "schema/shop.orders".into(),
            value: Some("{}".into()),
        },
        OffsetsRecord::Side { key: "schema/shop.gone".into(), value: None },
    ] {
        let value = record
            .value()
            .map_or("<null>".to_string(), |v| String::from_utf8(v).expect("text"));
        out.push_str(&format!("offsets {} = {value}\n", record.key().encode("pg-1")));
    }
    let repair = tributary_schemas::records::requests::Request::Repair {
        table: table.clone(),
        verification: 1_733_500_000_123,
        keys: vec!["[\"5\"]".into(), "[\"6\"]".into()],
    };
    out.push_str(&format!("request {} = {}\n", repair.key(), String::from_utf8(repair.value()).expect("text")));
    check("records.txt", out.as_bytes());
}
