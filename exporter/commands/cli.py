"""The command line: serve, check-config, presets, redis-acl, demo, emit, --version."""

from __future__ import annotations

import difflib
import gc
import importlib
import logging
import os
import signal
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import click

from exporter import __version__
from exporter.config import effective, inventory, presets
from exporter.config import settings as config_module
from exporter.core.logs import configure as configure_logging
from exporter.core.logs import register_model_secrets
from exporter.http.access import WebConfigError

log = logging.getLogger("exporter")

ENV_PREFIX = "QUEUE_EXPORTER"


def _env(flag: str) -> str:
    return f"{ENV_PREFIX}_{flag.upper()}"


class _LazyGroup(click.Group):
    """Commands whose modules load only when they run: `serve` never imports the demo's
    embedded servers and simulators (they cost start-up time and memory in every pod)."""

    LAZY_COMMANDS = {
        "demo": "exporter.demo.command:demo",
        "emit": "exporter.commands.emit:emit",
    }

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *self.LAZY_COMMANDS])

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = self.LAZY_COMMANDS.get(cmd_name)
        if target is None:
            return super().get_command(ctx, cmd_name)
        module, _, name = target.partition(":")
        command = getattr(importlib.import_module(module), name)
        if not isinstance(command, click.Command):
            raise TypeError(f"{target} is not a click command")
        return command


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="queue-exporter")
@click.pass_context
def main(context: click.Context) -> None:
    """Queue metrics sidecar: Redis queues, PostgreSQL queue tables and job events."""
    if context.invoked_subcommand != "serve":
        gc.enable()  # off while the command line loaded (exporter/__main__.py); serve's start-up
        # keeps it off until it listens (App.listen)
        signal.signal(signal.SIGHUP, signal.SIG_DFL)  # ignored while it loaded: serve's alone


