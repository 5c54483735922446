//! The blocking reads: the partitions' watermarks, the side topic's marks,
//! and the letters of a range, on the assign-only consumer.

use super::*;

impl Inner {
    /// The partitions of `topic` with their watermarks; none when the topic
    /// does not exist.
    pub(super) fn partitions(
        &self,
        reader: &Reader,
        topic: &str,
    ) -> Result<Vec<Partition>, Failure> {
        let step = || format!("read the metadata of `{topic}`");
        let metadata = reader
            .consumer
            .fetch_metadata(Some(topic), self.timeout)
            .map_err(|source| Failure::Client {
                step: step(),
                source,
            })?;
        let Some(found) = metadata.topics().iter().find(|found| found.name() == topic) else {
            return Ok(Vec::new());
        };
        if let Some(error) = found.error() {
            let code = RDKafkaErrorCode::from(error);
            return match code {
                RDKafkaErrorCode::UnknownTopicOrPartition | RDKafkaErrorCode::UnknownTopic => {
                    Ok(Vec::new())
                }
                code => Err(Failure::Client {
                    step: step(),
                    source: KafkaError::MetadataFetch(code),
                }),
            };
        }
        let mut partitions = Vec::with_capacity(found.partitions().len());
        for partition in found.partitions() {
            let (low, high) = reader
                .consumer
                .fetch_watermarks(topic, partition.id(), self.timeout)
                .map_err(|source| Failure::Client {
                    step: format!(
                        "read the watermarks of `{topic}` partition {}",
                        partition.id()
                    ),
                    source,
                })?;
            partitions.push(Partition {
                id: partition.id(),
                low,
                high,
            });
        }
        partitions.sort_by_key(|p| p.id);
        Ok(partitions)
    }

    /// Reads what the side topic gained since the last read.
    pub(super) fn refresh_marks(&self, reader: &mut Reader) -> Result<(), Failure> {
        let topic = self.removed_topic.as_str();
        let Some(side) = self.partitions(reader, topic)?.into_iter().next() else {
            // No side topic: nothing was ever removed (or it was deleted,
            // and with it every mark).
            reader.marks.clear();
            reader.marks_next = 0;
            return Ok(());
        };
        if side.high < reader.marks_next {
            // The side topic was deleted and made again: read it anew.
            reader.marks.clear();
            reader.marks_next = 0;
        }
        let from = reader.marks_next.max(side.low);
        let mut records = Vec::new();
        read_range(
            &reader.consumer,
            topic,
            side.id,
            from,
            side.high,
            self.timeout,
            usize::MAX,
            |message| {
                let key = message.key().and_then(|key| std::str::from_utf8(key).ok());
                match key.and_then(Id::parse) {
                    Some(id) => records.push((id, message.payload().is_some())),
                    None => tracing::debug!(
                        topic,
                        offset = message.offset(),
                        "a record of the side topic that is no mark, ignored"
                    ),
                }
                true
            },
        )?;
        for (id, marked) in records {
            if marked {
                reader.marks.insert(id);
            } else {
                reader.marks.remove(&id);
            }
        }
        reader.marks_next = side.high;
        Ok(())
    }

    pub(super) fn snapshot(&self, reader: &mut Reader) -> Result<Snapshot, Failure> {
        self.refresh_marks(reader)?;
        let partitions = self.partitions(reader, &self.topic)?;
        let mut snapshot = Snapshot {
            partitions,
            ..Snapshot::default()
        };
        for id in &reader.marks {
            match snapshot.partition(id.partition) {
                Some(p) if id.offset >= p.low => {
                    // A mark at or past the high watermark is kept: the
                    // letter it names cannot have been written yet, so it
                    // was marked by a store that saw a longer topic (one
                    // deleted since); it is stale only once below `low`.
                    if id.offset < p.high {
                        snapshot.removed.insert(*id);
                    }
                }
                _ => snapshot.stale.push(*id),
            }
        }
        Ok(snapshot)
    }

