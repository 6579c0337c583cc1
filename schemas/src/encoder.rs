//! Change events to Confluent-framed Avro records.
//!
//! [`EventEncoder::prepare`] does everything that may wait or fail for
//! reasons other than a value: building the schemas, checking compatibility
//! locally and with the registry, registering. [`EventEncoder::encode`] is
//! then synchronous and writes the Avro datum directly from the model's
//! values, following the schema `crate::avro` generated.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::avro::{envelope, has_source_text, EnvelopeOptions, EnvelopeSchemas};
use crate::binary::{write_bool, write_bytes, write_double, write_float, write_header, write_int, write_long};
use crate::compat;
use crate::decimal;
use crate::decoder::CompiledEnvelope;
use crate::error::SchemaError;
use crate::hashing::FxHashMap;
use crate::model::{ChangeEvent, Column, DataType, Op, Row, TableSchema, Value};
use crate::registry::Registry;
use crate::temporal;

type Result<T> = std::result::Result<T, SchemaError>;

/// Compatibility level set on the subjects we create.
pub const COMPATIBILITY_LEVEL: &str = "BACKWARD";

/// One Kafka record: key and value in the Confluent wire format. `None` is
/// a null key or value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncodedRecord {
    /// The key (null for truncates and key-less tables).
    pub key: Option<Vec<u8>>,
    /// The value (null for a tombstone).
    pub value: Option<Vec<u8>>,
}

/// What [`EventEncoder::prepare`] settled for one table shape of a topic.
#[derive(Debug)]
struct Prepared {
    /// The source's shape whose events this version encodes.
    table: Arc<TableSchema>,
    /// The shape the registered schemas describe: `table` relaxed so that
    /// readers of the previous version read it (see [`compat::relax`]);
    /// the same columns in the same order, some wider or optional.
    written: TableSchema,
    key_indexes: Vec<usize>,
    key_id: Option<u32>,
    value_id: u32,
    schemas: EnvelopeSchemas,
    /// Whether the value record has the source-text field
    /// ([`has_source_text`]).
    source_text: bool,
    /// Size of the last value, to allocate once per record.
    size_hint: AtomicUsize,
}

/// The shapes of one topic this process has prepared, the newest last.
#[derive(Debug, Default)]
struct Topic {
    versions: Vec<Prepared>,
    /// Whether the newest is the subjects' latest version because this
    /// process registered it (a shape found registered may be an old one).
    newest_registered: bool,
}

/// How many shapes of one topic are kept: events of an older shape come
/// only from a replay right after a schema change.
const KEPT_VERSIONS: usize = 8;

/// Encodes change events of any number of tables, each on its own topic.
#[derive(Debug)]
pub struct EventEncoder {
    registry: Registry,
    options: EnvelopeOptions,
    topics: FxHashMap<String, Topic>,
    register_incompatible: bool,
}

/// The source's version string in `source.version`.
const VERSION: &str = env!("CARGO_PKG_VERSION");

impl EventEncoder {
    /// An encoder registering schemas in `registry`.
    pub fn new(registry: Registry, options: EnvelopeOptions) -> Self {
        Self {
            registry,
            options,
            topics: FxHashMap::default(),
            register_incompatible: false,
        }
    }

    /// Registers a change no shape can carry over (`int` to `text`) as a new
    /// version anyway, under compatibility `NONE` for that one registration,
    /// instead of refusing it (`incompatible_schema_changes = "register"`,
    /// see `docs/schema-changes.md`): consumers of the topic must then read
    /// the new type.
    pub fn register_incompatible(mut self, yes: bool) -> Self {
        self.register_incompatible = yes;
        self
    }

    /// The envelope options.
    pub fn options(&self) -> &EnvelopeOptions {
        &self.options
    }

