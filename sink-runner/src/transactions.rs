//! Whole source transactions, for `consistency = "transactional"`
//! (docs/consistency.md): records wait here, per topic partition in Kafka
//! order, until the copy's transaction topic says which of them make a
//! source transaction (its END record counts its changes per table) and
//! all of them arrived; then the transaction's changes and its END enter
//! the buffers' one lane together, so that every batch cut from the lane
//! holds whole transactions, and their offsets, the transaction topic's
//! too, are stored with them.
//!
//! Records of no transaction (a snapshot's rows, control records, changes
//! of an older source runner) go on as they reach the front of their
//! partition. A transaction larger than the bound on what may wait here is
//! released in parts as its changes come (said loudly: a reader may see
//! part of it), and so is one whose END waited too long for changes that
//! never came (applied before a crash, when it had been released in
//! parts).

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use tracing::{info, warn};
use tributary_connectors::{Error, ErrorKind, KafkaPosition, Sink, SinkRecord};
use tributary_schemas::records::transaction::TransactionRecord;
use tributary_schemas::{ChangeEvent, Column, DataType, EventDecoder, Op, TableId, TableSchema, Value};

use crate::buffer::RawRecord;
use crate::decode::{decode_record, table_from_topic};
use crate::pipeline::Pipeline;

/// How long an END may wait at the front for changes of its transaction
/// that do not come before it is released without them.
pub const INCOMPLETE_AFTER: Duration = Duration::from_secs(60);
/// How many ids of transactions released incomplete are kept, so that
/// their changes arriving later go on rather than wait for an END.
const FINISHED_KEPT: usize = 10_000;

/// What a waiting record is.
#[derive(Debug, Clone, PartialEq)]
enum Kind {
    /// Not decoded yet.
    Unscanned,
    /// Belongs to no transaction.
    Free,
    /// A change of transaction `txn` of table `table` (`schema.table`).
    Change { txn: String, table: String },
    /// A BEGIN record.
    Begin,
    /// An END record.
    End(End),
}

/// An END record: the transaction, its commit time and its changes per
/// table.
#[derive(Debug, Clone, PartialEq)]
pub struct End {
    /// The source transaction's id.
    pub id: String,
    /// Its commit time at the source, in ms.
    pub ts_ms: i64,
    /// Its changes per table (`schema.table`).
    pub counts: Vec<(String, i64)>,
}

impl End {
    /// The END a record of the transaction topic is (`None`: a BEGIN).
    fn of(record: TransactionRecord) -> Option<Self> {
        match record {
            TransactionRecord::End { id, ts_ms, data_collections } => Some(End { id, ts_ms, counts: data_collections }),
            TransactionRecord::Begin { .. } => None,
        }
    }
}

#[derive(Debug)]
struct Entry {
    raw: RawRecord,
    kind: Kind,
}

/// What waits for whole transactions.
#[derive(Debug, Default)]
pub struct Transactions {
    /// The transaction topic (`None`: per-table consistency, nothing
    /// waits here).
    topic: Option<String>,
    queues: BTreeMap<(String, i32), VecDeque<Entry>>,
    /// Changes received and not released, per transaction and table.
    received: HashMap<String, HashMap<String, i64>>,
    /// Transactions released in parts: their changes go as they come.
    split: HashSet<String>,
    /// Transactions whose END went without all their changes.
    finished: VecDeque<String>,
    bytes: usize,
    /// Since when the END at the front has waited.
    front_since: Option<(String, Instant)>,
    /// Transactions released in parts so far.
    pub split_total: u64,
    /// Whether a transaction over the bound goes into one destination
    /// transaction held open across batches (the sink can,
    /// `Sink::spans_batches`) rather than in committed parts.
    pub spans: bool,
    /// The transactions over the bound going into the destination whole
    /// across batches, each until its END goes into the lane: the
    /// destination transaction stays open while there is one.
    pub spanning: Vec<String>,
    /// Transactions over the bound applied so, so far.
    pub spanned_total: u64,
    /// Transactions whose unit across batches failed: applied in parts
    /// when read again.
    no_span: VecDeque<String>,
    /// Why this member applies nothing: it holds only some partitions of
    /// the copy (see `Pipeline::check_whole_copy`).
    pub refusing: Option<String>,
}

/// What a call of [`Transactions::release`] let go.
#[derive(Debug, Default)]
pub struct Released {
    /// The records, in the order they go into the lane.
    pub records: Vec<RawRecord>,
}

