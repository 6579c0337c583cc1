//! `sink-runner objects`: the source's indexes, constraints and defaults
//! recorded for a PostgreSQL destination's tables, each with its state;
//! with `--make-waiting`, makes those that wait for a cutover
//! (docs/migration.md).

use tributary_connectors::sinks::postgres::objects::Outcome;
use tributary_connectors::sinks::postgres::PostgresSink;

use crate::config::SinkRunnerConfig;
use crate::RunError;

/// Every recorded object and its state, after making the waiting ones
/// when `make_waiting`.
pub async fn objects(config: &SinkRunnerConfig, make_waiting: bool) -> Result<Vec<Outcome>, RunError> {
    let Some(pg) = config.destination.postgres.clone() else {
        return Err(RunError::Other(
            "only a PostgreSQL destination ([postgres]) recreates the source's indexes, constraints and defaults"
                .into(),
        ));
    };
    let mut pg = pg;
    pg.consumer_group = Some(config.consumer_group.clone());
    let mut sink = PostgresSink::new(pg).map_err(|e| RunError::Other(e.to_string()))?;
    let out = if make_waiting {
        sink.make_waiting_objects().await
    } else {
        sink.objects().await
    };
    out.map_err(|e| RunError::Other(format!("destination: {e}")))
}
