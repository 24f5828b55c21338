"""The command line: serve, check-config, presets, --version."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from exporter import __version__, presets
from exporter import config as config_module
from exporter.logs import configure as configure_logging

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
    "--preset",
    multiple=True,
    envvar=_env("preset"),
    help=f"Known queue layout, repeatable: {', '.join(presets.available())}.",
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
    except OSError as error:
        raise click.ClickException(
            f"cannot listen on {config.listen_address}: {error.strerror}"
        ) from None
    app.run_until_signalled()


@main.command("check-config")
@click.argument("config_file", type=click.Path(path_type=Path))
def check_config(config_file: Path) -> None:
    """Validate FILE and print the effective configuration, secrets masked."""
    config = _load_or_exit(config_file, {})
    click.echo(config_module.effective_yaml(config), nl=False)


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
