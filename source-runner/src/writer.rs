//! The topic writer: a source's batches into Kafka transactions. Registers
//! each table's schema versions, encodes its changes into its topic, adds
//! the control records the held tables call for, and commits each
//! transaction with the checkpoint and the offsets-topic records that
//! cover it.
//!
//! Exactly once rests on three facts:
//! 1. the events of the batches and the checkpoint that covers them are
//!    written in one Kafka transaction, so `read_committed` consumers see
//!    both or neither;
//! 2. the transactional id is stable per runner, so a restarted runner
//!    fences its crashed predecessor and the broker aborts whatever it
//!    left open before the last checkpoint is read;
//! 3. the source releases history (slot flush LSN) only after the commit.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use rdkafka::admin::AdminClient;
use rdkafka::client::DefaultClientContext;
use rdkafka::message::{Header, OwnedHeaders};
use tracing::{info, warn};
use tributary_connectors::kafka::kafka_error;
use tributary_connectors::{Checkpoint, Error, ErrorKind, Source, SourceBatch, SourceMessage};
use tributary_operations::telemetry::Telemetry;
use tributary_schemas::avro::EnvelopeOptions;
use tributary_schemas::encoder::EventEncoder;
use tributary_schemas::records::transaction::TransactionRecord;
use tributary_schemas::records::{ControlRecord, OffsetsRecord, RangePartition, VerifyRange};
use tributary_schemas::topic::TopicNaming;
use tributary_schemas::{ChangeEvent, Op, SchemaError, SnapshotMarker, TableId, TableSchema};

use crate::config::{IncompatibleSchemaChanges, SourceRunnerConfig};
use crate::held_tables::{new_reset_id, HeldTables};
use crate::kafka::admin::Topics;
use crate::kafka::producer::TransactionalProducer;
use crate::offsets_topic;
use crate::transaction::TableCounts;

/// The Kafka side of a source runner: its producer, its topics, the
/// encoder and the held tables.
pub struct TopicWriter {
    config: SourceRunnerConfig,
    producer: TransactionalProducer,
    topics: Topics,
    encoder: EventEncoder,
    naming: TopicNaming,
    /// The schema each table's last produced event used.
    schemas: HashMap<TableId, Arc<TableSchema>>,
    /// The tables whose changes are held back; kept in the offsets topic
    /// beside the checkpoint, in the same transaction.
    pub(crate) held: HeldTables,
    /// Side records of batches in the open transaction, written with its
    /// checkpoint (`None`: deleted).
    side_pending: BTreeMap<String, Option<String>>,
    /// The registry, for the transaction topic's schemas.
    registry: tributary_schemas::registry::Registry,
    /// The registry's ids of the transaction topic's key and value schemas,
    /// once registered.
    transaction_ids: Option<(u32, u32)>,
    /// Per open source transaction, its changes not written per table (a
    /// held table's, one that could not be encoded): its END counts only
    /// what the topics hold, or a sink applying whole transactions would
    /// wait for them for ever.
    unwritten: HashMap<String, HashMap<TableId, i64>>,
}

/// What the offsets topic held for the runner at start, besides the held
/// tables (which the writer keeps).
pub struct Restored {
    /// The last committed checkpoint.
    pub checkpoint: Option<Checkpoint>,
    /// The source's side records, for `Source::restore_side_records`.
    pub side_records: BTreeMap<String, String>,
}

/// The Kafka headers of a control record.
fn control_headers(record: &ControlRecord) -> OwnedHeaders {
    record
        .headers()
        .into_iter()
        .fold(OwnedHeaders::new(), |h, (key, value)| h.insert(Header { key, value: Some(value.as_str()) }))
}

