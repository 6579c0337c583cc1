//! Tables without a key ("keyless": a PostgreSQL table without a primary
//! key and with REPLICA IDENTITY FULL, a MySQL table without a key): their
//! rows are a multiset, and every sink keeps them as rows. Written once
//! here for every destination; `docs/CONTRACTS.md` ("Tables without a
//! key") is the contract.
//!
//! # The model
//!
//! A destination keyless table holds one row per row of the source, equal
//! rows and NULLs included, and beside the source's columns:
//!
//! * [`KEY_COLUMN`]: the row's content key, a digest of its values
//!   ([`content_key`]): equal rows have equal keys, so a delete finds the
//!   rows it may remove by an equality every destination indexes or
//!   hashes (no per-type comparison of values, NULL-safe by construction);
//! * [`ROW_COLUMN`]: the row's name, the Kafka record that wrote it
//!   ([`record_id`], `topic:partition:offset`): an insert applied again
//!   finds its row there and writes nothing;
//! * the position columns: the position of the change that wrote it.
//!
//! A delete (the before-image of a delete, or of an update, whose
//! after-image is an insert) removes exactly one row of its content that
//! is older than it. Deletes and removed rows are remembered in the
//! deleted-rows table, under the destination table's name: `-<record>` a
//! delete applied, `+<record>` a row gone (removed by a delete or taken by
//! a pending delete), each with its position; a delete that finds no older
//! row of its content (its insert was not applied yet: another partition,
//! a dead letter not replayed yet) waits under [`pending_table`]'s name as
//! `<content key>/<record>` and takes the first older insert of its
//! content that comes. So applying any record twice changes nothing (the
//! offsets' fence does not even need to hold: `sink-runner replay`, a unit
//! committed before DDL and applied again), and the order records arrive
//! in does not change the result: each insert and each delete counts once.
//!
//! Which delete takes which row, when several could: the most rows
//! possible are paired, each delete with a row older than it ([`pair`];
//! [`pairing_sql`] the same in SQL). A truncate or a table-copied record
//! at a position removes the rows older than it and keeps out every
//! change older than it, as for keyed tables; a reset forgets every row's
//! position and every entry.

use std::fmt::Write as _;

use sha2::{Digest, Sha256};
use tributary_schemas::{TableSchema, Value};

use super::bookkeeping::{
    position_before, PositionSyntax, Quoting, DELETE_COLUMN, FORGOTTEN_POSITION, KEY_COLUMN, ROW_COLUMN, TABLE_ROW_KEY,
};
use super::reduce::key_value_text;
use super::KafkaPosition;
use crate::error::{Error, Result};

/// Hex digits of a content key ([`content_key`]): 128 bits.
pub const CONTENT_KEY_LEN: usize = 32;

/// The content key of a keyless table's row: SHA-256 of its values (each
/// one's SQL text, length-prefixed; NULL apart from every text), cut to
/// 128 bits, in hex. Trailing NULLs are left out, so a row keeps its key
/// when a nullable column without a default is added at the end (the
/// source's rows older than the column read NULL there); any other change
/// of a keyless table's columns makes the source copy it again.
pub fn content_key(schema: &TableSchema, row: &[Value]) -> Result<String> {
    let end = row.iter().rposition(|v| !matches!(v, Value::Null)).map_or(0, |i| i + 1);
    let mut hash = Sha256::new();
    let mut scratch = String::new();
    for (i, value) in row[..end].iter().enumerate() {
        let text = key_value_text(value, &mut scratch).map_err(|reason| {
            let name = schema.columns.get(i).map_or("?", |c| c.name.as_str());
            Error::permanent(format!("column {name}: {reason}")).with_column(name.to_string())
        })?;
        match text {
            None => hash.update([0u8]),
            Some(text) => {
                hash.update([1u8]);
                hash.update((text.len() as u64).to_le_bytes());
                hash.update(text.as_bytes());
            }
        }
    }
    let digest = hash.finalize();
    let mut out = String::with_capacity(CONTENT_KEY_LEN);
    for b in &digest[..CONTENT_KEY_LEN / 2] {
        let _ = write!(out, "{b:02x}");
    }
    Ok(out)
}

