//! The `SQL_REDO` column of `V$LOGMNR_CONTENTS` parsed into column values.
//!
//! LogMiner renders each row change as a statement. The shapes below are
//! those of Oracle's documentation, *Oracle Database Utilities*, chapter
//! "Using LogMiner to Analyze Redo Log Files" (19c: 22.4 "Examples Using
//! LogMiner", e.g. "Example 1: Finding All Modifications in the Last
//! Archived Redo Log File"), which shows for instance:
//!
//! ```text
//! insert into "HR"."JOBS"("JOB_ID","JOB_TITLE","MIN_SALARY","MAX_SALARY") values ('IT_WT','Technical Writer','4000','11000');
//! update "HR"."JOBS" set "JOB_TITLE" = 'FI_MGR' where "JOB_TITLE" = 'FI_MGRX' and ROWID = 'AAAHSeAABAAAY+CAAX';
//! delete from "OE"."ORDERS" where "ORDER_ID" = '2413' and "PROMOTION_ID" IS NULL and ROWID = 'AAAHTCAABAAAZAPAAN';
//! ```
//!
//! Numbers come quoted like text; dates as `TO_DATE('...', 'mask')` and
//! timestamps as `TO_TIMESTAMP('...')` / `TO_TIMESTAMP_TZ(...)` in the
//! mining session's NLS formats; RAW and BLOB bytes as `HEXTORAW('..')`;
//! NCHAR text as `UNISTR('\00e9')`; a LOB column of a new row as
//! `EMPTY_CLOB()` / `EMPTY_BLOB()` with its content in later LOB_WRITE
//! rows ([`super::lob`]). With supplemental logging of all columns the
//! `where` clause of an update or delete holds the whole before-image and
//! the `set` list the changed columns only.
//!
//! The parser never logs or returns the statement text in errors: it holds
//! row values.

use tributary_schemas::TableId;

use crate::error::{Error, Result};

/// One value as LogMiner writes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Literal {
    /// `NULL` (or `IS NULL` in a where clause).
    Null,
    /// `'text'` (numbers too: LogMiner quotes them), `UNISTR(...)` decoded.
    Str(String),
    /// An unquoted number.
    Number(String),
    /// `HEXTORAW('0a1b')`: the bytes.
    Raw(Vec<u8>),
    /// `TO_DATE(text, mask)`.
    Date {
        /// The value text.
        text: String,
        /// The format mask.
        mask: String,
    },
    /// `TO_TIMESTAMP(text, mask)`.
    Timestamp {
        /// The value text.
        text: String,
        /// The format mask.
        mask: String,
    },
    /// `TO_TIMESTAMP_TZ(text, mask)`.
    TimestampTz {
        /// The value text.
        text: String,
        /// The format mask.
        mask: String,
    },
    /// `TO_YMINTERVAL('+02-03')`.
    YmInterval(String),
    /// `TO_DSINTERVAL('+01 02:03:04.5')`.
    DsInterval(String),
    /// `EMPTY_CLOB()` / `EMPTY_BLOB()`: a LOB whose content follows in
    /// LOB_WRITE rows.
    EmptyLob,
    /// `Unsupported Type`: LogMiner cannot render this column's value.
    Unsupported,
}

/// A parsed row change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Redo {
    /// `insert into "S"."T"("A","B") values (...)`.
    Insert {
        /// The table.
        table: TableId,
        /// Column names and values.
        values: Vec<(String, Literal)>,
    },
    /// `update "S"."T" set ... where ...`.
    Update {
        /// The table.
        table: TableId,
        /// Changed columns.
        set: Vec<(String, Literal)>,
        /// The before-image columns of the where clause.
        before: Vec<(String, Literal)>,
    },
    /// `delete from "S"."T" where ...`.
    Delete {
        /// The table.
        table: TableId,
        /// The before-image columns of the where clause.
        before: Vec<(String, Literal)>,
    },
}

impl Redo {
    /// The table changed.
    pub fn table(&self) -> &TableId {
        match self {
            Redo::Insert { table, .. } | Redo::Update { table, .. } | Redo::Delete { table, .. } => table,
        }
    }
}

