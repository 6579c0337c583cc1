//! Applying batches: one at a time, in its own task, while the pipeline
//! goes on consuming and decoding; a record the destination refuses for
//! good is dead-lettered and the rest applied again; anything that may
//! clear pauses the table and retries the same batch.
//!
//! At most one batch is being applied, one more waits decoded, and one
//! more buffers (up to `batch_max_bytes`; then consuming waits). One apply
//! at a time keeps each table's batches in Kafka order; when an apply
//! fails, its records go back in front of what arrived since and the
//! table pauses, so nothing moves past unapplied data. The benchmark's
//! 1M-row snapshot: the sink had been busy 80-90% of each second decoding
//! and applying, and fell ~5 s behind the source; with the overlap it
//! keeps up with it.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use rdkafka::consumer::{CommitMode, Consumer};
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::oneshot;
use tracing::{debug, error, info, info_span, warn, Instrument};
use tributary_connectors::sink::bookkeeping::FENCED_CLASS;
use tributary_connectors::sink::verify;
use tributary_connectors::{policy, ApplyError, Decision, Error, KafkaPosition, Sink, SinkBatch, SinkRecord};
use tributary_operations::telemetry::{ConsistentPoint, TableState, VerifiedRange};
use tributary_schemas::records::requests::Request;
use tributary_schemas::records::VerifyRange;
use tributary_schemas::{TableId, TableSchema};

use crate::buffer::Buffer;
use crate::dead_letters::Stage;
use crate::partitions::Partition;
use crate::pipeline::Pipeline;

/// The raw side of a batch taken out of its topic's buffer and decoded:
/// what the pipeline keeps of it while it waits ([`DecodedBatch`]) and
/// while it is applied ([`InFlight`]).
pub(crate) struct RawBatch {
    pub(crate) topic: String,
    pub(crate) table: TableId,
    /// The raw records (for the dead-letter topic, and to retry).
    pub(crate) buf: Buffer,
    /// Index into `buf.records` of each of the batch's records.
    pub(crate) raw_index: Vec<usize>,
    pub(crate) started: Instant,
    pub(crate) decoded: Duration,
    /// The oldest source time among its changes: the table's lag counts
    /// from it until the batch is applied.
    pub(crate) oldest: Option<i64>,
    /// The last source transaction whose END the batch holds (transactional
    /// consistency): once applied, the destination reflects the source as
    /// of its commit.
    pub(crate) consistent: Option<crate::transactions::End>,
    /// Whole source transactions the batch holds.
    pub(crate) transactions: u64,
    /// The source transactions over the memory bound the batch applies
    /// part of, in a destination transaction held open across batches
    /// (empty: the batch is a unit of its own).
    pub(crate) spans: Vec<String>,
}

/// A batch decoded and waiting for the one being applied to end.
pub(crate) struct DecodedBatch {
    pub(crate) raw: RawBatch,
    pub(crate) batch: SinkBatch,
}

/// What an apply task hands back. A batch that was applied comes back
/// without its records: the task frees them after handing this back, while
/// the next batch is applied. Freed on the pipeline's thread, a snapshot
/// batch's rows took 5-8 ms with the destination idle until the next batch
/// started; freed in the task before it ended, they still delayed the next
/// batch (the destination sat 11 ms idle between one batch's `COMMIT` and
/// the next one's first statement).
pub(crate) struct ApplyOutcome {
    batch: SinkBatch,
    result: Result<(), ApplyError>,
    /// What comparing the batch's leading verify records found.
    verified: Vec<verify::Outcome>,
    /// Events in the batch, and the newest source time among them.
    events: usize,
    newest: Option<i64>,
    /// Per table, its changes and their source times.
    per_table: Vec<PerTable>,
}

/// A table's changes in a batch: how many, and their oldest and newest
/// source times.
pub(crate) struct PerTable {
    pub(crate) table: TableId,
    pub(crate) changes: usize,
    pub(crate) oldest: i64,
    pub(crate) newest: i64,
}

