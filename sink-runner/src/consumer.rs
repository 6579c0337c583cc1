//! The runner's Kafka consumer: its settings, its context (librdkafka's
//! errors, statistics and rebalances reach the runner through it), and the
//! health of its consumer-group membership.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, RebalanceProtocol};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientContext, TopicPartitionList};
use tokio::sync::mpsc;
use tracing::{debug, warn};
use tributary_operations::admin::Control;
use tributary_operations::telemetry::{ConsumerGroupStatus, Telemetry};

use crate::config::{
    SinkRunnerConfig, DEFAULT_FETCH_QUEUE_BACKOFF_MS, DEFAULT_QUEUED_MAX_KBYTES, DEFAULT_STATISTICS_INTERVAL_MS,
    DEFAULT_TOPIC_REFRESH_MS,
};
use crate::partitions::Partition;
use crate::rebalance::RebalanceEvent;
use crate::RunError;

/// The runner's consumer.
pub type ChangeConsumer = rdkafka::consumer::StreamConsumer<ConsumerCtx>;

/// The librdkafka consumer settings of a runner.
pub fn consumer_config(config: &SinkRunnerConfig) -> Result<ClientConfig, RunError> {
    let mut c = config.kafka.client_config()?;
    // Correctness: never overridable.
    c.set("group.id", &config.consumer_group);
    c.set("enable.auto.commit", "false");
    c.set("enable.auto.offset.store", "false");
    c.set("isolation.level", "read_committed");
    // A stored offset the topic no longer holds (retention ran out, the
    // topic was deleted and re-created) must stop its partition with an
    // error, never jump silently to either end: a partition without a stored
    // offset is assigned at `Offset::Beginning` explicitly (see
    // `rebalance`), so no reset is ever wanted.
    c.set("auto.offset.reset", "error");
    // Whole transactions need every partition of the copy in one member.
    if config.consistency == crate::config::Consistency::Transactional {
        c.set(crate::config::ASSIGNMENT_STRATEGY, crate::config::TRANSACTIONAL_ASSIGNMENT);
    }
    // Tuning: only when the operator did not set it in kafka.properties.
    let defaults = [
        ("topic.metadata.refresh.interval.ms", DEFAULT_TOPIC_REFRESH_MS.to_string()),
        ("queued.max.messages.kbytes", DEFAULT_QUEUED_MAX_KBYTES.to_string()),
        ("fetch.queue.backoff.ms", DEFAULT_FETCH_QUEUE_BACKOFF_MS.to_string()),
        ("client.id", format!("tributary-sink-{}", config.consumer_group)),
        ("statistics.interval.ms", DEFAULT_STATISTICS_INTERVAL_MS.to_string()),
    ];
    for (k, v) in defaults {
        if c.get(k).is_none() {
            c.set(k, v);
        }
    }
    Ok(c)
}

/// The consumer's context. It does nothing slow: a rebalance is handed to
/// the pipeline (which looks the partitions' offsets up in the destination
/// and assigns them, see `rebalance`); statistics feed the status.
pub struct ConsumerCtx {
    /// Where rebalances are handed over.
    pub(crate) rebalances: mpsc::UnboundedSender<RebalanceEvent>,
    /// Topics the pattern matches that are not copied (dead-letter and
    /// offsets topics, `exclude`): never looked up, never fetched.
    pub(crate) excluded: Arc<dyn Fn(&str) -> bool + Send + Sync>,
    pub(crate) telemetry: Telemetry,
    pub(crate) control: Control,
    pub(crate) group: Arc<std::sync::Mutex<GroupHealth>>,
    /// Whether the destination cannot tell the offsets of newly assigned
    /// partitions (the pipeline retries): not ready meanwhile.
    pub(crate) offsets_unreadable: Arc<AtomicBool>,
    /// The status label of a topic's table (for the consumer lag).
    pub(crate) topic_label: Arc<dyn Fn(&str) -> String + Send + Sync>,
    /// Set once the pipeline no longer serves rebalances (it stopped, and
    /// the consumer closes): they are served here, at once.
    pub(crate) closing: Arc<AtomicBool>,
}

