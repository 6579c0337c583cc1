//! The renames among the DDL statements LogMiner mines.
//!
//! A DDL row of `V$LOGMNR_CONTENTS` (`OPERATION_CODE` 5) holds in
//! `SQL_REDO` the statement as the user issued it (Oracle Database
//! Utilities, "Using LogMiner", DDL tracking: "the SQL_REDO column contains
//! the DDL statement as entered"): names quoted or not, qualified by their
//! owner or not (then the row's `SEG_OWNER` owns them). Every other DDL is
//! followed by reading the table's definition from the catalog again; a
//! rename cannot be: the catalog knows only the new name, and a column of a
//! new name read from it would be a new column, its values split from the
//! old one's downstream. The shapes (Oracle Database SQL Language
//! Reference, `ALTER TABLE` `rename_column_clause` and `RENAME TO`,
//! `RENAME`):
//!
//! ```text
//! ALTER TABLE [schema.]table RENAME COLUMN old TO new
//! ALTER TABLE [schema.]table RENAME TO new_table
//! RENAME old_table TO new_table
//! ```
//!
//! A `DROP TABLE` that moves the table to the recycle bin is mined as a
//! rename to a `BIN$` name on some versions: that is a drop (the catalog
//! no longer lists the table), not a rename.

use tributary_schemas::TableId;

use super::redo_sql::{Cursor, Token};

/// What a DDL statement does to the captured definitions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ddl {
    /// `ALTER TABLE ... RENAME COLUMN from TO to`.
    RenameColumn {
        /// The table.
        table: TableId,
        /// The old name.
        from: String,
        /// The new name.
        to: String,
    },
    /// `ALTER TABLE from RENAME TO to`, `RENAME from TO to`.
    RenameTable {
        /// The old name.
        from: TableId,
        /// The new name (same owner: a rename cannot move a table).
        to: TableId,
    },
    /// Anything else: the catalog says what it did.
    Other,
}

/// Parses `sql`, a DDL row's statement; unqualified names belong to
/// `owner` (the row's `SEG_OWNER`). Never fails: what is not a rename is
/// [`Ddl::Other`].
pub fn parse(sql: &str, owner: &str) -> Ddl {
    let Ok(mut c) = Cursor::new(sql) else { return Ddl::Other };
    parse_tokens(&mut c, owner).unwrap_or(Ddl::Other)
}

fn parse_tokens(c: &mut Cursor, owner: &str) -> Option<Ddl> {
    if c.eat_word("rename") {
        let from = name(c, owner)?;
        c.eat_word("to").then_some(())?;
        let to = name(c, &from.schema)?;
        return table_rename(from, to);
    }
    (c.eat_word("alter") && c.eat_word("table")).then_some(())?;
    let table = name(c, owner)?;
    c.eat_word("rename").then_some(())?;
    if c.eat_word("column") {
        let from = part(c)?;
        c.eat_word("to").then_some(())?;
        let to = part(c)?;
        return end(c).then_some(Ddl::RenameColumn { table, from, to });
    }
    c.eat_word("to").then_some(())?;
    // `RENAME TO` takes a bare name; a qualified one names the same owner.
    let to = name(c, &table.schema)?;
    end(c).then_some(())?;
    table_rename(table, to)
}

fn table_rename(from: TableId, to: TableId) -> Option<Ddl> {
    if to.table.starts_with("BIN$") || to.schema != from.schema {
        return None;
    }
    Some(Ddl::RenameTable { from, to })
}

/// Only a `;` may follow.
fn end(c: &mut Cursor) -> bool {
    c.eat_punct(";");
    c.peek().is_none()
}

/// One name part: quoted as is, bare upper-cased.
fn part(c: &mut Cursor) -> Option<String> {
    match c.peek()? {
        Token::Word(w) if w.contains('.') => None,
        _ => c.identifier().ok(),
    }
}

/// `[schema.]table`; the tokenizer keeps a bare `app.orders` as one word.
fn name(c: &mut Cursor, owner: &str) -> Option<TableId> {
    let mut parts = Vec::new();
    loop {
        match c.peek()? {
            Token::Word(w) if w.contains('.') => {
                let w = w.to_ascii_uppercase();
                c.identifier().ok()?;
                parts.extend(w.split('.').filter(|p| !p.is_empty()).map(str::to_string));
            }
            _ => parts.push(c.identifier().ok()?),
        }
        if !c.eat_punct(".") {
            break;
        }
    }
    match parts.as_slice() {
        [t] => Some(TableId::new(owner, t)),
        [s, t] => Some(TableId::new(s, t)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn col(t: &str, from: &str, to: &str) -> Ddl {
        Ddl::RenameColumn {
            table: TableId::new("APP", t),
            from: from.into(),
            to: to.into(),
        }
    }

    fn tab(from: &str, to: &str) -> Ddl {
        Ddl::RenameTable {
            from: TableId::new("APP", from),
            to: TableId::new("APP", to),
        }
    }

    /// Statements as users type them, which LogMiner hands back as typed.
    #[test]
    fn renames_parse_in_every_spelling() {
        let cases = [
            (
                "ALTER TABLE \"APP\".\"ORDERS\" RENAME COLUMN \"NAME\" TO \"TITLE\";",
                col("ORDERS", "NAME", "TITLE"),
            ),
            ("alter table orders rename column name to title", col("ORDERS", "NAME", "TITLE")),
            ("alter table app.orders rename column \"Name\" to title;", col("ORDERS", "Name", "TITLE")),
            ("ALTER TABLE \"APP\".orders RENAME COLUMN a TO \"b c\"", col("ORDERS", "A", "b c")),
            ("alter table orders rename to orders_old;", tab("ORDERS", "ORDERS_OLD")),
            ("ALTER TABLE \"APP\".\"ORDERS\" RENAME TO \"Orders2\"", tab("ORDERS", "Orders2")),
            ("alter table app.orders rename to app.orders2", tab("ORDERS", "ORDERS2")),
            ("RENAME orders TO orders_old;", tab("ORDERS", "ORDERS_OLD")),
            ("rename \"ORDERS\" to \"X\"", tab("ORDERS", "X")),
        ];
        for (sql, want) in cases {
            assert_eq!(parse(sql, "APP"), want, "{sql}");
        }
    }

    #[test]
    fn other_statements_are_not_renames() {
        for sql in [
            "create table \"APP\".\"T\" (...);",
            "alter table \"APP\".\"T\" add \"NOTE\" VARCHAR2;",
            "ALTER TABLE t RENAME CONSTRAINT c1 TO c2",
            "drop table \"APP\".\"T\" AS \"BIN$x==$0\";",
            "ALTER TABLE \"APP\".\"T\" RENAME TO \"BIN$3A/xw==$0\"",
            "alter table a.t rename to b.t",
            "alter table t rename column a to b cascade",
            "alter table t rename column",
            "ALTER INDEX i RENAME TO j",
            "comment on table t is 'it''s %*'",
            "",
        ] {
            assert_eq!(parse(sql, "APP"), Ddl::Other, "{sql}");
        }
    }
}
