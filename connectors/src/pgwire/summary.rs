//! A verify range summed by PostgreSQL itself (`[verify] method =
//! "summary"`, see docs/verification.md): the count of the range's rows
//! and the sum of a 64-bit hash of each row, computed in SQL so that no
//! row leaves the database. Defined once here, for the PostgreSQL source
//! that sends a summary and the PostgreSQL sink that computes the same over
//! its rows: the same SQL over columns of the same types gives the same
//! hashes for the same values.

/// Each row hashed by PostgreSQL's own extended hash of a record
/// (`hash_record_extended`, from PostgreSQL 14 on): each column's type's
/// hash, equal for values its equality calls equal (numbers by value, JSONB
/// by content), stable across versions (hash partitioning depends on it)
/// on servers of one byte order. About twice as fast as printing the row;
/// a table with a column type without an extended hash (`json`, `xml`,
/// `point`) uses [`ROW_TEXT`].
pub const RECORD_HASH: &str = "postgresql-record-hash-1";

/// Each row's text (`ROW(...)::text`) hashed (`hashtextextended`), under
/// [`SETTINGS`]: every type, from PostgreSQL 13 on (a float prints as its
/// shortest exact text from 12 on, `trim_scale` is from 13).
pub const ROW_TEXT: &str = "postgresql-row-text-1";

/// The settings the row texts are printed under, set for the transaction
/// on both sides (the source's sessions pin the same, see the source's
/// `SESSION_OPTIONS`): dates, times, intervals, bytes, floats and money
/// print alike whatever each server's defaults.
pub const SETTINGS: &str = "SET LOCAL DateStyle = 'ISO, YMD'; SET LOCAL IntervalStyle = 'iso_8601'; \
     SET LOCAL TimeZone = 'UTC'; SET LOCAL bytea_output = 'hex'; SET LOCAL extra_float_digits = 3; \
     SET LOCAL lc_monetary = 'C'";

/// The oldest server that computes `method` (`server_version_num`); `None`
/// for a method this build does not know.
pub fn min_server_version(method: &str) -> Option<i32> {
    match method {
        RECORD_HASH => Some(140_000),
        ROW_TEXT => Some(130_000),
        _ => None,
    }
}

/// What column `column` (quoted) of type `source_type` (`format_type`) is
/// hashed as by `method`. By the record hash, a `json` document as `jsonb`
/// (`json` has no extended hash; its keys' order and spaces then do not
/// count, as in the rows' canonical form). By the rows' texts, a number
/// without its trailing zeros, as in the canonical form (the record hash
/// of a `numeric` ignores them already); a `json` document as it is stored
/// (the sink writes the source's text).
pub fn column_expr(method: &str, column: &str, source_type: &str) -> String {
    match source_type {
        "json" if method == RECORD_HASH => format!("{column}::jsonb"),
        "json[]" if method == RECORD_HASH => format!("{column}::jsonb[]"),
        t if method == ROW_TEXT && (t == "numeric" || t.starts_with("numeric(")) => format!("trim_scale({column})"),
        _ => column.to_string(),
    }
}

/// A range's count and hash sum by `method` ([`RECORD_HASH`] or
/// [`ROW_TEXT`]): `columns` (quoted, in the range's column order) of the
/// rows of `from` (a table) that `condition` keeps (none: all). One row:
/// `count(*)` as bigint, the sum as text.
pub fn range_sql(method: &str, from: &str, columns: &[String], condition: Option<&str>) -> String {
    let row = format!("ROW({})", columns.join(", "));
    let hash = if method == RECORD_HASH {
        format!("hash_record_extended({row}, 0)")
    } else {
        format!("hashtextextended({row}::text, 0)")
    };
    let mut sql = format!("SELECT count(*), COALESCE(sum({hash}), 0)::text FROM {from}");
    if let Some(c) = condition {
        sql.push_str(" WHERE ");
        sql.push_str(c);
    }
    sql
}

/// Whether two columns' types hash the same values alike: the same
/// `format_type` spelling.
pub fn same_types(source: &[String], destination: &[String]) -> bool {
    source.len() == destination.len() && source.iter().zip(destination).all(|(a, b)| a == b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_is_counted_and_summed_over_its_columns() {
        let cols = vec!["\"id\"".to_string(), "\"name\"".to_string()];
        assert_eq!(
            range_sql(ROW_TEXT, "s.\"t\"", &cols, Some("(\"id\") > ('5')")),
            "SELECT count(*), COALESCE(sum(hashtextextended(ROW(\"id\", \"name\")::text, 0)), 0)::text \
             FROM s.\"t\" WHERE (\"id\") > ('5')"
        );
        assert_eq!(
            range_sql(RECORD_HASH, "t", &cols, None),
            "SELECT count(*), COALESCE(sum(hash_record_extended(ROW(\"id\", \"name\"), 0)), 0)::text FROM t"
        );
        assert_eq!(min_server_version(RECORD_HASH), Some(140_000));
        assert_eq!(column_expr(RECORD_HASH, "\"j\"", "json"), "\"j\"::jsonb");
        assert_eq!(column_expr(ROW_TEXT, "\"j\"", "json"), "\"j\"");
        assert_eq!(column_expr(ROW_TEXT, "\"n\"", "numeric(8,2)"), "trim_scale(\"n\")");
        assert_eq!(column_expr(RECORD_HASH, "\"n\"", "numeric"), "\"n\"");
        assert_eq!(column_expr(ROW_TEXT, "\"p\"", "point"), "\"p\"");
        assert_eq!(min_server_version("other"), None);
        assert!(same_types(&["integer".into()], &["integer".into()]));
        assert!(!same_types(&["json".into()], &["jsonb".into()]));
    }
}
