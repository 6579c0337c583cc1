//! `source-runner reset [--table schema.table]...`.

use std::process::ExitCode;

use tributary_connectors::Error;
use tributary_schemas::TableId;

use crate::config::SourceRunnerConfig;
use crate::writer::TopicWriter;

/// Records a reset of those tables (or of every table) in the offsets
/// topic; the runner carries it out at its next start (a running one is
/// fenced and starts again at once): each table is copied again, and the
/// destination rows the new copy does not see are removed (see
/// docs/operations.md, Reset).
pub async fn reset(config: SourceRunnerConfig, tables: Vec<String>) -> ExitCode {
    let mut ids = Vec::new();
    for t in &tables {
        match t.split_once('.') {
            Some((schema, table)) if !schema.is_empty() && !table.is_empty() => ids.push(TableId::new(schema, table)),
            _ => {
                eprintln!("error: --table {t}: expected schema.table (a MySQL table: database.table)");
                return ExitCode::from(2);
            }
        }
    }
    match record_reset(&config, &ids).await {
        Ok(reset) => {
            let what = if ids.is_empty() {
                "every table".to_string()
            } else {
                tables.join(", ")
            };
            println!(
                "reset {reset} of {what} recorded for runner {name:?}: at its next start (a running runner stops \
                 its current transaction and starts again by itself) each table is copied again, and the rows of \
                 the destination the new copy does not see are removed",
                name = config.name
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            if let Some(h) = e.hint() {
                eprintln!("hint: {h}");
            }
            ExitCode::FAILURE
        }
    }
}

/// Records a reset of `tables` (all with none) in the copy's offsets topic,
/// returning its id; a running runner is fenced by it and starts again to
/// carry it out.
pub async fn record_reset(config: &SourceRunnerConfig, tables: &[TableId]) -> Result<u64, Error> {
    let mut writer = TopicWriter::connect(config).await?;
    writer.restore().await?;
    writer.record_reset(tables).await
}
