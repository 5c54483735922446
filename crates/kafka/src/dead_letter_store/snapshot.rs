//! A letter's id (`PARTITION:OFFSET`) and the dead-letter topic as one
//! operation sees it: watermarks and the marks within them.

use std::collections::BTreeSet;
use std::fmt;

use intake_core::dead_letter::store::{LetterId, StoreError};

/// A letter's place: partition and offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Id {
    pub(super) partition: i32,
    pub(super) offset: i64,
}

impl Id {
    pub(super) fn letter_id(self) -> LetterId {
        LetterId::new(self.to_string())
    }

    /// The id written `PARTITION:OFFSET`, both decimal and not negative.
    pub(super) fn parse(text: &str) -> Option<Self> {
        let (partition, offset) = text.split_once(':')?;
        let digits = |part: &str| !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit());
        if !digits(partition) || !digits(offset) {
            return None;
        }
        Some(Self {
            partition: partition.parse().ok()?,
            offset: offset.parse().ok()?,
        })
    }
}

impl fmt::Display for Id {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.partition, self.offset)
    }
}

pub(super) fn id_of(id: &LetterId) -> Result<Id, StoreError> {
    Id::parse(id.as_str()).ok_or_else(|| StoreError::InvalidId {
        id: id.as_str().to_owned(),
        expected: "PARTITION:OFFSET in the dead-letter topic, such as 0:41",
    })
}

/// One partition of the dead-letter topic: its low and high watermarks.
#[derive(Clone, Copy, Debug)]
pub(super) struct Partition {
    pub(super) id: i32,
    pub(super) low: i64,
    pub(super) high: i64,
}

/// The dead-letter topic as one operation sees it.
#[derive(Debug, Default)]
pub(super) struct Snapshot {
    /// Sorted by partition; empty when the topic does not exist.
    pub(super) partitions: Vec<Partition>,
    /// Marked ids within their partition's watermarks.
    pub(super) removed: BTreeSet<Id>,
    /// Marked ids below their partition's low watermark, or of a partition
    /// the topic does not have: deleted already, their marks to tombstone.
    pub(super) stale: Vec<Id>,
}

impl Snapshot {
    pub(super) fn partition(&self, id: i32) -> Option<Partition> {
        self.partitions.iter().find(|p| p.id == id).copied()
    }

    /// Whether `id` is a letter the topic holds and no mark removed.
    pub(super) fn is_live(&self, id: Id) -> bool {
        self.partition(id.partition)
            .is_some_and(|p| p.low <= id.offset && id.offset < p.high)
            && !self.removed.contains(&id)
    }

    pub(super) fn entries(&self) -> u64 {
        let held: i64 = self
            .partitions
            .iter()
            .map(|p| (p.high - p.low).max(0))
            .sum();
        u64::try_from(held)
            .unwrap_or(0)
            .saturating_sub(self.removed.len() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_is_a_partition_and_an_offset() {
        for id in [
            "",
            "41",
            "0:",
            ":41",
            "-1:4",
            "0:-4",
            "0:4:1",
            "a:1",
            "0:+1",
            "99999999999:1",
        ] {
            assert!(
                matches!(id_of(&LetterId::new(id)), Err(StoreError::InvalidId { .. })),
                "{id}"
            );
        }
        let id = id_of(&LetterId::new("2:41")).expect("an id");
        assert_eq!((id.partition, id.offset), (2, 41));
        assert_eq!(id.letter_id().as_str(), "2:41");
    }

    #[test]
    fn a_snapshot_counts_the_held_records_less_the_marked_ones() {
        let snapshot = Snapshot {
            partitions: vec![
                Partition {
                    id: 0,
                    low: 3,
                    high: 10,
                },
                Partition {
                    id: 1,
                    low: 0,
                    high: 0,
                },
            ],
            removed: [Id {
                partition: 0,
                offset: 5,
            }]
            .into_iter()
            .collect(),
            stale: vec![],
        };
        assert_eq!(snapshot.entries(), 6);
        assert!(snapshot.is_live(Id {
            partition: 0,
            offset: 3
        }));
        assert!(
            !snapshot.is_live(Id {
                partition: 0,
                offset: 5
            }),
            "marked"
        );
        assert!(
            !snapshot.is_live(Id {
                partition: 0,
                offset: 2
            }),
            "deleted"
        );
        assert!(
            !snapshot.is_live(Id {
                partition: 0,
                offset: 10
            }),
            "not written"
        );
        assert!(
            !snapshot.is_live(Id {
                partition: 2,
                offset: 0
            }),
            "no partition"
        );
    }
}
