"""The failpoint registry: named points armed with `kill`, `error`, `sleep:<ms>`, `hang`,
`tamper` or `off` (optionally `once:`), parsed from `AGENTHOST_FAILPOINTS="name=action;…"` and
settable at run time.

It knows nothing of workers or the daemon, so both reuse it; `hit(name)` is the only call sites
make, and a site on a fork's hot path tests `armed` first (a field read: nothing armed, no call
into this module). A `state_dir` makes `once:` survive the SIGKILL it causes, so a restarted
process is not killed again by the same armed point.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from drivers.errors import FailpointError

ENV_POINTS = "AGENTHOST_FAILPOINTS"
ENV_STATE_DIR = "AGENTHOST_FAILPOINTS_STATE"


class FailpointAction(StrEnum):
    KILL = "kill"
    """SIGKILL the process that hits the point: nothing after it runs, no cleanup."""
    ERROR = "error"
    """Raise `FailpointError` at the point, as if the step failed."""
    BUG = "bug"
    """Raise a bare `RuntimeError` (not a typed error) at the point, as a programming error
    would: tests of the one internal-error path (a 500 with a reference, never the text)."""
    SLEEP = "sleep"
    """Sleep `sleep_ms` milliseconds, then continue."""
    HANG = "hang"
    """Block the hitting thread until the point is armed otherwise (`off` or another action):
    forever if it never is (until the process is killed)."""
    TAMPER = "tamper"
    """Run the site's tamper hook (a test hook that damages what the step just produced, e.g.
    the binder's copied rollouts), then continue; a site without one ignores it."""
    OFF = "off"
    """Disarm: setting a point to `off` removes it."""


@dataclass(frozen=True, slots=True)
class FailpointSpec:
    action: FailpointAction
    once: bool = False
    sleep_ms: int = 0

    @classmethod
    def parse(cls, text: str) -> FailpointSpec:
        """`[once:]kill|error|bug|hang|tamper|off|sleep:<ms>`; anything else is a ValueError."""
        raw = text.strip()
        once = raw.startswith("once:")
        if once:
            raw = raw[len("once:") :]
        if raw.startswith("sleep:"):
            ms_text = raw[len("sleep:") :]
            if not ms_text.isdigit():
                raise ValueError(f"bad failpoint sleep: {text!r}")
            return cls(FailpointAction.SLEEP, once, int(ms_text))
        try:
            action = FailpointAction(raw)
        except ValueError:
            raise ValueError(f"unknown failpoint action: {text!r}") from None
        if action is FailpointAction.SLEEP:
            raise ValueError(f"sleep needs milliseconds: {text!r}")
        return cls(action, once)

    def __str__(self) -> str:
        body = f"sleep:{self.sleep_ms}" if self.action is FailpointAction.SLEEP else self.action
        return f"once:{body}" if self.once else str(body)


def normalize(name: str, action: str) -> tuple[str, FailpointSpec]:
    """One armed point: `once:` may prefix the name as well as the action (`once:NAME=error`
    is `NAME=once:error`), so the spelling a person tries first arms the point instead of a
    name that nothing ever hits."""
    name = name.strip()
    spec = FailpointSpec.parse(action)
    if name.startswith("once:"):
        name = name[len("once:") :].strip()
        spec = FailpointSpec(spec.action, True, spec.sleep_ms)
    if not name:
        raise ValueError(f"bad failpoint name: {name!r}")
    return name, spec


def parse_points(text: str) -> dict[str, str]:
    """Parse `name=action;name=action` into a map (validating each action)."""
    points: dict[str, str] = {}
    for part in text.split(";"):
        part = part.strip()
        if not part:
            continue
        name, sep, action = part.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"bad failpoint entry: {part!r}")
        name, spec = normalize(name, action)
        points[name] = str(spec)
    return points


def format_points(points: Mapping[str, str]) -> str:
    return ";".join(f"{name}={action}" for name, action in sorted(points.items()))


