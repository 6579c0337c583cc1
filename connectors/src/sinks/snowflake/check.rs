//! `sink-runner check` for Snowflake: the login, a warehouse to run
//! statements, and the bookkeeping schema and offsets table, each problem
//! with its fix. Creates the bookkeeping schema and tables if it may (as
//! the first batch would), nothing else.

use super::dialect::quote_string;
use super::SnowflakeSink;
use crate::error::ErrorKind;
use crate::problem::Problem;
use crate::sink::bookkeeping::OFFSETS_TABLE;

/// What the sink's role needs, for the fixes.
const GRANTS_HINT: &str = "grant the sink's role USAGE on the warehouse and database, CREATE SCHEMA on the \
     database (or ownership of the destination and bookkeeping schemas): see docs/destinations/snowflake.md";

/// Runs the checks of [`SnowflakeSink::check`].
pub(super) async fn run(sink: &mut SnowflakeSink) -> Vec<Problem> {
    let mut problems = Vec::new();
    if let Err(e) = sink.probe_query("SELECT 1").await {
        let fix = match e.kind() {
            ErrorKind::NeedsOperator => e.hint().unwrap_or(GRANTS_HINT).to_string(),
            _ => "check the network path to snowflake.url and try again".to_string(),
        };
        problems.push(Problem::error(format!("cannot run a statement in Snowflake: {e}"), Some(fix)));
        return problems;
    }
    let config = sink.config().clone();
    let sql = format!(
        "SELECT COUNT(*) FROM {}.{}.{} WHERE consumer_group = {}",
        super::dialect::quote_ident(&config.database),
        super::dialect::quote_ident(&config.bookkeeping_schema),
        super::dialect::quote_ident(OFFSETS_TABLE),
        quote_string(config.consumer_group.as_deref().unwrap_or(""))
    );
    if let Err(e) = sink.probe_query(&sql).await {
        problems.push(Problem::error(
            format!("cannot read the offsets table {}.{OFFSETS_TABLE}: {e}", config.bookkeeping_schema),
            Some(GRANTS_HINT.to_string()),
        ));
    }
    problems
}
