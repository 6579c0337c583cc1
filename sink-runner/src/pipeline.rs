//! The sink runner's pipeline: Kafka (read_committed, topic pattern) ->
//! buffer per table -> decode -> [`Sink::apply`] (rows and offsets in one
//! durable step). How partitions come and go is in [`crate::rebalance`],
//! how batches are cut in [`crate::buffer`], applied and retried in
//! [`crate::apply`], dead-lettered in [`crate::dead_letters`].

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::FutureExt;
use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaError;
use tokio::sync::{mpsc, watch, Mutex};
use tokio::task::JoinHandle;
use tracing::{debug, error, info, info_span, warn, Instrument};
use tributary_connectors::{Labeler, Sink};
use tributary_operations::admin::Control;
use tributary_operations::process::sleep_until;
use tributary_operations::telemetry::Telemetry;
use tributary_schemas::{EventDecoder, TableId};

use crate::apply::{wait_applied, DecodedBatch, InFlight};
use crate::buffer::{BatchLimits, Buffers, RawRecord};
use crate::config::SinkRunnerConfig;
use crate::consumer::{consumer_config, ChangeConsumer, ConsumerCtx, GroupHealth};
use crate::dead_letters::{DeadLetterState, DeadLetters};
use crate::decode::table_from_topic;
use crate::out_of_range::is_out_of_range;
use crate::partitions::Partitions;
use crate::pauses::OperatorPauses;
use crate::rebalance::RebalanceEvent;
use crate::transactions::Transactions;
use crate::RunError;

/// How often topics are looked for while no partition is assigned yet. The
/// pattern subscription only sees a new topic at librdkafka's periodic
/// metadata refresh (`topic.metadata.refresh.interval.ms`, 5 s by default
/// here): at start-up, before the source created its topics, that wait was
/// most of the benchmark's ~5 s to the first row. A metadata request of all
/// topics makes librdkafka match the pattern again at once.
const STARTUP_METADATA_PROBE: Duration = Duration::from_millis(200);
/// How long after start the probe above runs at most: a runner left without
/// partitions (more runners than partitions) must not ask for the metadata
/// of every topic five times a second for ever.
const STARTUP_METADATA_PROBE_FOR: Duration = Duration::from_secs(60);
/// The probe's metadata request's timeout.
const STARTUP_METADATA_TIMEOUT: Duration = Duration::from_secs(1);
/// How often the pipeline looks at the consumer group's state.
const GROUP_CHECK: Duration = Duration::from_secs(5);
/// How long librdkafka may take to complete an unassignment the pipeline
/// served before the consumer is made again. It takes milliseconds, or up
/// to a commit's timeout; after a broker restart it was seen waiting for
/// ever on a commit queued for a coordinator it never looked up again
/// (`wait-unassign-to-complete`, `query-coord`): no partition, nothing
/// applied, no resubscribe possible until the process restarted.
const UNASSIGN_STUCK_AFTER: Duration = Duration::from_secs(30);
/// Records taken from librdkafka's queue in one go once one arrived. Bounds
/// how far a batch can overshoot `batch_max_records` before it is flushed.
const DRAIN_MAX_RECORDS: usize = 1000;

/// The pipeline's state: one per runner, driven by [`Pipeline::run`].
pub(crate) struct Pipeline<S: Sink + 'static> {
    pub(crate) config: SinkRunnerConfig,
    pub(crate) limits: BatchLimits,
    /// The destination; the apply task holds it while a batch is applied.
    pub(crate) sink: Arc<Mutex<S>>,
    pub(crate) labeler: Labeler,
    pub(crate) telemetry: Telemetry,
    pub(crate) operator: OperatorPauses,
    pub(crate) decoder: EventDecoder,
    pub(crate) dead_letters: DeadLetterState,
    /// Repair requests to the source runner (`[verify] repair`).
    pub(crate) repairs: Option<Arc<crate::repairs::RepairRequests>>,
    pub(crate) consumer: Arc<ChangeConsumer>,
    /// Rebalances, as the consumer's context hands them over.
    rebalances: mpsc::UnboundedReceiver<RebalanceEvent>,
    /// Whether the destination's offsets of newly assigned partitions
    /// cannot be read (shared with the consumer's context: not ready).
    pub(crate) offsets_unreadable: Arc<AtomicBool>,
    /// Set when the pipeline stops serving rebalances (shared with the
    /// consumer's context, which serves them itself from then on).
    closing: Arc<AtomicBool>,
    /// The consumer's group membership, as the statistics report it.
    group: Arc<std::sync::Mutex<GroupHealth>>,
    /// When [`Pipeline::check_group`] runs next.
    next_group_check: Instant,
    pub(crate) buffers: Buffers,
    /// Records waiting to make whole source transactions (transactional
    /// consistency only), before they enter the buffers.
    pub(crate) transactions: Transactions,
    pub(crate) partitions: Partitions,
    /// When the stopped and fenced partitions' stored offsets are looked
    /// at again.
    pub(crate) stopped_probe: Option<Instant>,
    /// Source table of each topic, once seen.
    pub(crate) tables: HashMap<String, TableId>,
    /// The batch being applied, while the pipeline consumes and decodes.
    pub(crate) in_flight: Option<InFlight>,
    /// The next batch, decoded while `in_flight` is applied. Only ever set
    /// while `in_flight` is: it bounds how far the pipeline reads ahead.
    pub(crate) ready: Option<DecodedBatch>,
    /// The destination transaction held open across batches for source
    /// transactions over the memory bound (transactional consistency).
    pub(crate) open_unit: Option<OpenUnit>,
    /// When the consumer last gave a record (see [`Pipeline::idle_at`]).
    last_received: Option<Instant>,
    /// Turns true when the runner is asked to stop.
    pub(crate) stop: watch::Receiver<bool>,
}

