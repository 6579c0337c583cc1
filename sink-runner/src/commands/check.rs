//! `sink-runner check`: connects to Kafka, the schema registry and the
//! destination, and reports each problem with its fix.

use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};

use crate::config::SinkRunnerConfig;
use crate::consumer::consumer_config;
use crate::RunError;

const KAFKA_TIMEOUT: Duration = Duration::from_secs(10);

/// One line of the report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// `kafka`, `registry` or `destination`.
    pub component: &'static str,
    /// Whether it is a problem (else information).
    pub problem: bool,
    /// What was found.
    pub message: String,
    /// How to fix it (problems only).
    pub fix: Option<String>,
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let tag = if self.problem { "PROBLEM" } else { "ok" };
        write!(f, "{tag:7} {:11} {}", self.component, self.message)?;
        if let Some(fix) = &self.fix {
            write!(f, "\n        fix: {fix}")?;
        }
        Ok(())
    }
}

fn ok(component: &'static str, message: String) -> Finding {
    Finding { component, problem: false, message, fix: None }
}

fn problem(component: &'static str, message: String, fix: String) -> Finding {
    Finding { component, problem: true, message, fix: Some(fix) }
}

/// Runs every check.
pub async fn check(config: &SinkRunnerConfig) -> Result<Vec<Finding>, RunError> {
    let mut findings = Vec::new();
    findings.extend(check_kafka(config).await?);
    findings.push(check_registry(config).await);
    let mut sink = config.sink()?;
    let problems = sink.check().await;
    if problems.is_empty() {
        findings.push(ok("destination", "reachable; the sink user can create tables and store offsets".into()));
    }
    for p in problems {
        let fix = p.fix.unwrap_or_else(|| "see the message".to_string());
        findings.push(problem("destination", p.message, fix));
    }
    Ok(findings)
}

async fn check_kafka(config: &SinkRunnerConfig) -> Result<Vec<Finding>, RunError> {
    let client = consumer_config(config)?;
    let pattern = config.topic_pattern();
    let config = config.clone();
    let result = tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = client.create().map_err(|e| e.to_string())?;
        let md = consumer.fetch_metadata(None, KAFKA_TIMEOUT).map_err(|e| e.to_string())?;
        let re = regex::Regex::new(&config.topic_pattern()).map_err(|e| e.to_string())?;
        let topics: Vec<String> = md
            .topics()
            .iter()
            .map(|t| t.name().to_string())
            .filter(|t| re.is_match(t) && !config.is_excluded(t))
            .collect();
        Ok::<_, String>((md.brokers().len(), topics))
    })
    .await
    .map_err(|e| RunError::Other(format!("kafka check panicked: {e}")))?;
    Ok(match result {
        Ok((brokers, topics)) => {
            let mut v = vec![ok("kafka", format!("{brokers} broker(s) reachable"))];
            if topics.is_empty() {
                v.push(ok(
                    "kafka",
                    format!("no topic matches {pattern} yet; tables appear as the source runner creates their topics"),
                ));
            } else {
                v.push(ok("kafka", format!("{} topic(s) match {pattern}", topics.len())));
            }
            v
        }
        Err(e) => vec![problem(
            "kafka",
            format!("cannot read cluster metadata: {e}"),
            "check kafka.bootstrap_servers and the security settings (kafka.security_protocol, sasl_*)".into(),
        )],
    })
}

async fn check_registry(config: &SinkRunnerConfig) -> Finding {
    let registry = match config.schema_registry.registry(&config.schema_registry_url) {
        Ok(r) => r,
        Err(e) => return problem("registry", e.to_string(), "fix schema_registry_url and [schema_registry]".into()),
    };
    match registry.latest("__tributary_check-value").await {
        Ok(_) => ok("registry", format!("{} answers", config.schema_registry_url)),
        Err(e) => problem(
            "registry",
            e.to_string(),
            "check schema_registry_url (a Confluent-compatible API, e.g. .../apis/ccompat/v7) and that the registry is up".into(),
        ),
    }
}
