"""The tutti-agent provider of the generic app-server driver (`drivers.app_server.driver`):
`tutti-agent app-server` with its own `TUTTI_AGENT_HOME` per Session. What is tutti-agent's
here (`TuttiAgentProvider`): the command (configured, else the `tutti-agent` script next to this
interpreter, with the model flags), the key-file environment, the version gate, where a fork
child's rollout lands and the in-worker readability proof with tutti_agent's own reader.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from domain.enums import ProviderStateBindingMode
from domain.model_limits import ModelLimits
from drivers.app_server.driver import AppServerDriver
from drivers.app_server.fork import ReaderNotApplicable, prefix_problem
from drivers.app_server.provider import config_env
from drivers.binder import ParsedRollout
from drivers.credentials import credential_plan, file_key_env
from drivers.failpoints import Failpoints
from drivers.known_rollouts import KnownRollouts
from drivers.turn_ends import TurnEnds
from drivers.versions import TUTTI_AGENT_GATE

__all__ = ["TuttiAgentProvider", "create_driver", "prove_tutti_child"]

MODEL_BASE_URL_VAR = "TUTTI_AGENT_MODEL_BASE_URL"
"""Carries `model_base_url` to the app-server (`tutti-agent app-server` reads it as the default
of `--model-base-url`)."""


class TuttiAgentProvider:
    """The `AppServerProvider` of tutti-agent."""

    kind = "tutti-agent"
    home_var = "TUTTI_AGENT_HOME"
    gate = TUTTI_AGENT_GATE
    binding_mode = ProviderStateBindingMode.HOST_COPY
    cache_attestations = False
    fork_exclude_turns = False
    fork_unloaded = True
    fork_copies_source = True
    turns_without_items = True
    turn_columns = True
    interrupt_waits_for_start = False
    liveness_probe: str | None = "thread/loaded/list"

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.config = config
        self._rollouts = KnownRollouts(_find_rollout)
        self._turn_ends = TurnEnds()

    def command(self) -> list[str]:
        configured = self.config.get("command")
        if isinstance(configured, str) and configured.strip():
            base = shlex.split(configured)
        elif isinstance(configured, Sequence) and not isinstance(configured, str) and configured:
            base = [str(part) for part in configured]
        else:
            # The console script installed next to the interpreter running this worker.
            base = [str(Path(sys.executable).parent / "tutti-agent")]
        argv = [*base, "app-server"]
        if self.config.get("model_base_url"):
            # The URL itself reaches the app-server through its environment (`extra_env`),
            # never its command line, which every user may read (it may hold a password).
            argv += ["--wire-api", str(self.config.get("wire_api") or "responses")]
            # Only the variable's name: the app-server reads the key at each request.
            plan = credential_plan(self.kind, self.config)
            if plan.variable:
                argv += ["--api-key-env", plan.variable]
            limits = ModelLimits.from_mapping(self.config)
            argv += [
                "--first-byte-seconds",
                f"{limits.first_byte_s:g}",
                "--stream-idle-seconds",
                f"{limits.stream_idle_s:g}",
                "--retries",
                str(limits.retries),
            ]
        if self.config.get("model"):
            argv += ["--model", str(self.config["model"])]
        if self.config.get("instructions"):
            argv += ["--instructions", str(self.config["instructions"])]
        return argv

    def warm_up(self) -> None:
        """What the worker's first fork imports lazily (the readability proof's reader), loaded
        as the worker starts (`WorkerServer.preload`) instead of on that fork's path."""
        import tutti_agent.errors
        import tutti_agent.history
        import tutti_agent.store  # noqa: F401

    def child_rollout_dir(self, target_home: Path) -> Path | None:
        """tutti-agent files a new rollout directly in `sessions/`
        (`tutti_agent.rollout.new_rollout_path`): a child's target home is three directories
        (`<session>`, the home, `sessions`), whatever the day."""
        return target_home / "sessions"

    def extra_env(self, home: Path) -> dict[str, str]:
        env = {**config_env(self.config), **file_key_env(self.config)}
        if self.config.get("model_base_url"):
            env[MODEL_BASE_URL_VAR] = str(self.config["model_base_url"])
        return env

    def prepare_home(self, home: Path) -> None:
        """Nothing: the command line carries the model settings."""

    def open_session(self, home: Path, params: Mapping[str, Any]) -> None:
        """Nothing: no Session setting lives in the home (`history_gone` remembers where its
        rollout is, forgotten at `close_session`)."""

    def close_session(self, home: Path) -> None:
        self._rollouts.forget(home)
        self._turn_ends.forget(home)

    def history_gone(self, home: Path, thread_id: str, *, search: bool = True) -> bool | None:
        """Whether the thread's rollout is gone from `home` (True), there (False), or not
        known without a listing of the home (None, with `search` false: a caller that must
        not list directories). A live app-server holds a thread whose file was removed in
        memory and appends its Turns to the removed file, lost at its next start, so a bound
        history is checked here, not asked of it. A fork child's rollout is a whole copy in
        its own home (`fork_copies_source`): checked as any other."""
        return self._rollouts.gone(home, thread_id, search=search)

    def turn_end_missing(
        self, home: Path, thread_id: str, turn_id: str, *, search: bool = True
    ) -> bool | None:
        """Whether the thread's rollout in `home` lacks the end of `turn_id` (a Turn the host
        bound and settled `completed`): True when it holds no `task_complete`/`turn_aborted`
        naming it (cut back by hand, say, while the app-server runs on from memory); False
        when it does; None with `search` false when that is not known from a file's tail. A
        fork child's rollout is a whole copy, so its own file is the only one read.
        (`drivers.turn_ends`)"""

        def files() -> list[Path]:
            path = _find_rollout(home, thread_id)
            return [] if path is None else [path]

        tail = self._rollouts.known(home, thread_id)
        return self._turn_ends.missing(home, turn_id, tail, files, search=search)

    def homes_kept(self) -> int:
        return len(self._rollouts)  # a rollout's path per open home, dropped at its close

    def session_context(self, home: Path, thread_id: str) -> dict[str, Any]:
        return {}

    def session_ancestors(self, home: Path) -> list[str]:
        return []  # a child's rollout is Copied: it holds its whole history

    def lineage(self, home: Path, thread_id: str) -> list[str]:
        return []  # `thread/read` loads the thread's rollout and its history_base chain itself

    def derive_for_proof(self, known: Mapping[str, ParsedRollout]) -> None:
        """The span's lines and lean reduction the proof takes (`drivers.tutti_proof`), made
        while the bind writes the files."""
        from drivers.tutti_proof import derive_known

        for path, parsed in known.items():
            derive_known(parsed, Path(path))

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
        """The child's readability from `home` alone, judged by tutti_agent's own reader (only
        when it is the exact version the runtime attested)."""
        return prove_tutti_child(home, child_id, source_id, prefix, attested, known, litter=litter)


