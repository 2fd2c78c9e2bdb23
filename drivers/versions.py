"""Provider version gates: parse the app-server `userAgent` from `initialize` and decide whether the
exact runtime may declare `forkThroughTurn` (seed 000 §3.2).

The version is the token after the first `/` (`tutti_agent/0.1.0 (Linux; x86_64)`) or after
`<name> ` (`codex-cli 0.171.0`); pre-release suffixes parse and order as in SemVer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum

_VERSION = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)(?:-([0-9A-Za-z.-]+))?(?:\+[0-9A-Za-z.-]+)?$")


@dataclass(frozen=True, slots=True, order=False)
class Version:
    major: int
    minor: int
    patch: int
    prerelease: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str) -> Version | None:
        m = _VERSION.match(text.strip())
        if m is None:
            return None
        pre = tuple(m.group(4).split(".")) if m.group(4) else ()
        return cls(int(m.group(1)), int(m.group(2)), int(m.group(3)), pre)

    def _key(self) -> tuple[object, ...]:
        # SemVer precedence: a release outranks its pre-releases; numeric ids sort numerically
        # and below alphanumeric ones.
        pre: tuple[object, ...] = tuple(
            (0, int(p), "") if p.isdigit() else (1, 0, p) for p in self.prerelease
        )
        return (self.major, self.minor, self.patch, 0 if self.prerelease else 1, pre)

    def __ge__(self, other: Version) -> bool:
        return self._key() >= other._key()

    def __lt__(self, other: Version) -> bool:
        return self._key() < other._key()

    def __str__(self) -> str:
        core = f"{self.major}.{self.minor}.{self.patch}"
        return f"{core}-{'.'.join(self.prerelease)}" if self.prerelease else core


@dataclass(frozen=True, slots=True)
class UserAgent:
    brand: str
    version: str

    @classmethod
    def parse(cls, user_agent: str) -> UserAgent | None:
        """`brand/version (...)` or `brand version`; None when there is no version token."""
        text = user_agent.strip()
        if not text:
            return None
        head = text.split(" (", 1)[0].strip()
        if "/" in head:
            brand, _, rest = head.partition("/")
            version = rest.split()[0] if rest.split() else ""
        else:
            parts = head.split()
            if len(parts) < 2:
                return None
            brand, version = parts[0], parts[1]
        if not brand or not version:
            return None
        return cls(brand, version)


class GateVerdict(StrEnum):
    SUPPORTED = "supported"
    TOO_OLD = "too_old"
    WRONG_BRAND = "wrong_brand"
    UNPARSABLE = "unparsable"


@dataclass(frozen=True, slots=True)
class GateResult:
    verdict: GateVerdict
    version: str
    brand: str
    fork_through_turn: bool = field(init=False, compare=False)
    """Whether the runtime may declare `forkThroughTurn` (a `SUPPORTED` verdict): decided once
    when the runtime is handshaken, so a fork reads a field instead of calling into this
    module."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "fork_through_turn", self.verdict is GateVerdict.SUPPORTED)


@dataclass(frozen=True, slots=True)
class VersionGate:
    """The first version of a provider brand whose `thread/fork` takes `lastTurnId`."""

    brands: frozenset[str]
    minimum: Version
    rejected_brands: frozenset[str] = frozenset()

    def check(self, user_agent: str) -> GateResult:
        ua = UserAgent.parse(user_agent or "")
        if ua is None:
            return GateResult(GateVerdict.UNPARSABLE, "", "")
        if ua.brand in self.rejected_brands or (self.brands and ua.brand not in self.brands):
            return GateResult(GateVerdict.WRONG_BRAND, ua.version, ua.brand)
        version = Version.parse(ua.version)
        if version is None:
            return GateResult(GateVerdict.UNPARSABLE, ua.version, ua.brand)
        if version < self.minimum:
            return GateResult(GateVerdict.TOO_OLD, ua.version, ua.brand)
        return GateResult(GateVerdict.SUPPORTED, ua.version, ua.brand)


TUTTI_AGENT_MIN = Version(0, 0, 10)
TUTTI_AGENT_GATE = VersionGate(brands=frozenset({"tutti_agent"}), minimum=TUTTI_AGENT_MIN)
"""Tutti Agent proves its own version (`tutti_agent/<v>`); it never passes as Codex."""

CODEX_MIN = Version(0, 144, 0)
CODEX_GATE = VersionGate(
    # Codex echoes the clientInfo name we send as the brand, so the brand is known from the
    # binary we launched; what must never pass is a Tutti Agent posing as Codex.
    brands=frozenset(),
    minimum=CODEX_MIN,
    rejected_brands=frozenset({"tutti_agent", "tutti-agent"}),
)
