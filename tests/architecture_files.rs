//! `docs/ARCHITECTURE.md`'s file tables, checked against the tree, so they
//! cannot drift from the code.
//!
//! A file table is a Markdown table whose first header cell names a crate's
//! source folder in backticks (`` `crates/kafka/src/` ``); the first cell of
//! each of its rows names files relative to that folder, each in backticks,
//! where `` `source/{mod,builder}.rs` `` stands for `source/mod.rs` and
//! `source/builder.rs`. For every crate with a table (a crate may have
//! several, read as one):
//!
//! - every file listed exists;
//! - every source file of the crate (`src/**/*.rs`) is listed, except its
//!   test modules: files reached only through a `#[cfg(test)]` module
//!   declaration.
//!
//! Beside the tables, every path under `crates/` that the README or a guide
//! in `docs/` names in backticks exists.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

const ARCHITECTURE: &str = "docs/ARCHITECTURE.md";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// One crate's file table (or tables): where each listed file was listed.
#[derive(Default)]
struct Table {
    /// Line of the table's header, for the messages.
    line: usize,
    /// Listed path (relative to `src/`) → line of its row.
    files: BTreeMap<String, usize>,
}

/// The text between backticks in `text`.
fn backticked(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

/// `a/{b,c}.rs` → `a/b.rs`, `a/c.rs` (one brace group; none: the path).
fn expand(path: &str) -> Vec<String> {
    match (path.find('{'), path.find('}')) {
        (Some(open), Some(close)) if open < close => path[open + 1..close]
            .split(',')
            .map(|part| format!("{}{}{}", &path[..open], part.trim(), &path[close + 1..]))
            .collect(),
        _ => vec![path.to_owned()],
    }
}

/// The cells of a Markdown table row (`| a | b |` → `a`, `b`). Backticks
/// and `|` inside code spans are not special here: file tables keep `|`
/// out of their first cell.
fn cells(line: &str) -> Vec<&str> {
    let inner = line.trim().trim_start_matches('|').trim_end_matches('|');
    inner.split('|').map(str::trim).collect()
}

/// The crate named by a file table's first header cell:
/// `` `crates/kafka/src/` `` → `kafka`.
fn table_crate(header: &str) -> Option<String> {
    let first = *cells(header).first()?;
    let path = backticked(first).into_iter().next()?;
    let name = path.strip_prefix("crates/")?.trim_end_matches('/');
    let name = name.strip_suffix("/src")?;
    (!name.contains('/')).then(|| name.to_owned())
}

/// Every file table of `docs/ARCHITECTURE.md`, by crate.
fn tables(text: &str) -> BTreeMap<String, Table> {
    let mut tables: BTreeMap<String, Table> = BTreeMap::new();
    let mut current: Option<String> = None;
    for (index, line) in text.lines().enumerate() {
        let number = index + 1;
        if !line.trim_start().starts_with('|') {
            current = None;
            continue;
        }
        if current.is_none() {
            // The first row of a table: its header.
            if let Some(name) = table_crate(line) {
                let table = tables.entry(name.clone()).or_default();
                if table.line == 0 {
                    table.line = number;
                }
                current = Some(name);
            } else {
                // Another kind of table: skip it whole.
                current = Some(String::new());
            }
            continue;
        }
        let Some(name) = current.as_ref().filter(|name| !name.is_empty()) else {
            continue;
        };
        let first = cells(line).into_iter().next().unwrap_or_default();
        if first.chars().all(|c| matches!(c, '-' | ':' | ' ')) {
            continue; // the delimiter row
        }
        let table = tables.get_mut(name).expect("the table was opened above");
        for listed in backticked(first) {
            for path in expand(listed) {
                table.files.entry(path).or_insert(number);
            }
        }
    }
    tables
}

/// Whether a module declaration's attributes compile it for tests only: a
/// `cfg` naming `test` (a word, not `"testkit"` in a feature name), not
/// under `not(..)`.
fn test_only(attributes: &str) -> bool {
    let unquoted: String = attributes.split('"').step_by(2).collect();
    unquoted
        .split("#[")
        .filter(|attribute| attribute.starts_with("cfg("))
        .any(|cfg| {
            let names_test = cfg
                .split(|c: char| !(c.is_alphanumeric() || c == '_'))
                .any(|word| word == "test");
            names_test && !cfg.replace(' ', "").contains("not(test")
        })
}

/// The files a module file declares (`mod name;`), each with whether it is
/// compiled for tests only.
fn declared_modules(file: &Path, is_root: bool) -> Vec<(PathBuf, bool)> {
    let Ok(text) = fs::read_to_string(file) else {
        return Vec::new();
    };
    // `lib.rs`, `main.rs` and `mod.rs` declare their children beside them;
    // `name.rs` in `name/`.
    let directory = if is_root || file.file_name().is_some_and(|name| name == "mod.rs") {
        file.parent().expect("a file has a folder").to_path_buf()
    } else {
        file.with_extension("")
    };
    let mut found = Vec::new();
    let mut attributes = String::new();
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with("#[")
            || (!attributes.is_empty() && !attributes.trim_end().ends_with(']'))
        {
            attributes.push_str(line);
            attributes.push(' ');
            continue;
        }
        let declaration = line
            .strip_prefix("pub(crate) ")
            .or_else(|| line.strip_prefix("pub(super) "))
            .or_else(|| line.strip_prefix("pub "))
            .unwrap_or(line);
        if let Some(rest) = declaration.strip_prefix("mod ")
            && let Some(name) = rest.strip_suffix(';')
        {
            let name = name.trim();
            let path_attribute = attributes
                .split("#[path")
                .nth(1)
                .and_then(|rest| rest.split('"').nth(1))
                .map(|path| file.parent().expect("a file has a folder").join(path));
            let path = path_attribute.unwrap_or_else(|| {
                let flat = directory.join(format!("{name}.rs"));
                if flat.exists() {
                    flat
                } else {
                    directory.join(name).join("mod.rs")
                }
            });
            found.push((path, test_only(&attributes)));
        }
        if !line.is_empty() && !line.starts_with("//") {
            attributes.clear();
        }
    }
    found
}

