//! [`OutputStore`]: the outputs of completed inputs, by partition and offset,
//! until a transaction commits them with their inputs' offsets.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use intake_core::PartitionKey;
use intake_core::publish::Output;

use super::limits::{self, Described, Describer, ProducerLimits, TopicLimits};

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
///
/// It also keeps what each destination accepts, and [`put`](Self::put)
/// checks outputs against it under the same lock (see [`limits`]).
#[derive(Debug)]
pub(crate) struct OutputStore {
    state: Mutex<State>,
    producer: ProducerLimits,
    describer: Describer,
}

#[derive(Debug, Default)]
struct State {
    partitions: HashMap<PartitionKey, BTreeMap<i64, Vec<Output>>>,
    /// Absent: epoch 0. One number per partition ever owned.
    epochs: HashMap<PartitionKey, u64>,
    /// What each destination accepts, as last read.
    topics: HashMap<Arc<str>, Known>,
    /// The destination last checked, by pointer, what it accepts and the
    /// [budget](limits::budget) of an output that surely fits it: a
    /// handler usually names one destination, made once and shared, so
    /// most checks need no lookup by name.
    last: Option<(Arc<str>, Option<TopicLimits>, usize)>,
}

/// What a destination accepts, as last read, and until when to believe it.
#[derive(Debug)]
struct Known {
    /// `None`: not read (the producer's limit alone applies).
    limits: Option<TopicLimits>,
    /// When to read it again.
    until: Instant,
    /// A read of it is under way.
    reading: bool,
}

/// What [`OutputStore::put`] did with an input's outputs.
#[derive(Debug)]
pub(crate) enum Put {
    /// Kept (or, for no outputs, any kept before dropped).
    Kept,
    /// Not kept: the partition was given up since the handler started.
    Stale,
    /// Not kept: the broker would refuse the output at `index`, to
    /// `destination`.
    Refused {
        index: usize,
        destination: Arc<str>,
        reason: String,
    },
    /// Not kept yet: what this destination accepts must be read first;
    /// the outputs are given back.
    Unread(Arc<str>, Vec<Output>),
    /// Not kept yet: an output names a partition past the count read for
    /// this destination, which must be read again (fresh) before the output
    /// is refused; the outputs are given back, to be put with
    /// [`put_recounted`](OutputStore::put_recounted).
    Recount(Arc<str>, Vec<Output>),
}

impl OutputStore {
    /// A store for outputs of a producer with these limits, reading what
    /// destinations accept with `describer`.
    pub(crate) fn new(producer: ProducerLimits, describer: Describer) -> Self {
        Self {
            state: Mutex::default(),
            producer,
            describer,
        }
    }

    /// What reads what destinations accept.
    pub(crate) fn describer(&self) -> &Describer {
        &self.describer
    }

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
    /// still `epoch` and each output's destination takes it (as far as
    /// this store knows what it takes: a destination not read yet gives
    /// the outputs back, to be [learned](Self::learn) first, and so does one
    /// whose partition count an output's partition is past, to be
    /// [recounted](Put::Recount)).
    pub(crate) fn put(
        &self,
        partition: &PartitionKey,
        epoch: u64,
        offset: i64,
        outputs: Vec<Output>,
    ) -> Put {
        self.keep(partition, epoch, offset, outputs, false)
    }

    /// [`put`](Self::put) after a [recount](Put::Recount): an output naming a
    /// partition past the count now read is refused.
    pub(crate) fn put_recounted(
        &self,
        partition: &PartitionKey,
        epoch: u64,
        offset: i64,
        outputs: Vec<Output>,
    ) -> Put {
        self.keep(partition, epoch, offset, outputs, true)
    }

    fn keep(
        &self,
        partition: &PartitionKey,
        epoch: u64,
        offset: i64,
        outputs: Vec<Output>,
        recounted: bool,
    ) -> Put {
        let mut state = self.lock();
        if state.epochs.get(partition).copied().unwrap_or(0) != epoch {
            return Put::Stale;
        }
        if outputs.is_empty() {
            if let Some(stored) = state.partitions.get_mut(partition) {
                stored.remove(&offset);
            }
            return Put::Kept;
        }
        for (index, output) in outputs.iter().enumerate() {
            let destination = output.destination_shared();
            let (accepts, budget) = match &state.last {
                Some((last, accepts, budget)) if Arc::ptr_eq(last, destination) => {
                    (*accepts, *budget)
                }
                _ => {
                    let Some(known) = state.topics.get(&**destination) else {
                        let topic = Arc::clone(destination);
                        return Put::Unread(topic, outputs);
                    };
                    let accepts = known.limits;
                    let budget = limits::budget(self.producer, accepts);
                    state.last = Some((Arc::clone(destination), accepts, budget));
                    (accepts, budget)
                }
            };
            let keyless_to_compacted =
                output.key().is_none() && accepts.is_some_and(|accepts| accepts.compacted);
            let partition_lacking =
                accepts.is_some_and(|accepts| accepts.lacks_partition_of(output));
            if limits::fits(output, budget) && !keyless_to_compacted && !partition_lacking {
                continue;
            }
            if partition_lacking && !recounted {
                // Kafka only adds partitions: the count read may be older
                // than the partition the output names.
                let topic = Arc::clone(destination);
                return Put::Recount(topic, outputs);
            }
            if let Some(reason) = limits::refusal(output, self.producer, accepts) {
                return Put::Refused {
                    index,
                    destination: Arc::clone(destination),
                    reason,
                };
            }
        }
        state
            .partitions
            .entry(partition.clone())
            .or_default()
            .insert(offset, outputs);
        Put::Kept
    }

