//! What the source x sink matrices (`tests/tests/schema_changes.rs`,
//! `tests/tests/fidelity.rs`) share: a source and a destination of each
//! kind, the runners as built over them, and the wait for the destination
//! to equal the source, compared as text, with the runners alive.

use std::path::PathBuf;
use std::time::Duration;

use mysql_async::prelude::Queryable;

use crate::bigquery::{query as bigquery, Datasets};
use crate::mysql::Database as MariaDb;
use crate::postgres::{connect, connect_pinned, has_column, Destination as PgDestination, SourceSchema};
use crate::redshift::{redshift_url, Warehouse as RedshiftWarehouse};
use crate::snowflake::Schemas as SnowflakeSchemas;
use crate::spanner::Database as SpannerDatabase;
use crate::{kafka_bootstrap, pg_destination_url, pg_source_url, runner_binary, schema_registry_url, Runner};

/// How long one step may take to reach the destination.
pub const STEP_DEADLINE: Duration = Duration::from_secs(120);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
/// A source database of the matrices.
pub enum SourceKind {
    /// PostgreSQL 15.
    Postgres,
    /// MariaDB 10.11.
    MariaDb,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
/// A destination of the matrices.
pub enum SinkKind {
    /// PostgreSQL 15.
    Postgres,
    /// The BigQuery emulator.
    BigQuery,
    /// PostgreSQL 15 in the Redshift sink's test mode, staging in moto.
    Redshift,
    /// Google's Cloud Spanner emulator.
    Spanner,
    /// fakesnow (Snowflake's protocol over DuckDB).
    Snowflake,
}

/// A source database with the tables of one test.
pub enum Source {
    /// A PostgreSQL schema.
    Postgres(SourceSchema),
    /// A MariaDB database.
    MariaDb(MariaDb),
}

impl Source {
    /// A new schema or database named after `stem`.
    pub async fn new(kind: SourceKind, stem: &str) -> Self {
        match kind {
            SourceKind::Postgres => Source::Postgres(SourceSchema::new(stem).await),
            SourceKind::MariaDb => Source::MariaDb(MariaDb::new(stem).await),
        }
    }

    /// Its kind.
    pub fn kind(&self) -> SourceKind {
        match self {
            Source::Postgres(_) => SourceKind::Postgres,
            Source::MariaDb(_) => SourceKind::MariaDb,
        }
    }

    /// The schema (PostgreSQL) or database (MariaDB): also the runners' name.
    pub fn name(&self) -> &str {
        match self {
            Source::Postgres(s) => &s.schema,
            Source::MariaDb(d) => &d.db,
        }
    }

    /// `<name>.<table>`.
    pub fn qualified(&self, table: &str) -> String {
        format!("{}.{table}", self.name())
    }

    /// Runs `sql` (statements separated by `; `).
    pub async fn sql(&mut self, sql: &str) {
        match self {
            Source::Postgres(s) => s.exec(sql).await,
            Source::MariaDb(d) => {
                for statement in sql.split("; ") {
                    d.sql(statement).await;
                }
            }
        }
    }

    /// The source runner's section for it.
    pub fn runner_section(&self) -> String {
        match self {
            Source::Postgres(s) => format!(
                "[postgres]\nurl = \"{}\"\nslot_name = \"{}\"\npublication_name = \"{}\"\ninclude = [\"{}.*\"]\n\
                 heartbeat_interval_ms = 500\n",
                pg_source_url(),
                s.slot,
                s.publication,
                s.schema
            ),
            Source::MariaDb(d) => {
                let c = d.config();
                format!(
                    "[mysql]\nurl = \"{}\"\nserver_id = {}\ninclude = [\"{}.*\"]\nheartbeat_interval_ms = 500\n",
                    secrecy::ExposeSecret::expose_secret(&c.url),
                    c.server_id,
                    d.db
                )
            }
        }
    }

    /// The table's columns now, in order, but generated columns of
    /// PostgreSQL, which are not carried (docs/sources/postgresql.md).
    pub async fn columns(&mut self, table: &str) -> Vec<String> {
        let name = self.name().to_string();
        match self {
            Source::Postgres(s) => s
                .admin
                .query(
                    "SELECT column_name::text FROM information_schema.columns \
                     WHERE table_schema = $1 AND table_name = $2 AND is_generated = 'NEVER' \
                     ORDER BY ordinal_position",
                    &[&name, &table],
                )
                .await
                .expect("source columns")
                .iter()
                .map(|r| r.get(0))
                .collect(),
            Source::MariaDb(d) => d
                .conn
                .exec(
                    "SELECT COLUMN_NAME FROM information_schema.COLUMNS \
                     WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? ORDER BY ORDINAL_POSITION",
                    (name, table),
                )
                .await
                .expect("source columns"),
        }
    }

