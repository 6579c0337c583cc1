//! What every warehouse sink keeps beside the copied rows, under the same
//! names everywhere (see `docs/CONTRACTS.md`): the position columns of each
//! destination row, the staging columns, and the offsets table.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};

use tributary_schemas::Position;

use crate::error::{Error, Result};

/// Schema (PostgreSQL, Redshift) or dataset (BigQuery) of the sink's own
/// tables, unless configured otherwise.
pub const BOOKKEEPING_SCHEMA: &str = "tributary";
/// The offsets table: `(consumer_group, topic, partition) -> next_offset`,
/// written in the same transaction as the rows it covers.
pub const OFFSETS_TABLE: &str = "offsets";
/// The deleted-rows table: `(destination table, row key) -> position` of
/// the newest delete of each key (and, under [`TABLE_ROW_KEY`], of the
/// newest truncate or copy of the table), so that an older change arriving
/// later (a member that lost its partition, an old key's events on another
/// partition, a replayed dead letter) cannot bring a deleted row back. A
/// key's entry goes when a newer change writes the row again, the others
/// after the sink's `deleted_rows_retention_hours`.
pub const DELETED_TABLE: &str = "deleted_rows";
/// The row key under which the deleted-rows table keeps a table-wide
/// removal (a truncate, a copy): no key renders empty ([`key_text`]).
pub const TABLE_ROW_KEY: &str = "";
/// Staging column holding a row's key as [`key_text`] renders it; in a
/// table without a key (see [`super::keyless`]) also a column of the
/// destination table, holding each row's content key.
pub const KEY_COLUMN: &str = "__tributary_key";
/// Column of a destination table without a key (see [`super::keyless`])
/// and of its staging: the name of the row, the Kafka record that wrote it.
pub const ROW_COLUMN: &str = "__tributary_row";
/// How long a deleted row's entry is kept unless configured otherwise: a
/// change older than a delete that arrives later than this may bring the
/// row back (Kafka's own `delete.retention.ms` for tombstones is one day).
pub const DEFAULT_DELETED_ROWS_RETENTION_HOURS: u64 = 168;
/// How often a sink removes expired deleted-row entries.
pub const DELETED_ROWS_PRUNE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(600);
/// The resets table: `destination table -> the last reset applied to it`
/// (see `Warehouse::forget_positions`), written in the same unit.
pub const RESETS_TABLE: &str = "resets";
/// The stored position of a row whose position was forgotten: older than
/// any change (sources' positions are unsigned).
pub const FORGOTTEN_POSITION: (i64, i64) = (-1, -1);
/// A reset's id as destinations store it (a signed 64-bit integer); an id
/// beyond it is a permanent error of its record.
pub fn reset_i64(reset: u64) -> Result<i64> {
    i64::try_from(reset).map_err(|_| {
        Error::permanent(format!("a table-reset record's id {reset} does not fit a signed 64-bit integer"))
            .with_class("tributary.reset")
    })
}
/// Column holding `Position::commit` of the event that last wrote a row.
pub const COMMIT_COLUMN: &str = "__tributary_commit";
/// Column holding `Position::index` of the event that last wrote a row.
pub const INDEX_COLUMN: &str = "__tributary_index";
/// Staging column telling a delete (true) from an upsert (false).
pub const DELETE_COLUMN: &str = "__tributary_delete";
/// The two position columns every destination table carries.
pub const POSITION_COLUMNS: [&str; 2] = [COMMIT_COLUMN, INDEX_COLUMN];

/// The columns a destination table without a key carries besides the
/// position columns (see [`super::keyless`]).
pub const KEYLESS_COLUMNS: [&str; 2] = [KEY_COLUMN, ROW_COLUMN];

/// Whether `column` is one of the sink's own columns, which the source never
/// sends and a schema change never touches.
pub fn is_bookkeeping(column: &str) -> bool {
    POSITION_COLUMNS.contains(&column) || KEYLESS_COLUMNS.contains(&column)
}

/// A position as the two signed 64-bit integers destinations store (none of
/// them has an unsigned 64-bit type). A position beyond them is a permanent
/// error of its record.
pub fn position_i64(p: Position) -> Result<(i64, i64)> {
    let out_of_range = || {
        Error::permanent("the event's position does not fit a signed 64-bit integer").with_class("tributary.position")
    };
    let commit = i64::try_from(p.commit).map_err(|_| out_of_range())?;
    let index = i64::try_from(p.index).map_err(|_| out_of_range())?;
    Ok((commit, index))
}

