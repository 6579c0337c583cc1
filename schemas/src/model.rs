//! The table and change-event model every connector speaks.
//!
//! Sources turn what their database says into these types; the Avro layer
//! (`crate::avro`) turns them into Debezium-compatible change events; sinks get
//! them back from the decoder. Keeping one model means a new connector only
//! maps its own types onto [`DataType`] and never touches the wire format.

use std::fmt;
use std::sync::Arc;

/// A table's identity in its source: `schema.table` (for MySQL the schema is
/// the database name).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct TableId {
    /// Schema (PostgreSQL, SQL Server, Oracle) or database (MySQL).
    pub schema: String,
    /// Table name, as the source spells it.
    pub table: String,
}

impl TableId {
    /// Builds a table id from its two parts.
    pub fn new(schema: impl Into<String>, table: impl Into<String>) -> Self {
        Self { schema: schema.into(), table: table.into() }
    }
}

impl fmt::Display for TableId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.schema, self.table)
    }
}

/// The logical type of a column, independent of any database.
///
/// Each variant has exactly one Avro representation (see `docs/type-mapping.md`),
/// chosen to match what Debezium emits so that its consumers feel at home.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum DataType {
    /// `boolean`.
    Boolean,
    /// 16-bit integer (Avro `int`, `connect.type=int16`).
    Int16,
    /// 32-bit integer.
    Int32,
    /// 64-bit integer.
    Int64,
    /// 32-bit IEEE float.
    Float32,
    /// 64-bit IEEE float.
    Float64,
    /// Fixed precision and scale (Avro `bytes` with logical type `decimal`).
    Decimal {
        /// Total digits.
        precision: u32,
        /// Digits after the decimal point.
        scale: u32,
    },
    /// A numeric without declared scale (PostgreSQL `numeric`): Debezium's
    /// `io.debezium.data.VariableScaleDecimal` record of `scale` and `value`.
    VariableDecimal,
    /// Unicode text of any length.
    Text,
    /// JSON document, carried as text (`io.debezium.data.Json`).
    Json,
    /// UUID, carried as its canonical text (logical type `uuid`).
    Uuid,
    /// Raw bytes.
    Bytes,
    /// A bit string of a fixed number of bits (PostgreSQL `bit(n)`, n > 1):
    /// Debezium's `io.debezium.data.Bits`, bytes with the bit count in its
    /// `length` parameter. The value ([`Value::Bytes`]) is the bit string
    /// read as a binary number, little-endian, in `ceil(length / 8)` bytes
    /// (Debezium's order: the string's last bit is bit 0 of byte 0).
    Bits {
        /// The number of bits.
        length: u32,
    },
    /// Calendar date: days since 1970-01-01 (logical type `date`).
    Date,
    /// Time of day in microseconds (logical type `time-micros`), from
    /// 00:00:00 to 24:00:00.
    Time,
    /// A signed span of time in microseconds, which may be negative or
    /// beyond a day: MySQL's `TIME` (-838:59:59 to 838:59:59, a time of day
    /// or an elapsed time). Carried as Debezium does, a `long` named
    /// `io.debezium.time.MicroTime`, without Avro's `time-micros` (whose
    /// readers take a time of day and fail or wrap on the rest), and with
    /// `tributary.time_span` so that a sink keeps every value (PostgreSQL
    /// `interval`, text elsewhere: docs/type-mapping.md).
    TimeSpan,
    /// Date and time without zone, microseconds since the epoch of the
    /// wall clock (logical type `local-timestamp-micros`).
    Timestamp,
    /// An instant, microseconds since the Unix epoch in UTC (logical type
    /// `timestamp-micros`).
    TimestampTz,
    /// An interval: months, days and microseconds (`io.debezium.time.Interval`
    /// is ISO-8601 text; we keep the three parts and render that text).
    Interval,
    /// One of a fixed set of labels (`io.debezium.data.Enum`, carried as text
    /// so that adding a label stays backward compatible).
    Enum {
        /// The allowed labels, in declaration order.
        symbols: Vec<String>,
    },
    /// An array of one element type.
    Array(Box<DataType>),
    /// Geometry or geography as WKB bytes (`io.debezium.data.geometry.Geometry`).
    Geometry,
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DataType::Boolean => f.write_str("boolean"),
            DataType::Int16 => f.write_str("int16"),
            DataType::Int32 => f.write_str("int32"),
            DataType::Int64 => f.write_str("int64"),
            DataType::Float32 => f.write_str("float32"),
            DataType::Float64 => f.write_str("float64"),
            DataType::Decimal { precision, scale } => write!(f, "decimal({precision},{scale})"),
            DataType::VariableDecimal => f.write_str("decimal"),
            DataType::Text => f.write_str("text"),
            DataType::Json => f.write_str("json"),
            DataType::Uuid => f.write_str("uuid"),
            DataType::Bytes => f.write_str("bytes"),
            DataType::Bits { length } => write!(f, "bits({length})"),
            DataType::Date => f.write_str("date"),
            DataType::Time => f.write_str("time"),
            DataType::TimeSpan => f.write_str("time span"),
            DataType::Timestamp => f.write_str("timestamp"),
            DataType::TimestampTz => f.write_str("timestamptz"),
            DataType::Interval => f.write_str("interval"),
            DataType::Enum { .. } => f.write_str("enum"),
            DataType::Array(inner) => write!(f, "array<{inner}>"),
            DataType::Geometry => f.write_str("geometry"),
        }
    }
}

