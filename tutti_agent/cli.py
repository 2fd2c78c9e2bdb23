"""The `tutti-agent` command: `tutti-agent app-server` serves the protocol on stdio.

Reads `TUTTI_AGENT_HOME` (required), the model options and `TUTTI_AGENT_FAILPOINTS`, then
builds the store, model and server and runs until stdin closes.

The program's modules are imported by `main` once `dataclass_code.install()` has run: their
classes' functions come from the build's file, not compiled at each start."""

from __future__ import annotations

import argparse
import io
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from tutti_agent import __version__, dataclass_code

if TYPE_CHECKING:
    from tutti_agent.model import Model


def build_parser() -> argparse.ArgumentParser:
    from tutti_agent.model import FIRST_BYTE_TIMEOUT_S, STREAM_IDLE_TIMEOUT_S

    parser = argparse.ArgumentParser(prog="tutti-agent", description="Tutti Agent provider")
    parser.add_argument("--version", action="version", version=f"tutti_agent {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    app = sub.add_parser("app-server", help="serve the app-server protocol on stdio")
    app.add_argument(
        "--model-base-url",
        default=os.environ.get("TUTTI_AGENT_MODEL_BASE_URL"),
        help="OpenAI Responses API base URL (e.g. http://127.0.0.1:PORT/v1); "
        "default: the built-in deterministic model",
    )
    app.add_argument(
        "--model",
        default=os.environ.get("TUTTI_AGENT_MODEL", "mock-model"),
        help="model name sent to the model endpoint (a thread's own model wins)",
    )
    app.add_argument(
        "--wire-api",
        choices=("responses", "chat"),
        default=os.environ.get("TUTTI_AGENT_WIRE_API", "responses"),
        help="the endpoint's API: OpenAI Responses (default) or Chat Completions",
    )
    app.add_argument(
        "--api-key-env",
        default=os.environ.get("TUTTI_AGENT_API_KEY_ENV"),
        help="name of the environment variable holding the key, read at each request and "
        "sent as `Authorization: Bearer` (the key itself is never an argument)",
    )
    app.add_argument(
        "--instructions",
        default=os.environ.get("TUTTI_AGENT_INSTRUCTIONS"),
        help="system prompt sent with every request",
    )
    app.add_argument(
        "--first-byte-seconds",
        type=float,
        default=float(os.environ.get("TUTTI_AGENT_FIRST_BYTE_SECONDS") or FIRST_BYTE_TIMEOUT_S),
        help="a request that gets no answer in this long fails the turn (model_timeout)",
    )
    app.add_argument(
        "--stream-idle-seconds",
        type=float,
        default=float(os.environ.get("TUTTI_AGENT_STREAM_IDLE_SECONDS") or STREAM_IDLE_TIMEOUT_S),
        help="a reply that pauses this long mid-stream fails the turn (model_timeout)",
    )
    app.add_argument(
        "--retries",
        type=int,
        default=int(os.environ.get("TUTTI_AGENT_MODEL_RETRIES") or 0),
        help="retries of a request that got no answer at all (each waits its own limit)",
    )
    return parser


def build_model(args: argparse.Namespace) -> Model:
    from tutti_agent.chat import ChatModel
    from tutti_agent.model import BuiltinModel, Endpoint, ResponsesModel

    if not args.model_base_url:
        return BuiltinModel()
    endpoint = Endpoint(
        args.model_base_url,
        args.model,
        api_key_env=args.api_key_env or None,
        instructions=args.instructions or None,
        first_byte_timeout_s=args.first_byte_seconds,
        read_timeout_s=args.stream_idle_seconds,
        retries=max(0, args.retries),
    )
    if args.wire_api == "chat":
        return ChatModel(endpoint)
    return ResponsesModel(endpoint)


def main(argv: list[str] | None = None) -> int:
    dataclass_code.install()
    from tutti_agent.failpoints import FailpointHooks, parse_failpoints
    from tutti_agent.server import AppServer
    from tutti_agent.store import ThreadStore

    args = build_parser().parse_args(argv)
    home_env = os.environ.get("TUTTI_AGENT_HOME")
    if not home_env:
        print("tutti-agent: TUTTI_AGENT_HOME must be set", file=sys.stderr)
        return 2
    home = Path(home_env).absolute()
    home.mkdir(parents=True, exist_ok=True)
    try:
        points = parse_failpoints(os.environ.get("TUTTI_AGENT_FAILPOINTS", ""))
    except ValueError as exc:
        print(f"tutti-agent: {exc}", file=sys.stderr)
        return 2
    model = build_model(args)
    # A byte that is no UTF-8 is kept as a lone surrogate (`surrogateescape`) for the server to
    # refuse that one line (`AppServer.handle_line`): a strict decoder raised out of the
    # read loop, and the server exited at a bad request.
    stdin = io.TextIOWrapper(
        sys.stdin.buffer, encoding="utf-8", errors="surrogateescape", newline="\n"
    )
    stdout = io.TextIOWrapper(sys.stdout.buffer, encoding="utf-8", newline="\n")
    server = AppServer(ThreadStore(home), model, stdout, hooks=FailpointHooks(points))
    server.serve(stdin)
    return 0


if __name__ == "__main__":
    sys.exit(main())