/// Whether a truncate or copy at `at` keeps a table-wide deleted-rows
/// entry. An empty copy's `table-copied` record carries the greatest
/// position (every row is older). An entry there would keep out for good
/// any row of that copy that reached the topic after it: the PostgreSQL
/// source sent it so until 2026-12-03 (it marked a table done before giving
/// out its last chunk; `SnapshotTableProgress::done` now says otherwise).
/// None is kept, in case a source gets that wrong again.
pub fn keeps_removal(at: Position) -> bool {
    at.commit < i64::MAX.unsigned_abs()
}

/// A row key as the deleted-rows table stores it: the core's key bytes
/// ([`super::reduce::key_bytes`]: every key value's text, length-prefixed)
/// in hex. Never empty, and the same for a key column widened by a schema
/// change.
pub fn key_text(key_bytes: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(key_bytes.len() * 2);
    for b in key_bytes {
        out.push(HEX[usize::from(b >> 4)] as char);
        out.push(HEX[usize::from(b & 15)] as char);
    }
    out
}

/// What the stored offset of a partition must be for a batch to commit:
/// the offset this runner last read or wrote for it. Another runner that
/// took the partition over and committed since (or an operator who moved
/// it) makes the batch fail as [`fenced`], so a member that lost a
/// partition can never write for it, nor move its offset backwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fence {
    /// Not checked (`sink-runner replay`, tests of one sink alone).
    Unchecked,
    /// No offset may be stored yet.
    Absent,
    /// The stored offset must be this one.
    At(i64),
}

/// One partition's offset move in a batch's unit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetMove<'a> {
    /// Topic.
    pub topic: &'a str,
    /// Partition.
    pub partition: i32,
    /// What must be stored now.
    pub fence: Fence,
    /// What is stored after the batch.
    pub next: i64,
}

/// The offset moves of a batch: each next offset with the fence its
/// partition has in `expected` (unchecked where it has none).
pub fn offset_moves<'a>(
    next: &'a [(String, i32, i64)],
    expected: &[(String, i32, Option<i64>)],
) -> Vec<OffsetMove<'a>> {
    next.iter()
        .map(|(topic, partition, next)| {
            let fence = expected
                .iter()
                .find(|(t, p, _)| t == topic && p == partition)
                .map_or(Fence::Unchecked, |(_, _, at)| at.map_or(Fence::Absent, Fence::At));
            OffsetMove { topic, partition: *partition, fence, next: *next }
        })
        .collect()
}

/// The class of [`fenced`] errors; dialects that raise it from SQL put it
/// in the message, where [`is_fenced_message`] finds it.
pub const FENCED_CLASS: &str = "tributary.fenced";

/// Whether a destination's error message is the fence's own.
pub fn is_fenced_message(message: &str) -> bool {
    message.contains(FENCED_CLASS)
}

/// The error of a batch whose partitions' stored offsets are not what its
/// runner expected: retryable, and the runner reads the stored offsets
/// again before anything else of those partitions.
pub fn fenced(detail: &str) -> Error {
    Error::retryable(format!(
        "the stored offsets moved under this sink runner ({detail}): another runner of the consumer group \
         took the partition over, or an operator changed the offsets; nothing of the batch was written"
    ))
    .with_class(FENCED_CLASS)
}

/// How a dialect compares the stored position of a row with another one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PositionSyntax {
    /// `(a, b) < (c, d)`: PostgreSQL's row comparison.
    RowValue,
    /// `(a < c OR (a = c AND b < d))`: for dialects without row comparison.
    Expanded,
}

/// The position guard: `left < right` (or `<=` when `or_equal`), where each
/// side is the `(commit, index)` column pair behind a table alias (`t.`,
/// `s.`, or `""`) or two literals.
pub fn position_before(syntax: PositionSyntax, left: (&str, &str), right: (&str, &str), or_equal: bool) -> String {
    let op = if or_equal { "<=" } else { "<" };
    match syntax {
        PositionSyntax::RowValue => format!("({}, {}) {op} ({}, {})", left.0, left.1, right.0, right.1),
        PositionSyntax::Expanded => format!(
            "({lc} < {rc} OR ({lc} = {rc} AND {li} {op} {ri}))",
            lc = left.0,
            li = left.1,
            rc = right.0,
            ri = right.1
        ),
    }
}

