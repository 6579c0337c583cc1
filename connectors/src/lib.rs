//! Tributary's connectors: the [`Source`] and [`Sink`] traits, the error kinds
//! and their policy, and one module per system, each with the same files.
#![deny(missing_docs)]

pub mod error;
pub mod problem;
pub mod selection;
pub mod sink;
pub mod source;

#[cfg(feature = "bigquery")]
pub mod bigquery;
#[cfg(feature = "mysql")]
pub mod mysql;
#[cfg(feature = "postgres")]
pub mod postgres;

pub use error::{policy, Decision, Error, ErrorKind, Result};
pub use sink::{ApplyError, CheckProblem, KafkaPosition, Sink, SinkBatch, SinkRecord};
pub use source::{Checkpoint, SnapshotTableProgress, Source, SourceBatch, SourceMessage};
