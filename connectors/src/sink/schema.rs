//! Destination tables that follow their source: what a table must become to
//! take the rows of a source schema, decided once for every sink over a
//! [`Dialect`] (its types and which changes it can make in place).
//!
//! The plan adds and renames: a missing table is created, a missing column
//! added (nullable: older rows have no value for it, or the source's
//! default for them when the schema carries one) or, when the source
//! renamed it (the column's aliases name a destination column), renamed, a
//! type widened where the destination can widen it in place, a NOT NULL
//! relaxed where the source now sends NULL or no longer sends the column.
//! A column the source dropped is dropped only when the sink is told to
//! (`drop_columns`), and only when the schema version says it dropped it
//! (`TableSchema::dropped`: an older shape replayed late never drops a
//! column a newer one added). Nothing is narrowed; a change the destination
//! cannot follow is a permanent error of the record that needs it
//! (dead-lettered, with the fix in its hint).

use std::fmt;

use tributary_schemas::{Column, DataType, TableSchema, Value};

use super::bookkeeping::{is_bookkeeping, KEYLESS_COLUMNS, POSITION_COLUMNS, ROW_COLUMN};
use crate::error::{Error, Result};

/// What a sink knows of a destination table.
#[derive(Debug, Clone, PartialEq)]
pub struct TableShape<T> {
    /// Whether the table exists.
    pub exists: bool,
    /// Its columns, in table order (the bookkeeping columns among them).
    pub columns: Vec<ShapeColumn<T>>,
    /// Its primary key columns (empty where the destination has none).
    pub primary_key: Vec<String>,
}

impl<T> Default for TableShape<T> {
    fn default() -> Self {
        Self {
            exists: false,
            columns: Vec::new(),
            primary_key: Vec::new(),
        }
    }
}

/// A column of a destination table.
#[derive(Debug, Clone, PartialEq)]
pub struct ShapeColumn<T> {
    /// Name.
    pub name: String,
    /// Type.
    pub ty: T,
    /// Whether it refuses NULL.
    pub not_null: bool,
}

impl<T> TableShape<T> {
    /// The column named `name`.
    pub fn column(&self, name: &str) -> Option<&ShapeColumn<T>> {
        self.columns.iter().find(|c| c.name == name)
    }
}

impl<T: Clone> TableShape<T> {
    /// The table as it is after `changes` (for a destination whose metadata
    /// lags behind its DDL, or to save a round trip).
    pub fn apply(&mut self, changes: &[TableChange<T>]) {
        for change in changes {
            match change {
                TableChange::CreateTable { columns, key } => {
                    self.exists = true;
                    self.columns = columns.clone();
                    self.primary_key = key.clone();
                }
                TableChange::AddColumn { column: c, .. } | TableChange::AddBookkeeping(c) => {
                    if self.column(&c.name).is_none() {
                        self.columns.push(c.clone());
                    }
                }
                TableChange::Widen { column, to, .. } => {
                    if let Some(c) = self.columns.iter_mut().find(|c| &c.name == column) {
                        c.ty = to.clone();
                    }
                }
                TableChange::DropNotNull { column } => {
                    if let Some(c) = self.columns.iter_mut().find(|c| &c.name == column) {
                        c.not_null = false;
                    }
                }
                TableChange::RenameColumn { from, to } => {
                    if let Some(c) = self.columns.iter_mut().find(|c| &c.name == from) {
                        c.name = to.clone();
                    }
                    for k in &mut self.primary_key {
                        if k == from {
                            *k = to.clone();
                        }
                    }
                }
                TableChange::DropColumn { column } => self.columns.retain(|c| &c.name != column),
            }
        }
    }
}

/// One change to a destination table, in the dialect's types; the sink
/// renders and runs it.
#[derive(Debug, Clone, PartialEq)]
pub enum TableChange<T> {
    /// Create the table: these columns (the position columns last) and
    /// primary key.
    CreateTable {
        /// Columns.
        columns: Vec<ShapeColumn<T>>,
        /// Key columns, in key order.
        key: Vec<String>,
    },
    /// Add a column the source now has (always nullable).
    AddColumn {
        /// The column.
        column: ShapeColumn<T>,
        /// The value the rows already in the table get: the source's value
        /// for rows older than the column (`ADD COLUMN ... DEFAULT 7`, see
        /// `docs/schema-changes.md`); `None` leaves them NULL.
        backfill: Option<Value>,
    },
    /// Widen a column's type in place.
    Widen {
        /// The column.
        column: String,
        /// Its type now.
        from: T,
        /// Its type after.
        to: T,
    },
    /// Let a column take NULL.
    DropNotNull {
        /// The column.
        column: String,
    },
    /// Rename a column the source renamed (its values stay).
    RenameColumn {
        /// Its name in the destination now.
        from: String,
        /// The source's new name.
        to: String,
    },
    /// Drop a column the source dropped (only with `drop_columns`).
    DropColumn {
        /// The column.
        column: String,
    },
    /// Add a position column to a table made by hand; existing rows get a
    /// position before every real one (`-1`), so any change overwrites them.
    AddBookkeeping(ShapeColumn<T>),
}

