"""The common base of the AMQP 0-9-1 method classes and the `wire` decorator that gives each its wire layout.

`@wire(class_id, method_id, name, layout, synchronous)` parses the layout ("field:kind field:kind", `-` for a
reserved field) into the class's `WIRE` table and appends the class to `METHOD_CLASSES`, the registry the codec
compiles its encoders and decoders from (node/amqp/codec.py); the package's __init__ sorts it into spec order.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar, TypeVar

Wire = tuple[tuple[str | None, str], ...]


class Method:
    """Common base of every method class."""

    __slots__ = ()
    CLASS_ID: ClassVar[int]
    METHOD_ID: ClassVar[int]
    NAME: ClassVar[str]
    WIRE: ClassVar[Wire]
    HAS_CONTENT: ClassVar[bool] = False
    SYNCHRONOUS: ClassVar[bool] = False


M = TypeVar("M", bound=type[Method])

METHOD_CLASSES: list[type[Method]] = []


def wire(
    class_id: int, method_id: int, name: str, layout: str, synchronous: bool = False
) -> Callable[[M], M]:
    """Attach the wire layout ("field:kind field:kind", `-` for a reserved field) to a method class."""

    def attach(cls: M) -> M:
        fields: list[tuple[str | None, str]] = []
        for item in layout.split():
            field_name, kind = item.split(":")
            fields.append((None if field_name == "-" else field_name, kind))
        cls.CLASS_ID = class_id
        cls.METHOD_ID = method_id
        cls.NAME = name
        cls.WIRE = tuple(fields)
        cls.SYNCHRONOUS = synchronous
        METHOD_CLASSES.append(cls)
        return cls

    return attach
