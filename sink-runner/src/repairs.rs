//! Asking the source runner to repair rows (`[verify] repair = true`): a
//! request on the copy's requests topic
//! ([`tributary_schemas::records::requests`]) with the keys a verification
//! found missing or changed. The source sends their rows again and then
//! verifies the table again; the sink applies them as any change.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use rdkafka::producer::{FutureProducer, FutureRecord};
use tributary_connectors::kafka::kafka_error;
use tributary_connectors::Error;
use tributary_schemas::records::requests::{self, Request};
use tributary_schemas::TableId;

use crate::config::SinkRunnerConfig;

/// How long sending a request may take.
const SEND_TIMEOUT: Duration = Duration::from_secs(30);

/// Keys gathered for one request at most: a request goes out once its
/// verification ended here, or once this many are waiting (a table that
/// differs everywhere is repaired in parts; each request is one Kafka
/// record, far below its size limit).
const REQUEST_KEYS: usize = 5_000;

/// The producer of repair requests, when repairs are on.
pub(crate) struct RepairRequests {
    producer: FutureProducer,
    topic: String,
    /// Keys to send again per table and verification, gathered from its
    /// ranges: one request per verification, not one per range (each
    /// request is a repair and a verification after it; on a topic of
    /// several partitions, one per partition's ranges).
    pending: Mutex<BTreeMap<(TableId, u64), Vec<String>>>,
}

impl RepairRequests {
    /// The producer, when `[verify] repair` is on (validation made sure
    /// the prefix that names the topic is set).
    pub(crate) fn new(config: &SinkRunnerConfig) -> Result<Option<Self>, Error> {
        let Some(prefix) = config.prefix.as_deref().filter(|_| config.verify.repair) else {
            return Ok(None);
        };
        let mut c = config.kafka.client_config().map_err(|e| Error::needs_operator(e.to_string()))?;
        c.set("enable.idempotence", "true").set("acks", "all");
        let producer: FutureProducer = c.create().map_err(|e| kafka_error("repair requests producer", e))?;
        Ok(Some(Self {
            producer,
            topic: requests::topic(prefix),
            pending: Mutex::new(BTreeMap::new()),
        }))
    }

    /// Adds `keys` to what verification `id` of `table` asks; the requests
    /// due now: the keys of this table's earlier verifications, and this
    /// one's once it `ended` or holds [`REQUEST_KEYS`].
    pub(crate) fn gather(&self, table: &TableId, id: u64, keys: Vec<String>, ended: bool) -> Vec<Request> {
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        if !keys.is_empty() {
            pending.entry((table.clone(), id)).or_default().extend(keys);
        }
        let due: Vec<(TableId, u64)> = pending
            .iter()
            .filter(|((t, v), k)| t == table && (*v < id || ended || k.len() >= REQUEST_KEYS))
            .map(|(key, _)| key.clone())
            .collect();
        due.into_iter()
            .filter_map(|key| pending.remove(&key).map(|keys| (key, keys)))
            .filter(|(_, keys)| !keys.is_empty())
            .map(|((table, verification), keys)| Request::Repair { table, verification, keys })
            .collect()
    }

    /// Sends `request`.
    pub(crate) async fn send(&self, request: &Request) -> Result<(), Error> {
        let key = request.key();
        let value = request.value();
        let record = FutureRecord::to(&self.topic).key(&key).payload(&value);
        self.producer
            .send(record, SEND_TIMEOUT)
            .await
            .map(|_| ())
            .map_err(|(e, _)| kafka_error(&format!("sending a repair request to {}", self.topic), e))
    }
}
