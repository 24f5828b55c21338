"""The base of every configuration model: unknown settings are errors, values never change.

`extra="forbid"` turns a typo in a YAML file into an error naming the setting (config.py
adds a "did you mean"), and `frozen=True` lets sources share one validated config between
threads without copying it. One base, so every model behaves the same way.

`defer_build=True`: a model's validator is built the first time it validates, not when its
module is imported. Validating a Config builds the one tree it needs; the nested models'
own validators, which only a direct validation would use, are never built (start-up time).

No pydantic plugins: the exporter uses none, and looking for them (at the first validator
built) reads the metadata of every installed distribution. An operator's own setting of
PYDANTIC_DISABLE_PLUGINS is kept.
"""

from __future__ import annotations

import os

from pydantic import BaseModel, ConfigDict

os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)
