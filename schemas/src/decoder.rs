//! The generic decoder sinks use: Confluent-framed Avro change events,
//! ours or Debezium's (PostgreSQL, MySQL and alike), back into
//! [`ChangeEvent`]s.
//!
//! A writer schema is compiled once per schema id into a plan: for every
//! column how to read it and which logical type it has (from Avro logical
//! types first, then Debezium's `connect.name` hints, then the plain Avro
//! type). The table's [`TableSchema`] is rebuilt from the same schema (key
//! columns from the key schema, nullability from unions) and shared by all
//! events of that schema. Decoding reads the datum directly, checking every
//! length and index, so arbitrary bytes give an error and never a panic.

use std::borrow::Cow;
use std::sync::Arc;

use crate::avro::{
    ATTR_ALIASES, ATTR_COLUMN_ID, ATTR_DEFAULT, ATTR_DROPPED, ATTR_KEY, ATTR_ORIGINAL_NAME, ATTR_SOURCE_TEXT,
    ATTR_SOURCE_TYPE, ATTR_SYMBOLS, ATTR_TIME_SPAN, BITS,
};
use crate::binary::{split_header, ReadError, Reader};
use crate::decimal;
use crate::error::SchemaError;
use crate::hashing::FxHashMap;
use crate::model::{
    ChangeEvent, Column, DataType, Op, Position, Row, SnapshotMarker, SourceInfo, TableId, TableSchema,
    TransactionInfo, Value,
};
use crate::registry::Registry;
use crate::temporal;
use crate::writer_schema::{self, Kind, Schema};

type Result<T> = std::result::Result<T, SchemaError>;

/// What a record on a change topic holds.
// Boxing the event would cost an allocation per record for nothing: a
// `Decoded` lives on the stack only until the sink takes the event.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum Decoded {
    /// A change event.
    Change(ChangeEvent),
    /// A record with a null value: the tombstone after a delete (or a
    /// control record; see its headers).
    Tombstone,
}

/// Decodes change-topic records, fetching writer schemas from the registry
/// by the id in each record and caching the compiled plans.
#[derive(Debug)]
pub struct EventDecoder {
    registry: Registry,
    plans: FxHashMap<(u32, Option<u32>), CompiledEnvelope>,
    /// Per topic: the newest value schema known (its id and shape), and
    /// the plans compiled for the topic.
    topics: FxHashMap<String, TopicVersions>,
}

/// What the decoder knows of one topic's versions.
#[derive(Debug, Default)]
struct TopicVersions {
    newest: Option<(u32, Arc<TableSchema>)>,
    plans: Vec<(u32, Option<u32>)>,
}

impl EventDecoder {
    /// A decoder over a registry.
    pub fn new(registry: Registry) -> Self {
        Self {
            registry,
            plans: FxHashMap::default(),
            topics: FxHashMap::default(),
        }
    }

    /// Decodes one record of `topic` (the topic only names errors).
    pub async fn decode(&mut self, topic: &str, key: Option<&[u8]>, value: Option<&[u8]>) -> Result<Decoded> {
        let Some(value) = value else {
            return Ok(Decoded::Tombstone);
        };
        let ids = frame_ids(topic, key, value)?;
        if !self.plans.contains_key(&ids) {
            let value_text = self.registry.schema_text(ids.0).await?;
            let key_text = match ids.1 {
                Some(id) => Some(self.registry.schema_text(id).await?),
                None => None,
            };
            let plan = CompiledEnvelope::new(topic, &value_text, key_text.as_deref())?;
            self.plans.insert(ids, plan);
            self.track_newest(topic, ids).await?;
        }
        match self.decode_cached(topic, key, Some(value))? {
            Some(d) => Ok(d),
            None => Err(decode_err(topic, "schema missing from the cache")),
        }
    }

    /// The shape of the table `table` that the registry's schemas `value_id`
    /// and `key_id` of `topic` describe (a verify record names the schemas
    /// its digests follow).
    pub async fn shape_of(
        &mut self,
        topic: &str,
        table: TableId,
        value_id: u32,
        key_id: Option<u32>,
    ) -> Result<Arc<TableSchema>> {
        let ids = (value_id, key_id);
        if !self.plans.contains_key(&ids) {
            let value_text = self.registry.schema_text(value_id).await?;
            let key_text = match key_id {
                Some(id) => Some(self.registry.schema_text(id).await?),
                None => None,
            };
            let plan = CompiledEnvelope::new(topic, &value_text, key_text.as_deref())?;
            self.plans.insert(ids, plan);
            self.track_newest(topic, ids).await?;
        }
        match self.plans.get(&ids) {
            Some(plan) => Ok(Arc::new(plan.shape(table))),
            None => Err(decode_err(topic, "schema missing from the cache")),
        }
    }

    /// Notes a new plan of `topic` and makes every plan of the topic read
    /// with the newest version's names: an event written before a column
    /// was renamed, read after the rename (a replay, a partition behind
    /// another), carries its values under the new name, as a reader of the
    /// newest schema would see them. The first plan of a topic asks the
    /// registry for the subject's latest version.
    async fn track_newest(&mut self, topic: &str, ids: (u32, Option<u32>)) -> Result<()> {
        if !self.topics.contains_key(topic) {
            let mut versions = TopicVersions::default();
            if let Some((id, text)) = self.registry.latest(&format!("{topic}-value")).await? {
                if id > ids.0 {
                    // Unreadable latest versions are left to their own records.
                    if let Ok(latest) = CompiledEnvelope::new(topic, &text, None) {
                        versions.newest = Some((id, Arc::new(latest.shape(TableId::new("", "")))));
                    }
                }
            }
            self.topics.insert(topic.to_string(), versions);
        }
        let Some(versions) = self.topics.get_mut(topic) else {
            return Ok(());
        };
        versions.plans.push(ids);
        if versions.newest.as_ref().is_none_or(|(id, _)| *id < ids.0) {
            if let Some(plan) = self.plans.get(&ids) {
                versions.newest = Some((ids.0, Arc::new(plan.shape(TableId::new("", "")))));
            }
        }
        let Some((newest_id, newest)) = &versions.newest else {
            return Ok(());
        };
        let renames = newest.columns.iter().any(|c| !c.aliases.is_empty());
        for p in &versions.plans {
            if let Some(plan) = self.plans.get_mut(p) {
                let older = p.0 < *newest_id;
                plan.read_as(if renames && older { Some(newest.clone()) } else { None });
            }
        }
        Ok(())
    }

