//! `sink-runner cutover`: ends a copy from PostgreSQL, MySQL or MariaDB into
//! PostgreSQL as a migration's switch-over (docs/migration.md). With both
//! runners running:
//!
//! 1. waits until the copy is caught up (every table's lag within a bound);
//! 2. makes the source read-only (the documented SQL, or an operator step
//!    it waits for, or nothing when that is done already);
//! 3. asks the source runner to verify every table: a verification's
//!    ranges follow every earlier change in the stream, so once the sink
//!    compared them all, everything up to the read-only point is applied,
//!    and equal or not;
//! 4. pauses the sink runner, makes the objects that waited for the
//!    cutover, moves every sequence past the source's, and drops the
//!    sink's position columns (the application writes rows without them);
//! 5. reports tables, rows, verification, objects, sequences and the write
//!    downtime, from read-only to done.
//!
//! The source stays read-only whatever happens (the report says how to
//! undo it): whether to go back is the operator's call.

mod source;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use reqwest::Method;
use serde::{Deserialize, Serialize};
use tributary_connectors::sinks::postgres::config::DestinationTable;
use tributary_connectors::sinks::postgres::objects::Outcome;
use tributary_connectors::sinks::postgres::PostgresSink;
use tributary_connectors::sources::mysql::config::MySqlSourceConfig;
use tributary_connectors::sources::postgres::config::PostgresSourceConfig;
use tributary_operations::admin::client::call;
use tributary_operations::admin::AdminConfig;

use crate::config::{CutoverReadOnly, SinkRunnerConfig};
use crate::RunError;

/// How the source stops taking writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ReadOnly {
    /// This command runs the documented SQL.
    Sql,
    /// This command prints the SQL and waits for the operator (Enter).
    Operator,
    /// The source takes no writes already.
    None,
}

/// What `cutover` is asked.
#[derive(Clone)]
pub struct Options {
    /// The source runner's config file (its database and admin server).
    pub source_config: PathBuf,
    /// How the source stops taking writes.
    pub read_only: ReadOnly,
    /// Only say what would be done.
    pub dry_run: bool,
    /// The lag every table must be within before the source is made
    /// read-only.
    pub max_lag: Duration,
    /// How long each wait may take.
    pub timeout: Duration,
    /// Keep the sink's position columns (the copy is to go on).
    pub keep_position_columns: bool,
    /// Told each step as it starts (the console's progress).
    pub progress: Option<Progress>,
}

/// What is told each step of a cutover as it starts.
pub type Progress = std::sync::Arc<dyn Fn(&str) + Send + Sync>;

/// One table's outcome.
#[derive(Debug, Clone, Serialize)]
pub struct TableReport {
    /// The source table.
    pub source: String,
    /// Its destination table.
    pub destination: String,
    /// The destination's rows after the cutover.
    pub rows: Option<i64>,
    /// The verification's outcome: `equal`, `differs`, `not_verified`.
    pub verification: String,
    /// Rows the verification compared.
    pub rows_verified: u64,
    /// Rows that differed.
    pub rows_differing: u64,
}

/// What a cutover did (or, dry, would do).
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Whether nothing was done.
    pub dry_run: bool,
    /// The steps, in order, as done or to be done.
    pub steps: Vec<String>,
    /// Every table.
    pub tables: Vec<TableReport>,
    /// Every recorded object and its state.
    pub objects: Vec<Outcome>,
    /// The sequences moved, each with the source's next value.
    pub sequences: Vec<(String, String)>,
    /// The SQL that made the source read-only, and the SQL that undoes it.
    pub read_only_sql: String,
    /// The SQL that makes the source writable again.
    pub undo_sql: String,
    /// From read-only to done, when this command made it read-only.
    pub downtime_ms: Option<u64>,
    /// Whether every table verified equal and no object was refused.
    pub ok: bool,
}

/// The parts of a source runner's config a cutover needs.
#[derive(Deserialize)]
struct SourceSide {
    #[serde(default)]
    admin: AdminConfig,
    postgres: Option<PostgresSourceConfig>,
    mysql: Option<MySqlSourceConfig>,
    #[serde(flatten)]
    _rest: toml::Table,
}

