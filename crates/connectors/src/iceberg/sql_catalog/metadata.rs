//! Iceberg table metadata (format v2) as a catalog keeps it: a new table's first metadata from a
//! REST `CreateTableRequest`, a commit's requirements checked against the current metadata,
//! and its updates applied, as the REST catalog specification defines them.

use serde_json::{Map, Value, json};

/// Why a request cannot be done: the REST status it answers with, and what to say.
#[derive(Debug, PartialEq, Eq)]
pub struct Refusal {
    pub status: u16,
    pub kind: &'static str,
    pub message: String,
}

impl Refusal {
    pub fn bad(message: impl Into<String>) -> Self {
        Self { status: 400, kind: "BadRequestException", message: message.into() }
    }

    pub fn conflict(message: impl Into<String>) -> Self {
        Self { status: 409, kind: "CommitFailedException", message: message.into() }
    }
}

/// A new table's metadata: the request's schema (its field ids kept), partition spec, sort
/// order and properties, at `location`, with no snapshot.
pub fn new_table(request: &Value, location: &str, uuid: &str, now_ms: i64) -> Result<Value, Refusal> {
    let mut schema = request.get("schema").cloned().ok_or_else(|| Refusal::bad("the request has no schema"))?;
    if !schema["fields"].is_array() {
        return Err(Refusal::bad("the schema has no fields"));
    }
    schema["schema-id"] = json!(0);
    schema["type"] = json!("struct");
    let mut spec = request.get("partition-spec").filter(|s| !s.is_null()).cloned().unwrap_or(json!({"fields": []}));
    spec["spec-id"] = json!(0);
    let mut order = request.get("write-order").filter(|s| !s.is_null()).cloned().unwrap_or(json!({"fields": []}));
    let order_id = if order["fields"].as_array().is_some_and(|f| !f.is_empty()) { 1 } else { 0 };
    order["order-id"] = json!(order_id);
    let properties = request.get("properties").filter(|p| p.is_object()).cloned().unwrap_or(json!({}));
    Ok(json!({
        "format-version": 2,
        "table-uuid": uuid,
        "location": location,
        "last-sequence-number": 0,
        "last-updated-ms": now_ms,
        "last-column-id": highest_field_id(&schema),
        "current-schema-id": 0,
        "schemas": [schema],
        "default-spec-id": 0,
        "partition-specs": [spec.clone()],
        "last-partition-id": highest_partition_id(&spec).max(999),
        "default-sort-order-id": order_id,
        "sort-orders": [order],
        "properties": properties,
        "refs": {},
        "snapshots": [],
        "snapshot-log": [],
        "metadata-log": [],
    }))
}

/// Check a commit's requirements against the table's current metadata.
pub fn check(metadata: &Value, requirements: &[Value]) -> Result<(), Refusal> {
    for requirement in requirements {
        let kind = requirement["type"].as_str().unwrap_or_default();
        let (ok, what) = match kind {
            "assert-create" => (false, "the table exists".to_string()),
            "assert-table-uuid" => (requirement["uuid"] == metadata["table-uuid"], "the table's UUID changed".into()),
            "assert-ref-snapshot-id" => {
                let name = requirement["ref"].as_str().unwrap_or_default();
                let now = metadata["refs"].get(name).map(|r| r["snapshot-id"].clone()).unwrap_or(Value::Null);
                let wanted = &requirement["snapshot-id"];
                (now == *wanted, format!("branch '{name}' is at {now}, not {wanted}"))
            }
            "assert-last-assigned-field-id" => same(metadata, requirement, "last-column-id", "last-assigned-field-id"),
            "assert-current-schema-id" => same(metadata, requirement, "current-schema-id", "current-schema-id"),
            "assert-last-assigned-partition-id" => {
                same(metadata, requirement, "last-partition-id", "last-assigned-partition-id")
            }
            "assert-default-spec-id" => same(metadata, requirement, "default-spec-id", "default-spec-id"),
            "assert-default-sort-order-id" => {
                same(metadata, requirement, "default-sort-order-id", "default-sort-order-id")
            }
            other => return Err(Refusal::bad(format!("unknown requirement '{other}'"))),
        };
        if !ok {
            return Err(Refusal::conflict(format!("requirement {kind} failed: {what}")));
        }
    }
    Ok(())
}