impl TopicWriter {
    /// Connects to Kafka and the registry and fences any earlier instance of
    /// this runner (`init_transactions`).
    pub async fn connect(config: &SourceRunnerConfig) -> Result<Self, Error> {
        let client = config.kafka.client_config().map_err(|e| Error::needs_operator(e.to_string()))?;
        let producer = TransactionalProducer::create(config)?;
        // Started now, awaited below: the admin and registry clients and the
        // offsets topic are made meanwhile (the start-up is a snapshot's
        // first second, with the machine mostly idle).
        let fencing = producer.fence();
        let admin: AdminClient<DefaultClientContext> =
            client.create().map_err(|e| kafka_error("cannot create the admin client", e))?;
        let registry = config
            .schema_registry
            .registry(&config.schema_registry_url)
            .map_err(|e| Error::needs_operator(e.to_string()))?;
        let encoder = EventEncoder::new(
            registry.clone(),
            EnvelopeOptions {
                connector: config.connector().to_string(),
                tombstones: config.tombstones,
            },
        )
        .register_incompatible(config.incompatible_schema_changes == IncompatibleSchemaChanges::Register);
        let mut topics = Topics::new(admin, producer.client());
        let offsets_topic = config.offsets_topic();
        // A refused login fails the start at once, with its reason.
        let (fenced, offsets) = tokio::select! {
            both = async { tokio::join!(fencing, topics.ensure(&offsets_topic, true)) } => both,
            refused = producer.authentication_failed() => return Err(refused),
        };
        fenced?;
        offsets?;
        topics
            .check_offsets_topic(&offsets_topic, &config.kafka.bootstrap_servers)
            .await?;
        Ok(TopicWriter {
            config: config.clone(),
            producer,
            topics,
            encoder,
            naming: TopicNaming::new(config.topic_template.clone()),
            schemas: HashMap::new(),
            held: HeldTables::default(),
            side_pending: BTreeMap::new(),
            registry,
            transaction_ids: None,
            unwritten: HashMap::new(),
        })
    }

    /// Reads this runner's records from the offsets topic: its last
    /// committed checkpoint and side records, and its held tables (kept).
    ///
    /// Must run after [`TopicWriter::connect`]: `init_transactions` has
    /// aborted whatever a crashed predecessor left open, so
    /// `read_committed` sees the final state.
    pub async fn restore(&mut self) -> Result<Restored, Error> {
        let stored = offsets_topic::read(&self.config).await?;
        self.held = HeldTables::restore(stored.held, stored.reset_all);
        self.side_pending.clear();
        Ok(Restored {
            checkpoint: stored.checkpoint,
            side_records: stored.side,
        })
    }

    /// Side records of a batch just added: written with the open
    /// transaction's checkpoint.
    pub fn stage_side_records(&mut self, records: Vec<(String, Option<String>)>) {
        self.side_pending.extend(records);
    }

    /// Records a reset asked by `source-runner reset`, to be carried out at
    /// the runner's next start: of `tables`, or of every table when there
    /// is none. Commits it alone (no checkpoint) in the runner's own
    /// transactional id: [`TopicWriter::connect`] fenced a running runner,
    /// which fails its next commit and starts again, finding the request.
    pub async fn record_reset(&mut self, tables: &[TableId]) -> Result<u64, Error> {
        let reset = new_reset_id();
        self.held.record_reset(tables, reset);
        self.producer.begin().await?;
        let records = self.held.records();
        if let Err(e) = self.send_offsets_records(&records).await {
            self.producer.abort().await;
            return Err(e);
        }
        self.producer.commit().await?;
        self.held.committed();
        Ok(reset)
    }

    /// Copies `table` (`schema.table`) again while the stream goes on, as
    /// `POST /resync` asks: what a reset does at a start (see
    /// [`TopicWriter::record_reset`] and the pipeline's start), done between
    /// two batches instead, without a restart. The state after a committed
    /// batch is the state a start from its checkpoint makes, so the source
    /// copies as it would right after `Source::start`. The held table and
    /// the source's plan reach the offsets topic with the next checkpoint;
    /// a crash before that loses the request, never a change. The outer
    /// result is the runner's (an error restarts it from its checkpoint),
    /// the inner one the operator's answer.
    pub async fn resync_live(&mut self, source: &mut dyn Source, table: &str) -> Result<Result<String, String>, Error> {
        let Some(id) = table
            .split_once('.')
            .filter(|(s, t)| !s.is_empty() && !t.is_empty())
            .map(|(s, t)| TableId::new(s, t))
        else {
            return Ok(Err(format!("table {table}: expected schema.table")));
        };
        let reset = new_reset_id();
        let before = match self.held.copy_again_live(&id, reset) {
            Ok(before) => before,
            Err(refused) => return Ok(Err(refused)),
        };
        let copying = match source.resync(std::slice::from_ref(&id)).await {
            Ok(c) => c,
            Err(e) => {
                self.held.restore_table(&id, before);
                return Err(e);
            }
        };
        if !copying.contains(&id) {
            self.held.restore_table(&id, before);
            return Ok(Err(format!(
                "{table} is not copied again: the source does not capture it, or cannot copy tables again \
                 (snapshot_mode = \"never\")"
            )));
        }
        self.held.copy_taken_on(&id);
        info!(table = %id, reset, "copying a table again while the others stream, as asked");
        Ok(Ok(format!(
            "copying {table} again (reset {reset}) while the other tables stream; the destination rows the new copy \
             does not see are removed at its end"
        )))
    }

