//! The BigQuery destination: [`sink::BigQuerySink`] applies change events
//! with one staged `MERGE` per table and batch, in a multi-statement
//! transaction that also stores the Kafka offsets.
//!
//! Talks to BigQuery's REST API through `gcp-bigquery-client`
//! (`jobs.query` for DDL, DML and scripts; `tabledata.insertAll` for
//! staging; `tables.get` for metadata). The same code runs against a real
//! project (service-account key file or application default credentials)
//! and against an emulator (`emulator_url`, no credentials). The Storage
//! Write API's CDC mode (`_CHANGE_TYPE`) is not provided: see
//! `docs/destinations/bigquery.md`.

pub mod check;
pub mod config;
pub mod sink;
pub mod types;

pub use config::{BigQuerySinkConfig, DestinationTable};
pub use sink::BigQuerySink;