impl Transactions {
    /// Waits for whole transactions of the copy whose transaction topic is
    /// `topic`; `None`: lets nothing wait.
    pub fn new(topic: Option<String>) -> Self {
        Self { topic, ..Self::default() }
    }

    /// Whether records wait here at all (transactional consistency).
    pub fn enabled(&self) -> bool {
        self.topic.is_some()
    }

    /// Bytes of the records waiting.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Takes a record from Kafka.
    pub fn push(&mut self, raw: RawRecord) {
        self.bytes += raw.size();
        let key = (raw.topic.clone(), raw.partition);
        self.queues
            .entry(key)
            .or_default()
            .push_back(Entry { raw, kind: Kind::Unscanned });
    }

    /// Drops everything waiting.
    pub fn clear(&mut self) {
        let topic = self.topic.take();
        let refusing = self.refusing.take();
        let no_span = std::mem::take(&mut self.no_span);
        *self = Self {
            topic,
            split_total: self.split_total,
            spans: self.spans,
            spanned_total: self.spanned_total,
            no_span,
            refusing,
            ..Self::default()
        };
    }

    /// Makes transaction `id` go in committed parts when it is over the
    /// bound again: its unit across batches failed.
    pub fn no_span(&mut self, id: String) {
        if !self.no_span.contains(&id) {
            self.no_span.push_back(id);
        }
        while self.no_span.len() > FINISHED_KEPT {
            self.no_span.pop_front();
        }
    }

    /// Drops what waits of a revoked partition.
    pub fn drop_partition(&mut self, topic: &str, partition: i32) {
        if let Some(q) = self.queues.remove(&(topic.to_string(), partition)) {
            for e in q {
                self.bytes = self.bytes.saturating_sub(e.raw.size());
                if let Kind::Change { txn, table } = e.kind {
                    forget(&mut self.received, &txn, &table);
                }
            }
        }
    }

    /// Decodes what arrived since the last call, to know each record's
    /// transaction. A record that cannot be decoded for good belongs to
    /// none (it is dead-lettered when its batch is decoded again); an error
    /// a retry may fix stops here, to be tried at the next call.
    pub async fn scan(&mut self, decoder: &mut EventDecoder, table_of: impl Fn(&str) -> TableId) -> Result<(), Error> {
        let Some(txn_topic) = self.topic.clone() else {
            return Ok(());
        };
        let Self { queues, received, .. } = self;
        for ((topic, _), queue) in queues.iter_mut() {
            // What is not scanned yet is the back of the queue (scanning
            // goes in order and stops only at an error): looked at alone,
            // not every record waiting at every call.
            let unscanned = queue.iter().rev().take_while(|e| e.kind == Kind::Unscanned).count();
            if unscanned == 0 {
                continue;
            }
            let table = table_of(topic);
            let from = queue.len() - unscanned;
            for e in queue.range_mut(from..) {
                e.kind = if *topic == txn_topic {
                    match e.raw.value.as_deref().map(TransactionRecord::decode_value) {
                        Some(Ok(TransactionRecord::Begin { .. })) => Kind::Begin,
                        Some(Ok(record)) => End::of(record).map_or(Kind::Free, Kind::End),
                        Some(Err(err)) => {
                            warn!(topic = %topic, offset = e.raw.offset, error = %err,
                                "a record of the transaction topic cannot be read: skipped");
                            Kind::Free
                        }
                        None => Kind::Free,
                    }
                } else {
                    match decode_record(decoder, &e.raw, &table).await {
                        Ok(Some(SinkRecord::Change(ev))) => match ev.transaction {
                            Some(tx) => {
                                let table = ev.schema.id.to_string();
                                *received.entry(tx.id.clone()).or_default().entry(table.clone()).or_default() += 1;
                                Kind::Change { txn: tx.id, table }
                            }
                            None => Kind::Free,
                        },
                        Ok(_) => Kind::Free,
                        Err(err) if err.kind() == ErrorKind::Permanent => Kind::Free,
                        Err(err) => return Err(err),
                    }
                }
            }
        }
        Ok(())
    }

