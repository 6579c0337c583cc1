//! The MySQL source against the stack's real MariaDB 10.11 (`MYSQL_URL`;
//! ROW binlog, FULL row image).
//!
//! Each test uses its own database, drives the [`Source`] directly (no
//! Kafka) and rebuilds the tables from the events the way a sink does (per
//! key, the event with the highest position wins), then compares them with
//! the source. The Kafka round trip with kill -9 is
//! `every_change_reaches_kafka_exactly_once_across_kill_9` at the end.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable;
use secrecy::ExposeSecret;
use tributary_connectors::sources::mysql::config::MySqlSourceConfig;
use tributary_connectors::sources::mysql::{check, MySqlSource, SourceState};
use tributary_connectors::{Checkpoint, Source, SourceBatch, SourceMessage};
use tributary_schemas::{ChangeEvent, Op, Position, Row, SnapshotMarker, TableId, Value};
use tributary_tests::{
    counters, kafka_bootstrap, mysql_url, pg_destination_url, runner_binary, schema_registry_url, side, unique,
    wait_for, Runner,
};

/// How long any wait on a condition may take before the test fails.
const DEADLINE: Duration = Duration::from_secs(60);

use tributary_tests::mysql::{admin, Database as Fixture};

async fn next(source: &mut MySqlSource) -> SourceBatch {
    tokio::time::timeout(DEADLINE, side::next_batch(source))
        .await
        .expect("next_batch within the deadline")
        .expect("next_batch")
}

/// Starts `source` from `checkpoint` with the side records durable with
/// it, as the runner does (they hold the schema history).
async fn start(source: &mut MySqlSource, checkpoint: Option<Checkpoint>) -> tributary_connectors::Result<()> {
    side::restore(source, checkpoint.as_ref());
    source.start(checkpoint).await
}

/// Tables rebuilt from events as a sink would: per key the latest row.
#[derive(Default)]
struct Mirror {
    rows: BTreeMap<TableId, BTreeMap<String, (Position, Row)>>,
    events: Vec<ChangeEvent>,
    messages: Vec<SourceMessage>,
    checkpoint: Option<Checkpoint>,
}

impl Mirror {
    fn apply(&mut self, batch: SourceBatch) {
        // The runner registers one schema per table and batch.
        let mut shapes: BTreeMap<TableId, &tributary_schemas::TableSchema> = BTreeMap::new();
        for m in &batch.messages {
            if let SourceMessage::Change(e) = m {
                let seen = shapes.entry(e.schema.id.clone()).or_insert(&e.schema);
                assert_eq!(**seen, *e.schema, "one batch holds rows of {} under two schemas", e.schema.id);
            }
        }
        for m in batch.messages {
            if let SourceMessage::Change(e) = &m {
                let key_idx = e.schema.key_indexes();
                let row = e.key_row().expect("row").clone();
                let key = format!("{:?}", key_idx.iter().map(|&i| row[i].clone()).collect::<Vec<_>>());
                let table = self.rows.entry(e.schema.id.clone()).or_default();
                let newer = table.get(&key).is_none_or(|(p, _)| *p <= e.source.position);
                if newer {
                    match e.op {
                        Op::Delete => {
                            table.remove(&key);
                        }
                        _ => {
                            table.insert(key, (e.source.position, e.after.clone().expect("after")));
                        }
                    }
                }
                self.events.push(e.clone());
            }
            if let SourceMessage::TableDropped(t) = &m {
                self.rows.remove(t);
            }
            self.messages.push(m);
        }
        self.checkpoint = Some(batch.checkpoint);
    }

    fn ids(&self, table: &TableId) -> BTreeSet<i64> {
        self.rows
            .get(table)
            .map(|t| t.values().map(|(_, r)| int(&r[0])).collect())
            .unwrap_or_default()
    }

    fn row(&self, table: &TableId, id: i64) -> Option<Row> {
        self.rows
            .get(table)?
            .values()
            .find(|(_, r)| int(&r[0]) == id)
            .map(|(_, r)| r.clone())
    }
}

fn int(v: &Value) -> i64 {
    match v {
        Value::Int16(x) => i64::from(*x),
        Value::Int32(x) => i64::from(*x),
        Value::Int64(x) => *x,
        Value::Decimal(x) => x.parse().expect("integral decimal"),
        other => panic!("not an integer: {other:?}"),
    }
}

/// Reads batches until `done` holds for the mirror.
async fn sync(source: &mut MySqlSource, mirror: &mut Mirror, what: &str, done: impl Fn(&Mirror) -> bool) {
    let deadline = Instant::now() + DEADLINE;
    while !done(mirror) {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        mirror.apply(next(source).await);
    }
}

async fn source_ids(conn: &mut mysql_async::Conn, table: &TableId) -> BTreeSet<i64> {
    let ids: Vec<i64> = conn
        .query(format!("SELECT id FROM `{}`.`{}`", table.schema, table.table))
        .await
        .expect("select ids");
    ids.into_iter().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_then_streaming_equals_source() {
    let mut fx = Fixture::new("mysnap").await;
    fx.sql("CREATE TABLE items (id INT PRIMARY KEY, name VARCHAR(40) NOT NULL, qty INT)")
        .await;
    fx.sql("CREATE TABLE nokey (a INT, b VARCHAR(10))").await;
    let mut values = Vec::new();
    for i in 1..=350 {
        values.push(format!("({i}, 'item {i}', {})", i % 7));
    }
    fx.sql(&format!("INSERT INTO items VALUES {}", values.join(","))).await;
    fx.sql("INSERT INTO nokey VALUES (1,'x'),(1,'x'),(2,'y')").await;

    let items = fx.table("items");
    let mut source = MySqlSource::new(fx.config(), "t").expect("config");
    start(&mut source, None).await.expect("start");
    let mut mirror = Mirror::default();
    sync(&mut source, &mut mirror, "the snapshot", |m| {
        m.events.iter().any(|e| e.source.snapshot == SnapshotMarker::Last)
    })
    .await;
    assert_eq!(mirror.ids(&items), (1..=350).collect());
    let reads = mirror.events.iter().filter(|e| e.op == Op::Read).count();
    assert_eq!(reads, 353, "every row read exactly once, keyless duplicates included");
    // Chunks of 100 rows: more than one batch, and progress reports both tables done.
    let progress = source.snapshot_progress();
    assert!(progress.iter().all(|p| p.done), "{progress:?}");
    assert_eq!(progress.iter().find(|p| p.table == items).map(|p| p.rows), Some(350));

    // Streaming: a multi-statement transaction, an update and a delete.
    fx.sql("START TRANSACTION").await;
    fx.sql("INSERT INTO items VALUES (351, 'new', 1), (352, 'new', 2)").await;
    fx.sql("UPDATE items SET qty = 99 WHERE id <= 10").await;
    fx.sql("DELETE FROM items WHERE id BETWEEN 20 AND 29").await;
    fx.sql("COMMIT").await;
    let expected = source_ids(&mut fx.conn, &items).await;
    sync(&mut source, &mut mirror, "the streamed transaction", |m| m.ids(&items) == expected).await;
    let row = mirror.row(&items, 5).expect("row 5");
    assert_eq!(row[2], Value::Int32(99));
    // The transaction's events share one commit position, indexed 1..n.
    let streamed: Vec<&ChangeEvent> = mirror.events.iter().filter(|e| e.op != Op::Read).collect();
    assert_eq!(streamed.len(), 2 + 10 + 10);
    assert!(streamed
        .iter()
        .all(|e| e.source.position.commit == streamed[0].source.position.commit));
    let idx: Vec<u64> = streamed.iter().map(|e| e.source.position.index).collect();
    assert_eq!(idx, (1..=22).collect::<Vec<_>>());
    let update = streamed.iter().find(|e| e.op == Op::Update).expect("an update");
    assert_eq!(update.before.as_ref().map(|b| b[1].clone()), update.after.as_ref().map(|a| a[1].clone()));
    assert!(update.source.tx_id.as_deref().is_some_and(|g| g.starts_with("0-1-")), "MariaDB GTID as tx id");
    // Debezium's transaction block: the GTID, the change's order in the
    // transaction and in its table (one table here: the same).
    for e in &streamed {
        let tx = e.transaction.as_ref().expect("the transaction block");
        assert_eq!(Some(tx.id.as_str()), update.source.tx_id.as_deref());
        assert_eq!(tx.total_order as u64, e.source.position.index);
        assert_eq!(tx.data_collection_order, tx.total_order);
    }
    // Its end, after its 22 changes, all of items.
    let at = |want: &dyn Fn(&SourceMessage) -> bool| mirror.messages.iter().position(want);
    let end =
        at(&|m| matches!(m, SourceMessage::TransactionEnd(e) if Some(e.id.as_str()) == update.source.tx_id.as_deref()))
            .expect("the transaction's end");
    let SourceMessage::TransactionEnd(e) = &mirror.messages[end] else {
        unreachable!()
    };
    assert_eq!(e.tables, vec![(items.clone(), 22)]);
    let last_change = mirror
        .messages
        .iter()
        .rposition(|m| matches!(m, SourceMessage::Change(_)))
        .expect("changes");
    assert!(end > last_change, "the end follows the changes");
    let state = SourceState::from_checkpoint(mirror.checkpoint.as_ref().expect("checkpoint")).expect("state");
    assert!(state.gtid.is_some() && state.snapshot.is_none());
    fx.drop().await;
}

/// TLS on every connection (catalog, snapshot, binlog) in each mode,
/// against the stack's MariaDB (`--ssl-cert`: a certificate that names
/// `localhost` but not `127.0.0.1`, so that verify-full fails on the address
/// and passes on the name; its CA in `MYSQL_TLS_CA`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_modes_connect_and_verify() {
    use tributary_connectors::tls::TlsMode;
    use tributary_connectors::ErrorKind;
    let ca = tributary_tests::mysql_tls_ca();
    let mut fx = Fixture::new("mytls").await;
    let have_ssl: Option<(String, String)> =
        fx.conn.query_first("SHOW VARIABLES LIKE 'have_ssl'").await.expect("have_ssl");
    assert_eq!(
        have_ssl.map(|(_, v)| v).as_deref(),
        Some("YES"),
        "scripts/stack up turns TLS on; is this an older stack? (scripts/stack restart mariadb)"
    );
    fx.sql("CREATE TABLE sec (id INT PRIMARY KEY, v VARCHAR(20))").await;
    fx.sql("INSERT INTO sec VALUES (1, 'a'), (2, 'b')").await;
    let sec = fx.table("sec");
    let base = fx.config();
    let with = |mode: TlsMode, host: &str| {
        let mut c = base.clone();
        c.url = c.url.expose_secret().replace("127.0.0.1", host).into();
        c.tls = mode;
        c.tls_ca_file = (mode == TlsMode::VerifyCa || mode == TlsMode::VerifyFull).then(|| ca.clone());
        c
    };
    // verify-full against an address the certificate does not name: an
    // operator's error, not a retry.
    let mut source = MySqlSource::new(with(TlsMode::VerifyFull, "127.0.0.1"), "t").expect("config");
    let e = start(&mut source, None)
        .await
        .expect_err("the certificate does not name 127.0.0.1");
    assert_eq!(e.kind(), ErrorKind::NeedsOperator, "{e}");
    assert!(e.to_string().contains("TLS") || e.hint().is_some_and(|h| h.contains("TLS")), "{e}");
    drop(source);
    // A CA that did not sign the certificate: refused in verify-ca too.
    let mut wrong = with(TlsMode::VerifyCa, "127.0.0.1");
    wrong.tls_ca_file = Some(tributary_tests::pg_tls_ca());
    let mut source = MySqlSource::new(wrong, "t").expect("config");
    let e = start(&mut source, None).await.expect_err("another CA's certificate");
    assert_eq!(e.kind(), ErrorKind::NeedsOperator, "{e}");
    drop(source);
    // verify-ca checks the name too with this driver (mysql_async 0.37
    // skips the name check only on an error text rustls 0.23 no longer
    // writes): stricter than asked, documented in docs/sources/mysql.md.
    // This assertion fails once that is fixed upstream: then verify-ca
    // with 127.0.0.1 belongs in the list below.
    let mut source = MySqlSource::new(with(TlsMode::VerifyCa, "127.0.0.1"), "t").expect("config");
    let e = start(&mut source, None)
        .await
        .expect_err("the name is checked in verify-ca too");
    assert_eq!(e.kind(), ErrorKind::NeedsOperator, "{e}");
    drop(source);
    for (mode, host) in [
        (TlsMode::Require, "127.0.0.1"),
        (TlsMode::VerifyCa, "localhost"),
        (TlsMode::VerifyFull, "localhost"),
    ] {
        let accepted = ssl_accepts(&mut fx.conn).await;
        let mut source = MySqlSource::new(with(mode, host), "t").expect("config");
        start(&mut source, None)
            .await
            .unwrap_or_else(|e| panic!("{mode:?} {host}: {e}"));
        let mut mirror = Mirror::default();
        let expected = source_ids(&mut fx.conn, &sec).await;
        sync(&mut source, &mut mirror, "the snapshot", |m| m.ids(&sec) == expected).await;
        // The binlog connection too: a change streams through it.
        fx.sql(&format!("INSERT INTO sec VALUES ({}, 'streamed')", 10 + mirror.ids(&sec).len()))
            .await;
        let expected = source_ids(&mut fx.conn, &sec).await;
        sync(&mut source, &mut mirror, "the streamed insert", |m| m.ids(&sec) == expected).await;
        // No other test connects with TLS: the server's count of TLS
        // handshakes grew by this source's connections (catalog, snapshot,
        // binlog).
        let grown = ssl_accepts(&mut fx.conn).await - accepted;
        assert!(grown >= 2, "{mode:?}: {grown} TLS connections accepted");
        drop(source);
    }
    fx.drop().await;
}