    /// Decodes a record whose schemas were already loaded by an earlier
    /// [`EventDecoder::decode`], without awaiting; `Ok(None)` when they were
    /// not. For hot loops that want to avoid an async call per record.
    pub fn decode_cached(&mut self, topic: &str, key: Option<&[u8]>, value: Option<&[u8]>) -> Result<Option<Decoded>> {
        let Some(value) = value else {
            return Ok(Some(Decoded::Tombstone));
        };
        let ids = frame_ids(topic, key, value)?;
        let Some(plan) = self.plans.get_mut(&ids) else {
            return Ok(None);
        };
        // `frame_ids` checked the header.
        let datum = &value[crate::binary::HEADER_LEN..];
        plan.decode_datum(topic, datum).map(|e| Some(Decoded::Change(e)))
    }
}

fn decode_err(context: &str, reason: impl Into<String>) -> SchemaError {
    SchemaError::Decode {
        context: context.to_string(),
        reason: reason.into(),
    }
}

fn frame_ids(topic: &str, key: Option<&[u8]>, value: &[u8]) -> Result<(u32, Option<u32>)> {
    let (vid, _) = split_header(value).ok_or_else(|| decode_err(topic, "value is not in the Confluent wire format"))?;
    let kid = match key {
        Some(k) => Some(
            split_header(k)
                .ok_or_else(|| decode_err(topic, "key is not in the Confluent wire format"))?
                .0,
        ),
        None => None,
    };
    Ok((vid, kid))
}

/// A change-event value schema compiled for decoding, with the key
/// columns from its key schema.
#[derive(Debug)]
pub struct CompiledEnvelope {
    fields: Vec<EnvField>,
    columns: Vec<Column>,
    key: Vec<String>,
    /// Columns the previous version had (`tributary.dropped`).
    dropped: Vec<String>,
    /// The topic's newest version, when it renamed columns of this older
    /// one: events are read with its names (see `TableSchema::renamed_as`).
    read_as: Option<Arc<TableSchema>>,
    /// The table schema of the last event, reused while the table is the
    /// same (one schema id normally serves one table).
    table: Option<Arc<TableSchema>>,
    /// The last connector, name, database and native position texts,
    /// shared with the next event while they repeat (a snapshot's events
    /// all carry the same ones).
    repeats: [Option<Arc<str>>; 4],
}