/// How a dialect quotes names and strings: what the deleted-rows and reset
/// statements that dialects without row comparison (BigQuery, Snowflake)
/// share need.
#[derive(Debug, Clone, Copy)]
pub struct Quoting {
    /// A quoted identifier.
    pub ident: fn(&str) -> String,
    /// A string literal.
    pub string: fn(&str) -> String,
}

impl Quoting {
    /// The position column pair behind a table alias (`t.`, `s.`, or `""`).
    pub fn positions(&self, alias: &str) -> (String, String) {
        (format!("{alias}{}", (self.ident)(COMMIT_COLUMN)), format!("{alias}{}", (self.ident)(INDEX_COLUMN)))
    }

    /// A staged batch (`source`) without the upserts that are not newer
    /// than their key's deleted-rows entry, or older than the table-wide
    /// one. Two anti-joins, each on an equality, not one with `OR` (which
    /// leaves the engine nothing to join on but every pair: see the
    /// PostgreSQL sink's `merge_sql`).
    pub fn not_deleted_sql(&self, deleted: &str, dest: &impl std::fmt::Display, source: &str) -> String {
        let (dc, di) = self.positions("d.");
        let (sc, si) = self.positions("s.");
        format!(
            "(SELECT s.* FROM {source} AS s WHERE s.{del} OR (NOT EXISTS (SELECT 1 FROM {deleted} AS d \
             WHERE d.dest_table = {name} AND d.row_key = s.{k} AND {removed}) AND NOT EXISTS (SELECT 1 FROM {deleted} AS d \
             WHERE d.dest_table = {name} AND d.row_key = {whole} AND {removed_table})))",
            del = (self.ident)(DELETE_COLUMN),
            k = (self.ident)(KEY_COLUMN),
            name = (self.string)(&dest.to_string()),
            whole = (self.string)(TABLE_ROW_KEY),
            removed = position_before(PositionSyntax::Expanded, (&sc, &si), (&dc, &di), true),
            // A row at the table-wide entry's own position is the copy's (see
            // `sink::memory`): only older ones stay out.
            removed_table = position_before(PositionSyntax::Expanded, (&sc, &si), (&dc, &di), false),
        )
    }

    /// Forgets every row's position of `dest` (its quoted name `table`
    /// when it exists; else there is no row) unless the resets table
    /// `resets` already holds reset `reset` (or a later one) of it, drops
    /// its deleted-rows entries (in `deleted`) likewise, then records
    /// `reset`: statements of the batch's transaction, in the order
    /// `syntax` says.
    pub fn forget_positions_sql(
        &self,
        syntax: ResetSyntax,
        dest: &impl std::fmt::Display,
        table: Option<&str>,
        resets: &str,
        deleted: &str,
        reset: i64,
    ) -> Vec<String> {
        let d = (self.string)(&dest.to_string());
        let taken = format!("EXISTS (SELECT 1 FROM {resets} WHERE destination = {d} AND reset >= {reset})");
        // (Not a MERGE: BigQuery's sink counts its MERGEs as row writes.)
        let mut older = Some(format!("DELETE FROM {resets} WHERE destination = {d} AND reset < {reset}"));
        let mut out = Vec::new();
        if syntax.resets_first {
            out.extend(older.take());
        }
        if let Some(table) = table {
            let (c, i) = self.positions("");
            let (commit, index) = FORGOTTEN_POSITION;
            out.push(format!("UPDATE {table} SET {c} = {commit}, {i} = {index} WHERE NOT {taken}"));
        }
        // Deleted rows' entries hold positions of the old domain: they would
        // keep the copy's rows out.
        let pending = (self.string)(&super::keyless::pending_table(&dest.to_string()));
        out.push(format!("DELETE FROM {deleted} WHERE dest_table IN ({d}, {pending}) AND NOT {taken}"));
        out.extend(older);
        out.push(format!(
            "INSERT INTO {resets} (destination, reset) SELECT {d}, {reset} {}WHERE NOT EXISTS \
             (SELECT 1 FROM {resets} WHERE destination = {d})",
            syntax.constants_from
        ));
        out
    }

