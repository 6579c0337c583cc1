//! Kafka client settings shared by both runners.

use rdkafka::ClientConfig;
use secrecy::ExposeSecret;
use serde::Deserialize;

use crate::config::{resolve_secret, ConfigError};

/// How to reach Kafka. `Debug` shows no secret: the SASL password is
/// shown as set or not, and of `properties` only the names (a value may
/// be a password, e.g. `ssl.key.password`).
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaConfig {
    /// Comma-separated `host:port` list.
    pub bootstrap_servers: String,
    /// `PLAINTEXT` (default), `SSL`, `SASL_PLAINTEXT` or `SASL_SSL`.
    #[serde(default = "default_security_protocol")]
    pub security_protocol: String,
    /// SASL mechanism, e.g. `SCRAM-SHA-512`.
    #[serde(default)]
    pub sasl_mechanism: Option<String>,
    /// SASL user name.
    #[serde(default)]
    pub sasl_username: Option<String>,
    /// SASL password: inline, `env:NAME` or `file:/path`.
    #[serde(default)]
    pub sasl_password: Option<String>,
    /// CA bundle for TLS.
    #[serde(default)]
    pub ssl_ca_location: Option<String>,
    /// SASL/OAUTHBEARER with tokens from an OpenID Connect provider
    /// (`sasl_mechanism = "OAUTHBEARER"`).
    #[serde(default)]
    pub oauth: Option<OAuthConfig>,
    /// Extra librdkafka properties, for anything not covered above.
    #[serde(default)]
    pub properties: std::collections::BTreeMap<String, String>,
}

/// The OAuth 2.0 client-credentials grant (RFC 6749, 4.4) librdkafka runs
/// against the provider's token endpoint (`sasl.oauthbearer.method=oidc`),
/// again before each token expires. `Debug` hides the secret.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OAuthConfig {
    /// The provider's token endpoint, `https://...`.
    pub token_endpoint_url: String,
    /// The client id the provider knows the runner by.
    pub client_id: String,
    /// Its secret: inline, `env:NAME` or `file:/path`.
    pub client_secret: String,
    /// The scope to ask for, if the provider or the cluster wants one.
    #[serde(default)]
    pub scope: Option<String>,
}

impl std::fmt::Debug for OAuthConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OAuthConfig")
            .field("token_endpoint_url", &self.token_endpoint_url)
            .field("client_id", &self.client_id)
            .field("client_secret", &crate::config::Redacted)
            .field("scope", &self.scope)
            .finish()
    }
}

/// Whether an error librdkafka reports is a failed login (a refused SASL
/// login, an OAuth token it could not get). librdkafka retries those by
/// itself, so the calls waiting on the broker would only time out, saying
/// nothing of the cause: the runners say it as soon as it is reported.
pub fn is_authentication_failure(error: &rdkafka::error::KafkaError) -> bool {
    use rdkafka::types::RDKafkaErrorCode;
    matches!(
        error.rdkafka_error_code(),
        Some(RDKafkaErrorCode::Authentication | RDKafkaErrorCode::SaslAuthenticationFailed)
    )
}

/// The start of a runner's message for a failed Kafka login.
pub const AUTHENTICATION_FAILED: &str = "kafka: authentication failed";

/// What to check when Kafka (or the identity provider) refuses the
/// runner's credentials.
pub const AUTHENTICATION_HINT: &str = "check [kafka] security_protocol, sasl_mechanism and sasl_username / \
     sasl_password, or [kafka.oauth] (token_endpoint_url, client_id, client_secret, scope), against the cluster's \
     listener and the identity provider's client";

/// The SASL mechanism whose credentials are OAuth tokens.
const OAUTHBEARER: &str = "OAUTHBEARER";

