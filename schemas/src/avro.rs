//! Avro schemas of change events: a key record of the key columns and a
//! Debezium-style envelope for the value.
//!
//! Names, `connect.name` hints and the envelope's shape follow Debezium's
//! Avro output so that consumers written for Debezium read our topics. Where
//! we differ (position fields in `source`, logical types on temporal
//! columns), `docs/type-mapping.md` says so.

use std::collections::HashSet;

use serde_json::{json, Map, Value as Json};

use crate::error::SchemaError;
use crate::model::{Column, DataType, TableSchema};

/// Field attribute holding a column's original name when Avro's naming
/// rules forced a change (Debezium would lose it; the decoder restores it).
pub const ATTR_ORIGINAL_NAME: &str = "tributary.name";
/// Field attribute holding the source's own spelling of the column type.
pub const ATTR_SOURCE_TYPE: &str = "tributary.source_type";
/// Field attribute holding a column's default (see `crate::defaults`), for
/// nullable fields too, whose Avro `default` must be null.
pub const ATTR_DEFAULT: &str = "tributary.default";
/// Field attribute holding a column's earlier names as the source spells
/// them (Avro's own `aliases` beside it holds them as Avro names).
pub const ATTR_ALIASES: &str = "tributary.aliases";
/// Field attribute holding the source's identity of a column (see
/// `Column::column_id`).
pub const ATTR_COLUMN_ID: &str = "tributary.column_id";
/// Attribute of the value record listing the key columns, so that events
/// with a null key (truncates) still tell the decoder the table's key.
pub const ATTR_KEY: &str = "tributary.key";
/// Attribute of the value record listing the columns the previous version
/// had and this one has not (see `TableSchema::dropped`).
pub const ATTR_DROPPED: &str = "tributary.dropped";
/// Type attribute listing enum labels exactly (Debezium's `allowed`
/// parameter is comma-separated and cannot carry a label with a comma).
pub const ATTR_SYMBOLS: &str = "tributary.symbols";
/// Type attribute (`true`) of a `MicroTime` that may be negative or beyond
/// a day (`DataType::TimeSpan`, MySQL's `TIME`).
pub const ATTR_TIME_SPAN: &str = "tributary.time_span";

/// Attribute of the value record naming its source-text field (see
/// [`has_source_text`]).
pub const ATTR_SOURCE_TEXT: &str = "tributary.source_text";
/// The name of the source-text field (one `_` more for each column that
/// takes it already).
pub const SOURCE_TEXT_FIELD: &str = "__tributary_source_text";
/// Debezium's name of a bit string of more than one bit.
pub const BITS: &str = "io.debezium.data.Bits";

/// Labels of `source.snapshot`, as Debezium declares them.
const SNAPSHOT_ALLOWED: &str = "true,last,false,incremental";

/// Choices that shape the envelope and the records around it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvelopeOptions {
    /// Connector kind written into the source block's record name
    /// (`io.debezium.connector.<connector>.Source`); `postgresql` adds the
    /// `lsn` field as Debezium's PostgreSQL connector does.
    pub connector: String,
    /// Whether a delete is followed by a tombstone (the key with a null
    /// value) so that log compaction can drop the key. Debezium's default.
    pub tombstones: bool,
}

impl EnvelopeOptions {
    /// Options for a connector kind, with tombstones on.
    pub fn for_connector(connector: impl Into<String>) -> Self {
        Self { connector: connector.into(), tombstones: true }
    }

    /// Whether the source block has PostgreSQL's `lsn` field.
    pub fn has_lsn(&self) -> bool {
        self.connector == "postgresql"
    }
}

impl Default for EnvelopeOptions {
    /// PostgreSQL with tombstones: the first and most common source.
    fn default() -> Self {
        Self::for_connector("postgresql")
    }
}

/// The two schemas of a table's topic, as Avro JSON text ready for the
/// registry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvelopeSchemas {
    /// Key schema; `None` when the table has no key columns (records then
    /// have a null key).
    pub key: Option<String>,
    /// Value schema: the envelope.
    pub value: String,
}

/// Replaces every character Avro does not allow in a name by `_`, and
/// prefixes `_` when the name would start with a digit (Debezium's
/// `avro` adjustment mode).
pub fn sanitize_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 1);
    if name.chars().next().is_none_or(|c| c.is_ascii_digit()) {
        out.push('_');
    }
    out.extend(
        name.chars()
            .map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' }),
    );
    out
}