/// A destination transaction left open by the batches applied so far of
/// source transactions over the memory bound (`UnitPart`).
#[derive(Debug, Default)]
pub(crate) struct OpenUnit {
    /// The source transactions it holds part of.
    pub(crate) transactions: Vec<String>,
    /// The next offset of every partition its batches covered: stored
    /// with the batch that commits it.
    pub(crate) offsets: std::collections::BTreeMap<(String, i32), i64>,
}

/// Runs a sink runner for the configured destination until `stop` turns true.
pub async fn run(
    config: SinkRunnerConfig,
    telemetry: Telemetry,
    control: Control,
    stop: watch::Receiver<bool>,
) -> Result<(), RunError> {
    let sink = config.sink()?;
    let labeler = sink.labeler();
    run_with_sink(config, sink, labeler, telemetry, control, stop).await
}

/// Runs the pipeline over any [`Sink`] (tests use fakes).
pub async fn run_with_sink<S: Sink + 'static>(
    config: SinkRunnerConfig,
    sink: S,
    labeler: Labeler,
    telemetry: Telemetry,
    control: Control,
    stop: watch::Receiver<bool>,
) -> Result<(), RunError> {
    let span = info_span!("sink_runner", group = %config.consumer_group);
    async move {
        let mut pipeline = Pipeline::new(config, sink, labeler, telemetry, control, stop)?;
        pipeline.run().await
    }
    .instrument(span)
    .await
}

