//! Which DDL changes the values of rows the binlog holds no change for
//! (issue #46, "never a silent difference").
//!
//! A copying `ALTER TABLE` (a generated column added, a column's type
//! converted, a charset conversion) and even an in-place one (a VIRTUAL
//! column, a default computed per row) give the rows already in the table
//! values that no row event carries: a destination that only streams keeps
//! the old values, or NULL, for ever. Each ALTER operation is judged here:
//! one that may change a value is said (the table is then copied again,
//! `SourceMessage::TableRewritten`), with why; one that keeps every value
//! (pure widening, renames, a nullable column or one with a constant
//! default the topic carries, indexes, engine and comments) is not. Where a
//! case is not known to keep every value, it is said: a needless copy costs
//! time, a missed one is a silent difference.

use sqlparser::ast::{
    AlterColumnOperation, AlterTableOperation, ColumnOption, ColumnOptionDef, Expr, ObjectName, TableConstraint,
    UnaryOperator, Value as SqlValue,
};
use tributary_schemas::mapping::TypeText;

use super::history::ColumnDef;

/// What the binlog's QUERY event says about the session that ran a
/// statement, as far as it decides whether a conversion may change a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Session {
    /// `sql_mode` had `STRICT_TRANS_TABLES` or `STRICT_ALL_TABLES`: a
    /// conversion that would clamp a number, drop an enum label in use or
    /// make a NULL a zero fails the whole ALTER instead (the rows keep their
    /// values, and nothing is logged). Unknown counts as not strict.
    pub strict: bool,
}

/// The statement-wide context of one ALTER's operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AlterContext {
    /// The session.
    pub session: Session,
    /// `ALTER IGNORE TABLE` (MariaDB): conversions never fail (as without
    /// strict mode), and rows that break a new unique key are deleted.
    pub ignore: bool,
}

impl AlterContext {
    /// Whether a conversion that cannot keep a value fails the ALTER.
    fn strict(&self) -> bool {
        self.session.strict && !self.ignore
    }
}

/// A MySQL column type taken apart as far as its values go.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Shape {
    /// `tinyint` .. `bigint` (`bool` is `tinyint(1)`).
    Int { bytes: u32, unsigned: bool },
    /// `decimal(p,s)`.
    Decimal { precision: u32, scale: u32, unsigned: bool },
    /// `float`, `double`, with `(m,d)` when given (values rounded to `d`
    /// digits).
    Float {
        double: bool,
        digits: Option<(u32, u32)>,
        unsigned: bool,
    },
    /// `bit(n)`.
    Bit(u32),
    /// `char(n)` (`fixed`: trailing spaces are not kept), `varchar(n)`,
    /// the text types: at most `chars` characters, at least
    /// `guaranteed` characters of any character set (a text type holds
    /// bytes: 4 per character in utf8mb4).
    Text { fixed: bool, chars: u64, guaranteed: u64 },
    /// `binary(n)` (`fixed`: padded with zero bytes to `n`), `varbinary`,
    /// the blob types.
    Blob { fixed: bool, bytes: u64 },
    /// `enum(...)`.
    Enum(Vec<String>),
    /// `set(...)`.
    Set(Vec<String>),
    /// `date`.
    Date,
    /// `time(fsp)`.
    Time(u32),
    /// `datetime(fsp)`.
    Datetime(u32),
    /// `timestamp(fsp)`.
    Timestamp(u32),
    /// `year`.
    Year,
    /// `json` (MariaDB: an alias of `longtext`).
    Json,
    /// Anything else, by its normalized text.
    Other(String),
}

/// Bytes per character in the widest character set (utf8mb4).
const MAX_BYTES_PER_CHAR: u64 = 4;
/// LONGTEXT's and LONGBLOB's size in bytes.
const LONGTEXT_BYTES: u64 = 4_294_967_295;

impl Shape {
    fn parse(text: &str) -> Shape {
        let Some(mut tt) = TypeText::parse(text) else {
            return Shape::Other(text.trim().to_ascii_lowercase());
        };
        let modifiers = ["unsigned", "signed", "zerofill"];
        let (base, moved): (Vec<&str>, Vec<&str>) = tt.base.split(' ').partition(|w| !modifiers.contains(w));
        // ZEROFILL implies UNSIGNED.
        let unsigned = tt
            .suffix
            .split(' ')
            .chain(moved.iter().copied())
            .any(|w| w == "unsigned" || w == "zerofill");
        tt.base = base.join(" ");
        let n = |i: usize| tt.num(i);
        let text_of = |bytes: u64| Shape::Text {
            fixed: false,
            chars: bytes,
            guaranteed: bytes / MAX_BYTES_PER_CHAR,
        };
        let int = |bytes: u32| Shape::Int { bytes, unsigned };
        match tt.base.as_str() {
            "bool" | "boolean" => Shape::Int { bytes: 1, unsigned: false },
            "tinyint" | "int1" => int(1),
            "smallint" | "int2" => int(2),
            "mediumint" | "int3" | "middleint" => int(3),
            "int" | "integer" | "int4" => int(4),
            "bigint" | "int8" => int(8),
            "serial" => Shape::Int { bytes: 8, unsigned: true },
            "decimal" | "numeric" | "dec" | "fixed" => Shape::Decimal {
                precision: n(0).unwrap_or(10),
                scale: n(1).unwrap_or(0),
                unsigned,
            },
            "float" => match (n(0), n(1)) {
                (Some(p), None) => Shape::Float { double: p > 24, digits: None, unsigned },
                (Some(m), Some(d)) => Shape::Float { double: false, digits: Some((m, d)), unsigned },
                _ => Shape::Float { double: false, digits: None, unsigned },
            },
            "double" | "double precision" | "real" | "float8" => {
                Shape::Float { double: true, digits: n(0).zip(n(1)), unsigned }
            }
            "float4" => Shape::Float { double: false, digits: None, unsigned },
            "bit" => Shape::Bit(n(0).unwrap_or(1)),
            "char" | "character" | "nchar" | "national char" | "national character" => {
                let chars = u64::from(n(0).unwrap_or(1));
                Shape::Text { fixed: true, chars, guaranteed: chars }
            }
            "varchar"
            | "character varying"
            | "nvarchar"
            | "national varchar"
            | "national character varying"
            | "varchar2" => {
                let chars = u64::from(n(0).unwrap_or(0));
                Shape::Text { fixed: false, chars, guaranteed: chars }
            }
            "tinytext" => text_of(255),
            "text" => text_of(65_535),
            "mediumtext" | "long varchar" | "long" => text_of(16_777_215),
            "longtext" => text_of(LONGTEXT_BYTES),
            "json" => Shape::Json,
            "binary" => Shape::Blob { fixed: true, bytes: u64::from(n(0).unwrap_or(1)) },
            "varbinary" => Shape::Blob { fixed: false, bytes: u64::from(n(0).unwrap_or(0)) },
            "tinyblob" => Shape::Blob { fixed: false, bytes: 255 },
            "blob" => Shape::Blob { fixed: false, bytes: 65_535 },
            "mediumblob" | "long varbinary" => Shape::Blob { fixed: false, bytes: 16_777_215 },
            "longblob" => Shape::Blob { fixed: false, bytes: LONGTEXT_BYTES },
            "enum" => Shape::Enum(tt.args.clone()),
            "set" => Shape::Set(tt.args.clone()),
            "date" => Shape::Date,
            "time" => Shape::Time(n(0).unwrap_or(0)),
            "datetime" => Shape::Datetime(n(0).unwrap_or(0)),
            "timestamp" => Shape::Timestamp(n(0).unwrap_or(0)),
            "year" => Shape::Year,
            _ => Shape::Other(
                text.split_whitespace()
                    .map(str::to_ascii_lowercase)
                    .collect::<Vec<_>>()
                    .join(" "),
            ),
        }
    }

