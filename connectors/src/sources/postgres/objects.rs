//! A captured table's objects besides its columns and key (secondary
//! indexes, unique, check, exclusion and foreign-key constraints, column
//! defaults and identities), read from the catalog for a destination of
//! the same kind to recreate when a database moves (docs/migration.md).
//! None of them is in the WAL: they are read at intervals, like sequences,
//! and sent whole when they changed.

use std::collections::BTreeMap;

use tributary_schemas::{
    ColumnDefault, ConstraintKind, ConstraintObject, ForeignKeyTarget, IndexObject, TableId, TableObjects,
};

use super::client::Catalog;
use crate::error::Result;

/// The captured tables of `tables` as ids in two parallel arrays, and the
/// `WITH` clause that finds them (`t`: oid, schema, name).
const TABLES: &str = "WITH t AS (SELECT c.oid, c.relkind, n.nspname, c.relname \
     FROM unnest($1::text[], $2::text[]) AS w(s, r) \
     JOIN pg_namespace n ON n.nspname = w.s JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = w.r) ";

/// Indexes that are neither the primary key's nor a constraint's (those
/// come with their constraint), valid ones only (a failed `CREATE INDEX
/// CONCURRENTLY` leaves an invalid one), with the text `pg_get_indexdef`
/// starts with when its table is printed as `regclass` prints it.
const INDEXES: &str = "SELECT t.nspname::text, t.relname::text, i.relname::text, x.indisunique, \
         pg_get_indexdef(x.indexrelid), \
         format('CREATE %sINDEX %s ON %s%s ', CASE WHEN x.indisunique THEN 'UNIQUE ' END, quote_ident(i.relname), \
                CASE WHEN t.relkind = 'p' THEN 'ONLY ' END, t.oid::regclass) \
     FROM t JOIN pg_index x ON x.indrelid = t.oid JOIN pg_class i ON i.oid = x.indexrelid \
     WHERE NOT x.indisprimary AND x.indisvalid \
       AND NOT EXISTS (SELECT 1 FROM pg_constraint k WHERE k.conindid = x.indexrelid AND k.conrelid = t.oid \
                       AND k.contype IN ('p', 'u', 'x')) \
     ORDER BY 1, 2, 3";

/// Check, unique, exclusion and foreign-key constraints defined on the
/// table itself (a partition's copies of its root's have a parent), with a
/// foreign key's parts.
const CONSTRAINTS: &str = "SELECT t.nspname::text, t.relname::text, k.conname::text, k.contype::text, \
         pg_get_constraintdef(k.oid), rn.nspname::text, r.relname::text, \
         ARRAY(SELECT quote_ident(a.attname) FROM unnest(k.conkey) WITH ORDINALITY u(n, o) \
               JOIN pg_attribute a ON a.attrelid = k.conrelid AND a.attnum = u.n ORDER BY u.o), \
         ARRAY(SELECT a.attname::text FROM unnest(k.confkey) WITH ORDINALITY u(n, o) \
               JOIN pg_attribute a ON a.attrelid = k.confrelid AND a.attnum = u.n ORDER BY u.o), \
         k.confmatchtype::text, k.confupdtype::text, k.confdeltype::text, k.condeferrable, k.condeferred, \
         k.convalidated \
     FROM t JOIN pg_constraint k ON k.conrelid = t.oid \
     LEFT JOIN pg_class r ON r.oid = k.confrelid LEFT JOIN pg_namespace rn ON rn.oid = r.relnamespace \
     WHERE k.contype IN ('c', 'u', 'x', 'f') AND k.conparentid = 0 \
     ORDER BY 1, 2, 3";

/// Columns with a default (generated columns excluded: their values are
/// copied) or an identity, with the sequence an identity owns or a plain
/// `nextval` default calls.
const DEFAULTS: &str = "SELECT t.nspname::text, t.relname::text, a.attname::text, \
         pg_get_expr(d.adbin, d.adrelid), a.attidentity::text, sn.nspname::text, s.relname::text \
     FROM t JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum > 0 AND NOT a.attisdropped \
     LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum \
     LEFT JOIN LATERAL ( \
         SELECT dep.objid AS seq FROM pg_depend dep \
          WHERE a.attidentity <> '' AND dep.classid = 'pg_class'::regclass AND dep.refobjid = t.oid \
            AND dep.refobjsubid = a.attnum AND dep.deptype = 'i' \
         UNION ALL \
         SELECT dep.refobjid FROM pg_depend dep \
          WHERE d.oid IS NOT NULL AND dep.classid = 'pg_attrdef'::regclass AND dep.objid = d.oid \
            AND dep.refclassid = 'pg_class'::regclass \
            AND pg_get_expr(d.adbin, d.adrelid) = format('nextval(%L::regclass)', dep.refobjid::regclass) \
         LIMIT 1) q ON true \
     LEFT JOIN pg_class s ON s.oid = q.seq AND s.relkind = 'S' LEFT JOIN pg_namespace sn ON sn.oid = s.relnamespace \
     WHERE a.attgenerated = '' AND (d.oid IS NOT NULL OR a.attidentity <> '') \
     ORDER BY 1, 2, a.attnum";

