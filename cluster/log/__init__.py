"""Log storage: append-only segments with indexes and a shared write-ahead log with group commit."""
