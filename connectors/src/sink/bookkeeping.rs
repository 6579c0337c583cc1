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

/// Whether `column` is one of the sink's own columns, which the source never
/// sends and a schema change never touches.
pub fn is_bookkeeping(column: &str) -> bool {
    POSITION_COLUMNS.contains(&column)
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