/// The objects of each of `tables` (every one of them, empty when it has
/// none), in the catalog's order.
pub async fn read(catalog: &Catalog, tables: &[TableId]) -> Result<BTreeMap<TableId, TableObjects>> {
    let mut out: BTreeMap<TableId, TableObjects> =
        tables.iter().map(|t| (t.clone(), TableObjects::default())).collect();
    if tables.is_empty() {
        return Ok(out);
    }
    let schemas: Vec<&str> = tables.iter().map(|t| t.schema.as_str()).collect();
    let names: Vec<&str> = tables.iter().map(|t| t.table.as_str()).collect();
    let client = catalog.client();
    let what = "reading the captured tables' indexes, constraints and defaults";
    let ask = |sql: &'static str| {
        let (schemas, names) = (&schemas, &names);
        async move {
            catalog
                .bounded(what, async {
                    client
                        .query(&format!("{TABLES}{sql}"), &[schemas, names])
                        .await
                        .map_err(|e| super::client::classify_pg(e, what))
                })
                .await
        }
    };
    let id = |r: &tokio_postgres::Row| TableId::new(r.get::<_, String>(0), r.get::<_, String>(1));
    for r in ask(INDEXES).await? {
        let (table, name, definition, prefix): (TableId, String, String, String) =
            (id(&r), r.get(2), r.get(4), r.get(5));
        match definition.strip_prefix(&prefix) {
            Some(rest) => out.entry(table).or_default().indexes.push(IndexObject {
                name,
                unique: r.get(3),
                definition: rest.to_string(),
            }),
            None => tracing::warn!(
                table = %table,
                index = %name,
                definition = %definition,
                "an index whose definition this version cannot read: it is not recreated in destinations"
            ),
        }
    }
    for r in ask(CONSTRAINTS).await? {
        let table = id(&r);
        let kind = match r.get::<_, String>(3).as_str() {
            "c" => ConstraintKind::Check,
            "u" => ConstraintKind::Unique,
            "x" => ConstraintKind::Exclusion,
            _ => ConstraintKind::ForeignKey,
        };
        let (definition, references) = if kind == ConstraintKind::ForeignKey {
            let columns: Vec<String> = r.get(7);
            let target = ForeignKeyTarget {
                table: TableId::new(r.get::<_, String>(5), r.get::<_, String>(6)),
                columns: r.get(8),
                options: foreign_key_options(
                    &r.get::<_, String>(9),
                    &r.get::<_, String>(10),
                    &r.get::<_, String>(11),
                    r.get(12),
                    r.get(13),
                    r.get(14),
                ),
            };
            (format!("FOREIGN KEY ({})", columns.join(", ")), Some(target))
        } else {
            (r.get(4), None)
        };
        out.entry(table).or_default().constraints.push(ConstraintObject {
            name: r.get(2),
            kind,
            definition,
            references,
        });
    }
    for r in ask(DEFAULTS).await? {
        let table = id(&r);
        let identity: String = r.get(4);
        let sequence = match (r.get::<_, Option<String>>(5), r.get::<_, Option<String>>(6)) {
            (Some(schema), Some(name)) => Some(TableId::new(schema, name)),
            _ => None,
        };
        out.entry(table).or_default().defaults.push(ColumnDefault {
            column: r.get(2),
            expression: r.get::<_, Option<String>>(3).unwrap_or_default(),
            sequence,
            identity_always: match identity.as_str() {
                "a" => Some(true),
                "d" => Some(false),
                _ => None,
            },
        });
    }
    Ok(out)
}

/// What follows a foreign key's referenced columns, from `pg_constraint`'s
/// codes, in `pg_get_constraintdef`'s order; the defaults (`MATCH SIMPLE`,
/// `NO ACTION`, not deferrable) are left out, as it leaves them.
fn foreign_key_options(
    matching: &str,
    on_update: &str,
    on_delete: &str,
    deferrable: bool,
    deferred: bool,
    validated: bool,
) -> String {
    let action = |code: &str| match code {
        "r" => Some("RESTRICT"),
        "c" => Some("CASCADE"),
        "n" => Some("SET NULL"),
        "d" => Some("SET DEFAULT"),
        _ => None,
    };
    let mut parts: Vec<String> = Vec::new();
    match matching {
        "f" => parts.push("MATCH FULL".into()),
        "p" => parts.push("MATCH PARTIAL".into()),
        _ => {}
    }
    if let Some(a) = action(on_update) {
        parts.push(format!("ON UPDATE {a}"));
    }
    if let Some(a) = action(on_delete) {
        parts.push(format!("ON DELETE {a}"));
    }
    if deferrable {
        parts.push("DEFERRABLE".into());
    }
    if deferred {
        parts.push("INITIALLY DEFERRED".into());
    }
    if !validated {
        parts.push("NOT VALID".into());
    }
    parts.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn foreign_key_options_leave_out_the_defaults() {
        assert_eq!(foreign_key_options("s", "a", "a", false, false, true), "");
        assert_eq!(
            foreign_key_options("f", "c", "n", true, true, false),
            "MATCH FULL ON UPDATE CASCADE ON DELETE SET NULL DEFERRABLE INITIALLY DEFERRED NOT VALID"
        );
        assert_eq!(foreign_key_options("s", "r", "d", false, false, true), "ON UPDATE RESTRICT ON DELETE SET DEFAULT");
    }
}
