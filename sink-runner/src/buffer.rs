//! Per-topic batches waiting to be applied: the raw records, their bytes,
//! the offsets they cover, when the first came, and the retry a failed
//! batch waits for. When a topic's batch is due is decided here, without
//! Kafka or a destination.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use rdkafka::message::{Headers, Message};
use tributary_connectors::{policy, Decision, ErrorKind, KafkaPosition};

/// A record as it came from Kafka, kept until it is applied or
/// dead-lettered.
#[derive(Debug, Clone)]
pub struct RawRecord {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
    /// Key bytes.
    pub key: Option<Vec<u8>>,
    /// Value bytes.
    pub value: Option<Vec<u8>>,
    /// Headers, in order.
    pub headers: Vec<(String, Option<Vec<u8>>)>,
}

impl RawRecord {
    /// Copies a consumed message.
    pub fn from_message<M: Message>(m: &M) -> Self {
        let headers = m
            .headers()
            .map(|h| h.iter().map(|h| (h.key.to_string(), h.value.map(<[u8]>::to_vec))).collect())
            .unwrap_or_default();
        Self {
            topic: m.topic().to_string(),
            partition: m.partition(),
            offset: m.offset(),
            key: m.key().map(<[u8]>::to_vec),
            value: m.payload().map(<[u8]>::to_vec),
            headers,
        }
    }

    /// The value of a header, as text.
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .and_then(|(_, v)| v.as_ref())
            .map(|v| String::from_utf8_lossy(v).into_owned())
    }

    /// Where it is in Kafka.
    pub fn position(&self) -> KafkaPosition {
        KafkaPosition {
            topic: self.topic.clone(),
            partition: self.partition,
            offset: self.offset,
        }
    }

    /// Bytes it holds (for batch limits).
    pub fn size(&self) -> usize {
        self.key.as_ref().map_or(0, Vec::len)
            + self.value.as_ref().map_or(0, Vec::len)
            + self
                .headers
                .iter()
                .map(|(k, v)| k.len() + v.as_ref().map_or(0, Vec::len))
                .sum::<usize>()
            + 64
    }
}

/// Next offset per partition, per topic.
pub type NextOffsets = BTreeMap<String, BTreeMap<i32, i64>>;

/// A pending batch of one lane: a topic, or every topic of a copy applied
/// transaction by transaction (see [`Buffers::lane`]).
#[derive(Debug)]
pub struct Buffer {
    /// The records, in the order they came.
    pub records: Vec<RawRecord>,
    /// Their bytes ([`RawRecord::size`]).
    pub bytes: usize,
    /// When the first came.
    pub first_at: Option<Instant>,
    /// Next offset per partition covered by everything received (applied,
    /// buffered or dead-lettered) and not yet stored.
    pub next_offsets: NextOffsets,
    /// The retry a failed batch of the topic waits for.
    pub retry: Option<Retry>,
}

/// When a failed batch is tried again, and how many times it failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retry {
    /// Failures so far.
    pub attempt: u32,
    /// When the next try is due.
    pub at: Instant,
}

impl Buffer {
    fn new() -> Self {
        Self {
            records: Vec::new(),
            bytes: 0,
            first_at: None,
            next_offsets: BTreeMap::new(),
            retry: None,
        }
    }

    /// Covers `partition` of `topic` up to `next` (exclusive).
    fn cover(&mut self, topic: &str, partition: i32, next: i64) {
        match self.next_offsets.get_mut(topic) {
            Some(parts) => {
                parts.insert(partition, next);
            }
            None => {
                self.next_offsets.insert(topic.to_string(), BTreeMap::from([(partition, next)]));
            }
        }
    }

    /// The next offset of `partition` of `topic`, if covered.
    pub fn next_offset(&self, topic: &str, partition: i32) -> Option<i64> {
        self.next_offsets.get(topic).and_then(|p| p.get(&partition)).copied()
    }