    /// The integers of `bytes` bytes: (min, max).
    fn int_range(bytes: u32, unsigned: bool) -> (i128, i128) {
        let bits = bytes * 8;
        if unsigned {
            (0, (1i128 << bits) - 1)
        } else {
            (-(1i128 << (bits - 1)), (1i128 << (bits - 1)) - 1)
        }
    }

    fn is_text(&self) -> bool {
        matches!(self, Shape::Text { .. } | Shape::Enum(_) | Shape::Set(_) | Shape::Json)
    }
}

/// How a conversion from one type to another treats the values.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Conversion {
    /// Every value stays the same.
    Keeps,
    /// Values outside the new type fail the ALTER in strict mode (clamped,
    /// emptied or zeroed without it): kept when the session is strict.
    FailsOrKeeps(String),
    /// Some values may change (rounded, truncated, re-encoded, padded),
    /// whatever the mode.
    Changes(String),
}

/// How MySQL converts the values of `old` into `new`.
fn conversion(old: &Shape, new: &Shape) -> Conversion {
    use Conversion::*;
    use Shape as S;
    if old == new {
        return Keeps;
    }
    match (old, new) {
        (S::Int { bytes: ob, unsigned: ou }, S::Int { bytes: nb, unsigned: nu }) => {
            let (omin, omax) = Shape::int_range(*ob, *ou);
            let (nmin, nmax) = Shape::int_range(*nb, *nu);
            if nmin <= omin && omax <= nmax {
                Keeps
            } else {
                FailsOrKeeps("a smaller integer range: values outside it are clamped".into())
            }
        }
        (S::Int { bytes, unsigned }, S::Decimal { precision, scale, unsigned: du }) => {
            let (min, max) = Shape::int_range(*bytes, *unsigned);
            let digits = max.max(-min).to_string().len() as u32;
            if precision.saturating_sub(*scale) >= digits && (!du || *unsigned) {
                Keeps
            } else {
                FailsOrKeeps("a decimal with fewer integer digits: values outside it are clamped".into())
            }
        }
        (S::Int { bytes, .. }, S::Float { double, digits: None, .. }) => {
            // A float holds integers up to 2^24 exactly, a double up to 2^53.
            let exact_bits = if *double { 53 } else { 24 };
            if bytes * 8 <= exact_bits {
                Keeps
            } else {
                Changes("a floating-point type rounds the larger integers".into())
            }
        }
        (
            S::Decimal { precision: op, scale: os, unsigned: ou },
            S::Decimal { precision: np, scale: ns, unsigned: nu },
        ) => {
            if ns < os {
                Changes(format!("{os} to {ns} digits after the point rounds the values"))
            } else if np.saturating_sub(*ns) < op.saturating_sub(*os) || (*nu && !ou) {
                FailsOrKeeps("fewer integer digits: values outside them are clamped".into())
            } else {
                Keeps
            }
        }
        (S::Float { double: false, digits: None, .. }, S::Float { double: true, digits: None, .. }) => Keeps,
        (S::Float { .. }, S::Float { .. }) => {
            Changes("a floating-point type of less precision rounds the values".into())
        }
        (S::Bit(_), S::Bit(_)) => Changes("a BIT of another width holds its values in another number of bytes".into()),
        (S::Text { fixed: of, chars: oc, .. }, S::Text { fixed: nf, guaranteed: ng, .. }) => {
            if *nf && !of {
                Changes("CHAR drops the trailing spaces of the values".into())
            } else if oc <= ng {
                Keeps
            } else {
                Changes("a shorter text type truncates the longer values".into())
            }
        }
        // MariaDB's JSON is LONGTEXT (MySQL 8 would parse and normalize
        // text made JSON: another kind, below).
        (S::Json, S::Text { fixed: false, chars: LONGTEXT_BYTES, .. })
        | (S::Text { fixed: false, chars: LONGTEXT_BYTES, .. }, S::Json) => Keeps,
        (S::Blob { fixed: of, bytes: ob }, S::Blob { fixed: nf, bytes: nb }) => {
            if *nf && (!of || nb != ob) {
                Changes("BINARY pads the values with zero bytes to its length".into())
            } else if nb >= ob {
                Keeps
            } else {
                Changes("a shorter binary type truncates the longer values".into())
            }
        }
        (S::Enum(old), S::Enum(new)) => {
            if old.iter().all(|l| new.contains(l)) {
                Keeps
            } else {
                FailsOrKeeps("labels in use that the new list lacks become ''".into())
            }
        }
        (S::Set(old), S::Set(new)) => {
            if new.starts_with(old) {
                Keeps
            } else {
                Changes("a SET whose members are removed or reordered changes the values' text".into())
            }
        }
        (S::Time(o), S::Time(n)) | (S::Datetime(o), S::Datetime(n)) | (S::Timestamp(o), S::Timestamp(n)) => {
            if n >= o {
                Keeps
            } else {
                Changes(format!("{o} to {n} fractional digits of a second rounds or truncates the values"))
            }
        }
        (S::Other(a), S::Other(b)) if a == b => Keeps,
        _ => Changes("a type of another kind converts the values".into()),
    }
}

