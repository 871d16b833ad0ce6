"""Sharding one stream list over N workers: `dfine-serve --streams FILE --shard INDEX/COUNT`.

Each worker reads the same file and serves the entries whose name hashes to its index: the first 8
bytes of the SHA-1 of the name, as a big-endian number, modulo COUNT. The hash depends on the name only
(not on Python's per-process `hash()`, the file's order or the other names), so every worker agrees
without talking to the others, and adding a stream moves no other one. Changing COUNT moves about
(COUNT-1)/COUNT of the streams. Streams added over the API are served by the worker they are sent to.
"""

from __future__ import annotations

import hashlib
import logging
import re

from dfine_deploy.errors import ServeError
from dfine_deploy.serve.settings import StreamSpec

log = logging.getLogger("dfine_deploy.serve")

SHARD_FORM = re.compile(r"^(\d{1,6})/(\d{1,6})$")


def parse_shard(text: str) -> tuple[int, int]:
    """'1/3' -> (1, 3); anything else is refused in one line."""
    match = SHARD_FORM.match(text.strip())
    index, count = (int(match.group(1)), int(match.group(2))) if match else (-1, 0)
    if not 0 <= index < count:
        raise ServeError(
            f"--shard {text!r}: give INDEX/COUNT with 0 <= INDEX < COUNT, e.g. 0/3 (the first of three)"
        )
    return index, count


def shard_of(name: str, count: int) -> int:
    """The worker index, in [0, count), that serves the stream named `name`."""
    digest = hashlib.sha1(name.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % count


def shard_streams(specs: list[StreamSpec], shard: tuple[int, int]) -> list[StreamSpec]:
    """The streams this worker serves; every stream needs a name when there is more than one worker."""
    index, count = shard
    if count == 1:
        return specs
    unnamed = [i for i, spec in enumerate(specs) if not spec.name]
    if unnamed:
        raise ServeError(
            f"--shard {index}/{count}: stream {unnamed[0]} of the list has no name, and the shard is chosen "
            "from the name; give every stream a 'name:'"
        )
    mine = [spec for spec in specs if shard_of(spec.name, count) == index]
    log.info(
        "shard %d/%d: serving %d of %d stream(s): %s",
        index,
        count,
        len(mine),
        len(specs),
        ", ".join(spec.name for spec in mine) or "none",
    )
    return mine