impl std::fmt::Debug for KafkaConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let properties: std::collections::BTreeMap<&str, crate::config::Redacted> =
            self.properties.keys().map(|k| (k.as_str(), crate::config::Redacted)).collect();
        f.debug_struct("KafkaConfig")
            .field("bootstrap_servers", &self.bootstrap_servers)
            .field("security_protocol", &self.security_protocol)
            .field("sasl_mechanism", &self.sasl_mechanism)
            .field("sasl_username", &self.sasl_username)
            .field("sasl_password", &self.sasl_password.as_ref().map(|_| crate::config::Redacted))
            .field("ssl_ca_location", &self.ssl_ca_location)
            .field("oauth", &self.oauth)
            .field("properties", &properties)
            .finish()
    }
}

fn default_security_protocol() -> String {
    "PLAINTEXT".to_string()
}

impl KafkaConfig {
    /// Checks the fields; errors name them under `prefix`.
    pub fn validate(&self, prefix: &str) -> Result<(), ConfigError> {
        if self.bootstrap_servers.trim().is_empty() {
            return Err(ConfigError::invalid(
                format!("{prefix}.bootstrap_servers"),
                "must list at least one host:port",
            ));
        }
        let protocols = ["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"];
        if !protocols.contains(&self.security_protocol.as_str()) {
            return Err(ConfigError::invalid(
                format!("{prefix}.security_protocol"),
                format!("must be one of {}", protocols.join(", ")),
            ));
        }
        let oauthbearer = self.sasl_mechanism.as_deref() == Some(OAUTHBEARER);
        match &self.oauth {
            Some(o) if oauthbearer => {
                if !(o.token_endpoint_url.starts_with("https://") || o.token_endpoint_url.starts_with("http://")) {
                    return Err(ConfigError::invalid(
                        format!("{prefix}.oauth.token_endpoint_url"),
                        "must be an https:// (or http://) URL",
                    ));
                }
                if o.client_id.trim().is_empty() {
                    return Err(ConfigError::invalid(format!("{prefix}.oauth.client_id"), "must not be empty"));
                }
            }
            Some(_) => {
                return Err(ConfigError::invalid(
                    format!("{prefix}.oauth"),
                    "is used only with sasl_mechanism = \"OAUTHBEARER\"",
                ))
            }
            None if oauthbearer => {
                return Err(ConfigError::invalid(
                    format!("{prefix}.oauth"),
                    "is required when sasl_mechanism is OAUTHBEARER (token_endpoint_url, client_id, client_secret)",
                ))
            }
            None => {}
        }
        if self.security_protocol.starts_with("SASL") && !oauthbearer && self.sasl_username.is_none() {
            return Err(ConfigError::invalid(
                format!("{prefix}.sasl_username"),
                "is required when security_protocol is SASL_* (except with sasl_mechanism = \"OAUTHBEARER\")",
            ));
        }
        self.validate_properties(prefix)
    }

    /// Hands each of `properties` to librdkafka now, as creating a client
    /// would, so that a mistyped name or a value librdkafka refuses stops
    /// the runner at start with the key named, instead of failing every
    /// client creation later. Neither librdkafka's message nor the value is
    /// repeated: a value may be a secret.
    fn validate_properties(&self, prefix: &str) -> Result<(), ConfigError> {
        for (key, value) in &self.properties {
            let mut one = ClientConfig::new();
            one.set(key, value);
            match one.create_native_config() {
                Ok(_) => {}
                Err(rdkafka::error::KafkaError::ClientConfig(res, ..)) => {
                    let rule = if res == rdkafka::types::RDKafkaConfRes::RD_KAFKA_CONF_UNKNOWN {
                        "is not a librdkafka setting (see librdkafka's CONFIGURATION.md for the names)"
                    } else {
                        "has a value librdkafka refuses for this setting"
                    };
                    return Err(ConfigError::invalid(format!("{prefix}.properties.\"{key}\""), rule));
                }
                Err(_) => {
                    return Err(ConfigError::invalid(
                        format!("{prefix}.properties.\"{key}\""),
                        "cannot be handed to librdkafka (it contains a NUL character)",
                    ))
                }
            }
        }
        Ok(())
    }

