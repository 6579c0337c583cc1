//! `sink-runner check` for BigQuery: credentials, the right to run jobs, and
//! the bookkeeping table, each problem with its fix. Changes nothing.

use super::dialect::quote_string;
use super::BigQuerySink;
use crate::error::ErrorKind;
use crate::problem::Problem;
use crate::sink::bookkeeping::OFFSETS_TABLE;

/// What the sink's principal needs, for the fixes.
const ROLES_HINT: &str = "grant the sink's principal roles/bigquery.jobUser on the project and \
     roles/bigquery.dataEditor on the destination and bookkeeping datasets \
     (or roles/bigquery.dataOwner on the project to let it create datasets)";

/// Runs the checks of [`BigQuerySink::check`].
pub(super) async fn run(sink: &mut BigQuerySink) -> Vec<Problem> {
    let mut problems = Vec::new();
    // Runs a job: needs credentials and bigquery.jobs.create.
    if let Err(e) = sink.probe_query("SELECT 1").await {
        problems.push(Problem::error(
            format!("cannot run a query in project {}: {}", sink.config().project, e),
            Some(match e.kind() {
                ErrorKind::NeedsOperator => e.hint().unwrap_or(ROLES_HINT).to_string(),
                _ => "check the network path to BigQuery (or bigquery.emulator_url) and try again".to_string(),
            }),
        ));
        return problems;
    }
    // Reads the offsets table when it exists: needs bigquery.tables.getData.
    let config = sink.config().clone();
    let sql = format!(
        "SELECT COUNT(*) FROM `{}.{}.{OFFSETS_TABLE}` WHERE consumer_group = {}",
        config.project,
        config.bookkeeping_dataset,
        quote_string(config.consumer_group.as_deref().unwrap_or(""))
    );
    match sink.probe_query(&sql).await {
        Ok(_) => {}
        Err(e) if e.class() == "bigquery.notFound" => {
            // Created on first use; that needs the right to create it.
        }
        Err(e) => problems.push(Problem::error(
            format!("cannot read the offsets table {}.{OFFSETS_TABLE}: {e}", config.bookkeeping_dataset),
            Some(ROLES_HINT.to_string()),
        )),
    }
    problems
}
