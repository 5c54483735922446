//! The fast path of [`Json<T>`](super::Json): a JSON reader for serde's
//! `Deserialize` that answers only where it gives what serde_json gives, and
//! otherwise leaves the payload to serde_json.
//!
//! serde_json spends about 850 instructions on the 28-byte
//! `{"id":1000000,"quantity":37}` (`benches/callgrind.sh pipeline_json`
//! less `pipeline_bytes`): UTF-8 validation of each key through
//! `str::from_utf8`, a search for escapes built for long strings, an
//! overflow check per digit. This reader takes about 515 for the same
//! document (one table look-up per string byte, UTF-8 checked only when a
//! byte is not ASCII, digits read without overflow checks up to the 19 that
//! cannot overflow), for the shapes messages mostly have, and gives up on
//! the rest.
//!
//! The rule that keeps it exact: [`from_slice`] returns `Some` only for input
//! serde_json accepts, with the same calls on the visitor (so the same value),
//! and `None` for everything else, after which the caller decodes with
//! serde_json, whose value or error is the answer. Giving up is always safe,
//! so the reader gives up on whatever it does not copy exactly:
//! - any error, its own or one the `Deserialize` impl raises (so every error
//!   the user sees is serde_json's, position and wording included);
//! - strings with an escape, a control character or invalid UTF-8 (serde_json
//!   copies or rejects them);
//! - integers past 19 digits (18 if negative), which serde_json may still
//!   read as integers;
//! - nesting past [`DEPTH_LIMIT`], below serde_json's own limit of 128;
//! - bytes, `i128`/`u128`, map keys read as numbers, booleans or options,
//!   and serde_json's `RawValue`;
//! - every input, when serde_json was built with `arbitrary_precision` (by
//!   any crate of the application): it then reads numbers differently.
//!
//! A payload it gives up on is read twice, as far as this reader got and
//! then whole by serde_json: the failure path (a payload that does not
//! decode) and the rarer shapes pay that, the common ones do not.
//!
//! Floats are read by serde_json itself (`from_slice::<f64>` on the number's
//! text: the same code it runs for a number inside a document), so they
//! round exactly as serde_json rounds them, with or without
//! `float_roundtrip`.

use std::fmt;
use std::sync::OnceLock;

mod access;

use serde::de::{self, DeserializeOwned, Visitor};

use access::{Elements, Entries, UnitVariant, Variant};

/// Nesting (arrays, objects, enum objects) past which the reader gives up.
/// serde_json fails at 128; stopping earlier leaves those inputs to it.
const DEPTH_LIMIT: u32 = 100;

/// The name serde_json's `RawValue` asks a deserializer for: only
/// serde_json's own can answer it.
const RAW_VALUE_TOKEN: &str = "$serde_json::private::RawValue";

/// `T` read from `input` if this reader reads it exactly as serde_json would;
/// `None` means "ask serde_json" (see the module docs).
#[inline]
pub(super) fn from_slice<T: DeserializeOwned>(input: &[u8]) -> Option<T> {
    if !serde_json_reads_numbers_plainly() {
        return None;
    }
    let mut reader = Reader {
        input,
        at: 0,
        depth: 0,
    };
    let value = T::deserialize(&mut reader).ok()?;
    match reader.peek() {
        None => Some(value),
        Some(_) => None,
    }
}

/// Whether serde_json was built without `arbitrary_precision`, which makes it
/// hand numbers to visitors as maps: this reader copies serde_json without
/// it. Asked of serde_json once per process, without allocating (the
/// handler tests count every allocation of a call, the first one included).
#[inline]
fn serde_json_reads_numbers_plainly() -> bool {
    static PLAIN: OnceLock<bool> = OnceLock::new();
    *PLAIN.get_or_init(|| serde_json::from_slice::<NumberProbe>(b"1").is_ok_and(|probe| probe.0))
}

/// Whether serde_json handed a number to its visitor as a number.
struct NumberProbe(bool);