    /// Removes every entry of destination table `dest` from the deleted-rows
    /// table `deleted`, its pending deletes too (see [`super::keyless`]):
    /// the table was dropped, or its copy deleted.
    pub fn forget_deleted_sql(&self, deleted: &str, dest: &impl std::fmt::Display) -> String {
        let name = dest.to_string();
        format!(
            "DELETE FROM {deleted} WHERE dest_table IN ({}, {})",
            (self.string)(&name),
            (self.string)(&super::keyless::pending_table(&name))
        )
    }

    /// Removes the deleted-rows entries of keys a staged upsert (`source`)
    /// wrote again, newer.
    pub fn undeleted_sql(&self, deleted: &str, dest: &impl std::fmt::Display, source: &str) -> String {
        let (dc, di) = self.positions("d.");
        let (sc, si) = self.positions("s.");
        format!(
            "DELETE FROM {deleted} AS d WHERE d.dest_table = {name} AND EXISTS (SELECT 1 FROM {source} AS s \
             WHERE NOT s.{del} AND s.{k} = d.row_key AND {older})",
            del = (self.ident)(DELETE_COLUMN),
            k = (self.ident)(KEY_COLUMN),
            name = (self.string)(&dest.to_string()),
            older = position_before(PositionSyntax::Expanded, (&dc, &di), (&sc, &si), false),
        )
    }
}

/// How a dialect's reset statements ([`Quoting::forget_positions_sql`])
/// differ.
#[derive(Debug, Clone, Copy)]
pub struct ResetSyntax {
    /// Whether the table's older entry in the resets table is deleted
    /// first, before the rows' positions are forgotten, rather than last,
    /// beside the insert. First where a write waits for another member's
    /// transaction that wrote the same row (Snowflake): the statements
    /// after it then begin after that commit and see its reset.
    pub resets_first: bool,
    /// What a `SELECT` of constants needs before its `WHERE`, with a
    /// trailing space (BigQuery: `FROM (SELECT 1) `), or nothing.
    pub constants_from: &'static str,
}

/// A staging table's name: `prefix` and a hash of the destination table and
/// its column set, so that a schema change gets a fresh staging table and
/// never an `ALTER`.
pub fn staging_name(prefix: &str, destination: &impl Hash, columns: &impl Hash) -> String {
    let mut h = DefaultHasher::new();
    destination.hash(&mut h);
    columns.hash(&mut h);
    format!("{prefix}{:016x}", h.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_beyond_i64_are_permanent() {
        assert_eq!(position_i64(Position { commit: 7, index: 2 }).unwrap(), (7, 2));
        let e = position_i64(Position { commit: u64::MAX, index: 0 }).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Permanent);
        assert_eq!(e.class(), "tributary.position");
    }

    #[test]
    fn key_texts_are_hex_and_never_empty() {
        assert_eq!(key_text(&[0, 1, 0xab]), "0001ab");
        // Every key value is length-prefixed: no key renders as the
        // table-wide entry's key.
        assert_ne!(key_text(&0u64.to_le_bytes()), TABLE_ROW_KEY);
    }

    #[test]
    fn offset_moves_take_the_fence_of_their_partition() {
        let next = vec![
            ("t".to_string(), 0, 10),
            ("t".to_string(), 1, 5),
            ("u".to_string(), 0, 3),
        ];
        let expected = vec![("t".to_string(), 0, Some(7)), ("t".to_string(), 1, None)];
        let moves = offset_moves(&next, &expected);
        assert_eq!(
            moves.iter().map(|m| m.fence).collect::<Vec<_>>(),
            vec![Fence::At(7), Fence::Absent, Fence::Unchecked]
        );
        assert_eq!(fenced("x").class(), FENCED_CLASS);
        assert!(is_fenced_message("invalid input syntax for type integer: \"tributary.fenced: 1 of 2\""));
    }

    #[test]
    fn guards_in_both_syntaxes() {
        assert_eq!(
            position_before(PositionSyntax::RowValue, ("t.c", "t.i"), ("s.c", "s.i"), false),
            "(t.c, t.i) < (s.c, s.i)"
        );
        assert_eq!(
            position_before(PositionSyntax::Expanded, ("t.c", "t.i"), ("5", "2"), true),
            "(t.c < 5 OR (t.c = 5 AND t.i <= 2))"
        );
    }
}