/// A topic as an Avro namespace: each dot-separated part sanitized.
pub fn namespace_of(topic: &str) -> String {
    topic.split('.').map(sanitize_name).collect::<Vec<_>>().join(".")
}

/// Builds the key and value schemas of a table's topic.
///
/// Fails when the table cannot be written in Avro: a decimal with a
/// precision of zero or a scale above its precision, or two column names
/// that become the same Avro name.
pub fn envelope(table: &TableSchema, topic: &str, options: &EnvelopeOptions) -> Result<EnvelopeSchemas, SchemaError> {
    let ns = namespace_of(topic);
    let key_columns: Vec<&Column> = table.key_indexes().into_iter().map(|i| &table.columns[i]).collect();
    let key = if key_columns.is_empty() {
        None
    } else {
        let mut names = HashSet::new();
        let fields = fields(table, &key_columns, &mut names)?;
        let record = json!({
            "type": "record",
            "name": "Key",
            "namespace": ns,
            "fields": fields,
            "connect.name": format!("{ns}.Key"),
        });
        Some(record.to_string())
    };

    let mut names = HashSet::new();
    let all: Vec<&Column> = table.columns.iter().collect();
    let mut value_fields = fields(table, &all, &mut names)?;
    let source_text = has_source_text(table, options).then(|| source_text_field(table));
    if let Some(name) = &source_text {
        value_fields.push(json!({
            "name": name,
            "type": ["null", {"type": "string", "connect.version": 1, "connect.name": "io.debezium.data.Json"}],
            "default": null,
        }));
    }
    let mut value_record = json!({
        "type": "record",
        "name": "Value",
        "namespace": ns,
        "fields": value_fields,
        "connect.name": format!("{ns}.Value"),
    });
    if !key_columns.is_empty() {
        value_record[ATTR_KEY] = json!(key_columns.iter().map(|c| c.name.as_str()).collect::<Vec<_>>());
    }
    if !table.dropped.is_empty() {
        value_record[ATTR_DROPPED] = json!(table.dropped);
    }
    if let Some(name) = source_text {
        value_record[ATTR_SOURCE_TEXT] = json!(name);
    }
    let value_name = format!("{ns}.Value");
    let envelope = json!({
        "type": "record",
        "name": "Envelope",
        "namespace": ns,
        "fields": [
            {"name": "before", "type": ["null", value_record], "default": null},
            {"name": "after", "type": ["null", value_name], "default": null},
            {"name": "source", "type": source_schema(options)},
            {"name": "op", "type": "string"},
            {"name": "ts_ms", "type": ["null", "long"], "default": null},
            {"name": "transaction", "type": ["null", transaction_schema()], "default": null},
        ],
        "connect.version": 1,
        "connect.name": format!("{ns}.Envelope"),
    });
    Ok(EnvelopeSchemas { key, value: envelope.to_string() })
}

/// Whether the value record of `table` has the source-text field: a
/// nullable string (JSON, `io.debezium.data.Json`) after the columns,
/// holding, per row, the source's own text of the values whose column type
/// has no exact form for them (`Value::SourceText`), as a JSON object of
/// column name to text; null when the row has none. PostgreSQL tables with
/// a column that can hold such a value have it: `numeric` (NaN and the
/// infinities), `timestamp[tz]` (the years after 294247) and arrays (several
/// dimensions, lower bounds other than 1, and their elements).
/// Debezium-minded consumers see one more optional JSON field; the value
/// record names it in [`ATTR_SOURCE_TEXT`].
pub fn has_source_text(table: &TableSchema, options: &EnvelopeOptions) -> bool {
    options.connector == "postgresql" && table.columns.iter().any(|c| may_need_source_text(&c.data_type))
}

/// Whether a PostgreSQL column of type `t` can hold a value without an
/// exact form in it (see [`has_source_text`]).
pub fn may_need_source_text(t: &DataType) -> bool {
    matches!(
        t,
        DataType::Decimal { .. }
            | DataType::VariableDecimal
            | DataType::Timestamp
            | DataType::TimestampTz
            | DataType::Array(_)
    )
}

/// The source-text field's name in `table`'s value record: one no column
/// takes.
fn source_text_field(table: &TableSchema) -> String {
    let mut name = SOURCE_TEXT_FIELD.to_string();
    while table.columns.iter().any(|c| sanitize_name(&c.name) == name) {
        name.push('_');
    }
    name
}

