"""Headers-exchange matching (pure), following rabbit_exchange_type_headers.

A binding's arguments hold `x-match` ("all" default, "any", "all-with-x", "any-with-x") and the header values to
compare. Keys starting with "x-" are ignored unless the mode is one of the *-with-x variants. A binding value of
None (AMQP void) matches mere presence of the header. Otherwise the types must be of the same class (all integer
widths are one class, float and double another) and the values equal.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Any

_MODES = frozenset({"all", "any", "all-with-x", "any-with-x"})


def x_match_mode(args: Mapping[str, Any]) -> str | None:
    """The x-match mode of a binding, or None when the value is invalid."""
    mode = args.get("x-match", "all")
    if isinstance(mode, bytes):
        mode = mode.decode("utf-8", "replace")
    return mode if mode in _MODES else None


def _type_class(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, (str, bytes, bytearray)):
        return "longstr"
    if isinstance(value, Decimal):
        return "decimal"
    return type(value).__name__


def _norm(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "surrogateescape")
    return value


def _value_matches(pattern: Any, data: Any) -> bool:
    if pattern is None:
        return True
    if _type_class(pattern) != _type_class(data):
        return False
    return bool(_norm(pattern) == _norm(data))


def headers_match(binding_args: Mapping[str, Any], headers: Mapping[str, Any] | None) -> bool:
    mode = x_match_mode(binding_args) or "all"
    with_x = mode.endswith("-with-x")
    want_all = mode.startswith("all")
    data = headers or {}
    any_matched = False
    for key, pattern in binding_args.items():
        if key == "x-match" or (key.startswith("x-") and not with_x):
            continue
        if key in data and _value_matches(pattern, data[key]):
            any_matched = True
            if not want_all:
                return True
        elif want_all:
            return False
    return any_matched if not want_all else True