    /// The table's rows over `columns`, as text ([`canonical`]).
    pub async fn rows(&mut self, table: &str, columns: &[String]) -> Vec<String> {
        let t = self.qualified(table);
        match self {
            Source::Postgres(s) => {
                let cols: Vec<String> = columns.iter().map(|c| format!("{c}::text")).collect();
                let sql = format!("SELECT {} FROM {t} ORDER BY id", cols.join(", "));
                let rows = s.admin.query(sql.as_str(), &[]).await.expect("source rows");
                rows.iter()
                    .map(|r| canonical((0..columns.len()).map(|i| r.get::<_, Option<String>>(i))))
                    .collect()
            }
            Source::MariaDb(d) => {
                let cols: Vec<String> = columns.iter().map(|c| format!("CAST(`{c}` AS CHAR)")).collect();
                let sql = format!("SELECT {} FROM {t} ORDER BY id", cols.join(", "));
                let rows: Vec<mysql_async::Row> = d.conn.query(sql).await.expect("source rows");
                rows.into_iter()
                    .map(|r| canonical((0..columns.len()).map(|i| r.get::<Option<String>, _>(i).flatten())))
                    .collect()
            }
        }
    }

    /// Drops what the test made.
    pub async fn cleanup(self) {
        match self {
            Source::Postgres(s) => s.cleanup().await,
            Source::MariaDb(d) => d.drop().await,
        }
    }
}

// ---------------------------------------------------------------- sink

/// A destination with the tables of one test.
pub enum Sink {
    /// A PostgreSQL schema.
    Postgres(PgDestination),
    /// BigQuery datasets (the emulator).
    BigQuery(Datasets),
    /// A Redshift schema (test mode) and the sink's consumer group.
    Redshift(RedshiftWarehouse, String),
    /// A Spanner database (the emulator).
    Spanner(SpannerDatabase),
    /// Snowflake schemas (fakesnow).
    Snowflake(Box<SnowflakeSchemas>),
}

impl Sink {
    /// A new destination named after `stem`.
    pub async fn new(kind: SinkKind, stem: &str) -> Self {
        match kind {
            SinkKind::Postgres => Sink::Postgres(PgDestination::new(stem).await),
            SinkKind::BigQuery => Sink::BigQuery(Datasets::new(stem)),
            SinkKind::Redshift => Sink::Redshift(RedshiftWarehouse::new(stem).await, crate::unique(stem)),
            SinkKind::Spanner => Sink::Spanner(SpannerDatabase::new(stem).await),
            SinkKind::Snowflake => Sink::Snowflake(Box::new(SnowflakeSchemas::new(stem))),
        }
    }

    /// The sink runner's consumer group.
    pub fn group(&self) -> &str {
        match self {
            Sink::Postgres(d) => &d.group,
            Sink::BigQuery(d) => &d.group,
            Sink::Redshift(_, group) => group,
            Sink::Spanner(d) => &d.group,
            Sink::Snowflake(d) => &d.group,
        }
    }

    /// The destination section; columns the source drops are dropped.
    pub fn runner_section(&self) -> String {
        let section = match self {
            Sink::Postgres(d) => format!("[postgres]\nurl = \"{}\"\nschema = \"{}\"\n", pg_destination_url(), d.schema),
            Sink::BigQuery(d) => d.runner_section(),
            Sink::Redshift(w, _) => w.runner_section(),
            // Tables named as in the source (not `<schema>_<table>`).
            Sink::Spanner(d) => format!("{}table = \"{{table}}\"\n", d.runner_section()),
            Sink::Snowflake(d) => d.runner_section(),
        };
        format!("{}\ndrop_columns = true\n", section.trim_end())
    }