/// A token of LogMiner's statement text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Token {
    /// `"NAME"` (with `""` for a quote inside).
    Quoted(String),
    /// A bare word or number: `insert`, `ROWID`, `4000`, `loc_c`, `dbms_lob.write`.
    Word(String),
    /// `'text'` (with `''` for a quote inside).
    Str(String),
    /// One of `( ) , = ; .` or `:=`, `||`.
    Punct(&'static str),
}

/// An error about statement text: never the text itself (row values).
pub(crate) fn malformed(what: &str) -> Error {
    Error::permanent(format!("LogMiner SQL_REDO not understood: {what}"))
        .with_class("tributary.oracle_redo")
        .with_hint(
            "the mining session must use DICTIONARY_FROM_ONLINE_CATALOG (or the redo dictionary) so that SQL_REDO \
             names columns; report the statement shape (without its values) as a bug",
        )
}

/// Splits statement text into tokens.
pub(crate) fn tokenize(sql: &str) -> Result<Vec<Token>> {
    let b = sql.as_bytes();
    let mut i = 0;
    let mut out = Vec::new();
    while i < b.len() {
        let c = b[i];
        match c {
            b' ' | b'\t' | b'\n' | b'\r' => i += 1,
            b'"' | b'\'' => {
                let quote = c;
                let mut text = Vec::new();
                i += 1;
                loop {
                    match b.get(i) {
                        None => return Err(malformed("an unterminated quote")),
                        Some(&q) if q == quote => {
                            if b.get(i + 1) == Some(&quote) {
                                text.push(quote);
                                i += 2;
                            } else {
                                i += 1;
                                break;
                            }
                        }
                        Some(&x) => {
                            text.push(x);
                            i += 1;
                        }
                    }
                }
                let text = String::from_utf8(text).map_err(|_| malformed("text that is not UTF-8"))?;
                out.push(if quote == b'"' {
                    Token::Quoted(text)
                } else {
                    Token::Str(text)
                });
            }
            b'(' => push(&mut out, &mut i, "(", 1),
            b')' => push(&mut out, &mut i, ")", 1),
            b',' => push(&mut out, &mut i, ",", 1),
            b'=' => push(&mut out, &mut i, "=", 1),
            b';' => push(&mut out, &mut i, ";", 1),
            b'.' => push(&mut out, &mut i, ".", 1),
            b':' if b.get(i + 1) == Some(&b'=') => push(&mut out, &mut i, ":=", 2),
            b'|' if b.get(i + 1) == Some(&b'|') => push(&mut out, &mut i, "||", 2),
            c if c.is_ascii_alphanumeric() || c == b'_' || c == b'-' || c == b'+' || c == b'$' || c == b'#' => {
                let start = i;
                while i < b.len()
                    && (b[i].is_ascii_alphanumeric() || matches!(b[i], b'_' | b'$' | b'#' | b'.' | b'-' | b'+'))
                {
                    // A dot inside a word only in a number (1.5) or a
                    // package call (dbms_lob.write), never before a quote.
                    if b[i] == b'.' && b.get(i + 1) == Some(&b'"') {
                        break;
                    }
                    i += 1;
                }
                out.push(Token::Word(sql[start..i].to_string()));
            }
            _ => return Err(malformed("an unexpected character")),
        }
    }
    Ok(out)
}

fn push(out: &mut Vec<Token>, i: &mut usize, p: &'static str, n: usize) {
    out.push(Token::Punct(p));
    *i += n;
}

/// A cursor over tokens.
pub(crate) struct Cursor {
    tokens: Vec<Token>,
    at: usize,
}

impl Cursor {
    pub(crate) fn new(sql: &str) -> Result<Self> {
        Ok(Self { tokens: tokenize(sql)?, at: 0 })
    }

