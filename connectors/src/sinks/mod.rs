//! Every sink connector, one line each: registering a connector is its
//! folder plus its line here (and its Cargo feature). See
//! `docs/CONNECTORS.md`.

crate::connectors! {
    /// The destination sections of a sink runner's config file (exactly one
    /// is set).
    "destination" => pub struct Sinks: dyn crate::SinkConfig {
        postgres: "sink-postgres" => postgres::PostgresSinkConfig,
        bigquery: "sink-bigquery" => bigquery::BigQuerySinkConfig,
        redshift: "sink-redshift" => redshift::RedshiftSinkConfig,
        snowflake: "sink-snowflake" => snowflake::SnowflakeSinkConfig,
        spanner: "sink-spanner" => spanner::SpannerSinkConfig,
    }
}

impl Sinks {
    /// The one configured destination, with its section name.
    pub fn one(&self) -> Result<(&'static str, &dyn crate::SinkConfig), tributary_operations::config::ConfigError> {
        crate::registry::exactly_one(
            self.configured(),
            "destination",
            Self::ALL,
            "a sink runner writes to exactly one destination",
        )
    }
}
