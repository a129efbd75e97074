"""Nacos gRPC message classes, built in a private descriptor pool.

The schema (``nacos_grpc_service.proto`` beside this file) has no package, so its messages are
called plainly ``Payload`` and ``Metadata``. The Nacos SDKs register those same names in
protobuf's default pool; building ours in a pool of our own lets the server, the load
generator and the real SDK live in one process without a duplicate-symbol error, and needs no
generated code.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import any_pb2, descriptor_pb2, descriptor_pool, message_factory

_FILE_NAME = "shoal/nacos_grpc_service.proto"


def _file_descriptor() -> descriptor_pb2.FileDescriptorProto:
    fdp = descriptor_pb2.FileDescriptorProto(
        name=_FILE_NAME, syntax="proto3", dependency=["google/protobuf/any.proto"]
    )
    F = descriptor_pb2.FieldDescriptorProto
    metadata = fdp.message_type.add(name="Metadata")
    metadata.field.add(name="type", number=3, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    metadata.field.add(name="clientIp", number=8, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    metadata.field.add(
        name="headers", number=7, type=F.TYPE_MESSAGE, label=F.LABEL_REPEATED,
        type_name=".Metadata.HeadersEntry",
    )
    entry = metadata.nested_type.add(name="HeadersEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    entry.field.add(name="value", number=2, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    payload = fdp.message_type.add(name="Payload")
    payload.field.add(
        name="metadata", number=2, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL, type_name=".Metadata"
    )
    payload.field.add(
        name="body", number=3, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL,
        type_name=".google.protobuf.Any",
    )
    return fdp


def _build() -> tuple[Any, Any]:
    pool = descriptor_pool.DescriptorPool()
    any_fdp = descriptor_pb2.FileDescriptorProto()
    any_pb2.DESCRIPTOR.CopyToProto(any_fdp)
    pool.Add(any_fdp)
    pool.Add(_file_descriptor())
    payload_cls = message_factory.GetMessageClass(pool.FindMessageTypeByName("Payload"))
    metadata_cls = message_factory.GetMessageClass(pool.FindMessageTypeByName("Metadata"))
    return payload_cls, metadata_cls


Payload, Metadata = _build()

__all__ = ["Payload", "Metadata"]
