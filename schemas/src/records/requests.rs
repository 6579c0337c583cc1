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
    /// Ranges of `table` whose summaries (see
    /// [`crate::records::RangeSummary`]) the destination found different
    /// from its rows, or could not compute: the source verifies them again
    /// with their rows' digests, which name the differing keys.
    Verify {
        /// The table.
        table: TableId,
        /// The verification whose summaries they were.
        verification: u64,
        /// The ranges: each the keys after `.0` up to `.1` (canonical key
        /// texts as in [`crate::records::VerifyRange`]; none: from the
        /// first, to the last).
        ranges: Vec<KeyBounds>,
    },
}

/// A key range: rows whose key is after the first bound (none: from the
/// first row) and at most the second (none: to the last), as the bounds of
/// a [`crate::records::VerifyRange`].
pub type KeyBounds = (Option<Vec<Option<String>>>, Option<Vec<Option<String>>>);

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
    Verify {
        schema: String,
        table: String,
        verification: u64,
        ranges: Vec<KeyBounds>,
    },
}

impl Request {
    /// Its key: the table, `schema.table`.
    pub fn key(&self) -> String {
        match self {
            Request::Repair { table, .. } | Request::Verify { table, .. } => table.to_string(),
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
            Request::Verify { table, verification, ranges } => Value::Verify {
                schema: table.schema.clone(),
                table: table.table.clone(),
                verification: *verification,
                ranges: ranges.clone(),
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
            Value::Verify { schema, table, verification, ranges } => Request::Verify {
                table: TableId::new(schema, table),
                verification,
                ranges,
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
        let v = Request::Verify {
            table: TableId::new("public", "items"),
            verification: 8,
            ranges: vec![
                (None, Some(vec![Some("5".into())])),
                (Some(vec![Some("9".into())]), None),
            ],
        };
        assert_eq!(Request::decode(&v.value()), Ok(v.clone()));
        assert_eq!(v.key(), "public.items");
        assert_eq!(topic("shop"), "shop.tributary-requests");
    }
}