#[derive(Debug)]
enum EnvField {
    Before(Optional, Vec<RowField>),
    After(Optional, Vec<RowField>),
    Source(Vec<(SourceSlot, ScalarReader)>),
    Op(Schema),
    TsMs(Schema),
    Transaction(Optional, Vec<(TxSlot, Schema)>),
    Skip(Schema),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SourceSlot {
    Connector,
    Name,
    TsMs,
    Snapshot,
    Db,
    Schema,
    Table,
    TxId,
    Gtid,
    Lsn,
    Sequence,
    PosCommit,
    PosIndex,
    NativePosition,
    File,
    Pos,
    Row,
    Skip,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TxSlot {
    Id,
    TotalOrder,
    DataCollectionOrder,
    Skip,
}

/// How a possibly-nullable type is read.
#[derive(Debug, Clone, Copy)]
enum Optional {
    /// Not a union: always present.
    Required,
    /// A union of null and one type (in either order), or of one type.
    Union {
        branches: usize,
        null: Option<usize>,
        value: usize,
    },
}

impl Optional {
    /// Reads the branch; `true` when a value follows.
    #[inline]
    fn present(self, r: &mut Reader<'_>) -> std::result::Result<bool, ReadError> {
        match self {
            Optional::Required => Ok(true),
            Optional::Union { branches, null, value } => {
                let b = r.branch(branches)?;
                if Some(b) == null {
                    Ok(false)
                } else if b == value {
                    Ok(true)
                } else {
                    Err(ReadError::BadIndex)
                }
            }
        }
    }

    fn nullable(self) -> bool {
        matches!(self, Optional::Union { null: Some(_), .. })
    }
}

/// Splits `["null", T]` (or `[T, "null"]`, `[T]`, `T`) into how to read the
/// union and `T`. `None` for unions of several non-null types.
fn optional(schema: &Schema) -> Option<(Optional, &Schema)> {
    let Kind::Union(branches) = &schema.kind else {
        return Some((Optional::Required, schema));
    };
    let mut null = None;
    let mut value = None;
    for (i, b) in branches.iter().enumerate() {
        match b.kind {
            Kind::Null if null.is_none() => null = Some(i),
            _ if value.is_none() => value = Some(i),
            _ => return None,
        }
    }
    let value = value?;
    Some((Optional::Union { branches: branches.len(), null, value }, &branches[value]))
}

/// How one column's Avro value becomes a model [`Value`].
#[derive(Debug)]
enum Conv {
    Bool,
    I16,
    I32,
    I64,
    F32,
    F64,
    Decimal { scale: i32 },
    DecimalFixed { size: usize, scale: i32 },
    VariableDecimal { scale_first: bool },
    Text,
    Json,
    Uuid,
    UuidFixed,
    Bytes,
    Fixed(usize),
    Date,
    TimeMicros,
    TimeMillis,
    TimeNanos,
    TsMicros,
    TsMillis,
    TsNanos,
    TzMicros,
    TzMillis,
    TzNanos,
    TzText,
    IntervalText,
    DurationMicros,
    EnumText,
    AvroEnum(Arc<[String]>),
    Array(Box<ColumnPlan>),
    Geometry(Vec<(bool, Schema)>),
}

#[derive(Debug)]
struct ColumnPlan {
    opt: Optional,
    conv: Conv,
}

/// One field of a value record: a column, or the source-text field
/// (`crate::avro::has_source_text`), a nullable string.
#[derive(Debug)]
enum RowField {
    Column(ColumnPlan),
    SourceText(Optional),
}

impl CompiledEnvelope {
    /// Compiles a value schema (and the key schema, for the key columns).
    /// `context` (the topic) names errors.
    pub fn new(context: &str, value_schema: &str, key_schema: Option<&str>) -> Result<Self> {
        let value = writer_schema::parse(value_schema).map_err(|e| decode_err(context, e))?;
        let Kind::Record(envelope) = &value.kind else {
            return Err(decode_err(context, "value schema is not a record"));
        };
        let mut fields = Vec::with_capacity(envelope.fields.len());
        let mut columns: Option<Vec<Column>> = None;
        let mut value_key: Option<Vec<String>> = None;
        let mut dropped: Vec<String> = Vec::new();
        let mut has_op = false;
        for f in &envelope.fields {
            let field = match f.name.as_str() {
                "before" | "after" => {
                    let (opt, record) = optional(&f.schema)
                        .ok_or_else(|| decode_err(context, format!("field {} is not an optional record", f.name)))?;
                    let (plans, cols) = compile_row(context, record)?;
                    if columns.is_none() {
                        columns = Some(cols);
                        value_key = record
                            .attrs
                            .get(ATTR_KEY)
                            .and_then(serde_json::Value::as_array)
                            .map(|names| names.iter().filter_map(|n| n.as_str().map(str::to_string)).collect());
                        dropped = record
                            .attrs
                            .get(ATTR_DROPPED)
                            .and_then(serde_json::Value::as_array)
                            .map(|names| names.iter().filter_map(|n| n.as_str().map(str::to_string)).collect())
                            .unwrap_or_default();
                    }
                    if f.name == "before" {
                        EnvField::Before(opt, plans)
                    } else {
                        EnvField::After(opt, plans)
                    }
                }
                "source" => {
                    let Kind::Record(rec) = &f.schema.kind else {
                        return Err(decode_err(context, "field source is not a record"));
                    };
                    EnvField::Source(
                        rec.fields
                            .iter()
                            .map(|sf| {
                                let slot = source_slot(&sf.name);
                                let reader = if slot == SourceSlot::Skip {
                                    ScalarReader::Skip(sf.schema.clone())
                                } else {
                                    ScalarReader::compile(&sf.schema)
                                };
                                (slot, reader)
                            })
                            .collect(),
                    )
                }
                "op" => {
                    has_op = true;
                    EnvField::Op(f.schema.clone())
                }
                "ts_ms" => EnvField::TsMs(f.schema.clone()),
                "transaction" => {
                    let (opt, inner) = optional(&f.schema)
                        .ok_or_else(|| decode_err(context, "field transaction is not an optional record"))?;
                    let Kind::Record(rec) = &inner.kind else {
                        return Err(decode_err(context, "field transaction is not a record"));
                    };
                    let slots = rec
                        .fields
                        .iter()
                        .map(|tf| {
                            let slot = match tf.name.as_str() {
                                "id" => TxSlot::Id,
                                "total_order" => TxSlot::TotalOrder,
                                "data_collection_order" => TxSlot::DataCollectionOrder,
                                _ => TxSlot::Skip,
                            };
                            (slot, tf.schema.clone())
                        })
                        .collect();
                    EnvField::Transaction(opt, slots)
                }
                _ => EnvField::Skip(f.schema.clone()),
            };
            fields.push(field);
        }
        let Some(columns) = columns.filter(|_| has_op) else {
            return Err(decode_err(context, "value schema is not a change-event envelope (no before/after/op)"));
        };
        let key = match key_schema {
            None => value_key.unwrap_or_default(),
            Some(text) => {
                let key = writer_schema::parse(text).map_err(|e| decode_err(context, e))?;
                match &key.kind {
                    Kind::Record(rec) => rec.fields.iter().map(column_name).collect(),
                    _ => return Err(decode_err(context, "key schema is not a record")),
                }
            }
        };
        Ok(Self {
            fields,
            columns,
            key,
            dropped,
            read_as: None,
            table: None,
            repeats: Default::default(),
        })
    }

    /// Reads events with the column names of `newest`, the topic's newest
    /// version, where it renamed columns of this one (`None`: their own).
    pub fn read_as(&mut self, newest: Option<Arc<TableSchema>>) {
        self.read_as = newest;
        self.table = None;
    }

    /// The shape this schema describes, named `id` (the columns, key and
    /// dropped columns; the table comes from each event's source block).
    pub fn shape(&self, id: TableId) -> TableSchema {
        TableSchema {
            id,
            columns: self.columns.clone(),
            key: self.key.clone(),
            dropped: self.dropped.clone(),
        }
    }

    /// The columns the schema describes (in the schema's order).
    pub fn columns(&self) -> &[Column] {
        &self.columns
    }

    /// Columns the previous version had and this one has not
    /// (`tributary.dropped`).
    pub fn dropped(&self) -> &[String] {
        &self.dropped
    }

    /// The key columns' names, from the key schema.
    pub fn key(&self) -> &[String] {
        &self.key
    }

    /// Decodes one Avro datum (without the Confluent header) written with
    /// this schema. `context` (the topic) names errors.
    pub fn decode_datum(&mut self, context: &str, datum: &[u8]) -> Result<ChangeEvent> {
        let mut r = Reader::new(datum);
        let mut before = None;
        let mut after = None;
        let mut op = None;
        let mut ts_ms = None;
        let mut source = SourceFields::default();
        let mut transaction = None;
        let rerr = |e: ReadError| decode_err(context, e.to_string());
        for field in &self.fields {
            match field {
                EnvField::Before(opt, plans) => {
                    if opt.present(&mut r).map_err(rerr)? {
                        before = Some(read_row(context, &self.columns, plans, &mut r)?);
                    }
                }
                EnvField::After(opt, plans) => {
                    if opt.present(&mut r).map_err(rerr)? {
                        after = Some(read_row(context, &self.columns, plans, &mut r)?);
                    }
                }
                EnvField::Source(slots) => {
                    for (slot, reader) in slots {
                        let d = reader.read(&mut r).map_err(rerr)?;
                        source.set(*slot, d);
                    }
                }
                EnvField::Op(schema) => match read_datum(schema, &mut r).map_err(rerr)? {
                    Datum::Str(code) => {
                        op = Some(Op::from_code(code).ok_or_else(|| decode_err(context, "unknown op code"))?)
                    }
                    _ => return Err(decode_err(context, "op is not a string")),
                },
                EnvField::TsMs(schema) => {
                    if let Datum::Long(v) = read_datum(schema, &mut r).map_err(rerr)? {
                        ts_ms = Some(v);
                    }
                }
                EnvField::Transaction(opt, slots) => {
                    if opt.present(&mut r).map_err(rerr)? {
                        let mut tx = TransactionInfo {
                            id: String::new(),
                            total_order: 0,
                            data_collection_order: 0,
                        };
                        for (slot, schema) in slots {
                            let d = read_datum(schema, &mut r).map_err(rerr)?;
                            match (slot, d) {
                                (TxSlot::Id, Datum::Str(s)) => tx.id = s.to_string(),
                                (TxSlot::Id, Datum::Long(v)) => tx.id = v.to_string(),
                                (TxSlot::TotalOrder, Datum::Long(v)) => tx.total_order = v,
                                (TxSlot::DataCollectionOrder, Datum::Long(v)) => tx.data_collection_order = v,
                                _ => {}
                            }
                        }
                        transaction = Some(tx);
                    }
                }
                EnvField::Skip(schema) => skip(schema, &mut r).map_err(rerr)?,
            }
        }
        if !r.at_end() {
            return Err(decode_err(context, "bytes left after the datum (schema mismatch)"));
        }
        let op = op.ok_or_else(|| decode_err(context, "no op"))?;
        let schema_name = source.schema.or(source.db).unwrap_or_default();
        let table_name = source.table.unwrap_or_default();
        let schema = match &self.table {
            Some(t) if t.id.schema == schema_name && t.id.table == table_name => t.clone(),
            _ => {
                let t = TableSchema {
                    id: TableId::new(schema_name, table_name),
                    columns: self.columns.clone(),
                    key: self.key.clone(),
                    dropped: self.dropped.clone(),
                };
                let t = Arc::new(match self.read_as.as_deref().and_then(|n| t.renamed_as(n)) {
                    Some(renamed) => renamed,
                    None => t,
                });
                self.table = Some(t.clone());
                t
            }
        };
        let (position, native_position) = source.position();
        let source_ts = source.ts_ms.unwrap_or(0);
        let [connector, name, db, native] = &mut self.repeats;
        let info = SourceInfo {
            connector: shared(connector, source.connector.unwrap_or_default()),
            name: shared(name, source.name.unwrap_or_default()),
            db: shared(db, source.db.unwrap_or_default()),
            ts_ms: source_ts,
            snapshot: source.snapshot.unwrap_or(SnapshotMarker::False),
            tx_id: source.tx_id.or_else(|| source.gtid.map(str::to_string)),
            position,
            native_position: shared(native, &native_position),
        };
        Ok(ChangeEvent {
            schema,
            op,
            before,
            after,
            source: info,
            ts_ms: ts_ms.unwrap_or(source_ts),
            transaction,
        })
    }
}

/// The parts of a source block the model keeps, borrowed from the datum.
#[derive(Default)]
struct SourceFields<'a> {
    connector: Option<&'a str>,
    name: Option<&'a str>,
    db: Option<&'a str>,
    schema: Option<&'a str>,
    table: Option<&'a str>,
    ts_ms: Option<i64>,
    snapshot: Option<SnapshotMarker>,
    tx_id: Option<String>,
    gtid: Option<&'a str>,
    lsn: Option<i64>,
    sequence: Option<&'a str>,
    pos_commit: Option<i64>,
    pos_index: Option<i64>,
    native_position: Option<&'a str>,
    file: Option<&'a str>,
    pos: Option<i64>,
    row: Option<i64>,
}

impl<'a> SourceFields<'a> {
    fn set(&mut self, slot: SourceSlot, d: Datum<'a>) {
        match (slot, d) {
            (SourceSlot::Connector, Datum::Str(s)) => self.connector = Some(s),
            (SourceSlot::Name, Datum::Str(s)) => self.name = Some(s),
            (SourceSlot::Db, Datum::Str(s)) => self.db = Some(s),
            (SourceSlot::Schema, Datum::Str(s)) => self.schema = Some(s),
            (SourceSlot::Table, Datum::Str(s)) => self.table = Some(s),
            (SourceSlot::TsMs, Datum::Long(v)) => self.ts_ms = Some(v),
            (SourceSlot::Snapshot, Datum::Str(s)) => {
                self.snapshot = Some(match s {
                    "last" => SnapshotMarker::Last,
                    "false" => SnapshotMarker::False,
                    // true, first, first_in_data_collection,
                    // last_in_data_collection, incremental: snapshot reads.
                    _ => SnapshotMarker::True,
                })
            }
            (SourceSlot::Snapshot, Datum::Bool(b)) => {
                self.snapshot = Some(if b { SnapshotMarker::True } else { SnapshotMarker::False })
            }
            (SourceSlot::TxId, Datum::Str(s)) => self.tx_id = Some(s.to_string()),
            (SourceSlot::TxId, Datum::Long(v)) => self.tx_id = Some(v.to_string()),
            (SourceSlot::Gtid, Datum::Str(s)) => self.gtid = Some(s),
            (SourceSlot::Lsn, Datum::Long(v)) => self.lsn = Some(v),
            (SourceSlot::Sequence, Datum::Str(s)) => self.sequence = Some(s),
            (SourceSlot::PosCommit, Datum::Long(v)) => self.pos_commit = Some(v),
            (SourceSlot::PosIndex, Datum::Long(v)) => self.pos_index = Some(v),
            (SourceSlot::NativePosition, Datum::Str(s)) => self.native_position = Some(s),
            (SourceSlot::File, Datum::Str(s)) => self.file = Some(s),
            (SourceSlot::Pos, Datum::Long(v)) => self.pos = Some(v),
            (SourceSlot::Row, Datum::Long(v)) => self.row = Some(v),
            _ => {}
        }
    }