    /// Every `(topic, partition, next offset)` covered.
    pub fn offsets(&self) -> impl Iterator<Item = (&str, i32, i64)> + '_ {
        self.next_offsets
            .iter()
            .flat_map(|(t, parts)| parts.iter().map(move |(p, o)| (t.as_str(), *p, *o)))
    }

    /// Removes the record at `i` (dead-lettered).
    pub fn remove(&mut self, i: usize) -> RawRecord {
        let gone = self.records.remove(i);
        self.bytes = self.bytes.saturating_sub(gone.size());
        gone
    }
}

/// How batches are cut: the runner's settings, resolved.
#[derive(Debug, Clone, Copy)]
pub struct BatchLimits {
    /// `batch_max_records`.
    pub max_records: usize,
    /// `batch_max_bytes`.
    pub max_bytes: usize,
    /// `batch_linger_ms`: a batch is due this long after its first record.
    pub linger: Duration,
    /// `batch_idle_ms`: buffered records are applied once the consumer
    /// gave nothing for this long while no batch is applied.
    pub idle: Option<Duration>,
    /// `max_buffered_bytes`: past it, the largest buffer is due.
    pub max_buffered: usize,
}

/// The buffers of every lane.
#[derive(Debug, Default)]
pub struct Buffers {
    /// By lane: a topic's name, or [`Buffers::lane`].
    topics: BTreeMap<String, Buffer>,
    /// The one lane every topic's records go to, when the copy is applied
    /// transaction by transaction (the transaction topic's name): a batch
    /// is then cut across all tables, and records enter the buffers only
    /// as whole transactions (`transaction::Transactions`). `None`: each
    /// topic is its own lane.
    pub lane: Option<String>,
    /// Per topic, the records from a verify record on that came after
    /// changes still buffered: a verify record starts its batch (the sink
    /// compares its range before applying anything after it, so the
    /// destination holds every change before it and none after). They
    /// become the topic's buffer when the one in front is taken.
    waiting: BTreeMap<String, Vec<RawRecord>>,
}

/// Whether `raw` is a verify control record, which starts a batch.
pub fn starts_batch(raw: &RawRecord) -> bool {
    use tributary_schemas::records::control::{CONTROL_HEADER, VERIFY};
    raw.value.is_none() && raw.header(CONTROL_HEADER).as_deref() == Some(VERIFY)
}

impl Buffers {
    /// Buffers whose records all go to `lane`, if given (see
    /// [`Buffers::lane`]).
    pub fn with_lane(lane: Option<String>) -> Self {
        Self { lane, ..Self::default() }
    }

    /// Adds a record taken from Kafka; `now` is asked only for a buffer's
    /// first record.
    pub fn push(&mut self, raw: RawRecord, now: impl FnOnce() -> Instant) {
        let lane = self.lane.as_deref().unwrap_or(&raw.topic);
        if let Some(waiting) = self.waiting.get_mut(lane) {
            waiting.push(raw);
            return;
        }
        if starts_batch(&raw)
            && self
                .topics
                .get(lane)
                .is_some_and(|b| b.records.iter().any(|r| !starts_batch(r)))
        {
            self.waiting.insert(lane.to_string(), vec![raw]);
            return;
        }
        // Looked up by reference first: the lane is copied only for a new
        // buffer.
        let buf = match self.topics.get_mut(lane) {
            Some(buf) => buf,
            None => self.topics.entry(lane.to_string()).or_insert_with(Buffer::new),
        };
        buf.cover(&raw.topic, raw.partition, raw.offset + 1);
        buf.bytes += raw.size();
        buf.first_at.get_or_insert_with(now);
        buf.records.push(raw);
    }

    /// The lane of `topic`'s records.
    pub fn lane_of<'a>(&'a self, topic: &'a str) -> &'a str {
        self.lane.as_deref().unwrap_or(topic)
    }

    /// `topic`'s buffer.
    pub fn get(&self, topic: &str) -> Option<&Buffer> {
        self.topics.get(topic)
    }

    /// `topic`'s buffer, to change.
    pub fn get_mut(&mut self, topic: &str) -> Option<&mut Buffer> {
        self.topics.get_mut(topic)
    }