def env_option(
    name: str, *declarations: str, **settings: Any
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The option --<name> (underscores as dashes), also read from QUEUE_EXPORTER_<NAME>."""
    return click.option(f"--{name.replace('_', '-')}", *declarations, envvar=_env(name), **settings)


# The options through which serve and check-config build their configuration: one list, so
# check-config checks exactly what serve would run.
_CONFIG_OPTIONS = (
    env_option(
        "config",
        "config_file",
        type=click.Path(path_type=Path),
        help="YAML configuration file.",
    ),
    env_option(
        "redis_url",
        multiple=True,
        help="Redis URL (redis://, rediss://, unix://); repeatable: one Redis source each, "
        "named redis1, redis2... in the redis_source label.",
    ),
    env_option(
        "postgres_dsn",
        help="PostgreSQL DSN (postgresql://... or key=value) for SQL collectors and presets.",
    ),
    env_option(
        "preset",
        multiple=True,
        help=f"Known queue layout, repeatable: {', '.join(presets.available())}; params as "
        "NAME:PARAM=VALUE;PARAM=VALUE (celery:queues=a,b).",
    ),
    env_option(
        "events_stream",
        multiple=True,
        help="Redis stream of lifecycle events (docs/events.md) to consume, repeatable.",
    ),
    env_option(
        "listen_address",
        help=f"HOST:PORT to serve on (default {config_module.DEFAULT_LISTEN_ADDRESS}).",
    ),
    env_option("sample_interval", type=float, help="Seconds between samples (default 15)."),
    env_option("log_level", type=click.Choice(["debug", "info", "warning", "error"])),
    env_option("log_format", type=click.Choice(["text", "json"])),
    env_option(
        "web_config",
        type=click.Path(path_type=Path),
        help="exporter-toolkit web config file (TLS, basic auth).",
    ),
)


def _config_options(command: Callable[..., None]) -> Callable[..., None]:
    for option in reversed(_CONFIG_OPTIONS):
        command = option(command)
    return command


@main.command()
@_config_options
def serve(config_file: Path | None, **overrides: Any) -> None:
    """Sample the configured sources and serve their metrics."""
    from exporter.runtime.app import App

    _refuse_unknown_variables()
    config = _load_or_exit(config_file, overrides)
    configure_logging(config.log_level, config.log_format)
    if inventory.take(config).empty:
        click.echo(f"error: {inventory.NOTHING_TO_DO}", err=True)
        sys.exit(1)
    try:
        app = App(config, listen_first=True)  # answers before redis-py is even imported
    except WebConfigError as error:
        click.echo(f"error: {error}", err=True)
        sys.exit(1)
    except OSError as error:
        raise click.ClickException(
            f"cannot listen on {config.listen_address}: {error.strerror}"
        ) from None
    app.run_until_signalled()


@main.command("check-config")
@click.argument("file_argument", metavar="[FILE]", required=False, type=click.Path(path_type=Path))
@_config_options
@click.option(
    "--connect",
    is_flag=True,
    help="Also reach every backend: keys per key group, streams, SQL collectors' rows, "
    "native readers' records.",
)
@click.option(
    "--strict", is_flag=True, help="Exit 1 on warnings too (OK with N warnings), not only FAILED."
)
@click.option(
    "--show-config",
    is_flag=True,
    help="Also print the whole resolved configuration as YAML, defaults filled in.",
)
def check_config(
    file_argument: Path | None,
    config_file: Path | None,
    connect: bool,
    strict: bool,
    show_config: bool,
    **overrides: Any,
) -> None:
    """Build the configuration as serve would (FILE or --config, environment, flags), print
    what it looks at with secrets masked and end with a verdict: OK, OK with N warnings (each
    named on its own line) or FAILED. Exit 1 on FAILED, and on warnings with --strict."""
    _refuse_unknown_variables()
    config = _load_or_exit(file_argument or config_file, overrides)
    configure_logging("error", "text")  # what the sources would warn about is printed below
    if config.web_config_file is not None:  # its certificates and hashes too, as serve would
        from exporter.http.web_config import load as load_web_config

        try:
            load_web_config(config.web_config_file)
        except WebConfigError as error:
            click.echo(f"error: {error}", err=True)
            sys.exit(1)
    found = inventory.take(config)
    for line in found.lines():
        click.echo(f"# {line}")
    if show_config:
        click.echo("---")
        click.echo(effective.effective_yaml(config), nl=False)
        click.echo("---")
    if found.empty:
        click.echo(f"error: {inventory.NOTHING_TO_DO}", err=True)
        sys.exit(1)
    failures: list[str] = []
    warnings: list[str] = []
    if connect:
        from exporter.commands.check_config import probe

        findings = probe(config, click.echo)
        failures, warnings = findings.failures, findings.warnings
    for warning in warnings:
        click.echo(f"WARNING: {warning}")
    if failures:
        click.echo(f"FAILED: {'; '.join(failures)}")
        sys.exit(1)
    click.echo(found.verdict(len(warnings)))
    if warnings and strict:
        sys.exit(1)


def unknown_variables(environment: Mapping[str, str]) -> list[str]:
    """The QUEUE_EXPORTER_* variables no option reads, each with the one it most resembles."""
    known = [str(option.envvar) for option in serve.params if isinstance(option, click.Option)]
    unknown = []
    for name in sorted(environment):
        if name.startswith(f"{ENV_PREFIX}_") and name not in known:
            # compared without the prefix they share, which would make any name look close
            settings = {setting.removeprefix(ENV_PREFIX): setting for setting in known}
            guess = difflib.get_close_matches(name.removeprefix(ENV_PREFIX), settings, n=1)
            hint = (
                f" (did you mean {settings[guess[0]]}?)"
                if guess
                else f" (known: {', '.join(known)})"
            )
            unknown.append(f"{name}: not a setting{hint}")
    return unknown


def _refuse_unknown_variables() -> None:
    """A mistyped variable is refused as an unknown key of the file is: ignored, it would leave
    its setting at the default (serve sampling redis://127.0.0.1:6379/0 for a misspelt URL)."""
    unknown = unknown_variables(os.environ)
    if unknown:
        lines = "".join(f"\n  {line}" for line in unknown)
        click.echo(f"error: invalid environment:{lines}", err=True)
        sys.exit(1)


@main.command("redis-acl")
@click.argument("config_file", type=click.Path(path_type=Path))
@click.option("--user", default="queue-exporter", show_default=True, help="ACL user name.")
def redis_acl_line(config_file: Path, user: str) -> None:
    """Print the least-privilege ACL SETUSER line for FILE's Redis keys (docs/security.md)."""
    from exporter.commands.redis_acl import sentinel_setuser_line, setuser_line

    config = _load_or_exit(config_file, {})
    click.echo(setuser_line(config, user))
    sentinel_line = sentinel_setuser_line(config, user)
    if sentinel_line is not None:
        click.echo(f"# on each Sentinel (sentinel_username: {user}):")
        click.echo(sentinel_line)


@main.command("presets")
def list_presets() -> None:
    """List the built-in presets."""
    for name in presets.available():
        click.echo(f"{name}: {presets.describe(name)}")


def _load_or_exit(config_file: Path | None, overrides: dict[str, Any]) -> config_module.Config:
    try:
        config = config_module.load(config_file, overrides)
    except config_module.ConfigError as error:
        click.echo(f"error: {error}", err=True)
        sys.exit(1)
    register_model_secrets(config)  # masked in every log line from now on
    return config
