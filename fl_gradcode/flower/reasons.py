"""Failure reasons as readable text: ``ExceptionType: message``, never a terminal-coloured repr.

Flower's simulation engine reports a ClientApp that raised as
``str(type(ex)) + ":<'" + str(ex) + "'>"``; under Ray ``ex`` is a ``RayTaskError`` whose text
is the actor's traceback with ANSI colour escapes around the actor's name
(``\\x1b[36mray::ClientAppActor.run()\\x1b[39m (pid=..., ...)``), the app's own exception, and
Flower's ``ClientAppException`` wrapping it. :func:`readable` turns that (or any reason) into
one ``Type: message`` line: the escapes stripped, the repr unwrapped, the app's own exception
(the first in the chain) named.
"""

from __future__ import annotations

import re

__all__ = ["raising_function", "readable", "strip_ansi", "unwrap"]

# CSI sequences (colours, cursor moves) and the two-character escapes
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")
_REPR = re.compile(r"^<class '(?P<type>[^']+)'>:<'(?P<body>.*)'>$", re.DOTALL)
_EMBEDDED = re.compile(r"<class '[^']+'>:<'.*'>", re.DOTALL)
_CHAINED = ("The above exception was the direct cause of the following exception:",
            "During handling of the above exception, another exception occurred:")
# an exception line of a traceback: ``module.Type: message`` at the start of a line
_EXC_LINE = re.compile(r"^(?P<type>[A-Za-z_][\w.]*(?:\([\w.]+\))?)(?::(?P<msg>.*))?$")
_FLOWER_WRAP = re.compile(r"Exception (\w+) occurred\. Message: ?(.*)", re.DOTALL)


def strip_ansi(text: str) -> str:
    """``text`` without terminal escape sequences."""
    return _ANSI.sub("", text)


def _short_type(name: str) -> str:
    """``ray.exceptions.RayTaskError(ClientAppException)`` -> ``ClientAppException``;
    ``flwr.clientapp.client_app.ClientAppException`` -> ``ClientAppException``."""
    inner = re.search(r"\(([\w.]+)\)$", name)
    if inner:
        name = inner.group(1)
    return name.rsplit(".", 1)[-1]


def _last_exception(block: str) -> str | None:
    """The ``Type: message`` a traceback block ends with (its message may span lines)."""
    lines = block.strip("\n").splitlines()
    for i in range(len(lines) - 1, -1, -1):
        line = lines[i]
        if not line or line[0].isspace() or line.startswith(("ray::", "Traceback")):
            continue
        match = _EXC_LINE.match(line)
        if match is None or match.group("msg") is None:
            continue
        message = "\n".join([match.group("msg"), *lines[i + 1:]]).strip()
        wrapped = _FLOWER_WRAP.search(message)
        if wrapped:  # Flower's ClientAppException: the app's message is what it carries
            message = wrapped.group(2).strip()
        return f"{_short_type(match.group('type'))}: {' '.join(message.split())}"
    return None


def readable(text: object) -> str | None:
    """One ``Type: message`` line for a reason in Flower's/Ray's repr form (``None`` when
    ``text`` is not one; strip it with :func:`strip_ansi` anyway)."""
    text = strip_ansi(str(text))
    match = _REPR.match(text.strip())
    if match is None:
        return None
    outer, body = match.group("type"), match.group("body")
    blocks = re.split("|".join(map(re.escape, _CHAINED)), body)
    for block in blocks:  # the first in the chain: the app's own exception
        found = _last_exception(block)
        if found is not None:
            return found
    wrapped = _FLOWER_WRAP.search(body)
    message = wrapped.group(2) if wrapped else body
    return f"{_short_type(outer)}: {' '.join(message.split())}"


def unwrap(text: object) -> str:
    """``text`` without terminal escapes, a Flower/Ray error repr inside it (e.g. in
    ``"error reply (code 0: <class '...'>:<'...'>)"``) replaced by its ``Type: message``."""
    text = strip_ansi(str(text))
    found = _EMBEDDED.search(text)
    if found is None:
        return text
    line = readable(found.group())
    return text if line is None else text[: found.start()] + line + text[found.end():]


_FRAME = re.compile(r'File "(?P<path>[^"]+)", line \d+, in (?P<name>[\w.<>]+)')
_FRAMEWORK = ("/flwr/", "/ray/", "/fl_gradcode/", "/concurrent/", "/threading.py")


def raising_function(reason: str) -> str | None:
    """The innermost function outside Flower, Ray and this library in the first traceback a
    client's error reason carries (Flower's simulation engine sends the actor's traceback),
    e.g. the mod that raised; ``None`` when the reason has no traceback."""
    text = strip_ansi(str(reason))
    first = re.split(r"The above exception was the direct cause|During handling of the above",
                     text)[0]
    names = [m.group("name") for m in _FRAME.finditer(first)
             if not any(part in m.group("path").replace("\\", "/") for part in _FRAMEWORK)]
    return names[-1] if names else None