    /// Verifies `table` (`schema.table`; empty: every table the source
    /// captures) while the stream goes on, as `POST /verify` asks: the
    /// source reads each table anew at a point of its stream and sends
    /// ranges of row digests, which the sinks compare (see
    /// docs/verification.md). Between two committed batches, as
    /// [`TopicWriter::resync_live`]. The outer result is the runner's, the
    /// inner one the operator's answer.
    pub async fn verify_live(
        &mut self,
        source: &mut dyn Source,
        table: &str,
        verify: &crate::config::VerifyConfig,
    ) -> Result<Result<String, String>, Error> {
        let rows_per_second = verify.rows_per_second;
        let asked: Vec<TableId> = if table.is_empty() {
            source.tables()
        } else {
            match table.split_once('.').filter(|(s, t)| !s.is_empty() && !t.is_empty()) {
                Some((s, t)) => vec![TableId::new(s, t)],
                None => return Ok(Err(format!("table {table}: expected schema.table"))),
            }
        };
        // Held tables are being copied: their rows differ until the copy
        // ends. One whose copy ended and was swept is held only until its
        // next change (older streamed changes are still left out), which a
        // verification, read after it, does not need.
        let copying = |t: &TableId| {
            self.held
                .get(t)
                .is_some_and(|h| !matches!(h.copy, tributary_schemas::records::CopyProgress::From { swept: true, .. }))
        };
        let (held, asked): (Vec<TableId>, Vec<TableId>) = asked.into_iter().partition(|t| copying(t));
        let id = new_reset_id();
        let verifying = if verify.method == crate::config::VerifyMethod::Summary {
            // A summary covers every key of its range: on a topic of one
            // partition only (a sink member compares the keys of its
            // partitions, whose changes alone it knows applied).
            let mut single = Vec::new();
            let mut several = Vec::new();
            for t in asked.iter().cloned() {
                let topic = self.naming.topic(self.config.prefix(), &t);
                if self.topics.every_partition(&topic).await.map_err(|e| e.or_table(&t))? <= 1 {
                    single.push(t);
                } else {
                    several.push(t);
                }
            }
            let mut v = source
                .verify_by_summaries(&single, id, rows_per_second, verify.summary_range_rows)
                .await?;
            v.extend(source.verify(&several, id, rows_per_second).await?);
            v
        } else {
            source.verify(&asked, id, rows_per_second).await?
        };
        let skipped: Vec<String> = asked
            .iter()
            .chain(&held)
            .filter(|t| !verifying.contains(t))
            .map(ToString::to_string)
            .collect();
        info!(id, tables = verifying.len(), skipped = skipped.len(), "verifying tables while the stream goes on");
        if verifying.is_empty() {
            return Ok(Err(format!(
                "nothing to verify: {} (the source does not capture it, cannot verify it, or copies or verifies it \
                 now)",
                if skipped.is_empty() {
                    "no table".to_string()
                } else {
                    skipped.join(", ")
                }
            )));
        }
        let mut answer = format!(
            "verification {id} of {}: the sinks report each table's outcome in their status and metrics",
            verifying.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
        );
        if !skipped.is_empty() {
            answer.push_str(&format!(
                "; not verified now (being copied or verified, or not captured): {}",
                skipped.join(", ")
            ));
        }
        Ok(Ok(answer))
    }

    /// Asks the source to copy again the tables it said were rewritten
    /// (`SourceMessage::TableRewritten`), held `Paused` since the batch
    /// that said so, which is committed. A table the source does not copy
    /// stays paused (it is asked again at the next start), loudly.
    pub async fn copy_rewritten(&mut self, source: &mut dyn Source, telemetry: &Telemetry) -> Result<(), Error> {
        for table in self.held.take_copies_asked() {
            let copying = source.resync(std::slice::from_ref(&table)).await?;
            if copying.contains(&table) {
                self.held.copy_taken_on(&table);
                let reason = self.held.get(&table).map(|h| h.reason.clone()).unwrap_or_default();
                telemetry.record_copy_again(&table.to_string(), &reason);
                info!(table = %table, reason = %reason, "copying a rewritten table again while the others stream");
            } else {
                warn!(table = %table, "the source cannot copy the rewritten table again now: it stays paused until \
                    the next start");
            }
        }
        Ok(())
    }