    pub(crate) fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.at)
    }

    fn next(&mut self) -> Option<Token> {
        let t = self.tokens.get(self.at).cloned();
        self.at += 1;
        t
    }

    pub(crate) fn is_word(&self, word: &str) -> bool {
        matches!(self.peek(), Some(Token::Word(w)) if w.eq_ignore_ascii_case(word))
    }

    pub(crate) fn eat_word(&mut self, word: &str) -> bool {
        let yes = self.is_word(word);
        if yes {
            self.at += 1;
        }
        yes
    }

    pub(crate) fn word(&mut self, word: &str) -> Result<()> {
        if self.eat_word(word) {
            Ok(())
        } else {
            Err(malformed(&format!("expected `{word}`")))
        }
    }

    pub(crate) fn eat_punct(&mut self, p: &str) -> bool {
        let yes = matches!(self.peek(), Some(Token::Punct(q)) if *q == p);
        if yes {
            self.at += 1;
        }
        yes
    }

    pub(crate) fn punct(&mut self, p: &str) -> Result<()> {
        if self.eat_punct(p) {
            Ok(())
        } else {
            Err(malformed(&format!("expected `{p}`")))
        }
    }

    /// Skips to just after the next `word` (case-insensitive); whether found.
    pub(crate) fn skip_past_word(&mut self, word: &str) -> bool {
        while let Some(t) = self.next() {
            if matches!(&t, Token::Word(w) if w.eq_ignore_ascii_case(word)) {
                return true;
            }
        }
        false
    }

    /// A column name, perhaps qualified by the table's alias (`a."COL"`).
    pub(crate) fn column(&mut self) -> Result<String> {
        if matches!(self.peek(), Some(Token::Word(_)))
            && matches!(self.tokens.get(self.at + 1), Some(Token::Punct(".")))
        {
            self.at += 2;
        }
        self.identifier()
    }

    /// Skips a table alias (`update "S"."T" a set ...`).
    pub(crate) fn skip_alias(&mut self) {
        if let Some(Token::Word(w)) = self.peek() {
            if !["set", "where", "values"].iter().any(|k| w.eq_ignore_ascii_case(k)) {
                self.at += 1;
            }
        }
    }

    pub(crate) fn identifier(&mut self) -> Result<String> {
        match self.next() {
            Some(Token::Quoted(name)) => Ok(name),
            // Unquoted names are stored in upper case.
            Some(Token::Word(name)) => Ok(name.to_ascii_uppercase()),
            _ => Err(malformed("expected a name")),
        }
    }

    /// `"S"."T"`.
    pub(crate) fn table(&mut self) -> Result<TableId> {
        let schema = self.identifier()?;
        self.punct(".")?;
        let table = self.identifier()?;
        Ok(TableId::new(schema, table))
    }

    pub(crate) fn string(&mut self) -> Result<String> {
        match self.next() {
            Some(Token::Str(s)) => Ok(s),
            _ => Err(malformed("expected a quoted value")),
        }
    }

    /// One value: a quoted string, a number, `NULL` or one of the
    /// conversion functions LogMiner writes; strings joined with `||`
    /// (long values are split that way) are one.
    pub(crate) fn literal(&mut self) -> Result<Literal> {
        let first = self.literal_part()?;
        if !matches!(self.peek(), Some(Token::Punct("||"))) {
            return Ok(first);
        }
        let mut text = match first {
            Literal::Str(s) => s,
            _ => return Err(malformed("`||` after a value that is not text")),
        };
        while self.eat_punct("||") {
            match self.literal_part()? {
                Literal::Str(s) => text.push_str(&s),
                _ => return Err(malformed("`||` before a value that is not text")),
            }
        }
        Ok(Literal::Str(text))
    }

    fn literal_part(&mut self) -> Result<Literal> {
        match self.next() {
            Some(Token::Str(s)) => Ok(Literal::Str(s)),
            Some(Token::Word(w)) => {
                let upper = w.to_ascii_uppercase();
                match upper.as_str() {
                    "NULL" => Ok(Literal::Null),
                    "EMPTY_CLOB" | "EMPTY_BLOB" => {
                        self.punct("(")?;
                        self.punct(")")?;
                        Ok(Literal::EmptyLob)
                    }
                    "HEXTORAW" => {
                        let hex = self.call1()?;
                        Ok(Literal::Raw(from_hex(&hex)?))
                    }
                    "UNISTR" => Ok(Literal::Str(unistr(&self.call1()?)?)),
                    "TO_YMINTERVAL" => Ok(Literal::YmInterval(self.call1()?)),
                    "TO_DSINTERVAL" => Ok(Literal::DsInterval(self.call1()?)),
                    // `Unsupported Type`, two bare words where a value goes.
                    "UNSUPPORTED" => {
                        self.word("Type")?;
                        Ok(Literal::Unsupported)
                    }
                    "TO_DATE" | "TO_TIMESTAMP" | "TO_TIMESTAMP_TZ" => {
                        self.punct("(")?;
                        let text = self.string()?;
                        // LogMiner writes timestamps without a mask, in the
                        // session's format (`TO_TIMESTAMP('2020-02-01
                        // 00:00:00.')`): empty means that.
                        let mask = if self.eat_punct(",") {
                            self.string()?
                        } else {
                            String::new()
                        };
                        self.punct(")")?;
                        Ok(match upper.as_str() {
                            "TO_DATE" => Literal::Date { text, mask },
                            "TO_TIMESTAMP" => Literal::Timestamp { text, mask },
                            _ => Literal::TimestampTz { text, mask },
                        })
                    }
                    _ if w.starts_with(|c: char| c.is_ascii_digit() || c == '-' || c == '+' || c == '.') => {
                        Ok(Literal::Number(w))
                    }
                    _ => Err(malformed("an unknown value function")),
                }
            }
            _ => Err(malformed("expected a value")),
        }
    }

    /// `( 'text' )`.
    fn call1(&mut self) -> Result<String> {
        self.punct("(")?;
        let s = self.string()?;
        self.punct(")")?;
        Ok(s)
    }

    /// `"A" = v and "B" IS NULL and ROWID = '...'`: the named columns, the
    /// ROWID left out; stops before `for`, `;` or the end.
    pub(crate) fn conditions(&mut self) -> Result<Vec<(String, Literal)>> {
        let mut out = Vec::new();
        loop {
            if self.is_word("ROWID") {
                self.at += 1;
                self.punct("=")?;
                self.string()?;
            } else {
                if !matches!(self.peek(), Some(Token::Quoted(_)) | Some(Token::Word(_))) {
                    return Err(malformed("expected a column name in the where clause"));
                }
                let name = self.column()?;
                if self.eat_word("IS") {
                    self.word("NULL")?;
                    out.push((name, Literal::Null));
                } else {
                    self.punct("=")?;
                    out.push((name, self.literal()?));
                }
            }
            if !self.eat_word("and") {
                return Ok(out);
            }
        }
    }
}