async fn ssl_accepts(conn: &mut mysql_async::Conn) -> u64 {
    let row: Option<(String, String)> = conn
        .query_first("SHOW GLOBAL STATUS LIKE 'Ssl_accepts'")
        .await
        .expect("Ssl_accepts");
    row.and_then(|(_, v)| v.parse().ok()).expect("a count")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_common_type_decodes_the_same_in_snapshot_and_stream() {
    let mut fx = Fixture::new("mytypes").await;
    fx.sql(
        "CREATE TABLE t (id INT PRIMARY KEY, ti TINYINT, tu TINYINT UNSIGNED, si SMALLINT, su SMALLINT UNSIGNED, \
         mi MEDIUMINT, mu MEDIUMINT UNSIGNED, i INT, iu INT UNSIGNED, bi BIGINT, bu BIGINT UNSIGNED, b1 TINYINT(1), \
         de DECIMAL(12,3), f FLOAT, d DOUBLE, c CHAR(5), vc VARCHAR(50), tx TEXT, bl BLOB, bn BINARY(4), vb VARBINARY(8), \
         dt DATE, dtm DATETIME(6), ts TIMESTAMP(3) NULL, tm TIME(6), yr YEAR, en ENUM('red','green','blue'), \
         st SET('a','b','c'), js JSON, bt BIT(1), b8 BIT(12))",
    )
    .await;
    let full = "-5, 250, -300, 65000, -8000000, 16000000, -2000000000, 4000000000, -9000000000000000000, \
                18446744073709551615, 1, -12345.678, 1.5, 2.25, 'ab', 'héllo wörld ✓', 'long text', X'00FF10', \
                X'6162', X'01020304', '2024-02-29', '2024-02-29 13:14:15.123456', '2021-06-01 00:00:01.5', \
                '-838:59:59.5', 2155, 'green', 'a,c', '{\"k\": [1, 2]}', b'1', b'101010101010'";
    let nulls = vec!["NULL"; 30].join(", ");
    fx.sql(&format!("INSERT INTO t VALUES (1, {full}), (2, {nulls})")).await;

    let t = fx.table("t");
    let mut source = MySqlSource::new(fx.config(), "t").expect("config");
    start(&mut source, None).await.expect("start");
    let mut mirror = Mirror::default();
    sync(&mut source, &mut mirror, "the snapshot", |m| m.ids(&t).len() == 2).await;
    fx.sql(&format!("INSERT INTO t VALUES (11, {full}), (12, {nulls})")).await;
    sync(&mut source, &mut mirror, "the streamed rows", |m| m.ids(&t).len() == 4).await;

    let snap = mirror.row(&t, 1).expect("snapshot row");
    let streamed = mirror.row(&t, 11).expect("streamed row");
    let schema = mirror.events[0].schema.clone();
    for (i, col) in schema.columns.iter().enumerate().skip(1) {
        assert_eq!(snap[i], streamed[i], "column {} ({})", col.name, col.source_type);
        assert_ne!(snap[i], Value::Null, "column {} is not NULL", col.name);
    }
    let snap_nulls = mirror.row(&t, 2).expect("snapshot nulls");
    let streamed_nulls = mirror.row(&t, 12).expect("streamed nulls");
    assert!(snap_nulls[1..].iter().all(|v| *v == Value::Null), "{snap_nulls:?}");
    assert_eq!(snap_nulls[1..], streamed_nulls[1..]);

    let col = |name: &str| schema.column_index(name).map(|i| streamed[i].clone()).expect("column");
    assert_eq!(col("tu"), Value::Int16(250));
    assert_eq!(col("su"), Value::Int32(65000));
    assert_eq!(col("mu"), Value::Int32(16_000_000));
    assert_eq!(col("iu"), Value::Int64(4_000_000_000));
    assert_eq!(col("bu"), Value::Decimal("18446744073709551615".into()));
    assert_eq!(col("b1"), Value::Boolean(true));
    assert_eq!(col("de"), Value::Decimal("-12345.678".into()));
    assert_eq!(col("f"), Value::Float32(1.5));
    assert_eq!(col("vc"), Value::Text("héllo wörld ✓".into()));
    assert_eq!(col("bn"), Value::Bytes(vec![0x61, 0x62, 0, 0]));
    assert_eq!(col("dt"), Value::Date(19782));
    assert_eq!(col("dtm"), Value::Timestamp(1_709_212_455_123_456));
    assert_eq!(col("ts"), Value::TimestampTz(1_622_505_601_500_000));
    assert_eq!(col("tm"), Value::Time(-(838 * 3600 + 59 * 60 + 59) * 1_000_000 - 500_000));
    assert_eq!(col("yr"), Value::Int32(2155));
    assert_eq!(col("en"), Value::Enum("green".into()));
    assert_eq!(col("st"), Value::Text("a,c".into()));
    assert_eq!(col("bt"), Value::Boolean(true));
    assert_eq!(col("b8"), Value::Bytes(vec![0x0a, 0xaa]));
    // MariaDB's JSON is LONGTEXT with a json_valid check (COLUMN_TYPE
    // `longtext`), so it is carried as text, as Debezium does for MariaDB.
    match col("js") {
        Value::Json(j) | Value::Text(j) => {
            assert_eq!(serde_json::from_str::<serde_json::Value>(&j).expect("json"), serde_json::json!({"k": [1, 2]}))
        }
        other => panic!("json column: {other:?}"),
    }
    fx.drop().await;
}

/// Zero dates (`0000-00-00`, and dates with a zero month or day) have no
/// calendar day: NULL where the column is optional, the epoch where it is
/// NOT NULL (Debezium's rule), alike in the snapshot and the binlog.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_dates_are_null_where_optional_and_the_epoch_where_not_null() {
    let mut fx = Fixture::new("myzero").await;
    // Zero dates need a session without NO_ZERO_DATE / strict mode.
    fx.sql("SET SESSION sql_mode = ''").await;
    fx.sql(
        "CREATE TABLE z (id INT PRIMARY KEY, d DATE NOT NULL, dt DATETIME(3) NOT NULL, \
         ts TIMESTAMP NOT NULL DEFAULT '0000-00-00 00:00:00', dm DATE NOT NULL, dtd DATETIME NOT NULL, \
         dn DATE NULL, dtn DATETIME NULL, tsn TIMESTAMP NULL, dmn DATE NULL)",
    )
    .await;
    let zeros = "'0000-00-00', '0000-00-00 00:00:00', '0000-00-00 00:00:00', '2024-00-15', '2024-05-00 10:00:00', \
                 '0000-00-00', '0000-00-00 00:00:00', '0000-00-00 00:00:00', '2024-05-00'";
    fx.sql(&format!("INSERT INTO z VALUES (1, {zeros})")).await;
    let z = fx.table("z");
    let mut source = MySqlSource::new(fx.config(), "t").expect("config");
    start(&mut source, None).await.expect("start");
    let mut mirror = Mirror::default();
    sync(&mut source, &mut mirror, "the snapshot", |m| m.ids(&z).len() == 1).await;
    fx.sql(&format!("INSERT INTO z VALUES (2, {zeros})")).await;
    sync(&mut source, &mut mirror, "the streamed row", |m| m.ids(&z).len() == 2).await;
    let want = vec![
        Value::Date(0),
        Value::Timestamp(0),
        Value::TimestampTz(0),
        Value::Date(0),
        Value::Timestamp(0),
        Value::Null,
        Value::Null,
        Value::Null,
        Value::Null,
    ];
    for id in [1, 2] {
        let row = mirror.row(&z, id).expect("row");
        assert_eq!(row[1..], want[..], "row {id}");
    }
    fx.drop().await;
}