    /// Whether the destination's `table` has `column`.
    pub async fn has_column(&self, table: &str, column: &str) -> bool {
        match self {
            Sink::Postgres(d) => has_column(&connect(&pg_destination_url()).await, &d.schema, table, column).await,
            Sink::Redshift(w, _) => has_column(&w.admin, &w.schema, table, column).await,
            // A query naming a column the table lacks fails.
            Sink::BigQuery(d) => bigquery(&format!("SELECT `{column}` FROM {} LIMIT 1", d.table(table)))
                .await
                .is_ok(),
            Sink::Spanner(d) => d.query(&format!("SELECT `{column}` FROM `{table}` LIMIT 1")).await.is_ok(),
            Sink::Snowflake(d) => d
                .query(&format!("SELECT \"{column}\" FROM {} LIMIT 1", d.table(table)))
                .await
                .is_ok(),
        }
    }

    /// The destination's rows over `columns`, or `None` while the table or
    /// one of the columns is not there yet, read as a `source` of that kind
    /// reads its own: a PostgreSQL destination with a PostgreSQL source's
    /// session settings (ISO 8601 intervals, ...), with PostgreSQL's
    /// defaults for a MariaDB source (an interval then prints as MySQL
    /// prints a `TIME`: `-29:59:59.654321`).
    pub async fn rows(&self, table: &str, columns: &[String], source: SourceKind) -> Option<Vec<String>> {
        match self {
            Sink::Postgres(_) | Sink::Redshift(..) => {
                let (url, schema) = match self {
                    Sink::Redshift(w, _) => (redshift_url(), w.schema.clone()),
                    Sink::Postgres(d) => (pg_destination_url(), d.schema.clone()),
                    _ => return None,
                };
                let cols: Vec<String> = columns.iter().map(|c| format!("\"{c}\"::text")).collect();
                let sql = format!("SELECT {} FROM \"{schema}\".\"{table}\" ORDER BY id", cols.join(", "));
                // Read as the source's rows are (`Source::rows`).
                let client = match source {
                    SourceKind::Postgres => connect_pinned(&url).await,
                    SourceKind::MariaDb => connect(&url).await,
                };
                let rows = client.query(sql.as_str(), &[]).await.ok()?;
                Some(
                    rows.iter()
                        .map(|r| canonical((0..columns.len()).map(|i| r.get::<_, Option<String>>(i))))
                        .collect(),
                )
            }
            Sink::BigQuery(d) => {
                let cols: Vec<String> = columns.iter().map(|c| format!("CAST(`{c}` AS STRING)")).collect();
                let sql = format!("SELECT {} FROM {} ORDER BY id", cols.join(", "), d.table(table));
                let rows = bigquery(&sql).await.ok()?;
                Some(rows.into_iter().map(|r| canonical(r.into_iter())).collect())
            }
            Sink::Spanner(d) => {
                let cols: Vec<String> = columns.iter().map(|c| format!("CAST(`{c}` AS STRING)")).collect();
                let sql = format!("SELECT {} FROM `{table}` ORDER BY id", cols.join(", "));
                let rows = d.query(&sql).await.ok()?;
                Some(rows.into_iter().map(|r| canonical(r.into_iter())).collect())
            }
            Sink::Snowflake(d) => {
                let cols: Vec<String> = columns.iter().map(|c| format!("CAST(\"{c}\" AS VARCHAR)")).collect();
                let sql = format!("SELECT {} FROM {} ORDER BY \"id\"", cols.join(", "), d.table(table));
                let rows = d.query(&sql).await.ok()?;
                Some(rows.into_iter().map(|r| canonical(r.into_iter())).collect())
            }
        }
    }

