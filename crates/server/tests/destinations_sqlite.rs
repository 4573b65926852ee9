//! Streams into SQLite (filled in by the SQLite destination work).
