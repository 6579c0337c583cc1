//! `source-runner delete [--yes]`: removes everything this copy owns on
//! the source, in Kafka and in the schema registry. Destination tables
//! belong to sinks (`sink-runner delete --drop-destination`).

use std::process::ExitCode;
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::RDKafkaErrorCode;
use tributary_connectors::kafka::kafka_error;
use tributary_connectors::Error;
use tributary_operations::pauses::PauseStore;
use tributary_schemas::topic::TopicNaming;

use crate::config::SourceRunnerConfig;
use crate::kafka::blocking;

/// Kafka's answer to the metadata request that lists the topics.
const METADATA_TIMEOUT: Duration = Duration::from_secs(10);

/// Deletes the copy after the operator typed its name (or `yes`).
pub async fn delete(config: SourceRunnerConfig, yes: bool) -> ExitCode {
    let prefix = config.prefix().to_string();
    if !yes {
        println!(
            "This deletes copy {name:?}: its replication slot and publication (PostgreSQL), its \
             Kafka topics (its table topics {prefix}.<schema>.<table>, their .dlq topics and its \
             offsets topic {prefix}.tributary.offsets, its requests topic {prefix}.tributary-requests), and their schema subjects. Type the copy's \
             name to confirm:",
            name = config.name
        );
        let mut answer = String::new();
        if std::io::stdin().read_line(&mut answer).is_err() || answer.trim() != config.name {
            eprintln!("not confirmed; nothing deleted");
            return ExitCode::FAILURE;
        }
    }
    let mut failed = false;
    if let Ok(source) = config.source_config() {
        match source.teardown().await {
            Ok(done) => {
                for d in done {
                    println!("deleted {d}");
                }
            }
            Err(e) => {
                eprintln!("error: {e}");
                failed = true;
            }
        }
    }
    match delete_topics(&config).await {
        Ok(topics) => {
            for t in topics {
                println!("deleted topic {t} and its schema subjects");
            }
        }
        Err(e) => {
            eprintln!("error: {e}");
            failed = true;
        }
    }
    let forgotten = match config.kafka.client_config() {
        Ok(kafka) => PauseStore::of_source(kafka, &config.name).forget().await,
        Err(e) => Err(e.to_string()),
    };
    match forgotten {
        Ok(true) => println!("deleted the stored operator pauses of source/{}", config.name),
        Ok(false) => {}
        Err(e) => {
            eprintln!("error: the stored operator pauses: {e}");
            failed = true;
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// Deletes every topic of this copy and its schema subjects: its table
/// topics (by the shape of their names, see `tributary_schemas::topic`),
/// their dead-letter topics (default suffix) and its offsets topic; never a
/// topic of another copy whose prefix starts like this one's. Returns the
/// deleted topic names.
pub async fn delete_topics(config: &SourceRunnerConfig) -> Result<Vec<String>, Error> {
    let client = config.kafka.client_config().map_err(|e| Error::needs_operator(e.to_string()))?;
    let admin: AdminClient<DefaultClientContext> =
        client.create().map_err(|e| kafka_error("cannot create the admin client", e))?;
    let consumer: BaseConsumer = client.create().map_err(|e| kafka_error("metadata client", e))?;
    let prefix = config.prefix().to_string();
    let naming = TopicNaming::new(config.topic_template.clone());
    let offsets = config.offsets_topic();
    let requests = tributary_schemas::records::requests::topic(config.prefix());
    let ours = move |t: &str| {
        t == offsets
            || t == requests
            || naming.is_table_topic(&prefix, t)
            || tributary_schemas::topic::is_dead_letter_topic(t, tributary_schemas::topic::DLQ_SUFFIX, |x| {
                naming.is_table_topic(&prefix, x)
            })
    };
    let topics: Vec<String> = blocking(move || {
        consumer
            .fetch_metadata(None, METADATA_TIMEOUT)
            .map(|m| m.topics().iter().map(|t| t.name().to_string()).collect::<Vec<_>>())
    })
    .await?
    .map_err(|e| kafka_error("list topics", e))?
    .into_iter()
    .filter(|t| ours(t))
    .collect();
    if topics.is_empty() {
        return Ok(topics);
    }
    let names: Vec<&str> = topics.iter().map(String::as_str).collect();
    for r in admin
        .delete_topics(&names, &AdminOptions::new())
        .await
        .map_err(|e| kafka_error("delete topics", e))?
    {
        match r {
            Ok(_) | Err((_, RDKafkaErrorCode::UnknownTopicOrPartition)) => {}
            Err((t, code)) => return Err(Error::retryable(format!("cannot delete topic {t}: {code}"))),
        }
    }
    let registry = config
        .schema_registry
        .registry(&config.schema_registry_url)
        .map_err(|e| Error::needs_operator(e.to_string()))?;
    for t in &topics {
        for suffix in ["key", "value"] {
            registry.delete_subject(&format!("{t}-{suffix}")).await?;
        }
    }
    Ok(topics)
}
