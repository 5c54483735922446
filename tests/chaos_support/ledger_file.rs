//! The ledger file `ledger consume` appends to: `ID\tPARTITION\tPOSITION\n`
//! per handled message, written before the handler reports success; a
//! parked copy's line has a fourth field, how many milliseconds after its
//! due time it ran. A line
//! is the proof that a message was handled; an id without a line was lost
//! (acked or committed without being handled), an id with several lines was
//! delivered again after a crash or fault.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// What the ledger files of one scenario say about ids `0..produced`.
#[derive(Debug)]
pub struct LedgerStats {
    pub produced: u64,
    /// Well-formed lines.
    pub lines: u64,
    /// Ids with at least one line.
    pub distinct: u64,
    /// Ids without a line, ascending.
    pub missing: Vec<u64>,
    /// Ids with more than one line.
    pub duplicated_ids: u64,
    /// Lines beyond the first per id: the redeliveries.
    pub duplicate_deliveries: u64,
    /// Lines cut short by a SIGKILL in the middle of a write (that handler
    /// never reported success, so its message is redelivered).
    pub torn_lines: u64,
    /// Well-formed lines whose id is not one that was produced, first few.
    pub foreign_ids: Vec<String>,
    /// Lines of parked copies (with a fourth field).
    pub parked_lines: u64,
    /// Parked copies handled before their due time, first few, as
    /// (id, milliseconds early).
    pub early: Vec<(String, i64)>,
    /// The order per key, as the ids first appear in the file.
    pub key_order: KeyOrder,
}

/// Keys (`id % KEYS`, as `ledger produce` writes them) whose ids did not
/// first appear in ascending order: each key's messages are produced in
/// ascending order, so a later id handled before an earlier one of its key
/// broke the key's order. Only meaningful for one file read by one
/// consumer at a time, with `--ordering key`.
#[derive(Debug, Default)]
pub struct KeyOrder {
    /// Keys with at least one id first seen after a later id of the key.
    pub broken_keys: u64,
    /// The first few breaks, as (key, the later id seen first, the earlier
    /// id seen after it).
    pub first_breaks: Vec<(u64, u64, u64)>,
}

/// How many keys `ledger produce` spreads ids over.
pub const KEYS: u64 = 64;

impl LedgerStats {
    /// Reads `files` (one per consumer process; missing files count as
    /// empty) against the ids `0..produced`.
    pub fn read(files: &[PathBuf], produced: u64) -> Result<Self, String> {
        let mut seen = vec![0_u32; usize::try_from(produced).expect("fits memory")];
        let mut stats = Self {
            produced,
            lines: 0,
            distinct: 0,
            missing: Vec::new(),
            duplicated_ids: 0,
            duplicate_deliveries: 0,
            torn_lines: 0,
            foreign_ids: Vec::new(),
            parked_lines: 0,
            early: Vec::new(),
            key_order: KeyOrder::default(),
        };
        // Per key: the highest id seen so far, and whether it broke.
        let mut highest: Vec<Option<u64>> = vec![None; KEYS as usize];
        let mut broken = vec![false; KEYS as usize];
        for file in files {
            let text = match fs::read_to_string(file) {
                Ok(text) => text,
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => continue,
                Err(error) => return Err(format!("cannot read {}: {error}", file.display())),
            };
            for line in text.lines() {
                let fields: Vec<&str> = line.split('\t').collect();
                let (id, position, lateness) = match fields[..] {
                    [id, _partition, position] => (id, position, None),
                    [id, _partition, position, lateness] => (id, position, Some(lateness)),
                    _ => {
                        stats.torn_lines += 1;
                        continue;
                    }
                };
                if let Some(lateness) = lateness {
                    let Ok(late_ms) = lateness.parse::<i64>() else {
                        stats.torn_lines += 1;
                        continue;
                    };
                    stats.parked_lines += 1;
                    if late_ms < 0 && stats.early.len() < 10 {
                        stats.early.push((id.to_owned(), -late_ms));
                    }
                }
                if position.is_empty() {
                    stats.torn_lines += 1;
                    continue;
                }
                match id.parse::<u64>() {
                    Ok(id) if id < produced => {
                        stats.lines += 1;
                        seen[id as usize] += 1;
                        if seen[id as usize] == 1 {
                            let key = (id % KEYS) as usize;
                            match highest[key] {
                                Some(later) if later > id => {
                                    broken[key] = true;
                                    if stats.key_order.first_breaks.len() < 10 {
                                        stats.key_order.first_breaks.push((key as u64, later, id));
                                    }
                                }
                                _ => highest[key] = Some(id),
                            }
                        }
                    }
                    _ => {
                        if stats.foreign_ids.len() < 10 {
                            stats.foreign_ids.push(id.to_owned());
                        }
                    }
                }
            }
        }
        stats.key_order.broken_keys = broken.iter().filter(|broken| **broken).count() as u64;
        for (id, &count) in seen.iter().enumerate() {
            match count {
                0 => stats.missing.push(id as u64),
                1 => stats.distinct += 1,
                _ => {
                    stats.distinct += 1;
                    stats.duplicated_ids += 1;
                    stats.duplicate_deliveries += u64::from(count - 1);
                }
            }
        }
        Ok(stats)
    }

