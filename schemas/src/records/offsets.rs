//! The records of a source runner's offsets topic
//! (`<prefix>.tributary.offsets`, compacted, one partition): each keyed by
//! the runner's name and what it is (docs/CONTRACTS.md, "Offsets topic of
//! a source runner"). The latest record of a key is the state; a null
//! value deletes it. Written in the Kafka transaction of the events they
//! cover, read back at the runner's next start.
//!
//! A new kind is one [`OffsetsKey`] variant, its key's shape, and its
//! [`OffsetsRecord`] variant with its value's encoding.

use serde::{Deserialize, Serialize};

use super::RecordError;
use crate::TableId;

/// The key suffix of the held-tables record.
const HELD_KEY_SUFFIX: &str = "/held-tables";
/// The key suffix of the reset-all record.
const RESET_ALL_KEY_SUFFIX: &str = "/reset-all";
/// The key infix of a side record: `<runner>/source/<the source's key>`.
const SIDE_KEY_INFIX: &str = "/source/";

/// What an offsets-topic key of one runner names.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum OffsetsKey {
    /// `<runner>`: the source's checkpoint.
    Checkpoint,
    /// `<runner>/held-tables`: the tables whose changes are held back.
    HeldTables,
    /// `<runner>/reset-all`: a reset of every table not carried out yet.
    ResetAll,
    /// `<runner>/source/<key>`: one of the source's side records.
    Side(String),
}

impl OffsetsKey {
    /// The key's bytes for the runner named `runner`.
    pub fn encode(&self, runner: &str) -> String {
        match self {
            OffsetsKey::Checkpoint => runner.to_string(),
            OffsetsKey::HeldTables => format!("{runner}{HELD_KEY_SUFFIX}"),
            OffsetsKey::ResetAll => format!("{runner}{RESET_ALL_KEY_SUFFIX}"),
            OffsetsKey::Side(key) => format!("{runner}{SIDE_KEY_INFIX}{key}"),
        }
    }

    /// What `key` names, if it is one of `runner`'s keys (other runners
    /// may share the topic).
    pub fn decode(runner: &str, key: &[u8]) -> Option<OffsetsKey> {
        let rest = key.strip_prefix(runner.as_bytes())?;
        if rest.is_empty() {
            return Some(OffsetsKey::Checkpoint);
        }
        if rest == HELD_KEY_SUFFIX.as_bytes() {
            return Some(OffsetsKey::HeldTables);
        }
        if rest == RESET_ALL_KEY_SUFFIX.as_bytes() {
            return Some(OffsetsKey::ResetAll);
        }
        let side = rest.strip_prefix(SIDE_KEY_INFIX.as_bytes())?;
        Some(OffsetsKey::Side(String::from_utf8_lossy(side).into_owned()))
    }
}

/// One record of a runner's offsets topic, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OffsetsRecord {
    /// The source's checkpoint (its own JSON; `None`: deleted).
    Checkpoint(Option<String>),
    /// Every table whose changes are held back (empty: none; a null value
    /// reads as none).
    HeldTables(Vec<HeldTable>),
    /// A reset of every table asked by `source-runner reset` (its id) and
    /// not carried out yet; `None` once carried out.
    ResetAll(Option<u64>),
    /// One side record of the source (`None`: the source dropped it).
    Side {
        /// The source's key.
        key: String,
        /// Its value.
        value: Option<String>,
    },
}

/// The reset-all record's value.
#[derive(Debug, Serialize, Deserialize)]
struct ResetAllValue {
    reset: u64,
}

impl OffsetsRecord {
    /// Its key.
    pub fn key(&self) -> OffsetsKey {
        match self {
            OffsetsRecord::Checkpoint(_) => OffsetsKey::Checkpoint,
            OffsetsRecord::HeldTables(_) => OffsetsKey::HeldTables,
            OffsetsRecord::ResetAll(_) => OffsetsKey::ResetAll,
            OffsetsRecord::Side { key, .. } => OffsetsKey::Side(key.clone()),
        }
    }

    /// Its value's bytes (`None`: a null value, which deletes the key).
    pub fn value(&self) -> Option<Vec<u8>> {
        match self {
            OffsetsRecord::Checkpoint(c) => c.as_ref().map(|c| c.as_bytes().to_vec()),
            // Plain data: serializing it cannot fail.
            OffsetsRecord::HeldTables(held) => Some(serde_json::to_vec(held).unwrap_or_default()),
            OffsetsRecord::ResetAll(reset) => {
                reset.map(|reset| serde_json::to_vec(&ResetAllValue { reset }).unwrap_or_default())
            }
            OffsetsRecord::Side { value, .. } => value.as_ref().map(|v| v.as_bytes().to_vec()),
        }
    }

    /// The record of `key` holding `value`.
    pub fn decode(key: OffsetsKey, value: Option<&[u8]>) -> Result<OffsetsRecord, RecordError> {
        let text = |v: &[u8]| String::from_utf8_lossy(v).into_owned();
        Ok(match key {
            OffsetsKey::Checkpoint => OffsetsRecord::Checkpoint(value.map(text)),
            OffsetsKey::HeldTables => match value {
                None => OffsetsRecord::HeldTables(Vec::new()),
                Some(bytes) => OffsetsRecord::HeldTables(
                    serde_json::from_slice(bytes)
                        .map_err(|e| RecordError::unreadable("the record of held tables", e.to_string()))?,
                ),
            },
            OffsetsKey::ResetAll => match value {
                None => OffsetsRecord::ResetAll(None),
                Some(bytes) => OffsetsRecord::ResetAll(Some(
                    serde_json::from_slice::<ResetAllValue>(bytes)
                        .map_err(|e| RecordError::unreadable("the record of a reset of every table", e.to_string()))?
                        .reset,
                )),
            },
            OffsetsKey::Side(key) => OffsetsRecord::Side { key, value: value.map(text) },
        })
    }
}