/// The source block's record.
fn source_schema(options: &EnvelopeOptions) -> Json {
    let connector = sanitize_name(&options.connector);
    let mut fields = vec![
        json!({"name": "version", "type": "string"}),
        json!({"name": "connector", "type": "string"}),
        json!({"name": "name", "type": "string"}),
        json!({"name": "ts_ms", "type": "long"}),
        json!({"name": "snapshot", "type": {
            "type": "string",
            "connect.version": 1,
            "connect.parameters": {"allowed": SNAPSHOT_ALLOWED},
            "connect.default": "false",
            "connect.name": "io.debezium.data.Enum",
        }, "default": "false"}),
        json!({"name": "db", "type": "string"}),
        json!({"name": "schema", "type": "string"}),
        json!({"name": "table", "type": "string"}),
        json!({"name": "txId", "type": ["null", "string"], "default": null}),
    ];
    if options.has_lsn() {
        fields.push(json!({"name": "lsn", "type": ["null", "long"], "default": null}));
    }
    fields.push(json!({"name": "pos_commit", "type": "long"}));
    fields.push(json!({"name": "pos_index", "type": "long"}));
    fields.push(json!({"name": "native_position", "type": "string"}));
    json!({
        "type": "record",
        "name": "Source",
        "namespace": format!("io.debezium.connector.{connector}"),
        "fields": fields,
        "connect.name": format!("io.debezium.connector.{connector}.Source"),
    })
}

/// Debezium's transaction block.
fn transaction_schema() -> Json {
    json!({
        "type": "record",
        "name": "block",
        "namespace": "event",
        "fields": [
            {"name": "id", "type": "string"},
            {"name": "total_order", "type": "long"},
            {"name": "data_collection_order", "type": "long"},
        ],
        "connect.version": 1,
        "connect.name": "event.block",
    })
}

/// Record fields of `columns`. `names` holds the named types already
/// defined in this schema document (a named type is defined once, then
/// referenced by name).
fn fields(
    table: &TableSchema,
    columns: &[&Column],
    names: &mut HashSet<&'static str>,
) -> Result<Vec<Json>, SchemaError> {
    let mut seen = HashSet::with_capacity(columns.len());
    let mut out = Vec::with_capacity(columns.len());
    for col in columns {
        let name = sanitize_name(&col.name);
        if !seen.insert(name.clone()) {
            return Err(SchemaError::Incompatible {
                table: table.id.clone(),
                columns: col.name.clone(),
                reason: format!("column name becomes the Avro name {name} of another column"),
            });
        }
        let ty = column_type(table, col, &col.data_type, names)?;
        let default = col.default.as_deref().and_then(|d| serde_json::from_str::<Json>(d).ok());
        let mut field = Map::new();
        field.insert("name".into(), Json::String(name.clone()));
        if col.nullable {
            field.insert("type".into(), json!(["null", ty]));
            field.insert("default".into(), Json::Null);
        } else {
            field.insert("type".into(), ty);
            // A reader of events written before the column existed takes
            // this value: the new schema stays BACKWARD compatible.
            if let Some(d) = &default {
                field.insert("default".into(), d.clone());
            }
        }
        if let Some(d) = default {
            field.insert(ATTR_DEFAULT.into(), d);
        }
        if name != col.name {
            field.insert(ATTR_ORIGINAL_NAME.into(), Json::String(col.name.clone()));
        }
        if !col.aliases.is_empty() {
            // Avro resolves a reader field by its aliases: a reader of this
            // version reads an older event's `d` as the renamed `d2`.
            let mut avro: Vec<String> = Vec::new();
            for a in col.aliases.iter().map(|a| sanitize_name(a)) {
                if a != name && !avro.contains(&a) {
                    avro.push(a);
                }
            }
            if !avro.is_empty() {
                field.insert("aliases".into(), json!(avro));
            }
            field.insert(ATTR_ALIASES.into(), json!(col.aliases));
        }
        if let Some(id) = col.column_id {
            field.insert(ATTR_COLUMN_ID.into(), json!(id));
        }
        if !col.source_type.is_empty() {
            field.insert(ATTR_SOURCE_TYPE.into(), Json::String(col.source_type.clone()));
        }
        out.push(Json::Object(field));
    }
    Ok(out)
}

/// A named record type: its definition the first time, its name after.
fn named(names: &mut HashSet<&'static str>, full_name: &'static str, define: impl FnOnce() -> Json) -> Json {
    if names.insert(full_name) {
        define()
    } else {
        Json::String(full_name.to_string())
    }
}

/// Full name of Debezium's variable-scale decimal record.
pub const VARIABLE_SCALE_DECIMAL: &str = "io.debezium.data.VariableScaleDecimal";
/// Full name of Debezium's geometry record.
pub const GEOMETRY: &str = "io.debezium.data.geometry.Geometry";

