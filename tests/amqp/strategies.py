"""Hypothesis strategies for AMQP values: method instances, field tables, properties."""

from __future__ import annotations

import dataclasses
import datetime
import decimal
from typing import Any

from hypothesis import strategies as st

from node.amqp.methods import Method
from node.amqp.properties import BasicProperties

utf8_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=20)
short_text = utf8_text.filter(lambda s: len(s.encode()) <= 255)

names = st.from_regex(r"[a-zA-Z0-9_.:-]{0,30}", fullmatch=True)
int_values = st.integers(-(2**63), 2**63 - 1)
decimals = st.builds(
    lambda mantissa, scale: decimal.Decimal(mantissa).scaleb(-scale),
    st.integers(-(2**31), 2**31 - 1),
    st.integers(0, 12),
)
timestamps = st.integers(0, 4_000_000_000).map(
    lambda s: datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC) + datetime.timedelta(seconds=s)
)


def field_values(pamqp_compatible: bool) -> st.SearchStrategy[Any]:
    scalars: list[st.SearchStrategy[Any]] = [
        st.booleans(),
        int_values,
        utf8_text,
        decimals,
        timestamps,
        st.none(),
        st.binary(max_size=20).map(bytearray),
    ]
    if not pamqp_compatible:
        scalars.append(st.floats(allow_nan=False))
    return st.recursive(
        st.one_of(scalars),
        lambda children: st.one_of(
            st.lists(children, max_size=4), _dicts(children, pamqp_compatible, max_size=4)
        ),
        max_leaves=6,
    )


def _dicts(
    values: st.SearchStrategy[Any], sort_keys: bool, max_size: int
) -> st.SearchStrategy[dict[str, Any]]:
    tables = st.dictionaries(short_text, values, max_size=max_size)
    # pamqp writes table keys sorted; we keep insertion order. Sorted input makes both agree.
    return tables.map(lambda d: dict(sorted(d.items()))) if sort_keys else tables


def field_tables(pamqp_compatible: bool = False) -> st.SearchStrategy[dict[str, Any]]:
    return _dicts(field_values(pamqp_compatible), pamqp_compatible, max_size=5)


_KIND_STRATEGIES: dict[str, st.SearchStrategy[Any]] = {
    "octet": st.integers(0, 255),
    "short": st.integers(0, 65535),
    "long": st.integers(0, 2**32 - 1),
    "longlong": st.integers(0, 2**64 - 1),
    "shortstr": short_text,
    "longstr": utf8_text.map(str.encode),
    "text": utf8_text,
    "bit": st.booleans(),
}


def methods(cls: type[Method], pamqp_compatible: bool = False) -> st.SearchStrategy[Method]:
    kinds = {name: kind for name, kind in cls.WIRE if name is not None}
    fields = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        kind = kinds[f.name]
        if kind == "table":
            fields[f.name] = field_tables(pamqp_compatible)
        elif kind == "longlong" and pamqp_compatible:
            fields[f.name] = st.integers(0, 2**63 - 1)  # pamqp packs longlong as signed
        elif kind == "shortstr" and pamqp_compatible:
            fields[f.name] = names  # pamqp validates exchange/queue names against the spec's domain regex
        else:
            fields[f.name] = _KIND_STRATEGIES[kind]
    return st.builds(cls, **fields)


def properties(pamqp_compatible: bool = False) -> st.SearchStrategy[BasicProperties]:
    maybe = st.none
    return st.builds(
        BasicProperties,
        content_type=short_text | maybe(),
        content_encoding=short_text | maybe(),
        headers=field_tables(pamqp_compatible) | maybe(),
        delivery_mode=st.integers(0, 255) | maybe(),
        priority=st.integers(0, 255) | maybe(),
        correlation_id=short_text | maybe(),
        reply_to=short_text | maybe(),
        expiration=short_text | maybe(),
        message_id=short_text | maybe(),
        timestamp=st.integers(0, 2**40) | maybe(),
        type=short_text | maybe(),
        user_id=short_text | maybe(),
        app_id=short_text | maybe(),
        cluster_id=short_text | maybe(),
    )
