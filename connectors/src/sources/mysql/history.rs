//! The schema history: each captured table's columns as of a binlog
//! position, moved forward by the DDL statements of QUERY events (parsed
//! with `sqlparser`'s MySQL dialect).
//!
//! Row events carry values by position only, so a row written before an
//! `ALTER TABLE ... ADD COLUMN` must be decoded with the columns it had then,
//! even when it is read long after the ALTER. The history is part of the
//! checkpoint (see `docs/sources/mysql.md`): the schema stored with a binlog
//! position is exactly the schema of that position, in the same Kafka
//! transaction as the events before it, so a restart decodes every later
//! event with the right columns.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sqlparser::ast::{
    AlterTableOperation, ColumnOption, ColumnOptionDef, Expr, MySQLColumnPosition, ObjectName, ObjectType,
    RenameTableNameKind, Statement, TableConstraint,
};
use sqlparser::dialect::MySqlDialect;
use sqlparser::parser::Parser;
use tributary_schemas::TableId;

use super::rewrites::{self, AlterContext, Session};

/// One column as the history keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ColumnDef {
    /// Column name.
    pub name: String,
    /// MySQL's spelling of the type (`int(10) unsigned`, `ENUM('a', 'b')`).
    pub type_text: String,
    /// Whether NULL is allowed.
    pub nullable: bool,
    /// For a column added by `ALTER TABLE ... ADD COLUMN`: the value the
    /// rows that existed then got (see `docs/schema-changes.md`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub added_default: Option<AddedDefault>,
    /// Names the column had before (`RENAME COLUMN`, `CHANGE COLUMN`),
    /// oldest first: the schema's `Column::aliases`, so that sinks rename
    /// instead of adding an empty column. Absent in older checkpoints.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub aliases: Vec<String>,
    /// Whether the column is AUTO_INCREMENT: making a column so numbers
    /// its zeros, restating it on one that is does not. Absent in older
    /// checkpoints (read as not).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub auto_increment: bool,
}

impl ColumnDef {
    /// Renames the column, keeping `old` among its earlier names.
    fn rename(&mut self, new: &str) {
        if self.name != new {
            let old = std::mem::replace(&mut self.name, new.to_string());
            if !self.aliases.contains(&old) {
                self.aliases.push(old);
            }
        }
        // Renamed back: its own name is no alias.
        self.aliases.retain(|a| a != new);
    }
}

/// The value rows older than an added column got.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AddedDefault {
    /// The column's constant `DEFAULT`, in MySQL's text form.
    Literal(String),
    /// A NOT NULL column without `DEFAULT`: MySQL gives old rows the type's
    /// implicit default (`0`, `''`, the first enum label).
    Implicit,
}

/// One table as the history keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct TableDef {
    /// Columns in ordinal order: the order of values in row events.
    pub columns: Vec<ColumnDef>,
    /// Primary key columns in key order (empty without one).
    pub primary_key: Vec<String>,
}

impl TableDef {
    /// This definition (from the catalog) with the earlier column names
    /// `known` (the history) has for columns of the same name.
    pub fn with_aliases_from(&self, known: &TableDef) -> TableDef {
        let mut def = self.clone();
        for c in &mut def.columns {
            if let Some(k) = known.columns.iter().find(|k| k.name == c.name) {
                c.aliases = k.aliases.clone();
            }
        }
        def
    }
}

/// What a DDL statement did to the tables the history knows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DdlEffect {
    /// A table was created (its definition is in the history).
    Created(TableId),
    /// A table's columns or key changed.
    Altered(TableId),
    /// A table was dropped.
    Dropped(TableId),
    /// A table was renamed: `from` is gone, `to` exists.
    Renamed {
        /// Old name.
        from: TableId,
        /// New name.
        to: TableId,
    },
    /// A table was truncated.
    Truncated(TableId),
    /// The statement may have changed the values of rows the binlog holds
    /// no change for (see `rewrites`): the table is to be copied again.
    Rewritten {
        /// The table.
        table: TableId,
        /// Why, for the status and the logs (names columns and types,
        /// never values).
        reason: String,
    },
}

/// Table definitions by `database.table`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct SchemaHistory {
    tables: BTreeMap<String, StoredTable>,
}

/// One entry of the history (the model's `TableId` is not serializable).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct StoredTable {
    schema: String,
    table: String,
    def: TableDef,
}

fn key(id: &TableId) -> String {
    // Unambiguous even for names with dots.
    format!("{}\u{1f}{}", id.schema, id.table)
}

/// Why a statement could not be applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DdlError {
    /// The table concerned, when known.
    pub table: Option<TableId>,
    /// What went wrong.
    pub message: String,
}

impl SchemaHistory {
    /// The definition of `id`.
    pub fn get(&self, id: &TableId) -> Option<&TableDef> {
        self.tables.get(&key(id)).map(|t| &t.def)
    }

    /// Sets the definition of `id` (from the catalog at a known position).
    pub fn insert(&mut self, id: TableId, def: TableDef) {
        self.tables.insert(
            key(&id),
            StoredTable {
                schema: id.schema.clone(),
                table: id.table.clone(),
                def,
            },
        );
    }

    /// Forgets `id`.
    pub fn remove(&mut self, id: &TableId) -> Option<TableDef> {
        self.tables.remove(&key(id)).map(|t| t.def)
    }

    /// One record per table, by a key naming it unambiguously: how the
    /// history is kept beside the checkpoint (see `MySqlSource`'s side
    /// records), so that a checkpoint stays small whatever the tables.
    pub fn records(&self) -> BTreeMap<String, String> {
        self.tables
            .iter()
            // A struct of strings, numbers and lists always serializes.
            .map(|(k, t)| (k.clone(), serde_json::to_string(t).unwrap_or_default()))
            .collect()
    }

