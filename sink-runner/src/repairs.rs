//! Asking the source runner, on the copy's requests topic
//! ([`tributary_schemas::records::requests`]): to repair rows (`[verify]
//! repair = true`), with the keys a verification found missing or changed
//! (the source sends their rows again and then verifies the table again;
//! the sink applies them as any change); and to verify with their rows'
//! digests the ranges whose summaries differed, or could not be computed
//! here (a verification by summaries, see docs/verification.md).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use rdkafka::producer::{FutureProducer, FutureRecord};
use tributary_connectors::kafka::kafka_error;
use tributary_connectors::Error;
use tributary_schemas::records::requests::{self, KeyBounds, Request};
use tributary_schemas::TableId;

use crate::config::SinkRunnerConfig;

/// How long sending a request may take.
const SEND_TIMEOUT: Duration = Duration::from_secs(30);

/// Keys gathered for one request at most: a request goes out once its
/// verification ended here, or once this many are waiting (a table that
/// differs everywhere is repaired in parts; each request is one Kafka
/// record, far below its size limit).
const REQUEST_KEYS: usize = 5_000;

/// The producer of requests to the source runner.
pub(crate) struct RepairRequests {
    producer: FutureProducer,
    topic: String,
    /// Whether repairs are on (`[verify] repair`).
    pub(crate) repair: bool,
    /// Ranges to verify by rows per table and verification, gathered from
    /// its summarized ranges: one request once the verification ended
    /// here (a request asked while the table is verified again is not
    /// taken).
    ranges: Mutex<BTreeMap<(TableId, u64), Vec<KeyBounds>>>,
    /// Keys to send again per table and verification, gathered from its
    /// ranges: one request per verification, not one per range (each
    /// request is a repair and a verification after it; on a topic of
    /// several partitions, one per partition's ranges).
    pending: Mutex<BTreeMap<(TableId, u64), Vec<String>>>,
}

impl RepairRequests {
    /// The producer, when the prefix that names the topic is set
    /// (validation made sure it is when `[verify] repair` is on).
    pub(crate) fn new(config: &SinkRunnerConfig) -> Result<Option<Self>, Error> {
        let Some(prefix) = config.prefix.as_deref() else {
            return Ok(None);
        };
        let mut c = config.kafka.client_config().map_err(|e| Error::needs_operator(e.to_string()))?;
        c.set("enable.idempotence", "true").set("acks", "all");
        let producer: FutureProducer = c.create().map_err(|e| kafka_error("repair requests producer", e))?;
        Ok(Some(Self {
            producer,
            topic: requests::topic(prefix),
            repair: config.verify.repair,
            ranges: Mutex::new(BTreeMap::new()),
            pending: Mutex::new(BTreeMap::new()),
        }))
    }

    /// Adds `ranges` to what verification `id` of `table` asks to verify by
    /// rows; the requests due now: this table's earlier verifications',
    /// and this one's once it `ended` here.
    pub(crate) fn gather_ranges(&self, table: &TableId, id: u64, ranges: Vec<KeyBounds>, ended: bool) -> Vec<Request> {
        let mut pending = self.ranges.lock().unwrap_or_else(|p| p.into_inner());
        take_due(&mut pending, table, id, ranges, |_| ended)
            .into_iter()
            .map(|(verification, ranges)| Request::Verify { table: table.clone(), verification, ranges })
            .collect()
    }

    /// Adds `keys` to what verification `id` of `table` asks; the requests
    /// due now: the keys of this table's earlier verifications, and this
    /// one's once it `ended` or holds [`REQUEST_KEYS`].
    pub(crate) fn gather(&self, table: &TableId, id: u64, keys: Vec<String>, ended: bool) -> Vec<Request> {
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        take_due(&mut pending, table, id, keys, |k| ended || k.len() >= REQUEST_KEYS)
            .into_iter()
            .map(|(verification, keys)| Request::Repair { table: table.clone(), verification, keys })
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
            .map_err(|(e, _)| kafka_error(&format!("sending a request to {}", self.topic), e))
    }
}

/// Adds `items` to what verification `id` of `table` gathered in `pending`;
/// takes out what is due: the table's earlier verifications', and this
/// one's once `due` says so (of what it gathered). Empty ones are dropped.
fn take_due<T>(
    pending: &mut BTreeMap<(TableId, u64), Vec<T>>,
    table: &TableId,
    id: u64,
    items: Vec<T>,
    due: impl Fn(&[T]) -> bool,
) -> Vec<(u64, Vec<T>)> {
    if !items.is_empty() {
        pending.entry((table.clone(), id)).or_default().extend(items);
    }
    let keys: Vec<(TableId, u64)> = pending
        .iter()
        .filter(|((t, v), items)| t == table && (*v < id || due(items)))
        .map(|(key, _)| key.clone())
        .collect();
    keys.into_iter()
        .filter_map(|key| pending.remove(&key).map(|items| (key.1, items)))
        .filter(|(_, items)| !items.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_gathered_goes_out_once_due_and_earlier_verifications_first() {
        let mut pending = BTreeMap::new();
        let t = TableId::new("s", "t");
        let other = TableId::new("s", "u");
        assert!(take_due(&mut pending, &t, 1, vec!["a"], |_| false).is_empty());
        assert!(take_due(&mut pending, &other, 1, vec!["x"], |_| false).is_empty());
        // The next verification of the table: the first one's are due.
        assert_eq!(take_due(&mut pending, &t, 2, vec!["b"], |_| false), vec![(1, vec!["a"])]);
        assert_eq!(take_due(&mut pending, &t, 2, vec!["c"], |i| i.len() >= 2), vec![(2, vec!["b", "c"])]);
        // Nothing gathered is nothing asked; the other table's wait.
        assert!(take_due(&mut pending, &t, 3, Vec::new(), |_| true).is_empty());
        assert_eq!(take_due(&mut pending, &other, 1, Vec::new(), |_| true), vec![(1, vec!["x"])]);
        assert!(pending.is_empty());
    }
}
