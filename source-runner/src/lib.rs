//! The source runner: one process per source database. Consistent snapshot,
//! then streaming, into per-table Kafka topics, exactly once.
#![deny(missing_docs)]

pub mod config;
pub mod runner;

use std::process::ExitCode;

use config::SourceRunnerConfig;
use tributary_connectors::Error;
use tributary_operations::pauses::PauseStore;

/// Builds the configured source and runs it until Ctrl-C or SIGTERM.
pub async fn run_from_config(config: SourceRunnerConfig) -> Result<(), Error> {
    let source = build_source(&config)?;
    let queue = u64::from(config.producer_queue_kbytes) * 1024;
    if let Some((held, settings)) = config.source_config().ok().and_then(|c| c.memory_budget()) {
        // The producer queue, plus what the source holds while it is produced.
        tributary_operations::memory::report_budget(queue + held, &format!("producer_queue_kbytes, {settings}"));
    }
    let telemetry = tributary_operations::telemetry::Telemetry::new(&config.name, "source");
    let control = tributary_operations::admin::Control::new();
    tributary_operations::admin::serve(&config.admin, telemetry.clone(), control.clone())
        .await
        .map_err(|e| Error::needs_operator(format!("cannot start the admin server on {}: {e}", config.admin.listen)))?;
    let kafka = config.kafka.client_config().map_err(|e| Error::needs_operator(e.to_string()))?;
    let store = PauseStore::of_source(kafka, &config.name);
    tributary_operations::pauses::attach_at_start(store, &control, &telemetry).await;
    runner::run(config, source, telemetry, control, tributary_operations::process::shutdown_signal()).await
}

/// The source named by the config.
pub fn build_source(config: &SourceRunnerConfig) -> Result<Box<dyn tributary_connectors::Source>, Error> {
    let source = config.source_config().map_err(|e| Error::needs_operator(e.to_string()))?;
    source.build(&config.name)
}

/// `source-runner check [--fix]`: prints each problem with the SQL that
/// fixes it; with `fix`, applies first what the source may fix itself.
pub async fn check(config: SourceRunnerConfig, fix: bool) -> ExitCode {
    let problems = match config.source_config() {
        Ok(source) if fix => match source.fix().await {
            Ok(left) => left,
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::FAILURE;
            }
        },
        Ok(source) => source.check().await,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    if problems.is_empty() {
        println!("ok: the source is ready for Tributary");
        return ExitCode::SUCCESS;
    }
    for p in &problems {
        println!("{p}");
    }
    // Warnings alone (e.g. REPLICA IDENTITY DEFAULT) still let the copy run.
    if problems.iter().any(|p| p.severity == tributary_connectors::Severity::Error) {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// `reset [--table schema.table]...`: records a reset of those tables (or
/// of every table) in the offsets topic; the runner carries it out at its
/// next start (a running one is fenced and starts again at once): each
/// table is copied again, and the destination rows the new copy does not
/// see are removed (see docs/operations.md, Reset).
pub async fn reset(config: SourceRunnerConfig, tables: Vec<String>) -> ExitCode {
    let mut ids = Vec::new();
    for t in &tables {
        match t.split_once('.') {
            Some((schema, table)) if !schema.is_empty() && !table.is_empty() => {
                ids.push(tributary_schemas::TableId::new(schema, table))
            }
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

/// Records a reset of `tables` (all with none) in the copy's offsets topic;
/// a running runner is fenced by it and starts again to carry it out.
async fn record_reset(config: &SourceRunnerConfig, tables: &[tributary_schemas::TableId]) -> Result<u64, Error> {
    let mut kafka = runner::KafkaSide::connect(config).await?;
    kafka.last_checkpoint().await?;
    kafka.record_reset(tables).await
}

/// `delete`: removes everything this copy owns on the source, in Kafka and
/// in the schema registry. Destination tables belong to sinks
/// (`sink-runner delete --drop-destination`).
pub async fn delete(config: SourceRunnerConfig, yes: bool) -> ExitCode {
    let prefix = config.prefix().to_string();
    if !yes {
        println!(
            "This deletes copy {name:?}: its replication slot and publication (PostgreSQL), its \
             Kafka topics (its table topics {prefix}.<schema>.<table>, their .dlq topics and its \
             offsets topic {prefix}.tributary.offsets), and their schema subjects. Type the copy's \
             name to confirm:",
            name = config.name
        );
        let mut answer = String::new();
        if std::io::stdin().read_line(&mut answer).is_err() || answer.trim() != config.name {
            eprintln!("not confirmed; nothing deleted");
            return ExitCode::FAILURE;
        }
    }
    let mut failed = false;
    if let Ok(source) = config.source_config() {
        match source.teardown().await {
            Ok(done) => {
                for d in done {
                    println!("deleted {d}");
                }
            }
            Err(e) => {
                eprintln!("error: {e}");
                failed = true;
            }
        }
    }
    match runner::delete_topics(&config).await {
        Ok(topics) => {
            for t in topics {
                println!("deleted topic {t} and its schema subjects");
            }
        }
        Err(e) => {
            eprintln!("error: {e}");
            failed = true;
        }
    }
    let forgotten = match config.kafka.client_config() {
        Ok(kafka) => PauseStore::of_source(kafka, &config.name).forget().await,
        Err(e) => Err(e.to_string()),
    };
    match forgotten {
        Ok(true) => println!("deleted the stored operator pauses of source/{}", config.name),
        Ok(false) => {}
        Err(e) => {
            eprintln!("error: the stored operator pauses: {e}");
            failed = true;
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
