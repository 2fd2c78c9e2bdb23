"""Daemon configuration: `AGENTHOST_HOME` and the optional `agenthost.toml` (PROTOCOL.md
"Configuration"), typed and validated against one declarative schema.

Every key of every table has exactly one `Key` in `SCHEMA`: its table, name, type (with its
range), default and one line of documentation. `parse_config` checks the whole file against
it; its mistakes are one `ConfigError` with a line for each, naming the file, table, key, what
was expected and what was given, e.g. `agenthost.toml: [daemon] allow_remote must be a boolean
(true/false), got the string "false"` (the CLI exits 2 with them; never a traceback).

To add a key: append one `Key(...)` to `SCHEMA` in `agenthost/config_schema.py` (a new
`[table]` is simply a new table name), document it in docs/user-guide.md "Configuration keys"
(a test checks every key is there), and read it with `config.get("table", "key")`: validated,
or the default when absent. Provider tables (`[providers.<name>]`) are handed to that
provider's worker as given (`str` values, `command` may be an argv list) in `config.providers`.

This module is the facade: every public name is importable from here. One concern each beside
it: `config_values` (value types, `Key`, `ConfigError`), `config_schema` (`SCHEMA`, defaults,
`Config`, the user-guide rows), `config_load` (home, file, validation) and `config_paths`
(loopback and Unix socket path checks).
"""

from __future__ import annotations

from agenthost.config_load import check_secret_file, load_config, parse_config
from agenthost.config_paths import (
    IPC_PATH_MAX,
    check_home_paths,
    check_ipc_length,
    check_listen,
)
from agenthost.config_schema import SCHEMA, WIRE_APIS, Config, markdown_rows, schema_tables
from agenthost.config_values import (
    Bool,
    Command,
    ConfigError,
    Endpoints,
    Int,
    Key,
    Number,
    Str,
    Strings,
    Url,
    ValueType,
    describe,
)
from domain.home_layout import default_home

__all__ = [
    "IPC_PATH_MAX",
    "SCHEMA",
    "WIRE_APIS",
    "Bool",
    "Command",
    "Config",
    "ConfigError",
    "Endpoints",
    "Int",
    "Key",
    "Number",
    "Str",
    "Strings",
    "Url",
    "ValueType",
    "check_home_paths",
    "check_ipc_length",
    "check_listen",
    "check_secret_file",
    "default_home",
    "describe",
    "load_config",
    "markdown_rows",
    "parse_config",
    "schema_tables",
]

if __name__ == "__main__":  # `python -m agenthost.config`: the rows for docs/user-guide.md
    print("\n".join(markdown_rows()))