    /// Drops what the test made.
    pub async fn cleanup(self) {
        match self {
            Sink::Postgres(d) => d.cleanup().await,
            Sink::BigQuery(d) => d.cleanup().await,
            Sink::Redshift(w, group) => w.cleanup(&[group]).await,
            Sink::Spanner(d) => d.cleanup().await,
            Sink::Snowflake(d) => d.cleanup().await,
        }
    }
}

/// A row as `a|b|...`; numbers without trailing zeros (`1.50` and `1.5`
/// are the same NUMERIC in two engines' text).
pub fn canonical(cells: impl Iterator<Item = Option<String>>) -> String {
    cells
        .map(|c| match c {
            None => "NULL".to_string(),
            Some(v) if v.contains('.') && v.parse::<f64>().is_ok() => {
                v.trim_end_matches('0').trim_end_matches('.').to_string()
            }
            Some(v) => without_trailing_fraction_zeros(in_utc(v)),
        })
        .collect::<Vec<_>>()
        .join("|")
}

/// A timestamp with an offset (`2026-12-06 10:10:34.063378-08`) as the
/// same instant in UTC (`2026-12-06 18:10:34.063378+00`): Spanner's `CAST(ts
/// AS STRING)` writes its default zone, America/Los_Angeles. Other text is
/// kept.
fn in_utc(v: String) -> String {
    match chrono::DateTime::parse_from_str(&v, "%Y-%m-%d %H:%M:%S%.f%#z") {
        Ok(t) if !v.ends_with("+00") => {
            let utc = t.with_timezone(&chrono::Utc);
            format!("{}+00", utc.format("%Y-%m-%d %H:%M:%S%.f"))
        }
        _ => v,
    }
}

/// A time or date-time's text (`-838:59:59.500000`, `2024-01-01
/// 10:00:00.120000`) without the fraction's trailing zeros: MariaDB writes
/// as many digits as the column's precision, PostgreSQL and BigQuery only
/// those that count. Other text is kept.
fn without_trailing_fraction_zeros(v: String) -> String {
    let Some((whole, fraction)) = v.rsplit_once('.') else {
        return v;
    };
    let clock = whole.rsplit(' ').next().unwrap_or(whole).trim_start_matches('-');
    let parts: Vec<&str> = clock.split(':').collect();
    let is_clock = parts.len() == 3
        && parts.iter().all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        && parts[1].len() == 2
        && parts[2].len() == 2;
    // A zone may follow the fraction (`.510130+00`: Spanner and BigQuery
    // write six digits, PostgreSQL `.51013+00`).
    let digits = fraction.bytes().take_while(u8::is_ascii_digit).count();
    let (fraction, zone) = fraction.split_at(digits);
    let is_zone = zone.is_empty()
        || (zone.starts_with(['+', '-'])
            && zone.len() > 1
            && zone[1..].bytes().all(|b| b.is_ascii_digit() || b == b':'));
    if !is_clock || fraction.is_empty() || !is_zone {
        return v;
    }
    match fraction.trim_end_matches('0') {
        "" => format!("{whole}{zone}"),
        f => format!("{whole}.{f}{zone}"),
    }
}

/// Rows sorted by their id (the first cell) as a number: `ORDER BY id`
/// over `id::text AS id` sorts text in PostgreSQL.
pub fn by_id(mut rows: Vec<String>) -> Vec<String> {
    rows.sort_by_key(|r| r.split('|').next().and_then(|id| id.parse::<i64>().ok()));
    rows
}

// ---------------------------------------------------------------- what a destination holds

/// What a destination holds of a table whose values it cannot all hold as
/// they are (`docs/type-mapping.md` says what and why): columns it holds in
/// another text, columns it holds in a form the text comparison cannot
/// see, and the rows it refuses (dead-lettered, absent). The default holds
/// everything as the source has it.
#[derive(Debug, Clone, Copy, Default)]
pub struct Holds<'a> {
    /// Columns compared through a SQL expression of the source's column
    /// (`{c}`) that gives the text the destination's type holds (a `real`
    /// widened to a double: `{c}::float8::text`).
    pub as_text: &'a [(&'a str, &'a str)],
    /// Columns not compared (held in a form a `CAST(... AS STRING)` does not
    /// show as the source's text, e.g. bytes), in groups, each with why.
    pub skipped: &'a [(&'a [&'a str], &'a str)],
    /// Ids of the rows the destination refuses: they must be absent from
    /// it, and every one of them the source has dead-lettered
    /// ([`dead_lettered_ids`]), no other.
    pub refused: &'a [i64],
}

impl Holds<'_> {
    /// The compared columns of `columns`, each with its source expression.
    fn compared(&self, columns: &[String]) -> Vec<(String, String)> {
        columns
            .iter()
            .filter(|c| !self.skipped.iter().any(|(group, _)| group.contains(&c.as_str())))
            .map(|c| {
                let expr = match self.as_text.iter().find(|(n, _)| n == c) {
                    Some((_, e)) => e.replace("{c}", c),
                    None => format!("{c}::text"),
                };
                (c.clone(), expr)
            })
            .collect()
    }
}

