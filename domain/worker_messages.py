"""The typed messages between the host and its driver workers, standard library only: the fork
request and answer (seed 000 §7, §7.1), fork.resolve's inspect / adopt / quarantine requests and
answers, and the other worker calls (a runtime's attestation, a Session's start, stop and
provider history, a Turn's start and interrupt, an Interaction's answer).

Both ends use these types: the saga builds a `ForkRequest` and reads a `ForkResult`, the worker
hands the driver the `ForkRequest` and sends its `ForkResult`; fork.resolve sends a
`ResolveRequest` (`fork.inspect`, `fork.quarantine`) or a `ResolveAdopt` (`fork.adopt`) and
reads a `ResolveInspection` / `ForkResult` / `ResolveQuarantined`, which the worker's resolution
handlers take and give. Each other call's request type names its worker method (`METHOD`) and
converts to the params map the link carries (`to_wire`); each answer is read back once at the
host (`from_wire`). The maps are the ones internals.md pins ("Worker methods"), key for key: the
wire does not change. A runtime context (a driver's attested verdict) is the driver's own
record, persisted as given: it stays a map inside its typed answer, as a fork's binding receipt
does. `MalformedMessage` is what every worker message's `from_wire` raises on a map without its
type's shape (the turn events a driver streams, `domain.turn_events`, raise it too).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar

from domain.enums import DeliveryDisposition, ProviderStateBindingMode


class MalformedMessage(ValueError):
    """A worker message that does not have its type's shape; the receiver treats the answer as
    unverifiable (a fork answer → `unknown`) or drops the event."""


@dataclass(frozen=True, slots=True)
class ForkSource:
    agent_session_id: str
    provider_session_id: str
    home: str
    cwd: str

    def to_wire(self) -> dict[str, Any]:
        return {
            "agentSessionId": self.agent_session_id,
            "providerSessionId": self.provider_session_id,
            "home": self.home,
            "cwd": self.cwd,
        }


@dataclass(frozen=True, slots=True)
class ForkTarget:
    agent_session_id: str
    home: str
    # The child's own working directory when it differs from the source's (a `worktree`
    # fork): a provider that files its transcript by directory files the child's there.
    cwd: str | None = None

    def to_wire(self) -> dict[str, Any]:
        out = {"agentSessionId": self.agent_session_id, "home": self.home}
        if self.cwd:
            out["cwd"] = self.cwd
        return out


_FORK_REQUEST_KEYS = frozenset(
    {"source", "target", "providerTurnIds", "title", "driverKind", "driverVersion", "sourceTurnId"}
)


@dataclass(frozen=True, slots=True)
class ForkRequest:
    """The provider-neutral input of a driver fork: the frozen ordered provider Turn prefix
    (`provider_turn_ids`, last = the boundary Turn) and the frozen driver identity.

    `extra` holds the optional keys a driver may need (`providerTurnBindings`, and fork.resolve's
    `operationId`, `excludeChildIds`, `childId`); it travels as top-level keys of the map."""

    METHOD: ClassVar[str] = "fork"

    source: ForkSource
    target: ForkTarget
    provider_turn_ids: tuple[str, ...]
    title: str
    driver_kind: str
    driver_version: str
    extra: Mapping[str, Any] = field(default_factory=dict)
    # The source canonical Turn id of the boundary (seed 000 §7 provider-neutral input); the
    # drivers echo it in their binding receipt, so the evidence names the Turn it binds.
    source_turn_id: str = ""

    @property
    def provider_turn_bindings(self) -> tuple[str | None, ...]:
        """The frozen binding JSON of each Turn, lined up with `provider_turn_ids` (a
        provider_owned driver cuts at a known checkpoint with it); empty when not sent."""
        raw = self.extra.get("providerTurnBindings") or ()
        return tuple(None if b is None else str(b) for b in raw)

    @property
    def runtime_generation(self) -> str | None:
        """`runtimeGeneration`: the generation of the source runtime whose attested verdict
        let this fork leave the host; the worker refuses it (`not_started`) when
        another runtime is live by now. None: no such check (fork.resolve, older hosts)."""
        value = self.extra.get("runtimeGeneration")
        return value if isinstance(value, str) and value else None

    def to_wire(self) -> dict[str, Any]:
        # The key order is the one the saga always sent (a msgpack map, byte for byte).
        out: dict[str, Any] = {
            "source": self.source.to_wire(),
            "target": self.target.to_wire(),
            "sourceTurnId": self.source_turn_id,
            "providerTurnIds": list(self.provider_turn_ids),
        }
        out.update({k: v for k, v in self.extra.items() if k not in _FORK_REQUEST_KEYS})
        out.update(
            {
                "title": self.title,
                "driverKind": self.driver_kind,
                "driverVersion": self.driver_version,
            }
        )
        return out

    @classmethod
    def from_wire(cls, params: Mapping[str, Any]) -> ForkRequest:
        src = params.get("source") or {}
        tgt = params.get("target") or {}
        return cls(
            source=ForkSource(
                agent_session_id=str(src.get("agentSessionId", "")),
                provider_session_id=str(src.get("providerSessionId") or ""),
                home=str(src.get("home", "")),
                cwd=str(src.get("cwd", "")),
            ),
            target=ForkTarget(
                agent_session_id=str(tgt.get("agentSessionId", "")),
                home=str(tgt.get("home", "")),
                cwd=str(tgt["cwd"]) if tgt.get("cwd") else None,
            ),
            provider_turn_ids=tuple(str(t) for t in params.get("providerTurnIds") or ()),
            title=str(params.get("title") or ""),
            driver_kind=str(params.get("driverKind") or ""),
            driver_version=str(params.get("driverVersion") or ""),
            extra={k: v for k, v in params.items() if k not in _FORK_REQUEST_KEYS},
            source_turn_id=str(params.get("sourceTurnId") or ""),
        )


@dataclass(frozen=True, slots=True)
class ForkChild:
    provider_session_id: str
    forked_from_id: str
    provider_turn_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ForkBinding:
    mode: ProviderStateBindingMode
    receipt: Mapping[str, Any]
    # provider_owned: source provider Turn id → {rootProviderTurnId, bindingJson} of the child's.
    turn_bindings: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class ForkResult:
    """A driver's answer: `accepted` only with `child` and `binding` (the hard gate of §7.1)."""

    disposition: DeliveryDisposition
    error: str | None = None
    child: ForkChild | None = None
    binding: ForkBinding | None = None

    def __post_init__(self) -> None:
        if self.disposition is DeliveryDisposition.ACCEPTED and (
            self.child is None or self.binding is None
        ):
            raise ValueError("an accepted fork needs a verified child and a binding")

    @classmethod
    def not_started(cls, error: str) -> ForkResult:
        return cls(DeliveryDisposition.NOT_STARTED, error)

    @classmethod
    def rejected(cls, error: str) -> ForkResult:
        return cls(DeliveryDisposition.REJECTED, error)

    @classmethod
    def unknown(cls, error: str, child: ForkChild | None = None) -> ForkResult:
        return cls(DeliveryDisposition.UNKNOWN, error, child)

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"disposition": self.disposition.value}
        if self.error is not None:
            out["error"] = self.error
        if self.child is not None:
            out["child"] = {
                "providerSessionId": self.child.provider_session_id,
                "forkedFromId": self.child.forked_from_id,
                "providerTurnIds": list(self.child.provider_turn_ids),
            }
        if self.binding is not None:
            binding: dict[str, Any] = {
                "mode": self.binding.mode.value,
                "receipt": dict(self.binding.receipt),
            }
            if self.binding.turn_bindings is not None:
                binding["turnBindings"] = dict(self.binding.turn_bindings)
            out["binding"] = binding
        return out

    @classmethod
    def from_wire(cls, result: Mapping[str, Any]) -> ForkResult:
        """The host's reading of a worker's answer. Raises `MalformedMessage` for an answer
        that is not a `ForkResult` (an unknown disposition, `accepted` without a child or a
        binding, a binding mode that does not exist): the saga records such an answer
        `unknown`, never `failed` (the provider call may have happened)."""
        raw = str(result.get("disposition") or "")
        error_raw = result.get("error")
        error = None if error_raw is None else str(error_raw)
        try:
            disposition = DeliveryDisposition(raw)
        except ValueError:
            raise MalformedMessage(f"{raw or 'no disposition'}: {error or ''}") from None
        child_raw = result.get("child")
        child = None
        if isinstance(child_raw, Mapping):
            child = ForkChild(
                provider_session_id=str(child_raw.get("providerSessionId") or ""),
                forked_from_id=str(child_raw.get("forkedFromId") or ""),
                provider_turn_ids=tuple(str(t) for t in child_raw.get("providerTurnIds") or ()),
            )
        binding_raw = result.get("binding")
        binding = None
        if isinstance(binding_raw, Mapping):
            mode_raw = str(binding_raw.get("mode") or "")
            try:
                mode = ProviderStateBindingMode(mode_raw)
            except ValueError:
                raise MalformedMessage(f"unknown binding mode {mode_raw!r}") from None
            receipt = binding_raw.get("receipt")
            turn_bindings = binding_raw.get("turnBindings")
            binding = ForkBinding(
                mode=mode,
                receipt=dict(receipt) if isinstance(receipt, Mapping) else {},
                turn_bindings=dict(turn_bindings) if isinstance(turn_bindings, Mapping) else None,
            )
        if disposition is DeliveryDisposition.ACCEPTED:
            if child is None:
                raise MalformedMessage("no child provider session id")
            if binding is None:
                raise MalformedMessage("no binding receipt")
        return cls(disposition, error, child, binding)


