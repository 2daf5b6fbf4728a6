"""How strong a cluster secret must be: the check `raftmq node` (config.cluster_layout) and `raftmq cluster` run.

The cluster secret keys every node-to-node link (metadata, queue Raft, mirrored fetch, the internal AMQP logins),
so a guessable one opens the cluster. `secret_weakness(secret)` names why a secret is refused, or returns None:
shorter than `CLUSTER_SECRET_BYTES_MIN` bytes, a known placeholder, fewer than `CLUSTER_SECRET_DISTINCT_MIN`
distinct characters, or below `CLUSTER_SECRET_BITS_MIN` bits by the simple estimate `secret_strength_bits`.
"""

from __future__ import annotations

import math

CLUSTER_SECRET_BYTES_MIN = 16
CLUSTER_SECRET_BITS_MIN = 128  # estimated strength (see `secret_weakness`)
CLUSTER_SECRET_DISTINCT_MIN = 8  # distinct characters
# Text that marks a placeholder rather than a secret (the example shipped before deploy/ generated secrets was
# "change-me-to-a-long-random-secret").
CLUSTER_SECRET_PLACEHOLDERS = ("change-me", "changeme", "change_me", "placeholder", "your-secret", "example")
_CHARACTER_CLASSES = (
    (26, str.islower),
    (26, str.isupper),
    (10, str.isdigit),
)
_OTHER_CHARACTERS = 33  # printable ASCII punctuation and space; anything else counts as this class too


def secret_strength_bits(secret: str) -> float:
    """A simple upper estimate of a secret's strength: its length times log2 of the size of the character classes
    it uses (lower case 26, upper case 26, digits 10, anything else 33). A random hex string of 32 characters
    scores 165 bits, `secrets.token_hex(32)` 331; "correcthorsebatterystaple" 118."""
    pool = sum(size for size, member in _CHARACTER_CLASSES if any(member(c) and c.isascii() for c in secret))
    if any(not (c.isascii() and c.isalnum()) for c in secret):
        pool += _OTHER_CHARACTERS
    return len(secret) * math.log2(pool) if pool else 0.0


def secret_weakness(secret: str) -> str | None:
    """Why `secret` is not acceptable as the cluster secret, or None: shorter than CLUSTER_SECRET_BYTES_MIN, a
    known placeholder, fewer than CLUSTER_SECRET_DISTINCT_MIN distinct characters, or below
    CLUSTER_SECRET_BITS_MIN bits by `secret_strength_bits`."""
    lowered = secret.lower()
    marker = next((m for m in CLUSTER_SECRET_PLACEHOLDERS if m in lowered), None)
    if len(secret.encode()) < CLUSTER_SECRET_BYTES_MIN:
        return f"it is shorter than {CLUSTER_SECRET_BYTES_MIN} bytes"
    if marker is not None:
        return f"it is a placeholder (it contains {marker!r})"
    if len(set(secret)) < CLUSTER_SECRET_DISTINCT_MIN:
        return f"it has fewer than {CLUSTER_SECRET_DISTINCT_MIN} distinct characters"
    bits = secret_strength_bits(secret)
    if bits < CLUSTER_SECRET_BITS_MIN:
        return f"it is too guessable (about {bits:.0f} bits estimated, at least {CLUSTER_SECRET_BITS_MIN} needed)"
    return None
