//! The one table from PostgreSQL's SQLSTATEs to our error kinds, for the
//! source and the sink alike (and every sink on PostgreSQL's protocol).
//!
//! Codes: <https://www.postgresql.org/docs/current/errcodes-appendix.html>.

use crate::error::{Error, ErrorKind};

/// The kind of a SQLSTATE, and why.
///
/// * **Retryable**: the connection or the server is going away or busy
///   (class 08, 53200, 53300, 57P01-57P03, 58, XX), a conflict the retry
///   does not meet again (40001, 40P01, 55P03 lock timeout, 55006 object in
///   use: a slot held by a session that is ending), a cancelled statement
///   (57014), a read-only transaction during a failover (25006), and a
///   table or column that vanished under us (42P01, 42703): the retry reads
///   the catalog again (a sink re-creates its table).
/// * **Needs an operator**: privileges (42501), credentials (class 28), a
///   database, schema or object that must exist (3D000, 3F000, 42704: a
///   publication or slot), server settings (55000: `wal_level`; 53400:
///   `max_replication_slots`), a full disk (53100), any other class 42
///   (syntax or access rule: retrying changes nothing).
/// * **Permanent**: the data itself (class 22 data exceptions, class 23
///   constraint violations, 42804 datatype mismatch): a sink dead-letters
///   the record; a source stops (it cannot skip a change).
/// * Anything else needs an operator: pausing is safer than dead-lettering
///   data, or retrying in a loop, over an error nobody has seen before.
pub fn kind(code: &str) -> ErrorKind {
    match code {
        "40001" | "40P01" | "55P03" | "55006" | "57014" | "57P01" | "57P02" | "57P03" | "25006" | "53200" | "53300"
        | "42P01" | "42703" => ErrorKind::Retryable,
        c if c.starts_with("08") || c.starts_with("58") || c.starts_with("XX") => ErrorKind::Retryable,
        "42804" => ErrorKind::Permanent,
        c if c.starts_with("22") || c.starts_with("23") => ErrorKind::Permanent,
        _ => ErrorKind::NeedsOperator,
    }
}

/// A generic fix for a SQLSTATE, when there is one.
pub fn hint(code: &str) -> Option<&'static str> {
    Some(match code {
        "42501" => "grant the privilege named in the message to the role (`check` prints the GRANT)",
        c if c.starts_with("28") => "check the user and password in postgres.url (and pg_hba.conf on the server)",
        "3D000" => "check the database name in postgres.url",
        "53400" => "raise max_replication_slots / max_wal_senders in postgresql.conf and restart PostgreSQL",
        "55000" => "set wal_level = logical in postgresql.conf and restart PostgreSQL",
        "53100" => "free disk space on the PostgreSQL server",
        _ => return None,
    })
}

/// The kind of a `tokio_postgres` error that did not come from the server:
/// a refused password, a bad setting or a certificate that does not verify
/// need an operator (retrying cannot fix them); a lost or refused connection
/// is retryable. tokio-postgres does not expose its error kinds, only these
/// message prefixes.
pub fn client_error_kind(err: &tokio_postgres::Error) -> ErrorKind {
    let text = err.to_string();
    if text.starts_with("authentication")
        || text.starts_with("invalid configuration")
        || text.starts_with("error performing TLS handshake")
    {
        ErrorKind::NeedsOperator
    } else {
        ErrorKind::Retryable
    }
}

/// Classifies a `tokio_postgres` error of a source's session; `context`
/// says what was being done. The message goes through the one redaction
/// ([`redact`](super::redact)): values quoted by data errors and DETAIL
/// lines never reach it. (The sink classifies its own, with its hints.)
pub fn classify(err: tokio_postgres::Error, context: &str) -> Error {
    if let Some(db) = err.as_db_error() {
        let code = db.code().code().to_string();
        let message = super::redact::redact_message(db.message(), super::redact::is_data_error(&code));
        let mut e = Error::new(kind(&code), format!("{context}: {message}")).with_class(format!("sqlstate.{code}"));
        if let Some(h) = hint(&code) {
            e = e.with_hint(h);
        }
        return e;
    }
    let text = super::redact::redacted(&err);
    Error::new(client_error_kind(&err), format!("{context}: {text}")).with_class("tokio_postgres")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_table_for_both_sides() {
        assert_eq!(kind("42501"), ErrorKind::NeedsOperator);
        assert_eq!(kind("55006"), ErrorKind::Retryable);
        assert_eq!(kind("08006"), ErrorKind::Retryable);
        assert_eq!(kind("22P02"), ErrorKind::Permanent);
        assert_eq!(kind("23505"), ErrorKind::Permanent);
        assert_eq!(kind("42804"), ErrorKind::Permanent);
        assert_eq!(kind("42704"), ErrorKind::NeedsOperator);
        // Vanished objects are read again on the retry, on both sides.
        assert_eq!(kind("42P01"), ErrorKind::Retryable);
        assert_eq!(kind("42703"), ErrorKind::Retryable);
        assert_eq!(kind("42601"), ErrorKind::NeedsOperator);
        assert_eq!(kind("3F000"), ErrorKind::NeedsOperator);
        assert_eq!(kind("XX000"), ErrorKind::Retryable);
        // Never seen before: pause, never dead-letter, never loop fast.
        assert_eq!(kind("ZZ999"), ErrorKind::NeedsOperator);
        assert!(hint("28P01").is_some_and(|h| h.contains("password")));
    }
}
