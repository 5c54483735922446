//! How the reader hands arrays, objects, keys and enums to a visitor: each
//! type copies the serde_json type it names, giving up where that one fails.

use serde::Deserialize as _;
use serde::de::{self, DeserializeSeed, Visitor};

use super::{GiveUp, Reader, Result};

/// An array's elements (serde_json's `SeqAccess`).
pub(super) struct Elements<'a, 'de> {
    pub(super) reader: &'a mut Reader<'de>,
    pub(super) first: bool,
}

impl<'de> de::SeqAccess<'de> for Elements<'_, 'de> {
    type Error = GiveUp;

    #[inline]
    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>> {
        match self.reader.peek() {
            Some(b']') => return Ok(None),
            Some(_) if self.first => self.first = false,
            Some(b',') => {
                self.reader.at += 1;
                match self.reader.peek() {
                    Some(b']') | None => return Err(GiveUp),
                    Some(_) => {}
                }
            }
            _ => return Err(GiveUp),
        }
        seed.deserialize(&mut *self.reader).map(Some)
    }
}

/// An object's entries (serde_json's `MapAccess`).
pub(super) struct Entries<'a, 'de> {
    pub(super) reader: &'a mut Reader<'de>,
    pub(super) first: bool,
}

impl<'de> de::MapAccess<'de> for Entries<'_, 'de> {
    type Error = GiveUp;

    #[inline]
    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>> {
        match self.reader.peek() {
            Some(b'}') => return Ok(None),
            Some(b'"') if self.first => self.first = false,
            Some(b',') if !self.first => {
                self.reader.at += 1;
                if self.reader.peek() != Some(b'"') {
                    return Err(GiveUp);
                }
            }
            _ => return Err(GiveUp),
        }
        seed.deserialize(Key {
            reader: &mut *self.reader,
        })
        .map(Some)
    }

    #[inline]
    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value> {
        if self.reader.peek() != Some(b':') {
            return Err(GiveUp);
        }
        self.reader.at += 1;
        seed.deserialize(&mut *self.reader)
    }
}

/// An object key, at its opening quote (serde_json's `MapKey`): read as a
/// string; a key asked for as a number, a boolean, an option, an enum or
/// bytes (which serde_json parses out of the quotes) is left to serde_json.
struct Key<'a, 'de> {
    reader: &'a mut Reader<'de>,
}

macro_rules! key_gives_up {
    ($($method:ident)*) => {
        $(
            #[cold]
            fn $method<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value> {
                Err(GiveUp)
            }
        )*
    };
}

impl<'de> de::Deserializer<'de> for Key<'_, 'de> {
    type Error = GiveUp;

    #[inline]
    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.reader.at += 1;
        visitor.visit_borrowed_str(self.reader.string()?)
    }

    key_gives_up! {
        deserialize_i8 deserialize_i16 deserialize_i32 deserialize_i64 deserialize_i128
        deserialize_u8 deserialize_u16 deserialize_u32 deserialize_u64 deserialize_u128
        deserialize_f32 deserialize_f64 deserialize_bool deserialize_option
        deserialize_bytes deserialize_byte_buf
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _visitor: V,
    ) -> Result<V::Value> {
        Err(GiveUp)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        _visitor: V,
    ) -> Result<V::Value> {
        Err(GiveUp)
    }

    serde::forward_to_deserialize_any! {
        char str string unit unit_struct seq tuple tuple_struct map struct
        identifier ignored_any
    }
}

/// An enum written as `{"Variant": value}` (serde_json's `VariantAccess`).
pub(super) struct Variant<'a, 'de> {
    pub(super) reader: &'a mut Reader<'de>,
}

impl<'de> de::EnumAccess<'de> for Variant<'_, 'de> {
    type Error = GiveUp;
    type Variant = Self;

    fn variant_seed<V: DeserializeSeed<'de>>(self, seed: V) -> Result<(V::Value, Self)> {
        if self.reader.peek() != Some(b'"') {
            return Err(GiveUp);
        }
        let variant = seed.deserialize(Key {
            reader: &mut *self.reader,
        })?;
        if self.reader.peek() != Some(b':') {
            return Err(GiveUp);
        }
        self.reader.at += 1;
        Ok((variant, self))
    }
}

impl<'de> de::VariantAccess<'de> for Variant<'_, 'de> {
    type Error = GiveUp;

    fn unit_variant(self) -> Result<()> {
        <()>::deserialize(self.reader)
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value> {
        seed.deserialize(self.reader)
    }

    fn tuple_variant<V: Visitor<'de>>(self, _len: usize, visitor: V) -> Result<V::Value> {
        de::Deserializer::deserialize_seq(self.reader, visitor)
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value> {
        de::Deserializer::deserialize_struct(self.reader, "", fields, visitor)
    }
}

/// An enum written as its variant's name (serde_json's
/// `UnitVariantAccess`): only a unit variant reads from it.
pub(super) struct UnitVariant<'a, 'de> {
    pub(super) reader: &'a mut Reader<'de>,
}

impl<'de> de::EnumAccess<'de> for UnitVariant<'_, 'de> {
    type Error = GiveUp;
    type Variant = Self;

    fn variant_seed<V: DeserializeSeed<'de>>(self, seed: V) -> Result<(V::Value, Self)> {
        let variant = seed.deserialize(&mut *self.reader)?;
        Ok((variant, self))
    }
}

impl<'de> de::VariantAccess<'de> for UnitVariant<'_, 'de> {
    type Error = GiveUp;

    fn unit_variant(self) -> Result<()> {
        Ok(())
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, _seed: T) -> Result<T::Value> {
        Err(GiveUp)
    }

    fn tuple_variant<V: Visitor<'de>>(self, _len: usize, _visitor: V) -> Result<V::Value> {
        Err(GiveUp)
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        _fields: &'static [&'static str],
        _visitor: V,
    ) -> Result<V::Value> {
        Err(GiveUp)
    }
}