/// One column of a table.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Column {
    /// Column name, as the source spells it.
    pub name: String,
    /// Logical type.
    pub data_type: DataType,
    /// Whether the column accepts NULL.
    pub nullable: bool,
    /// The source's own spelling of the type (`numeric(12,2)`, `varchar(40)`),
    /// kept so that a sink of the same kind can recreate it exactly
    /// (`__debezium.source.column.type` in Debezium's schema parameters).
    pub source_type: String,
    /// The value that rows which existed before the column was added have
    /// (`ADD COLUMN ... DEFAULT 7`), as the JSON of its Avro default (see
    /// `crate::defaults`); `None` when there is none or it cannot be
    /// carried. A sink that adds the column gives it to the rows it holds.
    pub default: Option<String>,
    /// Names the column had before (`RENAME COLUMN d TO d2` gives `d2` the
    /// alias `d`), oldest first; carried as the Avro field's `aliases` so
    /// that a reader of the newest schema reads older events' `d` as `d2`,
    /// and a sink renames its column instead of adding an empty one (see
    /// `docs/schema-changes.md`).
    pub aliases: Vec<String>,
    /// The source's identity of the column, which a rename keeps
    /// (PostgreSQL: the table's oid and the column's attnum), where the
    /// source has one; carried as `tributary.column_id`. The encoder finds
    /// a rename by it (a column of a new name with the identity of one that
    /// is gone), also after a restart, against the registry's version.
    pub column_id: Option<u64>,
}

impl Column {
    /// A column without the source's own type text (tests, and sources whose
    /// type names carry nothing beyond the logical type).
    pub fn new(name: impl Into<String>, data_type: DataType, nullable: bool) -> Self {
        Self {
            name: name.into(),
            data_type,
            nullable,
            source_type: String::new(),
            default: None,
            aliases: Vec::new(),
            column_id: None,
        }
    }

    /// This column with `value` as its default (see [`Column::default`]);
    /// a value without an Avro JSON form leaves it without one.
    pub fn with_default(mut self, value: &Value) -> Self {
        self.default = crate::defaults::to_avro_json(&self.data_type, value).map(|j| j.to_string());
        self
    }

    /// The column's default as a value of its type.
    pub fn default_value(&self) -> Option<Value> {
        let json: serde_json::Value = serde_json::from_str(self.default.as_deref()?).ok()?;
        crate::defaults::from_avro_json(&self.data_type, &json)
    }
}

/// The shape of a table at one point in its history.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TableSchema {
    /// The table.
    pub id: TableId,
    /// Columns in the source's ordinal order.
    pub columns: Vec<Column>,
    /// Names of the key columns, in key order. All columns when the table has
    /// no primary key and no key was configured.
    pub key: Vec<String>,
    /// Columns the previous version of the table had and this one no
    /// longer has (`DROP COLUMN b`), as the topic's schema version records
    /// them (`tributary.dropped`, set by the encoder when it registers the
    /// version); empty where a source builds a shape. A sink told to drop
    /// dropped columns drops only these, so that an older shape replayed
    /// late never drops a column a newer one added.
    pub dropped: Vec<String>,
}

