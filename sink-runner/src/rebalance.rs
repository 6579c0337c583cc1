//! Rebalances: partitions assigned at the offsets the destination stores,
//! and revoked only after the write that covers them committed or failed.
//!
//! The destination holds the authoritative offsets (written in the same
//! transaction as the rows). Kafka's group protocol only decides which
//! runner owns which partition; the consumer's context hands each
//! rebalance to the pipeline ([`RebalanceEvent`]), which looks the assigned
//! partitions' offsets up in the destination and assigns them *at* those
//! offsets, so no record is consumed from anywhere else. librdkafka waits
//! for that call (join state `wait-assign-call`) and heartbeats meanwhile;
//! nothing else is applied during the look-up anyway (the sink is one
//! session, and the look-up waits for the batch being applied).
//!
//! The protocol is whatever `partition.assignment.strategy` says: with the
//! default eager strategies every rebalance revokes everything first, so a
//! partition is never owned by two runners at once (a revoke waits for the
//! batch being applied to commit or fail before it unassigns, so the next
//! owner reads offsets that include it). With `cooperative-sticky` only
//! moved partitions are revoked and assigned (incrementally), with the same
//! look-up. Records of a revoked partition still buffered are dropped; its
//! new owner consumes them again from the destination's offsets. The
//! offsets committed to Kafka are a mirror for monitoring tools
//! (`kafka-consumer-groups --describe` shows the lag); they are never read.

use std::sync::atomic::Ordering;
use std::time::Duration;

use rdkafka::consumer::Consumer;
use rdkafka::{Offset, TopicPartitionList};
use tracing::{error, info, warn};
use tributary_connectors::{policy, Decision, Sink};

use crate::out_of_range::OutOfRange;
use crate::partitions::Partition;
use crate::pipeline::Pipeline;

/// Kafka's answer to a watermarks request.
pub(crate) const WATERMARKS_TIMEOUT: Duration = Duration::from_secs(10);

/// A rebalance, as the consumer's context hands it to the pipeline.
#[derive(Debug)]
pub enum RebalanceEvent {
    /// Partitions assigned: `wanted` to copy, `excluded` matched by the
    /// pattern but not copied (dead-letter and offsets topics, `exclude`).
    Assign {
        /// Partitions to copy.
        wanted: Vec<Partition>,
        /// Partitions assigned that never fetch.
        excluded: Vec<Partition>,
        /// Whether the group's protocol is cooperative (incremental).
        cooperative: bool,
    },
    /// Partitions revoked.
    Revoke {
        /// The partitions.
        parts: Vec<Partition>,
        /// Whether the group's protocol is cooperative (incremental).
        cooperative: bool,
    },
    /// The rebalance failed: whatever was assigned is given up.
    Failed {
        /// The partitions it named.
        parts: Vec<Partition>,
        /// Whether the group's protocol is cooperative (incremental).
        cooperative: bool,
        /// librdkafka's error.
        error: String,
    },
}