    /// Lets go what may go: records of no transaction at the front of
    /// their partition, and each transaction whose END is at the front of
    /// the transaction topic once all its changes arrived, its changes
    /// then its END. Over `bound` bytes with nothing to let go, the oldest
    /// transaction goes in parts. `now` times an END's wait.
    pub fn release(&mut self, bound: usize, now: Instant) -> Released {
        let mut out = Released::default();
        let Some(txn_topic) = self.topic.clone() else {
            return out;
        };
        loop {
            let mut progressed = self.release_free(&txn_topic, &mut out);
            match self.front_end(&txn_topic) {
                Some(end) => {
                    let complete = self.complete(&end);
                    let waited = match &self.front_since {
                        Some((id, since)) if *id == end.id => now.duration_since(*since),
                        _ => {
                            self.front_since = Some((end.id.clone(), now));
                            Duration::ZERO
                        }
                    };
                    let late = waited >= INCOMPLETE_AFTER;
                    if complete || late || self.split.contains(&end.id) && self.all_arrived(&end) {
                        if late && !complete {
                            warn!(transaction = %end.id, waited_s = waited.as_secs(),
                                "the END of a transaction waited too long for its changes: released without them \
                                 (their changes, if they come, are applied as they come)");
                            self.split_total += 1;
                            self.finish_incomplete(&end.id);
                        }
                        self.release_transaction(&txn_topic, &end, &mut out);
                        progressed = true;
                    }
                }
                None => self.front_since = None,
            }
            if !progressed {
                if out.records.is_empty() && self.bytes > bound {
                    if let Some(id) = self.oldest_waiting(&txn_topic) {
                        if self.spans && !self.no_span.contains(&id) {
                            info!(transaction = %id, waiting_bytes = self.bytes, bound,
                                "a source transaction is larger than max_buffered_bytes: applied in one destination \
                                 transaction held open across batches");
                            self.spanned_total += 1;
                            self.spanning.push(id.clone());
                        } else {
                            warn!(transaction = %id, waiting_bytes = self.bytes, bound,
                                "a source transaction is larger than max_buffered_bytes: it is applied in parts, and \
                                 a reader may see part of it until its last part is applied");
                            self.split_total += 1;
                        }
                        self.split.insert(id);
                        continue;
                    }
                }
                break;
            }
        }
        out
    }

    /// What the front of the transaction topic waits for, for the status:
    /// the transaction, and how long it has waited.
    pub fn waiting(&self, now: Instant) -> Option<(String, Duration)> {
        self.front_since
            .as_ref()
            .map(|(id, since)| (id.clone(), now.duration_since(*since)))
    }

    fn front_end(&self, txn_topic: &str) -> Option<End> {
        self.queues
            .iter()
            .filter(|((t, _), _)| t == txn_topic)
            .find_map(|(_, q)| match q.front().map(|e| &e.kind) {
                Some(Kind::End(end)) => Some(end.clone()),
                _ => None,
            })
    }

    /// Whether every change `end` counts arrived.
    fn all_arrived(&self, end: &End) -> bool {
        let got = self.received.get(&end.id);
        end.counts
            .iter()
            .all(|(t, n)| got.and_then(|g| g.get(t)).copied().unwrap_or(0) >= *n)
    }

    /// Whether every change `end` counts arrived and stands at the front
    /// of its partition (behind nothing of another transaction).
    fn complete(&self, end: &End) -> bool {
        if !self.all_arrived(end) {
            return false;
        }
        let total: i64 = end.counts.iter().map(|(_, n)| n).sum();
        let leading: usize = self
            .queues
            .values()
            .map(|q| {
                q.iter()
                    .take_while(|e| matches!(&e.kind, Kind::Change { txn, .. } if *txn == end.id))
                    .count()
            })
            .sum();
        leading as i64 >= total
    }

    /// Records of no transaction (and of transactions that go in parts or
    /// went without all their changes) at the front of their partition.
    fn release_free(&mut self, txn_topic: &str, out: &mut Released) -> bool {
        let mut progressed = false;
        let Self { queues, received, split, finished, bytes, .. } = self;
        for ((topic, _), queue) in queues.iter_mut() {
            while let Some(front) = queue.front() {
                let go = match &front.kind {
                    Kind::Free => true,
                    Kind::Begin => true,
                    Kind::Change { txn, .. } => split.contains(txn) || finished.contains(txn),
                    Kind::Unscanned | Kind::End(_) => false,
                };
                if !go || (topic == txn_topic && !matches!(front.kind, Kind::Begin | Kind::Free)) {
                    break;
                }
                let Some(e) = queue.pop_front() else { break };
                *bytes = bytes.saturating_sub(e.raw.size());
                // A part of a transaction that goes in parts still counts
                // towards its END; one whose END went is forgotten.
                if let Kind::Change { txn, table } = &e.kind {
                    if !split.contains(txn) {
                        forget(received, txn, table);
                    }
                }
                out.records.push(e.raw);
                progressed = true;
            }
        }
        progressed
    }

