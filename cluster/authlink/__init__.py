"""Authenticated node-to-node links: the shared handshake (handshake.py) and sealed frames (frames.py)."""
