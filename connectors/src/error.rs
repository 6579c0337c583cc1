//! The one error type of every connector, and the one place that decides what
//! a runner does about it.
//!
//! Every error carries an [`ErrorKind`]; [`policy`] maps the kind (and how many
//! times it was already retried) to a [`Decision`]. Connectors classify, the
//! runners obey: no connector retries, pauses or dead-letters on its own.

use std::fmt;
use std::time::Duration;

use tributary_schemas::TableId;

/// How an error may be resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// A retry may succeed without anyone acting: connection refused or
    /// reset, broker unavailable, lock timeout, serialization failure,
    /// destination read-only during a failover.
    Retryable,
    /// Retries keep failing until an operator acts: permission denied, a
    /// missing publication or slot, a full disk, wrong credentials. The
    /// runner pauses, says what to do, and keeps probing so it resumes by
    /// itself once the fix lands.
    NeedsOperator,
    /// This record can never be applied as it is: a value the destination
    /// column cannot hold, a type change it cannot follow. Sinks dead-letter
    /// the record and go on; sources stop with the error (they cannot skip a
    /// change without losing it).
    Permanent,
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ErrorKind::Retryable => "retryable",
            ErrorKind::NeedsOperator => "needs-operator",
            ErrorKind::Permanent => "permanent",
        })
    }
}

/// An error from a connector, with enough context to act on it.
///
/// The message never contains row values: errors end up in logs, the status
/// API and dead-letter headers. Boxed: results of every apply and every
/// source call carry it, and an error is the rare case.
#[derive(Debug)]
pub struct Error(Box<Inner>);

#[derive(Debug)]
struct Inner {
    kind: ErrorKind,
    message: String,
    table: Option<TableId>,
    column: Option<String>,
    hint: Option<String>,
    /// The class of the underlying error (`tokio_postgres::Error`, a SQLSTATE,
    /// a Kafka error code), for dead-letter headers.
    class: Option<String>,
    source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
}

impl Error {
    /// A new error of `kind`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self(Box::new(Inner {
            kind,
            message: message.into(),
            table: None,
            column: None,
            hint: None,
            class: None,
            source: None,
        }))
    }

    /// Shorthand for [`ErrorKind::Retryable`].
    pub fn retryable(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Retryable, message)
    }

    /// Shorthand for [`ErrorKind::NeedsOperator`].
    pub fn needs_operator(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::NeedsOperator, message)
    }

    /// Shorthand for [`ErrorKind::Permanent`].
    pub fn permanent(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Permanent, message)
    }

    /// The same error with another kind: where the caller knows more than
    /// the classifier (a dead-letter producer's fence is a hand-over, not
    /// a fault).
    pub fn with_kind(mut self, kind: ErrorKind) -> Self {
        self.0.kind = kind;
        self
    }

    /// Names the table the error is about.
    pub fn with_table(mut self, table: TableId) -> Self {
        self.0.table = Some(table);
        self
    }

    /// Names the table the error is about, unless it names one already.
    pub fn or_table(mut self, table: &TableId) -> Self {
        if self.0.table.is_none() {
            self.0.table = Some(table.clone());
        }
        self
    }

    /// Puts `what` (e.g. the destination object) before the message.
    pub fn in_context(mut self, what: &str) -> Self {
        self.0.message = format!("{what}: {}", self.0.message);
        self
    }

    /// Names the column the error is about.
    pub fn with_column(mut self, column: impl Into<String>) -> Self {
        self.0.column = Some(column.into());
        self
    }

    /// What an operator should do (exact SQL where there is some).
    pub fn with_hint(mut self, hint: impl Into<String>) -> Self {
        self.0.hint = Some(hint.into());
        self
    }

    /// The class of the underlying failure, e.g. a SQLSTATE.
    pub fn with_class(mut self, class: impl Into<String>) -> Self {
        self.0.class = Some(class.into());
        self
    }

    /// Keeps the underlying error for its `Display` chain.
    pub fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.0.source = Some(Box::new(source));
        self
    }

    /// The kind.
    pub fn kind(&self) -> ErrorKind {
        self.0.kind
    }

    /// The message, without context.
    pub fn message(&self) -> &str {
        &self.0.message
    }

    /// The table, when known.
    pub fn table(&self) -> Option<&TableId> {
        self.0.table.as_ref()
    }

    /// The column, when known.
    pub fn column(&self) -> Option<&str> {
        self.0.column.as_deref()
    }

    /// The operator hint, when there is one.
    pub fn hint(&self) -> Option<&str> {
        self.0.hint.as_deref()
    }

    /// The class of the underlying failure, or the kind when there is none.
    pub fn class(&self) -> String {
        self.0.class.clone().unwrap_or_else(|| format!("tributary.{}", self.0.kind))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let e = &self.0;
        if let Some(table) = &e.table {
            write!(f, "table {table}")?;
            if let Some(column) = &e.column {
                write!(f, ", column {column}")?;
            }
            f.write_str(": ")?;
        }
        f.write_str(&e.message)?;
        if let Some(source) = &e.source {
            write!(f, ": {source}")?;
        }
        if let Some(hint) = &e.hint {
            write!(f, " (to fix: {hint})")?;
        }
        Ok(())
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source.as_deref().map(|e| e as &(dyn std::error::Error + 'static))
    }
}

impl From<tributary_schemas::SchemaError> for Error {
    fn from(err: tributary_schemas::SchemaError) -> Self {
        // A registry that cannot be reached is retryable; one that refuses
        // (4xx: auth, an incompatible schema) needs an operator. Neither is
        // a problem of the record, so neither may dead-letter it or stop a
        // source.
        if let tributary_schemas::SchemaError::Registry { retryable, .. } = &err {
            let kind = if *retryable {
                ErrorKind::Retryable
            } else {
                ErrorKind::NeedsOperator
            };
            return Error::new(kind, err.to_string()).with_class("tributary.registry").with_hint(
                "check schema_registry_url, the [schema_registry] credentials and CA, and that the registry is up \
                     and readable",
            );
        }
        // A schema change the topic cannot carry: the source pauses (it
        // cannot skip the change) until the operator lets it be registered
        // anyway (reverting the column does not remove the changes already
        // written under the new type).
        if let tributary_schemas::SchemaError::Incompatible { table, columns, .. } = &err {
            let mut e = Error::needs_operator(err.to_string())
                .with_table(table.clone())
                .with_class("tributary.schema.incompatible")
                .with_hint(
                    "set incompatible_schema_changes = \"register\" in the source runner's config and restart \
                     it, to register the change as a new version anyway; readers of the topic must then read \
                     the new type (see docs/schema-changes.md)",
                );
            if !columns.is_empty() && !columns.contains(',') {
                e = e.with_column(columns.clone());
            }
            return e;
        }
        let mut e = Error::permanent(err.to_string()).with_class("tributary.schema");
        if let Some(t) = err.table() {
            e = e.with_table(t.clone());
        }
        if let Some(c) = err.column() {
            e = e.with_column(c.to_string());
        }
        e
    }
}

/// A connector result.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What a runner does about an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Wait, then try the same work again. Nothing moves meanwhile.
    RetryAfter(Duration),
    /// Report `paused` with the reason, then probe again after the delay
    /// (slower than a plain retry); resume by itself once it succeeds.
    PauseAndProbe(Duration),
    /// Send the record to its dead-letter topic and go on (sinks), or stop
    /// and report `failed` (sources, which cannot skip a change).
    DeadLetter,
}