fn same(metadata: &Value, requirement: &Value, ours: &str, theirs: &str) -> (bool, String) {
    let (now, wanted) = (&metadata[ours], &requirement[theirs]);
    (now == wanted, format!("{ours} is {now}, not {wanted}"))
}

/// Apply a commit's updates in order; `previous` (the metadata file replaced) goes into the
/// metadata log.
pub fn apply(metadata: &mut Value, updates: &[Value], previous: &str, now_ms: i64) -> Result<(), Refusal> {
    let version = metadata["format-version"].as_i64().unwrap_or(1);
    if version != 2 {
        return Err(Refusal::bad(format!(
            "format version {version}: Sluice's SQL catalog commits to version 2 tables"
        )));
    }
    let before_ms = metadata["last-updated-ms"].clone();
    let mut added = Vec::new();
    let (mut last_schema, mut last_spec, mut last_order) = (None, None, None);
    for update in updates {
        let action = update["action"].as_str().unwrap_or_default();
        let m = object(metadata);
        match action {
            "assign-uuid" => {
                if Some(&update["uuid"]) != m.get("table-uuid") {
                    return Err(Refusal::conflict("the table already has another UUID"));
                }
            }
            "upgrade-format-version" => {
                let wanted = update["format-version"].as_i64().unwrap_or(0);
                if wanted != 2 {
                    return Err(Refusal::bad(format!("format version {wanted}: this catalog keeps version 2")));
                }
            }
            "add-schema" => {
                let schema = &update["schema"];
                let highest = highest_field_id(schema).max(update["last-column-id"].as_i64().unwrap_or(0));
                raise(m, "last-column-id", highest);
                last_schema = Some(add(m, "schemas", "schema-id", schema));
            }
            "set-current-schema" => {
                let id = latest(update["schema-id"].as_i64(), last_schema, "schema")?;
                known(m, "schemas", "schema-id", id)?;
                m.insert("current-schema-id".into(), json!(id));
            }
            "add-spec" => {
                let spec = &update["spec"];
                raise(m, "last-partition-id", highest_partition_id(spec));
                last_spec = Some(add(m, "partition-specs", "spec-id", spec));
            }
            "set-default-spec" => {
                let id = latest(update["spec-id"].as_i64(), last_spec, "partition spec")?;
                known(m, "partition-specs", "spec-id", id)?;
                m.insert("default-spec-id".into(), json!(id));
            }
            "add-sort-order" => {
                last_order = Some(add(m, "sort-orders", "order-id", &update["sort-order"]));
            }
            "set-default-sort-order" => {
                let id = latest(update["sort-order-id"].as_i64(), last_order, "sort order")?;
                known(m, "sort-orders", "order-id", id)?;
                m.insert("default-sort-order-id".into(), json!(id));
            }
            "add-snapshot" => {
                let snapshot = update["snapshot"].clone();
                let Some(id) = snapshot["snapshot-id"].as_i64() else {
                    return Err(Refusal::bad("add-snapshot: the snapshot has no snapshot-id"));
                };
                if known(m, "snapshots", "snapshot-id", id).is_ok() {
                    return Err(Refusal::conflict(format!("snapshot {id} exists already")));
                }
                let Some(sequence) = snapshot["sequence-number"].as_i64() else {
                    return Err(Refusal::bad("add-snapshot: the snapshot has no sequence-number"));
                };
                if sequence <= m.get("last-sequence-number").and_then(Value::as_i64).unwrap_or(0) {
                    return Err(Refusal::conflict(format!("sequence number {sequence} is not past the table's")));
                }
                raise(m, "last-sequence-number", sequence);
                push(m, "snapshots", snapshot);
                added.push(id);
            }
            "set-snapshot-ref" => {
                let name = update["ref-name"].as_str().ok_or_else(|| Refusal::bad("set-snapshot-ref: no ref-name"))?;
                let id =
                    update["snapshot-id"].as_i64().ok_or_else(|| Refusal::bad("set-snapshot-ref: no snapshot-id"))?;
                known(m, "snapshots", "snapshot-id", id)?;
                let mut reference = json!({"snapshot-id": id, "type": update["type"].as_str().unwrap_or("branch")});
                for field in ["max-ref-age-ms", "max-snapshot-age-ms", "min-snapshots-to-keep"] {
                    if !update[field].is_null() {
                        reference[field] = update[field].clone();
                    }
                }
                let moved = m.get("refs").and_then(|r| r.get(name)).and_then(|r| r["snapshot-id"].as_i64()) != Some(id);
                object(m.entry("refs").or_insert(json!({}))).insert(name.into(), reference);
                if name == "main" && moved {
                    m.insert("current-snapshot-id".into(), json!(id));
                    // The snapshot's own time when this commit adds it, else now: the log stays
                    // in order (Java refuses a log out of order).
                    let at = if added.contains(&id) { snapshot_ms(m, id).unwrap_or(now_ms) } else { now_ms };
                    push(m, "snapshot-log", json!({"snapshot-id": id, "timestamp-ms": at}));
                }
            }
            "remove-snapshots" => {
                let gone: Vec<i64> = update["snapshot-ids"]
                    .as_array()
                    .map(|ids| ids.iter().filter_map(Value::as_i64).collect())
                    .unwrap_or_default();
                let still = |v: &Value| !gone.contains(&v["snapshot-id"].as_i64().unwrap_or(i64::MIN));
                for list in ["snapshots", "snapshot-log"] {
                    if let Some(items) = m.get_mut(list).and_then(Value::as_array_mut) {
                        items.retain(still);
                    }
                }
                if let Some(refs) = m.get_mut("refs").and_then(Value::as_object_mut) {
                    refs.retain(|_, r| still(r));
                }
                if m.get("current-snapshot-id").and_then(Value::as_i64).is_some_and(|id| gone.contains(&id)) {
                    m.remove("current-snapshot-id");
                }
            }
            "remove-snapshot-ref" => {
                let name = update["ref-name"].as_str().unwrap_or_default();
                if let Some(refs) = m.get_mut("refs").and_then(Value::as_object_mut) {
                    refs.remove(name);
                }
                if name == "main" {
                    m.remove("current-snapshot-id");
                }
            }
            "set-location" => {
                let location = update["location"].as_str().ok_or_else(|| Refusal::bad("set-location: no location"))?;
                m.insert("location".into(), json!(location.trim_end_matches('/')));
            }
            "set-properties" => {
                let updates = update["updates"].as_object().cloned().unwrap_or_default();
                object(m.entry("properties").or_insert(json!({}))).extend(updates);
            }
            "remove-properties" => {
                let properties = object(m.entry("properties").or_insert(json!({})));
                for key in update["removals"].as_array().into_iter().flatten().filter_map(Value::as_str) {
                    properties.remove(key);
                }
            }
            other => return Err(Refusal::bad(format!("update '{other}' is not supported by Sluice's SQL catalog"))),
        }
    }
    let m = object(metadata);
    push(m, "metadata-log", json!({"metadata-file": previous, "timestamp-ms": before_ms}));
    let keep = m
        .get("properties")
        .and_then(|p| p.get("write.metadata.previous-versions-max"))
        .and_then(Value::as_str)
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(100);
    if let Some(log) = m.get_mut("metadata-log").and_then(Value::as_array_mut)
        && log.len() > keep
    {
        log.drain(..log.len() - keep);
    }
    m.insert("last-updated-ms".into(), json!(now_ms));
    Ok(())
}