/// Parses one DML statement of `SQL_REDO` (CSF continuation rows already
/// joined).
pub fn parse(sql: &str) -> Result<Redo> {
    let mut c = Cursor::new(sql)?;
    let redo = if c.eat_word("insert") {
        c.word("into")?;
        let table = c.table()?;
        c.punct("(")?;
        let mut names = Vec::new();
        loop {
            names.push(c.identifier()?);
            if !c.eat_punct(",") {
                break;
            }
        }
        c.punct(")")?;
        c.word("values")?;
        c.punct("(")?;
        let mut values = Vec::with_capacity(names.len());
        for (i, name) in names.into_iter().enumerate() {
            if i > 0 {
                c.punct(",")?;
            }
            values.push((name, c.literal()?));
        }
        c.punct(")")?;
        Redo::Insert { table, values }
    } else if c.eat_word("update") {
        let table = c.table()?;
        c.skip_alias();
        c.word("set")?;
        let mut set = Vec::new();
        loop {
            let name = c.column()?;
            c.punct("=")?;
            set.push((name, c.literal()?));
            if !c.eat_punct(",") {
                break;
            }
        }
        // An update of a table without supplemental logging of its columns
        // may lack a where clause beyond the ROWID; the caller then finds
        // the key missing.
        let before = if c.eat_word("where") {
            c.conditions()?
        } else {
            Vec::new()
        };
        Redo::Update { table, set, before }
    } else if c.eat_word("delete") {
        c.word("from")?;
        let table = c.table()?;
        c.skip_alias();
        let before = if c.eat_word("where") {
            c.conditions()?
        } else {
            Vec::new()
        };
        Redo::Delete { table, before }
    } else {
        return Err(malformed("not an insert, update or delete"));
    };
    c.eat_punct(";");
    if c.peek().is_some() {
        return Err(malformed("text after the statement"));
    }
    Ok(redo)
}

