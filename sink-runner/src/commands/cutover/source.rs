//! The source database's side of a cutover: its tables, how it is made
//! read-only, and its sequences. PostgreSQL and MySQL / MariaDB.

use tributary_connectors::pgwire::quote_ident;
use tributary_connectors::sources::mysql::client as my;
use tributary_connectors::sources::mysql::config::MySqlSourceConfig;
use tributary_connectors::sources::postgres::client::Catalog;
use tributary_connectors::sources::postgres::config::PostgresSourceConfig;
use tributary_connectors::SourceConfig as _;
use tributary_schemas::{SequenceState, TableId};

/// A session on the source database.
pub enum SourceDb {
    /// PostgreSQL: the read-only switch is the database's.
    Postgres {
        /// The catalog session.
        catalog: Box<Catalog>,
        /// The database.
        database: String,
    },
    /// MySQL or MariaDB: the read-only switch is the server's.
    MySql {
        /// The session.
        conn: mysql_async::Conn,
        /// The database.
        database: String,
    },
}

impl SourceDb {
    /// Connects as the source runner's config says, with the tables it
    /// captures.
    pub async fn open(
        postgres: Option<&PostgresSourceConfig>,
        mysql: Option<&MySqlSourceConfig>,
    ) -> Result<(Self, Vec<TableId>), String> {
        if let Some(source) = postgres {
            source.validate_at("postgres").map_err(|e| e.to_string())?;
            let params = source.connection().map_err(|e| e.to_string())?;
            let catalog = Catalog::connect(&params).await.map_err(|e| format!("source: {e}"))?;
            let tables = catalog
                .list_tables(&source.filter())
                .await
                .map_err(|e| format!("source: {e}"))?
                .into_iter()
                .map(|(_, t)| t)
                .collect();
            return Ok((
                SourceDb::Postgres {
                    catalog: Box::new(catalog),
                    database: params.database.clone(),
                },
                tables,
            ));
        }
        if let Some(source) = mysql {
            source.validate_at("mysql").map_err(|e| e.to_string())?;
            let params = source.connection().map_err(|e| e.to_string())?;
            let mut conn = my::connect(&params).await.map_err(|e| format!("source: {e}"))?;
            let tables = my::list_tables(&mut conn, &source.filter(&params.database))
                .await
                .map_err(|e| format!("source: {e}"))?;
            return Ok((SourceDb::MySql { conn, database: params.database.clone() }, tables));
        }
        Err("the source runner's config has no [postgres] or [mysql] section".into())
    }

    /// The SQL that makes it read-only, as the report shows it.
    pub fn read_only_sql(&self) -> String {
        match self {
            SourceDb::Postgres { database, .. } => format!(
                "ALTER DATABASE {} SET default_transaction_read_only = on; \
                 SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() \
                 AND pid <> pg_backend_pid() AND backend_type = 'client backend' AND application_name NOT LIKE 'tributary%'",
                quote_ident(database)
            ),
            SourceDb::MySql { database, .. } => my::read_only_sql(database),
        }
    }

    /// The SQL that makes it writable again.
    pub fn undo_sql(&self) -> String {
        match self {
            SourceDb::Postgres { database, .. } => {
                format!("ALTER DATABASE {} RESET default_transaction_read_only", quote_ident(database))
            }
            SourceDb::MySql { .. } => my::UNDO_READ_ONLY_SQL.to_string(),
        }
    }

    /// Makes it read-only and ends the application's sessions.
    pub async fn make_read_only(&mut self) -> Result<(), String> {
        let sql = self.read_only_sql();
        match self {
            SourceDb::Postgres { catalog, .. } => catalog.client().batch_execute(&sql).await.map_err(|e| e.to_string()),
            SourceDb::MySql { conn, database } => my::make_read_only(conn, database)
                .await
                .map(|ended| tracing::info!(sessions = ended, "ended the application's sessions"))
                .map_err(|e| e.to_string()),
        }
    }

    /// The sequences of `tables` a destination moves past (PostgreSQL's
    /// readable ones; MySQL's `AUTO_INCREMENT` counters).
    pub async fn sequences(&mut self, tables: &[TableId]) -> Result<Vec<SequenceState>, String> {
        match self {
            SourceDb::Postgres { catalog, .. } => Ok(catalog
                .sequences(tables)
                .await
                .map_err(|e| e.to_string())?
                .into_iter()
                .filter(|(_, _, readable)| *readable)
                .map(|(_, s, _)| s)
                .collect()),
            SourceDb::MySql { conn, .. } => my::auto_increment_sequences(conn, tables).await.map_err(|e| e.to_string()),
        }
    }
}
