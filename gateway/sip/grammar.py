"""Lexical helpers of the RFC 3261 §25 grammar shared by the URI and header parsers.

Owns: token checks, quoted-string (un)quoting with backslash escapes (§25.1 quoted-pair), splitting on a
separator while honouring quotes and angle brackets, and generic `;name=value` parameter lists.
"""

from __future__ import annotations

from .errors import RemoteProtocolError

# RFC 3261 §25.1: token = 1*(alphanum / "-" / "." / "!" / "%" / "*" / "_" / "+" / "`" / "'" / "~")
_TOKEN_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-.!%*_+`'~")

Params = tuple[tuple[str, str | None], ...]


def is_token(text: str) -> bool:
    return bool(text) and all(ch in _TOKEN_CHARS for ch in text)


def quote(text: str) -> str:
    """A quoted-string for `text`, escaping backslash and double quote."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def unquote(text: str) -> str:
    """The content of a quoted-string (with its quotes), resolving quoted-pairs."""
    if len(text) < 2 or text[0] != '"' or text[-1] != '"':
        raise RemoteProtocolError(f"not a quoted string: {text[:40]!r}")
    out: list[str] = []
    i, end = 1, len(text) - 1
    while i < end:
        ch = text[i]
        if ch == "\\":
            if i + 1 >= end:
                raise RemoteProtocolError("dangling backslash in quoted string")
            out.append(text[i + 1])
            i += 2
            continue
        if ch == '"':
            raise RemoteProtocolError("unescaped quote inside quoted string")
        out.append(ch)
        i += 1
    return "".join(out)


def find_closing_quote(text: str, start: int) -> int:
    """Index of the quote that closes the quoted-string opening at `start`."""
    i = start + 1
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            i += 2
            continue
        if ch == '"':
            return i
        i += 1
    raise RemoteProtocolError("unterminated quoted string")


def split_outside(text: str, separator: str) -> list[str]:
    """Split on `separator` where it is outside quoted strings and <...>; parts are stripped."""
    parts: list[str] = []
    depth = 0
    current: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == '"':
            close = find_closing_quote(text, i)
            current.append(text[i : close + 1])
            i = close + 1
            continue
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(0, depth - 1)
        elif ch == separator and depth == 0:
            parts.append("".join(current).strip())
            current = []
            i += 1
            continue
        current.append(ch)
        i += 1
    parts.append("".join(current).strip())
    return parts


def parse_params(text: str) -> Params:
    """`;a=b;c;d="q"` (leading separator optional) -> (("a","b"),("c",None),("d","q")); names lower-cased."""
    params: list[tuple[str, str | None]] = []
    for raw in split_outside(text, ";"):
        if not raw:
            continue
        name, eq, value = raw.partition("=")
        name = name.strip().lower()
        if not is_token(name):
            raise RemoteProtocolError(f"bad parameter name {name[:40]!r}")
        if not eq:
            params.append((name, None))
            continue
        value = value.strip()
        if value.startswith('"'):
            params.append((name, unquote(value)))
        elif value and (is_token(value) or (value.startswith("[") and value.endswith("]"))):
            params.append((name, value))
        else:
            raise RemoteProtocolError(f"bad value for parameter {name!r}")
    return tuple(params)


def format_params(params: Params) -> str:
    out: list[str] = []
    for name, value in params:
        if value is None:
            out.append(f";{name}")
        elif is_token(value) or (value.startswith("[") and value.endswith("]")):
            out.append(f";{name}={value}")
        else:
            out.append(f";{name}={quote(value)}")
    return "".join(out)


def get_param(params: Params, name: str) -> str | None:
    for key, value in params:
        if key == name:
            return value
    return None


def has_param(params: Params, name: str) -> bool:
    return any(key == name for key, _ in params)


def with_param(params: Params, name: str, value: str | None) -> Params:
    """`params` with `name` set to `value` (replacing an existing one in place, else appended)."""
    if has_param(params, name):
        return tuple((key, value if key == name else old) for key, old in params)
    return (*params, (name, value))
