"""The Claude Code provider, split by concern (the names other code imports are re-exported
here; the worker loads `create_driver`):

- `env`: the driver's configuration, the pinned SDK, each session's CLI environment, and the
  process-wide config dir the SDK's in-process helpers read.
- `state`: the worker-side data of a session, its active turn and a pending permission request.
- `driver`: `ClaudeDriver`, the attested verdict and the sessions; composed of the parts below.
- `turns`: `Turns`, a turn's CLI run by the SDK on the driver's loop.
- `events`: `ClaudeEvents`, the SDK's messages read as turn events.
- `interactions`: `Interactions`, tool-permission requests as Interactions and their answers.
- `checkpoints`: the observed provider Turn identity and its checkpoint binding (functions).
- `fork`: `ClaudeFork`, the provider-owned fork via `fork_session`, the child's placement
  and proof.

The transcript format is `drivers.claude_transcript`; `fork.resolve` evidence is
`drivers.claude.resolution`.
"""

from drivers.claude.driver import ClaudeDriver, create_driver
from drivers.claude.env import (
    DRIVER_KIND,
    PINNED_SDK_VERSION,
    PRIVATE_HOME_DIR,
    QUIET_ENV,
    RECEIPT_SCHEMA_VERSION,
    ClaudeDriverConfig,
    claude_config_env,
    cli_version,
    sdk_version,
    session_env,
)
from drivers.claude.events import DESCENDANT_LANE_KIND, EPHEMERAL_SYSTEM_SUBTYPES
from drivers.claude.fork import receipt_hash
from drivers.claude.interactions import DECLINED_MESSAGE, QUESTION_TOOL, RESPOND_TIMEOUT_S
from drivers.claude.state import is_uuid
from drivers.claude.turns import TURN_START_TIMEOUT_S

__all__ = [
    "DECLINED_MESSAGE",
    "DESCENDANT_LANE_KIND",
    "DRIVER_KIND",
    "EPHEMERAL_SYSTEM_SUBTYPES",
    "PINNED_SDK_VERSION",
    "PRIVATE_HOME_DIR",
    "QUESTION_TOOL",
    "QUIET_ENV",
    "RECEIPT_SCHEMA_VERSION",
    "RESPOND_TIMEOUT_S",
    "TURN_START_TIMEOUT_S",
    "ClaudeDriver",
    "ClaudeDriverConfig",
    "claude_config_env",
    "cli_version",
    "create_driver",
    "is_uuid",
    "receipt_hash",
    "sdk_version",
    "session_env",
]
