"""Running a client command: open a client on the daemon's endpoint, call one method, and turn
every failure (daemon error, unknown reference, no reply, Ctrl-C) into its words and exit code.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, cast

from client.cli.endpoints import curve, endpoints
from client.cli.output import EXIT_INTERRUPTED, EXIT_USAGE, CliError, fail
from client.cli.reach import check_reachable, gone_check, no_reply, unreachable
from client.failure_words import too_large_words
from protocol.methods import HOST_STATUS, Method

if TYPE_CHECKING:
    from transport.client import Client

P = TypeVar("P")
R = TypeVar("R")


def open_client(args: argparse.Namespace) -> Client:
    from transport.client import Client

    api, _ = endpoints(args)
    check_reachable(args, api)
    return Client(api, timeout=args.timeout, curve=curve(args), gone=gone_check(args, api))


def api_error(exc: Any) -> CliError:
    words = too_large_words(exc.params) if exc.reason == "payload_too_large" else None
    return CliError(
        exc.reason or exc.code,
        words or exc.message,
        error={
            "status": exc.status,
            "code": exc.code,
            "reason": exc.reason,
            "message": exc.message,
            "retryable": exc.retryable,
            "params": exc.params,
        },
    )


def with_client(
    fn: Callable[[argparse.Namespace, Client], int],
) -> Callable[[argparse.Namespace], int]:
    """Run a command with a client; map every failure to a CliError with its exit code."""

    def run(args: argparse.Namespace) -> int:
        from client.session_client import ReferenceError_
        from transport.client import ApiError, ClientTimeout, ServerGone

        client = None
        try:
            client = open_client(args)
            return int(fn(args, client) or 0)
        except CliError as exc:
            return fail(args, exc)
        except ApiError as exc:
            return fail(args, api_error(exc))
        except ReferenceError_ as exc:
            return fail(args, CliError(exc.reason, exc.message))
        except ServerGone as exc:
            return fail(args, unreachable(str(exc)))
        except (ClientTimeout, TimeoutError):
            return fail(args, no_reply(args))
        except KeyboardInterrupt:
            return EXIT_INTERRUPTED
        finally:
            if client is not None:
                client.close()

    return run


def call(
    args: argparse.Namespace, client: Client, method: Method[P, R], params: P | None = None
) -> R:
    """`method`'s result for its typed `params` (built with the method's params TypedDict,
    `workspaceId=args.workspace`); `host.status` takes none."""
    body = cast(P, {}) if method is HOST_STATUS or params is None else params
    result: R = client.call(method, body)
    return result


def parse_pairs(pairs: list[str], what: str) -> dict[str, Any]:
    """`k=v` pairs; `v` is JSON when it parses (`n=3`, `flag=true`), else the plain string."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise CliError("invalid_argument", f"{what} {pair!r} is not KEY=VALUE", code=EXIT_USAGE)
        try:
            out[key] = json.loads(raw)
        except ValueError:
            out[key] = raw
    return out
