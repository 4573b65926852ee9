//! The Avro that Iceberg's manifests and manifest lists are written in: an object container
//! file (header, schema, one block of records) with the few encodings they use. Written by
//! hand, as the Delta log is: the `apache-avro` crate would add a serde data model and a build
//! for the two record shapes a compaction writes.

/// Appends Avro's binary encodings of values to a record.
#[derive(Default)]
pub struct Record(Vec<u8>);

impl Record {
    /// A `long` or an `int`: zig-zag, then variable length.
    pub fn long(&mut self, v: i64) -> &mut Self {
        let mut n = ((v << 1) ^ (v >> 63)) as u64;
        while n >= 0x80 {
            self.0.push((n as u8 & 0x7f) | 0x80);
            n >>= 7;
        }
        self.0.push(n as u8);
        self
    }

    /// A `string` or `bytes`: its length, then its bytes.
    pub fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.long(b.len() as i64);
        self.0.extend_from_slice(b);
        self
    }

    /// A union's `null` branch, when `null` is its first branch.
    pub fn null(&mut self) -> &mut Self {
        self.long(0)
    }

    /// A union's second branch (`["null", T]`), whose value follows.
    pub fn some(&mut self) -> &mut Self {
        self.long(1)
    }
}

/// An object container file of `records`, written with `schema` and the file metadata `meta`.
pub fn container(schema: &str, meta: &[(&str, String)], records: &[Record]) -> Vec<u8> {
    let mut out = Record(b"Obj\x01".to_vec());
    out.long(meta.len() as i64 + 2);
    out.bytes(b"avro.schema").bytes(schema.as_bytes());
    out.bytes(b"avro.codec").bytes(b"null");
    for (key, value) in meta {
        out.bytes(key.as_bytes()).bytes(value.as_bytes());
    }
    out.long(0);
    let sync: [u8; 16] = rand::random();
    out.0.extend_from_slice(&sync);
    let size: usize = records.iter().map(|r| r.0.len()).sum();
    out.long(records.len() as i64).long(size as i64);
    for r in records {
        out.0.extend_from_slice(&r.0);
    }
    out.0.extend_from_slice(&sync);
    out.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn longs_are_zig_zag_varints() {
        let enc = |v| Record::default().long(v).0.clone();
        assert_eq!(enc(0), [0]);
        assert_eq!(enc(-1), [1]);
        assert_eq!(enc(1), [2]);
        assert_eq!(enc(-64), [0x7f]);
        assert_eq!(enc(64), [0x80, 0x01]);
        assert_eq!(enc(i64::MAX), [0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]);
        assert_eq!(Record::default().bytes(b"ab").0, [4, b'a', b'b']);
    }

    #[test]
    fn a_container_has_its_header_schema_and_one_block() {
        let mut r = Record::default();
        r.long(3);
        let file = container(r#""long""#, &[("k", "v".into())], &[r]);
        assert!(file.starts_with(b"Obj\x01\x06"));
        let header_end = file.len() - 16 - 3;
        assert_eq!(&file[header_end..header_end + 3], [2, 2, 6]);
        assert_eq!(file[header_end - 16..header_end], file[file.len() - 16..]);
    }
}
