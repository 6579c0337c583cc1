//! `sink-runner check` for Spanner: credentials, the database, and the
//! offsets table, each problem with its fix. Changes nothing.

use super::client::ROLES_HINT;
use super::dialect::{quote_ident, quote_string};
use super::SpannerSink;
use crate::error::ErrorKind;
use crate::problem::Problem;
use crate::sink::bookkeeping::OFFSETS_TABLE;

/// Runs the checks of [`SpannerSink::check`].
pub(super) async fn run(sink: &mut SpannerSink) -> Vec<Problem> {
    let mut problems = Vec::new();
    let database = sink.config().database_path();
    if let Err(e) = sink.probe_query("SELECT 1").await {
        let fix = match e.kind() {
            ErrorKind::NeedsOperator => e.hint().unwrap_or(ROLES_HINT).to_string(),
            _ => "check the network path to Spanner (or spanner.emulator_host) and try again".to_string(),
        };
        problems.push(Problem::error(format!("cannot query Spanner database {database}: {e}"), Some(fix)));
        return problems;
    }
    let config = sink.config().clone();
    let offsets = config.bookkeeping(OFFSETS_TABLE);
    let exists = format!(
        "SELECT TABLE_NAME FROM INFORMATION_SCHEMA.TABLES WHERE TABLE_SCHEMA = '' AND TABLE_NAME = {}",
        quote_string(&offsets)
    );
    match sink.probe_query(&exists).await {
        // Created on first use; that needs the right to change the schema.
        Ok(0) => {}
        Ok(_) => {
            let sql = format!(
                "SELECT COUNT(*) FROM {} WHERE consumer_group = {}",
                quote_ident(&offsets),
                quote_string(config.consumer_group.as_deref().unwrap_or(""))
            );
            if let Err(e) = sink.probe_query(&sql).await {
                problems.push(Problem::error(
                    format!("cannot read the offsets table {offsets}: {e}"),
                    Some(ROLES_HINT.to_string()),
                ));
            }
        }
        Err(e) => problems
            .push(Problem::error(format!("cannot read the schema of {database}: {e}"), Some(ROLES_HINT.to_string()))),
    }
    problems
}
