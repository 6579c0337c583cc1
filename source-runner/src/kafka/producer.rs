//! The source runner's transactional producer: begin, send, commit and
//! abort one Kafka transaction at a time, under the runner's stable
//! `transactional.id` (so that a restarted runner fences its crashed
//! predecessor, and the broker aborts what that one left open).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use rdkafka::client::ClientContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::OwnedHeaders;
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::Message;
use tracing::warn;
use tributary_connectors::kafka::{kafka_error, too_large, too_large_error};
use tributary_connectors::Error;
use tributary_schemas::TableId;

use super::{blocking, unfinished};
use crate::config::SourceRunnerConfig;

/// How long to wait for Kafka's answer to a transaction step.
pub const KAFKA_TXN_STEP_TIMEOUT: Duration = Duration::from_secs(30);
/// How long to wait before offering a record again while librdkafka's
/// queue is full.
const DELIVERY_CHECK: Duration = Duration::from_millis(1);
/// How often a refused login is looked for while the first calls wait on
/// the broker.
const AUTHENTICATION_CHECK: Duration = Duration::from_millis(200);

/// The producer's context: keeps the largest record Kafka refused as too
/// large since the last look, so that the failed commit can say which
/// record, how large and on which topic (librdkafka reports a refused
/// record only in its delivery report; the commit says no more than that
/// the transaction failed).
#[derive(Clone, Default)]
pub struct SourceProducerContext {
    refused: Arc<std::sync::Mutex<Option<(String, usize, RDKafkaErrorCode)>>>,
    /// librdkafka's last authentication failure (a refused SASL login, an
    /// OAuth token it could not get): it retries those by itself, so the
    /// calls waiting on the broker would only time out, saying nothing of
    /// the cause.
    auth_failure: Arc<std::sync::Mutex<Option<String>>>,
}

impl ClientContext for SourceProducerContext {
    fn error(&self, error: KafkaError, reason: &str) {
        if tributary_operations::kafka::is_authentication_failure(&error) {
            *self.auth_failure.lock().unwrap_or_else(|e| e.into_inner()) = Some(reason.to_string());
        }
        warn!(error = %error, reason, "librdkafka reports an error");
    }
}

impl ProducerContext for SourceProducerContext {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        let Err((err, message)) = result else {
            return;
        };
        let Some(code) = err.rdkafka_error_code().filter(|c| too_large(*c)) else {
            return;
        };
        let bytes = message.key_len() + message.payload_len();
        let mut refused = self.refused.lock().unwrap_or_else(|e| e.into_inner());
        if refused.as_ref().is_none_or(|(_, b, _)| bytes > *b) {
            *refused = Some((message.topic().to_string(), bytes, code));
        }
    }
}

impl SourceProducerContext {
    /// Resolves with the needs-operator error of the first authentication
    /// failure librdkafka reports.
    async fn authentication_failed(&self) -> Error {
        loop {
            if let Some(reason) = self.auth_failure.lock().unwrap_or_else(|e| e.into_inner()).take() {
                use tributary_operations::kafka::{AUTHENTICATION_FAILED, AUTHENTICATION_HINT};
                return Error::needs_operator(format!("{AUTHENTICATION_FAILED}: {reason}"))
                    .with_class("kafka.Authentication")
                    .with_hint(AUTHENTICATION_HINT);
            }
            tokio::time::sleep(AUTHENTICATION_CHECK).await;
        }
    }

