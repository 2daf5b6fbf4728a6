"""Multi-group Raft: a pure core (cluster.raft.core) plus storage and transport adapters."""