# --------------------------------------------------------------------------- fork.resolve


@dataclass(frozen=True, slots=True)
class ResolveRequest:
    """The params of `fork.inspect` and `fork.quarantine`: which operation's
    provider children to look for (those whose lineage names the source and that no other
    operation claimed: `exclude_child_ids`), and what a verified child must show (the frozen
    provider Turn prefix, and for a provider_owned driver the frozen Turn bindings).

    `fork_request()` is the `ForkRequest` a driver re-verifies a child with, as its fork would.
    """

    INSPECT: ClassVar[str] = "fork.inspect"
    QUARANTINE: ClassVar[str] = "fork.quarantine"

    operation_id: str
    source: ForkSource
    target: ForkTarget
    provider_turn_ids: tuple[str, ...]
    exclude_child_ids: tuple[str, ...]
    title: str
    provider_turn_bindings: tuple[str | None, ...]
    driver_kind: str
    driver_version: str
    other_prefixes: tuple[tuple[str, ...], ...] = ()
    """The frozen provider Turn prefixes of the source's other operations that may own a child
    (not failed, not abandoned). A child showing one of them is that operation's, never this
    one's; a child that cannot be attributed by its Turns is this operation's evidence only
    when no other operation could own it (law 9)."""
    child_ids: tuple[str, ...] = ()
    """`fork.quarantine` only: the children the inspection attributed to this operation; no
    other file is moved."""

    def fork_request(self) -> ForkRequest:
        return ForkRequest.from_wire(self.to_wire())

    def to_wire(self) -> dict[str, Any]:
        # The key order fork.resolve always sent.
        return {
            "operationId": self.operation_id,
            "source": self.source.to_wire(),
            "target": self.target.to_wire(),
            "providerTurnIds": list(self.provider_turn_ids),
            "excludeChildIds": list(self.exclude_child_ids),
            "title": self.title,
            "providerTurnBindings": list(self.provider_turn_bindings),
            "driverKind": self.driver_kind,
            "driverVersion": self.driver_version,
            "otherPrefixes": [list(p) for p in self.other_prefixes],
            "childIds": list(self.child_ids),
        }

    def attributes(self, turns: tuple[str, ...] | None) -> bool:
        """Whether a provider child of the source whose Turns read as `turns` (None: could
        not be read) may be this operation's evidence: its Turns are this operation's frozen
        prefix; or they could not be read (then it is listed, undecided: an abandon refuses
        while another operation could own it, and it is never adoptable); or no other
        operation could own it."""
        if turns is None:
            return True
        if turns == self.provider_turn_ids:
            return True
        return not self.other_prefixes

    @classmethod
    def from_wire(cls, params: Mapping[str, Any]) -> ResolveRequest:
        fork = ForkRequest.from_wire(params)
        return cls(
            operation_id=str(params.get("operationId") or ""),
            source=fork.source,
            target=fork.target,
            provider_turn_ids=fork.provider_turn_ids,
            exclude_child_ids=tuple(str(c) for c in params.get("excludeChildIds") or ()),
            title=fork.title,
            provider_turn_bindings=fork.provider_turn_bindings,
            driver_kind=fork.driver_kind,
            driver_version=fork.driver_version,
            other_prefixes=tuple(
                tuple(str(t) for t in p)
                for p in params.get("otherPrefixes") or ()
                if isinstance(p, (list, tuple))
            ),
            child_ids=tuple(str(c) for c in params.get("childIds") or ()),
        )