/// Runs the cutover (see the module's doc).
pub async fn cutover(config: &SinkRunnerConfig, o: &Options) -> Result<Report, RunError> {
    let other = |e: String| RunError::Other(e);
    let text =
        std::fs::read_to_string(&o.source_config).map_err(|e| other(format!("{}: {e}", o.source_config.display())))?;
    let side: SourceSide = toml::from_str(&text).map_err(|e| other(format!("{}: {e}", o.source_config.display())))?;
    let Some(mut dest) = config.destination.postgres.clone() else {
        return Err(other("the cutover command moves a database into PostgreSQL ([postgres])".into()));
    };
    dest.consumer_group = Some(config.consumer_group.clone());
    let mut sink = PostgresSink::new(dest).map_err(|e| other(e.to_string()))?;
    let (mut db, tables) = source::SourceDb::open(side.postgres.as_ref(), side.mysql.as_ref())
        .await
        .map_err(other)?;
    let destinations: Vec<DestinationTable> = tables.iter().map(|t| sink.destination_of(t)).collect();
    let read_only_sql = db.read_only_sql();
    let undo_sql = db.undo_sql();
    for (which, admin, file) in [
        ("source", &side.admin, o.source_config.display().to_string()),
        ("sink", &config.admin, "the sink runner's config".to_string()),
    ] {
        if admin.listen == "off" {
            return Err(other(format!(
                "the cutover talks to the {which} runner's admin server: set [admin] listen in {file}"
            )));
        }
    }
    let source_token = side.admin.token().map_err(|e| other(e.to_string()))?;
    let sink_token = config.admin.token().map_err(|e| other(e.to_string()))?;
    let mut report = Report {
        dry_run: o.dry_run,
        steps: Vec::new(),
        tables: Vec::new(),
        objects: Vec::new(),
        sequences: Vec::new(),
        read_only_sql: read_only_sql.clone(),
        undo_sql,
        downtime_ms: None,
        ok: false,
    };
    let step = |report: &mut Report, s: String| {
        tracing::info!("{s}");
        if let Some(progress) = &o.progress {
            progress(&s);
        }
        report.steps.push(s);
    };

    step(
        &mut report,
        format!("wait until every table of the copy is within {} s of the source", o.max_lag.as_secs()),
    );
    if !o.dry_run {
        wait(o.timeout, "the copy to catch up", || async {
            let status = status(&config.admin.listen, sink_token.as_ref()).await.ok()?;
            destinations.iter().all(|d| caught_up(&status, d, o.max_lag)).then_some(())
        })
        .await?;
    }
    let read_only_at = match o.read_only {
        ReadOnly::Sql => {
            step(&mut report, format!("make the source read-only: {read_only_sql}"));
            if o.dry_run {
                None
            } else {
                db.make_read_only()
                    .await
                    .map_err(|e| other(format!("source: cannot make it read-only: {e}")))?;
                Some(Instant::now())
            }
        }
        ReadOnly::Operator => {
            step(&mut report, format!("wait for the operator to make the source read-only ({read_only_sql})"));
            if o.dry_run {
                None
            } else {
                eprintln!("Make the source read-only now, e.g.:\n  {read_only_sql}\nthen press Enter.");
                let mut line = String::new();
                let _ = tokio::task::spawn_blocking(move || std::io::stdin().read_line(&mut line)).await;
                Some(Instant::now())
            }
        }
        ReadOnly::None => {
            step(&mut report, "the source takes no writes already (--read-only none)".into());
            None
        }
    };
    step(&mut report, "verify every table: once compared, every change up to now is applied".into());
    let mut verified = serde_json::Value::Null;
    if !o.dry_run {
        let answer = call(&side.admin.listen, Method::POST, "/verify", source_token.as_ref())
            .await
            .map_err(|e| other(format!("source runner: cannot ask for a verification: {e}")))?;
        // "verification <id> of <tables>: ..."
        let asked: u64 = answer
            .split_whitespace()
            .nth(1)
            .and_then(|id| id.parse().ok())
            .ok_or_else(|| other(format!("source runner: unexpected answer to a verification: {answer}")))?;
        step(&mut report, answer.trim().to_string());
        verified = wait(o.timeout, "every table's verification", || async {
            let status = status(&config.admin.listen, sink_token.as_ref()).await.ok()?;
            destinations
                .iter()
                .all(|d| verification(&status, d, asked).is_some())
                .then_some(status)
        })
        .await?;
        // Nothing more is applied: the tables are about to change hands.
        call(&config.admin.listen, Method::POST, "/pause", sink_token.as_ref())
            .await
            .map_err(|e| other(format!("sink runner: cannot pause it: {e}")))?;
    }
    step(&mut report, "pause the sink runner".into());
    step(&mut report, "make the unique, check and foreign keys and identities that waited".into());
    report.objects = if o.dry_run {
        sink.objects().await.map_err(|e| other(format!("destination: {e}")))?
    } else {
        sink.make_waiting_objects()
            .await
            .map_err(|e| other(format!("destination: {e}")))?
    };
    step(&mut report, "move every sequence past the source's".into());
    let states = db.sequences(&tables).await.map_err(|e| other(format!("source: {e}")))?;
    if !o.dry_run {
        sink.advance_sequences(&states)
            .await
            .map_err(|e| other(format!("destination: {e}")))?;
    }
    report.sequences = states
        .iter()
        .map(|s| (sink.destination_of(&s.id()).to_string(), s.next_value().to_string()))
        .collect();
    if !o.keep_position_columns {
        step(&mut report, "drop the sink's position columns from the destination tables".into());
        if !o.dry_run {
            sink.drop_position_columns(&destinations)
                .await
                .map_err(|e| other(format!("destination: {e}")))?;
        }
    }
    report.downtime_ms = read_only_at.map(|t| t.elapsed().as_millis() as u64);
    let rows = sink
        .row_counts(&destinations)
        .await
        .map_err(|e| other(format!("destination: {e}")))?;
    for ((source, dest), rows) in tables.iter().zip(&destinations).zip(rows) {
        let v = verification(&verified, dest, 0);
        let field = |k: &str| v.and_then(|v| v[k].as_u64()).unwrap_or(0);
        report.tables.push(TableReport {
            source: source.to_string(),
            destination: dest.to_string(),
            rows,
            verification: v
                .and_then(|v| v["state"].as_str())
                .unwrap_or(if o.dry_run { "not_run" } else { "not_verified" })
                .to_string(),
            rows_verified: field("rows_verified"),
            rows_differing: field("rows_differing"),
        });
    }
    report.ok = !o.dry_run
        && report.tables.iter().all(|t| t.verification == "equal")
        && report.objects.iter().all(|o| o.state == "made");
    Ok(report)
}

