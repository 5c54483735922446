//! How a group's partitions are spread over its members.

/// How a consumer group spreads a topic's partitions over its members
/// (ordered by when they joined).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AssignmentStrategy {
    /// Contiguous ranges: with 5 partitions and 2 members, the first member
    /// gets 0–2 and the second 3–4 (Kafka's `RangeAssignor`).
    #[default]
    Range,
    /// In turn: partition `p` goes to member `p % members`
    /// (Kafka's `RoundRobinAssignor`).
    RoundRobin,
}

impl AssignmentStrategy {
    /// The index (into the members in join order) of the member that gets
    /// `partition`, or `None` when the group has no members.
    pub(crate) fn owner_of(self, partition: u32, partitions: u32, members: usize) -> Option<usize> {
        if members == 0 {
            return None;
        }
        let partition = partition as usize;
        Some(match self {
            AssignmentStrategy::RoundRobin => partition % members,
            AssignmentStrategy::Range => {
                let partitions = partitions as usize;
                let share = partitions / members;
                let with_extra = partitions % members;
                // The first `with_extra` members hold `share + 1` partitions.
                let boundary = with_extra * (share + 1);
                if partition < boundary {
                    partition / (share + 1)
                } else {
                    with_extra + (partition - boundary) / share.max(1)
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(strategy: AssignmentStrategy, partitions: u32, members: usize) -> Vec<usize> {
        (0..partitions)
            .map(|p| {
                strategy
                    .owner_of(p, partitions, members)
                    .unwrap_or(usize::MAX)
            })
            .collect()
    }

    #[test]
    fn range_gives_contiguous_runs_with_the_extras_first() {
        assert_eq!(layout(AssignmentStrategy::Range, 5, 2), [0, 0, 0, 1, 1]);
        assert_eq!(layout(AssignmentStrategy::Range, 6, 3), [0, 0, 1, 1, 2, 2]);
        assert_eq!(layout(AssignmentStrategy::Range, 2, 3), [0, 1]);
        assert_eq!(
            layout(AssignmentStrategy::Range, 7, 3),
            [0, 0, 0, 1, 1, 2, 2]
        );
    }

    #[test]
    fn round_robin_deals_partitions_in_turn() {
        assert_eq!(
            layout(AssignmentStrategy::RoundRobin, 5, 2),
            [0, 1, 0, 1, 0]
        );
    }

    #[test]
    fn every_partition_has_an_owner_and_shares_differ_by_at_most_one() {
        for strategy in [AssignmentStrategy::Range, AssignmentStrategy::RoundRobin] {
            for partitions in 1..20 {
                for members in 1..8 {
                    let owners = layout(strategy, partitions, members);
                    let mut counts = vec![0; members];
                    for owner in owners {
                        counts[owner] += 1;
                    }
                    let (min, max) = (counts.iter().min(), counts.iter().max());
                    assert!(max.zip(min).is_some_and(|(max, min)| max - min <= 1));
                }
            }
        }
    }

    #[test]
    fn no_members_no_owner() {
        assert_eq!(AssignmentStrategy::Range.owner_of(0, 3, 0), None);
    }
}