/// Whether a destination column of one type can take the values of another.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fit<T> {
    /// It already holds every value of the wanted type.
    Keep,
    /// It must be widened to this type first.
    Widen(T),
    /// The destination cannot widen it into the wanted type.
    Incompatible,
}

/// A destination's types and what it can change in place.
pub trait Dialect {
    /// A column type.
    type Type: Clone + PartialEq + fmt::Display + fmt::Debug;

    /// The destination type of a source column; `origin` is the source
    /// connector (`source.connector`: `postgresql`, `mysql`, ...), for a
    /// destination of the same kind that keeps the source's own spelling.
    fn column_type(&self, column: &Column, origin: &str) -> Self::Type;

    /// The type of the position columns.
    fn position_type(&self) -> Self::Type;

    /// Whether a column of type `have` takes the values of type `want`.
    fn fit(&self, have: &Self::Type, want: &Self::Type) -> Fit<Self::Type>;

    /// Whether a new column of type `ty` may be NOT NULL (BigQuery: a
    /// REPEATED column cannot be REQUIRED).
    fn can_refuse_null(&self, _ty: &Self::Type) -> bool {
        true
    }

    /// Whether key columns are created NOT NULL even where the source lets
    /// them be NULL (a primary key demands it).
    fn key_refuses_null(&self) -> bool;

    /// Whether a table made by hand without the position columns gets them
    /// ([`TableChange::AddBookkeeping`]); else writing to it fails.
    fn adds_position_columns(&self) -> bool;

    /// The permanent error of a column the destination cannot change from
    /// `have` to `want`, with the operator's fix in its hint.
    fn incompatible(&self, table: &str, column: &Column, have: &Self::Type, want: &Self::Type) -> Error;
}

/// What a sink's configuration says about columns the source dropped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Evolution {
    /// Drop a destination column when the source drops it (`drop_columns`);
    /// else it stays, NULL in new rows.
    pub drop_columns: bool,
}

/// How `shape` (the destination table as its catalog has it now, named
/// `table`) differs from what `schema`'s rows need: each change the sink
/// would make, as `sql` writes it, or that its key differs; none for a table
/// never written (an empty source table has none). For verification (see
/// [`super::warehouse::Warehouse::schema_differences`]).
pub fn differences<D: Dialect>(
    dialect: &D,
    table: &str,
    schema: &TableSchema,
    origin: &str,
    shape: &TableShape<D::Type>,
    evolution: Evolution,
    sql: impl Fn(&TableChange<D::Type>) -> Vec<String>,
) -> Result<Vec<String>> {
    if !shape.exists {
        return Ok(Vec::new());
    }
    match plan(dialect, table, schema, origin, shape, evolution) {
        Ok(changes) => Ok(changes.iter().flat_map(sql).collect()),
        Err(e) if e.class() == KEY_CHANGED_CLASS => Ok(vec![format!("its key differs: {e}")]),
        Err(e) => Err(e),
    }
}

