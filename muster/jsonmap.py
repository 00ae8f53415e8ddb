"""Muster's JSON mapping of its API messages: protobuf's canonical JSON (proto field names) with
every field present (zeros, empty lists and maps too) and enum values in their short form
(``JOB_PHASE_RUNNING`` -> ``Running``, ``TASK_STATUS_NOT_READY`` -> ``NotReady``), the spelling the
tables, ``--phase`` and ``muster simulate`` use. The CLI's ``-o json`` is exactly this."""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, EnumDescriptor, FieldDescriptor
from google.protobuf.message import Message


def short_enum_name(enum: EnumDescriptor, number: int) -> str:
    """``JOB_PHASE_RUNNING`` of enum ``JobPhase`` -> ``Running``; unknown numbers stay numbers."""
    value = enum.values_by_number.get(number)
    if value is None:
        return str(number)
    prefix = _upper_snake(enum.name) + "_"
    name = value.name.removeprefix(prefix)
    return "".join(word.capitalize() for word in name.split("_"))


def _upper_snake(name: str) -> str:
    out = []
    for i, ch in enumerate(name):
        if ch.isupper() and i and not name[i - 1].isupper():
            out.append("_")
        out.append(ch.upper())
    return "".join(out)


def to_json_dict(message: Message) -> dict[str, Any]:
    data = json_format.MessageToDict(
        message,
        preserving_proto_field_name=True,
        always_print_fields_with_no_presence=True,
        use_integers_for_enums=True,
    )
    # types-protobuf types DESCRIPTOR as the pure-Python or the upb Descriptor; both have the
    # fields/message_type/enum_type interface _shorten reads, but only the first is public to name.
    _shorten(message.DESCRIPTOR, data)  # type: ignore[arg-type]
    return data


def _shorten(descriptor: Descriptor, data: dict[str, Any]) -> None:
    for field in descriptor.fields:
        if field.name not in data:
            continue
        value = data[field.name]
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            value_field = field.message_type.fields_by_name["value"]
            for key, item in value.items():
                value[key] = _convert(value_field, item)
        elif field.is_repeated:
            data[field.name] = [_convert(field, item) for item in value]
        else:
            data[field.name] = _convert(field, value)


def _convert(field: FieldDescriptor, value: Any) -> Any:
    if field.enum_type is not None and isinstance(value, int):
        return short_enum_name(field.enum_type, value)
    if (
        field.message_type is not None
        and isinstance(value, dict)
        and field.message_type.full_name.startswith("muster.")
    ):
        _shorten(field.message_type, value)
    return value
