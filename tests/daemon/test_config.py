"""`agenthost.toml` is typed and validated, through the real `agenthost serve`:
every key of `agenthost.config.SCHEMA` given a value of the wrong type (and one out of its
range) stops `serve` with exit 2 and a line for each mistake, naming the file, table, key, what
was expected and what was given (`config check` says the same without starting anything); never
a traceback, never a started daemon. A too-long AGENTHOST_HOME is
reported before anything is created. A list `command` reaches the worker intact."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agenthost.config import (
    SCHEMA,
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
    load_config,
    markdown_rows,
    parse_config,
)
from tests.support.daemon import DaemonProcess, create_session, run_turn

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[2]

# Per type: a value of another TOML type, and a value of the right type out of range.
WRONG_TYPE: dict[type, Any] = {
    Bool: "false",
    Int: "thirty",
    Number: "thirty",
    Str: 42,
    Url: 42,
    Command: 42,
    Endpoints: 42,
    Strings: "node_modules/",
}
OUT_OF_RANGE: dict[type, Any] = {
    Bool: None,  # a boolean has no range
    Int: -1,
    Number: -5,
    Str: "",
    Url: "ftp://example.com",
    Command: [],
    Endpoints: ["udp://127.0.0.1:1"],
    Strings: [""],
}


def serve(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`agenthost serve` expected to refuse: a daemon that starts instead is killed at the
    subprocess timeout (and the test fails on it)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTHOST_")}
    return subprocess.run(
        [sys.executable, "-m", "agenthost.cli", "--home", str(home), "serve", *args],
        capture_output=True,
        text=True,
        timeout=30,
        stdin=subprocess.DEVNULL,
        env=env,
    )


def toml_value(value: Any) -> str:
    return json.dumps(value)  # strings, integers, booleans and arrays of them: valid TOML


def write_config(home: Path, key: Key, value: Any) -> Path:
    home.mkdir(parents=True, exist_ok=True)
    path = home / "agenthost.toml"
    path.write_text(f"[{key.table}]\n{key.name} = {toml_value(value)}\n")
    return path


def assert_refused(done: subprocess.CompletedProcess[str], home: Path, line: str) -> None:
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert done.stderr == f"agenthost: {line}\n"
    assert "Traceback" not in done.stderr
    # Refused before the daemon touched the home: no store, no run dir.
    assert not (home / "store.sqlite3").exists()
    assert not (home / "run").exists()


def test_a_quoted_false_is_not_true(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    path = home / "agenthost.toml"
    # Today `bool("false")` is True and this binds the API on every interface.
    path.write_text('[daemon]\nallow_remote = "false"\nlisten = "tcp://0.0.0.0:0"\n')
    done = serve(home)
    assert_refused(
        done,
        home,
        f'{path}: [daemon] allow_remote must be a boolean (true/false), got the string "false"',
    )


def _one_file_of_every_key(
    tmp_path_factory: pytest.TempPathFactory, values: dict[type, Any]
) -> tuple[Path, Path, subprocess.CompletedProcess[str]]:
    """One `serve` of a file giving every key (that has such a value) its value of `values`:
    `serve` names every mistake at once, so each key's test reads its own line of this one
    refusal (one real `serve` per kind of mistake, not one per key)."""
    home = tmp_path_factory.mktemp("cfg") / "home"
    home.mkdir()
    tables: dict[str, list[str]] = {}
    for key in SCHEMA:
        if values[type(key.type)] is not None:
            tables.setdefault(key.table, []).append(
                f"{key.name} = {toml_value(values[type(key.type)])}"
            )
    path = home / "agenthost.toml"
    path.write_text("".join(f"[{t}]\n" + "\n".join(keys) + "\n" for t, keys in tables.items()))
    return home, path, serve(home)


@pytest.fixture(scope="module")
def every_key_wrong(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, Path, subprocess.CompletedProcess[str]]:
    return _one_file_of_every_key(tmp_path_factory, WRONG_TYPE)


@pytest.fixture(scope="module")
def every_key_out_of_range(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, Path, subprocess.CompletedProcess[str]]:
    return _one_file_of_every_key(tmp_path_factory, OUT_OF_RANGE)


def assert_refused_with(done: subprocess.CompletedProcess[str], home: Path, start: str) -> str:
    """Refused as `assert_refused` says, among the lines of every mistake: the one line that
    starts with `start`, which is returned."""
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr and done.stderr.endswith("\n")
    mine = [line for line in done.stderr.splitlines() if line.startswith(start)]
    assert len(mine) == 1, (start, done.stderr)
    assert not (home / "store.sqlite3").exists()
    assert not (home / "run").exists()
    return mine[0]


@pytest.mark.parametrize("key", SCHEMA, ids=lambda k: f"{k.table}.{k.name}")
def test_every_key_of_the_wrong_type_exits_2_in_words(
    every_key_wrong: tuple[Path, Path, subprocess.CompletedProcess[str]], key: Key
) -> None:
    home, path, done = every_key_wrong
    wrong = WRONG_TYPE[type(key.type)]
    expected = key.type.expected()
    got = f"the string {json.dumps(wrong)}" if isinstance(wrong, str) else f"the integer {wrong}"
    line = f"agenthost: {path}: [{key.table}] {key.name} must be {expected}, got {got}"
    start = f"agenthost: {path}: [{key.table}] {key.name} must be "
    assert assert_refused_with(done, home, start) == line


def test_every_key_of_the_wrong_type_at_once_is_a_line_each_and_nothing_else(
    every_key_wrong: tuple[Path, Path, subprocess.CompletedProcess[str]],
) -> None:
    _, path, done = every_key_wrong
    said = sorted(line.split(" must be ")[0] for line in done.stderr.splitlines())
    assert said == sorted(f"agenthost: {path}: [{k.table}] {k.name}" for k in SCHEMA)


@pytest.mark.parametrize(
    "key",
    [k for k in SCHEMA if OUT_OF_RANGE[type(k.type)] is not None],
    ids=lambda k: f"{k.table}.{k.name}",
)
def test_every_key_out_of_its_range_exits_2_in_words(
    every_key_out_of_range: tuple[Path, Path, subprocess.CompletedProcess[str]], key: Key
) -> None:
    home, path, done = every_key_out_of_range
    start = f"agenthost: {path}: [{key.table}] {key.name} must be {key.type.expected()}, got "
    assert_refused_with(done, home, start)


def test_every_key_out_of_its_range_at_once_is_a_line_each_and_nothing_else(
    every_key_out_of_range: tuple[Path, Path, subprocess.CompletedProcess[str]],
) -> None:
    _, path, done = every_key_out_of_range
    ranged = [k for k in SCHEMA if OUT_OF_RANGE[type(k.type)] is not None]
    said = sorted(line.split(" must be ")[0] for line in done.stderr.splitlines())
    assert said == sorted(f"agenthost: {path}: [{k.table}] {k.name}" for k in ranged)


OTHER_MISTAKES = [
    ("[daemon]\nport = 1\n", '[daemon] unknown key "port" (known: actor_threads, '),
    ("[providers.codex]\ncli_path = '/x'\n", '[providers.codex] unknown key "cli_path"'),
    ("[providers.gpt]\nmodel = 'm'\n", "unknown provider [providers.gpt]"),
    ("[deamon]\nlisten = []\n", 'unknown table or key "deamon"'),
    ("daemon = 3\n", "[daemon] must be a table, got the integer 3"),
    ("[daemon\n", "not valid TOML: "),
    ("[daemon]\nidle_actor_seconds = nan\n", "idle_actor_seconds must be a number from 0.1"),
    ("[daemon]\nlisten = 'tcp://192.0.2.1:7'\n", "not a loopback address"),
    # Split like a shell would when the config is read, not when a status reads it.
    (
        "[providers.codex]\ncommand = 'codex \"app'\n",
        "command must be a command: a non-empty string or a non-empty array of strings "
        "(No closing quotation), got the string ",
    ),
    (
        "[providers.tutti-agent]\ncommand = '\"\"'\n",
        "[providers.tutti-agent] command must be a command: ",
    ),
    # One connection is the writer alone: the start's first write, reading, waited 30 s.
    ("[daemon]\nstore_connections = 1\n", "store_connections must be an integer from 2 "),
    # A variable's name is no secret: the mistake is shown as typed.
    ("[providers.codex]\napi_key_env = 'MY-KEY'\n", 'got the string "MY-KEY"'),
]
ALONE = {"[daemon\n", "daemon = 3\n"}
"""The mistakes no file can hold beside others (the file is not TOML; `daemon` not a table)."""


@pytest.fixture(scope="module")
def other_mistakes_at_once(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """One `serve` of a file holding every one of `OTHER_MISTAKES` but `ALONE`'s, each
    snippet's keys under its own table: `serve` names every mistake at once."""
    home = tmp_path_factory.mktemp("cfg") / "home"
    home.mkdir()
    tables: dict[str, list[str]] = {}
    for text, _ in OTHER_MISTAKES:
        if text not in ALONE:
            header, *keys = text.splitlines()
            tables.setdefault(header, []).extend(keys)
    body = "".join(f"{header}\n" + "\n".join(keys) + "\n" for header, keys in tables.items())
    (home / "agenthost.toml").write_text(body)
    return home, serve(home)