@dataclass(frozen=True, slots=True)
class ResolveAdopt:
    """The params of `fork.adopt`: the inspection's scope plus the one child to adopt. The
    answer is a `ForkResult` (`accepted` with the child and its binding, like a fork's)."""

    METHOD: ClassVar[str] = "fork.adopt"

    scope: ResolveRequest
    child_id: str

    def to_wire(self) -> dict[str, Any]:
        return {**self.scope.to_wire(), "childId": self.child_id}

    @classmethod
    def from_wire(cls, params: Mapping[str, Any]) -> ResolveAdopt:
        return cls(ResolveRequest.from_wire(params), str(params.get("childId") or ""))


@dataclass(frozen=True, slots=True)
class ResolvedChild:
    """One provider child an operation may have left, as a driver found it.

    `read_error` is reported only by the drivers that read the child's Turns through a provider
    program (the app-servers: why it could not be read, else None); Claude reads its transcript
    and reports none (`reports_read_error` False: the key is absent from the map)."""

    provider_session_id: str
    forked_from_id: str
    provider_turn_ids: tuple[str, ...]
    turns_equal_prefix: bool
    reads_from_own_home: bool
    locations: tuple[str, ...]
    read_error: str | None = None
    reports_read_error: bool = False

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "providerSessionId": self.provider_session_id,
            "forkedFromId": self.forked_from_id,
            "providerTurnIds": list(self.provider_turn_ids),
        }
        if self.reports_read_error:
            out["readError"] = self.read_error
        out["turnsEqualPrefix"] = self.turns_equal_prefix
        out["readsFromOwnHome"] = self.reads_from_own_home
        out["locations"] = list(self.locations)
        return out

    @classmethod
    def from_wire(cls, child: Mapping[str, Any]) -> ResolvedChild:
        read_error = child.get("readError")
        return cls(
            provider_session_id=str(child.get("providerSessionId") or ""),
            forked_from_id=str(child.get("forkedFromId") or ""),
            provider_turn_ids=tuple(str(t) for t in child.get("providerTurnIds") or ()),
            # `is True`: the verdict trusts only an explicit yes.
            turns_equal_prefix=child.get("turnsEqualPrefix") is True,
            reads_from_own_home=child.get("readsFromOwnHome") is True,
            locations=tuple(str(n) for n in child.get("locations") or ()),
            read_error=None if read_error is None else str(read_error),
            reports_read_error="readError" in child,
        )