impl ClientContext for ConsumerCtx {
    /// A failed login pauses the runner in its status, with the reason,
    /// until the group is joined: librdkafka retries it by itself.
    fn error(&self, error: KafkaError, reason: &str) {
        use tributary_operations::kafka::{is_authentication_failure, AUTHENTICATION_FAILED, AUTHENTICATION_HINT};
        if is_authentication_failure(&error) {
            self.telemetry
                .set_paused(Some(format!("{AUTHENTICATION_FAILED}: {reason} (to fix: {AUTHENTICATION_HINT})")));
        }
        warn!(error = %error, reason, "librdkafka reports an error");
    }

    /// Reads the consumer group's part of the statistics and each
    /// partition's consumer lag (the per-broker rest is not kept).
    fn stats_raw(&self, statistics: &[u8]) {
        // A consumer made again's predecessor no longer reports.
        if self.closing.load(Ordering::Relaxed) {
            return;
        }
        let stats = match Statistics::parse(statistics) {
            Ok(s) => s,
            Err(e) => {
                debug!(error = %e, "cannot read librdkafka's statistics");
                return;
            }
        };
        for (topic, lag) in stats.consumer_lags() {
            if !(self.excluded)(topic) {
                self.telemetry.set_consumer_lag(&(self.topic_label)(topic), lag);
            }
        }
        if let (Some(c), Ok(mut g)) = (stats.cgrp, self.group.lock()) {
            let now = Instant::now();
            g.update(c.state, c.join_state, c.assignment_size, now);
            let status = g.status(now);
            // Ready: a settled member whose destination answered.
            let settled = ConsumerGroupStatus::settled(&status.state, &status.join_state);
            self.control
                .set_ready(settled && !self.offsets_unreadable.load(Ordering::Relaxed));
            let failed_login = self
                .telemetry
                .paused_reason()
                .is_some_and(|r| r.starts_with(tributary_operations::kafka::AUTHENTICATION_FAILED));
            if settled && failed_login {
                // Logged in since: back to what the operator asked for.
                let all = self.control.paused().all;
                self.telemetry.set_paused(all.then(|| "paused by an operator".to_string()));
            }
            self.telemetry.set_consumer_group(status);
        }
    }
}

impl ConsumerContext for ConsumerCtx {
    /// Hands the rebalance to the pipeline, which assigns or unassigns
    /// when it has done what must come first (the destination's offsets, or
    /// the end of the batch being applied). librdkafka waits for that call
    /// (its join state says `wait-assign-call` or `wait-unassign-call`),
    /// heartbeating on its own thread meanwhile.
    fn rebalance(&self, base: &BaseConsumer<Self>, err: RDKafkaRespErr, tpl: &mut TopicPartitionList) {
        let cooperative = matches!(base.rebalance_protocol(), RebalanceProtocol::Cooperative);
        if self.closing.load(Ordering::Relaxed) {
            // The consumer closes (it waits for this call): what it had is
            // given up, nothing new is taken on.
            let r = match (err, cooperative) {
                (RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS, true) => base.incremental_assign(tpl),
                (RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS, false) => base.assign(tpl),
                (_, true) => base.incremental_unassign(tpl),
                (_, false) => base.unassign(),
            };
            if let Err(e) = r {
                warn!(error = %e, "cannot serve a rebalance while closing");
            }
            return;
        }
        let parts: Vec<Partition> = tpl
            .elements()
            .iter()
            .map(|e| Partition::new(e.topic(), e.partition()))
            .collect();
        let event = match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                let (excluded, wanted) = parts.into_iter().partition(|p| (self.excluded)(&p.topic));
                RebalanceEvent::Assign { wanted, excluded, cooperative }
            }
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => RebalanceEvent::Revoke { parts, cooperative },
            other => RebalanceEvent::Failed { parts, cooperative, error: format!("{other:?}") },
        };
        // The pipeline owns the receiver for as long as the consumer lives.
        let _ = self.rebalances.send(event);
    }
}