/// The changes that make `shape` (named `table` in errors) take the rows of
/// `schema` from a source of kind `origin`; empty when it already does.
pub fn plan<D: Dialect>(
    dialect: &D,
    table: &str,
    schema: &TableSchema,
    origin: &str,
    shape: &TableShape<D::Type>,
    evolution: Evolution,
) -> Result<Vec<TableChange<D::Type>>> {
    let mut plan = Vec::new();
    // A table without a key keeps its rows as a multiset: a row's content
    // key and its name (see `super::keyless`) are its primary key.
    let keyless = schema.key.is_empty();
    if !shape.exists {
        let mut columns = Vec::with_capacity(schema.columns.len() + 4);
        for c in &schema.columns {
            let ty = dialect.column_type(c, origin);
            let not_null = (!c.nullable || (dialect.key_refuses_null() && schema.key.contains(&c.name)))
                && dialect.can_refuse_null(&ty);
            columns.push(ShapeColumn { name: c.name.clone(), ty, not_null });
        }
        for name in POSITION_COLUMNS {
            columns.push(ShapeColumn {
                name: name.to_string(),
                ty: dialect.position_type(),
                not_null: true,
            });
        }
        let key = if keyless {
            for name in KEYLESS_COLUMNS {
                let ty = dialect.column_type(&Column::new(name, DataType::Text, false), origin);
                columns.push(ShapeColumn { name: name.to_string(), ty, not_null: true });
            }
            KEYLESS_COLUMNS.iter().map(|c| c.to_string()).collect()
        } else {
            schema.key.clone()
        };
        plan.push(TableChange::CreateTable { columns, key });
        return Ok(plan);
    }
    if keyless != shape.column(ROW_COLUMN).is_some() {
        return Err(key_changed(table, schema, keyless));
    }
    let mut renamed: Vec<&str> = Vec::new();
    for c in &schema.columns {
        let want = dialect.column_type(c, origin);
        let existing = match shape.column(&c.name) {
            Some(d) => Some(d),
            // Renamed at the source: the newest earlier name the destination
            // still has (and the source no longer uses) is this column.
            None => {
                let from = c
                    .aliases
                    .iter()
                    .rev()
                    .filter(|a| schema.column_index(a).is_none() && !renamed.contains(&a.as_str()))
                    .find_map(|a| shape.column(a))
                    .filter(|d| !is_bookkeeping(&d.name));
                if let Some(d) = from {
                    renamed.push(&d.name);
                    plan.push(TableChange::RenameColumn { from: d.name.clone(), to: c.name.clone() });
                }
                from
            }
        };
        match existing {
            None => plan.push(TableChange::AddColumn {
                column: ShapeColumn { name: c.name.clone(), ty: want, not_null: false },
                backfill: c.default_value(),
            }),
            Some(d) => {
                match dialect.fit(&d.ty, &want) {
                    Fit::Keep => {}
                    Fit::Widen(to) => plan.push(TableChange::Widen { column: c.name.clone(), from: d.ty.clone(), to }),
                    Fit::Incompatible => {
                        return Err(dialect
                            .incompatible(table, c, &d.ty, &want)
                            .with_table(schema.id.clone())
                            .with_column(c.name.clone())
                            .with_class("tributary.incompatible_type"));
                    }
                }
                if d.not_null && c.nullable && !shape.primary_key.contains(&d.name) {
                    plan.push(TableChange::DropNotNull { column: c.name.clone() });
                }
            }
        }
    }
    // Columns the source no longer sends are dropped where configured and
    // the version says it dropped them; else they must take NULL in new rows.
    for d in &shape.columns {
        if is_bookkeeping(&d.name)
            || shape.primary_key.contains(&d.name)
            || schema.column_index(&d.name).is_some()
            || renamed.contains(&d.name.as_str())
        {
            continue;
        }
        if evolution.drop_columns && schema.dropped.contains(&d.name) {
            plan.push(TableChange::DropColumn { column: d.name.clone() });
        } else if d.not_null {
            plan.push(TableChange::DropNotNull { column: d.name.clone() });
        }
    }
    if dialect.adds_position_columns() {
        for name in POSITION_COLUMNS {
            if shape.column(name).is_none() {
                plan.push(TableChange::AddBookkeeping(ShapeColumn {
                    name: name.to_string(),
                    ty: dialect.position_type(),
                    not_null: true,
                }));
            }
        }
    }
    Ok(plan)
}

/// The class of [`key_changed`] errors.
pub const KEY_CHANGED_CLASS: &str = "tributary.key_changed";