/// `value` as an object, made one if it is not (metadata the catalog wrote always is).
fn object(value: &mut Value) -> &mut Map<String, Value> {
    if !value.is_object() {
        *value = json!({});
    }
    value.as_object_mut().expect("made an object above")
}

fn push(m: &mut Map<String, Value>, list: &str, item: Value) {
    let entry = m.entry(list).or_insert(json!([]));
    if !entry.is_array() {
        *entry = json!([]);
    }
    entry.as_array_mut().expect("made an array above").push(item);
}

fn raise(m: &mut Map<String, Value>, field: &str, to: i64) {
    if m.get(field).and_then(Value::as_i64).is_none_or(|now| now < to) {
        m.insert(field.into(), json!(to));
    }
}

/// Add a schema, spec or order to `list`, its id the one it asks for when free, else one past
/// the highest; one the table has already (the same but for its id) is not added twice. Its id.
fn add(m: &mut Map<String, Value>, list: &str, field: &str, item: &Value) -> i64 {
    let fields = |v: &Value| {
        let mut v = v.clone();
        if let Some(o) = v.as_object_mut() {
            o.remove(field);
            if list == "schemas" {
                o.entry("identifier-field-ids").or_insert(json!([]));
                o.insert("type".into(), json!("struct"));
            }
        }
        v
    };
    let existing: Vec<(i64, Value)> = m
        .get(list)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|i| Some((i[field].as_i64()?, fields(i))))
        .collect();
    let wanted = fields(item);
    if let Some((id, _)) = existing.iter().find(|(_, v)| *v == wanted) {
        return *id;
    }
    let id = match item[field].as_i64() {
        Some(asked) if asked >= 0 && !existing.iter().any(|(id, _)| *id == asked) => asked,
        _ => existing.iter().map(|(id, _)| id + 1).max().unwrap_or(0),
    };
    let mut item = item.clone();
    item[field] = json!(id);
    push(m, list, item);
    id
}

