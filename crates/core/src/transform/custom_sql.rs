//! Custom SQL for SQL destinations: blocks of the user's statements per source table, run
//! for each event in place of Sluice's own insert or merge.
//!
//! ```sql
//! -- @sql key=customers
//! INSERT INTO crm.customers (id, name) VALUES ({id}, {name})
//! ON CONFLICT (id) DO UPDATE SET name = excluded.name
//! -- @end
//! -- @sql key=orders dependsOn=customers
//! INSERT INTO crm.orders (id, customer_id) VALUES ({id}, {customer_id})
//! -- @end
//! ```
//!
//! `{column}` becomes a bind variable (never text spliced into the SQL), `{debezium_cdc_op}`
//! the change's op (`c`, `u`, `d`, `r`). Within a unit, changes run parents before children
//! (`dependsOn`), and deletes after them, children before parents.

use std::collections::HashMap;

/// What a bind variable takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Param {
    /// The event's value of a column (NULL when it has none).
    Column(String),
    /// The change's op.
    Op,
}

#[derive(Debug, Clone, PartialEq)]
enum Part {
    Text(String),
    Bind(Param),
}

/// One `-- @sql` block.
#[derive(Debug, Clone, PartialEq)]
pub struct Block {
    /// The source table whose events it runs for.
    pub key: String,
    /// Blocks whose events run first.
    pub depends_on: Vec<String>,
    parts: Vec<Part>,
}

impl Block {
    /// The statement with bind placeholders (`$1`, `$2`… when `numbered`, else `?`), and what
    /// each placeholder takes.
    pub fn render(&self, numbered: bool) -> (String, Vec<Param>) {
        let mut sql = String::new();
        let mut params = Vec::new();
        for part in &self.parts {
            match part {
                Part::Text(text) => sql.push_str(text),
                Part::Bind(param) => {
                    params.push(param.clone());
                    if numbered {
                        sql.push_str(&format!("${}", params.len()));
                    } else {
                        sql.push('?');
                    }
                }
            }
        }
        (sql, params)
    }
}

/// A parsed template: its blocks, parents before children.
#[derive(Debug, Clone, PartialEq)]
pub struct CustomSql {
    blocks: Vec<Block>,
}

/// The op token.
const OP: &str = "debezium_cdc_op";

impl CustomSql {
    /// Parse a template; the problem as text, with its line.
    pub fn parse(template: &str) -> Result<Self, String> {
        let mut blocks: Vec<Block> = Vec::new();
        let mut open: Option<(usize, Block, String)> = None;
        for (n, line) in template.lines().enumerate() {
            let n = n + 1;
            let directive = line.trim().strip_prefix("--").map(str::trim).filter(|d| d.starts_with('@'));
            match (directive, open.as_mut()) {
                (Some(d), None) if d.starts_with("@sql") => {
                    let block = header(&d["@sql".len()..]).map_err(|e| format!("line {n}: {e}"))?;
                    open = Some((n, block, String::new()));
                }
                (Some("@end"), Some(_)) => {
                    let (start, mut block, body) = open.take().expect("open");
                    if body.trim().is_empty() {
                        return Err(format!("line {start}: block `{}` has no statement", block.key));
                    }
                    block.parts =
                        body_parts(&body).map_err(|e| format!("block `{}` (line {start}): {e}", block.key))?;
                    if blocks.iter().any(|b| b.key.eq_ignore_ascii_case(&block.key)) {
                        return Err(format!("line {start}: a second block for key `{}`", block.key));
                    }
                    blocks.push(block);
                }
                (Some(d), _) => return Err(format!("line {n}: `{d}` is not expected here")),
                (None, Some((_, _, body))) => {
                    body.push_str(line);
                    body.push('\n');
                }
                (None, None) if line.trim().is_empty() || line.trim().starts_with("--") => {}
                (None, None) => return Err(format!("line {n}: SQL outside a `-- @sql key=…` … `-- @end` block")),
            }
        }
        if let Some((start, block, _)) = open {
            return Err(format!("line {start}: block `{}` has no `-- @end`", block.key));
        }
        if blocks.is_empty() {
            return Err("no `-- @sql key=<source table>` block".into());
        }
        Ok(Self { blocks: order(blocks)? })
    }

    /// The blocks, each after the blocks it depends on.
    pub fn blocks(&self) -> &[Block] {
        &self.blocks
    }

    /// The block for events of `table` (names match without regard to case).
    pub fn block(&self, table: &str) -> Option<&Block> {
        self.blocks.iter().find(|b| b.key.eq_ignore_ascii_case(table))
    }
}

/// `key=<table> dependsOn=<a>,<b>`.
fn header(rest: &str) -> Result<Block, String> {
    let mut key = None;
    let mut depends_on = Vec::new();
    for word in rest.split_whitespace() {
        match word.split_once('=') {
            Some(("key", v)) if !v.is_empty() => key = Some(v.to_string()),
            Some(("dependsOn", v)) => depends_on.extend(v.split(',').filter(|s| !s.is_empty()).map(str::to_string)),
            _ => return Err(format!("`{word}`: expected key=<source table> and optionally dependsOn=<key>[,<key>]")),
        }
    }
    let key = key.ok_or("a block needs key=<source table>")?;
    Ok(Block { key, depends_on, parts: Vec::new() })
}

