"""The codec: pure functions and small classes, arrays in, arrays or bytes out, no I/O.

Stage 1 (quantize.py): per-block absmax INT8 with sender-side error feedback (feedback.py).
Stage 2 (huffman.py): canonical length-limited Huffman over the int8 symbols.
codec.py ties them to a CodecConfig; chunks.py cuts tensors into wire-sized pieces.
"""

from .chunks import ChunkSpec, check_coverage, check_fits, join_chunks, plan_chunks
from .codec import Codec, Encoded, EncodeStats, Extracted, encode_arrays, load_kernels
from .feedback import ErrorFeedback
from .quantize import dequantize_int8, quantize_int8

__all__ = ["ChunkSpec", "check_coverage", "check_fits", "join_chunks", "plan_chunks", "Codec", "Encoded", "EncodeStats",
           "Extracted", "encode_arrays", "load_kernels", "ErrorFeedback", "dequantize_int8", "quantize_int8"]
