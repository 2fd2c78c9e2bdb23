"""What one Codex-style provider adds to the generic app-server driver (`AppServerProvider`, a
port): its program and home, its version gate, the Session settings it keeps in that home, and
the places its storage differs (a fork child's lineage, where a child's rollout lands, an
in-worker history reader). `drivers.tutti_agent` and `drivers.codex` implement it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from domain.enums import ProviderStateBindingMode
from drivers.binder import ParsedRollout
from drivers.versions import VersionGate


class AppServerProvider(Protocol):
    """One provider kind served by `AppServerDriver`."""

    @property
    def kind(self) -> str:
        """The driver kind the host records (`tutti-agent`, `codex`)."""
        ...

    @property
    def home_var(self) -> str:
        """The environment variable that names the provider home (`CODEX_HOME`, …)."""
        ...

    @property
    def gate(self) -> VersionGate: ...

    @property
    def binding_mode(self) -> ProviderStateBindingMode: ...

    @property
    def cache_attestations(self) -> bool:
        """Reuse a transient probe's verdict for the exact same launch (seed 000 §6.3)."""
        ...

    @property
    def fork_exclude_turns(self) -> bool:
        """Ask `thread/fork` for no turns and list the child's with `thread/turns/list`: one
        round trip more, a third less app-server CPU per fork for Codex 0.171 than the deprecated
        full hydration (docs/performance.md)."""
        ...

    @property
    def fork_unloaded(self) -> bool:
        """Ask `thread/fork` not to load the child in the source's server (`loaded: false`,
        tutti-agent): nothing to unsubscribe after the fork. A server that loads it anyway
        (answers a status other than `notLoaded`) is still sent `thread/unsubscribe`."""
        ...

    @property
    def fork_copies_source(self) -> bool:
        """A child of `thread/fork` holds the source's lines up to the boundary byte for byte
        (a Copied child, tutti-agent): the fork validates the source's rollout into the
        binder's spans while the provider forks (`RolloutBinder.validate_ahead`), so the bind
        decodes only the child's own lines. Codex's Referenced child copies none."""
        ...

    @property
    def turns_without_items(self) -> bool:
        """Ask `thread/read` and `thread/fork` for the turns without their items (`turnItems:
        false`, tutti-agent): the fork reads only the turns' ids and statuses, and a
        10,000-Turn thread's items are a 5 MB answer to build, send and decode. Codex answers
        its own shape (its items included)."""
        ...

    @property
    def turn_columns(self) -> bool:
        """Ask `thread/read` and `thread/fork` for the turns as two columns (`turnColumns:
        true`, tutti-agent): `thread.turnIds` and `thread.turnStatuses`, lists of strings in
        order, what the fork reads of them and nothing else (a 10,000-Turn thread's are ~0.2 MB
        instead of 2.3 MB of turn objects, decoded and read without a check per turn). A
        server that answers no columns is read from `thread.turns` as before. Codex: False."""
        ...

    @property
    def interrupt_waits_for_start(self) -> bool:
        """The provider answers "no active turn" to an interrupt of a Turn it has accepted but
        not started yet (Codex): the driver retries while the Turn is still ours and running."""
        ...

    @property
    def liveness_probe(self) -> str | None:
        """A read-only request the app-server answers at once even while a Turn streams (any
        answer, an error too, proves it alive); None: the provider has none, and only a stopped
        process is detected."""
        ...

    def command(self) -> list[str]:
        """The app-server's command line."""
        ...

    def extra_env(self, home: Path) -> dict[str, str]:
        """Environment added to the private one of an app-server on `home`."""
        ...

    def prepare_home(self, home: Path) -> None:
        """Provider files in a home before its app-server starts (Codex: its config.toml)."""
        ...

    def open_session(self, home: Path, params: Mapping[str, Any]) -> None:
        """`session.start` params the provider keeps for `home` before its app-server starts
        (Codex: the approval policy, sandbox mode and a fork child's recorded source)."""
        ...

    def close_session(self, home: Path) -> None:
        """The last Session on `home` stopped in this worker (`session.stop`: deleted, evicted
        or idle): forget what `open_session` kept for it. Its next `session.start` opens it
        again before any app-server starts, so nothing is kept for the worker's life."""
        ...

    def homes_kept(self) -> int:
        """How many homes' `open_session` params the provider keeps now (`worker.ping`'s
        `providerHomes`: bounded by the Sessions started and not stopped)."""
        ...

    def session_context(self, home: Path, thread_id: str) -> dict[str, Any]:
        """Entries the provider adds to a started Session's runtime context."""
        ...

    def session_ancestors(self, home: Path) -> list[str]:
        """Threads a Session's new app-server on `home` loads before it serves (Codex: a fork
        child's Referenced ancestors, oldest first, so the home lists every inherited Turn)."""
        ...

    def lineage(self, home: Path, thread_id: str) -> list[str]:
        """The threads an app-server on `home` must load, oldest first and `thread_id` last,
        before it reads `thread_id`; empty when reading it loads what it needs (tutti-agent)."""
        ...

    def child_rollout_dir(self, target_home: Path) -> Path | None:
        """Where a fork child's rollout will land in its own home, if the provider's layout lets
        it be known before the provider call (None: not guessed, nothing made ahead)."""
        ...

    def derive_for_proof(self, known: Mapping[str, ParsedRollout]) -> None:
        """What `read_child` derives from the binder's parse of `known` (by target path),
        made before it: the fork runs this on a thread of its own while the bind writes the
        files, and joins it before the proof. Only a cache: `read_child` judges the files as
        if it were never called. Nothing, for a reader that derives nothing."""
        ...

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
        """The bound child's readability from `home` alone, judged in this worker by the
        provider's own history reader (a problem, or None); `attested` is the runtime's
        version; `known`: the binder's parse of the files it bound, by path, which a reader
        may take for a file holding exactly those bytes instead of decoding it again;
        `litter`: where a reader may put what it built that is large, for the caller to free
        after the verdict is answered. Raises
        `ReaderNotApplicable` where it cannot judge (the proof then spawns an app-server on
        the target home)."""
        ...


def config_env(config: Mapping[str, Any]) -> dict[str, str]:
    """The `env` table of a provider's configuration, as strings."""
    env = config.get("env") or {}
    return {str(k): str(v) for k, v in env.items()}