impl<S: Sink + 'static> Pipeline<S> {
    /// Serves one rebalance.
    pub(crate) async fn rebalance(&mut self, event: RebalanceEvent) {
        match event {
            RebalanceEvent::Assign { wanted, excluded, cooperative } => {
                self.assign(wanted, excluded, cooperative).await
            }
            RebalanceEvent::Revoke { parts, cooperative } => {
                self.revoke(&parts).await;
                info!(partitions = parts.len(), "partitions revoked");
                let r = if cooperative {
                    self.consumer.incremental_unassign(&list(&parts, |_| None))
                } else {
                    self.consumer.unassign()
                };
                if let Err(e) = r {
                    error!(error = %e, "cannot unassign partitions");
                }
            }
            RebalanceEvent::Failed { parts, cooperative, error } => {
                self.revoke(&parts).await;
                error!(error = %error, "rebalance failed");
                if !cooperative {
                    let _ = self.consumer.unassign();
                }
            }
        }
    }

    /// Assigns `wanted` at the destination's offsets (a partition without
    /// one from its beginning), checked against each topic's range, and
    /// `excluded` paused at their end.
    async fn assign(&mut self, wanted: Vec<Partition>, excluded: Vec<Partition>, cooperative: bool) {
        // librdkafka can give an eager assignment while this runner still
        // holds the last one: a change of the subscribed topics' metadata
        // (a partition added) seen while it waits for this runner's assign
        // call rejoins without a revoke (`rd_kafka_cgrp_revoke_all_rejoin`).
        // What this runner holds is given up here as a revoke would:
        // otherwise a partition assigned again has its buffered records
        // taken twice (a verify range compared twice, found by the fault
        // suite), and one assigned elsewhere stays this runner's.
        let held: Vec<Partition> = self
            .partitions
            .iter()
            .filter(|(t, p, _)| !cooperative || wanted.iter().any(|w| w.topic == *t && w.partition == *p))
            .map(|(t, p, _)| Partition::new(t, p))
            .collect();
        if !held.is_empty() {
            warn!(
                partitions = held.len(),
                "assigned without a revoke of what this runner held: given up first, consumed again from the \
                 destination's offsets"
            );
            self.revoke(&held).await;
        }
        let offsets = self.lookup(&wanted).await;
        let mut tpl = TopicPartitionList::new();
        let mut out_of_range = Vec::new();
        let mut idle = TopicPartitionList::new();
        match &offsets {
            Some(offsets) => {
                for (p, offset) in wanted.iter().zip(offsets) {
                    // No stored offset: a new topic (or partition), read
                    // from its beginning. A stored one: exactly there, if
                    // the topic still holds it.
                    let mut at = offset.map_or(Offset::Beginning, Offset::Offset);
                    if let Some(stored) = offset {
                        // If this look-up fails, a fetch out of range is
                        // still reported (auto.offset.reset=error) and the
                        // pipeline checks again.
                        match self.watermarks(&p.topic, p.partition).await {
                            Ok(range) => {
                                if let Some(o) = OutOfRange::check(&p.topic, p.partition, *stored, range) {
                                    // Assigned paused at a valid offset (so
                                    // librdkafka keeps it fetchable for a
                                    // seek later); anything fetched before
                                    // the pause is dropped.
                                    at = Offset::End;
                                    idle.add_partition(&p.topic, p.partition);
                                    out_of_range.push(o);
                                }
                            }
                            Err(e) => {
                                warn!(topic = %p.topic, partition = p.partition, error = %e, "cannot read the topic's range")
                            }
                        }
                    }
                    if let Err(e) = tpl.add_partition_offset(&p.topic, p.partition, at) {
                        error!(topic = %p.topic, partition = p.partition, error = %e, "cannot set the start offset");
                    }
                }
            }
            // Stopping: assigned, never fetched.
            None => {
                for p in &wanted {
                    let _ = tpl.add_partition_offset(&p.topic, p.partition, Offset::End);
                    idle.add_partition(&p.topic, p.partition);
                }
            }
        }
        // Partitions not copied never fetch, but need a valid start offset:
        // without one librdkafka would report "no offset to reset to"
        // (auto.offset.reset=error).
        for p in &excluded {
            let _ = tpl.add_partition_offset(&p.topic, p.partition, Offset::End);
            idle.add_partition(&p.topic, p.partition);
        }
        let r = if cooperative {
            self.consumer.incremental_assign(&tpl)
        } else {
            self.consumer.assign(&tpl)
        };
        if let Err(e) = r {
            error!(error = %e, "cannot assign partitions");
        }
        if idle.count() > 0 {
            if let Err(e) = self.consumer.pause(&idle) {
                warn!(error = %e, "cannot pause excluded partitions");
            }
        }
        let Some(offsets) = offsets else {
            return;
        };
        // librdkafka keeps a partition's pause flag across a revoke and a
        // new assignment: a partition paused for a retry before the
        // rebalance would never fetch again (found by the fault suite).
        // What still waits for a retry or an operator is paused again below.
        let mut run = TopicPartitionList::new();
        for p in wanted
            .iter()
            .filter(|p| !out_of_range.iter().any(|o| o.topic == p.topic && o.partition == p.partition))
        {
            run.add_partition(&p.topic, p.partition);
        }
        if run.count() > 0 {
            if let Err(e) = self.consumer.resume(&run) {
                warn!(error = %e, "cannot resume newly assigned partitions");
            }
        }
        info!(partitions = wanted.len(), excluded = excluded.len(), "partitions assigned");
        let mut topics = std::collections::BTreeSet::new();
        for (p, offset) in wanted.iter().zip(offsets) {
            self.partitions.assign(&p.topic, p.partition, offset);
            topics.insert(p.topic.clone());
        }
        for o in out_of_range {
            self.stop_partition(o);
        }
        // A table still waiting for its retry stays paused until the retry
        // succeeds.
        for topic in &topics {
            if self.buffers.retrying(topic) {
                self.pause(topic, true);
            }
        }
        if self.transactions.enabled() {
            self.check_whole_copy(topics).await;
        }
    }

    /// Whole transactions need every partition of the copy's topics in
    /// this member: a member given only some of a topic's (topics of several
    /// partitions, shared out among several members) would wait for ever
    /// for changes another member holds, or apply parts of transactions.
    /// It refuses instead: nothing assigned is fetched, and the status says
    /// why, until the next rebalance (a member leaves) gives it the whole
    /// copy. A member given nothing stands by.
    async fn check_whole_copy(&mut self, topics: std::collections::BTreeSet<String>) {
        let mut missing = Vec::new();
        for topic in topics {
            let consumer = self.consumer.clone();
            let t = topic.clone();
            let count = tokio::task::spawn_blocking(move || {
                consumer
                    .fetch_metadata(Some(&t), WATERMARKS_TIMEOUT)
                    .map(|m| m.topics().first().map_or(0, |t| t.partitions().len()))
            })
            .await;
            let Ok(Ok(count)) = count else {
                warn!(topic = %topic, "cannot read the topic's partitions to check this member holds them all");
                continue;
            };
            let held = self.partitions.of_topic(&topic).count();
            if held < count {
                missing.push(format!("{topic} ({held} of {count} partitions)"));
            }
        }
        if missing.is_empty() {
            if self.transactions.refusing.take().is_some() {
                info!("this member holds every partition of the copy again: applying whole transactions");
                let all = self.operator.control.paused().all;
                self.telemetry.set_paused(all.then(|| "paused by an operator".to_string()));
            }
            return;
        }
        let reason = format!(
            "consistency = \"transactional\" needs every partition of the copy's topics in one sink runner, and this \
             one holds only some of: {}; give the copy's topics one partition each (other members then stand by), \
             or run one member (docs/consistency.md)",
            missing.join(", ")
        );
        error!(reason = %reason, "refusing to apply parts of transactions");
        let lane = self.buffers.lane.clone().unwrap_or_default();
        self.pause(&lane, true);
        self.buffers.clear(&lane);
        self.transactions.clear();
        self.transactions.refusing = Some(reason.clone());
        self.telemetry.set_paused(Some(reason));
    }

    /// The destination's offsets of `parts`, retried per [`policy`] until
    /// they come or the runner stops (`None`). Nothing is consumed
    /// meanwhile: the status says why.
    async fn lookup(&mut self, parts: &[Partition]) -> Option<Vec<Option<i64>>> {
        if parts.is_empty() {
            return Some(Vec::new());
        }
        let pairs: Vec<(String, i32)> = parts.iter().map(Partition::pair).collect();
        let mut attempt = 0u32;
        loop {
            let result = self.sink.lock().await.committed_offsets(&pairs).await;
            match result {
                Ok(offsets) => {
                    self.offsets_unreadable.store(false, Ordering::Relaxed);
                    if attempt > 0 {
                        // Back to what the operator asked for.
                        let all = self.operator.control.paused().all;
                        self.telemetry.set_paused(all.then(|| "paused by an operator".to_string()));
                    }
                    return Some(offsets);
                }
                Err(e) => {
                    attempt += 1;
                    self.offsets_unreadable.store(true, Ordering::Relaxed);
                    self.operator.control.set_ready(false);
                    self.telemetry
                        .set_paused(Some(format!("cannot read the stored offsets of newly assigned partitions: {e}")));
                    let delay = match policy(e.kind(), attempt) {
                        Decision::RetryAfter(d) | Decision::PauseAndProbe(d) => d,
                        Decision::DeadLetter => tributary_connectors::error::OPERATOR_PROBE_DELAY,
                    };
                    warn!(
                        error = %e,
                        hint = e.hint().unwrap_or(""),
                        retry_in_ms = delay.as_millis() as u64,
                        "paused: cannot read the stored offsets of newly assigned partitions"
                    );
                    if *self.stop.borrow() {
                        return None;
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(delay) => {}
                        _ = self.stop.changed() => return None,
                    }
                }
            }
        }
    }

    /// The first offset `topic` / `partition` holds and the one after its
    /// last, asked of Kafka off the async path.
    pub(crate) async fn watermarks(&self, topic: &str, partition: i32) -> Result<(i64, i64), String> {
        let consumer = self.consumer.clone();
        let topic = topic.to_string();
        tokio::task::spawn_blocking(move || consumer.fetch_watermarks(&topic, partition, WATERMARKS_TIMEOUT))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())
    }

    /// Gives `parts` up: what is buffered or decoded of them is dropped
    /// (their next owner consumes it again from the destination's
    /// offsets), and the batch being applied commits or fails before the
    /// caller unassigns them, so that their next owner reads offsets that
    /// include it and never applies beside it. If it fails, its records of
    /// these partitions do not go back into a buffer.
    async fn revoke(&mut self, parts: &[Partition]) {
        for p in parts {
            let lane = self.buffers.lane_of(&p.topic).to_string();
            if let Some(f) = self.in_flight.as_mut().filter(|f| f.raw.topic == lane) {
                f.revoked.insert((p.topic.clone(), p.partition));
            }
            // Decoded but not applied: back into its buffer, to be dropped
            // below with the rest of the partition.
            if self.ready.as_ref().is_some_and(|r| r.raw.topic == lane) {
                if let Some(r) = self.ready.take() {
                    self.restore(r.raw.topic, r.raw.buf, &Default::default());
                }
            }
            self.partitions.revoke(&p.topic, p.partition);
            self.dead_letters.release(&p.topic, p.partition);
            if !self.partitions.has_topic(&p.topic) {
                // Paused again (if still wanted) once reassigned.
                self.operator.paused_topics.remove(&p.topic);
            }
            self.buffers.drop_partition(&p.topic, p.partition);
            self.transactions.drop_partition(&p.topic, p.partition);
        }
        if self.in_flight.is_some() {
            let applied = crate::apply::wait_applied(&mut self.in_flight).await;
            self.finish(applied).await;
        }
        if self.open_unit.is_some() {
            // What it held goes back to the stored offsets: on revoked
            // partitions for their next owner, on the others here.
            self.abandon_open_unit().await;
            if let Some(lane) = self.buffers.lane.clone() {
                self.read_again(&lane, &Default::default()).await;
            }
        }
    }
}

