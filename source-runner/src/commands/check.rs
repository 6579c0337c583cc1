//! `source-runner check [--fix]`.

use std::process::ExitCode;

use crate::config::SourceRunnerConfig;

/// Prints each problem with the SQL that fixes it; with `fix`, applies
/// first what the source may fix itself.
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