@dataclass(frozen=True, slots=True)
class ResolveInspection:
    """The answer of `fork.inspect`: the children found and the files already quarantined for
    this operation. The host adds its verdict (`adoptable` | `absent` | `ambiguous`)."""

    children: tuple[ResolvedChild, ...]
    quarantined: tuple[str, ...]

    def to_wire(self) -> dict[str, Any]:
        return {
            "children": [c.to_wire() for c in self.children],
            "quarantined": list(self.quarantined),
        }

    @classmethod
    def from_wire(cls, result: Mapping[str, Any]) -> ResolveInspection:
        children = result.get("children") or ()
        if not all(isinstance(c, Mapping) for c in children):
            raise MalformedMessage("fork.inspect children must be maps")
        return cls(
            tuple(ResolvedChild.from_wire(c) for c in children),
            tuple(str(p) for p in result.get("quarantined") or ()),
        )


@dataclass(frozen=True, slots=True)
class ResolveQuarantined:
    """The answer of `fork.quarantine`: where each child file was moved (never deleted)."""

    moved: tuple[str, ...]

    def to_wire(self) -> dict[str, Any]:
        return {"moved": list(self.moved)}

    @classmethod
    def from_wire(cls, result: Mapping[str, Any]) -> ResolveQuarantined:
        return cls(tuple(str(p) for p in result.get("moved") or ()))


