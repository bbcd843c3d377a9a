from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Encoding(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ENCODING_UNSPECIFIED: _ClassVar[Encoding]
    ENCODING_FP32: _ClassVar[Encoding]
    ENCODING_INT8: _ClassVar[Encoding]
    ENCODING_INT8_HUFFMAN: _ClassVar[Encoding]
    ENCODING_INT4_HUFFMAN: _ClassVar[Encoding]
    ENCODING_TERNARY_HUFFMAN: _ClassVar[Encoding]
    ENCODING_SIGN: _ClassVar[Encoding]
    ENCODING_TOPK: _ClassVar[Encoding]

class ChunkKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CHUNK_KIND_UNSPECIFIED: _ClassVar[ChunkKind]
    CHUNK_KIND_MODEL: _ClassVar[ChunkKind]
    CHUNK_KIND_DELTA: _ClassVar[ChunkKind]
    CHUNK_KIND_UPDATE: _ClassVar[ChunkKind]

class Role(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ROLE_UNSPECIFIED: _ClassVar[Role]
    ROLE_CRITICAL: _ClassVar[Role]
    ROLE_EMBEDDING: _ClassVar[Role]
    ROLE_ATTENTION: _ClassVar[Role]
    ROLE_MLP: _ClassVar[Role]
    ROLE_OTHER: _ClassVar[Role]

class LaneItem(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LANE_ITEM_UNSPECIFIED: _ClassVar[LaneItem]
    LANE_ITEM_MANIFEST: _ClassVar[LaneItem]
    LANE_ITEM_CHUNK: _ClassVar[LaneItem]
    LANE_ITEM_PARITY: _ClassVar[LaneItem]
ENCODING_UNSPECIFIED: Encoding
ENCODING_FP32: Encoding
ENCODING_INT8: Encoding
ENCODING_INT8_HUFFMAN: Encoding
ENCODING_INT4_HUFFMAN: Encoding
ENCODING_TERNARY_HUFFMAN: Encoding
ENCODING_SIGN: Encoding
ENCODING_TOPK: Encoding
CHUNK_KIND_UNSPECIFIED: ChunkKind
CHUNK_KIND_MODEL: ChunkKind
CHUNK_KIND_DELTA: ChunkKind
CHUNK_KIND_UPDATE: ChunkKind
ROLE_UNSPECIFIED: Role
ROLE_CRITICAL: Role
ROLE_EMBEDDING: Role
ROLE_ATTENTION: Role
ROLE_MLP: Role
ROLE_OTHER: Role
LANE_ITEM_UNSPECIFIED: LaneItem
LANE_ITEM_MANIFEST: LaneItem
LANE_ITEM_CHUNK: LaneItem
LANE_ITEM_PARITY: LaneItem

class Chunk(_message.Message):
    __slots__ = ("kind", "round", "index", "count", "tensor", "offset", "length", "encoding", "quant_block", "scales", "payload", "crc32")
    KIND_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    TENSOR_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    ENCODING_FIELD_NUMBER: _ClassVar[int]
    QUANT_BLOCK_FIELD_NUMBER: _ClassVar[int]
    SCALES_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    CRC32_FIELD_NUMBER: _ClassVar[int]
    kind: ChunkKind
    round: int
    index: int
    count: int
    tensor: str
    offset: int
    length: int
    encoding: Encoding
    quant_block: int
    scales: bytes
    payload: bytes
    crc32: int
    def __init__(self, kind: _Optional[_Union[ChunkKind, str]] = ..., round: _Optional[int] = ..., index: _Optional[int] = ..., count: _Optional[int] = ..., tensor: _Optional[str] = ..., offset: _Optional[int] = ..., length: _Optional[int] = ..., encoding: _Optional[_Union[Encoding, str]] = ..., quant_block: _Optional[int] = ..., scales: _Optional[bytes] = ..., payload: _Optional[bytes] = ..., crc32: _Optional[int] = ...) -> None: ...

class ManifestEntry(_message.Message):
    __slots__ = ("index", "tensor", "offset", "length", "role", "energy", "importance", "nbytes", "crc32", "parity_group")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    TENSOR_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    ENERGY_FIELD_NUMBER: _ClassVar[int]
    IMPORTANCE_FIELD_NUMBER: _ClassVar[int]
    NBYTES_FIELD_NUMBER: _ClassVar[int]
    CRC32_FIELD_NUMBER: _ClassVar[int]
    PARITY_GROUP_FIELD_NUMBER: _ClassVar[int]
    index: int
    tensor: str
    offset: int
    length: int
    role: Role
    energy: float
    importance: float
    nbytes: int
    crc32: int
    parity_group: int
    def __init__(self, index: _Optional[int] = ..., tensor: _Optional[str] = ..., offset: _Optional[int] = ..., length: _Optional[int] = ..., role: _Optional[_Union[Role, str]] = ..., energy: _Optional[float] = ..., importance: _Optional[float] = ..., nbytes: _Optional[int] = ..., crc32: _Optional[int] = ..., parity_group: _Optional[int] = ...) -> None: ...

class DeltaManifest(_message.Message):
    __slots__ = ("round", "tokens", "steps", "chunks")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    round: int
    tokens: int
    steps: int
    chunks: _containers.RepeatedCompositeFieldContainer[ManifestEntry]
    def __init__(self, round: _Optional[int] = ..., tokens: _Optional[int] = ..., steps: _Optional[int] = ..., chunks: _Optional[_Iterable[_Union[ManifestEntry, _Mapping]]] = ...) -> None: ...

class DeltaParity(_message.Message):
    __slots__ = ("round", "group", "payload")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    round: int
    group: int
    payload: bytes
    def __init__(self, round: _Optional[int] = ..., group: _Optional[int] = ..., payload: _Optional[bytes] = ...) -> None: ...

class LaneOpen(_message.Message):
    __slots__ = ("site", "token", "lane")
    SITE_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    LANE_FIELD_NUMBER: _ClassVar[int]
    site: str
    token: str
    lane: int
    def __init__(self, site: _Optional[str] = ..., token: _Optional[str] = ..., lane: _Optional[int] = ...) -> None: ...

class LaneAck(_message.Message):
    __slots__ = ("round", "item", "index")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    ITEM_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    round: int
    item: LaneItem
    index: int
    def __init__(self, round: _Optional[int] = ..., item: _Optional[_Union[LaneItem, str]] = ..., index: _Optional[int] = ...) -> None: ...

class Join(_message.Message):
    __slots__ = ("site", "protocol_version", "resume_round", "resume_hash", "device", "token")
    SITE_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    RESUME_ROUND_FIELD_NUMBER: _ClassVar[int]
    RESUME_HASH_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    site: str
    protocol_version: int
    resume_round: int
    resume_hash: str
    device: str
    token: str
    def __init__(self, site: _Optional[str] = ..., protocol_version: _Optional[int] = ..., resume_round: _Optional[int] = ..., resume_hash: _Optional[str] = ..., device: _Optional[str] = ..., token: _Optional[str] = ...) -> None: ...

class Welcome(_message.Message):
    __slots__ = ("run_id", "site_index", "config_json", "round", "model_hash", "model_chunks", "data_position", "shard_index", "shard_count")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    SITE_INDEX_FIELD_NUMBER: _ClassVar[int]
    CONFIG_JSON_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    MODEL_HASH_FIELD_NUMBER: _ClassVar[int]
    MODEL_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    DATA_POSITION_FIELD_NUMBER: _ClassVar[int]
    SHARD_INDEX_FIELD_NUMBER: _ClassVar[int]
    SHARD_COUNT_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    site_index: int
    config_json: str
    round: int
    model_hash: str
    model_chunks: int
    data_position: int
    shard_index: int
    shard_count: int
    def __init__(self, run_id: _Optional[str] = ..., site_index: _Optional[int] = ..., config_json: _Optional[str] = ..., round: _Optional[int] = ..., model_hash: _Optional[str] = ..., model_chunks: _Optional[int] = ..., data_position: _Optional[int] = ..., shard_index: _Optional[int] = ..., shard_count: _Optional[int] = ...) -> None: ...

class RoundStart(_message.Message):
    __slots__ = ("round", "model_hash", "train_s", "codec")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    MODEL_HASH_FIELD_NUMBER: _ClassVar[int]
    TRAIN_S_FIELD_NUMBER: _ClassVar[int]
    CODEC_FIELD_NUMBER: _ClassVar[int]
    round: int
    model_hash: str
    train_s: float
    codec: str
    def __init__(self, round: _Optional[int] = ..., model_hash: _Optional[str] = ..., train_s: _Optional[float] = ..., codec: _Optional[str] = ...) -> None: ...

class RoundMetrics(_message.Message):
    __slots__ = ("round", "train_loss", "last_train_loss", "tokens", "steps", "raw_bytes", "wire_bytes", "huffman_bits_per_symbol", "encode_s", "decode_s", "compute_s", "send_s", "chunks", "emulated_s", "data_position", "wait_s", "steps_ahead", "hedged", "download_s", "turnaround_s")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    TRAIN_LOSS_FIELD_NUMBER: _ClassVar[int]
    LAST_TRAIN_LOSS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    RAW_BYTES_FIELD_NUMBER: _ClassVar[int]
    WIRE_BYTES_FIELD_NUMBER: _ClassVar[int]
    HUFFMAN_BITS_PER_SYMBOL_FIELD_NUMBER: _ClassVar[int]
    ENCODE_S_FIELD_NUMBER: _ClassVar[int]
    DECODE_S_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_S_FIELD_NUMBER: _ClassVar[int]
    SEND_S_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    EMULATED_S_FIELD_NUMBER: _ClassVar[int]
    DATA_POSITION_FIELD_NUMBER: _ClassVar[int]
    WAIT_S_FIELD_NUMBER: _ClassVar[int]
    STEPS_AHEAD_FIELD_NUMBER: _ClassVar[int]
    HEDGED_FIELD_NUMBER: _ClassVar[int]
    DOWNLOAD_S_FIELD_NUMBER: _ClassVar[int]
    TURNAROUND_S_FIELD_NUMBER: _ClassVar[int]
    round: int
    train_loss: float
    last_train_loss: float
    tokens: int
    steps: int
    raw_bytes: int
    wire_bytes: int
    huffman_bits_per_symbol: float
    encode_s: float
    decode_s: float
    compute_s: float
    send_s: float
    chunks: int
    emulated_s: float
    data_position: int
    wait_s: float
    steps_ahead: int
    hedged: int
    download_s: float
    turnaround_s: float
    def __init__(self, round: _Optional[int] = ..., train_loss: _Optional[float] = ..., last_train_loss: _Optional[float] = ..., tokens: _Optional[int] = ..., steps: _Optional[int] = ..., raw_bytes: _Optional[int] = ..., wire_bytes: _Optional[int] = ..., huffman_bits_per_symbol: _Optional[float] = ..., encode_s: _Optional[float] = ..., decode_s: _Optional[float] = ..., compute_s: _Optional[float] = ..., send_s: _Optional[float] = ..., chunks: _Optional[int] = ..., emulated_s: _Optional[float] = ..., data_position: _Optional[int] = ..., wait_s: _Optional[float] = ..., steps_ahead: _Optional[int] = ..., hedged: _Optional[int] = ..., download_s: _Optional[float] = ..., turnaround_s: _Optional[float] = ...) -> None: ...

class RoundResult(_message.Message):
    __slots__ = ("round", "model_hash", "sites", "val_loss", "late_sites", "partial", "tail_chunks")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    MODEL_HASH_FIELD_NUMBER: _ClassVar[int]
    SITES_FIELD_NUMBER: _ClassVar[int]
    VAL_LOSS_FIELD_NUMBER: _ClassVar[int]
    LATE_SITES_FIELD_NUMBER: _ClassVar[int]
    PARTIAL_FIELD_NUMBER: _ClassVar[int]
    TAIL_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    round: int
    model_hash: str
    sites: _containers.RepeatedScalarFieldContainer[str]
    val_loss: float
    late_sites: _containers.RepeatedScalarFieldContainer[str]
    partial: _containers.RepeatedCompositeFieldContainer[CountedChunks]
    tail_chunks: int
    def __init__(self, round: _Optional[int] = ..., model_hash: _Optional[str] = ..., sites: _Optional[_Iterable[str]] = ..., val_loss: _Optional[float] = ..., late_sites: _Optional[_Iterable[str]] = ..., partial: _Optional[_Iterable[_Union[CountedChunks, _Mapping]]] = ..., tail_chunks: _Optional[int] = ...) -> None: ...

class CountedChunks(_message.Message):
    __slots__ = ("site", "chunks")
    SITE_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    site: str
    chunks: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, site: _Optional[str] = ..., chunks: _Optional[_Iterable[int]] = ...) -> None: ...

class Ready(_message.Message):
    __slots__ = ("round", "model_hash")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    MODEL_HASH_FIELD_NUMBER: _ClassVar[int]
    round: int
    model_hash: str
    def __init__(self, round: _Optional[int] = ..., model_hash: _Optional[str] = ...) -> None: ...

class HashReport(_message.Message):
    __slots__ = ("round", "model_hash")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    MODEL_HASH_FIELD_NUMBER: _ClassVar[int]
    round: int
    model_hash: str
    def __init__(self, round: _Optional[int] = ..., model_hash: _Optional[str] = ...) -> None: ...

class LinkProbe(_message.Message):
    __slots__ = ("t", "rtt_ms")
    T_FIELD_NUMBER: _ClassVar[int]
    RTT_MS_FIELD_NUMBER: _ClassVar[int]
    t: _containers.RepeatedScalarFieldContainer[float]
    rtt_ms: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, t: _Optional[_Iterable[float]] = ..., rtt_ms: _Optional[_Iterable[float]] = ...) -> None: ...

class DeltaOutcome(_message.Message):
    __slots__ = ("round", "outcome", "reason")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    round: int
    outcome: str
    reason: str
    def __init__(self, round: _Optional[int] = ..., outcome: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class Error(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: str
    message: str
    def __init__(self, code: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class SiteMessage(_message.Message):
    __slots__ = ("join", "chunk", "metrics", "hash_report", "link_probe", "ready", "manifest", "parity", "lane_open")
    JOIN_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    HASH_REPORT_FIELD_NUMBER: _ClassVar[int]
    LINK_PROBE_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    PARITY_FIELD_NUMBER: _ClassVar[int]
    LANE_OPEN_FIELD_NUMBER: _ClassVar[int]
    join: Join
    chunk: Chunk
    metrics: RoundMetrics
    hash_report: HashReport
    link_probe: LinkProbe
    ready: Ready
    manifest: DeltaManifest
    parity: DeltaParity
    lane_open: LaneOpen
    def __init__(self, join: _Optional[_Union[Join, _Mapping]] = ..., chunk: _Optional[_Union[Chunk, _Mapping]] = ..., metrics: _Optional[_Union[RoundMetrics, _Mapping]] = ..., hash_report: _Optional[_Union[HashReport, _Mapping]] = ..., link_probe: _Optional[_Union[LinkProbe, _Mapping]] = ..., ready: _Optional[_Union[Ready, _Mapping]] = ..., manifest: _Optional[_Union[DeltaManifest, _Mapping]] = ..., parity: _Optional[_Union[DeltaParity, _Mapping]] = ..., lane_open: _Optional[_Union[LaneOpen, _Mapping]] = ...) -> None: ...

class ServerMessage(_message.Message):
    __slots__ = ("welcome", "chunk", "round_start", "round_result", "error", "delta_outcome", "lane_ack")
    WELCOME_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    ROUND_START_FIELD_NUMBER: _ClassVar[int]
    ROUND_RESULT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    DELTA_OUTCOME_FIELD_NUMBER: _ClassVar[int]
    LANE_ACK_FIELD_NUMBER: _ClassVar[int]
    welcome: Welcome
    chunk: Chunk
    round_start: RoundStart
    round_result: RoundResult
    error: Error
    delta_outcome: DeltaOutcome
    lane_ack: LaneAck
    def __init__(self, welcome: _Optional[_Union[Welcome, _Mapping]] = ..., chunk: _Optional[_Union[Chunk, _Mapping]] = ..., round_start: _Optional[_Union[RoundStart, _Mapping]] = ..., round_result: _Optional[_Union[RoundResult, _Mapping]] = ..., error: _Optional[_Union[Error, _Mapping]] = ..., delta_outcome: _Optional[_Union[DeltaOutcome, _Mapping]] = ..., lane_ack: _Optional[_Union[LaneAck, _Mapping]] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ("from_seq",)
    FROM_SEQ_FIELD_NUMBER: _ClassVar[int]
    from_seq: int
    def __init__(self, from_seq: _Optional[int] = ...) -> None: ...

class PingRequest(_message.Message):
    __slots__ = ("site",)
    SITE_FIELD_NUMBER: _ClassVar[int]
    site: str
    def __init__(self, site: _Optional[str] = ...) -> None: ...

class PingReply(_message.Message):
    __slots__ = ("server_time",)
    SERVER_TIME_FIELD_NUMBER: _ClassVar[int]
    server_time: float
    def __init__(self, server_time: _Optional[float] = ...) -> None: ...

class ReportRequest(_message.Message):
    __slots__ = ("events",)
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, events: _Optional[_Iterable[str]] = ...) -> None: ...

class ReportReply(_message.Message):
    __slots__ = ("first_seq",)
    FIRST_SEQ_FIELD_NUMBER: _ClassVar[int]
    first_seq: int
    def __init__(self, first_seq: _Optional[int] = ...) -> None: ...

class TelemetryEvent(_message.Message):
    __slots__ = ("seq", "json")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    JSON_FIELD_NUMBER: _ClassVar[int]
    seq: int
    json: str
    def __init__(self, seq: _Optional[int] = ..., json: _Optional[str] = ...) -> None: ...