    /// `end`'s changes at the front of every partition, then `end`.
    fn release_transaction(&mut self, txn_topic: &str, end: &End, out: &mut Released) {
        let Self { queues, bytes, .. } = self;
        for ((topic, _), queue) in queues.iter_mut() {
            if topic == txn_topic {
                continue;
            }
            while queue
                .front()
                .is_some_and(|e| matches!(&e.kind, Kind::Change { txn, .. } if *txn == end.id))
            {
                let Some(e) = queue.pop_front() else { break };
                *bytes = bytes.saturating_sub(e.raw.size());
                out.records.push(e.raw);
            }
        }
        self.received.remove(&end.id);
        self.split.remove(&end.id);
        self.spanning.retain(|id| *id != end.id);
        if let Some(q) = self.queues.iter_mut().find(|((t, _), _)| t == txn_topic).map(|(_, q)| q) {
            if let Some(e) = q.pop_front() {
                self.bytes = self.bytes.saturating_sub(e.raw.size());
                out.records.push(e.raw);
            }
        }
        self.front_since = None;
    }

    fn finish_incomplete(&mut self, id: &str) {
        self.finished.push_back(id.to_string());
        while self.finished.len() > FINISHED_KEPT {
            self.finished.pop_front();
        }
    }

    /// The transaction of the oldest change waiting: the END at the front
    /// of the transaction topic's, or else any change at the front of its
    /// partition.
    /// Only transactions not already going in parts: the END at the front
    /// of one that is waits for its changes to arrive (looking again at it
    /// spun for ever).
    fn oldest_waiting(&self, txn_topic: &str) -> Option<String> {
        if let Some(end) = self.front_end(txn_topic).filter(|e| !self.split.contains(&e.id)) {
            return Some(end.id);
        }
        self.queues.values().find_map(|q| match q.front().map(|e| &e.kind) {
            Some(Kind::Change { txn, .. }) if !self.split.contains(txn) => Some(txn.clone()),
            _ => None,
        })
    }
}

/// Counts a change of `txn` in `table` as gone from `received` (and the
/// transaction once none of its changes is left).
fn forget(received: &mut HashMap<String, HashMap<String, i64>>, txn: &str, table: &str) {
    if let Some(t) = received.get_mut(txn) {
        if let Some(n) = t.get_mut(table) {
            *n -= 1;
        }
        if t.values().all(|n| *n <= 0) {
            received.remove(txn);
        }
    }
}

/// How often the pipeline looks at an END waiting for its changes.
pub const WAITING_CHECK: Duration = Duration::from_secs(1);

impl<S: Sink + 'static> Pipeline<S> {
    /// Decodes what arrived, lets whole transactions (and records of none)
    /// into the lane, and says what the copy waits for.
    pub(crate) async fn release_transactions(&mut self) {
        let prefix = self.config.prefix.clone();
        let tables = &self.tables;
        let table_of = |topic: &str| {
            tables
                .get(topic)
                .cloned()
                .unwrap_or_else(|| table_from_topic(topic, prefix.as_deref()))
        };
        if let Err(e) = self.transactions.scan(&mut self.decoder, table_of).await {
            warn!(error = %e, "cannot decode records to tell their transactions: trying again");
            return;
        }
        let now = Instant::now();
        let released = self.transactions.release(self.limits.max_buffered, now);
        for raw in released.records {
            self.buffers.push(raw, || now);
        }
        let waiting = self
            .transactions
            .waiting(now)
            .filter(|(_, waited)| *waited >= WAITING_CHECK)
            .map(|(id, waited)| (id, waited.as_secs()));
        if let Some((id, secs)) = &waiting {
            if *secs > 0 && secs % 30 == 0 {
                warn!(transaction = %id, waited_s = secs,
                    "waiting for the changes of a source transaction (every partition of the copy's topics must be \
                     this member's, see docs/consistency.md)");
            }
        }
        self.telemetry.set_transactions_waiting(
            waiting,
            self.transactions.split_total,
            self.transactions.spanned_total,
        );
    }
}

/// The source table whose destination table keeps the moment a
/// transactional sink's destination reflects (named by the sink's own
/// rules, e.g. `tributary.consistent_as_of` in PostgreSQL by default).
pub fn consistent_as_of_table() -> TableId {
    TableId::new(tributary_connectors::sink::bookkeeping::BOOKKEEPING_SCHEMA, "consistent_as_of")
}