/// The name of the row a record writes, and of the record in the
/// deleted-rows table: `topic:partition:offset`, the same on every
/// delivery of the record (a replayed dead letter keeps its origin's).
pub fn record_id(at: &KafkaPosition) -> String {
    format!("{}:{}:{}", at.topic, at.partition, at.offset)
}

/// The name under which the deleted-rows table keeps the pending deletes
/// of destination table `dest` (apart from its other entries, so that
/// the inserts of a batch look among the few pending ones only).
pub fn pending_table(dest: &str) -> String {
    format!("{dest} (pending deletes)")
}

/// The deleted-rows entry of an applied delete.
pub fn delete_done(record: &str) -> String {
    format!("-{record}")
}

/// The deleted-rows entry of a row that is gone (removed, or its insert
/// taken by a pending delete).
pub fn row_gone(record: &str) -> String {
    format!("+{record}")
}

/// A pending delete's entry (under [`pending_table`]'s name).
pub fn pending_key(content: &str, record: &str) -> String {
    format!("{content}/{record}")
}

/// The content key and the record of a pending delete's entry.
pub fn split_pending(row_key: &str) -> Option<(&str, &str)> {
    row_key.split_once('/').filter(|(k, _)| k.len() == CONTENT_KEY_LEN)
}

/// One side of a pairing ([`pair`]): a row or an insert (older side) or a
/// delete (newer side).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PairItem {
    /// The content key: only items of one content pair.
    pub content: String,
    /// The position as stored (`(-1, -1)` forgotten).
    pub position: (i64, i64),
    /// A delete (else a row or an insert).
    pub newer: bool,
    /// Its record, to order equal positions alike everywhere.
    pub id: String,
}

/// Which of `items` are paired: each delete with a row of its content
/// strictly older than it, as many pairs as possible. The same rule as
/// [`pairing_sql`]: scanning a content's items from the newest, a row is
/// paired when a delete newer than it is left; from the oldest, a delete
/// is paired when a row older than it is left.
pub fn pair(items: &[PairItem]) -> Vec<bool> {
    let mut matched = vec![false; items.len()];
    let mut order: Vec<usize> = (0..items.len()).collect();
    // Rows: newest first; at one position a row before a delete (not
    // older than it).
    order.sort_by(|&a, &b| {
        let (x, y) = (&items[a], &items[b]);
        (&x.content, std::cmp::Reverse(x.position), x.newer, &x.id).cmp(&(
            &y.content,
            std::cmp::Reverse(y.position),
            y.newer,
            &y.id,
        ))
    });
    scan(items, &order, false, &mut matched);
    // Deletes: oldest first; at one position a delete before a row.
    order.sort_by(|&a, &b| {
        let (x, y) = (&items[a], &items[b]);
        (&x.content, x.position, !x.newer, &x.id).cmp(&(&y.content, y.position, !y.newer, &y.id))
    });
    scan(items, &order, true, &mut matched);
    matched
}

/// One scan of [`pair`]: items of side `newer` are paired when the running
/// balance (the other side counts up, this side down) does not reach a new
/// low below zero.
fn scan(items: &[PairItem], order: &[usize], newer: bool, matched: &mut [bool]) {
    let mut content: Option<&str> = None;
    let (mut sum, mut low) = (0i64, 0i64);
    for &i in order {
        let item = &items[i];
        if content != Some(item.content.as_str()) {
            content = Some(&item.content);
            (sum, low) = (0, 0);
        }
        sum += if item.newer == newer { -1 } else { 1 };
        if item.newer == newer && sum >= low {
            matched[i] = true;
        }
        low = low.min(sum);
    }
}

/// What [`statements`] needs to know of a destination.
#[derive(Debug, Clone, Copy)]
pub struct KeylessSql<'a> {
    /// Quoting of names and strings.
    pub quoting: Quoting,
    /// The destination table, quoted.
    pub table: &'a str,
    /// Its name in the deleted-rows table.
    pub name: &'a str,
    /// The deleted-rows table, quoted.
    pub deleted: &'a str,
    /// The batch's staged rows: a table or a parenthesized `SELECT` with
    /// the source's columns, [`DELETE_COLUMN`], [`KEY_COLUMN`] (the content
    /// key), [`ROW_COLUMN`] and the position columns.
    pub source: &'a str,
    /// The staged source columns: each one's quoted name in the
    /// destination, and its value in a staged row `s` (`s."a"`, or a
    /// conversion of it where staging holds another type).
    pub columns: &'a [(String, String)],
    /// The current timestamp (`now()`, `CURRENT_TIMESTAMP()`).
    pub now: &'a str,
}

