"""Priors: other fingerprints' decisions of the same problem family, read as rankings and weighted by how well
each one has predicted this device so far.

A search evaluates the priors' best configs first (:class:`PriorFirst`); they change effort, never meaning
(docs/spaces.md, "Priors: starting from other devices' decisions" and "Fleet priors on the farm").
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from farm.identity import CacheKey
from farm.roster import Roster
from farm.stores.base import DecisionRecord
from farm.strategies import Sampler

RANKED = 32  # the best configs a decision's meta keeps with their ratios (what another SKU's search reads)
FIRST = 16  # the most configs the priors propose before the strategy's own
SHARE = 0.5  # the most share of ``max_configs`` the priors propose
AGREEMENT_PRIOR = 2.0  # pseudo-pairs of agreement a source starts with (its weight is 1 until evidence)
MUTE = 0.25  # the priors propose a config only while its weighted score is at least this
SOURCES = 8  # the most other fingerprints' decisions the farm seeds one search with
DECAY = 4.0  # ranks over which a source's score halves: a trusted source proposes about its best 12


@dataclass(frozen=True)
class Source:
    """One prior: its name (the fingerprint it was measured on), its ranking ``(config name, ratio to the
    reference)`` best first, and whether it is complete (every config it does not list ranked below its list)."""

    name: str
    ranking: tuple[tuple[str, float], ...]
    complete: bool = False


def source(prior: Any, limit: int | None = None) -> Source:
    """A prior as a Source: a ``Source``, a ``Tuned`` (its report's estimates) or a :class:`DecisionRecord` (its
    meta's ``ranked``); ``limit`` keeps the best ones only. ValueError for anything else, or one without a ranking."""
    if isinstance(prior, Source):
        found = prior
    elif isinstance(prior, DecisionRecord):
        ranked = prior.meta.get("ranked")
        if not isinstance(ranked, list) or not ranked:
            raise ValueError(f"decision {prior.name!r} keeps no ranking (meta 'ranked'): it cannot be a prior")
        pairs = [(str(n), float(r)) for n, r in ranked]
        try:
            environment = CacheKey.decode(prior.cache_key).environment
        except ValueError:  # a key this version cannot read still names a source
            environment = prior.cache_key[:64]
        found = Source(environment, tuple(pairs), prior.meta.get("covered") is not None)
    elif getattr(prior, "report", None) is not None and hasattr(prior.report, "estimates"):
        report = prior.report
        if not report.estimates:
            raise ValueError(f"result {prior.name!r} evaluated no config: it cannot be a prior")
        found = Source(report.environment, tuple(report.estimates), report.covered is not None)
    else:
        raise ValueError(f"a prior must be a Tuned result or a DecisionRecord, got {type(prior).__name__}")
    ranking = sorted(((n, r) for n, r in found.ranking if r > 0 and math.isfinite(r)), key=lambda nr: nr[1])
    return dataclasses.replace(found, ranking=tuple(ranking[:limit]))  # a complete one: the rest still below


def from_records(found: Iterable[tuple[str, DecisionRecord]], limit: int | None = None) -> tuple[Source, ...]:
    """Other fingerprints' decisions, given as (fingerprint digest, record), as priors named by their digests (a
    farm decision names the fingerprint it was measured on by digest); a record without a ranking is left out."""
    out = []
    for digest, record in found:
        with contextlib.suppress(ValueError, TypeError):  # no ranking, or a malformed one: not a prior
            out.append(dataclasses.replace(source(record, limit), name=digest))
    return tuple(out)


def ranked(estimates: Mapping[str, float | None], reference: str, limit: int | None = None) -> list[tuple[str, float]]:
    """Configs with their estimates, best first, ``limit`` of them, the reference (ratio 1) always among them."""
    good = ((n, float(r)) for n, r in estimates.items() if r is not None and math.isfinite(r) and r > 0)
    kept = sorted(good, key=lambda nr: nr[1])[:limit]
    return kept if any(n == reference for n, _ in kept) else [*kept, (reference, 1.0)]


def weight(src: Source, measured: Mapping[str, float]) -> float:
    """How well ``src`` predicted this device's ratios ``measured``, its rank agreement (docs/spaces.md,
    "Weighted by how well they predict this device"): 1 without evidence, 0 for a reversed ranking."""
    rank = {n: i for i, (n, _) in enumerate(src.ranking)}
    here = [(rank.get(n, len(rank)), r) for n, r in measured.items() if n in rank or src.complete]
    agrees = [(a < b) == (ra < rb) for i, (a, ra) in enumerate(here) for b, rb in here[i + 1:]
              if a != b and ra != rb]
    concordant, discordant = sum(agrees), len(agrees) - sum(agrees)
    agreement = (concordant + AGREEMENT_PRIOR) / (concordant + discordant + AGREEMENT_PRIOR)
    return max(0.0, 2.0 * agreement - 1.0)


def scores(sources: Sequence[Source], weights: Sequence[float]) -> dict[str, float]:
    """Each config's weighted score: the sum over sources of ``weight / (1 + rank / DECAY)`` (their best: 1)."""
    out: dict[str, float] = {}
    for src, w in zip(sources, weights, strict=True):
        for i, (n, _) in enumerate(src.ranking):
            out[n] = out.get(n, 0.0) + w / (1.0 + i / DECAY)
    return out


class PriorFirst:
    """A strategy wrapper: the priors' best configs first (re-weighted after every result), then ``inner``'s,
    which adopts them and is told their results; at most ``FIRST`` (and ``SHARE`` of ``max_configs``)."""

    def __init__(self, inner: Sampler, roster: Roster, sources: Sequence[Source], max_configs: int | None,
                 reference: str) -> None:
        self.inner, self.roster, self.sources = inner, roster, tuple(sources)
        self.name, self.adaptive = inner.name, True
        self.cap = FIRST if max_configs is None else min(FIRST, int(max_configs * SHARE))
        self.proposed: set[str] = set()
        self.measured: dict[str, float] = {reference: 1.0}  # every source's reference is at 1 too
        found = {n: roster.position(n) for s in self.sources for n, _ in s.ranking}
        self.positions = {n: p for n, p in found.items() if p is not None and roster[p].eligible
                          and roster.locate(p)[0].space is not None}
        self.weights = [1.0] * len(self.sources)

    def lead(self, n: int) -> list[int]:
        """The priors' own next configs (at most ``n``, adopted by the inner strategy); [] once they are done
        (cap reached, or no config scores ``MUTE``), and from then on :meth:`ask` is the inner strategy's."""
        out: list[int] = []
        if len(self.proposed) < self.cap:
            score = scores(self.sources, self.weights)
            for name in sorted(self.positions, key=lambda c: (-score.get(c, 0.0), c)):
                if len(out) >= n or len(self.proposed) + len(out) >= self.cap or score.get(name, 0.0) < MUTE:
                    break
                if name not in self.proposed and self.inner.usable(self.positions[name]):
                    out.append(self.positions[name])
            self.proposed.update(self.roster.names[p] for p in out)
            self.inner.adopt(out)
            if not out:
                self.cap = 0  # nothing worth proposing: the strategy's turn for good
        return out

    def ask(self, n: int) -> list[int]:
        return self.lead(n) or self.inner.ask(n)

    def usable(self, position: int) -> bool:
        return self.inner.usable(position)

    def adopt(self, positions: Sequence[int]) -> None:
        self.inner.adopt(positions)

    def tell(self, results: Sequence[tuple[int, float | None]]) -> None:
        names = self.roster.names
        self.measured.update((names[p], ratio) for p, ratio in results
                             if ratio is not None and ratio > 0 and math.isfinite(ratio))
        if len(self.proposed) < self.cap:  # the weights order only the priors' own proposals
            self.weights = [weight(s, self.measured) for s in self.sources]
        self.inner.tell(results)


_ACTIVE: contextvars.ContextVar[tuple[Source, ...]] = contextvars.ContextVar("farm_priors", default=())


def active() -> tuple[Source, ...]:
    """The priors of the search this thread runs (:func:`using`); empty outside ``farm.tune(priors=...)``."""
    return _ACTIVE.get()


@contextlib.contextmanager
def using(priors: Iterable[Any]) -> Iterator[tuple[Source, ...]]:
    """Give the searches run inside the block ``priors`` (read by :func:`source`): ``farm.tune`` passes them to
    the engine's search this way, so the engine's signature stays the fleet's."""
    token = _ACTIVE.set(tuple(source(p) for p in priors))
    try:
        yield _ACTIVE.get()
    finally:
        _ACTIVE.reset(token)