    /// The ordered position: ours from `pos_commit`/`pos_index`;
    /// Debezium PostgreSQL's from `sequence` (last commit LSN, event LSN)
    /// or else `lsn`; Debezium MySQL's from binlog file number, position
    /// and row.
    fn position(&self) -> (Position, Cow<'a, str>) {
        // Avro has no unsigned long: positions travel bit-cast.
        if let (Some(c), Some(i)) = (self.pos_commit, self.pos_index) {
            let native = Cow::Borrowed(self.native_position.unwrap_or_default());
            return (Position { commit: c as u64, index: i as u64 }, native);
        }
        if let Some(lsn) = self.lsn {
            let lsn = lsn as u64;
            let native = format!("{:X}/{:X}", lsn >> 32, lsn & 0xffff_ffff);
            let last_commit = self.sequence.and_then(sequence_last_commit);
            let position = match last_commit {
                Some(commit) => Position { commit, index: lsn },
                None => Position { commit: lsn, index: 0 },
            };
            return (position, Cow::Owned(native));
        }
        if let (Some(file), Some(pos)) = (self.file, self.pos) {
            let number: u64 = file.rsplit('.').next().and_then(|n| n.parse().ok()).unwrap_or(0);
            let commit = (number << 32) | (pos as u64 & 0xffff_ffff);
            let index = self.row.unwrap_or(0) as u64;
            return (Position { commit, index }, Cow::Owned(format!("{file}:{pos}")));
        }
        (Position::default(), Cow::Borrowed(self.native_position.unwrap_or_default()))
    }
}

/// `text` as the shared string in `slot`, which becomes `text`'s when it
/// differs.
fn shared(slot: &mut Option<Arc<str>>, text: &str) -> Arc<str> {
    match slot {
        Some(last) if **last == *text => last.clone(),
        _ => {
            let new: Arc<str> = Arc::from(text);
            *slot = Some(new.clone());
            new
        }
    }
}

/// The first element of Debezium PostgreSQL's `sequence`
/// (`["<last commit lsn>","<lsn>"]`), when present.
fn sequence_last_commit(seq: &str) -> Option<u64> {
    let v: Vec<Option<String>> = serde_json::from_str(seq).ok()?;
    v.first()?.as_deref()?.parse().ok()
}

fn source_slot(name: &str) -> SourceSlot {
    match name {
        "connector" => SourceSlot::Connector,
        "name" => SourceSlot::Name,
        "ts_ms" => SourceSlot::TsMs,
        "snapshot" => SourceSlot::Snapshot,
        "db" => SourceSlot::Db,
        "schema" => SourceSlot::Schema,
        "table" => SourceSlot::Table,
        "txId" => SourceSlot::TxId,
        "gtid" => SourceSlot::Gtid,
        "lsn" => SourceSlot::Lsn,
        "sequence" => SourceSlot::Sequence,
        "pos_commit" => SourceSlot::PosCommit,
        "pos_index" => SourceSlot::PosIndex,
        "native_position" => SourceSlot::NativePosition,
        "file" => SourceSlot::File,
        "pos" => SourceSlot::Pos,
        "row" => SourceSlot::Row,
        _ => SourceSlot::Skip,
    }
}

fn column_name(f: &writer_schema::Field) -> String {
    f.attrs
        .get(ATTR_ORIGINAL_NAME)
        .and_then(serde_json::Value::as_str)
        .unwrap_or(&f.name)
        .to_string()
}

fn compile_row(context: &str, record: &Schema) -> Result<(Vec<RowField>, Vec<Column>)> {
    let Kind::Record(rec) = &record.kind else {
        return Err(decode_err(context, "row type is not a record"));
    };
    let source_text = record.attr_str(ATTR_SOURCE_TEXT);
    let mut plans = Vec::with_capacity(rec.fields.len());
    let mut columns = Vec::with_capacity(rec.fields.len());
    for f in &rec.fields {
        if source_text == Some(f.name.as_str()) {
            match optional(&f.schema) {
                Some((opt, t)) if matches!(t.kind, Kind::String) => {
                    plans.push(RowField::SourceText(opt));
                    continue;
                }
                _ => return Err(decode_err(context, "the source-text field is not an optional string")),
            }
        }
        let name = column_name(f);
        let (plan, data_type) =
            compile_column(&f.schema).map_err(|reason| decode_err(context, format!("column {name}: {reason}")))?;
        let source_type = f
            .attrs
            .get(ATTR_SOURCE_TYPE)
            .and_then(serde_json::Value::as_str)
            .or_else(|| optional(&f.schema).and_then(|(_, t)| t.connect_param("__debezium.source.column.type")))
            .unwrap_or_default()
            .to_string();
        columns.push(Column {
            name,
            data_type,
            nullable: plan.opt.nullable(),
            source_type,
            default: f.attrs.get(ATTR_DEFAULT).map(serde_json::Value::to_string),
            aliases: f
                .attrs
                .get(ATTR_ALIASES)
                .or_else(|| f.attrs.get("aliases"))
                .and_then(serde_json::Value::as_array)
                .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_string)).collect())
                .unwrap_or_default(),
            column_id: f.attrs.get(ATTR_COLUMN_ID).and_then(serde_json::Value::as_u64),
        });
        plans.push(RowField::Column(plan));
    }
    Ok((plans, columns))
}