/// The Avro type of one logical type (without the nullable union).
fn column_type(
    table: &TableSchema,
    col: &Column,
    data_type: &DataType,
    names: &mut HashSet<&'static str>,
) -> Result<Json, SchemaError> {
    Ok(match data_type {
        DataType::Boolean => json!("boolean"),
        DataType::Int16 => json!({"type": "int", "connect.type": "int16"}),
        DataType::Int32 => json!("int"),
        DataType::Int64 => json!("long"),
        DataType::Float32 => json!("float"),
        DataType::Float64 => json!("double"),
        DataType::Decimal { precision, scale } => {
            if *precision == 0 || scale > precision {
                return Err(SchemaError::UnsupportedType {
                    table: table.id.clone(),
                    column: col.name.clone(),
                    source_type: format!("{} (Avro decimals need 0 < scale <= precision)", data_type),
                });
            }
            json!({
                "type": "bytes",
                "scale": scale,
                "precision": precision,
                "connect.version": 1,
                "connect.parameters": {
                    "scale": scale.to_string(),
                    "connect.decimal.precision": precision.to_string(),
                },
                "connect.name": "org.apache.kafka.connect.data.Decimal",
                "logicalType": "decimal",
            })
        }
        DataType::VariableDecimal => named(names, VARIABLE_SCALE_DECIMAL, || {
            json!({
                "type": "record",
                "name": "VariableScaleDecimal",
                "namespace": "io.debezium.data",
                "fields": [
                    {"name": "scale", "type": "int"},
                    {"name": "value", "type": "bytes"},
                ],
                "connect.doc": "Variable scaled decimal",
                "connect.version": 1,
                "connect.name": VARIABLE_SCALE_DECIMAL,
            })
        }),
        DataType::Text => json!("string"),
        DataType::Json => json!({
            "type": "string",
            "connect.version": 1,
            "connect.name": "io.debezium.data.Json",
        }),
        DataType::Uuid => json!({
            "type": "string",
            "logicalType": "uuid",
            "connect.version": 1,
            "connect.name": "io.debezium.data.Uuid",
        }),
        DataType::Bytes => json!("bytes"),
        DataType::Bits { length } => json!({
            "type": "bytes",
            "connect.version": 1,
            "connect.parameters": {"length": length.to_string()},
            "connect.name": BITS,
        }),
        DataType::Date => json!({
            "type": "int",
            "logicalType": "date",
            "connect.version": 1,
            "connect.name": "io.debezium.time.Date",
        }),
        DataType::Time => json!({
            "type": "long",
            "logicalType": "time-micros",
            "connect.version": 1,
            "connect.name": "io.debezium.time.MicroTime",
        }),
        // Debezium's MicroTime without `time-micros`: Avro's time-micros is
        // a time of day, and its readers (Java's LocalTime, fastavro's
        // time) fail on -838:59:59 or 100:00:00.
        DataType::TimeSpan => json!({
            "type": "long",
            "connect.version": 1,
            "connect.name": "io.debezium.time.MicroTime",
            ATTR_TIME_SPAN: true,
        }),
        DataType::Timestamp => json!({
            "type": "long",
            "logicalType": "local-timestamp-micros",
            "connect.version": 1,
            "connect.name": "io.debezium.time.MicroTimestamp",
        }),
        // Debezium sends an ISO string (ZonedTimestamp); an instant in UTC
        // microseconds is exact, smaller and a standard Avro logical type.
        DataType::TimestampTz => json!({
            "type": "long",
            "logicalType": "timestamp-micros",
        }),
        DataType::Interval => json!({
            "type": "string",
            "connect.version": 1,
            "connect.name": "io.debezium.time.Interval",
        }),
        DataType::Enum { symbols } => json!({
            "type": "string",
            "connect.version": 1,
            "connect.parameters": {"allowed": symbols.join(",")},
            "connect.name": "io.debezium.data.Enum",
            ATTR_SYMBOLS: symbols,
        }),
        DataType::Array(inner) => {
            let item = column_type(table, col, inner, names)?;
            // Array elements can be NULL in PostgreSQL; Debezium makes
            // them optional too.
            json!({"type": "array", "items": ["null", item]})
        }
        DataType::Geometry => named(names, GEOMETRY, || {
            json!({
                "type": "record",
                "name": "Geometry",
                "namespace": "io.debezium.data.geometry",
                "fields": [
                    {"name": "wkb", "type": "bytes"},
                    {"name": "srid", "type": ["null", "int"], "default": null},
                ],
                "connect.doc": "Geometry",
                "connect.version": 1,
                "connect.name": GEOMETRY,
            })
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::TableId;

    fn col(name: &str, data_type: DataType, nullable: bool) -> Column {
        Column::new(name, data_type, nullable)
    }

    #[test]
    fn names_are_sanitized_like_debezium() {
        assert_eq!(sanitize_name("order-items"), "order_items");
        assert_eq!(sanitize_name("1st"), "_1st");
        assert_eq!(sanitize_name(""), "_");
        assert_eq!(sanitize_name("prix€"), "prix_");
        assert_eq!(namespace_of("my-app.public.9lives"), "my_app.public._9lives");
    }

    #[test]
    fn schemas_parse_with_apache_avro() {
        let all = [
            DataType::Boolean,
            DataType::Int16,
            DataType::Int32,
            DataType::Int64,
            DataType::Float32,
            DataType::Float64,
            DataType::Decimal { precision: 12, scale: 2 },
            DataType::VariableDecimal,
            DataType::Text,
            DataType::Json,
            DataType::Uuid,
            DataType::Bytes,
            DataType::Bits { length: 12 },
            DataType::Date,
            DataType::Time,
            DataType::TimeSpan,
            DataType::Timestamp,
            DataType::TimestampTz,
            DataType::Interval,
            DataType::Enum { symbols: vec!["a".into(), "b,c".into()] },
            DataType::Array(Box::new(DataType::VariableDecimal)),
            DataType::Geometry,
        ];
        let mut columns: Vec<Column> = all
            .iter()
            .enumerate()
            .map(|(i, t)| col(&format!("c{i}"), t.clone(), i % 2 == 0))
            .collect();
        columns.push(col("second geometry", DataType::Geometry, true));
        columns.push(col("c7b", DataType::VariableDecimal, false));
        let table = TableSchema {
            id: TableId::new("public", "all"),
            columns,
            key: vec!["c1".into(), "c7".into()],
            dropped: Vec::new(),
        };
        let s = envelope(&table, "p.public.all", &EnvelopeOptions::default()).expect("schemas");
        apache_avro::Schema::parse_str(&s.value).expect("value schema parses");
        apache_avro::Schema::parse_str(s.key.as_deref().expect("key")).expect("key schema parses");
    }

    #[test]
    fn colliding_names_are_rejected() {
        let table = TableSchema {
            id: TableId::new("s", "t"),
            columns: vec![col("a-b", DataType::Int32, false), col("a_b", DataType::Int32, false)],
            key: vec![],
            dropped: Vec::new(),
        };
        let err = envelope(&table, "p.s.t", &EnvelopeOptions::default()).expect_err("collision");
        assert_eq!(err.table(), Some(&table.id));
    }

    #[test]
    fn a_time_span_is_debeziums_micro_time_without_time_micros_and_decodes_as_a_span() {
        let table = TableSchema {
            id: TableId::new("db", "t"),
            columns: vec![col("id", DataType::Int32, false), col("t", DataType::TimeSpan, true)],
            key: vec!["id".into()],
            dropped: Vec::new(),
        };
        let s = envelope(&table, "p.db.t", &EnvelopeOptions::for_connector("mysql")).expect("schemas");
        let value: Json = serde_json::from_str(&s.value).expect("json");
        let text = value.to_string();
        assert!(text.contains(r#""connect.name":"io.debezium.time.MicroTime""#), "{text}");
        assert!(text.contains(r#""tributary.time_span":true"#), "{text}");
        assert!(!text.contains("time-micros"), "a span is no time of day: {text}");
        let compiled = crate::decoder::CompiledEnvelope::new("t", &s.value, None).expect("compiles");
        assert_eq!(compiled.columns()[1].data_type, DataType::TimeSpan);
        // Debezium's own MicroTime (no attribute) stays a time of day.
        let debezium = s
            .value
            .replace(r#""tributary.time_span":true,"#, "")
            .replace(r#","tributary.time_span":true"#, "");
        assert!(!debezium.contains("time_span"));
        let compiled = crate::decoder::CompiledEnvelope::new("t", &debezium, None).expect("compiles");
        assert_eq!(compiled.columns()[1].data_type, DataType::Time);
        // A MySQL TIME topic registered as a time of day widens to a span.
        assert!(crate::compat::widens(&DataType::Time, &DataType::TimeSpan));
        assert!(!crate::compat::widens(&DataType::TimeSpan, &DataType::Time));
    }
}