    /// The destinations due to be read again (each marked as being read,
    /// so it is due once): what the acker reads in the background at each
    /// commit, so that no input pays for the clock. Usually none (no
    /// allocation then).
    pub(crate) fn due(&self) -> Vec<Arc<str>> {
        let mut state = self.lock();
        if state.topics.is_empty() {
            return Vec::new();
        }
        let now = Instant::now();
        state
            .topics
            .iter_mut()
            .filter(|(_, known)| !known.reading && now >= known.until)
            .map(|(topic, known)| {
                known.reading = true;
                Arc::clone(topic)
            })
            .collect()
    }

    /// Learns what `topic` accepts, as read now.
    pub(crate) fn learn(&self, topic: &Arc<str>, described: &Described) {
        let now = Instant::now();
        let (limits, until) = match described {
            Described::Known(limits) => (Some(*limits), now + limits::REFRESH),
            Described::Unknown(_) => (None, now + limits::RETRY_UNKNOWN),
        };
        let mut state = self.lock();
        let known = state.topics.entry(Arc::clone(topic)).or_insert(Known {
            limits,
            until,
            reading: false,
        });
        // A destination that could not be read again keeps what was read
        // before, if anything.
        known.limits = limits.or(known.limits);
        known.until = until;
        known.reading = false;
        state.last = None;
    }

    /// Has every destination read again at its next output: the broker
    /// refused a transaction for a record's sake, so what some destination
    /// accepts may have changed.
    pub(crate) fn reread_all(&self) {
        let now = Instant::now();
        for known in self.lock().topics.values_mut() {
            known.until = known.until.min(now);
        }
    }

    /// Destinations that refuse batches smaller than the producer builds,
    /// with their limit: a transaction sends no more to one of them
    /// between two flushes than a batch it accepts. Usually none (no
    /// allocation then).
    pub(crate) fn small_destinations(&self) -> Vec<(Arc<str>, usize)> {
        let producer = self.producer.max_batch;
        self.lock()
            .topics
            .iter()
            .filter_map(|(topic, known)| {
                let limit = known.limits?.max_batch;
                (limit < producer).then(|| (Arc::clone(topic), limit))
            })
            .collect()
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

/// Reads what `topics` accept again, in the background.
pub(crate) fn reread(store: &Arc<OutputStore>, topics: Vec<Arc<str>>) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        // No runtime to read in: what was read stays until the next try.
        for topic in &topics {
            store.learn(topic, &Described::Unknown("no runtime to read in".into()));
        }
        return;
    };
    let store = Arc::clone(store);
    drop(runtime.spawn(async move {
        for topic in topics {
            let described = store.describer().describe(&topic, true).await;
            store.learn(&topic, &described);
        }
    }));
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn output(payload: &str) -> Output {
        Output::new("out", payload.to_owned())
    }

    /// A store whose destination `out` has been read: 1,000 bytes at most.
    fn store() -> OutputStore {
        let settings = crate::KafkaSettings::new("127.0.0.1:9");
        let store = OutputStore::new(
            ProducerLimits::of(&settings),
            Describer::new(settings, Duration::from_secs(1)),
        );
        store.learn(
            &Arc::from("out"),
            &Described::Known(TopicLimits {
                max_batch: 1_000,
                compacted: false,
                partitions: Some(4),
            }),
        );
        store
    }

    fn kept(put: Put) -> bool {
        matches!(put, Put::Kept)
    }

    fn payloads(outputs: &[Output]) -> Vec<String> {
        outputs
            .iter()
            .map(|output| String::from_utf8_lossy(output.payload()).into_owned())
            .collect()
    }