/// Bytes of hexadecimal text.
pub fn from_hex(hex: &str) -> Result<Vec<u8>> {
    if !hex.len().is_multiple_of(2) {
        return Err(malformed("HEXTORAW of an odd number of digits"));
    }
    // Checked first: slicing by two bytes needs ASCII.
    if !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(malformed("HEXTORAW of a non-hex digit"));
    }
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).map_err(|_| malformed("HEXTORAW of a non-hex digit")))
        .collect()
}

/// Decodes `UNISTR` text: `\XXXX` is a UTF-16 code unit (surrogate pairs
/// form one character), `\\` a backslash (Oracle SQL Language Reference,
/// "UNISTR").
pub fn unistr(text: &str) -> Result<String> {
    let mut units: Vec<u16> = Vec::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(ch) = chars.next() {
        if ch != '\\' {
            let mut buf = [0u16; 2];
            units.extend_from_slice(ch.encode_utf16(&mut buf));
            continue;
        }
        let rest = chars.as_str();
        if let Some(after) = rest.strip_prefix('\\') {
            units.push(u16::from(b'\\'));
            chars = after.chars();
            continue;
        }
        let hex = rest.get(..4).ok_or_else(|| malformed("a short UNISTR escape"))?;
        units.push(u16::from_str_radix(hex, 16).map_err(|_| malformed("a UNISTR escape that is not hex"))?);
        chars = rest[4..].chars();
    }
    String::from_utf16(&units).map_err(|_| malformed("a UNISTR escape that is not UTF-16"))
}

/// `'text'` for statements the source itself writes (catalog queries,
/// fixes): never used with row values.
pub fn quote_literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// `"NAME"`.
pub fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// `"S"."T"`.
pub fn quote_table(table: &TableId) -> String {
    format!("{}.{}", quote_ident(&table.schema), quote_ident(&table.table))
}