/// `-1` means the one added last in this commit.
fn latest(id: Option<i64>, added: Option<i64>, what: &str) -> Result<i64, Refusal> {
    match id {
        Some(-1) => added.ok_or_else(|| Refusal::bad(format!("-1 names the {what} added last, and none was"))),
        Some(id) => Ok(id),
        None => Err(Refusal::bad(format!("no {what} id"))),
    }
}

fn known(m: &Map<String, Value>, list: &str, field: &str, id: i64) -> Result<(), Refusal> {
    let found = m.get(list).and_then(Value::as_array).into_iter().flatten().any(|i| i[field].as_i64() == Some(id));
    if found { Ok(()) } else { Err(Refusal::bad(format!("no {field} {id} in the table"))) }
}

fn snapshot_ms(m: &Map<String, Value>, id: i64) -> Option<i64> {
    m.get("snapshots")?.as_array()?.iter().find(|s| s["snapshot-id"].as_i64() == Some(id))?["timestamp-ms"].as_i64()
}

/// The highest field id in a schema or type, nested fields, list elements and map keys and
/// values included.
fn highest_field_id(ty: &Value) -> i64 {
    let mut highest = 0;
    for field in ty["fields"].as_array().into_iter().flatten() {
        highest = highest.max(field["id"].as_i64().unwrap_or(0)).max(highest_field_id(&field["type"]));
    }
    for id in ["element-id", "key-id", "value-id"] {
        highest = highest.max(ty[id].as_i64().unwrap_or(0));
    }
    for nested in ["element", "key", "value"] {
        if ty[nested].is_object() {
            highest = highest.max(highest_field_id(&ty[nested]));
        }
    }
    highest
}