    /// Produces the table-reset record of each held table whose reset is
    /// due on every partition of its topic, into the open transaction
    /// (before any row of its copy).
    async fn send_resets(&mut self) -> Result<(), Error> {
        let due = self.held.due_resets();
        if due.is_empty() {
            return Ok(());
        }
        self.producer.begin().await?;
        for (table, reset) in due {
            self.send_control(ControlRecord::TableReset { table: table.clone(), reset })
                .await
                .map_err(|e| e.or_table(&table))?;
            info!(table = %table, reset, "reset sent: sinks forget the positions of its rows before its copy");
            self.held.reset_sent(&table);
        }
        Ok(())
    }

    /// Produces `record` on every partition of its table's topic, into the
    /// open transaction.
    async fn send_control(&mut self, record: ControlRecord) -> Result<(), Error> {
        let topic = self.naming.topic(self.config.prefix(), record.table());
        let partitions = self.topics.every_partition(&topic).await?;
        for p in 0..partitions {
            self.producer
                .send(&topic, Some(p), None, None, Some(control_headers(&record)))
                .await?;
        }
        Ok(())
    }

    /// Produces `record` on partition 0 of its table's topic (made if
    /// needed), into the open transaction.
    async fn send_on_partition_0(&mut self, table: &TableId, record: &ControlRecord) -> Result<(), Error> {
        let topic = self.naming.topic(self.config.prefix(), table);
        self.topics.ensure(&topic, false).await.map_err(|e| e.or_table(table))?;
        self.producer
            .send(&topic, Some(0), None, None, Some(control_headers(record)))
            .await
            .map_err(|e| e.or_table(table))
    }

    /// Adds a batch's events to the open Kafka transaction, beginning one
    /// when none is open. [`TopicWriter::commit`] makes them durable.
    ///
    /// On error the transaction is aborted; nothing of it is visible to
    /// `read_committed` consumers.
    ///
    /// Returns what was produced per table.
    pub async fn add_batch(&mut self, batch: &SourceBatch) -> Result<HashMap<TableId, TableCounts>, Error> {
        if let Err(e) = self.send_resets().await {
            self.producer.abort().await;
            return Err(e);
        }
        let held = self.held.hold(batch);
        // Register new schema versions before producing anything that
        // needs them: an incompatible change stops us (and aborts the
        // transaction) before any event of it is produced.
        if let Err(e) = self.prepare_schemas(batch, &held).await {
            self.producer.abort().await;
            return Err(e);
        }
        self.producer.begin().await?;
        match self.produce_all(batch, &held).await {
            Ok(counts) => Ok(counts),
            Err(e) => {
                // A record refused earlier puts the transaction in an
                // error state that fails later sends: name that record.
                let e = if e.kind() == ErrorKind::Retryable {
                    self.refused_or(e)
                } else {
                    e
                };
                self.producer.abort().await;
                Err(e)
            }
        }
    }

