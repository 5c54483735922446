//! The fast path against serde_json: where it answers, serde_json gives the
//! same value; through `Json<T>`, the answer (value or error text) is
//! serde_json's for every input, valid or hostile, and nothing panics.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Debug;

use bytes::Bytes;
use proptest::prelude::*;
use serde::Deserialize;
use serde::de::DeserializeOwned;

use super::from_slice;
use crate::decode::{Decode, Json};

#[derive(Debug, PartialEq, Deserialize)]
struct Order {
    id: u64,
    quantity: u32,
}

#[derive(Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
struct Strict {
    name: String,
    tags: Vec<String>,
    note: Option<String>,
    ratio: f64,
    small: f32,
    delta: i64,
    flag: bool,
    pair: (u8, i8),
    letter: Option<char>,
}

#[derive(Debug, PartialEq, Deserialize)]
enum Tagged {
    Unit,
    Newtype(u64),
    Tuple(i32, String),
    Struct { a: u8 },
}

#[derive(Debug, PartialEq, Deserialize)]
#[serde(tag = "type")]
enum Internal {
    Created { id: u64 },
    Deleted,
}

#[derive(Debug, PartialEq, Deserialize)]
#[serde(untagged)]
enum Untagged {
    Number(i64),
    Float(f64),
    Text(String),
    List(Vec<Untagged>),
}

#[derive(Debug, PartialEq, Deserialize)]
struct Nested {
    #[serde(default)]
    orders: Vec<Order>,
    tagged: Option<Tagged>,
    #[serde(flatten)]
    rest: BTreeMap<String, serde_json::Value>,
}

#[derive(Debug, PartialEq, Deserialize)]
struct Unit;

#[derive(Debug, PartialEq, Deserialize)]
struct Wrapper(u16);

/// `Json<T>`'s answer for `input` is serde_json's, value or error text, and
/// the fast path's value, where it gives one, is serde_json's.
fn same_as_serde_json<T>(input: &[u8])
where
    T: DeserializeOwned + PartialEq + Debug,
{
    let expected = serde_json::from_slice::<T>(input);
    if let Some(fast) = from_slice::<T>(input) {
        match &expected {
            Ok(value) => assert_eq!(&fast, value, "the value of {:?}", escaped(input)),
            Err(error) => panic!(
                "the fast path accepted {:?}, which serde_json refuses: {error}",
                escaped(input)
            ),
        }
    }
    let decoded = Json::<T>::decode(&Bytes::copy_from_slice(input));
    match (decoded, expected) {
        (Ok(Json(value)), Ok(expected)) => assert_eq!(value, expected),
        (Err(error), Err(expected)) => {
            let text = error.to_string();
            assert!(
                text.contains(&expected.to_string()),
                "the error for {:?} is serde_json's: {text:?} / {expected}",
                escaped(input)
            );
        }
        (decoded, expected) => panic!(
            "{:?}: Json gave {:?}, serde_json {expected:?}",
            escaped(input),
            decoded.map(|Json(value)| value)
        ),
    }
}

/// Values compared as serde_json prints them too: `-0.0` and `0.0` are
/// equal floats, but not the same number.
fn same_value(input: &[u8]) {
    same_as_serde_json::<serde_json::Value>(input);
    if let (Some(fast), Ok(slow)) = (
        from_slice::<serde_json::Value>(input),
        serde_json::from_slice::<serde_json::Value>(input),
    ) {
        assert_eq!(fast.to_string(), slow.to_string());
    }
}

fn escaped(input: &[u8]) -> String {
    input.escape_ascii().to_string()
}

fn every_type(input: &[u8]) {
    same_value(input);
    same_as_serde_json::<Order>(input);
    same_as_serde_json::<Strict>(input);
    same_as_serde_json::<Tagged>(input);
    same_as_serde_json::<Internal>(input);
    same_as_serde_json::<Untagged>(input);
    same_as_serde_json::<Nested>(input);
    same_as_serde_json::<Unit>(input);
    same_as_serde_json::<Wrapper>(input);
    same_as_serde_json::<Option<Order>>(input);
    same_as_serde_json::<Vec<Order>>(input);
    same_as_serde_json::<HashMap<String, i64>>(input);
    same_as_serde_json::<BTreeMap<u32, bool>>(input);
    same_as_serde_json::<(u64, String)>(input);
    same_as_serde_json::<String>(input);
    same_as_serde_json::<u64>(input);
    same_as_serde_json::<i64>(input);
    same_as_serde_json::<i8>(input);
    same_as_serde_json::<u128>(input);
    same_as_serde_json::<f64>(input);
    same_as_serde_json::<f32>(input);
    same_as_serde_json::<Vec<u8>>(input);
    same_as_serde_json::<bool>(input);
    same_as_serde_json::<()>(input);
}

