//! Trace-event documents on the lab side: [`merge`] joins per-rank documents (a `PG_TRACE` directory's rank files)
//! into one, and [`to_serde`] and [`from_serde`] carry pg-core's JSON values to and from serde_json's for the tools
//! that read and compose them (pg-core writes its documents without serde_json; the lab reads them with it).

use std::collections::BTreeMap;

use pg_core::json::{Object, Value as PgValue};
use serde_json::{json, Value};

/// Joins trace-event documents (each `{"traceEvents": [...]}`, such as the rank files of a `PG_TRACE`
/// directory) into one: every document's events in order, and each one's `otherData` in the list
/// `otherData.parts`. Fails when a document has no `traceEvents` list, or when two documents name the same process
/// (`process_name` of one `pid`): their tracks would land on top of each other.
pub fn merge(documents: &[Value]) -> Result<Value, String> {
    let mut events = Vec::new();
    let mut parts = Vec::new();
    let mut named: BTreeMap<u64, usize> = BTreeMap::new();
    for (index, document) in documents.iter().enumerate() {
        let list = document
            .get("traceEvents")
            .and_then(Value::as_array)
            .ok_or_else(|| format!("document {index} has no traceEvents list"))?;
        for event in list {
            if event["ph"] == "M" && event["name"] == "process_name" {
                let pid = event["pid"].as_u64().ok_or_else(|| format!("document {index}: a process without a pid"))?;
                if let Some(first) = named.insert(pid, index) {
                    if first != index {
                        return Err(format!("documents {first} and {index} both name process {pid}"));
                    }
                }
            }
        }
        events.extend(list.iter().cloned());
        parts.push(document.get("otherData").cloned().unwrap_or(Value::Null));
    }
    Ok(json!({"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"parts": parts}}))
}

/// `value` as serde_json's value: the same document (an integer beyond `i64` and `u64` becomes the nearest float,
/// a float that is not finite `null`, as pg-core writes it).
pub fn to_serde(value: &PgValue) -> Value {
    match value {
        PgValue::Null => Value::Null,
        PgValue::Bool(b) => Value::Bool(*b),
        PgValue::Integer(n) => match (i64::try_from(*n), u64::try_from(*n)) {
            (Ok(n), _) => n.into(),
            (_, Ok(n)) => n.into(),
            _ => serde_json::Number::from_f64(*n as f64).map_or(Value::Null, Value::Number),
        },
        PgValue::Float(x) => serde_json::Number::from_f64(*x).map_or(Value::Null, Value::Number),
        PgValue::String(s) => Value::String(s.clone()),
        PgValue::Array(items) => Value::Array(items.iter().map(to_serde).collect()),
        PgValue::Object(object) => Value::Object(object.iter().map(|(k, v)| (k.to_owned(), to_serde(v))).collect()),
    }
}

/// `value` as pg-core's JSON value: the same document (an object's keys in serde_json's order).
pub fn from_serde(value: &Value) -> PgValue {
    match value {
        Value::Null => PgValue::Null,
        Value::Bool(b) => PgValue::Bool(*b),
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(n), _) => n.into(),
            (_, Some(n)) => n.into(),
            _ => n.as_f64().map_or(PgValue::Null, PgValue::Float),
        },
        Value::String(s) => PgValue::String(s.clone()),
        Value::Array(items) => PgValue::Array(items.iter().map(from_serde).collect()),
        Value::Object(map) => PgValue::Object(object_from_serde(map)),
    }
}

/// A serde_json object as pg-core's (trace-event arguments built from a read document).
pub fn object_from_serde(map: &serde_json::Map<String, Value>) -> Object {
    map.iter().map(|(k, v)| (k.as_str(), from_serde(v))).collect()
}

#[cfg(test)]
mod tests {
    use pg_core::json_object;
    use pg_core::trace_event::{TraceEvents, Track};

    use super::*;

    #[test]
    fn merging_keeps_every_event_and_refuses_a_process_named_twice() {
        let rank = |pid: u64| {
            let mut trace = TraceEvents::new();
            trace.process(pid, &format!("rank {pid}"), pid as i64);
            trace.slice(Track::new(pid, 1), "op", "op", 1_000, 2_000, Object::new());
            let mut document = to_serde(&trace.into_json());
            document["otherData"] = json!({"rank": pid});
            document
        };
        let merged = merge(&[rank(0), rank(1)]).unwrap();
        assert_eq!(merged["traceEvents"].as_array().map(Vec::len), Some(2 * 3));
        assert_eq!(merged["otherData"]["parts"][1]["rank"], 1);
        assert!(merge(&[rank(0), rank(0)]).unwrap_err().contains("both name process 0"));
        assert!(merge(&[json!({})]).is_err());
    }

    #[test]
    fn values_cross_over_unchanged() {
        let ours: PgValue = json_object! {
            "n": -3, "big": u64::MAX, "x": 0.5, "s": "a\"b", "none": PgValue::Null, "list": [true, false],
            "nested": json_object! {"k": Vec::<PgValue>::new()},
        }
        .into();
        let theirs = to_serde(&ours);
        assert_eq!(theirs, serde_json::from_str::<Value>(&ours.to_string()).unwrap());
        assert_eq!(to_serde(&from_serde(&theirs)), theirs);
        assert_eq!(to_serde(&PgValue::Float(f64::NAN)), Value::Null);
    }
}