@pytest.mark.parametrize(("text", "message"), OTHER_MISTAKES)
def test_other_mistakes_exit_2_in_words(
    tmp_path: Path,
    other_mistakes_at_once: tuple[Path, subprocess.CompletedProcess[str]],
    text: str,
    message: str,
) -> None:
    """Each mistake a line in words; those a file can hold together read from one `serve` of
    them all (a line each: `test_other_mistakes_at_once_are_a_line_each_and_nothing_else`),
    the others from a `serve` of their own, its one line."""
    if text in ALONE:
        home = tmp_path / "home"
        home.mkdir()
        (home / "agenthost.toml").write_text(text)
        done = serve(home)
        assert len(done.stderr.splitlines()) == 1, done.stderr
    else:
        home, done = other_mistakes_at_once
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert len([line for line in done.stderr.splitlines() if message in line]) == 1, done.stderr
    assert not (home / "store.sqlite3").exists() and not (home / "run").exists()


def test_other_mistakes_at_once_are_a_line_each_and_nothing_else(
    other_mistakes_at_once: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    _, done = other_mistakes_at_once
    lines = done.stderr.splitlines()
    assert len(lines) == len(OTHER_MISTAKES) - len(ALONE), lines
    for line in lines:
        assert [m for t, m in OTHER_MISTAKES if t not in ALONE and m in line], line


@pytest.mark.parametrize(
    ("endpoint", "said"),
    [
        ("tcp://127.0.0.1:99999", "Port out of range"),
        ("tcp://127.0.0.1", "needs a port from 1 to 65535"),
        ("tcp://127.0.0.1:0", "needs a port from 1 to 65535"),
    ],
)
def test_a_listen_endpoint_with_a_bad_port_exits_2_before_the_home_is_touched(
    tmp_path: Path, endpoint: str, said: str
) -> None:
    home = tmp_path / "home"
    done = serve(home, "--listen", endpoint)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"agenthost: --listen {endpoint}: ") and said in done.stderr
    assert not home.exists()


