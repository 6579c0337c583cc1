//! What both runners share: loading and validating config files, Kafka client
//! settings, logging, status and metrics, and the admin server.

pub mod admin;
pub mod config;
pub mod kafka;
pub mod logging;
pub mod memory;
pub mod pauses;
pub mod process;
pub mod registry;
pub mod telemetry;