fn consistent_as_of_schema() -> std::sync::Arc<TableSchema> {
    static SCHEMA: std::sync::OnceLock<std::sync::Arc<TableSchema>> = std::sync::OnceLock::new();
    SCHEMA
        .get_or_init(|| {
            let column = Column::new;
            std::sync::Arc::new(TableSchema {
                id: consistent_as_of_table(),
                columns: vec![
                    column("copy", DataType::Text, false),
                    column("transaction_id", DataType::Text, false),
                    column("committed_at", DataType::TimestampTz, false),
                    column("source_position", DataType::Text, false),
                ],
                key: vec!["copy".to_string()],
                dropped: Vec::new(),
            })
        })
        .clone()
}

/// The row that says the destination reflects the source as of `end`'s
/// commit, for copy `copy`: written in the destination transaction that
/// applies `end`'s changes, with the source information of the newest of
/// `records` (its position keeps the row moving forward only). `None`
/// when the batch holds no change of a transaction.
pub fn consistent_as_of_event(end: &End, copy: &str, records: &[(KafkaPosition, SinkRecord)]) -> Option<SinkRecord> {
    let newest = records
        .iter()
        .filter_map(|(_, r)| match r {
            SinkRecord::Change(ev) if ev.transaction.is_some() => Some(ev),
            _ => None,
        })
        .max_by_key(|ev| ev.source.position)?;
    let mut source = newest.source.clone();
    source.ts_ms = end.ts_ms;
    let row = vec![
        Value::Text(copy.to_string()),
        Value::Text(end.id.clone()),
        Value::TimestampTz(end.ts_ms.saturating_mul(1000)),
        Value::Text(newest.source.native_position.to_string()),
    ];
    Some(SinkRecord::Change(ChangeEvent {
        schema: consistent_as_of_schema(),
        op: Op::Update,
        before: None,
        after: Some(row),
        source,
        ts_ms: newest.ts_ms,
        transaction: None,
    }))
}