    #[test]
    fn outputs_come_out_in_offset_order_and_only_below_the_commit() {
        let store = store();
        let partition = PartitionKey::new("in", 0);
        store.put(&partition, 0, 7, vec![output("7a"), output("7b")]);
        store.put(&partition, 0, 3, vec![output("3")]);
        store.put(&partition, 0, 9, vec![output("9")]);
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
        let store = store();
        let partition = PartitionKey::new("in", 1);
        store.put(&partition, 0, 4, vec![output("first"), output("extra")]);
        store.put(&partition, 0, 4, vec![output("second")]);
        let mut taken = Vec::new();
        store.before(&partition, 5, &mut taken);
        assert_eq!(payloads(&taken), ["second"]);
        store.put(&partition, 0, 4, Vec::new());
        assert_eq!(store.len(), 0);
    }

    #[test]
    fn a_partition_given_up_leaves_nothing_behind() {
        let store = store();
        let kept = PartitionKey::new("in", 0);
        let lost = PartitionKey::new("in", 1);
        store.put(&kept, 0, 1, vec![output("kept")]);
        store.put(&lost, 0, 1, vec![output("lost")]);
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
        let store = store();
        let partition = PartitionKey::new("in", 0);
        let started_in = store.epoch(&partition);
        store.forget(std::slice::from_ref(&partition)); // lost
        assert!(matches!(
            store.put(&partition, started_in, 5, vec![output("late")]),
            Put::Stale
        ));
        store.forget(std::slice::from_ref(&partition)); // assigned again
        let mut taken = Vec::new();
        store.before(&partition, i64::MAX, &mut taken);
        assert!(taken.is_empty(), "{:?}", payloads(&taken));

        let now = store.epoch(&partition);
        assert!(kept(store.put(&partition, now, 9, vec![output("current")])));
        store.before(&partition, i64::MAX, &mut taken);
        assert_eq!(payloads(&taken), ["current"]);
    }

    #[test]
    fn an_output_its_destination_refuses_is_not_kept_nor_are_the_others_of_its_input() {
        let store = store();
        let partition = PartitionKey::new("in", 0);
        let refused = store.put(
            &partition,
            0,
            3,
            vec![output("small"), output(&"x".repeat(2_000))],
        );
        assert!(
            matches!(&refused, Put::Refused { index: 1, reason, .. } if reason.contains("max.message.bytes")),
            "{refused:?}"
        );
        assert_eq!(store.len(), 0);
    }

    #[test]
    fn an_output_past_the_partitions_read_is_recounted_then_refused() {
        let store = store();
        let partition = PartitionKey::new("in", 0);
        assert!(kept(store.put(
            &partition,
            0,
            1,
            vec![output("placed").with_partition(3)]
        )));
        let Put::Recount(topic, outputs) = store.put(
            &partition,
            0,
            2,
            vec![output("placed"), output("past").with_partition(4)],
        ) else {
            panic!("refused or kept without reading the count again");
        };
        assert_eq!(&*topic, "out");
        assert_eq!(store.len(), 1, "nothing of the second input kept");
        let refused = store.put_recounted(&partition, 0, 2, outputs);
        assert!(
            matches!(&refused, Put::Refused { index: 1, reason, .. } if reason.contains("partition 4")),
            "{refused:?}"
        );
        assert_eq!(store.len(), 1);
    }

    #[test]
    fn outputs_to_a_destination_not_read_yet_are_given_back_until_it_is() {
        let store = store();
        let partition = PartitionKey::new("in", 0);
        let Put::Unread(topic, outputs) =
            store.put(&partition, 0, 1, vec![Output::new("elsewhere", "x")])
        else {
            panic!("kept without knowing the destination");
        };
        assert_eq!(&*topic, "elsewhere");
        assert_eq!(store.len(), 0);
        store.learn(&topic, &Described::Unknown("no such topic".into()));
        assert!(kept(store.put(&partition, 0, 1, outputs)));
        assert!(
            store
                .small_destinations()
                .iter()
                .all(|(topic, _)| &**topic == "out")
        );
    }

    #[test]
    fn destinations_with_a_limit_below_the_producers_batch_are_listed() {
        let store = store();
        assert_eq!(store.small_destinations(), [(Arc::from("out"), 1_000)]);
        store.learn(
            &Arc::from("big"),
            &Described::Known(TopicLimits {
                max_batch: 2_000_000,
                compacted: false,
                partitions: None,
            }),
        );
        assert_eq!(store.small_destinations().len(), 1);
    }

    #[test]
    fn a_destination_due_is_read_again_once() {
        let store = store();
        assert!(store.due().is_empty(), "read a moment ago");
        store.reread_all();
        assert_eq!(store.due(), [Arc::from("out")]);
        assert!(store.due().is_empty(), "being read");
        store.learn(&Arc::from("out"), &Described::Unknown("gone".into()));
        let partition = PartitionKey::new("in", 0);
        assert!(
            matches!(
                store.put(&partition, 0, 1, vec![output(&"x".repeat(2_000))]),
                Put::Refused { .. }
            ),
            "a read that failed keeps what was read before"
        );
    }
}
