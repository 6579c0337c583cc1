//! The `[schema_registry]` section both runners share: credentials and a CA
//! for a registry that wants them (Confluent Cloud: basic authentication
//! with an API key; a secured Apicurio or Karapace: basic or a bearer
//! token; a private CA).

use serde::Deserialize;
use tributary_schemas::registry::{Registry, RegistryAccess};

use crate::config::{resolve_secret, ConfigError};

/// The `[schema_registry]` section. Every key is optional; without any the
/// registry is reached anonymously with the usual roots.
#[derive(Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchemaRegistryConfig {
    /// Basic authentication user (Confluent Cloud: the API key).
    #[serde(default)]
    pub username: Option<String>,
    /// Its password, inline or as `env:NAME` / `file:/path` (Confluent
    /// Cloud: the API secret).
    #[serde(default)]
    pub password: Option<String>,
    /// A bearer token instead, inline or as `env:NAME` / `file:/path`.
    #[serde(default)]
    pub token: Option<String>,
    /// A PEM file of the CA(s) the registry's certificate chains to, besides
    /// the usual roots.
    #[serde(default)]
    pub ca_file: Option<String>,
}

impl std::fmt::Debug for SchemaRegistryConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SchemaRegistryConfig")
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "[redacted]"))
            .field("token", &self.token.as_ref().map(|_| "[redacted]"))
            .field("ca_file", &self.ca_file)
            .finish()
    }
}

impl SchemaRegistryConfig {
    /// Checks the combination of keys; errors name `schema_registry.<key>`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let field = |k: &str| format!("schema_registry.{k}");
        match (&self.username, &self.password, &self.token) {
            (Some(_), _, Some(_)) => Err(ConfigError::invalid(
                field("token"),
                "cannot be set with schema_registry.username: use basic authentication or a bearer token",
            )),
            (None, Some(_), _) => Err(ConfigError::invalid(field("password"), "needs schema_registry.username")),
            (Some(u), None, None) if !u.is_empty() => Err(ConfigError::invalid(
                field("password"),
                "is required with schema_registry.username (inline, env:NAME or file:/path)",
            )),
            (Some(u), _, _) if u.is_empty() || u.contains(':') => {
                Err(ConfigError::invalid(field("username"), "must be non-empty and hold no ':'"))
            }
            _ => Ok(()),
        }
    }

    /// Resolves the secrets and reads the CA file.
    pub fn access(&self) -> Result<RegistryAccess, ConfigError> {
        let basic = match (&self.username, &self.password) {
            (Some(user), Some(raw)) => Some((user.clone(), resolve_secret("schema_registry.password", raw)?)),
            _ => None,
        };
        let token = self
            .token
            .as_deref()
            .map(|raw| resolve_secret("schema_registry.token", raw))
            .transpose()?;
        let ca_pem = self
            .ca_file
            .as_deref()
            .map(|path| {
                std::fs::read(path)
                    .map_err(|e| ConfigError::invalid("schema_registry.ca_file", format!("cannot read {path}: {e}")))
            })
            .transpose()?;
        Ok(RegistryAccess { basic, token, ca_pem })
    }

    /// A client of the registry at `url` with this section's access.
    pub fn registry(&self, url: &str) -> Result<Registry, ConfigError> {
        Registry::with_access(url, &self.access()?).map_err(|e| ConfigError::invalid("schema_registry", e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<SchemaRegistryConfig, String> {
        let c: SchemaRegistryConfig = toml::from_str(text).map_err(|e| e.to_string())?;
        c.validate().map_err(|e| e.to_string())?;
        Ok(c)
    }

    #[test]
    fn keys_combine_as_documented_and_secrets_stay_out_of_debug() {
        assert!(parse("").is_ok());
        assert!(parse("username = \"key\"\npassword = \"s3cret\"").is_ok());
        assert!(parse("token = \"t0ken\"").is_ok());
        let e = parse("username = \"key\"").expect_err("no password");
        assert!(e.contains("schema_registry.password"), "{e}");
        let e = parse("password = \"x\"").expect_err("no user");
        assert!(e.contains("schema_registry.password"), "{e}");
        let e = parse("username = \"k\"\npassword = \"p\"\ntoken = \"t\"").expect_err("both");
        assert!(e.contains("schema_registry.token"), "{e}");
        assert!(parse("user = \"k\"").is_err(), "unknown keys are refused");
        let c = parse("username = \"key\"\npassword = \"s3cret\"\ntoken_x = \"\"");
        assert!(c.is_err());
        let c = parse("username = \"key\"\npassword = \"s3cret\"").expect("config");
        let text = format!("{c:?} {:?}", c.access().expect("access"));
        assert!(!text.contains("s3cret"), "{text}");
        let c = parse("token = \"t0ken\"").expect("config");
        let text = format!("{c:?} {:?}", c.access().expect("access"));
        assert!(!text.contains("t0ken"), "{text}");
        let e = parse("ca_file = \"/nonexistent/ca.pem\"")
            .expect("config")
            .access()
            .expect_err("no file");
        assert!(e.to_string().contains("schema_registry.ca_file"), "{e}");
    }
}
