//! An Oracle database in memory that answers [`LogMinerClient`] as a real
//! one does, for tests: no Oracle server can run where Tributary is
//! developed. It writes what LogMiner documents (Oracle Database Reference,
//! `V$LOGMNR_CONTENTS`; Oracle Database Utilities, "Using LogMiner"): a
//! `START` row (6) per transaction, DML rows (1, 2, 3) with `SQL_REDO` in
//! LogMiner's shape (numbers quoted, `TO_DATE`, `HEXTORAW`, `IS NULL`,
//! before-images of all columns in the where clause), `EMPTY_CLOB()` plus
//! `SEL_LOB_LOCATOR` (9) and `LOB_WRITE` (10) rows for CLOB values,
//! `XML DOC BEGIN` / `WRITE` / `END` rows (68, 70, 71, binary XML storage)
//! for XMLTYPE values (their shapes as Debezium's LogMiner adapter parses
//! them: Oracle does not document them), statements longer than [`FakeOracle::set_csf_limit`] split over `CSF`
//! rows, undo rows with `ROLLBACK = 1` for a rollback to a savepoint,
//! `COMMIT` (7) and `ROLLBACK` (36) rows; DDL as its own transaction with
//! an operation 5 row. Flashback reads see the rows committed at or below
//! their SCN. Its redo is cut into log files of [`LOG_SCNS`] SCNs each,
//! archived except the current one; a sequence can be lost to test gaps.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use async_trait::async_trait;
use tributary_schemas::TableId;

use super::client::{ChunkAfter, ColumnDef, DatabaseInfo, LogMinerClient, LogMinerRow, RowAt, SnapshotRow, TableDef};
use super::logs::{LogFile, RedoThread};
use super::redo_sql::{quote_ident, quote_literal, quote_table};
use crate::error::{Error, Result};

/// SCNs per fake redo log file.
pub const LOG_SCNS: u64 = 50;

type Values = Vec<Option<String>>;

#[derive(Debug)]
struct Table {
    def: TableDef,
    /// Versions: (commit SCN, ROWID, row or deleted).
    versions: Vec<(u64, String, Option<Values>)>,
}

#[derive(Debug)]
struct Inner {
    scn: u64,
    tables: BTreeMap<TableId, Table>,
    redo: Vec<LogMinerRow>,
    open: BTreeMap<String, u64>,
    next_xid: u64,
    next_rowid: u64,
    lost: Vec<u64>,
    csf_limit: usize,
    info: DatabaseInfo,
    privileges: Vec<String>,
    logging: BTreeMap<TableId, Option<bool>>,
    unreadable: Vec<TableId>,
}

/// The fake database; clones share it.
#[derive(Debug, Clone)]
pub struct FakeOracle {
    inner: Arc<Mutex<Inner>>,
}

impl Default for FakeOracle {
    fn default() -> Self {
        Self::new()
    }
}

fn rows_at(t: &Table, scn: u64) -> BTreeMap<String, Values> {
    let mut rows = BTreeMap::new();
    for (at, rowid, v) in &t.versions {
        if *at > scn {
            break;
        }
        match v {
            Some(v) => rows.insert(rowid.clone(), v.clone()),
            None => rows.remove(rowid),
        };
    }
    let width = t.def.columns.len();
    for v in rows.values_mut() {
        v.resize(width, None);
    }
    rows
}