/// Text of columns in other character sets than UTF-8 is decoded by the
/// column's character set (the table map's, `binlog_row_metadata = FULL`)
/// in the binlog, as the server converts it for the snapshot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_utf8_character_sets_stream_as_the_source_text() {
    let mut fx = Fixture::new("mycharset").await;
    fx.sql(
        "CREATE TABLE l (id INT PRIMARY KEY, a VARCHAR(40), c VARCHAR(40) CHARACTER SET cp1251, \
         b TEXT COLLATE latin1_bin, u VARCHAR(40) CHARACTER SET utf8mb4, \
         g CHAR(10) CHARACTER SET greek, k VARCHAR(20) CHARACTER SET sjis) DEFAULT CHARSET = latin1",
    )
    .await;
    let texts = ["café", "привет, мир", "Ærø € ÿ", "ü ✓ 😀", "αβγ", "日本語"];
    let values = texts.iter().map(|t| format!("'{t}'")).collect::<Vec<_>>().join(", ");
    fx.sql(&format!("INSERT INTO l VALUES (1, {values})")).await;
    let l = fx.table("l");
    let mut source = MySqlSource::new(fx.config(), "t").expect("config");
    start(&mut source, None).await.expect("start");
    let mut mirror = Mirror::default();
    sync(&mut source, &mut mirror, "the snapshot", |m| m.ids(&l).len() == 1).await;
    fx.sql(&format!("INSERT INTO l VALUES (2, {values})")).await;
    fx.sql("UPDATE l SET a = 'naïve', b = 'ÀÉÎ' WHERE id = 2").await;
    sync(&mut source, &mut mirror, "the streamed rows", |m| {
        m.row(&l, 2).is_some_and(|r| r[1] == Value::Text("naïve".into()))
    })
    .await;
    let want = |a: &str, b: &str| -> Vec<Value> {
        [a, texts[1], b, texts[3], texts[4], texts[5]]
            .iter()
            .map(|t| Value::Text((*t).into()))
            .collect()
    };
    assert_eq!(mirror.row(&l, 1).expect("snapshot row")[1..], want(texts[0], texts[2])[..]);
    let streamed: Vec<&ChangeEvent> = mirror.events.iter().filter(|e| e.op != Op::Read).collect();
    assert_eq!(streamed.len(), 2);
    assert_eq!(streamed[0].after.as_ref().expect("after")[1..], want(texts[0], texts[2])[..]);
    assert_eq!(streamed[1].before.as_ref().expect("before")[1..], want(texts[0], texts[2])[..]);
    assert_eq!(streamed[1].after.as_ref().expect("after")[1..], want("naïve", "ÀÉÎ")[..]);
    fx.drop().await;
}

/// Issue #24: a streamed value the source cannot decode (a character set
/// without a decoder) pauses its table alone: the batch says which table
/// failed and why (column, type, character set), the other tables keep
/// flowing, and a copy of the table (what the runner asks at its next
/// start) reads the value through the server, in UTF-8. Before, the
/// source stopped with an error and no table was copied further.
/// Issue #30: the binlog after the source's position, for status and
/// metrics: known once started, and it grows by what is written and not
/// yet read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binlog_behind_the_position_is_measured() {
    use tributary_connectors::Source;
    let mut fx = Fixture::new("myretained").await;
    fx.sql("CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(200))").await;
    fx.sql("INSERT INTO t VALUES (1, 'a')").await;
    let t = fx.table("t");
    let mut source = MySqlSource::new(fx.config(), "t").expect("config");
    start(&mut source, None).await.expect("start");
    let mut mirror = Mirror::default();
    sync(&mut source, &mut mirror, "the snapshot", |m| m.ids(&t).len() == 1).await;
    let before = source.retained_bytes().await.expect("binlog bytes after the position");
    // 100 rows of 200 bytes, not read.
    fx.sql("INSERT INTO t SELECT seq, REPEAT('x', 200) FROM seq_2_to_101").await;
    let after = source.retained_bytes().await.expect("binlog bytes after the position");
    assert!(after >= before + 100 * 200, "{before} -> {after}");
    sync(&mut source, &mut mirror, "the rows", |m| m.ids(&t).len() == 101).await;
    let read = source.retained_bytes().await.expect("binlog bytes after the position");
    assert!(read < after, "reading did not shrink it: {after} -> {read}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecodable_value_pauses_its_table_and_the_others_go_on() {
    let mut fx = Fixture::new("myfail").await;
    fx.sql("CREATE TABLE d (id INT PRIMARY KEY, c VARCHAR(20) CHARACTER SET dec8)")
        .await;
    fx.sql("CREATE TABLE ok (id INT PRIMARY KEY, v INT)").await;
    fx.sql("INSERT INTO d VALUES (1, 'plain')").await;
    fx.sql("INSERT INTO ok VALUES (1, 1)").await;
    let (d, ok) = (fx.table("d"), fx.table("ok"));
    let mut source = MySqlSource::new(fx.config(), "t").expect("config");
    start(&mut source, None).await.expect("start");
    let mut mirror = Mirror::default();
    sync(&mut source, &mut mirror, "the snapshot", |m| m.ids(&d).len() == 1 && m.ids(&ok).len() == 1).await;

    fx.sql("INSERT INTO d VALUES (2, 'café')").await;
    fx.sql("INSERT INTO ok VALUES (2, 2)").await;
    let failed = |m: &Mirror| {
        m.messages
            .iter()
            .filter_map(|msg| match msg {
                SourceMessage::TableFailed(t, reason) => Some((t.clone(), reason.clone())),
                _ => None,
            })
            .collect::<Vec<_>>()
    };
    let deadline = Instant::now() + DEADLINE;
    while mirror.ids(&ok).len() < 2 {
        assert!(Instant::now() < deadline, "timed out waiting for ok's row");
        let batch = next(&mut source).await;
        mirror.messages.extend(
            batch
                .messages
                .iter()
                .filter(|m| matches!(m, SourceMessage::TableFailed(..)))
                .cloned(),
        );
        let rest = SourceBatch {
            messages: batch
                .messages
                .into_iter()
                .filter(|m| !matches!(m, SourceMessage::TableFailed(..)))
                .collect(),
            checkpoint: batch.checkpoint,
        };
        mirror.apply(rest);
    }
    let failures = failed(&mirror);
    assert_eq!(failures.len(), 1, "{failures:?}");
    let (table, reason) = &failures[0];
    assert_eq!(table, &d);
    assert!(
        reason.contains("dec8") && reason.contains('c'),
        "the reason names the column's character set: {reason}"
    );
    assert_eq!(mirror.ids(&d).len(), 1, "d's undecodable row is not emitted");
    drop(source);

    // The next start copies the table again: the server converts the value.
    let mut source = MySqlSource::new(fx.config(), "t").expect("config");
    start(&mut source, mirror.checkpoint.clone()).await.expect("resume");
    assert_eq!(source.resync(std::slice::from_ref(&d)).await.expect("resync"), vec![d.clone()]);
    sync(&mut source, &mut mirror, "d's copy", |m| m.ids(&d).len() == 2).await;
    assert_eq!(mirror.row(&d, 2).expect("row 2")[1], Value::Text("café".into()));
    fx.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ddl_mid_stream_decodes_rows_with_the_schema_they_were_written_under() {
    let mut fx = Fixture::new("myddl").await;
    fx.sql("CREATE TABLE a (id INT PRIMARY KEY, v INT)").await;
    fx.sql("INSERT INTO a VALUES (1, 10)").await;
    let a = fx.table("a");
    let mut source = MySqlSource::new(fx.config(), "t").expect("config");
    start(&mut source, None).await.expect("start");
    let mut mirror = Mirror::default();
    sync(&mut source, &mut mirror, "the snapshot", |m| m.ids(&a).len() == 1).await;
    let checkpoint = mirror.checkpoint.clone().expect("checkpoint");

    // Everything below is written before the source reads any of it: the
    // insert before the ALTER must still decode with two columns.
    fx.sql("INSERT INTO a VALUES (2, 20)").await;
    fx.sql("ALTER TABLE a ADD COLUMN note VARCHAR(20) NOT NULL DEFAULT 'x' AFTER id")
        .await;
    fx.sql("INSERT INTO a VALUES (3, 'three', 30)").await;
    fx.sql("ALTER TABLE a DROP COLUMN v, MODIFY note VARCHAR(40)").await;
    fx.sql("INSERT INTO a VALUES (4, 'four')").await;
    fx.sql("CREATE TABLE b (id BIGINT UNSIGNED PRIMARY KEY, e ENUM('x','y'))").await;
    fx.sql("INSERT INTO b VALUES (1, 'y')").await;
    fx.sql("RENAME TABLE b TO c").await;
    fx.sql("INSERT INTO c VALUES (2, 'x')").await;
    fx.sql("DROP TABLE c").await;

    let expect = |mirror: &Mirror| {
        mirror
            .messages
            .iter()
            .any(|m| matches!(m, SourceMessage::TableDropped(t) if t.table == "c"))
    };
    sync(&mut source, &mut mirror, "the DDL sequence", expect).await;
    let check = |mirror: &Mirror| {
        let ev = |id: i64| {
            mirror
                .events
                .iter()
                .find(|e| e.schema.id == a && e.op == Op::Create && int(&e.after.as_ref().expect("after")[0]) == id)
                .unwrap_or_else(|| panic!("insert {id}"))
                .clone()
        };
        let names = |e: &ChangeEvent| e.schema.columns.iter().map(|c| c.name.clone()).collect::<Vec<_>>();
        assert_eq!(names(&ev(2)), ["id", "v"]);
        assert_eq!(ev(2).after.expect("after")[1], Value::Int32(20));
        assert_eq!(names(&ev(3)), ["id", "note", "v"]);
        assert_eq!(ev(3).after.expect("after")[1], Value::Text("three".into()));
        assert_eq!(names(&ev(4)), ["id", "note"]);
        // SchemaChanged precedes the first row of each new shape and of new tables.
        let order: Vec<String> = mirror
            .messages
            .iter()
            .filter_map(|m| match m {
                SourceMessage::SchemaChanged(s) => Some(format!("schema {} {}", s.id.table, s.columns.len())),
                SourceMessage::Change(e) if e.op != Op::Read => Some(format!("row {}", e.schema.id.table)),
                SourceMessage::TableDropped(t) => Some(format!("dropped {}", t.table)),
                _ => None,
            })
            .collect();
        let tail: Vec<&str> = order.iter().map(String::as_str).skip_while(|s| *s != "row a").collect();
        assert_eq!(
            tail,
            [
                "row a",
                "schema a 3",
                "row a",
                "schema a 2",
                "row a",
                "schema b 2",
                "row b",
                "dropped b",
                "schema c 2",
                "row c",
                "dropped c"
            ],
            "{order:?}"
        );
    };
    check(&mirror);

    // A restart from the checkpoint before all of it replays the same
    // events with the same schemas: the history is in the checkpoint.
    let mut again = MySqlSource::new(fx.config(), "t").expect("config");
    start(&mut again, Some(checkpoint.clone())).await.expect("resume");
    let mut replay = Mirror::default();
    sync(&mut again, &mut replay, "the replayed DDL sequence", expect).await;
    check(&replay);
    let streamed = |m: &Mirror| -> Vec<(Position, Op)> {
        m.events
            .iter()
            .filter(|e| e.op != Op::Read)
            .map(|e| (e.source.position, e.op))
            .collect()
    };
    assert_eq!(streamed(&mirror), streamed(&replay));

    // The same by GTID (MariaDB's @slave_connect_state instead of file/offset).
    let state = SourceState::from_checkpoint(&checkpoint).expect("state");
    assert!(state.gtid.is_some(), "the snapshot checkpoint has a GTID position");
    let mut config = fx.config();
    config.resume_by = tributary_connectors::sources::mysql::config::ResumeBy::Gtid;
    let mut by_gtid = MySqlSource::new(config, "t").expect("config");
    start(&mut by_gtid, Some(checkpoint)).await.expect("resume by GTID");
    let mut replay_gtid = Mirror::default();
    sync(&mut by_gtid, &mut replay_gtid, "the DDL sequence replayed by GTID", expect).await;
    check(&replay_gtid);
    assert_eq!(streamed(&mirror), streamed(&replay_gtid));
    fx.drop().await;
}

/// Issue #46: an ALTER that may change the values of rows the binlog logs
/// no change for is said (`TableRewritten`, after the table's new shape and
/// before the changes after it), one that keeps every value is not; the
/// QUERY event's `sql_mode` decides the conversions strict mode refuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alters_that_change_values_without_row_events_are_said_and_others_are_not() {
    let mut fx = Fixture::new("myrewrite").await;
    fx.sql("CREATE TABLE t (id INT PRIMARY KEY, a BIGINT, v VARCHAR(20), n INT, tm TIME(6))")
        .await;
    fx.sql("INSERT INTO t VALUES (1, 1, 'one', 1, '-838:59:59'), (2, 2, 'two', 2, '100:00:00.5')")
        .await;
    fx.sql("CREATE TABLE u (id INT PRIMARY KEY, w VARCHAR(20)) CHARACTER SET utf8mb4")
        .await;
    fx.sql("INSERT INTO u VALUES (1, 'plain')").await;
    let (t, u) = (fx.table("t"), fx.table("u"));
    let mut source = MySqlSource::new(fx.config(), "t").expect("config");
    start(&mut source, None).await.expect("start");
    let mut mirror = Mirror::default();
    sync(&mut source, &mut mirror, "the snapshot", |m| m.ids(&t).len() == 2 && m.ids(&u).len() == 1).await;
    // MySQL's TIME beyond a day, as it is.
    assert_eq!(mirror.row(&t, 1).expect("row 1")[4], Value::Time(-3_020_399_000_000));
    assert_eq!(mirror.row(&t, 2).expect("row 2")[4], Value::Time(360_000_500_000));

    // Every value kept (the session is strict: narrowing values that fit
    // keeps them, or the ALTER fails).
    for sql in [
        "ALTER TABLE t MODIFY v VARCHAR(40), ADD COLUMN k INT DEFAULT 7",
        "ALTER TABLE t MODIFY a INT",
        "ALTER TABLE t MODIFY n INT NOT NULL",
        "ALTER TABLE t ENGINE=InnoDB",
        "ALTER TABLE t FORCE, ADD INDEX (n)",
        "ALTER ONLINE TABLE t ADD COLUMN IF NOT EXISTS z INT",
        "ALTER TABLE u CONVERT TO CHARACTER SET utf8mb4",
        "INSERT INTO t (id, a, v, n) VALUES (3, 3, 'three', 3)",
    ] {
        fx.sql(sql).await;
    }
    sync(&mut source, &mut mirror, "the kept changes", |m| m.ids(&t).contains(&3)).await;
    let said = |m: &Mirror| -> Vec<(String, String)> {
        m.messages
            .iter()
            .filter_map(|msg| match msg {
                SourceMessage::TableRewritten(t, why) => Some((t.table.clone(), why.clone())),
                _ => None,
            })
            .collect()
    };
    assert_eq!(said(&mirror), [], "nothing changed a value");

    // Values changed: each said, with why.
    fx.sql("ALTER TABLE t ADD COLUMN g INT AS (a * 2) PERSISTENT").await;
    fx.sql("INSERT INTO t (id, a, v, n) VALUES (4, 4, 'four', 4)").await;
    fx.sql("SET SESSION sql_mode = ''").await;
    fx.sql("ALTER TABLE t MODIFY n SMALLINT").await;
    fx.sql("ALTER TABLE u CONVERT TO CHARACTER SET latin1").await;
    fx.sql("SET SESSION sql_mode = DEFAULT").await;
    fx.sql("ALTER TABLE t MODIFY tm TIME").await;
    fx.sql("INSERT INTO u VALUES (2, 'after')").await;
    sync(&mut source, &mut mirror, "the rewrites", |m| m.ids(&u).contains(&2)).await;
    let said = said(&mirror);
    let tables: Vec<&str> = said.iter().map(|(t, _)| t.as_str()).collect();
    assert_eq!(tables, ["t", "t", "u", "t"], "{said:?}");
    assert!(said[0].1.contains("stored generated column g added"), "{}", said[0].1);
    assert!(said[1].1.contains("to SMALLINT"), "{}", said[1].1);
    assert!(said[2].1.contains("latin1"), "{}", said[2].1);
    assert!(said[3].1.contains("6 to 0 fractional digits"), "{}", said[3].1);
    // The generated column's message follows its new shape and comes
    // before the insert after it.
    let at = |f: &dyn Fn(&SourceMessage) -> bool| mirror.messages.iter().position(f).expect("message");
    let shape = at(&|m| matches!(m, SourceMessage::SchemaChanged(s) if s.id == t && s.column_index("g").is_some()));
    let rewritten = at(&|m| matches!(m, SourceMessage::TableRewritten(..)));
    let insert = at(
        &|m| matches!(m, SourceMessage::Change(e) if e.schema.id == t && int(&e.after.as_ref().expect("after")[0]) == 4),
    );
    assert!(shape < rewritten && rewritten < insert, "{shape} < {rewritten} < {insert}");
    drop(source);
    fx.drop().await;
}

