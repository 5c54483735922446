//! Which partition a record goes to.
//!
//! A keyed record goes to `murmur2(key) % partitions`, the hash Kafka's
//! default partitioner uses, so a key lands on the same partition number in
//! the memory broker as on a Kafka topic with as many partitions: tests that
//! reason about key placement hold on both. A record without a key goes to
//! the topic's partitions in turn.

/// Kafka's `murmur2` (`org.apache.kafka.common.utils.Utils.murmur2`), on
/// 32-bit wrapping arithmetic as Java's `int`.
pub(crate) fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;

    // Java's `seed ^ length` on an int: the length wraps at 32 bits.
    let mut h: u32 = SEED ^ (data.len() as u32);
    let mut chunks = data.chunks_exact(4);
    for chunk in &mut chunks {
        let mut k = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let tail = chunks.remainder();
    if !tail.is_empty() {
        if tail.len() >= 3 {
            h ^= u32::from(tail[2]) << 16;
        }
        if tail.len() >= 2 {
            h ^= u32::from(tail[1]) << 8;
        }
        h ^= u32::from(tail[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// The partition of a record with `key` on a topic of `partitions`
/// partitions (`partitions` > 0).
pub(crate) fn partition_for_key(key: &[u8], partitions: u32) -> u32 {
    // Kafka's `toPositive`: clear the sign bit rather than take `abs`, which
    // would overflow on `i32::MIN`.
    (murmur2(key) & 0x7fff_ffff) as u32 % partitions
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn murmur2_matches_kafkas_reference_values() {
        // From Kafka's `UtilsTest.testMurmur2`.
        let cases: [(&[u8], i32); 6] = [
            (b"21", -973_932_308),
            (b"foobar", -790_332_482),
            (b"a-little-bit-long-string", -985_981_536),
            (b"a-little-bit-longer-string", -1_486_304_829),
            (
                b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
                -58_897_971,
            ),
            (b"abc", 479_470_107),
        ];
        for (key, expected) in cases {
            assert_eq!(
                murmur2(key),
                expected,
                "murmur2({:?})",
                key.escape_ascii().to_string()
            );
        }
    }

    #[test]
    fn a_key_always_lands_on_the_same_partition_within_range() {
        for partitions in 1..=16 {
            for key in [&b""[..], b"a", b"order-17", b"\xff\xff\xff\xff\xff"] {
                let first = partition_for_key(key, partitions);
                assert!(first < partitions);
                assert_eq!(partition_for_key(key, partitions), first);
            }
        }
    }
}