/// The statements that apply a staged batch of a keyless table, in order,
/// each reading what those before it wrote (no statement relies on
/// another's uncommitted state but through the tables):
///
/// 1. inserts that a pending delete of their content (newer than them)
///    takes: `+<insert>` and `-<delete>` entries;
/// 2. the pending deletes so taken removed;
/// 3. the other inserts, not applied before (no row of their record, no
///    `+` entry) and not older than the table-wide entry, written;
/// 4. deletes not applied before, not older than the table-wide entry,
///    paired with the rows of their content: `-<delete>` and `+<row>`
///    entries for each pair, a pending entry for each delete left;
/// 5. the rows so paired removed.
pub fn statements(k: &KeylessSql<'_>, inserts: bool, deletes: bool) -> Vec<String> {
    let q = k.quoting;
    let ident = q.ident;
    let lit = q.string;
    let (kc, rc, dc) = (ident(KEY_COLUMN), ident(ROW_COLUMN), ident(DELETE_COLUMN));
    let (c, i) = q.positions("");
    let (sc, si) = q.positions("s.");
    let (xc, xi) = q.positions("x.");
    let name = lit(k.name);
    let pending = lit(&pending_table(k.name));
    let (deleted, table, source, now) = (k.deleted, k.table, k.source, k.now);
    let older_than_table = format!(
        "EXISTS (SELECT 1 FROM {deleted} AS x WHERE x.dest_table = {name} AND x.row_key = {whole} AND {older})",
        whole = lit(TABLE_ROW_KEY),
        older = position_before(PositionSyntax::Expanded, (&sc, &si), (&xc, &xi), false),
    );
    let entry = |namespace: &str, row_key: String| {
        format!("EXISTS (SELECT 1 FROM {deleted} AS x WHERE x.dest_table = {namespace} AND x.row_key = {row_key})")
    };
    let plus = lit("+");
    let minus = lit("-");
    let slash = lit("/");
    let insert = format!(
        "NOT s.{dc} AND NOT EXISTS (SELECT 1 FROM {table} AS t WHERE t.{kc} = s.{kc} AND t.{rc} = s.{rc}) \
         AND NOT {} AND NOT {older_than_table}",
        entry(&name, format!("{plus} || s.{rc}")),
    );
    let delete = format!(
        "s.{dc} AND NOT {} AND NOT {} AND NOT {older_than_table}",
        entry(&name, format!("{minus} || s.{rc}")),
        entry(&pending, format!("s.{kc} || {slash} || s.{rc}")),
    );
    let content_of = |e: &str| format!("SUBSTR({e}, 1, {CONTENT_KEY_LEN})");
    let record_of = |e: &str| format!("SUBSTR({e}, {})", CONTENT_KEY_LEN + 2);
    let entries = format!("INSERT INTO {deleted} (dest_table, row_key, {c}, {i}, deleted_at)");
    let mut out = Vec::new();
    if inserts {
        let ev = format!(
            "SELECT s.{kc} AS p_g, {sc} AS p_c, {si} AS p_i, 1 AS p_side, s.{rc} AS p_id FROM {source} AS s \
             WHERE {insert} AND EXISTS (SELECT 1 FROM {deleted} AS x WHERE x.dest_table = {pending} \
             AND {} = s.{kc}) \
             UNION ALL SELECT {}, {xc}, {xi}, 0, {} FROM {deleted} AS x WHERE x.dest_table = {pending} \
             AND {} IN (SELECT s.{kc} FROM {source} AS s WHERE NOT s.{dc})",
            content_of("x.row_key"),
            content_of("x.row_key"),
            record_of("x.row_key"),
            content_of("x.row_key"),
        );
        out.push(format!(
            "{entries} SELECT {name}, CASE WHEN p.p_side = 1 THEN {plus} ELSE {minus} END || p.p_id, p.p_c, p.p_i, \
             {now} FROM ({}) AS p WHERE p.p_matched",
            pairing_sql(&ev)
        ));
        out.push(format!(
            "DELETE FROM {deleted} WHERE dest_table = {pending} AND {minus} || {} IN \
             (SELECT x.row_key FROM {deleted} AS x WHERE x.dest_table = {name})",
            record_of("row_key"),
        ));
        let bookkeeping = [c.clone(), i.clone(), kc.clone(), rc.clone()];
        let cols: Vec<&str> = k
            .columns
            .iter()
            .map(|(n, _)| n.as_str())
            .chain(bookkeeping.iter().map(String::as_str))
            .collect();
        let values: Vec<String> = k
            .columns
            .iter()
            .map(|(_, v)| v.clone())
            .chain(bookkeeping.iter().map(|n| format!("s.{n}")))
            .collect();
        out.push(format!(
            "INSERT INTO {table} ({}) SELECT {} FROM {source} AS s WHERE {insert}",
            cols.join(", "),
            values.join(", ")
        ));
    }
    if deletes {
        let (tc, ti) = q.positions("t.");
        let ev = format!(
            "SELECT s.{kc} AS p_g, {sc} AS p_c, {si} AS p_i, 0 AS p_side, s.{rc} AS p_id FROM {source} AS s \
             WHERE {delete} \
             UNION ALL SELECT t.{kc}, {tc}, {ti}, 1, t.{rc} FROM {table} AS t \
             WHERE t.{kc} IN (SELECT s.{kc} FROM {source} AS s WHERE {delete})"
        );
        out.push(format!(
            "{entries} SELECT CASE WHEN p.p_side = 0 AND NOT p.p_matched THEN {pending} ELSE {name} END, \
             CASE WHEN p.p_side = 1 THEN {plus} || p.p_id WHEN p.p_matched THEN {minus} || p.p_id \
             ELSE p.p_g || {slash} || p.p_id END, p.p_c, p.p_i, {now} FROM ({}) AS p \
             WHERE p.p_side = 0 OR p.p_matched",
            pairing_sql(&ev)
        ));
        out.push(format!(
            "DELETE FROM {table} WHERE {kc} IN (SELECT s.{kc} FROM {source} AS s WHERE s.{dc}) \
             AND {plus} || {rc} IN (SELECT x.row_key FROM {deleted} AS x WHERE x.dest_table = {name})"
        ));
    }
    out
}

