"""Shovel links between brokers."""
