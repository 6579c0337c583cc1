//! What the runner knows of each partition assigned to it: where its next
//! record must start, the offset the destination stores for it (the fence
//! every batch's commit checks), and whether it is stopped or waiting.

use std::collections::BTreeMap;

use crate::out_of_range::OutOfRange;

/// A partition of a topic.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Partition {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
}

impl Partition {
    /// `partition` of `topic`.
    pub fn new(topic: impl Into<String>, partition: i32) -> Self {
        Self { topic: topic.into(), partition }
    }

    /// As the `Sink` trait names partitions.
    pub fn pair(&self) -> (String, i32) {
        (self.topic.clone(), self.partition)
    }
}

impl std::fmt::Display for Partition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.topic, self.partition)
    }
}

/// One assigned partition.
#[derive(Debug, Clone, Default)]
pub struct PartitionState {
    /// The next offset expected: a record below it is a stale prefetched
    /// one from before the assignment (`None`: any).
    pub expected: Option<i64>,
    /// The offset the destination stores for it, as this runner last read
    /// or wrote it (`None`: none): what a batch's commit must find there
    /// (the fence, see `SinkBatch::expected_offsets`).
    pub stored: Option<i64>,
    /// Stopped because its stored offset is out of the topic's range, until
    /// an operator fixes the stored offset.
    pub stopped: Option<OutOfRange>,
    /// Fenced, and its stored offset could not be read yet: held paused
    /// and looked at again with the stopped ones.
    pub rereading: bool,
    /// Its dead-letter topic was not read yet for what a predecessor sent:
    /// read once, before its first dead letter (a rare path, so never at
    /// assignment).
    pub dlq_unscanned: bool,
}

/// The assigned partitions, per topic (looked up by `&str` for each
/// record, without allocating).
#[derive(Debug, Default)]
pub struct Partitions {
    topics: BTreeMap<String, BTreeMap<i32, PartitionState>>,
}

impl Partitions {
    /// Takes `partition` of `topic` on, its destination offset `stored`.
    pub fn assign(&mut self, topic: &str, partition: i32, stored: Option<i64>) {
        let state = self.topics.entry(topic.to_string()).or_default().entry(partition).or_default();
        state.stored = stored;
        state.expected = stored;
        state.dlq_unscanned = true;
    }

    /// Forgets a revoked partition.
    pub fn revoke(&mut self, topic: &str, partition: i32) {
        if let Some(parts) = self.topics.get_mut(topic) {
            parts.remove(&partition);
            if parts.is_empty() {
                self.topics.remove(topic);
            }
        }
    }

    /// The state of an assigned partition.
    pub fn get(&self, topic: &str, partition: i32) -> Option<&PartitionState> {
        self.topics.get(topic)?.get(&partition)
    }

    /// The state of an assigned partition, to change.
    pub fn get_mut(&mut self, topic: &str, partition: i32) -> Option<&mut PartitionState> {
        self.topics.get_mut(topic)?.get_mut(&partition)
    }

    /// Whether `partition` of `topic` is assigned.
    pub fn contains(&self, topic: &str, partition: i32) -> bool {
        self.get(topic, partition).is_some()
    }

    /// Whether any partition is assigned.
    pub fn is_empty(&self) -> bool {
        self.topics.is_empty()
    }

    /// Whether any partition of `topic` is assigned.
    pub fn has_topic(&self, topic: &str) -> bool {
        self.topics.contains_key(topic)
    }

    /// The topics with an assigned partition.
    pub fn topics(&self) -> impl Iterator<Item = &str> {
        self.topics.keys().map(String::as_str)
    }

    /// Every assigned partition, in order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, i32, &PartitionState)> {
        self.topics
            .iter()
            .flat_map(|(t, parts)| parts.iter().map(move |(p, s)| (t.as_str(), *p, s)))
    }

    /// The assigned partitions of `topic`.
    pub fn of_topic(&self, topic: &str) -> impl Iterator<Item = (i32, &PartitionState)> {
        self.topics
            .get(topic)
            .into_iter()
            .flat_map(|parts| parts.iter().map(|(p, s)| (*p, s)))
    }

    /// Whether a record at `offset` of `topic` / `partition` is raw: the
    /// partition is assigned and running, and the record is not older than
    /// the next one expected. A taken record moves what is expected next.
    pub fn take(&mut self, topic: &str, partition: i32, offset: i64) -> bool {
        let Some(state) = self.get_mut(topic, partition) else {
            return false; // prefetched before a revoke
        };
        if state.stopped.is_some() {
            return false; // fetched before the partition was stopped
        }
        if state.expected.is_some_and(|e| offset < e) {
            return false; // prefetched before the assignment's offset
        }
        state.expected = Some(offset + 1);
        true
    }

    /// The stopped partitions' errors, and those waiting to read their
    /// stored offset again.
    pub fn waiting(&self) -> Vec<Partition> {
        self.iter()
            .filter(|(_, _, s)| s.stopped.is_some() || s.rereading)
            .map(|(t, p, _)| Partition::new(t, p))
            .collect()
    }

    /// Whether any partition is stopped or waiting to read its stored offset.
    pub fn any_waiting(&self) -> bool {
        self.iter().any(|(_, _, s)| s.stopped.is_some() || s.rereading)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_taken_from_the_assigned_offset_on_and_once() {
        let mut p = Partitions::default();
        assert!(!p.take("t", 0, 0), "not assigned");
        p.assign("t", 0, Some(5));
        assert!(!p.take("t", 0, 4), "prefetched before the stored offset");
        assert!(p.take("t", 0, 5));
        assert!(!p.take("t", 0, 5), "the same record again");
        assert!(p.take("t", 0, 6));
        p.assign("t", 1, None);
        assert!(p.take("t", 1, 0), "nothing stored: from the beginning");
        p.get_mut("t", 1).expect("assigned").stopped = Some(OutOfRange::check("t", 1, 9, (0, 3)).expect("out"));
        assert!(!p.take("t", 1, 1), "stopped");
        assert_eq!(p.waiting(), vec![Partition::new("t", 1)]);
        p.revoke("t", 0);
        p.revoke("t", 1);
        assert!(p.is_empty() && !p.has_topic("t"));
        assert!(!p.take("t", 0, 7), "revoked");
    }
}
