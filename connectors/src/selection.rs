//! Which tables and columns a source captures: the `include`, `exclude` and
//! `exclude_columns` patterns every source's configuration shares.

use regex::Regex;
use tributary_schemas::TableId;

/// One `include` / `exclude` pattern.
#[derive(Debug, Clone)]
pub struct TablePattern(Regex);

impl TablePattern {
    /// Parses a glob of `parts` dot-separated parts, or a `re:` regex.
    pub fn parse(pattern: &str, parts: usize) -> std::result::Result<Self, String> {
        if let Some(re) = pattern.strip_prefix("re:") {
            return Regex::new(&format!("^(?:{re})$"))
                .map(TablePattern)
                .map_err(|e| format!("pattern `{pattern}` is not a valid regular expression: {e}"));
        }
        if pattern.split('.').count() != parts {
            let shape = if parts == 2 {
                "schema.table"
            } else {
                "schema.table.column"
            };
            return Err(format!(
                "pattern `{pattern}` must have the shape `{shape}` (globs `*` and `?` allowed, or `re:<regex>`)"
            ));
        }
        let mut re = String::from("^");
        for c in pattern.chars() {
            match c {
                '*' => re.push_str("[^.]*"),
                '?' => re.push_str("[^.]"),
                c => re.push_str(&regex::escape(&c.to_string())),
            }
        }
        re.push('$');
        Regex::new(&re)
            .map(TablePattern)
            .map_err(|e| format!("pattern `{pattern}`: {e}"))
    }

    /// Whether `name` matches.
    pub fn matches(&self, name: &str) -> bool {
        self.0.is_match(name)
    }
}

/// Which tables and columns are captured.
#[derive(Debug, Clone, Default)]
pub struct TableFilter {
    include: Vec<TablePattern>,
    exclude: Vec<TablePattern>,
    exclude_columns: Vec<TablePattern>,
}

impl TableFilter {
    /// Whether `table` is captured.
    pub fn captures(&self, table: &TableId) -> bool {
        let name = table.to_string();
        self.include.iter().any(|p| p.matches(&name)) && !self.exclude.iter().any(|p| p.matches(&name))
    }

    /// Whether `column` of `table` is left out.
    pub fn excludes_column(&self, table: &TableId, column: &str) -> bool {
        if self.exclude_columns.is_empty() {
            return false;
        }
        let name = format!("{table}.{column}");
        self.exclude_columns.iter().any(|p| p.matches(&name))
    }
}

impl TableFilter {
    /// A filter from configured patterns (already validated with
    /// [`TablePattern::parse`]; an invalid one is left out).
    pub fn from_patterns(include: &[String], exclude: &[String], exclude_columns: &[String]) -> Self {
        let parse = |list: &[String], parts| {
            list.iter()
                .filter_map(|p| TablePattern::parse(p, parts).ok())
                .collect::<Vec<_>>()
        };
        TableFilter {
            include: parse(include, 2),
            exclude: parse(exclude, 2),
            exclude_columns: parse(exclude_columns, 3),
        }
    }
}