/// The error of a destination table made for a keyed source table that
/// now has no key (`keyless`), or the reverse: its rows cannot take the
/// other kind's changes. A sink makes the table anew instead when no row
/// of it is current (a table-reset forgot every row's position: the
/// source copies the table again after such a change, see
/// `docs/schema-changes.md`).
pub fn key_changed(table: &str, schema: &TableSchema, keyless: bool) -> Error {
    let what = if keyless {
        format!("source table {} has no key now, but destination table {table} was made with one", schema.id)
    } else {
        format!(
            "source table {} has a key now ({}), but destination table {table} was made without one",
            schema.id,
            schema.key.join(", ")
        )
    };
    Error::needs_operator(format!("{what}: its rows cannot take the changes"))
        .with_table(schema.id.clone())
        .with_class(KEY_CHANGED_CLASS)
        .with_hint(format!(
            "the source copies a table again when its key changes, and the sink then makes the destination table \
             anew; if it is not copied again (a copy older than this version, or another producer's topic), drop \
             {table} and copy the table again: source-runner reset --table {}",
            schema.id
        ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tributary_schemas::{DataType, TableId};

    /// Types as text; integers widen, text never changes.
    struct Toy;

    impl Dialect for Toy {
        type Type = String;
        fn column_type(&self, column: &Column, _origin: &str) -> String {
            column.data_type.to_string()
        }
        fn position_type(&self) -> String {
            "int64".into()
        }
        fn fit(&self, have: &String, want: &String) -> Fit<String> {
            match (have.as_str(), want.as_str()) {
                (h, w) if h == w => Fit::Keep,
                ("int32", "int64") => Fit::Widen(want.clone()),
                ("int64", "int32") => Fit::Keep,
                _ => Fit::Incompatible,
            }
        }
        fn key_refuses_null(&self) -> bool {
            true
        }
        fn adds_position_columns(&self) -> bool {
            true
        }
        fn incompatible(&self, table: &str, column: &Column, have: &String, want: &String) -> Error {
            Error::permanent(format!("{table}.{}: {have} -> {want}", column.name))
        }
    }

    fn schema(columns: Vec<Column>) -> TableSchema {
        TableSchema {
            id: TableId::new("s", "t"),
            columns,
            key: vec!["id".into()],
            dropped: Vec::new(),
        }
    }

    #[test]
    fn a_missing_table_is_created_with_key_and_positions() {
        let s = schema(vec![
            Column::new("id", DataType::Int32, true),
            Column::new("v", DataType::Text, true),
        ]);
        let plan = plan(&Toy, "t", &s, "test", &TableShape::default(), Evolution::default()).unwrap();
        let TableChange::CreateTable { columns, key } = &plan[0] else {
            panic!("{plan:?}")
        };
        assert_eq!(key, &vec!["id".to_string()]);
        let names: Vec<(&str, bool)> = columns.iter().map(|c| (c.name.as_str(), c.not_null)).collect();
        assert_eq!(
            names,
            vec![
                ("id", true),
                ("v", false),
                ("__tributary_commit", true),
                ("__tributary_index", true)
            ]
        );
        let mut shape = TableShape::default();
        shape.apply(&plan);
        assert!(
            super::plan(&Toy, "t", &s, "test", &shape, Evolution::default())
                .unwrap()
                .is_empty(),
            "applying the plan makes it fit"
        );
    }

    #[test]
    fn evolution_adds_widens_relaxes_and_refuses_what_cannot_change() {
        let old = schema(vec![
            Column::new("id", DataType::Int32, false),
            Column::new("n", DataType::Int32, false),
        ]);
        let mut shape = TableShape::default();
        shape.apply(&plan(&Toy, "t", &old, "test", &shape, Evolution::default()).unwrap());
        let new = schema(vec![
            Column::new("id", DataType::Int32, false),
            Column::new("n", DataType::Int64, true),
            Column::new("e", DataType::Text, true),
        ]);
        let changes = plan(&Toy, "t", &new, "test", &shape, Evolution::default()).unwrap();
        let mut with_default = new.clone();
        with_default.columns[2] = Column::new("e", DataType::Text, false).with_default(&Value::Text("x".into()));
        assert!(matches!(
            &plan(&Toy, "t", &with_default, "test", &shape, Evolution::default()).unwrap()[2],
            TableChange::AddColumn { backfill: Some(Value::Text(x)), .. } if x == "x"
        ));
        assert_eq!(
            changes,
            vec![
                TableChange::Widen {
                    column: "n".into(),
                    from: "int32".into(),
                    to: "int64".into()
                },
                TableChange::DropNotNull { column: "n".into() },
                TableChange::AddColumn {
                    column: ShapeColumn {
                        name: "e".into(),
                        ty: "text".into(),
                        not_null: false
                    },
                    backfill: None
                },
            ]
        );
        let dropped = schema(vec![Column::new("id", DataType::Int32, false)]);
        assert_eq!(
            plan(&Toy, "t", &dropped, "test", &shape, Evolution::default()).unwrap(),
            vec![TableChange::DropNotNull { column: "n".into() }]
        );
        let incompatible = schema(vec![
            Column::new("id", DataType::Int32, false),
            Column::new("n", DataType::Text, false),
        ]);
        let e = plan(&Toy, "t", &incompatible, "test", &shape, Evolution::default()).unwrap_err();
        assert_eq!(e.class(), "tributary.incompatible_type");
        assert_eq!(e.column(), Some("n"));
    }

    #[test]
    fn keyless_tables_get_their_own_key_and_hand_made_tables_get_positions() {
        let mut keyless = schema(vec![Column::new("id", DataType::Int32, true)]);
        keyless.key.clear();
        let changes = plan(&Toy, "t", &keyless, "test", &TableShape::default(), Evolution::default()).unwrap();
        let TableChange::CreateTable { columns, key } = &changes[0] else {
            panic!("{changes:?}")
        };
        assert_eq!(key, &["__tributary_key", "__tributary_row"]);
        assert_eq!(columns.len(), 5);
        assert!(!columns[0].not_null, "NULL is a legal value of every column of a keyless table");
        let mut made = TableShape::default();
        made.apply(&changes);
        assert!(plan(&Toy, "t", &keyless, "test", &made, Evolution::default())
            .unwrap()
            .is_empty());
        // The source table gained a key: the table must be made anew.
        let keyed = schema(vec![Column::new("id", DataType::Int32, false)]);
        let e = plan(&Toy, "t", &keyed, "test", &made, Evolution::default()).unwrap_err();
        assert_eq!(e.class(), KEY_CHANGED_CLASS);
        let s = schema(vec![Column::new("id", DataType::Int32, false)]);
        let hand_made = TableShape {
            exists: true,
            columns: vec![ShapeColumn {
                name: "id".into(),
                ty: "int32".to_string(),
                not_null: true,
            }],
            primary_key: vec!["id".into()],
        };
        let changes = plan(&Toy, "t", &s, "test", &hand_made, Evolution::default()).unwrap();
        assert_eq!(changes.len(), 2);
        assert!(matches!(&changes[0], TableChange::AddBookkeeping(c) if c.name == "__tributary_commit"));
    }

    #[test]
    fn renamed_columns_are_renamed_and_dropped_ones_dropped_only_when_asked_and_recorded() {
        let v1 = schema(vec![
            Column::new("id", DataType::Int32, false),
            Column::new("d", DataType::Int32, false),
            Column::new("b", DataType::Text, true),
        ]);
        let mut shape = TableShape::default();
        shape.apply(&plan(&Toy, "t", &v1, "test", &shape, Evolution::default()).unwrap());
        // RENAME COLUMN d TO d2, then a wider type: renamed, then widened.
        let mut d2 = Column::new("d2", DataType::Int64, true);
        d2.aliases = vec!["d".into()];
        let v2 = schema(vec![
            Column::new("id", DataType::Int32, false),
            d2,
            Column::new("b", DataType::Text, true),
        ]);
        let changes = plan(&Toy, "t", &v2, "test", &shape, Evolution::default()).unwrap();
        assert_eq!(
            changes,
            vec![
                TableChange::RenameColumn { from: "d".into(), to: "d2".into() },
                TableChange::Widen {
                    column: "d2".into(),
                    from: "int32".into(),
                    to: "int64".into()
                },
                TableChange::DropNotNull { column: "d2".into() },
            ]
        );
        shape.apply(&changes);
        assert!(plan(&Toy, "t", &v2, "test", &shape, Evolution::default()).unwrap().is_empty());
        // An older shape read with the newest names fits as it is.
        let v1_renamed = v1.renamed_as(&v2).expect("renamed");
        assert_eq!(v1_renamed.columns[1].name, "d2");
        let drop = Evolution { drop_columns: true };
        // DROP COLUMN b: kept by default, dropped when asked, and only when
        // the version records the drop (an older shape without a column a
        // newer one added never drops it).
        let mut v3 = schema(vec![Column::new("id", DataType::Int32, false), v2.columns[1].clone()]);
        assert!(plan(&Toy, "t", &v3, "test", &shape, drop).unwrap().is_empty());
        v3.dropped = vec!["b".into()];
        assert!(plan(&Toy, "t", &v3, "test", &shape, Evolution::default()).unwrap().is_empty());
        assert_eq!(
            plan(&Toy, "t", &v3, "test", &shape, drop).unwrap(),
            vec![TableChange::DropColumn { column: "b".into() }]
        );
    }
}