    /// Takes `topic`'s buffer out: records that arrive meanwhile start a
    /// new one.
    pub fn take(&mut self, topic: &str) -> Option<Buffer> {
        let taken = self.topics.remove(topic);
        if let Some(waiting) = self.waiting.remove(topic) {
            let now = Instant::now();
            for raw in waiting {
                self.push(raw, || now);
            }
        }
        taken
    }

    /// Drops everything buffered for `topic` (a fenced batch's topic).
    pub fn clear(&mut self, topic: &str) {
        self.topics.remove(topic);
        self.waiting.remove(topic);
    }

    /// Moves the records of `topic`'s buffer from its first verify record
    /// after a change on to the front of its waiting records: the buffer
    /// then ends before that record, covering the offsets before it.
    fn split_at_verify(&mut self, topic: &str) {
        let Some(buf) = self.topics.get_mut(topic) else { return };
        let Some(first_change) = buf.records.iter().position(|r| !starts_batch(r)) else {
            return;
        };
        let Some(at) = buf.records[first_change..]
            .iter()
            .position(starts_batch)
            .map(|i| i + first_change)
        else {
            return;
        };
        let moved = buf.records.split_off(at);
        for r in moved.iter().rev() {
            // Each moved partition's next offset is its first moved record.
            buf.cover(&r.topic, r.partition, r.offset);
        }
        buf.bytes = buf.records.iter().map(RawRecord::size).sum();
        let mut waiting = moved;
        waiting.extend(self.waiting.remove(topic).unwrap_or_default());
        self.waiting.insert(topic.to_string(), waiting);
    }

    /// Whether the batch of `topic`'s lane waits for a retry.
    pub fn retrying(&self, topic: &str) -> bool {
        self.topics.get(self.lane_of(topic)).is_some_and(|b| b.retry.is_some())
    }

    /// Bytes buffered in all.
    pub fn total_bytes(&self) -> usize {
        self.topics.values().map(|b| b.bytes).sum::<usize>()
            + self.waiting.values().flatten().map(RawRecord::size).sum::<usize>()
    }

    /// The topics with a buffer, not waiting for a retry.
    pub fn not_retrying(&self) -> Vec<String> {
        self.topics
            .iter()
            .filter(|(_, b)| b.retry.is_none())
            .map(|(t, _)| t.clone())
            .collect()
    }

    /// Drops what is buffered of `partition` of `topic` (revoked, or older
    /// than a fixed stored offset).
    pub fn drop_partition(&mut self, topic: &str, partition: i32) {
        let lane = self.lane_of(topic).to_string();
        let other = |r: &RawRecord| r.partition != partition || r.topic != topic;
        if let Some(buf) = self.topics.get_mut(&lane) {
            buf.records.retain(other);
            buf.bytes = buf.records.iter().map(RawRecord::size).sum();
            if let Some(parts) = buf.next_offsets.get_mut(topic) {
                parts.remove(&partition);
                if parts.is_empty() {
                    buf.next_offsets.remove(topic);
                }
            }
            if buf.next_offsets.is_empty() {
                self.topics.remove(&lane);
            }
        }
        if let Some(waiting) = self.waiting.get_mut(&lane) {
            waiting.retain(other);
            if waiting.is_empty() {
                self.waiting.remove(&lane);
            }
        }
    }

    /// Puts the records of a batch that was not applied (`older`) back in
    /// front of what arrived for its lane since, keeping only the
    /// partitions `keep` says are still this runner's.
    pub fn restore(&mut self, topic: String, mut older: Buffer, keep: impl Fn(&str, i32) -> bool) {
        older.records.retain(|r| keep(&r.topic, r.partition));
        for (t, parts) in older.next_offsets.iter_mut() {
            parts.retain(|p, _| keep(t, *p));
        }
        older.next_offsets.retain(|_, parts| !parts.is_empty());
        if let Some(newer) = self.topics.remove(&topic) {
            older.records.extend(newer.records);
            for (t, parts) in newer.next_offsets {
                older.next_offsets.entry(t).or_default().extend(parts);
            }
            older.first_at = older.first_at.or(newer.first_at);
            older.retry = older.retry.or(newer.retry);
        }
        older.bytes = older.records.iter().map(RawRecord::size).sum();
        if !older.next_offsets.is_empty() {
            self.topics.insert(topic.clone(), older);
            // What arrived since may start with a verify record.
            self.split_at_verify(&topic);
        }
    }

