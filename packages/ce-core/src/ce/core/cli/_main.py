"""Argument parsing, store selection, dispatch and error reporting of the ``ce`` command."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import webbrowser
from collections.abc import Sequence

from ce.core.cli import _transfer
from ce.core.cli._common import INSTALL_HINT, CliError, require_rich
from ce.core.errors import (
    ContextEngineError,
    MigrationError,
    SchemaValidationError,
    SessionNotFoundError,
    StoreError,
)
from ce.core.stores import (
    DEFAULT_STORE_URL,
    STORE_URL_ENV,
    Store,
    default_store_url,
    local_store_path,
    open_store,
)

__all__ = ["build_parser", "main"]

# The errors that mean "the caller asked for something absent or invalid": exit code 2.
_USAGE_ERRORS = (CliError, SchemaValidationError, MigrationError, SessionNotFoundError, StoreError)
_RICH_COMMANDS = frozenset({"sessions", "show", "turns", "report", "replay"})


def _non_negative(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = -1
    if number < 0:
        raise argparse.ArgumentTypeError(f"must be a non-negative integer, got {value!r}")
    return number


def _positive(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value!r}")
    return number


def build_parser() -> argparse.ArgumentParser:
    """The parser of the ``ce`` command line."""
    store_help = (
        "the store URL (memory://, sqlite:///path, file:///dir, postgresql://user@host/db); "
        f"default ${STORE_URL_ENV}, "
        f"else {DEFAULT_STORE_URL}"
    )
    parser = argparse.ArgumentParser(
        prog="ce",
        description=(
            "Inspect, report on, replay, export, import and browse Context Engine sessions."
        ),
    )
    parser.add_argument("--store", metavar="URL", help=store_help)
    # --store is accepted after the command too; there it overrides the one before it
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--store", metavar="URL", default=argparse.SUPPRESS, help=store_help)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    sessions = commands.add_parser("sessions", parents=[common], help="list the sessions")
    sessions.add_argument("--user", metavar="ID", help="only the sessions of this user id")

    show = commands.add_parser("show", parents=[common], help="a session's timeline")
    show.add_argument("session")

    turns = commands.add_parser("turns", parents=[common], help="a session's turns")
    turns.add_argument("session")

    turn_help = "the turn: its index in ce turns (-1 the newest), its id or an id prefix"
    report = commands.add_parser("report", parents=[common], help="a turn's report")
    report.add_argument("session")
    report.add_argument("turn", nargs="?", help=turn_help + " (default: the newest turn)")

    replay = commands.add_parser(
        "replay",
        parents=[common],
        help="reassemble a turn under another budget and diff the inputs",
    )
    replay.add_argument("session")
    replay.add_argument("turn", help=turn_help)
    replay.add_argument(
        "--budget", type=_positive, required=True, metavar="N", help="max input tokens"
    )
    replay.add_argument("--model", metavar="HINT", help="another model hint")
    replay.add_argument(
        "--reserve",
        type=_non_negative,
        metavar="N",
        help="reply tokens to reserve (default: the turn's, or a quarter of --budget)",
    )

    export = commands.add_parser("export", parents=[common], help="a session as JSON")
    export.add_argument("session")
    export.add_argument("-o", "--output", metavar="FILE", help="write here, not to stdout")

    imp = commands.add_parser("import", parents=[common], help="store an exported session")
    imp.add_argument("file", help="the export (or a bare session document); - for stdin")
    imp.add_argument("--session", metavar="NEW_ID", help="import under this session id")
    imp.add_argument("--replace", action="store_true", help="overwrite a stored session of that id")

    commands.add_parser("schema", help="print the JSON Schema of the session document")

    view = commands.add_parser(
        "view", parents=[common], help="browse the sessions in a local web page"
    )
    view.add_argument(
        "--port", type=_non_negative, default=8765, metavar="N", help="default 8765; 0: any free"
    )
    view.add_argument("--open", action="store_true", help="open the page in a web browser")
    return parser


async def _run(args: argparse.Namespace) -> None:
    if args.command == "schema":
        _transfer.schema()
        return
    if args.command in _RICH_COMMANDS:
        require_rich()
    url = args.store or default_store_url()
    path = local_store_path(url)
    if args.command != "import" and path is not None and not os.path.exists(path):
        # reading never creates a store (a typo in the URL must not leave an empty one)
        raise CliError(f"no store at {path!r} ({url})")
    store = open_store(url)
    try:
        if args.command == "export":
            await _transfer.export(store, args.session, args.output)
        elif args.command == "import":
            await _transfer.import_(store, args.file, args.session, args.replace)
        elif args.command == "view":
            await _view(store, url, args.port, args.open)
        else:
            from rich.console import Console

            from ce.core.cli import _inspect, _replay

            console = Console(highlight=False)
            if args.command == "sessions":
                await _inspect.sessions(store, console, args.user)
            elif args.command == "show":
                await _inspect.show(store, console, args.session)
            elif args.command == "turns":
                await _inspect.turns(store, console, args.session)
            elif args.command == "report":
                await _inspect.report(store, console, args.session, args.turn)
            else:
                await _replay.replay(
                    store, console, args.session, args.turn, args.budget, args.model, args.reserve
                )
    finally:
        await store.close()


async def _view(store: Store, url: str, port: int, open_page: bool) -> None:
    from ce.core.view import serve

    def ready(page: str) -> None:
        print(f"ce view: {url} at {page} (read-only; Ctrl-C stops)", flush=True)
        if open_page:
            webbrowser.open(page)

    try:
        await serve(store, port, ready=ready)
    except OSError as exc:
        raise CliError(f"cannot serve on 127.0.0.1:{port}: {exc} (try --port 0)") from None


def _fail(exc: BaseException, code: int) -> int:
    message = " ".join(str(exc).splitlines()) or type(exc).__name__
    print(f"ce: error: {message}", file=sys.stderr)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``ce`` command with ``argv`` (default: ``sys.argv[1:]``); the exit code.

    0: done. 2: bad usage, or what was asked for is absent, invalid or unreachable (a bad
    store URL or store file, an unknown session or turn, an invalid import file, an existing
    session without ``--replace``), or a command that renders tables runs without rich (the
    message names the ``ce-core[cli]`` extra). 1: the engine failed otherwise. Errors are one
    ``ce: error:`` line on stderr.
    """
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # --help, or a usage error argparse has printed
        return exc.code if isinstance(exc.code, int) else 2
    try:
        asyncio.run(_run(args))
    except _USAGE_ERRORS as exc:
        return _fail(exc, 2)
    except ImportError as exc:
        if INSTALL_HINT not in str(exc):
            raise
        return _fail(exc, 2)
    except ContextEngineError as exc:
        return _fail(exc, 1)
    except KeyboardInterrupt:  # Ctrl-C ends ce view (or a long command)
        return 130
    return 0
