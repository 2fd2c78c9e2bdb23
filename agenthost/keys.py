"""CURVE keys of a home and its connection files (docs/user-guide.md "Remote
access with the connection file").

Layout under `$AGENTHOST_HOME/run/keys/` (directories 0700, files 0600, pyzmq certificate
format so `zmq.auth` reads them):

    server.key, server.key_secret    the daemon's key pair (made at first start)
    client.key, client.key_secret    the first client's pair, the one in run/connection.json
    authorized/NAME.key              the public key of every client allowed in over TCP
                                     ("default" is the first client's)

`agenthost keys add NAME` mints a pair, authorizes its public key and prints a connection file
(the secret key is not kept by the home); `agenthost keys revoke NAME` removes
`authorized/NAME.key`. The ZAP handler reads `authorized/` at every new connection, so both take
effect for new connections without a restart.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import zmq.auth

from transport.connection_file import CONNECTION_ENV, Connection, KeyError_, load_connection
from transport.security import ServerCurve

# The connection file's reader and its error live in `transport.connection_file` (clients read
# it without importing the daemon); re-exported here, where the daemon writes it.
__all__ = [
    "CONNECTION_ENV",
    "DEFAULT_CLIENT",
    "Connection",
    "KeyError_",
    "KeyStore",
    "load_connection",
    "write_private",
]

DEFAULT_CLIENT = "default"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def write_private(path: Path, text: str) -> None:
    """Write `path` 0600 atomically (never readable by others, not even for a moment)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o600)  # mkstemp makes 0600 already; say it anyway
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _private_dir(path: Path) -> None:
    """`path` 0700, and every missing parent made 0700 too: `mkdir(parents=True)` makes them
    with the umask's 0755, and a `run/` removed under the live daemon while it restores it was
    made again that way, which the daemon then refused as not private and stopped."""
    missing = []
    parent = path
    while not parent.exists():
        missing.append(parent)
        parent = parent.parent
    for directory in reversed(missing):
        try:
            directory.mkdir(mode=0o700)
        except FileExistsError:
            continue  # made meanwhile by another (the daemon makes `run/` 0700 itself)
        os.chmod(directory, 0o700)
    os.chmod(path, 0o700)


