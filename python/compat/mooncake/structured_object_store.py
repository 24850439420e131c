"""mooncake.structured_object_store — Mooncake's structured object store on
the drop-in: MooncakeBundleTransfer (bundles, structured objects, DataProto
stages and their handles; kvengine.mooncake_bundle) and the structure and
codec inference (kvengine.mooncake_structured). What is left out is listed
in the README's Mooncake section."""
from kvengine.mooncake_structured import (MAX_DEPTH, MISSING, CodecDecision,  # noqa: F401
                                          LeafSpec, NodeSpec, _choose_leaf_codec,
                                          _escape_key, infer_structure)
from kvengine.mooncake_bundle import (  # noqa: F401
    AUTO_PARALLEL_MIN_BYTES, AUTO_PARALLEL_MIN_CHUNKS, DATAPROTO_REF_HANDLE_TYPE,
    DATAPROTO_REF_HANDLE_VERSION, DEFAULT_BUNDLE_CHUNK_BYTES, MISSING_OBJECT_ERROR,
    STORAGE_GROUP_ID, STRUCTURED_FIELD_SPECS_KEY, BundleTransferPolicy, FieldSchema,
    MooncakeBundleTransfer, MooncakeDataProtoRef, RemoteBundleRef, StructuredFieldLocation,
    StructuredMemberSlice, StructuredObjectPayload, StructuredObjectReadSpec,
    StructuredObjectResult, export_dataproto_ref, export_ref, import_dataproto_ref,
    import_ref, is_dataproto_ref_handle, raw_destination, tensor_object_buffer,
    _config_for_grouped_keys, _decode_manifest, _decode_msgpack_ragged_values,
    _encode_manifest, _encode_msgpack_ragged_values, _encode_with_schema)

__all__ = ["MISSING", "CodecDecision", "LeafSpec", "NodeSpec", "infer_structure",
           "BundleTransferPolicy", "FieldSchema", "MooncakeBundleTransfer",
           "MooncakeDataProtoRef", "RemoteBundleRef", "StructuredFieldLocation",
           "StructuredMemberSlice", "StructuredObjectPayload", "StructuredObjectReadSpec",
           "StructuredObjectResult", "export_dataproto_ref", "export_ref",
           "import_dataproto_ref", "import_ref", "is_dataproto_ref_handle",
           "raw_destination", "tensor_object_buffer"]
