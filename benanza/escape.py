"""String literals for the generated build files, in each language's own escaping.

JSON's escaping is not C++'s nor CMake's: ``json.dumps`` turns ``é`` into ``\\u00e9`` (CMake:
"Invalid character escape") and an emoji into a surrogate pair g++ rejects. Every string a
user or a model can influence (paths, benchmark names, metric names) goes through here.
"""

from __future__ import annotations

# Printable ASCII that needs no escape in a C++ string literal; '?' is left out so that no
# trigraph can form (pre-C++17 compilers), '"' and '\\' for the obvious reasons.
_C_PLAIN = frozenset(range(0x20, 0x7F)) - {ord('"'), ord("\\"), ord("?")}


def c_string(text: str) -> str:
    """A C/C++ narrow string literal holding ``text``'s UTF-8 bytes exactly.

    Other bytes are three-digit octal escapes: unlike ``\\x``, an octal escape ends after
    three digits, so a digit that follows is never swallowed into it.
    """
    out = ['"']
    for byte in text.encode("utf-8", errors="surrogateescape"):
        out.append(chr(byte) if byte in _C_PLAIN else f"\\{byte:03o}")
    out.append('"')
    return "".join(out)


_CMAKE_ESCAPES = {"\\": "\\\\", '"': '\\"', "$": "\\$", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def cmake_quoted(text: str) -> str:
    """A CMake quoted argument whose value is ``text`` exactly: no variable is expanded
    (``$`` is escaped), and other characters, UTF-8 included, stand as they are."""
    return '"' + "".join(_CMAKE_ESCAPES.get(ch, ch) for ch in text) + '"'


# Bidirectional overrides and isolates reorder what a terminal shows (a name can look like another).
_BIDI = frozenset(range(0x202A, 0x202F)) | frozenset(range(0x2066, 0x206A))


def printable(text: str) -> str:
    """``text`` for a terminal: control characters (ESC starts a command: clear the screen, set
    the clipboard, rename the window) and bidi overrides as ``\\x1b``/``\\u202e`` escapes; line
    breaks and tabs stay, they are layout."""
    return "".join(ch if ch in "\n\t" or not (ord(ch) < 0x20 or 0x7F <= ord(ch) < 0xA0 or ord(ch) in _BIDI)
                   else f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}" for ch in text)
