//! The consistent snapshot: every captured table read with flashback
//! queries `AS OF SCN` one SCN (Oracle Database Development Guide, "Using
//! Oracle Flashback Query (SELECT AS OF)"), in chunks by primary key (or
//! ROWID, stable at one SCN), each chunk's last key in the checkpoint so a
//! restart resumes after it at the same SCN. Streaming then starts at that
//! SCN: commits at or below it are in the rows already.
//!
//! The SCN must stay within undo retention until the last chunk is read
//! (ORA-01555 / ORA-08180 otherwise: classified as needing an operator,
//! with the fix).

use serde::{Deserialize, Serialize};
use tributary_schemas::{Row, TableId, TableSchema, Value};

use super::client::{ChunkAfter, SnapshotRow};
use super::redo_sql::Literal;
use super::types::decode;
use crate::error::Result;

/// One table's snapshot progress.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TablePlan {
    /// Owner.
    pub schema: String,
    /// Table.
    pub table: String,
    /// Where the next chunk starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<ChunkAfter>,
    /// Every row read.
    pub done: bool,
    /// The SCN this table is read at, when not the snapshot's: a table
    /// copied again while streaming is read at an SCN of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scn: Option<u64>,
}

impl TablePlan {
    /// A table not read yet.
    pub fn new(id: &TableId) -> Self {
        Self {
            schema: id.schema.clone(),
            table: id.table.clone(),
            after: None,
            done: false,
            scn: None,
        }
    }

    /// The table.
    pub fn id(&self) -> TableId {
        TableId::new(&self.schema, &self.table)
    }
}

/// The snapshot's state in the checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotState {
    /// The SCN every table is read at.
    pub scn: u64,
    /// Tables in order.
    pub tables: Vec<TablePlan>,
}

/// A snapshot row's values in the schema's column order.
pub fn decode_row(schema: &TableSchema, row: &SnapshotRow) -> Result<Row> {
    let (_, texts) = row;
    schema
        .columns
        .iter()
        .enumerate()
        .map(|(i, col)| match texts.get(i).cloned().flatten() {
            None => Ok(Value::Null),
            Some(t) => decode(col, &Literal::Str(t), true).map_err(|e| e.or_table(&schema.id)),
        })
        .collect()
}

/// Where the chunk after `rows` starts: the last row's key texts, or its
/// ROWID for a table without a primary key.
pub fn next_after(schema: &TableSchema, keyed: bool, rows: &[SnapshotRow]) -> Option<ChunkAfter> {
    let (rowid, texts) = rows.last()?;
    if !keyed {
        return Some(ChunkAfter::RowId(rowid.clone()));
    }
    let key = schema
        .key
        .iter()
        .map(|k| {
            schema
                .columns
                .iter()
                .position(|c| &c.name == k)
                .and_then(|i| texts.get(i).cloned().flatten())
        })
        .collect();
    Some(ChunkAfter::Key(key))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tributary_schemas::{Column, DataType};

    #[test]
    fn rows_decode_and_chunks_resume_after_the_last_key() {
        let mut id = Column::new("ID", DataType::Int32, false);
        id.source_type = "NUMBER(9)".into();
        let mut name = Column::new("NAME", DataType::Text, true);
        name.source_type = "VARCHAR2(20)".into();
        let schema = TableSchema {
            id: TableId::new("APP", "T"),
            columns: vec![id, name],
            key: vec!["ID".into()],
            dropped: vec![],
        };
        let rows = vec![
            ("AAA1".to_string(), vec![Some("1".to_string()), None]),
            ("AAA2".into(), vec![Some("2".into()), Some("b".into())]),
        ];
        assert_eq!(decode_row(&schema, &rows[1]).unwrap(), vec![Value::Int32(2), Value::Text("b".into())]);
        assert_eq!(decode_row(&schema, &rows[0]).unwrap(), vec![Value::Int32(1), Value::Null]);
        assert_eq!(next_after(&schema, true, &rows), Some(ChunkAfter::Key(vec![Some("2".into())])));
        assert_eq!(next_after(&schema, false, &rows), Some(ChunkAfter::RowId("AAA2".into())));
        assert_eq!(next_after(&schema, true, &[]), None);
        let bad = ("x".to_string(), vec![Some("nope".to_string()), None]);
        let e = decode_row(&schema, &bad).expect_err("not a number");
        assert_eq!(e.table(), Some(&TableId::new("APP", "T")));
    }
}
