//! Tributary's change-event format: the table model, type mapping from each
//! source database, the Debezium-compatible Avro envelope, the Confluent wire
//! format with a schema registry, and a generic decoder for sinks.
// `SchemaError` is large (it names table, column and type), and its shape
// is shared with the other crates; errors are off the hot path, so the
// size of `Result` does not matter here.
#![allow(clippy::result_large_err)]

pub mod avro;
pub mod binary;
pub mod canonical;
pub mod compat;
pub mod decimal;
pub mod decoder;
pub mod defaults;
pub mod encoder;
pub mod error;
// The fuzz target's entry point, not the runners' (`fuzzing`).
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
pub mod hashing;
pub mod mapping;
pub mod model;
pub mod records;
pub mod registry;
pub mod temporal;
pub mod topic;
pub mod writer_schema;

pub use avro::{envelope, EnvelopeOptions, EnvelopeSchemas};
pub use decoder::{CompiledEnvelope, Decoded, EventDecoder};
pub use encoder::{EncodedRecord, EventEncoder};
pub use error::SchemaError;
pub use model::{
    ChangeEvent, Column, ColumnDefault, ConstraintKind, ConstraintObject, DataType, ForeignKeyTarget, IndexObject, Op,
    Position, Row, SequenceState, SnapshotMarker, SourceInfo, TableId, TableObjects, TableSchema, TransactionInfo,
    Value,
};
pub use registry::Registry;
pub use topic::TopicNaming;
