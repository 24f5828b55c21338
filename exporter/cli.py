"""The command line: serve, check-config, presets, --version."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from exporter import __version__, presets
from exporter import config as config_module
from exporter.demo import command as demo_command
from exporter.events import emit_command
from exporter.logs import configure as configure_logging
from exporter.web_config import WebConfigError
from exporter.web_config import load as load_web_config

ENV_PREFIX = "QUEUE_EXPORTER"


def _env(flag: str) -> str:
    return f"{ENV_PREFIX}_{flag.upper()}"


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="queue-exporter")
def main() -> None:
    """Queue metrics sidecar: Redis queues, PostgreSQL queue tables and job events."""


@main.command()
@click.option(
    "--config",
    "config_file",
    type=click.Path(path_type=Path),
    envvar=_env("config"),
    help="YAML configuration file.",
)
@click.option(
    "--redis-url", envvar=_env("redis_url"), help="Redis URL (redis://, rediss://, unix://)."
)
@click.option(
    "--postgres-dsn",
    envvar=_env("postgres_dsn"),
    help="PostgreSQL DSN (postgresql://... or key=value) for SQL collectors and presets.",
)
@click.option(
    "--preset",
    multiple=True,
    envvar=_env("preset"),
    help=f"Known queue layout, repeatable: {', '.join(presets.available())}.",
)
@click.option(
    "--events-stream",
    multiple=True,
    envvar=_env("events_stream"),
    help="Redis stream of lifecycle events (docs/events.md) to consume, repeatable.",
)
@click.option(
    "--listen-address",
    envvar=_env("listen_address"),
    help=f"HOST:PORT to serve on (default {config_module.DEFAULT_LISTEN_ADDRESS}).",
)
@click.option(
    "--sample-interval",
    type=float,
    envvar=_env("sample_interval"),
    help="Seconds between samples (default 15).",
)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    envvar=_env("log_level"),
)
@click.option("--log-format", type=click.Choice(["text", "json"]), envvar=_env("log_format"))
@click.option(
    "--web-config",
    type=click.Path(path_type=Path),
    envvar=_env("web_config"),
    help="exporter-toolkit web config file (TLS, basic auth).",
)
def serve(config_file: Path | None, **overrides: Any) -> None:
    """Sample the configured sources and serve their metrics."""
    from exporter.app import App

    config = _load_or_exit(config_file, overrides)
    configure_logging(config.log_level, config.log_format)
    try:
        app = App(config)
    except WebConfigError as error:
        click.echo(f"error: {error}", err=True)
        sys.exit(1)
    except OSError as error:
        raise click.ClickException(
            f"cannot listen on {config.listen_address}: {error.strerror}"
        ) from None
    app.run_until_signalled()


main.add_command(emit_command.emit)
main.add_command(demo_command.demo)


@main.command("check-config")
@click.argument("config_file", type=click.Path(path_type=Path))
def check_config(config_file: Path) -> None:
    """Validate FILE and print the effective configuration, secrets masked."""
    config = _load_or_exit(config_file, {})
    if config.web_config_file is not None:  # its certificates and hashes too, as serve would
        try:
            load_web_config(config.web_config_file)
        except WebConfigError as error:
            click.echo(f"error: {error}", err=True)
            sys.exit(1)
    click.echo(config_module.effective_yaml(config), nl=False)


@main.command("redis-acl")
@click.argument("config_file", type=click.Path(path_type=Path))
@click.option("--user", default="queue-exporter", show_default=True, help="ACL user name.")
def redis_acl_line(config_file: Path, user: str) -> None:
    """Print the least-privilege ACL SETUSER line for FILE's Redis keys (docs/security.md)."""
    from exporter.redis_acl import setuser_line

    click.echo(setuser_line(_load_or_exit(config_file, {}), user))


@main.command("presets")
def list_presets() -> None:
    """List the built-in presets."""
    for name in presets.available():
        click.echo(f"{name}: {presets.describe(name)}")


def _load_or_exit(config_file: Path | None, overrides: dict[str, Any]) -> config_module.Config:
    try:
        return config_module.load(config_file, overrides)
    except config_module.ConfigError as error:
        click.echo(f"error: {error}", err=True)
        sys.exit(1)
