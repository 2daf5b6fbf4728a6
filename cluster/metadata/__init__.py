"""Cluster metadata: the definitions every node shares, replicated by a pysyncobj Raft group.

`model` is the pure state machine (commands -> new state, outcome); `store` is the pysyncobj adapter bridged into
trio (`MetadataStore`). See docs/metadata.md.
"""
