//! Requests a sink runner sends to its copy's source runner, on the
//! copy's requests topic ([`topic`]): a plain record per request, its key
//! the table, its value JSON. The source runner reads them between
//! batches; each is idempotent (asked twice, it does the same once more).

use serde::{Deserialize, Serialize};

use super::RecordError;
use crate::TableId;

/// The requests topic of the copy whose topics start with `prefix`: two
/// dot-separated parts, so that no sink's subscription to change topics
/// (`<prefix>.<schema>.<table>`) matches it.
pub fn topic(prefix: &str) -> String {
    format!("{prefix}.tributary-requests")
}

/// One request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// Rows of `table` differ in the destination (found by verification
    /// `verification`): the source sends the current rows of `keys` (their
    /// canonical key texts, see `crate::canonical`) again, then verifies
    /// the table again.
    Repair {
        /// The table.
        table: TableId,
        /// The verification that found them.
        verification: u64,
        /// The keys, as `crate::canonical::key_text` writes them.
        keys: Vec<String>,
    },
}

/// The JSON of a request's value.
#[derive(Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
enum Value {
    Repair {
        schema: String,
        table: String,
        verification: u64,
        keys: Vec<String>,
    },
}

impl Request {
    /// Its key: the table, `schema.table`.
    pub fn key(&self) -> String {
        match self {
            Request::Repair { table, .. } => table.to_string(),
        }
    }

    /// Its value's bytes.
    pub fn value(&self) -> Vec<u8> {
        let v = match self {
            Request::Repair { table, verification, keys } => Value::Repair {
                schema: table.schema.clone(),
                table: table.table.clone(),
                verification: *verification,
                keys: keys.clone(),
            },
        };
        // Plain data: serializing it cannot fail.
        serde_json::to_vec(&v).unwrap_or_default()
    }

    /// The request a value holds.
    pub fn decode(value: &[u8]) -> Result<Request, RecordError> {
        let v: Value = serde_json::from_slice(value)
            .map_err(|e| RecordError::unreadable("a request of the requests topic", e.to_string()))?;
        Ok(match v {
            Value::Repair { schema, table, verification, keys } => Request::Repair {
                table: TableId::new(schema, table),
                verification,
                keys,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_decodes_to_what_was_encoded_and_junk_is_an_error() {
        let r = Request::Repair {
            table: TableId::new("public", "items"),
            verification: 7,
            keys: vec![r#"["5"]"#.into(), r#"["6"]"#.into()],
        };
        assert_eq!(Request::decode(&r.value()), Ok(r.clone()));
        assert_eq!(r.key(), "public.items");
        assert!(Request::decode(b"{\"kind\":\"explode\"}").is_err());
        assert_eq!(topic("shop"), "shop.tributary-requests");
    }
}