fn compile_column(schema: &Schema) -> std::result::Result<(ColumnPlan, DataType), String> {
    let (opt, inner) = optional(schema).ok_or("a union of several types")?;
    let (conv, data_type) = compile_conv(inner)?;
    Ok((ColumnPlan { opt, conv }, data_type))
}

fn scale_of(s: &Schema) -> Option<i32> {
    s.attrs
        .get("scale")
        .and_then(serde_json::Value::as_i64)
        .or_else(|| s.connect_param("scale").and_then(|v| v.parse().ok()))
        .and_then(|v| i32::try_from(v).ok())
        .filter(|v| v.unsigned_abs() <= decimal::MAX_SCALE as u32)
}

fn precision_of(s: &Schema) -> Option<u32> {
    s.attrs
        .get("precision")
        .and_then(serde_json::Value::as_u64)
        .or_else(|| s.connect_param("connect.decimal.precision").and_then(|v| v.parse().ok()))
        .and_then(|v| u32::try_from(v).ok())
        .filter(|&p| p > 0)
}

fn decimal_type(s: &Schema, scale: i32) -> DataType {
    match (precision_of(s), u32::try_from(scale)) {
        (Some(precision), Ok(scale)) if scale <= precision => DataType::Decimal { precision, scale },
        // Without a precision (Kafka Connect's Decimal may lack one) the
        // values are still exact; the column is typed as variable scale.
        _ => DataType::VariableDecimal,
    }
}

fn enum_symbols(s: &Schema) -> Vec<String> {
    if let Some(list) = s.attrs.get(ATTR_SYMBOLS).and_then(serde_json::Value::as_array) {
        return list.iter().filter_map(|v| v.as_str().map(str::to_string)).collect();
    }
    match s.connect_param("allowed") {
        Some("") | None => Vec::new(),
        Some(allowed) => allowed.split(',').map(str::to_string).collect(),
    }
}

