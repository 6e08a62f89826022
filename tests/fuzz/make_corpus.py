#!/usr/bin/env python3
"""Writes the seed corpus of the fuzz targets (tests/fuzz_targets.hpp) into tests/fuzz/corpus/.

    python3 tests/fuzz/make_corpus.py        (from anywhere; standard library only)

The seeds are the starting points of both the bounded loop in tests/test_fuzz.cpp and of
libFuzzer (make fuzz): valid inputs that reach deep into the code, and malformed ones next to
each check, since a mutation of either is what finds a bug. Every file is rewritten, so a
change here and a regenerated corpus go into one commit.
"""
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "corpus")

# ---- safetensors: 8-byte little-endian header length, a JSON header, then the data ----------

FORMATS = {"F32": "<f", "F64": "<d", "I32": "<i", "I64": "<q", "BOOL": "<?"}


def safetensors(tensors, metadata=None, pad=True):
    """tensors: list of (name, dtype, shape, values); values packed in order, as save() does."""
    header, data = {}, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, values in tensors:
        raw = b"".join(struct.pack(FORMATS[dtype], v) for v in values)
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header, separators=(",", ":")).encode()
    if pad:   # the data section starts 8-byte aligned, as the format recommends
        text += b" " * (-len(text) % 8)
    return with_header(text) + data


def with_header(text, length=None):
    """A raw header (bytes) behind its length prefix; length overrides the true one."""
    return struct.pack("<Q", len(text) if length is None else length) + text


NAN, INF = float("nan"), float("inf")
SAFETENSORS = {
    # valid: every dtype, scalars, empty tensors, metadata, several tensors
    "f32_matrix": safetensors([("w", "F32", [2, 3], [1, -2, 3.5, 0, 1e-3, -7])]),
    "f64_vector": safetensors([("x", "F64", [4], [0.1, -1e300, 2.5e-310, 42])]),
    "i32_scalar": safetensors([("step", "I32", [], [-123456])]),
    "i64_extremes": safetensors([("ids", "I64", [3], [-2**63, 2**63 - 1, -1])]),
    "bool_mask": safetensors([("mask", "BOOL", [2, 2], [True, False, False, True])]),
    "f32_special": safetensors([("s", "F32", [5], [NAN, INF, -INF, -0.0, 1e-45])]),
    "empty_tensors": safetensors([("a", "F32", [0], []), ("b", "I64", [2, 0, 3], []),
                                  ("c", "BOOL", [1], [True])]),
    "metadata": safetensors([("bias", "F32", [1, 2], [0.5, -0.5])],
                            metadata={"format": "pt", "note": "q\"uote\\ \u00e9"}),
    "several": safetensors([("layer.0.weight", "F32", [2, 2], [1, 2, 3, 4]),
                            ("layer.0.bias", "F64", [2], [5, 6]),
                            ("count", "I32", [1, 1, 1], [7]),
                            ("flags", "BOOL", [3], [True, True, False])]),
    "empty_header": with_header(b"{}"),
    "unpadded_escapes": safetensors([("a\"b\\\n\u00e9", "I32", [2], [1, 2])], pad=False),
    # offsets out of key order: the data section is covered, but not in the header's order
    "offsets_reordered": with_header(
        b'{"b":{"dtype":"I32","shape":[1],"data_offsets":[4,8]},'
        b'"a":{"dtype":"I32","shape":[1],"data_offsets":[0,4]}}')
        + struct.pack("<ii", 1, 2),
    # malformed: one next to each check of the loader
    "short_file": b"\x02\x00\x00",
    "header_past_end": with_header(b"{}", length=4096),
    "truncated_data": safetensors([("w", "F32", [4], [1, 2, 3, 4])])[:-5],
    "overlapping_offsets": with_header(
        b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
        b'"b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}') + b"\0" * 8,
    "duplicate_key": with_header(
        b'{"a":{"dtype":"I32","shape":[],"data_offsets":[0,4]},'
        b'"a":{"dtype":"I32","shape":[],"data_offsets":[0,4]}}') + b"\0" * 4,
    "unsupported_dtype": with_header(
        b'{"h":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}}') + b"\0" * 4,
    # huge sizes with a zero among them: no bytes, but an element count past 2^63 if multiplied
    "huge_shape": with_header(
        b'{"z":{"dtype":"F64","shape":[9000000000000000,0,9000000000000000],'
        b'"data_offsets":[0,0]}}'),
    "deep_nesting": with_header(b'{"__metadata__":' + b"[" * 20 + b"]" * 20 + b"}"),
    # found by fuzzing: a zero first kept the product of the other sizes from being checked
    "zero_then_huge": with_header(
        b'{"z":{"dtype":"F32","shape":[0,4294967296,4294967296],"data_offsets":[0,0]}}'),
    "bool_byte_two": with_header(
        b'{"m":{"dtype":"BOOL","shape":[2],"data_offsets":[0,2]}}') + b"\x01\x02",
    "surrogate_pair_name": with_header(
        b'{"\\ud83d\\ude00":{"dtype":"I32","shape":[],"data_offsets":[0,4]}}') + b"\0" * 4,
    "lone_surrogate": with_header(
        b'{"\\ud83d":{"dtype":"I32","shape":[],"data_offsets":[0,4]}}') + b"\0" * 4,
    "hex_number": with_header(b'{"a":{"dtype":"I32","shape":[0x1],"data_offsets":[0,4]}}')
        + b"\0" * 4,
}