/// The statement's text and binds. `{{` and `}}` are a literal `{` and `}`.
fn body_parts(body: &str) -> Result<Vec<Part>, String> {
    let mut parts = Vec::new();
    let mut text = String::new();
    let mut quote: Option<char> = None;
    let mut chars = body.chars().peekable();
    while let Some(c) = chars.next() {
        match (quote, c) {
            (Some(q), c) if c == q => {
                quote = None;
                text.push(c);
            }
            (_, '{') if chars.peek() == Some(&'{') => {
                chars.next();
                text.push('{');
            }
            (_, '}') if chars.peek() == Some(&'}') => {
                chars.next();
                text.push('}');
            }
            (Some(_), '{') if chars.peek().is_some_and(|n| n.is_ascii_alphanumeric() || *n == '_') => {
                return Err("a `{column}` inside quotes would be text, not a bind: write it without quotes".into());
            }
            (Some(_), c) => text.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                text.push(c);
            }
            (None, '{') => {
                let mut name = String::new();
                for n in chars.by_ref() {
                    if n == '}' {
                        break;
                    }
                    name.push(n);
                }
                let name = name.trim();
                if name.is_empty() || name.len() > 255 || name.contains(['{', '\'', '"', ';']) {
                    return Err(format!("`{{{name}}}` does not name a column"));
                }
                if !text.is_empty() {
                    parts.push(Part::Text(std::mem::take(&mut text)));
                }
                parts.push(Part::Bind(if name == OP { Param::Op } else { Param::Column(name.to_string()) }));
            }
            (None, c) => text.push(c),
        }
    }
    if quote.is_some() {
        return Err("a quote is not closed".into());
    }
    if !text.is_empty() {
        parts.push(Part::Text(text));
    }
    Ok(parts)
}

/// Parents before children; an unknown key or a cycle is refused.
fn order(blocks: Vec<Block>) -> Result<Vec<Block>, String> {
    let index: HashMap<String, usize> = blocks.iter().enumerate().map(|(i, b)| (b.key.to_lowercase(), i)).collect();
    for b in &blocks {
        if let Some(d) = b.depends_on.iter().find(|d| !index.contains_key(&d.to_lowercase())) {
            return Err(format!("block `{}` depends on `{d}`, which has no block", b.key));
        }
    }
    // 0: not seen, 1: on the current path, 2: placed.
    let mut state = vec![0u8; blocks.len()];
    let mut placed = Vec::with_capacity(blocks.len());
    fn visit(
        i: usize,
        blocks: &[Block],
        index: &HashMap<String, usize>,
        state: &mut [u8],
        placed: &mut Vec<usize>,
        path: &mut Vec<String>,
    ) -> Result<(), String> {
        match state[i] {
            2 => return Ok(()),
            1 => {
                path.push(blocks[i].key.clone());
                return Err(format!("the blocks depend on each other in a cycle: {}", path.join(" → ")));
            }
            _ => {}
        }
        state[i] = 1;
        path.push(blocks[i].key.clone());
        for d in &blocks[i].depends_on {
            visit(index[&d.to_lowercase()], blocks, index, state, placed, path)?;
        }
        path.pop();
        state[i] = 2;
        placed.push(i);
        Ok(())
    }
    for i in 0..blocks.len() {
        visit(i, &blocks, &index, &mut state, &mut placed, &mut Vec::new())?;
    }
    let mut slots: Vec<Option<Block>> = blocks.into_iter().map(Some).collect();
    Ok(placed.into_iter().filter_map(|i| slots[i].take()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEMPLATE: &str = "-- orders need their customer first\n\
        -- @sql key=orders dependsOn=customers\n\
        INSERT INTO o (id, c, note) VALUES ({id}, {customer_id}, 'a {{literal}}')\n\
        -- @end\n\
        -- @sql key=customers\n\
        INSERT INTO c (id, name, op) VALUES ({id}, {name}, {debezium_cdc_op})\n\
        -- @end\n";

    #[test]
    fn blocks_are_ordered_parents_first_with_binds_in_place_of_tokens() {
        let sql = CustomSql::parse(TEMPLATE).unwrap();
        let keys: Vec<&str> = sql.blocks().iter().map(|b| b.key.as_str()).collect();
        assert_eq!(keys, ["customers", "orders"]);
        let (text, params) = sql.block("CUSTOMERS").unwrap().render(true);
        assert_eq!(text.trim(), "INSERT INTO c (id, name, op) VALUES ($1, $2, $3)");
        assert_eq!(params, [Param::Column("id".into()), Param::Column("name".into()), Param::Op]);
        let (text, _) = sql.block("orders").unwrap().render(false);
        assert_eq!(text.trim(), "INSERT INTO o (id, c, note) VALUES (?, ?, 'a {literal}')");
    }

    #[test]
    fn cycles_unknown_keys_and_quoted_tokens_are_refused() {
        let cycle = "-- @sql key=a dependsOn=b\nSELECT 1\n-- @end\n-- @sql key=b dependsOn=a\nSELECT 1\n-- @end";
        assert!(CustomSql::parse(cycle).unwrap_err().contains("cycle"));
        let unknown = "-- @sql key=a dependsOn=zz\nSELECT 1\n-- @end";
        assert!(CustomSql::parse(unknown).unwrap_err().contains("`zz`, which has no block"));
        let quoted = "-- @sql key=a\nINSERT INTO t VALUES ('{name}')\n-- @end";
        assert!(CustomSql::parse(quoted).unwrap_err().contains("inside quotes"));
        let outside = "DELETE FROM t\n-- @sql key=a\nSELECT 1\n-- @end";
        assert!(CustomSql::parse(outside).unwrap_err().contains("line 1"));
        let unclosed = "-- @sql key=a\nSELECT 1\n";
        assert!(CustomSql::parse(unclosed).unwrap_err().contains("no `-- @end`"));
        assert!(CustomSql::parse("-- just a comment").unwrap_err().contains("no `-- @sql"));
    }
}
