//! The documentation agrees with the code: every command, flag, script,
//! file, config key, port and environment variable that README.md and
//! docs/ quote exists, checked against the runners' `--help`, the scripts,
//! the repository's files and the config types. A doc that names something
//! that is not there fails here, with the file and the quote.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;

use regex::Regex;
use tributary_tests::{runner_binary, workspace_dir};

/// README.md and every page under docs/.
fn pages() -> Vec<PathBuf> {
    let root = workspace_dir();
    let mut out = vec![root.join("README.md")];
    let mut dirs = vec![root.join("docs")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("docs dir").flatten() {
            let p = entry.path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|e| e == "md") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// The quoted parts of a page: fenced blocks (with their language) and
/// inline code spans.
fn quotes(text: &str) -> (Vec<(String, String)>, Vec<String>) {
    let mut blocks = Vec::new();
    let mut inline = Vec::new();
    let mut in_block: Option<(String, String)> = None;
    let span = Regex::new(r"`([^`\n]+)`").expect("regex");
    for line in text.lines() {
        let t = line.trim_start();
        if let Some(lang) = t.strip_prefix("```") {
            match in_block.take() {
                Some(b) => blocks.push(b),
                None => in_block = Some((lang.trim().to_string(), String::new())),
            }
            continue;
        }
        match &mut in_block {
            Some((_, body)) => {
                body.push_str(line);
                body.push('\n');
            }
            None => inline.extend(span.captures_iter(line).map(|c| c[1].to_string())),
        }
    }
    (blocks, inline)
}

fn relative(p: &Path) -> String {
    p.strip_prefix(workspace_dir()).unwrap_or(p).display().to_string()
}

/// `<binary> [<subcommand>] --help`, cached.
struct Helps(HashMap<(String, String), String>);

impl Helps {
    fn get(&mut self, bin: &str, sub: &str) -> &str {
        self.0.entry((bin.to_string(), sub.to_string())).or_insert_with(|| {
            let mut c = Command::new(runner_binary(bin));
            if !sub.is_empty() {
                c.arg(sub);
            }
            let out = c.arg("--help").output().expect("run --help");
            String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
        })
    }
}

#[test]
fn commands_flags_scripts_files_ports_and_variables_the_docs_quote_exist() {
    let root = workspace_dir();
    let mut helps = Helps(HashMap::new());
    let mut problems = Vec::new();
    let runner_call = Regex::new(r"(?:^|[\s/$}])(source-runner|sink-runner)((?:\s+[-\w.=/:${}]+)*)").expect("regex");
    let script_call = Regex::new(r"(?:^|\s)((?:scripts|bench)/[\w.-]+|\.ci/run)((?:\s+--?[\w-]+)*)").expect("regex");
    let path_like = Regex::new(
        r"(?:^|[\s(\[`])((?:docs|examples|scripts|connectors|schemas|sink-runner|source-runner|operations|tests|bench|docker|fuzz|\.ci)/[\w./-]*[\w/])",
    )
    .expect("regex");
    let port = Regex::new(r"127\.0\.0\.1:(\d{4,5})").expect("regex");
    let variable = Regex::new(r"\b(TRIBUTARY_[A-Z0-9_]+)\b").expect("regex");
    let code = code_text(&root);
    for page in pages() {
        let text = std::fs::read_to_string(&page).expect("page");
        let name = relative(&page);
        let (blocks, inline) = quotes(&text);
        let mut snippets: Vec<String> = inline.clone();
        snippets.extend(
            blocks
                .iter()
                .filter(|(lang, _)| lang != "toml")
                .flat_map(|(_, b)| b.lines().map(str::to_string)),
        );
        for s in &snippets {
            for c in runner_call.captures_iter(s) {
                let start = c.get(1).map_or(0, |m| m.start());
                // `cargo build -p sink-runner ...` names a package, not a run.
                if s[..start].trim_end().ends_with("-p") || s[..start].trim_end().ends_with("--package") {
                    continue;
                }
                let bin = &c[1];
                let args: Vec<&str> = c[2].split_whitespace().collect();
                let top = helps.get(bin, "").to_string();
                // The subcommand may follow global flags (`--config x`).
                let sub = args
                    .iter()
                    .find(|a| !a.starts_with('-') && top.contains(&format!("\n  {a} ")))
                    .copied();
                let help = match sub {
                    Some(sub) => helps.get(bin, sub).to_string(),
                    None => top.clone(),
                };
                for flag in args.iter().filter(|a| a.starts_with("--")) {
                    let flag = flag.split('=').next().unwrap_or(flag);
                    if !help.contains(flag) {
                        problems.push(format!(
                            "{name}: `{}` quotes {bin} {} {flag}, which it does not have",
                            s.trim(),
                            sub.unwrap_or("")
                        ));
                    }
                }
                if let Some(first) = args
                    .first()
                    .filter(|a| !a.starts_with('-') && !a.contains('/') && !a.contains('$'))
                {
                    if sub.is_none() && first.chars().all(|c| c.is_ascii_lowercase() || c == '-') {
                        problems.push(format!("{name}: `{}`: {bin} has no subcommand `{first}`", s.trim()));
                    }
                }
            }
            for c in script_call.captures_iter(s) {
                let script = root.join(&c[1]);
                if script.is_dir() {
                    continue;
                }
                match std::fs::read_to_string(&script) {
                    Err(_) => problems.push(format!("{name}: `{}` names {}, which does not exist", s.trim(), &c[1])),
                    Ok(body) => {
                        for flag in c[2].split_whitespace().filter(|a| a.starts_with('-')) {
                            if !body.contains(flag) {
                                problems.push(format!("{name}: `{}`: {} has no option {flag}", s.trim(), &c[1]));
                            }
                        }
                    }
                }
            }
        }
        // Files named anywhere on the page (links, quotes, prose).
        for c in path_like.captures_iter(&text) {
            let p = c[1].trim_end_matches('.').split(['#', ':']).next().unwrap_or("").to_string();
            if p.contains('*') || p.contains('<') || p.contains("...") || p.ends_with("/results/") {
                continue;
            }
            if !root.join(&p).exists() {
                problems.push(format!("{name}: names {p}, which is not in the repository"));
            }
        }
        for c in port.captures_iter(&text) {
            if !code.contains(&c[1]) {
                problems.push(format!("{name}: port {} is not one any script, example or code uses", &c[1]));
            }
        }
        for c in variable.captures_iter(&text) {
            if !code.contains(&c[1]) {
                problems.push(format!("{name}: {} is read by nothing", &c[1]));
            }
        }
        for (lang, block) in &blocks {
            if lang == "toml" {
                if let Err(e) = runner_config_parses(block) {
                    problems.push(format!("{name}: a TOML example is not a valid runner config: {e}\n{block}"));
                }
            }
        }
        // Config keys in the configuration tables: `| `key` | ...` rows.
        for key in table_keys(&text) {
            if !code.contains(&format!("pub {key}:")) {
                problems.push(format!("{name}: the table names the config key `{key}`, which no config type has"));
            }
        }
    }
    assert!(problems.is_empty(), "{} problem(s):\n{}", problems.len(), problems.join("\n"));
}

/// The text of every script, example and source file (not the docs), to
/// look names up in.
fn code_text(root: &Path) -> String {
    let mut out = String::new();
    let mut dirs = vec![root.to_path_buf()];
    let skip = ["target", ".git", ".stack", "docs", "node_modules", "results"];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("dir").flatten() {
            let p = entry.path();
            let file = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if p.is_dir() {
                if !skip.contains(&file) {
                    dirs.push(p);
                }
            } else if file != "README.md" && std::fs::metadata(&p).is_ok_and(|m| m.len() < 2_000_000) {
                if let Ok(t) = std::fs::read_to_string(&p) {
                    out.push_str(&t);
                }
            }
        }
    }
    out
}

/// The config keys of the pages' configuration tables: a row whose first
/// cell is a quoted key (`| \`batch_max_records\` |` or `| \`[postgres] tls\` |`).
fn table_keys(text: &str) -> BTreeSet<String> {
    let row = Regex::new(r"^\|\s*`(?:\[[\w.]+\]\s+)?([a-z][a-z0-9_]*)`\s*\|").expect("regex");
    let mut keys = BTreeSet::new();
    let mut in_config_table = false;
    for line in text.lines() {
        if line.starts_with("| field") || line.starts_with("| key") {
            in_config_table = true;
            continue;
        }
        if !line.starts_with('|') {
            in_config_table = false;
            continue;
        }
        if in_config_table {
            if let Some(c) = row.captures(line) {
                keys.insert(c[1].to_string());
            }
        }
    }
    keys
}

/// A TOML example is a whole runner config, or a part of one (a section,
/// some keys): it must parse as one of the two runners' configs, alone or
/// on top of a minimal one.
fn runner_config_parses(block: &str) -> Result<(), String> {
    let base = "name = \"n\"\nprefix = \"p\"\nconsumer_group = \"g\"\n\
                schema_registry_url = \"http://127.0.0.1:8081/apis/ccompat/v7\"\n";
    let kafka = "[kafka]\nbootstrap_servers = \"127.0.0.1:9092\"\n";
    let section = "[postgres]\nurl = \"postgres://u@127.0.0.1/db\"\n";
    let has = |s: &str| block.lines().any(|l| l.trim_start().starts_with(s));
    // The block alone; on top of the top-level keys a runner needs; then
    // with Kafka and a source or destination section where it has none.
    let wrap = |head: &str| {
        let mut t = String::from(head);
        t.push_str(block);
        t.push('\n');
        if !has("[kafka]") {
            t.push_str(kafka);
        }
        if [
            "[postgres]",
            "[mysql]",
            "[sqlserver]",
            "[oracle]",
            "[bigquery]",
            "[redshift]",
            "[snowflake]",
            "[spanner]",
        ]
        .iter()
        .all(|s| !has(s))
        {
            t.push_str(section);
        }
        t
    };
    // A source section alone: the keys a source runner needs, without the
    // sink's (`prefix` is not a source runner's).
    let source_base = "name = \"n\"\nschema_registry_url = \"http://127.0.0.1:8081/apis/ccompat/v7\"\n";
    let tries = [block.to_string(), wrap(""), wrap(source_base), wrap(base)];
    let mut errors = Vec::new();
    for t in &tries {
        match toml::from_str::<source_runner::config::SourceRunnerConfig>(t) {
            Ok(_) => return Ok(()),
            Err(e) => errors.push(format!("as a source runner: {}", e.message())),
        }
        let sink: Result<sink_runner::config::SinkRunnerConfig, _> = toml::from_str(&t.replace("name = \"n\"\n", ""));
        match sink {
            Ok(_) => return Ok(()),
            Err(e) => errors.push(format!("as a sink runner: {}", e.message())),
        }
    }
    errors.sort();
    errors.dedup();
    Err(errors.join("; "))
}