# --------------------------------------------------------------------------- the other worker calls

_EMPTY: Mapping[str, Any] = MappingProxyType({})


def _map(value: Any, name: str) -> Mapping[str, Any]:
    if value is None:
        return _EMPTY
    if not isinstance(value, Mapping):
        raise MalformedMessage(f"{name} must be a map, not {type(value).__name__}")
    return value


def _generation(value: Any) -> str | None:
    """A runtime generation: anything but a non-empty string is none (the host then
    re-attests before the next fork)."""
    return value if isinstance(value, str) and value else None


def _positive(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and value > 0 else None


@dataclass(frozen=True, slots=True)
class RuntimeStamp:
    """What a worker adds to the answer of a call that carries a verdict, when the runtime it
    came from was live before and after the call: its generation, the pid of its process and
    how long the driver keeps it idle (the host reuses it for a fork within that window)."""

    generation: str | None = None
    pid: int | None = None
    idle_s: float | None = None
    worker_pid: int | None = None
    """The worker process's own pid: the runtime dies with it."""

    @classmethod
    def from_wire(cls, result: Mapping[str, Any]) -> RuntimeStamp:
        pid = _positive(result.get("runtimePid"))
        worker_pid = _positive(result.get("workerPid"))
        return cls(
            generation=_generation(result.get("runtimeGeneration")),
            pid=None if pid is None else int(pid),
            idle_s=_positive(result.get("runtimeIdleS")),
            worker_pid=None if worker_pid is None else int(worker_pid),
        )

    KEYS: ClassVar[frozenset[str]] = frozenset(
        {"runtimeGeneration", "runtimePid", "runtimeIdleS", "workerPid"}
    )


@dataclass(frozen=True, slots=True)
class RuntimeAttest:
    """`runtime.attest`: the dispatch-time re-attestation of a Session's prepared runtime."""

    METHOD: ClassVar[str] = "runtime.attest"

    agent_session_id: str
    home: str
    cwd: str
    settings: Mapping[str, Any] = field(default_factory=dict)

    def to_wire(self) -> dict[str, Any]:
        return {
            "agentSessionId": self.agent_session_id,
            "home": self.home,
            "cwd": self.cwd,
            "settings": dict(self.settings),
        }


@dataclass(frozen=True, slots=True)
class Attestation:
    """The answer to `runtime.attest`: the driver's verdict (`driverKind`, `driverVersion`,
    `bindingMode`, `binderAvailable`, `forkThroughTurn`, …) and the runtime's stamp."""

    verdict: Mapping[str, Any]
    stamp: RuntimeStamp = RuntimeStamp()

    @classmethod
    def from_wire(cls, result: Mapping[str, Any]) -> Attestation:
        verdict = {k: v for k, v in result.items() if k not in RuntimeStamp.KEYS}
        return cls(verdict, RuntimeStamp.from_wire(result))


@dataclass(frozen=True, slots=True)
class SessionStart:
    """`session.start`: start or resume a Session's provider runtime on its own home.
    `bound_history`: as `TurnStart`'s (a driver that finds the bound history gone fails the
    start rather than resume or start afresh); `bound_turn_id` too."""

    METHOD: ClassVar[str] = "session.start"

    agent_session_id: str
    home: str
    cwd: str
    settings: Mapping[str, Any]
    model: str | None
    provider_session_id: str | None
    runtime_context: Mapping[str, Any]
    bound_history: bool = False
    bound_turn_id: str | None = None

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "agentSessionId": self.agent_session_id,
            "home": self.home,
            "cwd": self.cwd,
            "settings": dict(self.settings),
            "model": self.model,
            "providerSessionId": self.provider_session_id,
            "runtimeContext": dict(self.runtime_context),
        }
        if self.bound_history:
            out["boundHistory"] = True
        if self.bound_turn_id:
            out["boundTurnId"] = self.bound_turn_id
        return out