/// Hostile and edge inputs, each tried as every type.
#[test]
fn hostile_inputs_get_serde_json_s_answer() {
    let mut inputs: Vec<Vec<u8>> = [
        &br#"{"id":1000000,"quantity":37}"#[..],
        b"",
        b"   ",
        b"\xef\xbb\xbf{}",
        br#"{"id":1,"quantity":2} x"#,
        br#"{"id":1,"quantity":2}}"#,
        br#"{"id":1,"quantity":2,}"#,
        br#"{"id":1,,"quantity":2}"#,
        br#"{"id":1 "quantity":2}"#,
        br#"{"id":1,"id":2,"quantity":2}"#,
        br#"{"id":1,"quantity":2,"other":[1,{"a":null}]}"#,
        br#"{"id":1,"quantity":4294967296}"#,
        br#"{"id":-1,"quantity":2}"#,
        br#"{"id":1.0,"quantity":2}"#,
        br#"{"id":18446744073709551615,"quantity":2}"#,
        br#"{"id":18446744073709551616,"quantity":2}"#,
        br#"{"id":99999999999999999999999,"quantity":2}"#,
        br#"[1000000,37]"#,
        br#"[1000000,37,]"#,
        br#"[1000000]"#,
        br#"[1000000,37,1]"#,
        b"{\"id\":1,\"quantity\":2,\"x\":\"\xff\"}",
        b"{\"id\":1,\"quantity\":2,\"\xff\":1}",
        b"{\"id\":1,\"quantity\":2,\"x\":\"\xc3\xa9\"}",
        b"\"\xc3\xa9t\xc3\xa9\"",
        b"\"\xed\xa0\x80\"",
        b"\"a\x00b\"",
        b"\"a\x1fb\"",
        br#""a\"b""#,
        br#""\u00e9""#,
        br#""\ud800""#,
        br#""\ud83d\ude00""#,
        br#""\x""#,
        b"\"unterminated",
        b"\"",
        br#""ab""#,
        br#"{"id":1,"quantity":2}"#,
        br#"{"name":"n","tags":["a","b"],"note":null,"ratio":1.5,"small":0.1,"delta":-9223372036854775808,"flag":true,"pair":[255,-128],"letter":"x"}"#,
        br#"{"name":"n","tags":[],"note":"x","ratio":1e308,"small":3.4028236e38,"delta":-1,"flag":false,"pair":[0,0],"letter":"xy"}"#,
        br#"{"name":"n","tags":[],"note":"x","ratio":1e400,"small":1,"delta":0,"flag":false,"pair":[0,0],"letter":null}"#,
        br#"{"name":"n","tags":[],"note":"x","ratio":-0,"small":-0.0,"delta":-0,"flag":false,"pair":[256,0],"letter":null}"#,
        br#"{"name":"n","tags":[],"note":"x","ratio":2,"small":1,"delta":5,"flag":false,"pair":[1,2],"letter":null,"extra":1}"#,
        br#""Unit""#,
        br#"{"Unit":null}"#,
        br#"{"Newtype":7}"#,
        br#"{"Newtype":7,"x":1}"#,
        br#"{"Tuple":[1,"a"]}"#,
        br#"{"Struct":{"a":1}}"#,
        br#"{"Struct":[1]}"#,
        br#""Newtype""#,
        br#"{}"#,
        br#"{"type":"Created","id":5}"#,
        br#"{"id":5,"type":"Created"}"#,
        br#"{"type":"Deleted"}"#,
        br#"[1,2.5,"x",[3,[-4]]]"#,
        br#"{"orders":[{"id":1,"quantity":2}],"tagged":"Unit","k":[true,false,null]}"#,
        br#"{"orders":[],"tagged":{"Newtype":1},"k":{"a":{"b":-0.0}}}"#,
        br#"{"1":true,"2":false}"#,
        br#"{"-1":true}"#,
        br#"{"x":true}"#,
        br#"{"a":1,"b":-2}"#,
        br#"[5,"x"]"#,
        b"null",
        b"nul",
        b"nullx",
        b"true",
        b"tru",
        b"false ",
        b" \t\r\n42 \n",
        b"42",
        b"0",
        b"-0",
        b"00",
        b"-01",
        b"01.5",
        b"1.",
        b".5",
        b"-",
        b"1e",
        b"1e+",
        b"1E5",
        b"1e-400",
        b"2.5e-3",
        b"1-2",
        b"1.5.5",
        b"-9223372036854775808",
        b"-9223372036854775809",
        b"-999999999999999999",
        b"9999999999999999999",
        b"10000000000000000000",
        b"340282366920938463463374607431768211455",
        b"127",
        b"128",
        b"-129",
        b"[104,105]",
        b"3.4028235e38",
        b"3.4028236e38",
        b"0.1",
        b"123456789012345678901234567890e-10",
    ]
    .iter()
    .map(|input| input.to_vec())
    .collect();
    for depth in [1, 50, 98, 99, 100, 101, 126, 127, 128, 129, 300] {
        let mut open = "[".repeat(depth).into_bytes();
        open.extend(std::iter::repeat_n(b']', depth));
        inputs.push(open);
        let mut objects = r#"{"a":"#.repeat(depth).into_bytes();
        objects.extend(b"1");
        objects.extend(std::iter::repeat_n(b'}', depth));
        inputs.push(objects);
        let mut unclosed = "[".repeat(depth).into_bytes();
        unclosed.extend(b"1");
        inputs.push(unclosed);
    }
    for input in &inputs {
        every_type(input);
    }
}