def test_a_config_file_that_is_not_utf8_or_missing_exits_2(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "agenthost.toml").write_bytes(b"[daemon]\nlisten = '\xff'\n")
    done = serve(home)
    assert done.returncode == 2 and "not UTF-8 text" in done.stderr
    assert "Traceback" not in done.stderr
    done = serve(home, "--config", str(tmp_path / "nope.toml"))
    assert done.returncode == 2 and "no such configuration file" in done.stderr


def test_a_too_long_home_is_reported_before_anything_is_created(tmp_path: Path) -> None:
    home = tmp_path / ("h" * 90) / "home"
    done = serve(home)
    assert done.returncode == 2, done.stderr
    sock = home / "run" / "events.sock"
    assert done.stderr.startswith(f"agenthost: AGENTHOST_HOME {home} is too long: its socket ")
    assert str(sock) in done.stderr or str(home / "run" / "api.sock") in done.stderr
    assert "over the 107-byte limit of a Unix socket path" in done.stderr
    assert f"at least {len(str(sock)) - 107} bytes shorter" in done.stderr
    assert not (tmp_path / ("h" * 90)).exists()


def test_every_key_is_documented_with_its_type_and_range() -> None:
    guide = (REPO / "docs" / "user-guide.md").read_text()
    missing = [row for row in markdown_rows() if row not in guide]
    assert not missing, "regenerate with `python -m agenthost.config`:\n" + "\n".join(missing)