    /// Makes each table's topic and registers each schema the batch's
    /// messages use for the first time. A schema change the topic cannot
    /// carry pauses its table alone under `incompatible_schema_changes =
    /// "pause_table"`; else it fails the batch.
    async fn prepare_schemas(&mut self, batch: &SourceBatch, held: &[bool]) -> Result<(), Error> {
        // The schema of the message before: a batch is mostly one table's
        // rows sharing one Arc, so most messages need no lookup at all.
        let mut previous: Option<&Arc<TableSchema>> = None;
        for (i, msg) in batch.messages.iter().enumerate() {
            let schema = match msg {
                SourceMessage::SchemaChanged(s) => s,
                SourceMessage::Change(e) => &e.schema,
                SourceMessage::TableDropped(_)
                | SourceMessage::TableFailed(..)
                | SourceMessage::TableRewritten(..)
                | SourceMessage::Sequence(..)
                | SourceMessage::Objects(..)
                | SourceMessage::Verify(..)
                | SourceMessage::TransactionEnd(_) => continue,
            };
            if self.held.is_held(held, i, &schema.id) {
                continue;
            }
            if previous.is_some_and(|p| Arc::ptr_eq(p, schema)) {
                continue;
            }
            previous = Some(schema);
            // Same Arc as last time: nothing to compare (the common case).
            if self.schemas.get(&schema.id).is_some_and(|s| Arc::ptr_eq(s, schema)) {
                continue;
            }
            // An equal schema in another Arc is prepared again too (which
            // costs nothing but remembering this Arc), so that later
            // events of it are recognised by pointer, not compared column
            // by column.
            let schema = schema.clone();
            let topic = self.naming.topic(self.config.prefix(), &schema.id);
            // The topic's creation and the schemas' registration at once:
            // each is a few round trips, and neither needs the other.
            let (created, registered) =
                tokio::join!(self.topics.ensure(&topic, false), self.encoder.prepare(&schema, &topic));
            self.topics.name_table(topic, schema.id.clone());
            created.map_err(|e| e.or_table(&schema.id))?;
            match registered {
                Ok(()) => {}
                Err(e @ SchemaError::Incompatible { .. })
                    if self.config.incompatible_schema_changes == IncompatibleSchemaChanges::PauseTable =>
                {
                    // That table alone waits; its changes are held back
                    // until it is copied again (see the pipeline's start).
                    let e = Error::from(e).with_hint(
                        "set incompatible_schema_changes = \"register\" in the source runner's config (readers of \
                         the topic must then read the new type) or revert the column, and restart the runner: the \
                         table is copied again (see docs/schema-changes.md)",
                    );
                    warn!(table = %schema.id, error = %e, hint = e.hint().unwrap_or(""),
                        "table paused: its changes are held back, the other tables go on");
                    self.held.pause(schema.id.clone(), e.to_string());
                    continue;
                }
                Err(e) => return Err(Error::from(e).or_table(&schema.id)),
            }
            self.schemas.insert(schema.id.clone(), schema);
        }
        Ok(())
    }

