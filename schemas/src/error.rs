//! Errors of the event format: always naming the table, the column and the
//! type, never the value.

use crate::model::TableId;

/// A value, schema or record that does not fit the event format.
#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    /// A value does not fit its column's type.
    #[error("table {table}, column {column}: a {value_kind} value does not fit type {data_type}: {reason}")]
    Value {
        /// Table.
        table: TableId,
        /// Column.
        column: String,
        /// Kind of the value (never the value itself).
        value_kind: &'static str,
        /// The column's logical type.
        data_type: String,
        /// Why.
        reason: String,
    },
    /// A source type the mapping does not know.
    #[error("table {table}, column {column}: unsupported source type {source_type}")]
    UnsupportedType {
        /// Table.
        table: TableId,
        /// Column.
        column: String,
        /// The source's type name.
        source_type: String,
    },
    /// A new schema version the registry's compatibility rule would reject.
    #[error("table {table}: incompatible schema change of column(s) {columns}: {reason}")]
    Incompatible {
        /// Table.
        table: TableId,
        /// The offending columns, comma-separated.
        columns: String,
        /// Why.
        reason: String,
    },
    /// A record whose bytes or schema cannot be decoded.
    #[error("{context}: cannot decode record: {reason}")]
    Decode {
        /// Topic or table.
        context: String,
        /// Why.
        reason: String,
    },
    /// The schema registry failed or refused.
    #[error("schema registry: {reason}")]
    Registry {
        /// Why.
        reason: String,
        /// Whether trying again may help (network, 5xx) or not (4xx).
        retryable: bool,
    },
}

impl SchemaError {
    /// The table the error is about, when known.
    pub fn table(&self) -> Option<&TableId> {
        match self {
            SchemaError::Value { table, .. }
            | SchemaError::UnsupportedType { table, .. }
            | SchemaError::Incompatible { table, .. } => Some(table),
            _ => None,
        }
    }

    /// The column the error is about, when known.
    pub fn column(&self) -> Option<&str> {
        match self {
            SchemaError::Value { column, .. } | SchemaError::UnsupportedType { column, .. } => Some(column),
            _ => None,
        }
    }
}