# ---- einsum: the first line is the spec; the bytes after it choose the operands --------------
# No newline: one operand per term, each letter with a size of its own (see fuzz_targets.hpp).
# After a newline: byte 0 is the operand count (mod 5); per operand a byte with the rank
# (mod 7), the dtype (bits 4-5: F32 F64 I32 BOOL) and whether it is a constant (bit 3), then a
# byte per size (mod 5).
F32, F64, I32, BOOL, CONST = 0x00, 0x10, 0x20, 0x30, 0x08


def operands(*ops):
    """ops: (shape, flags) pairs, flags a dtype or'ed with CONST."""
    out = bytes([len(ops)])
    for shape, flags in ops:
        out += bytes([len(shape) | flags]) + bytes(shape)
    return out


def einsum(spec, *ops):
    return spec.encode() if not ops else spec.encode() + b"\n" + operands(*ops)


EINSUM = {
    # shapes implied by the spec
    "matmul": einsum("ij,jk->ik"),
    "batch_matmul": einsum("bij,bjk->bik"),
    "ellipsis_broadcast": einsum("...ij,...jk"),
    "diagonal": einsum("ii->i"),
    "trace": einsum("ii"),
    "repeated_three": einsum("iij,jkk->ik"),
    "outer": einsum("i,j->ij"),
    "transpose": einsum("ijk->kji"),
    "three_operands": einsum("a,a,a->a"),
    "upper_and_lower": einsum("Ab,bA->Ab"),
    "spaces": einsum(" i j , j k -> k i "),
    "scalars": einsum(",->"),
    "ellipsis_only": einsum("...->..."),
    # shapes from the bytes
    "matmul_shaped": einsum("ij,jk->ik", ([2, 3], F32), ([3, 4], F64)),
    "batch_ellipsis": einsum("...ij,...jk->...ik", ([2, 1, 2, 3], F32), ([2, 3, 2], I32)),
    "broadcast_letter": einsum("ij,ij->ij", ([1, 4], F32), ([3, 4], F32 | CONST)),
    "empty_sum": einsum("ij->", ([0, 4], F32)),
    "empty_dot": einsum("i,i", ([0], I32), ([0], I32)),
    "bool_operands": einsum("ij,jk->ik", ([2, 2], BOOL), ([2, 3], BOOL)),
    "diagonal_constant": einsum("ii->i", ([3, 3], F64 | CONST)),
    "ellipsis_scalar": einsum("...,...->...", ([], F32), ([2], F32)),
    # errors
    "mismatch": einsum("ij,jk", ([2, 3], F32), ([4, 2], F32)),
    "diagonal_mismatch": einsum("ii->i", ([2, 3], F32)),
    "too_few_operands": einsum("ij,jk->ik", ([2, 3], F32)),
    "unknown_output": einsum("ij,jk->iz"),
    "repeated_output": einsum("ij->ii"),
    "two_ellipses": einsum("i...j...->ij"),
    "bad_character": einsum("ij;jk->ik"),
    "lone_dots": einsum("..i.j->ij"),
    "high_byte": b"i\xffj->ij",
    # a letter repeated: nested diagonals once grew the index exponentially
    "many_repeats": einsum("i" * 8 + "->i"),
}


def write(target, seeds):
    folder = os.path.join(CORPUS, target)
    os.makedirs(folder, exist_ok=True)
    for name in os.listdir(folder):   # seeds renamed or dropped here go from the corpus too
        os.remove(os.path.join(folder, name))
    for name, data in seeds.items():
        with open(os.path.join(folder, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    write("safetensors", SAFETENSORS)
    write("einsum", EINSUM)
    print(f"{len(SAFETENSORS)} safetensors and {len(EINSUM)} einsum seeds in {CORPUS}")
