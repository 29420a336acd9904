//! The serde pieces of the configuration model: mappings and lists that say what they expected
//! and what they found instead, leaves read as they are written, and the path of a refused value
//! in the document.
use std::{fmt, fmt::Write as _, marker::PhantomData};

use serde::{
    Deserialize, Deserializer,
    de::{
        self, EnumAccess, MapAccess, SeqAccess, Visitor,
        value::{MapAccessDeserializer, SeqAccessDeserializer},
    },
};
use serde_norway::Value;
use serde_path_to_error::{Path, Segment};

/// What a YAML value is, for a wrong-type error ("the string \"5s\"", "a list").
pub(crate) fn describe(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => format!("the boolean {b}"),
        Value::Number(n) => format!("the number {n}"),
        Value::String(s) => format!("the string {s:?}"),
        Value::Sequence(_) => "a list".into(),
        Value::Mapping(_) => "a mapping".into(),
        Value::Tagged(t) => format!("a value tagged {}", t.tag),
    }
}

/// A scalar as written (`5s`, `1000`, `true`), for an invalid-value error; anything else as
/// [`describe`] says it.
pub(crate) fn describe_plain(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        other => describe(other),
    }
}

/// The wording of every wrong-type error: "expected {expected}, found {found}".
pub(crate) fn wrong_type(expected: &str, found: &str) -> String {
    format!("expected {expected}, found {found}")
}

/// A leaf of the model read from the value as written: `take` gives the leaf, or the message
/// (without the field, which the reader adds) saying why the value is refused.
pub(super) fn leaf<'de, D, T>(
    d: D,
    take: impl FnOnce(Value) -> Result<T, String>,
) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
{
    let v = Value::deserialize(d)?;
    take(v).map_err(de::Error::custom)
}

/// A field that, once written, must hold a value: `null` is refused as a wrong type (by `T`),
/// where a plain `Option` would read it as absent. With `#[serde(default)]`, for the keys under
/// `nodeMonitor`.
pub(super) fn present<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    T::deserialize(d).map(Some)
}

/// A section of the model (a struct read from a mapping), with what its wrong-type error says
/// it takes.
pub(super) trait Section {
    /// What the section takes ("a mapping").
    const EXPECTED: &'static str;
}

/// A [`Section`] read from a mapping; anything else is refused with "expected …, found …".
pub(super) struct Mapped<T>(pub(super) T);

impl<'de, T: Deserialize<'de> + Section> Deserialize<'de> for Mapped<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        mapping(d, T::EXPECTED).map(Mapped)
    }
}

/// An optional [`Section`]: `null` or absent is `None`.
pub(super) fn optional_section<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Section,
{
    Ok(Option::<Mapped<T>>::deserialize(d)?.map(|m| m.0))
}

/// `T` from a mapping (the map access is handed on, so the path of a refused value inside is
/// kept); anything else is refused saying it expected `expected`.
pub(super) fn mapping<'de, D, T>(d: D, expected: &'static str) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    d.deserialize_any(Shape {
        list: false,
        expected,
        inner: PhantomData,
    })
}

/// `T` from a list, as [`mapping`] from a mapping.
pub(super) fn list<'de, D, T>(d: D, expected: &'static str) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    d.deserialize_any(Shape {
        list: true,
        expected,
        inner: PhantomData,
    })
}

/// The visitor of [`mapping`] and [`list`].
struct Shape<T> {
    list: bool,
    expected: &'static str,
    inner: PhantomData<T>,
}

impl<T> Shape<T> {
    fn refuse<E: de::Error>(&self, found: &str) -> Result<T, E> {
        Err(E::custom(wrong_type(self.expected, found)))
    }
}

impl<'de, T: Deserialize<'de>> Visitor<'de> for Shape<T> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.expected)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
        if self.list {
            self.refuse("a mapping")
        } else {
            T::deserialize(MapAccessDeserializer::new(StringKeys(map)))
        }
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<T, A::Error> {
        if self.list {
            T::deserialize(SeqAccessDeserializer::new(seq))
        } else {
            self.refuse("a list")
        }
    }

    fn visit_bool<E: de::Error>(self, b: bool) -> Result<T, E> {
        self.refuse(&format!("the boolean {b}"))
    }

    fn visit_i64<E: de::Error>(self, n: i64) -> Result<T, E> {
        self.refuse(&format!("the number {n}"))
    }

    fn visit_u64<E: de::Error>(self, n: u64) -> Result<T, E> {
        self.refuse(&format!("the number {n}"))
    }

    fn visit_f64<E: de::Error>(self, n: f64) -> Result<T, E> {
        self.refuse(&format!("the number {n}"))
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<T, E> {
        self.refuse(&format!("the string {s:?}"))
    }

    fn visit_unit<E: de::Error>(self) -> Result<T, E> {
        self.refuse("null")
    }

    fn visit_none<E: de::Error>(self) -> Result<T, E> {
        self.refuse("null")
    }

    fn visit_enum<A: EnumAccess<'de>>(self, _: A) -> Result<T, A::Error> {
        self.refuse("a tagged value")
    }
}

/// A mapping's entries with every key checked to be a string first, so that a section refuses a
/// key such as `1:` saying so (a struct's own field names would call it a "field identifier").
struct StringKeys<A>(A);

impl<'de, A: MapAccess<'de>> MapAccess<'de> for StringKeys<A> {
    type Error = A::Error;

    fn next_key_seed<K: de::DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, A::Error> {
        match self.0.next_key::<Value>()? {
            None => Ok(None),
            Some(Value::String(key)) => seed
                .deserialize(de::value::StringDeserializer::<A::Error>::new(key))
                .map(Some),
            Some(other) => Err(de::Error::custom(wrong_type(
                "string keys",
                &describe(&other),
            ))),
        }
    }

    fn next_value_seed<V: de::DeserializeSeed<'de>>(
        &mut self,
        seed: V,
    ) -> Result<V::Value, A::Error> {
        self.0.next_value_seed(seed)
    }

    fn size_hint(&self) -> Option<usize> {
        self.0.size_hint()
    }
}

/// The fields whose keys are eviction signals: an entry is named `evictionHard["memory.available"]`.
const SIGNAL_MAP_FIELDS: [&str; 4] = [
    "evictionHard",
    "evictionSoft",
    "evictionSoftGracePeriod",
    "evictionMinimumReclaim",
];

/// The field a path names, as errors write it: `nodeMonitor.shutdown.pollInterval`,
/// `shutdownGracePeriodByPodPriority[0].priority`, `evictionHard["memory.available"]`.
pub(super) fn field_path(path: &Path) -> String {
    let mut out = String::new();
    let mut signal_map = false;
    for segment in path.iter() {
        match segment {
            Segment::Seq { index } => {
                let _ = write!(out, "[{index}]");
            }
            Segment::Map { key } if signal_map => {
                let _ = write!(out, "[{key:?}]");
            }
            Segment::Map { key } => {
                if out.is_empty() {
                    signal_map = SIGNAL_MAP_FIELDS.contains(&key.as_str());
                } else {
                    out.push('.');
                    signal_map = false;
                }
                out.push_str(key);
            }
            // A key that is not a string (the message describes it) or an enum variant.
            Segment::Enum { .. } | Segment::Unknown => {}
        }
    }
    out
}