    async fn produce_all(
        &mut self,
        batch: &SourceBatch,
        held: &[bool],
    ) -> Result<HashMap<TableId, TableCounts>, Error> {
        // Keyed by reference while producing: no clone per event.
        let mut counts: HashMap<&TableId, TableCounts> = HashMap::new();
        // The run of consecutive events of one table (a snapshot chunk,
        // most transactions), by its schema's Arc: its topic is named once
        // and its counts are added up before they go into `counts`.
        let mut run: Option<(&Arc<TableSchema>, String, TableCounts)> = None;
        for (i, msg) in batch.messages.iter().enumerate() {
            match msg {
                // Nothing to produce: `prepare_schemas` registered the
                // schemas, a failed table is held (see `HeldTables::hold`).
                SourceMessage::SchemaChanged(_)
                | SourceMessage::TableFailed(..)
                | SourceMessage::TableRewritten(..) => {}
                SourceMessage::TransactionEnd(end) => {
                    let unwritten = self.unwritten.remove(&end.id).unwrap_or_default();
                    if self.config.transaction_metadata {
                        let data_collections: Vec<(String, i64)> = end
                            .tables
                            .iter()
                            .map(|(t, n)| (t.to_string(), n - unwritten.get(t).copied().unwrap_or(0)))
                            .filter(|(_, n)| *n > 0)
                            .collect();
                        // Every change of it held back: nothing of it is in
                        // the topics (its BEGIN may be, which says nothing).
                        if !data_collections.is_empty() {
                            let record = TransactionRecord::End {
                                id: end.id.clone(),
                                ts_ms: end.ts_ms,
                                data_collections,
                            };
                            self.send_transaction(&record).await?;
                        }
                    }
                }
                SourceMessage::Change(event) if self.held.is_held(held, i, &event.schema.id) => {
                    self.not_written(event);
                }
                SourceMessage::Change(event) => {
                    // A source transaction's first change: Debezium's BEGIN
                    // before it.
                    if let Some(tx) = event.transaction.as_ref().filter(|t| t.total_order == 1) {
                        if self.config.transaction_metadata {
                            let record = TransactionRecord::Begin { id: tx.id.clone(), ts_ms: event.source.ts_ms };
                            self.send_transaction(&record).await?;
                        }
                    }
                    if !run.as_ref().is_some_and(|(schema, _, _)| Arc::ptr_eq(schema, &event.schema)) {
                        if let Some((schema, _, c)) = run.take() {
                            counts.entry(&schema.id).or_default().add(c);
                        }
                        let topic = self.naming.topic(self.config.prefix(), &event.schema.id);
                        run = Some((&event.schema, topic, TableCounts::default()));
                    }
                    let Some((_, topic, run_counts)) = run.as_mut() else {
                        continue;
                    };
                    let topic = topic.as_str();
                    let table = &event.schema.id;
                    let encoded = match self.encoder.encode(event, topic) {
                        Ok(encoded) => encoded,
                        Err(e @ SchemaError::Value { .. }) => {
                            // A value its column's type cannot carry: that
                            // table alone waits, the others go on, and
                            // nothing is skipped (it is copied again once
                            // fixed, at a start or on `POST /resync`).
                            self.pause_unencodable(table, e);
                            self.not_written(event);
                            continue;
                        }
                        Err(e) => return Err(Error::from(e).or_table(table)),
                    };
                    run_counts.events += 1;
                    run_counts.latest_ts = run_counts.latest_ts.max(event.source.ts_ms);
                    run_counts.oldest_ts = run_counts.oldest_ts.min(event.source.ts_ms);
                    run_counts.snapshot |= event.source.snapshot != SnapshotMarker::False;
                    run_counts.bytes += (encoded.key.as_ref().map_or(0, |k| k.len())
                        + encoded.value.as_ref().map_or(0, |v| v.len())) as u64;
                    if event.op == Op::Truncate {
                        // A truncate concerns every key, so every partition
                        // gets it, in order with that partition's rows.
                        let partitions = self.topics.every_partition(topic).await.map_err(|e| e.or_table(table))?;
                        for p in 0..partitions {
                            self.producer
                                .send(topic, Some(p), encoded.key.as_deref(), encoded.value.as_deref(), None)
                                .await
                                .map_err(|e| e.or_table(table))?;
                        }
                    } else {
                        // A table without a key: its events carry a null key
                        // (as Debezium's do), which Kafka's partitioner would
                        // spread over the partitions; all on partition 0, a
                        // stock consumer reads them in source order.
                        let partition = encoded.key.is_none().then_some(0);
                        self.producer
                            .send(topic, partition, encoded.key.as_deref(), encoded.value.as_deref(), None)
                            .await
                            .map_err(|e| e.or_table(table))?;
                        if let Some(tombstone) = self.encoder.tombstone(event, topic)? {
                            self.producer
                                .send(topic, None, tombstone.key.as_deref(), None, None)
                                .await
                                .map_err(|e| e.or_table(table))?;
                        }
                    }
                }
                SourceMessage::TableDropped(table) => {
                    self.send_control(ControlRecord::TableDropped { table: table.clone() }).await?;
                    self.schemas.remove(table);
                }
                // One partition is enough for both: applying a sequence
                // only moves it forward, and a table's objects are its
                // whole set, whichever member applies them.
                SourceMessage::Sequence(table, state) => {
                    let record = ControlRecord::Sequence { table: table.clone(), state: state.clone() };
                    self.send_on_partition_0(table, &record).await?;
                }
                SourceMessage::Objects(table, objects) => {
                    let record = ControlRecord::Objects { table: table.clone(), objects: objects.clone() };
                    self.send_on_partition_0(table, &record).await?;
                }
                SourceMessage::Verify(table, range) => self.send_verify(table, range).await?,
            }
        }
        if let Some((schema, _, c)) = run {
            counts.entry(&schema.id).or_default().add(c);
        }
        Ok(counts.into_iter().map(|(id, c)| (id.clone(), c)).collect())
    }

    /// Writes `record` on the copy's transaction topic (made and its
    /// schemas registered the first time), keyed by the transaction's id:
    /// one partition keeps each transaction's BEGIN before its END.
    async fn send_transaction(&mut self, record: &TransactionRecord) -> Result<(), Error> {
        use tributary_schemas::records::transaction::{topic, KEY_SCHEMA, VALUE_SCHEMA};
        let topic = topic(self.config.prefix());
        let (key_id, value_id) = match self.transaction_ids {
            Some(ids) => ids,
            None => {
                self.topics.ensure(&topic, false).await?;
                let key_id = self.registry.register(&format!("{topic}-key"), KEY_SCHEMA).await?;
                let value_id = self.registry.register(&format!("{topic}-value"), VALUE_SCHEMA).await?;
                *self.transaction_ids.insert((key_id, value_id))
            }
        };
        let unwritable = |e: tributary_schemas::records::RecordError| Error::permanent(e.to_string());
        let key = record.encode_key(key_id).map_err(unwritable)?;
        let value = record.encode_value(value_id).map_err(unwritable)?;
        self.producer.send(&topic, None, Some(&key), Some(&value), None).await
    }