fn compile_conv(s: &Schema) -> std::result::Result<(Conv, DataType), String> {
    let logical = s.attr_str("logicalType");
    let connect = s.attr_str("connect.name");
    let connect_type = s.attr_str("connect.type");
    use DataType as D;
    Ok(match (&s.kind, logical, connect) {
        (Kind::Bytes, Some("decimal"), _) | (Kind::Bytes, _, Some("org.apache.kafka.connect.data.Decimal")) => {
            let scale = scale_of(s).unwrap_or(0);
            (Conv::Decimal { scale }, decimal_type(s, scale))
        }
        (Kind::Fixed(size), Some("decimal"), _) => {
            let scale = scale_of(s).unwrap_or(0);
            (Conv::DecimalFixed { size: *size, scale }, decimal_type(s, scale))
        }
        (Kind::Fixed(16), Some("uuid"), _) => (Conv::UuidFixed, D::Uuid),
        (Kind::String, Some("uuid"), _) | (Kind::String, _, Some("io.debezium.data.Uuid")) => (Conv::Uuid, D::Uuid),
        (Kind::Int, Some("date"), _)
        | (Kind::Int, _, Some("io.debezium.time.Date"))
        | (Kind::Int, _, Some("org.apache.kafka.connect.data.Date")) => (Conv::Date, D::Date),
        (Kind::Long, _, _) if s.attrs.get(ATTR_TIME_SPAN).and_then(serde_json::Value::as_bool) == Some(true) => {
            (Conv::TimeMicros, D::TimeSpan)
        }
        (Kind::Long, Some("time-micros"), _) | (Kind::Long, _, Some("io.debezium.time.MicroTime")) => {
            (Conv::TimeMicros, D::Time)
        }
        (Kind::Int, Some("time-millis"), _)
        | (Kind::Int, _, Some("io.debezium.time.Time"))
        | (Kind::Int, _, Some("org.apache.kafka.connect.data.Time")) => (Conv::TimeMillis, D::Time),
        (Kind::Long, _, Some("io.debezium.time.NanoTime")) => (Conv::TimeNanos, D::Time),
        (Kind::Long, Some("local-timestamp-micros"), _) => (Conv::TsMicros, D::Timestamp),
        (Kind::Long, Some("local-timestamp-millis"), _) => (Conv::TsMillis, D::Timestamp),
        (Kind::Long, Some("local-timestamp-nanos"), _) => (Conv::TsNanos, D::Timestamp),
        (Kind::Long, Some("timestamp-micros"), _) => (Conv::TzMicros, D::TimestampTz),
        (Kind::Long, Some("timestamp-millis"), _) => (Conv::TzMillis, D::TimestampTz),
        (Kind::Long, Some("timestamp-nanos"), _) => (Conv::TzNanos, D::TimestampTz),
        // Debezium's un-zoned timestamps: wall-clock time as if in UTC.
        (Kind::Long, _, Some("io.debezium.time.MicroTimestamp")) => (Conv::TsMicros, D::Timestamp),
        (Kind::Long, _, Some("io.debezium.time.Timestamp"))
        | (Kind::Long, _, Some("org.apache.kafka.connect.data.Timestamp")) => (Conv::TsMillis, D::Timestamp),
        (Kind::Long, _, Some("io.debezium.time.NanoTimestamp")) => (Conv::TsNanos, D::Timestamp),
        (Kind::String, _, Some("io.debezium.time.ZonedTimestamp")) => (Conv::TzText, D::TimestampTz),
        (Kind::String, _, Some("io.debezium.time.Interval")) => (Conv::IntervalText, D::Interval),
        (Kind::Long, _, Some("io.debezium.time.MicroDuration")) => (Conv::DurationMicros, D::Interval),
        (Kind::String, _, Some("io.debezium.data.Json")) => (Conv::Json, D::Json),
        (Kind::Bytes, _, Some(BITS)) => match s.connect_param("length").and_then(|l| l.parse::<u32>().ok()) {
            Some(length) if length > 0 => (Conv::Bytes, D::Bits { length }),
            _ => (Conv::Bytes, D::Bytes),
        },
        (Kind::String, _, Some("io.debezium.data.Enum")) => (Conv::EnumText, D::Enum { symbols: enum_symbols(s) }),
        (Kind::Record(rec), _, _)
            if rec.name == crate::avro::VARIABLE_SCALE_DECIMAL
                || connect == Some(crate::avro::VARIABLE_SCALE_DECIMAL) =>
        {
            let names: Vec<&str> = rec.fields.iter().map(|f| f.name.as_str()).collect();
            let ok_types = rec.fields.iter().all(|f| match f.name.as_str() {
                "scale" => matches!(f.schema.kind, Kind::Int),
                "value" => matches!(f.schema.kind, Kind::Bytes),
                _ => false,
            });
            let scale_first = match names.as_slice() {
                ["scale", "value"] => true,
                ["value", "scale"] => false,
                _ => return Err("VariableScaleDecimal without exactly scale and value".into()),
            };
            if !ok_types {
                return Err("VariableScaleDecimal with unexpected field types".into());
            }
            (Conv::VariableDecimal { scale_first }, D::VariableDecimal)
        }
        (Kind::Record(rec), _, _)
            if rec.name == crate::avro::GEOMETRY
                || connect == Some(crate::avro::GEOMETRY)
                || connect == Some("io.debezium.data.geometry.Geography") =>
        {
            let fields: Vec<(bool, Schema)> = rec
                .fields
                .iter()
                .map(|f| (f.name == "wkb" && matches!(f.schema.kind, Kind::Bytes), f.schema.clone()))
                .collect();
            if fields.iter().filter(|(w, _)| *w).count() != 1 {
                return Err("Geometry without a wkb field".into());
            }
            (Conv::Geometry(fields), D::Geometry)
        }
        (Kind::Record(rec), _, _) => return Err(format!("unsupported record type {}", rec.name)),
        (Kind::Array(items), _, _) => {
            let (plan, inner) = compile_column(items)?;
            (Conv::Array(Box::new(plan)), D::Array(Box::new(inner)))
        }
        (Kind::Enum(symbols), _, _) => (Conv::AvroEnum(symbols.clone()), D::Enum { symbols: symbols.to_vec() }),
        (Kind::Boolean, _, _) => (Conv::Bool, D::Boolean),
        (Kind::Int, _, _) if matches!(connect_type, Some("int16") | Some("int8")) => (Conv::I16, D::Int16),
        (Kind::Int, _, _) => (Conv::I32, D::Int32),
        (Kind::Long, _, _) => (Conv::I64, D::Int64),
        (Kind::Float, _, _) => (Conv::F32, D::Float32),
        (Kind::Double, _, _) => (Conv::F64, D::Float64),
        (Kind::String, _, _) => (Conv::Text, D::Text),
        (Kind::Bytes, _, _) => (Conv::Bytes, D::Bytes),
        (Kind::Fixed(n), _, _) => (Conv::Fixed(*n), D::Bytes),
        (Kind::Null, _, _) => return Err("a column of type null".into()),
        (Kind::Map(_), _, _) => return Err("map columns are not supported".into()),
        (Kind::Union(_), _, _) => return Err("a nested union".into()),
    })
}

