//! The `pgoutput` logical replication messages (protocol version 1, text values), as the
//! PostgreSQL manual's "Logical Replication Message Formats" documents them.

/// A column of a relation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RelColumn {
    pub name: String,
    pub type_oid: u32,
    pub typmod: i32,
    pub key: bool,
}

/// A relation (table) as the stream describes it; sent before its first change and after DDL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Relation {
    pub id: u32,
    pub schema: String,
    pub name: String,
    pub columns: Vec<RelColumn>,
}

/// One column value of a tuple.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Cell {
    Null,
    /// A TOASTed value that did not change (not sent).
    Unchanged,
    Text(String),
}

/// A decoded message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Message {
    Relation(Relation),
    Insert {
        relation: u32,
        new: Vec<Cell>,
    },
    Update {
        relation: u32,
        old: Option<Vec<Cell>>,
        new: Vec<Cell>,
    },
    Delete {
        relation: u32,
        old: Vec<Cell>,
    },
    /// Anything else (truncate, type, origin, logical message): no row change by key.
    Other(u8),
}

struct Reader<'a> {
    data: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self.at.checked_add(n).filter(|e| *e <= self.data.len()).ok_or("pgoutput message ends early")?;
        let out = &self.data[self.at..end];
        self.at = end;
        Ok(out)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn i16(&mut self) -> Result<i16, String> {
        Ok(i16::from_be_bytes(self.take(2)?.try_into().map_err(|_| "short")?))
    }
    fn i32(&mut self) -> Result<i32, String> {
        Ok(i32::from_be_bytes(self.take(4)?.try_into().map_err(|_| "short")?))
    }
    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_be_bytes(self.take(4)?.try_into().map_err(|_| "short")?))
    }
    fn cstr(&mut self) -> Result<String, String> {
        let rest = &self.data[self.at..];
        let end = rest.iter().position(|b| *b == 0).ok_or("unterminated string")?;
        let s = String::from_utf8_lossy(&rest[..end]).into_owned();
        self.at += end + 1;
        Ok(s)
    }
    fn tuple(&mut self) -> Result<Vec<Cell>, String> {
        let n = self.i16()?;
        let mut cells = Vec::with_capacity(n.max(0) as usize);
        for _ in 0..n {
            cells.push(match self.u8()? {
                b'n' => Cell::Null,
                b'u' => Cell::Unchanged,
                b't' | b'b' => {
                    let len = self.i32()?;
                    let bytes = self.take(usize::try_from(len).map_err(|_| "negative length")?)?;
                    Cell::Text(String::from_utf8_lossy(bytes).into_owned())
                }
                other => return Err(format!("unknown tuple column kind {other}")),
            });
        }
        Ok(cells)
    }
}

