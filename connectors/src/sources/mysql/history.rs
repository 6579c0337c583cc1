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
        let statements = Parser::parse_sql(&MySqlDialect {}, sql).map_err(|e| DdlError {
            table: None,
            message: format!("DDL statement not understood: {e}"),
        })?;
        let mut effects = Vec::new();
        for st in statements {
            self.apply_one(st, default_db, tracked, &mut effects)?;
        }
        Ok(effects)
    }

    fn apply_one(
        &mut self,
        st: Statement,
        default_db: &str,
        tracked: &dyn Fn(&TableId) -> bool,
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
                let Some(mut def) = self.get(&table).cloned() else {
                    return Ok(());
                };
                let mut renamed_to = None;
                for op in at.operations {
                    match op {
                        AlterTableOperation::AddColumn { column_def, column_position, if_not_exists, .. } => {
                            if if_not_exists && def.columns.iter().any(|c| c.name == column_def.name.value) {
                                continue;
                            }
                            let (mut col, pk) = column_def_of(&column_def);
                            if pk {
                                def.primary_key = vec![col.name.clone()];
                            }
                            col.added_default = match literal_default(&column_def.options) {
                                Some(text) => Some(AddedDefault::Literal(text)),
                                None if !col.nullable && !has_default(&column_def.options) => {
                                    Some(AddedDefault::Implicit)
                                }
                                None => None,
                            };
                            insert_at(&mut def, col, column_position.as_ref(), &table)?;
                        }
                        AlterTableOperation::DropColumn { column_names, if_exists, .. } => {
                            for name in column_names {
                                let before = def.columns.len();
                                def.columns.retain(|c| c.name != name.value);
                                def.primary_key.retain(|k| *k != name.value);
                                if before == def.columns.len() && !if_exists {
                                    return Err(unknown_column(&table, &name.value));
                                }
                            }
                        }
                        AlterTableOperation::ModifyColumn { col_name, data_type, options, column_position } => {
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
                            renamed_to = Some(id(&name));
                        }
                        // Indexes, defaults, engine, comments: no effect on row images.
                        _ => {}
                    }
                }
                match renamed_to {
                    Some(to) => {
                        self.remove(&table);
                        self.insert(to.clone(), def);
                        effects.push(DdlEffect::Renamed { from: table, to });
                    }
                    None => {
                        if self.get(&table) != Some(&def) {
                            self.insert(table.clone(), def);
                            effects.push(DdlEffect::Altered(table));
                        }
                    }
                }
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
}
