"""The configuration as it will run, as YAML, its secrets masked (`check-config` prints it)."""

from __future__ import annotations

import yaml

from exporter.config.kinds import KINDS
from exporter.config.settings import Config


def effective_yaml(config: Config) -> str:
    """Every setting, presets merged; each source kind masks its own secrets (config/kinds.py)."""
    document = config.model_dump(mode="json", exclude_none=True)
    for kind in KINDS:
        kind.mask(config, document)
    if config.leader_election.redis is not None:
        lease_redis = document["leader_election"]["redis"]
        lease_redis["url"] = config.leader_election.redis.masked_url()
    dumped: str = yaml.safe_dump(document, sort_keys=False, allow_unicode=True)
    return dumped