/// Copies asked while a run is under way (two tables rewritten by one
/// migration, a `POST /resync` as the snapshot ends): a table the run read
/// already is copied by a run of its own after it, one it has not started
/// keeps its place and its progress, and one it lacks waits for its end.
/// Before, a table the run had read was never copied again (the runner
/// held it for ever), a table added went into a plan the run overwrote with
/// its next chunk, and a table asked again before its rows lost its
/// progress, so the runner never heard its copy was complete (nor removed
/// the rows deleted meanwhile: tests/tests/schema_changes.rs,
/// `an_incompatible_change_pauses_its_mariadb_table_until_it_can_be_carried`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_asked_while_another_is_under_way_is_made_and_completes() {
    let mut fx = Fixture::new("myresync").await;
    fx.sql("CREATE TABLE a (id INT PRIMARY KEY, v INT)").await;
    fx.sql("CREATE TABLE b (id INT PRIMARY KEY, v INT)").await;
    fx.sql("INSERT INTO a VALUES (1, 1), (2, 2)").await;
    fx.sql("INSERT INTO b VALUES (1, 1), (2, 2), (3, 3)").await;
    let (a, b) = (fx.table("a"), fx.table("b"));
    let mut source = MySqlSource::new(fx.config(), "t").expect("config");
    start(&mut source, None).await.expect("start");
    let mut mirror = Mirror::default();
    sync(&mut source, &mut mirror, "the snapshot", |m| m.ids(&a).len() == 2 && m.ids(&b).len() == 3).await;

    fx.sql("INSERT INTO a VALUES (3, 3)").await;
    assert_eq!(source.resync(std::slice::from_ref(&a)).await.expect("resync a"), vec![a.clone()]);
    // Until a's copy is open (its progress starts over), catching up.
    let deadline = Instant::now() + DEADLINE;
    while !source.snapshot_progress().iter().any(|p| p.table == a && !p.done) {
        assert!(Instant::now() < deadline, "a's copy opens");
        mirror.apply(next(&mut source).await);
    }
    fx.sql("INSERT INTO b VALUES (4, 4)").await;
    let ab = [a.clone(), b.clone()];
    assert_eq!(source.resync(&ab).await.expect("resync a and b"), ab.to_vec());
    let reads = |m: &Mirror, t: &TableId| m.events.iter().filter(|e| e.schema.id == *t && e.op == Op::Read).count();
    let done = |s: &MySqlSource, t: &TableId| s.snapshot_progress().iter().any(|p| p.table == *t && p.done);
    let deadline = Instant::now() + DEADLINE;
    // The first snapshot read 2 + 3 rows; the copies read 3 + 4 more.
    while !(reads(&mirror, &a) >= 5 && reads(&mirror, &b) >= 7 && done(&source, &a) && done(&source, &b)) {
        assert!(
            Instant::now() < deadline,
            "both copies complete: a read {}, b read {}",
            reads(&mirror, &a),
            reads(&mirror, &b)
        );
        mirror.apply(next(&mut source).await);
    }
    assert_eq!(mirror.ids(&b), [1, 2, 3, 4].into());
    drop(source);
    fx.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renamed_columns_carry_their_earlier_names_as_aliases() {
    let mut fx = Fixture::new("mycolren").await;
    fx.sql("CREATE TABLE r (id INT PRIMARY KEY, d INT, e VARCHAR(10))").await;
    fx.sql("INSERT INTO r VALUES (1, 10, 'one')").await;
    let r = fx.table("r");
    let mut source = MySqlSource::new(fx.config(), "t").expect("config");
    start(&mut source, None).await.expect("start");
    let mut mirror = Mirror::default();
    sync(&mut source, &mut mirror, "the snapshot", |m| m.ids(&r).len() == 1).await;

    fx.sql("ALTER TABLE r RENAME COLUMN d TO d2").await;
    fx.sql("INSERT INTO r VALUES (2, 20, 'two')").await;
    fx.sql("ALTER TABLE r CHANGE COLUMN e e2 VARCHAR(20)").await;
    fx.sql("INSERT INTO r VALUES (3, 30, 'three')").await;
    fx.sql("ALTER TABLE r MODIFY COLUMN d2 BIGINT").await;
    fx.sql("INSERT INTO r VALUES (4, 40, 'four')").await;
    sync(&mut source, &mut mirror, "the renames", |m| m.ids(&r).len() == 4).await;

    let shape = |id: i64| -> Vec<(String, Vec<String>)> {
        let e = mirror
            .events
            .iter()
            .find(|e| e.op == Op::Create && int(&e.after.as_ref().expect("after")[0]) == id)
            .unwrap_or_else(|| panic!("insert {id}"));
        e.schema.columns.iter().map(|c| (c.name.clone(), c.aliases.clone())).collect()
    };
    let col = |name: &str, aliases: &[&str]| (name.to_string(), aliases.iter().map(|a| a.to_string()).collect());
    assert_eq!(shape(2), [col("id", &[]), col("d2", &["d"]), col("e", &[])]);
    assert_eq!(shape(3), [col("id", &[]), col("d2", &["d"]), col("e2", &["e"])]);
    assert_eq!(shape(4), [col("id", &[]), col("d2", &["d"]), col("e2", &["e"])]);
    // The announced schema (what the runner registers) carries them too.
    let announced = mirror
        .messages
        .iter()
        .rev()
        .find_map(|m| match m {
            SourceMessage::SchemaChanged(s) if s.id == r => Some(s.clone()),
            _ => None,
        })
        .expect("a schema change");
    assert_eq!(announced.columns[1].aliases, ["d"]);
    assert_eq!(announced.columns[1].source_type.to_lowercase(), "bigint");

    // They survive a restart: the history in the checkpoint keeps them.
    let mut again = MySqlSource::new(fx.config(), "t").expect("config");
    start(&mut again, mirror.checkpoint.clone()).await.expect("resume");
    fx.sql("INSERT INTO r VALUES (5, 50, 'five')").await;
    let mut replay = Mirror::default();
    sync(&mut again, &mut replay, "the insert after the restart", |m| m.ids(&r).contains(&5)).await;
    let e = replay.events.iter().find(|e| e.schema.id == r).expect("an event");
    assert_eq!(e.schema.columns[1].aliases, ["d"]);
    assert_eq!(e.schema.columns[2].aliases, ["e"]);
    fx.drop().await;
}