/// The tables of a batch's changes (a batch of the lane of every topic
/// has several), in their first order.
pub(crate) fn tables_of(records: &[(KafkaPosition, SinkRecord)]) -> Vec<PerTable> {
    let mut out: Vec<PerTable> = Vec::new();
    for (_, r) in records {
        let SinkRecord::Change(ev) = r else { continue };
        let ts = ev.source.ts_ms;
        match out.iter_mut().find(|t| t.table == ev.schema.id) {
            Some(t) => {
                t.changes += 1;
                t.oldest = t.oldest.min(ts);
                t.newest = t.newest.max(ts);
            }
            None => out.push(PerTable {
                table: ev.schema.id.clone(),
                changes: 1,
                oldest: ts,
                newest: ts,
            }),
        }
    }
    out
}

/// The newest source time of a batch's changes, from its tables'.
fn newest_of(per_table: &[PerTable]) -> Option<i64> {
    per_table.iter().map(|t| t.newest).max()
}

impl ApplyOutcome {
    /// The outcome of `batch`, and its records when they are no longer
    /// needed (applied) for the caller to free.
    fn new(
        mut batch: SinkBatch,
        result: Result<(), ApplyError>,
        verified: Vec<verify::Outcome>,
    ) -> (Self, Vec<(KafkaPosition, SinkRecord)>) {
        let events = batch.records.len();
        let per_table = tables_of(&batch.records);
        let newest = newest_of(&per_table);
        let done = if result.is_ok() {
            std::mem::take(&mut batch.records)
        } else {
            Vec::new()
        };
        (Self { batch, result, verified, events, newest, per_table }, done)
    }
}

/// The source times of a batch's changes.
pub(crate) fn source_ts(records: &[(KafkaPosition, SinkRecord)]) -> impl Iterator<Item = i64> + '_ {
    records.iter().filter_map(|(_, r)| match r {
        SinkRecord::Change(ev) => Some(ev.source.ts_ms),
        SinkRecord::TableDropped(_)
        | SinkRecord::Copied(..)
        | SinkRecord::Reset(..)
        | SinkRecord::Sequence(..)
        | SinkRecord::Objects(..)
        | SinkRecord::Verify(..) => None,
    })
}

/// A verify record leading a batch: the table's shape and the range.
type Leading<'a> = (&'a std::sync::Arc<TableSchema>, &'a VerifyRange);

/// Compares the verify records a batch starts with (the buffers start a
/// batch at each, see `buffer::starts_batch`).
async fn verify_leading<S: Sink>(sink: &mut S, batch: &SinkBatch, repair: bool) -> Result<Vec<verify::Outcome>, Error> {
    let mut out = Vec::new();
    let leading: Vec<_> = batch
        .records
        .iter()
        .map_while(|(_, r)| match r {
            SinkRecord::Verify(schema, range) => Some((schema, range)),
            _ => None,
        })
        .collect();
    // Per table, verification and partition (the copies of a range on a
    // topic of several partitions interleave), in their order.
    let mut groups: Vec<Vec<Leading<'_>>> = Vec::new();
    for (schema, range) in leading {
        let same = |g: &&mut Vec<Leading<'_>>| {
            g.first()
                .is_some_and(|(s, r)| s.id == schema.id && r.id == range.id && r.partition == range.partition)
        };
        match groups.iter_mut().find(|g| same(g)) {
            Some(g) => g.push((schema, range)),
            None => groups.push(vec![(schema, range)]),
        }
    }
    for group in groups {
        let mut rest = &group[..];
        while let Some(&(schema, first)) = rest.first() {
            let n = read_together(rest.iter().map(|&(_, r)| r));
            let rows: usize = rest[..n].iter().map(|(_, r)| r.rows.len()).sum();
            let ranges: Vec<_> = rest[..n].iter().map(|&(_, r)| r).collect();
            let span = info_span!("verify", table = %schema.id, id = first.id, ranges = n, rows);
            out.extend(sink.verify_ranges(schema, &ranges, repair).instrument(span).await?);
            rest = &rest[n..];
        }
    }
    Ok(out)
}