    /// Makes the copy's requests topic (what its sink runners ask) exist,
    /// and its transaction topic with `transaction_metadata`: a sink
    /// applying whole transactions subscribes to it by pattern, and a topic
    /// made at the first transaction would reach it only at its next
    /// metadata refresh (seconds of nothing applied, measured by `bench/run
    /// --consistency`).
    pub async fn ensure_requests_topic(&mut self) -> Result<(), Error> {
        let topic = tributary_schemas::records::requests::topic(self.config.prefix());
        self.topics.ensure(&topic, false).await?;
        if self.config.transaction_metadata {
            let topic = tributary_schemas::records::transaction::topic(self.config.prefix());
            self.topics.ensure(&topic, false).await?;
        }
        Ok(())
    }

    /// Whether `table`'s topic carries rows without a key (no key schema):
    /// a repair of it copies it again.
    pub fn keyless(&self, table: &TableId) -> bool {
        let topic = self.naming.topic(self.config.prefix(), table);
        self.encoder.prepared(&topic).is_some_and(|(_, key_id, _)| key_id.is_none())
    }

    /// Writes a verify range of `table` into its topic, with the registry's
    /// ids of the schemas its digests follow (the table's current ones: the
    /// source announced its schema before its rows). A sink compares a
    /// range once every change before it on its partition is applied: on a
    /// topic of several partitions each partition gets a copy holding the
    /// range's keys the producer puts there (the same bounds), and the sink
    /// compares those keys only.
    async fn send_verify(&mut self, table: &TableId, range: &VerifyRange) -> Result<(), Error> {
        let topic = self.naming.topic(self.config.prefix(), table);
        self.topics.ensure(&topic, false).await.map_err(|e| e.or_table(table))?;
        let partitions = self.topics.every_partition(&topic).await.map_err(|e| e.or_table(table))?;
        let Some((_, key_id, value_id)) = self.encoder.prepared(&topic) else {
            warn!(table = %table, "the table is not verified: its schema is not registered yet (no change of it \
                was written since the start)");
            return Ok(());
        };
        let mut range = range.clone();
        range.schema_id = value_id;
        range.key_schema_id = key_id;
        // A table without a key (no key schema) has all its changes on
        // partition 0: its ranges go there whole.
        if partitions <= 1 || key_id.is_none() {
            let record = ControlRecord::Verify { table: table.clone(), range };
            return self
                .producer
                .send(&topic, Some(0), None, None, Some(control_headers(&record)))
                .await
                .map_err(|e| e.or_table(table));
        }
        let split = match (key_id, self.encoder.written(&topic)) {
            (Some(key_id), Some(written)) => split_by_partition(written, key_id, &range.rows, partitions),
            _ => Err("the table has no key schema".to_string()),
        };
        let parts = match split {
            Ok(parts) => parts,
            Err(why) => {
                if range.last {
                    warn!(table = %table, topic = %topic, partitions,
                        "the table is not verified: its rows cannot be split as its topic's partitions are: {why}");
                }
                return Ok(());
            }
        };
        range.rows = Vec::new();
        for (partition, rows) in (0..partitions).zip(parts) {
            let copy = VerifyRange {
                rows,
                partition: Some(RangePartition { partition, of: partitions }),
                ..range.clone()
            };
            let record = ControlRecord::Verify { table: table.clone(), range: copy };
            self.producer
                .send(&topic, Some(partition), None, None, Some(control_headers(&record)))
                .await
                .map_err(|e| e.or_table(table))?;
        }
        Ok(())
    }

    /// Pauses `table` for a change that cannot be encoded: its changes are
    /// held back from this one on, and the table is copied again at the
    /// next start or `POST /resync`.
    /// Counts a change of a source transaction that is not written (see
    /// [`TopicWriter::unwritten`]).
    fn not_written(&mut self, event: &ChangeEvent) {
        if let Some(tx) = &event.transaction {
            *self
                .unwritten
                .entry(tx.id.clone())
                .or_default()
                .entry(event.schema.id.clone())
                .or_default() += 1;
        }
    }

    fn pause_unencodable(&mut self, table: &TableId, e: SchemaError) {
        let e = Error::from(e).with_kind(ErrorKind::NeedsOperator).with_hint(
            "the table's changes are held back from this change on, the other tables go on; fix the column's type \
             or value at the source (or report the type if the source should carry it), then copy the table \
             again: POST /resync, or restart the source runner (see docs/schema-changes.md)",
        );
        warn!(table = %table, error = %e, hint = e.hint().unwrap_or(""),
            "table paused: a change of it cannot be encoded; the other tables go on");
        self.held.pause(table.clone(), e.to_string());
    }