    /// The history from the values of [`SchemaHistory::records`].
    pub fn from_records<'a>(values: impl IntoIterator<Item = &'a String>) -> Result<Self, String> {
        let mut tables = BTreeMap::new();
        for v in values {
            let t: StoredTable = serde_json::from_str(v).map_err(|e| e.to_string())?;
            tables.insert(key(&TableId::new(t.schema.clone(), t.table.clone())), t);
        }
        Ok(Self { tables })
    }

    /// Whether it knows no table.
    pub fn is_empty(&self) -> bool {
        self.tables.is_empty()
    }

    /// How many tables it knows.
    pub fn len(&self) -> usize {
        self.tables.len()
    }

    /// Every table the history knows.
    pub fn tables(&self) -> impl Iterator<Item = TableId> + '_ {
        self.tables.values().map(|t| TableId::new(t.schema.clone(), t.table.clone()))
    }

    /// Applies the statement of a QUERY event, run with `default_db` as the
    /// current database. Statements that change no table (DML in statement
    /// format, GRANT, SET...) have no effect; `tracked` says which tables to
    /// keep a definition of (CREATE TABLE of another one is ignored).
    pub fn apply(
        &mut self,
        sql: &str,
        default_db: &str,
        tracked: &dyn Fn(&TableId) -> bool,
    ) -> Result<Vec<DdlEffect>, DdlError> {
        self.apply_in(sql, default_db, tracked, Session::default())
    }

    /// [`SchemaHistory::apply`] of a statement the binlog says `session`
    /// ran: an `ALTER TABLE` that may have changed the values of existing
    /// rows also gives a [`DdlEffect::Rewritten`] (after its other
    /// effects). An `ALTER TABLE` sqlparser cannot read whole (MariaDB's
    /// `PERSISTENT`, `ALTER ONLINE`/`IGNORE`, table options, partition
    /// maintenance, `CONVERT TO CHARACTER SET`) is read clause by clause:
    /// the clauses it reads apply, the others are judged by their words,
    /// and one not understood copies the table again (it may have changed
    /// values; the history cannot follow a column it changed).
    pub fn apply_in(
        &mut self,
        sql: &str,
        default_db: &str,
        tracked: &dyn Fn(&TableId) -> bool,
        session: Session,
    ) -> Result<Vec<DdlEffect>, DdlError> {
        let alter = alter_statement(sql);
        let normalized = alter.as_ref().map_or_else(|| sql.to_string(), |a| a.normalized.clone());
        let ctx = AlterContext {
            session,
            ignore: alter.as_ref().is_some_and(|a| a.ignore),
        };
        let mut effects = Vec::new();
        match Parser::parse_sql(&MySqlDialect {}, &normalized) {
            Ok(statements) => {
                for st in statements {
                    self.apply_one(st, default_db, tracked, &ctx, &mut effects)?;
                }
            }
            Err(e) => {
                let Some(alter) = alter else {
                    return Err(DdlError {
                        table: None,
                        message: format!("DDL statement not understood: {e}"),
                    });
                };
                self.apply_clauses(&alter, default_db, tracked, &ctx, &mut effects)?;
            }
        }
        Ok(effects)
    }

    /// An `ALTER TABLE` clause by clause (see [`SchemaHistory::apply_in`]).
    fn apply_clauses(
        &mut self,
        alter: &AlterStatement,
        default_db: &str,
        tracked: &dyn Fn(&TableId) -> bool,
        ctx: &AlterContext,
        effects: &mut Vec<DdlEffect>,
    ) -> Result<(), DdlError> {
        let Some(table) = alter.table.as_deref().map(|n| name_id(n, default_db)) else {
            return Err(DdlError {
                table: None,
                message: "ALTER TABLE without a table name".into(),
            });
        };
        if self.get(&table).is_none() {
            return Ok(());
        }
        let mut operations = Vec::new();
        let mut reasons = Vec::new();
        for clause in &alter.clauses {
            if let Some(op) = parse_clause(alter.table.as_deref().unwrap_or_default(), clause) {
                operations.push(op);
                continue;
            }
            let mut exchanged = None;
            match rewrites::unparsed_clause(clause, &mut exchanged) {
                Ok(None) => {}
                Ok(Some(reason)) => reasons.push(reason),
                Err(not_understood) => {
                    tracing::warn!(table = %table, clause = %rewrites::clause_head(clause),
                        "an ALTER TABLE clause is not understood: the table is copied again, and a column it \
                         changed is not followed by the schema history");
                    reasons.push(format!("{not_understood}: it may have changed values"));
                }
            }
            if let Some(other) = exchanged.map(|n| name_id(&n, default_db)) {
                if self.get(&other).is_some() && tracked(&other) {
                    effects.push(DdlEffect::Rewritten {
                        table: other,
                        reason: format!("EXCHANGE PARTITION with {table} swapped its rows with a partition's"),
                    });
                }
            }
        }
        self.apply_alter(table, operations, reasons, ctx, default_db, effects)
    }

    fn apply_one(
        &mut self,
        st: Statement,
        default_db: &str,
        tracked: &dyn Fn(&TableId) -> bool,
        ctx: &AlterContext,
        effects: &mut Vec<DdlEffect>,
    ) -> Result<(), DdlError> {
        let id = |name: &ObjectName| table_id(name, default_db);
        match st {
            Statement::CreateTable(ct) => {
                let table = id(&ct.name);
                if !tracked(&table) {
                    return Ok(());
                }
                if let Some(like) = ct.like.as_ref().and_then(like_name) {
                    // CREATE TABLE t LIKE s: the same columns as s.
                    let source = id(&like);
                    let def = self.get(&source).cloned().ok_or_else(|| DdlError {
                        table: Some(table.clone()),
                        message: format!("CREATE TABLE ... LIKE {source}: {source} is not in the schema history"),
                    })?;
                    self.insert(table.clone(), def);
                    effects.push(DdlEffect::Created(table));
                    return Ok(());
                }
                if ct.if_not_exists && self.get(&table).is_some() {
                    return Ok(());
                }
                let mut def = TableDef::default();
                for c in &ct.columns {
                    let (col, pk) = column_def(&c.name.value, &c.data_type.to_string(), &c.options);
                    if pk {
                        def.primary_key = vec![col.name.clone()];
                    }
                    def.columns.push(col);
                }
                for constraint in &ct.constraints {
                    if let Some(pk) = primary_key_columns(constraint) {
                        def.primary_key = pk;
                    }
                }
                mark_key_not_null(&mut def);
                self.insert(table.clone(), def);
                effects.push(DdlEffect::Created(table));
            }
            Statement::AlterTable(at) => {
                let table = id(&at.name);
                let operations = at.operations.into_iter().map(|op| (op, false)).collect();
                self.apply_alter(table, operations, Vec::new(), ctx, default_db, effects)?;
            }
            Statement::Drop { object_type: ObjectType::Table, names, .. } => {
                for name in names {
                    let table = id(&name);
                    if self.remove(&table).is_some() {
                        effects.push(DdlEffect::Dropped(table));
                    }
                }
            }
            Statement::RenameTable(renames) => {
                for r in renames {
                    let from = id(&r.old_name);
                    let to = id(&r.new_name);
                    if let Some(def) = self.remove(&from) {
                        self.insert(to.clone(), def);
                        effects.push(DdlEffect::Renamed { from, to });
                    }
                }
            }
            Statement::Truncate(t) => {
                for target in t.table_names {
                    let table = id(&target.name);
                    if self.get(&table).is_some() {
                        effects.push(DdlEffect::Truncated(table));
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }
    /// The operations of one `ALTER TABLE` of `table` (each with whether a
    /// clause said `IF [NOT] EXISTS` where sqlparser's MySQL dialect reads
    /// none), in order; `reasons` are those of clauses read by their words.
    fn apply_alter(
        &mut self,
        table: TableId,
        operations: Vec<(AlterTableOperation, bool)>,
        mut reasons: Vec<String>,
        ctx: &AlterContext,
        default_db: &str,
        effects: &mut Vec<DdlEffect>,
    ) -> Result<(), DdlError> {
        let Some(mut def) = self.get(&table).cloned() else {
            return Ok(());
        };
        let mut renamed_to = None;
        for (op, if_exists) in operations {
            if let Some(reason) = rewrites::other_operation(&op, ctx) {
                reasons.push(reason);
            }
            match op {
                AlterTableOperation::AddColumn { column_def, column_position, if_not_exists, .. } => {
                    if (if_not_exists || if_exists) && def.columns.iter().any(|c| c.name == column_def.name.value) {
                        continue;
                    }
                    reasons.extend(rewrites::added_column(&column_def));
                    let (mut col, pk) = column_def_of(&column_def);
                    if pk {
                        def.primary_key = vec![col.name.clone()];
                    }
                    col.added_default = match literal_default(&column_def.options) {
                        Some(text) => Some(AddedDefault::Literal(text)),
                        None if !col.nullable && !has_default(&column_def.options) => Some(AddedDefault::Implicit),
                        None => None,
                    };
                    insert_at(&mut def, col, column_position.as_ref(), &table)?;
                }
                AlterTableOperation::DropColumn { column_names, if_exists: drop_if_exists, .. } => {
                    for name in column_names {
                        let before = def.columns.len();
                        def.columns.retain(|c| c.name != name.value);
                        def.primary_key.retain(|k| *k != name.value);
                        if before == def.columns.len() && !(drop_if_exists || if_exists) {
                            return Err(unknown_column(&table, &name.value));
                        }
                    }
                }
                AlterTableOperation::ModifyColumn { col_name, data_type, options, column_position } => {
                    let Some(old) = def.columns.iter().find(|c| c.name == col_name.value) else {
                        if if_exists {
                            continue;
                        }
                        return Err(unknown_column(&table, &col_name.value));
                    };
                    reasons.extend(rewrites::modified_column(old, &data_type.to_string(), &options, ctx));
                    let options: Vec<ColumnOptionDef> = options
                        .into_iter()
                        .map(|option| ColumnOptionDef { name: None, option })
                        .collect();
                    let (col, _) = column_def(&col_name.value, &data_type.to_string(), &options);
                    replace_column(&mut def, &col_name.value, col, column_position.as_ref(), &table)?;
                }
                AlterTableOperation::ChangeColumn {
                    old_name,
                    new_name,
                    data_type,
                    options,
                    column_position,
                } => {
                    let Some(old) = def.columns.iter().find(|c| c.name == old_name.value) else {
                        if if_exists {
                            continue;
                        }
                        return Err(unknown_column(&table, &old_name.value));
                    };
                    reasons.extend(rewrites::modified_column(old, &data_type.to_string(), &options, ctx));
                    let options: Vec<ColumnOptionDef> = options
                        .into_iter()
                        .map(|option| ColumnOptionDef { name: None, option })
                        .collect();
                    let (col, _) = column_def(&new_name.value, &data_type.to_string(), &options);
                    replace_column(&mut def, &old_name.value, col, column_position.as_ref(), &table)?;
                    for k in &mut def.primary_key {
                        if *k == old_name.value {
                            *k = new_name.value.clone();
                        }
                    }
                }
                AlterTableOperation::RenameColumn { old_column_name, new_column_name } => {
                    let col = def
                        .columns
                        .iter_mut()
                        .find(|c| c.name == old_column_name.value)
                        .ok_or_else(|| unknown_column(&table, &old_column_name.value))?;
                    col.rename(&new_column_name.value);
                    for k in &mut def.primary_key {
                        if *k == old_column_name.value {
                            *k = new_column_name.value.clone();
                        }
                    }
                }
                AlterTableOperation::AddConstraint { constraint, .. } => {
                    if let Some(pk) = primary_key_columns(&constraint) {
                        def.primary_key = pk;
                        mark_key_not_null(&mut def);
                    }
                }
                AlterTableOperation::DropPrimaryKey { .. } => def.primary_key.clear(),
                AlterTableOperation::RenameTable { table_name } => {
                    let name = match table_name {
                        RenameTableNameKind::As(n) | RenameTableNameKind::To(n) => n,
                    };
                    renamed_to = Some(table_id(&name, default_db));
                }
                // Indexes, defaults, engine, comments: no effect on row images.
                _ => {}
            }
        }
        match renamed_to {
            // A renamed table is copied again under its new name anyway.
            Some(to) => {
                self.remove(&table);
                self.insert(to.clone(), def);
                effects.push(DdlEffect::Renamed { from: table, to });
            }
            None => {
                if self.get(&table) != Some(&def) {
                    self.insert(table.clone(), def);
                    effects.push(DdlEffect::Altered(table.clone()));
                }
                if !reasons.is_empty() {
                    effects.push(DdlEffect::Rewritten { table, reason: reasons.join("; ") });
                }
            }
        }
        Ok(())
    }
}

/// An `ALTER TABLE` statement taken apart before sqlparser reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct AlterStatement {
    /// The statement in words sqlparser reads: `ALTER ONLINE` and `ALTER
    /// IGNORE` made `ALTER`, MariaDB's `PERSISTENT` made `STORED`,
    /// `CHARSET` made `CHARACTER SET`.
    normalized: String,
    /// `ALTER IGNORE TABLE`.
    ignore: bool,
    /// The table's name as written (`db`.`t`).
    table: Option<String>,
    /// The operations, as written (split at the commas outside
    /// parentheses and quotes).
    clauses: Vec<String>,
}

/// A lexical piece of a statement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Piece {
    /// A word (keyword, bare name, number).
    Word,
    /// A quoted string or name.
    Quoted,
    /// Whitespace or a comment.
    Space,
    /// One character of anything else (`(`, `,`, `.`, `=`...).
    Other,
}

/// The pieces of `sql`, each with its byte range and its depth in
/// parentheses (a parenthesis has the depth inside it).
fn pieces(sql: &str) -> Vec<(Piece, std::ops::Range<usize>, usize)> {
    let bytes = sql.as_bytes();
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_' || b == b'$' || b >= 0x80;
    let mut out = Vec::new();
    let (mut i, mut depth) = (0usize, 0usize);
    while i < bytes.len() {
        let start = i;
        let c = bytes[i];
        let piece = if c == b'\'' || c == b'"' || c == b'`' {
            i += 1;
            while i < bytes.len() {
                let escaped = bytes[i] == b'\\' && c != b'`';
                if escaped || (bytes[i] == c && bytes.get(i + 1) == Some(&c)) {
                    i += 2;
                } else if bytes[i] == c {
                    i += 1;
                    break;
                } else {
                    i += 1;
                }
            }
            Piece::Quoted
        } else if c == b'/' && bytes.get(i + 1) == Some(&b'*') {
            i = sql[i + 2..].find("*/").map_or(bytes.len(), |e| i + 2 + e + 2);
            Piece::Space
        } else if c == b'#' || (c == b'-' && bytes.get(i + 1) == Some(&b'-')) {
            i = sql[i..].find('\n').map_or(bytes.len(), |e| i + e);
            Piece::Space
        } else if c.is_ascii_whitespace() {
            while i < bytes.len() && bytes[i].is_ascii_whitespace() {
                i += 1;
            }
            Piece::Space
        } else if word(c) {
            while i < bytes.len() && word(bytes[i]) {
                i += 1;
            }
            Piece::Word
        } else {
            i += 1;
            if c == b'(' {
                depth += 1;
            }
            Piece::Other
        };
        let end = i.min(bytes.len());
        out.push((piece, start..end, depth));
        if c == b')' && piece == Piece::Other {
            depth = depth.saturating_sub(1);
        }
        i = end;
    }
    out
}

/// `sql` taken apart when it is an `ALTER [ONLINE] [IGNORE] TABLE`.
fn alter_statement(sql: &str) -> Option<AlterStatement> {
    let is = |w: &str, k: &str| w.eq_ignore_ascii_case(k);
    let pieces = pieces(sql);
    let words: Vec<(std::ops::Range<usize>, &str)> = pieces
        .iter()
        .filter(|p| p.0 == Piece::Word)
        .map(|p| (p.1.clone(), &sql[p.1.clone()]))
        .collect();
    if !words.first().is_some_and(|(_, w)| is(w, "ALTER")) {
        return None;
    }
    let mut ignore = false;
    let mut dropped: Vec<std::ops::Range<usize>> = Vec::new();
    let mut found_table = false;
    for (range, w) in words.iter().skip(1) {
        if is(w, "ONLINE") || is(w, "IGNORE") {
            ignore |= is(w, "IGNORE");
            dropped.push(range.clone());
            continue;
        }
        found_table = is(w, "TABLE");
        break;
    }
    if !found_table {
        return None;
    }
    // The statement without ONLINE / IGNORE, with PERSISTENT and CHARSET
    // in the words sqlparser knows.
    let mut normalized = String::with_capacity(sql.len() + 16);
    let mut at = 0;
    for (range, w) in &words {
        let replacement = if dropped.contains(range) {
            ""
        } else if is(w, "PERSISTENT") {
            "STORED"
        } else if is(w, "CHARSET") {
            "CHARACTER SET"
        } else {
            continue;
        };
        normalized.push_str(&sql[at..range.start]);
        normalized.push_str(replacement);
        at = range.end;
    }
    normalized.push_str(&sql[at..]);
    // The table's name (after TABLE [IF EXISTS]: words, quoted names and
    // dots with no space between), then the clauses.
    let pn = self::pieces(&normalized);
    let mut k = pn
        .iter()
        .position(|p| p.0 == Piece::Word && is(&normalized[p.1.clone()], "TABLE"))?
        + 1;
    while let Some(p) = pn.get(k) {
        let text = &normalized[p.1.clone()];
        if p.0 == Piece::Space || (p.0 == Piece::Word && (is(text, "IF") || is(text, "EXISTS"))) {
            k += 1;
        } else {
            break;
        }
    }
    let name_start = pn.get(k)?.1.start;
    let mut name_end = name_start;
    while let Some(p) = pn.get(k) {
        let dot = p.0 == Piece::Other && &normalized[p.1.clone()] == ".";
        if p.0 == Piece::Word || p.0 == Piece::Quoted || dot {
            name_end = p.1.end;
            k += 1;
        } else {
            break;
        }
    }
    let table = normalized[name_start..name_end].to_string();
    let mut clauses = Vec::new();
    let mut start = name_end;
    for p in &pn[k..] {
        if p.0 == Piece::Other && p.2 == 0 && &normalized[p.1.clone()] == "," {
            clauses.push(normalized[start..p.1.start].to_string());
            start = p.1.end;
        }
    }
    clauses.push(normalized[start..].to_string());
    let clauses: Vec<String> = clauses
        .into_iter()
        .map(|c| c.trim().trim_end_matches(';').trim().to_string())
        .filter(|c| !c.is_empty())
        .collect();
    Some(AlterStatement {
        normalized,
        ignore,
        table: (!table.is_empty()).then_some(table),
        clauses,
    })
}

/// One clause of an `ALTER TABLE name` read by sqlparser alone, with
/// whether it said `IF [NOT] EXISTS` (which sqlparser's MySQL dialect
/// does not read after ADD, MODIFY and CHANGE).
fn parse_clause(table: &str, clause: &str) -> Option<(AlterTableOperation, bool)> {
    let one = |text: &str| -> Option<AlterTableOperation> {
        let mut statements = Parser::parse_sql(&MySqlDialect {}, &format!("ALTER TABLE {table} {text}")).ok()?;
        match statements.pop()? {
            Statement::AlterTable(mut at) if statements.is_empty() && at.operations.len() == 1 => at.operations.pop(),
            _ => None,
        }
    };
    if let Some(op) = one(clause) {
        return Some((op, false));
    }
    // ADD [COLUMN] IF NOT EXISTS, MODIFY / CHANGE / DROP [COLUMN] IF EXISTS.
    let pieces = pieces(clause);
    let words: Vec<&std::ops::Range<usize>> =
        pieces.iter().filter(|p| p.0 == Piece::Word).map(|p| &p.1).take(5).collect();
    let word = |i: usize| words.get(i).map(|r| &clause[(*r).clone()]).unwrap_or("");
    let is = |w: &str, k: &str| w.eq_ignore_ascii_case(k);
    let verb = word(0);
    if !["ADD", "MODIFY", "CHANGE", "DROP"].iter().any(|v| is(verb, v)) {
        return None;
    }
    let at = if is(word(1), "COLUMN") { 2 } else { 1 };
    let guard: &[&str] = if is(verb, "ADD") {
        &["IF", "NOT", "EXISTS"]
    } else {
        &["IF", "EXISTS"]
    };
    if !guard.iter().enumerate().all(|(k, g)| is(word(at + k), g)) {
        return None;
    }
    let (from, to) = (words.get(at)?.start, words.get(at + guard.len() - 1)?.end);
    let op = one(&format!("{}{}", &clause[..from], &clause[to..]))?;
    Some((op, true))
}

/// A table named as written (`t`, `db`.`t`, `db.t`).
fn name_id(name: &str, default_db: &str) -> TableId {
    let mut parts: Vec<String> = Vec::new();
    let (mut current, mut quoted) = (String::new(), false);
    let mut chars = name.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '`' if quoted && chars.peek() == Some(&'`') => {
                chars.next();
                current.push('`');
            }
            '`' => quoted = !quoted,
            '.' if !quoted => parts.push(std::mem::take(&mut current)),
            c => current.push(c),
        }
    }
    parts.push(current);
    match parts.as_slice() {
        [db, table] => TableId::new(db.clone(), table.clone()),
        [.., table] => TableId::new(default_db, table.clone()),
        [] => TableId::new(default_db, ""),
    }
}