    /// Schedules the next try of `topic`'s batch after an error of `kind`,
    /// per [`policy`]: the attempt and when. A permanent error without a
    /// record to blame is probed slowly.
    pub fn schedule_retry(&mut self, topic: &str, kind: ErrorKind, now: Instant) -> Retry {
        let attempt = self.topics.get(topic).and_then(|b| b.retry.as_ref()).map_or(0, |r| r.attempt) + 1;
        let delay = match policy(kind, attempt) {
            Decision::RetryAfter(d) | Decision::PauseAndProbe(d) => d,
            Decision::DeadLetter => tributary_connectors::error::OPERATOR_PROBE_DELAY,
        };
        let retry = Retry { attempt, at: now + delay };
        if let Some(buf) = self.topics.get_mut(topic) {
            buf.retry = Some(retry);
        }
        retry
    }

    /// The topics whose batch is due at `now`: a retry due, or, without
    /// one, a batch full by records or bytes, lingered long enough, due for
    /// want of more (`idle`), or the largest when all buffers together are
    /// over their bound. `paused` topics (an operator's) are never due.
    pub fn due(&self, now: Instant, limits: &BatchLimits, idle: bool, paused: &BTreeSet<String>) -> Vec<String> {
        let largest = if self.total_bytes() > limits.max_buffered {
            self.topics
                .iter()
                .filter(|(_, b)| b.retry.is_none())
                .max_by_key(|(_, b)| b.bytes)
                .map(|(t, _)| t.as_str())
        } else {
            None
        };
        self.topics
            .iter()
            .filter(|(topic, _)| !paused.contains(*topic))
            .filter(|(topic, b)| match &b.retry {
                Some(r) => r.at <= now,
                None => {
                    self.waiting.contains_key(topic.as_str())
                        || b.records.len() >= limits.max_records
                        || b.bytes >= limits.max_bytes
                        || b.first_at.is_some_and(|t| idle || t + limits.linger <= now)
                        || largest == Some(topic.as_str())
                }
            })
            .map(|(t, _)| t.clone())
            .collect()
    }

