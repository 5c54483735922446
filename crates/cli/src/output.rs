//! What the commands print: aligned tables for people, JSON for scripts.
//!
//! JSON goes to stdout as one document per command, so `| jq` works; every
//! message for people (errors, prompts, progress) goes to stderr.

use std::fmt::Write as _;
use std::time::Duration;

use intake_core::lag::PartitionLag;
use serde::Serialize;

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
    /// One entry per partition.
    pub partitions: Vec<PartitionLagReport>,
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
pub fn lag_json(broker: &str, source: &str, group: &str, lags: &[PartitionLag]) -> String {
    let report = LagReport {
        broker,
        source,
        group,
        total: lag_total(lags),
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
/// partitions.
pub fn lag_table(lags: &[PartitionLag]) -> String {
    let unknown = || "?".to_owned();
    let mut table = Table::new(&["SOURCE", "PARTITION", "LAG", "OLDEST"])
        .right_aligned(1)
        .right_aligned(2);
    for lag in lags {
        table.row(vec![
            lag.partition.source.to_string(),
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
    table.render()
}

/// `value` as pretty JSON and a newline. Serializing these plain structs
/// cannot fail; were it to, the text says so instead of panicking.
pub fn json<T: Serialize>(value: &T) -> String {
    match serde_json::to_string_pretty(value) {
        Ok(mut text) => {
            text.push('\n');
            text
        }
        Err(error) => format!("{{\"error\": \"{error}\"}}\n"),
    }
}

#[cfg(test)]
mod tests {
    use intake_core::PartitionKey;

    use super::*;

    fn lags() -> Vec<PartitionLag> {
        vec![
            PartitionLag::new(PartitionKey::new("orders", 0), Some(12))
                .with_oldest_age(Duration::from_millis(3_250)),
            PartitionLag::new(PartitionKey::new("orders", 1), Some(0)),
            PartitionLag::new(PartitionKey::new("orders", 10), Some(1_500)),
        ]
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
        let lag = vec![PartitionLag::new(PartitionKey::new("q", 0), Some(7))];
        assert_eq!(
            lag_table(&lag),
            "SOURCE  PARTITION  LAG  OLDEST\nq               0    7  -\n"
        );
    }

    #[test]
    fn an_unknown_partition_makes_the_total_unknown() {
        let mut lags = lags();
        lags.push(PartitionLag::new(PartitionKey::new("orders", 11), None));
        assert_eq!(lag_total(&lags), None);
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
                "partitions": [
                    {"source": "orders", "partition": 0, "messages": 12, "oldest_age_ms": 3250},
                    {"source": "orders", "partition": 1, "messages": 0, "oldest_age_ms": null},
                    {"source": "orders", "partition": 10, "messages": 1500, "oldest_age_ms": null},
                ]
            })
        );
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