/// The benchmark's payload takes the fast path (so the benchmark measures
/// it), and so do the common shapes.
#[test]
fn common_shapes_take_the_fast_path() {
    assert_eq!(
        from_slice::<Order>(br#"{"id":1000000,"quantity":37}"#),
        Some(Order {
            id: 1_000_000,
            quantity: 37
        })
    );
    assert!(
        from_slice::<Nested>(
            br#"{"orders":[{"id":1,"quantity":2}],"tagged":{"Struct":{"a":1}},"x":[1.5,"s",null]}"#
        )
        .is_some()
    );
    assert!(from_slice::<Internal>(br#"{"type":"Created","id":5}"#).is_some());
    assert!(from_slice::<serde_json::Value>(b"\"\xc3\xa9\"").is_some());
    // And what is left to serde_json is.
    assert!(from_slice::<String>(br#""a\nb""#).is_none());
    assert!(from_slice::<Order>(br#"{"id":1,"quantity":-2}"#).is_none());
}

/// JSON-ish bytes: every byte that means something to a JSON parser, and a
/// few that do not.
fn jsonish() -> impl Strategy<Value = Vec<u8>> {
    let alphabet: &[u8] = b"{}[]\":,0123456789.eE+- \n\tnulltruefalseaidqyx\\u\xff\xc3\xa9\x00";
    prop::collection::vec(prop::sample::select(alphabet.to_vec()), 0..40)
}

/// Valid documents: serde_json's own `Value`s, printed.
fn documents() -> impl Strategy<Value = Vec<u8>> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::from),
        any::<u64>().prop_map(serde_json::Value::from),
        any::<i64>().prop_map(serde_json::Value::from),
        (0..1_000_000u64).prop_map(serde_json::Value::from),
        (-1_000_000..0i64).prop_map(serde_json::Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(serde_json::Value::from),
        "[a-z\u{e9}\u{1f600}]{0,6}".prop_map(serde_json::Value::from),
        "[a-z\u{e9}\u{1f600}\"\\\\\n]{0,6}".prop_map(serde_json::Value::from),
    ];
    let value = leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(serde_json::Value::from),
            prop::collection::btree_map("[a-z]{0,3}|id|quantity|type|Created", inner, 0..5)
                .prop_map(|map| serde_json::Value::Object(map.into_iter().collect())),
        ]
    });
    value.prop_map(|value| serde_json::to_vec(&value).expect("a value prints"))
}

/// Valid documents with one mutation or none: a byte replaced, removed or
/// added, or the text cut.
fn mutated_documents() -> impl Strategy<Value = Vec<u8>> {
    (
        documents(),
        any::<u8>(),
        0..5u8,
        any::<prop::sample::Index>(),
    )
        .prop_map(|(mut text, byte, mutation, index)| {
            let at = index.index(text.len() + 1);
            match mutation {
                0 if at < text.len() => text[at] = byte,
                1 if at < text.len() => {
                    text.remove(at);
                }
                2 => text.insert(at, byte),
                3 => text.truncate(at),
                _ => {}
            }
            text
        })
}

/// The comparisons above are not vacuous: most valid documents take the
/// fast path (those it gives up on hold an escape, or an integer past 19
/// digits).
#[test]
fn most_valid_documents_take_the_fast_path() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;

    let mut runner = TestRunner::deterministic();
    let strategy = documents();
    let tried = 500;
    let mut answered = 0;
    for _ in 0..tried {
        let text = strategy
            .new_tree(&mut runner)
            .expect("a document")
            .current();
        if from_slice::<serde_json::Value>(&text).is_some() {
            answered += 1;
        }
    }
    assert!(
        answered * 2 > tried,
        "{answered} of {tried} took the fast path"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn jsonish_bytes_get_serde_json_s_answer(input in jsonish()) {
        every_type(&input);
    }

    #[test]
    fn valid_documents_get_serde_json_s_answer(input in documents()) {
        every_type(&input);
    }

    #[test]
    fn mutated_documents_get_serde_json_s_answer(input in mutated_documents()) {
        every_type(&input);
    }

    #[test]
    fn orders_get_serde_json_s_answer(id in any::<u64>(), quantity in any::<i64>(), spaces in " {0,2}") {
        let input = format!(r#"{{{spaces}"id"{spaces}:{spaces}{id},"quantity":{quantity}{spaces}}}"#);
        every_type(input.as_bytes());
    }
}