/// Decode one pgoutput message.
pub(crate) fn decode(data: &[u8]) -> Result<Message, String> {
    let mut r = Reader { data, at: 0 };
    let kind = r.u8()?;
    Ok(match kind {
        b'R' => {
            let id = r.u32()?;
            let schema = r.cstr()?;
            let name = r.cstr()?;
            let _replica_identity = r.u8()?;
            let n = r.i16()?;
            let mut columns = Vec::with_capacity(n.max(0) as usize);
            for _ in 0..n {
                let flags = r.u8()?;
                let name = r.cstr()?;
                let type_oid = r.u32()?;
                let typmod = r.i32()?;
                columns.push(RelColumn { name, type_oid, typmod, key: flags & 1 == 1 });
            }
            Message::Relation(Relation { id, schema, name, columns })
        }
        b'I' => {
            let relation = r.u32()?;
            r.u8()?; // 'N'
            Message::Insert { relation, new: r.tuple()? }
        }
        b'U' => {
            let relation = r.u32()?;
            let mut old = None;
            let mut tag = r.u8()?;
            if tag == b'K' || tag == b'O' {
                old = Some(r.tuple()?);
                tag = r.u8()?;
            }
            if tag != b'N' {
                return Err("update without a new tuple".into());
            }
            Message::Update { relation, old, new: r.tuple()? }
        }
        b'D' => {
            let relation = r.u32()?;
            r.u8()?; // 'K' or 'O'
            Message::Delete { relation, old: r.tuple()? }
        }
        other => Message::Other(other),
    })
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// A message as PostgreSQL sends it.
    fn encode(m: &Message) -> Vec<u8> {
        fn cstr(out: &mut Vec<u8>, s: &str) {
            out.extend_from_slice(s.as_bytes());
            out.push(0);
        }
        fn tuple(out: &mut Vec<u8>, cells: &[Cell]) {
            out.extend_from_slice(&(cells.len() as i16).to_be_bytes());
            for cell in cells {
                match cell {
                    Cell::Null => out.push(b'n'),
                    Cell::Unchanged => out.push(b'u'),
                    Cell::Text(t) => {
                        out.push(b't');
                        out.extend_from_slice(&(t.len() as i32).to_be_bytes());
                        out.extend_from_slice(t.as_bytes());
                    }
                }
            }
        }
        let mut out = Vec::new();
        match m {
            Message::Relation(r) => {
                out.push(b'R');
                out.extend_from_slice(&r.id.to_be_bytes());
                cstr(&mut out, &r.schema);
                cstr(&mut out, &r.name);
                out.push(b'd');
                out.extend_from_slice(&(r.columns.len() as i16).to_be_bytes());
                for c in &r.columns {
                    out.push(u8::from(c.key));
                    cstr(&mut out, &c.name);
                    out.extend_from_slice(&c.type_oid.to_be_bytes());
                    out.extend_from_slice(&c.typmod.to_be_bytes());
                }
            }
            Message::Insert { relation, new } => {
                out.push(b'I');
                out.extend_from_slice(&relation.to_be_bytes());
                out.push(b'N');
                tuple(&mut out, new);
            }
            Message::Update { relation, old, new } => {
                out.push(b'U');
                out.extend_from_slice(&relation.to_be_bytes());
                if let Some(old) = old {
                    out.push(b'O');
                    tuple(&mut out, old);
                }
                out.push(b'N');
                tuple(&mut out, new);
            }
            Message::Delete { relation, old } => {
                out.push(b'D');
                out.extend_from_slice(&relation.to_be_bytes());
                out.push(b'K');
                tuple(&mut out, old);
            }
            Message::Other(kind) => out.push(*kind),
        }
        out
    }

    fn name() -> impl Strategy<Value = String> {
        proptest::collection::vec(any::<char>().prop_filter("no NUL", |c| *c != '\0'), 0..8)
            .prop_map(|c| c.into_iter().collect())
    }

    fn cells() -> impl Strategy<Value = Vec<Cell>> {
        let text = proptest::collection::vec(any::<char>(), 0..12).prop_map(|c| Cell::Text(c.into_iter().collect()));
        proptest::collection::vec(prop_oneof![Just(Cell::Null), Just(Cell::Unchanged), text], 0..6)
    }

    fn message() -> impl Strategy<Value = Message> {
        let column = (name(), any::<u32>(), any::<i32>(), any::<bool>())
            .prop_map(|(name, type_oid, typmod, key)| RelColumn { name, type_oid, typmod, key });
        prop_oneof![
            (any::<u32>(), name(), name(), proptest::collection::vec(column, 0..5))
                .prop_map(|(id, schema, name, columns)| Message::Relation(Relation { id, schema, name, columns })),
            (any::<u32>(), cells()).prop_map(|(relation, new)| Message::Insert { relation, new }),
            (any::<u32>(), proptest::option::of(cells()), cells()).prop_map(|(relation, old, new)| Message::Update {
                relation,
                old,
                new
            }),
            (any::<u32>(), cells()).prop_map(|(relation, old)| Message::Delete { relation, old }),
            proptest::sample::select(b"BCOTYM".to_vec()).prop_map(Message::Other),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::default() })]

        /// What PostgreSQL sends comes back as it was; cut short anywhere, it is an error.
        #[test]
        fn messages_round_trip(m in message(), cut in any::<usize>()) {
            let bytes = encode(&m);
            prop_assert_eq!(decode(&bytes), Ok(m.clone()));
            if !matches!(m, Message::Other(_)) {
                let cut = cut % bytes.len();
                prop_assert!(decode(&bytes[..cut]).is_err(), "a prefix of {} bytes decoded", cut);
            }
        }
    }
}