class Failpoints:
    """Thread-safe registry of armed points; `hit(name)` is a dict lookup when nothing is armed."""

    def __init__(
        self, points: Mapping[str, str] | None = None, *, state_dir: Path | None = None
    ) -> None:
        self._lock = threading.Lock()
        # Notified whenever the armed set changes: a `hang` waits on it to be disarmed.
        self._changed = threading.Condition(self._lock)
        self._points: dict[str, FailpointSpec] = {}
        self.armed: Mapping[str, FailpointSpec] = self._points
        """The armed points (the registry's own map, read-only by type): empty means `hit` does
        nothing, so a site on a hot path may skip the call when it is."""
        self._fired: set[str] = set()
        self._state_dir = state_dir
        if state_dir is not None:
            state_dir.mkdir(parents=True, exist_ok=True)
        if points:
            self.set(points, rearm=False)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Failpoints:
        env = os.environ if environ is None else environ
        state = env.get(ENV_STATE_DIR)
        return cls(parse_points(env.get(ENV_POINTS, "")), state_dir=Path(state) if state else None)

    def set(
        self, points: Mapping[str, str], *, rearm: bool = True, clear_markers: bool = True
    ) -> dict[str, str]:
        """Arm (or with `off`, disarm) each named point; re-arming clears a fired `once:`:
        this process's record of it and, with `clear_markers`, the shared marker.

        A worker armed by its supervisor passes `clear_markers=False`: the supervisor
        cleared the markers once, as it armed, and each worker gets that arming whenever its
        link reads it. Clearing again there would undo a claim another worker made meanwhile,
        and a `once:kill` would fire twice (a worker still starting, or busy, unlinks the
        marker of a point a sibling already died of; the sibling's successor dies of it too).

        Validates every action first, so a bad map changes nothing.
        """
        parsed = dict(normalize(name, action) for name, action in points.items())
        with self._lock:
            for name, spec in parsed.items():
                if spec.action is FailpointAction.OFF:
                    self._points.pop(name, None)
                else:
                    self._points[name] = spec
                if rearm:
                    self._fired.discard(name)
                    marker = self._marker(name) if clear_markers else None
                    if marker is not None:
                        with contextlib.suppress(FileNotFoundError):
                            marker.unlink()
            self._changed.notify_all()
            return self._snapshot_locked()

    def snapshot(self) -> dict[str, str]:
        with self._lock:
            return self._snapshot_locked()

    def _snapshot_locked(self) -> dict[str, str]:
        return {name: str(spec) for name, spec in sorted(self._points.items())}

    def _marker(self, name: str) -> Path | None:
        if self._state_dir is None:
            return None
        return self._state_dir / f"fired.{name}"

    def _claim_once(self, name: str) -> bool:
        """True exactly once per arming, across every process sharing the state dir."""
        if name in self._fired:
            return False
        self._fired.add(name)
        marker = self._marker(name)
        if marker is None:
            return True
        try:
            # O_EXCL makes the claim atomic across processes; it is durable before a `kill`.
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        except FileExistsError:
            return False
        except FileNotFoundError:
            # The state dir went with a removed `run/` (a cleaner of /tmp; the daemon makes
            # `run/` again, 0700, itself): once in this process, as without a state dir.
            return True
        os.close(fd)
        return True

    def hit(self, name: str, *, tamper: Callable[[], None] | None = None) -> None:
        """Run the action armed at `name`, if any; `tamper` is the site's hook for `tamper`."""
        if not self._points:
            return
        with self._lock:
            spec = self._points.get(name)
            if spec is None:
                return
            if spec.once and not self._claim_once(name):
                return
        if spec.action is FailpointAction.KILL:
            os.kill(os.getpid(), signal.SIGKILL)
            threading.Event().wait()  # SIGKILL is asynchronous; never run past the point
        elif spec.action is FailpointAction.ERROR:
            raise FailpointError(f"failpoint {name} fired", params={"failpoint": name})
        elif spec.action is FailpointAction.BUG:
            raise RuntimeError(f"failpoint {name} fired as a bug")
        elif spec.action is FailpointAction.SLEEP:
            time.sleep(spec.sleep_ms / 1000)
        elif spec.action is FailpointAction.HANG:
            # Until this arming is replaced (`off` or another action): forever if it never is,
            # so a test can hold a step exactly as long as it needs and then let it go on.
            with self._changed:
                while self._points.get(name) is spec:
                    self._changed.wait()
        elif spec.action is FailpointAction.TAMPER and tamper is not None:
            tamper()