/// A crate's source files that are test modules: reached from its roots
/// only through a `#[cfg(test)]` declaration.
fn test_modules(src: &Path) -> BTreeSet<PathBuf> {
    let mut tests = BTreeSet::new();
    let mut stack: Vec<(PathBuf, bool, bool)> = ["lib.rs", "main.rs"]
        .iter()
        .map(|root| (src.join(root), false, true))
        .filter(|(path, _, _)| path.exists())
        .collect();
    let mut seen = BTreeSet::new();
    while let Some((file, in_test, is_root)) = stack.pop() {
        if !seen.insert((file.clone(), in_test)) {
            continue;
        }
        if in_test {
            tests.insert(file.clone());
        }
        for (child, test_only) in declared_modules(&file, is_root) {
            stack.push((child, in_test || test_only, false));
        }
    }
    tests
}

/// Every `.rs` file under `folder`, relative to it, with `/` separators.
fn rust_files(folder: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut stack = vec![folder.to_path_buf()];
    while let Some(directory) = stack.pop() {
        let Ok(entries) = fs::read_dir(&directory) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|extension| extension == "rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

fn relative(path: &Path, base: &Path) -> String {
    path.strip_prefix(base)
        .expect("under its base")
        .components()
        .map(|component| component.as_os_str().to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join("/")
}

#[test]
fn every_file_table_of_the_architecture_lists_exactly_the_crates_source_files() {
    let root = root();
    let text = fs::read_to_string(root.join(ARCHITECTURE)).expect("read docs/ARCHITECTURE.md");
    let tables = tables(&text);
    assert!(
        tables.contains_key("core"),
        "{ARCHITECTURE} has no file table for crates/core/src (a table whose first header cell is `crates/core/src/`)"
    );
    let mut problems = Vec::new();
    for (name, table) in &tables {
        let src = root.join("crates").join(name).join("src");
        if !src.is_dir() {
            problems.push(format!(
                "{ARCHITECTURE}:{}: a file table for `crates/{name}/src/`, which does not exist: remove the table",
                table.line
            ));
            continue;
        }
        for (listed, line) in &table.files {
            if !src.join(listed).is_file() {
                problems.push(format!(
                    "{ARCHITECTURE}:{line}: remove `{listed}` from the `crates/{name}/src/` table: crates/{name}/src/{listed} does not exist"
                ));
            }
        }
        let tests = test_modules(&src);
        for file in rust_files(&src) {
            if tests.contains(&file) {
                continue;
            }
            let path = relative(&file, &src);
            if !table.files.contains_key(&path) {
                problems.push(format!(
                    "{ARCHITECTURE}:{}: add `{path}` to the `crates/{name}/src/` table: crates/{name}/src/{path} exists and is not listed",
                    table.line
                ));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "the file tables of {ARCHITECTURE} drifted from the tree ({} problems):\n{}",
        problems.len(),
        problems.join("\n")
    );
}

#[test]
fn every_crate_path_the_docs_name_exists() {
    let root = root();
    let mut documents = vec![root.join("README.md")];
    let mut guides: Vec<PathBuf> = fs::read_dir(root.join("docs"))
        .expect("read docs/")
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|extension| extension == "md"))
        .collect();
    guides.sort();
    documents.extend(guides);
    let mut problems = Vec::new();
    for document in &documents {
        let text = fs::read_to_string(document).expect("read a document");
        let name = relative(document, &root);
        for (index, line) in text.lines().enumerate() {
            for quoted in backticked(line) {
                // A path under crates/, not a pattern (`outbox*`).
                if !quoted.starts_with("crates/") || quoted.contains(['*', ' ', '<']) {
                    continue;
                }
                for path in expand(quoted) {
                    if !root.join(&path).exists() {
                        problems.push(format!(
                            "{name}:{}: `{path}` does not exist: name the file as it is now, or remove it",
                            index + 1
                        ));
                    }
                }
            }
        }
    }
    assert!(
        problems.is_empty(),
        "the docs name {} paths that do not exist:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

#[test]
fn the_table_reader_expands_braces_and_reads_only_file_tables() {
    assert_eq!(
        expand("source/{mod, builder}.rs"),
        ["source/mod.rs", "source/builder.rs"]
    );
    assert_eq!(expand("lib.rs"), ["lib.rs"]);
    let text = "| `crates/x/src/` | what |\n|---|---|\n| `a.rs`, `b/{c,d}.rs` | one |\n\n| other | `e.rs` |\n|---|---|\n| `f.rs` | no |\n";
    let tables = tables(text);
    let files: Vec<&str> = tables["x"].files.keys().map(String::as_str).collect();
    assert_eq!(files, ["a.rs", "b/c.rs", "b/d.rs"]);
    assert_eq!(tables.len(), 1);
    assert!(test_only("#[cfg(test)] "));
    assert!(test_only("#[cfg(all(test, feature = \"metrics\"))] "));
    assert!(!test_only("#[cfg(feature = \"testkit\")] "));
    assert!(!test_only("#[cfg(not(test))] "));
    assert!(!test_only("#[doc = \"a test\"] "));
    assert!(test_only("#[allow(dead_code)] #[cfg(test)] "));
}