/// Why `MODIFY` / `CHANGE` of `old` to `new_type` with `options` may change
/// the values the rows hold; `None` when it keeps every one.
pub fn modified_column(
    old: &ColumnDef,
    new_type: &str,
    options: &[ColumnOption],
    ctx: &AlterContext,
) -> Option<String> {
    let name = &old.name;
    if let Some(why) = generated(options) {
        return Some(format!("column {name} made {why}: the server computed its values for every row"));
    }
    if options.iter().any(is_auto_increment) && !old.auto_increment {
        return Some(format!("column {name} made AUTO_INCREMENT: its zeros (and NULLs) were numbered"));
    }
    let (before, after) = (Shape::parse(&old.type_text), Shape::parse(new_type));
    match conversion(&before, &after) {
        Conversion::Keeps => {}
        Conversion::FailsOrKeeps(_) if ctx.strict() => {}
        Conversion::FailsOrKeeps(why) | Conversion::Changes(why) => {
            return Some(format!("column {name} changed from {} to {new_type}: {why}", old.type_text));
        }
    }
    if after.is_text() {
        match charset_of(options) {
            Some(cs) if !is_utf8mb4(&cs) => {
                return Some(format!("column {name} converted to character set {cs}: characters it lacks became '?'"))
            }
            Some(_) => {}
            // Without a character set MODIFY converts the column to the
            // table's default one, which the history does not know.
            None if !ctx.strict() => {
                return Some(format!(
                    "column {name} changed without strict mode nor a character set: converted to the table's \
                     default one, characters it lacks became '?'"
                ))
            }
            None => {}
        }
    }
    let made_not_null = options
        .iter()
        .any(|o| matches!(o, ColumnOption::NotNull | ColumnOption::PrimaryKey(_)));
    if made_not_null && old.nullable && !ctx.strict() {
        return Some(format!("column {name} made NOT NULL without strict mode: its NULLs became zeros"));
    }
    None
}

/// Why `ADD COLUMN` of `column` gives the rows already there values that the
/// topic does not carry; `None` when they are NULL or a constant default
/// carried as the column's default (see `docs/schema-changes.md`).
pub fn added_column(column: &sqlparser::ast::ColumnDef) -> Option<String> {
    let name = &column.name.value;
    let options: Vec<ColumnOption> = column.options.iter().map(|o| o.option.clone()).collect();
    if let Some(why) = generated(&options) {
        return Some(format!("{why} column {name} added: the server computed its values for every row"));
    }
    if options.iter().any(is_auto_increment) {
        return Some(format!("AUTO_INCREMENT column {name} added: every row got a number"));
    }
    let shape = Shape::parse(&column.data_type.to_string());
    let not_null = options
        .iter()
        .any(|o| matches!(o, ColumnOption::NotNull | ColumnOption::PrimaryKey(_)));
    let explicit_null = options.iter().any(|o| matches!(o, ColumnOption::Null));
    match default_of(&options) {
        Some(ColumnDefault::Null) => None,
        Some(ColumnDefault::Literal { text, string }) => (!literal_is_exact(&shape, &text, string)).then(|| {
            format!("column {name} added with the default {}: the rows got the value the column's type makes of it, which is not carried exactly", quoted(&text, string))
        }),
        Some(ColumnDefault::Expression(e)) => Some(format!(
            "column {name} added with the default {e}: every row got a value computed when the ALTER ran"
        )),
        // No default: NULL, or a NOT NULL column's implicit value.
        None if matches!(shape, Shape::Timestamp(_)) && !explicit_null => Some(format!(
            "TIMESTAMP column {name} added without a default: the rows' value depends on \
             explicit_defaults_for_timestamp"
        )),
        None if not_null => (!implicit_is_carried(&shape)).then(|| {
            format!("NOT NULL column {name} added without a default: the rows got its type's implicit value, which is not carried")
        }),
        None => None,
    }
}

/// Why an `ALTER TABLE` operation other than a column's definition may
/// change rows without row events; `None` when it does not.
pub fn other_operation(op: &AlterTableOperation, ctx: &AlterContext) -> Option<String> {
    match op {
        AlterTableOperation::AddConstraint {
            constraint: TableConstraint::PrimaryKey(_) | TableConstraint::Unique(_),
            ..
        } if ctx.ignore => Some("ALTER IGNORE added a unique key: rows that broke it were deleted".into()),
        AlterTableOperation::DropPartitions { .. } => Some("DROP PARTITION deleted the partition's rows".into()),
        AlterTableOperation::AlterColumn { column_name, op } => match op {
            AlterColumnOperation::SetNotNull if !ctx.strict() => {
                Some(format!("column {} made NOT NULL without strict mode: its NULLs became zeros", column_name.value))
            }
            AlterColumnOperation::SetDataType { .. } | AlterColumnOperation::AddGenerated { .. } => {
                Some(format!("column {} changed by ALTER COLUMN: its values may have changed", column_name.value))
            }
            _ => None,
        },
        _ => None,
    }
}