/// First retry delay. Short: most transient failures (a broker leader
/// election, a dropped connection) clear in well under a second.
pub const RETRY_INITIAL_DELAY: Duration = Duration::from_millis(200);
/// Longest retry delay: long outages are probed every 30 s, so a copy
/// resumes within half a minute of the fix without hammering a sick server.
pub const RETRY_MAX_DELAY: Duration = Duration::from_secs(30);
/// Probe interval while paused for an operator: often enough that a GRANT
/// is noticed in seconds, rarely enough to keep the logs readable.
pub const OPERATOR_PROBE_DELAY: Duration = Duration::from_secs(5);

/// The one place that decides retry, pause or dead-letter.
///
/// `attempt` counts the failures of the same work so far (1 for the first).
pub fn policy(kind: ErrorKind, attempt: u32) -> Decision {
    match kind {
        ErrorKind::Retryable => {
            let factor = 2u32.saturating_pow(attempt.saturating_sub(1).min(16));
            let delay = RETRY_INITIAL_DELAY.saturating_mul(factor).min(RETRY_MAX_DELAY);
            Decision::RetryAfter(delay)
        }
        ErrorKind::NeedsOperator => Decision::PauseAndProbe(OPERATOR_PROBE_DELAY),
        ErrorKind::Permanent => Decision::DeadLetter,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_outages_retry_refusals_pause_and_garbage_is_permanent() {
        use tributary_schemas::SchemaError;
        let e = Error::from(SchemaError::Registry { reason: "down".into(), retryable: true });
        assert_eq!(e.kind(), ErrorKind::Retryable);
        let e = Error::from(SchemaError::Registry { reason: "401".into(), retryable: false });
        assert_eq!(e.kind(), ErrorKind::NeedsOperator);
        let e = Error::from(SchemaError::Decode { context: "t".into(), reason: "bad".into() });
        assert_eq!(e.kind(), ErrorKind::Permanent);
    }

    #[test]
    fn retry_delay_doubles_and_is_capped() {
        assert_eq!(policy(ErrorKind::Retryable, 1), Decision::RetryAfter(RETRY_INITIAL_DELAY));
        assert_eq!(policy(ErrorKind::Retryable, 2), Decision::RetryAfter(RETRY_INITIAL_DELAY * 2));
        assert_eq!(policy(ErrorKind::Retryable, 40), Decision::RetryAfter(RETRY_MAX_DELAY));
    }

    #[test]
    fn operator_errors_pause_and_permanent_errors_dead_letter() {
        assert_eq!(policy(ErrorKind::NeedsOperator, 1), Decision::PauseAndProbe(OPERATOR_PROBE_DELAY));
        assert_eq!(policy(ErrorKind::Permanent, 1), Decision::DeadLetter);
    }

    #[test]
    fn display_names_table_column_and_fix() {
        let e = Error::needs_operator("permission denied")
            .with_table(TableId::new("public", "orders"))
            .with_column("total")
            .with_hint("GRANT SELECT ON public.orders TO cdc_user");
        assert_eq!(
            e.to_string(),
            "table public.orders, column total: permission denied (to fix: GRANT SELECT ON public.orders TO cdc_user)"
        );
    }
}