/// One held table in the held-tables record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldTable {
    /// The table's schema.
    pub schema: String,
    /// The table's name.
    pub table: String,
    /// Why and how far.
    #[serde(flatten)]
    pub held: Held,
}

impl HeldTable {
    /// The table.
    pub fn id(&self) -> TableId {
        TableId::new(self.schema.clone(), self.table.clone())
    }
}

/// A table whose changes are held back, and how far its new copy is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Held {
    /// Why it was held (the schema change, with the fix).
    pub reason: String,
    /// Where its new copy is.
    pub copy: CopyProgress,
    /// A reset (its id) due before the copy's rows: a table-reset record on
    /// every partition of the table's topic makes sinks forget the
    /// positions their rows hold, so that the copy's rows, from another
    /// position domain or not, pass the position guard. Sent once the
    /// source has taken the copy on (not while `Paused`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reset: Option<u64>,
}

/// How far the new copy of a held table is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CopyProgress {
    /// Paused: every change is held back until the next start asks the
    /// source to copy it again.
    Paused,
    /// The source was asked to copy it: changes are held back until the
    /// copy's rows come.
    Asked,
    /// The copy's rows read the table at this position: streamed changes
    /// before it (which the copy's rows already hold) are held back, those
    /// after it flow; the first one after the sweep ends the hold. (Not
    /// before: a copy resumed after a restart reads at a later position,
    /// and the stream catches up to it, past this one, before the copy
    /// ends; the sweep is still due then.)
    From {
        /// `Position::commit` of the copy's rows.
        commit: u64,
        /// `Position::index` of the copy's rows.
        index: u64,
        /// Whether the copy is complete and the rows it did not rewrite
        /// (deleted while the table was held back) were declared gone.
        #[serde(default)]
        swept: bool,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_told_apart_per_runner() {
        for key in [
            OffsetsKey::Checkpoint,
            OffsetsKey::HeldTables,
            OffsetsKey::ResetAll,
            OffsetsKey::Side("schema/db.t".into()),
        ] {
            let bytes = key.encode("pg-1");
            assert_eq!(OffsetsKey::decode("pg-1", bytes.as_bytes()), Some(key));
        }
        // Another runner's keys, including one whose name starts like ours.
        assert_eq!(OffsetsKey::decode("pg-1", b"pg-2"), None);
        assert_eq!(OffsetsKey::decode("pg-1", b"pg-10"), None);
        assert_eq!(OffsetsKey::decode("pg-1", b"pg-10/held-tables"), None);
        assert_eq!(OffsetsKey::decode("pg-1", b"pg-1/other"), None);
    }

    #[test]
    fn every_record_decodes_to_what_was_encoded() {
        let held = vec![
            HeldTable {
                schema: "public".into(),
                table: "orders".into(),
                held: Held {
                    reason: "why".into(),
                    copy: CopyProgress::Paused,
                    reset: Some(5),
                },
            },
            HeldTable {
                schema: "public".into(),
                table: "lines".into(),
                held: Held {
                    reason: "why".into(),
                    copy: CopyProgress::From { commit: 7, index: 1, swept: true },
                    reset: None,
                },
            },
        ];
        for record in [
            OffsetsRecord::Checkpoint(Some("{\"lsn\":1}".into())),
            OffsetsRecord::Checkpoint(None),
            OffsetsRecord::HeldTables(held),
            OffsetsRecord::HeldTables(Vec::new()),
            OffsetsRecord::ResetAll(Some(1_733_500_000_123)),
            OffsetsRecord::ResetAll(None),
            OffsetsRecord::Side { key: "k".into(), value: Some("v".into()) },
            OffsetsRecord::Side { key: "k".into(), value: None },
        ] {
            let value = record.value();
            assert_eq!(OffsetsRecord::decode(record.key(), value.as_deref()), Ok(record));
        }
    }

    #[test]
    fn records_written_before_the_typed_module_still_read() {
        // The held-tables record as the runner wrote it before (a `From`
        // without `swept`, a reset absent).
        let old = br#"[{"schema":"s","table":"t","reason":"r","copy":{"from":{"commit":3,"index":4}}}]"#;
        let OffsetsRecord::HeldTables(held) = OffsetsRecord::decode(OffsetsKey::HeldTables, Some(old)).unwrap() else {
            panic!("held tables")
        };
        assert_eq!(held[0].held.copy, CopyProgress::From { commit: 3, index: 4, swept: false });
        assert_eq!(held[0].held.reset, None);
        assert_eq!(held[0].id(), TableId::new("s", "t"));
        let e = OffsetsRecord::decode(OffsetsKey::ResetAll, Some(b"[]")).unwrap_err();
        assert!(e.to_string().starts_with("the record of a reset of every table is unreadable"), "{e}");
    }
}
