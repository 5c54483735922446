//! The compile errors a handler author meets, checked word for word: each
//! `tests/ui/NAME.rs` must fail to compile with the errors in
//! `tests/ui/NAME.stderr`.
//!
//! Each case is one rustc run against the `intake_core` this test was built
//! with (the newest `libintake_core-*.rlib` beside the test binary, whose
//! dependencies rustc finds there too), so the cases cost about a second in
//! all and nothing to build. trybuild, the usual tool, checks a project of
//! its own with every dependency and dev-dependency of the crate, twice
//! (its two passes differ in flags): about 100 s and 400 MB more on a cold
//! build of this crate, measured.
//!
//! The messages are rustc's and change between its versions: the expected
//! files are those of the toolchain this workspace builds with. After a
//! change to a message or the toolchain, `INTAKE_BLESS=1 cargo test -p
//! intake-core --test compile_errors` rewrites them; review the diff, it is
//! the text users read.

use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

#[test]
fn handler_mistakes_are_explained() {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let deps = deps_dir();
    let intake_core = newest_rlib(&deps, "libintake_core-");
    let bless = std::env::var_os("INTAKE_BLESS").is_some_and(|value| value == "1");

    let mut cases: Vec<PathBuf> = fs::read_dir(manifest_dir.join("tests/ui"))
        .expect("tests/ui exists")
        .map(|entry| entry.expect("tests/ui is readable").path())
        .filter(|path| path.extension().is_some_and(|extension| extension == "rs"))
        .collect();
    cases.sort();
    assert!(!cases.is_empty(), "no case in tests/ui");

    let mut failures = Vec::new();
    for case in &cases {
        let name = case
            .file_stem()
            .and_then(|stem| stem.to_str())
            .expect("a UTF-8 file name");
        let relative = format!("tests/ui/{name}.rs");
        let output = Command::new(rustc())
            .current_dir(manifest_dir)
            .args(["--edition=2024", "--crate-type=bin", "--emit=metadata"])
            .args(["--color=never", "--diagnostic-width=140"])
            .arg(format!("--crate-name=ui_{name}"))
            .arg("-o")
            .arg(Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("ui_{name}.rmeta")))
            .arg("--extern")
            .arg(concat_os("intake_core=", intake_core.as_os_str()))
            .arg("-L")
            .arg(concat_os("dependency=", deps.as_os_str()))
            .arg(&relative)
            .output()
            .expect("rustc runs");
        let stderr = normalize(&String::from_utf8_lossy(&output.stderr));
        if output.status.success() {
            failures.push(format!("{relative} compiled, but it should not:\n{stderr}"));
            continue;
        }
        let expected_path = manifest_dir.join(format!("tests/ui/{name}.stderr"));
        if bless {
            fs::write(&expected_path, &stderr).expect("the expected file is writable");
            continue;
        }
        let expected = fs::read_to_string(&expected_path).unwrap_or_default();
        if expected != stderr {
            failures.push(format!(
                "{relative}: the errors differ from tests/ui/{name}.stderr \
                 (INTAKE_BLESS=1 rewrites it)\n--- expected\n{expected}\n--- actual\n{stderr}"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The directory of this test binary, where cargo put the rlibs it linked.
fn deps_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    exe.parent()
        .expect("the test binary is in a directory")
        .to_path_buf()
}

/// The newest rlib whose file name starts with `prefix`. Every rlib newer
/// than the one this test linked was built from the same sources (cargo
/// rebuilt this test's if they changed since), so the newest is current;
/// one of another feature set gives the same errors for these cases, which
/// use no optional feature.
fn newest_rlib(deps: &Path, prefix: &str) -> PathBuf {
    fs::read_dir(deps)
        .expect("the deps directory is readable")
        .filter_map(Result::ok)
        .filter(|entry| {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            name.starts_with(prefix) && name.ends_with(".rlib")
        })
        .filter_map(|entry| Some((entry.metadata().ok()?.modified().ok()?, entry.path())))
        .max()
        .map(|(_, path)| path)
        .unwrap_or_else(|| panic!("no {prefix}*.rlib in {}", deps.display()))
}

/// The rustc cargo runs: `$RUSTC` when set, else the one on the path (the
/// toolchain rustup picked for this cargo).
fn rustc() -> OsString {
    std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into())
}

fn concat_os(prefix: &str, value: &std::ffi::OsStr) -> OsString {
    let mut joined = OsString::from(prefix);
    joined.push(value);
    joined
}

/// Keeps the errors from depending on intake's own line numbers: a span in
/// the library (`crates/core/src/handler/mod.rs:120:0`, no snippet, as
/// rustc cannot read the workspace-relative path from here) is shown by
/// file only (`src/handler/mod.rs`). The file rustc writes a long type name
/// to has a random name: it is shown as `$LONG_TYPE`.
fn normalize(stderr: &str) -> String {
    let mut normalized = String::with_capacity(stderr.len());
    for line in stderr.lines() {
        if let Some(start) = line.find("the full name for the type has been written to '") {
            normalized.push_str(&line[..start]);
            normalized.push_str("the full name for the type has been written to '$LONG_TYPE'\n");
            continue;
        }
        match line.find("crates/core/src/") {
            Some(start) => {
                let path_start = start + "crates/core/".len();
                let rest = &line[path_start..];
                let path_end = rest.find(':').unwrap_or(rest.len());
                let after =
                    rest[path_end..].trim_start_matches(|c: char| c == ':' || c.is_ascii_digit());
                normalized.push_str(&line[..start]);
                normalized.push_str(&rest[..path_end]);
                normalized.push_str(after);
            }
            None => normalized.push_str(line),
        }
        normalized.push('\n');
    }
    normalized
}