impl<'de> de::Deserialize<'de> for NumberProbe {
    fn deserialize<D: de::Deserializer<'de>>(
        deserializer: D,
    ) -> std::result::Result<Self, D::Error> {
        struct Probe;

        impl<'de> Visitor<'de> for Probe {
            type Value = NumberProbe;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a number")
            }

            fn visit_u64<E>(self, _number: u64) -> std::result::Result<NumberProbe, E> {
                Ok(NumberProbe(true))
            }

            fn visit_map<A: de::MapAccess<'de>>(
                self,
                _map: A,
            ) -> std::result::Result<NumberProbe, A::Error> {
                Ok(NumberProbe(false))
            }
        }

        deserializer.deserialize_any(Probe)
    }
}

/// "Ask serde_json": the reader's only error. It carries nothing, so giving
/// up costs no allocation.
#[derive(Debug)]
pub(super) struct GiveUp;

impl fmt::Display for GiveUp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("left to serde_json")
    }
}

impl std::error::Error for GiveUp {}

impl de::Error for GiveUp {
    #[cold]
    fn custom<T: fmt::Display>(_message: T) -> Self {
        GiveUp
    }
}

type Result<T> = std::result::Result<T, GiveUp>;

/// The bytes that end a string's plain run: its closing quote, an escape,
/// a control character.
static STOPS_A_STRING: [bool; 256] = {
    let mut table = [false; 256];
    let mut byte = 0;
    while byte < 0x20 {
        table[byte] = true;
        byte += 1;
    }
    table[b'"' as usize] = true;
    table[b'\\' as usize] = true;
    table
};

/// A number as serde_json parses it.
enum Number {
    U64(u64),
    I64(i64),
    F64(f64),
}

struct Reader<'de> {
    input: &'de [u8],
    at: usize,
    depth: u32,
}

impl<'de> Reader<'de> {
    /// The next byte that is not JSON whitespace, not consumed.
    #[inline]
    fn peek(&mut self) -> Option<u8> {
        while let Some(&byte) = self.input.get(self.at) {
            match byte {
                b' ' | b'\n' | b'\t' | b'\r' => self.at += 1,
                _ => return Some(byte),
            }
        }
        None
    }

    /// Consumes `word` (the rest of `null`, `true` or `false`).
    #[inline]
    fn word(&mut self, word: &[u8]) -> Result<()> {
        match self.input.get(self.at..self.at + word.len()) {
            Some(found) if found == word => {
                self.at += word.len();
                Ok(())
            }
            _ => Err(GiveUp),
        }
    }

