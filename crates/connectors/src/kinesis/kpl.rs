//! Records aggregated by the Kinesis Producer Library: a magic number, a protobuf
//! `AggregatedRecord`, and the MD5 of that protobuf.

use bytes::Bytes;
use md5::{Digest, Md5};

/// The four bytes that open an aggregated record.
pub const KPL_MAGIC: [u8; 4] = [0xF3, 0x89, 0x9A, 0xC2];
const DIGEST_LEN: usize = 16;

/// The KPL's `AggregatedRecord` message.
#[derive(Clone, PartialEq, prost::Message)]
pub struct AggregatedRecord {
    /// Partition keys, referred to by index.
    #[prost(string, repeated, tag = "1")]
    pub partition_key_table: Vec<String>,
    /// Explicit hash keys, referred to by index.
    #[prost(string, repeated, tag = "2")]
    pub explicit_hash_key_table: Vec<String>,
    /// The user records.
    #[prost(message, repeated, tag = "3")]
    pub records: Vec<UserRecord>,
}

/// One user record inside an aggregate.
#[derive(Clone, PartialEq, prost::Message)]
pub struct UserRecord {
    /// Index into `partition_key_table`.
    #[prost(uint64, tag = "1")]
    pub partition_key_index: u64,
    /// Index into `explicit_hash_key_table`.
    #[prost(uint64, optional, tag = "2")]
    pub explicit_hash_key_index: Option<u64>,
    /// The record's data.
    #[prost(bytes = "bytes", tag = "3")]
    pub data: Bytes,
}

/// The user records inside `data` as (partition key, data), or `None` when `data` is not an
/// aggregate (no magic, or a digest that does not match, as the KCL does). An aggregate that
/// names a missing partition key gets the record's own key.
pub fn deaggregate(data: &[u8], record_key: &str) -> Option<Vec<(String, Bytes)>> {
    let body = data.strip_prefix(&KPL_MAGIC)?;
    if body.len() < DIGEST_LEN {
        return None;
    }
    let (message, digest) = body.split_at(body.len() - DIGEST_LEN);
    if Md5::digest(message).as_slice() != digest {
        return None;
    }
    let aggregate = <AggregatedRecord as prost::Message>::decode(message).ok()?;
    let out = aggregate
        .records
        .into_iter()
        .map(|r| {
            let key = usize::try_from(r.partition_key_index)
                .ok()
                .and_then(|i| aggregate.partition_key_table.get(i))
                .map_or_else(|| record_key.to_string(), Clone::clone);
            (key, r.data)
        })
        .collect();
    Some(out)
}

/// Build an aggregate of `records` (partition key, data) as the KPL does; for producers such as
/// `sluice bench-kinesis`.
pub fn aggregate(records: &[(&str, &[u8])]) -> Vec<u8> {
    let mut keys: Vec<String> = Vec::new();
    let mut users = Vec::with_capacity(records.len());
    for (key, data) in records {
        let index = keys.iter().position(|k| k == key).unwrap_or_else(|| {
            keys.push((*key).to_string());
            keys.len() - 1
        });
        users.push(UserRecord {
            partition_key_index: index as u64,
            explicit_hash_key_index: None,
            data: Bytes::copy_from_slice(data),
        });
    }
    let message = prost::Message::encode_to_vec(&AggregatedRecord {
        partition_key_table: keys,
        explicit_hash_key_table: Vec::new(),
        records: users,
    });
    let mut out = KPL_MAGIC.to_vec();
    out.extend_from_slice(&message);
    out.extend_from_slice(Md5::digest(&message).as_slice());
    out
}
