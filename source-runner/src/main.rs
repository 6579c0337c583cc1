//! `source-runner`: copy one source database into per-table Kafka topics.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use source_runner::config::SourceRunnerConfig;
use tributary_operations::admin::client::{self, Request};
use tributary_operations::logging::{self, LogFormat};
use tributary_operations::process;

/// Copies one source database into per-table Kafka topics: a consistent
/// snapshot, then every change, exactly once.
#[derive(Debug, Parser)]
#[command(name = "source-runner", version, about)]
struct Cli {
    /// Config file (TOML). See examples/source-postgres.toml.
    #[arg(long, short, global = true, env = "TRIBUTARY_CONFIG")]
    config: Option<PathBuf>,
    /// Log format: text (terminal) or json.
    #[arg(long, global = true, default_value = "text")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the copy (the default).
    Run,
    /// Check the source's settings and privileges; print the SQL that fixes
    /// each problem.
    Check {
        /// Also apply the fixes the source's role may apply itself (the
        /// publication, REPLICA IDENTITY FULL, the DDL trigger), then check
        /// again.
        #[arg(long)]
        fix: bool,
    },
    /// Show the running runner's status per table (through its admin server).
    Status {
        /// Print the raw JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Pause the running runner: it stops reading; the slot keeps its place.
    Pause,
    /// Resume a paused runner.
    Resume,
    /// Copy tables again and remove the destination rows the new copy does
    /// not see (a re-snapshot). Recorded now, carried out at the runner's
    /// next start; a running runner starts again by itself.
    Reset {
        /// A table to copy again (`schema.table`, repeatable); without it,
        /// every table (and the source starts over from its current
        /// position: the way back from a lost checkpoint, slot or binlog).
        #[arg(long = "table", value_name = "SCHEMA.TABLE")]
        tables: Vec<String>,
    },
    /// Verify tables while the copy runs: the running runner reads each
    /// table anew at a point of its stream and sends its rows' digests, and
    /// the sinks compare them with the destination's rows at the same
    /// point (their status, metrics and logs say what differs; see
    /// docs/verification.md).
    Verify {
        /// A table to verify (`schema.table`); without it, every table.
        #[arg(long = "table", value_name = "SCHEMA.TABLE")]
        table: Option<String>,
        /// `rows` or `summary` (see docs/verification.md); without it, the
        /// config's `[verify] method`.
        #[arg(long = "method", value_name = "METHOD")]
        method: Option<String>,
    },
    /// Delete this copy: the replication slot, the publication, the change
    /// topics, the offsets topic and the schema subjects.
    Delete {
        /// Do not ask for confirmation.
        #[arg(long)]
        yes: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    logging::init(cli.log_format);
    let (config, runtime): (SourceRunnerConfig, _) = match process::start(cli.config.as_deref(), "TRIBUTARY_CONFIG") {
        Ok(started) => started,
        Err(code) => return code,
    };
    runtime.block_on(async move {
        match cli.command.unwrap_or(Command::Run) {
            Command::Run => match source_runner::run_from_config(config).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::FAILURE
                }
            },
            Command::Check { fix } => source_runner::commands::check::check(config, fix).await,
            Command::Status { json } => client::command(&config.admin, Request::Status { json }).await,
            Command::Pause => client::command(&config.admin, Request::Pause(None)).await,
            Command::Resume => client::command(&config.admin, Request::Resume(None)).await,
            Command::Verify { table, method } => {
                client::command(&config.admin, Request::Verify { table, method }).await
            }
            Command::Reset { tables } => source_runner::commands::reset::reset(config, tables).await,
            Command::Delete { yes } => source_runner::commands::delete::delete(config, yes).await,
        }
    })
}