/// How LogMiner would write `value` as a string literal (the fake and the
/// tests render with it).
pub fn render_str(value: &str) -> String {
    quote_literal(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str, n: &str) -> TableId {
        TableId::new(s, n)
    }
    fn s(v: &str) -> Literal {
        Literal::Str(v.into())
    }

    #[test]
    fn the_documented_insert_update_and_delete_parse() {
        // Oracle Database Utilities 19c, 22.4.1.1 "Example 1".
        let r = parse(
            r#"insert into "HR"."JOBS"("JOB_ID","JOB_TITLE","MIN_SALARY","MAX_SALARY") values ('IT_WT','Technical Writer','4000','11000');"#,
        )
        .expect("insert");
        assert_eq!(
            r,
            Redo::Insert {
                table: t("HR", "JOBS"),
                values: vec![
                    ("JOB_ID".into(), s("IT_WT")),
                    ("JOB_TITLE".into(), s("Technical Writer")),
                    ("MIN_SALARY".into(), s("4000")),
                    ("MAX_SALARY".into(), s("11000")),
                ]
            }
        );
        let r = parse(
            r#"update "HR"."JOBS" set "JOB_TITLE" = 'FI_MGR' where "JOB_TITLE" = 'FI_MGRX' and ROWID = 'AAAHSeAABAAAY+CAAX';"#,
        )
        .expect("update");
        assert_eq!(
            r,
            Redo::Update {
                table: t("HR", "JOBS"),
                set: vec![("JOB_TITLE".into(), s("FI_MGR"))],
                before: vec![("JOB_TITLE".into(), s("FI_MGRX"))],
            }
        );
        let r = parse(
            r#"delete from "OE"."ORDERS" where "ORDER_ID" = '2413' and "ORDER_MODE" = 'direct' and "CUSTOMER_ID" = '101' and "ORDER_STATUS" = '5' and "ORDER_TOTAL" = '48552' and "SALES_REP_ID" = '161' and "PROMOTION_ID" IS NULL and ROWID = 'AAAHTCAABAAAZAPAAN';"#,
        )
        .expect("delete");
        let Redo::Delete { table, before } = r else {
            panic!("not a delete")
        };
        assert_eq!(table, t("OE", "ORDERS"));
        assert_eq!(before.len(), 7);
        assert_eq!(before[6], ("PROMOTION_ID".into(), Literal::Null));
    }

    #[test]
    fn conversion_functions_quotes_and_unistr_parse() {
        let r = parse(
            r#"insert into "APP"."T ""Q"""("ID","D","TS","TZ","R","N","NOTE","C","YM","DS","X") values (7,TO_DATE('2012-01-10 15:34:12', 'YYYY-MM-DD HH24:MI:SS'),TO_TIMESTAMP('2024-02-29 23:59:59.123456', 'YYYY-MM-DD HH24:MI:SS.FF6'),TO_TIMESTAMP_TZ('2024-02-29 23:59:59.5 +02:00', 'YYYY-MM-DD HH24:MI:SS.FF TZH:TZM'),HEXTORAW('00ff10'),UNISTR('caf\00e9 \d83d\de00'),'it''s',EMPTY_CLOB(),TO_YMINTERVAL('+02-03'),TO_DSINTERVAL('+01 02:03:04.500000'),NULL);"#,
        )
        .expect("parses");
        let Redo::Insert { table, values } = r else {
            panic!("not an insert")
        };
        assert_eq!(table, t("APP", "T \"Q\""));
        let v: Vec<Literal> = values.into_iter().map(|(_, v)| v).collect();
        assert_eq!(v[0], Literal::Number("7".into()));
        assert_eq!(
            v[1],
            Literal::Date {
                text: "2012-01-10 15:34:12".into(),
                mask: "YYYY-MM-DD HH24:MI:SS".into()
            }
        );
        assert!(matches!(v[2], Literal::Timestamp { .. }));
        assert!(matches!(v[3], Literal::TimestampTz { .. }));
        assert_eq!(v[4], Literal::Raw(vec![0, 0xff, 0x10]));
        assert_eq!(v[5], s("café 😀"));
        assert_eq!(v[6], s("it's"));
        assert_eq!(v[7], Literal::EmptyLob);
        assert_eq!(v[8], Literal::YmInterval("+02-03".into()));
        assert_eq!(v[9], Literal::DsInterval("+01 02:03:04.500000".into()));
        assert_eq!(v[10], Literal::Null);
    }

    /// Shapes real LogMiner output takes beyond the documentation's
    /// examples, as Debezium's parser tests record them
    /// (`LogMinerDmlParserTest`: DBZ-3078, DBZ-3235, DBZ-4194, DBZ-3892,
    /// DBZ-5521): timestamps without a mask, `Unsupported Type`, `= NULL`
    /// in a where clause, no where clause, table aliases, `||` inside
    /// quotes, concatenated `UNISTR`.
    #[test]
    fn shapes_real_logminer_writes_parse() {
        let r = parse(
            r#"update "DEBEZIUM"."TEST" set "NAME" = 'Bob', "TS" = TO_TIMESTAMP('2020-02-02 00:00:00.'), "UT" = Unsupported Type, "C1" = NULL where "ID" = '1' and "UT" = Unsupported Type and "C1" = NULL and "IS" IS NULL;"#,
        )
        .expect("update");
        let Redo::Update { set, before, .. } = r else {
            panic!("not an update")
        };
        assert_eq!(
            set[1].1,
            Literal::Timestamp {
                text: "2020-02-02 00:00:00.".into(),
                mask: String::new()
            }
        );
        assert_eq!(set[2].1, Literal::Unsupported);
        assert_eq!(set[3].1, Literal::Null);
        assert_eq!(
            before.iter().map(|(_, v)| v.clone()).collect::<Vec<_>>(),
            vec![s("1"), Literal::Unsupported, Literal::Null, Literal::Null]
        );
        let r = parse(r#"update "DEBEZIUM"."TEST" a set a."COL1" = '1', a."COL2" = NULL;"#).expect("alias, no where");
        assert!(
            matches!(r, Redo::Update { ref set, ref before, .. } if set[0] == ("COL1".into(), s("1")) && before.is_empty())
        );
        let r = parse(r#"delete from "DEBEZIUM"."TEST" a where a."COL1" = '1' and a."COL2" = '2';"#).expect("alias");
        assert!(matches!(r, Redo::Delete { ref before, .. } if before[1] == ("COL2".into(), s("2"))));
        let r = parse(r#"insert into "UNKNOWN"."TABLE" ("COL1","COL2") values ('I||am',UNISTR('\0412\044B') || UNISTR('\043F\043E'));"#)
            .expect("insert");
        let Redo::Insert { values, .. } = r else {
            panic!("not an insert")
        };
        assert_eq!(values[0].1, s("I||am"));
        assert_eq!(values[1].1, s("\u{412}\u{44b}\u{43f}\u{43e}"));
        assert!(
            matches!(parse(r#"delete from "DEBEZIUM"."TEST";"#).expect("no where"), Redo::Delete { ref before, .. } if before.is_empty())
        );
    }

    #[test]
    fn concatenated_text_is_one_value_and_garbage_is_refused() {
        let r = parse(r#"update "A"."B" set "C" = 'ab' || 'cd' where "ID" = '1'"#).expect("parses");
        assert!(matches!(r, Redo::Update { ref set, .. } if set[0].1 == s("abcd")));
        for bad in [
            "select 1 from dual",
            r#"insert into "A"."B"("C") values ('x'"#,
            r#"insert into "A"."B"("C") values ('x') extra"#,
            r#"delete from "A"."B" where "C" = 'secretvalue"#,
            r#"insert into "A"."B"("C") values (SYS_GUID())"#,
            r#"insert into "A"."B"("C") values (HEXTORAW('abc'))"#,
            r#"insert into "A"."B"("C") values (HEXTORAW('aé1'))"#,
        ] {
            let e = parse(bad).expect_err(bad);
            assert_eq!(e.kind(), crate::error::ErrorKind::Permanent);
            assert!(!e.to_string().contains("secretvalue"), "{e}");
        }
    }

    use proptest::prelude::any;

    /// One statement of each shape the parsers read.
    const SEEDS: &[&str] = &[
        r#"insert into "APP"."T"("ID","D","TS","R","N","C") values ('1',TO_DATE('2012-01-10 15:34:12', 'YYYY-MM-DD HH24:MI:SS'),TO_TIMESTAMP('2020-02-01 00:00:00.'),HEXTORAW('00ff'),UNISTR('caf\00e9') || UNISTR('\d83d\de00'),EMPTY_CLOB());"#,
        r#"update "APP"."T" a set a."NAME" = 'it''s', "X" = Unsupported Type where "ID" = '1' and "Y" IS NULL and "Z" = NULL and ROWID = 'AAAx+/B';"#,
        r#"delete from "APP"."T" where "ID" = '-1.5E+3' and "I" = TO_DSINTERVAL('+01 02:03:04.5') and "J" = TO_YMINTERVAL('-01-02');"#,
        "DECLARE loc_c CLOB; buf_c VARCHAR2(6156); BEGIN select \"DOC\" into loc_c from \"APP\".\"T\" where \"ID\" = '1' and ROWID = 'AAAS' for update;",
        "buf_c := 'piece'; dbms_lob.write(loc_c, 5, 1, buf_c);",
        "buf_b := HEXTORAW('0a0b'); dbms_lob.write(loc_b, 2, 1, buf_b);",
        "dbms_lob.trim(loc_c, 3);",
        "dbms_lob.erase(loc_c, 2, 1);",
    ];

    #[test]
    fn the_mutation_seeds_are_valid() {
        for (i, seed) in SEEDS.iter().enumerate() {
            let ok = match i {
                0..=2 => parse(seed).is_ok(),
                3 => crate::sources::oracle::lob::parse(9, seed).is_ok(),
                4 | 5 => crate::sources::oracle::lob::parse(10, seed).is_ok(),
                6 => crate::sources::oracle::lob::parse(11, seed).is_ok(),
                _ => crate::sources::oracle::lob::parse(28, seed).is_ok(),
            };
            assert!(ok, "seed {i}");
        }
    }

    /// Renders an insert the way LogMiner writes one.
    fn render_insert(table: &TableId, cols: &[(String, Option<String>)]) -> String {
        let names: Vec<String> = cols.iter().map(|(n, _)| quote_ident(n)).collect();
        let values: Vec<String> = cols
            .iter()
            .map(|(_, v)| v.as_deref().map_or("NULL".to_string(), render_str))
            .collect();
        format!("insert into {}({}) values ({});", quote_table(table), names.join(","), values.join(","))
    }

    proptest::proptest! {
        /// Any names and texts (quotes, `;`, `and`, newlines, any Unicode)
        /// come back exactly from a rendered insert and delete.
        #[test]
        fn rendered_statements_parse_back(
            schema in "[A-Za-z][A-Za-z0-9_ \"]{0,12}",
            table in "[A-Za-z][A-Za-z0-9_$# \".]{0,12}",
            cols in proptest::collection::vec(("[A-Z][A-Z0-9_ \"]{0,8}", proptest::option::of("\\PC{0,20}")), 1..6),
        ) {
            let id = TableId::new(schema, table);
            let insert = render_insert(&id, &cols);
            let expected: Vec<(String, Literal)> =
                cols.iter().map(|(n, v)| (n.clone(), v.clone().map_or(Literal::Null, Literal::Str))).collect();
            proptest::prop_assert_eq!(parse(&insert)?, Redo::Insert { table: id.clone(), values: expected.clone() });
            let conds: Vec<String> = cols.iter().map(|(n, v)| match v {
                Some(v) => format!("{} = {}", quote_ident(n), render_str(v)),
                None => format!("{} IS NULL", quote_ident(n)),
            }).collect();
            let delete = format!("delete from {} where {} and ROWID = 'AAAx+/AAB';", quote_table(&id), conds.join(" and "));
            proptest::prop_assert_eq!(parse(&delete)?, Redo::Delete { table: id, before: expected });
        }

        /// Arbitrary input never panics.
        #[test]
        fn arbitrary_text_never_panics(text in "\\PC{0,80}") {
            let _ = parse(&text);
            let _ = unistr(&text);
        }

        /// Valid statements of every shape, cut, spliced and overwritten at
        /// random points, are refused or parsed, never a panic (the
        /// decoders of the other sources get the same from
        /// `connectors/tests/decoder_inputs.rs`).
        #[test]
        fn mutated_statements_never_panic(
            seed in 0usize..SEEDS.len(),
            edits in proptest::collection::vec((any::<usize>(), 0u8..3, any::<char>()), 1..8),
        ) {
            let mut chars: Vec<char> = SEEDS[seed].chars().collect();
            for (at, kind, c) in edits {
                let at = at % (chars.len() + 1);
                match kind {
                    0 if at < chars.len() => { chars.remove(at); }
                    1 => chars.insert(at, c),
                    _ if at < chars.len() => chars[at] = c,
                    _ => {}
                }
            }
            let text: String = chars.into_iter().collect();
            let _ = parse(&text);
            for op in [9u8, 10, 11, 28] {
                let _ = crate::sources::oracle::lob::parse(op, &text);
            }
        }
    }
}