/// Serves the cutovers asked from the console (`POST /cutover`) as the
/// runner's `[cutover]` says, one at a time, publishing each one's steps as
/// they start and its report or error for `GET /cutover`.
pub fn serve_console(config: &SinkRunnerConfig, control: &tributary_operations::admin::Control) {
    let Some(c) = config.cutover.clone() else {
        return;
    };
    if config.destination.postgres.is_none() {
        tracing::warn!("[cutover] is for a copy into PostgreSQL: the console's cutover is off");
        return;
    }
    let (config, control) = (config.clone(), control.clone());
    let mut requests = control.serve_cutover();
    tokio::spawn(async move {
        while let Some(dry_run) = requests.recv().await {
            let steps = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
            let progress: Progress = {
                let (steps, control) = (steps.clone(), control.clone());
                std::sync::Arc::new(move |s: &str| {
                    let mut steps = steps.lock().unwrap_or_else(|p| p.into_inner());
                    steps.push(s.to_string());
                    control.set_cutover_state(
                        serde_json::json!({"state": "running", "dry_run": dry_run, "steps": *steps}),
                    );
                })
            };
            let options = Options {
                source_config: c.source_config.clone(),
                read_only: match c.read_only {
                    CutoverReadOnly::Sql => ReadOnly::Sql,
                    CutoverReadOnly::None => ReadOnly::None,
                },
                dry_run,
                max_lag: Duration::from_secs(c.max_lag_seconds),
                timeout: Duration::from_secs(c.timeout_seconds),
                keep_position_columns: c.keep_position_columns,
                progress: Some(progress),
            };
            let state = match cutover(&config, &options).await {
                Ok(report) => {
                    serde_json::json!({"state": "done", "dry_run": dry_run, "steps": report.steps, "report": report})
                }
                Err(e) => {
                    tracing::error!(error = %e, "the cutover asked from the console failed");
                    let steps = steps.lock().unwrap_or_else(|p| p.into_inner()).clone();
                    serde_json::json!({"state": "failed", "dry_run": dry_run, "steps": steps, "error": e.to_string()})
                }
            };
            control.set_cutover_state(state);
        }
    });
}