def create_driver(config: Mapping[str, Any], failpoints: Failpoints) -> AppServerDriver:
    """The worker's entry point for `--provider tutti-agent`."""
    return AppServerDriver(config, failpoints, TuttiAgentProvider(config))


def prove_tutti_child(
    home: Path,
    child_id: str,
    source_id: str,
    prefix: Sequence[str],
    runtime_version: str,
    known: Mapping[str, ParsedRollout] | None = None,
    *,
    litter: list[object] | None = None,
) -> str | None:
    """Prove a tutti-agent child readable from `home` with tutti_agent's own reader.

    `known`: the binder's validated bytes and decoded lines of the files it just bound, by
    path. The reader still finds, reads and compares each file in full; a file that holds
    exactly those bytes has its lines taken from the binder's decoding of them (the same
    JSON values a second decode would return) instead of decoding 60,000 lines again, and a
    file that holds anything else is the problem.
    `litter`: the reader's store and the child's history go there (freed by the caller after
    the verdict is answered: 120,000 line objects for a 10,000-Turn child), not freed here."""
    import tutti_agent
    from drivers.tutti_proof import known_lines, known_run
    from tutti_agent.errors import AppServerError, RolloutCorrupt
    from tutti_agent.history import TurnStatus, build_turns
    from tutti_agent.store import ThreadStore

    if tutti_agent.__version__ != runtime_version:
        # The app-server that will serve the child is another build: only it can judge.
        raise ReaderNotApplicable(
            f"in-worker tutti_agent {tutti_agent.__version__} != runtime {runtime_version}"
        )
    store = ThreadStore(home)
    if litter is not None:
        litter.append(store)  # its parse of the child, kept until the caller frees it
    try:
        for name, parsed in (known or {}).items():
            path = Path(name)
            if not store.adopt_decoded(
                path, parsed.data, parsed.records, known_lines(parsed, path)
            ):
                # Changed since the bind (a child whose Turns still read right would pass a
                # proof that only judged what the file holds now).
                return f"{name} no longer holds the bytes the binder wrote"
        history = store.load(child_id)
        if litter is not None:
            litter.append(history)
    except (AppServerError, RolloutCorrupt, OSError, ValueError, KeyError, TypeError) as exc:
        return f"{type(exc).__name__}: {exc}"
    if history.forked_from_id != source_id:
        return f"child rollout names source {history.forked_from_id!r}, not {source_id!r}"
    # The reduction the app-server's `thread/read` projects turns with; only the turns' ids
    # and statuses are judged, so without their items (`turnItems: false`'s reduction).
    run = known_run(history, (known or {}).values())  # a span's reduction made before
    turns = build_turns(history.items, with_items=False, run=run)
    if any(t.id is None for t in turns):
        raise ReaderNotApplicable("the child's history holds legacy turns without ids")
    return prefix_problem([(t.id, t.status is TurnStatus.IN_PROGRESS) for t in turns], prefix)


def _find_rollout(home: Path, thread_id: str) -> Path | None:
    from tutti_agent.rollout import find_rollout_path  # the worker imports it when it asks

    return find_rollout_path(home, thread_id)