impl TableSchema {
    /// This (older) shape with its columns named as in `newest`, where
    /// `newest` says a column was renamed (its aliases hold this shape's
    /// name, and this shape has no column of the new name); `None` when
    /// nothing is renamed. A column of the same name in `newest` wins over
    /// an alias, as in Avro's schema resolution. Values stay where they
    /// are: only names change.
    pub fn renamed_as(&self, newest: &TableSchema) -> Option<TableSchema> {
        if newest.columns.iter().all(|c| c.aliases.is_empty()) {
            return None;
        }
        let mut out: Option<TableSchema> = None;
        for (i, c) in self.columns.iter().enumerate() {
            if newest.column_index(&c.name).is_some() {
                continue;
            }
            let Some(to) = newest.columns.iter().find(|n| n.aliases.contains(&c.name)) else {
                continue;
            };
            if self.column_index(&to.name).is_some() {
                continue;
            }
            let s = out.get_or_insert_with(|| self.clone());
            s.columns[i].name = to.name.clone();
            s.columns[i].aliases = to.aliases.clone();
            for k in &mut s.key {
                if *k == c.name {
                    *k = to.name.clone();
                }
            }
        }
        out
    }

    /// Index of a column by name.
    pub fn column_index(&self, name: &str) -> Option<usize> {
        self.columns.iter().position(|c| c.name == name)
    }

    /// Indexes of the key columns, in key order. Key names that do not exist
    /// are skipped (the source validates keys when it builds the schema).
    pub fn key_indexes(&self) -> Vec<usize> {
        self.key.iter().filter_map(|k| self.column_index(k)).collect()
    }
}

/// A single column value. `Unchanged` exists only between a source and its
/// own post-processing (a PostgreSQL TOAST value the WAL did not repeat); it
/// never reaches a topic.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// SQL NULL.
    Null,
    /// `boolean`.
    Boolean(bool),
    /// `int16`.
    Int16(i16),
    /// `int32`.
    Int32(i32),
    /// `int64`.
    Int64(i64),
    /// `float32`.
    Float32(f32),
    /// `float64`.
    Float64(f64),
    /// A decimal (fixed or variable scale) as its exact canonical text, e.g.
    /// `-12.340`. Text keeps every digit and the scale without a big-number
    /// type in the model.
    Decimal(String),
    /// Text.
    Text(String),
    /// JSON text.
    Json(String),
    /// UUID.
    Uuid(uuid::Uuid),
    /// Bytes.
    Bytes(Vec<u8>),
    /// Days since 1970-01-01.
    Date(i32),
    /// Microseconds since midnight ([`DataType::Time`]), or a signed span
    /// of microseconds ([`DataType::TimeSpan`]).
    Time(i64),
    /// Wall-clock microseconds since 1970-01-01T00:00:00 (no zone).
    Timestamp(i64),
    /// Microseconds since the Unix epoch, UTC.
    TimestampTz(i64),
    /// An interval.
    Interval {
        /// Months.
        months: i32,
        /// Days.
        days: i32,
        /// Microseconds.
        micros: i64,
    },
    /// An enum label.
    Enum(String),
    /// Array elements.
    Array(Vec<Value>),
    /// WKB bytes.
    Geometry(Vec<u8>),
    /// A value its column's type has no exact form for (PostgreSQL's
    /// numeric `NaN` and infinities, a timestamp after 294247-01-10, an
    /// array of several dimensions or with a lower bound other than 1):
    /// the source's own text of it, which a destination of the source's
    /// kind reads back exactly, and the nearest value of the column's type,
    /// which the change topic's column carries (what Debezium carries: NULL
    /// or zero for a NaN, the largest timestamp, the elements in order).
    /// The text travels beside the row (`tributary.source_text`, see
    /// `docs/type-mapping.md`); a sink that cannot write the text refuses
    /// the value rather than writing the nearest one.
    SourceText {
        /// The source's text of the value (PostgreSQL's output function).
        text: String,
        /// The nearest value of the column's type (never a `SourceText`).
        nearest: Box<Value>,
    },
    /// A value the source did not send because it did not change (see the
    /// type's doc). Encoders reject it.
    Unchanged,
}

impl Value {
    /// A short name of the value's kind, for error messages (never the value
    /// itself: row values are not logged).
    pub fn kind(&self) -> &'static str {
        match self {
            Value::Null => "null",
            Value::Boolean(_) => "boolean",
            Value::Int16(_) => "int16",
            Value::Int32(_) => "int32",
            Value::Int64(_) => "int64",
            Value::Float32(_) => "float32",
            Value::Float64(_) => "float64",
            Value::Decimal(_) => "decimal",
            Value::Text(_) => "text",
            Value::Json(_) => "json",
            Value::Uuid(_) => "uuid",
            Value::Bytes(_) => "bytes",
            Value::Date(_) => "date",
            Value::Time(_) => "time",
            Value::Timestamp(_) => "timestamp",
            Value::TimestampTz(_) => "timestamptz",
            Value::Interval { .. } => "interval",
            Value::Enum(_) => "enum",
            Value::Array(_) => "array",
            Value::Geometry(_) => "geometry",
            Value::SourceText { .. } => "source text",
            Value::Unchanged => "unchanged",
        }
    }
}