fn read_row(context: &str, columns: &[Column], plans: &[RowField], r: &mut Reader<'_>) -> Result<Row> {
    let mut row = Vec::with_capacity(columns.len());
    let mut texts = None;
    for plan in plans {
        match plan {
            RowField::Column(plan) => match read_column(plan, r) {
                Ok(v) => row.push(v),
                Err(e) => {
                    let name = columns.get(row.len()).map_or("?", |c| c.name.as_str());
                    return Err(decode_err(context, format!("column {name}: {e}")));
                }
            },
            RowField::SourceText(opt) => {
                let read = |r: &mut Reader<'_>| -> std::result::Result<Option<String>, ReadError> {
                    Ok(if opt.present(r)? {
                        Some(r.str()?.to_string())
                    } else {
                        None
                    })
                };
                texts = read(r).map_err(|e| decode_err(context, format!("the source-text field: {e}")))?;
            }
        }
    }
    if let Some(texts) = texts {
        apply_source_texts(context, columns, &mut row, &texts)?;
    }
    Ok(row)
}

/// Puts the source's text of each value the source-text field holds (a
/// JSON object of column name to text) beside the value the column carries
/// ([`Value::SourceText`]).
fn apply_source_texts(context: &str, columns: &[Column], row: &mut Row, json: &str) -> Result<()> {
    let bad = || decode_err(context, "the source-text field is not a JSON object of texts");
    let serde_json::Value::Object(texts) = serde_json::from_str(json).map_err(|_| bad())? else {
        return Err(bad());
    };
    for (name, text) in texts {
        let serde_json::Value::String(text) = text else {
            return Err(bad());
        };
        let i = columns
            .iter()
            .position(|c| c.name == name)
            .ok_or_else(|| decode_err(context, "the source-text field names a column the record has not"))?;
        let Some(value) = row.get_mut(i) else {
            return Err(bad());
        };
        let nearest = std::mem::replace(value, Value::Null);
        *value = Value::SourceText { text, nearest: Box::new(nearest) };
    }
    Ok(())
}

#[inline]
fn read_column(plan: &ColumnPlan, r: &mut Reader<'_>) -> std::result::Result<Value, ReadError> {
    if !plan.opt.present(r)? {
        return Ok(Value::Null);
    }
    read_conv(&plan.conv, r)
}

fn read_conv(conv: &Conv, r: &mut Reader<'_>) -> std::result::Result<Value, ReadError> {
    Ok(match conv {
        Conv::Bool => Value::Boolean(r.bool()?),
        Conv::I16 => Value::Int16(i16::try_from(r.int()?).map_err(|_| ReadError::BadValue("int16"))?),
        Conv::I32 => Value::Int32(r.int()?),
        Conv::I64 => Value::Int64(r.long()?),
        Conv::F32 => Value::Float32(r.float()?),
        Conv::F64 => Value::Float64(r.double()?),
        Conv::Decimal { scale } => Value::Decimal(decimal::decode(r.bytes()?, *scale).map_err(ReadError::BadValue)?),
        Conv::DecimalFixed { size, scale } => {
            Value::Decimal(decimal::decode(r.take(*size)?, *scale).map_err(ReadError::BadValue)?)
        }
        Conv::VariableDecimal { scale_first } => {
            let (scale, bytes) = if *scale_first {
                let s = r.int()?;
                (s, r.bytes()?)
            } else {
                let b = r.bytes()?;
                (r.int()?, b)
            };
            Value::Decimal(decimal::decode(bytes, scale).map_err(ReadError::BadValue)?)
        }
        Conv::Text => Value::Text(r.str()?.to_string()),
        Conv::Json => Value::Json(r.str()?.to_string()),
        Conv::Uuid => Value::Uuid(uuid::Uuid::try_parse(r.str()?).map_err(|_| ReadError::BadValue("uuid"))?),
        Conv::UuidFixed => {
            let b = r.take(16)?;
            let mut a = [0u8; 16];
            a.copy_from_slice(b);
            Value::Uuid(uuid::Uuid::from_bytes(a))
        }
        Conv::Bytes => Value::Bytes(r.bytes()?.to_vec()),
        Conv::Fixed(n) => Value::Bytes(r.take(*n)?.to_vec()),
        Conv::Date => Value::Date(r.int()?),
        Conv::TimeMicros => Value::Time(r.long()?),
        Conv::TimeMillis => Value::Time(i64::from(r.int()?) * 1000),
        Conv::TimeNanos => Value::Time(r.long()? / 1000),
        Conv::TsMicros => Value::Timestamp(r.long()?),
        Conv::TsMillis => Value::Timestamp(r.long()?.checked_mul(1000).ok_or(ReadError::BadValue("timestamp"))?),
        Conv::TsNanos => Value::Timestamp(r.long()? / 1000),
        Conv::TzMicros => Value::TimestampTz(r.long()?),
        Conv::TzMillis => Value::TimestampTz(r.long()?.checked_mul(1000).ok_or(ReadError::BadValue("timestamp"))?),
        Conv::TzNanos => Value::TimestampTz(r.long()? / 1000),
        Conv::TzText => {
            Value::TimestampTz(temporal::instant_from_iso(r.str()?).ok_or(ReadError::BadValue("timestamp"))?)
        }
        Conv::IntervalText => {
            let (months, days, micros) =
                temporal::interval_from_iso(r.str()?).ok_or(ReadError::BadValue("interval"))?;
            Value::Interval { months, days, micros }
        }
        Conv::DurationMicros => Value::Interval { months: 0, days: 0, micros: r.long()? },
        Conv::EnumText => Value::Enum(r.str()?.to_string()),
        Conv::AvroEnum(symbols) => {
            let i = r.long()?;
            let label = usize::try_from(i)
                .ok()
                .and_then(|i| symbols.get(i))
                .ok_or(ReadError::BadIndex)?;
            Value::Enum(label.clone())
        }
        Conv::Array(item) => {
            let mut out = Vec::new();
            loop {
                // Every item takes at least its union branch byte.
                let n = r.block_len(1)?;
                if n == 0 {
                    break;
                }
                out.reserve(n);
                for _ in 0..n {
                    out.push(read_column(item, r)?);
                }
            }
            Value::Array(out)
        }
        Conv::Geometry(fields) => {
            let mut wkb = Vec::new();
            for (is_wkb, schema) in fields {
                if *is_wkb {
                    wkb = r.bytes()?.to_vec();
                } else {
                    skip(schema, r)?;
                }
            }
            Value::Geometry(wkb)
        }
    })
}