@dataclass(frozen=True, slots=True)
class SessionStarted:
    """The answer to `session.start`: the provider's session id, the runtime context to
    persist (the attested verdict and what the driver adds), and the runtime's stamp."""

    provider_session_id: str
    runtime_context: Mapping[str, Any]
    stamp: RuntimeStamp = RuntimeStamp()

    @classmethod
    def from_wire(cls, result: Mapping[str, Any]) -> SessionStarted:
        return cls(
            provider_session_id=str(result.get("providerSessionId") or ""),
            runtime_context=dict(_map(result.get("runtimeContext"), "runtimeContext")),
            stamp=RuntimeStamp.from_wire(result),
        )


@dataclass(frozen=True, slots=True)
class SessionStop:
    """`session.stop`: stop the Session's provider runtime (it respawns at the next use).
    `start_only` (`startOnly`): stop nothing healthy; end the Session's start in progress only
    if its app-server is found stopped (SIGSTOP) while the start waits on it — the start then
    fails `provider_stopped` — and answer once that start has ended (an interrupted Turn's, a
    deleted Session's start: design/drivers.md "The starting case"); a healthy start goes on,
    its runtime kept."""

    METHOD: ClassVar[str] = "session.stop"

    agent_session_id: str
    start_only: bool = False

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {"agentSessionId": self.agent_session_id}
        if self.start_only:
            wire["startOnly"] = True
        return wire


@dataclass(frozen=True, slots=True)
class HistoryRequest:
    """`session.history`: the provider's own Turns of the Session, in its order. `home`: the
    Session's provider home, for the answer's `final` (None: never final)."""

    METHOD: ClassVar[str] = "session.history"

    agent_session_id: str
    home: str | None = None
    after_index: int = 0
    """The page's first Turn: the index (in the provider's order) the last page's
    `nextIndex` named; 0 for the first page."""
    cursor: str | None = None
    """The last page's `historyCursor`: the worker answers this page from the history it read
    for the first (held a short time), not from a new read of the provider's."""

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"agentSessionId": self.agent_session_id}
        if self.home is not None:
            out["home"] = self.home
        if self.after_index:
            out["afterIndex"] = self.after_index
        if self.cursor is not None:
            out["historyCursor"] = self.cursor
        return out


HISTORY_PAGE_CHARS = 8 << 20
"""The most characters of text (user texts, bindings, ids) one `session.history` page carries:
at most 4 UTF-8 bytes each, 32 MiB, half the host↔worker link's 64 MiB frame. A page ends
before the Turn that would take it past this (never before its first Turn)."""

HISTORY_TURN_ALLOWANCE = 64
"""Characters counted per Turn of a page beyond its texts (its keys, its status)."""


def history_turn_chars(turn: Mapping[str, Any]) -> int:
    """What one history Turn counts for in a page (and in what a worker holds): its texts'
    characters and `HISTORY_TURN_ALLOWANCE`."""
    return HISTORY_TURN_ALLOWANCE + sum(
        len(value) for value in turn.values() if isinstance(value, str)
    )


def history_page(
    turns: Sequence[Mapping[str, Any]], after_index: int, max_chars: int = HISTORY_PAGE_CHARS
) -> tuple[list[Mapping[str, Any]], int | None]:
    """The page of `turns` (a provider's whole history, in its order) that starts at
    `after_index`, and the index the next page starts at (None: this page ends the history).
    The page ends before the Turn that would take its text past `max_chars`, never before its
    first, so paging always moves on."""
    page: list[Mapping[str, Any]] = []
    used = 0
    for index in range(max(after_index, 0), len(turns)):
        turn = turns[index]
        size = history_turn_chars(turn)
        if page and used + size > max_chars:
            return page, index
        page.append(turn)
        used += size
    return page, None


@dataclass(frozen=True, slots=True)
class HistoryTurn:
    """One provider Turn: its id, status, the user's text and (Claude Code) its binding."""

    provider_turn_id: str
    status: str = ""
    user_text: str | None = None
    binding_json: str | None = None

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"providerTurnId": self.provider_turn_id, "status": self.status}
        out["userText"] = self.user_text
        if self.binding_json is not None:
            out["bindingJson"] = self.binding_json
        return out


