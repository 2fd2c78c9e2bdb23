"""The Claude Code provider, split by concern (import a name from the module that defines it;
the worker loads `drivers.claude.driver.create_driver`):

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
