//! What the commands print: aligned tables for people, JSON for scripts.
//!
//! JSON goes to stdout as one document per command, so `| jq` works; every
//! message for people (errors, prompts, progress) goes to stderr.
//!
//! Nothing a producer wrote reaches the terminal as it is: a letter's
//! source, key, error, headers and payload, and a broker's error text, may
//! hold escape sequences (set the window title, write the clipboard with
//! OSC 52, erase or hide lines), a carriage return or newline that forges a
//! line, or a bidi control that reorders one. Text for people goes through
//! [`escaped`] (or [`escaped_bytes`], [`escaped_block`]); JSON through
//! [`json`], which writes such characters as JSON escapes (`\u001b`), so
//! the document is as safe on a terminal and parses back to the exact text.

use std::borrow::Cow;
use std::fmt::Write as _;
use std::io;
use std::time::Duration;

use intake_core::lag::PartitionLag;

use crate::lag::Lag;
use serde::Serialize;
use serde_json::ser::{Formatter, PrettyFormatter};

/// Whether `c` must not reach a terminal as it is: every control character
/// (C0 with ESC, CR and the newline; DEL; C1 with its one-character CSI and
/// OSC), which start escape sequences, move the cursor or end a line, and
/// the Unicode bidi controls and line separators, which reorder or break
/// how a line reads.
pub fn is_unsafe(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061c}'
                | '\u{200e}'
                | '\u{200f}'
                | '\u{2028}'
                | '\u{2029}'
                | '\u{202a}'..='\u{202e}'
                | '\u{2066}'..='\u{2069}'
        )
}

/// Appends `c` as an escape: `\n`, `\r`, `\t`, `\x1b` for the rest below
/// U+0080 (DEL is `\x7f`), `\u{9b}` above.
fn push_escape(out: &mut String, c: char) {
    let _ = match c {
        '\n' => out.write_str("\\n"),
        '\r' => out.write_str("\\r"),
        '\t' => out.write_str("\\t"),
        c if c.is_ascii() => write!(out, "\\x{:02x}", u32::from(c)),
        c => write!(out, "\\u{{{:x}}}", u32::from(c)),
    };
}

/// `text` for one line of a terminal: each [unsafe](is_unsafe) character
/// (the newline included) as an escape, the rest as it is. Backslashes are
/// left alone: this is for people, and `--json` has the exact text.
pub fn escaped(text: &str) -> Cow<'_, str> {
    escaped_keeping(text, |_| false)
}

/// `text` with the [unsafe](is_unsafe) characters escaped but those `keep`
/// allows.
fn escaped_keeping(text: &str, keep: impl Fn(char) -> bool) -> Cow<'_, str> {
    if !text.chars().any(|c| is_unsafe(c) && !keep(c)) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if is_unsafe(c) && !keep(c) {
            push_escape(&mut out, c);
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// Bytes for one line of a terminal: UTF-8 as [`escaped`], each byte that
/// is not UTF-8 as `\xNN`.
pub fn escaped_bytes(bytes: &[u8]) -> Cow<'_, str> {
    bytes_keeping(bytes, |_| false)
}

fn bytes_keeping(bytes: &[u8], keep: impl Fn(char) -> bool + Copy) -> Cow<'_, str> {
    if let Ok(text) = std::str::from_utf8(bytes) {
        return escaped_keeping(text, keep);
    }
    let mut out = String::with_capacity(bytes.len() + 8);
    for chunk in bytes.utf8_chunks() {
        out.push_str(&escaped_keeping(chunk.valid(), keep));
        for byte in chunk.invalid() {
            let _ = write!(out, "\\x{byte:02x}");
        }
    }
    Cow::Owned(out)
}

/// Bytes as a block of lines (a payload): as [`escaped_bytes`], but
/// newlines and tabs kept, and every line after the first indented by
/// `indent`, so that no line of it can pass for a line of its own (a field
/// of `show`).
pub fn escaped_block(bytes: &[u8], indent: &str) -> String {
    bytes_keeping(bytes, |c| c == '\n' || c == '\t').replace('\n', &format!("\n{indent}"))
}

/// The bytes as JSON carries them: UTF-8 exactly (the [`json`] document
/// escapes what a terminal must not see), anything else as
/// [`escaped_bytes`].
pub fn json_text(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(text) => text.to_owned(),
        Err(_) => escaped_bytes(bytes).into_owned(),
    }
}

