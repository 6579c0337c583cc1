//! A change topic the tests write themselves: change events encoded as the
//! source runner encodes them (Avro, Confluent wire format, registered
//! schemas) and produced in Kafka transactions, so that a sink runner can be
//! tested without a source database.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{OwnedHeaders, OwnedMessage};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::ClientConfig;
use tributary_schemas::{ChangeEvent, EnvelopeOptions, EventEncoder, Registry};

use crate::{kafka_bootstrap, schema_registry_url, unique};

/// A topic `<prefix>.public.items` (and its dead-letter topic) with a
/// transactional producer and an encoder.
pub struct EventTopic {
    /// The topic prefix (a sink runner's `prefix`).
    pub prefix: String,
    /// The change topic.
    pub topic: String,
    encoder: EventEncoder,
    producer: ThreadedProducer<DefaultProducerContext>,
}

impl EventTopic {
    /// Creates the topic with `partitions` partitions (and `<topic>.dlq`),
    /// under a prefix no earlier run used.
    pub async fn new(name: &str, partitions: i32) -> Self {
        let prefix = unique(&format!("e2e_{name}"));
        let topic = format!("{prefix}.public.items");
        let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", kafka_bootstrap())
            .create()
            .expect("admin client");
        let dlq_topic = format!("{topic}.dlq");
        let topics = [
            NewTopic::new(&topic, partitions, TopicReplication::Fixed(1)),
            NewTopic::new(&dlq_topic, 1, TopicReplication::Fixed(1)),
        ];
        for r in admin.create_topics(&topics, &AdminOptions::new()).await.expect("create topics") {
            r.expect("topic created");
        }
        let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
            .set("bootstrap.servers", kafka_bootstrap())
            .set("transactional.id", unique("e2e-producer"))
            .create()
            .expect("producer");
        producer.init_transactions(Duration::from_secs(30)).expect("init transactions");
        let encoder = EventEncoder::new(
            Registry::new(schema_registry_url()).expect("registry"),
            EnvelopeOptions::for_connector("postgresql"),
        );
        Self { prefix, topic, encoder, producer }
    }

    /// Encodes and produces `events` in one Kafka transaction (with a
    /// tombstone after each delete, like the source runner).
    pub async fn produce(&mut self, events: &[ChangeEvent]) {
        for e in events {
            self.encoder.prepare(&e.schema, &self.topic).await.expect("prepare");
        }
        self.producer.begin_transaction().expect("begin");
        for e in events {
            let rec = self.encoder.encode(e, &self.topic).expect("encode");
            self.send(rec.key.as_deref(), rec.value.as_deref(), None);
            if let Some(t) = self.encoder.tombstone(e, &self.topic).expect("tombstone") {
                self.send(t.key.as_deref(), None, None);
            }
        }
        self.producer.commit_transaction(Duration::from_secs(30)).expect("commit");
    }

    /// `event` encoded as [`EventTopic::produce`] encodes it (its schema
    /// prepared before).
    pub fn encode(&self, event: &ChangeEvent) -> tributary_schemas::encoder::EncodedRecord {
        self.encoder.encode(event, &self.topic).expect("encode")
    }

    /// Produces raw bytes (e.g. garbage) in one transaction.
    pub fn produce_raw(&self, key: Option<&[u8]>, value: Option<&[u8]>) {
        self.producer.begin_transaction().expect("begin");
        self.send(key, value, None);
        self.producer.commit_transaction(Duration::from_secs(30)).expect("commit");
    }

    /// Produces a control record (null key and value, `headers`) on
    /// partition `partition`, in one transaction.
    pub fn produce_control(&self, partition: i32, headers: &[(&str, &str)]) {
        self.produce_control_to(&self.topic, partition, headers);
    }

    /// A record without key and value, with `headers`, into `topic` (a
    /// control record as it would sit in a dead-letter topic).
    pub fn produce_control_to(&self, topic: &str, partition: i32, headers: &[(&str, &str)]) {
        use rdkafka::message::Header;
        let mut h = OwnedHeaders::new();
        for (key, value) in headers {
            h = h.insert(Header { key, value: Some(*value) });
        }
        self.producer.begin_transaction().expect("begin");
        let r: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(topic).partition(partition).headers(h);
        self.producer.send(r).map_err(|(e, _)| e).expect("send a control record");
        self.producer.commit_transaction(Duration::from_secs(30)).expect("commit");
    }

    fn send(&self, key: Option<&[u8]>, value: Option<&[u8]>, headers: Option<OwnedHeaders>) {
        let mut r: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(&self.topic);
        if let Some(k) = key {
            r = r.key(k);
        }
        if let Some(v) = value {
            r = r.payload(v);
        }
        if let Some(h) = headers {
            r = r.headers(h);
        }
        loop {
            match self.producer.send(r) {
                Ok(()) => break,
                Err((e, back)) if e.rdkafka_error_code() == Some(rdkafka::types::RDKafkaErrorCode::QueueFull) => {
                    self.producer.poll(Duration::from_millis(50));
                    r = back;
                }
                Err((e, _)) => panic!("send: {e}"),
            }
        }
    }

    /// End offsets of the change topic's partitions.
    pub fn end_offsets(&self) -> BTreeMap<(String, i32), i64> {
        let c: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", kafka_bootstrap())
            .set("group.id", unique("watermarks"))
            .create()
            .expect("consumer");
        let md = c.fetch_metadata(Some(&self.topic), Duration::from_secs(10)).expect("metadata");
        let mut out = BTreeMap::new();
        for t in md.topics() {
            for p in t.partitions() {
                let (_, high) = c
                    .fetch_watermarks(&self.topic, p.id(), Duration::from_secs(10))
                    .expect("watermarks");
                out.insert((self.topic.clone(), p.id()), high);
            }
        }
        out
    }

    /// Every record of `topic` (read_committed) from the start, until
    /// `expect` arrived or `deadline` passed.
    pub fn read_topic(&self, topic: &str, expect: usize, deadline: Duration) -> Vec<OwnedMessage> {
        let c: BaseConsumer = crate::committed_reader("reader").create().expect("consumer");
        c.subscribe(&[topic]).expect("subscribe");
        let until = Instant::now() + deadline;
        let mut out = Vec::new();
        while out.len() < expect && Instant::now() < until {
            if let Some(Ok(m)) = c.poll(Duration::from_millis(200)) {
                out.push(m.detach());
            }
        }
        out
    }

    /// A sink runner's config file for this topic: consumer group `group`,
    /// small batches, and the destination section `destination`.
    pub fn sink_runner_config(&self, group: &str, destination: &str) -> String {
        format!(
            "prefix = \"{prefix}\"\nconsumer_group = \"{group}\"\nschema_registry_url = \"{registry}\"\n\
             batch_max_records = 300\nbatch_linger_ms = 100\n\
             [admin]\nlisten = \"off\"\n\
             [kafka]\nbootstrap_servers = \"{bootstrap}\"\n\
             [kafka.properties]\n\"session.timeout.ms\" = \"6000\"\n\"heartbeat.interval.ms\" = \"1000\"\n\
             {destination}",
            prefix = self.prefix,
            registry = schema_registry_url(),
            bootstrap = kafka_bootstrap(),
        )
    }
}