/// The consumer's group membership, from librdkafka's statistics.
#[derive(Debug, Default)]
pub struct GroupHealth {
    state: String,
    join_state: String,
    assignment_size: i32,
    /// When the membership stopped being settled (`None` while it is, and
    /// before the first report).
    unsettled_since: Option<Instant>,
    /// When it started waiting on the group rather than on this runner
    /// (`None` while settled, or while librdkafka waits for the pipeline to
    /// serve an assignment: leaving the group would not help then).
    pub stuck_since: Option<Instant>,
}

impl GroupHealth {
    fn update(&mut self, state: String, join_state: String, assignment_size: i32, now: Instant) {
        if ConsumerGroupStatus::settled(&state, &join_state) {
            self.unsettled_since = None;
            self.stuck_since = None;
        } else {
            self.unsettled_since.get_or_insert(now);
            // librdkafka's join states that wait for the application (an
            // assignment or unassignment to serve): the pipeline is busy (a
            // long apply, a destination look-up), not the group stuck.
            // Once it called unassign, librdkafka waits on itself
            // (`wait-unassign-to-complete`).
            let ours = matches!(join_state.as_str(), "wait-assign-call" | "wait-unassign-call");
            if ours {
                self.stuck_since = None;
            } else {
                self.stuck_since.get_or_insert(now);
            }
        }
        self.state = state;
        self.join_state = join_state;
        self.assignment_size = assignment_size;
    }

    fn status(&self, now: Instant) -> ConsumerGroupStatus {
        ConsumerGroupStatus {
            state: self.state.clone(),
            join_state: self.join_state.clone(),
            assigned_partitions: self.assignment_size,
            unsettled_seconds: self.unsettled_since.map(|t| now.saturating_duration_since(t).as_secs()),
        }
    }

    /// How long the membership has been stuck on the group, and in which
    /// states: `None` while settled or waiting on this runner.
    pub fn stuck(&self) -> Option<(Duration, String, String)> {
        self.stuck_since
            .map(|t| (t.elapsed(), self.state.clone(), self.join_state.clone()))
    }
}

/// The parts of librdkafka's statistics the runner reads.
#[derive(Debug, serde::Deserialize)]
struct Statistics {
    cgrp: Option<Cgrp>,
    #[serde(default)]
    topics: HashMap<String, StatsTopic>,
}

#[derive(Debug, serde::Deserialize)]
struct StatsTopic {
    #[serde(default)]
    partitions: HashMap<String, StatsPartition>,
}

#[derive(Debug, serde::Deserialize)]
struct StatsPartition {
    /// Records after the committed offset (committed after each applied
    /// batch); -1 when unknown.
    consumer_lag: i64,
}

#[derive(Debug, serde::Deserialize)]
struct Cgrp {
    state: String,
    join_state: String,
    assignment_size: i32,
}

impl Statistics {
    fn parse(statistics: &[u8]) -> Result<Self, serde_json::Error> {
        serde_json::from_slice(statistics)
    }

