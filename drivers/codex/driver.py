"""The Codex driver: the generic app-server driver (`drivers.app_server.driver`) over
`codex app-server` (pinned 0.171.0), one `CODEX_HOME` per Session. What is Codex's here: the
command, the home's `config.toml` (and a private copy of the user's login), the Session settings
(approval policy, sandbox mode), attestations cached per exact launch, the interrupt that waits
for a just-started turn, and a fork child's Referenced lineage in its own home (the binder re-run
at resume, its ancestors loaded before a read).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from domain.errors import Conflict, InvalidArgument
from domain.model_limits import ModelLimits
from drivers.app_server.driver import AppServerDriver
from drivers.app_server.process import AppServerFailure
from drivers.app_server.state import Runtime, SessionState
from drivers.base import ForkRequest, ProviderDriver
from drivers.binder import RolloutBinder
from drivers.codex.command import resolve_command
from drivers.codex.config import ApprovalPolicy, SandboxMode, render_config_toml, write_if_changed
from drivers.codex.lineage import (
    CONTEXT_KEY,
    ForkLineage,
    fork_lineage_of,
    rollout_lineage,
    rollout_path,
    session_meta,
)
from drivers.credentials import copy_login, credential_plan, file_key_env, user_codex_auth
from drivers.errors import DriverError
from drivers.failpoints import Failpoints
from drivers.readability import prove_codex_child
from drivers.rollout_files import BinderError
from drivers.versions import CODEX_GATE


@dataclass(frozen=True, slots=True)
class _HomeSpec:
    """What a Session's home needs before its app-server starts."""

    approval_policy: ApprovalPolicy
    sandbox_mode: SandboxMode
    thread_id: str
    lineage: ForkLineage | None


def _enum_setting(
    settings: Mapping[str, Any], keys: tuple[str, str], enum: type[StrEnum], default: StrEnum
) -> Any:
    for key in keys:
        if key in settings and settings[key] is not None:
            value = settings[key]
            try:
                return enum(str(value))
            except ValueError:
                allowed = ", ".join(m.value for m in enum)
                raise InvalidArgument(
                    f"settings.{key}", f"{key} must be one of {allowed}, not {value!r}"
                ) from None
    return default


