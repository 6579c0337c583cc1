//! Every record one runner writes and another reads, besides the change
//! events themselves: one enum per place, each kind one variant, its
//! encoding and decoding side by side, and golden bytes in the tests.
//!
//! * [`control`]: control records on change topics (a null key and value,
//!   the meaning in headers), written by the source runner, read by sinks
//!   in order with the changes around them.
//! * [`offsets`]: the records of a source runner's offsets topic (its
//!   checkpoint, its held tables, a reset of every table, the source's side
//!   records), written in the same Kafka transaction as the events they
//!   cover, read at the next start and by `source-runner reset`.
//! * [`requests`]: what a sink runner asks its copy's source runner (a
//!   repair of rows a verification found different).
//! * [`transaction`]: the copy's transaction topic (Debezium's BEGIN and
//!   END records), written by the source runner with the changes.
//!
//! Neither module knows Kafka's client types: a record is text headers or
//! a key and value of bytes, which the runners hand to rdkafka.

pub mod control;
pub mod offsets;
pub mod requests;
pub mod transaction;

pub use control::{ControlRecord, RangePartition, RangeSummary, VerifyRange};
pub use offsets::{CopyProgress, Held, HeldTable, OffsetsKey, OffsetsRecord};

/// A record that cannot be read. Never contains row values (none of these
/// records holds any).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// Its bytes do not say what its kind needs.
    #[error("{what} is unreadable: {reason}")]
    Unreadable {
        /// Which record (its kind and key or table).
        what: String,
        /// Why.
        reason: String,
    },
    /// A control record of a kind this build does not know: a newer
    /// runner's.
    #[error(
        "a control record of {table} has the kind {kind:?}, which this runner does not know (a newer source runner's?)"
    )]
    UnknownKind {
        /// The table it names.
        table: crate::TableId,
        /// Its kind.
        kind: String,
    },
}

impl RecordError {
    fn unreadable(what: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::Unreadable { what: what.into(), reason: reason.into() }
    }
}

/// The value of the last header named `name`, as text (Kafka keeps every
/// header of a record, in order; a later one wins).
pub fn header<'a>(headers: &'a [(String, Option<Vec<u8>>)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .rev()
        .find(|(k, _)| k == name)
        .and_then(|(_, v)| v.as_deref())
        .and_then(|v| std::str::from_utf8(v).ok())
}
