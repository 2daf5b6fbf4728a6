"""Pure Raft core: election, replication, snapshots, membership. No I/O, clocks or randomness of its own."""