    /// A string whose opening quote was consumed, up to and past its closing
    /// quote; gives up on escapes, control characters and invalid UTF-8.
    #[inline]
    fn string(&mut self) -> Result<&'de str> {
        let rest = self.input.get(self.at..).unwrap_or_default();
        // The bytes or'ed together: ASCII if the top bit stays clear.
        let mut seen = 0u8;
        for (length, &byte) in rest.iter().enumerate() {
            if STOPS_A_STRING[usize::from(byte)] {
                if byte != b'"' {
                    // An escape or a control character.
                    return Err(GiveUp);
                }
                let text = &rest[..length];
                self.at += length + 1;
                return if seen < 0x80 {
                    // SAFETY: no byte of `text` has its top bit set: it is
                    // ASCII, which is UTF-8.
                    Ok(unsafe { std::str::from_utf8_unchecked(text) })
                } else {
                    std::str::from_utf8(text).map_err(|_| GiveUp)
                };
            }
            seen |= byte;
        }
        Err(GiveUp)
    }

    /// A number starting at the current byte (`-` or a digit), as serde_json
    /// parses it (see `Deserializer::parse_integer` there).
    #[inline]
    fn number(&mut self) -> Result<Number> {
        let input = self.input;
        let start = self.at;
        let negative = input.get(self.at) == Some(&b'-');
        if negative {
            self.at += 1;
        }
        let digits_start = self.at;
        let mut value: u64 = 0;
        while let Some(&digit @ b'0'..=b'9') = input.get(self.at) {
            value = value.wrapping_mul(10).wrapping_add(u64::from(digit - b'0'));
            self.at += 1;
        }
        let digits = self.at - digits_start;
        if digits == 0 || (digits > 1 && input[digits_start] == b'0') {
            // No digit, or a leading zero: serde_json refuses both.
            return Err(GiveUp);
        }
        if let Some(b'.' | b'e' | b'E') = input.get(self.at) {
            return self.float(start);
        }
        if !negative {
            // Up to 19 digits fits a u64 without overflow; serde_json reads
            // longer ones as u64 or f64 by value: left to it.
            return if digits <= 19 {
                Ok(Number::U64(value))
            } else {
                Err(GiveUp)
            };
        }
        match digits {
            // serde_json reads `-0` as the float -0.0.
            _ if value == 0 => self.float(start),
            // Below 10^18 < 2^63: the negation cannot overflow.
            ..=18 => Ok(Number::I64(-(value as i64))),
            _ => Err(GiveUp),
        }
    }

    /// A float from `start`, read by serde_json itself from the number's
    /// text (any byte that may continue a number is taken: if serde_json's
    /// number ends earlier, it refuses the rest and the reader gives up).
    #[inline(never)]
    fn float(&mut self, start: usize) -> Result<Number> {
        while let Some(b'0'..=b'9' | b'.' | b'e' | b'E' | b'+' | b'-') = self.input.get(self.at) {
            self.at += 1;
        }
        serde_json::from_slice::<f64>(&self.input[start..self.at])
            .map(Number::F64)
            .map_err(|_| GiveUp)
    }

    #[inline]
    fn enter(&mut self) -> Result<()> {
        self.depth += 1;
        if self.depth >= DEPTH_LIMIT {
            return Err(GiveUp);
        }
        self.at += 1;
        Ok(())
    }

    /// Consumes `close` after a visitor read an array or object: serde_json
    /// refuses anything else there (elements or entries the visitor left).
    #[inline]
    fn leave(&mut self, close: u8) -> Result<()> {
        self.depth -= 1;
        if self.peek() != Some(close) {
            return Err(GiveUp);
        }
        self.at += 1;
        Ok(())
    }

    #[inline]
    fn seq<V: Visitor<'de>>(&mut self, visitor: V) -> Result<V::Value> {
        self.enter()?;
        let value = visitor.visit_seq(Elements {
            reader: self,
            first: true,
        })?;
        self.leave(b']')?;
        Ok(value)
    }

    #[inline]
    fn map<V: Visitor<'de>>(&mut self, visitor: V) -> Result<V::Value> {
        self.enter()?;
        let value = visitor.visit_map(Entries {
            reader: self,
            first: true,
        })?;
        self.leave(b'}')?;
        Ok(value)
    }

    #[inline]
    fn visit_number<V: Visitor<'de>>(&mut self, visitor: V) -> Result<V::Value> {
        match self.peek() {
            Some(b'-' | b'0'..=b'9') => match self.number()? {
                Number::U64(value) => visitor.visit_u64(value),
                Number::I64(value) => visitor.visit_i64(value),
                Number::F64(value) => visitor.visit_f64(value),
            },
            _ => Err(GiveUp),
        }
    }

    /// An `f32` field: integers as any number; a float is left to
    /// serde_json, which with `float_roundtrip` rounds it to `f32` precision
    /// in its own way.
    fn visit_f32<V: Visitor<'de>>(&mut self, visitor: V) -> Result<V::Value> {
        match self.peek() {
            Some(b'-' | b'0'..=b'9') => match self.number()? {
                Number::U64(value) => visitor.visit_u64(value),
                Number::I64(value) => visitor.visit_i64(value),
                Number::F64(_) => Err(GiveUp),
            },
            _ => Err(GiveUp),
        }
    }
}

