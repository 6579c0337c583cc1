//! Tributary's connectors: the [`Source`] and [`Sink`] traits, the error kinds
//! and their policy, the warehouse-sink core ([`sink`]), the reference
//! connectors in memory, and one folder per connector with the same files
//! ([`sources`], [`sinks`]; `docs/CONNECTORS.md`), each behind its Cargo
//! feature.

pub mod error;
pub mod kafka;
pub mod problem;
#[macro_use]
pub mod registry;
pub mod selection;
pub mod sink;
pub mod sinks;
pub mod source;
pub mod sources;
pub mod tls;

// Entry points for the fuzz targets and the decoder test, not the runners.
#[cfg(all(
    any(test, feature = "fuzzing"),
    any(feature = "source-postgres", feature = "source-mysql")
))]
pub mod fuzzing;

#[cfg(feature = "pgwire")]
pub mod pgwire;

pub use error::{policy, Decision, Error, ErrorKind, Result};
pub use problem::{Problem, Severity};
pub use sink::{ApplyError, KafkaPosition, Labeler, Sink, SinkBatch, SinkConfig, SinkRecord, UnitPart};
pub use source::{
    copy_for_key_change, keyless_shape, Checkpoint, CopyHold, CopyHolds, SnapshotTableProgress, Source, SourceBatch,
    SourceConfig, SourceMessage, TransactionEnd,
};

/// Milliseconds since the Unix epoch, for events' processing time (`ts_ms`)
/// in the sources. Public: a build without sources (a sink runner) has no
/// caller of it, and it is not dead code for that.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