    /// The largest record refused as too large since the last call.
    fn take_refused(&self) -> Option<(String, usize, RDKafkaErrorCode)> {
        self.refused.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

/// The librdkafka producer of a source runner.
pub(crate) type SourceProducer = ThreadedProducer<SourceProducerContext>;

/// The runner's transactional producer, and whether a transaction is open.
pub struct TransactionalProducer {
    producer: Arc<SourceProducer>,
    open: bool,
}

impl TransactionalProducer {
    /// The producer of `config`'s runner. Connects nothing yet; see
    /// [`TransactionalProducer::fence`].
    pub fn create(config: &SourceRunnerConfig) -> Result<Self, Error> {
        let mut producer_config = config.kafka.client_config().map_err(|e| Error::needs_operator(e.to_string()))?;
        // Correctness and the memory bound: never overridable.
        producer_config
            .set("transactional.id", config.transactional_id())
            .set("enable.idempotence", "true")
            .set("transaction.timeout.ms", config.transaction_timeout_ms.to_string())
            .set("queue.buffering.max.kbytes", config.producer_queue_kbytes.to_string());
        // Tuning: only where `kafka.properties` does not say otherwise. lz4,
        // not zstd: zstd took a sixth of the runner's CPU in a 1M-row
        // snapshot on 2 cores shared with the database and the broker, and
        // lz4 made that snapshot about 20% faster (141-150k vs 120k rows/s).
        // A 20 ms linger fills a snapshot's produce requests; a commit does
        // not wait for it (see `wait_delivered`). Delivery reports only for
        // failures: nothing reads the others (a failed record fails the
        // transaction's commit, and the runner retries from the last
        // checkpoint), and serving a million of them took a quarter second
        // of CPU per 1M-row snapshot.
        for (key, value) in [
            ("linger.ms", "20"),
            ("compression.type", "lz4"),
            ("delivery.report.only.error", "true"),
        ] {
            if producer_config.get(key).is_none() {
                producer_config.set(key, value);
            }
        }
        let producer: SourceProducer = producer_config
            .create_with_context(SourceProducerContext::default())
            .map_err(|e| kafka_error("cannot create the producer", e))?;
        Ok(Self { producer: Arc::new(producer), open: false })
    }

    /// Fences every earlier instance of the runner (`init_transactions`):
    /// started at once, resolved when the broker has aborted whatever a
    /// crashed predecessor left open.
    pub fn fence(&self) -> impl Future<Output = Result<(), Error>> {
        let p = self.producer.clone();
        let fencing = tokio::task::spawn_blocking(move || p.init_transactions(KAFKA_TXN_STEP_TIMEOUT));
        async move {
            fencing
                .await
                .map_err(unfinished)?
                .map_err(|e| kafka_error("init_transactions (fencing the previous instance)", e))
        }
    }

    /// Resolves with the error of the first refused login.
    pub async fn authentication_failed(&self) -> Error {
        self.producer.context().authentication_failed().await
    }

    /// The librdkafka client, for metadata requests.
    pub(crate) fn client(&self) -> Arc<SourceProducer> {
        self.producer.clone()
    }

    /// Begins a Kafka transaction unless one is open.
    pub async fn begin(&mut self) -> Result<(), Error> {
        if !self.open {
            let p = self.producer.clone();
            blocking(move || p.begin_transaction())
                .await?
                .map_err(|e| kafka_error("begin_transaction", e))?;
            self.open = true;
        }
        Ok(())
    }

    /// Waits for every record sent to be delivered, then commits the open
    /// transaction; on failure it is aborted.
    pub async fn commit(&mut self) -> Result<(), Error> {
        self.wait_delivered().await;
        let p = self.producer.clone();
        match blocking(move || p.commit_transaction(KAFKA_TXN_STEP_TIMEOUT)).await? {
            Ok(()) => {
                self.open = false;
                Ok(())
            }
            Err(e) => {
                self.abort().await;
                Err(kafka_error("commit_transaction", e))
            }
        }
    }

    /// Aborts the open transaction, if any: nothing of it is visible to
    /// `read_committed` consumers.
    pub async fn abort(&mut self) {
        if !std::mem::replace(&mut self.open, false) {
            return; // nothing begun (a schema refused before the first batch)
        }
        let p = self.producer.clone();
        match blocking(move || p.abort_transaction(KAFKA_TXN_STEP_TIMEOUT)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                warn!(error = %e, "abort_transaction failed; the broker aborts the transaction at its timeout")
            }
            Err(e) => warn!(error = %e, "abort_transaction did not run"),
        }
    }

    /// Enqueues one record; a full queue is backpressure: wait a moment
    /// for deliveries to free some of it, then try again (not `flush`,
    /// which waits for all of them, 100 ms at least: see
    /// [`TransactionalProducer::wait_delivered`]).
    pub async fn send(
        &self,
        topic: &str,
        partition: Option<i32>,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        headers: Option<OwnedHeaders>,
    ) -> Result<(), Error> {
        let mut record: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(topic);
        if let Some(p) = partition {
            record = record.partition(p);
        }
        if let Some(k) = key {
            record = record.key(k);
        }
        if let Some(v) = value {
            record = record.payload(v);
        }
        let bytes = key.map_or(0, <[u8]>::len) + value.map_or(0, <[u8]>::len);
        if let Some(h) = headers {
            record = record.headers(h);
        }
        loop {
            match self.producer.send(record) {
                Ok(()) => return Ok(()),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                    record = r;
                    tokio::time::sleep(DELIVERY_CHECK).await;
                }
                Err((KafkaError::MessageProduction(code), _)) if too_large(code) => {
                    return Err(too_large_error(topic, bytes, code))
                }
                Err((e, _)) => return Err(kafka_error("produce", e)),
            }
        }
    }

    /// `err`, or, when Kafka refused a record as too large meanwhile, an
    /// error naming that record's size, its table (`table_of` its topic)
    /// and what to raise.
    pub fn refused_or(&self, err: Error, table_of: impl Fn(&str) -> Option<TableId>) -> Error {
        match self.producer.context().take_refused() {
            Some((topic, bytes, code)) => {
                let e = too_large_error(&topic, bytes, code);
                match table_of(&topic) {
                    Some(table) => e.with_table(table),
                    None => e,
                }
            }
            None => err,
        }
    }

    /// Waits until librdkafka has delivered every queued record (or for
    /// [`KAFKA_TXN_STEP_TIMEOUT`]; `commit_transaction` then reports what is
    /// left).
    ///
    /// rust-rdkafka's `commit_transaction` and `flush` wait for deliveries
    /// by polling the producer's event queue, 100 ms at a time, while the
    /// `ThreadedProducer`'s own thread serves that queue: with anything in
    /// flight, each call slept about 100 ms after the last delivery
    /// (measured: 100-108 ms per commit, whatever its size). librdkafka's
    /// own `rd_kafka_flush`, with delivery reports as events (as
    /// rust-rdkafka sets them), serves no queue: it sends what lingers at
    /// once and waits for the in-flight count to reach zero, so the
    /// commit's own flush then finds nothing left and returns at once. That
    /// also lets `linger.ms` fill a snapshot's requests without delaying a
    /// streamed transaction's commit.
    async fn wait_delivered(&self) {
        let p = self.producer.clone();
        let timeout_ms = i32::try_from(KAFKA_TXN_STEP_TIMEOUT.as_millis()).unwrap_or(i32::MAX);
        // SAFETY: the pointer is that of the producer `p` keeps alive for
        // the call; rd_kafka_flush may be called from any thread.
        let flushed =
            blocking(move || unsafe { rdkafka::bindings::rd_kafka_flush(p.client().native_ptr(), timeout_ms) }).await;
        if let Err(e) = flushed {
            warn!(error = %e, "cannot wait for deliveries; the commit reports what is left");
        }
    }
}
