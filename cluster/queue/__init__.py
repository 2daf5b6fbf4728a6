"""The pure queue state machine shared by classic, quorum and mirrored queues."""