impl<S: Sink + 'static> Pipeline<S> {
    pub(crate) fn new(
        config: SinkRunnerConfig,
        sink: S,
        labeler: Labeler,
        telemetry: Telemetry,
        control: Control,
        stop: watch::Receiver<bool>,
    ) -> Result<Self, RunError> {
        let offsets_unreadable = Arc::new(AtomicBool::new(false));
        let made = make_consumer(&config, &labeler, &telemetry, &control, &offsets_unreadable)?;
        let dead_letters = DeadLetters::new(&config.kafka.client_config()?, &config.consumer_group);
        let repairs = crate::repairs::RepairRequests::new(&config)
            .map_err(|e| RunError::Kafka(e.to_string()))?
            .map(Arc::new);
        let registry = config.schema_registry.registry(&config.schema_registry_url)?;
        let transaction_topic = config.transaction_topic();
        let mut transactions = Transactions::new(transaction_topic.clone());
        transactions.spans = sink.spans_batches();
        let limits = BatchLimits {
            max_records: config.batch_max_records,
            max_bytes: config.batch_max_bytes(),
            linger: config.linger(),
            idle: config.idle(),
            max_buffered: config.max_buffered_bytes,
        };
        Ok(Self {
            config,
            limits,
            sink: Arc::new(Mutex::new(sink)),
            labeler,
            telemetry,
            operator: OperatorPauses::new(control),
            decoder: EventDecoder::new(registry),
            dead_letters: DeadLetterState::new(dead_letters),
            repairs,
            consumer: Arc::new(made.consumer),
            rebalances: made.rebalances,
            offsets_unreadable,
            closing: made.closing,
            group: made.group,
            next_group_check: Instant::now() + GROUP_CHECK,
            buffers: Buffers::with_lane(transaction_topic.clone()),
            transactions,
            partitions: Partitions::default(),
            stopped_probe: None,
            tables: HashMap::new(),
            in_flight: None,
            ready: None,
            open_unit: None,
            last_received: None,
            stop,
        })
    }

    async fn run(&mut self) -> Result<(), RunError> {
        let mut consumer_errors = 0u32;
        let mut next_probe = Instant::now() + STARTUP_METADATA_PROBE;
        let probe_until = Instant::now() + STARTUP_METADATA_PROBE_FOR;
        let mut probing: Option<JoinHandle<()>> = None;
        loop {
            if *self.stop.borrow() {
                break;
            }
            let deadline = self.next_deadline();
            // With a batch applying and the next one decoded, the buffers
            // may take one more batch's bytes; then consuming waits for the
            // apply. Three batches in memory (applying, decoded, buffered)
            // instead of one costs RSS: the 128 MiB budget leaves no room
            // for `max_buffered_bytes` on top.
            let full = self.ready.is_some() && self.buffers.total_bytes() >= self.limits.max_bytes;
            // A rebalance handed over is served before anything more is
            // consumed.
            let rebalancing = !self.rebalances.is_empty();
            let mut applied = None;
            let mut rebalance = None;
            let probe = (self.partitions.is_empty() && next_probe < probe_until).then_some(next_probe);
            let consumer = self.consumer.clone();
            let received = tokio::select! {
                _ = self.stop.changed() => None,
                // An operator's pause or resume takes effect at once, also
                // while nothing is arriving.
                _ = self.operator.changed.changed() => None,
                event = self.rebalances.recv() => {
                    rebalance = event;
                    None
                }
                m = consumer.recv(), if !full && !rebalancing => Some(m.map(|m| RawRecord::from_message(&m))),
                r = wait_applied(&mut self.in_flight) => {
                    applied = Some(r);
                    None
                }
                _ = sleep_until(deadline) => None,
                _ = sleep_until(self.stopped_probe) => {
                    self.probe_stopped().await;
                    None
                }
                _ = sleep_until(Some(self.next_group_check)) => {
                    self.next_group_check = Instant::now() + GROUP_CHECK;
                    self.check_group();
                    None
                }
                _ = sleep_until(probe) => {
                    next_probe = Instant::now() + STARTUP_METADATA_PROBE;
                    // Off the async path, one at a time, and only while
                    // there is nothing to copy anyway.
                    if probing.as_ref().is_none_or(JoinHandle::is_finished) {
                        let consumer = self.consumer.clone();
                        probing = Some(tokio::task::spawn_blocking(move || {
                            if let Err(e) = consumer.fetch_metadata(None, STARTUP_METADATA_TIMEOUT) {
                                debug!(error = %e, "cannot look for topics");
                            }
                        }));
                    }
                    None
                }
            };
            if let Some(r) = applied {
                self.finish(r).await;
            }
            if let Some(event) = rebalance {
                self.rebalance(event).await;
            }
            match received {
                Some(Ok(raw)) => {
                    consumer_errors = 0;
                    self.accept(raw);
                    // Take what is already fetched without a trip through
                    // select! and timers per record (a few µs each, a
                    // large share of a snapshot's time otherwise), until a
                    // rebalance is handed over.
                    for _ in 0..DRAIN_MAX_RECORDS {
                        if !self.rebalances.is_empty() {
                            break;
                        }
                        match self.consumer.recv().now_or_never() {
                            Some(Ok(m)) => {
                                let raw = RawRecord::from_message(&m);
                                drop(m);
                                self.accept(raw);
                            }
                            Some(Err(KafkaError::PartitionEOF(_))) => {}
                            Some(Err(e)) => {
                                if is_out_of_range(&e) {
                                    self.find_out_of_range().await;
                                } else {
                                    warn!(error = %e, "consumer error");
                                }
                                break;
                            }
                            None => break,
                        }
                    }
                    self.last_received = Some(Instant::now());
                }
                Some(Err(e)) => {
                    consumer_errors = consumer_errors.saturating_add(1);
                    match e {
                        KafkaError::PartitionEOF(_) => {}
                        KafkaError::MessageConsumptionFatal(code) => {
                            return Err(RunError::Kafka(format!("fatal consumer error: {code}")));
                        }
                        e if is_out_of_range(&e) => self.find_out_of_range().await,
                        other => {
                            // librdkafka reconnects by itself; these are
                            // reports, queued like messages. Sleeping per
                            // report (as this loop once did) drained a broker
                            // outage's backlog of reports at one per few
                            // seconds while the records behind them waited:
                            // the fault suite saw a sink stall for minutes
                            // after a Kafka restart. So: no wait, and the log
                            // says it once per run of errors, then every 50th.
                            if consumer_errors == 1 || consumer_errors.is_multiple_of(50) {
                                warn!(error = %other, repeated = consumer_errors, "consumer error (librdkafka retries)");
                            }
                        }
                    }
                }
                None => {}
            }
            self.apply_operator_pause();
            self.flush_due().await;
        }
        info!("stopping: applying what is buffered");
        self.finish_applying().await;
        for topic in self.buffers.not_retrying() {
            self.flush(&topic).await;
            self.finish_applying().await;
        }
        self.abandon_open_unit().await;
        self.close();
        info!("stopped");
        Ok(())
    }

    /// Rolls back the destination transaction held open for a large
    /// source transaction, if any: what it held is read again from the
    /// stored offsets (by the next owner, or at the next start).
    pub(crate) async fn abandon_open_unit(&mut self) {
        if self.open_unit.take().is_some() {
            self.sink.lock().await.abandon_unit().await;
            info!(
                "the destination transaction held open for a large source transaction is rolled back: it is \
                   applied again from the stored offsets"
            );
        }
    }

    /// Stops serving rebalances: the consumer's context serves them from
    /// now on (the consumer's close waits for its revoke to be served), and
    /// those handed over but not served are served the same way.
    fn close(&mut self) {
        self.closing.store(true, std::sync::atomic::Ordering::Relaxed);
        while let Ok(event) = self.rebalances.try_recv() {
            let r = match event {
                RebalanceEvent::Assign { wanted, excluded, cooperative } => {
                    let parts: Vec<_> = wanted.into_iter().chain(excluded).collect();
                    let tpl = crate::rebalance::list(&parts, |_| Some(rdkafka::Offset::End));
                    if cooperative {
                        self.consumer.incremental_assign(&tpl)
                    } else {
                        self.consumer.assign(&tpl)
                    }
                }
                RebalanceEvent::Revoke { parts, cooperative: true } => {
                    self.consumer.incremental_unassign(&crate::rebalance::list(&parts, |_| None))
                }
                RebalanceEvent::Revoke { cooperative: false, .. } | RebalanceEvent::Failed { .. } => {
                    self.consumer.unassign()
                }
            };
            if let Err(e) = r {
                warn!(error = %e, "cannot serve a rebalance while stopping");
            }
        }
    }

    /// Takes a record from Kafka into its topic's buffer, unless it is not
    /// this runner's (see [`Partitions::take`]).
    fn accept(&mut self, raw: RawRecord) {
        if self.partitions.take(&raw.topic, raw.partition, raw.offset) {
            if self.transactions.enabled() {
                self.transactions.push(raw);
            } else {
                self.buffers.push(raw, Instant::now);
            }
        }
    }

    fn next_deadline(&self) -> Option<Instant> {
        if self.ready.is_some() {
            // Nothing more can be flushed before the apply ends (which
            // wakes the pipeline).
            return None;
        }
        let due = self.buffers.next_due(self.limits.linger, self.idle_at(), &self.paused_lanes());
        // An END waiting for its changes is looked at again now and then
        // (it may wait too long, see `transactions::INCOMPLETE_AFTER`).
        let waiting = self
            .transactions
            .waiting(Instant::now())
            .map(|_| Instant::now() + crate::transactions::WAITING_CHECK);
        match (due, waiting) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// When buffered records are applied for want of more: no batch being
    /// applied, and nothing received for `batch_idle_ms`. Waiting the whole
    /// linger made every change wait for it, also when nothing else was
    /// coming. Under load batches still grow: what arrives while a batch
    /// is applied waits for that apply, and goes in the next.
    fn idle_at(&self) -> Option<Instant> {
        match (&self.in_flight, self.last_received, self.limits.idle) {
            (None, Some(t), Some(idle)) => Some(t + idle),
            _ => None,
        }
    }

    async fn flush_due(&mut self) {
        if self.transactions.enabled() {
            self.release_transactions().await;
        }
        let now = Instant::now();
        let idle = self.idle_at().is_some_and(|t| t <= now);
        let due = self.buffers.due(now, &self.limits, idle, &self.paused_lanes());
        for topic in due {
            if self.ready.is_some() {
                break; // the rest waits for the apply to end
            }
            self.flush(&topic).await;
        }
    }

    /// Replaces a consumer that librdkafka left waiting on itself: the new
    /// one joins the group afresh and is assigned at the offsets the
    /// destination stores, like a restarted runner. The pipeline had served
    /// the revoke (nothing of the old one is held); the old one stops
    /// taking part in the group, and is closed off the runtime, since its
    /// close may wait on what wedged it.
    fn make_consumer_again(&mut self, state: &str, join_state: &str, waited: Duration) {
        let made = match make_consumer(
            &self.config,
            &self.labeler,
            &self.telemetry,
            &self.operator.control,
            &self.offsets_unreadable,
        ) {
            Ok(made) => made,
            Err(e) => {
                error!(error = %e, "cannot make the consumer again; trying at the next check");
                return;
            }
        };
        warn!(
            state = %state,
            join_state = %join_state,
            waited_s = waited.as_secs(),
            "librdkafka has not completed the unassignment this runner served: the consumer is made again"
        );
        let old = std::mem::replace(&mut self.consumer, Arc::new(made.consumer));
        // The old context serves whatever comes to it from now on, and no
        // longer reports.
        std::mem::replace(&mut self.closing, made.closing).store(true, std::sync::atomic::Ordering::Relaxed);
        self.rebalances = made.rebalances;
        self.group = made.group;
        old.unsubscribe();
        let closed = std::thread::Builder::new()
            .name("old-consumer-close".into())
            .spawn(move || drop(old));
        if let Err(e) = closed {
            warn!(error = %e, "cannot close the old consumer off the runtime: it is left open");
        }
    }

    /// Subscribes again when the consumer has been out of a settled group
    /// membership for `group_rejoin_after_secs`: leaving the group
    /// (revoking whatever is still assigned, after the batch being applied)
    /// and joining it afresh, which is what a member that lost its
    /// partitions and never joined again needs.
    fn check_group(&mut self) {
        let stuck = match self.group.lock() {
            Ok(g) => g.stuck(),
            Err(_) => return,
        };
        let Some((waited, state, join_state)) = stuck else {
            return;
        };
        if join_state.ends_with("unassign-to-complete") && waited >= UNASSIGN_STUCK_AFTER {
            self.make_consumer_again(&state, &join_state, waited);
            return;
        }
        if waited < Duration::from_secs(self.config.group_rejoin_after_secs) {
            return;
        }
        let pattern = self.config.topic_pattern();
        warn!(
            state = %state,
            join_state = %join_state,
            unsettled_s = waited.as_secs(),
            "the consumer has not been a settled member of its group for too long: subscribing again"
        );
        self.consumer.unsubscribe();
        if let Err(e) = self.consumer.subscribe(&[pattern.as_str()]) {
            error!(pattern = %pattern, error = %e, "cannot subscribe again");
        }
        // Another full wait before the next attempt.
        if let Ok(mut g) = self.group.lock() {
            g.stuck_since = Some(Instant::now());
        }
    }
}