/// A clause sqlparser does not read (MariaDB and MySQL table options,
/// partition maintenance, `CONVERT TO CHARACTER SET`): why it may change
/// rows without row events (`Err` when not known: the caller copies the
/// table again, saying so), `Ok(None)` when it keeps every row as it is.
/// `exchanged` gets the table of `EXCHANGE PARTITION ... WITH TABLE`.
pub fn unparsed_clause(clause: &str, exchanged: &mut Option<String>) -> Result<Option<String>, String> {
    let words = words(clause);
    let w = |i: usize| words.get(i).map(String::as_str).unwrap_or("");
    let first = w(0);
    let second = w(1);
    let keeps = Ok(None);
    match (first, second) {
        ("CONVERT", "TO") => {
            // CONVERT TO CHARACTER SET x / CONVERT TO CHARSET x
            let cs = if w(2) == "CHARSET" { w(3) } else { w(4) };
            if is_utf8mb4(cs) {
                keeps
            } else {
                Ok(Some(format!(
                    "CONVERT TO CHARACTER SET {}: text columns were converted, characters it lacks became '?'",
                    cs.to_ascii_lowercase()
                )))
            }
        }
        ("DEFAULT", "CHARACTER" | "CHARSET" | "COLLATE") | ("CHARACTER", "SET") | ("CHARSET" | "COLLATE", _) => keeps,
        ("ENGINE", _) => {
            let engine = words
                .iter()
                .find(|x| *x != "ENGINE" && *x != "=")
                .map(String::as_str)
                .unwrap_or("");
            if matches!(engine, "INNODB" | "MYISAM" | "ARIA" | "MEMORY" | "HEAP" | "ROCKSDB" | "TOKUDB" | "XTRADB") {
                keeps
            } else {
                Ok(Some(format!(
                    "ENGINE={}: the table's rows may not have been kept as they were",
                    engine.to_ascii_lowercase()
                )))
            }
        }
        (
            "FORCE"
            | "ROW_FORMAT"
            | "KEY_BLOCK_SIZE"
            | "COMMENT"
            | "AUTO_INCREMENT"
            | "AVG_ROW_LENGTH"
            | "CHECKSUM"
            | "TABLE_CHECKSUM"
            | "PAGE_CHECKSUM"
            | "MAX_ROWS"
            | "MIN_ROWS"
            | "PACK_KEYS"
            | "STATS_AUTO_RECALC"
            | "STATS_PERSISTENT"
            | "STATS_SAMPLE_PAGES"
            | "TRANSACTIONAL"
            | "ENCRYPTED"
            | "ENCRYPTION"
            | "ENCRYPTION_KEY_ID"
            | "PAGE_COMPRESSED"
            | "PAGE_COMPRESSION_LEVEL"
            | "IETF_QUOTES"
            | "DELAY_KEY_WRITE"
            | "INSERT_METHOD"
            | "UNION"
            | "DATA"
            | "INDEX"
            | "ALGORITHM"
            | "LOCK"
            | "ENABLE"
            | "DISABLE"
            | "ORDER"
            | "REMOVE"
            | "COALESCE"
            | "REORGANIZE"
            | "ANALYZE"
            | "CHECK"
            | "OPTIMIZE"
            | "REBUILD"
            | "REPAIR"
            | "PARTITION"
            | "NOWAIT"
            | "WAIT"
            | "VALIDATION"
            | "WITH"
            | "WITHOUT"
            | "SEQUENCE",
            _,
        ) => keeps,
        ("ADD", "INDEX" | "KEY" | "FULLTEXT" | "SPATIAL" | "FOREIGN" | "CHECK" | "PARTITION" | "PERIOD")
        | ("DROP", "INDEX" | "KEY" | "FOREIGN" | "CHECK" | "CONSTRAINT" | "PERIOD")
        | ("RENAME", "INDEX" | "KEY")
        | ("ALTER", "INDEX" | "KEY") => keeps,
        ("TRUNCATE", "PARTITION") => Ok(Some("TRUNCATE PARTITION deleted the partition's rows".into())),
        ("DROP", "PARTITION") => Ok(Some("DROP PARTITION deleted the partition's rows".into())),
        ("EXCHANGE", "PARTITION") => {
            if let Some(i) = words.iter().position(|x| x == "TABLE") {
                *exchanged = raw_words(clause).get(i + 1).cloned();
            }
            Ok(Some("EXCHANGE PARTITION swapped the partition's rows with another table's".into()))
        }
        ("IMPORT" | "DISCARD", _) => {
            Ok(Some(format!("{} TABLESPACE: the table's rows were replaced", first.to_ascii_uppercase())))
        }
        ("DROP", "SYSTEM") => Ok(Some("DROP SYSTEM VERSIONING deleted the history rows".into())),
        _ => Err(format!("ALTER TABLE clause `{}` not understood", clause_head(clause))),
    }
}

/// The first few words of a clause, for a reason or a log line (never a
/// literal's content: values are not logged).
pub fn clause_head(clause: &str) -> String {
    words(clause)
        .into_iter()
        .filter(|w| !w.starts_with(['\'', '"']))
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

fn quoted(text: &str, string: bool) -> String {
    if string {
        format!("'{text}'")
    } else {
        text.to_string()
    }
}

/// `STORED`/`PERSISTENT` or `VIRTUAL` of a generated column definition.
fn generated(options: &[ColumnOption]) -> Option<&'static str> {
    use sqlparser::ast::{GeneratedAs, GeneratedExpressionMode};
    options.iter().find_map(|o| match o {
        ColumnOption::Generated {
            generated_as,
            generation_expr: Some(_),
            generation_expr_mode,
            ..
        } => Some(
            if matches!(generation_expr_mode, Some(GeneratedExpressionMode::Stored))
                || matches!(generated_as, GeneratedAs::ExpStored)
            {
                "a stored generated"
            } else {
                "a generated"
            },
        ),
        ColumnOption::Materialized(_) | ColumnOption::Alias(_) => Some("a generated"),
        _ => None,
    })
}

fn is_auto_increment(option: &ColumnOption) -> bool {
    match option {
        ColumnOption::DialectSpecific(tokens) => {
            tokens.iter().any(|t| t.to_string().eq_ignore_ascii_case("AUTO_INCREMENT"))
        }
        _ => false,
    }
}