    /// A librdkafka config with connection and security settings applied.
    pub fn client_config(&self) -> Result<ClientConfig, ConfigError> {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.bootstrap_servers);
        c.set("security.protocol", &self.security_protocol);
        if let Some(m) = &self.sasl_mechanism {
            c.set("sasl.mechanism", m);
        }
        if let Some(u) = &self.sasl_username {
            c.set("sasl.username", u);
        }
        if let Some(p) = &self.sasl_password {
            let secret = resolve_secret("kafka.sasl_password", p)?;
            c.set("sasl.password", secret.expose_secret());
        }
        if let Some(ca) = &self.ssl_ca_location {
            c.set("ssl.ca.location", ca);
        }
        if let Some(o) = &self.oauth {
            let secret = resolve_secret("kafka.oauth.client_secret", &o.client_secret)?;
            c.set("sasl.oauthbearer.method", "oidc")
                .set("sasl.oauthbearer.token.endpoint.url", &o.token_endpoint_url)
                .set("sasl.oauthbearer.client.id", &o.client_id)
                .set("sasl.oauthbearer.client.secret", secret.expose_secret());
            if let Some(scope) = &o.scope {
                c.set("sasl.oauthbearer.scope", scope);
            }
        }
        for (k, v) in &self.properties {
            c.set(k, v);
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(properties: &[(&str, &str)]) -> KafkaConfig {
        KafkaConfig {
            bootstrap_servers: "127.0.0.1:9092".into(),
            security_protocol: default_security_protocol(),
            sasl_mechanism: None,
            sasl_username: None,
            sasl_password: None,
            ssl_ca_location: None,
            oauth: None,
            properties: properties.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        }
    }

    #[test]
    fn oauthbearer_needs_its_section_and_no_user_name() {
        let mut c = config(&[]);
        c.security_protocol = "SASL_SSL".into();
        c.sasl_mechanism = Some(OAUTHBEARER.into());
        let e = c.validate("kafka").unwrap_err().to_string();
        assert!(e.contains("kafka.oauth") && e.contains("required"), "{e}");
        c.oauth = Some(OAuthConfig {
            token_endpoint_url: "https://idp.example/token".into(),
            client_id: "tributary".into(),
            client_secret: "s3cret-value".into(),
            scope: Some("kafka".into()),
        });
        c.validate("kafka").expect("no user name needed");
        assert!(!format!("{c:?}").contains("s3cret-value"), "the client secret is redacted");
        let native = c.client_config().expect("client config");
        assert_eq!(native.get("sasl.oauthbearer.method"), Some("oidc"));
        assert_eq!(native.get("sasl.oauthbearer.scope"), Some("kafka"));
        if let Some(o) = c.oauth.as_mut() {
            o.token_endpoint_url = "idp.example/token".into();
        }
        let e = c.validate("kafka").unwrap_err().to_string();
        assert!(e.contains("kafka.oauth.token_endpoint_url"), "{e}");
        c.sasl_mechanism = Some("SCRAM-SHA-512".into());
        let e = c.validate("kafka").unwrap_err().to_string();
        assert!(e.contains("kafka.oauth") && e.contains("only with"), "{e}");
    }

    #[test]
    fn a_mistyped_or_refused_property_is_named_at_validation() {
        assert!(config(&[("linger.ms", "5"), ("compression.type", "zstd")])
            .validate("kafka")
            .is_ok());
        let e = config(&[("linger.ms", "5"), ("lingr.ms", "5")]).validate("kafka").unwrap_err();
        let text = e.to_string();
        assert!(text.contains("kafka.properties.\"lingr.ms\""), "{text}");
        assert!(text.contains("is not a librdkafka setting"), "{text}");
        let e = config(&[("compression.type", "secret-looking-value")])
            .validate("kafka")
            .unwrap_err();
        let text = e.to_string();
        assert!(text.contains("kafka.properties.\"compression.type\"") && text.contains("value"), "{text}");
        assert!(!text.contains("secret-looking-value"), "the value is never repeated: {text}");
    }
}