/// Columns of text, each as wide as its widest cell, two spaces apart.
/// Cells of columns listed in `right` are right-aligned (numbers).
#[derive(Debug, Default)]
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
    right: Vec<usize>,
}

impl Table {
    /// A table with these column names.
    pub fn new(header: &[&str]) -> Self {
        Self {
            header: header.iter().map(|&name| name.to_owned()).collect(),
            ..Self::default()
        }
    }

    /// Right-aligns column `index`.
    pub fn right_aligned(mut self, index: usize) -> Self {
        self.right.push(index);
        self
    }

    /// Adds a row; missing cells are empty, extra ones are dropped.
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// The table, a line per row after the header, each ending in `\n`;
    /// trailing spaces trimmed.
    pub fn render(&self) -> String {
        let columns = self.header.len();
        let cell = |row: &Vec<String>, index: usize| row.get(index).cloned().unwrap_or_default();
        let widths: Vec<usize> = (0..columns)
            .map(|index| {
                std::iter::once(&self.header)
                    .chain(&self.rows)
                    .map(|row| cell(row, index).chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let mut out = String::new();
        for row in std::iter::once(&self.header).chain(&self.rows) {
            let mut line = String::new();
            for (index, width) in widths.iter().enumerate() {
                let text = cell(row, index);
                if index > 0 {
                    line.push_str("  ");
                }
                if self.right.contains(&index) {
                    let _ = write!(line, "{text:>width$}");
                } else {
                    let _ = write!(line, "{text:<width$}");
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

/// `duration` as people read an age: `850ms`, `3.2s`, `4m05s`, `2h03m`,
/// `3d04h`.
pub fn human_duration(duration: Duration) -> String {
    let millis = duration.as_millis();
    let secs = duration.as_secs();
    match secs {
        0 => format!("{millis}ms"),
        1..60 => format!("{}.{}s", secs, duration.subsec_millis() / 100),
        60..3_600 => format!("{}m{:02}s", secs / 60, secs % 60),
        3_600..86_400 => format!("{}h{:02}m", secs / 3_600, secs % 3_600 / 60),
        _ => format!("{}d{:02}h", secs / 86_400, secs % 86_400 / 3_600),
    }
}

/// `intake lag --json`.
#[derive(Debug, Serialize)]
pub struct LagReport<'a> {
    /// The broker URL, redacted.
    pub broker: &'a str,
    /// The source asked about.
    pub source: &'a str,
    /// The group asked about.
    pub group: &'a str,
    /// The sum of every partition's lag; `null` when a partition's is
    /// unknown.
    pub total: Option<u64>,
    /// Messages the group parked (retry later) that are not back yet:
    /// acknowledged, so not in `total`; `null` where the backend cannot
    /// count them.
    pub parked: Option<u64>,
    /// The parked messages per delay tier (`1s`, `exact`, `all`), with when
    /// the first is due back where the backend knows it.
    pub parked_tiers: Vec<ParkedTierReport>,
    /// One entry per partition.
    pub partitions: Vec<PartitionLagReport>,
}

/// One tier in [`LagReport`].
#[derive(Debug, Serialize)]
pub struct ParkedTierReport {
    /// The tier as the backend names it.
    pub tier: String,
    /// Messages parked there.
    pub messages: u64,
    /// When the first of them is due back, Unix milliseconds; `null` where
    /// the backend does not say.
    pub next_due_unix_ms: Option<u64>,
}

/// One partition in [`LagReport`].
#[derive(Debug, Serialize)]
pub struct PartitionLagReport {
    /// Topic, stream or queue.
    pub source: String,
    /// Partition number (0 for a stream or queue).
    pub partition: u32,
    /// Messages not committed or acknowledged; `null` when unknown.
    pub messages: Option<u64>,
    /// Age of the oldest of them in milliseconds, where the broker tells.
    pub oldest_age_ms: Option<u64>,
}

/// The lags' total: `None` as soon as one is unknown, since a partial sum
/// would read as the whole.
pub fn lag_total(lags: &[PartitionLag]) -> Option<u64> {
    lags.iter()
        .try_fold(0u64, |sum, lag| Some(sum.saturating_add(lag.messages?)))
}

/// The JSON document of `intake lag --json`.
pub fn lag_json(broker: &str, source: &str, group: &str, lag: &Lag) -> String {
    let lags = &lag.partitions;
    let report = LagReport {
        broker,
        source,
        group,
        total: lag_total(lags),
        parked: lag.parked,
        parked_tiers: lag
            .parked_tiers
            .iter()
            .map(|tier| ParkedTierReport {
                tier: tier.tier.clone(),
                messages: tier.messages,
                next_due_unix_ms: tier.next_due.and_then(|due| {
                    due.duration_since(std::time::UNIX_EPOCH)
                        .ok()
                        .and_then(|since| u64::try_from(since.as_millis()).ok())
                }),
            })
            .collect(),
        partitions: lags
            .iter()
            .map(|lag| PartitionLagReport {
                source: lag.partition.source.to_string(),
                partition: lag.partition.partition,
                messages: lag.messages,
                oldest_age_ms: lag
                    .oldest_age
                    .map(|age| u64::try_from(age.as_millis()).unwrap_or(u64::MAX)),
            })
            .collect(),
    };
    json(&report)
}

/// The table of `intake lag`, with a total line when there are several
/// partitions, and a `parked` line where the backend counts parked
/// messages.
pub fn lag_table(lag: &Lag) -> String {
    let lags = &lag.partitions;
    let unknown = || "?".to_owned();
    let mut table = Table::new(&["SOURCE", "PARTITION", "LAG", "OLDEST"])
        .right_aligned(1)
        .right_aligned(2);
    for lag in lags {
        table.row(vec![
            escaped(&lag.partition.source).into_owned(),
            lag.partition.partition.to_string(),
            lag.messages.map_or_else(unknown, |n| n.to_string()),
            lag.oldest_age
                .map_or_else(|| "-".to_owned(), human_duration),
        ]);
    }
    if lags.len() > 1 {
        table.row(vec![
            "total".to_owned(),
            String::new(),
            lag_total(lags).map_or_else(unknown, |n| n.to_string()),
        ]);
    }
    if let Some(parked) = lag.parked {
        table.row(vec!["parked".to_owned(), String::new(), parked.to_string()]);
        // Tiers only where the backend tells more than the total.
        let told =
            lag.parked_tiers.len() > 1 || lag.parked_tiers.iter().any(|tier| tier.tier != "all");
        if told {
            let now = std::time::SystemTime::now();
            for tier in &lag.parked_tiers {
                let due = tier.next_due.map_or_else(
                    || "-".to_owned(),
                    |due| {
                        format!(
                            "due in {}",
                            human_duration(due.duration_since(now).unwrap_or_default())
                        )
                    },
                );
                table.row(vec![
                    format!("  {}", escaped(&tier.tier)),
                    String::new(),
                    tier.messages.to_string(),
                    due,
                ]);
            }
        }
    }
    table.render()
}

/// `value` as pretty JSON and a newline, every [unsafe](is_unsafe)
/// character of its strings written as a JSON escape (`\u001b`, `\u009b`,
/// `\u202e`): the same value for a parser, nothing for a terminal to act
/// on. Serializing these plain structs cannot fail; were it to, the text
/// says so instead of panicking.
pub fn json<T: Serialize>(value: &T) -> String {
    let mut bytes = Vec::with_capacity(256);
    let mut serializer =
        serde_json::Serializer::with_formatter(&mut bytes, TerminalSafe(PrettyFormatter::new()));
    match value.serialize(&mut serializer) {
        // serde_json writes only UTF-8.
        Ok(()) => {
            let mut text = String::from_utf8_lossy(&bytes).into_owned();
            text.push('\n');
            text
        }
        Err(error) => format!("{{\"error\": {:?}}}\n", escaped(&error.to_string())),
    }
}

/// serde_json's pretty formatter, which escapes C0 controls already, also
/// escaping DEL, C1 controls and the bidi controls it passes through.
struct TerminalSafe<'a>(PrettyFormatter<'a>);

impl Formatter for TerminalSafe<'_> {
    fn write_string_fragment<W>(&mut self, writer: &mut W, fragment: &str) -> io::Result<()>
    where
        W: ?Sized + io::Write,
    {
        let mut start = 0;
        for (at, c) in fragment.char_indices() {
            if is_unsafe(c) {
                writer.write_all(&fragment.as_bytes()[start..at])?;
                // Every unsafe character is in the Basic Multilingual Plane.
                write!(writer, "\\u{:04x}", u32::from(c))?;
                start = at + c.len_utf8();
            }
        }
        writer.write_all(&fragment.as_bytes()[start..])
    }

    fn begin_array<W>(&mut self, writer: &mut W) -> io::Result<()>
    where
        W: ?Sized + io::Write,
    {
        self.0.begin_array(writer)
    }

    fn end_array<W>(&mut self, writer: &mut W) -> io::Result<()>
    where
        W: ?Sized + io::Write,
    {
        self.0.end_array(writer)
    }

    fn begin_array_value<W>(&mut self, writer: &mut W, first: bool) -> io::Result<()>
    where
        W: ?Sized + io::Write,
    {
        self.0.begin_array_value(writer, first)
    }

    fn end_array_value<W>(&mut self, writer: &mut W) -> io::Result<()>
    where
        W: ?Sized + io::Write,
    {
        self.0.end_array_value(writer)
    }

    fn begin_object<W>(&mut self, writer: &mut W) -> io::Result<()>
    where
        W: ?Sized + io::Write,
    {
        self.0.begin_object(writer)
    }

    fn end_object<W>(&mut self, writer: &mut W) -> io::Result<()>
    where
        W: ?Sized + io::Write,
    {
        self.0.end_object(writer)
    }

    fn begin_object_key<W>(&mut self, writer: &mut W, first: bool) -> io::Result<()>
    where
        W: ?Sized + io::Write,
    {
        self.0.begin_object_key(writer, first)
    }

    fn begin_object_value<W>(&mut self, writer: &mut W) -> io::Result<()>
    where
        W: ?Sized + io::Write,
    {
        self.0.begin_object_value(writer)
    }

    fn end_object_value<W>(&mut self, writer: &mut W) -> io::Result<()>
    where
        W: ?Sized + io::Write,
    {
        self.0.end_object_value(writer)
    }
}

#[cfg(test)]
mod tests {
    use intake_core::PartitionKey;

    use super::*;

    fn lags() -> Lag {
        of(vec![
            PartitionLag::new(PartitionKey::new("orders", 0), Some(12))
                .with_oldest_age(Duration::from_millis(3_250)),
            PartitionLag::new(PartitionKey::new("orders", 1), Some(0)),
            PartitionLag::new(PartitionKey::new("orders", 10), Some(1_500)),
        ])
    }

    fn of(partitions: Vec<PartitionLag>) -> Lag {
        Lag {
            partitions,
            parked: None,
            parked_tiers: Vec::new(),
        }
    }

    #[test]
    fn parked_tiers_have_lines_of_their_own_with_hostile_names_escaped() {
        let mut lag = lags();
        lag.parked = Some(5);
        lag.parked_tiers = vec![
            intake_core::lag::ParkedTier::new("1s", 3),
            intake_core::lag::ParkedTier::new("\u{1b}[2J2m", 2),
        ];
        let table = lag_table(&lag);
        assert!(
            table
                .lines()
                .any(|line| line.starts_with("  1s ") && line.ends_with(" 3  -")),
            "{table}"
        );
        assert!(!table.contains('\u{1b}'), "{table}");
        let value: serde_json::Value =
            serde_json::from_str(&lag_json("kafka://h:9092", "orders", "g", &lag)).unwrap();
        assert_eq!(value["parked_tiers"][0]["tier"], "1s");
        assert_eq!(value["parked_tiers"][1]["messages"], 2);
        assert_eq!(
            value["parked_tiers"][1]["next_due_unix_ms"],
            serde_json::Value::Null
        );
    }

    #[test]
    fn one_tier_all_adds_no_line() {
        let mut lag = lags();
        lag.parked = Some(5);
        lag.parked_tiers = vec![intake_core::lag::ParkedTier::new("all", 5)];
        assert!(lag_table(&lag).ends_with("parked                5\n"));
    }

    #[test]
    fn the_parked_backlog_has_a_line_of_its_own() {
        let mut lag = lags();
        lag.parked = Some(5);
        let table = lag_table(&lag);
        assert!(
            table.ends_with("total              1512\nparked                5\n"),
            "{table}"
        );
        let value: serde_json::Value =
            serde_json::from_str(&lag_json("kafka://h:9092", "orders", "g", &lag)).unwrap();
        assert_eq!(value["parked"], 5);
        assert_eq!(value["total"], 1512, "parked messages are not broker lag");
    }

    #[test]
    fn the_lag_table_aligns_numbers_right_and_totals() {
        assert_eq!(
            lag_table(&lags()),
            "SOURCE  PARTITION   LAG  OLDEST\n\
             orders          0    12  3.2s\n\
             orders          1     0  -\n\
             orders         10  1500  -\n\
             total              1512\n"
        );
    }

    #[test]
    fn one_partition_needs_no_total() {
        let lag = of(vec![PartitionLag::new(PartitionKey::new("q", 0), Some(7))]);
        assert_eq!(
            lag_table(&lag),
            "SOURCE  PARTITION  LAG  OLDEST\nq               0    7  -\n"
        );
    }

    #[test]
    fn an_unknown_partition_makes_the_total_unknown() {
        let mut lags = lags();
        lags.partitions
            .push(PartitionLag::new(PartitionKey::new("orders", 11), None));
        assert_eq!(lag_total(&lags.partitions), None);
        let table = lag_table(&lags);
        assert!(table.ends_with("total                 ?\n"), "{table}");
        let value: serde_json::Value =
            serde_json::from_str(&lag_json("kafka://h:9092", "orders", "g", &lags)).unwrap();
        assert_eq!(value["total"], serde_json::Value::Null);
        assert_eq!(value["partitions"][3]["messages"], serde_json::Value::Null);
    }

    #[test]
    fn the_lag_json_has_every_field_scripts_read() {
        let value: serde_json::Value =
            serde_json::from_str(&lag_json("kafka://h:9092", "orders", "billing", &lags()))
                .unwrap();
        assert_eq!(
            value,
            serde_json::json!({
                "broker": "kafka://h:9092",
                "source": "orders",
                "group": "billing",
                "total": 1512,
                "parked": null,
                "parked_tiers": [],
                "partitions": [
                    {"source": "orders", "partition": 0, "messages": 12, "oldest_age_ms": 3250},
                    {"source": "orders", "partition": 1, "messages": 0, "oldest_age_ms": null},
                    {"source": "orders", "partition": 10, "messages": 1500, "oldest_age_ms": null},
                ]
            })
        );
    }

    #[test]
    fn text_for_a_terminal_escapes_controls_and_bidi_only() {
        assert_eq!(escaped("plain, é, 日本, \\x1b"), "plain, é, 日本, \\x1b");
        assert!(matches!(escaped("plain"), Cow::Borrowed(_)));
        assert_eq!(
            escaped("\x1b]0;t\x07\u{9b}2J\x7f\r\n\t\u{202e}\u{2066}\u{2028}"),
            "\\x1b]0;t\\x07\\u{9b}2J\\x7f\\r\\n\\t\\u{202e}\\u{2066}\\u{2028}"
        );
        assert_eq!(
            escaped_bytes(b"ok\xff\x1b[m\xe2\x80"),
            "ok\\xff\\x1b[m\\xe2\\x80"
        );
        assert_eq!(
            escaped_block(b"{\n\t\"a\": 1\r\n}\x1b", "  "),
            "{\n  \t\"a\": 1\\r\n  }\\x1b"
        );
        assert_eq!(json_text(b"\x1b"), "\x1b");
        assert_eq!(json_text(b"\xff"), "\\xff");
    }

    #[test]
    fn json_escapes_what_a_terminal_would_act_on_and_parses_back() {
        let text = "a\x1b\x7f\u{9b}\u{202e}\u{2029}é";
        let document = json(&serde_json::json!({ text: text }));
        assert_eq!(
            document,
            "{\n  \"a\\u001b\\u007f\\u009b\\u202e\\u2029é\": \"a\\u001b\\u007f\\u009b\\u202e\\u2029é\"\n}\n"
        );
        let value: serde_json::Value = serde_json::from_str(&document).unwrap();
        assert_eq!(value[text], text);
    }

    #[test]
    fn ages_read_at_a_glance() {
        for (millis, shown) in [
            (850, "850ms"),
            (3_250, "3.2s"),
            (245_000, "4m05s"),
            (7_380_000, "2h03m"),
            (273_600_000, "3d04h"),
        ] {
            assert_eq!(human_duration(Duration::from_millis(millis)), shown);
        }
    }
}