fn like_name(like: &sqlparser::ast::CreateTableLikeKind) -> Option<ObjectName> {
    match like {
        sqlparser::ast::CreateTableLikeKind::Parenthesized(l) | sqlparser::ast::CreateTableLikeKind::Plain(l) => {
            Some(l.name.clone())
        }
    }
}

fn table_id(name: &ObjectName, default_db: &str) -> TableId {
    let parts: Vec<String> = name.0.iter().filter_map(|p| p.as_ident().map(|i| i.value.clone())).collect();
    match parts.as_slice() {
        [db, table] => TableId::new(db.clone(), table.clone()),
        [.., table] => TableId::new(default_db, table.clone()),
        [] => TableId::new(default_db, ""),
    }
}

fn column_def_of(c: &sqlparser::ast::ColumnDef) -> (ColumnDef, bool) {
    column_def(&c.name.value, &c.data_type.to_string(), &c.options)
}

/// A column from its parsed definition; the flag says it is the primary key.
fn column_def(name: &str, type_text: &str, options: &[ColumnOptionDef]) -> (ColumnDef, bool) {
    let mut nullable = true;
    let mut pk = false;
    for o in options {
        match &o.option {
            ColumnOption::NotNull => nullable = false,
            ColumnOption::PrimaryKey(_) => {
                pk = true;
                nullable = false;
            }
            _ => {}
        }
    }
    (
        ColumnDef {
            name: name.to_string(),
            type_text: type_text.to_string(),
            nullable,
            added_default: None,
            aliases: Vec::new(),
            auto_increment: rewrites::marks_auto_increment(options),
        },
        pk,
    )
}

