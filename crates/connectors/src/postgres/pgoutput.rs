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