    /// Up to `max` letters of the topic in (partition, offset) order from
    /// `start` up to `through` included, the removed ones skipped.
    pub(super) fn scan(
        &self,
        reader: &mut Reader,
        start: Option<Id>,
        through: Option<Id>,
        max: usize,
    ) -> Result<Vec<StoredLetter>, Failure> {
        let snapshot = self.snapshot(reader)?;
        let mut letters = Vec::new();
        for partition in &snapshot.partitions {
            if letters.len() >= max {
                break;
            }
            if start.is_some_and(|start| partition.id < start.partition)
                || through.is_some_and(|through| partition.id > through.partition)
            {
                continue;
            }
            let from = match start {
                Some(start) if start.partition == partition.id => start.offset.max(partition.low),
                _ => partition.low,
            };
            let end = match through {
                Some(through) if through.partition == partition.id => {
                    partition.high.min(through.offset.saturating_add(1))
                }
                _ => partition.high,
            };
            if from >= end {
                continue;
            }
            let wanted = max - letters.len();
            read_range(
                &reader.consumer,
                &self.topic,
                partition.id,
                from,
                end,
                self.timeout,
                wanted,
                |message| {
                    let id = Id {
                        partition: partition.id,
                        offset: message.offset(),
                    };
                    if snapshot.removed.contains(&id) {
                        return false;
                    }
                    letters.push(stored(id, message));
                    true
                },
            )?;
        }
        Ok(letters)
    }
}

/// Reads `partition` of `topic` from offset `from` to `end` (excluded),
/// handing each record to `take`, which says whether it counted; stops
/// after `max` counted. Each wait for the next record is bounded by
/// `timeout`; the end is known by the record before it or by librdkafka's
/// end-of-partition event (a compacted topic has gaps).
#[allow(clippy::too_many_arguments)]
pub(super) fn read_range(
    consumer: &BaseConsumer,
    topic: &str,
    partition: i32,
    from: i64,
    end: i64,
    timeout: Duration,
    max: usize,
    mut take: impl FnMut(&BorrowedMessage<'_>) -> bool,
) -> Result<(), Failure> {
    if from >= end || max == 0 {
        return Ok(());
    }
    let step = || format!("read `{topic}` partition {partition} from offset {from}");
    let mut assignment = TopicPartitionList::new();
    assignment
        .add_partition_offset(topic, partition, Offset::Offset(from))
        .and_then(|()| consumer.assign(&assignment))
        .map_err(|source| Failure::Client {
            step: step(),
            source,
        })?;
    let mut next = from;
    let mut counted = 0;
    let mut last_progress = Instant::now();
    while next < end && counted < max {
        let left = timeout.saturating_sub(last_progress.elapsed());
        if left.is_zero() {
            return Err(Failure::TimedOut {
                step: step(),
                waited: timeout,
            });
        }
        match consumer.poll(left) {
            None => {}
            Some(Err(KafkaError::PartitionEOF(eof))) if eof == partition => break,
            Some(Err(KafkaError::PartitionEOF(_))) => {}
            Some(Err(source)) => {
                return Err(Failure::Client {
                    step: step(),
                    source,
                });
            }
            Some(Ok(message)) => {
                // A record of an earlier assignment (librdkafka drops
                // those, this makes sure), or one before the start.
                if message.partition() != partition
                    || message.offset() < next
                    || message.topic() != topic
                {
                    continue;
                }
                if message.offset() >= end {
                    break;
                }
                next = message.offset() + 1;
                last_progress = Instant::now();
                if take(&message) {
                    counted += 1;
                }
            }
        }
    }
    // Nothing fetched in the background between reads: a fetch in flight
    // holds the connection the next step's requests go over.
    consumer.unassign().map_err(|source| Failure::Client {
        step: step(),
        source,
    })?;
    Ok(())
}

/// A record of the dead-letter topic as a stored letter: the record key is
/// the key slot.
pub(super) fn stored(id: Id, message: &BorrowedMessage<'_>) -> StoredLetter {
    StoredLetter::read(
        id.letter_id(),
        message.key().map(Bytes::copy_from_slice),
        message
            .payload()
            .map(Bytes::copy_from_slice)
            .unwrap_or_default(),
        &crate::record_headers::read_headers(message),
    )
}
