//! One redaction for every PostgreSQL error that reaches an [`Error`]
//! message or a log line, on the source and the sink alike: row values
//! never leave the database that way (docs/operations.md, Errors).
//!
//! PostgreSQL quotes values in two places: the primary message of a data
//! error (`invalid input syntax for type integer: "abc"`), and the DETAIL
//! field (`Key (id)=(5) already exists.`, `Failing row contains (...)`),
//! which the `Display` of the driver's `DbError` (the error's source)
//! appends. Only the primary message is kept, with quoted text and a
//! trailing `: value` cut from data errors; DETAIL and HINT are never shown.
//!
//! [`Error`]: crate::error::Error

use std::fmt::Write as _;

/// Whether a SQLSTATE is about the data itself (class 22 data exceptions,
/// class 23 constraint violations, 42804 datatype mismatch): its message
/// may quote a value.
pub fn is_data_error(code: &str) -> bool {
    code.starts_with("22") || code.starts_with("23") || code == "42804"
}

/// PostgreSQL's message, with quoted text (which may be a row value)
/// replaced for data errors.
pub fn redact_message(message: &str, data_error: bool) -> String {
    // Only the first line: a server message never needs more, and a DETAIL
    // pasted after it would carry values.
    let message = message.lines().next().unwrap_or("");
    if !data_error {
        return message.to_string();
    }
    let mut out = String::with_capacity(message.len());
    let mut in_quote = false;
    for ch in message.chars() {
        if ch == '"' {
            if in_quote {
                out.push_str("…\"");
            } else {
                out.push('"');
            }
            in_quote = !in_quote;
        } else if !in_quote {
            out.push(ch);
        }
    }
    // `value too long for type character varying(3)` keeps its type; an
    // unquoted trailing `: <value>` is cut.
    if let Some(i) = out.find(": ") {
        out.truncate(i);
    }
    out
}

/// The primary message of a server error reported as text (`<message>
/// (SQLSTATE <code>)`, as pgwire-replication formats it), redacted.
pub fn redact_server_text(text: &str) -> String {
    let first = text.lines().next().unwrap_or("");
    match first.rsplit_once(" (SQLSTATE ") {
        Some((message, code)) => {
            let code = code.trim_end_matches(')');
            format!("{} (SQLSTATE {code})", redact_message(message, is_data_error(code)))
        }
        None => first.to_string(),
    }
}

/// A tokio-postgres error without anything a server might echo of our
/// data: for a server error its redacted primary message and SQLSTATE (never
/// DETAIL, which the `DbError`'s `Display` adds); otherwise the client's
/// own chain.
pub fn redacted(err: &tokio_postgres::Error) -> String {
    match err.as_db_error() {
        Some(db) => {
            let code = db.code().code();
            format!("{} (SQLSTATE {code})", redact_message(db.message(), is_data_error(code)))
        }
        None => {
            let mut s = err.to_string();
            let mut source = std::error::Error::source(err);
            while let Some(inner) = source {
                let _ = write!(s, ": {inner}");
                source = inner.source();
            }
            s
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Messages as PostgreSQL 15 words them.
    #[test]
    fn redacts_values_from_data_errors() {
        assert_eq!(
            redact_message("invalid input syntax for type integer: \"secret-42\"", true),
            "invalid input syntax for type integer"
        );
        assert_eq!(
            redact_message("new row for relation \"t\" violates check constraint \"c\"", true),
            "new row for relation \"…\" violates check constraint \"…\""
        );
        assert_eq!(
            redact_message(
                "duplicate key value violates unique constraint \"t_pkey\"\nDETAIL: Key (id)=(5) already exists.",
                true
            ),
            "duplicate key value violates unique constraint \"…\""
        );
        assert_eq!(
            redact_message("date/time field value out of range: \"2024-13-45\"", true),
            "date/time field value out of range"
        );
        assert_eq!(
            redact_message("invalid input value for enum mood: \"secret\"", true),
            "invalid input value for enum mood"
        );
        assert_eq!(
            redact_message("value too long for type character varying(3)", true),
            "value too long for type character varying(3)"
        );
        // Names in other errors help the operator and are kept.
        assert_eq!(redact_message("relation \"s.t\" does not exist", false), "relation \"s.t\" does not exist");
        assert_eq!(
            redact_server_text("invalid input syntax for type bigint: \"12abc\" (SQLSTATE 22P02)"),
            "invalid input syntax for type bigint (SQLSTATE 22P02)"
        );
        assert_eq!(
            redact_server_text("replication slot \"s\" does not exist (SQLSTATE 42704)"),
            "replication slot \"s\" does not exist (SQLSTATE 42704)"
        );
    }
}
