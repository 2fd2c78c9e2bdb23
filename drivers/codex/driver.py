"""The Codex provider of the generic app-server driver (`drivers.app_server.driver`): `codex
app-server` (pinned 0.171.0), one `CODEX_HOME` per Session. What is Codex's here
(`CodexProvider`): the command, the home's `config.toml` (and a private copy of the user's
login), the Session settings (approval policy, sandbox mode), attestations cached per exact
launch, the interrupt that waits for a just-started turn, and a fork child's Referenced lineage
in its own home (the binder re-run at resume, its ancestors loaded before a read).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from domain.enums import ProviderStateBindingMode
from domain.errors import InvalidArgument
from domain.model_limits import ModelLimits
from drivers.app_server.driver import AppServerDriver
from drivers.app_server.provider import config_env
from drivers.binder import BinderError, ParsedRollout, RolloutBinder
from drivers.codex.command import resolve_command
from drivers.codex.config import ApprovalPolicy, SandboxMode, render_config_toml, write_if_changed
from drivers.codex.lineage import (
    CONTEXT_KEY,
    ForkLineage,
    fork_lineage_of,
    prove_codex_child,
    rollout_lineage,
    rollout_path,
    session_meta,
)
from drivers.credentials import copy_login, credential_plan, file_key_env, user_codex_auth
from drivers.errors import DriverError
from drivers.failpoints import Failpoints
from drivers.known_rollouts import KnownRollouts
from drivers.turn_ends import TurnEnds
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


class CodexProvider:
    """The `AppServerProvider` of Codex."""

    kind = "codex"
    home_var = "CODEX_HOME"
    gate = CODEX_GATE
    binding_mode = ProviderStateBindingMode.HOST_COPY
    cache_attestations = True
    fork_exclude_turns = True
    fork_unloaded = False
    fork_copies_source = False
    turns_without_items = False
    turn_columns = False
    interrupt_waits_for_start = True
    # Answered at once even while a Turn streams (Codex 0.171; docs/performance.md).
    liveness_probe: str | None = "thread/loaded/list"

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.config = config
        self._homes: dict[Path, _HomeSpec] = {}
        self._homes_lock = threading.Lock()
        # Self-repair at resume never fires the fork failpoints (they belong to the saga).
        self._resume_binder = RolloutBinder()
        self._rollouts = KnownRollouts(rollout_path)
        self._turn_ends = TurnEnds()

    def command(self) -> list[str]:
        native = bool(self.config.get("resolve_native_binary", True))
        return [*resolve_command(self.config.get("command"), native=native), "app-server"]

    def extra_env(self, home: Path) -> dict[str, str]:
        return {**config_env(self.config), **file_key_env(self.config)}

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

    def open_session(self, home: Path, params: Mapping[str, Any]) -> None:
        """The Session's approval policy and sandbox mode (validated here, written into its
        `config.toml` at the next app-server start) and, for a fork child, its recorded source."""
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

    def close_session(self, home: Path) -> None:
        with self._homes_lock:
            self._homes.pop(home, None)
        self._rollouts.forget(home)
        self._turn_ends.forget(home)

    def history_gone(self, home: Path, thread_id: str, *, search: bool = True) -> bool | None:
        """Whether the thread's rollout is gone from `home` (True), there (False), or not
        known without a search of the home (None, with `search` false: a caller that must not
        walk directories). An app-server keeps a thread whose file was removed in memory and
        goes on appending to the removed file, so a bound history is checked here, not asked
        of it. A fork child is left to its re-bind at start (`_rebind`), which repairs or
        refuses its copy from the recorded source."""
        with self._homes_lock:
            spec = self._homes.get(home)
        if spec is not None and spec.lineage is not None:
            return False
        return self._rollouts.gone(home, thread_id, search=search)

    def turn_end_missing(
        self, home: Path, thread_id: str, turn_id: str, *, search: bool = True
    ) -> bool | None:
        """Whether the thread's history in `home` lacks the end of `turn_id` (a Turn the host
        bound and settled `completed`): True when neither its rollout nor, for a fork child,
        an ancestor's in the home holds it (cut back by hand, say); False when one does; None
        with `search` false when that is not known without reading more than a file's tail.
        (`drivers.turn_ends`)"""

        def files() -> list[Path]:
            paths = (rollout_path(home, t) for t in rollout_lineage(home, thread_id))
            return [p for p in paths if p is not None]

        tail = self._rollouts.known(home, thread_id)
        return self._turn_ends.missing(home, turn_id, tail, files, search=search)

    def homes_kept(self) -> int:
        with self._homes_lock:
            return len(self._homes)

    def session_context(self, home: Path, thread_id: str) -> dict[str, Any]:
        """The Session's home and thread, and a fork child's recorded source (what the next
        start re-binds from)."""
        with self._homes_lock:
            spec = self._homes.get(home)
        entry: dict[str, Any] = {"home": str(home), "threadId": thread_id}
        if spec is not None and spec.lineage is not None:
            entry["forkSource"] = spec.lineage.to_wire()
        return {CONTEXT_KEY: entry}

    def session_ancestors(self, home: Path) -> list[str]:
        """A fork child's own resume projects only its own lines: its ancestors are loaded
        too, so the home lists every inherited Turn (and can fork at one of them)."""
        with self._homes_lock:
            spec = self._homes.get(home)
        if spec is None or spec.lineage is None:
            return []
        return list(reversed(rollout_lineage(home, spec.thread_id)[1:]))

    def lineage(self, home: Path, thread_id: str) -> list[str]:
        """Codex indexes a copied rollout only once it loaded it: the thread's whole Referenced
        lineage, oldest first."""
        return list(reversed(rollout_lineage(home, thread_id)))

    def child_rollout_dir(self, target_home: Path) -> Path | None:
        return None  # Codex's layout is not guessed

    def derive_for_proof(self, known: Mapping[str, ParsedRollout]) -> None:
        """Nothing: the lineage reader takes nothing from the binder's parse."""

    def read_child(
        self,
        home: Path,
        child_id: str,
        source_id: str,
        prefix: list[str],
        attested: str,
        known: Mapping[str, ParsedRollout] | None = None,
        *,
        litter: list[object] | None = None,
    ) -> str | None:
        """The bound child's lineage read from the target home alone, in this worker: every
        referenced rollout present, the session_meta chain intact, turns = the prefix (the
        lines of a file that holds exactly what the bind wrote not decoded twice)."""
        return prove_codex_child(home, child_id, source_id, prefix, known)

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


def create_driver(config: Mapping[str, Any], failpoints: Failpoints) -> AppServerDriver:
    """The worker's entry point for `--provider codex`."""
    return AppServerDriver(config, failpoints, CodexProvider(config))