    /// The schemas last prepared for a topic, with their registry ids (key
    /// id, value id).
    pub fn prepared(&self, topic: &str) -> Option<(&EnvelopeSchemas, Option<u32>, u32)> {
        self.newest(topic).map(|p| (&p.schemas, p.key_id, p.value_id))
    }

    /// The shape the newest schemas of `topic` describe (the source's shape
    /// relaxed, see [`compat::relax`]).
    pub fn written(&self, topic: &str) -> Option<&TableSchema> {
        self.newest(topic).map(|p| &p.written)
    }

    fn newest(&self, topic: &str) -> Option<&Prepared> {
        self.topics.get(topic).and_then(|t| t.versions.last())
    }

    /// Makes `topic` ready for events of `table`.
    ///
    /// A shape already registered under the topic's subjects (after a
    /// restart, the events of the shape before a schema change are replayed)
    /// is used as it is. Otherwise the shape is relaxed against the
    /// subject's newest version (ours, or the registry's after a restart)
    /// so that it stays BACKWARD compatible where it can ([`compat::relax`]:
    /// new NOT NULL columns without a default and columns that became NOT
    /// NULL stay optional, narrowed types stay wide), checked locally and
    /// with the registry, and registered as `<topic>-key` / `<topic>-value`;
    /// a new subject's compatibility is set to BACKWARD first.
    ///
    /// A change no shape can carry over (`int` to `text`) is
    /// [`SchemaError::Incompatible`] naming the table, the columns and the
    /// types; nothing is registered then.
    pub async fn prepare(&mut self, table: &Arc<TableSchema>, topic: &str) -> Result<()> {
        if let Some(t) = self.topics.get_mut(topic) {
            if let Some(i) = t
                .versions
                .iter()
                .position(|p| Arc::ptr_eq(&p.table, table) || *p.table == **table)
            {
                t.versions[i].table = table.clone();
                return Ok(());
            }
        }
        let plain = envelope(table, topic, &self.options)?;
        let key_subject = format!("{topic}-key");
        let value_subject = format!("{topic}-value");
        let local_base = self
            .topics
            .get(topic)
            .filter(|t| t.newest_registered)
            .and_then(|t| t.versions.last())
            .map(|p| {
                let key = p.key_indexes.iter().map(|&i| p.written.columns[i].clone()).collect::<Vec<_>>();
                (p.written.columns.clone(), key, p.key_id.is_none())
            });

        // One round trip: is this very shape registered already, and (after
        // a restart) what is the subjects' newest version. The registry's
        // calls for one topic run at once: a source of many tables prepares
        // them one after the other at its start, at 10-35 ms a request
        // (Apicurio, here).
        let lookups = async {
            let key = async {
                match &plain.key {
                    Some(k) => self.registry.lookup(&key_subject, k).await,
                    None => Ok(None),
                }
            };
            tokio::try_join!(self.registry.lookup(&value_subject, &plain.value), key)
        };
        let latest = async {
            if local_base.is_some() {
                return Ok((None, None));
            }
            tokio::try_join!(self.registry.latest(&value_subject), self.registry.latest(&key_subject))
        };
        let ((value_hit, key_hit), (latest_value, latest_key)) = tokio::try_join!(lookups, latest)?;
        if let Some(value_id) = value_hit {
            if plain.key.is_none() || key_hit.is_some() {
                self.insert(topic, table, (**table).clone(), plain, key_hit, value_id, false);
                return Ok(());
            }
        }

        // What the registry's latest version says was dropped, when it is
        // the previous shape.
        let mut latest_dropped: Vec<String> = Vec::new();
        // The previous shape: ours if this process prepared the topic, else
        // the registry's latest version. `fresh`: the registry was just
        // asked for the subjects' latest versions, so `*_is_new` says that
        // they have none.
        let (previous, value_is_new, key_is_new, fresh) = match local_base {
            Some((columns, key, key_is_new)) => (Some((columns, key)), false, key_is_new, false),
            None => {
                let previous = match &latest_value {
                    Some((_, text)) => {
                        let plan = CompiledEnvelope::new(topic, text, latest_key.as_ref().map(|(_, t)| &**t))?;
                        let key_cols = plan
                            .key()
                            .iter()
                            .filter_map(|k| plan.columns().iter().find(|c| &c.name == k).cloned())
                            .collect::<Vec<_>>();
                        latest_dropped = plan.dropped().to_vec();
                        Some((plan.columns().to_vec(), key_cols))
                    }
                    None => None,
                };
                (previous, latest_value.is_none(), latest_key.is_none(), true)
            }
        };

        let mut forced = None;
        let (written, schemas) = match &previous {
            None => ((**table).clone(), plain),
            Some((old_columns, old_key)) => {
                let (mut written, mut violations) = compat::relax(old_columns, table);
                // After a restart, a replay of the events of the registry's
                // latest version (written after a DROP COLUMN, then not
                // committed before a crash) has its columns exactly: it is
                // that version, which says what was dropped. Registering it
                // again without would leave the dropped column in sinks
                // that drop dropped columns (found by the schema-change
                // matrix, PostgreSQL to Spanner, a kill right after DROP
                // COLUMN b).
                if written.dropped.is_empty() && !latest_dropped.is_empty() && written.columns == *old_columns {
                    written.dropped = latest_dropped.clone();
                }
                let new_key_columns: Vec<Column> =
                    written.key_indexes().into_iter().map(|i| written.columns[i].clone()).collect();
                if plain.key.is_some() && !old_key.is_empty() {
                    for v in compat::check(old_key, &new_key_columns) {
                        if !violations.iter().any(|x| x.column == v.column) {
                            violations.push(compat::Violation {
                                column: v.column,
                                reason: format!("in the key: {}", v.reason),
                            });
                        }
                    }
                }
                for v in compat::check(old_columns, &written.columns) {
                    if !violations.iter().any(|x| x.column == v.column) {
                        violations.push(v);
                    }
                }
                if !violations.is_empty() && self.register_incompatible {
                    forced = Some(
                        violations
                            .iter()
                            .map(|v| format!("{}: {}", v.column, v.reason))
                            .collect::<Vec<_>>()
                            .join("; "),
                    );
                } else if !violations.is_empty() {
                    return Err(SchemaError::Incompatible {
                        table: table.id.clone(),
                        columns: violations.iter().map(|v| v.column.as_str()).collect::<Vec<_>>().join(", "),
                        reason: violations
                            .iter()
                            .map(|v| format!("{}: {}", v.column, v.reason))
                            .collect::<Vec<_>>()
                            .join("; "),
                    });
                }
                if written == **table {
                    (written, plain)
                } else {
                    let schemas = envelope(&written, topic, &self.options)?;
                    // The relaxed shape may be registered already (a replay
                    // of the events of an earlier relaxed version).
                    let key = async {
                        match &schemas.key {
                            Some(k) => self.registry.lookup(&key_subject, k).await,
                            None => Ok(None),
                        }
                    };
                    let (value_hit, key_hit) =
                        tokio::try_join!(self.registry.lookup(&value_subject, &schemas.value), key)?;
                    if let Some(value_id) = value_hit {
                        if schemas.key.is_none() || key_hit.is_some() {
                            self.insert(topic, table, written, schemas, key_hit, value_id, false);
                            return Ok(());
                        }
                    }
                    (written, schemas)
                }
            }
        };
        let new_key_columns: Vec<Column> =
            written.key_indexes().into_iter().map(|i| written.columns[i].clone()).collect();

        // The registry has the last word (another writer may have
        // registered a version we do not know). A subject that had no
        // version a moment ago has nothing to be compatible with (the
        // registry answers 404, taken as compatible); if another writer
        // registers one meanwhile, the registry checks ours against it when
        // we register.
        let value_check = async {
            if (fresh && value_is_new) || forced.is_some() {
                return None;
            }
            Some(self.registry.compatibility(&value_subject, &schemas.value).await)
        };
        let key_check = async {
            match &schemas.key {
                Some(key) if !(fresh && key_is_new) && forced.is_none() => {
                    Some(self.registry.compatibility(&key_subject, key).await)
                }
                _ => None,
            }
        };
        let (value_answer, key_answer) = tokio::join!(value_check, key_check);
        let checks = [
            (value_answer, &value_subject, &written.columns, "value"),
            (key_answer, &key_subject, &new_key_columns, "key"),
        ];
        for (answer, subject, columns, which) in checks {
            let Some(answer) = answer else { continue };
            let (ok, messages) = answer?;
            if !ok {
                let changed = match &previous {
                    Some((old, old_key)) => {
                        let old = if which == "key" { old_key } else { old };
                        compat::changed_columns(old, columns)
                    }
                    None => Vec::new(),
                };
                let columns = if changed.is_empty() {
                    "(unknown)".to_string()
                } else {
                    changed.join(", ")
                };
                return Err(SchemaError::Incompatible {
                    table: table.id.clone(),
                    columns,
                    reason: format!(
                        "the schema registry refuses the new {which} schema of subject {subject}: {}",
                        messages.join("; ")
                    ),
                });
            }
        }

        // The level is set before the first version so that no version is
        // ever registered under the registry's global default.
        let value = async {
            if value_is_new {
                self.registry.set_compatibility(&value_subject, COMPATIBILITY_LEVEL).await?;
            }
            self.registry.register(&value_subject, &schemas.value).await
        };
        let key = async {
            match &schemas.key {
                Some(key) => {
                    if key_is_new {
                        self.registry.set_compatibility(&key_subject, COMPATIBILITY_LEVEL).await?;
                    }
                    Ok(Some(self.registry.register(&key_subject, key).await?))
                }
                None => Ok(None),
            }
        };
        let (value_id, key_id) = match &forced {
            None => tokio::try_join!(value, key)?,
            Some(reason) => {
                tracing::warn!(table = %table.id, topic, change = %reason,
                    "registering an incompatible schema change (incompatible_schema_changes = \"register\")");
                let subjects = if schemas.key.is_some() {
                    vec![&value_subject, &key_subject]
                } else {
                    vec![&value_subject]
                };
                for subject in &subjects {
                    self.registry.set_compatibility(subject, "NONE").await?;
                }
                let ids = tokio::try_join!(value, key);
                for subject in &subjects {
                    self.registry.set_compatibility(subject, COMPATIBILITY_LEVEL).await?;
                }
                ids?
            }
        };
        self.insert(topic, table, written, schemas, key_id, value_id, true);
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn insert(
        &mut self,
        topic: &str,
        table: &Arc<TableSchema>,
        written: TableSchema,
        schemas: EnvelopeSchemas,
        key_id: Option<u32>,
        value_id: u32,
        registered: bool,
    ) {
        let t = self.topics.entry(topic.to_string()).or_default();
        t.newest_registered = registered;
        let versions = &mut t.versions;
        if versions.len() >= KEPT_VERSIONS {
            versions.remove(0);
        }
        versions.push(Prepared {
            table: table.clone(),
            key_indexes: written.key_indexes(),
            source_text: has_source_text(&written, &self.options),
            written,
            key_id,
            value_id,
            schemas,
            size_hint: AtomicUsize::new(256),
        });
    }

    fn prepared_for(&self, event: &ChangeEvent, topic: &str) -> Result<&Prepared> {
        let t = self.topics.get(topic).ok_or_else(|| not_prepared(event, topic))?;
        // The newest first: nearly every event is of the newest shape.
        t.versions
            .iter()
            .rev()
            .find(|p| Arc::ptr_eq(&p.table, &event.schema) || *p.table == *event.schema)
            .ok_or_else(|| not_prepared(event, topic))
    }

    /// Encodes an event for `topic`, which must have been prepared with the
    /// event's table schema. For a delete, follow with
    /// [`EventEncoder::tombstone`].
    pub fn encode(&self, event: &ChangeEvent, topic: &str) -> Result<EncodedRecord> {
        let p = self.prepared_for(event, topic)?;
        let key = self.encode_key(p, event)?;
        let mut out = Vec::with_capacity(p.size_hint.load(Ordering::Relaxed) + 16);
        write_header(&mut out, p.value_id);
        self.write_envelope(&mut out, p, event)?;
        p.size_hint.store(out.len(), Ordering::Relaxed);
        Ok(EncodedRecord { key, value: Some(out) })
    }

    /// The tombstone that follows a delete (its key, a null value), or
    /// `None` for other operations or when tombstones are off.
    pub fn tombstone(&self, event: &ChangeEvent, topic: &str) -> Result<Option<EncodedRecord>> {
        if event.op != Op::Delete || !self.options.tombstones {
            return Ok(None);
        }
        let p = self.prepared_for(event, topic)?;
        Ok(self
            .encode_key(p, event)?
            .map(|key| EncodedRecord { key: Some(key), value: None }))
    }

    /// The encoded key of an event (`None` for truncates and key-less
    /// tables), as a tombstone or a compaction key needs it.
    pub fn tombstone_key(&self, event: &ChangeEvent, topic: &str) -> Result<Option<Vec<u8>>> {
        let p = self.prepared_for(event, topic)?;
        self.encode_key(p, event)
    }

    fn encode_key(&self, p: &Prepared, event: &ChangeEvent) -> Result<Option<Vec<u8>>> {
        let (Some(key_id), Some(row)) = (p.key_id, event.key_row()) else {
            return Ok(None);
        };
        let table = &p.written;
        check_row_len(table, row)?;
        let mut out = Vec::with_capacity(32);
        write_header(&mut out, key_id);
        for &i in &p.key_indexes {
            write_column(&mut out, table, &table.columns[i], &row[i])?;
        }
        Ok(Some(out))
    }

    fn write_envelope(&self, out: &mut Vec<u8>, p: &Prepared, event: &ChangeEvent) -> Result<()> {
        let table = &p.written;
        for row in [&event.before, &event.after] {
            match row {
                None => write_long(out, 0),
                Some(row) => {
                    write_long(out, 1);
                    write_row(out, table, row, p.source_text)?;
                }
            }
        }
        let s = &event.source;
        write_bytes(out, VERSION.as_bytes());
        write_bytes(out, s.connector.as_bytes());
        write_bytes(out, s.name.as_bytes());
        write_long(out, s.ts_ms);
        write_bytes(out, s.snapshot.as_str().as_bytes());
        write_bytes(out, s.db.as_bytes());
        write_bytes(out, table.id.schema.as_bytes());
        write_bytes(out, table.id.table.as_bytes());
        match &s.tx_id {
            None => write_long(out, 0),
            Some(tx) => {
                write_long(out, 1);
                write_bytes(out, tx.as_bytes());
            }
        }
        if self.options.has_lsn() {
            match parse_pg_lsn(&s.native_position) {
                None => write_long(out, 0),
                Some(lsn) => {
                    write_long(out, 1);
                    write_long(out, lsn as i64);
                }
            }
        }
        // Avro has no unsigned long: positions travel bit-cast.
        write_long(out, s.position.commit as i64);
        write_long(out, s.position.index as i64);
        write_bytes(out, s.native_position.as_bytes());
        write_bytes(out, event.op.code().as_bytes());
        write_long(out, 1);
        write_long(out, event.ts_ms);
        match &event.transaction {
            None => write_long(out, 0),
            Some(tx) => {
                write_long(out, 1);
                write_bytes(out, tx.id.as_bytes());
                write_long(out, tx.total_order);
                write_long(out, tx.data_collection_order);
            }
        }
        Ok(())
    }
}

fn not_prepared(event: &ChangeEvent, topic: &str) -> SchemaError {
    SchemaError::Incompatible {
        table: event.schema.id.clone(),
        columns: String::new(),
        reason: format!("topic {topic} was not prepared for this table schema (call prepare first)"),
    }
}

/// A PostgreSQL LSN in its text form `16/B374D848`.
fn parse_pg_lsn(text: &str) -> Option<u64> {
    let (hi, lo) = text.split_once('/')?;
    let hi = u32::from_str_radix(hi, 16).ok()?;
    let lo = u32::from_str_radix(lo, 16).ok()?;
    Some((u64::from(hi) << 32) | u64::from(lo))
}

/// The key record of a row whose key columns hold `key` (their values in
/// key order), as [`EventEncoder::encode`] writes it under the key schema
/// `key_id` of the shape `table` (the source's written shape, or the one a
/// sink read back from the registry): the bytes the producer's partitioner
/// hashes.
pub fn key_bytes(table: &TableSchema, key_id: u32, key: &[Value]) -> Result<Vec<u8>> {
    let indexes = table.key_indexes();
    if indexes.len() != key.len() || indexes.is_empty() {
        return Err(SchemaError::Value {
            table: table.id.clone(),
            column: String::new(),
            value_kind: "key",
            data_type: format!("key of {} columns", indexes.len()),
            reason: format!("the key has {} values", key.len()),
        });
    }
    let mut out = Vec::with_capacity(32);
    write_header(&mut out, key_id);
    for (&i, v) in indexes.iter().zip(key) {
        write_column(&mut out, table, &table.columns[i], v)?;
    }
    Ok(out)
}

/// The partition the source runner's producer gives a record keyed `key`
/// on a topic of `partitions` partitions: librdkafka's default partitioner
/// (`consistent_random`), the CRC-32 of the key's bytes modulo the count.
pub fn partition_of(key: &[u8], partitions: i32) -> i32 {
    match u32::try_from(partitions) {
        Ok(n) if n > 1 => (crc32fast::hash(key) % n) as i32,
        _ => 0,
    }
}

fn check_row_len(table: &TableSchema, row: &Row) -> Result<()> {
    if row.len() != table.columns.len() {
        return Err(SchemaError::Value {
            table: table.id.clone(),
            column: String::new(),
            value_kind: "row",
            data_type: format!("row of {} columns", table.columns.len()),
            reason: format!("the row has {} values", row.len()),
        });
    }
    Ok(())
}

/// Writes a value record: the columns, then, when the record has it, the
/// source-text field (see `crate::avro::has_source_text`).
fn write_row(out: &mut Vec<u8>, table: &TableSchema, row: &Row, source_text: bool) -> Result<()> {
    check_row_len(table, row)?;
    let mut texts: Option<serde_json::Map<String, serde_json::Value>> = None;
    for (col, v) in table.columns.iter().zip(row) {
        if let Value::SourceText { text, nearest } = v {
            if !source_text {
                return Err(value_error(
                    table,
                    col,
                    v,
                    "a value without an exact form in the column's type, in a record without a source-text field",
                ));
            }
            if matches!(**nearest, Value::SourceText { .. }) {
                return Err(value_error(table, col, v, "a source text nearest to another source text"));
            }
            texts
                .get_or_insert_with(Default::default)
                .insert(col.name.clone(), serde_json::Value::String(text.clone()));
            write_column(out, table, col, nearest)?;
        } else {
            write_column(out, table, col, v)?;
        }
    }
    if source_text {
        match texts {
            None => write_long(out, 0),
            Some(texts) => {
                write_long(out, 1);
                write_bytes(out, serde_json::Value::Object(texts).to_string().as_bytes());
            }
        }
    }
    Ok(())
}

fn value_error(table: &TableSchema, col: &Column, v: &Value, reason: &str) -> SchemaError {
    SchemaError::Value {
        table: table.id.clone(),
        column: col.name.clone(),
        value_kind: v.kind(),
        data_type: col.data_type.to_string(),
        reason: reason.to_string(),
    }
}

#[inline]
fn write_column(out: &mut Vec<u8>, table: &TableSchema, col: &Column, v: &Value) -> Result<()> {
    // A key column's value without an exact form: the key carries the
    // nearest value (the value record, the source's text).
    if let Value::SourceText { nearest, .. } = v {
        if !matches!(**nearest, Value::SourceText { .. }) {
            return write_column(out, table, col, nearest);
        }
    }
    let r = match v {
        Value::Null if col.nullable => {
            write_long(out, 0);
            Ok(())
        }
        Value::Null => Err("NULL in a NOT NULL column"),
        _ => {
            if col.nullable {
                write_long(out, 1);
            }
            write_typed(out, &col.data_type, v)
        }
    };
    r.map_err(|reason| value_error(table, col, v, reason))
}

/// Writes `bytes` produced by `fill` with their length prefix in front,
/// without a scratch buffer: one byte is reserved for the length, enough
/// for up to 63 bytes (every decimal of up to 151 digits); longer ones move
/// into place once.
#[inline]
fn write_len_prefixed(
    out: &mut Vec<u8>,
    fill: impl FnOnce(&mut Vec<u8>) -> std::result::Result<(), decimal::Reason>,
) -> std::result::Result<(), decimal::Reason> {
    let at = out.len();
    out.push(0);
    fill(out)?;
    let len = out.len() - at - 1;
    if len < 64 {
        out[at] = (len as u8) << 1;
    } else {
        let mut prefix = Vec::with_capacity(10);
        write_long(&mut prefix, len as i64);
        out.splice(at..at + 1, prefix);
    }
    Ok(())
}

fn write_typed(out: &mut Vec<u8>, dt: &DataType, v: &Value) -> std::result::Result<(), &'static str> {
    match (dt, v) {
        (DataType::Boolean, Value::Boolean(b)) => write_bool(out, *b),
        (DataType::Int16, Value::Int16(x)) => write_int(out, i32::from(*x)),
        (DataType::Int32, Value::Int32(x)) => write_int(out, *x),
        (DataType::Int64, Value::Int64(x)) => write_long(out, *x),
        // A column whose type narrowed at the source keeps its wider type
        // in the topic (see `compat::relax`): its values are written in it.
        (DataType::Int32, Value::Int16(x)) => write_int(out, i32::from(*x)),
        (DataType::Int64, Value::Int16(x)) => write_long(out, i64::from(*x)),
        (DataType::Int64, Value::Int32(x)) => write_long(out, i64::from(*x)),
        (DataType::Float32, Value::Int16(x)) => write_float(out, f32::from(*x)),
        (DataType::Float64, Value::Int16(x)) => write_double(out, f64::from(*x)),
        (DataType::Float64, Value::Int32(x)) => write_double(out, f64::from(*x)),
        (DataType::Float64, Value::Float32(x)) => write_double(out, f64::from(*x)),
        (DataType::Text, Value::Enum(s) | Value::Json(s)) => write_bytes(out, s.as_bytes()),
        (DataType::Text, Value::Uuid(u)) => {
            let mut buf = [0u8; uuid::fmt::Hyphenated::LENGTH];
            write_bytes(out, u.hyphenated().encode_lower(&mut buf).as_bytes());
        }
        (DataType::Float32, Value::Float32(x)) => write_float(out, *x),
        (DataType::Float64, Value::Float64(x)) => write_double(out, *x),
        (DataType::Decimal { precision, scale }, Value::Decimal(text)) => {
            write_len_prefixed(out, |o| decimal::encode_fixed(o, text, *precision, *scale))?
        }
        (DataType::VariableDecimal, Value::Decimal(text)) => {
            // The scale comes first in the record: count the fraction digits
            // before encoding.
            let scale = text.split_once('.').map_or(0, |(_, f)| f.len());
            let scale = i32::try_from(scale).map_err(|_| "scale too large")?;
            write_int(out, scale);
            write_len_prefixed(out, |o| decimal::encode_variable(o, text).map(|_| ()))?
        }
        (DataType::Text, Value::Text(s)) => write_bytes(out, s.as_bytes()),
        (DataType::Json, Value::Json(s)) => write_bytes(out, s.as_bytes()),
        (DataType::Uuid, Value::Uuid(u)) => {
            let mut buf = [0u8; uuid::fmt::Hyphenated::LENGTH];
            write_bytes(out, u.hyphenated().encode_lower(&mut buf).as_bytes());
        }
        (DataType::Bytes, Value::Bytes(b)) => write_bytes(out, b),
        (DataType::Bits { length }, Value::Bytes(b)) => {
            if b.len() > length.div_ceil(8) as usize {
                return Err("more bytes than the column's bits take");
            }
            write_bytes(out, b)
        }
        (DataType::Date, Value::Date(d)) => write_int(out, *d),
        (DataType::Time | DataType::TimeSpan, Value::Time(t)) => write_long(out, *t),
        (DataType::Timestamp, Value::Timestamp(t)) => write_long(out, *t),
        (DataType::TimestampTz, Value::TimestampTz(t)) => write_long(out, *t),
        (DataType::Interval, Value::Interval { months, days, micros }) => {
            write_bytes(out, temporal::interval_to_iso(*months, *days, *micros).as_bytes())
        }
        (DataType::Enum { symbols }, Value::Enum(label)) => {
            if !symbols.iter().any(|s| s == label) {
                return Err("label is not one of the column's enum labels");
            }
            write_bytes(out, label.as_bytes());
        }
        (DataType::Array(inner), Value::Array(items)) => {
            if !items.is_empty() {
                write_long(out, items.len() as i64);
                for item in items {
                    match item {
                        Value::Null => write_long(out, 0),
                        _ => {
                            write_long(out, 1);
                            write_typed(out, inner, item)?;
                        }
                    }
                }
            }
            write_long(out, 0);
        }
        (DataType::Geometry, Value::Geometry(wkb)) => {
            write_bytes(out, wkb);
            write_long(out, 0);
        }
        (_, Value::Unchanged) => return Err("an unchanged (TOAST) value was not resolved by the source"),
        _ => return Err("the value's kind does not match the column's type"),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_partitioned_as_librdkafka_does() {
        // CRC-32 (the zlib one librdkafka's `rd_crc32` is) of its check
        // string is 0xCBF43926.
        assert_eq!(partition_of(b"123456789", 3), (0xCBF4_3926_u32 % 3) as i32);
        assert_eq!(partition_of(b"123456789", 7), 5);
        assert_eq!(partition_of(b"123456789", 1), 0);
        assert_eq!(partition_of(b"", 0), 0);
    }

    #[test]
    fn pg_lsn_parses() {
        assert_eq!(parse_pg_lsn("16/B374D848"), Some(0x16_B374_D848));
        assert_eq!(parse_pg_lsn("0/0"), Some(0));
        assert_eq!(parse_pg_lsn("mysql-bin.000003:154"), None);
    }

    #[test]
    fn long_prefixed_bytes_move_into_place() {
        let mut out = vec![7u8];
        write_len_prefixed(&mut out, |o| {
            o.extend(std::iter::repeat_n(1u8, 200));
            Ok(())
        })
        .expect("fill");
        let mut r = crate::binary::Reader::new(&out[1..]);
        assert_eq!(r.bytes().map(<[u8]>::len), Ok(200));
        assert!(r.at_end());
    }
}
