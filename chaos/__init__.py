"""Chaos: the seeded simulator of the pure cores and the real-process fault harness."""
