//! Inspection: lag of a group that never consumed.

use super::support::*;
use crate::memory::*;

#[test]
fn a_group_that_never_consumed_owes_everything() {
    let broker = broker_with_topic(2);
    produce_to(&broker, 0, 2);
    let group = broker.group(TOPIC, "nobody").expect("group");
    assert!(group.members.is_empty());
    assert_eq!(group.committed(), [None, None]);
    assert_eq!(group.lag(), 2);
    assert_eq!(group.partitions[0].owner, PartitionOwner::Unassigned);
}