def test_valid_values_start_and_a_list_command_runs_the_provider(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    script = Path(sys.executable).parent / "tutti-agent"
    (home / "agenthost.toml").write_text(
        "[daemon]\nallow_remote = false\nidle_actor_seconds = 5\nfork_sync_budget_ms = 0\n"
        'listen = []\n[providers.tutti-agent]\nmodel = "m"\n'
        f'command = ["{sys.executable}", "{script}"]\n'
    )
    d = DaemonProcess(home).start()
    try:
        c = d.client()
        sid = create_session(c)["agentSessionId"]
        turn = run_turn(c, sid, "hello")
    finally:
        d.stop()
    assert turn["outcome"] == "completed"
    assert turn["messages"][-1]["text"] == "echo: hello"


def test_model_keys_are_validated(tmp_path: Path) -> None:
    """The model keys of each provider, checked at start-up with the key named; a
    value given where a key name belongs is not echoed."""
    cfg = parse_config(
        tmp_path,
        {
            "providers": {
                "tutti-agent": {"wire_api": "chat", "api_key_env": "MY_KEY", "instructions": "x"},
                "codex": {"use_user_login": True},
                "claude-code": {"api_key_env": "ANTHROPIC_API_KEY", "use_user_login": False},
            }
        },
    )
    assert cfg.providers["tutti-agent"]["wire_api"] == "chat"
    with pytest.raises(ConfigError, match='wire_api must be one of "responses", "chat"'):
        parse_config(tmp_path, {"providers": {"tutti-agent": {"wire_api": "soap"}}})
    with pytest.raises(ConfigError, match="api_key_env must be an environment variable name") as e:
        parse_config(tmp_path, {"providers": {"codex": {"api_key_env": "sk-abc def"}}})
    assert "sk-abc" not in str(e.value)
    with pytest.raises(ConfigError, match="use_user_login must be a boolean"):
        parse_config(tmp_path, {"providers": {"codex": {"use_user_login": "maybe"}}})
    # A URL refused is named without its user and password.
    bad_url = "ftp://agent:hunter2-S3cr3t@models.example/v1"
    with pytest.raises(ConfigError, match=r"model_base_url must be an http\(s\) URL") as e:
        parse_config(tmp_path, {"providers": {"codex": {"model_base_url": bad_url}}})
    assert "hunter2" not in str(e.value) and "ftp://***@models.example/v1" in str(e.value)
    with pytest.raises(
        ConfigError, match=r'\[providers.tutti-agent\] unknown key "use_user_login"'
    ):
        parse_config(tmp_path, {"providers": {"tutti-agent": {"use_user_login": True}}})


def test_a_key_in_a_readable_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "agenthost.toml"
    path.write_text('[providers.codex]\napi_key = "sk-secret-value"\n')
    os.chmod(path, 0o640)
    with pytest.raises(ConfigError) as err:
        load_config(tmp_path)
    assert "must be 0600" in str(err.value) and "sk-secret-value" not in str(err.value)
    os.chmod(path, 0o600)
    assert load_config(tmp_path).providers["codex"]["api_key"] == "sk-secret-value"


def _worker_config(daemon_pid: int, provider: str) -> dict[str, Any]:
    """The provider table the daemon handed its running `provider` worker (its environment)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"drivers.worker" not in argv or provider.encode() not in argv:
            continue
        env = dict(item.decode().partition("=")[::2] for item in environ if b"=" in item)
        if env.get("AGENTHOST_WORKER_PARENT_PID") == str(daemon_pid):
            return dict(json.loads(env["AGENTHOST_PROVIDER_CONFIG"]))
    raise AssertionError(f"no {provider} worker of {daemon_pid}")


@pytest.mark.parametrize(
    ("keys", "limit"),
    [("provider_write_seconds = 7\n", 7.0), ("provider_stopped_seconds = 3\n", 6.0)],
    ids=["given", "twice-the-stopped-limit"],
)
def test_provider_write_seconds_reaches_the_app_server_driver(
    tmp_path: Path, keys: str, limit: float
) -> None:
    from drivers.failpoints import Failpoints
    from drivers.tutti_agent import create_driver

    home = tmp_path / "home"
    home.mkdir()
    (home / "agenthost.toml").write_text("[daemon]\n" + keys)
    daemon = DaemonProcess(home).start()
    try:
        client = daemon.client()
        run_turn(client, create_session(client)["agentSessionId"], "hello")
        assert daemon.proc is not None
        config = _worker_config(daemon.proc.pid, "tutti-agent")
        assert config["write_limit_s"] == limit
        driver = create_driver(config, Failpoints())
        try:
            assert driver.write_limit == limit
        finally:
            driver.close()
    finally:
        daemon.stop()


def config_check(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTHOST_")}
    return subprocess.run(
        [sys.executable, "-m", "agenthost.cli", "--home", str(home), "config", "check", *args],
        capture_output=True,
        text=True,
        timeout=30,
        stdin=subprocess.DEVNULL,
        env=env,
    )


def test_serve_and_config_check_name_every_mistake_at_once(tmp_path: Path) -> None:
    """A bad value does not hide the unknown key after it: `serve` refuses with a line for each
    mistake, and `config check` says the same lines without starting anything."""
    home = tmp_path / "home"
    home.mkdir()
    path = home / "agenthost.toml"
    path.write_text(
        '[daemon]\nallow_remote = "false"\nport = 1\n'
        "[workspace]\ncheckpoints = 3\n[deamon]\nlisten = []\n"
    )
    expected = [
        f"agenthost: {path}: [daemon] allow_remote must be a boolean (true/false), "
        'got the string "false"',
        f'agenthost: {path}: [daemon] unknown key "port" (known: actor_threads, ',
        f"agenthost: {path}: [workspace] checkpoints must be a boolean (true/false), "
        "got the integer 3",
        f'agenthost: {path}: unknown table or key "deamon" (known: daemon, providers, workspace)',
    ]
    served = serve(home)
    checked = config_check(home)
    for done in (served, checked):
        assert done.returncode == 2, done.stderr
        lines = done.stderr.splitlines()
        assert len(lines) == len(expected), lines
        for line, start in zip(lines, expected, strict=True):
            assert line.startswith(start), (line, start)
        assert not (home / "store.sqlite3").exists() and not (home / "run").exists()
    assert checked.stderr == served.stderr and checked.stdout == ""


def test_config_check_passes_a_good_file_and_no_file(tmp_path: Path) -> None:
    home = tmp_path / "home"
    done = config_check(home)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{home / 'agenthost.toml'}: no such file, every key at its default: ok\n"
    home.mkdir()
    (home / "agenthost.toml").write_text("[daemon]\nactor_threads = 4\n")
    done = config_check(home)
    assert (done.returncode, done.stdout, done.stderr) == (
        0,
        f"{home / 'agenthost.toml'}: ok\n",
        "",
    )
    assert not (home / "run").exists()
    # --config names another file; a too-long home is refused as `serve` refuses it.
    other = tmp_path / "other.toml"
    other.write_text("[daemon]\nworkers_ahead = 1\n")
    done = config_check(home, "--config", str(other))
    assert done.returncode == 2 and f"agenthost: {other}: [daemon] workers_ahead" in done.stderr
    done = config_check(tmp_path / ("h" * 90) / "home")
    assert done.returncode == 2 and "over the 107-byte limit" in done.stderr


def test_parse_config_lists_every_problem() -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(
            Path("/tmp/h"),
            {"daemon": {"actor_threads": "x", "nope": 1}, "providers": {"gpt": {}}},
        )
    assert len(err.value.problems) == 3
    assert str(err.value) == "\n".join(err.value.problems)


def test_every_configuration_the_docs_show_is_one_serve_accepts(tmp_path: Path) -> None:
    """Each ```toml block of the user guide and protocol.md parses as it is written (with a
    port for its `PORT`), its commented-out keys as well."""
    import tomllib

    blocks = []
    for doc in ("docs/user-guide.md", "docs/protocol.md"):
        text = (REPO / doc).read_text()
        blocks += [b.split("\n```", 1)[0] for b in text.split("```toml\n")[1:]]
    assert len(blocks) >= 6
    for block in blocks:
        text = re.sub(r"^# ([a-z_]+ =)", r"\1", block.replace("PORT", "8080"), flags=re.M)
        parse_config(tmp_path, tomllib.loads(text))


def test_the_readability_proofs_the_config_accepts_are_the_drivers() -> None:
    from agenthost.config_schema import READABILITY_PROOFS
    from drivers.app_server.fork import READABILITY_APP_SERVER, READABILITY_IN_WORKER

    assert READABILITY_PROOFS == (READABILITY_IN_WORKER, READABILITY_APP_SERVER)


def test_readability_proof_app_server_in_the_file_proves_a_fork_by_a_fresh_app_server(
    tmp_path: Path,
) -> None:
    """`[providers.tutti-agent] readability_proof = "app_server"` reaches the driver: the fork's
    child is proven readable by a fresh app-server on its home, as its binding receipt says."""
    import apsw

    from tests.daemon.test_fork_saga import fork, until_terminal

    home = tmp_path / "home"
    home.mkdir()
    (home / "agenthost.toml").write_text(
        '[providers.tutti-agent]\nreadability_proof = "app_server"\n'
    )
    daemon = DaemonProcess(home).start()
    try:
        client = daemon.client(timeout=60)
        sid = create_session(client)["agentSessionId"]
        turn = run_turn(client, sid, "hello")
        op = until_terminal(client, fork(client, sid, turn["turnId"])[1])
        assert op["status"] == "committed", op
    finally:
        daemon.stop()
    db = apsw.Connection(str(home / "store.sqlite3"), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        ((receipt,),) = db.execute(
            "SELECT binding_receipt FROM fork_operations WHERE operation_id = ?",
            (op["operationId"],),
        )
    finally:
        db.close()
    assert json.loads(receipt)["readabilityProof"] == "app_server"