/// [`statements`] for destination table `dest` (quoted: `table`), staged
/// rows `source` with `columns`, in a dialect's `quoting` and `now`.
#[allow(clippy::too_many_arguments)]
pub fn statements_for(
    quoting: Quoting,
    dest: &impl std::fmt::Display,
    table: &str,
    deleted: &str,
    source: &str,
    columns: &[(String, String)],
    now: &str,
    (inserts, deletes): (bool, bool),
) -> Vec<String> {
    let name = dest.to_string();
    let k = KeylessSql {
        quoting,
        table,
        name: &name,
        deleted,
        source,
        columns,
        now,
    };
    statements(&k, inserts, deletes)
}

/// How many rows of `table` (quoted) have a position not forgotten: a
/// table made anew when its source table gained or lost its key must have
/// none (see `schema::key_changed`).
pub fn current_rows_sql(quoting: Quoting, table: &str) -> String {
    let (c, i) = quoting.positions("");
    let (fc, fi) = FORGOTTEN_POSITION;
    format!("SELECT COUNT(*) FROM {table} WHERE {c} <> {fc} OR {i} <> {fi}")
}

/// [`pair`] in SQL, over `items` (a `SELECT` of `p_g` the content key,
/// `p_c`, `p_i` the position, `p_side` 1 for a row or an insert and 0 for a
/// delete, `p_id` the record): the same columns and `p_matched`. Window
/// functions only (PostgreSQL, BigQuery, Snowflake, Redshift alike).
pub fn pairing_sql(items: &str) -> String {
    let newest = "PARTITION BY p_g ORDER BY p_c DESC, p_i DESC, p_side DESC, p_id";
    let oldest = "PARTITION BY p_g ORDER BY p_c, p_i, p_side, p_id";
    let upto = "ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW";
    let before = "ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING";
    format!(
        "SELECT p_g, p_c, p_i, p_side, p_id, CASE WHEN p_side = 1 THEN r_row >= LEAST(0, COALESCE(l_row, 0)) \
         ELSE r_del >= LEAST(0, COALESCE(l_del, 0)) END AS p_matched FROM \
         (SELECT w.*, MIN(r_row) OVER ({newest} {before}) AS l_row, MIN(r_del) OVER ({oldest} {before}) AS l_del FROM \
         (SELECT e.*, SUM(CASE WHEN p_side = 0 THEN 1 ELSE -1 END) OVER ({newest} {upto}) AS r_row, \
         SUM(CASE WHEN p_side = 1 THEN 1 ELSE -1 END) OVER ({oldest} {upto}) AS r_del FROM ({items}) AS e) AS w) AS v"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use tributary_schemas::{Column, DataType, TableId};

    fn item(content: &str, commit: i64, newer: bool, id: &str) -> PairItem {
        PairItem {
            content: content.into(),
            position: (commit, 0),
            newer,
            id: id.into(),
        }
    }

    #[test]
    fn each_delete_takes_one_older_row_as_many_as_can_be() {
        // Rows at 3 and 10; deletes at 2, 11, 12: the delete at 2 finds
        // nothing older, the two others take both rows.
        let items = [
            item("a", 3, false, "r3"),
            item("a", 10, false, "r10"),
            item("a", 2, true, "d2"),
            item("a", 11, true, "d11"),
            item("a", 12, true, "d12"),
        ];
        assert_eq!(pair(&items), vec![true, true, false, true, true]);
        // A row at the delete's own position is not older than it.
        let items = [item("a", 5, false, "r"), item("a", 5, true, "d")];
        assert_eq!(pair(&items), vec![false, false]);
        // Contents pair apart.
        let items = [item("a", 1, false, "r"), item("b", 5, true, "d")];
        assert_eq!(pair(&items), vec![false, false]);
        // Two equal rows, one delete: one row goes.
        let items = [
            item("a", 1, false, "r1"),
            item("a", 1, false, "r2"),
            item("a", 5, true, "d"),
        ];
        assert_eq!(pair(&items).iter().filter(|m| **m).count(), 2);
    }

    #[test]
    fn content_keys_are_equal_for_equal_rows_and_keep_across_an_added_null_column() {
        let schema = TableSchema {
            id: TableId::new("s", "t"),
            columns: vec![
                Column::new("a", DataType::Int32, true),
                Column::new("b", DataType::Text, true),
            ],
            key: Vec::new(),
            dropped: Vec::new(),
        };
        let one = content_key(&schema, &[Value::Int32(1), Value::Text("x".into())]).unwrap();
        assert_eq!(one.len(), CONTENT_KEY_LEN);
        assert_eq!(one, content_key(&schema, &[Value::Int64(1), Value::Text("x".into())]).unwrap());
        assert_eq!(one, content_key(&schema, &[Value::Int32(1), Value::Text("x".into()), Value::Null]).unwrap());
        // NULL is not the empty text; NULLs in the middle count.
        let null = content_key(&schema, &[Value::Null, Value::Text("x".into())]).unwrap();
        let empty = content_key(&schema, &[Value::Text(String::new()), Value::Text("x".into())]).unwrap();
        assert_ne!(null, empty);
        assert_ne!(content_key(&schema, &[Value::Null, Value::Null]).unwrap(), empty);
        assert_eq!(split_pending(&pending_key(&one, "t:0:5")), Some((one.as_str(), "t:0:5")));
    }

    #[test]
    fn the_statements_read_the_staged_rows_and_name_the_entries() {
        let quoting = Quoting {
            ident: |n| format!("\"{n}\""),
            string: |s| format!("'{}'", s.replace('\'', "''")),
        };
        let columns = vec![("\"a\"".to_string(), "s.\"a\"".to_string())];
        let k = KeylessSql {
            quoting,
            table: "\"s\".\"t\"",
            name: "s.t",
            deleted: "tributary.deleted_rows",
            source: "stage",
            columns: &columns,
            now: "now()",
        };
        let all = statements(&k, true, true);
        assert_eq!(all.len(), 5);
        assert!(all[0].contains("'s.t (pending deletes)'"), "{}", all[0]);
        assert!(all[2].starts_with("INSERT INTO \"s\".\"t\" (\"a\", \"__tributary_commit\""), "{}", all[2]);
        assert!(all[4].starts_with("DELETE FROM \"s\".\"t\" WHERE"), "{}", all[4]);
        assert_eq!(statements(&k, false, true).len(), 2);
    }
}