impl Source {
    /// The table's rows over `columns` (each `(name, expression)`), but the
    /// rows of `except` ids, as text ([`canonical`]). PostgreSQL only.
    pub async fn rows_as(&mut self, table: &str, columns: &[(String, String)], except: &[i64]) -> Vec<String> {
        let t = self.qualified(table);
        let Source::Postgres(s) = self else {
            panic!("rows_as reads PostgreSQL sources");
        };
        let cols: Vec<&str> = columns.iter().map(|(_, e)| e.as_str()).collect();
        let except = except.iter().map(i64::to_string).collect::<Vec<_>>().join(", ");
        let filter = if except.is_empty() {
            String::new()
        } else {
            format!(" WHERE id NOT IN ({except})")
        };
        let sql = format!("SELECT {} FROM {t}{filter} ORDER BY id", cols.join(", "));
        let rows = s.admin.query(sql.as_str(), &[]).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
        rows.iter()
            .map(|r| canonical((0..columns.len()).map(|i| r.get::<_, Option<String>>(i))))
            .collect()
    }
}

/// Waits until the destination's `table` holds what `holds` says of the
/// source's: the rows but the refused ones, over the compared columns; the
/// runners must stay alive meanwhile.
pub async fn converge_holding(
    source: &mut Source,
    sink: &Sink,
    runners: &mut Runners,
    table: &str,
    step: &str,
    holds: &Holds<'_>,
) {
    let deadline = tokio::time::Instant::now() + STEP_DEADLINE;
    loop {
        runners.assert_alive(&format!("at step {step:?} of {table}"));
        let columns = holds.compared(&source.columns(table).await);
        let names: Vec<String> = columns.iter().map(|(n, _)| n.clone()).collect();
        let want = by_id(source.rows_as(table, &columns, holds.refused).await);
        let got = sink.rows(table, &names, source.kind()).await.map(by_id);
        if got.as_ref() == Some(&want) {
            return;
        }
        if tokio::time::Instant::now() > deadline {
            let mut diff: Vec<String> = match &got {
                None => vec![format!(
                    "the destination has no table {table} with columns {names:?} yet"
                )],
                Some(got) => {
                    let ids = |rows: &[String]| {
                        rows.iter()
                            .map(|r| r.split('|').next().unwrap_or("").to_string())
                            .collect::<Vec<_>>()
                    };
                    vec![format!("row ids: source {:?}, destination {:?}", ids(&want), ids(got))]
                }
            };
            // Column by column: which differ, and how.
            if got.is_some() {
                let id = ("id".to_string(), "id::text".to_string());
                for c in columns.iter().filter(|(n, _)| n != "id") {
                    let pair = [id.clone(), c.clone()];
                    let want = by_id(source.rows_as(table, &pair, holds.refused).await);
                    let got = sink.rows(table, &[id.0.clone(), c.0.clone()], source.kind()).await.map(by_id);
                    if let Some(got) = got.filter(|g| *g != want) {
                        let w: Vec<&String> = want.iter().filter(|r| !got.contains(r)).take(4).collect();
                        let g: Vec<&String> = got.iter().filter(|r| !want.contains(r)).take(4).collect();
                        diff.push(format!("column {}: - {w:?} / + {g:?}", c.0));
                    }
                }
            }
            panic!(
                "{table}: the destination does not hold what it should after step {step:?} within {STEP_DEADLINE:?} \
                 (columns {names:?}, refused rows {:?}; source - / destination +):\n{}",
                holds.refused,
                diff.join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// The ids (column `id`) of the records dead-lettered from `table`'s topic,
/// each with its column and message headers; every dead letter must name
/// the table and a column (never a value: not checked here).
pub async fn dead_lettered_ids(source: &Source, table: &str) -> Vec<(i64, String, String)> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::message::{Headers, Message};
    let topic = format!("{}.{}.{table}", source.name(), source.name());
    let dlq = format!("{topic}.dlq");
    let consumer: BaseConsumer = crate::committed_reader("dlq")
        .set("enable.partition.eof", "true")
        .create()
        .expect("consumer");
    let partitions = consumer
        .fetch_metadata(Some(&dlq), Duration::from_secs(10))
        .ok()
        .and_then(|m| m.topics().first().map(|t| t.partitions().len()))
        .unwrap_or(0);
    if partitions == 0 {
        return Vec::new();
    }
    consumer.subscribe(&[&dlq]).expect("subscribe");
    let mut decoder = tributary_schemas::EventDecoder::new(
        tributary_schemas::Registry::new(schema_registry_url()).expect("registry"),
    );
    let mut out = Vec::new();
    let mut eof = std::collections::HashSet::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while eof.len() < partitions && std::time::Instant::now() < deadline {
        match consumer.poll(Duration::from_millis(500)) {
            Some(Ok(m)) => {
                let header = |name: &str| {
                    m.headers()
                        .and_then(|h| h.iter().find(|x| x.key == name))
                        .and_then(|x| x.value)
                        .map(|v| String::from_utf8_lossy(v).into_owned())
                        .unwrap_or_default()
                };
                let (column, message) =
                    (header("tributary.errors.column"), header("__connect.errors.exception.message"));
                assert!(
                    header("tributary.errors.table").ends_with(table),
                    "a dead letter of {table} names the table: {message}"
                );
                let event = match decoder.decode(&topic, m.key(), m.payload()).await {
                    Ok(tributary_schemas::decoder::Decoded::Change(e)) => e,
                    other => panic!("a dead letter of {table} that is no change event: {other:?}"),
                };
                let row = event.key_row().expect("a row");
                let i = event.schema.column_index("id").expect("an id column");
                let id = match &row[i] {
                    tributary_schemas::Value::Int32(v) => i64::from(*v),
                    tributary_schemas::Value::Int64(v) => *v,
                    other => panic!("id {other:?}"),
                };
                out.push((id, column, message));
            }
            Some(Err(rdkafka::error::KafkaError::PartitionEOF(p))) => {
                eof.insert(p);
            }
            _ => {}
        }
    }
    assert_eq!(eof.len(), partitions, "read {dlq} to its end");
    out
}

// ---------------------------------------------------------------- runners

/// A runner process the matrices start, kill and start again.
pub struct Proc {
    /// Its binary.
    pub bin: PathBuf,
    /// Its config file.
    pub config: PathBuf,
    /// Its log.
    pub log: PathBuf,
    running: Option<Runner>,
}

impl Proc {
    /// Starts it.
    pub fn start(&mut self) {
        self.running = Some(Runner::spawn(&self.bin, &self.config, &self.log));
    }

    /// Kills it (SIGKILL), if it runs.
    pub fn kill9(&mut self) {
        if let Some(r) = self.running.take() {
            r.kill9();
        }
    }

    /// Fails the test, with its log's tail, if it exited by itself.
    pub fn assert_alive(&mut self, when: &str) {
        if let Some(status) = self.running.as_mut().and_then(Runner::exited) {
            panic!("{} exited by itself ({status}) {when}; log tail:\n{}", self.bin.display(), self.log_tail(30));
        }
    }

    /// The last `n` lines of its log (what a failed wait shows, so that a
    /// failure in CI can be read without the machine).
    pub fn log_tail(&self, n: usize) -> String {
        crate::log_tail(&self.log, n)
    }
}

/// A source runner and a sink runner over a source and a destination.
pub struct Runners {
    /// The source runner.
    pub source: Proc,
    /// The sink runner.
    pub sink: Proc,
    /// The source's admin server.
    pub source_admin: String,
    /// The sink's admin server.
    pub sink_admin: String,
}

impl Runners {
    /// Their config files (written now) and logs, in a temporary folder.
    pub fn new(source: &Source, sink: &Sink) -> Self {
        let name = source.name();
        let dir = std::env::temp_dir().join(format!("{name}-ddl"));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let (registry, kafka) = (schema_registry_url(), kafka_bootstrap());
        let source_port = crate::free_port();
        let sink_port = crate::free_port();
        let source_config = format!(
            "name = \"{name}\"\nschema_registry_url = \"{registry}\"\n\n[kafka]\nbootstrap_servers = \"{kafka}\"\n\n\
             [admin]\nlisten = \"127.0.0.1:{source_port}\"\n\n{}",
            source.runner_section()
        );
        let sink_config = format!(
            "prefix = \"{name}\"\nconsumer_group = \"{}\"\nschema_registry_url = \"{registry}\"\nbatch_linger_ms = 200\n\n\
             [kafka]\nbootstrap_servers = \"{kafka}\"\n\n[admin]\nlisten = \"127.0.0.1:{sink_port}\"\n\n{}",
            sink.group(),
            sink.runner_section()
        );
        std::fs::write(dir.join("source.toml"), source_config).expect("source config");
        std::fs::write(dir.join("sink.toml"), sink_config).expect("sink config");
        eprintln!("logs: {}/{{source,sink}}.log", dir.display());
        let proc = |package: &str, what: &str| Proc {
            bin: runner_binary(package),
            config: dir.join(format!("{what}.toml")),
            log: dir.join(format!("{what}.log")),
            running: None,
        };
        Self {
            source: proc("source-runner", "source"),
            sink: proc("sink-runner", "sink"),
            source_admin: format!("http://127.0.0.1:{source_port}"),
            sink_admin: format!("http://127.0.0.1:{sink_port}"),
        }
    }

    /// Appends `toml` (whole tables, e.g. `[verify]\nrepair = true`) to the
    /// config of the source runner (`source`) or the sink runner; takes
    /// effect at its next start.
    pub fn append_config(&self, source: bool, toml: &str) {
        let path = if source { &self.source.config } else { &self.sink.config };
        let mut text = std::fs::read_to_string(path).expect("runner config");
        text.push('\n');
        text.push_str(toml);
        std::fs::write(path, text).expect("runner config");
    }

    /// `POST /verify` of `table` (`schema.table`) to the source runner: the
    /// verification's id. Retried while the runner is starting.
    pub async fn verify(&self, table: &str) -> u64 {
        let url = format!("{}/verify?table={table}", self.source_admin);
        let deadline = std::time::Instant::now() + STEP_DEADLINE;
        loop {
            let answer = match reqwest::Client::new().post(&url).send().await {
                Ok(r) => (r.status().is_success(), r.text().await.unwrap_or_default()),
                Err(e) => (false, e.to_string()),
            };
            if answer.0 {
                let id = answer
                    .1
                    .split_whitespace()
                    .nth(1)
                    .and_then(|w| w.trim_end_matches(':').parse().ok())
                    .unwrap_or_else(|| panic!("no verification id in {:?}", answer.1));
                return id;
            }
            assert!(std::time::Instant::now() < deadline, "POST /verify of {table} failed: {}", answer.1);
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// The sink runner's `verification` entry of the table whose status key
    /// ends with `table`, once verification `id` of it ended.
    pub async fn verified(&mut self, table: &str, id: u64) -> serde_json::Value {
        self.verified_where(table, |v| v == id).await
    }

    /// The sink runner's `verification` entry of the table whose status key
    /// ends with `table`, once a verification whose id `wanted` accepts
    /// ended.
    pub async fn verified_where(&mut self, table: &str, wanted: impl Fn(u64) -> bool) -> serde_json::Value {
        let url = format!("{}/status", self.sink_admin);
        let deadline = std::time::Instant::now() + STEP_DEADLINE;
        loop {
            self.assert_alive("while verifying");
            let status: Option<serde_json::Value> = match reqwest::get(&url).await {
                Ok(r) => r.json().await.ok(),
                Err(_) => None,
            };
            // The last verification, or the one before it (a repair's
            // verification can replace the one asked for within a poll).
            let entry = status
                .as_ref()
                .and_then(|s| s.get("tables"))
                .and_then(|t| t.as_object())
                .and_then(|t| t.iter().find(|(k, _)| k.ends_with(table)).map(|(_, v)| v.clone()));
            let found = ["previous_verification", "verification"]
                .iter()
                .filter_map(|key| entry.as_ref().and_then(|e| e.get(*key)).cloned())
                // Ended: its last range compared (a range not compared
                // makes it `not_verified` before then).
                .find(|v| v["id"].as_u64().is_some_and(&wanted) && v["finished_ms"].is_i64());
            if let Some(v) = found {
                return v;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the verification of {table} waited for did not end; status: {status:?}\nsink log:\n{}\nsource log:\n{}",
                self.sink.log_tail(30),
                self.source.log_tail(30)
            );
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }

    /// Fails the test if either exited by itself.
    pub fn assert_alive(&mut self, when: &str) {
        self.source.assert_alive(when);
        self.sink.assert_alive(when);
    }

    /// `source-runner reset --table` of `tables`; must succeed.
    pub fn reset(&self, tables: &[&str]) {
        let mut command = std::process::Command::new(&self.source.bin);
        command.arg("--config").arg(&self.source.config).arg("reset");
        for t in tables {
            command.args(["--table", t]);
        }
        let out = command.output().expect("source-runner reset");
        assert!(
            out.status.success(),
            "source-runner reset failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Kills both and deletes the source's topics and subjects.
    pub fn delete(&mut self) {
        self.source.kill9();
        self.sink.kill9();
        let _ = std::process::Command::new(&self.source.bin)
            .arg("--config")
            .arg(&self.source.config)
            .args(["delete", "--yes"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
    }
}

// ---------------------------------------------------------------- the matrix

/// How [`converge_as`] lines up the source's rows and the destination's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compare {
    /// Ordered by `id` as a number (a key: one row per id).
    ById,
    /// As multisets: every row sorted as text, equal rows counted (a table
    /// without a key, where equal rows and NULL ids are legal).
    Multiset,
}

/// Waits until the destination's `table` equals the source's over the
/// source's columns; the runners must stay alive meanwhile.
pub async fn converge(source: &mut Source, sink: &Sink, runners: &mut Runners, table: &str, step: &str) {
    converge_as(source, sink, runners, table, step, Compare::ById).await;
}

/// [`converge`], the rows lined up as `compare` says.
pub async fn converge_as(
    source: &mut Source,
    sink: &Sink,
    runners: &mut Runners,
    table: &str,
    step: &str,
    compare: Compare,
) {
    let order = |rows: Vec<String>| match compare {
        Compare::ById => by_id(rows),
        Compare::Multiset => {
            let mut rows = rows;
            rows.sort();
            rows
        }
    };
    let deadline = tokio::time::Instant::now() + STEP_DEADLINE;
    let mut last = None;
    loop {
        runners.assert_alive(&format!("at step {step:?} of {table}"));
        let columns = source.columns(table).await;
        let want = order(source.rows(table, &columns).await);
        let got = sink.rows(table, &columns, source.kind()).await.map(order);
        if got.as_ref() == Some(&want) {
            return;
        }
        if tokio::time::Instant::now() > deadline {
            // Which change wrote each row tells a row never written again
            // from one written back.
            let mut positioned = columns.clone();
            positioned.extend(["__tributary_commit".to_string(), "__tributary_index".to_string()]);
            eprintln!(
                "{table}: the destination's rows with the position of the change that wrote them: {:#?}",
                sink.rows(table, &positioned, source.kind()).await
            );
            let diff: Vec<String> = match &got {
                None => vec![format!(
                    "the destination has no table {table} with columns {columns:?} yet"
                )],
                Some(got) => {
                    // Counted: a row twice in one and once in the other is
                    // a difference (a table without a key).
                    let count = |rows: &[String], r: &String| rows.iter().filter(|x| *x == r).count();
                    let missing = want
                        .iter()
                        .filter(|r| count(got, r) < count(&want, r))
                        .take(5)
                        .map(|r| format!("- {r} (source {}, destination {})", count(&want, r), count(got, r)));
                    let extra = got
                        .iter()
                        .filter(|r| count(got, r) > count(&want, r))
                        .take(5)
                        .map(|r| format!("+ {r} (source {}, destination {})", count(&want, r), count(got, r)));
                    let order = want
                        .iter()
                        .zip(got)
                        .find(|(w, g)| w != g)
                        .map(|(w, g)| format!("first out of order: - {w} / + {g}"));
                    missing.chain(extra).chain(order).collect()
                }
            };
            panic!(
                "{table}: the destination did not reach the source after step {step:?} within {STEP_DEADLINE:?} \
                 (columns {columns:?}; source - / destination +):\n{}\n(rows: source {}, destination {:?}, the poll before {last:?})\n\
                 source runner's log, last lines:\n{}\nsink runner's log, last lines:\n{}",
                diff.join("\n"),
                want.len(),
                got.as_ref().map(Vec::len),
                runners.source.log_tail(40),
                runners.sink.log_tail(40)
            );
        }
        last = got.map(|g| g.len());
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::canonical;

    fn one(v: &str) -> String {
        canonical(std::iter::once(Some(v.to_string())))
    }

    #[test]
    fn timestamps_compare_without_the_fractions_trailing_zeros() {
        // PostgreSQL's text drops them; Spanner's and BigQuery's keep six
        // digits (a now() ending in 0 once failed the comparison).
        assert_eq!(one("2026-12-07 04:51:16.510130+00"), one("2026-12-07 04:51:16.51013+00"));
        assert_eq!(one("2026-12-07 04:51:16.000000+00"), "2026-12-07 04:51:16+00");
        assert_eq!(one("2024-01-01 10:00:00.120000"), "2024-01-01 10:00:00.12");
        assert_eq!(one("-838:59:59.500000"), "-838:59:59.5");
        assert_eq!(one("10:00:00.120000+05:30"), "10:00:00.12+05:30");
        // Not a clock: kept.
        assert_eq!(one("v1.100x"), "v1.100x");
        assert_eq!(one("12:00:00.10 apples"), "12:00:00.10 apples");
    }
}