    /// Ids that were produced but never handled.
    pub fn lost(&self) -> u64 {
        self.missing.len() as u64
    }

    /// The first few missing ids, for a failure message.
    pub fn first_missing(&self) -> String {
        let shown: Vec<String> = self.missing.iter().take(20).map(u64::to_string).collect();
        let more = self.missing.len().saturating_sub(shown.len());
        if more > 0 {
            format!("{} … and {more} more", shown.join(", "))
        } else {
            shown.join(", ")
        }
    }
}

/// Follows ledger files while consumers append to them: how many distinct
/// ids they hold so far, the progress of the work (redeliveries are not
/// progress). Reads only what was appended since the last look, and only
/// complete lines (a writer may be in the middle of one).
#[derive(Debug)]
pub struct Progress {
    files: Vec<(PathBuf, u64)>,
    seen: Vec<bool>,
    distinct: u64,
}

impl Progress {
    /// Progress over ids `0..produced` in `files`.
    pub fn new(files: &[PathBuf], produced: u64) -> Self {
        Self {
            files: files.iter().map(|file| (file.clone(), 0)).collect(),
            seen: vec![false; usize::try_from(produced).expect("fits memory")],
            distinct: 0,
        }
    }

    /// Distinct ids handled so far.
    pub fn distinct(&mut self) -> u64 {
        let mut appended = Vec::new();
        for (path, offset) in &mut self.files {
            let Ok(mut file) = File::open(&*path) else {
                continue; // Not created yet.
            };
            appended.clear();
            if file.seek(SeekFrom::Start(*offset)).is_err()
                || file.read_to_end(&mut appended).is_err()
            {
                continue;
            }
            let Some(end) = appended.iter().rposition(|&byte| byte == b'\n') else {
                continue; // No complete line yet.
            };
            *offset += end as u64 + 1;
            for line in appended[..end].split(|&byte| byte == b'\n') {
                let id = line.split(|&byte| byte == b'\t').next().unwrap_or_default();
                let id = std::str::from_utf8(id)
                    .ok()
                    .and_then(|id| id.parse::<usize>().ok());
                if let Some(seen) = id.and_then(|id| self.seen.get_mut(id))
                    && !*seen
                {
                    *seen = true;
                    self.distinct += 1;
                }
            }
        }
        self.distinct
    }
}

/// A graceful stop in a rolling restart: which ledger file the stopped
/// instance wrote, and how long every ledger file was when it was sent
/// SIGTERM (a line starting at or past that length was written after).
#[derive(Clone, Debug)]
pub struct GracefulStop {
    /// Index of the stopped instance's file in the files attributed.
    pub stopped: usize,
    /// Length of each file, by index, when SIGTERM was sent.
    pub lengths_at_sigterm: Vec<u64>,
}

/// Duplicate deliveries (lines beyond the first per id) by cause.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct DuplicateCauses {
    /// Per graceful stop, in order: lines of ids the stopped instance had
    /// handled, written by another instance after the stop's SIGTERM. The
    /// stop handed them over although the stopped instance had handled
    /// them: the handover repeated them.
    pub per_stop: Vec<u64>,
    /// Every other duplicate: one instance handling an id twice, or two
    /// instances that were not stopping (a rebalance when one joins).
    pub other: u64,
}

impl DuplicateCauses {
    /// Duplicates attributed to graceful stops, all together.
    pub fn handover(&self) -> u64 {
        self.per_stop.iter().sum()
    }

    /// Attributes the duplicate deliveries in `files` (one per instance;
    /// ids `0..produced`) to the graceful `stops`.
    pub fn attribute(
        files: &[PathBuf],
        stops: &[GracefulStop],
        produced: u64,
    ) -> Result<Self, String> {
        // Each id's lines as (file, offset of the line's start).
        let mut lines: Vec<Vec<(usize, u64)>> =
            vec![Vec::new(); usize::try_from(produced).expect("fits memory")];
        for (index, file) in files.iter().enumerate() {
            let text = match fs::read(file) {
                Ok(text) => text,
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => continue,
                Err(error) => return Err(format!("cannot read {}: {error}", file.display())),
            };
            let mut offset = 0_u64;
            for line in text.split_inclusive(|&byte| byte == b'\n') {
                let id = line.split(|&byte| byte == b'\t').next().unwrap_or_default();
                let id = std::str::from_utf8(id)
                    .ok()
                    .and_then(|id| id.parse::<usize>().ok());
                // Torn and foreign lines are LedgerStats' business.
                if line.ends_with(b"\n")
                    && let Some(handled) = id.and_then(|id| lines.get_mut(id))
                {
                    handled.push((index, offset));
                }
                offset += line.len() as u64;
            }
        }
        let mut causes = Self {
            per_stop: vec![0; stops.len()],
            other: 0,
        };
        for handled in lines.iter().filter(|handled| handled.len() > 1) {
            let extra = handled.len() as u64 - 1;
            let mut by_stops = 0;
            for &(file, offset) in handled {
                let stop = stops.iter().position(|stop| {
                    stop.stopped != file
                        && handled.iter().any(|&(other, _)| other == stop.stopped)
                        // A file that is not in the list did not exist yet.
                        && offset >= stop.lengths_at_sigterm.get(file).copied().unwrap_or(0)
                });
                if let Some(stop) = stop
                    && by_stops < extra
                {
                    causes.per_stop[stop] += 1;
                    by_stops += 1;
                }
            }
            causes.other += extra - by_stops;
        }
        Ok(causes)
    }
}

