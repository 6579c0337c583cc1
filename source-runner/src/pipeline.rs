//! The source runner's pipeline: source batches -> Avro -> one Kafka
//! transaction (events + checkpoint) -> acknowledge to the source, with
//! the retry loop around it. How the transactions are cut is in
//! [`crate::transaction`], what goes into them in [`crate::writer`].

use std::time::{Duration, Instant};

use tracing::{info, info_span, warn, Instrument};
use tributary_connectors::{policy, Decision, Error, Source};
use tributary_operations::admin::Control;
use tributary_operations::process::sleep_until;
use tributary_operations::telemetry::{TableState, Telemetry};

use crate::config::{SourceRunnerConfig, VERIFY_LAG_RECHECK};
use crate::requests::Requests;
use crate::transaction::{next_limit, snapshot_ends, snapshot_rows, OpenTxn};
use crate::writer::TopicWriter;
use tributary_schemas::records::requests::Request;

/// How often the source is asked how much history its database keeps
/// for the copy (`tributary_source_retained_bytes`).
const RETAINED_EVERY: Duration = Duration::from_secs(30);
/// A run of the source that lasted this long resets the retry backoff.
const RUN_RESETS_BACKOFF: Duration = Duration::from_secs(60);

/// Runs a source until it fails for good or `shutdown` resolves.
///
/// Retryable and operator errors are retried per [`policy`], restarting the
/// source from the last durable checkpoint; nothing is ever skipped.
pub async fn run(
    config: SourceRunnerConfig,
    mut source: Box<dyn Source>,
    telemetry: Telemetry,
    control: Control,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), Error> {
    tokio::pin!(shutdown);
    let span = info_span!("source_runner", runner = %config.name);
    control.serve_resyncs();
    source.set_wake(control.wake());
    async move {
        let mut attempt = 0u32;
        loop {
            let started = Instant::now();
            let result = tokio::select! {
                r = run_once(&config, source.as_mut(), &telemetry, &control) => r,
                _ = &mut shutdown => { info!("shutting down"); return Ok(()); }
            };
            let err = match result {
                Ok(()) => return Ok(()),
                Err(e) => e,
            };
            // A run that lasted was a recovery: the next failure starts the
            // backoff over instead of waiting the maximum after a day of
            // occasional, unrelated outages.
            if started.elapsed() >= RUN_RESETS_BACKOFF {
                attempt = 0;
            }
            attempt += 1;
            control.set_ready(false);
            let table = err.table().map(|t| t.to_string());
            if let Some(t) = &table {
                telemetry.record_error(t, &err.to_string(), &err.kind().to_string());
            }
            let delay = match policy(err.kind(), attempt) {
                Decision::RetryAfter(d) => {
                    warn!(error = %err, attempt, delay_ms = d.as_millis() as u64, "retrying from the last checkpoint");
                    telemetry.set_paused(Some(format!("retrying: {err}")));
                    d
                }
                Decision::PauseAndProbe(d) => {
                    warn!(error = %err, hint = err.hint().unwrap_or(""), "paused until an operator fixes this; probing again");
                    telemetry.set_paused(Some(err.to_string()));
                    d
                }
                Decision::DeadLetter => {
                    tracing::error!(error = %err, "stopping: a source cannot skip a change");
                    if let Some(t) = &table {
                        telemetry.set_state(t, TableState::Failed(err.to_string()));
                    }
                    return Err(err);
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = &mut shutdown => { info!("shutting down"); return Ok(()); }
            }
        }
    }
    .instrument(span)
    .await
}

/// One life of the pipeline: connect, resume from the last checkpoint, then
/// loop until an error.
async fn run_once(
    config: &SourceRunnerConfig,
    source: &mut dyn Source,
    telemetry: &Telemetry,
    control: &Control,
) -> Result<(), Error> {
    let mut writer = start(config, source, telemetry).await?;
    writer.ensure_requests_topic().await?;
    let requests = Requests::subscribe(config)?;
    control.set_ready(true);
    telemetry.set_paused(None);
    stream(config, &mut writer, source, telemetry, control, &requests).await
}

/// Connects to Kafka, reads the runner's records back, starts the source
/// from its checkpoint, and asks it to copy again what is held.
async fn start(
    config: &SourceRunnerConfig,
    source: &mut dyn Source,
    telemetry: &Telemetry,
) -> Result<TopicWriter, Error> {
    let mut writer = TopicWriter::connect(config).await?;
    let restored = writer.restore().await?;
    info!(resuming = restored.checkpoint.is_some(), "connected to Kafka");
    if writer.held.reset_all_asked() && !source.start_over() {
        return Err(Error::needs_operator(format!(
            "a reset of every table was asked, and the {} source cannot copy every table again",
            config.connector()
        ))
        .with_class("tributary.reset")
        .with_hint("name the tables instead: source-runner --config <source.toml> reset --table <schema.table> ..."));
    }
    source.restore_side_records(restored.side_records);
    source.start(restored.checkpoint).await?;
    if let Some(why) = source.domain_change() {
        writer.held.reset_all_tables(&why, source.tables());
    }
    if !writer.held.is_empty() {
        // Their changes were held back: each is copied again, and flows if
        // its schema can now be carried (else it is paused again).
        let copying = source.resync(&writer.held.to_copy_again()).await?;
        writer.held.copying_again(&copying);
        writer.held.show_paused(telemetry);
    }
    Ok(writer)
}

/// Reads, produces and commits batches until an error (or an operator's
/// pause ends the runner's life: never, it waits).
async fn stream(
    config: &SourceRunnerConfig,
    writer: &mut TopicWriter,
    source: &mut dyn Source,
    telemetry: &Telemetry,
    control: &Control,
    requests: &Requests,
) -> Result<(), Error> {
    let mut pause = control.subscribe();
    let mut next_retained = Instant::now();
    let mut batch_no: u64 = 0;
    // The open Kafka transaction's batches, not yet durable.
    let mut open: Option<OpenTxn> = None;
    // Events the open snapshot transaction may reach before it is
    // committed: one batch first, then four times the last one.
    let mut txn_limit = 0usize;
    // A third: the commit itself must reach the broker in time, on a
    // loaded machine too.
    let keep_alive_after = Duration::from_millis(u64::from(config.transaction_timeout_ms) / 3);
    // The next scheduled verification: one period after the start.
    let mut next_verify = config.verify.every_secs.map(|s| Instant::now() + Duration::from_secs(s));
    loop {
        // A paused source stops reading: its slot keeps the position, and
        // nothing after the last commit is lost.
        if pause.borrow().all {
            if let Some(txn) = open.take() {
                txn.commit(writer, source, telemetry).await?;
            }
        }
        while pause.borrow_and_update().all {
            telemetry.set_paused(Some("paused by an operator".to_string()));
            if pause.changed().await.is_err() {
                return Ok(());
            }
        }
        telemetry.set_paused(None);
        while let Some(req) = control.next_resync() {
            // Between two committed batches: the state a start makes.
            if let Some(txn) = open.take() {
                txn.commit(writer, source, telemetry).await?;
            }
            let answer = writer.resync_live(source, &req.table).await;
            writer.held.show_paused(telemetry);
            match answer {
                Ok(a) => {
                    if a.is_ok() {
                        telemetry.record_copy_again(&req.table, "copied again, as asked (POST /resync)");
                    }
                    let _ = req.reply.send(a);
                }
                Err(e) => {
                    let _ = req.reply.send(Err(e.to_string()));
                    return Err(e);
                }
            }
        }
        while let Some(req) = control.next_verify() {
            if let Some(txn) = open.take() {
                txn.commit(writer, source, telemetry).await?;
            }
            let mut verify = config.verify.clone();
            match req.method.as_deref() {
                None => {}
                Some("rows") => verify.method = crate::config::VerifyMethod::Rows,
                Some("summary") => verify.method = crate::config::VerifyMethod::Summary,
                Some(other) => {
                    let _ = req.reply.send(Err(format!("method {other}: expected rows or summary")));
                    continue;
                }
            }
            match writer.verify_live(source, &req.table, &verify).await {
                Ok(a) => {
                    let _ = req.reply.send(a);
                }
                Err(e) => {
                    let _ = req.reply.send(Err(e.to_string()));
                    return Err(e);
                }
            }
        }
        while let Some(request) = requests.next() {
            if let Some(txn) = open.take() {
                txn.commit(writer, source, telemetry).await?;
            }
            let (table, verification, keys) = match request {
                Request::Repair { table, verification, keys } => (table, verification, keys),
                Request::Verify { table, verification, ranges } => {
                    let held = writer.held.get(&table).is_some();
                    let id = crate::held_tables::new_reset_id();
                    if !held && source.verify_ranges(&table, id, &ranges, config.verify.rows_per_second).await? {
                        info!(table = %table, verification, ranges = ranges.len(), id,
                            "verifying by their rows the ranges whose summaries differed at a destination");
                    } else {
                        warn!(table = %table, verification, ranges = ranges.len(),
                            "ranges whose summaries differed are not verified by rows now (the table is being \
                             copied or verified, or the source cannot): the next verification finds what differs");
                    }
                    continue;
                }
            };
            if writer.keyless(&table) {
                // No key names the rows to send again: the table is copied
                // again whole, as `POST /resync` does (its rows that the
                // copy does not see are removed at its end).
                match writer.resync_live(source, &table.to_string()).await? {
                    Ok(said) => {
                        writer.held.show_paused(telemetry);
                        telemetry
                            .record_copy_again(&table.to_string(), "copied again to repair what a verification found");
                        info!(table = %table, verification, rows = keys.len(),
                            "repairing a table without a key that a verification found different: {said}");
                    }
                    Err(why) => warn!(table = %table, verification,
                        "a repair is not made now: {why}; the next verification finds what still differs"),
                }
                continue;
            }
            let held = writer.held.get(&table).is_some();
            let verify_after = crate::held_tables::new_reset_id();
            if !held
                && source
                    .repair(&table, &keys, verify_after, config.verify.rows_per_second)
                    .await?
            {
                info!(table = %table, verification, keys = keys.len(), verify_after,
                    "repairing rows a verification found different, then verifying the table again");
            } else {
                warn!(table = %table, verification, keys = keys.len(),
                    "a repair is not made now (the table is being copied or verified, or the source cannot): the \
                     next verification finds what still differs");
            }
        }
        if next_verify.is_some_and(|at| Instant::now() >= at) {
            // Scheduled: every table, unless the copy is behind.
            let lag = telemetry
                .status()
                .tables
                .values()
                .filter_map(|t| t.lag_seconds)
                .fold(0.0, f64::max);
            if lag > config.verify.max_lag_seconds {
                info!(lag_seconds = lag, "the scheduled verification waits while the copy is behind");
                next_verify = Some(Instant::now() + VERIFY_LAG_RECHECK);
            } else {
                if let Some(txn) = open.take() {
                    txn.commit(writer, source, telemetry).await?;
                }
                if let Err(why) = writer.verify_live(source, "", &config.verify).await? {
                    info!("scheduled verification: {why}");
                }
                next_verify = config.verify.every_secs.map(|s| Instant::now() + Duration::from_secs(s));
            }
        }
        if writer.held.copies_asked() {
            // The batch that asked is committed first: the copy must read
            // the table after the rewrite, and a crash before the copy is
            // asked finds the table held (and copies it at the start).
            if let Some(txn) = open.take() {
                txn.commit(writer, source, telemetry).await?;
            }
            writer.copy_rewritten(source, telemetry).await?;
            writer.held.show_paused(telemetry);
        }
        if Instant::now() >= next_retained {
            next_retained = Instant::now() + RETAINED_EVERY;
            if let Some(bytes) = source.retained_bytes().await {
                telemetry.set_retained_bytes(bytes);
            }
        }
        let asked = Instant::now();
        let batch = {
            // A snapshot's transaction stays open while the source reads
            // its next chunk. A chunk slower than the transaction timeout
            // would make Kafka abort it, and the runner start over only to
            // fail the same way: it is committed at a third of the timeout
            // instead, while the read goes on (its checkpoint, the last
            // batch's, is a place to resume from).
            let mut keep_alive = open
                .as_ref()
                .filter(|t| !t.kafka_committed)
                .map(|t| t.started + keep_alive_after);
            let next = source.next_batch();
            tokio::pin!(next);
            loop {
                tokio::select! {
                    batch = &mut next => break batch?,
                    _ = sleep_until(keep_alive) => {
                        keep_alive = None;
                        if let Some(txn) = open.as_mut() {
                            info!(
                                open_ms = txn.started.elapsed().as_millis() as u64,
                                "the source is slow to give its next batch: committing what is open"
                            );
                            txn.commit_kafka(writer).await?;
                        }
                    }
                }
            }
        };
        if open.as_ref().is_some_and(|t| t.kafka_committed) {
            if let Some(txn) = open.take() {
                txn.commit(writer, source, telemetry).await?;
            }
        }
        writer.stage_side_records(source.take_side_records());
        batch_no += 1;
        let events = batch.messages.len();
        let span = info_span!("batch", batch = batch_no, events);
        let producing = Instant::now();
        let counts = writer.add_batch(&batch).instrument(span.clone()).await?;
        if !writer.held.is_empty() {
            writer.sweep_copied(&source.snapshot_progress()).await?;
        }
        // The broker times a transaction from its first produce, so its
        // age counts from before this batch's, however long that took.
        let txn = open.get_or_insert_with(|| OpenTxn::new(producing));
        for (id, c) in counts.iter().filter(|(_, c)| c.events > 0) {
            telemetry.record_pending(&id.to_string(), c.oldest_ts);
        }
        txn.add(&batch, counts);
        txn.waited_for_source += producing - asked;
        txn.producing += producing.elapsed();
        // Snapshot rows keep the transaction open while more of the
        // snapshot follows at once; anything else is committed now.
        let snapshot_rows = snapshot_rows(&batch);
        let snapshot_ends = snapshot_ends(&batch, &source.snapshot_progress());
        txn.checkpoint = batch.checkpoint;
        if txn.stays_open(snapshot_rows, snapshot_ends, txn_limit) {
            continue;
        }
        if let Some(txn) = open.take() {
            txn_limit = next_limit(txn.events, snapshot_rows);
            txn.commit(writer, source, telemetry).instrument(span).await?;
        }
        for p in source.snapshot_progress() {
            let table = p.table.to_string();
            telemetry.record_snapshot(&table, p.rows, p.estimated_rows);
            if !p.done {
                telemetry.set_state(&table, TableState::Snapshotting);
            }
        }
    }
}
