"""Text a process controls, made safe to show: on a terminal, in a report, to another user.

Command lines, py-spy's frames (function and file names), a dataset's class name, the hook
file's fields and names, py-spy's error output: any local user can put an escape sequence in
them (`ESC ]52;c;...` writes the admin's clipboard, `ESC ]0;...` the window title) or a bidi
override that reorders what the reader sees. `printable` shows every C0 and C1 control, DEL
and the bidi embeddings, overrides and isolates as a visible escape (`\\x1b`, `\\u202e`), so no
output (the live view, the picker, replay, Markdown, HTML, JSON, Prometheus) ever carries
them raw. It is applied where such text enters a snapshot or a notice (model.py).
"""

from __future__ import annotations

import re

# C0 controls, DEL, C1 controls; the bidi embeddings and overrides (U+202A-U+202E) and
# isolates (U+2066-U+2069); lone surrogates (JSON's `\ud800` decodes to one), which no UTF-8
# output can encode.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def _escape(match: re.Match) -> str:
    c = ord(match.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def printable(text: str) -> str:
    """text with every control and bidi formatting character shown as a visible escape."""
    return _UNSAFE.sub(_escape, text) if _UNSAFE.search(text) else text


def printable_or_none(text: str | None) -> str | None:
    return None if text is None else printable(text)


def printable_tree(value: object, depth: int = 0) -> object:
    """value (JSON: dicts, lists, strings, numbers) with every string, keys too, made printable:
    a report file is whatever its author wrote."""
    if depth > 64:
        raise ValueError("nested too deep")
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        return {printable(str(k)): printable_tree(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [printable_tree(v, depth + 1) for v in value]
    return value


def count(n: int, word: str) -> str:
    """'1 worker', '2 workers': a count agrees with its noun."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"
