//! Asking the source runner to repair rows (`[verify] repair = true`): a
//! request on the copy's requests topic
//! ([`tributary_schemas::records::requests`]) with the keys a verification
//! found missing or changed. The source sends their rows again and then
//! verifies the table again; the sink applies them as any change.

use std::time::Duration;

use rdkafka::producer::{FutureProducer, FutureRecord};
use tributary_connectors::kafka::kafka_error;
use tributary_connectors::Error;
use tributary_schemas::records::requests::{self, Request};

use crate::config::SinkRunnerConfig;

/// How long sending a request may take.
const SEND_TIMEOUT: Duration = Duration::from_secs(30);

/// The producer of repair requests, when repairs are on.
pub(crate) struct RepairRequests {
    producer: FutureProducer,
    topic: String,
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
        Ok(Some(Self { producer, topic: requests::topic(prefix) }))
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
