"""The Redis tier's fleet-priors lookup (``farm.priors``): other fingerprints' decisions of one problem family.

A spaced decision is indexed under its family id across fingerprints too (docs/spaces.md). ``farm_priors``
(priors.lua) answers in one round trip; without it, three pipelined round trips here give the same answer."""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

from farm.errors import CorruptRecord
from farm.stores.base import DecisionRecord
from farm.stores.redis_nearest import call_ro

log = logging.getLogger(__name__)


def lookup(client: Any, layout: Any, family: str, exclude: str, limit: int,
           on_server: bool = True) -> tuple[list[tuple[str, DecisionRecord]], bool]:
    """(digest, record) of up to ``limit`` fingerprints other than ``exclude`` with a decision of ``family``, in
    digest order, and whether the server may answer next time. Unreadable records are logged and left out."""
    if limit <= 0:
        return [], on_server
    flat, on_server = call_ro(client, on_server, partial(_here, client, layout, family, exclude, limit),
                              "farm_priors", layout.fingerprints_key, layout.problems_key(""),
                              layout.decisions_key(""), family, exclude, limit)
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
    mapped = [(d, f) for d, f in zip(digests, pipe.execute(), strict=True) if f]
    pipe = client.pipeline(transaction=False)
    for digest, field in mapped:
        pipe.hget(layout.decisions_key(digest), field)
    found = [(d, raw) for (d, _), raw in zip(mapped, pipe.execute(), strict=True) if raw is not None]
    return [value for pair in found[:limit] for value in pair]