/// A constant `DEFAULT` in MySQL's text form (`7`, `-1.5`, `x`); `None`
/// for none, NULL or an expression (`CURRENT_TIMESTAMP`, `(uuid())`), whose
/// value for old rows is not known here.
fn literal_default(options: &[ColumnOptionDef]) -> Option<String> {
    use sqlparser::ast::{UnaryOperator, Value};
    let expr = options.iter().find_map(|o| match &o.option {
        ColumnOption::Default(e) => Some(e),
        _ => None,
    })?;
    let (negative, expr) = match expr {
        Expr::UnaryOp { op: UnaryOperator::Minus, expr } => (true, &**expr),
        e => (false, e),
    };
    let Expr::Value(v) = expr else { return None };
    let text = match &v.value {
        Value::Number(n, _) => n.to_string(),
        Value::SingleQuotedString(t) | Value::DoubleQuotedString(t) if !negative => return Some(t.clone()),
        Value::Boolean(b) if !negative => return Some(if *b { "1" } else { "0" }.to_string()),
        _ => return None,
    };
    Some(if negative { format!("-{text}") } else { text })
}

fn has_default(options: &[ColumnOptionDef]) -> bool {
    options.iter().any(|o| matches!(o.option, ColumnOption::Default(_)))
}

fn primary_key_columns(constraint: &TableConstraint) -> Option<Vec<String>> {
    match constraint {
        TableConstraint::PrimaryKey(pk) => Some(
            pk.columns
                .iter()
                .filter_map(|c| match &c.column.expr {
                    Expr::Identifier(i) => Some(i.value.clone()),
                    _ => None,
                })
                .collect(),
        ),
        _ => None,
    }
}