    /// When the next batch is due, given when buffered records are due for
    /// want of more (`idle_at`). A table an operator paused is not due (see
    /// [`Buffers::due`]): its buffer's linger, long past, would wake the
    /// pipeline at once, for ever.
    pub fn next_due(&self, linger: Duration, idle_at: Option<Instant>, paused: &BTreeSet<String>) -> Option<Instant> {
        self.topics
            .iter()
            .filter(|(topic, _)| !paused.contains(*topic))
            .filter_map(|(topic, b)| match &b.retry {
                Some(r) => Some(r.at),
                // A verify record waits behind it: due at once.
                None if self.waiting.contains_key(topic.as_str()) => b.first_at,
                None => b.first_at.map(|t| idle_at.map_or(t + linger, |i| i.min(t + linger))),
            })
            .min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tributary_connectors::error::{OPERATOR_PROBE_DELAY, RETRY_INITIAL_DELAY};

    fn raw(topic: &str, partition: i32, offset: i64, bytes: usize) -> RawRecord {
        RawRecord {
            topic: topic.into(),
            partition,
            offset,
            key: None,
            value: Some(vec![0; bytes]),
            headers: Vec::new(),
        }
    }

    fn verify(topic: &str, partition: i32, offset: i64) -> RawRecord {
        use tributary_schemas::records::control::{CONTROL_HEADER, VERIFY};
        RawRecord {
            value: None,
            headers: vec![(CONTROL_HEADER.to_string(), Some(VERIFY.as_bytes().to_vec()))],
            ..raw(topic, partition, offset, 0)
        }
    }

    #[test]
    fn a_verify_record_starts_its_batch_and_what_follows_it_waits() {
        let mut b = Buffers::default();
        let now = Instant::now();
        b.push(raw("t", 0, 1, 10), || now);
        b.push(verify("t", 0, 2), || now);
        b.push(raw("t", 0, 3, 10), || now);
        b.push(verify("t", 0, 4), || now);
        // Due at once, though nothing is full or lingered.
        assert_eq!(b.due(now, &limits(), false, &BTreeSet::new()), vec!["t".to_string()]);
        let first = b.take("t").expect("buffer");
        assert_eq!(first.records.iter().map(|r| r.offset).collect::<Vec<_>>(), vec![1]);
        assert_eq!(first.next_offset("t", 0), Some(2));
        // The verify record leads the next batch, which ends before the
        // next verify record after a change.
        let second = b.take("t").expect("buffer");
        assert_eq!(second.records.iter().map(|r| r.offset).collect::<Vec<_>>(), vec![2, 3]);
        assert_eq!(second.next_offset("t", 0), Some(4));
        // A failed batch goes back in front: the verify record behind it
        // waits again.
        b.restore("t".into(), second, |_, _| true);
        let again = b.take("t").expect("buffer");
        assert_eq!(again.records.iter().map(|r| r.offset).collect::<Vec<_>>(), vec![2, 3]);
        assert_eq!(again.next_offset("t", 0), Some(4));
        let last = b.take("t").expect("buffer");
        assert_eq!(last.records.iter().map(|r| r.offset).collect::<Vec<_>>(), vec![4]);
        assert!(b.take("t").is_none());
    }

    fn limits() -> BatchLimits {
        BatchLimits {
            max_records: 3,
            max_bytes: 10_000,
            linger: Duration::from_millis(100),
            idle: Some(Duration::from_millis(2)),
            max_buffered: 50_000,
        }
    }

    #[test]
    fn a_batch_is_due_when_full_lingered_idle_or_the_largest_over_the_bound() {
        let t0 = Instant::now();
        let none = BTreeSet::new();
        let mut b = Buffers::default();
        b.push(raw("a", 0, 0, 10), || t0);
        assert!(b.due(t0, &limits(), false, &none).is_empty());
        assert_eq!(b.due(t0, &limits(), true, &none), vec!["a"], "nothing more is coming");
        assert_eq!(b.due(t0 + Duration::from_millis(100), &limits(), false, &none), vec!["a"], "lingered");
        assert_eq!(b.next_due(limits().linger, None, &none), Some(t0 + Duration::from_millis(100)));
        let idle_at = t0 + Duration::from_millis(2);
        assert_eq!(b.next_due(limits().linger, Some(idle_at), &none), Some(idle_at));
        b.push(raw("a", 0, 1, 10), || t0);
        b.push(raw("a", 1, 7, 10), || t0);
        assert_eq!(b.due(t0, &limits(), false, &none), vec!["a"], "full by records");
        b.push(raw("b", 0, 0, 10_000), || t0);
        assert_eq!(b.due(t0, &limits(), false, &none), vec!["a", "b"], "full by bytes");
        let paused: BTreeSet<String> = ["a".to_string()].into();
        assert_eq!(b.due(t0, &limits(), false, &paused), vec!["b"], "an operator's pause wins");
        let small = BatchLimits {
            max_buffered: 1_000,
            max_bytes: 100_000,
            max_records: 100,
            ..limits()
        };
        assert_eq!(b.due(t0, &small, false, &none), vec!["b"], "the largest, when all are over the bound");
        assert_eq!(
            b.get("a").map(|a| a.offsets().map(|(_, p, o)| (p, o)).collect::<Vec<_>>()),
            Some(vec![(0, 2), (1, 8)])
        );
    }

    #[test]
    fn a_failed_batch_is_retried_later_and_later_and_goes_back_in_front() {
        let t0 = Instant::now();
        let none = BTreeSet::new();
        let mut b = Buffers::default();
        b.push(raw("a", 0, 0, 10), || t0);
        b.push(raw("a", 1, 0, 10), || t0);
        let failed = b.take("a").expect("taken");
        // Newer records came meanwhile.
        b.push(raw("a", 0, 1, 10), || t0);
        b.restore("a".into(), failed, |_, p| p != 1);
        let a = b.get("a").expect("restored");
        assert_eq!(a.records.iter().map(|r| (r.partition, r.offset)).collect::<Vec<_>>(), vec![(0, 0), (0, 1)]);
        assert_eq!(a.offsets().collect::<Vec<_>>(), vec![("a", 0, 2)], "partition 1 was revoked meanwhile");
        let first = b.schedule_retry("a", ErrorKind::Retryable, t0);
        assert_eq!(first, Retry { attempt: 1, at: t0 + RETRY_INITIAL_DELAY });
        assert!(b.retrying("a"));
        assert!(b.due(t0, &limits(), true, &none).is_empty(), "waits for its retry, idle or not");
        assert_eq!(b.due(first.at, &limits(), false, &none), vec!["a"]);
        assert_eq!(b.next_due(limits().linger, None, &none), Some(first.at));
        let second = b.schedule_retry("a", ErrorKind::Retryable, t0);
        assert_eq!(second, Retry { attempt: 2, at: t0 + RETRY_INITIAL_DELAY * 2 }, "backs off");
        let probe = b.schedule_retry("a", ErrorKind::NeedsOperator, t0);
        assert_eq!(probe.at, t0 + OPERATOR_PROBE_DELAY);
        assert_eq!(b.schedule_retry("a", ErrorKind::Permanent, t0).at, t0 + OPERATOR_PROBE_DELAY);
        assert_eq!(b.not_retrying(), Vec::<String>::new());
    }

    #[test]
    fn one_lane_takes_every_topic_and_covers_each_topics_partitions() {
        let t0 = Instant::now();
        let mut b = Buffers::with_lane(Some("shop.transaction".into()));
        b.push(raw("shop.public.a", 0, 4, 10), || t0);
        b.push(raw("shop.public.b", 0, 9, 10), || t0);
        b.push(raw("shop.transaction", 0, 2, 10), || t0);
        assert!(b.get("shop.public.a").is_none(), "no buffer of its own");
        assert!(b.retrying("shop.public.a") == b.retrying("shop.transaction"));
        let lane = b.get("shop.transaction").expect("the lane");
        assert_eq!(
            lane.offsets().collect::<Vec<_>>(),
            vec![
                ("shop.public.a", 0, 5),
                ("shop.public.b", 0, 10),
                ("shop.transaction", 0, 3)
            ]
        );
        b.drop_partition("shop.public.b", 0);
        let lane = b.take("shop.transaction").expect("the lane");
        assert_eq!(lane.records.len(), 2);
        b.push(raw("shop.public.a", 0, 5, 10), || t0);
        b.restore("shop.transaction".into(), lane, |t, _| t != "shop.public.a");
        let lane = b.get("shop.transaction").expect("restored");
        assert_eq!(
            lane.records.iter().map(|r| (r.topic.as_str(), r.offset)).collect::<Vec<_>>(),
            vec![("shop.transaction", 2), ("shop.public.a", 5)],
            "the failed batch in front, without what is no longer this runner's"
        );
    }

    #[test]
    fn a_revoked_partition_leaves_nothing_behind() {
        let t0 = Instant::now();
        let mut b = Buffers::default();
        b.push(raw("a", 0, 0, 10), || t0);
        b.push(raw("a", 1, 0, 10), || t0);
        b.drop_partition("a", 0);
        assert_eq!(b.get("a").map(|a| a.records.len()), Some(1));
        assert_eq!(b.total_bytes(), raw("a", 1, 0, 10).size());
        b.drop_partition("a", 1);
        assert!(b.get("a").is_none(), "an empty buffer is gone");
    }
}