/// An END record's content, for the batch that carries it.
pub fn read_end(raw: &RawRecord) -> Option<End> {
    End::of(raw.value.as_deref().map(TransactionRecord::decode_value)?.ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TXN: &str = "shop.transaction";

    fn raw(topic: &str, partition: i32, offset: i64) -> RawRecord {
        RawRecord {
            topic: topic.into(),
            partition,
            offset,
            key: None,
            value: Some(vec![0; 10]),
            headers: Vec::new(),
        }
    }

    fn with(t: &mut Transactions, topic: &str, partition: i32, offset: i64, kind: Kind) {
        t.push(raw(topic, partition, offset));
        let q = t.queues.get_mut(&(topic.to_string(), partition)).expect("queue");
        if let Some(e) = q.back_mut() {
            if let Kind::Change { txn, table } = &kind {
                *t.received.entry(txn.clone()).or_default().entry(table.clone()).or_default() += 1;
            }
            e.kind = kind;
        }
    }

    fn change(txn: &str, table: &str) -> Kind {
        Kind::Change { txn: txn.into(), table: table.into() }
    }

    fn end(id: &str, counts: &[(&str, i64)]) -> Kind {
        Kind::End(End {
            id: id.into(),
            ts_ms: 1,
            counts: counts.iter().map(|(t, n)| (t.to_string(), *n)).collect(),
        })
    }

    fn offsets(r: &Released) -> Vec<(String, i64)> {
        r.records.iter().map(|r| (r.topic.clone(), r.offset)).collect()
    }

    #[test]
    fn a_transaction_goes_whole_once_its_end_and_every_change_arrived() {
        let now = Instant::now();
        let mut t = Transactions::new(Some(TXN.into()));
        with(&mut t, "shop.public.a", 0, 0, Kind::Free); // a snapshot row
        with(&mut t, "shop.public.a", 0, 1, change("7", "public.a"));
        with(&mut t, TXN, 0, 0, Kind::Begin);
        with(&mut t, TXN, 0, 1, end("7", &[("public.a", 1), ("public.b", 2)]));
        with(&mut t, "shop.public.b", 0, 0, change("7", "public.b"));
        let r = t.release(1 << 20, now);
        assert_eq!(
            offsets(&r),
            vec![("shop.public.a".into(), 0), (TXN.into(), 0)],
            "the free records go, the transaction waits for its last change"
        );
        with(&mut t, "shop.public.b", 1, 0, change("7", "public.b"));
        with(&mut t, "shop.public.b", 1, 1, change("8", "public.b"));
        let r = t.release(1 << 20, now);
        assert_eq!(
            offsets(&r),
            vec![
                ("shop.public.a".into(), 1),
                ("shop.public.b".into(), 0),
                ("shop.public.b".into(), 0),
                (TXN.into(), 1)
            ]
        );
        assert_eq!(t.release(1 << 20, now).records.len(), 0, "8 waits for its END");
    }

    #[test]
    fn a_transaction_over_the_bound_goes_in_parts_and_a_late_end_goes_without_its_changes() {
        let now = Instant::now();
        let mut t = Transactions::new(Some(TXN.into()));
        with(&mut t, "shop.public.a", 0, 0, change("9", "public.a"));
        with(&mut t, "shop.public.a", 0, 1, change("9", "public.a"));
        let r = t.release(1, now);
        assert_eq!(r.records.len(), 2, "over the bound: in parts");
        assert_eq!(t.split_total, 1);
        with(&mut t, "shop.public.a", 0, 2, change("9", "public.a"));
        with(&mut t, TXN, 0, 0, end("9", &[("public.a", 3)]));
        let r = t.release(1 << 20, now);
        assert_eq!(offsets(&r), vec![("shop.public.a".into(), 2), (TXN.into(), 0)]);
        // An END whose changes never come (applied before a restart).
        with(&mut t, TXN, 0, 1, end("10", &[("public.a", 1)]));
        assert!(t.release(1 << 20, now).records.is_empty());
        let r = t.release(1 << 20, now + INCOMPLETE_AFTER);
        assert_eq!(offsets(&r), vec![(TXN.into(), 1)]);
        // Its change, late: goes as it comes.
        with(&mut t, "shop.public.a", 0, 3, change("10", "public.a"));
        assert_eq!(t.release(1 << 20, now).records.len(), 1);
        assert_eq!(t.bytes(), 0);
    }

    #[test]
    fn the_end_of_a_transaction_in_parts_waits_for_its_changes_without_spinning() {
        let now = Instant::now();
        for spans in [false, true] {
            let mut t = Transactions::new(Some(TXN.into()));
            t.spans = spans;
            with(&mut t, "shop.public.a", 0, 0, change("9", "public.a"));
            with(&mut t, TXN, 0, 0, end("9", &[("public.a", 2)]));
            with(&mut t, TXN, 0, 1, end("10", &[("public.b", 1)]));
            // Over the bound: 9 goes in parts; its second change has not
            // arrived, and 10's END waits behind 9's.
            let r = t.release(1, now);
            assert_eq!(offsets(&r), vec![("shop.public.a".into(), 0)]);
            assert_eq!(t.split_total + t.spanned_total, 1, "split once, not again and again");
            assert!(t.release(1, now).records.is_empty());
            with(&mut t, "shop.public.a", 0, 1, change("9", "public.a"));
            let r = t.release(1, now);
            assert_eq!(offsets(&r), vec![("shop.public.a".into(), 1), (TXN.into(), 0)]);
            assert!(t.spanning.is_empty());
        }
    }

    #[test]
    fn a_transaction_over_the_bound_spans_batches_where_the_sink_can_until_its_end_goes() {
        let now = Instant::now();
        let mut t = Transactions::new(Some(TXN.into()));
        t.spans = true;
        with(&mut t, "shop.public.a", 0, 0, change("9", "public.a"));
        with(&mut t, "shop.public.b", 0, 0, change("9", "public.b"));
        let r = t.release(1, now);
        assert_eq!(r.records.len(), 2, "over the bound: its changes go as they come");
        assert_eq!((t.split_total, t.spanned_total), (0, 1));
        assert_eq!(t.spanning, vec!["9".to_string()], "held open until its END goes");
        with(&mut t, "shop.public.a", 0, 1, change("9", "public.a"));
        with(&mut t, TXN, 0, 0, end("9", &[("public.a", 2), ("public.b", 1)]));
        let r = t.release(1 << 20, now);
        assert_eq!(offsets(&r), vec![("shop.public.a".into(), 1), (TXN.into(), 0)]);
        assert!(t.spanning.is_empty(), "its END went: the batch holding it commits");
        // Read again after its destination transaction failed: in parts.
        t.clear();
        t.no_span("9".into());
        with(&mut t, "shop.public.a", 0, 0, change("9", "public.a"));
        with(&mut t, "shop.public.a", 0, 1, change("9", "public.a"));
        assert_eq!(t.release(1, now).records.len(), 2);
        assert_eq!((t.split_total, t.spanned_total), (1, 1));
        assert!(t.spanning.is_empty());
    }
}
