"""The Redis tier's fleet-priors lookup (``farm.priors``): other fingerprints' decisions of one problem family.

The farm publishes each spaced decision under its family's id across fingerprints as well (an alias in the
fingerprint's problem index, ``<prefix>:problems:<digest>``, written in the publication's own MULTI/EXEC:
``farm_coordinator.publish``). A lookup is one round trip: ``farm_priors`` (priors.lua, read only) walks the
fingerprints hash in digest order and returns, for each other fingerprint whose index maps the family id, the
record its field holds, at most ``limit`` of them. Where the function is not loaded or not permitted, the same
answer takes three pipelined round trips here (the fingerprints, their index entries, the records).
"""

from __future__ import annotations

import logging
from typing import Any

from farm.errors import CorruptRecord
from farm.stores.base import DecisionRecord

log = logging.getLogger(__name__)


def lookup(client: Any, layout: Any, family: str, exclude: str, limit: int,
           on_server: bool = True) -> tuple[list[tuple[str, DecisionRecord]], bool]:
    """(digest, record) of up to ``limit`` fingerprints other than ``exclude`` with a decision of ``family``, in
    digest order, and whether the server may answer next time. Unreadable records are logged and left out."""
    import redis

    if limit <= 0:
        return [], on_server
    problems, decisions = layout.problems_key(""), layout.decisions_key("")
    flat: list[Any] | None = None
    if on_server:
        try:
            flat = list(client.fcall_ro("farm_priors", 1, layout.fingerprints_key, problems, decisions, family,
                                        exclude, limit))
        except redis.ResponseError as e:
            refused = isinstance(e, redis.exceptions.NoPermissionError) or "can't run this command" in str(e)
            if "Function not found" not in str(e) and not refused:
                raise
            on_server = False
    if flat is None:
        flat = _here(client, layout, family, exclude, limit)
    found = []
    for digest, raw in zip(flat[0::2], flat[1::2], strict=True):
        try:
            found.append((str(digest), DecisionRecord.from_json(raw)))
        except CorruptRecord as e:
            log.warning("skipping an unreadable prior of family %s in %s: %s", family[:12], digest, e)
    return found, on_server


def _here(client: Any, layout: Any, family: str, exclude: str, limit: int) -> list[Any]:
    """farm_priors' answer, client-side."""
    digests = sorted(str(d) for d in client.hkeys(layout.fingerprints_key) if str(d) != exclude)
    pipe = client.pipeline(transaction=False)
    for digest in digests:
        pipe.hget(layout.problems_key(digest), family)
    fields = pipe.execute()
    mapped = [(d, f) for d, f in zip(digests, fields, strict=True) if f]
    pipe = client.pipeline(transaction=False)
    for digest, field in mapped:
        pipe.hget(layout.decisions_key(digest), field)
    out: list[Any] = []
    for (digest, _), raw in zip(mapped, pipe.execute(), strict=True):
        if raw is not None and len(out) < 2 * limit:
            out += [digest, raw]
    return out
