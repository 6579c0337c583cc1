//! Pausing and resuming a table's partitions: for an operator (the admin
//! server's pause set, per table or the whole runner), and for a retry.

use std::collections::BTreeSet;

use rdkafka::consumer::Consumer;
use rdkafka::TopicPartitionList;
use tokio::sync::watch;
use tracing::{info, warn};
use tributary_connectors::Sink;
use tributary_operations::admin::{Control, PauseSet};
use tributary_operations::telemetry::TableState;

use crate::pipeline::Pipeline;

/// What an operator paused, as the pipeline follows it.
pub(crate) struct OperatorPauses {
    /// Operator pause/resume from the admin server.
    pub(crate) control: Control,
    /// Wakes the pipeline when the pause set changes.
    pub(crate) changed: watch::Receiver<PauseSet>,
    /// Topics whose partitions are paused because an operator paused their
    /// table (or the whole runner).
    pub(crate) paused_topics: BTreeSet<String>,
    /// Whether the status says the whole runner is paused.
    runner_paused: bool,
}

impl OperatorPauses {
    /// Following `control`'s pause set.
    pub(crate) fn new(control: Control) -> Self {
        Self {
            changed: control.subscribe(),
            control,
            paused_topics: BTreeSet::new(),
            runner_paused: false,
        }
    }
}

impl<S: Sink + 'static> Pipeline<S> {
    /// Follows the operator's pause set: pauses the partitions of paused
    /// tables (nothing more is fetched, nothing buffered is applied, no
    /// offset moves) and resumes them when the operator resumes.
    pub(crate) fn apply_operator_pause(&mut self) {
        let paused = self.operator.control.paused();
        // This runs once per trip through the loop: without any pause, past
        // or present, there is nothing to do and nothing is allocated.
        if !paused.all && paused.tables.is_empty() && self.operator.paused_topics.is_empty() {
            if self.operator.runner_paused {
                self.telemetry.set_paused(None);
                self.operator.runner_paused = false;
            }
            return;
        }
        let topics: Vec<String> = self.partitions.topics().map(str::to_string).collect();
        for topic in topics {
            let label = (self.labeler)(&self.table_of(&topic));
            let want = paused.is_paused(&label);
            let is = self.operator.paused_topics.contains(&topic);
            if want && !is {
                self.pause(&topic, true);
                self.operator.paused_topics.insert(topic);
                self.telemetry
                    .set_state(&label, TableState::Paused("paused by an operator".to_string()));
                info!(table = %label, "paused by an operator");
            } else if !want && is {
                // A table also waiting for a retry stays paused until it succeeds.
                if !self.buffers.retrying(&topic) {
                    self.pause(&topic, false);
                }
                self.operator.paused_topics.remove(&topic);
                self.set_streaming(&topic, &label);
                info!(table = %label, "resumed by an operator");
            }
        }
        if paused.all != self.operator.runner_paused {
            self.telemetry
                .set_paused(paused.all.then(|| "paused by an operator".to_string()));
            self.operator.runner_paused = paused.all;
        }
    }

    /// Pauses (or resumes) every assigned partition of `topic`. A partition
    /// stopped out of range stays paused until its stored offset is fixed
    /// (see `probe_stopped`).
    pub(crate) fn pause(&self, topic: &str, paused: bool) {
        let mut tpl = TopicPartitionList::new();
        // The lane of every topic (transactional consistency): all of them.
        let all = self.buffers.lane.as_deref() == Some(topic);
        for (t, p, state) in self.partitions.iter().filter(|(t, _, _)| all || *t == topic) {
            if paused || state.stopped.is_none() {
                tpl.add_partition(t, p);
            }
        }
        if tpl.count() == 0 {
            return;
        }
        let r = if paused {
            self.consumer.pause(&tpl)
        } else {
            self.consumer.resume(&tpl)
        };
        if let Err(e) = r {
            warn!(topic, error = %e, "cannot pause or resume partitions");
        }
    }

    /// The lanes an operator paused: the paused topics, or, when every
    /// topic is one lane (transactional consistency), that lane while any
    /// of its tables is paused: a transaction applies whole or waits.
    pub(crate) fn paused_lanes(&self) -> std::borrow::Cow<'_, BTreeSet<String>> {
        match &self.buffers.lane {
            Some(lane) if !self.operator.paused_topics.is_empty() => {
                std::borrow::Cow::Owned(BTreeSet::from([lane.clone()]))
            }
            _ => std::borrow::Cow::Borrowed(&self.operator.paused_topics),
        }
    }

    /// Marks `topic`'s table streaming, unless one of its partitions is
    /// stopped out of range: its error stays in the status.
    pub(crate) fn set_streaming(&self, topic: &str, label: &str) {
        let stopped = self.partitions.of_topic(topic).find_map(|(_, s)| s.stopped.as_ref());
        let state = match stopped {
            Some(o) => TableState::Paused(o.error(&self.config.consumer_group, &self.table_of(topic)).to_string()),
            None => TableState::Streaming,
        };
        self.telemetry.set_state(label, state);
    }
}
