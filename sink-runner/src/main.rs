//! `sink-runner`: run, check or replay a copy into a destination.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use sink_runner::config::SinkRunnerConfig;
use tokio::sync::watch;
use tributary_operations::admin::client::{self, Request};
use tributary_operations::logging::{self, LogFormat};
use tributary_operations::pauses::PauseStore;
use tributary_operations::process;

/// Copies change topics into a destination database.
#[derive(Debug, Parser)]
#[command(name = "sink-runner", version, about)]
struct Cli {
    /// Config file (TOML). See examples/sink-postgres.toml.
    #[arg(long, short, global = true, env = "TRIBUTARY_SINK_CONFIG")]
    config: Option<PathBuf>,
    /// Log format: text or json.
    #[arg(long, global = true, default_value = "text")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the copy (the default).
    Run,
    /// Connects to Kafka, the registry and the destination; reports problems with fixes.
    Check,
    /// Applies the records of a dead-letter topic again (after the cause was fixed).
    Replay {
        /// The dead-letter topic, e.g. `shop.public.orders.dlq`.
        #[arg(long)]
        dlq: String,
        /// Only tell what would apply and what would still fail.
        #[arg(long)]
        dry_run: bool,
    },
    /// Show the running runner's status per table (through its admin server).
    Status {
        /// Print the raw JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Pause the running runner, or one destination table.
    Pause {
        /// `schema.table` of the destination table; all tables when absent.
        #[arg(long)]
        table: Option<String>,
    },
    /// Resume the running runner, or one destination table.
    Resume {
        /// `schema.table` of the destination table; all tables when absent.
        #[arg(long)]
        table: Option<String>,
    },
    /// List the source's indexes, constraints and defaults recorded for a
    /// PostgreSQL destination, each with its state; with --make-waiting,
    /// make those that wait for a cutover (docs/migration.md).
    #[cfg(feature = "sink-postgres")]
    Objects {
        /// Make the unique and foreign keys, exclusion constraints and
        /// identities that wait (once the source is read-only and every
        /// change is applied), and those refused before.
        #[arg(long)]
        make_waiting: bool,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// End a copy from PostgreSQL, MySQL or MariaDB into PostgreSQL as a
    /// migration's switch-over: wait until caught up, make the source read-only,
    /// verify every table, make the objects that waited, move the
    /// sequences, report (docs/migration.md). Exits 0 only when every
    /// table verified equal.
    #[cfg(feature = "cutover")]
    Cutover {
        /// The source runner's config file ([cutover] source_config when
        /// not given).
        #[arg(long)]
        source_config: Option<PathBuf>,
        /// How the source stops taking writes.
        #[arg(long, value_enum, default_value = "sql")]
        read_only: sink_runner::commands::cutover::ReadOnly,
        /// Only print what would be done.
        #[arg(long)]
        dry_run: bool,
        /// The lag, in seconds, every table must be within before the
        /// source is made read-only.
        #[arg(long, default_value_t = 5)]
        max_lag_seconds: u64,
        /// How long each wait may take, in seconds.
        #[arg(long, default_value_t = 600)]
        timeout_seconds: u64,
        /// Keep the sink's position columns (the copy is to go on).
        #[arg(long)]
        keep_position_columns: bool,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Delete this copy's consumer group and stored offsets (and, with
    /// --drop-destination, its destination tables).
    Delete {
        /// Do not ask for confirmation.
        #[arg(long)]
        yes: bool,
        /// Also drop the destination tables.
        #[arg(long)]
        drop_destination: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    logging::init(cli.log_format);
    let (config, runtime): (SinkRunnerConfig, _) = match process::start(cli.config.as_deref(), "TRIBUTARY_SINK_CONFIG")
    {
        Ok(started) => started,
        Err(code) => return code,
    };
    runtime.block_on(async move {
        match cli.command {
            None | Some(Command::Run) => run(config).await,
            Some(Command::Check) => check(config).await,
            Some(Command::Replay { dlq, dry_run }) => replay(config, &dlq, dry_run).await,
            Some(Command::Status { json }) => client::command(&config.admin, Request::Status { json }).await,
            Some(Command::Pause { table }) => client::command(&config.admin, Request::Pause(table)).await,
            Some(Command::Resume { table }) => client::command(&config.admin, Request::Resume(table)).await,
            #[cfg(feature = "sink-postgres")]
            Some(Command::Objects { make_waiting, json }) => objects(config, make_waiting, json).await,
            #[cfg(feature = "cutover")]
            Some(Command::Cutover {
                source_config,
                read_only,
                dry_run,
                max_lag_seconds,
                timeout_seconds,
                keep_position_columns,
                json,
            }) => {
                let Some(source_config) =
                    source_config.or_else(|| config.cutover.as_ref().map(|c| c.source_config.clone()))
                else {
                    eprintln!("error: cutover needs --source-config, or [cutover] source_config in the config");
                    return ExitCode::from(2);
                };
                let options = sink_runner::commands::cutover::Options {
                    source_config,
                    read_only,
                    dry_run,
                    max_lag: std::time::Duration::from_secs(max_lag_seconds),
                    timeout: std::time::Duration::from_secs(timeout_seconds),
                    keep_position_columns,
                    progress: None,
                };
                cutover(config, &options, json).await
            }
            Some(Command::Delete { yes, drop_destination }) => delete(config, yes, drop_destination).await,
        }
    })
}

async fn run(config: SinkRunnerConfig) -> ExitCode {
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(async move {
        process::shutdown_signal().await;
        tracing::info!("shutdown requested");
        let _ = stop_tx.send(true);
    });
    // Everything buffered across tables, plus the batch being applied.
    tributary_operations::memory::report_budget(
        (config.max_buffered_bytes + config.batch_max_bytes()) as u64,
        "max_buffered_bytes or batch_max_bytes",
    );
    let telemetry = tributary_operations::telemetry::Telemetry::new(&config.consumer_group, "sink");
    let control = tributary_operations::admin::Control::new();
    #[cfg(feature = "cutover")]
    sink_runner::commands::cutover::serve_console(&config, &control);
    if let Err(e) = tributary_operations::admin::serve(&config.admin, telemetry.clone(), control.clone()).await {
        eprintln!("error: cannot start the admin server on {}: {e}", config.admin.listen);
        return ExitCode::FAILURE;
    }
    let kafka = match config.kafka.client_config() {
        Ok(k) => k,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let store = PauseStore::of_sink(kafka, &config.consumer_group);
    tributary_operations::pauses::attach_at_start(store, &control, &telemetry).await;
    // Ready once the consumer is a settled member of its group (see
    // `RebalanceCtx::stats_raw`), not before.
    match sink_runner::run(config, telemetry, control, stop_rx).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "sink runner failed");
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn check(config: SinkRunnerConfig) -> ExitCode {
    match sink_runner::commands::check::check(&config).await {
        Ok(findings) => {
            let problems = findings.iter().filter(|f| f.problem).count();
            for f in &findings {
                println!("{f}");
            }
            if problems == 0 {
                println!("all checks passed");
                ExitCode::SUCCESS
            } else {
                println!("{problems} problem(s) found");
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn replay(config: SinkRunnerConfig, dlq: &str, dry_run: bool) -> ExitCode {
    match sink_runner::commands::replay::replay(&config, dlq, dry_run).await {
        Ok(report) => {
            let verb = if dry_run { "would apply" } else { "applied" };
            println!(
                "read {} record(s) from {dlq}: {verb} {}, skipped {}, duplicates {}, control records not replayed {}, \
                 still failing {}",
                report.read,
                report.applied,
                report.skipped,
                report.duplicates,
                report.control,
                report.failing.len()
            );
            for f in &report.failing {
                let origin = f
                    .original
                    .as_ref()
                    .map(|o| format!("{}/{}@{}", o.topic, o.partition, o.offset))
                    .unwrap_or_else(|| "unknown origin".into());
                println!("  {}/{}@{} (from {origin}): {}", f.dlq.topic, f.dlq.partition, f.dlq.offset, f.error);
            }
            if report.failing.is_empty() {
                ExitCode::SUCCESS
            } else {
                println!("the failing records stay in {dlq}; fix their cause and replay again");
                ExitCode::from(3)
            }
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `cutover`: the report; exits 3 unless every table verified equal and
/// every object was made.
#[cfg(feature = "cutover")]
async fn cutover(config: SinkRunnerConfig, options: &sink_runner::commands::cutover::Options, json: bool) -> ExitCode {
    match sink_runner::commands::cutover::cutover(&config, options).await {
        Ok(r) => {
            if json {
                println!("{}", serde_json::to_string_pretty(&r).unwrap_or_default());
            } else {
                let verb = if r.dry_run { "would" } else { "did" };
                println!("cutover: {verb}");
                for s in &r.steps {
                    println!("  - {s}");
                }
                println!("{:<40} {:<40} {:>10} VERIFIED", "SOURCE", "DESTINATION", "ROWS");
                for t in &r.tables {
                    let rows = t.rows.map_or("-".to_string(), |n| n.to_string());
                    println!("{:<40} {:<40} {:>10} {}", t.source, t.destination, rows, t.verification);
                }
                let refused: Vec<_> = r.objects.iter().filter(|o| o.state == "refused").collect();
                println!("objects: {} recorded, {} refused", r.objects.len(), refused.len());
                for o in refused {
                    println!("  {} {} {}: {}", o.destination, o.kind, o.name, o.error.as_deref().unwrap_or(""));
                }
                println!("sequences moved: {}", r.sequences.len());
                if let Some(ms) = r.downtime_ms {
                    println!("write downtime: {:.1} s (from read-only to done)", ms as f64 / 1000.0);
                }
                println!("to make the source writable again: {}", r.undo_sql);
            }
            if r.ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(3)
            }
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `objects`: every recorded object and its state; exits 3 when one is
/// refused.
#[cfg(feature = "sink-postgres")]
async fn objects(config: SinkRunnerConfig, make_waiting: bool, json: bool) -> ExitCode {
    match sink_runner::commands::objects::objects(&config, make_waiting).await {
        Ok(list) => {
            if json {
                println!("{}", serde_json::to_string_pretty(&list).unwrap_or_default());
            } else {
                for o in &list {
                    let error = o.error.as_deref().map(|e| format!(": {e}")).unwrap_or_default();
                    println!("{:<40} {:<12} {:<40} {}{error}", o.destination, o.kind, o.name, o.state);
                }
            }
            let refused = list.iter().filter(|o| o.state == "refused").count();
            let waiting = list.iter().filter(|o| o.state == "at_cutover").count();
            eprintln!("{} object(s): {refused} refused, {waiting} waiting for a cutover", list.len());
            if refused > 0 {
                ExitCode::from(3)
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `delete`: the consumer group, the stored offsets and, when asked, the
/// destination tables.
async fn delete(config: SinkRunnerConfig, yes: bool, drop_destination: bool) -> ExitCode {
    if !yes {
        println!(
            "This deletes the copy {group:?}: its consumer group and stored offsets{tables}. \
             Type the consumer group's name to confirm:",
            group = config.consumer_group,
            tables = if drop_destination {
                ", and its destination tables"
            } else {
                ""
            }
        );
        let mut answer = String::new();
        if std::io::stdin().read_line(&mut answer).is_err() || answer.trim() != config.consumer_group {
            eprintln!("not confirmed; nothing deleted");
            return ExitCode::FAILURE;
        }
    }
    match sink_runner::commands::delete::delete(&config, drop_destination).await {
        Ok(done) => {
            for d in done {
                println!("deleted {d}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