/// How a source-block field is read: the common shapes directly, others
/// through the generic [`read_datum`], unused ones skipped (no UTF-8 check).
#[derive(Debug)]
enum ScalarReader {
    Str,
    Long,
    OptStr(Optional),
    OptLong(Optional),
    Generic(Schema),
    Skip(Schema),
}

impl ScalarReader {
    fn compile(schema: &Schema) -> Self {
        match optional(schema) {
            Some((Optional::Required, inner)) => match inner.kind {
                Kind::String => ScalarReader::Str,
                Kind::Int | Kind::Long => ScalarReader::Long,
                _ => ScalarReader::Generic(schema.clone()),
            },
            Some((opt, inner)) => match inner.kind {
                Kind::String => ScalarReader::OptStr(opt),
                Kind::Int | Kind::Long => ScalarReader::OptLong(opt),
                _ => ScalarReader::Generic(schema.clone()),
            },
            None => ScalarReader::Generic(schema.clone()),
        }
    }

    #[inline]
    fn read<'a>(&'a self, r: &mut Reader<'a>) -> std::result::Result<Datum<'a>, ReadError> {
        Ok(match self {
            ScalarReader::Str => Datum::Str(r.str()?),
            ScalarReader::Long => Datum::Long(r.long()?),
            ScalarReader::OptStr(opt) => {
                if opt.present(r)? {
                    Datum::Str(r.str()?)
                } else {
                    Datum::Null
                }
            }
            ScalarReader::OptLong(opt) => {
                if opt.present(r)? {
                    Datum::Long(r.long()?)
                } else {
                    Datum::Null
                }
            }
            ScalarReader::Generic(schema) => read_datum(schema, r)?,
            ScalarReader::Skip(schema) => {
                skip(schema, r)?;
                Datum::Other
            }
        })
    }
}

/// A source-block value in the few shapes the model uses.
enum Datum<'a> {
    Null,
    Bool(bool),
    Long(i64),
    Str(&'a str),
    Other,
}

fn read_datum<'a>(schema: &'a Schema, r: &mut Reader<'a>) -> std::result::Result<Datum<'a>, ReadError> {
    Ok(match &schema.kind {
        Kind::Null => Datum::Null,
        Kind::Boolean => Datum::Bool(r.bool()?),
        Kind::Int | Kind::Long => Datum::Long(r.long()?),
        Kind::String => Datum::Str(r.str()?),
        Kind::Enum(symbols) => {
            let i = r.long()?;
            let s = usize::try_from(i)
                .ok()
                .and_then(|i| symbols.get(i))
                .ok_or(ReadError::BadIndex)?;
            Datum::Str(s.as_str())
        }
        Kind::Union(branches) => {
            let b = r.branch(branches.len())?;
            read_datum(&branches[b], r)?
        }
        _ => {
            skip(schema, r)?;
            Datum::Other
        }
    })
}

/// Reads past a datum of any type.
fn skip(schema: &Schema, r: &mut Reader<'_>) -> std::result::Result<(), ReadError> {
    match &schema.kind {
        Kind::Null => {}
        Kind::Boolean => {
            r.take(1)?;
        }
        Kind::Int | Kind::Long | Kind::Enum(_) => {
            r.long()?;
        }
        Kind::Float => {
            r.take(4)?;
        }
        Kind::Double => {
            r.take(8)?;
        }
        Kind::Bytes | Kind::String => {
            r.bytes()?;
        }
        Kind::Fixed(n) => {
            r.take(*n)?;
        }
        Kind::Array(items) => loop {
            let n = r.block_len(items.min_size())?;
            if n == 0 {
                break;
            }
            for _ in 0..n {
                skip(items, r)?;
            }
        },
        Kind::Map(values) => loop {
            let n = r.block_len(1 + values.min_size())?;
            if n == 0 {
                break;
            }
            for _ in 0..n {
                r.bytes()?;
                skip(values, r)?;
            }
        },
        Kind::Union(branches) => {
            let b = r.branch(branches.len())?;
            skip(&branches[b], r)?;
        }
        Kind::Record(rec) => {
            for f in &rec.fields {
                skip(&f.schema, r)?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_texts_that_do_not_read_are_errors_not_panics() {
        let columns = vec![Column::new("n", DataType::VariableDecimal, true)];
        for bad in ["", "[]", "{\"n\": 1}", "{\"x\": \"NaN\"}", "{\"n\": \"NaN\"", "null"] {
            let mut row = vec![Value::Null];
            assert!(apply_source_texts("t", &columns, &mut row, bad).is_err(), "{bad}");
        }
        // A row shorter than its columns (never decoded so) is an error too.
        assert!(apply_source_texts("t", &columns, &mut Vec::new(), "{\"n\": \"NaN\"}").is_err());
        let mut row = vec![Value::Null];
        apply_source_texts("t", &columns, &mut row, "{\"n\": \"NaN\"}").expect("reads");
        assert_eq!(row, vec![Value::SourceText { text: "NaN".into(), nearest: Box::new(Value::Null) }]);
        // Bits without a length are plain bytes.
        let bits = writer_schema::parse(r#"{"type":"bytes","connect.name":"io.debezium.data.Bits"}"#).expect("parses");
        assert!(matches!(compile_conv(&bits), Ok((Conv::Bytes, DataType::Bytes))));
        let bits = writer_schema::parse(
            r#"{"type":"bytes","connect.name":"io.debezium.data.Bits","connect.parameters":{"length":"9"}}"#,
        )
        .expect("parses");
        assert!(matches!(compile_conv(&bits), Ok((Conv::Bytes, DataType::Bits { length: 9 }))));
    }
}
