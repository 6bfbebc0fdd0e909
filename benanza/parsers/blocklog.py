"""The block grammar shared by the cuDNN and cuBLAS API loggers.

Both libraries print one block per API call::

    I! CuDNN (v7604) function cudnnConvolutionForward() called:
    i!     xDesc: type=cudnnTensorDescriptor_t:
    i!         dimA: type=int; val=[1,3,224,224];
    i!     algo: type=cudnnConvolutionFwdAlgo_t; val=CUDNN_CONVOLUTION_FWD_ALGO_GEMM (2);
    i! Time: 2019-11-02T10:01:02.123456 (0d+0h+0m+1s since start)
    i! Process=4242; Thread=4242; GPU=0; Handle=0x55d0c8; StreamId=(nil) (defaultStream).

Nested descriptors indent further; this module flattens them into dotted paths
(``xDesc.dimA``) so format-specific parsers only pick fields.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from .base import ProfileFormatError

_FIELD = re.compile(r"^(?P<name>[^:=]+?):\s*(?:type=(?P<type>[^;:]*?))?\s*"
                    r"(?:;\s*val=(?P<val>.*?))?;?\s*(?P<nest>:)?\s*$")


@dataclass(frozen=True)
class Block:
    library_version: str
    function: str
    level: str  # I | W | E
    fields: tuple[tuple[str, str], ...]  # dotted path → raw value text
    timestamp: str
    process: str
    thread: str
    line: int  # 1-based line of the header

    def get(self, *names: str, default: str = "") -> str:
        """Value of the first field whose path equals, or ends with ``.name``, one of ``names``."""
        for want in names:
            for path, value in self.fields:
                if path == want or path.endswith("." + want):
                    return value
        return default

    def under(self, parent: str) -> dict[str, str]:
        """Fields nested below the first component named ``parent`` (case-insensitive)."""
        out = {}
        for path, value in self.fields:
            parts = path.split(".")
            lowered = [p.lower() for p in parts]
            if parent.lower() in lowered:
                i = lowered.index(parent.lower())
                out[".".join(parts[i + 1:])] = value
        return out


def parse_blocks(text: str, path: str | Path, header: re.Pattern, what: str) -> list[Block]:
    """Split a log into blocks. ``header`` has groups ``level``, ``version`` and ``function``.

    Lines outside any block (a framework's own output interleaved in the same stream) are
    skipped; a block whose header is found but whose body is cut off mid-way is an error.
    """
    blocks: list[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = header.match(lines[i].strip())
        if not m:
            i += 1
            continue
        start = i
        i += 1
        fields: list[tuple[str, str]] = []
        stack: list[tuple[int, str]] = []
        timestamp = process = thread = ""
        closed = False
        while i < len(lines):
            raw = lines[i]
            if header.match(raw.strip()):  # cuBLAS 13 starts the next block on the line after the last
                break
            body = re.match(r"^[iwe]!(\s*)(.*)$", raw.strip("\r"), re.IGNORECASE)
            if not body and not closed and _body_follows(lines, i + 1, header):
                i += 1  # cuDNN 9's multi-line warnings: a blank line, or a message's second line bare
                continue
            if not body:
                break
            indent, content = len(body.group(1)), body.group(2).strip()
            i += 1
            if content.startswith("Time:"):
                timestamp = content[5:].strip().split(" ")[0]
                continue
            if content.startswith("Process="):
                kv = dict(p.strip().split("=", 1) for p in content.rstrip(".").split(";") if "=" in p)
                process, thread = kv.get("Process", ""), kv.get("Thread", "")
                closed = True
                continue
            if not content:
                continue
            fm = _FIELD.match(content)
            if not fm:
                continue  # free text (e.g. cuDNN 9 "Info: Traceback contains ..."): not a parameter
            while stack and stack[-1][0] >= indent:
                stack.pop()
            name = fm.group("name").strip()
            full = ".".join([s for _, s in stack] + [name])
            if fm.group("nest") and fm.group("val") is None:
                stack.append((indent, name))
            else:
                fields.append((full, (fm.group("val") or "").strip()))
        if not closed:
            raise ProfileFormatError(path, f"{what}: the block of {m.group('function')}() starting at line "
                                           f"{start + 1} ends before its Process=/Thread= line "
                                           f"(log truncated or not a {what})")
        blocks.append(Block(m.group("version"), m.group("function"), m.group("level"), tuple(fields),
                            timestamp, process, thread, start + 1))
    return blocks


def _body_follows(lines: list[str], i: int, header: re.Pattern) -> bool:
    """Whether the next non-blank line from ``i`` continues a block (a body line, not a header)."""
    while i < len(lines) and not lines[i].strip():
        i += 1
    return i < len(lines) and not header.match(lines[i].strip()) and \
        re.match(r"^[iwe]!", lines[i].strip(), re.IGNORECASE) is not None


def int_list(text: str) -> tuple[int, ...]:
    """``[1,3,224,224]`` → (1, 3, 224, 224); scalars give a 1-tuple; garbage gives ()."""
    nums = (re.findall(r"-?\d+", text.split("(")[0]) if text.strip().startswith("[")
            else re.findall(r"^-?\d+", text.strip()))
    return tuple(int(n) for n in nums)


def enum_name(text: str) -> str:
    """``CUDNN_DATA_FLOAT (0)`` or ``CUBLAS_OP_T(1)`` → the symbolic name."""
    return re.sub(r"\s*\(-?\d+\)\s*$", "", text.strip())
