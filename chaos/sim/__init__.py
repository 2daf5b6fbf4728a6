"""Deterministic single-process simulator driving the pure cores from one seed."""
