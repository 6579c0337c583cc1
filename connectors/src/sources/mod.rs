//! Every source connector, one line each: registering a connector is its
//! folder plus its line here (and its Cargo feature). See
//! `docs/CONNECTORS.md`.

crate::connectors! {
    /// The source sections of a source runner's config file (exactly one is
    /// set).
    "source" => pub struct Sources: dyn crate::SourceConfig {
        postgres: "source-postgres" => postgres::PostgresSourceConfig,
        mysql: "source-mysql" => mysql::MySqlSourceConfig,
        sqlserver: "source-sqlserver" => sqlserver::SqlServerSourceConfig,
        oracle: "source-oracle" => oracle::OracleSourceConfig,
    }
}

impl Sources {
    /// The one configured source, with its section name.
    pub fn one(&self) -> Result<(&'static str, &dyn crate::SourceConfig), tributary_operations::config::ConfigError> {
        crate::registry::exactly_one(
            self.configured(),
            "source",
            Self::ALL,
            "a runner reads one source: run a second runner for the other",
        )
    }
}