async fn source_rows_of(conn: &mut mysql_async::Conn, table: &TableId) -> BTreeMap<i64, String> {
    let rows: Vec<(i64, String)> = conn
        .query(format!("SELECT id, v FROM `{}`.`{}`", table.schema, table.table))
        .await
        .expect("select rows");
    rows.into_iter().collect()
}

fn mirror_rows_of(mirror: &Mirror, table: &TableId) -> BTreeMap<i64, String> {
    let text = |v: &Value| match v {
        Value::Text(t) => t.clone(),
        other => panic!("not text: {other:?}"),
    };
    mirror
        .rows
        .get(table)
        .map(|t| t.values().map(|(_, r)| (int(&r[0]), text(&r[1]))).collect())
        .unwrap_or_default()
}

/// Each row comes after a `SchemaChanged` of exactly its schema: the
/// runner registers the announced shape and encodes rows with it.
fn assert_rows_follow_their_announced_schema(mirror: &Mirror) {
    let mut announced: BTreeMap<TableId, std::sync::Arc<tributary_schemas::TableSchema>> = BTreeMap::new();
    for (i, m) in mirror.messages.iter().enumerate() {
        match m {
            SourceMessage::SchemaChanged(s) => {
                announced.insert(s.id.clone(), s.clone());
            }
            SourceMessage::TableDropped(t) => {
                announced.remove(t);
            }
            SourceMessage::TableFailed(t, reason) => panic!("{t} failed: {reason}"),
            SourceMessage::TableRewritten(t, reason) => panic!("{t} rewritten: {reason}"),
            SourceMessage::Sequence(..)
            | SourceMessage::Objects(..)
            | SourceMessage::Verify(..)
            | SourceMessage::TransactionEnd(_) => {}
            SourceMessage::Change(e) => {
                assert!(
                    announced.get(&e.schema.id).is_some_and(|s| **s == *e.schema),
                    "message {i}: a {:?} row of {} under a schema not announced last",
                    e.op,
                    e.schema.id
                );
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renamed_table_is_copied_again_under_its_new_name() {
    let mut fx = Fixture::new("mytblren").await;
    fx.sql("CREATE TABLE src (id INT PRIMARY KEY, v VARCHAR(20) NOT NULL)").await;
    let values: Vec<String> = (1..=250).map(|i| format!("({i}, 'v{i}')")).collect();
    fx.sql(&format!("INSERT INTO src VALUES {}", values.join(","))).await;
    let (src, dst) = (fx.table("src"), fx.table("dst"));
    let mut source = MySqlSource::new(fx.config(), "t").expect("config");
    start(&mut source, None).await.expect("start");
    let mut mirror = Mirror::default();
    sync(&mut source, &mut mirror, "the snapshot", |m| m.ids(&src).len() == 250).await;

    // All written before the source reads the rename: the copy sees the
    // table after these changes, the stream replays them before it.
    fx.sql("INSERT INTO src VALUES (251, 'before')").await;
    fx.sql("RENAME TABLE src TO dst").await;
    fx.sql("INSERT INTO dst VALUES (252, 'after')").await;
    // The copy reads this later shape; the stream's rows before the ALTER
    // have the earlier one and must be announced under it again.
    fx.sql("ALTER TABLE dst ADD COLUMN note VARCHAR(10) DEFAULT 'n'").await;
    fx.sql("UPDATE dst SET v = 'changed' WHERE id IN (3, 251)").await;
    fx.sql("DELETE FROM dst WHERE id IN (4, 252)").await;
    fx.sql("INSERT INTO dst (id, v) VALUES (999, 'last')").await;

    // The batch with the rename ends there, its checkpoint holds the copy.
    let deadline = Instant::now() + DEADLINE;
    let renamed = loop {
        assert!(Instant::now() < deadline, "timed out waiting for the rename");
        let batch = next(&mut source).await;
        let dropped = batch
            .messages
            .iter()
            .any(|m| matches!(m, SourceMessage::TableDropped(t) if *t == src));
        let checkpoint = batch.checkpoint.clone();
        mirror.apply(batch);
        if dropped {
            break checkpoint;
        }
    };
    let state = SourceState::from_checkpoint(&renamed).expect("state");
    let plan = state.snapshot.expect("the checkpoint after the rename holds the copy to do");
    assert_eq!(plan.tables.iter().map(|t| t.id()).collect::<Vec<_>>(), std::slice::from_ref(&dst));

    // The stream first catches up with the copy's point (the insert of
    // 999, the last change, among what it emits), then the copy's rows go
    // out: wait for the checkpoint without snapshot work.
    let streamed_999 = |m: &Mirror| {
        m.events
            .iter()
            .any(|e| e.schema.id == dst && e.op == Op::Create && e.after.as_ref().is_some_and(|a| int(&a[0]) == 999))
            && m.checkpoint
                .as_ref()
                .is_some_and(|c| SourceState::from_checkpoint(c).expect("state").snapshot.is_none())
    };
    let expected = source_rows_of(&mut fx.conn, &dst).await;
    assert_eq!(expected.len(), 251, "251 rows, 252 and 999 added, 4 and 252 deleted");
    sync(&mut source, &mut mirror, "the copy and the changes after it", streamed_999).await;
    assert_eq!(mirror_rows_of(&mirror, &dst), expected, "the destination's dst equals the source's");
    assert!(!mirror.rows.contains_key(&src), "src was dropped");
    assert_rows_follow_their_announced_schema(&mirror);
    assert_no_event_older_than_one_before_it(&mirror.events);
    let reads = mirror.events.iter().filter(|e| e.schema.id == dst && e.op == Op::Read).count();
    assert_eq!(reads, 251, "every row of dst copied once");
    assert!(mirror
        .events
        .iter()
        .filter(|e| e.schema.id == dst && e.op == Op::Read)
        .all(|e| e.source.snapshot == SnapshotMarker::True));

    // Later changes stream as usual.
    fx.sql("UPDATE dst SET v = 'streamed' WHERE id = 1").await;
    sync(&mut source, &mut mirror, "a change after the copy", |m| {
        mirror_rows_of(m, &dst).get(&1).map(String::as_str) == Some("streamed")
    })
    .await;

    // A crash right after the rename batch: the restart does the copy.
    let mut again = MySqlSource::new(fx.config(), "t").expect("config");
    start(&mut again, Some(renamed)).await.expect("resume");
    let mut replay = Mirror::default();
    let expected = source_rows_of(&mut fx.conn, &dst).await;
    sync(&mut again, &mut replay, "the copy after a restart", streamed_999).await;
    assert_eq!(mirror_rows_of(&replay, &dst), expected);
    assert_rows_follow_their_announced_schema(&replay);

    // Renamed back: copied again, its progress counted afresh.
    let progress = |s: &MySqlSource, t: &TableId| s.snapshot_progress().into_iter().find(|p| p.table == *t);
    assert_eq!(progress(&source, &dst).map(|p| (p.rows, p.done)), Some((251, true)));
    fx.sql("RENAME TABLE dst TO src").await;
    let expected = source_rows_of(&mut fx.conn, &src).await;
    sync(&mut source, &mut mirror, "the copy under the old name again", |m| {
        !m.rows.contains_key(&dst) && mirror_rows_of(m, &src) == expected
    })
    .await;
    assert_eq!(progress(&source, &src).map(|p| (p.rows, p.done)), Some((251, true)));
    assert_rows_follow_their_announced_schema(&mirror);
    fx.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_mid_snapshot_and_mid_stream_is_exactly_once() {
    let mut fx = Fixture::new("myresume").await;
    fx.sql("CREATE TABLE r (id INT PRIMARY KEY, v INT NOT NULL)").await;
    let values: Vec<String> = (1..=1000).map(|i| format!("({i}, 0)")).collect();
    fx.sql(&format!("INSERT INTO r VALUES {}", values.join(","))).await;
    let r = fx.table("r");

    // First life: two chunks, then the process "dies" (dropped).
    let mut source = MySqlSource::new(fx.config(), "t").expect("config");
    start(&mut source, None).await.expect("start");
    let mut mirror = Mirror::default();
    mirror.apply(next(&mut source).await);
    mirror.apply(next(&mut source).await);
    drop(source);
    let durable = mirror.checkpoint.clone();
    let state = SourceState::from_checkpoint(durable.as_ref().expect("checkpoint")).expect("state");
    assert!(state.snapshot.is_some(), "the kill lands mid-snapshot");

    let mut source = MySqlSource::new(fx.config(), "t").expect("config");
    start(&mut source, durable).await.expect("resume");
    sync(&mut source, &mut mirror, "the rest of the snapshot", |m| m.ids(&r).len() == 1000).await;
    let reads = mirror.events.iter().filter(|e| e.op == Op::Read).count();
    assert_eq!(reads, 1000, "no snapshot row twice");

    // Streaming: 30 transactions; a crash after some batches drops what
    // was read but not made durable.
    for step in 1..=30 {
        fx.sql(&format!("UPDATE r SET v = v + 1 WHERE id = {}", step % 5 + 1)).await;
    }
    let mut durable_mirror_len = mirror.events.len();
    let mut durable = mirror.checkpoint.clone();
    let total = |m: &Mirror| m.events.iter().filter(|e| e.op == Op::Update).count();
    let deadline = Instant::now() + DEADLINE;
    while total(&mirror) < 10 {
        assert!(Instant::now() < deadline, "timed out before the crash");
        mirror.apply(next(&mut source).await);
        durable_mirror_len = mirror.events.len();
        durable = mirror.checkpoint.clone();
    }
    // Read one more batch that never becomes durable, then crash.
    let lost = tokio::time::timeout(Duration::from_secs(2), source.next_batch()).await;
    drop(lost);
    drop(source);
    mirror.events.truncate(durable_mirror_len);
    let mut source = MySqlSource::new(fx.config(), "t").expect("config");
    start(&mut source, durable).await.expect("resume streaming");
    sync(&mut source, &mut mirror, "every update", |m| total(m) >= 30).await;
    // One more heartbeat: nothing beyond the 30 updates arrives.
    mirror.apply(next(&mut source).await);
    assert_eq!(total(&mirror), 30, "every update exactly once");
    let mut last: BTreeMap<i64, i64> = BTreeMap::new();
    for e in mirror.events.iter().filter(|e| e.op == Op::Update) {
        let row = e.after.as_ref().expect("after");
        let (id, v) = (int(&row[0]), int(&row[1]));
        assert_eq!(v, last.get(&id).copied().unwrap_or(0) + 1, "id {id}: no gap, no repeat");
        last.insert(id, v);
    }
    fx.drop().await;
}

/// Issue #24: a transaction with more changes than a batch holds goes out
/// in parts, each batch within `max_batch_events`, instead of being held
/// whole in memory. Its positions (start of the transaction + 1, 1..n) sit
/// between those of the transactions around it; a crash after a part
/// resumes inside it with neither a repeat nor a gap, and a replay from
/// before it gives every change the same position.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_larger_than_a_batch_goes_out_in_parts_and_resumes_exactly_once() {
    const MAX: usize = 100;
    const BIG: i64 = 1_050;
    let mut fx = Fixture::new("myparts").await;
    fx.sql("CREATE TABLE p (id INT PRIMARY KEY, v INT NOT NULL)").await;
    fx.sql("INSERT INTO p VALUES (0, 0)").await;
    let t = fx.table("p");
    let mut config = fx.config();
    config.max_batch_events = MAX;
    let mut source = MySqlSource::new(config.clone(), "t").expect("config");
    start(&mut source, None).await.expect("start");
    let mut mirror = Mirror::default();
    sync(&mut source, &mut mirror, "the snapshot", |m| m.ids(&t).len() == 1).await;
    let before_big = mirror.checkpoint.clone();
    let streamed_from = mirror.events.len();

    fx.sql("INSERT INTO p VALUES (1, 1)").await;
    let rows: Vec<String> = (2..2 + BIG).map(|i| format!("({i}, 1)")).collect();
    fx.sql(&format!("INSERT INTO p VALUES {}", rows.join(","))).await;
    fx.sql(&format!("INSERT INTO p VALUES ({}, 1)", 2 + BIG)).await;

    // First life: up to and including the second part, then a batch read
    // but never made durable, then the crash.
    let parts = |m: &Mirror| {
        m.events[streamed_from..]
            .iter()
            .filter(|e| (2..2 + BIG).contains(&id_of(e)))
            .count()
    };
    let deadline = Instant::now() + DEADLINE;
    while parts(&mirror) < 2 * MAX {
        assert!(Instant::now() < deadline, "timed out before the crash");
        let batch = next(&mut source).await;
        assert!(changes(&batch) <= MAX, "a batch of {} changes", changes(&batch));
        mirror.apply(batch);
    }
    let state = SourceState::from_checkpoint(mirror.checkpoint.as_ref().expect("checkpoint")).expect("state");
    let partial = state.partial.clone().expect("the checkpoint marks the part emitted");
    assert!(partial.changes as usize >= 2 * MAX - MAX && partial.changes < BIG as u64, "{partial:?}");
    let durable = mirror.checkpoint.clone();
    let lost = tokio::time::timeout(Duration::from_secs(2), source.next_batch()).await;
    drop(lost);
    drop(source);

    let mut source = MySqlSource::new(config.clone(), "t").expect("config");
    start(&mut source, durable).await.expect("resume inside the transaction");
    sync(&mut source, &mut mirror, "every row", |m| m.ids(&t).len() == BIG as usize + 3).await;
    mirror.apply(next(&mut source).await);
    let first_life = mirror.events[streamed_from..].to_vec();
    for e in &first_life {
        assert!(e.source.position.commit > 0, "a change without its position: {e:?}");
    }
    let ids: Vec<i64> = first_life.iter().map(id_of).collect();
    let expected: Vec<i64> = (1..=2 + BIG).collect();
    assert_eq!(ids, expected, "every change once, in order");
    let positions: Vec<Position> = first_life.iter().map(|e| e.source.position).collect();
    assert!(positions.windows(2).all(|w| w[0] < w[1]), "positions increase");
    let big: BTreeSet<u64> = first_life[1..=BIG as usize].iter().map(|e| e.source.position.commit).collect();
    assert_eq!(big.len(), 1, "one transaction, one commit position");
    let indexes: Vec<u64> = first_life[1..=BIG as usize].iter().map(|e| e.source.position.index).collect();
    assert_eq!(indexes, (1..=BIG as u64).collect::<Vec<_>>());
    drop(source);

    // A replay from before the transaction: the same positions.
    let mut source = MySqlSource::new(config, "t").expect("config");
    start(&mut source, before_big).await.expect("replay");
    let mut replay = Mirror::default();
    sync(&mut source, &mut replay, "the replay", |m| m.ids(&t).len() == BIG as usize + 2).await;
    let again: Vec<Position> = replay.events.iter().map(|e| e.source.position).collect();
    assert_eq!(again, positions, "a replay gives every change the same position");
    fx.drop().await;
}

/// Issue #24: the schema history is kept beside the checkpoint, one side
/// record per table written when its definition changes, instead of in
/// every checkpoint (a few hundred wide tables made each checkpoint larger
/// than Kafka takes, and every commit failed). A restart decodes with the
/// history the side records hold; a dropped table's record is deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_schema_history_is_kept_beside_the_checkpoint() {
    const TABLES: usize = 40;
    const COLUMNS: usize = 60;
    let mut fx = Fixture::new("myhist").await;
    let columns: Vec<String> = (1..COLUMNS).map(|c| format!("c{c} VARCHAR(20) NULL")).collect();
    for t in 0..TABLES {
        fx.sql(&format!("CREATE TABLE w{t} (id INT PRIMARY KEY, {})", columns.join(", ")))
            .await;
    }
    fx.sql("INSERT INTO w0 (id) VALUES (1)").await;
    let (w0, w1) = (fx.table("w0"), fx.table("w1"));
    // The side records durable with a checkpoint (see `next`).
    let side_of = |m: &Mirror| -> BTreeMap<String, String> {
        let checkpoint = m.checkpoint.as_ref().expect("checkpoint");
        side::of(checkpoint).expect("side records")
    };
    let mut source = MySqlSource::new(fx.config(), "t").expect("config");
    start(&mut source, None).await.expect("start");
    let mut mirror = Mirror::default();
    let snapshotting = |m: &Mirror| {
        m.checkpoint
            .as_ref()
            .is_none_or(|c| SourceState::from_checkpoint(c).expect("state").snapshot.is_some())
    };
    sync(&mut source, &mut mirror, "the snapshot", |m| !m.ids(&w0).is_empty() && !snapshotting(m)).await;
    let checkpoint = mirror.checkpoint.clone().expect("checkpoint");
    let side = side_of(&mirror);
    let history_bytes: usize = side.values().map(String::len).sum();
    eprintln!(
        "{TABLES} tables of {COLUMNS} columns: checkpoint {} bytes, history {history_bytes} bytes in {} side records",
        checkpoint.0.len(),
        side.len()
    );
    assert_eq!(side.len(), TABLES, "a record per table");
    assert!(checkpoint.0.len() < 500, "the checkpoint holds no history: {}", checkpoint.0);
    assert!(source.take_side_records().is_empty(), "nothing changed, nothing written");

    // A change of one table changes its record only.
    fx.sql("ALTER TABLE w1 ADD COLUMN extra INT NOT NULL DEFAULT 7").await;
    fx.sql("INSERT INTO w1 (id, extra) VALUES (1, 8)").await;
    sync(&mut source, &mut mirror, "w1's row", |m| !m.ids(&w1).is_empty()).await;
    let after = side_of(&mirror);
    let changed: Vec<&String> = after.keys().filter(|k| after.get(*k) != side.get(*k)).collect();
    assert_eq!(changed.len(), 1, "{changed:?}");
    assert!(changed[0].contains("w1") && after[changed[0]].contains("extra"));
    fx.sql("DROP TABLE w2").await;
    fx.sql("INSERT INTO w1 (id, extra) VALUES (2, 9)").await;
    sync(&mut source, &mut mirror, "w1's second row", |m| m.ids(&w1).len() == 2).await;
    let dropped = side_of(&mirror);
    let gone: Vec<&String> = after.keys().filter(|k| !dropped.contains_key(*k)).collect();
    assert!(gone.len() == 1 && gone[0].contains("w2"), "the dropped table's record is deleted: {gone:?}");
    assert_eq!(dropped.len(), TABLES - 1);
    drop(source);

    // A restart with the side records (and a checkpoint without history)
    // decodes rows with the definitions they hold; without them it stops
    // instead of dropping rows of tables it would not know.
    fx.sql("INSERT INTO w1 (id, c1, extra) VALUES (3, 'x', 10)").await;
    let mut source = MySqlSource::new(fx.config(), "t").expect("config");
    let e = source.start(mirror.checkpoint.clone()).await.expect_err("no side records");
    assert_eq!(e.kind(), tributary_connectors::ErrorKind::NeedsOperator, "{e}");
    assert!(e.to_string().contains("schema history"), "{e}");
    start(&mut source, mirror.checkpoint.clone()).await.expect("resume");
    sync(&mut source, &mut mirror, "w1's third row", |m| m.ids(&w1).len() == 3).await;
    let row = mirror.row(&w1, 3).expect("row 3");
    let last = mirror.events.last().expect("event");
    let extra = last
        .schema
        .columns
        .iter()
        .position(|c| c.name == "extra")
        .expect("extra column");
    assert_eq!(int(&row[extra]), 10);
    assert!(source.take_side_records().is_empty(), "the restored history is the durable one");
    fx.drop().await;
}

/// The key of a change of table `p`.
fn id_of(e: &ChangeEvent) -> i64 {
    int(&e.key_row().expect("row")[0])
}

/// The changes a batch holds.
fn changes(batch: &SourceBatch) -> usize {
    batch.messages.iter().filter(|m| matches!(m, SourceMessage::Change(_))).count()
}

/// A table without a primary key interrupted mid-snapshot is read again
/// from its start: resumed by `OFFSET` in a new transaction, the rows
/// deleted meanwhile shifted the offset and rows were never read. Its rows
/// have no key (a multiset): read again as they were, the first part's
/// rows would be in the destination twice. The source asks for a copy
/// again (`TableRewritten`: the runner resets the table first and sweeps
/// after), which reads every row once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyless_table_interrupted_mid_snapshot_is_copied_again_from_its_start() {
    let mut fx = Fixture::new("mykeyless").await;
    fx.sql("CREATE TABLE k (id INT NOT NULL, b VARCHAR(10) NOT NULL)").await;
    let values: Vec<String> = (1..=350).map(|i| format!("({i}, 'v{i}')")).collect();
    fx.sql(&format!("INSERT INTO k VALUES {}", values.join(","))).await;
    let k = fx.table("k");
    // The reads of k in `batch`; once `asked`, its other changes are the
    // runner's to hold back (they come after the table is asked again).
    let reads = |batch: &SourceBatch, asked: bool| -> Vec<i64> {
        let mut asked = asked;
        let mut out = Vec::new();
        for m in &batch.messages {
            match m {
                SourceMessage::TableRewritten(t, _) if *t == k => asked = true,
                SourceMessage::Change(e) if e.schema.id == k => {
                    assert!(e.schema.key.is_empty(), "a table without a key has no key columns");
                    if e.op == Op::Read {
                        out.push(int(&e.after.as_ref().expect("after")[0]));
                    } else {
                        assert!(asked, "a change of the interrupted table before it is asked again: {:?}", e.op);
                    }
                }
                _ => {}
            }
        }
        out
    };
    let mut source = MySqlSource::new(fx.config(), "t").expect("config");
    start(&mut source, None).await.expect("start");
    let mut before = 0;
    let mut durable = None;
    for _ in 0..2 {
        let batch = next(&mut source).await;
        before += reads(&batch, false).len();
        durable = Some(batch.checkpoint);
    }
    drop(source);
    assert!(before >= 100, "some rows read before the crash");
    assert!(
        SourceState::from_checkpoint(durable.as_ref().expect("checkpoint"))
            .expect("state")
            .snapshot
            .is_some(),
        "the crash lands mid-snapshot"
    );
    // While the runner is down, rows it already read go away.
    fx.sql("DELETE FROM k WHERE id < 50").await;
    let mut source = MySqlSource::new(fx.config(), "t").expect("config");
    start(&mut source, durable).await.expect("resume");
    // Its rows have no key the copy's rows could overwrite: the source asks
    // for it to be copied again whole (the runner sends a reset first and
    // a sweep after), and reads nothing of it before.
    let deadline = Instant::now() + DEADLINE;
    let mut asked = false;
    let mut copy: Vec<i64> = Vec::new();
    loop {
        assert!(Instant::now() < deadline, "timed out waiting for the copy again");
        let batch = next(&mut source).await;
        let rows = reads(&batch, asked);
        assert!(asked || rows.is_empty(), "a row of the interrupted copy before the copy again");
        copy.extend(rows);
        if !asked
            && batch
                .messages
                .iter()
                .any(|m| matches!(m, SourceMessage::TableRewritten(t, _) if *t == k))
        {
            // What the runner does once that batch is committed.
            assert_eq!(source.resync(std::slice::from_ref(&k)).await.expect("resync"), vec![k.clone()]);
            asked = true;
        }
        if asked && source.snapshot_progress().iter().any(|p| p.table == k && p.done) {
            break;
        }
    }
    let expected: Vec<i64> = source_ids(&mut fx.conn, &k).await.into_iter().collect();
    copy.sort_unstable();
    assert_eq!(copy, expected, "the copy again holds every row once");
    fx.drop().await;
}

/// Per key, every event is newer than the one before it: what a consumer
/// of the topic without a position guard needs, so that no row moves
/// backwards (a change older than a snapshot read that already reflects it
/// is such a move).
fn assert_no_event_older_than_one_before_it(events: &[ChangeEvent]) {
    let mut last: BTreeMap<(TableId, String), (Position, Op)> = BTreeMap::new();
    let mut backwards = Vec::new();
    for e in events {
        let row = e.key_row().expect("row");
        let key = format!("{:?}", e.schema.key_indexes().iter().map(|&i| row[i].clone()).collect::<Vec<_>>());
        let now = (e.source.position, e.op);
        if let Some(before) = last.insert((e.schema.id.clone(), key.clone()), now) {
            if before.0 >= now.0 {
                backwards.push(format!("{key}: {:?} at {:?} after {:?} at {:?}", now.1, now.0, before.1, before.0));
            }
        }
    }
    assert!(
        backwards.is_empty(),
        "{} events older than one before them for the same key, e.g. {:?}",
        backwards.len(),
        &backwards[..backwards.len().min(3)]
    );
}

/// A snapshot resumed after a crash, with writes before and during the
/// resume, to rows already copied and rows not copied yet: the topic
/// holds, per key, nothing older than an event before it (issue #23,
/// case 7: the remaining rows were read at a later point and the stream
/// then replayed, from the first point, changes those rows already held).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_snapshot_emits_nothing_older_than_a_row_it_read() {
    let mut fx = Fixture::new("myreplay").await;
    fx.sql("CREATE TABLE r (id INT PRIMARY KEY, v INT NOT NULL)").await;
    let values: Vec<String> = (1..=1000).map(|i| format!("({i}, 0)")).collect();
    fx.sql(&format!("INSERT INTO r VALUES {}", values.join(","))).await;
    let r = fx.table("r");

    // First life: two chunks (ids 1..=200), then the process dies.
    let mut source = MySqlSource::new(fx.config(), "t").expect("config");
    start(&mut source, None).await.expect("start");
    let mut mirror = Mirror::default();
    mirror.apply(next(&mut source).await);
    mirror.apply(next(&mut source).await);
    drop(source);
    let durable = mirror.checkpoint.clone();
    let state = SourceState::from_checkpoint(durable.as_ref().expect("checkpoint")).expect("state");
    assert!(state.snapshot.is_some(), "the kill lands mid-snapshot");

    // While it is down: changes to copied and to not yet copied rows.
    for round in 0..5 {
        fx.sql(&format!("UPDATE r SET v = v + 1 WHERE id % 50 = {round}")).await;
    }
    fx.sql("DELETE FROM r WHERE id IN (150, 750)").await;
    fx.sql("INSERT INTO r VALUES (1001, 0), (1002, 0)").await;

    let mut source = MySqlSource::new(fx.config(), "t").expect("config");
    start(&mut source, durable).await.expect("resume");
    mirror.apply(next(&mut source).await);
    // And while it copies.
    for round in 0..5 {
        fx.sql(&format!("UPDATE r SET v = v + 1 WHERE id % 40 = {round}")).await;
    }
    let want: BTreeMap<i64, i64> = fx
        .conn
        .query::<(i64, i64), _>("SELECT id, v FROM r")
        .await
        .expect("rows")
        .into_iter()
        .collect();
    let got = |m: &Mirror| -> BTreeMap<i64, i64> {
        m.rows
            .get(&r)
            .map(|t| t.values().map(|(_, row)| (int(&row[0]), int(&row[1]))).collect())
            .unwrap_or_default()
    };
    sync(&mut source, &mut mirror, "the copy to equal the source", |m| got(m) == want).await;
    assert_no_event_older_than_one_before_it(&mirror.events);
    let reads: BTreeSet<i64> = mirror
        .events
        .iter()
        .filter(|e| e.op == Op::Read)
        .map(|e| int(&e.after.as_ref().expect("after")[0]))
        .collect();
    assert_eq!(mirror.events.iter().filter(|e| e.op == Op::Read).count(), reads.len(), "no snapshot row twice");
    fx.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_reports_missing_grants_with_the_statement_that_fixes_them() {
    let fx = Fixture::new("mycheck").await;
    let ok = check::check(&fx.config()).await;
    assert!(ok.is_empty(), "the stack's account is ready: {ok:?}");

    let user = unique("mychk");
    let mut conn = admin().await;
    // An account with no privileges at all; information_schema is the one
    // database it may still connect to.
    conn.query_drop(format!("CREATE USER '{user}'@'%' IDENTIFIED BY 'pw'"))
        .await
        .expect("create user");
    let base = mysql_url();
    let host = base.rsplit('@').next().and_then(|h| h.split('/').next()).expect("host part");
    let mut config = MySqlSourceConfig::with_url(format!("mysql://{user}:pw@{host}/information_schema"));
    config.include = vec![format!("{}.*", fx.db)];
    let problems = check::check(&config).await;
    let text: Vec<String> = problems.iter().map(ToString::to_string).collect();
    let grant = text.iter().find(|p| p.contains("lacks")).unwrap_or_else(|| panic!("{text:?}"));
    for p in [
        "SELECT",
        "RELOAD",
        "SHOW DATABASES",
        "REPLICATION SLAVE",
        "BINLOG MONITOR",
    ] {
        assert!(grant.contains(p), "{grant}");
    }
    assert!(
        grant.contains("fix: GRANT SELECT, RELOAD") && grant.contains(&format!("TO '{user}'@'%'")),
        "{grant}"
    );
    conn.query_drop(format!("DROP USER '{user}'@'%'")).await.expect("drop user");
    fx.drop().await;
}

// ---------------------------------------------------------------- Kafka

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_change_reaches_kafka_exactly_once_across_kill_9() {
    const SNAPSHOT_ROWS: i64 = 20_000;
    let seed: u64 = std::env::var("TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| u64::from(std::process::id()) * 7919 + 1);
    println!("TEST_SEED={seed}");
    let mut rng = seed | 1;
    let mut below = |n: u64| {
        rng ^= rng >> 12;
        rng ^= rng << 25;
        rng ^= rng >> 27;
        rng.wrapping_mul(0x2545_F491_4F6C_DD1D) % n
    };

    let mut fx = Fixture::new("myeo").await;
    fx.sql("CREATE TABLE counters (id BIGINT PRIMARY KEY, v BIGINT NOT NULL)").await;
    // Issue #24: 20 tables of 1,000 columns, whose schema history (about
    // 1.2 MB) no longer fits in one Kafka record. Kept in the checkpoint,
    // it made the first commit fail; kept beside it, a record per table,
    // every restart below decodes `counters` with the history read back.
    let wide: Vec<String> = (1..1000).map(|c| format!("c{c} INT NULL")).collect();
    for t in 0..20 {
        fx.sql(&format!("CREATE TABLE wide{t} (id INT PRIMARY KEY, {})", wide.join(", ")))
            .await;
    }
    fx.sql(&format!("INSERT INTO counters SELECT seq, 0 FROM seq_1_to_{SNAPSHOT_ROWS}"))
        .await;
    let name = fx.db.clone();
    let dir = std::env::temp_dir().join(&name);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let config = dir.join("source.toml");
    let log = dir.join("source.log");
    let url = fx.config().url;
    std::fs::write(
        &config,
        format!(
            r#"name = "{name}"
schema_registry_url = "{registry}"

[kafka]
bootstrap_servers = "{kafka}"

[admin]
listen = "off"

[mysql]
url = "{url}"
server_id = {server_id}
snapshot_chunk_rows = 500
heartbeat_interval_ms = 1000
"#,
            registry = schema_registry_url(),
            kafka = kafka_bootstrap(),
            url = secrecy::ExposeSecret::expose_secret(&url),
            server_id = 6000 + std::process::id() % 10_000,
        ),
    )
    .expect("write config");
    let topic = format!("{name}.{name}.counters");
    let seen = counters::collect(topic.clone(), "v");

    let mut runner = counters::snapshot_through_a_kill9(&config, &log, &seen, SNAPSHOT_ROWS as usize).await;

    let mut next_id = SNAPSHOT_ROWS + 1;
    let mut expected_changes = 0usize;
    let kills: BTreeSet<u64> = [20 + below(40), 80 + below(60)].into_iter().collect();
    let mut deleted = BTreeSet::new();
    for step in 0..160u64 {
        let mut stmts = Vec::new();
        for _ in 0..1 + below(4) {
            match below(10) {
                0 => {
                    stmts.push(format!("INSERT INTO counters VALUES ({next_id}, 0)"));
                    next_id += 1;
                }
                1 => {
                    let id = 1 + below(SNAPSHOT_ROWS as u64) as i64;
                    if !deleted.insert(id) {
                        continue;
                    }
                    stmts.push(format!("DELETE FROM counters WHERE id = {id}"));
                }
                _ => {
                    let id = 1 + below(200) as i64;
                    if deleted.contains(&id) {
                        continue;
                    }
                    stmts.push(format!("UPDATE counters SET v = v + 1 WHERE id = {id}"));
                }
            }
            expected_changes += 1;
        }
        fx.sql("START TRANSACTION").await;
        for s in &stmts {
            fx.sql(s).await;
        }
        fx.sql("COMMIT").await;
        if kills.contains(&step) {
            runner.kill9();
            runner = Runner::start("source-runner", &config, &log);
        }
    }

    wait_for("every change in Kafka", Duration::from_secs(180), || async {
        (counters::changes(&seen.lock().unwrap()) >= expected_changes).then_some(())
    })
    .await;
    drop(runner);

    counters::assert_exactly_once(&seen.lock().unwrap(), SNAPSHOT_ROWS as usize, expected_changes);

    let _ = Command::new(runner_binary("source-runner"))
        .arg("--config")
        .arg(&config)
        .args(["delete", "--yes"])
        .status();
    let _ = std::fs::remove_dir_all(&dir);
    fx.drop().await;
}

/// The source runner killed (SIGKILL) during its snapshot while a writer
/// keeps updating rows all over the table: a stock `read_committed`
/// consumer of the topic sees, per key, every event newer than the one
/// before it and each update once (issue #23, case 7: the resumed snapshot
/// read the remaining rows at a later point, then the stream replayed
/// from the first point the updates those rows already held).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_9_during_the_snapshot_with_writes_leaves_no_replay_in_the_topic() {
    // Enough 10-row chunks (one Kafka transaction each: several seconds)
    // that the kill, at the first read a consumer sees, lands mid-snapshot.
    const SNAPSHOT_ROWS: i64 = 100_000;
    let mut fx = Fixture::new("mysnapkill").await;
    fx.sql("CREATE TABLE counters (id BIGINT PRIMARY KEY, v BIGINT NOT NULL)").await;
    fx.sql(&format!("INSERT INTO counters SELECT seq, 0 FROM seq_1_to_{SNAPSHOT_ROWS}"))
        .await;
    let name = fx.db.clone();
    let dir = std::env::temp_dir().join(&name);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let config = dir.join("source.toml");
    let log = dir.join("source.log");
    let url = fx.config().url;
    std::fs::write(
        &config,
        format!(
            r#"name = "{name}"
schema_registry_url = "{registry}"

[kafka]
bootstrap_servers = "{kafka}"

[admin]
listen = "off"

[mysql]
url = "{url}"
server_id = {server_id}
snapshot_chunk_rows = 10
heartbeat_interval_ms = 1000
"#,
            registry = schema_registry_url(),
            kafka = kafka_bootstrap(),
            url = secrecy::ExposeSecret::expose_secret(&url),
            server_id = 16000 + std::process::id() % 10_000,
        ),
    )
    .expect("write config");
    let topic = format!("{name}.{name}.counters");
    let seen = counters::collect(topic.clone(), "v");

    // A writer of its own: one-row updates all over the table, each its own
    // transaction, until told to stop; it counts them.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let stop = stop.clone();
        let url = secrecy::ExposeSecret::expose_secret(&url).to_string();
        tokio::spawn(async move {
            let mut conn = mysql_async::Conn::from_url(url).await.expect("writer connects");
            let mut rng = tributary_tests::Rng(u64::from(std::process::id()) * 7919 + 1);
            let mut updates = 0usize;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let id = 1 + (rng.next() % SNAPSHOT_ROWS as u64) as i64;
                conn.query_drop(format!("UPDATE counters SET v = v + 1 WHERE id = {id}"))
                    .await
                    .expect("update");
                updates += 1;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            updates
        })
    };
    let runner = counters::snapshot_through_a_kill9(&config, &log, &seen, SNAPSHOT_ROWS as usize).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let updates = writer.await.expect("writer");
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(text.matches("snapshot started").count() >= 2, "the kill landed after the snapshot: make it longer");
    // Every key's last event holds the source's counter.
    let want: BTreeMap<i64, i64> = fx
        .conn
        .query::<(i64, i64), _>("SELECT id, v FROM counters WHERE v > 0")
        .await
        .expect("counters")
        .into_iter()
        .collect();
    wait_for("every update in Kafka", Duration::from_secs(180), || async {
        let seen = seen.lock().unwrap();
        let mut last: BTreeMap<i64, i64> = BTreeMap::new();
        for s in seen.iter() {
            last.insert(s.id, s.v.unwrap_or(0));
        }
        want.iter().all(|(id, v)| last.get(id) == Some(v)).then_some(())
    })
    .await;
    drop(runner);

    let seen = seen.lock().unwrap().clone();
    let backwards = counters::backwards(&seen);
    assert!(
        backwards.is_empty(),
        "{} events older than one before them for the same key ({updates} updates), e.g. {:#?}",
        backwards.len(),
        &backwards[..backwards.len().min(5)]
    );
    // And nothing lost: after each key's first event its updates count on
    // by one; a read after changes (those the stream caught up with before
    // reading the key's range) holds the last of them.
    let mut last: BTreeMap<i64, i64> = BTreeMap::new();
    for s in &seen {
        let v = s.v.expect("the counter");
        if let Some(prev) = last.insert(s.id, v) {
            let want = if s.op == Op::Read { prev } else { prev + 1 };
            assert_eq!(v, want, "id {}: {:?} to {v} after {prev}", s.id, s.op);
        }
    }
    assert_eq!(seen.iter().filter(|s| s.op == Op::Read).count(), SNAPSHOT_ROWS as usize, "every row read once");

    let _ = Command::new(runner_binary("source-runner"))
        .arg("--config")
        .arg(&config)
        .args(["delete", "--yes"])
        .status();
    let _ = std::fs::remove_dir_all(&dir);
    fx.drop().await;
}

/// MariaDB -> source runner -> Kafka -> sink runner -> PostgreSQL: the
/// change events of the MySQL source are applied by the PostgreSQL sink
/// like those of the PostgreSQL source, including a column added mid-stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_to_postgresql_through_kafka_equals_the_source() {
    let mut fx = Fixture::new("mye2e").await;
    fx.sql("CREATE TABLE items (id INT PRIMARY KEY, name VARCHAR(40) NOT NULL, price DECIMAL(10,2), qty INT UNSIGNED)")
        .await;
    fx.sql("INSERT INTO items SELECT seq, CONCAT('item ', seq), seq / 4, seq % 9 FROM seq_1_to_2000")
        .await;
    let name = fx.db.clone();
    let dir = std::env::temp_dir().join(&name);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let url = fx.config().url;
    let source_cfg = dir.join("source.toml");
    std::fs::write(
        &source_cfg,
        format!(
            "name = \"{name}\"\nschema_registry_url = \"{registry}\"\n[kafka]\nbootstrap_servers = \"{kafka}\"\n\
             [admin]\nlisten = \"off\"\n[mysql]\nurl = \"{url}\"\nserver_id = {server_id}\nheartbeat_interval_ms = 1000\n",
            registry = schema_registry_url(),
            kafka = kafka_bootstrap(),
            url = secrecy::ExposeSecret::expose_secret(&url),
            server_id = 16000 + std::process::id() % 10_000,
        ),
    )
    .expect("write source config");
    let sink_cfg = dir.join("sink.toml");
    std::fs::write(
        &sink_cfg,
        format!(
            "prefix = \"{name}\"\nconsumer_group = \"{name}_sink\"\nschema_registry_url = \"{registry}\"\n\
             batch_linger_ms = 100\n[kafka]\nbootstrap_servers = \"{kafka}\"\n[admin]\nlisten = \"off\"\n\
             [postgres]\nurl = \"{pg}\"\n",
            registry = schema_registry_url(),
            kafka = kafka_bootstrap(),
            pg = pg_destination_url(),
        ),
    )
    .expect("write sink config");
    let log = dir.join("runners.log");
    let source = Runner::start("source-runner", &source_cfg, &log);
    let sink = Runner::start("sink-runner", &sink_cfg, &log);

    let (pg, conn) = tokio_postgres::connect(&pg_destination_url(), tokio_postgres::NoTls)
        .await
        .expect("connect to the destination");
    tokio::spawn(conn);
    // The destination schema is the source database's name.
    let dest_rows = |extra: &'static str| {
        let pg = &pg;
        let name = name.clone();
        async move {
            pg.query(
                &format!("SELECT id::bigint, name, price::text, qty::bigint{extra} FROM \"{name}\".items ORDER BY id"),
                &[],
            )
            .await
            .ok()
            .map(|rows| {
                rows.iter()
                    .map(|r| {
                        let mut s = format!(
                            "{}|{}|{}|{}",
                            r.get::<_, i64>(0),
                            r.get::<_, String>(1),
                            r.get::<_, Option<String>>(2).unwrap_or_default(),
                            r.get::<_, Option<i64>>(3).map(|q| q.to_string()).unwrap_or_default()
                        );
                        if r.len() > 4 {
                            s.push_str(&format!("|{}", r.get::<_, Option<String>>(4).unwrap_or_default()));
                        }
                        s
                    })
                    .collect::<Vec<String>>()
            })
        }
    };
    let expected = source_rows(&mut fx.conn, false).await;
    wait_for("the snapshot in PostgreSQL", Duration::from_secs(120), || async {
        dest_rows("").await.filter(|r| *r == expected).map(|_| ())
    })
    .await;

    fx.sql("START TRANSACTION").await;
    fx.sql("INSERT INTO items VALUES (5001, 'new', 1.25, 4294967295)").await;
    fx.sql("UPDATE items SET price = price * 2, qty = NULL WHERE id <= 50").await;
    fx.sql("DELETE FROM items WHERE id BETWEEN 100 AND 119").await;
    fx.sql("COMMIT").await;
    fx.sql("ALTER TABLE items ADD COLUMN note VARCHAR(20)").await;
    fx.sql("UPDATE items SET note = 'noted' WHERE id <= 10").await;
    let expected = source_rows(&mut fx.conn, true).await;
    wait_for("the changes and the new column in PostgreSQL", Duration::from_secs(120), || async {
        dest_rows(", note").await.filter(|r| *r == expected).map(|_| ())
    })
    .await;
    drop(source);
    drop(sink);

    let _ = pg.batch_execute(&format!("DROP SCHEMA IF EXISTS \"{name}\" CASCADE")).await;
    let _ = Command::new(runner_binary("source-runner"))
        .arg("--config")
        .arg(&source_cfg)
        .args(["delete", "--yes"])
        .status();
    let _ = std::fs::remove_dir_all(&dir);
    fx.drop().await;
}

/// The source's rows as `id|name|price|qty[|note]`.
async fn source_rows(conn: &mut mysql_async::Conn, note: bool) -> Vec<String> {
    let sql = format!(
        "SELECT CONCAT_WS('|', id, name, IFNULL(price, ''), IFNULL(qty, ''){}) FROM items ORDER BY id",
        if note { ", IFNULL(note, '')" } else { "" }
    );
    conn.query::<String, _>(sql).await.expect("source rows")
}