/// A row: one value per column, in the column order of its [`TableSchema`].
pub type Row = Vec<Value>;

/// What happened to a row (Debezium's `op` field).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// `r`: read during the snapshot.
    Read,
    /// `c`: insert.
    Create,
    /// `u`: update.
    Update,
    /// `d`: delete.
    Delete,
    /// `t`: truncate of the whole table.
    Truncate,
}

impl Op {
    /// Debezium's one-letter code.
    pub fn code(self) -> &'static str {
        match self {
            Op::Read => "r",
            Op::Create => "c",
            Op::Update => "u",
            Op::Delete => "d",
            Op::Truncate => "t",
        }
    }

    /// Parses Debezium's one-letter code.
    pub fn from_code(code: &str) -> Option<Op> {
        Some(match code {
            "r" => Op::Read,
            "c" => Op::Create,
            "u" => Op::Update,
            "d" => Op::Delete,
            "t" => Op::Truncate,
            _ => return None,
        })
    }
}

/// A totally ordered position in the source's change history.
///
/// `commit` orders transactions (PostgreSQL: commit LSN; MySQL: binlog file
/// number << 32 | offset of the transaction's end), `index` orders events
/// within one transaction. Snapshot rows carry the position the snapshot is
/// consistent with and index 0, so every streamed change sorts after them.
/// Sinks compare positions to never move a row backwards on a replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, serde::Serialize, serde::Deserialize)]
pub struct Position {
    /// Orders transactions.
    pub commit: u64,
    /// Orders events inside one transaction.
    pub index: u64,
}

/// A sequence a captured table's column takes its values from (an identity
/// or `serial` column's, or one its default calls), as the source has it
/// at one moment: enough to make it in a destination and keep it at or
/// above the source, so that a destination promoted to primary never hands
/// out a value the source used.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SequenceState {
    /// The sequence's schema.
    pub schema: String,
    /// The sequence's name.
    pub name: String,
    /// Its type (`bigint`, `integer`, `smallint`).
    pub data_type: String,
    /// `INCREMENT BY`.
    pub increment: i64,
    /// `MINVALUE`.
    pub min: i64,
    /// `MAXVALUE`.
    pub max: i64,
    /// Whether it wraps around.
    pub cycle: bool,
    /// Its `last_value`.
    pub last_value: i64,
    /// Whether `last_value` was handed out (`is_called`); if not, it is the
    /// next value.
    pub is_called: bool,
}

impl SequenceState {
    /// The sequence, named as a table is.
    pub fn id(&self) -> TableId {
        TableId::new(self.schema.clone(), self.name.clone())
    }

    /// The next value it hands out (without wrapping around).
    pub fn next_value(&self) -> i128 {
        if self.is_called {
            i128::from(self.last_value) + i128::from(self.increment)
        } else {
            i128::from(self.last_value)
        }
    }

    /// Whether it is ahead of `other` (further in its direction).
    pub fn ahead_of(&self, other: &SequenceState) -> bool {
        if self.increment >= 0 {
            self.next_value() > other.next_value()
        } else {
            self.next_value() < other.next_value()
        }
    }
}

/// A table's objects besides its columns and key, as the source has them:
/// what a destination of the same kind recreates when a database moves
/// (docs/migration.md). The SQL carried names no other table; a foreign
/// key's table and a default's sequence are ids, which a sink names as it
/// names tables. Empty lists serialize to nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TableObjects {
    /// Indexes other than the primary key's and those a constraint owns.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub indexes: Vec<IndexObject>,
    /// Constraints other than the primary key and `NOT NULL`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub constraints: Vec<ConstraintObject>,
    /// Column defaults and identities.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub defaults: Vec<ColumnDefault>,
}

impl TableObjects {
    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.indexes.is_empty() && self.constraints.is_empty() && self.defaults.is_empty()
    }
}

/// A secondary index.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IndexObject {
    /// Its name.
    pub name: String,
    /// Whether it is unique.
    pub unique: bool,
    /// What follows the table's name in its `CREATE INDEX`: `USING btree
    /// (lower(email)) INCLUDE (x) WHERE (...)`.
    pub definition: String,
}

/// What a constraint is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConstraintKind {
    /// `CHECK (...)`: about one row.
    Check,
    /// `UNIQUE (...)`.
    Unique,
    /// `EXCLUDE USING ...`.
    Exclusion,
    /// `FOREIGN KEY (...) REFERENCES ...`.
    ForeignKey,
}

