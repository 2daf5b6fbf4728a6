"""Smoke test: every method class encodes and decodes back to itself with default values."""

from __future__ import annotations

import pytest

from node.amqp.codec import decode_method, encode_method
from node.amqp.methods import METHOD_CLASSES, Method


@pytest.mark.parametrize("cls", METHOD_CLASSES, ids=lambda c: c.NAME)
def test_default_round_trip(cls: type[Method]) -> None:
    method = cls()
    assert decode_method(encode_method(method)) == method