/// How many of `ranges` (one table's, verification's and partition's, in
/// their order) one read of the destination covers: consecutive ranges
/// (each one's lower bound the one before's upper bound) up to a bounded
/// number of rows. A range to the end is followed by none: a range after
/// it, from the start, is one sent again (its partition assigned to this
/// runner a second time), read on its own.
fn read_together<'a>(ranges: impl IntoIterator<Item = &'a VerifyRange>) -> usize {
    let mut ranges = ranges.into_iter();
    let Some(mut previous) = ranges.next() else { return 0 };
    let mut n = 1;
    let mut rows = previous.rows.len();
    for r in ranges {
        if previous.until.is_none() || r.after != previous.until || rows + r.rows.len() > VERIFY_READ_ROWS {
            break;
        }
        rows += r.rows.len();
        n += 1;
        previous = r;
    }
    n
}

/// Rows of the source's ranges one read of the destination covers at most:
/// consecutive ranges share a query (fewer statements, and on BigQuery
/// fewer bytes billed), in a bounded share of memory.
const VERIFY_READ_ROWS: usize = 50_000;

/// The batch being applied in its own task.
pub(crate) struct InFlight {
    pub(crate) raw: RawBatch,
    /// Partitions revoked while it was applied: if it fails, none of their
    /// records go back into a buffer (they may be assigned again, and are
    /// then consumed again from the destination's offsets).
    pub(crate) revoked: BTreeSet<(String, i32)>,
    /// The task's outcome; closed without one if the task panicked.
    done: oneshot::Receiver<ApplyOutcome>,
}

/// The end of the batch being applied; never, when there is none.
pub(crate) async fn wait_applied(in_flight: &mut Option<InFlight>) -> Result<ApplyOutcome, oneshot::error::RecvError> {
    match in_flight {
        Some(f) => (&mut f.done).await,
        None => futures::future::pending().await,
    }
}

/// How a batch that was not applied ends: its records (what is left of
/// them), the partitions revoked meanwhile, and why.
type NotApplied = (Buffer, BTreeSet<(String, i32)>, Error);

/// Whether `partition` of `topic` is among `revoked`.
fn is_revoked(revoked: &BTreeSet<(String, i32)>, topic: &str, partition: i32) -> bool {
    revoked.iter().any(|(t, p)| *p == partition && t == topic)
}

