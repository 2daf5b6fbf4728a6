"""CPU cost of sealing node-to-node frames (cluster/authlink/frames.py) against plain length framing.

    .venv/bin/python -m bench.micro.frame_auth [--rounds 5] [--seconds 0.5]

For each payload size: microseconds per frame to frame it plainly (4-byte length + payload, what the transport did
before frames were authenticated) and to seal it and open it again (sequence number + AES-256-GCM both ways: what
one frame now costs its sender plus its receiver). Best of `--rounds`; prints one JSON line per size.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

from cluster.authlink.frames import FrameOpener, FrameSealer, session_keys

SIZES = (64, 512, 4096, 65536, 1 << 20)


def _per_call_us(fn: Callable[[], object], seconds: float) -> float:
    calls = 0
    start = time.perf_counter()
    deadline = start + seconds
    while True:
        for _ in range(100):
            fn()
        calls += 100
        now = time.perf_counter()
        if now >= deadline:
            return (now - start) / calls * 1e6


def measure(size: int, rounds: int, seconds: float) -> dict[str, float]:
    payload = bytes(size)
    keys = session_keys(b"bench-secret-0123456789abcdef", b"l" * 16, b"d" * 16, "n1", "n2", dialer_side=True)
    plain = min(_per_call_us(lambda: len(payload).to_bytes(4, "big") + payload, seconds) for _ in range(rounds))

    sealer, opener = FrameSealer(keys.send), FrameOpener(keys.send)

    def seal_open() -> None:
        opener.open(sealer.seal(payload)[4:])

    sealed = min(_per_call_us(seal_open, seconds) for _ in range(rounds))
    return {"payload_bytes": size, "plain_us": round(plain, 3), "seal_open_us": round(sealed, 3),
            "overhead_us": round(sealed - plain, 3), "mb_per_s_sealed": round(size / sealed, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.micro.frame_auth", description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=0.5)
    args = parser.parse_args(argv)
    for size in SIZES:
        print(json.dumps(measure(size, args.rounds, args.seconds)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