/// Whether `options` mark an AUTO_INCREMENT column (for the history).
pub fn marks_auto_increment(options: &[ColumnOptionDef]) -> bool {
    options.iter().any(|o| is_auto_increment(&o.option))
}

fn charset_of(options: &[ColumnOption]) -> Option<String> {
    options.iter().find_map(|o| match o {
        ColumnOption::CharacterSet(name) => Some(object_name(name)),
        // A collation names its character set before the first `_`.
        ColumnOption::Collation(name) => {
            let c = object_name(name);
            Some(c.split('_').next().unwrap_or(&c).to_string())
        }
        _ => None,
    })
}

fn object_name(name: &ObjectName) -> String {
    name.0
        .iter()
        .filter_map(|p| p.as_ident().map(|i| i.value.to_ascii_lowercase()))
        .collect::<Vec<_>>()
        .join(".")
}

fn is_utf8mb4(charset: &str) -> bool {
    charset.eq_ignore_ascii_case("utf8mb4")
}

/// A column's `DEFAULT`.
enum ColumnDefault {
    Null,
    /// A number (`string` false) or a quoted string.
    Literal {
        text: String,
        string: bool,
    },
    /// Anything computed: `CURRENT_TIMESTAMP`, `(uuid())`, `(a + 1)`.
    Expression(String),
}

fn default_of(options: &[ColumnOption]) -> Option<ColumnDefault> {
    let expr = options.iter().find_map(|o| match o {
        ColumnOption::Default(e) => Some(e),
        _ => None,
    })?;
    let shown = expr.to_string();
    let (negative, inner) = match expr {
        Expr::UnaryOp { op: UnaryOperator::Minus, expr } => (true, &**expr),
        e => (false, e),
    };
    let Expr::Value(v) = inner else {
        return Some(ColumnDefault::Expression(shown));
    };
    Some(match &v.value {
        SqlValue::Null if !negative => ColumnDefault::Null,
        SqlValue::Number(n, _) => ColumnDefault::Literal {
            text: if negative { format!("-{n}") } else { n.to_string() },
            string: false,
        },
        SqlValue::SingleQuotedString(t) | SqlValue::DoubleQuotedString(t) if !negative => {
            ColumnDefault::Literal { text: t.clone(), string: true }
        }
        SqlValue::Boolean(b) if !negative => ColumnDefault::Literal {
            text: if *b { "1" } else { "0" }.into(),
            string: false,
        },
        _ => ColumnDefault::Expression(shown),
    })
}

/// Whether the constant `text` is the value a column of `shape` stores for
/// it, exactly as the source carries it as the column's default (the text
/// decoded like a value of the column): no rounding, padding, truncation,
/// time zone or reordering by the server.
fn literal_is_exact(shape: &Shape, text: &str, string: bool) -> bool {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let number = |s: &str| -> Option<(bool, String, String)> {
        let (neg, rest) = match s.strip_prefix('-') {
            Some(r) => (true, r),
            None => (false, s.strip_prefix('+').unwrap_or(s)),
        };
        let (int, frac) = rest.split_once('.').unwrap_or((rest, ""));
        if (int.is_empty() && frac.is_empty()) || !(int.is_empty() || digits(int)) || !(frac.is_empty() || digits(frac))
        {
            return None;
        }
        Some((neg, int.trim_start_matches('0').to_string(), frac.trim_end_matches('0').to_string()))
    };
    match shape {
        Shape::Int { bytes, unsigned } => {
            let (min, max) = Shape::int_range(*bytes, *unsigned);
            text.parse::<i128>().is_ok_and(|v| (min..=max).contains(&v))
        }
        Shape::Decimal { precision, scale, unsigned } => number(text).is_some_and(|(neg, int, frac)| {
            (!neg || !unsigned)
                && frac.len() <= *scale as usize
                && int.len() <= precision.saturating_sub(*scale) as usize
        }),
        Shape::Float { digits: None, .. } => text.parse::<f64>().is_ok_and(f64::is_finite) && number(text).is_some(),
        Shape::Float { digits: Some((m, d)), .. } => number(text)
            .is_some_and(|(_, int, frac)| frac.len() <= *d as usize && int.len() <= m.saturating_sub(*d) as usize),
        Shape::Text { fixed, chars, .. } => {
            string && (text.chars().count() as u64) <= *chars && !(*fixed && text.ends_with(' '))
        }
        Shape::Enum(labels) => string && labels.iter().any(|l| l == text),
        Shape::Set(labels) => {
            // Members in declaration order, each once: the text MySQL
            // writes back.
            string
                && (text.is_empty() || {
                    let positions: Vec<Option<usize>> =
                        text.split(',').map(|m| labels.iter().position(|l| l == m)).collect();
                    positions.iter().all(Option::is_some) && positions.windows(2).all(|w| w[0] < w[1])
                })
        }
        Shape::Date => string && is_date(text),
        Shape::Datetime(fsp) => string && is_datetime(text, *fsp),
        Shape::Time(fsp) => string && is_time(text, *fsp),
        Shape::Year => text.parse::<u32>().is_ok_and(|y| (1901..=2155).contains(&y)) && text.len() == 4,
        Shape::Json => string,
        // TIMESTAMP literals are read in the session's time zone; BIT and
        // binary literals are not their text's bytes.
        Shape::Timestamp(_) | Shape::Bit(_) | Shape::Blob { .. } | Shape::Other(_) => false,
    }
}

/// Whether the value a NOT NULL column of `shape` added without a default
/// gives the rows already there is carried (see `added_default` in
/// `mod.rs`: zero, '', the first enum label, the zero date read as the
/// epoch).
fn implicit_is_carried(shape: &Shape) -> bool {
    match shape {
        Shape::Int { .. } | Shape::Decimal { .. } | Shape::Float { .. } | Shape::Text { .. } | Shape::Set(_) => true,
        Shape::Enum(labels) => !labels.is_empty(),
        Shape::Date | Shape::Datetime(_) | Shape::Year | Shape::Time(_) => true,
        Shape::Blob { fixed: false, .. } => true,
        // BINARY(n)'s n zero bytes, a BIT's zero bytes (not their text), a
        // TIMESTAMP's (explicit_defaults_for_timestamp), JSON's: not here.
        _ => false,
    }
}