fn mark_key_not_null(def: &mut TableDef) {
    for c in &mut def.columns {
        if def.primary_key.contains(&c.name) {
            c.nullable = false;
        }
    }
}

fn unknown_column(table: &TableId, column: &str) -> DdlError {
    DdlError {
        table: Some(table.clone()),
        message: format!("DDL names column {column}, which the schema history does not have"),
    }
}

fn insert_at(
    def: &mut TableDef,
    col: ColumnDef,
    pos: Option<&MySQLColumnPosition>,
    table: &TableId,
) -> Result<(), DdlError> {
    match pos {
        None => def.columns.push(col),
        Some(MySQLColumnPosition::First) => def.columns.insert(0, col),
        Some(MySQLColumnPosition::After(after)) => {
            let i = def
                .columns
                .iter()
                .position(|c| c.name == after.value)
                .ok_or_else(|| unknown_column(table, &after.value))?;
            def.columns.insert(i + 1, col);
        }
    }
    Ok(())
}

fn replace_column(
    def: &mut TableDef,
    old: &str,
    col: ColumnDef,
    pos: Option<&MySQLColumnPosition>,
    table: &TableId,
) -> Result<(), DdlError> {
    let i = def
        .columns
        .iter()
        .position(|c| c.name == old)
        .ok_or_else(|| unknown_column(table, old))?;
    let mut col = col;
    if def.primary_key.iter().any(|k| k == old) {
        col.nullable = false;
    }
    // MODIFY keeps the column's earlier names; CHANGE adds `old` to them.
    let new = std::mem::replace(&mut col.name, old.to_string());
    col.aliases = def.columns[i].aliases.clone();
    col.rename(&new);
    match pos {
        None => def.columns[i] = col,
        Some(p) => {
            def.columns.remove(i);
            insert_at(def, col, Some(p), table)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(_: &TableId) -> bool {
        true
    }

    fn names(h: &SchemaHistory, t: &TableId) -> Vec<String> {
        h.get(t)
            .map(|d| d.columns.iter().map(|c| c.name.clone()).collect())
            .unwrap_or_default()
    }

    #[test]
    fn create_alter_rename_drop_follow_the_table() {
        let mut h = SchemaHistory::default();
        let t = TableId::new("shop", "orders");
        let e = h
            .apply(
                "CREATE TABLE orders (id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT, total DECIMAL(10,2), \
                 state ENUM('new','paid') DEFAULT 'new', PRIMARY KEY (id)) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4",
                "shop",
                &all,
            )
            .expect("create");
        assert_eq!(e, vec![DdlEffect::Created(t.clone())]);
        let def = h.get(&t).expect("known");
        assert_eq!(def.primary_key, vec!["id"]);
        assert!(!def.columns[0].nullable);
        assert_eq!(def.columns[0].type_text.to_lowercase(), "bigint unsigned");

        h.apply("ALTER TABLE `shop`.`orders` ADD COLUMN note VARCHAR(40) NOT NULL AFTER id", "other", &all)
            .expect("add");
        assert_eq!(names(&h, &t), ["id", "note", "total", "state"]);
        h.apply("ALTER TABLE orders MODIFY COLUMN total DECIMAL(12,3), DROP COLUMN state", "shop", &all)
            .expect("modify + drop");
        assert_eq!(names(&h, &t), ["id", "note", "total"]);
        assert_eq!(h.get(&t).expect("known").columns[2].type_text, "DECIMAL(12,3)");
        h.apply("ALTER TABLE orders CHANGE note memo TEXT", "shop", &all)
            .expect("change");
        assert_eq!(names(&h, &t), ["id", "memo", "total"]);

        let e = h.apply("RENAME TABLE orders TO orders_old", "shop", &all).expect("rename");
        let old = TableId::new("shop", "orders_old");
        assert_eq!(e, vec![DdlEffect::Renamed { from: t.clone(), to: old.clone() }]);
        let e = h
            .apply("DROP TABLE IF EXISTS orders_old, nothing_here", "shop", &all)
            .expect("drop");
        assert_eq!(e, vec![DdlEffect::Dropped(old)]);
        assert!(h.tables().next().is_none());
    }

    #[test]
    fn statements_that_change_no_table_have_no_effect() {
        let mut h = SchemaHistory::default();
        h.insert(TableId::new("db", "t"), TableDef::default());
        for sql in [
            "GRANT SELECT ON db.* TO 'x'@'%'",
            "CREATE DATABASE other",
            "FLUSH PRIVILEGES",
        ] {
            assert_eq!(h.apply(sql, "db", &all).unwrap_or_default(), Vec::new(), "{sql}");
        }
        assert!(h.apply("ALTER TABLE t DROP COLUMN missing", "db", &all).is_err());
    }

    #[test]
    fn untracked_tables_are_not_kept_and_history_round_trips_as_json() {
        let mut h = SchemaHistory::default();
        h.apply("CREATE TABLE a (x INT); CREATE TABLE b (y INT)", "db", &|t: &TableId| t.table == "a")
            .expect("create");
        assert_eq!(h.tables().count(), 1);
        let json = serde_json::to_string(&h).expect("json");
        let back: SchemaHistory = serde_json::from_str(&json).expect("parse");
        assert_eq!(back, h);
    }

    fn aliases(h: &SchemaHistory, t: &TableId, column: &str) -> Vec<String> {
        h.get(t)
            .and_then(|d| d.columns.iter().find(|c| c.name == column))
            .map(|c| c.aliases.clone())
            .unwrap_or_else(|| panic!("no column {column}"))
    }

    #[test]
    fn renamed_columns_keep_their_earlier_names_oldest_first() {
        let mut h = SchemaHistory::default();
        let t = TableId::new("db", "t");
        h.apply("CREATE TABLE t (id INT PRIMARY KEY, a INT, b INT)", "db", &all)
            .expect("create");
        let e = h.apply("ALTER TABLE t RENAME COLUMN a TO a2", "db", &all).expect("rename");
        assert_eq!(e, vec![DdlEffect::Altered(t.clone())]);
        assert_eq!(aliases(&h, &t, "a2"), ["a"]);
        h.apply("ALTER TABLE t CHANGE COLUMN a2 a3 BIGINT NOT NULL", "db", &all)
            .expect("change");
        assert_eq!(aliases(&h, &t, "a3"), ["a", "a2"]);
        // MODIFY, and a CHANGE that keeps the name, add nothing and lose nothing.
        h.apply("ALTER TABLE t MODIFY a3 DECIMAL(20,0)", "db", &all).expect("modify");
        h.apply("ALTER TABLE t CHANGE a3 a3 DECIMAL(22,0) AFTER b", "db", &all)
            .expect("change in place");
        assert_eq!(names(&h, &t), ["id", "b", "a3"]);
        assert_eq!(aliases(&h, &t, "a3"), ["a", "a2"]);
        // Back to an earlier name: no duplicate, and never its own name.
        h.apply("ALTER TABLE t RENAME COLUMN a3 TO a2", "db", &all)
            .expect("rename back");
        assert_eq!(aliases(&h, &t, "a2"), ["a", "a3"]);
        // The key follows the rename and keeps its earlier name too.
        h.apply("ALTER TABLE t RENAME COLUMN id TO pk", "db", &all).expect("rename key");
        assert_eq!(h.get(&t).expect("known").primary_key, ["pk"]);
        assert_eq!(aliases(&h, &t, "pk"), ["id"]);
        // A table rename takes the aliases along.
        h.apply("ALTER TABLE t RENAME TO t2", "db", &all).expect("rename table");
        assert_eq!(aliases(&h, &TableId::new("db", "t2"), "a2"), ["a", "a3"]);
    }

    #[test]
    fn a_column_added_under_an_old_name_is_a_new_column_without_aliases() {
        let mut h = SchemaHistory::default();
        let t = TableId::new("db", "t");
        h.apply("CREATE TABLE t (id INT PRIMARY KEY, b INT)", "db", &all)
            .expect("create");
        h.apply("ALTER TABLE t RENAME COLUMN b TO c", "db", &all).expect("rename");
        h.apply("ALTER TABLE t ADD COLUMN b VARCHAR(10)", "db", &all).expect("add");
        assert_eq!(names(&h, &t), ["id", "c", "b"]);
        assert!(aliases(&h, &t, "b").is_empty());
        assert_eq!(aliases(&h, &t, "c"), ["b"]);
        // Dropped and added again: a new column, no earlier names.
        h.apply("ALTER TABLE t DROP COLUMN c, ADD COLUMN c INT", "db", &all)
            .expect("drop + add");
        assert!(aliases(&h, &t, "c").is_empty());
    }

    #[test]
    fn aliases_round_trip_and_older_checkpoints_without_them_still_read() {
        let mut h = SchemaHistory::default();
        h.apply("CREATE TABLE t (id INT PRIMARY KEY, a INT)", "db", &all)
            .expect("create");
        let before = serde_json::to_string(&h).expect("json");
        assert!(!before.contains("aliases"), "no field without aliases: {before}");
        // `before` is also what a checkpoint written before aliases holds.
        let old: SchemaHistory = serde_json::from_str(&before).expect("parse");
        assert_eq!(old, h);
        h.apply("ALTER TABLE t RENAME COLUMN a TO b", "db", &all).expect("rename");
        let json = serde_json::to_string(&h).expect("json");
        let back: SchemaHistory = serde_json::from_str(&json).expect("parse");
        assert_eq!(back, h);
        assert_eq!(aliases(&back, &TableId::new("db", "t"), "b"), ["a"]);
    }
    fn rewritten(effects: &[DdlEffect]) -> Vec<(String, String)> {
        effects
            .iter()
            .filter_map(|e| match e {
                DdlEffect::Rewritten { table, reason } => Some((table.table.clone(), reason.clone())),
                _ => None,
            })
            .collect()
    }

    fn history_of(sql: &str) -> SchemaHistory {
        let mut h = SchemaHistory::default();
        h.apply(sql, "db", &all).expect("create");
        h
    }

    const STRICT: Session = Session { strict: true };

    #[test]
    fn alters_that_may_change_values_say_so_after_their_other_effects() {
        let create = "CREATE TABLE t (id INT PRIMARY KEY, a INT, d DECIMAL(8,2), v VARCHAR(20), n INT)";
        for (sql, what) in [
            ("ALTER TABLE t ADD COLUMN g INT AS (a * 3) STORED", "stored generated"),
            ("ALTER TABLE t ADD COLUMN g INT AS (a * 3) PERSISTENT", "stored generated"),
            ("ALTER TABLE t ADD COLUMN g INT AS (a * 3) VIRTUAL", "generated"),
            ("ALTER TABLE t ADD COLUMN c DATETIME DEFAULT CURRENT_TIMESTAMP", "CURRENT_TIMESTAMP"),
            ("ALTER TABLE t ADD COLUMN u CHAR(36) DEFAULT (uuid())", "uuid"),
            ("ALTER TABLE t MODIFY d DECIMAL(8,1)", "rounds"),
            ("ALTER TABLE t CHANGE COLUMN v v2 VARCHAR(5)", "truncates"),
            ("ALTER TABLE t CONVERT TO CHARACTER SET latin1", "latin1"),
            ("ALTER TABLE t MODIFY v VARCHAR(20) CHARSET latin1", "latin1"),
            ("ALTER IGNORE TABLE t ADD UNIQUE KEY (a)", "deleted"),
            ("ALTER TABLE t TRUNCATE PARTITION p0", "TRUNCATE PARTITION"),
            ("ALTER TABLE t FORCE, FROBNICATE", "FROBNICATE"),
            ("ALTER TABLE t ADD COLUMN n2 INT NOT NULL AUTO_INCREMENT, ADD UNIQUE (n2)", "AUTO_INCREMENT"),
        ] {
            let mut h = history_of(create);
            let e = h.apply_in(sql, "db", &all, STRICT).unwrap_or_else(|e| panic!("{sql}: {e:?}"));
            let r = rewritten(&e);
            assert_eq!(r.len(), 1, "{sql}: {e:?}");
            assert!(r[0].1.contains(what), "{sql}: {}", r[0].1);
            assert!(matches!(e.last(), Some(DdlEffect::Rewritten { .. })), "{sql}: the rewrite comes last");
        }
        // Narrowing and NULL to NOT NULL fail in strict mode instead.
        for sql in ["ALTER TABLE t MODIFY a TINYINT", "ALTER TABLE t MODIFY n INT NOT NULL"] {
            let mut h = history_of(create);
            assert_eq!(rewritten(&h.apply_in(sql, "db", &all, STRICT).expect(sql)), [], "{sql} strict");
            let mut h = history_of(create);
            assert_eq!(rewritten(&h.apply_in(sql, "db", &all, Session::default()).expect(sql)).len(), 1, "{sql}");
        }
    }

    #[test]
    fn alters_that_keep_every_value_say_nothing() {
        let create = "CREATE TABLE t (id INT PRIMARY KEY, a INT, d DECIMAL(8,2), v VARCHAR(20), n INT)";
        for sql in [
            "ALTER TABLE t ADD COLUMN x INT",
            "ALTER TABLE t ADD COLUMN x INT NOT NULL DEFAULT 7",
            "ALTER TABLE t ADD COLUMN x VARCHAR(10) NOT NULL",
            "ALTER TABLE t MODIFY a BIGINT, MODIFY d DECIMAL(12,2), MODIFY v VARCHAR(40)",
            "ALTER TABLE t RENAME COLUMN a TO a2",
            "ALTER TABLE t CHANGE a a2 BIGINT",
            "ALTER TABLE t DROP COLUMN n",
            "ALTER TABLE t ALTER COLUMN a SET DEFAULT 4",
            "ALTER TABLE t ADD INDEX (a), ALGORITHM=INPLACE, LOCK=NONE",
            "ALTER TABLE t ENGINE=InnoDB",
            "ALTER TABLE t FORCE",
            "ALTER ONLINE TABLE t ADD COLUMN y INT",
            "ALTER TABLE t CONVERT TO CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci",
            "ALTER TABLE t MODIFY v VARCHAR(30) CHARACTER SET utf8mb4",
            "ALTER TABLE t ADD COLUMN IF NOT EXISTS z INT DEFAULT 1",
            "ALTER TABLE t RENAME TO t2, MODIFY d DECIMAL(8,1)",
        ] {
            let mut h = history_of(create);
            let e = h.apply_in(sql, "db", &all, STRICT).unwrap_or_else(|e| panic!("{sql}: {e:?}"));
            assert_eq!(rewritten(&e), [], "{sql}");
        }
    }

    #[test]
    fn alters_sqlparser_cannot_read_whole_still_move_the_history() {
        let t = TableId::new("db", "t");
        let mut h = history_of("CREATE TABLE t (id INT PRIMARY KEY, a INT)");
        // MariaDB's PERSISTENT, ALTER ONLINE, IF NOT EXISTS (twice: the
        // second does nothing), a table option sqlparser does not know.
        h.apply_in("ALTER ONLINE TABLE `db`.`t` ADD COLUMN g INT AS (a + 1) PERSISTENT", "x", &all, STRICT)
            .expect("persistent");
        h.apply_in("ALTER TABLE t ADD COLUMN IF NOT EXISTS b INT, ENGINE=InnoDB", "db", &all, STRICT)
            .expect("if not exists");
        let e = h
            .apply_in("ALTER TABLE t ADD COLUMN IF NOT EXISTS b INT, ROW_FORMAT=DYNAMIC", "db", &all, STRICT)
            .expect("again");
        assert_eq!(e, []);
        assert_eq!(names(&h, &t), ["id", "a", "g", "b"]);
        // A clause not understood still lets the others apply.
        let e = h
            .apply_in("ALTER TABLE t ADD COLUMN c INT, MODIFY a BIGINT FROBNICATE", "db", &all, STRICT)
            .expect("partly");
        assert_eq!(names(&h, &t), ["id", "a", "g", "b", "c"]);
        assert!(matches!(&e[..], [DdlEffect::Altered(_), DdlEffect::Rewritten { .. }]), "{e:?}");
        // EXCHANGE PARTITION copies both tables.
        h.apply("CREATE TABLE u (id INT PRIMARY KEY)", "db", &all).expect("u");
        let e = h
            .apply_in("ALTER TABLE t EXCHANGE PARTITION p0 WITH TABLE `db`.u", "db", &all, STRICT)
            .expect("x");
        let tables: Vec<String> = rewritten(&e).into_iter().map(|(t, _)| t).collect();
        assert_eq!(tables, ["u", "t"]);
        // Another table's ALTER is nothing.
        assert_eq!(h.apply_in("ALTER TABLE other CONVERT TO CHARSET latin1", "db", &all, STRICT), Ok(vec![]));
    }

    #[test]
    fn auto_increment_is_remembered_and_restating_it_keeps_values() {
        let mut h = history_of("CREATE TABLE t (id INT NOT NULL AUTO_INCREMENT PRIMARY KEY, a INT)");
        assert!(h.get(&TableId::new("db", "t")).expect("t").columns[0].auto_increment);
        let e = h
            .apply_in("ALTER TABLE t MODIFY id BIGINT NOT NULL AUTO_INCREMENT", "db", &all, STRICT)
            .expect("id");
        assert_eq!(rewritten(&e), []);
        let e = h
            .apply_in("ALTER TABLE t MODIFY a INT NOT NULL AUTO_INCREMENT", "db", &all, STRICT)
            .expect("a");
        assert_eq!(rewritten(&e).len(), 1);
    }

    #[test]
    fn alter_statements_are_taken_apart_outside_quotes_and_parentheses() {
        let a = alter_statement(
            "ALTER IGNORE TABLE IF EXISTS `my db`.`t,1` ADD COLUMN c VARCHAR(3) DEFAULT 'a,b' COMMENT 'persistent', \
             ADD INDEX (a, b) /* x, y */, ENGINE=InnoDB;",
        )
        .expect("an ALTER");
        assert!(a.ignore);
        assert_eq!(a.table.as_deref(), Some("`my db`.`t,1`"));
        assert_eq!(
            a.clauses,
            [
                "ADD COLUMN c VARCHAR(3) DEFAULT 'a,b' COMMENT 'persistent'",
                "ADD INDEX (a, b) /* x, y */",
                "ENGINE=InnoDB"
            ]
        );
        assert!(a.normalized.starts_with("ALTER  TABLE"), "{}", a.normalized);
        assert_eq!(name_id(a.table.as_deref().unwrap_or_default(), "db"), TableId::new("my db", "t,1"));
        assert_eq!(alter_statement("ALTER VIEW v AS SELECT 1"), None);
        assert_eq!(alter_statement("CREATE TABLE t (a INT)"), None);
    }
}