fn highest_partition_id(spec: &Value) -> i64 {
    spec["fields"].as_array().into_iter().flatten().filter_map(|f| f["field-id"].as_i64()).max().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> Value {
        let request = json!({"name": "t", "schema": {"type": "struct", "fields": [
            {"id": 1, "name": "id", "required": false, "type": "long"},
            {"id": 2, "name": "tags", "required": false, "type": {"type": "list", "element-id": 3,
                "element": "string", "element-required": false}}]}});
        new_table(&request, "file:///w/ns/t", "u-1", 10).unwrap()
    }

    fn snapshot(id: i64, sequence: i64) -> Value {
        json!({"action": "add-snapshot", "snapshot": {"snapshot-id": id, "sequence-number": sequence,
            "timestamp-ms": 20, "manifest-list": "file:///w/ns/t/metadata/snap.avro", "summary": {"operation": "append"}}})
    }

    #[test]
    fn a_new_table_counts_nested_field_ids_and_has_no_snapshot() {
        let t = table();
        assert_eq!((t["last-column-id"].clone(), t["last-partition-id"].clone()), (json!(3), json!(999)));
        assert!(t.get("current-snapshot-id").is_none() && t["snapshots"] == json!([]));
        assert!(new_table(&json!({"name": "t"}), "x", "u", 0).is_err());
    }

    #[test]
    fn a_snapshot_on_main_moves_the_table_and_logs_the_old_metadata() {
        let mut t = table();
        let updates = [
            snapshot(7, 1),
            json!({"action": "set-snapshot-ref", "ref-name": "main", "type": "branch", "snapshot-id": 7}),
            json!({"action": "set-properties", "updates": {"sluice.position.s": "{}"}}),
        ];
        apply(&mut t, &updates, "file:///w/ns/t/metadata/00000-a.metadata.json", 30).unwrap();
        assert_eq!(t["current-snapshot-id"], 7);
        assert_eq!(t["last-sequence-number"], 1);
        assert_eq!(t["refs"]["main"]["snapshot-id"], 7);
        assert_eq!(t["snapshot-log"][0], json!({"snapshot-id": 7, "timestamp-ms": 20}));
        assert_eq!(t["metadata-log"][0]["metadata-file"], "file:///w/ns/t/metadata/00000-a.metadata.json");
        assert_eq!(
            (t["properties"]["sluice.position.s"].clone(), t["last-updated-ms"].clone()),
            (json!("{}"), json!(30))
        );
        // The same snapshot again, or an older sequence number, is a conflict.
        assert_eq!(apply(&mut t.clone(), &[snapshot(7, 2)], "m", 40).unwrap_err().status, 409);
        assert_eq!(apply(&mut t.clone(), &[snapshot(8, 1)], "m", 40).unwrap_err().status, 409);
        let unnumbered = json!({"action": "add-snapshot", "snapshot": {"snapshot-id": 9, "timestamp-ms": 1}});
        assert_eq!(apply(&mut t.clone(), &[unnumbered], "m", 40).unwrap_err().status, 400);
        // Pointing main at the snapshot it is at already logs nothing; back at an older one
        // logs now, so the log stays in order.
        let main =
            |id: i64| json!({"action": "set-snapshot-ref", "ref-name": "main", "type": "branch", "snapshot-id": id});
        apply(&mut t, &[main(7)], "n", 50).unwrap();
        assert_eq!(t["snapshot-log"].as_array().unwrap().len(), 1);
        apply(&mut t, &[snapshot(8, 2), main(8)], "o", 60).unwrap();
        apply(&mut t, &[main(7)], "p", 70).unwrap();
        assert_eq!(t["snapshot-log"][2], json!({"snapshot-id": 7, "timestamp-ms": 70}));
        // A version 1 table (another writer's) is refused, not half upgraded.
        let mut v1 = json!({"format-version": 1, "schemas": []});
        assert_eq!(apply(&mut v1, &[snapshot(1, 1)], "q", 80).unwrap_err().status, 400);
    }

    #[test]
    fn requirements_hold_or_conflict() {
        let mut t = table();
        let main_at = |id: Value| json!({"type": "assert-ref-snapshot-id", "ref": "main", "snapshot-id": id});
        assert!(check(&t, &[main_at(Value::Null), json!({"type": "assert-table-uuid", "uuid": "u-1"})]).is_ok());
        assert_eq!(check(&t, &[json!({"type": "assert-table-uuid", "uuid": "u-2"})]).unwrap_err().status, 409);
        assert_eq!(check(&t, &[json!({"type": "assert-create"})]).unwrap_err().status, 409);
        assert_eq!(check(&t, &[json!({"type": "assert-anything"})]).unwrap_err().status, 400);
        let set = json!({"action": "set-snapshot-ref", "ref-name": "main", "type": "branch", "snapshot-id": 7});
        apply(&mut t, &[snapshot(7, 1), set], "m", 30).unwrap();
        assert!(check(&t, &[main_at(json!(7))]).is_ok());
        assert_eq!(check(&t, &[main_at(Value::Null)]).unwrap_err().status, 409);
    }

    /// DuckDB follows a create with the table's own schema, spec and order again: they are not
    /// added twice (a second copy of schema 0 as schema 1 made DuckDB's next schema clash).
    #[test]
    fn the_same_schema_again_keeps_its_id() {
        let mut t = table();
        let same = t["schemas"][0].clone();
        let updates = [
            json!({"action": "add-schema", "schema": same, "last-column-id": 3}),
            json!({"action": "set-current-schema", "schema-id": -1}),
            json!({"action": "add-spec", "spec": {"spec-id": 0, "fields": []}}),
            json!({"action": "add-sort-order", "sort-order": {"order-id": 0, "fields": []}}),
        ];
        apply(&mut t, &updates, "m", 30).unwrap();
        assert_eq!(t["schemas"].as_array().unwrap().len(), 1);
        assert_eq!(
            (t["partition-specs"].as_array().unwrap().len(), t["sort-orders"].as_array().unwrap().len()),
            (1, 1)
        );
        assert_eq!(t["current-schema-id"], 0);
    }

    #[test]
    fn a_new_schema_becomes_current_and_raises_the_last_column_id() {
        let mut t = table();
        let mut schema = t["schemas"][0].clone();
        schema["fields"]
            .as_array_mut()
            .unwrap()
            .push(json!({"id": 4, "name": "coupon", "required": false, "type": "string"}));
        let updates = [
            json!({"action": "add-schema", "schema": schema, "last-column-id": 4}),
            json!({"action": "set-current-schema", "schema-id": -1}),
        ];
        apply(&mut t, &updates, "m", 30).unwrap();
        assert_eq!((t["current-schema-id"].clone(), t["last-column-id"].clone()), (json!(1), json!(4)));
        assert_eq!(t["schemas"].as_array().unwrap().len(), 2);
        assert!(check(&t, &[json!({"type": "assert-current-schema-id", "current-schema-id": 1})]).is_ok());
        // Naming a schema the table does not have is a bad request.
        let wrong = [json!({"action": "set-current-schema", "schema-id": 9})];
        assert_eq!(apply(&mut t, &wrong, "m", 40).unwrap_err().status, 400);
    }

    #[test]
    fn expired_snapshots_leave_the_lists_and_their_refs() {
        let mut t = table();
        let set =
            |id: i64| json!({"action": "set-snapshot-ref", "ref-name": "main", "type": "branch", "snapshot-id": id});
        apply(&mut t, &[snapshot(1, 1), set(1)], "a", 20).unwrap();
        apply(&mut t, &[snapshot(2, 2), set(2)], "b", 30).unwrap();
        apply(&mut t, &[json!({"action": "remove-snapshots", "snapshot-ids": [1]})], "c", 40).unwrap();
        let ids: Vec<i64> =
            t["snapshots"].as_array().unwrap().iter().map(|s| s["snapshot-id"].as_i64().unwrap()).collect();
        assert_eq!(ids, vec![2]);
        assert_eq!(t["snapshot-log"].as_array().unwrap().len(), 1);
        assert_eq!((t["current-snapshot-id"].clone(), t["metadata-log"].as_array().unwrap().len()), (json!(2), 3));
    }
}