/// `parts` as a partition list, each at `offset(p)` when it gives one.
pub(crate) fn list(parts: &[Partition], offset: impl Fn(&Partition) -> Option<Offset>) -> TopicPartitionList {
    let mut tpl = TopicPartitionList::new();
    for p in parts {
        match offset(p) {
            Some(o) => {
                let _ = tpl.add_partition_offset(&p.topic, p.partition, o);
            }
            None => {
                tpl.add_partition(&p.topic, p.partition);
            }
        }
    }
    tpl
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::buffer::RawRecord;
    use crate::config::SinkRunnerConfig;
    use std::time::Instant;
    use tributary_connectors::{ApplyError, Problem, SinkBatch};
    use tributary_schemas::TableId;

    /// A destination that stores nothing: every partition starts at its
    /// beginning. Never connected to (the consumer is never polled).
    struct Empty;

    #[async_trait::async_trait]
    impl Sink for Empty {
        async fn committed_offsets(&mut self, p: &[(String, i32)]) -> tributary_connectors::Result<Vec<Option<i64>>> {
            Ok(vec![None; p.len()])
        }
        async fn apply(&mut self, _: &SinkBatch) -> Result<(), ApplyError> {
            Ok(())
        }
        async fn trial_apply(&mut self, _: &SinkBatch) -> Result<(), ApplyError> {
            Ok(())
        }
        async fn check(&mut self) -> Vec<Problem> {
            Vec::new()
        }
        async fn delete_copy(&mut self, _: &[TableId]) -> tributary_connectors::Result<Vec<String>> {
            Ok(Vec::new())
        }
    }

    fn pipeline() -> Pipeline<Empty> {
        // Nothing listens there: creating a consumer connects to nothing.
        let text = "prefix = \"shop\"\nconsumer_group = \"g\"\n\
                    schema_registry_url = \"http://127.0.0.1:1\"\n\
                    [kafka]\nbootstrap_servers = \"127.0.0.1:1\"\n\
                    [postgres]\nurl = \"postgres://u@127.0.0.1:1/db\"\n";
        let config: SinkRunnerConfig = tributary_operations::config::parse(text, "test").expect("config");
        let labeler: tributary_connectors::Labeler = std::sync::Arc::new(|t: &TableId| t.to_string());
        let (_, stop) = tokio::sync::watch::channel(false);
        let telemetry = tributary_operations::telemetry::Telemetry::new("t", "sink");
        Pipeline::new(config, Empty, labeler, telemetry, tributary_operations::admin::Control::new(), stop)
            .expect("pipeline")
    }

    /// Takes records `offsets` of `topic` partition 0 as the consumer
    /// would; how many the buffers hold then.
    fn consume(p: &mut Pipeline<Empty>, topic: &str, offsets: std::ops::Range<i64>) -> usize {
        for offset in offsets {
            let raw = RawRecord {
                topic: topic.into(),
                partition: 0,
                offset,
                key: Some(vec![1]),
                value: Some(vec![2]),
                headers: Vec::new(),
            };
            if p.partitions.take(topic, 0, offset) {
                p.buffers.push(raw, Instant::now);
            }
        }
        p.buffers.get(topic).map_or(0, |b| b.records.len())
    }

    /// librdkafka can give an eager assignment while this runner still
    /// holds the last one (a partition-count change seen while it served
    /// an assignment: `rd_kafka_cgrp_revoke_all_rejoin` skips the revoke
    /// then). The partition starts again from the destination's offset; what
    /// was buffered of it must not stay beside its records consumed again.
    #[tokio::test]
    async fn an_assignment_without_a_revoke_first_consumes_each_record_once() {
        let mut p = pipeline();
        let (t, other) = ("shop.public.items", "shop.public.orders");
        let assign = |parts: &[(&str, i32)]| RebalanceEvent::Assign {
            wanted: parts.iter().map(|(t, i)| Partition::new(*t, *i)).collect(),
            excluded: Vec::new(),
            cooperative: false,
        };
        p.rebalance(assign(&[(t, 0), (other, 0)])).await;
        assert_eq!(consume(&mut p, t, 0..3), 3);
        assert_eq!(consume(&mut p, other, 0..2), 2);
        // The next generation's assignment, without a revoke: `other` went
        // to another member.
        p.rebalance(assign(&[(t, 0)])).await;
        assert_eq!(consume(&mut p, t, 0..3), 3, "each record of the partition once");
        assert!(p.buffers.get(other).is_none(), "what another member owns now is dropped");
        assert!(!p.partitions.contains(other, 0), "and no longer this runner's");
    }
}
