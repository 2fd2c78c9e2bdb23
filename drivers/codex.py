"""The Codex driver: one live `codex app-server` (pinned 0.171.0) per active Session, each with its
own `CODEX_HOME` holding a generated `config.toml`, a private HOME and TMPDIR; turns, interactions
and the verified through-turn fork are those of `AppServerDriver` (seed 000 §7, §7.1).

What is Codex-specific lives here: command resolution, the per-home `config.toml`, the historical
capability cache keyed by the exact launch fingerprint, and the Referenced-lineage handling a
Codex 0.171 child needs in its own home (binder re-run at resume, history projection).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shlex
import shutil
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from domain.errors import Conflict, HostError, InvalidArgument
from drivers.app_server.driver import AppServerDriver
from drivers.app_server.process import AppServerFailure, private_env
from drivers.app_server.state import Runtime, SessionState
from drivers.base import ForkRequest, ProviderDriver
from drivers.binder import ROLLOUT_DIRS, BinderError, RolloutBinder
from drivers.credentials import copy_login, credential_plan, file_key_env, user_codex_auth
from drivers.errors import DriverError
from drivers.failpoints import Failpoints
from drivers.readability import prove_codex_child
from drivers.versions import CODEX_GATE

REPO_ROOT = Path(__file__).resolve().parent.parent
PINNED_PREFIX = REPO_ROOT / "build" / "providers" / "codex"
CONTEXT_KEY = "codex"
"""The driver's own key in a Session's runtime context: `{home, threadId, forkSource}`."""

# npm installs the real binary in a per-platform optional package next to the JS shim.
_NATIVE_PACKAGES: dict[tuple[str, str], tuple[str, str]] = {
    ("Linux", "x86_64"): ("codex-linux-x64", "x86_64-unknown-linux-musl"),
    ("Linux", "aarch64"): ("codex-linux-arm64", "aarch64-unknown-linux-musl"),
    ("Darwin", "x86_64"): ("codex-darwin-x64", "x86_64-apple-darwin"),
    ("Darwin", "arm64"): ("codex-darwin-arm64", "aarch64-apple-darwin"),
}


class ApprovalPolicy(StrEnum):
    """When Codex asks before acting; anything but `never` raises approval Interactions."""

    NEVER = "never"
    ON_REQUEST = "on-request"
    ON_FAILURE = "on-failure"
    # Codex 0.171 refuses to start with "untrusted" ("no longer supported").


class SandboxMode(StrEnum):
    READ_ONLY = "read-only"
    WORKSPACE_WRITE = "workspace-write"
    DANGER_FULL_ACCESS = "danger-full-access"


# --------------------------------------------------------------------------- command


def native_binary(node_modules: Path) -> Path | None:
    """The platform's native `codex` inside an npm install (about 70 ms faster to start than
    the node shim, and an executable whose identity can be fingerprinted)."""
    key = _NATIVE_PACKAGES.get((platform.system(), platform.machine()))
    if key is None:
        return None
    package, triple = key
    path = node_modules / "@openai" / package / "vendor" / triple / "bin" / "codex"
    return path if path.is_file() and os.access(path, os.X_OK) else None


def default_command() -> list[str]:
    """The pinned install under the repo's build/ dir (native binary, else its npm shim), else
    `codex` on PATH."""
    node_modules = PINNED_PREFIX / "node_modules"
    native = native_binary(node_modules)
    if native is not None:
        return [str(native)]
    shim = node_modules / ".bin" / "codex"
    if shim.exists():
        return [str(shim)]
    return [shutil.which("codex") or "codex"]


def native_behind_npm_shim(program: str) -> Path | None:
    """The native `codex` that npm's `node` wrapper would run, or None when `program` is not
    that wrapper (or its platform binary is missing).

    The wrapper is `@openai/codex`'s `bin/codex.js` (usually reached through the
    `node_modules/.bin/codex` symlink); it resolves `@openai/codex-<platform>` the way
    `require.resolve` does — the package's own `node_modules`, then each enclosing
    `node_modules` — falling back to the package's own `vendor/` dir, and then `execve`s
    `vendor/<triple>/bin/codex` with the same arguments. Spawning that binary directly saves a
    Node.js start per app-server (issue 20). The wrapper also exports `CODEX_MANAGED_BY_NPM` /
    `CODEX_MANAGED_PACKAGE_ROOT`, which only `codex doctor` reads; they are not set here.
    """
    found = shutil.which(program) if os.sep not in program else program
    if not found:
        return None
    real = Path(os.path.realpath(found))
    if real.name != "codex.js" or real.parent.name != "bin":
        return None
    package = real.parent.parent
    try:
        manifest = json.loads((package / "package.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict) or manifest.get("name") != "@openai/codex":
        return None
    for node_modules in [
        package / "node_modules",
        *(d for d in package.parents if d.name == "node_modules"),
    ]:
        native = native_binary(node_modules)
        if native is not None:
            return native
    key = _NATIVE_PACKAGES.get((platform.system(), platform.machine()))
    if key is not None:
        vendored = package / "vendor" / key[1] / "bin" / "codex"
        if vendored.is_file() and os.access(vendored, os.X_OK):
            return vendored
    return None


def resolve_command(configured: Any, *, native: bool = True) -> list[str]:
    """`[providers.codex] command` (a string is split like a shell would, a list is taken as
    is), else `default_command()`. A configured npm `node` wrapper is replaced by the native
    binary it would run (same arguments) unless `native` is false; without one, the wrapper is
    kept. The `app-server` argument is added by the driver."""
    if isinstance(configured, str) and configured.strip():
        argv = shlex.split(configured)
    elif isinstance(configured, Sequence) and not isinstance(configured, str) and configured:
        argv = [str(part) for part in configured]
    else:
        return default_command()
    if native:
        binary = native_behind_npm_shim(argv[0])
        if binary is not None:
            return [str(binary), *argv[1:]]
    return argv


# --------------------------------------------------------------------------- config.toml


def _toml_string(value: str) -> str:
    # JSON string escapes are valid TOML basic-string escapes.
    return json.dumps(value)


def render_config_toml(
    *,
    model: str | None,
    model_base_url: str | None,
    approval_policy: ApprovalPolicy,
    sandbox_mode: SandboxMode,
    env_key: str | None = None,
    requires_openai_auth: bool = False,
) -> str:
    """The offline `config.toml` of PROVIDERS.md: a local Responses endpoint, no retries, and
    the features that would reach the network (plugins) or the login shell (snapshots) off."""
    lines: list[str] = []
    if model:
        lines.append(f"model = {_toml_string(model)}")
    if model_base_url:
        lines.append('model_provider = "agenthost"')
    lines += [
        f"approval_policy = {_toml_string(approval_policy.value)}",
        f"sandbox_mode = {_toml_string(sandbox_mode.value)}",
    ]
    if model_base_url:
        lines += [
            "",
            "[model_providers.agenthost]",
            'name = "agenthost model endpoint"',
            f"base_url = {_toml_string(model_base_url)}",
            'wire_api = "responses"',
            # Codex's own mechanism: it reads the key from this variable of its environment
            # and sends it as a Bearer token; the key is never written here.
            *([f"env_key = {_toml_string(env_key)}"] if env_key else []),
            f"requires_openai_auth = {'true' if requires_openai_auth else 'false'}",
            "supports_websockets = false",
            "request_max_retries = 0",
            "stream_max_retries = 0",
        ]
    lines += [
        "",
        "[features]",
        "plugins = false",
        "shell_snapshot = false",
        "",
        "[analytics]",
        "enabled = false",
        "",
    ]
    return "\n".join(lines)


def _write_if_changed(path: Path, text: str) -> None:
    data = text.encode()
    try:
        if path.read_bytes() == data:
            return
    except OSError:
        pass
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


# --------------------------------------------------------------------------- launch fingerprint


@dataclass(frozen=True, slots=True)
class ExecutableIdentity:
    """What identifies the program a launch really runs: the resolved file's inode, size,
    mtime and ctime (ctime cannot be set back, so a replaced or touched binary changes it)."""

    path: str
    device: int
    inode: int
    size: int
    mtime_ns: int
    ctime_ns: int


def executable_identity(argv0: str, env: Mapping[str, str]) -> ExecutableIdentity | None:
    """The identity of a native executable, or None when it cannot be proven: not found, or a
    `#!` script (a shell/package-manager wrapper such as npm's `.bin/codex` node shim picks
    the program it runs at run time, so its own bytes prove nothing about that program)."""
    found = shutil.which(argv0, path=env.get("PATH")) if os.sep not in argv0 else argv0
    if not found:
        return None
    real = os.path.realpath(found)
    try:
        with open(real, "rb") as fh:
            if fh.read(2) == b"#!":
                return None
            st = os.fstat(fh.fileno())
    except OSError:
        return None
    return ExecutableIdentity(
        real, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns
    )


def launch_fingerprint(argv: Sequence[str], cwd: str, env: Mapping[str, str]) -> str | None:
    """SHA-256 over the exact launch (argv, cwd, env, executable identity), or None when the
    launch must not be cached (seed 000 §6.3: wrappers are always re-probed)."""
    if not argv:
        return None
    identity = executable_identity(argv[0], env)
    if identity is None:
        return None
    document = {
        "argv": list(argv),
        "cwd": cwd,
        "env": sorted(env.items()),
        "executable": [
            identity.path,
            identity.device,
            identity.inode,
            identity.size,
            identity.mtime_ns,
            identity.ctime_ns,
        ],
    }
    return hashlib.sha256(json.dumps(document, sort_keys=True).encode()).hexdigest()


# --------------------------------------------------------------------------- lineage


@dataclass(frozen=True, slots=True)
class ForkLineage:
    """Where a committed fork child's provider state came from: the home and thread of its
    direct source. Re-binding from it at resume repairs a child whose copy was lost."""

    source_home: str
    source_thread_id: str

    def to_wire(self) -> dict[str, str]:
        return {"home": self.source_home, "threadId": self.source_thread_id}


def fork_lineage_of(
    home: Path, thread_id: str, runtime_context: Mapping[str, Any]
) -> ForkLineage | None:
    """The fork source of a Session, from its canonical runtime context.

    A fork child inherits its source's context frozen at prepare (seed 000 §5), so a `codex`
    entry naming another home and another thread is the direct source; once the child has run,
    its own entry names itself and keeps the recorded `forkSource`.
    """
    entry = runtime_context.get(CONTEXT_KEY)
    if not thread_id or not isinstance(entry, Mapping):
        return None
    recorded_home, recorded_thread = entry.get("home"), entry.get("threadId")
    if recorded_thread == thread_id:
        source = entry.get("forkSource")
        if (
            isinstance(source, Mapping)
            and isinstance(source.get("home"), str)
            and isinstance(source.get("threadId"), str)
            and source["home"] != str(home)
        ):
            return ForkLineage(source["home"], source["threadId"])
        return None
    if (
        isinstance(recorded_home, str)
        and isinstance(recorded_thread, str)
        and recorded_thread
        and recorded_home != str(home)
    ):
        return ForkLineage(recorded_home, recorded_thread)
    return None


def _rollout_path(home: Path, thread_id: str) -> Path | None:
    suffix = f"-{thread_id}.jsonl"
    for dirname in ROLLOUT_DIRS:
        root = home / dirname
        if root.is_dir() and not root.is_symlink():
            for path in sorted(root.rglob(f"rollout-*{suffix}")):
                return path
    return None


def _session_meta(path: Path) -> Mapping[str, Any]:
    with path.open("rb") as fh:
        first = json.loads(fh.readline())
    payload = first.get("payload") if isinstance(first, dict) else None
    if not isinstance(first, dict) or first.get("type") != "session_meta":
        raise ValueError(f"{path}: first line is not session_meta")
    return payload if isinstance(payload, dict) else {}


def rollout_lineage(home: Path, thread_id: str) -> list[str]:
    """The thread and the ancestors its rollout references in `home`, child first. A Codex
    0.171 child only holds its own lines and reads the rest through `forked_from_id`."""
    chain: list[str] = []
    current: str | None = thread_id
    while current and current not in chain and len(chain) < 64:
        chain.append(current)
        path = _rollout_path(home, current)
        if path is None:
            break
        try:
            parent = _session_meta(path).get("forked_from_id")
        except (OSError, ValueError):
            break
        current = parent if isinstance(parent, str) and parent else None
    return chain


# --------------------------------------------------------------------------- the driver


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

    def __init__(self, config: Mapping[str, Any], failpoints: Failpoints) -> None:
        super().__init__(config, failpoints)
        self._homes: dict[Path, _HomeSpec] = {}
        self._homes_lock = threading.Lock()
        self._attest_cache: dict[str, dict[str, Any]] = {}
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
        _write_if_changed(
            home / "config.toml",
            render_config_toml(
                model=str(model) if model else None,
                model_base_url=str(base_url) if base_url else None,
                approval_policy=approval,
                sandbox_mode=sandbox,
                env_key=plan.variable,
                requires_openai_auth=plan.source == "login",
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
        path = _rollout_path(home, thread_id)
        try:
            parent = _session_meta(path).get("forked_from_id") if path else None
        except (OSError, ValueError) as exc:
            raise DriverError(f"child rollout of {thread_id} unreadable: {exc}") from exc
        if parent != lineage.source_thread_id:
            raise DriverError(
                f"child {thread_id} names source {parent!r}, not {lineage.source_thread_id!r}",
                reason="provider_state_binding_failed",
            )

    def _verify_readable(self, home: Path, child_id: str, prefix: list[str]) -> str | None:
        """Prove the bound child reads from the target home alone: a fresh app-server there
        loads its whole lineage and lists exactly the frozen prefix."""
        try:
            runtime = self._spawn(home, None, None)
        except HostError as exc:
            return str(exc)
        try:
            self._project(runtime, reversed(rollout_lineage(home, child_id)))
            turns = [str(t.get("id")) for t in self._thread_turns(runtime, child_id)]
        except AppServerFailure as exc:
            return str(exc)
        finally:
            runtime.proc.close()
        if turns != prefix:
            return f"target home shows turns {turns}"
        return None

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

    def _probe(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """A live runtime attests itself; otherwise a transient one is probed, and its answer
        is reused only for the exact same launch (seed 000 §6.3)."""
        home = Path(str(params.get("home") or ""))
        if not str(home) or not home.is_absolute():
            raise InvalidArgument("home", "home must be an absolute path")
        live = self._live_runtime_for_home(home)
        if live is not None:
            return self._attestation(live)
        cwd = str(params.get("cwd") or "")
        launch_cwd = cwd if cwd and Path(cwd).is_dir() else str(home)
        env = private_env(None, self.home_var, home, self.extra_env(home))
        fingerprint = launch_fingerprint(self.command(), launch_cwd, env)
        if fingerprint is not None:
            with self._homes_lock:
                cached = self._attest_cache.get(fingerprint)
            if cached is not None:
                return dict(cached)
        result = super()._probe(params)
        if fingerprint is not None:
            with self._homes_lock:
                self._attest_cache[fingerprint] = dict(result)
        return result


def create_driver(config: Mapping[str, Any], failpoints: Failpoints) -> ProviderDriver:
    return CodexDriver(config, failpoints)