/// The runner's `/status` at `listen`, as JSON.
async fn status(listen: &str, token: Option<&secrecy::SecretString>) -> Result<serde_json::Value, String> {
    let body = call(listen, Method::GET, "/status", token).await?;
    serde_json::from_str(&body).map_err(|e| e.to_string())
}

/// Whether the sink's status shows `dest` streaming within `max_lag` (a
/// table without a lag yet has had no change since its copy).
fn caught_up(status: &serde_json::Value, dest: &DestinationTable, max_lag: Duration) -> bool {
    let t = &status["tables"][dest.to_string()];
    t["state"].as_str() == Some("streaming") && t["lag_seconds"].as_f64().is_none_or(|l| l <= max_lag.as_secs_f64())
}

/// `dest`'s last verification in the sink's status, once one asked at or
/// after `asked` (ms) ended.
fn verification<'a>(
    status: &'a serde_json::Value,
    dest: &DestinationTable,
    asked: u64,
) -> Option<&'a serde_json::Value> {
    let v = &status["tables"][dest.to_string()]["verification"];
    (v["id"].as_u64()? >= asked && v["state"].as_str()? != "running").then_some(v)
}

/// Polls `check` until it answers, failing after `timeout` naming `what`.
async fn wait<T, F, Fut>(timeout: Duration, what: &str, mut check: F) -> Result<T, RunError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return Ok(v);
        }
        if Instant::now() > deadline {
            return Err(RunError::Other(format!("waited {} s for {what}; nothing more was done", timeout.as_secs())));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_is_caught_up_streaming_within_the_lag_and_verified_by_a_verification_asked_now() {
        let dest = DestinationTable { schema: "copy".into(), table: "orders".into() };
        let status = |state: &str, lag: serde_json::Value, verification: serde_json::Value| serde_json::json!({"tables": {"copy.orders": {"state": state, "lag_seconds": lag, "verification": verification}}});
        let five = Duration::from_secs(5);
        let none = serde_json::Value::Null;
        assert!(caught_up(&status("streaming", 1.5.into(), none.clone()), &dest, five));
        assert!(caught_up(&status("streaming", none.clone(), none.clone()), &dest, five));
        assert!(!caught_up(&status("streaming", 7.0.into(), none.clone()), &dest, five));
        assert!(!caught_up(&status("snapshot", 0.0.into(), none.clone()), &dest, five));
        assert!(!caught_up(&serde_json::json!({"tables": {}}), &dest, five));
        let v = |id: u64, state: &str| serde_json::json!({"id": id, "state": state});
        assert!(verification(&status("streaming", none.clone(), v(10, "equal")), &dest, 10).is_some());
        assert!(verification(&status("streaming", none.clone(), v(10, "differs")), &dest, 10).is_some());
        assert!(verification(&status("streaming", none.clone(), v(10, "running")), &dest, 10).is_none());
        assert!(verification(&status("streaming", none.clone(), v(9, "equal")), &dest, 10).is_none());
        assert!(verification(&status("streaming", none, serde_json::Value::Null), &dest, 10).is_none());
    }
}