/// Ends a line a SIGKILL cut short, so that the next run's first line does
/// not glue onto it (which would turn a good line into a torn one and hide
/// its id). Called between runs, while no process writes the file.
pub fn end_torn_line(path: &Path) -> Result<(), String> {
    let bytes = match fs::read(path) {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(error) => return Err(format!("cannot read {}: {error}", path.display())),
    };
    if bytes.last().is_none_or(|&last| last == b'\n') {
        return Ok(());
    }
    OpenOptions::new()
        .append(true)
        .open(path)
        .and_then(|mut file| file.write_all(b"\n"))
        .map_err(|error| format!("cannot end the torn line of {}: {error}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_missing_duplicated_torn_and_foreign_lines() {
        let dir = std::env::temp_dir().join(format!("intake-chaos-ledger-{}", std::process::id()));
        fs::create_dir_all(&dir).expect("temp dir");
        let first = dir.join("a.tsv");
        let second = dir.join("b.tsv");
        fs::write(&first, "0\t0\t0\n1\t0\t1\n1\t0\t1\n3\t0\t3\n9\t0\t9\n4\t0").expect("write");
        end_torn_line(&first).expect("end torn line");
        fs::write(&second, "3\t1\t0\n3\t1\t0\n").expect("write");
        let stats = LedgerStats::read(&[first, second, dir.join("absent.tsv")], 5).expect("read");
        fs::remove_dir_all(&dir).expect("clean up");
        assert_eq!(stats.missing, vec![2, 4]);
        assert_eq!(stats.distinct, 3);
        assert_eq!(stats.duplicated_ids, 2);
        assert_eq!(stats.duplicate_deliveries, 3);
        assert_eq!(stats.torn_lines, 1);
        assert_eq!(stats.foreign_ids, vec!["9".to_owned()]);
        assert_eq!(stats.lines, 6);
    }

    #[test]
    fn duplicates_after_a_sigterm_of_ids_the_stopped_instance_handled_are_the_handovers() {
        let dir =
            std::env::temp_dir().join(format!("intake-chaos-handover-{}", std::process::id()));
        fs::create_dir_all(&dir).expect("temp dir");
        let (stopped, survivor, replacement) =
            (dir.join("a.tsv"), dir.join("b.tsv"), dir.join("c.tsv"));
        // The stopped instance handled 0, 1 and 2, and 3 twice itself.
        fs::write(&stopped, "0\t0\t0\n1\t0\t1\n2\t0\t2\n3\t0\t3\n3\t0\t3\n").expect("write");
        // Before the SIGTERM the survivor handled 4 and 2 (a rebalance);
        // after it, 0 again.
        let before = "4\t1\t0\n2\t0\t2\n";
        fs::write(&survivor, format!("{before}0\t0\t0\n")).expect("write");
        // The replacement started after the SIGTERM: 1 again, and 4.
        fs::write(&replacement, "1\t0\t1\n4\t1\t0\n").expect("write");
        let stop = GracefulStop {
            stopped: 0,
            // The replacement's file came after the SIGTERM.
            lengths_at_sigterm: vec![30, before.len() as u64],
        };
        let causes = DuplicateCauses::attribute(&[stopped, survivor, replacement], &[stop], 5)
            .expect("attribute");
        fs::remove_dir_all(&dir).expect("clean up");
        // 0 and 1 after the stop; 2 before it, 3 within one instance and 4
        // between two instances that were not stopping.
        assert_eq!(
            causes,
            DuplicateCauses {
                per_stop: vec![2],
                other: 3
            }
        );
        assert_eq!(causes.handover(), 2);
    }

    #[test]
    fn progress_counts_distinct_ids_of_complete_lines_only() {
        let dir =
            std::env::temp_dir().join(format!("intake-chaos-progress-{}", std::process::id()));
        fs::create_dir_all(&dir).expect("temp dir");
        let file = dir.join("ledger.tsv");
        fs::write(&file, "0\t0\t0\n1\t0\t1\n1\t0\t1\n2\t0").expect("write");
        let mut progress = Progress::new(std::slice::from_ref(&file), 5);
        assert_eq!(progress.distinct(), 2);
        OpenOptions::new()
            .append(true)
            .open(&file)
            .and_then(|mut file| file.write_all(b"\t2\n3\t0\t3\n"))
            .expect("append");
        assert_eq!(progress.distinct(), 4);
        fs::remove_dir_all(&dir).expect("clean up");
    }
}