impl FakeOracle {
    /// A database in ARCHIVELOG mode with minimal and all-column
    /// supplemental logging and every grant the source needs.
    pub fn new() -> Self {
        Self {
            inner: Arc::new(Mutex::new(Inner {
                scn: 1000,
                tables: BTreeMap::new(),
                redo: Vec::new(),
                open: BTreeMap::new(),
                next_xid: 1,
                next_rowid: 1,
                lost: Vec::new(),
                csf_limit: 4000,
                info: DatabaseInfo {
                    log_mode: "ARCHIVELOG".into(),
                    supplemental_min: "YES".into(),
                    supplemental_all: true,
                    dbid: 4242,
                    con_name: "FREEPDB1".into(),
                    cdb: true,
                    user: "C##TRIBUTARY".into(),
                    smallest_redo_log_bytes: 1 << 30,
                },
                privileges: super::check::REQUIRED_PRIVILEGES.iter().map(|s| s.to_string()).collect(),
                logging: BTreeMap::new(),
                unreadable: Vec::new(),
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Changes the database settings `check` reads.
    pub fn set_info(&self, f: impl FnOnce(&mut DatabaseInfo)) {
        f(&mut self.lock().info);
    }

    /// Replaces the session's privileges.
    pub fn set_privileges(&self, privileges: &[&str]) {
        self.lock().privileges = privileges.iter().map(|s| s.to_string()).collect();
    }

    /// A table's supplemental log group (`Some(true)` all columns).
    pub fn set_table_logging(&self, table: &TableId, logging: Option<bool>) {
        self.lock().logging.insert(table.clone(), logging);
    }

    /// The session may not read `table`.
    pub fn revoke_select(&self, table: &TableId) {
        self.lock().unreadable.push(table.clone());
    }

    /// Statements longer than `bytes` continue over CSF rows.
    pub fn set_csf_limit(&self, bytes: usize) {
        self.lock().csf_limit = bytes.max(8);
    }

    /// Removes log sequence `sequence` (archived and online).
    pub fn lose_sequence(&self, sequence: u64) {
        self.lock().lost.push(sequence);
    }

    /// The current SCN.
    pub fn scn(&self) -> u64 {
        self.lock().scn
    }

    /// Creates a table (its own DDL transaction).
    pub fn create_table(&self, table: &TableId, columns: &[(&str, &str)], key: &[&str]) {
        let def = TableDef {
            columns: columns
                .iter()
                .map(|(n, t)| ColumnDef {
                    name: n.to_string(),
                    type_text: t.to_string(),
                    precision: None,
                    scale: None,
                    nullable: !key.contains(n),
                    aliases: Vec::new(),
                })
                .collect(),
            primary_key: key.iter().map(|s| s.to_string()).collect(),
        };
        let sql = format!("create table {} (...);", quote_table(table));
        self.ddl(table, &sql, |i| {
            i.tables.insert(table.clone(), Table { def, versions: Vec::new() });
            i.logging.entry(table.clone()).or_insert(Some(true));
        });
    }

    /// `ALTER TABLE ... ADD column`.
    pub fn add_column(&self, table: &TableId, name: &str, type_text: &str) {
        let sql = format!("alter table {} add {} {type_text};", quote_table(table), quote_ident(name));
        self.ddl(table, &sql, |i| {
            if let Some(t) = i.tables.get_mut(table) {
                t.def.columns.push(ColumnDef {
                    name: name.into(),
                    type_text: type_text.into(),
                    precision: None,
                    scale: None,
                    nullable: true,
                    aliases: Vec::new(),
                });
            }
        });
    }

    /// `ALTER TABLE ... RENAME COLUMN from TO to`. The rows mined later
    /// name the column `to`, those written before the rename too: the
    /// online catalog renders every row with today's names.
    pub fn rename_column(&self, table: &TableId, from: &str, to: &str) {
        let sql =
            format!("ALTER TABLE {} RENAME COLUMN {} TO {};", quote_table(table), quote_ident(from), quote_ident(to));
        let mut i = self.lock();
        let (old, new) = (quote_ident(from), quote_ident(to));
        for r in i
            .redo
            .iter_mut()
            .filter(|r| r.seg_owner.as_deref() == Some(&table.schema) && r.table_name.as_deref() == Some(&table.table))
        {
            if matches!(r.operation_code, 1 | 2 | 3 | 9) {
                r.sql_redo = r.sql_redo.as_ref().map(|q| q.replace(&old, &new));
            }
        }
        drop(i);
        self.ddl(table, &sql, |i| {
            if let Some(c) = i
                .tables
                .get_mut(table)
                .and_then(|t| t.def.columns.iter_mut().find(|c| c.name == from))
            {
                c.name = to.to_string();
            }
            if let Some(t) = i.tables.get_mut(table) {
                t.def
                    .primary_key
                    .iter_mut()
                    .filter(|k| *k == from)
                    .for_each(|k| *k = to.to_string());
            }
        });
    }

    /// `ALTER TABLE from RENAME TO to` (same owner). Rows written before
    /// it are mined under the new name, as with [`FakeOracle::rename_column`].
    pub fn rename_table(&self, from: &TableId, to: &str) {
        let new = TableId::new(&from.schema, to);
        let sql = format!("ALTER TABLE {} RENAME TO {};", quote_table(from), quote_ident(to));
        let mut i = self.lock();
        let (old_q, new_q) = (quote_table(from), quote_table(&new));
        for r in i
            .redo
            .iter_mut()
            .filter(|r| r.seg_owner.as_deref() == Some(&from.schema) && r.table_name.as_deref() == Some(&from.table))
        {
            r.table_name = Some(to.to_string());
            r.sql_redo = r.sql_redo.as_ref().map(|q| q.replace(&old_q, &new_q));
        }
        drop(i);
        self.ddl(&new, &sql, |i| {
            if let Some(t) = i.tables.remove(from) {
                i.tables.insert(new.clone(), t);
            }
            if let Some(l) = i.logging.remove(from) {
                i.logging.insert(new.clone(), l);
            }
        });
    }

    /// `DROP TABLE`.
    pub fn drop_table(&self, table: &TableId) {
        let sql = format!("drop table {} AS \"BIN$x==$0\";", quote_table(table));
        self.ddl(table, &sql, |i| {
            i.tables.remove(table);
        });
    }

    fn ddl(&self, table: &TableId, sql: &str, apply: impl FnOnce(&mut Inner)) {
        let mut i = self.lock();
        let xid = format!("DD{:06}", i.next_xid);
        i.next_xid += 1;
        i.push(6, &xid, None, None, "set transaction read write;", false);
        i.push(5, &xid, Some(table), None, sql, false);
        apply(&mut i);
        i.push(7, &xid, None, None, "commit;", false);
    }

    /// Opens a transaction.
    pub fn begin(&self) -> FakeTx {
        let mut i = self.lock();
        let xid = format!("0A00{:08X}", i.next_xid);
        i.next_xid += 1;
        i.push(6, &xid, None, None, "set transaction read write;", false);
        let start = i.scn;
        i.open.insert(xid.clone(), start);
        FakeTx {
            db: self.clone(),
            xid,
            changes: Vec::new(),
            savepoints: Vec::new(),
        }
    }

    /// The committed rows of `table` now, by ROWID order.
    pub fn rows(&self, table: &TableId) -> Vec<Values> {
        let i = self.lock();
        i.tables
            .get(table)
            .map(|t| rows_at(t, i.scn).into_values().collect())
            .unwrap_or_default()
    }
}

impl Inner {
    fn push(&mut self, op: u8, xid: &str, table: Option<&TableId>, row_id: Option<&str>, sql: &str, rollback: bool) {
        self.scn += 1;
        let limit = self.csf_limit;
        let mut pieces: Vec<&str> = Vec::new();
        let mut rest = sql;
        while rest.len() > limit {
            let mut cut = limit;
            while !rest.is_char_boundary(cut) {
                cut -= 1;
            }
            pieces.push(&rest[..cut]);
            rest = &rest[cut..];
        }
        pieces.push(rest);
        let n = pieces.len();
        for (k, p) in pieces.into_iter().enumerate() {
            self.redo.push(LogMinerRow {
                scn: self.scn,
                operation_code: op,
                xid: xid.to_string(),
                thread: 1,
                rs_id: format!(" 0x{:06x}.0001.0010 ", self.scn),
                ssn: 0,
                csf: k + 1 < n,
                rollback,
                seg_owner: table.map(|t| t.schema.clone()),
                table_name: table.map(|t| t.table.clone()),
                row_id: row_id.map(str::to_string),
                sql_redo: Some(p.to_string()),
                ts_ms: 1_700_000_000_000 + self.scn as i64,
            });
        }
    }

    /// How LogMiner renders `v` of column `c`.
    fn render(c: &ColumnDef, v: &Option<String>) -> String {
        let Some(v) = v else { return "NULL".into() };
        match c.type_text.as_str() {
            "DATE" => format!("TO_DATE({}, 'YYYY-MM-DD HH24:MI:SS')", quote_literal(v)),
            t if t.starts_with("TIMESTAMP") => {
                format!("TO_TIMESTAMP({}, 'YYYY-MM-DD HH24:MI:SS.FF9')", quote_literal(v))
            }
            t if t.starts_with("RAW") || t == "BLOB" => format!("HEXTORAW({})", quote_literal(v)),
            "CLOB" => "EMPTY_CLOB()".into(),
            // The document follows in XML DOC rows.
            "XMLTYPE" => "NULL".into(),
            "NVARCHAR2" | "NCHAR" => {
                let esc: String = v.encode_utf16().map(|u| format!("\\{u:04X}")).collect();
                format!("UNISTR({})", quote_literal(&esc))
            }
            _ => quote_literal(v),
        }
    }

    fn conditions(def: &TableDef, row: &Values) -> String {
        let mut parts: Vec<String> = def
            .columns
            .iter()
            .zip(row.iter().chain(std::iter::repeat(&None)))
            .filter(|(c, _)| !matches!(c.type_text.as_str(), "CLOB" | "BLOB" | "XMLTYPE"))
            .map(|(c, v)| match v {
                None => format!("{} IS NULL", quote_ident(&c.name)),
                Some(_) => format!("{} = {}", quote_ident(&c.name), Self::render(c, v)),
            })
            .collect();
        parts.push("ROWID = 'AAAx+/AAB'".into());
        parts.join(" and ")
    }

    /// XML DOC rows for the XMLTYPE columns of `row` named in `columns`, as
    /// binary XML storage writes them: the document's UTF-8 bytes in
    /// HEXTORAW pieces of 5 bytes (which split characters), the last one
    /// without its closing quote as Oracle writes some; `XML_REDO := NULL`
    /// for a NULL document.
    fn xml_rows(&mut self, xid: &str, table: &TableId, rowid: &str, def: &TableDef, row: &Values, columns: &[&str]) {
        for (c, v) in def.columns.iter().zip(row.iter()) {
            if c.type_text != "XMLTYPE" || !columns.contains(&c.name.as_str()) {
                continue;
            }
            // The row's other columns, as in Debezium's samples (DBZ-7489).
            let before = Self::conditions(def, row);
            let before = before.trim_end_matches(" and ROWID = 'AAAx+/AAB'");
            let begin =
                format!("XML DOC BEGIN:  select {} from {} where {before}", quote_ident(&c.name), quote_table(table));
            self.push(68, xid, Some(table), Some(rowid), &begin, false);
            match v {
                None => self.push(70, xid, Some(table), Some(rowid), "XML_REDO := NULL", false),
                Some(doc) => {
                    let pieces: Vec<&[u8]> = doc.as_bytes().chunks(5).collect();
                    for (k, piece) in pieces.iter().enumerate() {
                        let hex: String = piece.iter().map(|b| format!("{b:02x}")).collect();
                        let quote = if k + 1 == pieces.len() { "" } else { "'" };
                        let sql = format!("XML_REDO := HEXTORAW('{hex}{quote}):{}", piece.len());
                        self.push(70, xid, Some(table), Some(rowid), &sql, false);
                    }
                }
            }
            self.push(71, xid, Some(table), Some(rowid), "XML DOC END", false);
        }
    }

    /// LOB rows for the CLOB columns of `row`, written in 4-character pieces.
    fn lob_rows(&mut self, xid: &str, table: &TableId, rowid: &str, def: &TableDef, row: &Values) {
        for (c, v) in def.columns.iter().zip(row.iter()) {
            let (Some(v), true) = (v, c.type_text == "CLOB") else {
                continue;
            };
            let key: Vec<String> = def
                .primary_key
                .iter()
                .filter_map(|k| {
                    let i = def.columns.iter().position(|c| &c.name == k)?;
                    Some(format!("{} = {}", quote_ident(k), Self::render(&def.columns[i], &row[i])))
                })
                .collect();
            let sel = format!(
                "DECLARE \n loc_c CLOB; \n buf_c VARCHAR2(6156); \nBEGIN\n select {} into loc_c from {} where {} and ROWID = '{rowid}' for update;",
                quote_ident(&c.name),
                quote_table(table),
                key.join(" and ")
            );
            self.push(9, xid, Some(table), Some(rowid), &sel, false);
            let chars: Vec<char> = v.chars().collect();
            for (k, piece) in chars.chunks(4).enumerate() {
                let text: String = piece.iter().collect();
                let sql = format!(
                    "buf_c := {}; dbms_lob.write(loc_c, {}, {}, buf_c);",
                    quote_literal(&text),
                    piece.len(),
                    k * 4 + 1
                );
                self.push(10, xid, Some(table), Some(rowid), &sql, false);
            }
        }
    }
}

/// One change of a fake transaction, to undo it.
#[derive(Debug, Clone)]
struct Change {
    table: TableId,
    rowid: String,
    before: Option<Values>,
    after: Option<Values>,
}

/// An open transaction of the fake.
#[derive(Debug)]
pub struct FakeTx {
    db: FakeOracle,
    xid: String,
    changes: Vec<Change>,
    savepoints: Vec<usize>,
}

impl FakeTx {
    /// The transaction's XID.
    pub fn xid(&self) -> &str {
        &self.xid
    }

    fn current(&self, i: &Inner, table: &TableId, key: &str) -> Option<(String, Values)> {
        let t = i.tables.get(table)?;
        let k = t.def.columns.iter().position(|c| Some(&c.name) == t.def.primary_key.first())?;
        let mut rows = rows_at(t, i.scn);
        for c in self.changes.iter().filter(|c| &c.table == table) {
            match &c.after {
                Some(v) => rows.insert(c.rowid.clone(), v.clone()),
                None => rows.remove(&c.rowid),
            };
        }
        rows.into_iter()
            .find(|(_, v)| v.get(k).cloned().flatten().as_deref() == Some(key))
    }

    /// Inserts a row (values as text, in column order; `None` is NULL).
    pub fn insert(&mut self, table: &TableId, row: &[Option<&str>]) {
        let mut i = self.db.lock();
        let Some(def) = i.tables.get(table).map(|t| t.def.clone()) else {
            return;
        };
        let rowid = format!("AAAR{:08}", i.next_rowid);
        i.next_rowid += 1;
        let mut row: Values = row.iter().map(|v| v.map(str::to_string)).collect();
        row.resize(def.columns.len(), None);
        let names: Vec<String> = def.columns.iter().map(|c| quote_ident(&c.name)).collect();
        let values: Vec<String> = def.columns.iter().zip(&row).map(|(c, v)| Inner::render(c, v)).collect();
        let sql = format!("insert into {}({}) values ({});", quote_table(table), names.join(","), values.join(","));
        i.push(1, &self.xid, Some(table), Some(&rowid), &sql, false);
        i.lob_rows(&self.xid, table, &rowid, &def, &row);
        let all: Vec<&str> = def.columns.iter().map(|c| c.name.as_str()).collect();
        i.xml_rows(&self.xid, table, &rowid, &def, &row, &all);
        self.changes.push(Change {
            table: table.clone(),
            rowid,
            before: None,
            after: Some(row),
        });
    }

    /// Sets columns of the row whose first key column is `key`.
    pub fn update(&mut self, table: &TableId, key: &str, set: &[(&str, Option<&str>)]) {
        let mut i = self.db.lock();
        let Some((rowid, before)) = self.current(&i, table, key) else {
            return;
        };
        let Some(def) = i.tables.get(table).map(|t| t.def.clone()) else {
            return;
        };
        let mut after = before.clone();
        let mut sets = Vec::new();
        let mut xml = Vec::new();
        for (name, v) in set {
            if let Some(k) = def.columns.iter().position(|c| c.name == *name) {
                after[k] = v.map(str::to_string);
                if def.columns[k].type_text == "XMLTYPE" {
                    xml.push(*name);
                } else {
                    sets.push(format!("{} = {}", quote_ident(name), Inner::render(&def.columns[k], &after[k])));
                }
            }
        }
        // An update of XMLTYPE columns alone is only its XML DOC rows.
        if !sets.is_empty() {
            let sql = format!(
                "update {} set {} where {};",
                quote_table(table),
                sets.join(", "),
                Inner::conditions(&def, &before)
            );
            i.push(3, &self.xid, Some(table), Some(&rowid), &sql, false);
        }
        i.xml_rows(&self.xid, table, &rowid, &def, &after, &xml);
        self.changes.push(Change {
            table: table.clone(),
            rowid,
            before: Some(before),
            after: Some(after),
        });
    }

    /// Deletes the row whose first key column is `key`.
    pub fn delete(&mut self, table: &TableId, key: &str) {
        let mut i = self.db.lock();
        let Some((rowid, before)) = self.current(&i, table, key) else {
            return;
        };
        let Some(def) = i.tables.get(table).map(|t| t.def.clone()) else {
            return;
        };
        let sql = format!("delete from {} where {};", quote_table(table), Inner::conditions(&def, &before));
        i.push(2, &self.xid, Some(table), Some(&rowid), &sql, false);
        self.changes.push(Change {
            table: table.clone(),
            rowid,
            before: Some(before),
            after: None,
        });
    }

    /// `SAVEPOINT`.
    pub fn savepoint(&mut self) {
        self.savepoints.push(self.changes.len());
    }

    /// `ROLLBACK TO SAVEPOINT` (the last one): the undo of each change
    /// since, newest first, as `ROLLBACK = 1` rows.
    pub fn rollback_to_savepoint(&mut self) {
        let Some(at) = self.savepoints.pop() else { return };
        self.undo(at);
    }

    fn undo(&mut self, at: usize) {
        let mut i = self.db.lock();
        for c in self.changes.drain(at..).rev() {
            let Some(def) = i.tables.get(&c.table).map(|t| t.def.clone()) else {
                continue;
            };
            let (op, sql) = match (&c.before, &c.after) {
                (None, Some(a)) => {
                    (2, format!("delete from {} where {};", quote_table(&c.table), Inner::conditions(&def, a)))
                }
                (Some(b), None) => {
                    let values: Vec<String> = def.columns.iter().zip(b).map(|(col, v)| Inner::render(col, v)).collect();
                    let names: Vec<String> = def.columns.iter().map(|c| quote_ident(&c.name)).collect();
                    (
                        1,
                        format!(
                            "insert into {}({}) values ({});",
                            quote_table(&c.table),
                            names.join(","),
                            values.join(",")
                        ),
                    )
                }
                (Some(b), Some(a)) => {
                    let sets: Vec<String> = def
                        .columns
                        .iter()
                        .zip(b)
                        .map(|(col, v)| format!("{} = {}", quote_ident(&col.name), Inner::render(col, v)))
                        .collect();
                    (
                        3,
                        format!(
                            "update {} set {} where {};",
                            quote_table(&c.table),
                            sets.join(", "),
                            Inner::conditions(&def, a)
                        ),
                    )
                }
                (None, None) => continue,
            };
            i.push(op, &self.xid, Some(&c.table), Some(&c.rowid), &sql, true);
        }
    }

    /// `COMMIT`: the changes become visible at the commit SCN.
    pub fn commit(self) {
        let mut i = self.db.lock();
        i.push(7, &self.xid, None, None, "commit;", false);
        let scn = i.scn;
        i.open.remove(&self.xid);
        for c in self.changes {
            if let Some(t) = i.tables.get_mut(&c.table) {
                t.versions.push((scn, c.rowid, c.after));
            }
        }
    }

    /// `ROLLBACK`: undo rows, then the rollback row.
    pub fn rollback(mut self) {
        self.undo(0);
        let mut i = self.db.lock();
        i.push(36, &self.xid, None, None, "rollback;", false);
        i.open.remove(&self.xid);
    }
}

fn lost_log(sequence: u64) -> Error {
    Error::needs_operator(format!("ORA-01291: missing log file (sequence {sequence})")).with_class("ORA-01291")
}

#[async_trait]
impl LogMinerClient for FakeOracle {
    async fn database_info(&self) -> Result<DatabaseInfo> {
        Ok(self.lock().info.clone())
    }

    async fn current_scn(&self) -> Result<u64> {
        Ok(self.lock().scn)
    }

    async fn oldest_open_transaction(&self) -> Result<Option<u64>> {
        Ok(self.lock().open.values().min().copied())
    }

    async fn list_tables(&self, owners: &[String]) -> Result<Vec<TableId>> {
        Ok(self
            .lock()
            .tables
            .keys()
            .filter(|t| owners.contains(&t.schema))
            .cloned()
            .collect())
    }

    async fn table_def(&self, table: &TableId) -> Result<Option<TableDef>> {
        Ok(self.lock().tables.get(table).map(|t| t.def.clone()))
    }

    async fn snapshot_chunk(
        &self,
        table: &TableId,
        def: &TableDef,
        scn: u64,
        after: Option<&ChunkAfter>,
        limit: usize,
    ) -> Result<Vec<SnapshotRow>> {
        let i = self.lock();
        let t = i
            .tables
            .get(table)
            .ok_or_else(|| Error::needs_operator("ORA-00942: table or view does not exist"))?;
        let rows = rows_at(t, scn);
        let index = |name: &str| t.def.columns.iter().position(|c| c.name == name);
        let key_idx: Vec<usize> = def.primary_key.iter().filter_map(|k| index(k)).collect();
        // Key order compares numbers as numbers (the fake's keys are NUMBER).
        let key_of = |v: &Values| -> Vec<i128> {
            key_idx
                .iter()
                .map(|&k| v.get(k).cloned().flatten().and_then(|s| s.parse().ok()).unwrap_or(i128::MIN))
                .collect()
        };
        let mut list: Vec<(String, Values)> = rows.into_iter().collect();
        if !key_idx.is_empty() {
            list.sort_by_key(|(_, v)| key_of(v));
        }
        let list = list.into_iter().filter(|(rowid, v)| match after {
            None => true,
            Some(ChunkAfter::RowId(r)) => rowid > r,
            Some(ChunkAfter::Key(k)) => {
                key_of(v)
                    > k.iter()
                        .map(|s| s.as_deref().and_then(|s| s.parse().ok()).unwrap_or(i128::MIN))
                        .collect::<Vec<_>>()
            }
        });
        Ok(list
            .take(limit)
            .map(|(rowid, v)| {
                let vals = def
                    .columns
                    .iter()
                    .map(|c| index(&c.name).and_then(|k| v.get(k).cloned().flatten()))
                    .collect();
                (rowid, vals)
            })
            .collect())
    }

    async fn row_at(&self, at: RowAt<'_>) -> Result<Option<Vec<Option<String>>>> {
        let i = self.lock();
        let Some(t) = i.tables.get(at.table) else {
            return Ok(None);
        };
        let index = |name: &str| t.def.columns.iter().position(|c| c.name == name);
        let key_idx: Vec<Option<usize>> = at.def.primary_key.iter().map(|k| index(k)).collect();
        Ok(rows_at(t, at.scn)
            .into_values()
            .find(|v| {
                key_idx
                    .iter()
                    .zip(at.key)
                    .all(|(k, want)| k.and_then(|k| v.get(k).cloned().flatten()) == *want)
            })
            .map(|v| {
                at.def
                    .columns
                    .iter()
                    .map(|c| index(&c.name).and_then(|k| v.get(k).cloned().flatten()))
                    .collect()
            }))
    }

    async fn logs(&self) -> Result<Vec<LogFile>> {
        let i = self.lock();
        let current = i.scn / LOG_SCNS;
        Ok((0..=current)
            .filter(|s| !i.lost.contains(s))
            .map(|s| LogFile {
                name: format!("/fake/redo_{s}.arc"),
                thread: 1,
                sequence: s,
                first_scn: s * LOG_SCNS,
                next_scn: if s == current { u64::MAX } else { (s + 1) * LOG_SCNS },
                online: s == current,
                current: s == current,
            })
            .collect())
    }

    /// One open thread whose redo is flushed as it is written: every row
    /// at or below the current SCN is there, so `LAST_REDO_CHANGE#` is one
    /// past it.
    async fn threads(&self) -> Result<Vec<RedoThread>> {
        Ok(vec![RedoThread {
            thread: 1,
            open: true,
            last_redo_scn: self.lock().scn + 1,
        }])
    }

    async fn mine(&self, files: &[LogFile], start: u64, end: u64, owners: &[String]) -> Result<Vec<LogMinerRow>> {
        let i = self.lock();
        // LogMiner reads only the files added: every SCN of the window
        // must be in one (else ORA-01291, missing log file).
        for s in (start + 1) / LOG_SCNS..=end / LOG_SCNS {
            if !files.iter().any(|f| f.sequence == s) {
                return Err(lost_log(s));
            }
        }
        Ok(i.redo
            .iter()
            .filter(|r| r.scn > start && r.scn <= end)
            .filter(|r| {
                matches!(r.operation_code, 6 | 7 | 36) || r.seg_owner.as_ref().is_some_and(|o| owners.contains(o))
            })
            .cloned()
            .collect())
    }

    async fn privileges(&self) -> Result<Vec<String>> {
        Ok(self.lock().privileges.clone())
    }

    async fn can_read(&self, table: &TableId) -> Result<bool> {
        Ok(!self.lock().unreadable.contains(table))
    }

    async fn table_supplemental_logging(&self, table: &TableId) -> Result<Option<bool>> {
        Ok(self.lock().logging.get(table).copied().flatten())
    }
}
