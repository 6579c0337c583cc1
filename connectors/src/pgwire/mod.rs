//! What PostgreSQL's source and sink share: connections (plain or TLS),
//! the one SQLSTATE table, quoting, and the binary `COPY` format's types.

pub mod redact;
pub mod sqlstate;
pub mod summary;
pub mod tls;
pub mod values;

use tracing::Instrument;
use tributary_schemas::TableId;

use self::tls::TlsMode;
use crate::error::Result;

/// Opens a session with `tls`: the connection task runs in the background
/// and reports why it ended through `closed` (never with statement text).
/// The outer error is a TLS setup problem (a CA file that cannot be read);
/// the inner one PostgreSQL's or the network's, for the caller to classify.
pub async fn connect(
    pg: &tokio_postgres::Config,
    tls: TlsMode,
    tls_ca_file: Option<&str>,
    closed: fn(&tokio_postgres::Error),
) -> Result<std::result::Result<tokio_postgres::Client, tokio_postgres::Error>> {
    fn spawn<S, T>(connection: tokio_postgres::Connection<S, T>, closed: fn(&tokio_postgres::Error))
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
        T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        tokio::spawn(
            async move {
                if let Err(e) = connection.await {
                    closed(&e);
                }
            }
            .instrument(tracing::info_span!("postgres_connection")),
        );
    }
    if tls == TlsMode::Disable {
        return Ok(pg.connect(tokio_postgres::NoTls).await.map(|(client, connection)| {
            spawn(connection, closed);
            client
        }));
    }
    let mut pg = pg.clone();
    pg.ssl_mode(tokio_postgres::config::SslMode::Require);
    let connector = tokio_postgres_rustls::MakeRustlsConnect::new(tls::client_config(tls, tls_ca_file)?);
    Ok(pg.connect(connector).await.map(|(client, connection)| {
        spawn(connection, closed);
        client
    }))
}

/// Quotes an identifier for SQL text.
pub fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Quotes a string literal (both sides pin `standard_conforming_strings` on).
pub fn quote_literal(value: &str) -> String {
    format!("'{}'", value.replace('\'', "''"))
}

/// `"schema"."table"`.
pub fn quote_table(table: &TableId) -> String {
    format!("{}.{}", quote_ident(&table.schema), quote_ident(&table.table))
}

// ---------------------------------------------------------------- binary COPY

/// A type of PostgreSQL's binary `COPY` format that the source's snapshot
/// reads and the sink writes.
/// Binary spares PostgreSQL the types' text output or input functions and
/// the runners the text conversion. Each reader gives exactly the [`Value`]
/// that its text form gives; a table is read or written in binary only
/// when every column has a reader or writer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinaryType {
    /// `boolean`.
    Bool,
    /// `smallint`.
    Int2,
    /// `integer`.
    Int4,
    /// `bigint`.
    Int8,
    /// `real`.
    Float4,
    /// `double precision`.
    Float8,
    /// `numeric`, as the canonical text `numeric_out` prints.
    Numeric,
    /// `text`, `varchar`, `char`: the text itself.
    Text,
    /// `json`: the text itself.
    Json,
    /// `jsonb`: a version byte, then the text.
    Jsonb,
    /// `bytea`.
    Bytea,
    /// `uuid`.
    Uuid,
    /// `date`.
    Date,
    /// `time`.
    Time,
    /// `timestamp`.
    Timestamp,
    /// `timestamptz`.
    TimestampTz,
}

/// The signature that starts a binary `COPY` stream; flags (32 bits) and
/// the length of a header extension (32 bits) follow it.
pub const BINARY_COPY_SIGNATURE: &[u8] = b"PGCOPY\n\xff\r\n\0";
/// Days from 1970-01-01 to PostgreSQL's epoch, 2000-01-01.
pub const PG_EPOCH_DAYS: i32 = 10_957;
/// Microseconds from 1970-01-01 to 2000-01-01.
pub const PG_EPOCH_MICROS: i64 = 946_684_800_000_000;

impl BinaryType {
    /// The binary type of a type's `format_type` spelling without modifiers
    /// (`numeric`, `character varying`, `timestamp with time zone`); `None`
    /// for the types read and written as text.
    pub fn from_base(base: &str) -> Option<Self> {
        Some(match base {
            "boolean" => Self::Bool,
            "smallint" => Self::Int2,
            "integer" => Self::Int4,
            "bigint" => Self::Int8,
            "real" => Self::Float4,
            "double precision" => Self::Float8,
            "numeric" => Self::Numeric,
            // Their binary input applies the length modifier as text input does.
            "text" | "character varying" | "character" => Self::Text,
            "json" => Self::Json,
            "jsonb" => Self::Jsonb,
            "bytea" => Self::Bytea,
            "uuid" => Self::Uuid,
            "date" => Self::Date,
            "time without time zone" => Self::Time,
            "timestamp without time zone" => Self::Timestamp,
            "timestamp with time zone" => Self::TimestampTz,
            _ => return None,
        })
    }
}