@dataclass(frozen=True, slots=True)
class SessionHistory:
    """The answer to `session.history`. `final`: no process that may hold a `turn.start`
    the answering worker never received is alive, so the history holds every Turn the
    provider will ever have of one (drivers/history_final.py); absent or not `true`: False."""

    turns: tuple[HistoryTurn, ...]
    final: bool = False
    next_index: int | None = None
    """Set: the history goes on past this page; ask again with `after_index` = it."""
    cursor: str | None = None
    """With `next_index`: the history the worker read, held for the next page's request."""

    @classmethod
    def from_wire(cls, result: Mapping[str, Any]) -> SessionHistory:
        raw = result.get("turns") or []
        if not isinstance(raw, (list, tuple)):
            raise MalformedMessage("turns must be a list")
        turns = []
        for item in raw:
            entry = _map(item, "a history turn")
            text, binding = entry.get("userText"), entry.get("bindingJson")
            turns.append(
                HistoryTurn(
                    provider_turn_id=str(entry.get("providerTurnId") or ""),
                    status=str(entry.get("status") or ""),
                    user_text=text if isinstance(text, str) else None,
                    binding_json=binding if isinstance(binding, str) and binding else None,
                )
            )
        next_index = result.get("nextIndex")
        if next_index is not None and (type(next_index) is not int or next_index < 1):
            raise MalformedMessage("nextIndex must be a positive integer")
        cursor = result.get("historyCursor")
        if cursor is not None and not isinstance(cursor, str):
            raise MalformedMessage("historyCursor must be a string")
        return cls(
            tuple(turns), final=result.get("final") is True, next_index=next_index, cursor=cursor
        )


@dataclass(frozen=True, slots=True)
class TurnStart:
    """`turn.start`: run a Turn. With `runtime_generation` (and `home`) it goes to that warm
    runtime only: the worker refuses it (`runtime_changed`) if another one is live.
    `bound_history`: a Turn of the Session is bound to its provider, so the provider's history
    of it must exist (a driver that finds none fails the Turn rather than start afresh).
    `bound_turn_id`: the provider's id of the Session's last Turn bound and settled
    `completed`, whose end its history must still hold (a driver that finds it cut off fails
    the start, `provider_history_missing`); None when there is none."""

    METHOD: ClassVar[str] = "turn.start"

    agent_session_id: str
    turn_id: str
    text: str
    home: str | None = None
    runtime_generation: str | None = None
    bound_history: bool = False
    bound_turn_id: str | None = None

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "agentSessionId": self.agent_session_id,
            "turnId": self.turn_id,
            "text": self.text,
        }
        if self.runtime_generation is not None:
            out.update(home=self.home, runtimeGeneration=self.runtime_generation)
        if self.bound_history:
            out["boundHistory"] = True
        if self.bound_turn_id:
            out["boundTurnId"] = self.bound_turn_id
        return out


@dataclass(frozen=True, slots=True)
class TurnAccepted:
    """The answer to `turn.start`: the provider's id of the Turn (its events follow)."""

    provider_turn_id: str

    @classmethod
    def from_wire(cls, result: Mapping[str, Any]) -> TurnAccepted:
        return cls(str(result.get("providerTurnId") or ""))


@dataclass(frozen=True, slots=True)
class TurnInterrupt:
    """`turn.interrupt`: stop the Session's running provider Turn."""

    METHOD: ClassVar[str] = "turn.interrupt"

    agent_session_id: str
    provider_turn_id: str

    def to_wire(self) -> dict[str, Any]:
        return {"agentSessionId": self.agent_session_id, "providerTurnId": self.provider_turn_id}


@dataclass(frozen=True, slots=True)
class InteractionRespond:
    """`interaction.respond`: the answer to a pending Interaction (`{decision}` for an
    approval, `{text}` for a question; the driver checks which)."""

    METHOD: ClassVar[str] = "interaction.respond"

    agent_session_id: str
    request_id: str
    response: Mapping[str, Any]

    def to_wire(self) -> dict[str, Any]:
        return {
            "agentSessionId": self.agent_session_id,
            "requestId": self.request_id,
            "response": dict(self.response),
        }
