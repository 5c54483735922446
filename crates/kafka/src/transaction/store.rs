//! [`OutputStore`]: the outputs of completed inputs, by partition and offset,
//! until a transaction commits them with their inputs' offsets.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, MutexGuard};

use intake_core::PartitionKey;
use intake_core::publish::Output;

/// Outputs waiting for the transaction that commits their input.
///
/// Keyed by the input's offset, so that an input handled again (a retry, or
/// a redelivery after its partition came back) replaces what it left rather
/// than adding to it: an input's outputs go into a transaction once, however
/// often it ran.
#[derive(Debug, Default)]
pub(crate) struct OutputStore {
    partitions: Mutex<HashMap<PartitionKey, BTreeMap<i64, Vec<Output>>>>,
}

impl OutputStore {
    fn lock(&self) -> MutexGuard<'_, HashMap<PartitionKey, BTreeMap<i64, Vec<Output>>>> {
        self.partitions
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }

    /// Keeps `outputs` as those of the input at `offset` of `partition`,
    /// replacing any it left before.
    pub(crate) fn put(&self, partition: PartitionKey, offset: i64, outputs: Vec<Output>) {
        let mut partitions = self.lock();
        if outputs.is_empty() {
            if let Some(stored) = partitions.get_mut(&partition) {
                stored.remove(&offset);
            }
            return;
        }
        partitions
            .entry(partition)
            .or_default()
            .insert(offset, outputs);
    }

    /// Forgets what the input at `offset` of `partition` left (it failed).
    pub(crate) fn remove(&self, partition: &PartitionKey, offset: i64) {
        if let Some(stored) = self.lock().get_mut(partition) {
            stored.remove(&offset);
        }
    }

    /// Copies of the outputs of the inputs of `partition` before `next` (the
    /// offset a commit names), in offset order and, per input, in the order
    /// the handler returned them. Copies are cheap (payloads are shared) and
    /// leave the store as it is until the transaction is known to have
    /// committed.
    pub(crate) fn before(&self, partition: &PartitionKey, next: i64, into: &mut Vec<Output>) {
        if let Some(stored) = self.lock().get(partition) {
            for outputs in stored.range(..next).map(|(_, outputs)| outputs) {
                into.extend(outputs.iter().cloned());
            }
        }
    }

    /// Drops the outputs of the inputs of `partition` before `next`: their
    /// transaction committed.
    pub(crate) fn committed(&self, partition: &PartitionKey, next: i64) {
        let mut partitions = self.lock();
        if let Some(stored) = partitions.get_mut(partition) {
            *stored = stored.split_off(&next);
            if stored.is_empty() {
                partitions.remove(partition);
            }
        }
    }

    /// Drops every output of `partitions`: this consumer gave them up, and
    /// their next owner handles their uncommitted inputs again.
    pub(crate) fn forget(&self, partitions: &[PartitionKey]) {
        let mut stored = self.lock();
        for partition in partitions {
            stored.remove(partition);
        }
    }

    /// Outputs held, across partitions.
    pub(crate) fn len(&self) -> usize {
        self.lock()
            .values()
            .flat_map(BTreeMap::values)
            .map(Vec::len)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn output(payload: &str) -> Output {
        Output::new("out", payload.to_owned())
    }

    fn payloads(outputs: &[Output]) -> Vec<String> {
        outputs
            .iter()
            .map(|output| String::from_utf8_lossy(output.payload()).into_owned())
            .collect()
    }

    #[test]
    fn outputs_come_out_in_offset_order_and_only_below_the_commit() {
        let store = OutputStore::default();
        let partition = PartitionKey::new("in", 0);
        store.put(partition.clone(), 7, vec![output("7a"), output("7b")]);
        store.put(partition.clone(), 3, vec![output("3")]);
        store.put(partition.clone(), 9, vec![output("9")]);
        let mut taken = Vec::new();
        store.before(&partition, 8, &mut taken);
        assert_eq!(payloads(&taken), ["3", "7a", "7b"]);
        assert_eq!(store.len(), 4, "nothing leaves before the commit");
        store.committed(&partition, 8);
        let mut left = Vec::new();
        store.before(&partition, i64::MAX, &mut left);
        assert_eq!(payloads(&left), ["9"]);
    }

    #[test]
    fn an_input_handled_again_replaces_its_outputs() {
        let store = OutputStore::default();
        let partition = PartitionKey::new("in", 1);
        store.put(partition.clone(), 4, vec![output("first"), output("extra")]);
        store.put(partition.clone(), 4, vec![output("second")]);
        let mut taken = Vec::new();
        store.before(&partition, 5, &mut taken);
        assert_eq!(payloads(&taken), ["second"]);
        store.put(partition.clone(), 4, Vec::new());
        assert_eq!(store.len(), 0);
    }

    #[test]
    fn a_partition_given_up_leaves_nothing_behind() {
        let store = OutputStore::default();
        let kept = PartitionKey::new("in", 0);
        let lost = PartitionKey::new("in", 1);
        store.put(kept.clone(), 1, vec![output("kept")]);
        store.put(lost.clone(), 1, vec![output("lost")]);
        store.remove(&kept, 2);
        store.forget(std::slice::from_ref(&lost));
        let mut taken = Vec::new();
        store.before(&lost, i64::MAX, &mut taken);
        assert!(taken.is_empty());
        store.before(&kept, i64::MAX, &mut taken);
        assert_eq!(payloads(&taken), ["kept"]);
    }
}