fn is_date(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 10
        && b[4] == b'-'
        && b[7] == b'-'
        && [&s[..4], &s[5..7], &s[8..10]]
            .iter()
            .all(|p| p.bytes().all(|c| c.is_ascii_digit()))
}

fn is_clock(s: &str, fsp: u32, hours_any: bool) -> bool {
    let (clock, frac) = s.split_once('.').unwrap_or((s, ""));
    let parts: Vec<&str> = clock.split(':').collect();
    let digits = |p: &str| !p.is_empty() && p.bytes().all(|c| c.is_ascii_digit());
    parts.len() == 3
        && parts.iter().all(|p| digits(p))
        && (hours_any || parts[0].len() == 2)
        && parts[1].len() == 2
        && parts[2].len() == 2
        && parts[1] < "60"
        && parts[2] < "60"
        && (frac.is_empty() || (digits(frac) && frac.trim_end_matches('0').len() <= fsp as usize))
}

fn is_datetime(s: &str, fsp: u32) -> bool {
    match s.split_once(' ') {
        Some((d, t)) => is_date(d) && is_clock(t, fsp, false),
        None => is_date(s),
    }
}

/// `[-]H:MM:SS[.f]` within TIME's range, -838:59:59 to 838:59:59.
fn is_time(s: &str, fsp: u32) -> bool {
    let clock = s.strip_prefix('-').unwrap_or(s);
    let seconds = |c: &str| -> Option<u64> {
        let mut parts = c.split('.').next()?.split(':').map(|p| p.parse::<u64>().ok());
        Some(parts.next()?? * 3600 + parts.next()?? * 60 + parts.next()??)
    };
    let max = 838 * 3600 + 59 * 60 + 59;
    let has_fraction = clock.split_once('.').is_some_and(|(_, f)| f.bytes().any(|b| b != b'0'));
    is_clock(clock, fsp, true) && seconds(clock).is_some_and(|v| v < max || (v == max && !has_fraction))
}

/// The words of a clause outside quotes and parentheses, upper-case, with
/// `=` as a word of its own.
fn words(clause: &str) -> Vec<String> {
    raw_words(clause).into_iter().map(|w| w.to_ascii_uppercase()).collect()
}

