//! The stack's MariaDB for the source tests: a database of their own.

use mysql_async::prelude::Queryable;
use tributary_connectors::sources::mysql::config::MySqlSourceConfig;
use tributary_schemas::TableId;

use crate::{mysql_url, unique};

/// An admin session (`MYSQL_URL`).
pub async fn admin() -> mysql_async::Conn {
    mysql_async::Conn::from_url(mysql_url())
        .await
        .expect("connect to MYSQL_URL (is the stack up?)")
}

/// A database of its own, dropped at the end.
pub struct Database {
    /// The database.
    pub db: String,
    /// A session using it.
    pub conn: mysql_async::Conn,
}

impl Database {
    /// A fresh database for the test `prefix`.
    pub async fn new(prefix: &str) -> Self {
        let db = unique(prefix);
        let mut conn = admin().await;
        conn.query_drop(format!("CREATE DATABASE `{db}`"))
            .await
            .expect("create database");
        conn.query_drop(format!("USE `{db}`")).await.expect("use database");
        conn.query_drop("SET time_zone = '+00:00'").await.expect("time zone");
        Self { db, conn }
    }

    /// Runs `sql`.
    pub async fn sql(&mut self, sql: &str) {
        self.conn.query_drop(sql).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    /// A source config over the database (small chunks, short heartbeats,
    /// a replica id of its own).
    pub fn config(&self) -> MySqlSourceConfig {
        let base = mysql_url();
        let url = match base.rfind('/') {
            Some(i) => format!("{}/{}", &base[..i], self.db),
            None => base,
        };
        let mut c = MySqlSourceConfig::with_url(url);
        c.heartbeat_interval_ms = 500;
        c.batch_linger_ms = 20;
        c.snapshot_chunk_rows = 100;
        // A replica id of its own: MariaDB drops the older of two binlog
        // connections with the same server_id, so tests running in
        // parallel with the default id cut each other's streams (seen as
        // ERROR 1236 mid-test).
        c.server_id = 20_000 + (uuid::Uuid::new_v4().as_u128() % 1_000_000) as u32;
        c
    }

    /// The table `name` of the database.
    pub fn table(&self, name: &str) -> TableId {
        TableId::new(self.db.clone(), name)
    }

    /// Drops the database.
    pub async fn drop(mut self) {
        self.sql(&format!("DROP DATABASE IF EXISTS `{}`", self.db)).await;
        let _ = self.conn.disconnect().await;
    }
}