impl<S: Sink + 'static> Pipeline<S> {
    /// Decodes `topic`'s buffer and starts applying it, or, while another
    /// batch is being applied, keeps it decoded to start right after (so
    /// decoding overlaps the destination's work). A retryable failure to
    /// decode pauses the table, as a failed apply does.
    pub(crate) async fn flush(&mut self, topic: &str) {
        let table = self.table_of(topic);
        let label = (self.labeler)(&table);
        let records = self.buffers.get(topic).map_or(0, |b| b.records.len());
        let span = info_span!("batch", table = %label, topic, records);
        let prepared = self.prepare(topic).instrument(span).await;
        match prepared {
            Ok(Some(p)) => {
                if self.in_flight.is_none() {
                    self.start(p);
                } else {
                    self.ready = Some(p);
                }
            }
            Ok(None) => {}
            Err((table, error)) => self.schedule_retry(topic, &table, &error),
        }
    }

    /// Applies a prepared batch in its own task: the pipeline goes on
    /// consuming and decoding. One batch at a time, so a table's batches
    /// are applied in order and a failed one is retried before anything
    /// after it.
    pub(crate) fn start(&mut self, p: DecodedBatch) {
        if self.paused_lanes().contains(&p.raw.topic) {
            // Paused while it waited: nothing buffered is applied.
            self.restore(p.raw.topic, p.raw.buf, &BTreeSet::new());
            return;
        }
        let sink = self.sink.clone();
        let repair = self.repairs.as_ref().is_some_and(|r| r.repair);
        let mut batch = p.batch;
        let mut raw = p.raw;
        // Set now, not when decoded: the batch before may have left a
        // destination transaction open, which this one continues, and
        // commits with the offsets of every partition it covered.
        if let Some(open) = &self.open_unit {
            batch.unit.continues = true;
            for t in &open.transactions {
                if !raw.spans.contains(t) {
                    raw.spans.push(t.clone());
                }
            }
            for ((t, part), o) in &open.offsets {
                if !batch.next_offsets.iter().any(|(bt, bp, _)| bp == part && bt == t) {
                    batch.next_offsets.push((t.clone(), *part, *o));
                }
            }
        }
        batch.expected_offsets = batch
            .next_offsets
            .iter()
            .filter_map(|(t, p, _)| self.partitions.get(t, *p).map(|s| (t.clone(), *p, s.stored)))
            .collect();
        let (tx, done) = oneshot::channel();
        tokio::spawn(async move {
            let mut guard = sink.lock().await;
            // Compared before anything after them is applied: the
            // destination holds every change before them, none after.
            let (verified, result) = match verify_leading(&mut *guard, &batch, repair).await {
                Ok(verified) => (verified, guard.apply(&batch).await),
                Err(e) => (Vec::new(), Err(ApplyError::from(e))),
            };
            drop(guard);
            let (applied, records) = ApplyOutcome::new(batch, result, verified);
            // The pipeline may have stopped waiting (shutting down): then
            // there is nobody to tell.
            let _ = tx.send(applied);
            drop(records);
        });
        self.in_flight = Some(InFlight { raw, revoked: BTreeSet::new(), done });
    }

    /// Puts the records of a batch that was not applied back in front of
    /// what arrived for its topic since, without the partitions revoked
    /// meanwhile (their next owner consumes them again from the
    /// destination's offsets).
    pub(crate) fn restore(&mut self, topic: String, older: Buffer, revoked: &BTreeSet<(String, i32)>) {
        let partitions = &self.partitions;
        self.buffers
            .restore(topic, older, |t, p| !is_revoked(revoked, t, p) && partitions.contains(t, p));
    }

    /// Waits for the batch being applied and the one decoded meanwhile.
    pub(crate) async fn finish_applying(&mut self) {
        while self.in_flight.is_some() {
            let r = wait_applied(&mut self.in_flight).await;
            self.finish(r).await;
        }
    }

    /// Handles the end of the batch applied in its task, then starts the
    /// one decoded meanwhile.
    pub(crate) async fn finish(&mut self, joined: Result<ApplyOutcome, oneshot::error::RecvError>) {
        let Some(f) = self.in_flight.take() else {
            return;
        };
        let label = (self.labeler)(&f.raw.table);
        let span = info_span!("batch", table = %label, topic = %f.raw.topic, records = f.raw.raw_index.len());
        let topic = f.raw.topic.clone();
        let table = f.raw.table.clone();
        let spans = f.raw.spans.clone();
        // The raw records of an applied batch are freed once the next batch
        // is on its way.
        let applied = match self.finish_inner(f, joined).instrument(span).await {
            Ok(buf) => Some(buf),
            Err((_, revoked, error)) if error.class() == FENCED_CLASS || !spans.is_empty() => {
                // Another runner (or an operator) stored offsets for these
                // partitions: nothing of the batch was written. Or the
                // destination transaction held open for a large source
                // transaction failed, undoing its earlier batches too,
                // which went out of memory: read again, that transaction
                // then goes in parts (each one retried, dead-lettered, as
                // any batch). Everything buffered for the topic is dropped
                // and its partitions go on from what is stored now.
                let label = (self.labeler)(&table);
                if spans.is_empty() {
                    warn!(table = %label, topic = %topic, error = %error,
                        "batch fenced: reading the stored offsets again");
                } else {
                    warn!(table = %label, transactions = ?spans, error = %error,
                        "the destination transaction held open for a large source transaction failed: reading it \
                         again, to apply it in parts");
                    self.open_unit = None;
                    for t in spans {
                        self.transactions.no_span(t);
                    }
                }
                self.telemetry
                    .record_error(&label, &error.to_string(), &error.kind().to_string());
                self.read_again(&topic, &revoked).await;
                None
            }
            Err((buf, revoked, error)) => {
                // Newer records of the table go back behind the failed ones.
                if self.ready.as_ref().is_some_and(|r| r.raw.topic == topic) {
                    if let Some(r) = self.ready.take() {
                        self.restore(r.raw.topic, r.raw.buf, &revoked);
                    }
                }
                self.restore(topic.clone(), buf, &revoked);
                self.schedule_retry(&topic, &table, &error);
                None
            }
        };
        if self.in_flight.is_none() {
            if let Some(p) = self.ready.take() {
                self.start(p);
            }
        }
        drop(applied);
    }

    /// Drops what is buffered and decoded of `topic` (of the lane of every
    /// topic: all of them, and what waits to make whole transactions) and
    /// goes on with its partitions, but `revoked`, from the offsets the
    /// destination stores now.
    pub(crate) async fn read_again(&mut self, topic: &str, revoked: &BTreeSet<(String, i32)>) {
        if self.ready.as_ref().is_some_and(|r| r.raw.topic == topic) {
            self.ready = None;
        }
        self.buffers.clear(topic);
        let all = self.buffers.lane.is_some();
        if all {
            self.transactions.clear();
        }
        let parts: Vec<Partition> = self
            .partitions
            .iter()
            .filter(|(t, p, _)| (all || *t == topic) && !is_revoked(revoked, t, *p))
            .map(|(t, p, _)| Partition::new(t, p))
            .collect();
        self.restart_from_stored(parts).await;
    }

    async fn finish_inner(
        &mut self,
        f: InFlight,
        joined: Result<ApplyOutcome, oneshot::error::RecvError>,
    ) -> Result<Buffer, NotApplied> {
        let InFlight {
            raw:
                RawBatch {
                    topic,
                    table,
                    mut buf,
                    mut raw_index,
                    started,
                    decoded,
                    consistent,
                    transactions,
                    spans,
                    ..
                },
            revoked,
            ..
        } = f;
        let ApplyOutcome {
            mut batch,
            result,
            verified,
            mut events,
            mut newest,
            mut per_table,
        } = match joined {
            Ok(r) => r,
            Err(_) => {
                // The task panicked or was cancelled: nothing is known to
                // be applied, so the batch is retried.
                let error = Error::retryable("the apply task ended without an outcome (it panicked or was cancelled)");
                return Err((buf, revoked, error));
            }
        };
        // Part of a destination transaction held open across batches: a
        // failure undid all of it, which the caller reads again.
        let mut result = match result {
            Err(ApplyError { error, .. }) if batch.unit.spans() => return Err((buf, revoked, error)),
            other => other,
        };
        // A record the destination refuses is dead-lettered and the rest
        // applied again (here, in the pipeline: a rare path).
        loop {
            match result {
                Ok(()) => break,
                Err(ApplyError { error, record }) => match policy(error.kind(), 1) {
                    Decision::DeadLetter => {
                        let blamed: Vec<usize> = match record {
                            Some(r) if r < batch.records.len() => vec![r],
                            _ => {
                                error!(error = %error, "a permanent error without a record to blame: dead-lettering the whole batch");
                                (0..batch.records.len()).collect()
                            }
                        };
                        if blamed.is_empty() {
                            return Err((buf, revoked, error));
                        }
                        // A control record (table-reset, table-copied,
                        // table-dropped) is never dead-lettered: skipping
                        // it loses what it does to every row of the table,
                        // and a replay would apply it out of order (a reset
                        // replayed later forgets the positions of newer
                        // rows). The table waits for an operator instead.
                        if let Some(&b) = blamed.iter().find(|&&b| !matches!(batch.records[b].1, SinkRecord::Change(_)))
                        {
                            let at = &batch.records[b].0;
                            let error = Error::needs_operator(format!(
                                "a control record ({} partition {} offset {}) cannot be applied: {error}",
                                at.topic, at.partition, at.offset
                            ))
                            .with_class("tributary.control_refused")
                            .with_hint(
                                "control records are never dead-lettered: fix what the destination refuses (the \
                                 error above; a table-reset rewrites every row's position, so a row that breaks a \
                                 constraint added later refuses it); the table goes on by itself",
                            );
                            return Err((buf, revoked, error));
                        }
                        for &b in blamed.iter().rev() {
                            let ri = raw_index[b];
                            let raw = buf.records[ri].clone();
                            if let Err(e) = self.dead_letter(&raw, Stage::Apply, &error, &table).await {
                                return Err((buf, revoked, e));
                            }
                            batch.records.remove(b);
                            raw_index.remove(b);
                            buf.remove(ri);
                            for r in raw_index.iter_mut().filter(|r| **r > ri) {
                                *r -= 1;
                            }
                        }
                        result = {
                            let mut sink = self.sink.lock().await;
                            sink.apply(&batch).await
                        };
                        events = batch.records.len();
                        per_table = tables_of(&batch.records);
                        newest = newest_of(&per_table);
                    }
                    _ => return Err((buf, revoked, error)),
                },
            }
        }
        // Done: tell Kafka (for monitoring) and the status.
        let label = (self.labeler)(&table);
        for outcome in &verified {
            // On a topic of several partitions, each of this runner's
            // partitions (of those the range was written to) ends it.
            // (The lane of every topic: the table's own topic.)
            let own = match &self.buffers.lane {
                Some(_) => self
                    .tables
                    .iter()
                    .find(|(_, t)| **t == outcome.table)
                    .map_or(topic.clone(), |(topic, _)| topic.clone()),
                None => topic.clone(),
            };
            let label = (self.labeler)(&outcome.table);
            let parts = outcome
                .partition
                .map_or(1, |p| self.partitions.of_topic(&own).filter(|(i, _)| *i < p.of).count().max(1) as u64);
            let asked = if self.repairs.as_ref().is_some_and(|r| r.repair) {
                outcome.to_resend().len() as u64
            } else {
                0
            };
            self.report_verified(&label, outcome, asked, parts);
            self.ask_repair(&label, outcome).await;
            self.ask_rows(&label, outcome).await;
        }
        if self.buffers.lane.is_some() {
            // Every table of the batch, and the moment the destination now
            // reflects.
            let bookkeeping = crate::transactions::consistent_as_of_table();
            for t in per_table.iter().filter(|t| t.table != bookkeeping) {
                let label = (self.labeler)(&t.table);
                let bytes = (buf.bytes as u64).saturating_mul(t.changes as u64) / (events.max(1) as u64);
                self.telemetry.record_events(&label, t.changes as u64, bytes, Some(t.newest));
                self.telemetry.record_applied(&label, Some(t.newest));
                self.telemetry
                    .set_state(&label, tributary_operations::telemetry::TableState::Streaming);
            }
            // In a destination transaction held open, nothing is visible
            // yet: the batch that commits it moves the consistent point.
            if !batch.unit.more {
                let point =
                    consistent.map(|end| ConsistentPoint { transaction_id: end.id, committed_at_ms: end.ts_ms });
                self.telemetry.record_transactions(transactions, point);
            }
        } else {
            self.telemetry.record_events(&label, events as u64, buf.bytes as u64, newest);
            self.telemetry.record_applied(&label, newest);
        }
        // The batch decoded meanwhile is seen and not applied.
        if let Some(ts) = self.ready.as_ref().filter(|r| r.raw.topic == topic).and_then(|r| r.raw.oldest) {
            self.telemetry.record_pending(&label, ts);
        }
        self.telemetry.record_batch_seconds(started.elapsed().as_secs_f64());
        if buf.retry.is_some() {
            self.pause(&topic, false);
            info!(table = %label, "resumed");
        }
        self.set_streaming(&topic, &label);
        if batch.unit.more {
            // Nothing is durable until the batch that commits the open
            // destination transaction: its offsets wait with it.
            // (`spans` holds the unit's earlier transactions too: `start`.)
            let open = self.open_unit.get_or_insert_with(Default::default);
            for (t, p, o) in &batch.next_offsets {
                open.offsets.insert((t.clone(), *p), *o);
            }
            open.transactions = spans;
            return Ok(buf);
        }
        self.open_unit = None;
        // Stored now: what was dead-lettered below these offsets is never
        // consumed again.
        self.dead_letters.stored(&batch.next_offsets);
        let mut tpl = TopicPartitionList::new();
        for (t, p, o) in &batch.next_offsets {
            if is_revoked(&revoked, t, *p) {
                continue;
            }
            if let Some(state) = self.partitions.get_mut(t, *p) {
                state.stored = Some(*o);
                let _ = tpl.add_partition_offset(t, *p, Offset::Offset(*o));
            }
        }
        if tpl.count() > 0 {
            if let Err(e) = self.consumer.commit(&tpl, CommitMode::Async) {
                debug!(error = %e, "cannot mirror offsets to Kafka");
            }
        }
        debug!(
            table = %label,
            events,
            decode_ms = decoded.as_millis() as u64,
            apply_ms = (started.elapsed() - decoded).as_millis() as u64,
            "applied"
        );
        Ok(buf)
    }

    /// Asks the source runner to send the rows of a verified range that
    /// are missing or changed again, with repairs on: gathered per
    /// verification, asked once it ended here (see `RepairRequests::gather`).
    async fn ask_repair(&self, label: &str, outcome: &verify::Outcome) {
        let Some(repairs) = self.repairs.as_ref().filter(|r| r.repair) else {
            return;
        };
        let ended = self.verification_ended(label, outcome.id);
        for request in repairs.gather(&outcome.table, outcome.id, outcome.to_resend(), ended) {
            let Request::Repair { verification, keys, .. } = &request else {
                continue;
            };
            let n = keys.len();
            match repairs.send(&request).await {
                Ok(()) => {
                    info!(table = %label, verification, rows = n, "verification: asked the source for the rows again");
                }
                Err(e) => {
                    warn!(table = %label, verification, error = %e,
                        "verification: cannot ask the source for the rows again; the next verification finds them still different");
                }
            }
        }
    }

    /// Whether verification `id` of the table ended here.
    fn verification_ended(&self, label: &str, id: u64) -> bool {
        self.telemetry
            .table(label)
            .and_then(|t| t.verification)
            .is_some_and(|v| v.id == id && v.finished_ms.is_some())
    }

    /// Asks the source runner to verify by rows the summarized ranges
    /// whose summary differed or could not be computed here: gathered per
    /// verification, asked once it ended here (see
    /// `RepairRequests::gather_ranges`).
    async fn ask_rows(&self, label: &str, outcome: &verify::Outcome) {
        let Some(requests) = &self.repairs else {
            if outcome.ask_rows.is_some() {
                warn!(table = %label, verification = outcome.id,
                    "verification: cannot ask the source for the range's rows (the runner has no `prefix`, which \
                     names the requests topic)");
            }
            return;
        };
        let ended = self.verification_ended(label, outcome.id);
        let ranges = outcome.ask_rows.iter().cloned().collect();
        for request in requests.gather_ranges(&outcome.table, outcome.id, ranges, ended) {
            let Request::Verify { verification, ranges, .. } = &request else {
                continue;
            };
            let n = ranges.len();
            match requests.send(&request).await {
                Ok(()) => {
                    info!(table = %label, verification, ranges = n,
                        "verification: asked the source to verify ranges by their rows");
                }
                Err(e) => {
                    warn!(table = %label, verification, error = %e,
                        "verification: cannot ask the source to verify ranges by their rows; the next verification \
                         finds what differs");
                }
            }
        }
    }

    /// Says what a verified range found: status, metrics, and each
    /// differing key in the log (never values).
    fn report_verified(&self, label: &str, outcome: &verify::Outcome, repair_asked: u64, parts: u64) {
        let mut differences: Vec<String> = outcome.schema.iter().map(|s| format!("columns: {s}")).collect();
        differences.extend(outcome.summary_difference());
        differences.extend(outcome.differences.iter().map(ToString::to_string));
        for d in differences.iter().take(verify::MAX_LOGGED_DIFFERENCES) {
            warn!(table = %label, verification = outcome.id, "verification: {d}");
        }
        if outcome.removed > 0 {
            info!(table = %label, verification = outcome.id, rows = outcome.removed,
                "verification: removed the rows only the destination had");
        }
        if let Some(why) = &outcome.unsupported {
            warn!(table = %label, verification = outcome.id, "verification: the range is not compared: {why}");
        }
        self.telemetry.record_verified(
            label,
            &VerifiedRange {
                id: outcome.id,
                position: (outcome.at.commit, outcome.at.index),
                rows: outcome.rows,
                differing: outcome.differing,
                differs: outcome.differing > 0 || outcome.summary_differs.is_some(),
                differences: &differences,
                unsupported: outcome.unsupported.as_deref(),
                last: outcome.last,
                parts,
                repaired: outcome.removed + repair_asked,
                schema_differs: !outcome.schema.is_empty(),
            },
        );
        if outcome.last {
            let ended = self
                .telemetry
                .table(label)
                .and_then(|t| t.verification)
                .filter(|v| v.finished_ms.is_some());
            if let Some(v) = ended {
                if v.state == "equal" {
                    info!(table = %label, verification = v.id, rows = v.rows_verified, "verification: equal to the source");
                } else {
                    warn!(table = %label, verification = v.id, rows = v.rows_verified, differing = v.rows_differing,
                        state = %v.state, "verification: the destination differs from the source");
                }
            }
        }
    }

    /// Schedules a retry of `topic`'s batch after `error`, per [`policy`]:
    /// the table pauses (its partitions fetch nothing meanwhile) and says
    /// why.
    pub(crate) fn schedule_retry(&mut self, topic: &str, table: &TableId, error: &Error) {
        let label = (self.labeler)(table);
        let now = Instant::now();
        let retry = self.buffers.schedule_retry(topic, error.kind(), now);
        if retry.attempt == 1 {
            self.pause(topic, true);
        }
        self.telemetry.set_state(&label, TableState::Paused(error.to_string()));
        self.telemetry
            .record_error(&label, &error.to_string(), &error.kind().to_string());
        warn!(
            table = %label,
            kind = %error.kind(),
            error = %error,
            hint = error.hint().unwrap_or(""),
            attempt = retry.attempt,
            retry_in_ms = (retry.at - now).as_millis() as u64,
            "paused"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(after: Option<u32>, until: Option<u32>, rows: usize) -> VerifyRange {
        let bound = |k: Option<u32>| k.map(|k| vec![Some(k.to_string())]);
        VerifyRange {
            id: 1,
            at: Default::default(),
            connector: "postgresql".into(),
            schema_id: 1,
            key_schema_id: Some(2),
            after: bound(after),
            until: bound(until),
            last: until.is_none(),
            rows: vec![(String::new(), String::new(), String::new()); rows],
            partition: None,
            columns: None,
            summary: None,
        }
    }

    #[test]
    fn consecutive_ranges_are_read_together_and_a_range_sent_again_alone() {
        let whole = [
            range(None, Some(10), 5),
            range(Some(10), Some(20), 5),
            range(Some(20), None, 5),
        ];
        assert_eq!(read_together(&whole), 3);
        assert_eq!(read_together(&whole[1..]), 2);
        // The copy of a partition read twice: its last range (to the end)
        // and then its first (from the start) again. Read as one they
        // bound nothing: every row would be missing.
        let twice = [
            range(Some(20), None, 5),
            range(None, Some(10), 5),
            range(Some(10), None, 5),
        ];
        assert_eq!(read_together(&twice), 1);
        assert_eq!(read_together(&twice[1..]), 2);
        // A gap, and the bound on rows.
        assert_eq!(read_together(&[range(None, Some(10), 5), range(Some(11), None, 5)]), 1);
        let big = [range(None, Some(10), VERIFY_READ_ROWS - 1), range(Some(10), None, 2)];
        assert_eq!(read_together(&big), 1);
        assert_eq!(read_together(&[]), 0);
    }
}
