"""Loading the configuration: where the home is (`AGENTHOST_HOME`, else the XDG data dir:
`domain.home_layout.default_home`, which the client shares), reading
`agenthost.toml` (UTF-8 TOML), validating every table and key against `SCHEMA` (one
`ConfigError` listing every mistake, each naming the file, table, key, what was expected and
what was given), and the rule that a file holding a key must be private (mode 0600)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agenthost.config_paths import check_listen
from agenthost.config_schema import Config, defaults, schema_tables
from agenthost.config_values import ConfigError, Key, describe
from domain.home_layout import default_home

# the home's place: shared
from domain.providers import PROVIDERS


def _absolute(path: Path) -> Path:
    # Not resolve(): a home that is a symlink must stay visible as one (it is refused).
    return Path(os.path.abspath(path.expanduser()))


def load_config(home: Path | None = None, path: Path | None = None) -> Config:
    """`path` (`--config`) must exist; without it, `<home>/agenthost.toml` is optional."""
    home = _absolute(home or default_home())
    if path is not None and not path.exists():
        raise ConfigError(f"{path}: no such configuration file")
    path = path or home / "agenthost.toml"
    if not path.exists():
        return Config(home=home)
    import tomllib  # only a home with a configuration file pays its import

    try:
        raw = tomllib.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    config, problems = _parse(home, raw, str(path))
    try:
        check_secret_file(path, config)
    except ConfigError as exc:
        problems.extend(exc.problems)
    if problems:
        raise ConfigError(*problems)
    return config


def check_secret_file(path: Path, config: Config) -> None:
    """A key written in the file (`api_key`) is only accepted from a file nobody else can read
    (mode 0600 or stricter): the daemon refuses to start otherwise, naming the reason."""
    holders = [name for name, table in config.providers.items() if "api_key" in table]
    if not holders:
        return
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        raise ConfigError(
            f"{path}: [providers.{holders[0]}] api_key is set but the file is mode "
            f"{mode:04o}; a file holding a key must be 0600 (chmod 600 {path}), or use "
            "api_key_env to name an environment variable instead"
        )


def parse_config(home: Path, raw: Mapping[str, Any], *, source: str = "config") -> Config:
    """The validated `Config`, or one `ConfigError` listing every mistake of `raw`."""
    config, problems = _parse(home, raw, source)
    if problems:
        raise ConfigError(*problems)
    return config


def _parse(home: Path, raw: Mapping[str, Any], source: str) -> tuple[Config, list[str]]:
    """The `Config` of what was valid in `raw` (defaults elsewhere) and every mistake found."""
    tables = schema_tables()
    known_top = sorted({t.split(".")[0] for t in tables})
    values: dict[str, dict[str, Any]] = defaults()
    providers: dict[str, dict[str, str | list[str]]] = {}
    problems: list[str] = []
    for top, content in raw.items():
        if top not in known_top:
            problems.append(
                f"{source}: unknown table or key {json.dumps(top)} (known: {', '.join(known_top)})"
            )
        elif not isinstance(content, Mapping):
            problems.append(f"{source}: [{top}] must be a table, got {describe(content)}")
        elif top == "providers":
            for name, table in content.items():
                if f"providers.{name}" not in tables:
                    problems.append(
                        f"{source}: unknown provider [providers.{name}] "
                        f"(known: {', '.join(PROVIDERS)})"
                    )
                elif not isinstance(table, Mapping):
                    problems.append(
                        f"{source}: [providers.{name}] must be a table, got {describe(table)}"
                    )
                else:
                    table_name = f"providers.{name}"
                    providers[name] = _check_table(table_name, table, tables, source, problems)
        else:
            checked = _check_table(top, content, tables, source, problems)
            values[top] = {**values.get(top, {}), **checked}
    config = Config(home=home, providers=providers, tables=values)
    # An endpoint is judged against allow_remote: not against a default the file meant to change.
    if not any(p.startswith(f"{source}: [daemon] allow_remote ") for p in problems):
        for key, endpoints in (
            ("listen", config.listen),
            ("events_listen", config.events_listen),
            ("events_exact_listen", config.events_exact_listen),
        ):
            for endpoint in endpoints:
                try:
                    check_listen(endpoint, config.allow_remote, source=f"{source}: [daemon] {key}")
                except ConfigError as exc:
                    problems.extend(exc.problems)
    return config, problems


def _check_table(
    table: str,
    content: Mapping[str, Any],
    tables: Mapping[str, Mapping[str, Key]],
    source: str,
    problems: list[str],
) -> dict[str, Any]:
    """The valid keys of one table; each mistake is appended to `problems`."""
    keys = tables[table]
    out: dict[str, Any] = {}
    for name, value in content.items():
        key = keys.get(name)
        if key is None:
            problems.append(
                f"{source}: [{table}] unknown key {json.dumps(name)} "
                f"(known: {', '.join(sorted(keys))})"
            )
            continue
        try:
            out[name] = key.type.check(value)
        except ValueError as exc:
            got = describe(value)
            if isinstance(value, str) and (key.secret or _looks_like_a_key(name, value)):
                got = f"a string of {len(value)} characters (not shown)"
            problems.append(f"{source}: [{table}] {name} must be {exc}, got {got}")
    return out


def _looks_like_a_key(name: str, value: str) -> bool:
    """`api_key_env` names a variable and is shown like any value (`MY-KEY` is a typo worth
    seeing), unless what was written there looks like the key itself: a space, a provider's
    key prefix, or a length no variable name has."""
    if name != "api_key_env":
        return False
    return any(c.isspace() for c in value) or value.startswith("sk-") or len(value) > 64