/// A constraint other than the primary key.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConstraintObject {
    /// Its name.
    pub name: String,
    /// What it is.
    pub kind: ConstraintKind,
    /// Its definition as the source prints it (`CHECK ((qty > 0))`,
    /// `UNIQUE (email)`); a foreign key's, up to `REFERENCES` (`FOREIGN KEY
    /// (customer_id)`), the rest in [`ConstraintObject::references`].
    pub definition: String,
    /// A foreign key's referenced table, columns and options.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub references: Option<ForeignKeyTarget>,
}

/// What a foreign key references.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ForeignKeyTarget {
    /// The referenced table.
    pub table: TableId,
    /// Its columns, in the key's order.
    pub columns: Vec<String>,
    /// What follows the column list: `MATCH FULL ON DELETE CASCADE
    /// DEFERRABLE INITIALLY DEFERRED` (empty for the defaults).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub options: String,
}

/// A column's default or identity.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ColumnDefault {
    /// The column.
    pub column: String,
    /// The default's expression as the source prints it (empty for an
    /// identity): when [`ColumnDefault::sequence`] is set and this is a
    /// plain `nextval` of it, a sink calls its own sequence instead.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub expression: String,
    /// The sequence a plain `nextval` default or an identity takes values
    /// from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sequence: Option<TableId>,
    /// `GENERATED ALWAYS` (`Some(true)`) or `BY DEFAULT` (`Some(false)`)
    /// `AS IDENTITY`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity_always: Option<bool>,
}

/// Snapshot marker of an event (Debezium's `source.snapshot`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SnapshotMarker {
    /// A streamed change.
    False,
    /// A snapshot row.
    True,
    /// The last row of the snapshot of the last table.
    Last,
}

impl SnapshotMarker {
    /// Debezium's text for the marker.
    pub fn as_str(self) -> &'static str {
        match self {
            SnapshotMarker::False => "false",
            SnapshotMarker::True => "true",
            SnapshotMarker::Last => "last",
        }
    }
}

/// Where an event came from (Debezium's `source` block).
///
/// The texts that repeat from event to event are shared (`Arc<str>`): a
/// snapshot's million events would otherwise each allocate, and free on
/// another thread, the same four strings.
#[derive(Debug, Clone, PartialEq)]
pub struct SourceInfo {
    /// Connector kind: `postgresql`, `mysql`, `sqlserver`, `oracle`.
    pub connector: Arc<str>,
    /// The runner's logical name (Debezium's `topic.prefix`).
    pub name: Arc<str>,
    /// Database name.
    pub db: Arc<str>,
    /// Source commit time, milliseconds since the epoch.
    pub ts_ms: i64,
    /// Snapshot marker.
    pub snapshot: SnapshotMarker,
    /// Source transaction id, when the source has one.
    pub tx_id: Option<String>,
    /// Ordered position.
    pub position: Position,
    /// The source's native position text (`0/16B3748`, `mysql-bin.000003:154`).
    pub native_position: Arc<str>,
}

/// Transaction metadata (Debezium's `transaction` block).
#[derive(Debug, Clone, PartialEq)]
pub struct TransactionInfo {
    /// Transaction id.
    pub id: String,
    /// 1-based order of this event among all events of the transaction.
    pub total_order: i64,
    /// 1-based order of this event among the transaction's events for its table.
    pub data_collection_order: i64,
}

/// One change to one row, or to a whole table for truncate.
#[derive(Debug, Clone, PartialEq)]
pub struct ChangeEvent {
    /// The table's schema at the time of the change.
    pub schema: Arc<TableSchema>,
    /// What happened.
    pub op: Op,
    /// Row before the change (updates and deletes, per replica identity).
    pub before: Option<Row>,
    /// Row after the change (reads, inserts, updates).
    pub after: Option<Row>,
    /// Where it came from.
    pub source: SourceInfo,
    /// When the runner processed it, milliseconds since the epoch.
    pub ts_ms: i64,
    /// Transaction metadata, when the source provides it.
    pub transaction: Option<TransactionInfo>,
}

impl ChangeEvent {
    /// The row that carries the key: `after` for reads, inserts and updates,
    /// `before` for deletes.
    pub fn key_row(&self) -> Option<&Row> {
        match self.op {
            Op::Delete => self.before.as_ref(),
            Op::Truncate => None,
            _ => self.after.as_ref().or(self.before.as_ref()),
        }
    }
}