class KeyStore:
    """The key files of one home (see the module docstring)."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.dir = run_dir / "keys"
        self.authorized_dir = self.dir / "authorized"
        self.connection_file = run_dir / "connection.json"

    # -- creation ----------------------------------------------------------------------------

    def ensure(self) -> None:
        """At first start: the server pair, and the first client pair, authorized as
        "default". Existing keys are kept (a revoked "default" stays revoked)."""
        _private_dir(self.dir)
        _private_dir(self.authorized_dir)
        for name in ("server", "client"):
            self._repair_public(name)
        if not (self.dir / "server.key_secret").exists():
            self._mint(self.dir, "server")
        if not (self.dir / "client.key_secret").exists():
            staging = Path(tempfile.mkdtemp(dir=self.dir, prefix=".first-"))
            try:
                public, _ = self._mint(staging, "client")
                # Authorized before the pair is in place: a crash in between re-mints both.
                self._write_public(DEFAULT_CLIENT, public)
                for suffix in (".key", ".key_secret"):
                    os.replace(staging / f"client{suffix}", self.dir / f"client{suffix}")
            finally:
                shutil.rmtree(staging, ignore_errors=True)

    def _repair_public(self, name: str) -> None:
        """A pair whose secret file is there and whose public file is not (a removal of `run/`
        racing the live daemon putting its keys back, or a person's `rm`): the public half is
        written again from the secret file, which holds both. A new pair would not match the
        key clients and the connection file know."""
        public_file = self.dir / f"{name}.key"
        secret_file = self.dir / f"{name}.key_secret"
        if public_file.exists() or not secret_file.exists():
            return
        public, _ = self._load(secret_file)
        write_private(
            public_file,
            f"# agenthost {name} key (zmq.auth certificate)\n"
            f'curve\n    public-key = "{public.decode()}"\n',
        )

    def _mint(self, directory: Path, name: str) -> tuple[bytes, bytes]:
        """A new pair as `name.key` + `name.key_secret` (0600) in `directory`, via zmq.auth."""
        staging = Path(tempfile.mkdtemp(dir=directory, prefix=".mint-"))  # 0700
        try:
            public_file, secret_file = zmq.auth.create_certificates(staging, name)
            for made in (public_file, secret_file):
                os.chmod(made, 0o600)
            os.replace(public_file, directory / f"{name}.key")
            os.replace(secret_file, directory / f"{name}.key_secret")
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return self._load(directory / f"{name}.key_secret")

    def _write_public(self, name: str, public: bytes) -> None:
        write_private(
            self.authorized_dir / f"{name}.key",
            "# agenthost client key (zmq.auth certificate)\n"
            f'curve\n    public-key = "{public.decode()}"\n',
        )

    @staticmethod
    def _load(path: Path) -> tuple[bytes, bytes]:
        try:
            public, secret = zmq.auth.load_certificate(path)
        except (OSError, ValueError) as exc:
            raise KeyError_(f"{path}: cannot read the key: {exc}") from exc
        if public is None or secret is None:
            raise KeyError_(f"{path}: no key pair in it")
        return public, secret

    # -- the daemon side ---------------------------------------------------------------------

    def server_files(self) -> dict[str, bytes]:
        """The server pair's files as they are now (kept by the daemon to `restore_server`)."""
        return {
            name: (self.dir / name).read_bytes() for name in ("server.key", "server.key_secret")
        }

    def restore_server(self, files: dict[str, bytes]) -> None:
        """Put the live server pair back after `run/keys/` was removed under the daemon: its
        sockets keep the key they were bound with, so a new pair would mismatch them. The
        authorized client keys went with the directory and are not brought back (a revoked
        key must stay revoked); `ensure()` then authorizes a new first client, as at a first
        start."""
        _private_dir(self.dir)
        for name, data in files.items():
            if not (self.dir / name).exists():
                write_private(self.dir / name, data.decode())

    def server_curve(self) -> ServerCurve:
        _, secret = self._load(self.dir / "server.key_secret")
        return ServerCurve(secret_key=secret, authorize=self.is_authorized)

    def server_public_key(self) -> bytes:
        return self._load(self.dir / "server.key_secret")[0]

    def authorized(self) -> dict[str, bytes]:
        """Name -> z85 public key of every authorized client, read from disk now."""
        keys: dict[str, bytes] = {}
        for path in sorted(self.authorized_dir.glob("*.key")):
            with contextlib.suppress(OSError, ValueError):
                public, _ = zmq.auth.load_certificate(path)
                if public:
                    keys[path.stem] = public
        return keys

    def is_authorized(self, public_key: bytes) -> bool:
        """Read at each new connection, so `keys add` / `keys revoke` need no restart."""
        return public_key in self.authorized().values()

    def write_connection_file(
        self, api: str | None, events: str | None, events_exact: str | None = None
    ) -> Path:
        """`run/connection.json` (0600) for the first client; `api` None: no TCP listen."""
        public, secret = self._load(self.dir / "client.key_secret")
        write_private(
            self.connection_file, self.connection_text(api, events, public, secret, events_exact)
        )
        return self.connection_file

    def connection_text(
        self,
        api: str | None,
        events: str | None,
        public: bytes,
        secret: bytes,
        events_exact: str | None = None,
    ) -> str:
        return (
            json.dumps(
                {
                    "transport": "tcp",
                    "api": api,
                    "events": events,
                    # Extension: topics `workspaceId + "\0"`; null: none.
                    "eventsExact": events_exact,
                    "serverPublicKey": self.server_public_key().decode(),
                    "clientPublicKey": public.decode(),
                    "clientSecretKey": secret.decode(),
                },
                indent=2,
            )
            + "\n"
        )

    # -- `agenthost keys` --------------------------------------------------------------------

    def add(self, name: str) -> str:
        """Mint and authorize a client pair; its connection file's text (api/events copied
        from the daemon's connection file when there is one)."""
        _check_name(name)
        if not (self.dir / "server.key_secret").exists():
            raise KeyError_(
                f"no server key under {self.dir}: start `agenthost serve` once on this home"
            )
        _private_dir(self.authorized_dir)
        if (self.authorized_dir / f"{name}.key").exists():
            raise KeyError_(f"a client key named {name!r} already exists")
        staging = Path(tempfile.mkdtemp(dir=self.dir, prefix=".add-"))
        try:
            public, secret = self._mint(staging, name)
        finally:
            shutil.rmtree(staging, ignore_errors=True)  # the secret leaves only in the output
        self._write_public(name, public)
        api, events, events_exact = self._listening()
        return self.connection_text(api, events, public, secret, events_exact)

    def revoke(self, name: str) -> None:
        _check_name(name)
        try:
            (self.authorized_dir / f"{name}.key").unlink()
        except FileNotFoundError:
            raise KeyError_(f"no client key named {name!r}") from None

    def _listening(self) -> tuple[str | None, str | None, str | None]:
        try:
            data = json.loads(self.connection_file.read_text())
        except (OSError, ValueError):
            return None, None, None
        if not isinstance(data, dict):
            return None, None, None
        found = (data.get("api"), data.get("events"), data.get("eventsExact"))
        api, events, exact = (value if isinstance(value, str) else None for value in found)
        return api, events, exact


def _check_name(name: str) -> None:
    if not _NAME.match(name):
        raise KeyError_(
            f"invalid key name {name!r}: letters, digits, '_', '.', '-' (up to 64), "
            "starting with a letter or digit"
        )