class CodexDriver(AppServerDriver):
    kind = "codex"
    home_var = "CODEX_HOME"
    gate = CODEX_GATE
    cache_attestations = True
    fork_exclude_turns = True

    def __init__(self, config: Mapping[str, Any], failpoints: Failpoints) -> None:
        super().__init__(config, failpoints)
        self._homes: dict[Path, _HomeSpec] = {}
        self._homes_lock = threading.Lock()
        # Self-repair at resume never fires the fork failpoints (they belong to the saga).
        self._resume_binder = RolloutBinder()
        self.spawns = 0
        """App-servers started by this driver (tests pin that a projection spawns none)."""

    # ------------------------------------------------------------------ process

    def command(self) -> list[str]:
        native = bool(self.config.get("resolve_native_binary", True))
        return [*resolve_command(self.config.get("command"), native=native), "app-server"]

    def extra_env(self, home: Path) -> dict[str, str]:
        return {**super().extra_env(home), **file_key_env(self.config)}

    def prepare_home(self, home: Path) -> None:
        with self._homes_lock:
            spec = self._homes.get(home)
        approval = spec.approval_policy if spec else ApprovalPolicy.NEVER
        sandbox = spec.sandbox_mode if spec else SandboxMode.READ_ONLY
        base_url = self.config.get("model_base_url")
        model = self.config.get("model")
        plan = credential_plan(self.kind, self.config)
        if plan.source == "login":
            # The user's own `codex login`, seen by this home only (a private copy).
            copy_login(user_codex_auth(), home / "auth.json", provider=self.kind)
        write_if_changed(
            home / "config.toml",
            render_config_toml(
                model=str(model) if model else None,
                model_base_url=str(base_url) if base_url else None,
                approval_policy=approval,
                sandbox_mode=sandbox,
                env_key=plan.variable,
                requires_openai_auth=plan.source == "login",
                limits=ModelLimits.from_mapping(self.config),
            ),
        )
        if spec is not None and spec.lineage is not None and spec.thread_id:
            self._rebind(home, spec.thread_id, spec.lineage)

    def _spawn(self, home: Path, cwd: str | None, session: SessionState | None) -> Runtime:
        runtime = super()._spawn(home, cwd, session)
        with self._homes_lock:
            self.spawns += 1
            spec = self._homes.get(home)
        if session is not None and spec is not None and spec.lineage is not None:
            # The child's own resume projects only its own lines: project its ancestors too,
            # so the home lists every inherited Turn (and can fork at one of them).
            ancestors = rollout_lineage(home, spec.thread_id)[1:]
            try:
                self._project(runtime, reversed(ancestors))
            except AppServerFailure as exc:
                runtime.proc.close()
                raise DriverError(
                    f"cannot load the lineage of {spec.thread_id}: {exc}",
                    reason="provider_session_unavailable",
                ) from exc
        return runtime

    def _project(self, runtime: Runtime, thread_ids: Iterable[str]) -> None:
        """Resume, then unsubscribe, each thread: Codex 0.171 indexes a rollout's Turns in its
        home's history DB only when it loads that thread, and a copied rollout was never
        loaded there. Unsubscribing keeps the server from accumulating them."""
        for thread_id in thread_ids:
            runtime.proc.request(
                "thread/resume",
                {"threadId": thread_id, "excludeTurns": True},
                timeout=self.request_timeout,
            )
            runtime.proc.request(
                "thread/unsubscribe", {"threadId": thread_id}, timeout=self.request_timeout
            )

    def _rebind(self, home: Path, thread_id: str, lineage: ForkLineage) -> None:
        """Seed 000 §10: resume re-runs the idempotent binder from the recorded source, so a
        committed child whose copy is missing, truncated or torn repairs itself; post-fork
        appends are kept, anything else fails closed (the Session does not start)."""
        try:
            self._resume_binder.bind(Path(lineage.source_home), home, thread_id)
        except BinderError:
            raise
        except OSError as exc:
            raise DriverError(f"cannot re-bind {thread_id}: {exc}") from exc
        path = rollout_path(home, thread_id)
        try:
            parent = session_meta(path).get("forked_from_id") if path else None
        except (OSError, ValueError) as exc:
            raise DriverError(f"child rollout of {thread_id} unreadable: {exc}") from exc
        if parent != lineage.source_thread_id:
            raise DriverError(
                f"child {thread_id} names source {parent!r}, not {lineage.source_thread_id!r}",
                reason="provider_state_binding_failed",
            )

    def _load_lineage(self, runtime: Runtime, home: Path, thread_id: str) -> None:
        """A fresh app-server on the target home loads the child's whole lineage before it
        lists the child's turns (Codex indexes a copied rollout only once it loaded it)."""
        self._project(runtime, reversed(rollout_lineage(home, thread_id)))

    def _fork_runtime(self, request: ForkRequest) -> tuple[Runtime | None, bool]:
        """A transient fork runtime first loads the source's ancestors: Codex lists a thread's
        inherited Turns only once it loaded them in that home, and a fork child that never ran
        was loaded by no app-server there (its readability is proven in the worker)."""
        runtime, transient = super()._fork_runtime(request)
        if runtime is None or not transient:
            return runtime, transient
        home = Path(request.source.home)
        ancestors = rollout_lineage(home, request.source.provider_session_id)[1:]
        try:
            self._project(runtime, reversed(ancestors))
        except AppServerFailure:
            runtime.proc.close()
            return None, False
        return runtime, transient

    def _read_child_in_worker(
        self, runtime: Runtime, home: Path, child_id: str, source_id: str, prefix: list[str]
    ) -> str | None:
        """The bound child's lineage read from the target home alone, in this worker: every
        referenced rollout present, the session_meta chain intact, turns = the prefix."""
        return prove_codex_child(home, child_id, source_id, prefix)

    # ------------------------------------------------------------------ port methods

    def start_session(self, params: Mapping[str, Any]) -> dict[str, Any]:
        home_text = str(params.get("home") or "")
        if not home_text or not Path(home_text).is_absolute():
            raise InvalidArgument("home", "home must be an absolute path")
        home = Path(home_text)
        settings = params.get("settings")
        settings = settings if isinstance(settings, Mapping) else {}
        context = params.get("runtimeContext")
        context = context if isinstance(context, Mapping) else {}
        thread_id = str(params.get("providerSessionId") or "")
        spec = _HomeSpec(
            approval_policy=_enum_setting(
                settings,
                ("approvalPolicy", "approval_policy"),
                ApprovalPolicy,
                ApprovalPolicy.NEVER,
            ),
            sandbox_mode=_enum_setting(
                settings, ("sandboxMode", "sandbox_mode"), SandboxMode, SandboxMode.READ_ONLY
            ),
            thread_id=thread_id,
            lineage=fork_lineage_of(home, thread_id, context),
        )
        with self._homes_lock:
            self._homes[home] = spec
        result = super().start_session(params)
        entry: dict[str, Any] = {"home": str(home), "threadId": result["providerSessionId"]}
        if spec.lineage is not None:
            entry["forkSource"] = spec.lineage.to_wire()
        result["runtimeContext"][CONTEXT_KEY] = entry
        return result

    def interrupt_turn(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """Codex answers "no active turn to interrupt" until a just-started turn is running;
        while the turn is still ours and unfinished, that answer means "not yet": retry."""
        deadline = time.monotonic() + self.request_timeout
        provider_turn_id = str(params.get("providerTurnId") or "")
        while True:
            try:
                return super().interrupt_turn(params)
            except Conflict as exc:
                session = self._session(params)
                with session.state_lock:
                    unfinished = provider_turn_id in session.active
                if (
                    "no active turn" not in exc.message
                    or not unfinished
                    or time.monotonic() > deadline
                ):
                    raise
                time.sleep(0.05)


def create_driver(config: Mapping[str, Any], failpoints: Failpoints) -> ProviderDriver:
    return CodexDriver(config, failpoints)
