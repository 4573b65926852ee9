//! A table's columns as the decoder knows them, and the changes that evolve them.

use foldhash::HashMap;

use serde::{Deserialize, Serialize};

use super::ColumnType;

/// One column.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Column {
    /// Name as created (any characters; always quoted in SQL).
    pub name: String,
    /// Type.
    pub ty: ColumnType,
}

/// DDL the sink applies before writing rows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum SchemaChange {
    /// Create the table with these columns.
    Create(Vec<Column>),
    /// Add a nullable column.
    Add(Column),
    /// Change a column's type to a wider one (BIGINT to DOUBLE).
    Widen(Column),
}

/// The columns of one table, in order. Lookups ignore ASCII case, as SQL identifiers in the
/// workspace do: `id` and `ID` are one column.
#[derive(Debug, Clone, Default)]
pub struct TableSchema {
    columns: Vec<Column>,
    index: HashMap<String, usize>,
    exists: bool,
}

impl TableSchema {
    /// A table that exists with these columns.
    pub fn existing(columns: Vec<Column>) -> Self {
        let mut schema = Self { exists: true, ..Self::default() };
        for column in columns {
            schema.push(column);
        }
        schema
    }

    /// Whether the table exists in the destination.
    pub fn exists(&self) -> bool {
        self.exists
    }

    /// Mark the table as created.
    pub fn set_exists(&mut self) {
        self.exists = true;
    }

    /// The columns in table order.
    pub fn columns(&self) -> &[Column] {
        &self.columns
    }

    /// Find a column by name (ASCII case-insensitive).
    pub fn find(&self, name: &str) -> Option<usize> {
        if let Some(i) = self.index.get(name) {
            return Some(*i);
        }
        self.index.get(&name.to_lowercase()).copied()
    }

    /// Add a column and return its index.
    pub fn push(&mut self, column: Column) -> usize {
        let i = self.columns.len();
        // A name finds its own column; another spelling finds the column named as its lower
        // case, else the first that folds to it (a table made elsewhere may hold names that
        // differ only in case).
        self.index.entry(column.name.to_lowercase()).or_insert(i);
        self.index.insert(column.name.clone(), i);
        self.columns.push(column);
        i
    }

    /// The same columns, and the same existence.
    pub fn same_as(&self, other: &Self) -> bool {
        self.exists == other.exists && self.columns == other.columns
    }

    /// Change a column's type.
    pub fn set_type(&mut self, i: usize, ty: ColumnType) {
        self.columns[i].ty = ty;
    }
}
