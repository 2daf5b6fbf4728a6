"""Mirrored queues: in-sync replica sets, high watermark and leader epochs."""
