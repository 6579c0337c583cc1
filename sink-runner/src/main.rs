//! `sink-runner`: run, check or replay a copy into a destination.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use sink_runner::config::SinkRunnerConfig;
use sink_runner::status::SinkStatus;
use tokio::sync::watch;
use tributary_operations::config::load;
use tributary_operations::logging::{self, LogFormat};

/// Copies change topics into a destination database.
#[derive(Debug, Parser)]
#[command(name = "sink-runner", version, about)]
struct Cli {
    /// Config file (TOML).
    #[arg(long, global = true, env = "TRIBUTARY_SINK_CONFIG")]
    config: Option<PathBuf>,
    /// Log format: text or json.
    #[arg(long, global = true, default_value = "text")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    logging::init(cli.log_format);
    let Some(path) = cli.config.clone() else {
        eprintln!("error: --config FILE is required");
        return ExitCode::from(2);
    };
    let config: SinkRunnerConfig = match load(&path) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        match cli.command {
            None => run(config).await,
            Some(Command::Check) => check(config).await,
            Some(Command::Replay { dlq, dry_run }) => replay(config, &dlq, dry_run).await,
        }
    })
}

async fn run(config: SinkRunnerConfig) -> ExitCode {
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(async move {
        shutdown_signal().await;
        tracing::info!("shutdown requested");
        let _ = stop_tx.send(true);
    });
    match sink_runner::run(config, SinkStatus::new(), stop_rx).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "sink runner failed");
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

async fn check(config: SinkRunnerConfig) -> ExitCode {
    match sink_runner::check::check(&config).await {
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
    match sink_runner::replay::replay(&config, dlq, dry_run).await {
        Ok(report) => {
            let verb = if dry_run { "would apply" } else { "applied" };
            println!(
                "read {} record(s) from {dlq}: {verb} {}, skipped {}, still failing {}",
                report.read,
                report.applied,
                report.skipped,
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
