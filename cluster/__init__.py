"""Cluster: queue state machine, log storage, metadata, Raft, mirrored queues, federation, shovel."""
