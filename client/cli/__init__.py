"""The `agenthost` command's client part: every subcommand but `serve` and `keys`, which the
daemon's composition root (`agenthost.cli`) adds to this parser (`client.cli.parser`).

One module per concern, none importing the daemon (`make lint`'s import-linter contract):

- `parser`: the global options, the client subcommands and their flags; `run_command`.
- `endpoints`: where the daemon is (the home's ipc sockets, a connection file, `--connect`).
- `reach`: is it there (the home's lock and socket), and what "no reply" means.
- `command`: running one command on a client, every failure mapped to words and an exit code.
- `output`: the exit codes, `CliError`, human or `--json` output.
- `sessions` (status, sessions, new, show), `turns` (say, interrupt, answer), `forks` (fork,
  tree, resolve, op), `manage` (delete, rename, pin/unpin, settings), `launch_gui` (gui).
"""
