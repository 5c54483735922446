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
///
/// Each partition has an ownership epoch, moved on whenever this consumer
/// gains or gives up the partition: a handler keeps its outputs only if the
/// epoch it started in is still current. Otherwise a handler of a lost
/// partition that finished late would leave outputs behind, and if the
/// partition came back after another owner committed past them, the next
/// transaction would produce them a second time.
#[derive(Debug, Default)]
pub(crate) struct OutputStore {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    partitions: HashMap<PartitionKey, BTreeMap<i64, Vec<Output>>>,
    /// Absent: epoch 0. One number per partition ever owned.
    epochs: HashMap<PartitionKey, u64>,
}

impl OutputStore {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }

    /// The current ownership epoch of `partition`, for a handler starting
    /// now to [`put`](Self::put) its outputs with.
    pub(crate) fn epoch(&self, partition: &PartitionKey) -> u64 {
        self.lock().epochs.get(partition).copied().unwrap_or(0)
    }

    /// Keeps `outputs` as those of the input at `offset` of `partition`,
    /// replacing any it left before, if the partition's ownership epoch is
    /// still `epoch`; returns whether it kept them.
    pub(crate) fn put(
        &self,
        partition: PartitionKey,
        epoch: u64,
        offset: i64,
        outputs: Vec<Output>,
    ) -> bool {
        let mut state = self.lock();
        if state.epochs.get(&partition).copied().unwrap_or(0) != epoch {
            return false;
        }
        let partitions = &mut state.partitions;
        if outputs.is_empty() {
            if let Some(stored) = partitions.get_mut(&partition) {
                stored.remove(&offset);
            }
            return true;
        }
        partitions
            .entry(partition)
            .or_default()
            .insert(offset, outputs);
        true
    }

    /// Forgets what the input at `offset` of `partition` left (it failed).
    pub(crate) fn remove(&self, partition: &PartitionKey, offset: i64) {
        if let Some(stored) = self.lock().partitions.get_mut(partition) {
            stored.remove(&offset);
        }
    }

    /// Copies of the outputs of the inputs of `partition` before `next` (the
    /// offset a commit names), in offset order and, per input, in the order
    /// the handler returned them. Copies are cheap (payloads are shared) and
    /// leave the store as it is until the transaction is known to have
    /// committed.
    pub(crate) fn before(&self, partition: &PartitionKey, next: i64, into: &mut Vec<Output>) {
        if let Some(stored) = self.lock().partitions.get(partition) {
            for outputs in stored.range(..next).map(|(_, outputs)| outputs) {
                into.extend(outputs.iter().cloned());
            }
        }
    }

    /// Drops the outputs of the inputs of `partition` before `next`: their
    /// transaction committed.
    pub(crate) fn committed(&self, partition: &PartitionKey, next: i64) {
        let partitions = &mut self.lock().partitions;
        if let Some(stored) = partitions.get_mut(partition) {
            *stored = stored.split_off(&next);
            if stored.is_empty() {
                partitions.remove(partition);
            }
        }
    }

    /// Drops every output of `partitions` and moves their ownership epoch
    /// on: this consumer gave them up (their next owner handles their
    /// uncommitted inputs again) or just got them (nothing kept before
    /// counts: the inputs are delivered again from the committed offset).
    pub(crate) fn forget(&self, partitions: &[PartitionKey]) {
        let mut state = self.lock();
        for partition in partitions {
            state.partitions.remove(partition);
            let epoch = state.epochs.entry(partition.clone()).or_default();
            *epoch = epoch.wrapping_add(1);
        }
    }

    /// Outputs held, across partitions.
    pub(crate) fn len(&self) -> usize {
        self.lock()
            .partitions
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
        store.put(partition.clone(), 0, 7, vec![output("7a"), output("7b")]);
        store.put(partition.clone(), 0, 3, vec![output("3")]);
        store.put(partition.clone(), 0, 9, vec![output("9")]);
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
        store.put(
            partition.clone(),
            0,
            4,
            vec![output("first"), output("extra")],
        );
        store.put(partition.clone(), 0, 4, vec![output("second")]);
        let mut taken = Vec::new();
        store.before(&partition, 5, &mut taken);
        assert_eq!(payloads(&taken), ["second"]);
        store.put(partition.clone(), 0, 4, Vec::new());
        assert_eq!(store.len(), 0);
    }

    #[test]
    fn a_partition_given_up_leaves_nothing_behind() {
        let store = OutputStore::default();
        let kept = PartitionKey::new("in", 0);
        let lost = PartitionKey::new("in", 1);
        store.put(kept.clone(), 0, 1, vec![output("kept")]);
        store.put(lost.clone(), 0, 1, vec![output("lost")]);
        store.remove(&kept, 2);
        store.forget(std::slice::from_ref(&lost));
        let mut taken = Vec::new();
        store.before(&lost, i64::MAX, &mut taken);
        assert!(taken.is_empty());
        store.before(&kept, i64::MAX, &mut taken);
        assert_eq!(payloads(&taken), ["kept"]);
    }

    /// A handler of a partition that was lost finishes after the loss; the
    /// partition comes back later, after another owner committed past that
    /// input: what the late handler returned must not go into a
    /// transaction again.
    #[test]
    fn a_late_handler_of_a_lost_partition_keeps_nothing() {
        let store = OutputStore::default();
        let partition = PartitionKey::new("in", 0);
        let started_in = store.epoch(&partition);
        store.forget(std::slice::from_ref(&partition)); // lost
        assert!(!store.put(partition.clone(), started_in, 5, vec![output("late")]));
        store.forget(std::slice::from_ref(&partition)); // assigned again
        let mut taken = Vec::new();
        store.before(&partition, i64::MAX, &mut taken);
        assert!(taken.is_empty(), "{:?}", payloads(&taken));

        let now = store.epoch(&partition);
        assert!(store.put(partition.clone(), now, 9, vec![output("current")]));
        store.before(&partition, i64::MAX, &mut taken);
        assert_eq!(payloads(&taken), ["current"]);
    }
}