    /// Each topic's consumer lag: the sum over its partitions whose lag is
    /// known (partition -1 is librdkafka's own); topics with none known are
    /// left out.
    fn consumer_lags(&self) -> impl Iterator<Item = (&str, u64)> {
        self.topics.iter().filter_map(|(topic, t)| {
            let known: Vec<i64> = t
                .partitions
                .iter()
                .filter(|(p, l)| p.as_str() != "-1" && l.consumer_lag >= 0)
                .map(|(_, l)| l.consumer_lag)
                .collect();
            (!known.is_empty()).then(|| (topic.as_str(), known.iter().sum::<i64>() as u64))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_health_counts_from_the_first_unsettled_report_until_settled_again() {
        let t0 = Instant::now();
        let mut g = GroupHealth::default();
        g.update("up".into(), "steady".into(), 4, t0);
        assert_eq!(g.unsettled_since, None);
        assert_eq!(g.status(t0).unsettled_seconds, None);
        // A broker restart: the coordinator is lost, then the member waits
        // to join; the clock runs from the first report.
        g.update("query-coord".into(), "init".into(), 0, t0 + Duration::from_secs(5));
        g.update("up".into(), "wait-join".into(), 0, t0 + Duration::from_secs(10));
        assert_eq!(g.unsettled_since, Some(t0 + Duration::from_secs(5)));
        let s = g.status(t0 + Duration::from_secs(35));
        assert_eq!((s.state.as_str(), s.join_state.as_str(), s.assigned_partitions), ("up", "wait-join", 0));
        assert_eq!(s.unsettled_seconds, Some(30));
        assert_eq!(g.stuck_since, Some(t0 + Duration::from_secs(5)));
        // Waiting for the pipeline to serve the assignment: not stuck (the
        // status still counts it as unsettled).
        g.update("up".into(), "wait-assign-call".into(), 0, t0 + Duration::from_secs(36));
        assert_eq!((g.stuck_since, g.unsettled_since), (None, Some(t0 + Duration::from_secs(5))));
        // An unassignment the pipeline served that librdkafka does not
        // complete: stuck on librdkafka, from that report.
        g.update("query-coord".into(), "wait-unassign-to-complete".into(), 0, t0 + Duration::from_secs(37));
        assert_eq!(g.stuck_since, Some(t0 + Duration::from_secs(37)));
        let (_, _, join_state) = g.stuck().expect("stuck");
        assert_eq!(join_state, "wait-unassign-to-complete");
        g.update("up".into(), "steady".into(), 4, t0 + Duration::from_secs(40));
        assert_eq!(g.unsettled_since, None);
        assert_eq!(g.status(t0 + Duration::from_secs(40)).assigned_partitions, 4);
    }

    #[test]
    fn statistics_give_the_group_and_each_topics_known_lag() {
        let raw = br#"{"name":"c","cgrp":{"state":"up","join_state":"steady","assignment_size":3,"rebalance_cnt":1},
            "topics":{"p.s.a":{"partitions":{"0":{"consumer_lag":4},"1":{"consumer_lag":-1},"-1":{"consumer_lag":9}}},
                      "p.s.b":{"partitions":{"0":{"consumer_lag":-1}}}}}"#;
        let stats = Statistics::parse(raw).expect("parses");
        let cgrp = stats.cgrp.as_ref().expect("cgrp");
        assert_eq!((cgrp.state.as_str(), cgrp.join_state.as_str(), cgrp.assignment_size), ("up", "steady", 3));
        let lags: Vec<(&str, u64)> = stats.consumer_lags().collect();
        assert_eq!(lags, vec![("p.s.a", 4)], "unknown lags and librdkafka's partition -1 are left out");
    }

    #[test]
    fn consumer_tuning_defaults_yield_to_kafka_properties() {
        let base = r#"
prefix = "shop"
consumer_group = "g"
schema_registry_url = "http://127.0.0.1:8081/apis/ccompat/v7"
[postgres]
url = "postgres://u@127.0.0.1/db"
[kafka]
bootstrap_servers = "127.0.0.1:9092"
"#;
        let parse = |text: &str| -> SinkRunnerConfig { tributary_operations::config::parse(text, "test").unwrap() };
        let c = consumer_config(&parse(base)).unwrap();
        assert_eq!(c.get("fetch.queue.backoff.ms"), Some(DEFAULT_FETCH_QUEUE_BACKOFF_MS.to_string().as_str()));
        assert_eq!(c.get("isolation.level"), Some("read_committed"));
        let tuned = format!(
            "{base}properties = {{ \"fetch.queue.backoff.ms\" = \"500\", \"isolation.level\" = \"read_uncommitted\" }}\n"
        );
        let c = consumer_config(&parse(&tuned)).unwrap();
        assert_eq!(c.get("fetch.queue.backoff.ms"), Some("500"), "an operator's setting wins");
        assert_eq!(c.get("isolation.level"), Some("read_committed"), "correctness settings are never overridden");
        let reset = format!("{base}properties = {{ \"auto.offset.reset\" = \"earliest\" }}\n");
        let c = consumer_config(&parse(&reset)).unwrap();
        assert_eq!(c.get("auto.offset.reset"), Some("error"), "an offset out of range is never reset silently");
    }
}