macro_rules! numbers {
    ($($method:ident)*) => {
        $(
            #[inline]
            fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
                self.visit_number(visitor)
            }
        )*
    };
}

macro_rules! give_up {
    ($($method:ident)*) => {
        $(
            #[cold]
            fn $method<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value> {
                Err(GiveUp)
            }
        )*
    };
}

impl<'de> de::Deserializer<'de> for &mut Reader<'de> {
    type Error = GiveUp;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        match self.peek() {
            Some(b'n') => {
                self.at += 1;
                self.word(b"ull")?;
                visitor.visit_unit()
            }
            Some(b't') => {
                self.at += 1;
                self.word(b"rue")?;
                visitor.visit_bool(true)
            }
            Some(b'f') => {
                self.at += 1;
                self.word(b"alse")?;
                visitor.visit_bool(false)
            }
            Some(b'-' | b'0'..=b'9') => self.visit_number(visitor),
            Some(b'"') => {
                self.at += 1;
                visitor.visit_borrowed_str(self.string()?)
            }
            Some(b'[') => self.seq(visitor),
            Some(b'{') => self.map(visitor),
            _ => Err(GiveUp),
        }
    }

    fn deserialize_bool<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        match self.peek() {
            Some(b't' | b'f') => self.deserialize_any(visitor),
            _ => Err(GiveUp),
        }
    }

    numbers! {
        deserialize_i8 deserialize_i16 deserialize_i32 deserialize_i64
        deserialize_u8 deserialize_u16 deserialize_u32 deserialize_u64
        deserialize_f64
    }

    fn deserialize_f32<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.visit_f32(visitor)
    }

    give_up! { deserialize_i128 deserialize_u128 deserialize_bytes deserialize_byte_buf }

    fn deserialize_char<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.deserialize_str(visitor)
    }

    #[inline]
    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        match self.peek() {
            Some(b'"') => {
                self.at += 1;
                visitor.visit_borrowed_str(self.string()?)
            }
            _ => Err(GiveUp),
        }
    }

    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.deserialize_str(visitor)
    }

    fn deserialize_identifier<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.deserialize_str(visitor)
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        match self.peek() {
            Some(b'n') => {
                self.at += 1;
                self.word(b"ull")?;
                visitor.visit_none()
            }
            _ => visitor.visit_some(self),
        }
    }

    fn deserialize_unit<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        match self.peek() {
            Some(b'n') => self.deserialize_any(visitor),
            _ => Err(GiveUp),
        }
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value> {
        self.deserialize_unit(visitor)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value> {
        if name == RAW_VALUE_TOKEN {
            return Err(GiveUp);
        }
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        match self.peek() {
            Some(b'[') => self.seq(visitor),
            _ => Err(GiveUp),
        }
    }

    fn deserialize_tuple<V: Visitor<'de>>(self, _len: usize, visitor: V) -> Result<V::Value> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        match self.peek() {
            Some(b'{') => self.map(visitor),
            _ => Err(GiveUp),
        }
    }

    #[inline]
    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value> {
        // serde_json reads a struct from an object or an array.
        match self.peek() {
            Some(b'{') => self.map(visitor),
            Some(b'[') => self.seq(visitor),
            _ => Err(GiveUp),
        }
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value> {
        match self.peek() {
            Some(b'{') => {
                self.enter()?;
                let value = visitor.visit_enum(Variant { reader: self })?;
                self.leave(b'}')?;
                Ok(value)
            }
            Some(b'"') => visitor.visit_enum(UnitVariant { reader: self }),
            _ => Err(GiveUp),
        }
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        // Read strictly (serde_json skips more leniently: where this gives
        // up, it decides), then reported as unit, as serde_json does.
        de::Deserializer::deserialize_any(&mut *self, de::IgnoredAny)?;
        visitor.visit_unit()
    }
}

#[cfg(test)]
mod tests;