/// The words of a clause outside parentheses (quoted names as written).
fn raw_words(clause: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    let mut depth = 0usize;
    let mut chars = clause.chars().peekable();
    let flush = |current: &mut String, out: &mut Vec<String>| {
        if !current.is_empty() {
            out.push(std::mem::take(current));
        }
    };
    while let Some(c) = chars.next() {
        match c {
            '\'' | '"' | '`' => {
                // A quoted string or name: kept whole in a word at depth 0.
                let mut quoted = String::from(c);
                while let Some(d) = chars.next() {
                    quoted.push(d);
                    if d == '\\' && c != '`' {
                        if let Some(e) = chars.next() {
                            quoted.push(e);
                        }
                    } else if d == c {
                        if chars.peek() == Some(&c) {
                            quoted.push(c);
                            chars.next();
                        } else {
                            break;
                        }
                    }
                }
                if depth == 0 {
                    current.push_str(&quoted);
                }
            }
            '(' => {
                flush(&mut current, &mut out);
                depth += 1;
            }
            ')' => depth = depth.saturating_sub(1),
            '=' if depth == 0 => {
                flush(&mut current, &mut out);
                out.push("=".into());
            }
            c if c.is_whitespace() && depth == 0 => flush(&mut current, &mut out),
            c if c.is_whitespace() => {}
            c if depth == 0 => current.push(c),
            _ => {}
        }
    }
    flush(&mut current, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn col(type_text: &str, nullable: bool) -> ColumnDef {
        ColumnDef {
            name: "c".into(),
            type_text: type_text.into(),
            nullable,
            added_default: None,
            aliases: Vec::new(),
            auto_increment: false,
        }
    }

    fn conv(old: &str, new: &str) -> Conversion {
        conversion(&Shape::parse(old), &Shape::parse(new))
    }

    #[test]
    fn widening_keeps_and_narrowing_does_not() {
        use Conversion::*;
        // Catalog spelling (COLUMN_TYPE) to the DDL's (sqlparser's).
        for (old, new) in [
            ("int(11)", "BIGINT"),
            ("tinyint(4)", "SMALLINT"),
            ("smallint(5) unsigned", "MEDIUMINT"),
            ("int(10) unsigned", "BIGINT"),
            ("int(11)", "DECIMAL(12,2)"),
            ("smallint(6)", "DOUBLE"),
            ("decimal(8,2)", "DECIMAL(12,2)"),
            ("decimal(8,2)", "DECIMAL(9,3)"),
            ("float", "DOUBLE"),
            ("varchar(10)", "VARCHAR(40)"),
            ("varchar(10)", "TEXT"),
            ("char(10)", "VARCHAR(10)"),
            ("char(5)", "CHAR(10)"),
            ("text", "MEDIUMTEXT"),
            ("tinytext", "VARCHAR(255)"),
            ("varbinary(4)", "VARBINARY(8)"),
            ("binary(4)", "VARBINARY(4)"),
            ("blob", "LONGBLOB"),
            ("enum('a','b')", "ENUM('b', 'a', 'c')"),
            ("set('a','b')", "SET('a', 'b', 'c')"),
            ("datetime(3)", "DATETIME(6)"),
            ("time", "TIME(6)"),
            ("timestamp(0)", "TIMESTAMP(3)"),
            ("longtext", "JSON"),
            ("int(11) unsigned zerofill", "BIGINT UNSIGNED"),
        ] {
            assert_eq!(conv(old, new), Keeps, "{old} -> {new}");
        }
        for (old, new) in [
            ("bigint(20)", "INT"),
            ("int(11)", "TINYINT"),
            ("int(11)", "INT UNSIGNED"),
            ("int(10) unsigned", "INT"),
            ("decimal(8,2)", "DECIMAL(7,2)"),
            ("int(11)", "DECIMAL(8,2)"),
            ("enum('a','b','c')", "ENUM('a', 'b')"),
        ] {
            assert!(matches!(conv(old, new), FailsOrKeeps(_)), "{old} -> {new}: {:?}", conv(old, new));
        }
        for (old, new) in [
            ("decimal(8,2)", "DECIMAL(8,1)"),
            ("double", "FLOAT"),
            ("double", "DOUBLE(10,2)"),
            ("bigint(20)", "DOUBLE"),
            ("varchar(20)", "VARCHAR(5)"),
            ("varchar(20)", "CHAR(20)"),
            ("text", "VARCHAR(100)"),
            ("varchar(20000)", "TEXT"),
            ("binary(4)", "BINARY(8)"),
            ("varbinary(8)", "VARBINARY(4)"),
            ("bit(8)", "BIT(16)"),
            ("set('a','b')", "SET('b', 'a')"),
            ("datetime(6)", "DATETIME"),
            ("time(6)", "TIME"),
            ("timestamp(6)", "TIMESTAMP(3)"),
            ("date", "DATETIME"),
            ("datetime", "TIMESTAMP"),
            ("int(11)", "VARCHAR(20)"),
            ("varchar(20)", "VARBINARY(80)"),
            ("year(4)", "INT"),
            ("inet6", "UUID"),
        ] {
            assert!(matches!(conv(old, new), Changes(_)), "{old} -> {new}: {:?}", conv(old, new));
        }
    }

    #[test]
    fn strict_mode_decides_the_conversions_that_fail_or_keep() {
        let strict = AlterContext { session: Session { strict: true }, ignore: false };
        let lax = AlterContext::default();
        let ignore = AlterContext { session: Session { strict: true }, ignore: true };
        let narrow = |ctx: &AlterContext| modified_column(&col("int(11)", true), "TINYINT", &[], ctx);
        assert_eq!(narrow(&strict), None);
        assert!(narrow(&lax).is_some_and(|r| r.contains("int(11) to TINYINT")), "{:?}", narrow(&lax));
        assert!(narrow(&ignore).is_some());
        // NULL to NOT NULL: refused in strict mode where a NULL is.
        let not_null =
            |ctx: &AlterContext| modified_column(&col("int(11)", true), "INT", &[ColumnOption::NotNull], ctx);
        assert_eq!(not_null(&strict), None);
        assert!(not_null(&lax).is_some_and(|r| r.contains("NOT NULL")));
        // Rounding happens in strict mode too.
        assert!(modified_column(&col("decimal(8,2)", true), "DECIMAL(8,1)", &[], &strict).is_some());
        // A text column without a character set takes the table's default.
        assert_eq!(modified_column(&col("varchar(10)", true), "VARCHAR(40)", &[], &strict), None);
        assert!(modified_column(&col("varchar(10)", true), "VARCHAR(40)", &[], &lax).is_some());
    }

    #[test]
    fn character_sets_other_than_utf8mb4_convert() {
        let strict = AlterContext { session: Session { strict: true }, ignore: false };
        let name = |s: &str| ObjectName::from(vec![sqlparser::ast::Ident::new(s)]);
        let latin1 = [ColumnOption::CharacterSet(name("latin1"))];
        let utf8mb4 = [ColumnOption::Collation(name("utf8mb4_bin"))];
        assert!(modified_column(&col("varchar(10)", true), "VARCHAR(10)", &latin1, &strict)
            .is_some_and(|r| r.contains("latin1")));
        assert_eq!(modified_column(&col("varchar(10)", true), "VARCHAR(10)", &utf8mb4, &strict), None);
        let mut exchanged = None;
        assert!(unparsed_clause("CONVERT TO CHARACTER SET latin1", &mut exchanged)
            .is_ok_and(|r| r.is_some_and(|r| r.contains("latin1"))));
        assert_eq!(unparsed_clause("convert to charset utf8mb4 collate utf8mb4_bin", &mut exchanged), Ok(None));
        assert_eq!(unparsed_clause("DEFAULT CHARSET=latin1", &mut exchanged), Ok(None));
    }

    fn added(sql: &str) -> Option<String> {
        let st = sqlparser::parser::Parser::parse_sql(&sqlparser::dialect::MySqlDialect {}, sql).expect("parses");
        let Some(sqlparser::ast::Statement::AlterTable(at)) = st.into_iter().next() else {
            panic!("{sql}")
        };
        at.operations.iter().find_map(|op| match op {
            AlterTableOperation::AddColumn { column_def, .. } => Some(added_column(column_def)),
            _ => None,
        })?
    }

    #[test]
    fn added_columns_copy_again_when_the_rows_got_what_the_topic_cannot_say() {
        for sql in [
            "ALTER TABLE t ADD COLUMN g INT AS (a * 3) STORED",
            "ALTER TABLE t ADD COLUMN g INT AS (a * 3) VIRTUAL",
            "ALTER TABLE t ADD COLUMN g INT GENERATED ALWAYS AS (a * 3)",
            "ALTER TABLE t ADD COLUMN c DATETIME DEFAULT CURRENT_TIMESTAMP",
            "ALTER TABLE t ADD COLUMN c DATETIME(6) NOT NULL DEFAULT NOW(6)",
            "ALTER TABLE t ADD COLUMN u CHAR(36) DEFAULT (uuid())",
            "ALTER TABLE t ADD COLUMN n INT NOT NULL AUTO_INCREMENT UNIQUE",
            "ALTER TABLE t ADD COLUMN r DECIMAL(5,1) DEFAULT 1.25",
            "ALTER TABLE t ADD COLUMN v VARCHAR(3) DEFAULT 'abcd'",
            "ALTER TABLE t ADD COLUMN ch CHAR(3) DEFAULT 'a '",
            "ALTER TABLE t ADD COLUMN ts TIMESTAMP NOT NULL",
            "ALTER TABLE t ADD COLUMN ts TIMESTAMP DEFAULT '2024-01-01 00:00:00'",
            "ALTER TABLE t ADD COLUMN b BIT(8) DEFAULT 5",
            "ALTER TABLE t ADD COLUMN bn BINARY(4) NOT NULL",
            "ALTER TABLE t ADD COLUMN s SET('a','b') DEFAULT 'b,a'",
            "ALTER TABLE t ADD COLUMN dt DATETIME DEFAULT '2024-01-01 10:00:00.5'",
            "ALTER TABLE t ADD COLUMN d DATE DEFAULT '2024-1-5'",
            "ALTER TABLE t ADD COLUMN i TINYINT DEFAULT 300",
            "ALTER TABLE t ADD COLUMN tm TIME DEFAULT '900:00:00'",
        ] {
            assert!(added(sql).is_some(), "{sql} should copy the table again");
        }
        for sql in [
            "ALTER TABLE t ADD COLUMN d INT",
            "ALTER TABLE t ADD COLUMN e INT DEFAULT 7",
            "ALTER TABLE t ADD COLUMN e INT DEFAULT -7 NOT NULL",
            "ALTER TABLE t ADD COLUMN f VARCHAR(20) NOT NULL DEFAULT 'x'",
            "ALTER TABLE t ADD COLUMN g INT NOT NULL",
            "ALTER TABLE t ADD COLUMN r DECIMAL(5,2) DEFAULT 1.25",
            "ALTER TABLE t ADD COLUMN n INT DEFAULT NULL",
            "ALTER TABLE t ADD COLUMN ts TIMESTAMP NULL",
            "ALTER TABLE t ADD COLUMN en ENUM('a','b') NOT NULL",
            "ALTER TABLE t ADD COLUMN en ENUM('a','b') DEFAULT 'b'",
            "ALTER TABLE t ADD COLUMN s SET('a','b') DEFAULT 'a,b'",
            "ALTER TABLE t ADD COLUMN dt DATETIME(3) DEFAULT '2024-01-01 10:00:00.5'",
            "ALTER TABLE t ADD COLUMN d DATE NOT NULL DEFAULT '2024-01-05'",
            "ALTER TABLE t ADD COLUMN tm TIME(6) DEFAULT '-838:59:58.5'",
            "ALTER TABLE t ADD COLUMN y YEAR DEFAULT 2024",
            "ALTER TABLE t ADD COLUMN b BOOLEAN DEFAULT TRUE",
            "ALTER TABLE t ADD COLUMN x DOUBLE NOT NULL DEFAULT 0.1",
            "ALTER TABLE t ADD COLUMN tm TIME NOT NULL",
        ] {
            assert_eq!(added(sql), None, "{sql} keeps every value (or its default is carried)");
        }
    }

    #[test]
    fn clauses_sqlparser_does_not_read_are_judged_by_their_words() {
        let mut exchanged = None;
        for keeps in [
            "FORCE",
            "ENGINE=InnoDB",
            "ENGINE = Aria",
            "ROW_FORMAT=DYNAMIC",
            "COMMENT 'x'",
            "ALGORITHM=COPY",
            "ADD PARTITION (PARTITION p3 VALUES LESS THAN (30))",
            "REORGANIZE PARTITION p0 INTO (PARTITION a VALUES LESS THAN (5), PARTITION b VALUES LESS THAN (10))",
            "REMOVE PARTITIONING",
            "PARTITION BY HASH(id) PARTITIONS 4",
            "ADD INDEX (a, b)",
            "DISABLE KEYS",
        ] {
            assert_eq!(unparsed_clause(keeps, &mut exchanged), Ok(None), "{keeps}");
        }
        for changes in [
            "TRUNCATE PARTITION p0",
            "DROP PARTITION p0, p1",
            "ENGINE=BLACKHOLE",
            "IMPORT TABLESPACE",
            "DROP SYSTEM VERSIONING",
        ] {
            assert!(unparsed_clause(changes, &mut exchanged).is_ok_and(|r| r.is_some()), "{changes}");
        }
        assert!(
            unparsed_clause("EXCHANGE PARTITION p0 WITH TABLE `db`.`other`", &mut exchanged).is_ok_and(|r| r.is_some())
        );
        assert_eq!(exchanged.as_deref(), Some("`db`.`other`"));
        assert!(unparsed_clause("FROBNICATE EVERYTHING 'secret'", &mut exchanged)
            .is_err_and(|e| e.contains("FROBNICATE") && !e.contains("secret")));
    }

    #[test]
    fn ignore_and_partitions_and_generated_modifications_are_said() {
        let ignore = AlterContext { session: Session { strict: true }, ignore: true };
        let strict = AlterContext { session: Session { strict: true }, ignore: false };
        let st = sqlparser::parser::Parser::parse_sql(
            &sqlparser::dialect::MySqlDialect {},
            "ALTER TABLE t ADD UNIQUE KEY (a), MODIFY s INT AS (a + 100) STORED",
        )
        .expect("parses");
        let Some(sqlparser::ast::Statement::AlterTable(at)) = st.into_iter().next() else {
            panic!()
        };
        assert!(other_operation(&at.operations[0], &ignore).is_some());
        assert_eq!(other_operation(&at.operations[0], &strict), None);
        let AlterTableOperation::ModifyColumn { options, data_type, .. } = &at.operations[1] else {
            panic!()
        };
        assert!(modified_column(&col("int(11)", true), &data_type.to_string(), options, &strict)
            .is_some_and(|r| r.contains("generated")));
        // AUTO_INCREMENT restated on a column that had it keeps the values.
        let mut id = col("int(11)", false);
        id.auto_increment = true;
        let ai = [
            ColumnOption::NotNull,
            ColumnOption::DialectSpecific(vec![sqlparser::tokenizer::Token::make_keyword("AUTO_INCREMENT")]),
        ];
        assert_eq!(modified_column(&id, "BIGINT", &ai, &strict), None);
        id.auto_increment = false;
        assert!(modified_column(&id, "BIGINT", &ai, &strict).is_some());
    }
}
