"""`agenthost gui`: the terminal GUI (`client.gui`, the optional `gui` extra) on the daemon's
endpoints.
"""

from __future__ import annotations

import argparse

from client.cli.endpoints import curve, endpoints, events_source
from client.cli.output import CliError, fail
from client.cli.reach import check_reachable


def run_gui_command(args: argparse.Namespace) -> int:
    try:
        api, _ = endpoints(args)
        events, exact = events_source(args)
        check_reachable(args, api)
    except CliError as exc:
        return fail(args, exc)
    try:
        from client.gui.app import run_gui
    except ImportError as exc:  # textual is the optional `gui` extra
        return fail(args, CliError("gui_unavailable", f"{exc} (pip install 'agenthost[gui]')"))
    return run_gui(api, events, args.workspace, curve=curve(args), events_exact=exact)