/// A consumer subscribed to the copy's topics, with what its context
/// shares with the pipeline.
struct MadeConsumer {
    consumer: ChangeConsumer,
    rebalances: mpsc::UnboundedReceiver<RebalanceEvent>,
    closing: Arc<AtomicBool>,
    group: Arc<std::sync::Mutex<GroupHealth>>,
}

/// Makes the runner's consumer and subscribes it.
fn make_consumer(
    config: &SinkRunnerConfig,
    labeler: &Labeler,
    telemetry: &Telemetry,
    control: &Control,
    offsets_unreadable: &Arc<AtomicBool>,
) -> Result<MadeConsumer, RunError> {
    let (rebalance_tx, rebalances) = mpsc::unbounded_channel();
    let group = Arc::new(std::sync::Mutex::new(GroupHealth::default()));
    let closing = Arc::new(AtomicBool::new(false));
    let excluded_config = config.clone();
    let topic_label = {
        let (labeler, prefix) = (labeler.clone(), config.prefix.clone());
        Arc::new(move |topic: &str| labeler(&table_from_topic(topic, prefix.as_deref())))
    };
    let ctx = ConsumerCtx {
        rebalances: rebalance_tx,
        excluded: Arc::new(move |t: &str| excluded_config.is_excluded(t)),
        telemetry: telemetry.clone(),
        control: control.clone(),
        group: group.clone(),
        offsets_unreadable: offsets_unreadable.clone(),
        topic_label,
        closing: closing.clone(),
    };
    let consumer: ChangeConsumer = consumer_config(config)?
        .create_with_context(ctx)
        .map_err(|e| RunError::Kafka(format!("cannot create the consumer: {e}")))?;
    let pattern = config.topic_pattern();
    consumer
        .subscribe(&[pattern.as_str()])
        .map_err(|e| RunError::Kafka(format!("cannot subscribe to {pattern}: {e}")))?;
    info!(pattern = %pattern, "subscribed");
    Ok(MadeConsumer { consumer, rebalances, closing, group })
}