    /// For each held table whose new copy is complete (per `progress`): a
    /// table-copied record after the copy's rows says that every row older
    /// than the copy is gone, so that a row deleted while the table was
    /// held back does not stay in the destination. An empty copy (no row
    /// to take the position from) removes every row. Produced into the
    /// open transaction.
    pub async fn sweep_copied(
        &mut self,
        progress: &[tributary_connectors::SnapshotTableProgress],
    ) -> Result<(), Error> {
        let due = self.held.due_sweeps(progress);
        if due.is_empty() {
            return Ok(());
        }
        self.producer.begin().await?;
        for (table, at) in due {
            self.send_control(ControlRecord::TableCopied { table: table.clone(), at })
                .await?;
            info!(table = %table, "copied again; rows deleted while it was held back are removed downstream");
            self.held.swept(&table);
        }
        Ok(())
    }

    /// Writes `checkpoint` into the open transaction (beginning one for a
    /// checkpoint alone), with the offsets-topic records that changed, and
    /// commits it.
    pub async fn commit(&mut self, checkpoint: &Checkpoint) -> Result<(), Error> {
        self.producer.begin().await?;
        let mut records = self.held.records();
        records.extend(
            std::mem::take(&mut self.side_pending)
                .into_iter()
                .map(|(key, value)| OffsetsRecord::Side { key, value }),
        );
        records.push(OffsetsRecord::Checkpoint(Some(checkpoint.0.clone())));
        if let Err(e) = self.send_offsets_records(&records).await {
            // This life ends: the next reads what is durable.
            let e = self.refused_or(e);
            self.producer.abort().await;
            return Err(e);
        }
        if let Err(e) = self.producer.commit().await {
            return Err(self.refused_or(e));
        }
        self.held.committed();
        Ok(())
    }

    /// Produces `records` to the offsets topic, into the open transaction.
    async fn send_offsets_records(&self, records: &[OffsetsRecord]) -> Result<(), Error> {
        let topic = self.config.offsets_topic();
        for record in records {
            let key = record.key().encode(&self.config.name);
            let value = record.value();
            self.producer
                .send(&topic, Some(0), Some(key.as_bytes()), value.as_deref(), None)
                .await?;
        }
        Ok(())
    }

    /// `err`, or, when Kafka refused a record as too large meanwhile, an
    /// error naming that record's size, its table and what to raise.
    fn refused_or(&self, err: Error) -> Error {
        self.producer.refused_or(err, |topic| self.topics.table_of(topic))
    }
}

/// One row of a verify range: key text, hash, column fingerprints.
type VerifyEntry = (String, String, String);

/// The entries of a verify range (key text, hash, fingerprints) split by
/// the partition the producer puts each key on, among `partitions`: the key
/// is written as its change events' keys are (`written`'s key columns under
/// the key schema `key_id`), then hashed as the producer hashes it.
fn split_by_partition(
    written: &TableSchema,
    key_id: u32,
    rows: &[VerifyEntry],
    partitions: i32,
) -> Result<Vec<Vec<VerifyEntry>>, String> {
    use tributary_schemas::canonical::{key_value, parse_key_text};
    use tributary_schemas::encoder::{key_bytes, partition_of};

    let indexes = written.key_indexes();
    let mut parts: Vec<Vec<VerifyEntry>> = (0..partitions).map(|_| Vec::new()).collect();
    for entry in rows {
        let texts = parse_key_text(&entry.0).ok_or_else(|| format!("key {} does not read", entry.0))?;
        if texts.len() != indexes.len() {
            return Err(format!("key {} has {} values for {} key columns", entry.0, texts.len(), indexes.len()));
        }
        let values = indexes
            .iter()
            .zip(&texts)
            .map(|(&i, t)| key_value(&written.columns[i].data_type, t.as_deref()))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| format!("key {} does not read as the key's types", entry.0))?;
        let bytes = key_bytes(written, key_id, &values).map_err(|e| e.to_string())?;
        let p = usize::try_from(partition_of(&bytes, partitions)).unwrap_or(0);
        if let Some(part) = parts.get_mut(p) {
            part.push(entry.clone());
        }
    }
    Ok(parts)
}
